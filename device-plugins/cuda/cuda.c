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
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <te/te-plugin.h>

#include "../pci-numa.h"

/* ----------------------------------------------------- driver API subset */

typedef int CUresult; /* CUDA_SUCCESS = 0 */
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUmodule;
typedef void *CUfunction;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUipcMemHandle {
	char reserved[64]; /* CU_IPC_HANDLE_SIZE */
} CUipcMemHandle;
typedef struct CUmemLocation {
	int type;
	int id;
} CUmemLocation;
typedef struct CUmemAllocationProp {
	int type;
	int requestedHandleTypes;
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;
typedef struct CUmemAccessDesc {
	CUmemLocation location;
	int flags;
} CUmemAccessDesc;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_NOT_READY = 600,
	CU_EVENT_BLOCKING_SYNC = 1,
	CU_EVENT_DISABLE_TIMING = 2,
	CU_MEM_ALLOCATION_TYPE_PINNED = 1,
	CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
	CU_MEM_LOCATION_TYPE_DEVICE = 1,
	CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
	CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
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
	/* Optional (CUDA 11.7 and later drivers). */
	CUresult (*MemGetHandleForAddressRange)(void *, CUdeviceptr, size_t, int, unsigned long long);
	/* Optional: sharing cuMemAlloc memory with other processes. */
	CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
	CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned);
	CUresult (*IpcCloseMemHandle)(CUdeviceptr);
	/* Optional: copies reported by events (without them, stream callbacks). */
	CUresult (*EventCreate)(CUevent *, unsigned);
	CUresult (*EventRecord)(CUevent, CUstream);
	CUresult (*EventSynchronize)(CUevent);
	CUresult (*EventQuery)(CUevent);
	CUresult (*EventDestroy)(CUevent);
	/* Optional: the gather-copy kernel for device-to-device batches. */
	CUresult (*ModuleLoadData)(CUmodule *, const void *);
	CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
	CUresult (*ModuleUnload)(CUmodule);
	CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
				 unsigned, CUstream, void **, void **);
	/* Optional: memory of the virtual memory API (cuMemCreate). */
	CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
	CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
			      unsigned long long);
	CUresult (*MemRelease)(CUmemGenericAllocationHandle);
	CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	CUresult (*MemAddressFree)(CUdeviceptr, size_t);
	CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
	CUresult (*MemUnmap)(CUdeviceptr, size_t);
	CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
	CUresult (*MemRetainAllocationHandle)(CUmemGenericAllocationHandle *, void *);
	CUresult (*MemExportToShareableHandle)(void *, CUmemGenericAllocationHandle, int,
					       unsigned long long);
	CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *, int);
} driver;

/* Asynchronous copies go round-robin to this many lanes (a stream and a
 * thread that reports its copies' ends), so that copies into and out of the
 * devices use both copy engines at once. */
#define LANES 4
/* Streams for batches (copy_batch): one per batch in flight. */
#define POOL_MAX 32
/* Events kept for reuse. */
#define EVENTS_KEPT 256
/* Pieces per launch of the gather kernel: its parameter block (gather.cu). */
#define GATHER_MAX 128

typedef struct cuda_ctx cuda_ctx;

/* TE_CUDA_STATS=1: copy timings, printed when the plugin is unloaded (a
 * diagnostic for tuning on a GPU machine). */
static struct {
	atomic_ullong async_n, async_bytes, async_lat_ns, async_sync_ns, async_call_ns;
	atomic_ullong batch_n, batch_pieces, batch_bytes, batch_ns, batch_wait_ns, batch_nostream;
} cst;
static inline uint64_t cst_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
__attribute__((destructor)) static void cst_print(void)
{
	const char *v = getenv("TE_CUDA_STATS");
	if (v == NULL || v[0] != '1')
		return;
	unsigned long long a = atomic_load(&cst.async_n), b = atomic_load(&cst.batch_n);
	fprintf(stderr, "cuda-stats[%d]: async %llu, %.0f bytes, us avg: call %.1f, latency %.1f, in sync %.1f; "
		"batch %llu, %.1f pieces %.0f bytes, us avg: %.1f, wait %.1f; no stream %llu\n", (int)getpid(),
		a, a ? (double)atomic_load(&cst.async_bytes) / a : 0, a ? atomic_load(&cst.async_call_ns) / 1e3 / a : 0,
		a ? atomic_load(&cst.async_lat_ns) / 1e3 / a : 0, a ? atomic_load(&cst.async_sync_ns) / 1e3 / a : 0,
		b, b ? (double)atomic_load(&cst.batch_pieces) / b : 0, b ? (double)atomic_load(&cst.batch_bytes) / b : 0,
		b ? atomic_load(&cst.batch_ns) / 1e3 / b : 0, b ? atomic_load(&cst.batch_wait_ns) / 1e3 / b : 0,
		(unsigned long long)atomic_load(&cst.batch_nostream));
}

