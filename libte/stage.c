/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Staging: remote transfers whose local side is device memory, for a
 * transport that does not move that memory itself (no GPUDirect). The host
 * cuts them into chunks that travel through host buffers of its own: for a
 * WRITE a chunk is copied out of the device and then handed to the
 * transport; for a READ the transport fills the buffer and the chunk is then
 * copied into the device. There are TE_STAGE_BUFFERS buffers for all of an
 * engine's staged transfers, taken by chunks in submission order, so the
 * device copies of some chunks overlap the transport's I/O of others, and as
 * many chunks are handed to transports as there are buffers (a transport
 * keeps what exceeds its window queued, ready for the wire the moment a
 * reply frees room): never one blocking copy of a whole transfer. Doing it here serves every transport at once.
 *
 * The buffers are one area, page-locked by the device plugin when it can,
 * registered as libte's own memory (transports that need to know their
 * buffers, such as RDMA, register it; the descriptor leaves it out). The
 * device copies start from the transports' completions when the device
 * plugin copies asynchronously and the transport allows nested submits, and
 * run on a small pool of staging threads otherwise; a chunk's parent task
 * counts its chunks as slices, so it completes once, with the first error.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "internal.h"

/* TE_STAGE_STATS=1: where a staged chunk's time goes, the process's totals
 * so far printed when an engine is destroyed (a diagnostic for tuning on a
 * GPU machine). Read once at load: when off, a branch not taken. */
static bool stats_on;
__attribute__((constructor)) static void stats_init(void)
{
	const char *v = getenv("TE_STAGE_STATS");
	stats_on = v != NULL && v[0] == '1';
}
static struct {
	atomic_ullong chunks[2], wait_ns[2], copy1_ns[2], xport_ns[2], copy2_ns[2], total_ns[2], bytes[2];
	atomic_ullong handover_calls, handover_chunks;
} st;
static inline uint64_t st_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define THREADS 2
#define CHUNK_DEFAULT (1024u << 10)
#define CHUNK_MIN (4u << 10)
#define CHUNK_MAX (64u << 20)
#define BUFFERS_DEFAULT 64u /* 64 MiB: the best of the choices measured on an H100 (docs/gpu.md) */
#define BUFFERS_MAX 1024u

/* Work items for the pool, as pointers: slot index and what to do. */
enum { WORK_START = 1, WORK_FINISH = 2 };
#define WORK(slot, what) GUINT_TO_POINTER(((guint)(slot) << 2) | (what))

typedef struct stage_slot {
	te_task sub;    /* what the transport is handed; sub.stage marks it */
	te_task *parent;
	uint64_t off;   /* in the parent */
	uint64_t len;
	uint64_t t_give, t_xport, t_xdone; /* TE_STAGE_STATS */
} stage_slot;

struct te_stager {
	te_engine *e;
	GThreadPool *pool;
	GMutex lock;
	GQueue pending;  /* te_task* with chunks not yet given a buffer */
	guint *free;     /* stack of free slots */
	guint nfree;
	stage_slot *slots;
	guint nslots;
	size_t chunk;
	char *area;      /* nslots * chunk bytes, once set up */
	te_device *area_dev; /* the plugin that allocated it, or NULL (posix_memalign) */
	int area_rc;     /* negative once setting it up failed */
	atomic_bool queued; /* te_stage_submit queued tasks since the last flush */
	atomic_uint busy; /* transport submit calls in progress, and bursts holding chunks */
	bool burst;       /* TE_STAGE_BURST: chunks ready in a burst go over together */
};

/* Set while this thread is inside a transport's complete() (a staged
 * chunk's): what starts from there (a copy_async() that finishes at once,
 * the next chunk) must know. */
static _Thread_local bool in_complete;

/* ---------------------------------------------------------------- buffers */

