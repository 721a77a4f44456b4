/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA plugin's memory for others: allocations (cuMemAlloc, or the
 * virtual memory API's cuMemCreate), dma-bufs for RDMA, and exports to and
 * imports from other processes of the host (IPC handles, or POSIX file
 * descriptors for cuMemCreate memory).
 */
#include "cuda-internal.h"
#include "teu-devmem.h"

/* ------------------------------------------------ the virtual memory API */

static bool has_vmm(const teu_cu_driver *d)
{
	return d->MemGetAllocationGranularity && d->MemCreate && d->MemRelease && d->MemAddressReserve &&
	       d->MemAddressFree && d->MemMap && d->MemUnmap && d->MemSetAccess &&
	       d->MemRetainAllocationHandle && d->MemExportToShareableHandle &&
	       d->MemImportFromShareableHandle;
}

static void vmm_add(cuda_ctx *c, CUdeviceptr base, size_t size, vmm_map *m)
{
	m->base = base;
	m->size = size;
	pthread_mutex_lock(&c->vmm_lock);
	m->next = c->maps;
	c->maps = m;
	pthread_mutex_unlock(&c->vmm_lock);
}

/* Unmaps and frees the range at `base` if this plugin mapped it: true then. */
static bool vmm_drop(cuda_ctx *c, CUdeviceptr base)
{
	vmm_map *m = NULL;

	pthread_mutex_lock(&c->vmm_lock);
	for (vmm_map **pp = &c->maps; *pp != NULL; pp = &(*pp)->next)
		if ((*pp)->base == base) {
			m = *pp;
			*pp = m->next;
			break;
		}
	pthread_mutex_unlock(&c->vmm_lock);
	if (m == NULL)
		return false;
	cu_make_current(c, 0);
	c->drv.MemUnmap(m->base, m->size);
	c->drv.MemAddressFree(m->base, m->size);
	free(m);
	return true;
}

/* Maps a physical allocation at a fresh address, read-write for `dev`. The
 * mapping holds the allocation: the caller releases its handle. */
static CUresult vmm_map_handle(cuda_ctx *c, CUmemGenericAllocationHandle ah, size_t size, int dev,
			       CUdeviceptr *out)
{
	CUdeviceptr p = 0;
	CUmemAccessDesc acc = { .location = { CU_MEM_LOCATION_TYPE_DEVICE, dev },
				.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	CUresult r = c->drv.MemAddressReserve(&p, size, 0, 0, 0);
	if (r != CUDA_SUCCESS)
		return r;
	r = c->drv.MemMap(p, size, 0, ah, 0);
	if (r == CUDA_SUCCESS) {
		r = c->drv.MemSetAccess(p, size, &acc, 1);
		if (r != CUDA_SUCCESS)
			c->drv.MemUnmap(p, size);
	}
	if (r != CUDA_SUCCESS) {
		c->drv.MemAddressFree(p, size);
		return r;
	}
	*out = p;
	return CUDA_SUCCESS;
}

/* te_device_alloc() memory from cuMemCreate (TE_CUDA_ALLOC=vmm), as the
 * frameworks' newer allocators make it: shareable as a file descriptor. */
static int vmm_alloc(cuda_ctx *c, int device, size_t len, void **ptr)
{
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
				     .location = { CU_MEM_LOCATION_TYPE_DEVICE, device } };
	CUmemGenericAllocationHandle ah;
	CUdeviceptr p = 0;
	size_t gran = 0;
	vmm_map *m = malloc(sizeof *m);

	if (m == NULL)
		return -ENOMEM;
	CUresult r = c->drv.MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r == CUDA_SUCCESS && gran == 0)
		r = CUDA_ERROR_NO_DEVICE;
	size_t size = r == CUDA_SUCCESS ? (len + gran - 1) / gran * gran : 0;
	if (r == CUDA_SUCCESS)
		r = c->drv.MemCreate(&ah, size, &prop, 0);
	if (r == CUDA_SUCCESS) {
		r = vmm_map_handle(c, ah, size, device, &p);
		c->drv.MemRelease(ah);
	}
	if (r != CUDA_SUCCESS) {
		c->g.host->log(c->g.host, TE_LOG_ERROR, "cuMemCreate memory of %zu bytes on device %d: %s", len,
			       device, teu_cu_errstr(&c->drv, r));
		free(m);
		return -ENOMEM;
	}
	vmm_add(c, p, size, m);
	*ptr = (void *)(uintptr_t)p;
	return 0;
}