/* A copy_async() handed to the submitting thread. */
typedef struct cu_job {
	struct cu_job *next;
	const te_copy *v;
	size_t n;
	te_copy one; /* v of a single copy */
	te_device_done_fn done;
	void *arg;
	int rc;      /* a failure queuing it */
	size_t len;  /* all its bytes */
	uint64_t t0; /* TE_CUDA_STATS */
} cu_job;

/* Jobs queued on one lane's stream together, and the event after them. */
typedef struct cu_group {
	struct cu_group *next;
	cu_job *jobs;
	CUevent ev; /* NULL: none could be recorded, the stream is waited for */
	size_t len;
} cu_group;

typedef struct lane {
	cuda_ctx *owner;
	CUstream stream;
	pthread_t thread;
	pthread_mutex_t lock; /* guards the list and quit */
	pthread_cond_t cond;
	cu_group *head, *tail;
	bool quit, started;
} lane;

/* Memory of the virtual memory API that this plugin mapped: its own
 * allocations (TE_CUDA_ALLOC=vmm) and other processes' it opened. */
typedef struct vmm_map {
	struct vmm_map *next;
	CUdeviceptr base;
	size_t size;
} vmm_map;

struct cuda_ctx {
	const te_host *host;
	driver drv;
	int ndev;
	CUcontext ctx[MAX_DEVICES]; /* primary contexts */

	/* Asynchronous copies (see cu_copy_async) */
	bool async;
	lane lanes[LANES];
	unsigned next_lane; /* the submitter's */
	pthread_t sub_thread;
	bool sub_started, sub_quit;
	pthread_mutex_t sub_lock; /* guards the queue and sub_quit */
	pthread_cond_t sub_cond;
	cu_job *sub_head, *sub_tail;
	pthread_mutex_t ev_lock; /* guards the kept events */
	CUevent events[EVENTS_KEPT];
	unsigned nevents;

	/* Batches (see cu_copy_batch) */
	pthread_mutex_t pool_lock;
	CUstream pool[POOL_MAX]; /* free ones first */
	unsigned pool_free, pool_made;
	pthread_mutex_t gather_lock;
	int gather_state; /* 0 not tried, 1 loaded, -1 unusable */
	bool gather_off;  /* TE_CUDA_GATHER=0 */
	CUmodule gather_mod;
	CUfunction gather_fn;

	/* Waits sleep on blocking events (TE_CUDA_WAIT=block, the default)
	 * rather than spinning a core each (=spin, the driver's default while
	 * a process has fewer contexts than cores): many threads wait at once
	 * here (a TCP server's connections, the copy lanes), and spinning ones
	 * take the cores the transports' threads need. */
	bool wait_spin;
	/* TE_CUDA_WAIT=poll: look for the event's end this long (yielding the
	 * core between looks) before sleeping on it: a short copy's end is
	 * caught without a wake-up, a long one costs no spinning core. */
	unsigned poll_us;

