/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The HIP device plugin: AMD GPU memory through the HIP runtime (ROCm).
 * libamdhip64.so is opened with dlopen() when the plugin is probed, so
 * neither the plugin nor libte needs ROCm to build or a GPU to run: without
 * the library or a device the plugin stays idle and says why.
 * This file opens the runtime, makes and ends the plugin's context, tells
 * device memory apart and finds a stream's device; hip-copy.c copies and
 * hip-share.c shares (hip-internal.h). The steps it takes as the CUDA plugin
 * does (probe, create, the device table, the stream ops, the ops table) are
 * util/teu-gpu.h's.
 */
#include "hip-internal.h"
#include "teu-devmem.h"

static const char *const LIBS[] = { "libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5" };

/* The calls the shared steps make (teu_gpu_calls), by their names here. */
static const char *const HIP_CALLS[TEU_GPU_NCALLS] = { "hipDeviceGet", "hipDeviceGetName", "hipDeviceTotalMem",
						       "hipDeviceGetPCIBusId", "hipStreamSynchronize",
						       "hipLaunchHostFunc" };

static int hip_open(void *ctx, char *why, size_t why_len)
{
	hip_ctx *c = ctx;
	runtime *r = &c->rt;
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
	SYM(StreamGetDevice, "hipStreamGetDevice", 0);
#undef SYM
	hipError_t e = r->Init != NULL ? r->Init(0) : hipSuccess;
	int n = 0, version = 0;
	if (e == hipSuccess)
		e = r->GetDeviceCount(&n);
	n = teu_gpu_found(&c->g, r->lib, e, n, HIP_CALLS, why, why_len);
	if (n < 0)
		return n;
	/* The memory type's numbering depends on the runtime's major version. */
	e = r->RuntimeGetVersion(&version);
	if (e != hipSuccess || version <= 0) {
		snprintf(why, why_len, "%s does not say its version (%s)", r->name,
			 e != hipSuccess ? errstr(r, e) : "none");
		return -ENOTSUP; /* the library is closed with the context */
	}
	r->major = HIP_VERSION_MAJOR_OF(version);
	return n;
}

static const char *hip_errstr(void *ctx, int err)
{
	hip_ctx *c = ctx;
	return errstr(&c->rt, err);
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

/* The rest of create, once the runtime counted the devices. */
static void hip_start(void *ctx)
{
	hip_ctx *c = ctx;

	c->device_type = c->rt.major >= 6 ? HIP_MEMORY_TYPE_DEVICE_V6 : HIP_MEMORY_TYPE_DEVICE_V5;
	teu_gpu_pool_init(&c->batch, BATCH_STREAMS);
	c->async = async_start(c);
}

static void hip_destroy(void *ctx)
{
	hip_ctx *c = ctx;

	async_stop(c);
	for (unsigned i = 0; i < c->batch.made; i++)
		c->rt.StreamDestroy(c->batch.s[i]);
	teu_gpu_pool_fini(&c->batch);
	teu_gpu_free(&c->g);
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
	if (teu_range_check(c->g.host, addr, len, start, size) < 0)
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

	if (device >= c->g.ndev) {
		c->g.host->log(c->g.host, TE_LOG_ERROR, "%s: no device hip:%d here", what, device);
		return -ENODEV;
	}
	if (c->rt.GetDevice(&cur) != hipSuccess)
		cur = 0;
	*dev = device >= 0 ? device : cur;
	if (stream == NULL)
		return 0;
	if (c->rt.StreamGetDevice == NULL) {
		if (!atomic_exchange(&c->said_no_stream_device, true))
			c->g.host->log(c->g.host, TE_LOG_WARN,
				       "this HIP runtime has no hipStreamGetDevice: a stream is taken for the device of "
				       "its location, or else the calling thread's current one (said once)");
		return 0;
	}
	hipDevice_t sd = -1;
	hipError_t e = c->rt.StreamGetDevice(stream, &sd);
	if (e != hipSuccess) {
		c->g.host->log(c->g.host, TE_LOG_ERROR, "%s: hipStreamGetDevice of stream %p: %s", what, stream,
			       errstr(&c->rt, e));
		return -EINVAL;
	}
	if (device >= 0 && sd != device) {
		c->g.host->log(c->g.host, TE_LOG_ERROR, "%s: stream %p is hip:%d's, not hip:%d's", what, stream, sd,
			       device);
		return -EINVAL;
	}
	*dev = sd;
	return 0;
}

/* The batch pool's check, as the shared steps ask it. */
static bool hip_own_stream(void *ctx)
{
	hip_ctx *c = ctx;
	hipStream_t own = copy_stream_take(c);

	if (own == NULL)
		return false;
	copy_stream_give(c, own);
	return true;
}

/* The stream's device made the calling thread's current one for the calls
 * that follow (stream_device); *saved: the device hip_stream_leave puts
 * back, or -1 for none. */
static int hip_stream_enter(void *ctx, int device, void *stream, const char *what, int *saved)
{
	hip_ctx *c = ctx;
	int dev;
	int rc = stream_device(c, device, stream, what, &dev);

	*saved = -1;
	if (rc < 0)
		return rc;
	int old = device_enter(c, dev);
	*saved = old != dev ? old : -1;
	return 0;
}

static void hip_stream_leave(void *ctx, int saved)
{
	hip_ctx *c = ctx;

	if (saved >= 0)
		c->rt.SetDevice(saved);
}

TEU_GPU_PLUGIN(hip, hip_ctx, "HIP", "hip", "runtime", "AMD GPU memory through the HIP runtime")
