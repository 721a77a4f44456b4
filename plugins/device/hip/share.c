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
	if (e != hipSuccess || h < 0) {
		c->g.host->log(c->g.host, TE_LOG_INFO, "no dma-buf for %p: %s", addr, errstr(&c->rt, e));
		return -ENOTSUP;
	}
	*fd = h;
	*offset = off;
	return 0;
}

/* ------------------------------------------------- other processes (IPC) */

static bool has_ipc(const hip_ctx *c)
{
	return c->rt.IpcGetMemHandle != NULL && c->rt.IpcOpenMemHandle != NULL &&
	       c->rt.IpcCloseMemHandle != NULL;
}

/* HIP IPC handles name whole hipMalloc allocations: export the allocation
 * holding the range. */
int hip_ipc_export(void *ctx, const void *addr, size_t len, te_device_ipc *ipc)
{
	hip_ctx *c = ctx;
	uintptr_t start = 0;
	size_t size = 0;
	int dev = -1;
	hipIpcMemHandle_t h;

	if (!has_ipc(c))
		return -ENOTSUP;
	if (hip_classify(c, addr, len, &dev) != 1 || !range_of(c, (void *)(uintptr_t)addr, &start, &size))
		return -EINVAL;
	int old = device_enter(c, dev);
	hipError_t e = c->rt.IpcGetMemHandle(&h, (void *)start);
	device_leave(c, dev, old);
	if (e != hipSuccess) {
		c->g.host->log(c->g.host, TE_LOG_INFO, "no IPC handle for %p: %s", addr, errstr(&c->rt, e));
		return -ENOTSUP;
	}
	_Static_assert(sizeof h <= sizeof ipc->handle, "IPC handle size");
	teu_ipc_fill(ipc, &h, sizeof h, dev, -1, start, size);
	return 0;
}

int hip_ipc_open(void *ctx, const te_device_ipc *ipc, void **base)
{
	hip_ctx *c = ctx;
	hipIpcMemHandle_t h;
	void *p = NULL;

	if (!has_ipc(c))
		return -ENOTSUP;
	if (teu_ipc_handle(ipc, &h, sizeof h) < 0)
		return -EINVAL;
	/* Opened on the device of the same index here, or on device 0; lazy
	 * peer access lets a copy reach it from any device. */
	int dev = teu_ipc_device(ipc, c->g.ndev);
	int old = device_enter(c, dev);
	hipError_t e = c->rt.IpcOpenMemHandle(&p, h, hipIpcMemLazyEnablePeerAccess);
	device_leave(c, dev, old);
	if (e != hipSuccess) {
		c->g.host->log(c->g.host, TE_LOG_WARN, "hipIpcOpenMemHandle of another process's hip:%d memory: %s",
			     ipc->device, errstr(&c->rt, e));
		return -EIO;
	}
	*base = p;
	return 0;
}

void hip_ipc_close(void *ctx, void *base)
{
	hip_ctx *c = ctx;

	hipError_t e = c->rt.IpcCloseMemHandle(base);
	if (e != hipSuccess)
		c->g.host->log(c->g.host, TE_LOG_WARN, "hipIpcCloseMemHandle(%p): %s", base, errstr(&c->rt, e));
}
