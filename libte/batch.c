/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Batches and the submit path. A batch is one allocation holding all its
 * tasks, so submitting costs no allocation; a task moves through atomic
 * counters only, and the batch's mutex is taken once per submit call and once
 * when the batch drains (to wake waiters), never per slice.
 */
#include <sched.h>
#include <string.h>

#include "internal.h"
#include "metrics.h"

#define TE_MAX_BATCH (1u << 20)
#define DISPATCH_CHUNK 64

/* Batches are shared between the table and API calls in progress. */
typedef struct batch_box {
	atomic_int refs;
	bool freed;
	te_batch *b;
} batch_box;

/* The batch's memory outlives its table entry while a transport still
 * holds a task that was ended early (a deadline, a cancel). */
void te_batch_mem_unref(te_batch *b)
{
	if (atomic_fetch_sub_explicit(&b->mem_refs, 1, memory_order_acq_rel) != 1)
		return;
	g_mutex_clear(&b->lock);
	g_cond_clear(&b->cond);
	g_free(b->notify_msg);
	g_free(b->notify_name);
	g_free(b->notify_sender);
	g_free(b);
}

static void box_unref(batch_box *box)
{
	if (atomic_fetch_sub_explicit(&box->refs, 1, memory_order_acq_rel) != 1)
		return;
	te_batch_mem_unref(box->b);
	g_free(box);
}

static batch_box *batch_get(te_engine *e, te_batch_id id, const char *what)
{
	batch_box *box;

	if (e == NULL) {
		te_err("%s: NULL engine", what);
		return NULL;
	}
	g_rw_lock_reader_lock(&e->batch_lock);
	box = g_hash_table_lookup(e->batches, &id);
	if (box != NULL)
		atomic_fetch_add_explicit(&box->refs, 1, memory_order_relaxed);
	g_rw_lock_reader_unlock(&e->batch_lock);
	if (box == NULL)
		te_err("%s: unknown batch id %llu", what, (unsigned long long)id);
	return box;
}

void te_batches_init(te_engine *e)
{
	g_rw_lock_init(&e->batch_lock);
	e->batches = g_hash_table_new_full(g_int64_hash, g_int64_equal, NULL, (GDestroyNotify)box_unref);
	e->next_batch = 1;
}

void te_batches_clear(te_engine *e)
{
	g_rw_lock_writer_lock(&e->batch_lock);
	g_hash_table_remove_all(e->batches);
	g_rw_lock_writer_unlock(&e->batch_lock);
	g_hash_table_unref(e->batches);
	g_rw_lock_clear(&e->batch_lock);
}

static void cancel_one(gpointer k, gpointer v, gpointer u)
{
	(void)k;
	(void)u;
	atomic_store(&((batch_box *)v)->b->canceled, 1);
}

void te_batches_cancel_all(te_engine *e)
{
	g_rw_lock_reader_lock(&e->batch_lock);
	g_hash_table_foreach(e->batches, cancel_one, NULL);
	g_rw_lock_reader_unlock(&e->batch_lock);
}

int te_batch_alloc(te_engine *e, size_t capacity, te_batch_id *out)
{
	te_batch *b;
	batch_box *box;

	if (e == NULL || out == NULL) {
		te_err("te_batch_alloc: NULL %s", e == NULL ? "engine" : "output pointer");
		return -EINVAL;
	}
	*out = TE_INVALID_BATCH;
	if (capacity == 0 || capacity > TE_MAX_BATCH) {
		te_err("te_batch_alloc: capacity %zu outside [1, %u]", capacity, TE_MAX_BATCH);
		return -EINVAL;
	}
	/* Tasks are set whole when submitted and never read before: only the
	 * header is cleared, so a large batch made for a few tasks (Mooncake's
	 * C API callers allocate 1024 per transfer) costs no pages it never
	 * touches. */
	b = g_try_malloc(sizeof *b + capacity * sizeof(te_task));
	if (b == NULL)
		return -ENOMEM;
	memset(b, 0, sizeof *b);
	b->engine = e;
	b->capacity = capacity;
	atomic_init(&b->mem_refs, 1);
	g_mutex_init(&b->lock);
	g_cond_init(&b->cond);
	box = g_new0(batch_box, 1);
	atomic_init(&box->refs, 1);
	box->b = b;
	g_rw_lock_writer_lock(&e->batch_lock);
	b->id = e->next_batch++;
	g_hash_table_insert(e->batches, &b->id, box);
	g_rw_lock_writer_unlock(&e->batch_lock);
	*out = b->id;
	return 0;
}

/* True when every submitted task has reached an end state (lock held). */
static bool all_ended(te_batch *b)
{
	size_t n = atomic_load(&b->count);
	for (size_t i = 0; i < n; i++) {
		int s = atomic_load_explicit(&b->tasks[i].state, memory_order_acquire);
		if (s == TE_TASK_WAITING || s == TE_TASK_PENDING)
			return false;
	}
	return true;
}

int te_batch_free(te_engine *e, te_batch_id id)
{
	batch_box *box = batch_get(e, id, "te_batch_free");
	te_batch *b;

	if (box == NULL)
		return e == NULL ? -EINVAL : TE_ERR_BATCH;
	b = box->b;
	g_mutex_lock(&b->lock);
	if (atomic_load(&b->inflight) > 0 && !box->freed && all_ended(b)) {
		/* Every task shows its end state, but a completing thread sets the
		 * state before it lowers the count: a caller that polled the states
		 * and frees at once must not see -EBUSY. The last decrement happens
		 * under this lock and wakes waiters, so this is a short wait. */
		gint64 end = g_get_monotonic_time() + G_USEC_PER_SEC;
		b->waiters++;
		while (atomic_load(&b->inflight) > 0 && g_cond_wait_until(&b->cond, &b->lock, end))
			;
		b->waiters--;
	}
	if (atomic_load(&b->inflight) > 0 || box->freed) {
		bool busy = !box->freed;
		g_mutex_unlock(&b->lock);
		box_unref(box);
		if (busy)
			te_err("te_batch_free: batch %llu still has %zu tasks in flight",
			       (unsigned long long)id, atomic_load(&b->inflight));
		return busy ? -EBUSY : TE_ERR_BATCH;
	}
	box->freed = true;
	g_mutex_unlock(&b->lock);
	g_rw_lock_writer_lock(&e->batch_lock);
	g_hash_table_remove(e->batches, &id);
	g_rw_lock_writer_unlock(&e->batch_lock);
	box_unref(box);
	return 0;
}

