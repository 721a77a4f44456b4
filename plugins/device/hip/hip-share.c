/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The HIP plugin's memory for others: allocations (hipMalloc), dma-bufs for
 * RDMA, and exports to and imports from other processes of the host (HIP
 * IPC handles).
 */
#include "hip-internal.h"
#include "teu-devmem.h"

int hip_mem_alloc(void *ctx, int device, size_t len, void **ptr)
{
	hip_ctx *c = ctx;
	void *p = NULL;

	if (device < 0 || device >= c->g.ndev)
		return -ENODEV;
	int old = device_enter(c, device);
	hipError_t e = c->rt.Malloc(&p, len);
	device_leave(c, device, old);
	if (e != hipSuccess) {
		c->g.host->log(c->g.host, TE_LOG_ERROR, "hipMalloc of %zu bytes on device %d: %s", len, device,
			       errstr(&c->rt, e));
		return -ENOMEM;
	}
	*ptr = p;
	return 0;
}

void hip_mem_free(void *ctx, void *ptr)
{
	hip_ctx *c = ctx;
	int dev = 0;

	if (c->rt.PointerGetAttribute(&dev, HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) != hipSuccess)
		dev = 0;
	int old = device_enter(c, dev);
	hipError_t e = c->rt.Free(ptr);
	device_leave(c, dev, old);
	if (e != hipSuccess)
		c->g.host->log(c->g.host, TE_LOG_WARN, "hipFree(%p): %s", ptr, errstr(&c->rt, e));
}

int hip_export_dmabuf(void *ctx, const void *addr, size_t len, int *fd, uint64_t *offset)
{
	hip_ctx *c = ctx;
	void *p = (void *)(uintptr_t)addr;
	uintptr_t start = 0;
	size_t size = 0;
	uint64_t off = 0;
	int h = -1;

	if (c->rt.MemGetHandleForAddressRange == NULL)
		return -ENOTSUP;
	/* Export the whole allocation, and say where the range starts in it. */
	if (!range_of(c, p, &start, &size) || !teu_range_in((uintptr_t)addr, len, start, size, &off))
		return -EINVAL;
	hipError_t e = c->rt.MemGetHandleForAddressRange(&h, (void *)start, size,
							 hipMemRangeHandleTypeDmaBufFd, 0);
	return teu_gpu_dmabuf(&c->g, addr, e, h, off, fd, offset);
}

/* ------------------------------------------------- other processes (IPC) */

static bool has_ipc(const hip_ctx *c)
{
	return c->rt.IpcGetMemHandle != NULL && c->rt.IpcOpenMemHandle != NULL &&
	       c->rt.IpcCloseMemHandle != NULL;
}

/* The handle of the allocation at `start`, asked on device `dev`. */
static int ipc_get_on(void *ctx, int dev, uint64_t start, void *handle)
{
	hip_ctx *c = ctx;
	int old = device_enter(c, dev);
	hipError_t e = c->rt.IpcGetMemHandle(handle, (void *)(uintptr_t)start);

	device_leave(c, dev, old);
	return e;
}

/* HIP IPC handles name whole hipMalloc allocations: export the allocation
 * holding the range. */
int hip_ipc_export(void *ctx, const void *addr, size_t len, te_device_ipc *ipc)
{
	hip_ctx *c = ctx;
	uintptr_t start = 0;
	size_t size = 0;
	int dev = -1;

	if (!has_ipc(c))
		return -ENOTSUP;
	if (hip_classify(c, addr, len, &dev) != 1 || !range_of(c, (void *)(uintptr_t)addr, &start, &size))
		return -EINVAL;
	_Static_assert(sizeof(hipIpcMemHandle_t) <= sizeof ipc->handle, "IPC handle size");
	int e = teu_gpu_ipc_get(&c->g, ipc, sizeof(hipIpcMemHandle_t), ipc_get_on, dev, start, size);
	return e != hipSuccess ? teu_gpu_refused(&c->g, "IPC handle", addr, e, "") : 0;
}

/* Another process's handle opened on device `dev` (lazy peer access lets
 * a copy reach it from any device). */
static int ipc_open_on(void *ctx, int dev, const void *handle, void **base)
{
	hip_ctx *c = ctx;
	hipIpcMemHandle_t h;
	int old = device_enter(c, dev);

	memcpy(&h, handle, sizeof h);
	hipError_t e = c->rt.IpcOpenMemHandle(base, h, hipIpcMemLazyEnablePeerAccess);
	device_leave(c, dev, old);
	return e;
}

int hip_ipc_open(void *ctx, const te_device_ipc *ipc, void **base)
{
	hip_ctx *c = ctx;

	if (!has_ipc(c))
		return -ENOTSUP;
	return teu_gpu_ipc_open(&c->g, ipc, sizeof(hipIpcMemHandle_t), ipc_open_on, base);
}

void hip_ipc_close(void *ctx, void *base)
{
	hip_ctx *c = ctx;

	hipError_t e = c->rt.IpcCloseMemHandle(base);
	if (e != hipSuccess)
		c->g.host->log(c->g.host, TE_LOG_WARN, "hipIpcCloseMemHandle(%p): %s", base, errstr(&c->rt, e));
}
