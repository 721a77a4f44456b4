/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The GPU device plugins (CUDA, HIP) take the same steps through two vendor
 * APIs; what differs is only the calls' names, or how a call finds its
 * device (a CUDA context, HIP's current device). This is those steps once:
 *
 *   - a plugin's context begins with a teu_gpu: the host, the devices, the
 *     vendor's hooks (teu_gpu_vendor) and the calls both APIs spell alike
 *     (teu_gpu_calls), looked up in the vendor's library;
 *   - the ops that make no call of their own (probe, create, the device
 *     table, waiting on and queuing host work in an application's stream)
 *     run here on them;
 *   - TEU_GPU_PLUGIN() writes the plugin's ops table and entry, and
 *     TEU_GPU_DECLARE_OPS() declares its op functions, from one naming rule:
 *     the ops of plugin `p` are p_classify, p_copy, ..., p_ipc_close.
 *
 * Plain C with te-plugin.h; the vendors' own declarations stay with their
 * plugins (util/teu-cuda.h for CUDA).
 */
#ifndef TEU_GPU_H
#define TEU_GPU_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <te/te-plugin.h>

/* The most devices a plugin serves (a context holds a slot for each). */
#define TEU_GPU_MAX_DEVICES 64

/* The calls the shared steps make, which the CUDA driver API and the HIP
 * runtime spell alike: a result is an int (0 for success), a device an int,
 * a stream a pointer. Looked up by teu_gpu_found() with the vendor's names,
 * in this order. */
typedef struct teu_gpu_calls {
	int (*DeviceGet)(int *, int);
	int (*DeviceGetName)(char *, int, int);
	int (*DeviceTotalMem)(size_t *, int);
	/* cuDeviceGetPCIBusId takes a CUdevice, hipDeviceGetPCIBusId an
	 * ordinal; hipDeviceGet's device is its ordinal, so the device of
	 * DeviceGet serves both. */
	int (*DeviceGetPCIBusId)(char *, int, int);
	int (*StreamSynchronize)(void *);
	int (*LaunchHostFunc)(void *, void (*)(void *), void *); /* optional (NULL) */
} teu_gpu_calls;

enum { TEU_GPU_NCALLS = 6 };

/* What each vendor's plugin does its own way; TEU_GPU_PLUGIN() fills it from
 * the plugin's functions p_open, p_start, ... (below). */
typedef struct teu_gpu_vendor {
	size_t size;         /* the plugin's context, which begins with a teu_gpu */
	const char *prefix;  /* locations are prefix:N ("cuda") */
	const char *name;    /* in messages: "CUDA" */
	const char *api;     /* the calls' prefix in messages: "cu" */
	const char *library; /* "driver", "runtime" */
	/* Opens the vendor's library into the (zeroed) context: the number of
	 * devices (through teu_gpu_found), or negative with `why`. */
	int (*open)(void *ctx, char *why, size_t why_len);
	/* The rest of create, once open found devices. */
	void (*start)(void *ctx);
	/* The vendor's text for a result. */
	const char *(*errstr)(void *ctx, int err);
	/* Makes the device of `stream` (an application's; a default stream: of
	 * `device`, or with -1 the calling thread's current one) the calling
	 * thread's for the calls that follow, until stream_leave(ctx, *saved)
	 * puts the caller's back: 0, or negative (logged, naming `what`). */
	int (*stream_enter)(void *ctx, int device, void *stream, const char *what, int *saved);
	void (*stream_leave)(void *ctx, int saved);
	/* Whether the plugin has a stream of its own to copy on (none: its
	 * copies would wait for the default stream, where host work queued by
	 * stream_launch may wait for them). */
	bool (*own_stream)(void *ctx);
} teu_gpu_vendor;

/* The beginning of each GPU plugin's context. */
typedef struct teu_gpu {
	const te_host *host;
	int ndev;
	const teu_gpu_vendor *vendor;
	void *lib; /* the vendor's library (dlopen), closed by teu_gpu_free */
	teu_gpu_calls calls;
} teu_gpu;

/* For a vendor's open hook, once its library `lib` counted the devices
 * (`err`, the count's result, 0 for success; `n` the count): their number, at
 * most TEU_GPU_MAX_DEVICES, with g->calls looked up in `lib` by `names`
 * (TEU_GPU_NCALLS, in teu_gpu_calls's order) and `lib` kept in g->lib; else
 * negative and `why` ("no CUDA device (...)"), `lib` closed. */
int teu_gpu_found(teu_gpu *g, void *lib, int err, int n, const char *const names[TEU_GPU_NCALLS], char *why,
		  size_t why_len);

/* probe and create: the library opened by vendor->open (into a context
 * freed again by probe), create's context then made ready by vendor->start;
 * an idle create says why in the log. */
int teu_gpu_probe(const teu_gpu_vendor *v, char *why, size_t why_len);
int teu_gpu_create(const teu_gpu_vendor *v, const te_host *h, void **out);

/* The end of destroy: the library closed, the context freed. */
void teu_gpu_free(teu_gpu *g);

/* The error line of a failed call: 0 when `err` is 0, else -EIO and
 * "`what`: <the vendor's text>" logged. */
int teu_gpu_check(teu_gpu *g, int err, const char *what);

/* A copy's result (`err` of the call named `call`, then `wait` of the wait
 * for it): 0, or -EIO and "<call or copy> of N bytes: <text>" logged. */
int teu_gpu_copied(teu_gpu *g, size_t len, const char *call, int err, int wait);

/* An export of device memory refused (`what`: "dma-buf", "IPC handle"):
 * -ENOTSUP, and "no <what> for <addr>: <the vendor's text for err><more>"
 * logged (the peer then takes another way to the memory). */
int teu_gpu_refused(teu_gpu *g, const char *what, const void *addr, int err, const char *more);

/* export_dmabuf's end, once the vendor's call for the allocation that holds
 * `addr` returned `err` and the descriptor `h`: 0 with *fd = h and *offset =
 * off (where the range starts in the allocation), else teu_gpu_refused. */
int teu_gpu_dmabuf(teu_gpu *g, const void *addr, int err, int h, uint64_t off, int *fd, uint64_t *offset);

/* ipc_export's handle of the allocation [start, start+size) of device
 * `dev`: get(ctx, dev, start, handle) (0 or the vendor's error) writes the
 * vendor's handle (`len` bytes, at most sizeof ipc->handle), which goes to
 * *ipc. 0, or the vendor's error (*ipc left as it was). */
int teu_gpu_ipc_get(teu_gpu *g, te_device_ipc *ipc, size_t len,
		    int (*get)(void *ctx, int dev, uint64_t start, void *handle), int dev, uint64_t start,
		    uint64_t size);

/* ipc_open of another process's export `ipc` whose handle is `len` bytes
 * (the vendor's handle type): on the device of the same index here, or on
 * device 0, through open(ctx, dev, handle, &p) (0 or the vendor's error).
 * 0 with *base = p; -EINVAL for a handle of another length; else -EIO and
 * the vendor's text logged. */
int teu_gpu_ipc_open(teu_gpu *g, const te_device_ipc *ipc, size_t len,
		     int (*open)(void *ctx, int dev, const void *handle, void **p), void **base);

/* copy_batch without a stream: each piece through `copy` (the plugin's
 * synchronous copy), stopping at the first failure. */
int teu_gpu_copy_each(int (*copy)(void *ctx, void *dst, const void *src, size_t len), void *ctx,
		      const te_copy *v, size_t n);

/* Streams for synchronous copies and batches, one per copy or batch in
 * flight: made when first needed (up to `max`), then taken and given back.
 * Never the default stream, which host work queued on it (stream_launch)
 * may hold while it waits for this very copy. */
#define TEU_GPU_POOL_MAX 32
typedef struct teu_gpu_pool {
	pthread_mutex_t lock;
	pthread_cond_t cond; /* a stream came back */
	void *s[TEU_GPU_POOL_MAX]; /* every one made, the free ones first */
	unsigned max, free, made;
} teu_gpu_pool;

void teu_gpu_pool_init(teu_gpu_pool *p, unsigned max);
/* The streams are the plugin's to destroy first (s[0, made)). */
void teu_gpu_pool_fini(teu_gpu_pool *p);
/* A free stream; else a new one from make(ctx, &s) (0, or the vendor's
 * error, logged by make) while fewer than max exist; else the next to come
 * back. NULL only when none could be made and none exists. */
void *teu_gpu_pool_take(teu_gpu_pool *p, int (*make)(void *ctx, void **s), void *ctx);
/* Gives back a stream of the pool's (another, such as a stream the pool
 * stood in for, is left alone). */
void teu_gpu_pool_give(teu_gpu_pool *p, void *s);

/* The ops these steps serve whole. */
int teu_gpu_devices(void *ctx, te_device_info *out, size_t max, size_t *n);
int teu_gpu_stream_wait(void *ctx, void *stream);
int teu_gpu_stream_wait_on(void *ctx, int device, void *stream);
int teu_gpu_stream_launch(void *ctx, void *stream, void (*fn)(void *), void *arg);
int teu_gpu_stream_launch_on(void *ctx, int device, void *stream, void (*fn)(void *), void *arg);

/* The op functions a GPU plugin `p` defines itself (in the files that share
 * its internal header), declared from te_device_ops's signatures. */
#define TEU_GPU_DECLARE_OPS(p)                                                                         \
	int p##_classify(void *ctx, const void *addr, size_t len, int *device);                         \
	int p##_copy(void *ctx, void *dst, const void *src, size_t len);                                \
	int p##_copy_async(void *ctx, void *dst, const void *src, size_t len, te_device_done_fn done,  \
			   void *arg);                                                                   \
	int p##_copy_batch(void *ctx, const te_copy *v, size_t n, unsigned flags);                      \
	int p##_host_alloc(void *ctx, size_t len, void **ptr);                                          \
	void p##_host_free(void *ctx, void *ptr);                                                       \
	int p##_mem_alloc(void *ctx, int device, size_t len, void **ptr);                               \
	void p##_mem_free(void *ctx, void *ptr);                                                        \
	int p##_export_dmabuf(void *ctx, const void *addr, size_t len, int *fd, uint64_t *offset);      \
	int p##_ipc_export(void *ctx, const void *addr, size_t len, te_device_ipc *ipc);                \
	int p##_ipc_open(void *ctx, const te_device_ipc *ipc, void **base);                             \
	void p##_ipc_close(void *ctx, void *base)

/* A GPU plugin's vendor hooks, ops table and entry: `p` names its functions
 * (p_open, p_start, p_errstr, p_stream_enter, p_stream_leave, p_own_stream,
 * p_destroy and the ops of TEU_GPU_DECLARE_OPS), `ctx_type` its context,
 * `name_` ("CUDA"), `api_` ("cu") and `library_` ("driver") its messages'
 * words. */
#define TEU_GPU_PLUGIN(p, ctx_type, name_, api_, library_, description)                                \
	static const teu_gpu_vendor p##_vendor = {                                                      \
		.size = sizeof(ctx_type), .prefix = #p, .name = name_, .api = api_,                     \
		.library = library_, .open = p##_open, .start = p##_start, .errstr = p##_errstr,        \
		.stream_enter = p##_stream_enter, .stream_leave = p##_stream_leave,                     \
		.own_stream = p##_own_stream,                                                           \
	};                                                                                              \
	static int p##_probe(const te_host *h, char *why, size_t why_len)                               \
	{                                                                                               \
		(void)h;                                                                                \
		return teu_gpu_probe(&p##_vendor, why, why_len);                                        \
	}                                                                                               \
	static int p##_create(const te_host *h, void **out)                                             \
	{                                                                                               \
		return teu_gpu_create(&p##_vendor, h, out);                                             \
	}                                                                                               \
	static const te_device_ops p##_ops = {                                                          \
		.size = sizeof(te_device_ops), .prefix = #p, .probe = p##_probe,                        \
		.create = p##_create, .destroy = p##_destroy, .classify = p##_classify,                 \
		.copy = p##_copy, .copy_async = p##_copy_async, .copy_batch = p##_copy_batch,           \
		.host_alloc = p##_host_alloc, .host_free = p##_host_free,                               \
		.mem_alloc = p##_mem_alloc, .mem_free = p##_mem_free,                                   \
		.export_dmabuf = p##_export_dmabuf, .ipc_export = p##_ipc_export,                       \
		.ipc_open = p##_ipc_open, .ipc_close = p##_ipc_close,                                   \
		.devices = teu_gpu_devices, .stream_wait = teu_gpu_stream_wait,                         \
		.stream_launch = teu_gpu_stream_launch, .stream_wait_on = teu_gpu_stream_wait_on,       \
		.stream_launch_on = teu_gpu_stream_launch_on,                                           \
	};                                                                                              \
	TE_PLUGIN_DEFINE(TE_KIND_DEVICE, #p, "1.0", description, "Apache-2.0", &p##_ops)

#endif