int cu_mem_alloc(void *ctx, int device, size_t len, void **ptr)
{
	cuda_ctx *c = ctx;
	CUdeviceptr p = 0;

	if (device < 0 || device >= c->g.ndev || c->ctx[device] == NULL)
		return -ENODEV;
	cu_make_current(c, device);
	if (c->alloc_vmm && has_vmm(&c->drv))
		return vmm_alloc(c, device, len, ptr);
	CUresult r = c->drv.MemAlloc(&p, len);
	if (r != CUDA_SUCCESS) {
		c->g.host->log(c->g.host, TE_LOG_ERROR, "cuMemAlloc of %zu bytes on device %d: %s", len,
			       device, teu_cu_errstr(&c->drv, r));
		return -ENOMEM;
	}
	*ptr = (void *)(uintptr_t)p;
	return 0;
}

void cu_mem_free(void *ctx, void *ptr)
{
	cuda_ctx *c = ctx;
	int dev = 0;

	if (vmm_drop(c, (CUdeviceptr)(uintptr_t)ptr))
		return;
	c->drv.PointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
				   (CUdeviceptr)(uintptr_t)ptr);
	cu_make_current(c, dev);
	c->drv.MemFree((CUdeviceptr)(uintptr_t)ptr);
}

int cu_export_dmabuf(void *ctx, const void *addr, size_t len, int *fd, uint64_t *offset)
{
	cuda_ctx *c = ctx;
	CUdeviceptr p = (CUdeviceptr)(uintptr_t)addr, start = 0;
	size_t size = 0;
	uint64_t off = 0;
	int h = -1;

	if (c->drv.MemGetHandleForAddressRange == NULL)
		return -ENOTSUP;
	cu_make_current(c, 0);
	/* The handle covers whole allocations: export the allocation, and say
	 * where the range starts in it. */
	if (c->drv.PointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p) !=
		    CUDA_SUCCESS ||
	    c->drv.PointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p) != CUDA_SUCCESS ||
	    !teu_range_in((uintptr_t)p, len, (uintptr_t)start, size, &off))
		return -EINVAL;
	CUresult r = c->drv.MemGetHandleForAddressRange(&h, start, size,
							CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	return teu_gpu_dmabuf(&c->g, addr, r, h, off, fd, offset);
}

/* ------------------------------------------------- other processes (IPC) */

static bool has_ipc(const cuda_ctx *c)
{
	return c->drv.IpcGetMemHandle != NULL && c->drv.IpcOpenMemHandle != NULL &&
	       c->drv.IpcCloseMemHandle != NULL;
}

/* The tag of an export by file descriptor in te_device_ipc.handle. */
static const char vmm_tag[4] = { 'V', 'M', 'M', '1' };

/* cuMemCreate memory: the allocation holding [start, start+size) as a
 * POSIX file descriptor. -ENOTSUP when the driver has no such call or the
 * range is not one whole mapping of one allocation. */
