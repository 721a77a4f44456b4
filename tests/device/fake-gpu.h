/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The core both stand-in GPU drivers (fake-cuda/, fake-hip/) are built on,
 * included once by each:
 *
 * - NDEV devices whose memory is one memfd mapped twice: device pointers
 *   come from a view without access rights (code that touches device memory
 *   directly crashes), copies go through a second, read-write view;
 * - the table of allocations, and the way from a device pointer to the
 *   read-write view of its bytes;
 * - streams: a FIFO of work and the thread that runs it (a GPU's copy
 *   engine), what each driver queues on it its own; each device's null
 *   (legacy default) stream, and blocking streams that synchronise with it
 *   as the runtimes' do: work on a blocking stream starts after the work
 *   queued on its device's null stream before it, work on the null stream
 *   after the work queued on every blocking stream of the device before
 *   it, and a synchronous copy after both; non-blocking streams wait for
 *   neither;
 * - IPC: a handle names the memfd through /proc/<pid>/fd/<n> (processes of
 *   the same user may open it), and another process maps the allocation
 *   twice as the devices are; opening in the exporting process itself fails,
 *   as the real drivers' does.
 *
 * CUDA and HIP number the errors and pointer attributes below alike.
 */
#ifndef TE_FAKE_GPU_H
#define TE_FAKE_GPU_H

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

enum {
	OK = 0,
	ERR_INVALID_VALUE = 1,
	ERR_OUT_OF_MEMORY = 2,
	ERR_NOT_INITIALIZED = 3,
	ERR_INVALID_DEVICE = 101,
	ERR_ILLEGAL_ADDRESS = 700,
	ERR_NOT_SUPPORTED = 801,
	ATTR_MEMORY_TYPE = 2,
	ATTR_DEVICE_POINTER = 3,
	ATTR_DEVICE_ORDINAL = 9,
	ATTR_RANGE_START_ADDR = 11,
	ATTR_RANGE_SIZE = 12,
};

#define NDEV 2
#define DEV_SIZE (2ull << 30) /* virtual: pages exist once written */
#define MAX_ALLOCS 4096

/* An allocation is the driver's device memory, another process's opened by
 * IPC handle, a mapping of virtual memory management (fake-cuda) or pinned
 * host memory (fake-hip). */
enum { A_MALLOC, A_IPC, A_VMM, A_HOST };

typedef struct vmm vmm; /* fake-cuda's cuMemCreate allocations */

typedef struct alloc {
	uintptr_t start;
	size_t size;
	char *priv;    /* memory mapped here (A_IPC, A_VMM): its read-write view; NULL: in g.priv */
	size_t mapped; /* bytes of both views (a whole number of pages) */
	int kind, dev;
	vmm *h;        /* A_VMM: the allocation mapped */
} alloc;

/* What the drivers' 64-byte IPC handles hold. */
typedef struct ipc_handle {
	uint32_t magic;
	int32_t pid, fd, device;
	uint64_t off, size; /* the allocation in the memfd */
} ipc_handle;

static struct {
	pthread_mutex_t lock;
	bool ready;
	char *dev;  /* PROT_NONE view: what callers get */
	char *priv; /* read-write view */
	int fd;     /* the memfd, open for other processes' IPC opens */
	size_t next[NDEV];
	alloc allocs[MAX_ALLOCS];
	unsigned nallocs;
} g = { .lock = PTHREAD_MUTEX_INITIALIZER };

static atomic_uint nviews; /* allocations with views of their own: none, no lookup (the copies' usual case) */

/* Creates the devices' memory, g.lock held and g not ready yet: whether it
 * is ready now. */