/* -------------------------------------------------------------- progress */

/* A transport that can collect its own completions in the waiting thread
 * (the progress and wake ops) spares a thread hand-off per completion:
 * te_batch_wait() sleeps where the completions arrive instead of on the
 * batch's condition variable. The host uses the transport of the batch's
 * first remote task; whoever drains the batch outside that transport's own
 * collecting (another transport, a local copy, a task ended at submit) wakes
 * the sleepers through the wake op. An instance is pinned
 * through its inflight count, which uninstalling drains after marking it
 * retired; instances are freed only with the engine, so a stale wait_tp is
 * still safe to read. */
#define PROGRESS_SLICE_NS (100 * 1000 * 1000) /* the host re-checks this often */

/* The transport whose progress() this thread is inside: completions made
 * there need no wake-up from the host. */
static _Thread_local te_transport_inst *progress_here;

static bool tp_pin(te_transport_inst *tp)
{
	atomic_fetch_add(&tp->inflight, 1);
	if (atomic_load(&tp->retired)) {
		atomic_fetch_sub(&tp->inflight, 1);
		return false;
	}
	return true;
}

static void tp_unpin(te_transport_inst *tp)
{
	atomic_fetch_sub_explicit(&tp->inflight, 1, memory_order_release);
}

static te_transport_inst *progress_begin(te_batch *b)
{
	te_transport_inst *tp = atomic_load(&b->wait_tp);

	if (tp == NULL || !TE_HAS_OP(tp->ops, progress) || !TE_HAS_OP(tp->ops, wake))
		return NULL;
	return tp_pin(tp) ? tp : NULL;
}

typedef struct progress_arg {
	te_batch *b;
	te_transport_inst *tp;
} progress_arg;

/* Drained, or drained and filled again with a first task elsewhere: look
 * again from the host. */
static int batch_drained(void *arg)
{
	const progress_arg *pa = arg;

	return atomic_load(&pa->b->inflight) == 0 || atomic_load(&pa->b->wait_tp) != pa->tp;
}

/* Collects what is ready (no sleeping) before a status read. */
static void progress_poll(te_batch *b)
{
	te_transport_inst *tp = progress_begin(b);

	if (tp == NULL)
		return;
	te_transport_inst *outer = progress_here;
	progress_here = tp;
	tp->ops->progress(tp->ctx, NULL, NULL, 0);
	progress_here = outer;
	tp_unpin(tp);
}

/* te_batch_wait through the transport: 0 when drained, -ETIMEDOUT, or 1
 * when the condition variable has to do. */
static int progress_wait(te_batch *b, int timeout_ms, gint64 end_us)
{
	for (;;) {
		if (atomic_load(&b->inflight) == 0)
			return 0;
		int64_t slice = PROGRESS_SLICE_NS;
		bool last = false;
		if (timeout_ms >= 0) {
			gint64 left = end_us - g_get_monotonic_time();
			if (left <= 0) {
				slice = 0; /* one look at what is ready */
				last = true;
			} else if (left * 1000 < slice) {
				slice = left * 1000;
			}
		}
		te_transport_inst *tp = progress_begin(b);
		if (tp == NULL)
			return 1;
		/* Counted before the transport's last look at batch_drained():
		 * a drain elsewhere either is seen there or sees this count. */
		atomic_fetch_add(&b->sleepers, 1);
		te_transport_inst *outer = progress_here;
		progress_here = tp;
		progress_arg pa = { b, tp };
		int rc = tp->ops->progress(tp->ctx, batch_drained, &pa, slice);
		progress_here = outer;
		atomic_fetch_sub(&b->sleepers, 1);
		tp_unpin(tp);
		if (rc < 0 && rc != -ETIMEDOUT)
			return 1;
		if (last)
			return atomic_load(&b->inflight) == 0 ? 0 : -ETIMEDOUT;
	}
}

/* ------------------------------------------------------------ completion */

static void send_notify_job(gpointer data, gpointer user);

typedef struct notify_job {
	te_engine *e;
	char *segment;
	char *sender;
	char *msg;
} notify_job;

/* `n` of the batch's tasks ended. The last decrement happens under the batch
 * lock, so te_batch_free (which checks under the same lock) cannot free the
 * batch under a waker. */
static void batch_tasks_done(te_batch *b, size_t n)
{
	size_t old = atomic_load_explicit(&b->inflight, memory_order_relaxed);

	while (old > n)
		if (atomic_compare_exchange_weak_explicit(&b->inflight, &old, old - n,
							  memory_order_acq_rel, memory_order_relaxed))
			return;
	te_transport_inst *wake = NULL;
	g_mutex_lock(&b->lock);
	if (atomic_fetch_sub(&b->inflight, n) == n) {
		if (b->waiters > 0) /* a broadcast is a system call even with nobody to wake */
			g_cond_broadcast(&b->cond);
		/* Threads sleeping in a transport's progress() for this batch see
		 * the drain when that transport's own collecting caused it;
		 * otherwise they need a wake-up (made after the unlock: the
		 * transport's locks come before batch locks). */
		if (atomic_load(&b->sleepers) > 0) {
			wake = atomic_load(&b->wait_tp);
			if (wake == NULL || wake == progress_here || !TE_HAS_OP(wake->ops, wake) || !tp_pin(wake))
				wake = NULL;
		}
		if (b->notify_msg != NULL) {
			notify_job *j = g_new0(notify_job, 1);
			j->e = b->engine;
			j->segment = b->notify_name;
			j->sender = b->notify_sender;
			j->msg = b->notify_msg;
			b->notify_msg = NULL;
			b->notify_name = NULL;
			b->notify_sender = NULL;
			g_thread_pool_push(b->engine->notify_pool, j, NULL);
		}
	}
	g_mutex_unlock(&b->lock);
	/* b may be freed from here on; the pinned instance is not */
	if (wake != NULL) {
		wake->ops->wake(wake->ctx);
		tp_unpin(wake);
	}
}

