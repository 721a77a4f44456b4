/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA device plugin: NVIDIA GPU memory through the CUDA driver API.
 * libcuda.so.1 is opened with dlopen() when the plugin is probed, so neither
 * the plugin nor libte needs the CUDA toolkit to build or a GPU to run:
 * without the library or a device the plugin stays idle and says why.
 * This file opens the driver, makes and ends the plugin's context, tells
 * device memory apart and finds a stream's context; cuda-copy.c copies and
 * cuda-share.c shares (cuda-internal.h). The steps it takes as the HIP plugin
 * does (probe, create, the device table, the stream ops, the ops table) are
 * util/teu-gpu.h's.
 */
#include "cuda-internal.h"
#include "teu-devmem.h"

/* The calls the shared steps make (teu_gpu_calls), by their names here. */
static const char *const CU_CALLS[TEU_GPU_NCALLS] = { "cuDeviceGet", "cuDeviceGetName", "cuDeviceTotalMem_v2",
						      "cuDeviceGetPCIBusId", "cuStreamSynchronize",
						      "cuLaunchHostFunc" };

static int cuda_open(void *ctx, char *why, size_t why_len)
{
	cuda_ctx *c = ctx;
	int rc = teu_cu_open(&c->drv, why, why_len);
	if (rc != 0)
		return rc;
	CUresult r = c->drv.Init(0);
	int n = 0;
	if (r == CUDA_SUCCESS)
		r = c->drv.DeviceGetCount(&n);
	return teu_gpu_found(&c->g, c->drv.lib, r, n, CU_CALLS, why, why_len);
}

static const char *cuda_errstr(void *ctx, int err)
{
	cuda_ctx *c = ctx;
	return teu_cu_errstr(&c->drv, err);
}

/* The application's threads call the plugin too (registering memory,
 * te_device_copy, te_device_alloc, creating an engine), each with the
 * context it works in current. The plugin makes its own current for its
 * calls (cu_make_current) and puts the caller's back before it returns, so
 * that the application's next launch goes where it left it. */
static CUcontext callers(cuda_ctx *c)
{
	CUcontext cur = NULL;
	if (c->drv.CtxGetCurrent(&cur) != CUDA_SUCCESS)
		cur = NULL;
	return cur;
}

static void restore(cuda_ctx *c, CUcontext cur)
{
	c->drv.CtxSetCurrent(cur); /* NULL: none current, as before */
}

#define KEEP_CALLERS(name, params, args)       \
	static int cuda_##name params          \
	{                                      \
		cuda_ctx *c = ctx;             \
		CUcontext cur = callers(c);    \
		int rc = cu_##name args;       \
		restore(c, cur);               \
		return rc;                     \
	}
#define KEEP_CALLERS_VOID(name, params, args)  \
	static void cuda_##name params         \
	{                                      \
		cuda_ctx *c = ctx;             \
		CUcontext cur = callers(c);    \
		cu_##name args;                \
		restore(c, cur);               \
	}
KEEP_CALLERS(classify, (void *ctx, const void *addr, size_t len, int *device), (ctx, addr, len, device))
KEEP_CALLERS(copy, (void *ctx, void *dst, const void *src, size_t len), (ctx, dst, src, len))
KEEP_CALLERS(copy_batch, (void *ctx, const te_copy *v, size_t n, unsigned flags), (ctx, v, n, flags))
KEEP_CALLERS(host_alloc, (void *ctx, size_t len, void **ptr), (ctx, len, ptr))
KEEP_CALLERS_VOID(host_free, (void *ctx, void *ptr), (ctx, ptr))
KEEP_CALLERS(mem_alloc, (void *ctx, int device, size_t len, void **ptr), (ctx, device, len, ptr))
KEEP_CALLERS_VOID(mem_free, (void *ctx, void *ptr), (ctx, ptr))
KEEP_CALLERS(export_dmabuf, (void *ctx, const void *addr, size_t len, int *fd, uint64_t *offset),
	     (ctx, addr, len, fd, offset))
KEEP_CALLERS(ipc_export, (void *ctx, const void *addr, size_t len, te_device_ipc *ipc), (ctx, addr, len, ipc))
KEEP_CALLERS(ipc_open, (void *ctx, const te_device_ipc *ipc, void **base), (ctx, ipc, base))
KEEP_CALLERS_VOID(ipc_close, (void *ctx, void *base), (ctx, base))

/* copy_async makes no driver call on the caller's thread (the submitting
 * thread does): nothing to keep. */