/* Once, in a staging thread (it registers memory: not from te_submit). */
static int area_setup(te_stager *s, te_device *dev)
{
	size_t size = s->chunk * s->nslots;
	void *p = NULL;
	int rc;

	g_mutex_lock(&s->lock);
	int ready = s->area != NULL; /* read under the lock: another thread may set it */
	rc = ready ? 0 : s->area_rc;
	g_mutex_unlock(&s->lock);
	if (ready || rc < 0)
		return rc;
	te_device *by = NULL;
	if (TE_HAS_OP(dev->ops, host_alloc) && TE_HAS_OP(dev->ops, host_free) &&
	    dev->ops->host_alloc(dev->ctx, size, &p) == 0)
		by = dev;
	else if (posix_memalign(&p, 4096, size) != 0)
		p = NULL;
	rc = p == NULL ? -ENOMEM : te_register_hidden(s->e, p, size);
	g_mutex_lock(&s->lock);
	if (s->area != NULL || rc < 0) {
		/* Another thread was first, or it failed: keep theirs, drop ours. */
		int theirs = s->area != NULL;
		if (rc < 0 && !theirs) {
			te_err("staging: cannot set up %zu bytes of host buffers: %s", size,
			       te_strerror(rc));
			s->area_rc = rc;
		}
		g_mutex_unlock(&s->lock);
		if (p != NULL && rc == 0)
			te_unregister_memory(s->e, p);
		if (p != NULL)
			by ? by->ops->host_free(by->ctx, p) : free(p);
		return theirs ? 0 : rc;
	}
	s->area = p;
	s->area_dev = by;
	g_mutex_unlock(&s->lock);
	te_dbg("staging: %u buffers of %zu bytes (%s host memory)", s->nslots, s->chunk,
	       by ? "page-locked" : "ordinary");
	return 0;
}

/* Chunks started by the thread that gave them their buffer, outside the
 * stager's lock: READs, which copy nothing before the transport's I/O and
 * are handed over together, and, where that thread may start copies, WRITEs
 * whose device copy needs no waiting (copy_async). A ring, as chunks ending
 * early (a failed or canceled task) free buffers for others while it is
 * being worked through; it never holds more than nslots. */
typedef struct ready_ring {
	guint head, n;
	bool copies; /* WRITE chunks too: their device copy may start here */
	guint slot[BUFFERS_MAX];
} ready_ring;

/* Gives free buffers to waiting chunks, in submission order: to `ready`
 * what it may take (once the buffers exist), the rest to the staging
 * threads. */
static void dispatch_locked(te_stager *s, ready_ring *ready)
{
	while (s->nfree > 0 && !g_queue_is_empty(&s->pending)) {
		te_task *t = g_queue_peek_head(&s->pending);
		unsigned idx = atomic_fetch_add(&t->chunk_next, 1);
		if (idx + 1 >= t->xfer.nr_slices)
			g_queue_pop_head(&s->pending);
		guint slot = s->free[--s->nfree];
		stage_slot *sl = &s->slots[slot];
		sl->parent = t;
		sl->sub.stage = s; /* write_copied() finds its stager there */
		sl->off = (uint64_t)idx * s->chunk;
		sl->len = MIN((uint64_t)s->chunk, t->xfer.length - sl->off);
		if (stats_on) {
			sl->t_give = st_now();
			sl->t_xport = sl->t_xdone = 0;
		}
		if (ready != NULL && s->area != NULL &&
		    (t->xfer.opcode == TE_OP_READ || (ready->copies && TE_HAS_OP(t->dev->ops, copy_async))))
			ready->slot[(ready->head + ready->n++) % BUFFERS_MAX] = slot;
		else
			g_thread_pool_push(s->pool, WORK(slot, WORK_START), NULL);
	}
}