	/* The virtual memory API */
	bool alloc_vmm; /* TE_CUDA_ALLOC=vmm */
	pthread_mutex_t vmm_lock;
	vmm_map *maps;
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
	SYM(MemGetHandleForAddressRange, "cuMemGetHandleForAddressRange", 0);
	SYM(IpcGetMemHandle, "cuIpcGetMemHandle", 0);
	SYM(IpcOpenMemHandle, "cuIpcOpenMemHandle_v2", 0);
	if (d->IpcOpenMemHandle == NULL)
		SYM(IpcOpenMemHandle, "cuIpcOpenMemHandle", 0);
	SYM(IpcCloseMemHandle, "cuIpcCloseMemHandle", 0);
	SYM(EventCreate, "cuEventCreate", 0);
	SYM(EventRecord, "cuEventRecord", 0);
	SYM(EventSynchronize, "cuEventSynchronize", 0);
	SYM(EventQuery, "cuEventQuery", 0);
	SYM(EventDestroy, "cuEventDestroy_v2", 0);
	SYM(ModuleLoadData, "cuModuleLoadData", 0);
	SYM(ModuleGetFunction, "cuModuleGetFunction", 0);
	SYM(ModuleUnload, "cuModuleUnload", 0);
	SYM(LaunchKernel, "cuLaunchKernel", 0);
	SYM(MemGetAllocationGranularity, "cuMemGetAllocationGranularity", 0);
	SYM(MemCreate, "cuMemCreate", 0);
	SYM(MemRelease, "cuMemRelease", 0);
	SYM(MemAddressReserve, "cuMemAddressReserve", 0);
	SYM(MemAddressFree, "cuMemAddressFree", 0);
	SYM(MemMap, "cuMemMap", 0);
	SYM(MemUnmap, "cuMemUnmap", 0);
	SYM(MemSetAccess, "cuMemSetAccess", 0);
	SYM(MemRetainAllocationHandle, "cuMemRetainAllocationHandle", 0);
	SYM(MemExportToShareableHandle, "cuMemExportToShareableHandle", 0);
	SYM(MemImportFromShareableHandle, "cuMemImportFromShareableHandle", 0);
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
	const char *alloc = h->config(h, "TE_CUDA_ALLOC", NULL);
	const char *gather = h->config(h, "TE_CUDA_GATHER", NULL);
	const char *wait = h->config(h, "TE_CUDA_WAIT", NULL);
	c->wait_spin = wait != NULL && strcmp(wait, "spin") == 0;
	if (wait != NULL && strcmp(wait, "poll") == 0)
		c->poll_us = (unsigned)te_host_config_u64(h, "TE_CUDA_POLL_US", NULL, 20, 1, 10000);
	else if (wait != NULL && !c->wait_spin && strcmp(wait, "block") != 0)
		h->log(h, TE_LOG_WARN, "TE_CUDA_WAIT=%s: not 'block', 'poll' or 'spin'; blocking it is", wait);
	c->alloc_vmm = alloc != NULL && strcmp(alloc, "vmm") == 0;
	c->gather_off = gather != NULL && strcmp(gather, "0") == 0;
	if (alloc != NULL && !c->alloc_vmm && strcmp(alloc, "legacy") != 0)
		h->log(h, TE_LOG_WARN, "TE_CUDA_ALLOC=%s: not 'legacy' or 'vmm'; cuMemAlloc it is", alloc);
	pthread_mutex_init(&c->pool_lock, NULL);
	pthread_mutex_init(&c->gather_lock, NULL);
	pthread_mutex_init(&c->vmm_lock, NULL);
	pthread_mutex_init(&c->ev_lock, NULL);
	c->async = async_start(c);
	*out = c;
	return 0;
}