static void batch_task_done(te_batch *b)
{
	batch_tasks_done(b, 1);
}

static int final_state(int error)
{
	switch (error) {
	case 0: return TE_TASK_COMPLETED;
	case -ETIMEDOUT: return TE_TASK_TIMEOUT;
	case -ECANCELED: return TE_TASK_CANCELED;
	default: return TE_TASK_FAILED;
	}
}

/* A peer that refuses a range its descriptor offered has most likely
 * unregistered that memory: fetch the descriptor again (off this thread,
 * once per descriptor version) so that later requests to the range are
 * called invalid at submit instead of travelling to be refused. */
static void ask_refresh(te_engine *e, te_segver *sv, int error)
{
	if ((error != TE_ERR_REJECTED && error != TE_ERR_ADDRESS) || e->closing || e->refresh_pool == NULL ||
	    atomic_exchange(&sv->refresh_asked, true))
		return;
	atomic_fetch_add_explicit(&sv->refs, 1, memory_order_relaxed);
	g_thread_pool_push(e->refresh_pool, sv, NULL);
}

void te_task_stale(te_task *t)
{
	/* A staging chunk's sub-transfer has no version of its own; its
	 * parent's completion asks when the task fails. */
	if (t->sv != NULL && t->batch != NULL)
		ask_refresh(t->batch->engine, t->sv, TE_ERR_ADDRESS);
}

/* Errors that say the peer process or its host went away. */
static bool peer_gone(int error)
{
	switch (error) {
	case -ECONNREFUSED:
	case -ECONNRESET:
	case -ECONNABORTED:
	case -EPIPE:
	case -ENOTCONN:
	case -EHOSTUNREACH:
	case -ENETUNREACH:
	case -ESRCH:
		return true;
	default:
		return false;
	}
}

/* Publishes a task's end state (metrics first: whoever sees the task ended
 * sees it counted). */
static void task_end_state(te_task *t, te_segver *sv, int state)
{
	te_batch *b = t->batch;
	te_engine *e = b->engine;
	te_stream_op *sop = t->sop;

	if (e->metrics != NULL)
		te_metrics_task_end(e->metrics, t, state);
	if (sv != NULL && state == TE_TASK_FAILED) {
		int err = atomic_load(&t->error);
		ask_refresh(e, sv, err);
		if (peer_gone(err) && !atomic_exchange(&sv->peer_lost, true))
			atomic_fetch_add(&e->lost, 1);
	}
	atomic_store_explicit(&t->state, state, memory_order_release);
	/* Its stream goes on once each of the submission's tasks is seen ended. */
	if (sop != NULL)
		te_stream_task_done(sop);
}

/* What ended tasks of one batch, peer version and transport hold in common,
 * let go once for a run of them (te_task_complete_many()): a reference on
 * the version and the in-flight counts of the transport, the batch and the
 * engine. These lines are written by every thread that completes, so one
 * atomic per run instead of per task saves a cache-line transfer each. */
typedef struct task_group {
	te_batch *b;
	te_segver *sv;
	te_transport_inst *tp;
	size_t n;
} task_group;

static void group_flush(task_group *g, bool from_completion)
{
	if (g->n == 0)
		return;
	te_engine *e = g->b->engine;
	size_t n = g->n;

	g->n = 0;
	te_segver_unref_n(g->sv, (int)n, from_completion);
	if (g->tp != NULL)
		atomic_fetch_sub_explicit(&g->tp->inflight, n, memory_order_release);
	batch_tasks_done(g->b, n);
	/* Last touch of anything shared: engine destroy waits for this count. */
	atomic_fetch_sub_explicit(&e->inflight, n, memory_order_release);
}

/* Ends a task; what it shares is let go through `g` (NULL: at once). */
static void task_finish(te_task *t, int state, bool from_completion, task_group *g)
{
	te_segver *sv = t->sv;
	te_transport_inst *tp = t->tp;
	task_group one = { 0 };

	t->sv = NULL;
	if (sv != NULL && state == TE_TASK_COMPLETED &&
	    atomic_load_explicit(&sv->fo_until, memory_order_relaxed) != 0)
		te_segver_recovered(sv);
	task_end_state(t, sv, state);
	if (g == NULL)
		g = &one;
	if (g->n > 0 && (g->b != t->batch || g->sv != sv || g->tp != tp || g->n >= INT_MAX))
		group_flush(g, from_completion);
	if (g->n == 0)
		*g = (task_group){ t->batch, sv, tp, 0 };
	g->n++;
	if (g == &one)
		group_flush(g, from_completion);
}

static void task_last(te_task *t, int state, int error, bool from_completion, task_group *g);

/* One slice of `t` done; ends the task when it was the last. */
static void slice_done(te_task *t, uint64_t bytes, int error, task_group *g)
{
	if (t->stage != NULL) {
		te_stage_slice_done(t, bytes, error);
		return;
	}
	/* Once ended early, what its transport still reports is not the
	 * task's: the caller saw it end. */
	if (bytes && (atomic_load_explicit(&t->gate, memory_order_relaxed) & TE_GATE_EARLY))
		bytes = 0;
	if (te_task_count_slice(t, bytes, error)) {
		int err = atomic_load(&t->error);
		/* Its transport lost every path to the peer: another may have one. */
		if (err != 0 && te_task_failover(t, err))
			return;
		task_last(t, final_state(err), error, true, g);
	}
}

void te_task_complete(te_task *t, uint64_t bytes, int error)
{
	slice_done(t, bytes, error, NULL);
}

void te_task_complete_many(te_transfer *const *ts, const uint64_t *bytes, const int *errors, size_t n)
{
	task_group g = { 0 };

	for (size_t i = 0; i < n; i++) {
		/* Each task's counters were last written by the thread that
		 * submitted it: fetch the next one's while this one ends. */
		if (i + 1 < n) {
			const te_task *next = (const te_task *)(const void *)ts[i + 1];
			__builtin_prefetch(&next->slices_done, 1);
			__builtin_prefetch(&next->gate, 1);
		}
		slice_done((te_task *)(void *)ts[i], bytes[i], errors != NULL ? errors[i] : 0, &g);
	}
	group_flush(&g, true);
}

