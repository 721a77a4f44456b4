/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A stand-in for the CUDA driver library (libcuda.so.1) for the tests: the
 * driver API calls the CUDA device plugin makes, on memory the CPU cannot
 * touch, so the real plugin's code runs end to end on a machine without a
 * GPU. Never installed; the tests put its folder on LD_LIBRARY_PATH.
 *
 * - Two devices. Their memory is one memfd mapped twice, as the test device
 *   plugin does: device pointers come from a view without access rights, and
 *   copies go through a second, read-write view. Code that touches device
 *   memory directly crashes.
 * - Streams are FIFO queues, each with a thread (a GPU's copy engine): an
 *   asynchronous copy and a stream callback run there, in order, and the
 *   callback gets the status of the work before it.
 * - FAKE_CUDA_FAIL_ASYNC=1 makes cuMemcpyAsync refuse; FAKE_CUDA_FAIL_STREAM=1
 *   makes queued copies fail (the callback sees the error);
 *   FAKE_CUDA_NO_CALLBACK=1 makes cuStreamAddCallback refuse.
 *   FAKE_CUDA_STATS=FILE writes, at exit, how many copies of each kind were
 *   made and how many other processes' allocations were opened.
 * - IPC: a handle names the memfd through /proc/<pid>/fd/<n> (processes of
 *   the same user may open it), and cuIpcOpenMemHandle maps the allocation
 *   twice as cuInit maps the devices; cuIpcOpenMemHandle in the exporting
 *   process itself fails, as the driver's does.
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

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef struct fstream *CUstream;
typedef void (*CUstreamCallback)(CUstream stream, CUresult status, void *user);

enum {
	OK = 0,
	ERR_INVALID_VALUE = 1,
	ERR_OUT_OF_MEMORY = 2,
	ERR_NOT_INITIALIZED = 3,
	ERR_INVALID_DEVICE = 101,
	ERR_ILLEGAL_ADDRESS = 700,
	ATTR_MEMORY_TYPE = 2,
	ATTR_DEVICE_ORDINAL = 9,
	ATTR_RANGE_START_ADDR = 11,
	ATTR_RANGE_SIZE = 12,
	MEMORYTYPE_DEVICE = 2,
};

#define NDEV 2
#define DEV_SIZE (2ull << 30) /* virtual: pages exist once written */
#define MAX_ALLOCS 4096

typedef struct alloc {
	uintptr_t start;
	size_t size;
	char *priv; /* another process's allocation opened here: its read-write view; NULL: ours */
	size_t mapped; /* bytes of both views (a whole number of pages) */
} alloc;

typedef struct CUipcMemHandle {
	char reserved[64];
} CUipcMemHandle;

typedef struct ipc_handle {
	uint32_t magic;
	int32_t pid, fd;
	uint32_t pad;
	uint64_t off, size; /* the allocation in the memfd */
} ipc_handle;

#define IPC_MAGIC 0x43504946u

static struct {
	pthread_mutex_t lock;
	bool ready;
	char *dev;  /* PROT_NONE view: what callers get */
	char *priv; /* read-write view */
	int fd;     /* the memfd, open for other processes' cuIpcOpenMemHandle */
	size_t next[NDEV];
	alloc allocs[MAX_ALLOCS];
	unsigned nallocs;
} g = { .lock = PTHREAD_MUTEX_INITIALIZER };

static atomic_ulong sync_copies, async_copies, callbacks, ipc_opens;
static atomic_uint nimports; /* opened allocations: none, no lookup (the copies' usual case) */

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

/* The allocation holding `p` (a copy: cuMemFree moves entries). */
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

static CUresult copy(CUdeviceptr dst, CUdeviceptr src, size_t len)
{
	void *d = (void *)(uintptr_t)dst;
	const void *s = (const void *)(uintptr_t)src;
	if ((inside(d, 1) && !inside(d, len)) || (inside(s, 1) && !inside(s, len)))
		return ERR_ILLEGAL_ADDRESS;
	memmove(view(d), view(s), len);
	return OK;
}

static void write_stats(void)
{
	const char *path = getenv("FAKE_CUDA_STATS");
	FILE *f = path ? fopen(path, "a") : NULL;
	if (f == NULL)
		return;
	fprintf(f, "sync %lu async %lu callbacks %lu ipc %lu\n", atomic_load(&sync_copies),
		atomic_load(&async_copies), atomic_load(&callbacks), atomic_load(&ipc_opens));
	fclose(f);
}

API CUresult cuInit(unsigned flags)
{
	(void)flags;
	pthread_mutex_lock(&g.lock);
	if (!g.ready) {
		int fd = memfd_create("fake-cuda", MFD_CLOEXEC);
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
	CUresult r = g.ready ? OK : ERR_OUT_OF_MEMORY;
	pthread_mutex_unlock(&g.lock);
	return r;
}

API CUresult cuDeviceGetCount(int *n)
{
	*n = g.ready ? NDEV : 0;
	return g.ready ? OK : ERR_NOT_INITIALIZED;
}

API CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
	if (ordinal < 0 || ordinal >= NDEV)
		return ERR_INVALID_DEVICE;
	*dev = ordinal;
	return OK;
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	snprintf(name, (size_t)len, "libte fake GPU %d", dev);
	return OK;
}

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	(void)dev;
	*bytes = DEV_SIZE;
	return OK;
}

