/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Caller submission: submit() turns slices into SQEs on the calling thread,
 * and whichever thread holds the collector role (an application thread in
 * progress(), else the worker) takes completions from the ring.
 */
#include <errno.h>
#include <time.h>

#include "nvmeof.h"

#define NV_STUCK_NS 1000000 /* retry interval while the kernel refuses entries */

/* Completions in the ring not yet taken. Other threads read this while the
 * role holder advances the head, hence the atomic loads. */
static unsigned cq_pending(nv_worker *w)
{
	unsigned tail = atomic_load_explicit((_Atomic unsigned *)w->ring.cq.ktail, memory_order_acquire);
	unsigned head = atomic_load_explicit((_Atomic unsigned *)w->ring.cq.khead, memory_order_relaxed);

	return tail - head;
}

/* Entering the kernel would bring completions into the ring: it holds some
 * the ring had no room for, or a submitter's completion work is pending
 * (which only that submitter's entering runs). */
static bool cq_needs_enter(nv_worker *w)
{
	return atomic_load_explicit((_Atomic unsigned *)w->ring.sq.kflags, memory_order_relaxed) &
	       (IORING_SQ_CQ_OVERFLOW | IORING_SQ_TASKRUN);
}

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Sleeps in the kernel until the ring holds a completion (or `timeout_ns`
 * passes, < 0: no limit). Leaves the submission queue alone. */
static int ring_wait(nv_worker *w, int64_t timeout_ns)
{
	if (timeout_ns < 0)
		return io_uring_enter(w->ring.ring_fd, 0, 1, IORING_ENTER_GETEVENTS, NULL);
	struct __kernel_timespec ts = { .tv_sec = timeout_ns / 1000000000, .tv_nsec = timeout_ns % 1000000000 };
	struct io_uring_getevents_arg arg = { .ts = (uint64_t)(uintptr_t)&ts };
	return io_uring_enter2(w->ring.ring_fd, 0, 1, IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG,
			       (sigset_t *)&arg, sizeof arg);
}

/* Submits what the SQ ring holds, under w->lock. Negative when entries stay
 * queued (the kernel is short of resources): someone must retry. */
static int flush_sq(nv_worker *w)
{
	if (io_uring_sq_ready(&w->ring) == 0)
		return 0;
	int rc = io_uring_submit(&w->ring);
	if (rc >= 0 && io_uring_sq_ready(&w->ring) > 0)
		rc = -EAGAIN;
	return rc;
}

/* ---------------------------------- caller submission: collecting completions */

static bool role_try(nv_worker *w, int who)
{
	int expect = NV_ROLE_FREE;

	return atomic_load_explicit(&w->role, memory_order_relaxed) == NV_ROLE_FREE &&
	       atomic_compare_exchange_strong(&w->role, &expect, who);
}

static void wake_secondaries(nv_worker *w)
{
	teu_mon_broadcast(&w->cv);
}

/* Gives the role up; threads that waited because it was taken look again.
 * Pairs with wait_aside(), which counts itself before it looks at the role
 * (both sequentially consistent): one of the two sees the other. */
static void role_release(nv_worker *w)
{
	atomic_store(&w->role, NV_ROLE_FREE);
	if (atomic_load(&w->secondaries) > 0)
		wake_secondaries(w);
}

static void log_enter_error(nv_worker *w, int rc)
{
	static atomic_uint errors;

	if (atomic_fetch_add(&errors, 1) % NV_LOG_EVERY == 0)
		w->ctx->host->log(w->ctx->host, TE_LOG_ERROR, "worker %u: io_uring_enter failed: %s", w->index,
				  g_strerror(-rc));
}

/* Takes every completion the ring holds (the caller holds the role), refills
 * the slots they free from the queue and submits, then makes the complete()
 * calls without the lock. Negative when entries stay in the submission queue
 * (the kernel is short of resources): the caller retries soon. */
