/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA device plugin: NVIDIA GPU memory through the CUDA driver API.
 * libcuda.so.1 is opened with dlopen() when the plugin is probed, so neither
 * the plugin nor libte needs the CUDA toolkit to build or a GPU to run:
 * without the library or a device the plugin stays idle and says why.
 * The few driver types, constants and prototypes it uses are declared here.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <te/te-plugin.h>

/* ----------------------------------------------------- driver API subset */

typedef int CUresult; /* CUDA_SUCCESS = 0 */
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef void (*CUstreamCallback)(CUstream stream, CUresult status, void *user);
typedef struct CUipcMemHandle {
	char reserved[64]; /* CU_IPC_HANDLE_SIZE */
} CUipcMemHandle;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_NO_DEVICE = 100,
	CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
	CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
	CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
	CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
	CU_MEMORYTYPE_DEVICE = 2,
	CU_MEMHOSTALLOC_PORTABLE = 1,
	CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1,
	CU_STREAM_NON_BLOCKING = 1,
	CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1,
};

#define MAX_DEVICES 64

typedef struct driver {
	void *lib;
	CUresult (*Init)(unsigned);
	CUresult (*DeviceGetCount)(int *);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*DeviceGetName)(char *, int, CUdevice);
	CUresult (*DeviceTotalMem)(size_t *, CUdevice);
	CUresult (*DeviceGetPCIBusId)(char *, int, CUdevice);
	CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*DevicePrimaryCtxRelease)(CUdevice);
	CUresult (*CtxSetCurrent)(CUcontext);
	CUresult (*PointerGetAttribute)(void *, int, CUdeviceptr);
	CUresult (*Memcpy)(CUdeviceptr, CUdeviceptr, size_t);
	CUresult (*MemHostAlloc)(void **, size_t, unsigned);
	CUresult (*MemFreeHost)(void *);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemFree)(CUdeviceptr);
	CUresult (*GetErrorString)(CUresult, const char **);
	CUresult (*StreamSynchronize)(CUstream);
	/* Optional: without them copies are synchronous only. */
	CUresult (*StreamCreate)(CUstream *, unsigned);
	CUresult (*StreamDestroy)(CUstream);
	CUresult (*MemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
	CUresult (*StreamAddCallback)(CUstream, CUstreamCallback, void *, unsigned);
	/* Optional (CUDA 11.7 and later drivers). */
	CUresult (*MemGetHandleForAddressRange)(void *, CUdeviceptr, size_t, int, unsigned long long);
	/* Optional: sharing cuMemAlloc memory with other processes. */
	CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
	CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned);
	CUresult (*IpcCloseMemHandle)(CUdeviceptr);
} driver;

/* Asynchronous copies go round-robin to this many streams, so that copies
 * into and out of the devices can use both copy engines at once. */
#define STREAMS 2

/* A copy whose end the driver will report. */
typedef struct cuda_ctx cuda_ctx;
typedef struct cu_done {
	struct cu_done *next;
	cuda_ctx *owner;
	te_device_done_fn done;
	void *arg;
	size_t len;
	CUresult status;
} cu_done;

struct cuda_ctx {
	const te_host *host;
	driver drv;
	int ndev;
	CUcontext ctx[MAX_DEVICES]; /* primary contexts */

	/* Asynchronous copies (see cu_copy_async) */
	bool async;
	CUstream streams[STREAMS];
	atomic_uint next_stream;
	atomic_bool said_sync; /* the fall-back to waiting was logged */
	pthread_t completer;
	pthread_mutex_t lock; /* guards the finished list and quit */
	pthread_cond_t cond;
	cu_done *head, *tail;
	bool quit;
};

static const char *errstr(const driver *d, CUresult r)
{
	const char *s = NULL;
	if (d->GetErrorString == NULL || d->GetErrorString(r, &s) != CUDA_SUCCESS || s == NULL)
		return "unknown CUDA error";
	return s;
}