/* A chunk is over: its buffer goes to the next chunk, its parent counts it. */
static void release(te_stager *s, guint slot, uint64_t bytes, int error, ready_ring *ready)
{
	stage_slot *sl = &s->slots[slot];
	te_task *parent = sl->parent;

	if (stats_on && error == 0 && sl->t_xport != 0 && sl->t_xdone != 0) {
		uint64_t end = st_now();
		int w = parent->xfer.opcode == TE_OP_WRITE;
		atomic_fetch_add(&st.chunks[w], 1);
		atomic_fetch_add(&st.bytes[w], sl->len);
		atomic_fetch_add(&st.wait_ns[w], sl->t_give - parent->stage_t0);
		atomic_fetch_add(&st.copy1_ns[w], sl->t_xport - sl->t_give);
		atomic_fetch_add(&st.xport_ns[w], sl->t_xdone - sl->t_xport);
		atomic_fetch_add(&st.copy2_ns[w], end - sl->t_xdone);
		atomic_fetch_add(&st.total_ns[w], end - parent->stage_t0);
	}
	sl->parent = NULL;
	g_mutex_lock(&s->lock);
	s->free[s->nfree++] = slot;
	dispatch_locked(s, ready);
	g_mutex_unlock(&s->lock);
	te_task_complete(parent, bytes, error);
}

static void start_ready(te_stager *s, ready_ring *ready);

/* Hand-overs started from inside completions, on this thread: a transport
 * that completes inside submit() would otherwise nest without bound. */
static _Thread_local unsigned nesting;
#define NESTING_MAX 4

/* `may_submit`: chunks that become ready may be handed to a transport from
 * here. */
static void chunk_done(te_stager *s, guint slot, uint64_t bytes, int error, bool may_submit)
{
	if (!may_submit || nesting >= NESTING_MAX) {
		release(s, slot, bytes, error, NULL);
		return;
	}
	ready_ring ready;
	ready.head = ready.n = 0;
	ready.copies = true;
	nesting++;
	release(s, slot, bytes, error, &ready);
	start_ready(s, &ready);
	nesting--;
}

/* In a transport's completion (in_complete), hand-overs may go on from
 * here only if the transport allows nested submits. */
static bool may_submit_here(const te_task *t)
{
	return !in_complete || (t->tp->ops->flags & TE_TRANSPORT_NESTED_SUBMIT);
}

/* ------------------------------------------------------------------ work */

/* Slot `slot`'s staging buffer. */
static char *slot_area(const te_stager *s, guint slot)
{
	return s->area + (size_t)slot * s->chunk;
}

/* Where the chunk in `sl` lies in its task's device memory. */
static char *chunk_local(const stage_slot *sl)
{
	return (char *)sl->parent->xfer.local + sl->off;
}

/* The chunk's transfer, as the transport is handed it. */
static te_transfer *sub_transfer(te_stager *s, guint slot)
{
	stage_slot *sl = &s->slots[slot];
	te_task *t = sl->parent;
	te_task *sub = &sl->sub;

	sub->batch = t->batch;
	sub->stage = s;
	sub->xfer = (te_transfer){
		.opcode = t->xfer.opcode,
		.nr_slices = 1,
		.local = slot_area(s, slot),
		.remote = t->xfer.remote + sl->off,
		.length = sl->len,
		.seg_ctx = t->xfer.seg_ctx,
		.local_location = t->xfer.local_location,
	};
	atomic_store(&sub->slices_done, 0);
	atomic_store(&sub->error, 0);
	atomic_store(&sub->transferred, 0);
	if (stats_on)
		sl->t_xport = st_now();
	return &sub->xfer;
}

/* Why a chunk should end without moving anything, or 0. */
static int chunk_skip(te_task *t)
{
	int err = atomic_load(&t->error);

	if (err == 0 && atomic_load_explicit(&t->batch->canceled, memory_order_relaxed))
		err = -ECANCELED;
	return err;
}

#define SUBMIT_MAX 64

/* Hands chunks to their transport. Unlike te_submit's own calls, this one
 * may still be running when the chunks' tasks have completed (on the
 * transport's threads) and their user has closed the segment or is
 * destroying the engine: a reference on each chunk's segment version keeps
 * the transport's peer until the call returns, and `busy` the engine
 * (te_stage_quiesce). Inside a transport's completion, a segment version
 * released here is closed off this thread. */