static void task_last(te_task *t, int state, int error, bool from_completion, task_group *g)
{
	unsigned mark = TE_GATE_FINAL | (error == -ETIMEDOUT ? TE_GATE_GAVEUP : 0);
	unsigned prev = atomic_load(&t->gate), want;
	do {
		want = prev | mark | ((prev & TE_GATE_ENDING) ? 0 : TE_GATE_ENDED);
	} while (!atomic_compare_exchange_weak(&t->gate, &prev, want));
	if ((prev & TE_GATE_ENDING) && !(prev & TE_GATE_ENDED))
		return; /* the early end under way publishes, then lets go */
	if (!(prev & TE_GATE_ENDED))
		task_finish(t, state, from_completion, g);
	else if (prev & TE_GATE_PUBDONE)
		te_task_release_early(t, from_completion);
	/* else: ended early and still publishing; that side lets go */
}

void te_task_last(te_task *t, int state, int error, bool from_completion)
{
	task_last(t, state, error, from_completion, NULL);
}

void te_task_publish_early(te_task *t, int state)
{
	task_end_state(t, t->sv, state);
	batch_task_done(t->batch); /* the batch stays: the early end holds it */
}

void te_task_release_early(te_task *t, bool from_completion)
{
	te_batch *b = t->batch;
	te_engine *e = b->engine;
	te_segver *sv = t->sv;
	te_transport_inst *tp = t->tp;
	unsigned g = atomic_load(&t->gate);

	t->sv = NULL;
	/* Its transport let go: a WRITE it held is settled, unless it gave up
	 * waiting (-ETIMEDOUT), which says nothing of the peer. */
	if ((g & TE_GATE_UNSETTLED) && !(g & TE_GATE_GAVEUP)) {
		atomic_fetch_and(&t->gate, ~TE_GATE_UNSETTLED);
		g_mutex_lock(&b->lock);
		if (atomic_fetch_sub(&b->unsettled, 1) == 1 && b->waiters > 0)
			g_cond_broadcast(&b->cond);
		g_mutex_unlock(&b->lock);
	}
	te_segver_unref(sv, from_completion);
	if (tp != NULL)
		atomic_fetch_sub_explicit(&tp->inflight, 1, memory_order_release);
	te_batch_mem_unref(b);
	atomic_fetch_sub_explicit(&e->inflight, 1, memory_order_release);
}

/* A task that ends in te_submit() before it was handed on (canceled,
 * refused, empty): its request is counted here, as routing did not. */
static void task_reject(te_task *t, int state, int error)
{
	te_engine *e = t->batch->engine;

	if (e->metrics != NULL)
		te_metrics_task_unsubmitted(e->metrics, t);
	atomic_store(&t->error, error);
	te_task_last(t, state, error, false);
}

/* ---------------------------------------------------------------- submit */

typedef struct dispatch {
	te_transport_inst *tp;
	te_transfer *pend[DISPATCH_CHUNK];
	size_t n;
	te_msubmit ms; /* what the call counts as handed over */
} dispatch;

/* Hands n transfers to their transport; a refusal ends each of them with
 * its code (shared by te_submit and te_submit_prepared). */
void te_transport_hand_over(te_transport_inst *tp, te_transfer **pend, size_t n)
{
	if (n == 0)
		return;
	int rc = tp->ops->submit(tp->ctx, pend, n);
	if (rc < 0) {
		te_err("transport %s refused %zu transfers: %s", tp->hc.plugin->name, n, te_strerror(rc));
		for (size_t i = 0; i < n; i++) {
			te_task *t = (te_task *)pend[i];
			t->xfer.nr_slices = 1;
			atomic_store(&t->slices_done, 0);
			te_task_complete(t, 0, rc);
		}
	}
}

static void flush(dispatch *d)
{
	te_transport_hand_over(d->tp, d->pend, d->n);
	d->n = 0;
}

/* Hands a full chunk over without the registry lock: a transport's submit
 * may look up buffers itself. */
static void flush_unlocked(te_engine *e, dispatch *d)
{
	if (d->n == 0)
		return;
	g_rw_lock_reader_unlock(&e->mem.lock);
	flush(d);
	g_rw_lock_reader_lock(&e->mem.lock);
}

static void queue_remote(te_engine *e, dispatch *d, te_task *t)
{
	if (d->tp != t->tp) {
		flush_unlocked(e, d);
		d->tp = t->tp;
	}
	d->pend[d->n++] = &t->xfer;
	if (d->n == DISPATCH_CHUNK)
		flush_unlocked(e, d);
}

/* Records the transport of the batch's first remote task, for
 * te_batch_wait (see progress). */
static void note_transport(te_batch *b, te_transport_inst *tp)
{
	te_transport_inst *cur = NULL;

	if (atomic_load_explicit(&b->wait_tp, memory_order_relaxed) == NULL)
		atomic_compare_exchange_strong(&b->wait_tp, &cur, tp);
}

typedef struct seg_cache {
	te_segment_id id;
	te_segver *sv;
	te_mpeer *peer;
} seg_cache;

#define ROUTE_EMPTY 1
#define ROUTE_STALE 2 /* outside the cached descriptor: maybe the peer grew */
#define MAX_STALE 64

static void reject_range(te_task *t, const te_request *r, const char *segment)
{
	te_err("submit: task %td: range 0x%llx+%llu is outside the buffers of segment %s",
	       t - t->batch->tasks, (unsigned long long)r->remote, (unsigned long long)r->length,
	       segment);
}

/* Validates a request and routes its task; returns the reject error, 0, or
 * ROUTE_EMPTY / ROUTE_STALE. Called with the data and registry locks held. */
