/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A stand-in for the HIP runtime library (libamdhip64.so) for the tests:
 * the HIP calls the HIP device plugin makes, on memory the CPU cannot touch,
 * so the real plugin's code runs end to end on a machine without a GPU.
 * Never installed; the tests put its folder on LD_LIBRARY_PATH.
 *
 * - Two devices, their memory and IPC handles as fake-gpu.h makes them (the
 *   core shared with the stand-in CUDA driver). hipMalloc allocates on the
 *   calling thread's current device.
 * - Streams are FIFO queues, each with a thread (a GPU's copy engine):
 *   asynchronous copies, event records and host functions run there, in
 *   order; an event gets the status of the stream's work before it. No
 *   stream callbacks. A stream is the device's that was current when it was
 *   made (hipStreamGetDevice). Each device has a null stream (stream NULL,
 *   of the calling thread's current device), made when first used; a stream
 *   made by hipStreamCreate or with flags 0 is a blocking one, ordered
 *   against it (fake-gpu.h), and hipMemcpy, a synchronous copy on the null
 *   stream, waits for the work of both first, as the runtime's does.
 * - FAKE_HIP_VERSION=N: what hipRuntimeGetVersion says (default 60342134,
 *   ROCm 6); below 60000000 the memory types take ROCm 5's numbering.
 *   FAKE_HIP_NO_DEVICE=1: no device. FAKE_HIP_FAIL_COPY=1: every copy
 *   fails, hipMemcpy's and the queued ones (events and stream waits see the
 *   error). Copies to or from pinned host memory (hipHostMalloc: what
 *   transfers stage through, while a program fills its device memory from
 *   its own) fail with FAKE_HIP_FAIL_ASYNC=1: hipMemcpyAsync refuses them;
 *   FAKE_HIP_FAIL_STREAM=1: they fail on the stream;
 *   FAKE_HIP_NO_EVENT_RECORD=1: hipEventRecord refuses;
 *   FAKE_HIP_FAIL_EVENT_QUERY=1: hipEventQuery refuses.
 *   FAKE_HIP_STATS=FILE appends, at exit, how many calls of each kind ran.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "../fake-gpu.h"

typedef int hipError_t;
typedef int hipDevice_t;
typedef struct fstream *hipStream_t;
typedef struct fevent *hipEvent_t;

enum {
	ERR_NO_DEVICE = 100,
	ERR_NOT_READY = 600,
	MEMCPY_DEFAULT = 4,
	IPC_LAZY = 1,
};

#define DEFAULT_VERSION 60342134

typedef struct hipIpcMemHandle {
	char reserved[64];
} hipIpcMemHandle_t;

#define IPC_MAGIC 0x50494846u

/* The thread's current device (0 until set), under a thread key rather than
 * in _Thread_local: this library is dlopen()ed, and LeakSanitizer's scan of
 * a dlopen()ed module's thread-local blocks read stale ranges of threads. */
static pthread_key_t current_key;
static pthread_once_t current_once = PTHREAD_ONCE_INIT;

static void current_key_make(void)
{
	if (pthread_key_create(&current_key, NULL) != 0)
		abort();
}

static int current_get(void)
{
	pthread_once(&current_once, current_key_make);
	return (int)(uintptr_t)pthread_getspecific(current_key);
}

static void current_set(int dev)
{
	pthread_once(&current_once, current_key_make);
	if (pthread_setspecific(current_key, (void *)(uintptr_t)dev) != 0)
		abort();
}
static atomic_ulong sync_copies, async_copies, events, event_waits, event_ended, batches, ipc_opens,
	set_devices;

static bool env(const char *name)
{
	const char *v = getenv(name);
	return v != NULL && *v != '\0' && strcmp(v, "0") != 0;
}

static bool rocm5(void)
{
	const char *v = getenv("FAKE_HIP_VERSION");
	return v != NULL && atol(v) < 60000000;
}

/* Whether p is in pinned host memory (hipHostMalloc). */
static bool pinned(const void *p)
{
	alloc a;
	return find_alloc((uintptr_t)p, &a) && a.kind == A_HOST;
}

static hipError_t copy(void *d, const void *s, size_t len, int kind)
{
	if (kind != MEMCPY_DEFAULT)
		return ERR_INVALID_VALUE; /* the plugin relies on unified addressing */
	if ((inside(d, 1) && !inside(d, len)) || (inside(s, 1) && !inside(s, len)))
		return ERR_ILLEGAL_ADDRESS;
	memmove(view(d), view(s), len);
	return OK;
}

static void write_stats(void)
{
	const char *path = getenv("FAKE_HIP_STATS");
	FILE *f = path ? fopen(path, "a") : NULL;
	if (f == NULL)
		return;
	fprintf(f,
		"sync %lu async %lu events %lu event_waits %lu event_ended %lu batches %lu ipc %lu "
		"set_device %lu\n",
		atomic_load(&sync_copies), atomic_load(&async_copies), atomic_load(&events),
		atomic_load(&event_waits), atomic_load(&event_ended), atomic_load(&batches),
		atomic_load(&ipc_opens), atomic_load(&set_devices));
	fclose(f);
}

static bool init(void)
{
	pthread_mutex_lock(&g.lock);
	if (!g.ready && map_devices("fake-hip"))
		atexit(write_stats);
	bool ok = g.ready;
	pthread_mutex_unlock(&g.lock);
	return ok;
}

API hipError_t hipInit(unsigned flags)
{
	(void)flags;
	return init() ? OK : ERR_OUT_OF_MEMORY;
}

API hipError_t hipRuntimeGetVersion(int *v)
{
	const char *s = getenv("FAKE_HIP_VERSION");
	*v = s != NULL ? atoi(s) : DEFAULT_VERSION;
	return OK;
}

API hipError_t hipGetDeviceCount(int *n)
{
	*n = 0;
	if (!init())
		return ERR_NOT_INITIALIZED;
	if (env("FAKE_HIP_NO_DEVICE"))
		return ERR_NO_DEVICE;
	*n = NDEV;
	return OK;
}

API hipError_t hipGetDevice(int *dev)
{
	*dev = current_get();
	return OK;
}

API hipError_t hipSetDevice(int dev)
{
	if (dev < 0 || dev >= NDEV)
		return ERR_INVALID_DEVICE;
	atomic_fetch_add(&set_devices, 1);
	current_set(dev);
	return OK;
}

API hipError_t hipDeviceGet(hipDevice_t *dev, int ordinal)
{
	return device_get(dev, ordinal);
}

API hipError_t hipDeviceGetName(char *name, int len, hipDevice_t dev)
{
	snprintf(name, (size_t)len, "libte fake AMD GPU %d", dev);
	return OK;
}

API hipError_t hipDeviceTotalMem(size_t *bytes, hipDevice_t dev)
{
	(void)dev;
	*bytes = DEV_SIZE;
	return OK;
}

API hipError_t hipDeviceGetPCIBusId(char *id, int len, int dev)
{
	if (dev < 0 || dev >= NDEV)
		return ERR_INVALID_DEVICE;
	snprintf(id, (size_t)len, "0000:%02X:00.0", 0xc1 + dev);
	return OK;
}

API const char *hipGetErrorString(hipError_t e)
{
	switch (e) {
	case OK: return "hipSuccess";
	case ERR_INVALID_VALUE: return "hipErrorInvalidValue";
	case ERR_OUT_OF_MEMORY: return "hipErrorOutOfMemory";
	case ERR_NO_DEVICE: return "hipErrorNoDevice";
	case ERR_NOT_READY: return "hipErrorNotReady";
	case ERR_ILLEGAL_ADDRESS: return "hipErrorIllegalAddress";
	case ERR_NOT_SUPPORTED: return "hipErrorNotSupported";
	default: return "fake HIP error";
	}
}

API hipError_t hipPointerGetAttribute(void *out, int attr, void *p)
{
	alloc a;
	if (!find_alloc((uintptr_t)p, &a))
		return ERR_INVALID_VALUE; /* memory the runtime does not know */
	switch (attr) {
	case ATTR_MEMORY_TYPE:
		/* ROCm 5: Host 0, Device 1; ROCm 6: Host 1, Device 2. */
		*(unsigned *)out = (a.kind == A_HOST ? 0u : 1u) + (rocm5() ? 0u : 1u);
		return OK;
	case ATTR_DEVICE_ORDINAL: *(int *)out = a.dev; return OK;
	case ATTR_RANGE_START_ADDR: *(void **)out = (void *)a.start; return OK;
	case ATTR_RANGE_SIZE: *(size_t *)out = a.size; return OK;
	default: return ERR_INVALID_VALUE;
	}
}

API hipError_t hipMalloc(void **p, size_t len)
{
	uintptr_t start = 0;
	pthread_mutex_lock(&g.lock);
	hipError_t r = alloc_device(current_get(), len, &start);
	pthread_mutex_unlock(&g.lock);
	if (r == OK)
		*p = (void *)start;
	return r;
}

API hipError_t hipFree(void *p)
{
	return p == NULL || forget((uintptr_t)p, A_MALLOC) ? OK : ERR_INVALID_VALUE;
}

API hipError_t hipHostMalloc(void **p, size_t len, unsigned flags)
{
	(void)flags;
	if (posix_memalign(p, 4096, len ? len : 1) != 0)
		return ERR_OUT_OF_MEMORY;
	pthread_mutex_lock(&g.lock);
	bool ok = g.nallocs < MAX_ALLOCS;
	if (ok)
		g.allocs[g.nallocs++] = (alloc){ .start = (uintptr_t)*p, .size = len ? len : 1, .kind = A_HOST };
	pthread_mutex_unlock(&g.lock);
	if (!ok) {
		free(*p);
		return ERR_OUT_OF_MEMORY;
	}
	return OK;
}

API hipError_t hipHostFree(void *p)
{
	if (p == NULL)
		return OK;
	if (!forget((uintptr_t)p, A_HOST))
		return ERR_INVALID_VALUE;
	free(p);
	return OK;
}

API hipError_t hipMemcpy(void *dst, const void *src, size_t len, int kind)
{
	atomic_fetch_add(&sync_copies, 1);
	null_drain(current_get()); /* a copy on the null stream: after its work and the blocking streams' */
	if (env("FAKE_HIP_FAIL_COPY"))
		return ERR_ILLEGAL_ADDRESS;
	return copy(dst, src, len, kind);
}

API hipError_t hipMemGetHandleForAddressRange(void *handle, void *p, size_t size, int type,
					      unsigned long long flags)
{
	(void)handle, (void)p, (void)size, (void)type, (void)flags;
	return ERR_NOT_SUPPORTED; /* no dma-buf from memory of a memfd */
}

/* ------------------------------------------------------- streams, events */

struct fevent {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint64_t recorded, reached; /* records made, records the stream got to */
	hipError_t status;
};

typedef struct op {
	qnode q; /* first: the stream queues ops as qnodes */
	void *dst;
	const void *src;
	size_t len;
	hipEvent_t ev; /* set: an event record, not a copy */
	uint64_t seq;
	void (*fn)(void *); /* set: hipLaunchHostFunc's function, not a copy */
	void *arg;
} op;

struct fstream {
	worker w; /* first (stream_new); idle: the queue ran empty */
	hipError_t status;    /* first error of the stream's work */
	unsigned since_wait;  /* copies queued since the last hipStreamSynchronize */
};

static void *stream_thread(void *arg)
{
	hipStream_t s = arg;

	pthread_mutex_lock(&s->w.lock);
	for (;;) {
		op *o = (op *)worker_take(&s->w);
		if (o == NULL)
			break;
		pthread_mutex_unlock(&s->w.lock);
		deps_wait(&o->q); /* a blocking or null stream's turn comes after the other's */
		pthread_mutex_lock(&s->w.lock);
		hipError_t status = s->status;
		pthread_mutex_unlock(&s->w.lock);
		if (o->fn != NULL) {
			o->fn(o->arg);
		} else if (o->ev != NULL) {
			pthread_mutex_lock(&o->ev->lock);
			if (o->seq > o->ev->reached) {
				o->ev->reached = o->seq;
				o->ev->status = status;
			}
			pthread_cond_broadcast(&o->ev->cond);
			pthread_mutex_unlock(&o->ev->lock);
		} else {
			bool fail = env("FAKE_HIP_FAIL_COPY") ||
				    (env("FAKE_HIP_FAIL_STREAM") && (pinned(o->dst) || pinned(o->src)));
			hipError_t r = fail ? ERR_ILLEGAL_ADDRESS : copy(o->dst, o->src, o->len, MEMCPY_DEFAULT);
			atomic_fetch_add(&async_copies, 1);
			pthread_mutex_lock(&s->w.lock);
			if (s->status == OK)
				s->status = r;
			pthread_mutex_unlock(&s->w.lock);
		}
		free(o);
		pthread_mutex_lock(&s->w.lock);
		worker_done(&s->w);
	}
	pthread_mutex_unlock(&s->w.lock);
	return NULL;
}

/* hipStreamNonBlocking (1): not ordered against the null stream. */
API hipError_t hipStreamCreateWithFlags(hipStream_t *out, unsigned flags)
{
	*out = stream_new(sizeof **out, stream_thread, current_get(), flags & 1 ? W_NONBLOCKING : W_BLOCKING);
	return *out != NULL ? OK : ERR_OUT_OF_MEMORY;
}

API hipError_t hipStreamCreate(hipStream_t *out)
{
	return hipStreamCreateWithFlags(out, 0);
}

static worker *null_make(int dev)
{
	return stream_new(sizeof(struct fstream), stream_thread, dev, W_NULL);
}

/* The stream s names: NULL is the current device's null stream. */
static hipStream_t resolve(hipStream_t s)
{
	return s != NULL ? s : (hipStream_t)null_stream(current_get(), null_make);
}

static hipError_t push(hipStream_t s, op *o)
{
	s = resolve(s);
	if (s == NULL || o == NULL) {
		free(o);
		return ERR_OUT_OF_MEMORY;
	}
	if (o->ev == NULL && o->fn == NULL) {
		pthread_mutex_lock(&s->w.lock);
		s->since_wait++;
		pthread_mutex_unlock(&s->w.lock);
	}
	worker_push_ordered(&s->w, &o->q, NULL);
	return OK;
}

API hipError_t hipStreamGetDevice(hipStream_t s, hipDevice_t *dev)
{
	if (dev == NULL)
		return ERR_INVALID_VALUE;
	*dev = s != NULL ? s->w.dev : current_get();
	return OK;
}

API hipError_t hipMemcpyAsync(void *dst, const void *src, size_t len, int kind, hipStream_t s)
{
	if ((env("FAKE_HIP_FAIL_ASYNC") && (pinned(dst) || pinned(src))) || kind != MEMCPY_DEFAULT)
		return ERR_INVALID_VALUE;
	op *o = calloc(1, sizeof *o);
	if (o != NULL)
		*o = (op){ .dst = dst, .src = src, .len = len };
	return push(s, o);
}

API hipError_t hipLaunchHostFunc(hipStream_t s, void (*fn)(void *), void *arg)
{
	if (fn == NULL)
		return ERR_INVALID_VALUE;
	op *o = calloc(1, sizeof *o);
	if (o != NULL)
		*o = (op){ .fn = fn, .arg = arg };
	return push(s, o);
}

API hipError_t hipStreamSynchronize(hipStream_t s)
{
	if (s == NULL) { /* the null stream's work, and the blocking streams' before it */
		null_drain(current_get());
		pthread_mutex_lock(&sync_.lock);
		s = (hipStream_t)sync_.null_[current_get()];
		pthread_mutex_unlock(&sync_.lock);
		if (s == NULL)
			return OK;
	}
	pthread_mutex_lock(&s->w.lock);
	while (s->w.head != NULL || s->w.busy)
		pthread_cond_wait(&s->w.idle, &s->w.lock);
	if (s->since_wait > 1)
		atomic_fetch_add(&batches, 1); /* several copies waited for at once */
	s->since_wait = 0;
	hipError_t r = s->status;
	pthread_mutex_unlock(&s->w.lock);
	return r;
}

API hipError_t hipStreamDestroy(hipStream_t s)
{
	if (s == NULL)
		return ERR_INVALID_VALUE;
	stream_free(&s->w);
	return OK;
}

API hipError_t hipEventCreateWithFlags(hipEvent_t *out, unsigned flags)
{
	(void)flags;
	hipEvent_t e = calloc(1, sizeof *e);
	if (e == NULL)
		return ERR_OUT_OF_MEMORY;
	pthread_mutex_init(&e->lock, NULL);
	pthread_cond_init(&e->cond, NULL);
	*out = e;
	return OK;
}

API hipError_t hipEventRecord(hipEvent_t e, hipStream_t s)
{
	if (e == NULL || env("FAKE_HIP_NO_EVENT_RECORD"))
		return ERR_INVALID_VALUE;
	op *o = calloc(1, sizeof *o);
	if (o == NULL)
		return ERR_OUT_OF_MEMORY;
	pthread_mutex_lock(&e->lock);
	o->ev = e;
	o->seq = ++e->recorded;
	pthread_mutex_unlock(&e->lock);
	atomic_fetch_add(&events, 1);
	return push(s, o);
}

static hipError_t wait_event(hipEvent_t e)
{
	pthread_mutex_lock(&e->lock);
	uint64_t want = e->recorded;
	while (e->reached < want)
		pthread_cond_wait(&e->cond, &e->lock);
	hipError_t r = e->status;
	pthread_mutex_unlock(&e->lock);
	return r;
}

API hipError_t hipEventSynchronize(hipEvent_t e)
{
	if (e == NULL)
		return ERR_INVALID_VALUE;
	atomic_fetch_add(&event_waits, 1);
	return wait_event(e);
}

/* hipErrorNotReady while work before the event's last record runs; else
 * that work's status. event_ended counts the queries that found it ended
 * well (those the plugin reports a copy on, as a wait would). */
API hipError_t hipEventQuery(hipEvent_t e)
{
	if (e == NULL || env("FAKE_HIP_FAIL_EVENT_QUERY"))
		return ERR_INVALID_VALUE;
	pthread_mutex_lock(&e->lock);
	bool ended = e->reached >= e->recorded;
	hipError_t r = ended ? e->status : ERR_NOT_READY;
	pthread_mutex_unlock(&e->lock);
	if (ended && r == OK)
		atomic_fetch_add(&event_ended, 1);
	return r;
}

API hipError_t hipEventDestroy(hipEvent_t e)
{
	if (e == NULL)
		return ERR_INVALID_VALUE;
	/* Like the runtime, a recorded event may be destroyed before the stream
	 * gets to it; here the record must not outlive it, so wait. */
	wait_event(e);
	pthread_mutex_destroy(&e->lock);
	pthread_cond_destroy(&e->cond);
	free(e);
	return OK;
}

/* ------------------------------------------------------------------- IPC */

API hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t *h, void *p)
{
	alloc a;
	if (!find_alloc((uintptr_t)p, &a) || a.kind != A_MALLOC || a.start != (uintptr_t)p)
		return ERR_INVALID_VALUE; /* handles name whole allocations of this process */
	ipc_export(h->reserved, &a, IPC_MAGIC);
	return OK;
}

API hipError_t hipIpcOpenMemHandle(void **out, hipIpcMemHandle_t h, unsigned flags)
{
	if (flags != IPC_LAZY)
		return ERR_INVALID_VALUE;
	hipError_t r = ipc_open(h.reserved, IPC_MAGIC, current_get(), out);
	if (r == OK)
		atomic_fetch_add(&ipc_opens, 1);
	return r;
}

API hipError_t hipIpcCloseMemHandle(void *p)
{
	return ipc_close((uintptr_t)p) ? OK : ERR_INVALID_VALUE;
}