static bool map_devices(const char *name)
{
	int fd = memfd_create(name, MFD_CLOEXEC);
	if (fd >= 0 && ftruncate(fd, NDEV * DEV_SIZE) == 0) {
		g.dev = mmap(NULL, NDEV * DEV_SIZE, PROT_NONE, MAP_SHARED, fd, 0);
		g.priv = mmap(NULL, NDEV * DEV_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		g.ready = g.dev != MAP_FAILED && g.priv != MAP_FAILED;
		if (!g.ready)
			g.dev = g.priv = NULL;
	}
	if (g.ready)
		g.fd = fd;
	else if (fd >= 0)
		close(fd);
	return g.ready;
}

static bool own(const void *p, size_t len)
{
	uintptr_t a = (uintptr_t)p, base = (uintptr_t)g.dev;
	return g.dev != NULL && a >= base && len <= NDEV * DEV_SIZE && a - base <= NDEV * DEV_SIZE - len;
}

/* Memory with a view of its own (another process's allocation opened here,
 * or a cuMemMap mapping) holding [p, p+len): its read-write view of p; NULL
 * when none. */
static char *imported(const void *p, size_t len)
{
	uintptr_t a = (uintptr_t)p;
	char *v = NULL;
	if (atomic_load(&nviews) == 0)
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

/* The allocation holding `p` (a copy: freeing moves entries). */
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

/* Records len bytes of device d (its space is never reused), g.lock held:
 * OK and their device address in *start, or ERR_OUT_OF_MEMORY. */
static int alloc_device(int d, size_t len, uintptr_t *start)
{
	size_t want = (len + 4095) / 4096 * 4096;
	if (!g.ready || want == 0 || g.nallocs >= MAX_ALLOCS || g.next[d] + want > DEV_SIZE)
		return ERR_OUT_OF_MEMORY;
	*start = (uintptr_t)g.dev + (size_t)d * DEV_SIZE + g.next[d];
	g.next[d] += want;
	g.allocs[g.nallocs++] = (alloc){ .start = *start, .size = len, .kind = A_MALLOC, .dev = d };
	return OK;
}

/* Drops the allocation of `kind` that starts at p from the table: whether
 * there was one. */
static bool forget(uintptr_t p, int kind)
{
	bool found = false;
	pthread_mutex_lock(&g.lock);
	for (unsigned i = 0; i < g.nallocs && !found; i++)
		if (g.allocs[i].start == p && g.allocs[i].kind == kind) {
			g.allocs[i] = g.allocs[--g.nallocs]; /* device space is not reused */
			found = true;
		}
	pthread_mutex_unlock(&g.lock);
	return found;
}

static int device_get(int *dev, int ordinal)
{
	if (ordinal < 0 || ordinal >= NDEV)
		return ERR_INVALID_DEVICE;
	*dev = ordinal;
	return OK;
}

/* ------------------------------------------------------------ streams */

struct worker;

/* Work of another stream an item waits for: until that stream has finished
 * `seq` items. */
typedef struct dep {
	struct worker *w;
	uint64_t seq;
} dep;

/* A stream's work items start with a qnode. */
typedef struct qnode {
	struct qnode *next;
	dep *deps; /* waited for before it runs (deps_wait) */
	unsigned ndeps;
} qnode;

/* How a stream orders itself against its device's null stream. */
enum { W_NONBLOCKING, W_BLOCKING, W_NULL };

typedef struct worker {
	pthread_mutex_t lock;
	pthread_cond_t cond; /* work queued, or quit */
	pthread_cond_t idle; /* an item finished */
	qnode *head, *tail;
	bool busy, quit;
	pthread_t thread;
	uint64_t pushed, finished; /* items queued, items finished (in order) */
	int dev, kind;
	struct worker *next_blocking; /* in sync_.blocking[dev] */
	atomic_uint refs; /* its owner's, and each dep naming it */
} worker;

/* The null streams and the blocking streams of each device. Taken before a
 * worker's lock, never after. */
static struct {
	pthread_mutex_t lock;
	worker *null_[NDEV];
	worker *blocking[NDEV];
} sync_ = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* A new stream of device `dev` ordered as `kind` says: `size` zeroed bytes
 * that start with its worker, whose thread runs run(the stream); NULL when
 * out of memory or threads. A null stream is the caller's to record. */
static void *stream_new(size_t size, void *(*run)(void *), int dev, int kind)
{
	worker *w = calloc(1, size);
	if (w == NULL)
		return NULL;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	pthread_cond_init(&w->idle, NULL);
	w->dev = dev;
	w->kind = kind;
	atomic_init(&w->refs, 1);
	if (pthread_create(&w->thread, NULL, run, w) != 0) {
		free(w);
		return NULL;
	}
	if (kind == W_BLOCKING) {
		pthread_mutex_lock(&sync_.lock);
		w->next_blocking = sync_.blocking[dev];
		sync_.blocking[dev] = w;
		pthread_mutex_unlock(&sync_.lock);
	}
	return w;
}

static void worker_unref(worker *w)
{
	if (atomic_fetch_sub(&w->refs, 1) != 1)
		return;
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->cond);
	pthread_cond_destroy(&w->idle);
	free(w);
}

/* Ends a stream of stream_new once the work queued on it has run; its
 * memory goes with the last dep on it. */
static void stream_free(worker *w)
{
	if (w->kind == W_BLOCKING) {
		pthread_mutex_lock(&sync_.lock);
		for (worker **pp = &sync_.blocking[w->dev]; *pp != NULL; pp = &(*pp)->next_blocking)
			if (*pp == w) {
				*pp = w->next_blocking;
				break;
			}
		pthread_mutex_unlock(&sync_.lock);
	}
	pthread_mutex_lock(&w->lock);
	w->quit = true; /* queued work still runs first */
	pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
	pthread_join(w->thread, NULL);
	worker_unref(w);
}

/* Adds to n's deps the work queued on x so far, if any is unfinished;
 * sync_.lock held. Out of memory: not waited for. */
static void dep_add(qnode *n, worker *x)
{
	pthread_mutex_lock(&x->lock);
	uint64_t seq = x->pushed;
	bool pending = x->finished < seq;
	pthread_mutex_unlock(&x->lock);
	dep *d = pending ? realloc(n->deps, (n->ndeps + 1) * sizeof *d) : NULL;
	if (d == NULL)
		return;
	n->deps = d;
	atomic_fetch_add(&x->refs, 1);
	d[n->ndeps++] = (dep){ x, seq };
}

/* What work queued on w now waits for: for a blocking stream its device's
 * null stream's work, for a null stream the work of the device's blocking
 * streams; sync_.lock held, w's lock not. */
static void deps_for(worker *w, qnode *n)
{
	n->deps = NULL;
	n->ndeps = 0;
	if (w->kind == W_BLOCKING && sync_.null_[w->dev] != NULL)
		dep_add(n, sync_.null_[w->dev]);
	else if (w->kind == W_NULL)
		for (worker *b = sync_.blocking[w->dev]; b != NULL; b = b->next_blocking)
			dep_add(n, b);
}

/* Waits for n's deps and lets them go; no lock held. */
static void deps_wait(qnode *n)
{
	for (unsigned i = 0; i < n->ndeps; i++) {
		worker *x = n->deps[i].w;
		pthread_mutex_lock(&x->lock);
		while (x->finished < n->deps[i].seq)
			pthread_cond_wait(&x->idle, &x->lock);
		pthread_mutex_unlock(&x->lock);
		worker_unref(x);
	}
	free(n->deps);
	n->deps = NULL;
	n->ndeps = 0;
}

/* As a synchronous copy on device dev's null stream: waits for the work
 * queued before on it and on the device's blocking streams. */
static void null_drain(int dev)
{
	qnode tmp = { 0 };
	pthread_mutex_lock(&sync_.lock);
	if (sync_.null_[dev] != NULL)
		dep_add(&tmp, sync_.null_[dev]);
	for (worker *b = sync_.blocking[dev]; b != NULL; b = b->next_blocking)
		dep_add(&tmp, b);
	pthread_mutex_unlock(&sync_.lock);
	deps_wait(&tmp);
}

/* Device dev's null stream, made when first used (by make). */
static worker *null_stream(int dev, worker *(*make)(int dev))
{
	pthread_mutex_lock(&sync_.lock);
	if (sync_.null_[dev] == NULL)
		sync_.null_[dev] = make(dev);
	worker *w = sync_.null_[dev];
	pthread_mutex_unlock(&sync_.lock);
	return w;
}

/* Queues n, w->lock held. */
static void worker_push(worker *w, qnode *n)
{
	if (w->tail)
		w->tail->next = n;
	else
		w->head = n;
	w->tail = n;
	w->pushed++;
	pthread_cond_signal(&w->cond);
}

/* Queues n after what it must wait for (deps_for): the whole of it under
 * sync_.lock for a stream ordered against others, so that two streams'
 * items never wait for each other. (fake-cuda numbers its items itself.) */
static inline void worker_push_ordered(worker *w, qnode *n, uint64_t *seq)
{
	bool ordered = w->kind != W_NONBLOCKING;
	if (ordered) {
		pthread_mutex_lock(&sync_.lock);
		deps_for(w, n);
	}
	pthread_mutex_lock(&w->lock);
	worker_push(w, n);
	if (seq != NULL)
		*seq = w->pushed;
	pthread_mutex_unlock(&w->lock);
	if (ordered)
		pthread_mutex_unlock(&sync_.lock);
}

/* An item finished, w->lock held. */
static void worker_done(worker *w)
{
	w->finished++;
	w->busy = false;
	pthread_cond_broadcast(&w->idle);
}

/* The thread's next item, w->lock held (and let go while it waits), with
 * the worker marked busy; NULL once it is to quit and nothing is queued. */
static qnode *worker_take(worker *w)
{
	while (w->head == NULL && !w->quit)
		pthread_cond_wait(&w->cond, &w->lock);
	qnode *n = w->head;
	if (n == NULL)
		return NULL;
	w->head = n->next;
	if (w->head == NULL)
		w->tail = NULL;
	w->busy = true;
	return n;
}

/* ---------------------------------------------------------------- IPC */

/* The handle of this process's allocation `a`, into a driver's 64 bytes. */
static void ipc_export(char out[64], const alloc *a, uint32_t magic)
{
	ipc_handle ih = { .magic = magic, .pid = (int32_t)getpid(), .fd = g.fd, .device = a->dev,
			  .off = a->start - (uintptr_t)g.dev, .size = a->size };
	memset(out, 0, 64);
	memcpy(out, &ih, sizeof ih);
}

/* Opens the allocation a handle of another process names, recorded as A_IPC
 * memory of device `dev`: OK and its no-access address in *out, or the
 * error the driver returns. */
static int ipc_open(const char in[64], uint32_t magic, int dev, void **out)
{
	ipc_handle ih;
	char path[64];
	memcpy(&ih, in, sizeof ih);
	if (ih.magic != magic || ih.size == 0 || ih.off % 4096 != 0 || ih.pid == (int32_t)getpid())
		return ERR_INVALID_VALUE;
	snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)ih.pid, (int)ih.fd);
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return ERR_INVALID_VALUE;
	size_t len = (ih.size + 4095) / 4096 * 4096;
	char *d = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, (off_t)ih.off);
	char *v = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)ih.off);
	close(fd);
	int r = ERR_OUT_OF_MEMORY;
	pthread_mutex_lock(&g.lock);
	if (d != MAP_FAILED && v != MAP_FAILED && g.nallocs < MAX_ALLOCS) {
		g.allocs[g.nallocs++] = (alloc){ .start = (uintptr_t)d, .size = ih.size, .priv = v, .mapped = len,
						 .kind = A_IPC, .dev = dev };
		atomic_fetch_add(&nviews, 1);
		*out = d;
		r = OK;
	}
	pthread_mutex_unlock(&g.lock);
	if (r != OK) {
		if (d != MAP_FAILED)
			munmap(d, len);
		if (v != MAP_FAILED)
			munmap(v, len);
	}
	return r;
}

/* Unmaps an allocation ipc_open opened at p: whether there was one. */
static bool ipc_close(uintptr_t p)
{
	alloc a = { 0 };
	pthread_mutex_lock(&g.lock);
	for (unsigned i = 0; i < g.nallocs; i++)
		if (g.allocs[i].start == p && g.allocs[i].kind == A_IPC) {
			a = g.allocs[i];
			g.allocs[i] = g.allocs[--g.nallocs];
			atomic_fetch_sub(&nviews, 1);
			break;
		}
	pthread_mutex_unlock(&g.lock);
	if (a.priv == NULL)
		return false;
	munmap((void *)a.start, a.mapped);
	munmap(a.priv, a.mapped);
	return true;
}

#endif
