/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA device plugin: NVIDIA GPU memory through the CUDA driver API.
 * libcuda.so.1 is opened with dlopen() when the plugin is probed, so neither
 * the plugin nor libte needs the CUDA toolkit to build or a GPU to run:
 * without the library or a device the plugin stays idle and says why.
 * This file opens the driver, makes and ends the plugin's context, tells
 * device memory apart and lists the devices; copy.c copies and share.c
 * shares (cuda-internal.h).
 */
#include "cuda-internal.h"
#include "../pci-numa.h"

static int open_driver(driver *d, char *why, size_t why_len)
{
	int rc = cu_driver_open(d, why, why_len);
	if (rc != 0)
		return rc;
	CUresult r = d->Init(0);
	int n = 0;
	if (r == CUDA_SUCCESS)
		r = d->DeviceGetCount(&n);
	if (r != CUDA_SUCCESS || n <= 0) {
		snprintf(why, why_len, "no CUDA device (%s)",
			 r != CUDA_SUCCESS ? cu_errstr(d, r) : "the driver counts none");
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

void cu_make_current(cuda_ctx *c, int dev);
bool cu_async_start(cuda_ctx *c);
void cu_async_stop(cuda_ctx *c);

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
			h->log(h, TE_LOG_WARN, "device %d: no context: %s", i, cu_errstr(&c->drv, r));
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
	pthread_mutex_init(&c->pool_lock, NULL);
	pthread_mutex_init(&c->gather_lock, NULL);
	pthread_mutex_init(&c->host_lock, NULL);
	pthread_mutex_init(&c->vmm_lock, NULL);
	pthread_mutex_init(&c->ev_lock, NULL);
	c->async = cu_async_start(c);
	*out = c;
	return 0;
}

static void cu_destroy(void *ctx)
{
	cuda_ctx *c = ctx;

	cu_async_stop(c);
	cu_make_current(c, 0);
	for (unsigned i = 0; i < c->pool_made; i++) {
		c->drv.StreamSynchronize(c->pool[i]);
		c->drv.StreamDestroy(c->pool[i]);
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
	pthread_mutex_destroy(&c->pool_lock);
	pthread_mutex_destroy(&c->gather_lock);
	while (c->hosts != NULL) { /* page-locked memory its users did not free */
		host_map *m = c->hosts;
		c->hosts = m->next;
		free(m);
	}
	pthread_mutex_destroy(&c->host_lock);
	pthread_mutex_destroy(&c->vmm_lock);
	pthread_mutex_destroy(&c->ev_lock);
	for (int i = 0; i < c->ndev; i++)
		if (c->ctx[i] != NULL)
			c->drv.DevicePrimaryCtxRelease(i);
	dlclose(c->drv.lib);
	free(c);
}

void cu_make_current(cuda_ctx *c, int dev)
{
	if (dev >= 0 && dev < c->ndev && c->ctx[dev] != NULL)
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
	if (p + len > start + size) {
		c->host->log(c->host, TE_LOG_ERROR,
			     "%p+%zu runs past its device allocation (%zu bytes at %#llx)", addr, len,
			     size, start);
		return -EINVAL;
	}
	*device = ordinal;
	return 1;
}

static int cu_stream_wait(void *ctx, void *stream)
{
	cuda_ctx *c = ctx;

	cu_make_current(c, 0);
	CUresult r = c->drv.StreamSynchronize(stream);
	if (r != CUDA_SUCCESS) {
		c->host->log(c->host, TE_LOG_ERROR, "cuStreamSynchronize: %s", cu_errstr(&c->drv, r));
		return -EIO;
	}
	return 0;
}

/* The function runs on the driver's thread for host functions, which must
 * not call the driver; libte's (stream.c) only hands work over and waits. */
static int cu_stream_launch(void *ctx, void *stream, void (*fn)(void *), void *arg)
{
	cuda_ctx *c = ctx;

	if (c->drv.LaunchHostFunc == NULL) {
		c->host->log(c->host, TE_LOG_ERROR, "this CUDA driver has no cuLaunchHostFunc (CUDA 10 and later)");
		return -ENOTSUP;
	}
	cu_make_current(c, 0);
	CUresult r = c->drv.LaunchHostFunc(stream, fn, arg);
	if (r != CUDA_SUCCESS) {
		c->host->log(c->host, TE_LOG_ERROR, "cuLaunchHostFunc: %s", cu_errstr(&c->drv, r));
		return -EIO;
	}
	return 0;
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
			d->numa_node = te_pci_numa_node(d->pci_bus_id);
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
	.stream_launch = cu_stream_launch,
	.ipc_export = cu_ipc_export,
	.ipc_open = cu_ipc_open,
	.ipc_close = cu_ipc_close,
	.copy_batch = cu_copy_batch,
};

TE_PLUGIN_DEFINE(TE_KIND_DEVICE, "cuda", "1.0", "NVIDIA GPU memory through the CUDA driver API",
		 "Apache-2.0", &ops)
