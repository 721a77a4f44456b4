/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device plugins (TE_KIND_DEVICE): te_device_ops. Included by
 * te-plugin.h.
 */
#ifndef TE_TE_DEVICE_H
#define TE_TE_DEVICE_H

#include <te/te-plugin.h>

#ifdef __cplusplus
extern "C" {
#endif

/* --------------------------------------------------------- device plugins */


typedef void (*te_device_done_fn)(void *arg, int error);

/*
 * Device memory (since ABI 1.2). One instance per process: device runtimes
 * are per process. Every op may be called from any thread.
 */
typedef struct te_device_ops {
	uint32_t size;
	uint32_t reserved;
	/* Location prefix of this plugin's devices: "cuda" gives "cuda:N". */
	const char *prefix;
	/* Required. 0 when the plugin can work here, else negative with the
	 * reason in `why` (no driver library, no device): te-info shows it. */
	int (*probe)(const te_host *h, char *why, size_t why_len);
	/* Required. */
	int (*create)(const te_host *h, void **ctx);
	void (*destroy)(void *ctx);
	/* Required. 1 when [addr, addr+len) is device memory of this plugin
	 * (then `*device` is its index), 0 when it is not (host memory or
	 * another plugin's), negative on error. */
	int (*classify)(void *ctx, const void *addr, size_t len, int *device);
	/* Required. Copies `len` bytes, either side device memory or host memory. */
	int (*copy)(void *ctx, void *dst, const void *src, size_t len);
	/* Optional. As copy, returning at once; done(arg, error) runs once the
	 * bytes moved (possibly before it returns, in the caller's thread). A
	 * negative return: nothing was started and done() will not run;
	 * -ENOTSUP: use copy() for this one. done() must not call the plugin's
	 * ops. */
	int (*copy_async)(void *ctx, void *dst, const void *src, size_t len, te_device_done_fn done,
			  void *arg);
	/* Optional. Page-locked host memory for staging buffers. */
	int (*host_alloc)(void *ctx, size_t len, void **ptr);
	void (*host_free)(void *ctx, void *ptr);
	/* Optional. Device memory of device `device`. */
	int (*mem_alloc)(void *ctx, int device, size_t len, void **ptr);
	void (*mem_free)(void *ctx, void *ptr);
	/* Optional. A dma-buf file descriptor (the caller closes it) and the
	 * range's offset in it, for ibv_reg_dmabuf_mr. -ENOTSUP when the driver
	 * offers none. */
	int (*export_dmabuf)(void *ctx, const void *addr, size_t len, int *fd, uint64_t *offset);
	/* Required. Up to `max` devices into `out` (each `out[i].size` set by the
	 * caller); `*n` the number of devices there are. */
	int (*devices)(void *ctx, te_device_info *out, size_t max, size_t *n);
	/* Optional. Waits until the work queued on the runtime's stream (a
	 * CUDA stream: CUstream) before this call has finished. */
	int (*stream_wait)(void *ctx, void *stream);
	/* ---- since ABI 1.3: optional, all three or none ---- */
	/* Lets another process of this host reach the allocation holding
	 * [addr, addr+len): fills `ipc` (its fd, if any, the caller's to close).
	 * -ENOTSUP when the driver cannot share this memory. */
	int (*ipc_export)(void *ctx, const void *addr, size_t len, te_device_ipc *ipc);
	/* Opens an export of another process: `*base` is the allocation's first
	 * byte here; copy() and classify() then know the range. The fd in `ipc`
	 * stays the caller's. */
	int (*ipc_open)(void *ctx, const te_device_ipc *ipc, void **base);
	void (*ipc_close)(void *ctx, void *base);
	/* ---- since ABI 1.5: optional ---- */
	/* Copies n pieces (any directions, TE_COPY_* flags as hints), queued
	 * together and waited for once; returns when all moved. 0, or negative
	 * (logged): any piece may then have moved. Without it the host calls
	 * copy() n times. */
	int (*copy_batch)(void *ctx, const te_copy *copies, size_t n, unsigned flags);
	/* ---- since ABI 1.9: optional ---- */
	/* Queues `fn(arg)` on the runtime's stream (CUDA: cuLaunchHostFunc):
	 * it runs once the work queued before has finished, on a thread of the
	 * runtime, and the stream's later work waits until it returns. `fn`
	 * calls nothing of the runtime (it may block). 0, or negative (logged):
	 * then `fn` never runs. */
	int (*stream_launch)(void *ctx, void *stream, void (*fn)(void *arg), void *arg);
	/* ---- since ABI 1.10: optional, both or none ---- */
	/* stream_launch and stream_wait for a stream of device `device` (the N
	 * of the location "prefix:N"; -1 when the location names none). The
	 * plugin queues where the stream's own device (context) wants it: a
	 * stream the runtime made is its device's, whatever the calling
	 * thread's current device; a default stream (CUDA's 0, HIP's null
	 * stream) is `device`'s, or the calling thread's current device's when
	 * -1. -EINVAL when the stream is another device's than `device`. The
	 * calling thread's current device (CUDA: context) is as it was when
	 * they return. The host prefers them to the two above. */
	int (*stream_launch_on)(void *ctx, int device, void *stream, void (*fn)(void *arg), void *arg);
	int (*stream_wait_on)(void *ctx, int device, void *stream);
} te_device_ops;

#ifdef __cplusplus
}
#endif
#endif /* TE_TE_DEVICE_H */