static int cuda_copy_async(void *ctx, void *dst, const void *src, size_t len, te_device_done_fn done, void *arg)
{
	return cu_copy_async(ctx, dst, src, len, done, arg);
}

/* The rest of create, once the driver counted the devices. */
static void cuda_start(void *ctx)
{
	cuda_ctx *c = ctx;
	const te_host *h = c->g.host;

	for (int i = 0; i < c->g.ndev; i++) {
		CUdevice dev;
		CUresult r = c->drv.DeviceGet(&dev, i);
		if (r == CUDA_SUCCESS)
			r = c->drv.DevicePrimaryCtxRetain(&c->ctx[i], dev);
		if (r != CUDA_SUCCESS) {
			h->log(h, TE_LOG_WARN, "device %d: no context: %s", i, teu_cu_errstr(&c->drv, r));
			c->ctx[i] = NULL;
		}
	}
	const char *alloc = h->config(h, "TE_CUDA_ALLOC", NULL);
	const char *gather = h->config(h, "TE_CUDA_GATHER", NULL);
	const char *wait = h->config(h, "TE_CUDA_WAIT", NULL);
	c->wait_spin = wait != NULL && strcmp(wait, "spin") == 0;
	if (wait != NULL && strcmp(wait, "poll") == 0)
		c->poll_us = (unsigned)te_host_config_u64(h, "TE_CUDA_POLL_US", NULL, 20, 1, 10000);
	else if (wait != NULL && !c->wait_spin && strcmp(wait, "block") != 0)
		h->log(h, TE_LOG_WARN, "TE_CUDA_WAIT=%s: not 'block', 'poll' or 'spin'; blocking it is", wait);
	c->alloc_vmm = alloc != NULL && strcmp(alloc, "vmm") == 0;
	c->gather_mode = gather == NULL || strcmp(gather, "1") == 0 || strcmp(gather, "device") == 0 ? GATHER_DEVICE
			 : strcmp(gather, "0") == 0				   ? GATHER_OFF
			 : strcmp(gather, "host") == 0				   ? GATHER_HOST
										   : -1;
	if (c->gather_mode < 0) {
		h->log(h, TE_LOG_WARN, "TE_CUDA_GATHER=%s: not '0', 'device' or 'host'; device it is", gather);
		c->gather_mode = GATHER_DEVICE;
	}
	if (alloc != NULL && !c->alloc_vmm && strcmp(alloc, "legacy") != 0)
		h->log(h, TE_LOG_WARN, "TE_CUDA_ALLOC=%s: not 'legacy' or 'vmm'; cuMemAlloc it is", alloc);
	teu_gpu_pool_init(&c->pool, POOL_MAX);
	c->streams = c->drv.StreamCreate != NULL && c->drv.StreamDestroy != NULL && c->drv.MemcpyAsync != NULL &&
		     c->ctx[0] != NULL;
	pthread_mutex_init(&c->gather_lock, NULL);
	pthread_mutex_init(&c->host_lock, NULL);
	pthread_mutex_init(&c->vmm_lock, NULL);
	pthread_mutex_init(&c->ev_lock, NULL);
	CUcontext caller = callers(c);
	c->async = cu_async_start(c);
	restore(c, caller);
}

static void cuda_destroy(void *ctx)
{
	cuda_ctx *c = ctx;
	CUcontext caller = callers(c);

	cu_async_stop(c);
	cu_make_current(c, 0);
	for (unsigned i = 0; i < c->pool.made; i++) {
		c->drv.StreamSynchronize(c->pool.s[i]);
		c->drv.StreamDestroy(c->pool.s[i]);
	}
	if (atomic_load(&c->gather_state) == 1)
		c->drv.ModuleUnload(c->gather_mod);
	for (unsigned i = 0; i < c->nevents; i++)
		c->drv.EventDestroy(c->events[i]);
	while (c->maps != NULL) { /* left mapped by their users: ours to drop now */
		vmm_map *m = c->maps;
		c->maps = m->next;
		c->drv.MemUnmap(m->base, m->size);
		c->drv.MemAddressFree(m->base, m->size);
		free(m);
	}
	teu_gpu_pool_fini(&c->pool);
	pthread_mutex_destroy(&c->gather_lock);
	while (c->hosts != NULL) { /* page-locked memory its users did not free */
		host_map *m = c->hosts;
		c->hosts = m->next;
		free(m);
	}
	pthread_mutex_destroy(&c->host_lock);
	pthread_mutex_destroy(&c->vmm_lock);
	pthread_mutex_destroy(&c->ev_lock);
	restore(c, caller);
	for (int i = 0; i < c->g.ndev; i++)
		if (c->ctx[i] != NULL)
			c->drv.DevicePrimaryCtxRelease(i);
	teu_gpu_free(&c->g);
}