static int route(te_engine *e, te_batch *b, te_task *t, const te_request *r, seg_cache *sc,
		 dispatch *d)
{
	te_region *lr;

	if (r->opcode != TE_OP_READ && r->opcode != TE_OP_WRITE) {
		te_err("submit: task %td: unknown opcode %u", t - b->tasks, r->opcode);
		return -EINVAL;
	}
	if (r->local == NULL && r->length > 0) {
		te_err("submit: task %td: NULL local address", t - b->tasks);
		return TE_ERR_ADDRESS;
	}
	lr = r->length ? te_memreg_find_locked(&e->mem, (uintptr_t)r->local, r->length) : NULL;
	if (lr != NULL)
		t->xfer.local_location = lr->location;
	if (r->length > 0 && lr == NULL) {
		te_err("submit: task %td: local range %p+%llu is not inside one registered region",
		       t - b->tasks, r->local, (unsigned long long)r->length);
		return TE_ERR_ADDRESS;
	}

	if (lr != NULL)
		t->dev = lr->dev;
	if (r->segment == TE_LOCAL_SEGMENT) {
		te_region *rr;
		if (r->length == 0)
			return ROUTE_EMPTY;
		if ((rr = te_memreg_find_locked(&e->mem, r->remote, r->length)) == NULL) {
			te_err("submit: task %td: range 0x%llx+%llu is outside the local segment's buffers",
			       t - b->tasks, (unsigned long long)r->remote, (unsigned long long)r->length);
			return TE_ERR_ADDRESS;
		}
		if (t->dev == NULL)
			t->dev = rr->dev;
		if (e->metrics != NULL)
			te_metrics_submit_one(e->metrics, &d->ms, t);
		te_local_submit(e, t); /* hands it over */
		return 0;
	}

	if (sc->id != r->segment) {
		te_segment *s = g_hash_table_lookup(e->segments, GINT_TO_POINTER(r->segment));
		sc->id = r->segment;
		sc->sv = s ? te_segver_route(s->cur) : NULL;
		sc->peer = s ? s->mpeer : NULL;
		if (s == NULL) {
			te_err("submit: task %td: unknown segment id %d", t - b->tasks, r->segment);
			sc->id = -1;
			return TE_ERR_SEGMENT;
		}
	}
	/* From here on the task counts as the segment's and its transport's,
	 * refused or not. */
	t->mpeer = sc->peer;
	if (sc->sv == NULL) {
		te_err("submit: task %td: segment %d has no transport", t - b->tasks, r->segment);
		return TE_ERR_NO_TRANSPORT;
	}
	t->mb = sc->sv->tp->hc.mb;
	if (r->length == 0)
		return ROUTE_EMPTY;
	if (!te_desc_contains(sc->sv->desc, r->remote, r->length))
		return ROUTE_STALE;
	t->sv = sc->sv;
	atomic_fetch_add_explicit(&t->sv->refs, 1, memory_order_relaxed);
	t->xfer.seg_ctx = sc->sv->seg_ctx;
	t->tp = sc->sv->tp;
	atomic_fetch_add_explicit(&t->tp->inflight, 1, memory_order_relaxed);
	note_transport(b, t->tp);
	if (e->metrics != NULL)
		te_metrics_submit_one(e->metrics, &d->ms, t);
	/* A staged task is not handed over: its staging copies do not pass
	 * the gate, so it ends when its transport ends it. */
	if (t->dev != NULL && !te_region_direct(lr, t->tp)) {
		te_stage_submit(e, t);
	} else {
		te_task_handed(t);
		queue_remote(e, d, t);
	}
	return 0;
}

/* What becomes of a task that route() did not hand to a transport (rc not
 * 0; out of line, as the tasks that go on are the ones that count): an empty
 * one is done, a refused one (its range still outside the peer's descriptor
 * after any refresh) fails. Returns 1 when it was refused. */
static __attribute__((noinline)) int route_settle(te_task *t, const te_request *r, int rc, const seg_cache *sc)
{
	if (rc == ROUTE_EMPTY) {
		task_reject(t, TE_TASK_COMPLETED, 0);
		return 0;
	}
	if (rc == ROUTE_STALE) {
		reject_range(t, r, sc->sv->desc->name);
		rc = TE_ERR_ADDRESS;
	}
	if (rc >= 0)
		return 0;
	task_reject(t, TE_TASK_INVALID, rc);
	return 1;
}

/* A task as submitted, before routing. */
static void task_init(te_task *t, te_batch *b, const te_request *r, te_stream_op *sop, uint64_t t0,
		      int64_t deadline)
{
	te_task_init(t, b, r->opcode, r->local, r->remote, r->length, sop, t0);
	t->deadline = deadline;
}

/* Appends `n` tasks to the batch, in flight from now on (te_batch_wait()
 * waits for them, te_batch_free() refuses); *base is the first one's
 * index. Negative, nothing appended: a freed batch, or no room. */
static int reserve(te_engine *e, te_batch *b, batch_box *box, size_t n, const char *what, size_t *base)
{
	g_mutex_lock(&b->lock);
	*base = atomic_load(&b->count);
	if (box->freed || n > b->capacity - *base) {
		bool freed = box->freed;
		g_mutex_unlock(&b->lock);
		if (freed)
			return TE_ERR_BATCH;
		te_err("%s: %zu requests exceed batch %llu's capacity (%zu of %zu used)", what, n,
		       (unsigned long long)b->id, *base, b->capacity);
		return TE_ERR_BATCH_FULL;
	}
	atomic_store(&b->count, *base + n);
	if (atomic_load(&b->inflight) == 0) {
		/* Drained: nothing routed earlier is in flight any more. */
		atomic_store(&b->wait_tp, NULL);
	}
	atomic_fetch_add(&b->inflight, n);
	atomic_fetch_add(&e->inflight, (long)n);
	g_mutex_unlock(&b->lock);
	return 0;
}

/* Routes tasks [base, base + n) of the batch, reserved for `reqs`, and
 * hands them on; `sop`: the stream submission they belong to, or NULL;
 * `deadline`: theirs (0: none). Returns how many ended INVALID. */
