/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA device plugin's shared declarations: the plugin's context and
 * the functions its files share (the driver's types, calls and table are in
 * util/teu-cuda.h, so that neither the plugin nor libte needs the CUDA
 * toolkit). cuda-plugin.c opens the driver and holds the
 * ops table; cuda-copy.c the copies; cuda-share.c the virtual memory API, dma-bufs and
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

#include "teu-cuda.h"
#include "teu-gather.h"
#include "teu-gpu.h"

/* Asynchronous copies go round-robin to this many lanes (a stream and a
 * thread that reports its copies' ends), so that copies into and out of the
 * devices use both copy engines at once. */
#define LANES 4
/* Streams for batches (copy_batch): one per batch in flight. */
#define POOL_MAX TEU_GPU_POOL_MAX
/* Events kept for reuse. */
#define EVENTS_KEPT 256

typedef struct cuda_ctx cuda_ctx;

/* What the gather kernel moves (TE_CUDA_GATHER): nothing, device-to-device
 * batches (the default), or also pieces between device memory and the
 * page-locked host memory this plugin allocated (=host). */
enum { GATHER_OFF, GATHER_DEVICE, GATHER_HOST };

/* Page-locked host memory from cu_host_alloc, and the address the device
 * reaches it at: the only host memory the gather kernel is given, as the
 * plugin alone knows when it goes away. */
typedef struct host_map {
	struct host_map *next;
	uintptr_t start;
	size_t size;
	CUdeviceptr dev;
} host_map;

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
	teu_gpu g; /* first: the shared steps' (the host, the devices) */
	teu_cu_driver drv;
	CUcontext ctx[TEU_GPU_MAX_DEVICES]; /* primary contexts */

	/* Asynchronous copies (see cu_copy_async) */
	bool async;
	lane lanes[LANES];
	unsigned next_lane; /* the submitter's */
	pthread_t sub_thread;
	bool sub_started, sub_quit;
	pthread_mutex_t sub_lock; /* guards the queue and sub_quit */
	pthread_cond_t sub_cond;
	cu_job *sub_head, *sub_tail;
	teu_gather sub_gather; /* the submitter's launches (TE_CUDA_GATHER=host) */
	pthread_mutex_t ev_lock; /* guards the kept events */
	CUevent events[EVENTS_KEPT];
	unsigned nevents;

	/* Batches and synchronous copies (see pool_get) */
	bool streams; /* the driver has the calls they need */
	teu_gpu_pool pool;
	atomic_bool said_no_pool;
	pthread_mutex_t gather_lock;
	atomic_int gather_state; /* 0 not tried, 1 loaded, -1 unusable */
	int gather_mode;  /* TE_CUDA_GATHER */
	pthread_mutex_t host_lock; /* guards hosts */
	host_map *hosts;
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

	atomic_bool said_no_stream_ctx; /* stream_enter without cuStreamGetCtx */

	/* The virtual memory API */
	bool alloc_vmm; /* TE_CUDA_ALLOC=vmm */
	pthread_mutex_t vmm_lock;
	vmm_map *maps;
};


/* The ops' work (cu_classify, ...; cuda-copy.c and cuda-share.c). cuda-plugin.c hands them
 * to the host as cuda_classify, ..., which put the caller's current context
 * back after them. */
TEU_GPU_DECLARE_OPS(cu);

/* cuda-plugin.c */
/* Driver calls need a current context in the calling thread. */
void cu_make_current(cuda_ctx *c, int dev);

/* cuda-copy.c */
bool cu_async_start(cuda_ctx *c);
void cu_async_stop(cuda_ctx *c);
/* Whether the plugin has a stream of its own to copy on (none: its copies
 * are cuMemcpy, which waits for the legacy stream). */
bool cuda_own_stream(void *ctx);

#endif