void cu_make_current(cuda_ctx *c, int dev)
{
	if (dev >= 0 && dev < c->g.ndev && c->ctx[dev] != NULL)
		c->drv.CtxSetCurrent(c->ctx[dev]);
}

int cu_classify(void *ctx, const void *addr, size_t len, int *device)
{
	cuda_ctx *c = ctx;
	unsigned type = 0;
	int ordinal = -1;
	CUdeviceptr p = (CUdeviceptr)(uintptr_t)addr, start = 0;
	size_t size = 0;

	cu_make_current(c, 0);
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
	if (teu_range_check(c->g.host, addr, len, (uintptr_t)start, size) < 0)
		return -EINVAL;
	*device = ordinal;
	return 1;
}

/* The default streams' handles: the legacy stream (0 and CU_STREAM_LEGACY)
 * and the per-thread one (CU_STREAM_PER_THREAD), each the calling thread's
 * current context's. */
static bool default_stream(CUstream s)
{
	return (uintptr_t)s <= 2;
}

/* Makes the context `stream` belongs to current in the calling thread, over
 * the caller's (cuCtxPushCurrent; stream_leave puts the caller's back): the
 * context cuStreamGetCtx names for a stream the application made, whatever
 * is current; for a default stream device `device`'s primary context, or
 * with -1 the caller's current one. The application's thread may have any
 * device current (cudaSetDevice), and the call must leave it so. 0, or
 * negative (logged). Nothing to save: the push keeps the caller's. */
static int cuda_stream_enter(void *ctx, int device, void *stream, const char *what, int *saved)
{
	cuda_ctx *c = ctx;
	teu_cu_driver *d = &c->drv;
	CUcontext want = NULL;
	CUresult r;

	*saved = 0;
	if (device >= c->g.ndev || (device >= 0 && c->ctx[device] == NULL)) {
		c->g.host->log(c->g.host, TE_LOG_ERROR, "%s: no device cuda:%d here", what, device);
		return -ENODEV;
	}
	if (!default_stream(stream) && d->StreamGetCtx != NULL) {
		r = d->StreamGetCtx(stream, &want);
		if (r != CUDA_SUCCESS) {
			c->g.host->log(c->g.host, TE_LOG_ERROR, "%s: cuStreamGetCtx of stream %p: %s", what, stream,
				       teu_cu_errstr(d, r));
			return -EINVAL;
		}
	} else if (device >= 0) {
		want = c->ctx[device];
	} else if (d->CtxGetCurrent(&want) != CUDA_SUCCESS || want == NULL) {
		want = c->ctx[0]; /* nothing current: the runtime's default device */
	}
	if (!default_stream(stream) && d->StreamGetCtx == NULL && !atomic_exchange(&c->said_no_stream_ctx, true))
		c->g.host->log(c->g.host, TE_LOG_WARN,
			       "this CUDA driver has no cuStreamGetCtx: a stream is taken for the device of its "
			       "location, or else the calling thread's current one (said once)");
	r = d->CtxPushCurrent(want);
	if (r != CUDA_SUCCESS) {
		c->g.host->log(c->g.host, TE_LOG_ERROR, "%s: cuCtxPushCurrent: %s", what, teu_cu_errstr(d, r));
		return -EIO;
	}
	CUdevice dev, named;
	if (device >= 0 && !default_stream(stream) && d->CtxGetDevice != NULL &&
	    d->CtxGetDevice(&dev) == CUDA_SUCCESS && d->DeviceGet(&named, device) == CUDA_SUCCESS &&
	    dev != named) {
		d->CtxPopCurrent(&want);
		c->g.host->log(c->g.host, TE_LOG_ERROR, "%s: stream %p belongs to another device than cuda:%d", what,
			       stream, device);
		return -EINVAL;
	}
	return 0;
}

static void cuda_stream_leave(void *ctx, int saved)
{
	cuda_ctx *c = ctx;
	CUcontext popped;

	(void)saved;
	c->drv.CtxPopCurrent(&popped);
}

TEU_GPU_PLUGIN(cuda, cuda_ctx, "CUDA", "cu", "driver", "NVIDIA GPU memory through the CUDA driver API")