static int start_tasks(te_engine *e, te_batch *b, size_t base, const te_request *reqs, size_t n,
		       te_stream_op *sop, int64_t deadline)
{
	int invalid = 0;
	/* Exchanges with peers made below (descriptor fetches) end by it. */
	int64_t outer_deadline = te_call_deadline;
	if (deadline != 0 && (outer_deadline == 0 || deadline < outer_deadline))
		te_call_deadline = deadline;

	if (atomic_load_explicit(&e->lost, memory_order_relaxed) > 0) {
		/* Some peer went away: the segments this submit names are fetched
		 * again first, so a peer back under the same name is reached at its
		 * new ports. One atomic load when no peer was lost. */
		te_segment_id last = TE_LOCAL_SEGMENT;
		for (size_t i = 0; i < n; i++)
			if (reqs[i].segment != last && reqs[i].segment != TE_LOCAL_SEGMENT)
				te_segment_refresh_lost(e, last = reqs[i].segment);
	}
	bool canceled = atomic_load(&b->canceled);

	/* One clock reading serves every task of the call. */
	uint64_t t0 = e->metrics != NULL ? te_metrics_now() : 0;
	te_mlate late;
	if (e->metrics != NULL)
		te_metrics_late_begin(e->metrics, t0, &late);
	dispatch d = { 0 };
	seg_cache sc = { .id = -1 };
	size_t stale[MAX_STALE], n_stale = 0;
	g_rw_lock_reader_lock(&e->data);
	g_rw_lock_reader_lock(&e->mem.lock);
	for (size_t i = 0; i < n; i++) {
		te_task *t = &b->tasks[base + i];
		const te_request *r = &reqs[i];
		task_init(t, b, r, sop, t0, deadline);
		if (canceled) {
			task_reject(t, TE_TASK_CANCELED, -ECANCELED);
			continue;
		}
		int rc = route(e, b, t, r, &sc, &d);
		if (rc == ROUTE_STALE && n_stale < MAX_STALE)
			stale[n_stale++] = i; /* decided after a refresh, below */
		else if (rc != 0)
			invalid += route_settle(t, r, rc, &sc);
	}
	g_rw_lock_reader_unlock(&e->mem.lock);
	flush(&d);
	te_stage_flush(e);
	g_rw_lock_reader_unlock(&e->data);

	if (n_stale > 0) {
		/* The peer may have registered memory since its descriptor was
		 * fetched: refresh (rate-limited per segment) and look again. */
		for (size_t k = 0; k < n_stale; k++) {
			te_segment_id id = reqs[stale[k]].segment;
			bool seen = false;
			for (size_t j = 0; j < k; j++)
				seen |= reqs[stale[j]].segment == id;
			if (!seen)
				te_segment_refresh_stale(e, id);
		}
		seg_cache sc2 = { .id = -1 };
		g_rw_lock_reader_lock(&e->data);
		g_rw_lock_reader_lock(&e->mem.lock);
		for (size_t k = 0; k < n_stale; k++) {
			te_task *t = &b->tasks[base + stale[k]];
			const te_request *r = &reqs[stale[k]];
			int rc = route(e, b, t, r, &sc2, &d);
			if (rc != 0)
				invalid += route_settle(t, r, rc, &sc2);
		}
		g_rw_lock_reader_unlock(&e->mem.lock);
		flush(&d);
		te_stage_flush(e);
		g_rw_lock_reader_unlock(&e->data);
	}
	if (e->metrics != NULL)
		te_metrics_late_end(&late);
	te_metrics_submit_flush(&d.ms);
	if (deadline != 0)
		te_deadline_arm(e, b->id, base, n, deadline);
	te_call_deadline = outer_deadline;
	return invalid;
}

int te_batch_start_held(te_engine *e, te_batch *b, size_t base, const te_request *reqs, size_t n,
			te_stream_op *sop)
{
	return start_tasks(e, b, base, reqs, n, sop, atomic_load_explicit(&b->deadline, memory_order_relaxed));
}

static int submit(te_engine *e, te_batch_id id, const te_request *reqs, size_t n, int64_t deadline,
		  const char *what)
{
	batch_box *box;
	size_t base;

	if (e != NULL && n > 0 && reqs == NULL) {
		te_err("%s: NULL request array", what);
		return -EINVAL;
	}
	if (deadline < 0) {
		te_err("%s: negative deadline %lld", what, (long long)deadline);
		return -EINVAL;
	}
	box = batch_get(e, id, what);
	if (box == NULL)
		return e == NULL ? -EINVAL : TE_ERR_BATCH;
	if (n == 0) {
		box_unref(box);
		return 0;
	}
	if (deadline == 0)
		deadline = atomic_load_explicit(&box->b->deadline, memory_order_relaxed);
	int rc = reserve(e, box->b, box, n, what, &base);
	if (rc == 0)
		rc = start_tasks(e, box->b, base, reqs, n, NULL, deadline);
	box_unref(box);
	return rc;
}

int te_submit(te_engine *e, te_batch_id id, const te_request *reqs, size_t n)
{
	return submit(e, id, reqs, n, 0, "te_submit");
}

int te_submit_by(te_engine *e, te_batch_id id, const te_request *reqs, size_t n, int64_t deadline_ns)
{
	return submit(e, id, reqs, n, deadline_ns, "te_submit_by");
}

int te_batch_set_deadline(te_engine *e, te_batch_id id, int64_t deadline_ns)
{
	if (deadline_ns < 0) {
		te_err("te_batch_set_deadline: negative deadline %lld", (long long)deadline_ns);
		return -EINVAL;
	}
	batch_box *box = batch_get(e, id, "te_batch_set_deadline");
	if (box == NULL)
		return e == NULL ? -EINVAL : TE_ERR_BATCH;
	atomic_store_explicit(&box->b->deadline, deadline_ns, memory_order_relaxed);
	box_unref(box);
	return 0;
}

int te_batch_hold(te_engine *e, te_batch_id id, const te_request *reqs, size_t n, te_stream_op *sop,
		  te_batch **out, size_t *base)
{
	batch_box *box = batch_get(e, id, "te_submit_on_stream");

	if (box == NULL)
		return TE_ERR_BATCH;
	te_batch *b = box->b;
	int rc = reserve(e, b, box, n, "te_submit_on_stream", base);
	if (rc == 0) {
		uint64_t t0 = e->metrics != NULL ? te_metrics_now() : 0;
		int64_t dl = atomic_load_explicit(&b->deadline, memory_order_relaxed);
		for (size_t i = 0; i < n; i++)
			task_init(&b->tasks[*base + i], b, &reqs[i], sop, t0, dl);
		*out = b;
	}
	/* The tasks in flight keep the batch: te_batch_free() refuses it, and
	 * an engine being destroyed waits for them. */
	box_unref(box);
	return rc;
}