static int open_driver(driver *d, char *why, size_t why_len)
{
	memset(d, 0, sizeof *d);
	d->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (d->lib == NULL) {
		snprintf(why, why_len, "the CUDA driver library libcuda.so.1 is not installed (%s)",
			 dlerror());
		return -ENODEV;
	}
#define SYM(field, name, required)                                                         \
	do {                                                                               \
		*(void **)&d->field = dlsym(d->lib, name);                                 \
		if (d->field == NULL && (required)) {                                      \
			snprintf(why, why_len, "libcuda.so.1 lacks %s", name);             \
			dlclose(d->lib);                                                   \
			d->lib = NULL;                                                     \
			return -ENOTSUP;                                                   \
		}                                                                          \
	} while (0)
	SYM(Init, "cuInit", 1);
	SYM(DeviceGetCount, "cuDeviceGetCount", 1);
	SYM(DeviceGet, "cuDeviceGet", 1);
	SYM(DeviceGetName, "cuDeviceGetName", 1);
	SYM(DeviceTotalMem, "cuDeviceTotalMem_v2", 1);
	SYM(DeviceGetPCIBusId, "cuDeviceGetPCIBusId", 1);
	SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 1);
	SYM(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", 1);
	SYM(CtxSetCurrent, "cuCtxSetCurrent", 1);
	SYM(PointerGetAttribute, "cuPointerGetAttribute", 1);
	SYM(Memcpy, "cuMemcpy", 1);
	SYM(MemHostAlloc, "cuMemHostAlloc", 1);
	SYM(MemFreeHost, "cuMemFreeHost", 1);
	SYM(MemAlloc, "cuMemAlloc_v2", 1);
	SYM(MemFree, "cuMemFree_v2", 1);
	SYM(GetErrorString, "cuGetErrorString", 0);
	SYM(StreamSynchronize, "cuStreamSynchronize", 1);
	SYM(StreamCreate, "cuStreamCreate", 0);
	SYM(StreamDestroy, "cuStreamDestroy_v2", 0);
	SYM(MemcpyAsync, "cuMemcpyAsync", 0);
	SYM(StreamAddCallback, "cuStreamAddCallback", 0);
	SYM(MemGetHandleForAddressRange, "cuMemGetHandleForAddressRange", 0);
	SYM(IpcGetMemHandle, "cuIpcGetMemHandle", 0);
	SYM(IpcOpenMemHandle, "cuIpcOpenMemHandle_v2", 0);
	if (d->IpcOpenMemHandle == NULL)
		SYM(IpcOpenMemHandle, "cuIpcOpenMemHandle", 0);
	SYM(IpcCloseMemHandle, "cuIpcCloseMemHandle", 0);
#undef SYM
	CUresult r = d->Init(0);
	int n = 0;
	if (r == CUDA_SUCCESS)
		r = d->DeviceGetCount(&n);
	if (r != CUDA_SUCCESS || n <= 0) {
		snprintf(why, why_len, "no CUDA device (%s)",
			 r != CUDA_SUCCESS ? errstr(d, r) : "the driver counts none");
		dlclose(d->lib);
		d->lib = NULL;
		return -ENODEV;
	}
	return n > MAX_DEVICES ? MAX_DEVICES : n;
}

static int cu_probe(const te_host *h, char *why, size_t why_len)
{
	driver d;
	(void)h;
	int n = open_driver(&d, why, why_len);
	if (n < 0)
		return n;
	dlclose(d.lib);
	return 0;
}

static void make_current(cuda_ctx *c, int dev);
static bool async_start(cuda_ctx *c);
static void async_stop(cuda_ctx *c);

static int cu_create(const te_host *h, void **out)
{
	cuda_ctx *c = calloc(1, sizeof *c);
	char why[256] = "";

	if (c == NULL)
		return -ENOMEM;
	c->host = h;
	c->ndev = open_driver(&c->drv, why, sizeof why);
	if (c->ndev < 0) {
		int rc = c->ndev;
		h->log(h, TE_LOG_INFO, "idle: %s", why);
		free(c);
		return rc;
	}
	for (int i = 0; i < c->ndev; i++) {
		CUdevice dev;
		CUresult r = c->drv.DeviceGet(&dev, i);
		if (r == CUDA_SUCCESS)
			r = c->drv.DevicePrimaryCtxRetain(&c->ctx[i], dev);
		if (r != CUDA_SUCCESS) {
			h->log(h, TE_LOG_WARN, "device %d: no context: %s", i, errstr(&c->drv, r));
			c->ctx[i] = NULL;
		}
	}
	c->async = async_start(c);
	*out = c;
	return 0;
}

