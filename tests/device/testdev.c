/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A device plugin for the tests: "device memory" that the CPU cannot touch.
 * One memfd is mapped twice: the device view, handed out by mem_alloc and
 * reported by classify, has no access rights at all, and the plugin's copies
 * go through a second, private read-write view of the same pages. Any code
 * that reads or writes device memory directly, instead of through the
 * plugin, crashes the test instead of passing by accident.
 *
 * Allocations of 2 MiB and more lie on 2 MiB boundaries and are backed by
 * 2 MiB pages (MADV_COLLAPSE, Linux 6.1 and later; 4 KiB pages where it
 * fails): a GPU maps its memory with large pages and its copy engines take
 * no CPU TLB misses, while copies through 4 KiB pages of the private view
 * took one every 4 KiB, a cost of this stand-in and not of the code under
 * test (docs/benchmarks.md, "Device memory staging");
 * TE_TESTDEV_SMALL_PAGES=1 keeps 4 KiB pages, to measure that cost.
 *
 * Two devices, testdev:0 and testdev:1 (the halves of the mapping). The
 * memfd is also the devices' dma-buf: a NIC (the RDMA tests' software verbs
 * layer) that maps it reaches device memory the way GPUDirect RDMA does.
 * TE_TESTDEV_FAIL=1 in the environment makes every copy fail with -EIO;
 * TE_TESTDEV_NO_DMABUF=1 makes the export fail (no GPUDirect);
 * TE_TESTDEV_OFF=1 makes the plugin idle; TE_TESTDEV_NO_ASYNC=1 makes
 * copy_async decline; TE_TESTDEV_BURST=N makes its copies run on a thread
 * of the plugin's and be reported in bursts of up to N. te_testdev_copies() counts the
 * copies made. Never installed.
 *
 * Other processes reach a device through the memfd too (ipc_export hands it
 * over; ipc_open maps it twice, as here): their views of it are device
 * memory of this plugin like its own. TE_TESTDEV_NO_IPC=1 makes the export
 * fail.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <te/te-plugin.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* The exported reader `fn` of the counter `var`, for the tests that load
 * this plugin and look it up (dlsym). */
#define TD_COUNTER(fn, var)                                            \
	__attribute__((visibility("default"))) unsigned long fn(void); \
	unsigned long fn(void)                                         \
	{                                                              \
		return atomic_load(&var);                              \
	}

#define SIZE (4ull << 30) /* virtual: the memfd's pages exist once written */
#define ALIGN 4096u
#define HUGE (2u << 20)
#define MAX_IMPORTS 64 /* never reused: 8 GiB of address space each */
#define IPC_MAGIC 0x54444950u /* "PIDT" */

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1; older C libraries do not name it */
#endif

/* A copy queued for the burst thread (TE_TESTDEV_BURST). */
typedef struct td_job {
	struct td_job *next;
	void *dst;
	const void *src;
	size_t len;
	te_device_done_fn done;
	void *arg;
} td_job;

typedef struct tdev {
	const te_host *host;
	/* TE_TESTDEV_BURST: the copies' thread and its queue */
	pthread_mutex_t burst_lock;
	pthread_cond_t burst_cond;
	td_job *head, *tail;
	pthread_t burst_thread;
	bool burst_started, burst_quit;
	char *dev;  /* PROT_NONE view */
	char *priv; /* read-write view, on a 2 MiB boundary */
	char *priv_area; /* the reservation it was placed in */
	int fd;     /* the memfd: the dma-buf */
	_Atomic size_t next; /* bump allocator per device half */
	_Atomic size_t next1;
	/* Other processes' devices opened here: a device view without access
	 * and a private one, as for our own. Entries are published (dev set
	 * last, with release) and never reused while the plugin lives, so
	 * lookups take no lock. */
	pthread_mutex_t import_lock;
	_Atomic int nimports; /* slots ever used: lookups stop there (none: the copies' usual case) */
	struct import {
		_Atomic(char *) dev;
		char *priv;
		size_t size;
		atomic_bool open; /* until ipc_close */
	} imports[MAX_IMPORTS];
} tdev;