API CUresult cuDeviceGetPCIBusId(char *id, int len, CUdevice dev)
{
	snprintf(id, (size_t)len, "0000:%02X:00.0", 0x3b + dev);
	return OK;
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
	*ctx = (CUcontext)(uintptr_t)(dev + 1);
	return OK;
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	(void)dev;
	return OK;
}

API CUresult cuCtxSetCurrent(CUcontext ctx)
{
	(void)ctx;
	return OK;
}

API CUresult cuGetErrorString(CUresult r, const char **s)
{
	switch (r) {
	case OK: *s = "no error"; break;
	case ERR_INVALID_VALUE: *s = "invalid argument"; break;
	case ERR_OUT_OF_MEMORY: *s = "out of memory"; break;
	case ERR_ILLEGAL_ADDRESS: *s = "an illegal memory access was encountered"; break;
	default: *s = "fake CUDA error"; break;
	}
	return OK;
}

API CUresult cuPointerGetAttribute(void *out, int attr, CUdeviceptr p)
{
	alloc a;
	if (!find_alloc((uintptr_t)p, &a))
		return ERR_INVALID_VALUE; /* what the driver says of memory it does not know */
	switch (attr) {
	case ATTR_MEMORY_TYPE: *(unsigned *)out = MEMORYTYPE_DEVICE; return OK;
	case ATTR_DEVICE_ORDINAL: *(int *)out = a.priv ? 0 : (int)((a.start - (uintptr_t)g.dev) / DEV_SIZE); return OK;
	case ATTR_RANGE_START_ADDR: *(CUdeviceptr *)out = a.start; return OK;
	case ATTR_RANGE_SIZE: *(size_t *)out = a.size; return OK;
	default: return ERR_INVALID_VALUE;
	}
}

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t len)
{
	/* The current context is not tracked: device 0, or device 1 once 0 is
	 * full (enough for the tests, which use one at a time). */
	size_t want = (len + 4095) / 4096 * 4096;
	CUresult r = ERR_OUT_OF_MEMORY;
	pthread_mutex_lock(&g.lock);
	for (int d = 0; d < NDEV && r != OK && g.nallocs < MAX_ALLOCS && g.ready; d++) {
		if (want == 0 || g.next[d] + want > DEV_SIZE)
			continue;
		uintptr_t start = (uintptr_t)g.dev + (size_t)d * DEV_SIZE + g.next[d];
		g.next[d] += want;
		g.allocs[g.nallocs++] = (alloc){ start, len, NULL, 0 };
		*p = start;
		r = OK;
	}
	pthread_mutex_unlock(&g.lock);
	return r;
}

API CUresult cuMemFree_v2(CUdeviceptr p)
{
	CUresult r = ERR_INVALID_VALUE;
	pthread_mutex_lock(&g.lock);
	for (unsigned i = 0; i < g.nallocs; i++)
		if (g.allocs[i].start == p && g.allocs[i].priv == NULL) {
			g.allocs[i] = g.allocs[--g.nallocs]; /* its space is not reused */
			r = OK;
			break;
		}
	pthread_mutex_unlock(&g.lock);
	return r;
}

API CUresult cuMemHostAlloc(void **p, size_t len, unsigned flags)
{
	(void)flags;
	return posix_memalign(p, 4096, len ? len : 1) == 0 ? OK : ERR_OUT_OF_MEMORY;
}

API CUresult cuMemFreeHost(void *p)
{
	free(p);
	return OK;
}

API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t len)
{
	atomic_fetch_add(&sync_copies, 1);
	return copy(dst, src, len);
}