static void cu_destroy(void *ctx)
{
	cuda_ctx *c = ctx;

	async_stop(c);
	for (int i = 0; i < c->ndev; i++)
		if (c->ctx[i] != NULL)
			c->drv.DevicePrimaryCtxRelease(i);
	dlclose(c->drv.lib);
	free(c);
}

/* Driver calls need a current context in the calling thread. */
static void make_current(cuda_ctx *c, int dev)
{
	if (dev >= 0 && dev < c->ndev && c->ctx[dev] != NULL)
		c->drv.CtxSetCurrent(c->ctx[dev]);
}

static int cu_classify(void *ctx, const void *addr, size_t len, int *device)
{
	cuda_ctx *c = ctx;
	unsigned type = 0;
	int ordinal = -1;
	CUdeviceptr p = (CUdeviceptr)(uintptr_t)addr, start = 0;
	size_t size = 0;

	make_current(c, 0);
	/* Host memory, even page-locked host memory, is not device memory. */
	if (c->drv.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) != CUDA_SUCCESS ||
	    type != CU_MEMORYTYPE_DEVICE)
		return 0;
	if (c->drv.PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) !=
		    CUDA_SUCCESS ||
	    c->drv.PointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p) !=
		    CUDA_SUCCESS ||
	    c->drv.PointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p) != CUDA_SUCCESS)
		return -EIO;
	if (p + len > start + size) {
		c->host->log(c->host, TE_LOG_ERROR,
			     "%p+%zu runs past its device allocation (%zu bytes at %#llx)", addr, len,
			     size, start);
		return -EINVAL;
	}
	*device = ordinal;
	return 1;
}

static int cu_copy(void *ctx, void *dst, const void *src, size_t len)
{
	cuda_ctx *c = ctx;

	make_current(c, 0);
	/* Unified addressing: one call for every direction. */
	CUresult r = c->drv.Memcpy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, len);
	if (r != CUDA_SUCCESS) {
		c->host->log(c->host, TE_LOG_ERROR, "cuMemcpy of %zu bytes: %s", len,
			     errstr(&c->drv, r));
		return -EIO;
	}
	return 0;
}

/* ------------------------------------------------------ asynchronous copies */

/* The driver's stream callback: on a driver thread, which must not call the
 * driver. The copy's owner is told on the completer thread instead, where
 * it may start the next copy. */
static void on_stream_done(CUstream stream, CUresult status, void *user)
{
	cu_done *d = user;
	cuda_ctx *owner = d->owner;
	(void)stream;

	d->status = status;
	pthread_mutex_lock(&owner->lock);
	if (owner->tail)
		owner->tail->next = d;
	else
		owner->head = d;
	owner->tail = d;
	pthread_cond_signal(&owner->cond);
	pthread_mutex_unlock(&owner->lock);
}