static int transport_submit(te_stager *s, te_transport_inst *tp, te_transfer **xs, size_t n)
{
	te_segver *held[SUBMIT_MAX];

	atomic_fetch_add(&s->busy, 1);
	for (size_t i = 0; i < n; i++) {
		held[i] = ((stage_slot *)xs[i])->parent->sv; /* set until the task ends */
		atomic_fetch_add_explicit(&held[i]->refs, 1, memory_order_relaxed);
	}
	if (stats_on) {
		atomic_fetch_add(&st.handover_calls, 1);
		atomic_fetch_add(&st.handover_chunks, n);
	}
	int rc = tp->ops->submit(tp->ctx, xs, n);
	for (size_t i = 0; i < n; i++)
		te_segver_unref(held[i], in_complete);
	atomic_fetch_sub(&s->busy, 1);
	return rc;
}

static void submit_now(te_stager *s, te_transport_inst *tp, te_transfer **xs, size_t n, ready_ring *ready);

/* A burst of device copy completions on this thread (te_host's
 * device_done_burst): the chunks they make ready go to their transport
 * together at its end, one call per transport and up to SUBMIT_MAX chunks,
 * rather than a call (and a wake-up of the transport's thread) per copy.
 * While chunks wait here their stager counts as busy, so an engine being
 * destroyed waits for them. */
static _Thread_local struct {
	unsigned depth;
	te_stager *s;
	te_transport_inst *tp;
	size_t n;
	te_transfer *xs[SUBMIT_MAX];
} burst;

/* Hands over what the burst holds (its thread, any depth). */
static void burst_flush(void)
{
	te_transfer *xs[SUBMIT_MAX];
	size_t n = burst.n;
	te_stager *s = burst.s;

	if (n == 0)
		return;
	/* Emptied first: a transport completing inside its submit may start
	 * chunks of its own into the burst. */
	memcpy(xs, burst.xs, n * sizeof xs[0]);
	burst.n = 0;
	submit_now(s, burst.tp, xs, n, NULL);
	atomic_fetch_sub(&s->busy, 1);
}

/* Whether chunks of `s` made ready on this thread now wait for a burst's end. */
static inline bool burst_on(const te_stager *s)
{
	return burst.depth > 0 && s->burst;
}

/* Keeps a chunk for the burst's end (burst_on). */
static void burst_keep(te_stager *s, te_transport_inst *tp, te_transfer *x)
{
	if (burst.n > 0 && (burst.s != s || burst.tp != tp || burst.n == SUBMIT_MAX))
		burst_flush();
	if (burst.n == 0) {
		burst.s = s;
		burst.tp = tp;
		atomic_fetch_add(&s->busy, 1);
	}
	burst.xs[burst.n++] = x;
}

void te_stage_burst(int begin)
{
	if (begin) {
		burst.depth++;
	} else if (burst.depth > 0 && --burst.depth == 0) {
		burst_flush();
	}
}

/* Hands chunks to their transport now; a refusal ends them. */
static void submit_now(te_stager *s, te_transport_inst *tp, te_transfer **xs, size_t n, ready_ring *ready)
{
	if (n == 0)
		return;
	int rc = transport_submit(s, tp, xs, n);
	if (rc >= 0)
		return;
	te_err("staging: transport %s refused %zu chunks: %s", tp->hc.plugin->name, n, te_strerror(rc));
	for (size_t i = 0; i < n; i++)
		release(s, (guint)((stage_slot *)xs[i] - s->slots), 0, rc, ready);
}

/* Hands chunks to their transport, or keeps them for the burst's end. */
static void submit_group(te_stager *s, te_transport_inst *tp, te_transfer **xs, size_t n,
			 ready_ring *ready)
{
	if (!burst_on(s)) {
		submit_now(s, tp, xs, n, ready);
		return;
	}
	for (size_t i = 0; i < n; i++)
		burst_keep(s, tp, xs[i]);
}

/* One chunk to its transport; a refusal ends it (its successors start on
 * the staging threads). */
