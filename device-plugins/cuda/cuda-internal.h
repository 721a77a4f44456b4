/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA device plugin's shared declarations: the few driver types,
 * constants and prototypes it uses (declared here, so that neither the
 * plugin nor libte needs the CUDA toolkit), the driver table filled by
 * dlopen(), and the plugin's context. cuda.c opens the driver and holds the
 * ops table; copy.c the copies; share.c the virtual memory API, dma-bufs and
 * other processes' memory.
 */
#ifndef TE_CUDA_INTERNAL_H
#define TE_CUDA_INTERNAL_H

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


/* cuda.c */
const char *cu_errstr(const driver *d, CUresult r);
/* Driver calls need a current context in the calling thread. */
void cu_make_current(cuda_ctx *c, int dev);
int cu_classify(void *ctx, const void *addr, size_t len, int *device);

/* copy.c */
bool cu_async_start(cuda_ctx *c);
void cu_async_stop(cuda_ctx *c);
int cu_copy(void *ctx, void *dst, const void *src, size_t len);
int cu_copy_async(void *ctx, void *dst, const void *src, size_t len, te_device_done_fn done, void *arg);
int cu_copy_batch(void *ctx, const te_copy *v, size_t n, unsigned flags);
int cu_host_alloc(void *ctx, size_t len, void **ptr);
void cu_host_free(void *ctx, void *ptr);

/* share.c */
int cu_mem_alloc(void *ctx, int device, size_t len, void **ptr);
void cu_mem_free(void *ctx, void *ptr);
int cu_export_dmabuf(void *ctx, const void *addr, size_t len, int *fd, uint64_t *offset);
int cu_ipc_export(void *ctx, const void *addr, size_t len, te_device_ipc *ipc);
int cu_ipc_open(void *ctx, const te_device_ipc *ipc, void **base);
void cu_ipc_close(void *ctx, void *base);

#endif