static void *completer(void *arg)
{
	cuda_ctx *c = arg;

	pthread_mutex_lock(&c->lock);
	for (;;) {
		while (c->head == NULL && !c->quit)
			pthread_cond_wait(&c->cond, &c->lock);
		cu_done *d = c->head;
		if (d == NULL)
			break; /* quit, and every reported copy delivered */
		c->head = d->next;
		if (c->head == NULL)
			c->tail = NULL;
		pthread_mutex_unlock(&c->lock);
		if (d->status != CUDA_SUCCESS)
			c->host->log(c->host, TE_LOG_ERROR, "asynchronous copy of %zu bytes: %s", d->len,
				     errstr(&c->drv, d->status));
		d->done(d->arg, d->status == CUDA_SUCCESS ? 0 : -EIO);
		free(d);
		pthread_mutex_lock(&c->lock);
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

/* Streams on device 0's context (unified addressing: any direction, any
 * device) and the completer thread; false (copies stay synchronous) when the
 * driver lacks the calls or refuses. */
static bool async_start(cuda_ctx *c)
{
	driver *d = &c->drv;
	int made = 0;

	if (d->StreamCreate == NULL || d->StreamDestroy == NULL || d->MemcpyAsync == NULL ||
	    d->StreamAddCallback == NULL || c->ctx[0] == NULL)
		return false;
	make_current(c, 0);
	for (; made < STREAMS; made++) {
		CUresult r = d->StreamCreate(&c->streams[made], CU_STREAM_NON_BLOCKING);
		if (r != CUDA_SUCCESS) {
			c->host->log(c->host, TE_LOG_INFO, "no stream for asynchronous copies: %s", errstr(d, r));
			break;
		}
	}
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	if (made == STREAMS && pthread_create(&c->completer, NULL, completer, c) == 0)
		return true;
	while (made > 0)
		d->StreamDestroy(c->streams[--made]);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	return false;
}

/* Every copy started has been reported to its owner when this returns. The
 * host destroys device plugins after every engine, so no done() starts a
 * copy here any more. */
static void async_stop(cuda_ctx *c)
{
	if (!c->async)
		return;
	make_current(c, 0);
	for (int i = 0; i < STREAMS; i++) {
		c->drv.StreamSynchronize(c->streams[i]); /* its callbacks have run */
		c->drv.StreamDestroy(c->streams[i]);
	}
	pthread_mutex_lock(&c->lock);
	c->quit = true;
	pthread_cond_signal(&c->cond);
	pthread_mutex_unlock(&c->lock);
	pthread_join(c->completer, NULL);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	c->async = false;
}

/* cuMemcpyAsync on the next stream, then a stream callback that reports
 * the copy's end: the caller's thread never waits for the copy. */
static int cu_copy_async(void *ctx, void *dst, const void *src, size_t len, te_device_done_fn done,
			 void *arg)
{
	cuda_ctx *c = ctx;

	if (!c->async)
		return -ENOTSUP;
	cu_done *d = malloc(sizeof *d);
	if (d == NULL)
		return -ENOMEM;
	*d = (cu_done){ .owner = c, .done = done, .arg = arg, .len = len };
	CUstream s = c->streams[atomic_fetch_add_explicit(&c->next_stream, 1, memory_order_relaxed) % STREAMS];
	make_current(c, 0);
	CUresult r = c->drv.MemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, len, s);
	if (r != CUDA_SUCCESS) {
		c->host->log(c->host, TE_LOG_ERROR, "cuMemcpyAsync of %zu bytes: %s", len, errstr(&c->drv, r));
		free(d);
		return -EIO;
	}
	r = c->drv.StreamAddCallback(s, on_stream_done, d, 0);
	if (r != CUDA_SUCCESS) {
		/* The copy is queued and nothing would report its end: wait for
		 * it here (done may run before copy_async returns). */
		if (!atomic_exchange(&c->said_sync, true))
			c->host->log(c->host, TE_LOG_WARN,
				     "cuStreamAddCallback: %s; waiting for copies instead (said once)",
				     errstr(&c->drv, r));
		free(d);
		r = c->drv.StreamSynchronize(s);
		if (r != CUDA_SUCCESS)
			c->host->log(c->host, TE_LOG_ERROR, "copy of %zu bytes: %s", len, errstr(&c->drv, r));
		done(arg, r == CUDA_SUCCESS ? 0 : -EIO);
	}
	return 0;
}

static int cu_host_alloc(void *ctx, size_t len, void **ptr)
{
	cuda_ctx *c = ctx;

	make_current(c, 0);
	return c->drv.MemHostAlloc(ptr, len, CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS ? 0
										      : -ENOMEM;
}

static void cu_host_free(void *ctx, void *ptr)
{
	cuda_ctx *c = ctx;
	make_current(c, 0);
	c->drv.MemFreeHost(ptr);
}

static int cu_mem_alloc(void *ctx, int device, size_t len, void **ptr)
{
	cuda_ctx *c = ctx;
	CUdeviceptr p = 0;

	if (device < 0 || device >= c->ndev || c->ctx[device] == NULL)
		return -ENODEV;
	make_current(c, device);
	CUresult r = c->drv.MemAlloc(&p, len);
	if (r != CUDA_SUCCESS) {
		c->host->log(c->host, TE_LOG_ERROR, "cuMemAlloc of %zu bytes on device %d: %s", len,
			     device, errstr(&c->drv, r));
		return -ENOMEM;
	}
	*ptr = (void *)(uintptr_t)p;
	return 0;
}

static void cu_mem_free(void *ctx, void *ptr)
{
	cuda_ctx *c = ctx;
	int dev = 0;

	c->drv.PointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
				   (CUdeviceptr)(uintptr_t)ptr);
	make_current(c, dev);
	c->drv.MemFree((CUdeviceptr)(uintptr_t)ptr);
}

static int cu_export_dmabuf(void *ctx, const void *addr, size_t len, int *fd, uint64_t *offset)
{
	cuda_ctx *c = ctx;
	CUdeviceptr p = (CUdeviceptr)(uintptr_t)addr, start = 0;
	size_t size = 0;
	int h = -1;

	if (c->drv.MemGetHandleForAddressRange == NULL)
		return -ENOTSUP;
	make_current(c, 0);
	/* The handle covers whole allocations: export the allocation, and say
	 * where the range starts in it. */
	if (c->drv.PointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p) !=
		    CUDA_SUCCESS ||
	    c->drv.PointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p) != CUDA_SUCCESS ||
	    p + len > start + size)
		return -EINVAL;
	CUresult r = c->drv.MemGetHandleForAddressRange(&h, start, size,
							CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	if (r != CUDA_SUCCESS) {
		c->host->log(c->host, TE_LOG_INFO, "no dma-buf for %p: %s", addr, errstr(&c->drv, r));
		return -ENOTSUP;
	}
	*fd = h;
	*offset = p - start;
	return 0;
}