static void cu_destroy(void *ctx)
{
	cuda_ctx *c = ctx;

	async_stop(c);
	make_current(c, 0);
	for (unsigned i = 0; i < c->pool_made; i++) {
		c->drv.StreamSynchronize(c->pool[i]);
		c->drv.StreamDestroy(c->pool[i]);
	}
	if (c->gather_state == 1)
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
	pthread_mutex_destroy(&c->vmm_lock);
	pthread_mutex_destroy(&c->ev_lock);
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

static CUstream pool_get(cuda_ctx *c);
static void pool_put(cuda_ctx *c, CUstream s);
static CUresult stream_wait(cuda_ctx *c, CUstream s);

static int cu_copy(void *ctx, void *dst, const void *src, size_t len)
{
	cuda_ctx *c = ctx;

	make_current(c, 0);
	/* Queued and waited for on a blocking event, so that the wait sleeps
	 * (cuMemcpy would spin). */
	CUstream s = c->async && !c->wait_spin ? pool_get(c) : NULL;
	if (s != NULL) {
		CUresult r = c->drv.MemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, len, s);
		CUresult w = stream_wait(c, s);
		pool_put(c, s);
		if (r == CUDA_SUCCESS && w == CUDA_SUCCESS)
			return 0;
		if (w != CUDA_SUCCESS) {
			c->host->log(c->host, TE_LOG_ERROR, "copy of %zu bytes: %s", len, errstr(&c->drv, w));
			return -EIO;
		}
		/* Not queued: cuMemcpy says whether it can be done at all. */
	}
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

/* Asynchronous copies go to one submitting thread per context, which
 * queues whatever has gathered since its last look on the next lane's stream
 * with one event after it; the lane's thread waits for the events in order
 * and reports each copy. Driver calls from many threads at once (every
 * transport thread finishing a staged chunk) contend inside the driver: on
 * an H100 the call and its event cost 20-80 us each from sixteen threads,
 * against ~4 us a queued 64 KiB copy from one. One thread also turns many
 * small copies into one wait. (A stream callback would hold the stream
 * until the host ran it: events instead.) */

/* Groups are cut at this many bytes or jobs, so that the first copies of a
 * burst are reported while later ones still run. */
#define GROUP_BYTES (4u << 20)
#define GROUP_JOBS 64

static bool has_events(const driver *d)
{
	return d->EventCreate != NULL && d->EventRecord != NULL && d->EventSynchronize != NULL &&
	       d->EventDestroy != NULL;
}

static CUevent event_get(cuda_ctx *c)
{
	CUevent ev = NULL;

	pthread_mutex_lock(&c->ev_lock);
	if (c->nevents > 0)
		ev = c->events[--c->nevents];
	pthread_mutex_unlock(&c->ev_lock);
	if (ev == NULL &&
	    c->drv.EventCreate(&ev, CU_EVENT_DISABLE_TIMING | (c->wait_spin ? 0 : CU_EVENT_BLOCKING_SYNC)) !=
		    CUDA_SUCCESS)
		ev = NULL;
	return ev;
}

static void event_put(cuda_ctx *c, CUevent ev)
{
	pthread_mutex_lock(&c->ev_lock);
	if (c->nevents < EVENTS_KEPT) {
		c->events[c->nevents++] = ev;
		ev = NULL;
	}
	pthread_mutex_unlock(&c->ev_lock);
	if (ev != NULL)
		c->drv.EventDestroy(ev);
}

/* Waits for an event: polling first with TE_CUDA_WAIT=poll. */
static CUresult event_sync(cuda_ctx *c, CUevent ev)
{
	if (c->poll_us > 0 && c->drv.EventQuery != NULL) {
		struct timespec t0, t;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (;;) {
			CUresult r = c->drv.EventQuery(ev);
			if (r != CUDA_ERROR_NOT_READY)
				return r;
			clock_gettime(CLOCK_MONOTONIC, &t);
			if ((t.tv_sec - t0.tv_sec) * 1000000 + (t.tv_nsec - t0.tv_nsec) / 1000 >= (long)c->poll_us)
				break;
			sched_yield();
		}
	}
	return c->drv.EventSynchronize(ev);
}

/* Tells a job's owner how it ended; the job is gone afterwards. */
static void job_end(cu_job *j, int rc)
{
	j->done(j->arg, rc);
	free(j);
}

/* The lane's thread: waits for each group's event in the order they were
 * queued and reports its jobs, whose owners may start the next copies here. */
static void *lane_main(void *arg)
{
	lane *l = arg;
	cuda_ctx *c = l->owner;

	make_current(c, 0);
	pthread_mutex_lock(&l->lock);
	for (;;) {
		while (l->head == NULL && !l->quit)
			pthread_cond_wait(&l->cond, &l->lock);
		cu_group *g = l->head;
		if (g == NULL)
			break; /* quit, and every queued group reported */
		l->head = g->next;
		if (l->head == NULL)
			l->tail = NULL;
		pthread_mutex_unlock(&l->lock);
		uint64_t ts = cst_now();
		CUresult r = g->ev != NULL ? event_sync(c, g->ev) : c->drv.StreamSynchronize(l->stream);
		uint64_t te = cst_now();
		if (r != CUDA_SUCCESS)
			c->host->log(c->host, TE_LOG_ERROR, "asynchronous copies of %zu bytes: %s", g->len,
				     errstr(&c->drv, r));
		if (g->ev != NULL)
			event_put(c, g->ev);
		atomic_fetch_add(&cst.async_sync_ns, te - ts);
		for (cu_job *j = g->jobs, *next; j != NULL; j = next) {
			next = j->next;
			atomic_fetch_add(&cst.async_n, 1);
			atomic_fetch_add(&cst.async_bytes, j->len);
			atomic_fetch_add(&cst.async_lat_ns, te - j->t0);
			job_end(j, j->rc < 0 ? j->rc : r == CUDA_SUCCESS ? 0 : -EIO);
		}
		free(g);
		pthread_mutex_lock(&l->lock);
	}
	pthread_mutex_unlock(&l->lock);
	return NULL;
}

/* Queues a group's copies on the next lane's stream and hands it to that
 * lane's thread. */
static void group_issue(cuda_ctx *c, cu_job *jobs)
{
	lane *l = &c->lanes[c->next_lane++ % LANES];
	cu_group *g = malloc(sizeof *g);

	if (g == NULL) {
		for (cu_job *j = jobs, *next; j != NULL; j = next) {
			next = j->next;
			job_end(j, -ENOMEM);
		}
		return;
	}
	*g = (cu_group){ .jobs = jobs };
	for (cu_job *j = jobs; j != NULL; j = j->next) {
		for (size_t i = 0; i < j->n && j->rc == 0; i++) {
			if (j->v[i].len == 0)
				continue;
			CUresult r = c->drv.MemcpyAsync((CUdeviceptr)(uintptr_t)j->v[i].dst,
							(CUdeviceptr)(uintptr_t)j->v[i].src, j->v[i].len, l->stream);
			if (r != CUDA_SUCCESS) {
				c->host->log(c->host, TE_LOG_ERROR, "cuMemcpyAsync of %zu bytes: %s", j->v[i].len,
					     errstr(&c->drv, r));
				j->rc = -EIO;
			}
		}
		g->len += j->len;
	}
	g->ev = event_get(c);
	if (g->ev != NULL && c->drv.EventRecord(g->ev, l->stream) != CUDA_SUCCESS) {
		event_put(c, g->ev);
		g->ev = NULL;
	}
	pthread_mutex_lock(&l->lock);
	if (l->tail)
		l->tail->next = g;
	else
		l->head = g;
	l->tail = g;
	pthread_cond_signal(&l->cond);
	pthread_mutex_unlock(&l->lock);
}

/* The submitting thread: takes what gathered in the queue, in groups. */
static void *submit_main(void *arg)
{
	cuda_ctx *c = arg;

	make_current(c, 0);
	pthread_mutex_lock(&c->sub_lock);
	for (;;) {
		while (c->sub_head == NULL && !c->sub_quit)
			pthread_cond_wait(&c->sub_cond, &c->sub_lock);
		cu_job *jobs = c->sub_head;
		if (jobs == NULL)
			break; /* quit, and every job queued */
		c->sub_head = c->sub_tail = NULL;
		pthread_mutex_unlock(&c->sub_lock);
		while (jobs != NULL) {
			cu_job *first = jobs, *last = jobs;
			size_t bytes = jobs->len;
			unsigned n = 1;
			while (last->next != NULL && n < GROUP_JOBS && bytes < GROUP_BYTES) {
				last = last->next;
				bytes += last->len;
				n++;
			}
			jobs = last->next;
			last->next = NULL;
			group_issue(c, first);
		}
		pthread_mutex_lock(&c->sub_lock);
	}
	pthread_mutex_unlock(&c->sub_lock);
	return NULL;
}

static void job_queue(cuda_ctx *c, cu_job *j)
{
	j->next = NULL;
	pthread_mutex_lock(&c->sub_lock);
	if (c->sub_tail != NULL) {
		c->sub_tail->next = j;
	} else {
		c->sub_head = j;
		pthread_cond_signal(&c->sub_cond); /* it sleeps only on an empty queue */
	}
	c->sub_tail = j;
	pthread_mutex_unlock(&c->sub_lock);
}

static void lane_stop(cuda_ctx *c, lane *l)
{
	if (l->started) {
		pthread_mutex_lock(&l->lock);
		l->quit = true;
		pthread_cond_signal(&l->cond);
		pthread_mutex_unlock(&l->lock);
		pthread_join(l->thread, NULL);
	}
	if (l->stream != NULL) {
		c->drv.StreamSynchronize(l->stream);
		c->drv.StreamDestroy(l->stream);
	}
	pthread_mutex_destroy(&l->lock);
	pthread_cond_destroy(&l->cond);
	memset(l, 0, sizeof *l);
}

static void submitter_stop(cuda_ctx *c)
{
	if (c->sub_started) {
		pthread_mutex_lock(&c->sub_lock);
		c->sub_quit = true;
		pthread_cond_signal(&c->sub_cond);
		pthread_mutex_unlock(&c->sub_lock);
		pthread_join(c->sub_thread, NULL);
		c->sub_started = false;
	}
	pthread_mutex_destroy(&c->sub_lock);
	pthread_cond_destroy(&c->sub_cond);
}

/* Streams on device 0's context (unified addressing: any direction, any
 * device), their threads and the submitter; false (copies stay synchronous)
 * when the driver lacks the calls or refuses. */
static bool async_start(cuda_ctx *c)
{
	driver *d = &c->drv;
	int made = 0;

	if (d->StreamCreate == NULL || d->StreamDestroy == NULL || d->MemcpyAsync == NULL ||
	    !has_events(d) || c->ctx[0] == NULL)
		return false;
	make_current(c, 0);
	pthread_mutex_init(&c->sub_lock, NULL);
	pthread_cond_init(&c->sub_cond, NULL);
	for (; made < LANES; made++) {
		lane *l = &c->lanes[made];
		l->owner = c;
		pthread_mutex_init(&l->lock, NULL);
		pthread_cond_init(&l->cond, NULL);
		CUresult r = d->StreamCreate(&l->stream, CU_STREAM_NON_BLOCKING);
		if (r != CUDA_SUCCESS) {
			c->host->log(c->host, TE_LOG_INFO, "no stream for asynchronous copies: %s", errstr(d, r));
			l->stream = NULL;
			made++;
			break;
		}
		if (pthread_create(&l->thread, NULL, lane_main, l) != 0) {
			made++;
			break;
		}
		l->started = true;
	}
	if (made == LANES && c->lanes[LANES - 1].started &&
	    pthread_create(&c->sub_thread, NULL, submit_main, c) == 0) {
		c->sub_started = true;
		return true;
	}
	submitter_stop(c);
	while (made > 0)
		lane_stop(c, &c->lanes[--made]);
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
	submitter_stop(c); /* every job handed to a lane */
	for (int i = 0; i < LANES; i++)
		lane_stop(c, &c->lanes[i]);
	c->async = false;
}

/* Queued for the submitter: the caller's thread never waits for the copy
 * nor calls the driver, and the copy engine never waits for us. */
static int cu_copy_async(void *ctx, void *dst, const void *src, size_t len, te_device_done_fn done,
			 void *arg)
{
	cuda_ctx *c = ctx;

	if (!c->async)
		return -ENOTSUP;
	cu_job *j = malloc(sizeof *j);
	if (j == NULL)
		return -ENOMEM;
	*j = (cu_job){ .one = { dst, src, len }, .n = 1, .done = done, .arg = arg, .len = len, .t0 = cst_now() };
	j->v = &j->one;
	job_queue(c, j);
	return 0;
}

/* ----------------------------------------------------------------- batches */

#include "gather-ptx.h"

/* The gather kernel's parameter block (gather.cu's te_gather). */
typedef struct gather_params {
	unsigned long long n, chunk;
	struct {
		unsigned long long dst, src, len;
	} p[GATHER_MAX];
} gather_params;
_Static_assert(sizeof(gather_params) == 3088, "gather.cu's te_gather layout");

static CUstream pool_get(cuda_ctx *c)
{
	CUstream s = NULL;

	pthread_mutex_lock(&c->pool_lock);
	if (c->pool_free > 0) {
		s = c->pool[--c->pool_free];
	} else if (c->pool_made < POOL_MAX) {
		make_current(c, 0);
		if (c->drv.StreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS) {
			/* Made streams sit at [pool_free, pool_made) while in use. */
			c->pool[c->pool_made++] = s;
		} else {
			s = NULL;
		}
	}
	pthread_mutex_unlock(&c->pool_lock);
	return s;
}

static void pool_put(cuda_ctx *c, CUstream s)
{
	pthread_mutex_lock(&c->pool_lock);
	/* Keep every made stream in pool[0, pool_made): swap s to pool_free. */
	for (unsigned i = c->pool_free; i < c->pool_made; i++)
		if (c->pool[i] == s) {
			c->pool[i] = c->pool[c->pool_free];
			c->pool[c->pool_free++] = s;
			break;
		}
	pthread_mutex_unlock(&c->pool_lock);
}

static bool gather_ready(cuda_ctx *c)
{
	pthread_mutex_lock(&c->gather_lock);
	if (c->gather_state == 0) {
		c->gather_state = -1;
		if (c->gather_off || c->drv.ModuleLoadData == NULL || c->drv.ModuleGetFunction == NULL ||
		    c->drv.ModuleUnload == NULL || c->drv.LaunchKernel == NULL) {
			c->host->log(c->host, TE_LOG_INFO, "device-to-device batches: a copy call per piece (%s)",
				     c->gather_off ? "TE_CUDA_GATHER=0" : "the driver has no kernel launches");
		} else {
			make_current(c, 0);
			CUresult r = c->drv.ModuleLoadData(&c->gather_mod, gather_ptx);
			if (r == CUDA_SUCCESS) {
				r = c->drv.ModuleGetFunction(&c->gather_fn, c->gather_mod, "te_gather_copy");
				if (r != CUDA_SUCCESS)
					c->drv.ModuleUnload(c->gather_mod);
			}
			if (r == CUDA_SUCCESS)
				c->gather_state = 1;
			else
				c->host->log(c->host, TE_LOG_INFO,
					     "no gather kernel (%s): device-to-device batches take a copy call per piece",
					     errstr(&c->drv, r));
		}
	}
	bool ok = c->gather_state == 1;
	pthread_mutex_unlock(&c->gather_lock);
	return ok;
}

/* The device of a pointer, or -1 when it is not device memory. */
static int ordinal_of(cuda_ctx *c, const void *p)
{
	unsigned type = 0;
	int ordinal = -1;
	CUdeviceptr dp = (CUdeviceptr)(uintptr_t)p;

	if (c->drv.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dp) != CUDA_SUCCESS ||
	    type != CU_MEMORYTYPE_DEVICE ||
	    c->drv.PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dp) != CUDA_SUCCESS)
		return -1;
	return ordinal;
}