static void submit_one(te_stager *s, guint slot)
{
	te_transport_inst *tp = s->slots[slot].parent->tp;
	te_transfer *x = sub_transfer(s, slot);
	if (burst_on(s)) {
		burst_keep(s, tp, x);
		return;
	}
	int rc = transport_submit(s, tp, &x, 1);

	if (rc < 0) {
		te_err("staging: transport %s refused a chunk: %s", tp->hc.plugin->name, te_strerror(rc));
		release(s, slot, 0, rc, NULL);
	}
}

/* A WRITE chunk's bytes are in its buffer: on to the transport. */
static void write_copied(void *arg, int error)
{
	stage_slot *sl = arg;
	te_stager *s = sl->sub.stage;
	guint slot = (guint)(sl - s->slots);
	te_task *t = sl->parent;

	if (error < 0) {
		te_log(TE_LOG_ERROR, t->dev->hc.plugin->name, "copy of %llu bytes out of device memory failed: %s",
		       (unsigned long long)sl->len, te_strerror(error));
		/* Not chunk_done(): the task's next chunks, failing the same way,
		 * go through the staging threads instead of nesting here. */
		release(s, slot, 0, error, NULL);
		return;
	}
	submit_one(s, slot);
}

/* What the start of the asynchronous copy of slot `slot`'s chunk gave, `dir`
 * ("out of", "into") its device memory: 0 when it started, or when the
 * plugin cannot and the staging threads take the copy over (`work`); another
 * error, logged, is the chunk's to end with. */
static int copy_started(te_stager *s, guint slot, int rc, unsigned work, const char *dir)
{
	const stage_slot *sl = &s->slots[slot];

	if (rc == -ENOTSUP) {
		g_thread_pool_push(s->pool, WORK(slot, work), NULL);
		return 0;
	}
	if (rc < 0)
		te_log(TE_LOG_ERROR, sl->parent->dev->hc.plugin->name, "cannot start a copy of %llu bytes %s device memory: %s",
		       (unsigned long long)sl->len, dir, te_strerror(rc));
	return rc;
}

/* Starts the copy out of the device of a WRITE chunk that has its buffer;
 * the staging threads do it when the plugin cannot copy asynchronously. */
static void start_write(te_stager *s, guint slot)
{
	stage_slot *sl = &s->slots[slot];
	te_device *dev = sl->parent->dev;
	int rc = dev->ops->copy_async(dev->ctx, slot_area(s, slot), chunk_local(sl), sl->len, write_copied, sl);

	if (copy_started(s, slot, rc, WORK_START, "out of") < 0)
		release(s, slot, 0, rc, NULL);
}

/* Starts ready chunks: READs go to their transports, those of one transport
 * in one call (as te_submit does with host memory: one wake-up of the
 * transport for many chunks rather than one each); WRITEs start their copy
 * out of the device. */
static void start_ready(te_stager *s, ready_ring *ready)
{
	te_transfer *xs[SUBMIT_MAX];
	te_transport_inst *tp = NULL;
	size_t n = 0;

	while (ready->n > 0) {
		guint slot = ready->slot[ready->head];
		ready->head = (ready->head + 1) % BUFFERS_MAX;
		ready->n--;
		te_task *t = s->slots[slot].parent;
		int err = chunk_skip(t);
		if (err != 0) {
			release(s, slot, 0, err, ready);
			continue;
		}
		if (t->xfer.opcode == TE_OP_WRITE) {
			start_write(s, slot);
			continue;
		}
		if (tp != t->tp || n == SUBMIT_MAX) {
			submit_group(s, tp, xs, n, ready);
			n = 0;
			tp = t->tp;
		}
		xs[n++] = sub_transfer(s, slot);
		if (ready->n == 0) {
			/* Hand these over before looking again: a refusal above
			 * may make more ready. */
			submit_group(s, tp, xs, n, ready);
			n = 0;
		}
	}
}