static int collect(nv_worker *w)
{
	const te_host *h = w->ctx->host;
	nv_done done[NV_PASS_DONE];
	nv_pass p = { .done = done, .cap = NV_PASS_DONE };
	uint32_t completed = 0;
	unsigned n;
	int rc;

	do {
		if (cq_pending(w) == 0 && cq_needs_enter(w)) {
			int erc = io_uring_enter(w->ring.ring_fd, 0, 0, IORING_ENTER_GETEVENTS, NULL);
			if (erc < 0 && erc != -EINTR && erc != -EAGAIN && erc != -EBUSY)
				log_enter_error(w, erc);
		}
		g_mutex_lock(&w->lock);
		n = nv_reap(w, &p, NV_PASS_CQES);
		nv_issue(w, &p);
		rc = flush_sq(w);
		g_mutex_unlock(&w->lock);
		completed += p.completed;
		p.completed = 0;
		nv_pass_flush(h, &p);
	} while (n == NV_PASS_CQES);
	if (completed > 0) {
		/* Threads waiting aside check their condition after counting
		 * themselves; this load follows the complete() calls. */
		atomic_thread_fence(memory_order_seq_cst);
		if (atomic_load(&w->secondaries) > 0)
			wake_secondaries(w);
	}
	return rc;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

/* Looks for a completion without sleeping until `until`: a sleep and its
 * wake-up cost the thread a context switch and tens of microseconds on a VM,
 * more than a short look. The kernel flags completion work it holds for this
 * thread (it runs it without interrupting the thread); entering the kernel
 * runs it. True when there is something to collect or done() holds. */
static bool spin_for_completion(nv_worker *w, int (*done)(void *), void *arg, int64_t until)
{
	for (unsigned i = 1;; i++) {
		if (cq_pending(w) > 0 || done(arg))
			return true;
		/* at most every 64 looks: the work may be another thread's */
		if (i % 64 == 1 && cq_needs_enter(w)) {
			int rc = io_uring_enter(w->ring.ring_fd, 0, 0, IORING_ENTER_GETEVENTS, NULL);
			if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
				return false;
			continue;
		}
		if (i % 64 == 0 && now_ns() >= until)
			return false;
		cpu_relax();
	}
}

/* The role holder's wait: collect, check, sleep in the ring for more (after
 * a short look when the last wait was that short). */
static int collect_until(nv_worker *w, int (*done)(void *), void *arg, int64_t end)
{
	for (;;) {
		int stuck = collect(w);
		if (done == NULL || done(arg))
			return 0;
		int64_t left = -1;
		if (end != INT64_MAX) {
			left = end - now_ns();
			if (left <= 0)
				return -ETIMEDOUT;
		}
		if (stuck < 0 && (left < 0 || left > NV_STUCK_NS))
			left = NV_STUCK_NS;
		/* Every completion of this transport passes through the ring (even
		 * failures found at submit time), and only the role holder takes
		 * them out: whatever can make done() true wakes this sleep. */
		if (cq_pending(w) == 0) {
			int64_t t0 = now_ns();
			int64_t spin = w->ctx->spin_ns;
			if (spin > 0 && w->last_wait_ns < spin && (left < 0 || left > spin) &&
			    spin_for_completion(w, done, arg, t0 + spin)) {
				w->last_wait_ns = now_ns() - t0;
				continue;
			}
			int rc = ring_wait(w, left);
			w->last_wait_ns = now_ns() - t0;
			if (rc < 0 && rc != -EINTR && rc != -ETIME && rc != -EAGAIN && rc != -EBUSY) {
				log_enter_error(w, rc);
				g_usleep(1000); /* do not spin on a persistent failure */
			}
		}
	}
}

/* Another thread holds the role: sleep until it reports completions or gives
 * the role up. 1: the role may be free, try to take it. */
static int wait_aside(nv_worker *w, int (*done)(void *), void *arg, int64_t end)
{
	int rc;

	g_mutex_lock(&w->cv.lock);
	atomic_fetch_add(&w->secondaries, 1);
	for (;;) {
		if (done == NULL || done(arg)) {
			rc = 0;
			break;
		}
		if (atomic_load(&w->role) == NV_ROLE_FREE) {
			rc = 1;
			break;
		}
		if (end == INT64_MAX) {
			g_cond_wait(&w->cv.cond, &w->cv.lock);
			continue;
		}
		int64_t left = end - now_ns();
		if (left <= 0) {
			rc = -ETIMEDOUT;
			break;
		}
		g_cond_wait_until(&w->cv.cond, &w->cv.lock, g_get_monotonic_time() + left / 1000 + 1);
	}
	atomic_fetch_sub(&w->secondaries, 1);
	g_mutex_unlock(&w->cv.lock);
	return rc;
}

int nv_progress(nv_ctx *c, int (*done)(void *), void *arg, int64_t timeout_ns)
{
	/* One ring only: a thread cannot sleep in several. */
	if (!c->caller_submit || c->n_workers != 1 || !c->workers[0].ext_arg)
		return -ENOTSUP;
	nv_worker *w = &c->workers[0];
	int rc;

	/* A plain store, not a count: this runs for every status call. */
	if (!atomic_load_explicit(&w->app_called, memory_order_relaxed))
		atomic_store_explicit(&w->app_called, 1, memory_order_relaxed);
	if (timeout_ns == 0) {
		if ((cq_pending(w) > 0 || cq_needs_enter(w)) && role_try(w, NV_ROLE_APP)) {
			collect(w);
			role_release(w);
		}
		return done == NULL || done(arg) ? 0 : -ETIMEDOUT;
	}
	int64_t end = timeout_ns < 0 ? INT64_MAX : now_ns() + timeout_ns;
	atomic_fetch_add(&w->app_waiters, 1);
	for (;;) {
		if (role_try(w, NV_ROLE_APP)) {
			rc = collect_until(w, done, arg, end);
			role_release(w);
			break;
		}
		rc = wait_aside(w, done, arg, end);
		if (rc != 1)
			break;
	}
	atomic_fetch_sub(&w->app_waiters, 1);
	return rc;
}

void nv_wake(nv_ctx *c)
{
	if (!c->caller_submit || c->n_workers != 1)
		return;
	nv_worker *w = &c->workers[0];
	/* The collector sleeps in the ring: a no-op's completion wakes it. */
	g_mutex_lock(&w->lock);
	struct io_uring_sqe *sqe = nv_get_sqe(w);
	if (sqe != NULL) {
		io_uring_prep_nop(sqe);
		io_uring_sqe_set_data64(sqe, NV_WAKE_TAG);
	}
	int rc = flush_sq(w);
	g_mutex_unlock(&w->lock);
	if (sqe == NULL || rc < 0)
		nv_efd_wake(w);
	/* The others wait aside. */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load(&w->secondaries) > 0)
		wake_secondaries(w);
}