/* Device-to-device pieces in launches of the gather kernel on device 0,
 * where both sides of every piece are: one launch moves up to GATHER_MAX
 * pieces (a copy call per piece costs ~10 us whatever its size). */
static CUresult gather_launch(cuda_ctx *c, const te_copy *v, size_t n, CUstream s)
{
	gather_params g;
	CUresult r = CUDA_SUCCESS;

	for (size_t i = 0; i < n && r == CUDA_SUCCESS;) {
		unsigned long long maxlen = 0;
		g.n = 0;
		for (; i < n && g.n < GATHER_MAX; i++) {
			if (v[i].len == 0)
				continue;
			g.p[g.n].dst = (uintptr_t)v[i].dst;
			g.p[g.n].src = (uintptr_t)v[i].src;
			g.p[g.n].len = v[i].len;
			if (v[i].len > maxlen)
				maxlen = v[i].len;
			g.n++;
		}
		if (g.n == 0)
			break;
		/* Blocks of 16 KiB or more, at most 4096 per piece. */
		unsigned long long chunk = (maxlen + 4095) / 4096;
		chunk = chunk < 16384 ? 16384 : (chunk + 15) & ~15ull;
		unsigned gy = (unsigned)((maxlen + chunk - 1) / chunk);
		g.chunk = chunk;
		void *args[] = { &g };
		r = c->drv.LaunchKernel(c->gather_fn, (unsigned)g.n, gy, 1, 256, 1, 1, 0, s, args, NULL);
	}
	return r;
}