static void start(te_stager *s, guint slot)
{
	stage_slot *sl = &s->slots[slot];
	te_task *t = sl->parent;
	int err = chunk_skip(t);

	if (err == 0)
		err = area_setup(s, t->dev);
	if (err != 0) {
		/* The task failed already (or is canceled): its other chunks end
		 * without moving anything. */
		chunk_done(s, slot, 0, err, true);
		return;
	}
	if (t->xfer.opcode == TE_OP_WRITE) {
		int rc = te_device_copy_with(t->dev, slot_area(s, slot), chunk_local(sl), sl->len);
		if (rc < 0) {
			chunk_done(s, slot, 0, rc, true);
			return;
		}
	}
	submit_one(s, slot);
}

static void finish(te_stager *s, guint slot)
{
	stage_slot *sl = &s->slots[slot];
	int rc = te_device_copy_with(sl->parent->dev, chunk_local(sl), slot_area(s, slot), sl->len);

	chunk_done(s, slot, rc < 0 ? 0 : sl->len, rc, true);
}

static void run(gpointer data, gpointer user)
{
	guint w = GPOINTER_TO_UINT(data);

	if ((w & 3) == WORK_START)
		start(user, w >> 2);
	else
		finish(user, w >> 2);
}

/* The device copy of a READ chunk ended. */
static void finish_done(void *arg, int error)
{
	stage_slot *sl = arg;
	te_stager *s = sl->sub.stage;
	te_task *t = sl->parent;
	bool may_submit = may_submit_here(t);

	if (error < 0)
		te_log(TE_LOG_ERROR, t->dev->hc.plugin->name, "copy of %llu bytes into device memory failed: %s",
		       (unsigned long long)sl->len, te_strerror(error));
	chunk_done(s, (guint)(sl - s->slots), error < 0 ? 0 : sl->len, error, may_submit);
}

/* Into the device: started here, in the transport's completion, when the
 * plugin copies asynchronously (a GPU's copy engine: nothing waits), else
 * on a staging thread, so the transport's thread never waits for a copy. */
static void finish_read(te_stager *s, guint slot)
{
	stage_slot *sl = &s->slots[slot];
	te_device *dev = sl->parent->dev;

	if (!TE_HAS_OP(dev->ops, copy_async)) {
		g_thread_pool_push(s->pool, WORK(slot, WORK_FINISH), NULL);
		return;
	}
	bool outer = in_complete;
	in_complete = true;
	int rc = dev->ops->copy_async(dev->ctx, chunk_local(sl), slot_area(s, slot), sl->len, finish_done,
				      sl);
	in_complete = outer;
	if (copy_started(s, slot, rc, WORK_FINISH, "into") < 0)
		chunk_done(s, slot, 0, rc, false);
}

void te_stage_slice_done(te_task *sub, uint64_t bytes, int error)
{
	te_stager *s = sub->stage;
	stage_slot *sl = (stage_slot *)sub; /* sub is the slot's first member */
	guint slot = (guint)(sl - s->slots);

	if (!te_task_count_slice(sub, bytes, error))
		return;
	if (stats_on)
		sl->t_xdone = st_now();
	int rc = atomic_load(&sub->error);
	if (rc == 0 && atomic_load(&sub->transferred) < sl->len)
		rc = -EIO;
	if (rc == 0 && sl->parent->xfer.opcode == TE_OP_READ) {
		finish_read(s, slot);
		return;
	}
	/* A WRITE's buffer is free: the chunk waiting for one may start from
	 * here (its copy out of the device too, with copy_async). */
	bool outer = in_complete; /* a transport may complete inside a nested submit */
	in_complete = true;
	chunk_done(s, slot, rc < 0 ? 0 : sl->len, rc, may_submit_here(sl->parent));
	in_complete = outer;
}

/* ---------------------------------------------------------------- engine */