static int vmm_export(cuda_ctx *c, const void *addr, CUdeviceptr start, size_t size, int dev,
		      te_device_ipc *ipc)
{
	CUmemGenericAllocationHandle ah;
	int fd = -1;

	(void)addr;
	if (!has_vmm(&c->drv))
		return -ENOTSUP;
	CUresult r = c->drv.MemRetainAllocationHandle(&ah, (void *)(uintptr_t)start);
	if (r != CUDA_SUCCESS)
		return -ENOTSUP; /* not cuMemCreate memory */
	r = c->drv.MemExportToShareableHandle(&fd, ah, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	c->drv.MemRelease(ah);
	if (r != CUDA_SUCCESS || fd < 0) {
		c->g.host->log(c->g.host, TE_LOG_INFO,
			       "cuMemCreate memory at %#llx without a file descriptor (%s): made without "
			       "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR?", start, teu_cu_errstr(&c->drv, r));
		return -EIO;
	}
	teu_ipc_fill(ipc, vmm_tag, sizeof vmm_tag, dev, fd, start, size);
	return 0;
}

static int vmm_open(cuda_ctx *c, const te_device_ipc *ipc, void **base)
{
	CUmemGenericAllocationHandle ah;
	CUdeviceptr p = 0;
	int dev = teu_ipc_device(ipc, c->g.ndev);
	vmm_map *m;

	if (!has_vmm(&c->drv) || ipc->fd < 0 || ipc->alloc_size == 0 || ipc->alloc_size > SIZE_MAX)
		return -EINVAL;
	m = malloc(sizeof *m);
	if (m == NULL)
		return -ENOMEM;
	cu_make_current(c, dev);
	CUresult r = c->drv.MemImportFromShareableHandle(&ah, (void *)(uintptr_t)ipc->fd,
							 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r == CUDA_SUCCESS) {
		r = vmm_map_handle(c, ah, (size_t)ipc->alloc_size, dev, &p);
		c->drv.MemRelease(ah);
	}
	if (r != CUDA_SUCCESS) {
		c->g.host->log(c->g.host, TE_LOG_WARN, "opening another process's cuMemCreate memory (cuda:%d, %llu bytes): %s",
			       ipc->device, (unsigned long long)ipc->alloc_size, teu_cu_errstr(&c->drv, r));
		free(m);
		return -EIO;
	}
	vmm_add(c, p, (size_t)ipc->alloc_size, m);
	*base = (void *)(uintptr_t)p;
	return 0;
}

/* The handle of the allocation at `start`, asked in device `dev`'s context. */
static int ipc_get_on(void *ctx, int dev, uint64_t start, void *handle)
{
	cuda_ctx *c = ctx;

	cu_make_current(c, dev);
	return c->drv.IpcGetMemHandle(handle, start);
}

/* CUDA IPC handles name whole cuMemAlloc allocations: export the
 * allocation holding the range. */
int cu_ipc_export(void *ctx, const void *addr, size_t len, te_device_ipc *ipc)
{
	cuda_ctx *c = ctx;
	CUdeviceptr p = (CUdeviceptr)(uintptr_t)addr, start = 0;
	size_t size = 0;
	int dev = -1;

	if (!has_ipc(c))
		return -ENOTSUP;
	if (cu_classify(c, addr, len, &dev) != 1 ||
	    c->drv.PointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p) != CUDA_SUCCESS ||
	    c->drv.PointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p) != CUDA_SUCCESS)
		return -EINVAL;
	_Static_assert(sizeof(CUipcMemHandle) <= sizeof ipc->handle, "IPC handle size");
	int r = teu_gpu_ipc_get(&c->g, ipc, sizeof(CUipcMemHandle), ipc_get_on, dev, start, size);
	if (r != CUDA_SUCCESS) {
		/* Memory from cuMemCreate, which IPC handles do not cover: its
		 * physical allocation as a file descriptor, when it was made
		 * shareable so. */
		int vr = vmm_export(c, addr, start, size, dev, ipc);
		if (vr == 0)
			return 0;
		return teu_gpu_refused(&c->g, "IPC handle", addr, r,
				       vr == -ENOTSUP ? "" : "; nor a file descriptor of its cuMemCreate allocation");
	}
	return 0;
}

/* Another process's handle opened in the context of device `dev` (lazy
 * peer access lets a copy reach it from any device). */
static int ipc_open_on(void *ctx, int dev, const void *handle, void **base)
{
	cuda_ctx *c = ctx;
	CUipcMemHandle h;
	CUdeviceptr p = 0;

	memcpy(&h, handle, sizeof h);
	cu_make_current(c, dev);
	CUresult r = c->drv.IpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	*base = (void *)(uintptr_t)p;
	return r;
}

int cu_ipc_open(void *ctx, const te_device_ipc *ipc, void **base)
{
	cuda_ctx *c = ctx;

	if (ipc->handle_len == sizeof vmm_tag && memcmp(ipc->handle, vmm_tag, sizeof vmm_tag) == 0)
		return vmm_open(c, ipc, base);
	if (!has_ipc(c))
		return -ENOTSUP;
	return teu_gpu_ipc_open(&c->g, ipc, sizeof(CUipcMemHandle), ipc_open_on, base);
}

void cu_ipc_close(void *ctx, void *base)
{
	cuda_ctx *c = ctx;

	if (vmm_drop(c, (CUdeviceptr)(uintptr_t)base))
		return;
	cu_make_current(c, 0);
	CUresult r = c->drv.IpcCloseMemHandle((CUdeviceptr)(uintptr_t)base);
	if (r != CUDA_SUCCESS)
		c->g.host->log(c->g.host, TE_LOG_WARN, "cuIpcCloseMemHandle(%p): %s", base, teu_cu_errstr(&c->drv, r));
}