static bool all_on_device0(cuda_ctx *c, const te_copy *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (v[i].len > 0 && (ordinal_of(c, v[i].dst) != 0 || ordinal_of(c, v[i].src) != 0))
			return false;
	return true;
}

/* Waits for what is queued on `s`: on a blocking event (the thread
 * sleeps), or spinning in cuStreamSynchronize with TE_CUDA_WAIT=spin. */
static CUresult stream_wait(cuda_ctx *c, CUstream s)
{
	CUevent ev = c->wait_spin ? NULL : event_get(c);

	if (ev == NULL)
		return c->drv.StreamSynchronize(s);
	CUresult r = c->drv.EventRecord(ev, s);
	r = r == CUDA_SUCCESS ? event_sync(c, ev) : c->drv.StreamSynchronize(s);
	event_put(c, ev);
	return r;
}

/* Every piece queued on one stream of the pool, then one wait. */
static int cu_copy_batch(void *ctx, const te_copy *v, size_t n, unsigned flags)
{
	cuda_ctx *c = ctx;
	bool gather = (flags & TE_COPY_DEVICE_ONLY) && n > 1 && c->async && gather_ready(c);
	uint64_t t0 = cst_now();

	atomic_fetch_add(&cst.batch_n, 1);
	atomic_fetch_add(&cst.batch_pieces, n);
	for (size_t i = 0; i < n; i++)
		atomic_fetch_add(&cst.batch_bytes, v[i].len);
	if (gather) {
		make_current(c, 0);
		gather = all_on_device0(c, v, n);
	}
	CUstream s = c->async ? pool_get(c) : NULL;
	CUresult r = CUDA_SUCCESS;

	if (s == NULL) { /* no streams (or all busy): one copy after the other */
		atomic_fetch_add(&cst.batch_nostream, 1);
		for (size_t i = 0; i < n; i++) {
			int rc = cu_copy(c, v[i].dst, v[i].src, v[i].len);
			if (rc < 0)
				return rc;
		}
		return 0;
	}
	make_current(c, 0);
	if (gather) {
		r = gather_launch(c, v, n, s);
		if (r != CUDA_SUCCESS)
			c->host->log(c->host, TE_LOG_ERROR, "gather kernel over %zu pieces: %s", n,
				     errstr(&c->drv, r));
	} else {
		for (size_t i = 0; i < n && r == CUDA_SUCCESS; i++) {
			if (v[i].len == 0)
				continue;
			r = c->drv.MemcpyAsync((CUdeviceptr)(uintptr_t)v[i].dst,
					       (CUdeviceptr)(uintptr_t)v[i].src, v[i].len, s);
			if (r != CUDA_SUCCESS)
				c->host->log(c->host, TE_LOG_ERROR, "cuMemcpyAsync of %zu bytes: %s",
					     v[i].len, errstr(&c->drv, r));
		}
	}
	/* Wait even after a failure: nothing of this batch may still run when
	 * the caller reuses its buffers. */
	uint64_t tw = cst_now();
	CUresult w = stream_wait(c, s);
	atomic_fetch_add(&cst.batch_wait_ns, cst_now() - tw);
	atomic_fetch_add(&cst.batch_ns, cst_now() - t0);
	if (w != CUDA_SUCCESS)
		c->host->log(c->host, TE_LOG_ERROR, "batch of %zu copies: %s", n, errstr(&c->drv, w));
	pool_put(c, s);
	return r == CUDA_SUCCESS && w == CUDA_SUCCESS ? 0 : -EIO;
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

/* ------------------------------------------------ the virtual memory API */

static bool has_vmm(const driver *d)
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
	make_current(c, 0);
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
		c->host->log(c->host, TE_LOG_ERROR, "cuMemCreate memory of %zu bytes on device %d: %s", len,
			     device, errstr(&c->drv, r));
		free(m);
		return -ENOMEM;
	}
	vmm_add(c, p, size, m);
	*ptr = (void *)(uintptr_t)p;
	return 0;
}

