/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The HIP device plugin's shared declarations: the few HIP types, constants
 * and calls it uses (declared here, so that neither the plugin nor libte
 * needs ROCm), the plugin's context and the functions its files share.
 * hip-plugin.c opens the runtime and holds the ops table; hip-copy.c the copies;
 * hip-share.c device memory for others (dma-bufs, other processes' memory).
 */
#ifndef TE_HIP_INTERNAL_H
#define TE_HIP_INTERNAL_H

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <te/te-plugin.h>

#include "teu-gpu.h"

/* ------------------------------------------------------- HIP API subset */

typedef int hipError_t; /* hipSuccess = 0 */
typedef int hipDevice_t;
typedef void *hipStream_t;
typedef void *hipEvent_t;
typedef struct hipIpcMemHandle {
	char reserved[64]; /* HIP_IPC_HANDLE_SIZE */
} hipIpcMemHandle_t;

enum {
	hipSuccess = 0,
	HIP_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
	HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
	HIP_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
	HIP_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
	/* hipMemoryType's device value: the enum was renumbered in ROCm 6
	 * (Unregistered 0, Host 1, Device 2, ...); ROCm 5 had Host 0, Device 1. */
	HIP_MEMORY_TYPE_DEVICE_V5 = 1,
	HIP_MEMORY_TYPE_DEVICE_V6 = 2,
	hipMemcpyDefault = 4,
	hipHostMallocPortable = 1,
	hipStreamNonBlocking = 1,
	hipEventDisableTiming = 2,
	hipIpcMemLazyEnablePeerAccess = 1,
	hipMemRangeHandleTypeDmaBufFd = 1,
};

/* hipRuntimeGetVersion: major * 10000000 + minor * 100000 + patch. */
#define HIP_VERSION_MAJOR_OF(v) ((v) / 10000000)

/* The runtime's calls but those the shared steps make (teu_gpu_calls:
 * the device table, hipStreamSynchronize, hipLaunchHostFunc). */
typedef struct runtime {
	void *lib;
	const char *name; /* which of LIBS opened */
	int major;        /* ROCm major version of the runtime */
	hipError_t (*Init)(unsigned);
	hipError_t (*RuntimeGetVersion)(int *);
	hipError_t (*GetDeviceCount)(int *);
	hipError_t (*GetDevice)(int *);
	hipError_t (*SetDevice)(int);
	hipError_t (*PointerGetAttribute)(void *, int, void *);
	hipError_t (*Memcpy)(void *, const void *, size_t, int);
	hipError_t (*HostMalloc)(void **, size_t, unsigned);
	hipError_t (*HostFree)(void *);
	hipError_t (*Malloc)(void **, size_t);
	hipError_t (*Free)(void *);
	const char *(*GetErrorString)(hipError_t);
	hipError_t (*StreamSynchronize)(hipStream_t);
	/* Optional: without them copies are synchronous only. */
	hipError_t (*StreamCreateWithFlags)(hipStream_t *, unsigned);
	hipError_t (*StreamDestroy)(hipStream_t);
	hipError_t (*MemcpyAsync)(void *, const void *, size_t, int, hipStream_t);
	hipError_t (*EventCreateWithFlags)(hipEvent_t *, unsigned);
	hipError_t (*EventRecord)(hipEvent_t, hipStream_t);
	hipError_t (*EventSynchronize)(hipEvent_t);
	hipError_t (*EventDestroy)(hipEvent_t);
	hipError_t (*EventQuery)(hipEvent_t); /* optional too: without it, no bursts */
	/* Optional: dma-buf export (newer runtimes). */
	hipError_t (*MemGetHandleForAddressRange)(void *, void *, size_t, int, unsigned long long);
	/* Optional: sharing hipMalloc memory with other processes. */
	hipError_t (*IpcGetMemHandle)(hipIpcMemHandle_t *, void *);
	hipError_t (*IpcOpenMemHandle)(void **, hipIpcMemHandle_t, unsigned);
	hipError_t (*IpcCloseMemHandle)(void *);
	/* Optional: the device of a stream for host work in its order
	 * (te_submit_on_stream; hipStreamGetDevice: ROCm 5.2 and later). */
	hipError_t (*StreamGetDevice)(hipStream_t, hipDevice_t *);
} runtime;

/* Asynchronous copies go round-robin to this many streams, so that copies
 * into and out of the devices can use both copy engines at once. */
#define STREAMS 2
/* Streams for copy_batch, taken one per batch; a batch waits for a free one. */
#define BATCH_STREAMS 4
/* Events kept for reuse: creating one per copy costs a runtime call. */
#define SPARE_EVENTS 256
/* The most copies the completer reports in one burst (as a CUDA lane group). */
#define BURST_MAX 64

/* A queued copy whose event the completer waits for. */
typedef struct hip_pending {
	struct hip_pending *next;
	hipEvent_t ev;
	te_device_done_fn done;
	void *arg;
	size_t len;
} hip_pending;

typedef struct hip_ctx {
	teu_gpu g; /* first: the shared steps' (the host, the devices) */
	runtime rt;
	unsigned device_type; /* hipMemoryType's "device" in this runtime */

	/* Asynchronous copies (see hip_copy_async) */
	bool async;
	hipStream_t streams[STREAMS];
	atomic_uint next_stream;
	atomic_bool said_sync; /* the fall-back to waiting was logged */
	pthread_t completer;
	pthread_mutex_t lock; /* guards the pending list, the spare events and quit */
	pthread_cond_t cond;
	hip_pending *head, *tail;
	hipEvent_t spare[SPARE_EVENTS];
	unsigned nspare;
	bool quit;

	/* Batches (see hip_copy_batch) */
	teu_gpu_pool batch;
	atomic_bool said_no_stream_device; /* stream_device without hipStreamGetDevice */
} hip_ctx;

static inline const char *errstr(const runtime *r, hipError_t e)
{
	const char *s = r->GetErrorString != NULL ? r->GetErrorString(e) : NULL;
	return s != NULL ? s : "unknown HIP error";
}

TEU_GPU_DECLARE_OPS(hip);

/* hip-plugin.c */
int device_enter(hip_ctx *c, int dev);
void device_leave(hip_ctx *c, int dev, int old);
bool range_of(hip_ctx *c, void *p, uintptr_t *start, size_t *size);

/* hip-copy.c */
bool async_start(hip_ctx *c);
void async_stop(hip_ctx *c);
hipStream_t copy_stream_take(hip_ctx *c);
void copy_stream_give(hip_ctx *c, hipStream_t s);

#endif