void te_batch_end_held(te_batch *b, size_t base, size_t n, int state, int error)
{
	for (size_t i = 0; i < n; i++)
		task_reject(&b->tasks[base + i], state, error);
}

/* ---------------------------------------------------------------- status */

int te_get_status(te_engine *e, te_batch_id id, size_t task, te_task_status *out)
{
	batch_box *box;
	int rc = 0;

	if (out == NULL) {
		te_err("te_get_status: NULL output pointer");
		return -EINVAL;
	}
	box = batch_get(e, id, "te_get_status");
	if (box == NULL)
		return e == NULL ? -EINVAL : TE_ERR_BATCH;
	te_batch *b = box->b;
	if (task < atomic_load(&b->count)) {
		int st = atomic_load_explicit(&b->tasks[task].state, memory_order_acquire);
		if (st == TE_TASK_WAITING || st == TE_TASK_PENDING)
			progress_poll(b);
	}
	if (task >= atomic_load(&b->count)) {
		te_err("te_get_status: task %zu not submitted to batch %llu (%zu tasks)", task,
		       (unsigned long long)id, atomic_load(&b->count));
		rc = -ERANGE;
	} else {
		te_task *t = &b->tasks[task];
		out->state = atomic_load_explicit(&t->state, memory_order_acquire);
		out->error = atomic_load_explicit(&t->error, memory_order_relaxed);
		out->transferred = atomic_load_explicit(&t->transferred, memory_order_relaxed);
		if (out->state == TE_TASK_COMPLETED)
			out->error = 0;
	}
	box_unref(box);
	return rc;
}

static int severity(int state)
{
	switch (state) {
	case TE_TASK_FAILED: return 5;
	case TE_TASK_TIMEOUT: return 4;
	case TE_TASK_INVALID: return 3;
	case TE_TASK_CANCELED: return 2;
	default: return 0;
	}
}

int te_batch_status(te_engine *e, te_batch_id id, size_t *submitted, size_t *in_flight, int32_t *state)
{
	batch_box *box = batch_get(e, id, "te_batch_status");

	if (box == NULL)
		return e == NULL ? -EINVAL : TE_ERR_BATCH;
	te_batch *b = box->b;
	if (atomic_load(&b->inflight) > 0)
		progress_poll(b);
	size_t count = atomic_load(&b->count);
	size_t infl = atomic_load(&b->inflight);
	if (submitted)
		*submitted = count;
	if (in_flight)
		*in_flight = infl;
	if (state) {
		int worst = TE_TASK_COMPLETED;
		if (infl > 0) {
			worst = TE_TASK_WAITING;
		} else {
			for (size_t i = 0; i < count; i++) {
				int s = atomic_load(&b->tasks[i].state);
				if (severity(s) > severity(worst))
					worst = s;
			}
		}
		*state = worst;
	}
	box_unref(box);
	return 0;
}

/* Sleeps on the batch's condition until `*count` is 0 (whoever lowers it
 * to 0 broadcasts under the lock), or until `end` (monotonic µs) when
 * timeout_ms >= 0: 0 or -ETIMEDOUT. */
static int wait_zero(te_batch *b, atomic_size_t *count, int timeout_ms, gint64 end)
{
	int rc = 0;

	g_mutex_lock(&b->lock);
	b->waiters++;
	while (atomic_load(count) > 0) {
		if (timeout_ms < 0) {
			g_cond_wait(&b->cond, &b->lock);
		} else if (!g_cond_wait_until(&b->cond, &b->lock, end) && atomic_load(count) > 0) {
			rc = -ETIMEDOUT;
			break;
		}
	}
	b->waiters--;
	g_mutex_unlock(&b->lock);
	return rc;
}

atomic_int te_batch_spinners;

/* This thread's look in te_batch_wait before it sleeps, learned. */
static _Thread_local teu_spin_state tls_wait_spin;

int te_batch_wait(te_engine *e, te_batch_id id, int timeout_ms)
{
	batch_box *box = batch_get(e, id, "te_batch_wait");
	int rc = 0;

	if (box == NULL)
		return e == NULL ? -EINVAL : TE_ERR_BATCH;
	te_batch *b = box->b;
	gint64 end = timeout_ms >= 0 ? g_get_monotonic_time() + (gint64)timeout_ms * 1000 : 0;
	rc = progress_wait(b, timeout_ms, end);
	if (rc <= 0) {
		box_unref(box);
		return rc;
	}
	rc = 0;
	/* TE_SPIN_US (learned when unset, util/teu-spin.h): a completion
	 * within that long is seen without the sleep and wake-up (tens of
	 * microseconds on a VM). */
	gint64 start = g_get_monotonic_time();
	int64_t spin = teu_spin_begin(&e->spin, &tls_wait_spin);
	bool hit = false;
	if (spin > 0) {
		gint64 until = start + spin / 1000;
		if (timeout_ms >= 0 && end < until)
			until = end;
		for (unsigned i = 1; !(hit = atomic_load(&b->inflight) == 0); i++) {
			if (i % 64 == 0) {
				if (g_get_monotonic_time() >= until)
					break;
				/* the thread completing it may wait for this core */
				teu_spin_pause();
			}
			te_cpu_relax();
		}
		teu_spin_end(&e->spin, spin);
	}
	rc = wait_zero(b, &b->inflight, timeout_ms, end);
	if (rc == 0)
		teu_spin_learn(&e->spin, &tls_wait_spin, hit, (g_get_monotonic_time() - start) * 1000);
	box_unref(box);
	return rc;
}

int te_batch_cancel(te_engine *e, te_batch_id id)
{
	batch_box *box = batch_get(e, id, "te_batch_cancel");

	if (box == NULL)
		return e == NULL ? -EINVAL : TE_ERR_BATCH;
	te_batch *b = box->b;
	atomic_store(&b->canceled, 1);
	/* Tasks in flight end now where their transport allows it; the others
	 * see the flag at their next slice. */
	size_t n = atomic_load(&b->count);
	for (size_t i = 0; i < n && atomic_load(&b->inflight) > 0; i++)
		te_task_end_early(&b->tasks[i], TE_TASK_CANCELED, -ECANCELED);
	box_unref(box);
	return 0;
}

