/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A stand-in for the HIP runtime library (libamdhip64.so) for the tests:
 * the HIP calls the HIP device plugin makes, on memory the CPU cannot touch,
 * so the real plugin's code runs end to end on a machine without a GPU.
 * Never installed; the tests put its folder on LD_LIBRARY_PATH.
 *
 * - Two devices. Their memory is one memfd mapped twice: device pointers
 *   come from a view without access rights, and copies go through a second,
 *   read-write view. Code that touches device memory directly crashes.
 *   hipMalloc allocates on the calling thread's current device.
 * - Streams are FIFO queues, each with a thread (a GPU's copy engine):
 *   asynchronous copies and event records run there, in order; an event
 *   gets the status of the stream's work before it. No stream callbacks.
 * - FAKE_HIP_VERSION=N: what hipRuntimeGetVersion says (default 60342134,
 *   ROCm 6); below 60000000 the memory types take ROCm 5's numbering.
 *   FAKE_HIP_NO_DEVICE=1: no device. FAKE_HIP_FAIL_COPY=1: hipMemcpy fails;
 *   FAKE_HIP_FAIL_ASYNC=1: hipMemcpyAsync refuses; FAKE_HIP_FAIL_STREAM=1:
 *   queued copies fail (events and stream waits see the error);
 *   FAKE_HIP_NO_EVENT_RECORD=1: hipEventRecord refuses.
 *   FAKE_HIP_STATS=FILE appends, at exit, how many calls of each kind ran.
 * - IPC: a handle names the memfd through /proc/<pid>/fd/<n> (processes of
 *   the same user may open it), and hipIpcOpenMemHandle maps the allocation
 *   twice as the devices are; opening in the exporting process itself
 *   fails, as the runtime's does.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

typedef int hipError_t;
typedef int hipDevice_t;
typedef struct fstream *hipStream_t;
typedef struct fevent *hipEvent_t;

enum {
	OK = 0,
	ERR_INVALID_VALUE = 1,
	ERR_OUT_OF_MEMORY = 2,
	ERR_NOT_INITIALIZED = 3,
	ERR_NO_DEVICE = 100,
	ERR_INVALID_DEVICE = 101,
	ERR_ILLEGAL_ADDRESS = 700,
	ERR_NOT_SUPPORTED = 801,
	ATTR_MEMORY_TYPE = 2,
	ATTR_DEVICE_ORDINAL = 9,
	ATTR_RANGE_START_ADDR = 11,
	ATTR_RANGE_SIZE = 12,
	MEMCPY_DEFAULT = 4,
	IPC_LAZY = 1,
};

#define NDEV 2
#define DEV_SIZE (2ull << 30) /* virtual: pages exist once written */
#define MAX_ALLOCS 4096
#define DEFAULT_VERSION 60342134

typedef struct alloc {
	uintptr_t start;
	size_t size;
	char *priv;    /* another process's allocation opened here: its read-write view */
	size_t mapped; /* bytes of both views (a whole number of pages) */
	int device;
	bool host;     /* hipHostMalloc memory */
} alloc;

typedef struct hipIpcMemHandle {
	char reserved[64];
} hipIpcMemHandle_t;

typedef struct ipc_handle {
	uint32_t magic;
	int32_t pid, fd, device;
	uint64_t off, size; /* the allocation in the memfd */
} ipc_handle;

#define IPC_MAGIC 0x50494846u

static struct {
	pthread_mutex_t lock;
	bool ready;
	char *dev;  /* PROT_NONE view: what callers get */
	char *priv; /* read-write view */
	int fd;     /* the memfd, open for other processes' hipIpcOpenMemHandle */
	size_t next[NDEV];
	alloc allocs[MAX_ALLOCS];
	unsigned nallocs;
} g = { .lock = PTHREAD_MUTEX_INITIALIZER };

static _Thread_local int current; /* the thread's current device */
static atomic_ulong sync_copies, async_copies, events, event_waits, batches, ipc_opens, set_devices;
static atomic_uint nimports; /* opened allocations: none, no lookup (the copies' usual case) */

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

static bool own(const void *p, size_t len)
{
	uintptr_t a = (uintptr_t)p, base = (uintptr_t)g.dev;
	return g.dev != NULL && a >= base && len <= NDEV * DEV_SIZE && a - base <= NDEV * DEV_SIZE - len;
}

/* An opened allocation of another process holding [p, p+len): its private
 * view of p; NULL when none. */
static char *imported(const void *p, size_t len)
{
	uintptr_t a = (uintptr_t)p;
	char *v = NULL;
	if (atomic_load(&nimports) == 0)
		return NULL;
	pthread_mutex_lock(&g.lock);
	for (unsigned i = 0; i < g.nallocs && v == NULL; i++)
		if (g.allocs[i].priv != NULL && a >= g.allocs[i].start && len <= g.allocs[i].size &&
		    a - g.allocs[i].start <= g.allocs[i].size - len)
			v = g.allocs[i].priv + (a - g.allocs[i].start);
	pthread_mutex_unlock(&g.lock);
	return v;
}

static bool inside(const void *p, size_t len)
{
	return own(p, len) || imported(p, len) != NULL;
}

static void *view(const void *p)
{
	if (own(p, 1))
		return g.priv + ((const char *)p - g.dev);
	char *v = imported(p, 1);
	return v != NULL ? v : (void *)p;
}

/* The allocation holding `p` (a copy: hipFree moves entries). */
static bool find_alloc(uintptr_t p, alloc *out)
{
	bool found = false;
	pthread_mutex_lock(&g.lock);
	for (unsigned i = 0; i < g.nallocs && !found; i++)
		if (p >= g.allocs[i].start && p - g.allocs[i].start < g.allocs[i].size) {
			*out = g.allocs[i];
			found = true;
		}
	pthread_mutex_unlock(&g.lock);
	return found;
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
	fprintf(f, "sync %lu async %lu events %lu event_waits %lu batches %lu ipc %lu set_device %lu\n",
		atomic_load(&sync_copies), atomic_load(&async_copies), atomic_load(&events),
		atomic_load(&event_waits), atomic_load(&batches), atomic_load(&ipc_opens),
		atomic_load(&set_devices));
	fclose(f);
}

static bool init(void)
{
	pthread_mutex_lock(&g.lock);
	if (!g.ready) {
		int fd = memfd_create("fake-hip", MFD_CLOEXEC);
		if (fd >= 0 && ftruncate(fd, NDEV * DEV_SIZE) == 0) {
			g.dev = mmap(NULL, NDEV * DEV_SIZE, PROT_NONE, MAP_SHARED, fd, 0);
			g.priv = mmap(NULL, NDEV * DEV_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			g.ready = g.dev != MAP_FAILED && g.priv != MAP_FAILED;
			if (!g.ready)
				g.dev = g.priv = NULL;
			else
				atexit(write_stats);
		}
		if (g.ready)
			g.fd = fd;
		else if (fd >= 0)
			close(fd);
	}
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
	*dev = current;
	return OK;
}

API hipError_t hipSetDevice(int dev)
{
	if (dev < 0 || dev >= NDEV)
		return ERR_INVALID_DEVICE;
	atomic_fetch_add(&set_devices, 1);
	current = dev;
	return OK;
}

API hipError_t hipDeviceGet(hipDevice_t *dev, int ordinal)
{
	if (ordinal < 0 || ordinal >= NDEV)
		return ERR_INVALID_DEVICE;
	*dev = ordinal;
	return OK;
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
		*(unsigned *)out = (a.host ? 0u : 1u) + (rocm5() ? 0u : 1u);
		return OK;
	case ATTR_DEVICE_ORDINAL: *(int *)out = a.device; return OK;
	case ATTR_RANGE_START_ADDR: *(void **)out = (void *)a.start; return OK;
	case ATTR_RANGE_SIZE: *(size_t *)out = a.size; return OK;
	default: return ERR_INVALID_VALUE;
	}
}

API hipError_t hipMalloc(void **p, size_t len)
{
	size_t want = (len + 4095) / 4096 * 4096;
	int d = current;
	hipError_t r = ERR_OUT_OF_MEMORY;
	pthread_mutex_lock(&g.lock);
	if (g.ready && want > 0 && g.nallocs < MAX_ALLOCS && g.next[d] + want <= DEV_SIZE) {
		uintptr_t start = (uintptr_t)g.dev + (size_t)d * DEV_SIZE + g.next[d];
		g.next[d] += want;
		g.allocs[g.nallocs++] = (alloc){ .start = start, .size = len, .device = d };
		*p = (void *)start;
		r = OK;
	}
	pthread_mutex_unlock(&g.lock);
	return r;
}

static hipError_t forget(void *p, bool host)
{
	hipError_t r = ERR_INVALID_VALUE;
	pthread_mutex_lock(&g.lock);
	for (unsigned i = 0; i < g.nallocs; i++)
		if (g.allocs[i].start == (uintptr_t)p && g.allocs[i].priv == NULL && g.allocs[i].host == host) {
			g.allocs[i] = g.allocs[--g.nallocs]; /* device space is not reused */
			r = OK;
			break;
		}
	pthread_mutex_unlock(&g.lock);
	return r;
}

API hipError_t hipFree(void *p)
{
	return p == NULL ? OK : forget(p, false);
}

API hipError_t hipHostMalloc(void **p, size_t len, unsigned flags)
{
	(void)flags;
	if (posix_memalign(p, 4096, len ? len : 1) != 0)
		return ERR_OUT_OF_MEMORY;
	pthread_mutex_lock(&g.lock);
	bool ok = g.nallocs < MAX_ALLOCS;
	if (ok)
		g.allocs[g.nallocs++] = (alloc){ .start = (uintptr_t)*p, .size = len ? len : 1, .host = true };
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
	hipError_t r = forget(p, true);
	if (r == OK)
		free(p);
	return r;
}

API hipError_t hipMemcpy(void *dst, const void *src, size_t len, int kind)
{
	atomic_fetch_add(&sync_copies, 1);
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
	struct op *next;
	void *dst;
	const void *src;
	size_t len;
	hipEvent_t ev; /* set: an event record, not a copy */
	uint64_t seq;
} op;

struct fstream {
	pthread_mutex_t lock;
	pthread_cond_t cond;  /* work queued, or quit */
	pthread_cond_t idle;  /* the queue ran empty */
	op *head, *tail;
	bool busy, quit;
	hipError_t status;    /* first error of the stream's work */
	unsigned since_wait;  /* copies queued since the last hipStreamSynchronize */
	pthread_t thread;
};

static void *stream_thread(void *arg)
{
	hipStream_t s = arg;

	pthread_mutex_lock(&s->lock);
	for (;;) {
		while (s->head == NULL && !s->quit)
			pthread_cond_wait(&s->cond, &s->lock);
		if (s->head == NULL)
			break;
		op *o = s->head;
		s->head = o->next;
		if (s->head == NULL)
			s->tail = NULL;
		s->busy = true;
		hipError_t status = s->status;
		pthread_mutex_unlock(&s->lock);
		if (o->ev != NULL) {
			pthread_mutex_lock(&o->ev->lock);
			if (o->seq > o->ev->reached) {
				o->ev->reached = o->seq;
				o->ev->status = status;
			}
			pthread_cond_broadcast(&o->ev->cond);
			pthread_mutex_unlock(&o->ev->lock);
		} else {
			hipError_t r = env("FAKE_HIP_FAIL_STREAM") ? ERR_ILLEGAL_ADDRESS
								   : copy(o->dst, o->src, o->len, MEMCPY_DEFAULT);
			atomic_fetch_add(&async_copies, 1);
			pthread_mutex_lock(&s->lock);
			if (s->status == OK)
				s->status = r;
			pthread_mutex_unlock(&s->lock);
		}
		free(o);
		pthread_mutex_lock(&s->lock);
		s->busy = false;
		if (s->head == NULL)
			pthread_cond_broadcast(&s->idle);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

API hipError_t hipStreamCreateWithFlags(hipStream_t *out, unsigned flags)
{
	(void)flags;
	hipStream_t s = calloc(1, sizeof *s);
	if (s == NULL)
		return ERR_OUT_OF_MEMORY;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	pthread_cond_init(&s->idle, NULL);
	if (pthread_create(&s->thread, NULL, stream_thread, s) != 0) {
		free(s);
		return ERR_OUT_OF_MEMORY;
	}
	*out = s;
	return OK;
}

static hipError_t push(hipStream_t s, op *o)
{
	if (s == NULL || o == NULL) {
		free(o);
		return s == NULL ? ERR_INVALID_VALUE : ERR_OUT_OF_MEMORY;
	}
	pthread_mutex_lock(&s->lock);
	if (s->tail)
		s->tail->next = o;
	else
		s->head = o;
	s->tail = o;
	if (o->ev == NULL)
		s->since_wait++;
	pthread_cond_signal(&s->cond);
	pthread_mutex_unlock(&s->lock);
	return OK;
}

API hipError_t hipMemcpyAsync(void *dst, const void *src, size_t len, int kind, hipStream_t s)
{
	if (env("FAKE_HIP_FAIL_ASYNC") || kind != MEMCPY_DEFAULT)
		return ERR_INVALID_VALUE;
	op *o = calloc(1, sizeof *o);
	if (o != NULL)
		*o = (op){ .dst = dst, .src = src, .len = len };
	return push(s, o);
}

API hipError_t hipStreamSynchronize(hipStream_t s)
{
	if (s == NULL)
		return OK; /* the null stream: nothing runs there */
	pthread_mutex_lock(&s->lock);
	while (s->head != NULL || s->busy)
		pthread_cond_wait(&s->idle, &s->lock);
	if (s->since_wait > 1)
		atomic_fetch_add(&batches, 1); /* several copies waited for at once */
	s->since_wait = 0;
	hipError_t r = s->status;
	pthread_mutex_unlock(&s->lock);
	return r;
}

API hipError_t hipStreamDestroy(hipStream_t s)
{
	if (s == NULL)
		return ERR_INVALID_VALUE;
	pthread_mutex_lock(&s->lock);
	s->quit = true; /* queued work still runs first */
	pthread_cond_signal(&s->cond);
	pthread_mutex_unlock(&s->lock);
	pthread_join(s->thread, NULL);
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->cond);
	pthread_cond_destroy(&s->idle);
	free(s);
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
	if (e == NULL || s == NULL || env("FAKE_HIP_NO_EVENT_RECORD"))
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
	ipc_handle ih = { .magic = IPC_MAGIC, .pid = (int32_t)getpid(), .fd = g.fd };
	if (!find_alloc((uintptr_t)p, &a) || a.priv != NULL || a.host || a.start != (uintptr_t)p)
		return ERR_INVALID_VALUE; /* handles name whole allocations of this process */
	ih.off = a.start - (uintptr_t)g.dev;
	ih.size = a.size;
	ih.device = a.device;
	memset(h, 0, sizeof *h);
	memcpy(h->reserved, &ih, sizeof ih);
	return OK;
}

API hipError_t hipIpcOpenMemHandle(void **out, hipIpcMemHandle_t h, unsigned flags)
{
	ipc_handle ih;
	char path[64];
	memcpy(&ih, h.reserved, sizeof ih);
	if (flags != IPC_LAZY || ih.magic != IPC_MAGIC || ih.size == 0 || ih.off % 4096 != 0 ||
	    ih.pid == (int32_t)getpid())
		return ERR_INVALID_VALUE;
	snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)ih.pid, (int)ih.fd);
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return ERR_INVALID_VALUE;
	size_t len = (ih.size + 4095) / 4096 * 4096;
	char *d = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, (off_t)ih.off);
	char *v = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)ih.off);
	close(fd);
	hipError_t r = ERR_OUT_OF_MEMORY;
	pthread_mutex_lock(&g.lock);
	if (d != MAP_FAILED && v != MAP_FAILED && g.nallocs < MAX_ALLOCS) {
		g.allocs[g.nallocs++] = (alloc){ .start = (uintptr_t)d, .size = ih.size, .priv = v,
						 .mapped = len, .device = current };
		atomic_fetch_add(&nimports, 1);
		*out = d;
		r = OK;
	}
	pthread_mutex_unlock(&g.lock);
	if (r != OK) {
		if (d != MAP_FAILED)
			munmap(d, len);
		if (v != MAP_FAILED)
			munmap(v, len);
	} else {
		atomic_fetch_add(&ipc_opens, 1);
	}
	return r;
}

API hipError_t hipIpcCloseMemHandle(void *p)
{
	alloc a = { 0 };
	pthread_mutex_lock(&g.lock);
	for (unsigned i = 0; i < g.nallocs; i++)
		if (g.allocs[i].start == (uintptr_t)p && g.allocs[i].priv != NULL) {
			a = g.allocs[i];
			g.allocs[i] = g.allocs[--g.nallocs];
			atomic_fetch_sub(&nimports, 1);
			break;
		}
	pthread_mutex_unlock(&g.lock);
	if (a.priv == NULL)
		return ERR_INVALID_VALUE;
	munmap((void *)a.start, a.mapped);
	munmap(a.priv, a.mapped);
	return OK;
}