int te_stage_init(te_engine *e)
{
	te_stager *s = g_new0(te_stager, 1);

	s->e = e;
	s->chunk = (size_t)te_engine_option_u64(e, "TE_STAGE_CHUNK_BYTES", CHUNK_DEFAULT, CHUNK_MIN, CHUNK_MAX) &
		   ~(size_t)(CHUNK_MIN - 1);
	s->nslots = (guint)te_engine_option_u64(e, "TE_STAGE_BUFFERS", BUFFERS_DEFAULT, 1, BUFFERS_MAX);
	s->burst = te_engine_option_u64(e, "TE_STAGE_BURST", 1, 0, 1) == 1;
	s->slots = g_new0(stage_slot, s->nslots);
	s->free = g_new(guint, s->nslots);
	for (guint i = 0; i < s->nslots; i++)
		s->free[s->nfree++] = s->nslots - 1 - i;
	g_mutex_init(&s->lock);
	g_queue_init(&s->pending);
	s->pool = g_thread_pool_new(run, s, THREADS, FALSE, NULL);
	e->stager = s;
	return 0;
}

/* After every task ended and the registry was cleared. */
void te_stage_fini(te_engine *e)
{
	te_stager *s = e->stager;

	if (s == NULL)
		return;
	g_thread_pool_free(s->pool, FALSE, TRUE);
	for (int w = 0; stats_on && w < 2; w++) {
		unsigned long long n = atomic_load(&st.chunks[w]);
		if (n == 0)
			continue;
		fprintf(stderr, "stage-stats %s: %llu chunks, %.0f bytes avg; us avg: wait %.1f copy-before %.1f transport %.1f copy-after %.1f total %.1f\n",
			w ? "write" : "read", n, (double)atomic_load(&st.bytes[w]) / n,
			atomic_load(&st.wait_ns[w]) / 1e3 / n, atomic_load(&st.copy1_ns[w]) / 1e3 / n,
			atomic_load(&st.xport_ns[w]) / 1e3 / n, atomic_load(&st.copy2_ns[w]) / 1e3 / n,
			atomic_load(&st.total_ns[w]) / 1e3 / n);
	}
	if (stats_on && atomic_load(&st.handover_calls) > 0)
		fprintf(stderr, "stage-stats hand-overs: %llu calls, %llu chunks\n",
			(unsigned long long)atomic_load(&st.handover_calls),
			(unsigned long long)atomic_load(&st.handover_chunks));
	if (s->area != NULL) {
		if (s->area_dev != NULL)
			s->area_dev->ops->host_free(s->area_dev->ctx, s->area);
		else
			free(s->area);
	}
	g_mutex_clear(&s->lock);
	g_free(s->slots);
	g_free(s->free);
	g_free(s);
	e->stager = NULL;
}

/* At engine destroy, once no task is in flight: until no transport submit
 * call made here is still returning. They never block. */
void te_stage_quiesce(te_engine *e)
{
	te_stager *s = e->stager;

	while (s != NULL && atomic_load(&s->busy) > 0)
		g_usleep(100);
}

/* Called with the registry locked: the chunks wait for te_stage_flush. */
void te_stage_submit(te_engine *e, te_task *t)
{
	te_stager *s = e->stager;

	/* Each chunk is a slice of the task. */
	t->xfer.nr_slices = (uint32_t)((t->xfer.length + s->chunk - 1) / s->chunk);
	atomic_store(&t->chunk_next, 0);
	if (stats_on)
		t->stage_t0 = st_now();
	g_mutex_lock(&s->lock);
	g_queue_push_tail(&s->pending, t);
	g_mutex_unlock(&s->lock);
	atomic_store(&s->queued, true);
}

/* At the end of te_submit, without the registry lock (a transport's submit
 * may look up buffers): gives the chunks te_stage_submit queued their
 * buffers and starts them. */
void te_stage_flush(te_engine *e)
{
	te_stager *s = e->stager;
	ready_ring ready;

	/* No lock for calls that staged nothing (host memory). */
	if (s == NULL || !atomic_exchange(&s->queued, false))
		return;
	ready.head = ready.n = 0;
	/* WRITE chunks start their copies out of the device here too: a
	 * device plugin's copy_async only queues them (the staging threads'
	 * synchronous copies, one at a time each, held 64 KiB WRITEs to a
	 * fraction of the copy engine on an H100). */
	ready.copies = true;
	g_mutex_lock(&s->lock);
	dispatch_locked(s, &ready);
	g_mutex_unlock(&s->lock);
	start_ready(s, &ready);
}