static int cu_mem_alloc(void *ctx, int device, size_t len, void **ptr)
{
	cuda_ctx *c = ctx;
	CUdeviceptr p = 0;

	if (device < 0 || device >= c->ndev || c->ctx[device] == NULL)
		return -ENODEV;
	make_current(c, device);
	if (c->alloc_vmm && has_vmm(&c->drv))
		return vmm_alloc(c, device, len, ptr);
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

	if (vmm_drop(c, (CUdeviceptr)(uintptr_t)ptr))
		return;
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
		c->host->log(c->host, TE_LOG_INFO,
			     "cuMemCreate memory at %#llx without a file descriptor (%s): made without "
			     "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR?", start, errstr(&c->drv, r));
		return -EIO;
	}
	memcpy(ipc->handle, vmm_tag, sizeof vmm_tag);
	ipc->handle_len = sizeof vmm_tag;
	ipc->device = dev;
	ipc->fd = fd;
	ipc->alloc_base = start;
	ipc->alloc_size = size;
	return 0;
}

static int vmm_open(cuda_ctx *c, const te_device_ipc *ipc, void **base)
{
	CUmemGenericAllocationHandle ah;
	CUdeviceptr p = 0;
	int dev = ipc->device >= 0 && ipc->device < c->ndev ? ipc->device : 0;
	vmm_map *m;

	if (!has_vmm(&c->drv) || ipc->fd < 0 || ipc->alloc_size == 0 || ipc->alloc_size > SIZE_MAX)
		return -EINVAL;
	m = malloc(sizeof *m);
	if (m == NULL)
		return -ENOMEM;
	make_current(c, dev);
	CUresult r = c->drv.MemImportFromShareableHandle(&ah, (void *)(uintptr_t)ipc->fd,
							 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r == CUDA_SUCCESS) {
		r = vmm_map_handle(c, ah, (size_t)ipc->alloc_size, dev, &p);
		c->drv.MemRelease(ah);
	}
	if (r != CUDA_SUCCESS) {
		c->host->log(c->host, TE_LOG_WARN, "opening another process's cuMemCreate memory (cuda:%d, %llu bytes): %s",
			     ipc->device, (unsigned long long)ipc->alloc_size, errstr(&c->drv, r));
		free(m);
		return -EIO;
	}
	vmm_add(c, p, (size_t)ipc->alloc_size, m);
	*base = (void *)(uintptr_t)p;
	return 0;
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
		/* Memory from cuMemCreate, which IPC handles do not cover: its
		 * physical allocation as a file descriptor, when it was made
		 * shareable so. */
		int vr = vmm_export(c, addr, start, size, dev, ipc);
		if (vr == 0)
			return 0;
		c->host->log(c->host, TE_LOG_INFO, "no IPC handle for %p: %s%s", addr, errstr(&c->drv, r),
			     vr == -ENOTSUP ? "" : "; nor a file descriptor of its cuMemCreate allocation");
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

	if (ipc->handle_len == sizeof vmm_tag && memcmp(ipc->handle, vmm_tag, sizeof vmm_tag) == 0)
		return vmm_open(c, ipc, base);
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

	if (vmm_drop(c, (CUdeviceptr)(uintptr_t)base))
		return;
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
	.ipc_export = cu_ipc_export,
	.ipc_open = cu_ipc_open,
	.ipc_close = cu_ipc_close,
	.copy_batch = cu_copy_batch,
};

TE_PLUGIN_DEFINE(TE_KIND_DEVICE, "cuda", "1.0", "NVIDIA GPU memory through the CUDA driver API",
		 "Apache-2.0", &ops)