/* ipc handle bytes: what ipc_open checks before it maps. */
typedef struct td_handle {
	uint32_t magic;
	uint32_t device;
	uint64_t size; /* the memfd's */
} td_handle;

static int td_probe(const te_host *h, char *why, size_t why_len)
{
	(void)h;
	if (getenv("TE_TESTDEV_OFF") != NULL) {
		snprintf(why, why_len, "disabled by TE_TESTDEV_OFF");
		return -ENODEV;
	}
	return 0;
}

static int td_create(const te_host *h, void **out)
{
	tdev *t = calloc(1, sizeof *t);
	int fd = memfd_create("te-testdev", MFD_CLOEXEC);

	if (t == NULL || fd < 0 || ftruncate(fd, SIZE) < 0) {
		free(t);
		if (fd >= 0)
			close(fd);
		return -ENOMEM;
	}
	t->host = h;
	t->fd = fd;
	pthread_mutex_init(&t->import_lock, NULL);
	pthread_mutex_init(&t->burst_lock, NULL);
	pthread_cond_init(&t->burst_cond, NULL);
	t->dev = mmap(NULL, SIZE, PROT_NONE, MAP_SHARED, fd, 0);
	/* File offset 0 at a 2 MiB boundary: only then can a 2 MiB page of the
	 * memfd be mapped whole. */
	t->priv_area = mmap(NULL, SIZE + HUGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	t->priv = MAP_FAILED;
	if (t->priv_area != MAP_FAILED) {
		char *at = (char *)(((uintptr_t)t->priv_area + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
		t->priv = mmap(at, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
	}
	if (t->dev == MAP_FAILED || t->priv == MAP_FAILED) {
		if (t->dev != MAP_FAILED)
			munmap(t->dev, SIZE);
		if (t->priv_area != MAP_FAILED)
			munmap(t->priv_area, SIZE + HUGE);
		close(fd);
		free(t);
		return -ENOMEM;
	}
	*out = t;
	return 0;
}

static void td_destroy(void *ctx)
{
	tdev *t = ctx;
	pthread_mutex_lock(&t->burst_lock);
	t->burst_quit = true;
	pthread_cond_signal(&t->burst_cond);
	pthread_mutex_unlock(&t->burst_lock);
	if (t->burst_started) /* it reports what is queued before it ends */
		pthread_join(t->burst_thread, NULL);
	pthread_mutex_destroy(&t->burst_lock);
	pthread_cond_destroy(&t->burst_cond);
	munmap(t->dev, SIZE);
	munmap(t->priv_area, SIZE + HUGE); /* the private view with it */
	for (int i = 0; i < MAX_IMPORTS; i++) {
		char *d = atomic_load(&t->imports[i].dev);
		if (d != NULL && d != MAP_FAILED) {
			munmap(d, t->imports[i].size);
			munmap(t->imports[i].priv, t->imports[i].size);
		}
	}
	pthread_mutex_destroy(&t->import_lock);
	close(t->fd);
	free(t);
}

static bool within(const char *base, size_t size, const void *p, size_t len)
{
	uintptr_t a = (uintptr_t)p, b = (uintptr_t)base;
	return base != NULL && a >= b && len <= size && a - b <= size - len;
}

/* The opened device of another process holding p, or NULL. */
static struct import *imported(tdev *t, const void *p)
{
	int n = atomic_load_explicit(&t->nimports, memory_order_acquire);
	for (int i = 0; i < n; i++) {
		struct import *im = &t->imports[i];
		char *d = atomic_load_explicit(&im->dev, memory_order_acquire);
		if (d != NULL && atomic_load_explicit(&im->open, memory_order_relaxed) &&
		    within(d, im->size, p, 1))
			return im;
	}
	return NULL;
}

static bool inside_own(const tdev *t, const void *p, size_t len)
{
	return within(t->dev, SIZE, p, len);
}

/* Device memory of this plugin: ours, or another process's opened here. */
static bool inside(tdev *t, const void *p, size_t len)
{
	if (inside_own(t, p, len))
		return true;
	struct import *im = len > 0 ? imported(t, p) : NULL;
	return im != NULL && within(im->dev, im->size, p, len);
}

static int td_classify(void *ctx, const void *addr, size_t len, int *device)
{
	tdev *t = ctx;

	if (!inside(t, addr, 1))
		return 0;
	if (!inside(t, addr, len))
		return -EINVAL;
	struct import *im = inside_own(t, addr, 1) ? NULL : imported(t, addr);
	const char *base = im != NULL ? im->dev : t->dev;
	*device = (uintptr_t)addr - (uintptr_t)base >= SIZE / 2;
	return 1;
}

/* The private view of a device address; host addresses stay as they are. */
static void *view(tdev *t, const void *p)
{
	if (inside_own(t, p, 1))
		return t->priv + ((const char *)p - t->dev);
	struct import *im = imported(t, p);
	return im != NULL ? im->priv + ((const char *)p - im->dev) : (void *)p;
}

static atomic_ulong copies;

TD_COUNTER(te_testdev_copies, copies)

/* The device's "copy engine". Not memmove: for the sizes staging copies
 * (64 KiB and up) glibc picks `rep movsb`, which on the AMD EPYC machines
 * these tests run on moves bytes at a fraction of the speed of a vector loop
 * (docs/benchmarks.md, "Device memory"), and a figure of the staging
 * pipeline would then mostly measure that. Writes into device memory use
 * streaming stores: like a real device's copies, they leave the CPU's caches
 * alone. Overlapping ranges (a device-to-device copy within one device) go
 * to memmove. */
static void engine_copy(char *d, const char *s, size_t n, bool to_device)
{
#ifdef __SSE2__
	if (n >= 256 && (d + n <= s || s + n <= d)) {
		while (((uintptr_t)d & 15) != 0) {
			*d++ = *s++;
			n--;
		}
		for (; n >= 64; n -= 64, s += 64, d += 64) {
			__m128i a = _mm_loadu_si128((const __m128i *)s);
			__m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
			__m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
			__m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
			if (to_device) {
				_mm_stream_si128((__m128i *)d, a);
				_mm_stream_si128((__m128i *)(d + 16), b);
				_mm_stream_si128((__m128i *)(d + 32), c);
				_mm_stream_si128((__m128i *)(d + 48), e);
			} else {
				_mm_store_si128((__m128i *)d, a);
				_mm_store_si128((__m128i *)(d + 16), b);
				_mm_store_si128((__m128i *)(d + 32), c);
				_mm_store_si128((__m128i *)(d + 48), e);
			}
		}
		if (to_device)
			_mm_sfence(); /* the bytes are visible before the copy reports done */
	}
#else
	(void)to_device;
#endif
	memmove(d, s, n);
}

static int td_copy(void *ctx, void *dst, const void *src, size_t len)
{
	tdev *t = ctx;

	if (getenv("TE_TESTDEV_FAIL") != NULL) {
		t->host->log(t->host, TE_LOG_WARN, "copy of %zu bytes fails (TE_TESTDEV_FAIL)", len);
		return -EIO;
	}
	if ((inside(t, dst, 1) && !inside(t, dst, len)) || (inside(t, src, 1) && !inside(t, src, len)))
		return -EINVAL;
	engine_copy(view(t, dst), view(t, src), len, inside(t, dst, 1));
	atomic_fetch_add(&copies, 1);
	return 0;
}

/* Its copy engine is the CPU: the copy is made before returning, and done()
 * runs then. TE_TESTDEV_NO_ASYNC=1 declines (-ENOTSUP), so that callers
 * fall back to copy(). */
static atomic_ulong async_copies;

TD_COUNTER(te_testdev_async_copies, async_copies)

/* TE_TESTDEV_BURST=N (read at each call): copy_async queues the copy for
 * a thread of the plugin's, which makes up to N queued copies at a time
 * and reports them as one burst of the host's (device_done_burst), as a
 * GPU plugin's lane reports the copies one event covered.
 * te_testdev_bursts() counts the bursts of two copies or more and
 * te_testdev_burst_max() gives the largest. */
static atomic_ulong bursts, burst_max;

TD_COUNTER(te_testdev_bursts, bursts)

TD_COUNTER(te_testdev_burst_max, burst_max)

static void *burst_main(void *arg)
{
	tdev *t = arg;
	const te_host *h = t->host;

	pthread_mutex_lock(&t->burst_lock);
	for (;;) {
		while (t->head == NULL && !t->burst_quit)
			pthread_cond_wait(&t->burst_cond, &t->burst_lock);
		td_job *jobs = t->head;
		if (jobs == NULL)
			break;
		const char *v = getenv("TE_TESTDEV_BURST");
		unsigned long max = v != NULL ? strtoul(v, NULL, 10) : 1, n = 1;
		td_job *last = jobs;
		while (last->next != NULL && n < max) {
			last = last->next;
			n++;
		}
		t->head = last->next;
		if (t->head == NULL)
			t->tail = NULL;
		last->next = NULL;
		pthread_mutex_unlock(&t->burst_lock);
		bool burst = n > 1 && TE_HAS_OP(h, device_done_burst);
		if (burst) {
			atomic_fetch_add(&bursts, 1);
			unsigned long m = atomic_load(&burst_max);
			while (n > m && !atomic_compare_exchange_weak(&burst_max, &m, n))
				;
			h->device_done_burst(h, 1);
		}
		for (td_job *j = jobs, *next; j != NULL; j = next) {
			next = j->next;
			j->done(j->arg, td_copy(t, j->dst, j->src, j->len));
			free(j);
		}
		if (burst)
			h->device_done_burst(h, 0);
		pthread_mutex_lock(&t->burst_lock);
	}
	pthread_mutex_unlock(&t->burst_lock);
	return NULL;
}

static int td_copy_async(void *ctx, void *dst, const void *src, size_t len, te_device_done_fn done,
			 void *arg)
{
	tdev *t = ctx;

	if (getenv("TE_TESTDEV_NO_ASYNC") != NULL)
		return -ENOTSUP;
	atomic_fetch_add(&async_copies, 1);
	if (getenv("TE_TESTDEV_BURST") == NULL) {
		done(arg, td_copy(ctx, dst, src, len));
		return 0;
	}
	td_job *j = malloc(sizeof *j);
	if (j == NULL)
		return -ENOMEM;
	*j = (td_job){ .dst = dst, .src = src, .len = len, .done = done, .arg = arg };
	pthread_mutex_lock(&t->burst_lock);
	int rc = 0;
	if (!t->burst_started) {
		if (pthread_create(&t->burst_thread, NULL, burst_main, t) == 0)
			t->burst_started = true;
		else
			rc = -EAGAIN;
	}
	if (rc == 0) {
		if (t->tail != NULL)
			t->tail->next = j;
		else
			t->head = j;
		t->tail = j;
		pthread_cond_signal(&t->burst_cond);
	}
	pthread_mutex_unlock(&t->burst_lock);
	if (rc != 0)
		free(j);
	return rc;
}

static int td_export_dmabuf(void *ctx, const void *addr, size_t len, int *fd, uint64_t *offset)
{
	tdev *t = ctx;

	if (getenv("TE_TESTDEV_NO_DMABUF") != NULL)
		return -ENOTSUP;
	if (!inside_own(t, addr, len))
		return -EINVAL;
	*fd = fcntl(t->fd, F_DUPFD_CLOEXEC, 0);
	if (*fd < 0)
		return -errno;
	*offset = (uint64_t)((const char *)addr - t->dev);
	return 0;
}

/* Sharing with another process: the whole memfd is the "allocation"; the
 * receiver maps it as its own device memory is mapped here. */
static int td_ipc_export(void *ctx, const void *addr, size_t len, te_device_ipc *ipc)
{
	tdev *t = ctx;
	td_handle hd = { .magic = IPC_MAGIC, .size = SIZE };

	if (getenv("TE_TESTDEV_NO_IPC") != NULL)
		return -ENOTSUP;
	if (!inside_own(t, addr, len))
		return -EINVAL; /* another process's memory is not ours to share */
	hd.device = (uintptr_t)addr - (uintptr_t)t->dev >= SIZE / 2;
	ipc->fd = fcntl(t->fd, F_DUPFD_CLOEXEC, 0);
	if (ipc->fd < 0)
		return -errno;
	ipc->device = (int32_t)hd.device;
	memcpy(ipc->handle, &hd, sizeof hd);
	ipc->handle_len = sizeof hd;
	ipc->alloc_base = (uintptr_t)t->dev;
	ipc->alloc_size = SIZE;
	return 0;
}

static atomic_ulong ipc_opens;

TD_COUNTER(te_testdev_ipc_opens, ipc_opens)

static int td_ipc_open(void *ctx, const te_device_ipc *ipc, void **base)
{
	tdev *t = ctx;
	td_handle hd;
	struct stat st;

	if (ipc->handle_len != sizeof hd || ipc->fd < 0)
		return -EINVAL;
	memcpy(&hd, ipc->handle, sizeof hd);
	if (hd.magic != IPC_MAGIC || hd.size != ipc->alloc_size || hd.size == 0 ||
	    fstat(ipc->fd, &st) < 0 || (uint64_t)st.st_size < hd.size)
		return -EINVAL; /* not one of ours, or not the size it claims */
	pthread_mutex_lock(&t->import_lock);
	int slot = -1;
	for (int i = 0; i < MAX_IMPORTS && slot < 0; i++)
		if (atomic_load(&t->imports[i].dev) == NULL)
			slot = i;
	if (slot < 0) {
		pthread_mutex_unlock(&t->import_lock);
		return -ENOSPC;
	}
	struct import *im = &t->imports[slot];
	char *d = mmap(NULL, hd.size, PROT_NONE, MAP_SHARED, ipc->fd, 0);
	char *p = mmap(NULL, hd.size, PROT_READ | PROT_WRITE, MAP_SHARED, ipc->fd, 0);
	if (d == MAP_FAILED || p == MAP_FAILED) {
		int rc = -errno;
		if (d != MAP_FAILED)
			munmap(d, hd.size);
		if (p != MAP_FAILED)
			munmap(p, hd.size);
		pthread_mutex_unlock(&t->import_lock);
		return rc;
	}
	im->priv = p;
	im->size = hd.size;
	atomic_store(&im->open, true);
	atomic_store_explicit(&im->dev, d, memory_order_release);
	atomic_store_explicit(&t->nimports, slot + 1, memory_order_release);
	pthread_mutex_unlock(&t->import_lock);
	atomic_fetch_add(&ipc_opens, 1);
	*base = d;
	return 0;
}

/* The views stay mapped (closed, they are no longer device memory)
 * until the plugin goes: a lookup racing a close never sees them unmapped,
 * and a slot is not reused. */
static void td_ipc_close(void *ctx, void *base)
{
	tdev *t = ctx;

	pthread_mutex_lock(&t->import_lock);
	for (int i = 0; i < MAX_IMPORTS; i++)
		if (atomic_load(&t->imports[i].dev) == base)
			atomic_store(&t->imports[i].open, false);
	pthread_mutex_unlock(&t->import_lock);
}

/* Streams: any pointer names one. Host functions queued on one run in
 * order on a thread of its own, each once the one before returned, as a
 * runtime's stream runs them; waiting for a stream waits until its queue is
 * empty. Both count (te_testdev_waits, te_testdev_launches). */
#define MAX_STREAMS 16

typedef struct td_hostfn {
	void (*fn)(void *);
	void *arg;
	struct td_hostfn *next;
} td_hostfn;

static struct td_stream {
	void *id;
	td_hostfn *head, *tail; /* head: running, or next */
} streams[MAX_STREAMS];
static int nstreams;
static pthread_mutex_t st_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t st_cond = PTHREAD_COND_INITIALIZER; /* work queued, or a job done */
static atomic_ulong waits, launches;

TD_COUNTER(te_testdev_waits, waits)

TD_COUNTER(te_testdev_launches, launches)

static void *stream_run(void *arg)
{
	struct td_stream *s = arg;

	pthread_mutex_lock(&st_lock);
	for (;;) {
		while (s->head == NULL)
			pthread_cond_wait(&st_cond, &st_lock);
		td_hostfn *j = s->head;
		pthread_mutex_unlock(&st_lock);
		j->fn(j->arg);
		pthread_mutex_lock(&st_lock);
		s->head = j->next;
		if (s->head == NULL)
			s->tail = NULL;
		free(j);
		pthread_cond_broadcast(&st_cond);
	}
	return NULL;
}

/* The stream named `id` (lock held); NULL when `make` is false and it has
 * never been used, or when the table is full. */
static struct td_stream *stream_of(void *id, bool make)
{
	for (int i = 0; i < nstreams; i++)
		if (streams[i].id == id)
			return &streams[i];
	if (!make || nstreams == MAX_STREAMS)
		return NULL;
	struct td_stream *s = &streams[nstreams];
	pthread_t thr;
	s->id = id;
	if (pthread_create(&thr, NULL, stream_run, s) != 0)
		return NULL;
	pthread_detach(thr); /* the process's for its life, as a runtime's */
	nstreams++;
	return s;
}

/* Also for tests, to queue work of their own (a "kernel") on a stream. */
__attribute__((visibility("default"))) int te_testdev_stream_launch(void *stream, void (*fn)(void *), void *arg);
int te_testdev_stream_launch(void *stream, void (*fn)(void *), void *arg)
{
	td_hostfn *j = calloc(1, sizeof *j);

	if (j == NULL || fn == NULL) {
		free(j);
		return fn == NULL ? -EINVAL : -ENOMEM;
	}
	j->fn = fn;
	j->arg = arg;
	pthread_mutex_lock(&st_lock);
	struct td_stream *s = stream_of(stream, true);
	if (s != NULL) {
		if (s->tail != NULL)
			s->tail->next = j;
		else
			s->head = j;
		s->tail = j;
		pthread_cond_broadcast(&st_cond);
	}
	pthread_mutex_unlock(&st_lock);
	if (s == NULL) {
		free(j);
		return -EAGAIN;
	}
	return 0;
}

/* The next `n` launches fail with -EIO, as a runtime refusing. */
static atomic_uint launch_fail;
__attribute__((visibility("default"))) void te_testdev_launch_fail(unsigned n);
void te_testdev_launch_fail(unsigned n)
{
	atomic_store(&launch_fail, n);
}

static int td_stream_launch(void *ctx, void *stream, void (*fn)(void *), void *arg)
{
	(void)ctx;
	unsigned f = atomic_load(&launch_fail);
	while (f > 0 && !atomic_compare_exchange_weak(&launch_fail, &f, f - 1))
		;
	if (f > 0)
		return -EIO;
	atomic_fetch_add(&launches, 1);
	return te_testdev_stream_launch(stream, fn, arg);
}

static int td_stream_wait(void *ctx, void *stream)
{
	(void)ctx;
	atomic_fetch_add(&waits, 1);
	pthread_mutex_lock(&st_lock);
	struct td_stream *s = stream_of(stream, false);
	while (s != NULL && s->head != NULL)
		pthread_cond_wait(&st_cond, &st_lock);
	pthread_mutex_unlock(&st_lock);
	return 0;
}

/* Its streams belong to no device: a device past the two is refused, as a
 * runtime refuses a device it does not have. */
static int td_stream_launch_on(void *ctx, int device, void *stream, void (*fn)(void *), void *arg)
{
	return device >= 2 ? -ENODEV : td_stream_launch(ctx, stream, fn, arg);
}

static int td_stream_wait_on(void *ctx, int device, void *stream)
{
	return device >= 2 ? -ENODEV : td_stream_wait(ctx, stream);
}

/* Backs [p, p + len) of the private view, 2 MiB aligned, with 2 MiB pages:
 * MADV_COLLAPSE wants one page present in each. Figures, not correctness,
 * depend on it, so a failure is only logged (once). */
static void back_with_huge_pages(tdev *t, char *p, size_t len)
{
	static atomic_bool told;

	if (getenv("TE_TESTDEV_SMALL_PAGES") != NULL)
		return;
	for (size_t o = 0; o < len; o += HUGE)
		p[o] = 0; /* fresh memory: zero already */
	if (madvise(p, len, MADV_COLLAPSE) == 0 || atomic_exchange(&told, true))
		return;
	t->host->log(t->host, TE_LOG_INFO, "device memory stays on 4 KiB pages: MADV_COLLAPSE: %s",
		     strerror(errno));
}

static int td_mem_alloc(void *ctx, int device, size_t len, void **ptr)
{
	tdev *t = ctx;
	_Atomic size_t *next = device == 0 ? &t->next : &t->next1;
	size_t want = (len + ALIGN - 1) / ALIGN * ALIGN;
	size_t align = want >= HUGE ? HUGE : ALIGN, off, cur;

	if (device < 0 || device > 1)
		return -ENODEV;
	if (want < len)
		return -ENOMEM;
	cur = atomic_load(next);
	do {
		off = (cur + align - 1) / align * align;
		if (off > SIZE / 2 || want > SIZE / 2 - off)
			return -ENOMEM;
	} while (!atomic_compare_exchange_weak(next, &cur, off + want));
	size_t at = (size_t)device * (SIZE / 2) + off;
	if (want >= HUGE)
		back_with_huge_pages(t, t->priv + at, want / HUGE * HUGE);
	*ptr = t->dev + at;
	return 0;
}

static void td_mem_free(void *ctx, void *ptr)
{
	(void)ctx;
	(void)ptr; /* a bump allocator: the mapping goes with the process */
}

static int td_host_alloc(void *ctx, size_t len, void **ptr)
{
	(void)ctx;
	return posix_memalign(ptr, ALIGN, len) == 0 ? 0 : -ENOMEM;
}

static void td_host_free(void *ctx, void *ptr)
{
	(void)ctx;
	free(ptr);
}

/* TE_TESTDEV_PCI=<bus id>,<bus id> places the two devices on the PCI tree
 * (the RDMA tests' sysfs fixtures). */
static int td_devices(void *ctx, te_device_info *out, size_t max, size_t *n)
{
	const char *pci = getenv("TE_TESTDEV_PCI");
	(void)ctx;
	*n = 2;
	for (size_t i = 0; i < 2 && i < max; i++) {
		snprintf(out[i].location, sizeof out[i].location, "testdev:%zu", i);
		snprintf(out[i].name, sizeof out[i].name, "libte test device (no CPU access)");
		out[i].memory = SIZE / 2;
		out[i].numa_node = -1;
		out[i].pci_bus_id[0] = '\0';
		if (pci != NULL) {
			size_t len = strcspn(pci, ",");
			if (len < sizeof out[i].pci_bus_id) {
				memcpy(out[i].pci_bus_id, pci, len);
				out[i].pci_bus_id[len] = '\0';
			}
			pci = pci[len] ? pci + len + 1 : pci + len;
		}
	}
	return 0;
}

static const te_device_ops ops = {
	.size = sizeof(te_device_ops),
	.prefix = "testdev",
	.probe = td_probe,
	.create = td_create,
	.destroy = td_destroy,
	.classify = td_classify,
	.copy = td_copy,
	.copy_async = td_copy_async,
	.host_alloc = td_host_alloc,
	.host_free = td_host_free,
	.mem_alloc = td_mem_alloc,
	.mem_free = td_mem_free,
	.export_dmabuf = td_export_dmabuf,
	.devices = td_devices,
	.stream_wait = td_stream_wait,
	.ipc_export = td_ipc_export,
	.ipc_open = td_ipc_open,
	.ipc_close = td_ipc_close,
	.stream_launch = td_stream_launch,
	.stream_launch_on = td_stream_launch_on,
	.stream_wait_on = td_stream_wait_on,
};

TE_PLUGIN_DEFINE(TE_KIND_DEVICE, "testdev", "1.0", "device memory the CPU cannot touch (tests)",
		 "Apache-2.0", &ops)