/* ------------------------------------------------- other processes (IPC) */

static bool has_ipc(const cuda_ctx *c)
{
	return c->drv.IpcGetMemHandle != NULL && c->drv.IpcOpenMemHandle != NULL &&
	       c->drv.IpcCloseMemHandle != NULL;
}

/* CUDA IPC handles name whole cuMemAlloc allocations: export the
 * allocation holding the range. */
static int cu_ipc_export(void *ctx, const void *addr, size_t len, te_device_ipc *ipc)
{
	cuda_ctx *c = ctx;
	CUdeviceptr p = (CUdeviceptr)(uintptr_t)addr, start = 0;
	size_t size = 0;
	int dev = -1;
	CUipcMemHandle h;

	if (!has_ipc(c))
		return -ENOTSUP;
	if (cu_classify(c, addr, len, &dev) != 1 ||
	    c->drv.PointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p) != CUDA_SUCCESS ||
	    c->drv.PointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p) != CUDA_SUCCESS)
		return -EINVAL;
	make_current(c, dev);
	CUresult r = c->drv.IpcGetMemHandle(&h, start);
	if (r != CUDA_SUCCESS) {
		/* e.g. memory from cuMemCreate, which IPC handles do not cover */
		c->host->log(c->host, TE_LOG_INFO, "no IPC handle for %p: %s", addr, errstr(&c->drv, r));
		return -ENOTSUP;
	}
	_Static_assert(sizeof h <= sizeof ipc->handle, "IPC handle size");
	memcpy(ipc->handle, &h, sizeof h);
	ipc->handle_len = sizeof h;
	ipc->device = dev;
	ipc->fd = -1;
	ipc->alloc_base = start;
	ipc->alloc_size = size;
	return 0;
}