/* Wakes the worker wherever it sleeps: in the ring (through the eventfd's
 * poll) or between its looks at the application threads. */
void nv_kick_worker(nv_worker *w)
{
	g_mutex_lock(&w->lazy.lock);
	w->lazy_kick = true;
	g_cond_signal(&w->lazy.cond);
	g_mutex_unlock(&w->lazy.lock);
	nv_efd_wake(w);
}

static void lazy_sleep(nv_worker *w, int64_t ns)
{
	g_mutex_lock(&w->lazy.lock);
	if (!w->lazy_kick)
		g_cond_wait_until(&w->lazy.cond, &w->lazy.lock, g_get_monotonic_time() + ns / 1000);
	w->lazy_kick = false;
	g_mutex_unlock(&w->lazy.lock);
}

/* Caller submission, the worker: collects only while no application thread
 * does. A thread that called progress() since the last look (or is inside
 * it) counts as collecting; the worker then sleeps for a tick. Otherwise it
 * takes the role and sleeps in the ring, and gives the role back after each
 * wake-up so that an application thread can take it. */
void nv_caller_loop(nv_worker *w)
{

	g_mutex_lock(&w->lock);
	nv_arm_wake(w);
	int stuck = flush_sq(w);
	g_mutex_unlock(&w->lock);
	for (;;) {
		bool stop = atomic_load(&w->stop);
		bool called = atomic_exchange(&w->app_called, 0);
		bool apps = !stop && (called || atomic_load(&w->app_waiters) > 0);
		if (apps || !role_try(w, NV_ROLE_WORKER)) {
			lazy_sleep(w, stop ? NV_STUCK_NS : w->ctx->reap_tick_ns);
			continue;
		}
		stuck = collect(w);
		g_mutex_lock(&w->lock);
		bool idle = w->n_free == w->depth && w->head == NULL;
		g_mutex_unlock(&w->lock);
		if (idle && stop) {
			role_release(w);
			break;
		}
		if (cq_pending(w) == 0 && atomic_load(&w->app_waiters) == 0) {
			int rc = ring_wait(w, stuck < 0 ? NV_STUCK_NS : -1);
			if (rc < 0 && rc != -EINTR && rc != -ETIME && rc != -EAGAIN && rc != -EBUSY) {
				log_enter_error(w, rc);
				g_usleep(1000);
			}
			stuck = collect(w);
		}
		role_release(w);
	}
}

void nv_worker_submit(nv_worker *w, te_transfer *newest, te_transfer *oldest, te_transfer *failed)
{
	nv_pass p = { 0 }; /* no room: what cannot go through the ring completes at once */
	te_transfer *list = newest, *rev = NULL;

	/* newest-first chain to oldest-first, before taking the lock */
	while (list != NULL) {
		te_transfer *next = pd_next(list);
		list->plugin_data[NV_PD_NEXT] = (uintptr_t)rev;
		rev = list;
		list = next;
	}
	g_mutex_lock(&w->lock);
	while (failed != NULL) {
		te_transfer *next = pd_next(failed);
		nv_fail_via_ring(w, failed, 1, (int)(intptr_t)failed->plugin_data[NV_PD_ERROR], &p);
		failed = next;
	}
	if (oldest != NULL) {
		if (w->tail != NULL)
			w->tail->plugin_data[NV_PD_NEXT] = (uintptr_t)oldest;
		else
			w->head = oldest;
		w->tail = newest;
	}
	nv_issue(w, &p);
	int rc = flush_sq(w);
	g_mutex_unlock(&w->lock);
	/* Entries the kernel did not take stay queued: whoever collects retries. */
	if (rc < 0)
		nv_kick_worker(w);
}