void te_batch_expire_range(te_engine *e, te_batch_id id, size_t base, size_t n)
{
	g_rw_lock_reader_lock(&e->batch_lock);
	batch_box *box = g_hash_table_lookup(e->batches, &id);
	if (box != NULL)
		atomic_fetch_add_explicit(&box->refs, 1, memory_order_relaxed);
	g_rw_lock_reader_unlock(&e->batch_lock);
	if (box == NULL)
		return; /* freed: none of its tasks is in flight */
	te_batch *b = box->b;
	for (size_t i = base; i < base + n && atomic_load(&b->inflight) > 0; i++)
		te_task_end_early(&b->tasks[i], TE_TASK_FAILED, -ETIMEDOUT);
	box_unref(box);
}

int te_batch_wait_settled(te_engine *e, te_batch_id id, int timeout_ms)
{
	gint64 start = g_get_monotonic_time();
	int rc = te_batch_wait(e, id, timeout_ms);

	if (rc < 0)
		return rc;
	batch_box *box = batch_get(e, id, "te_batch_wait_settled");
	if (box == NULL)
		return e == NULL ? -EINVAL : TE_ERR_BATCH;
	rc = wait_zero(box->b, &box->b->unsettled, timeout_ms, start + (gint64)timeout_ms * 1000);
	box_unref(box);
	return rc;
}

int te_get_task_info(te_engine *e, te_batch_id id, size_t task, te_task_info *out)
{
	if (out == NULL || out->size < sizeof *out) {
		te_err("te_get_task_info: %s", out == NULL ? "NULL output pointer"
							   : "out->size is not set to sizeof(te_task_info)");
		return -EINVAL;
	}
	te_task_status st;
	int rc = te_get_status(e, id, task, &st);
	if (rc < 0)
		return rc;
	batch_box *box = batch_get(e, id, "te_get_task_info");
	if (box == NULL)
		return TE_ERR_BATCH;
	const te_task *t = &box->b->tasks[task];
	unsigned g = atomic_load_explicit(&t->gate, memory_order_acquire);
	int state = atomic_load_explicit(&t->state, memory_order_acquire);
	uint32_t size = out->size < sizeof *out ? out->size : (uint32_t)sizeof *out;
	te_task_info info = {
		.size = size,
		.state = state,
		.error = state == TE_TASK_COMPLETED ? 0 : atomic_load(&t->error),
		.flags = ((g & TE_GATE_UNSETTLED) ? TE_TASK_UNSETTLED : 0) |
			 ((g & TE_GATE_EARLY) && state != TE_TASK_WAITING ? TE_TASK_ENDED_EARLY : 0),
		.transferred = atomic_load_explicit(&t->transferred, memory_order_relaxed),
		.deadline_ns = t->deadline,
	};
	(void)st;
	memcpy(out, &info, size);
	box_unref(box);
	return 0;
}

/* ---------------------------------------------------------- notification */

static void send_notify_job(gpointer data, gpointer user)
{
	notify_job *j = data;
	(void)user;
	if (j->segment != NULL) {
		int rc = te_notify_send_name(j->e, j->segment, j->sender, j->msg);
		if (rc < 0) /* a peer refusing them would log one line per batch */
			te_warn_limited("batch notification to %s failed: %s", j->segment, te_strerror(rc));
	}
	g_free(j->segment);
	g_free(j->sender);
	g_free(j->msg);
	g_free(j);
}

GThreadPool *te_notify_pool_new(void)
{
	return g_thread_pool_new(send_notify_job, NULL, 1, FALSE, NULL);
}

int te_batch_notify_as(te_engine *e, te_batch_id id, te_segment_id seg, const char *sender, const char *msg)
{
	batch_box *box;
	char *name;
	int rc = 0;

	if (msg == NULL || strlen(msg) > TE_NOTIFY_MAX || (sender != NULL && strlen(sender) > TE_NOTIFY_MAX)) {
		te_err("te_batch_notify: %s", msg == NULL ? "message is NULL"
					      : strlen(msg) > TE_NOTIFY_MAX ? "message is longer than TE_NOTIFY_MAX"
									    : "sender name is longer than TE_NOTIFY_MAX");
		return -EINVAL;
	}
	box = batch_get(e, id, "te_batch_notify");
	if (box == NULL)
		return e == NULL ? -EINVAL : TE_ERR_BATCH;
	name = te_segment_name(e, seg);
	if (name == NULL) {
		box_unref(box);
		te_err("te_batch_notify: unknown segment id %d", seg);
		return TE_ERR_SEGMENT;
	}
	te_batch *b = box->b;
	g_mutex_lock(&b->lock);
	if (b->notify_msg != NULL) {
		rc = -EBUSY;
		te_err("te_batch_notify: batch %llu already has a pending notification",
		       (unsigned long long)id);
	} else if (atomic_load(&b->inflight) > 0) {
		b->notify_msg = g_strdup(msg);
		b->notify_sender = g_strdup(sender);
		b->notify_name = name;
		name = NULL;
		rc = 1;
	}
	g_mutex_unlock(&b->lock);
	box_unref(box);
	if (rc == 0)
		rc = te_notify_send_name(e, name, sender, msg);
	g_free(name);
	return rc < 0 ? rc : 0;
}

int te_batch_notify(te_engine *e, te_batch_id id, te_segment_id seg, const char *msg)
{
	return te_batch_notify_as(e, id, seg, NULL, msg);
}

/* ------------------------------------------------- prepared transfers */

int te_batch_reserve(te_engine *e, te_batch_id id, size_t n, const char *what, te_batch **out, size_t *base)
{
	batch_box *box = batch_get(e, id, what);

	if (box == NULL)
		return TE_ERR_BATCH;
	int rc = reserve(e, box->b, box, n, what, base);
	if (rc == 0)
		*out = box->b;
	/* The reserved tasks keep the batch, as te_batch_hold()'s do. */
	box_unref(box);
	return rc;
}

void te_batch_task_end(te_task *t, int state, int error)
{
	task_reject(t, state, error);
}

void te_batch_note_transport(te_batch *b, te_transport_inst *tp)
{
	note_transport(b, tp);
}
