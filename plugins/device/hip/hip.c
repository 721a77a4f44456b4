/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The HIP device plugin: AMD GPU memory through the HIP runtime (ROCm).
 * libamdhip64.so is opened with dlopen() when the plugin is probed, so
 * neither the plugin nor libte needs ROCm to build or a GPU to run: without
 * the library or a device the plugin stays idle and says why.
 * This file opens the runtime, makes and ends the plugin's context, tells
 * device memory apart, runs host work in a stream's order and lists the
 * devices; copy.c copies and share.c shares (hip-internal.h).
 */
#include "hip-internal.h"
#include "teu-devmem.h"
#include "teu-pci.h"

static const char *const LIBS[] = { "libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5" };

static int open_runtime(runtime *r, char *why, size_t why_len)
{
	char err[200] = "";

	memset(r, 0, sizeof *r);
	for (size_t i = 0; i < sizeof LIBS / sizeof LIBS[0] && r->lib == NULL; i++) {
		/* Never unloaded: once initialised the runtime has threads of
		 * its own and thread-local state, which unloading would pull
		 * from under them (probe and create both open it). */
		r->lib = dlopen(LIBS[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
		if (r->lib != NULL) {
			r->name = LIBS[i];
		} else if (i == 0) {
			/* The first name's reason is the telling one; the next
			 * dlopen() may reuse dlerror()'s buffer. */
			const char *e = dlerror();
			snprintf(err, sizeof err, "%s", e != NULL ? e : "");
		}
	}
	if (r->lib == NULL) {
		snprintf(why, why_len, "the HIP runtime library libamdhip64.so is not installed (%s)", err);
		return -ENODEV;
	}
#define SYM(field, sym, required)                                                          \
	do {                                                                               \
		*(void **)&r->field = dlsym(r->lib, sym);                                  \
		if (r->field == NULL && (required)) {                                      \
			snprintf(why, why_len, "%s lacks %s", r->name, sym);               \
			dlclose(r->lib);                                                   \
			r->lib = NULL;                                                     \
			return -ENOTSUP;                                                   \
		}                                                                          \
	} while (0)
	SYM(Init, "hipInit", 0);
	SYM(RuntimeGetVersion, "hipRuntimeGetVersion", 1);
	SYM(GetDeviceCount, "hipGetDeviceCount", 1);
	SYM(GetDevice, "hipGetDevice", 1);
	SYM(SetDevice, "hipSetDevice", 1);
	SYM(DeviceGet, "hipDeviceGet", 1);
	SYM(DeviceGetName, "hipDeviceGetName", 1);
	SYM(DeviceTotalMem, "hipDeviceTotalMem", 1);
	SYM(DeviceGetPCIBusId, "hipDeviceGetPCIBusId", 1);
	SYM(PointerGetAttribute, "hipPointerGetAttribute", 1);
	SYM(Memcpy, "hipMemcpy", 1);
	SYM(HostMalloc, "hipHostMalloc", 1);
	SYM(HostFree, "hipHostFree", 1);
	SYM(Malloc, "hipMalloc", 1);
	SYM(Free, "hipFree", 1);
	SYM(GetErrorString, "hipGetErrorString", 0);
	SYM(StreamSynchronize, "hipStreamSynchronize", 1);
	SYM(StreamCreateWithFlags, "hipStreamCreateWithFlags", 0);
	SYM(StreamDestroy, "hipStreamDestroy", 0);
	SYM(MemcpyAsync, "hipMemcpyAsync", 0);
	SYM(EventCreateWithFlags, "hipEventCreateWithFlags", 0);
	SYM(EventRecord, "hipEventRecord", 0);
	SYM(EventSynchronize, "hipEventSynchronize", 0);
	SYM(EventDestroy, "hipEventDestroy", 0);
	SYM(EventQuery, "hipEventQuery", 0);
	SYM(MemGetHandleForAddressRange, "hipMemGetHandleForAddressRange", 0);
	SYM(IpcGetMemHandle, "hipIpcGetMemHandle", 0);
	SYM(IpcOpenMemHandle, "hipIpcOpenMemHandle", 0);
	SYM(IpcCloseMemHandle, "hipIpcCloseMemHandle", 0);
	SYM(LaunchHostFunc, "hipLaunchHostFunc", 0);
	SYM(StreamGetDevice, "hipStreamGetDevice", 0);
#undef SYM
	hipError_t e = r->Init != NULL ? r->Init(0) : hipSuccess;
	int n = 0, version = 0;
	if (e == hipSuccess)
		e = r->GetDeviceCount(&n);
	if (e != hipSuccess || n <= 0) {
		snprintf(why, why_len, "no HIP device (%s)",
			 e != hipSuccess ? errstr(r, e) : "the runtime counts none");
		dlclose(r->lib);
		r->lib = NULL;
		return -ENODEV;
	}
	/* The memory type's numbering depends on the runtime's major version. */
	e = r->RuntimeGetVersion(&version);
	if (e != hipSuccess || version <= 0) {
		snprintf(why, why_len, "%s does not say its version (%s)", r->name,
			 e != hipSuccess ? errstr(r, e) : "none");
		dlclose(r->lib);
		r->lib = NULL;
		return -ENOTSUP;
	}
	r->major = HIP_VERSION_MAJOR_OF(version);
	return n > MAX_DEVICES ? MAX_DEVICES : n;
}

static int hip_probe(const te_host *h, char *why, size_t why_len)
{
	runtime r;
	(void)h;
	int n = open_runtime(&r, why, why_len);
	if (n < 0)
		return n;
	dlclose(r.lib);
	return 0;
}

/* HIP's current device is per thread, and the calling thread is usually the
 * application's: calls that depend on it set it and put the old one back. */
int device_enter(hip_ctx *c, int dev)
{
	int old = 0;
	if (c->rt.GetDevice(&old) != hipSuccess)
		old = -1;
	if (old != dev)
		c->rt.SetDevice(dev);
	return old;
}

void device_leave(hip_ctx *c, int dev, int old)
{
	if (old >= 0 && old != dev)
		c->rt.SetDevice(old);
}

static int hip_create(const te_host *h, void **out)
{
	hip_ctx *c = calloc(1, sizeof *c);
	char why[256] = "";

	if (c == NULL)
		return -ENOMEM;
	c->host = h;
	c->ndev = open_runtime(&c->rt, why, sizeof why);
	if (c->ndev < 0) {
		int rc = c->ndev;
		h->log(h, TE_LOG_INFO, "idle: %s", why);
		free(c);
		return rc;
	}
	c->device_type = c->rt.major >= 6 ? HIP_MEMORY_TYPE_DEVICE_V6 : HIP_MEMORY_TYPE_DEVICE_V5;
	pthread_mutex_init(&c->batch_lock, NULL);
	pthread_cond_init(&c->batch_cond, NULL);
	c->async = async_start(c);
	*out = c;
	return 0;
}

static void hip_destroy(void *ctx)
{
	hip_ctx *c = ctx;

	async_stop(c);
	for (unsigned i = 0; i < c->batch_made; i++)
		c->rt.StreamDestroy(c->batch_streams[i]);
	pthread_mutex_destroy(&c->batch_lock);
	pthread_cond_destroy(&c->batch_cond);
	dlclose(c->rt.lib);
	free(c);
}

bool range_of(hip_ctx *c, void *p, uintptr_t *start, size_t *size)
{
	void *s = NULL;
	*size = 0;
	if (c->rt.PointerGetAttribute(&s, HIP_POINTER_ATTRIBUTE_RANGE_START_ADDR, p) != hipSuccess ||
	    c->rt.PointerGetAttribute(size, HIP_POINTER_ATTRIBUTE_RANGE_SIZE, p) != hipSuccess)
		return false;
	*start = (uintptr_t)s;
	return true;
}

int hip_classify(void *ctx, const void *addr, size_t len, int *device)
{
	hip_ctx *c = ctx;
	unsigned type = 0;
	int ordinal = -1;
	void *p = (void *)(uintptr_t)addr;
	uintptr_t start = 0;
	size_t size = 0;

	/* Host memory, even page-locked host memory, is not device memory. */
	if (c->rt.PointerGetAttribute(&type, HIP_POINTER_ATTRIBUTE_MEMORY_TYPE, p) != hipSuccess ||
	    type != c->device_type)
		return 0;
	if (c->rt.PointerGetAttribute(&ordinal, HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) != hipSuccess ||
	    !range_of(c, p, &start, &size))
		return -EIO;
	if (teu_range_check(c->host, addr, len, start, size) < 0)
		return -EINVAL;
	*device = ordinal;
	return 1;
}

/* The device whose stream `stream` is: the runtime says (hipStreamGetDevice),
 * and for the null stream `device`, or with -1 the calling thread's
 * current one. -EINVAL (logged) when the stream is not `device`'s. */
static int stream_device(hip_ctx *c, int device, hipStream_t stream, const char *what, int *dev)
{
	int cur = 0;

	if (device >= c->ndev) {
		c->host->log(c->host, TE_LOG_ERROR, "%s: no device hip:%d here", what, device);
		return -ENODEV;
	}
	if (c->rt.GetDevice(&cur) != hipSuccess)
		cur = 0;
	*dev = device >= 0 ? device : cur;
	if (stream == NULL)
		return 0;
	if (c->rt.StreamGetDevice == NULL) {
		if (!atomic_exchange(&c->said_no_stream_device, true))
			c->host->log(c->host, TE_LOG_WARN,
				     "this HIP runtime has no hipStreamGetDevice: a stream is taken for the device of "
				     "its location, or else the calling thread's current one (said once)");
		return 0;
	}
	hipDevice_t sd = -1;
	hipError_t e = c->rt.StreamGetDevice(stream, &sd);
	if (e != hipSuccess) {
		c->host->log(c->host, TE_LOG_ERROR, "%s: hipStreamGetDevice of stream %p: %s", what, stream,
			     errstr(&c->rt, e));
		return -EINVAL;
	}
	if (device >= 0 && sd != device) {
		c->host->log(c->host, TE_LOG_ERROR, "%s: stream %p is hip:%d's, not hip:%d's", what, stream, sd,
			     device);
		return -EINVAL;
	}
	*dev = sd;
	return 0;
}

/* The function runs on the runtime's thread for host functions, which must
 * not call the runtime; libte's (stream.c) only hands work over and waits.
 * On the stream's own device, the caller's current one put back after. The
 * plugin's copies never wait for the null stream (hip_copy), so that a
 * blocking stream or the null stream held by the function does not hold the
 * transfer it waits for; a runtime that leaves the plugin no stream of its
 * own is refused. */
static int hip_stream_launch_on(void *ctx, int device, void *stream, void (*fn)(void *), void *arg)
{
	hip_ctx *c = ctx;
	int dev;

	if (c->rt.LaunchHostFunc == NULL) {
		c->host->log(c->host, TE_LOG_ERROR, "this HIP runtime has no hipLaunchHostFunc");
		return -ENOTSUP;
	}
	hipStream_t own = copy_stream_take(c);
	if (own == NULL) {
		c->host->log(c->host, TE_LOG_ERROR,
			     "no stream of the plugin's own: its copies would wait for the stream's host function");
		return -ENOTSUP;
	}
	copy_stream_give(c, own);
	int rc = stream_device(c, device, stream, "hipLaunchHostFunc", &dev);
	if (rc < 0)
		return rc;
	int old = device_enter(c, dev);
	hipError_t e = c->rt.LaunchHostFunc(stream, fn, arg);
	device_leave(c, dev, old);
	if (e != hipSuccess) {
		c->host->log(c->host, TE_LOG_ERROR, "hipLaunchHostFunc: %s", errstr(&c->rt, e));
		return -EIO;
	}
	return 0;
}

static int hip_stream_launch(void *ctx, void *stream, void (*fn)(void *), void *arg)
{
	return hip_stream_launch_on(ctx, -1, stream, fn, arg);
}

static int hip_stream_wait_on(void *ctx, int device, void *stream)
{
	hip_ctx *c = ctx;
	int dev;
	int rc = stream_device(c, device, stream, "hipStreamSynchronize", &dev);

	if (rc < 0)
		return rc;
	int old = device_enter(c, dev);
	hipError_t e = c->rt.StreamSynchronize(stream);
	device_leave(c, dev, old);
	if (e != hipSuccess) {
		c->host->log(c->host, TE_LOG_ERROR, "hipStreamSynchronize: %s", errstr(&c->rt, e));
		return -EIO;
	}
	return 0;
}

static int hip_stream_wait(void *ctx, void *stream)
{
	return hip_stream_wait_on(ctx, -1, stream);
}

static int hip_devices(void *ctx, te_device_info *out, size_t max, size_t *n)
{
	hip_ctx *c = ctx;

	*n = (size_t)c->ndev;
	for (int i = 0; i < c->ndev && (size_t)i < max; i++) {
		te_device_info *d = &out[i];
		hipDevice_t dev;
		size_t mem = 0;

		snprintf(d->location, sizeof d->location, "hip:%d", i);
		if (c->rt.DeviceGet(&dev, i) != hipSuccess)
			continue;
		if (c->rt.DeviceGetName(d->name, (int)sizeof d->name, dev) != hipSuccess)
			snprintf(d->name, sizeof d->name, "?");
		d->name[sizeof d->name - 1] = '\0';
		if (c->rt.DeviceTotalMem(&mem, dev) == hipSuccess)
			d->memory = mem;
		teu_pci_info(d, c->rt.DeviceGetPCIBusId(d->pci_bus_id, (int)sizeof d->pci_bus_id, i) == hipSuccess);
	}
	return 0;
}

static const te_device_ops ops = {
	.size = sizeof(te_device_ops),
	.prefix = "hip",
	.probe = hip_probe,
	.create = hip_create,
	.destroy = hip_destroy,
	.classify = hip_classify,
	.copy = hip_copy,
	.copy_async = hip_copy_async,
	.host_alloc = hip_host_alloc,
	.host_free = hip_host_free,
	.mem_alloc = hip_mem_alloc,
	.mem_free = hip_mem_free,
	.export_dmabuf = hip_export_dmabuf,
	.devices = hip_devices,
	.stream_wait = hip_stream_wait,
	.stream_launch = hip_stream_launch,
	.stream_launch_on = hip_stream_launch_on,
	.stream_wait_on = hip_stream_wait_on,
	.ipc_export = hip_ipc_export,
	.ipc_open = hip_ipc_open,
	.ipc_close = hip_ipc_close,
	.copy_batch = hip_copy_batch,
};

TE_PLUGIN_DEFINE(TE_KIND_DEVICE, "hip", "1.0", "AMD GPU memory through the HIP runtime",
		 "Apache-2.0", &ops)