/* ---------------------------------------------------------------- streams */

typedef struct op {
	struct op *next;
	CUdeviceptr dst, src;
	size_t len;
	CUstreamCallback cb; /* set: a callback, not a copy */
	void *user;
} op;

struct fstream {
	pthread_mutex_t lock;
	pthread_cond_t cond;  /* work queued, or quit */
	pthread_cond_t idle;  /* the queue ran empty */
	op *head, *tail;
	bool busy, quit;
	CUresult status;      /* first error of the stream's work */
	pthread_t thread;
};

static void *stream_thread(void *arg)
{
	CUstream s = arg;

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
		CUresult status = s->status;
		pthread_mutex_unlock(&s->lock);
		if (o->cb != NULL) {
			atomic_fetch_add(&callbacks, 1);
			o->cb(s, status, o->user);
		} else {
			CUresult r = getenv("FAKE_CUDA_FAIL_STREAM") ? ERR_ILLEGAL_ADDRESS : copy(o->dst, o->src, o->len);
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

API CUresult cuStreamCreate(CUstream *out, unsigned flags)
{
	(void)flags;
	CUstream s = calloc(1, sizeof *s);
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

static CUresult push(CUstream s, op *o)
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
	pthread_cond_signal(&s->cond);
	pthread_mutex_unlock(&s->lock);
	return OK;
}

API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t len, CUstream s)
{
	if (getenv("FAKE_CUDA_FAIL_ASYNC") != NULL)
		return ERR_INVALID_VALUE;
	op *o = calloc(1, sizeof *o);
	if (o != NULL)
		*o = (op){ .dst = dst, .src = src, .len = len };
	return push(s, o);
}

API CUresult cuStreamAddCallback(CUstream s, CUstreamCallback cb, void *user, unsigned flags)
{
	if (cb == NULL || flags != 0 || getenv("FAKE_CUDA_NO_CALLBACK") != NULL)
		return ERR_INVALID_VALUE;
	op *o = calloc(1, sizeof *o);
	if (o != NULL)
		*o = (op){ .cb = cb, .user = user };
	return push(s, o);
}

API CUresult cuStreamSynchronize(CUstream s)
{
	if (s == NULL)
		return OK; /* the legacy default stream: nothing runs there */
	pthread_mutex_lock(&s->lock);
	while (s->head != NULL || s->busy)
		pthread_cond_wait(&s->idle, &s->lock);
	CUresult r = s->status;
	pthread_mutex_unlock(&s->lock);
	return r;
}

API CUresult cuStreamDestroy_v2(CUstream s)
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

API CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
	alloc a;
	ipc_handle ih = { .magic = IPC_MAGIC, .pid = (int32_t)getpid(), .fd = g.fd };
	if (!find_alloc((uintptr_t)p, &a) || a.priv != NULL || a.start != p)
		return ERR_INVALID_VALUE; /* handles name whole allocations of this process */
	ih.off = a.start - (uintptr_t)g.dev;
	ih.size = a.size;
	memset(h, 0, sizeof *h);
	memcpy(h->reserved, &ih, sizeof ih);
	return OK;
}

API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *out, CUipcMemHandle h, unsigned flags)
{
	ipc_handle ih;
	char path[64];
	(void)flags;
	memcpy(&ih, h.reserved, sizeof ih);
	if (ih.magic != IPC_MAGIC || ih.size == 0 || ih.off % 4096 != 0 || ih.pid == (int32_t)getpid())
		return ERR_INVALID_VALUE;
	snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)ih.pid, (int)ih.fd);
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return ERR_INVALID_VALUE;
	size_t len = (ih.size + 4095) / 4096 * 4096;
	char *d = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, (off_t)ih.off);
	char *v = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)ih.off);
	close(fd);
	CUresult r = ERR_OUT_OF_MEMORY;
	pthread_mutex_lock(&g.lock);
	if (d != MAP_FAILED && v != MAP_FAILED && g.nallocs < MAX_ALLOCS) {
		g.allocs[g.nallocs++] = (alloc){ (uintptr_t)d, ih.size, v, len };
		atomic_fetch_add(&nimports, 1);
		*out = (uintptr_t)d;
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

API CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
	alloc a = { 0 };
	pthread_mutex_lock(&g.lock);
	for (unsigned i = 0; i < g.nallocs; i++)
		if (g.allocs[i].start == p && g.allocs[i].priv != NULL) {
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