static int cu_ipc_open(void *ctx, const te_device_ipc *ipc, void **base)
{
	cuda_ctx *c = ctx;
	CUipcMemHandle h;
	CUdeviceptr p = 0;

	if (!has_ipc(c))
		return -ENOTSUP;
	if (ipc->handle_len != sizeof h)
		return -EINVAL;
	memcpy(&h, ipc->handle, sizeof h);
	/* Opened in the context of the device of the same index here, or of
	 * device 0; lazy peer access lets a copy reach it from any device. */
	make_current(c, ipc->device >= 0 && ipc->device < c->ndev ? ipc->device : 0);
	CUresult r = c->drv.IpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	if (r != CUDA_SUCCESS) {
		c->host->log(c->host, TE_LOG_WARN, "cuIpcOpenMemHandle of another process's cuda:%d memory: %s",
			     ipc->device, errstr(&c->drv, r));
		return -EIO;
	}
	*base = (void *)(uintptr_t)p;
	return 0;
}

static void cu_ipc_close(void *ctx, void *base)
{
	cuda_ctx *c = ctx;

	make_current(c, 0);
	CUresult r = c->drv.IpcCloseMemHandle((CUdeviceptr)(uintptr_t)base);
	if (r != CUDA_SUCCESS)
		c->host->log(c->host, TE_LOG_WARN, "cuIpcCloseMemHandle(%p): %s", base, errstr(&c->drv, r));
}

static int cu_stream_wait(void *ctx, void *stream)
{
	cuda_ctx *c = ctx;

	make_current(c, 0);
	CUresult r = c->drv.StreamSynchronize(stream);
	if (r != CUDA_SUCCESS) {
		c->host->log(c->host, TE_LOG_ERROR, "cuStreamSynchronize: %s", errstr(&c->drv, r));
		return -EIO;
	}
	return 0;
}

static int numa_of(const char *bus_id)
{
	char path[128], lower[32];
	size_t i;
	int node = -1;

	for (i = 0; bus_id[i] != '\0' && i + 1 < sizeof lower; i++)
		lower[i] = (char)(bus_id[i] >= 'A' && bus_id[i] <= 'F' ? bus_id[i] + 32 : bus_id[i]);
	lower[i] = '\0';
	snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", lower);
	FILE *f = fopen(path, "r");
	if (f != NULL) {
		if (fscanf(f, "%d", &node) != 1)
			node = -1;
		fclose(f);
	}
	return node;
}

static int cu_devices(void *ctx, te_device_info *out, size_t max, size_t *n)
{
	cuda_ctx *c = ctx;

	*n = (size_t)c->ndev;
	for (int i = 0; i < c->ndev && (size_t)i < max; i++) {
		te_device_info *d = &out[i];
		CUdevice dev;
		size_t mem = 0;

		snprintf(d->location, sizeof d->location, "cuda:%d", i);
		if (c->drv.DeviceGet(&dev, i) != CUDA_SUCCESS)
			continue;
		if (c->drv.DeviceGetName(d->name, (int)sizeof d->name, dev) != CUDA_SUCCESS)
			snprintf(d->name, sizeof d->name, "?");
		if (c->drv.DeviceTotalMem(&mem, dev) == CUDA_SUCCESS)
			d->memory = mem;
		if (c->drv.DeviceGetPCIBusId(d->pci_bus_id, (int)sizeof d->pci_bus_id, dev) ==
		    CUDA_SUCCESS)
			d->numa_node = numa_of(d->pci_bus_id);
		else
			d->pci_bus_id[0] = '\0';
	}
	return 0;
}

static const te_device_ops ops = {
	.size = sizeof(te_device_ops),
	.prefix = "cuda",
	.probe = cu_probe,
	.create = cu_create,
	.destroy = cu_destroy,
	.classify = cu_classify,
	.copy = cu_copy,
	.copy_async = cu_copy_async,
	.host_alloc = cu_host_alloc,
	.host_free = cu_host_free,
	.mem_alloc = cu_mem_alloc,
	.mem_free = cu_mem_free,
	.export_dmabuf = cu_export_dmabuf,
	.devices = cu_devices,
	.stream_wait = cu_stream_wait,
	.ipc_export = cu_ipc_export,
	.ipc_open = cu_ipc_open,
	.ipc_close = cu_ipc_close,
};

TE_PLUGIN_DEFINE(TE_KIND_DEVICE, "cuda", "1.0", "NVIDIA GPU memory through the CUDA driver API",
		 "Apache-2.0", &ops)
