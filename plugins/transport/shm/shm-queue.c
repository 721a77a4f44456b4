/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Who copies a submit, and when: small submits are copied by the
 * submitting thread; larger ones are split into slices in a queue that the
 * copy workers and the callers waiting in progress() both draw from (see
 * "the queue"), with the kick timer for work left to a caller that did not
 * come. The copies themselves: shm-copy.c.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>

#include "shm.h"

/* te_transfer.plugin_data while queued for the workers */
#define Q_NEXT 0  /* next transfer in the queue */
#define Q_CLAIM 1 /* bytes handed to workers so far */

/* ------------------------------------------------------------ the queue */

/* Submits too large to copy in the submitting thread wait in one queue. The
 * copy workers draw from it, and so does a thread waiting for its batch in
 * progress() (te_batch_wait()): it copies queued pieces itself instead of
 * sleeping until a worker did, and completes them in its own thread, so
 * that no hand-off stands between the copy and the caller. Workers still
 * take whatever nobody waits for (submits of callers that poll, or never
 * wait). */

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Takes work from the queue (q_lock held): one slice of the head transfer,
 * or up to SHM_RUN_MAX small whole transfers of one segment and opcode (a
 * cross-memory attach call, or a device batch, per SHM_CMA_IOV of them) up
 * to a slice's bytes, so that a batch of 1 MiB requests spreads over the
 * copying threads rather than filling one, and a batch of many small ones
 * costs one take per slice of bytes rather than one per request. */
static unsigned take(shm_ctx *c, shm_piece *ps)
{
	uint64_t bytes = 0;
	unsigned n = 0;

	while (c->q_head != NULL && n < SHM_RUN_MAX) {
		te_transfer *t = c->q_head;
		uint64_t claim = t->plugin_data[Q_CLAIM];
		uint64_t len = t->length - claim < c->cfg.slice ? t->length - claim : c->cfg.slice;
		if (n > 0 && (claim != 0 || len != t->length || t->seg_ctx != ps[0].t->seg_ctx ||
			      t->opcode != ps[0].t->opcode || bytes + len > c->cfg.slice))
			break;
		bytes += len;
		ps[n++] = (shm_piece){ t, claim, len };
		t->plugin_data[Q_CLAIM] = claim + len;
		if (claim + len == t->length) {
			c->q_head = (te_transfer *)t->plugin_data[Q_NEXT];
			if (c->q_head == NULL)
				c->q_tail = NULL;
		}
		if (len != t->length)
			break; /* a slice of a large transfer: alone */
	}
	if (c->q_head == NULL) {
		atomic_store_explicit(&c->q_any, false, memory_order_relaxed);
		atomic_store_explicit(&c->q_lazy, false, memory_order_relaxed);
	}
	if (n > 0)
		atomic_fetch_add_explicit(&c->copiers, 1, memory_order_relaxed);
	return n;
}

/* After a worker's completions: wake the callers asleep in progress() so
 * that they look at their batches again (the host wakes them only for a
 * batch that drained; this covers the plugin's own completions, as the ABI
 * asks). The fence pairs with the one in progress(): either the sleeper saw
 * the completion before it slept, or we see its count here. */
static void wake_sleepers(shm_ctx *c)
{
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&c->p_sleepers, memory_order_relaxed) == 0)
		return;
	pthread_mutex_lock(&c->q_lock);
	pthread_cond_broadcast(&c->p_cond);
	pthread_mutex_unlock(&c->q_lock);
}

void shm_wake(shm_ctx *c)
{
	wake_sleepers(c);
}

/* Queued work no worker was told of: tell them now (the kick timer, or a
 * status poll: the caller expected to copy it did not come). */
void shm_kick(shm_ctx *c)
{
	pthread_mutex_lock(&c->q_lock);
	c->kick_armed = false;
	atomic_store_explicit(&c->q_lazy, false, memory_order_relaxed);
	if (c->q_head != NULL)
		pthread_cond_signal(&c->q_cond); /* a worker wakes the next if there is more */
	pthread_mutex_unlock(&c->q_lock);
}

/* Sleeps on p_cond until the queue holds work, done(arg), or `end` (ns,
 * CLOCK_MONOTONIC; INT64_MAX: no limit): 1, 0 or -ETIMEDOUT. */
/* Whether a waiting caller copies queued work now (q_lock held, or a
 * look without it): work left for waiting callers is theirs; other work
 * only while fewer threads than there are workers copy, since a copier
 * more than there are CPUs for them slows every copy. */
static bool may_take(shm_ctx *c)
{
	return c->q_head != NULL && (atomic_load_explicit(&c->q_lazy, memory_order_relaxed) ||
				     atomic_load_explicit(&c->copiers, memory_order_relaxed) < c->nworkers);
}

/* The same without the lock (q_any stands for q_head). */
static bool may_take_look(shm_ctx *c)
{
	return atomic_load_explicit(&c->q_any, memory_order_relaxed) &&
	       (atomic_load_explicit(&c->q_lazy, memory_order_relaxed) ||
		atomic_load_explicit(&c->copiers, memory_order_relaxed) < c->nworkers);
}

static int sleep_until(shm_ctx *c, int (*done)(void *), void *arg, int64_t end)
{
	int rc = 1;

	pthread_mutex_lock(&c->q_lock);
	atomic_fetch_add_explicit(&c->p_sleepers, 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_seq_cst); /* the count before the look at done() */
	while (!may_take(c)) {
		if (done(arg)) {
			rc = 0;
			break;
		}
		if (end == INT64_MAX) {
			pthread_cond_wait(&c->p_cond, &c->q_lock);
			continue;
		}
		if (now_ns() >= end) {
			rc = -ETIMEDOUT;
			break;
		}
		struct timespec ts = { .tv_sec = end / 1000000000, .tv_nsec = end % 1000000000 };
		int err = pthread_cond_timedwait(&c->p_cond, &c->q_lock, &ts);
		if (err != 0 && err != ETIMEDOUT && err != EINTR) {
			rc = -err; /* the host then waits its usual way */
			break;
		}
	}
	atomic_fetch_sub_explicit(&c->p_sleepers, 1, memory_order_relaxed);
	pthread_mutex_unlock(&c->q_lock);
	return rc;
}

int shm_progress(shm_ctx *c, int (*done)(void *), void *arg, int64_t timeout_ns)
{
	shm_piece ps[SHM_RUN_MAX];

	/* A status read: the workers copy what nobody waits for, so a look
	 * stays a look (a copy here would make a poll cost a slice's copy). A
	 * poller is no waiter: what was left for it goes to the workers. */
	if (timeout_ns == 0 || done == NULL) {
		if (atomic_load_explicit(&c->q_lazy, memory_order_relaxed))
			shm_kick(c);
		return done == NULL || done(arg) ? 0 : -ETIMEDOUT;
	}
	if (pthread_getspecific(c->waiter_key) == NULL)
		(void)pthread_setspecific(c->waiter_key, c); /* (ENOMEM: treated as no waiter) */
	if (pthread_getspecific(c->streak_key) != NULL)
		(void)pthread_setspecific(c->streak_key, NULL);
	int64_t t0 = now_ns();
	int64_t end = timeout_ns < 0 || timeout_ns >= INT64_MAX - t0 ? INT64_MAX : t0 + timeout_ns;
	for (;;) {
		if (done(arg))
			return 0;
		/* Queued work, ours or not: copy it here rather than wait for a
		 * worker to (may_take() says when). Pieces are at most a slice,
		 * so done() and the deadline are looked at again soon. */
		if (may_take_look(c)) {
			pthread_mutex_lock(&c->q_lock);
			unsigned n = may_take(c) ? take(c, ps) : 0;
			pthread_mutex_unlock(&c->q_lock);
			if (n > 0) {
				shm_run_all(c, ps, n);
				atomic_fetch_sub_explicit(&c->copiers, 1, memory_order_relaxed);
				/* Pieces of other callers' batches too: they may be
				 * asleep here, and the host wakes nobody for
				 * completions made inside this transport's progress(). */
				wake_sleepers(c);
				if (end != INT64_MAX && now_ns() >= end)
					return done(arg) ? 0 : -ETIMEDOUT;
				continue;
			}
		}
		/* Nothing queued: a worker copies what is left of the batch (or
		 * another transport does). Look for it a while before sleeping
		 * (TE_SPIN_US): a futex wake-up costs more than a short copy. */
		if (c->cfg.spin_ns > 0) {
			int64_t t1 = now_ns(), stop = t1 + c->cfg.spin_ns < end ? t1 + c->cfg.spin_ns : end;
			bool again = false;
			for (int64_t t = t1; t < stop; t = now_ns()) {
				if (done(arg))
					return 0;
				if (may_take_look(c)) {
					again = true;
					break;
				}
				/* Yield, not just pause: the worker copying our
				 * piece may be waiting for this very core. */
				sched_yield();
			}
			if (again)
				continue;
		}
		int rc = sleep_until(c, done, arg, end);
		if (rc != 1)
			return rc;
	}
}

/* -------------------------------------------------------------- workers */

static void *worker_main(void *arg)
{
	shm_ctx *c = arg;
	shm_piece ps[SHM_RUN_MAX];

	for (;;) {
		pthread_mutex_lock(&c->q_lock);
		while (c->q_head == NULL && !c->q_stop)
			pthread_cond_wait(&c->q_cond, &c->q_lock);
		if (c->q_head == NULL) {
			pthread_mutex_unlock(&c->q_lock);
			return NULL;
		}
		unsigned n = take(c, ps);
		/* More for another worker, unless as many threads as there are
		 * workers copy already (a waiting caller counts): more would
		 * only share the CPUs. */
		if (c->q_head != NULL && atomic_load_explicit(&c->copiers, memory_order_relaxed) < c->nworkers)
			pthread_cond_signal(&c->q_cond);
		pthread_mutex_unlock(&c->q_lock);
		shm_run_all(c, ps, n);
		atomic_fetch_sub_explicit(&c->copiers, 1, memory_order_relaxed);
		wake_sleepers(c);
	}
}

int shm_workers_start(shm_ctx *c)
{
	c->workers = calloc(c->cfg.threads, sizeof *c->workers);
	if (c->workers == NULL)
		return -ENOMEM;
	for (unsigned i = 0; i < c->cfg.threads; i++) {
		if (pthread_create(&c->workers[i], NULL, worker_main, c) != 0) {
			shm_workers_stop(c);
			return -EAGAIN;
		}
		c->nworkers++;
	}
	return 0;
}

void shm_workers_stop(shm_ctx *c)
{
	/* Workers drain the queue before they leave: every transfer completes. */
	pthread_mutex_lock(&c->q_lock);
	c->q_stop = true;
	pthread_cond_broadcast(&c->q_cond);
	pthread_mutex_unlock(&c->q_lock);
	for (unsigned i = 0; i < c->nworkers; i++)
		pthread_join(c->workers[i], NULL);
	c->nworkers = 0;
	free(c->workers);
	c->workers = NULL;
	/* With no worker (none could start), fail what is left. Detached under
	 * the lock: the kick timer's thread still looks at the queue. */
	pthread_mutex_lock(&c->q_lock);
	te_transfer *left = c->q_head;
	c->q_head = c->q_tail = NULL;
	atomic_store_explicit(&c->q_any, false, memory_order_relaxed);
	pthread_mutex_unlock(&c->q_lock);
	for (te_transfer *t = left; t != NULL;) {
		te_transfer *next = (te_transfer *)t->plugin_data[Q_NEXT];
		uint64_t claim = t->plugin_data[Q_CLAIM];
		while (claim < t->length) {
			uint64_t len = t->length - claim < c->cfg.slice ? t->length - claim : c->cfg.slice;
			claim += len;
			c->host->complete(c->host, t, 0, -ECANCELED);
		}
		t = next;
	}
}

/* A thread's streak: the KiB it copied in its own submits (20 bits) and
 * when the last of them ended (µs, the 44 bits above). */
#define STREAK_KIB_MAX ((1u << 20) - 1)
#define STREAK_GAP_US 50
/* Submits of fewer transfers are not chunks of a large one and stay out of
 * streaks (a loop of single requests pays no clock reads for them). */
#define STREAK_MIN_TRANSFERS 16

static uint64_t streak_make(int64_t now_us, uint64_t kib)
{
	return (uint64_t)now_us << 20 | (kib < STREAK_KIB_MAX ? kib : STREAK_KIB_MAX);
}

/* Whether a submit of `total` bytes (at most inline_bytes) is copied by the
 * submitting thread. The host hands a large te_submit() over in chunks of
 * a few dozen transfers: a KV cache's thousands of 4 KiB blocks arrive as
 * chunks of 256 KiB, each small, and copied one after the other in the
 * caller they left the copy workers idle (a large request is shared by
 * them and the waiting caller). Chunks (of STREAK_MIN_TRANSFERS or more)
 * that follow each other within STREAK_GAP_US count together: past
 * inline_bytes they are queued, to be shared. A wait in progress() ends the
 * streak. */
static bool inline_ok(shm_ctx *c, uint64_t total, uint64_t *streak)
{
	uint64_t v = (uint64_t)(uintptr_t)pthread_getspecific(c->streak_key);
	int64_t now_us = now_ns() / 1000;
	uint64_t kib = v & STREAK_KIB_MAX;

	if (v == 0 || now_us - (int64_t)(v >> 20) > STREAK_GAP_US)
		kib = 0;
	kib += (total + 1023) >> 10;
	(void)pthread_setspecific(c->streak_key, (void *)(uintptr_t)streak_make(now_us, kib));
	*streak = kib << 10;
	return kib <= c->cfg.inline_bytes >> 10;
}

/* The end of an inline submit's copies: the streak goes on from now. */
static void streak_touch(shm_ctx *c)
{
	uint64_t v = (uint64_t)(uintptr_t)pthread_getspecific(c->streak_key);

	if (v != 0)
		(void)pthread_setspecific(c->streak_key,
					  (void *)(uintptr_t)streak_make(now_ns() / 1000, v & STREAK_KIB_MAX));
}

int shm_submit(shm_ctx *c, te_transfer *const *ts, size_t n)
{
	uint64_t total = 0, streak = 0;

	for (size_t i = 0; i < n; i++)
		total += ts[i]->length;
	if (total <= c->cfg.inline_bytes && (n < STREAK_MIN_TRANSFERS || inline_ok(c, total, &streak))) {
		/* Small: copying here costs less than waking a worker. */
		shm_piece ps[SHM_CMA_IOV];
		size_t i = 0;
		while (i < n) {
			unsigned k = 0;
			for (; i < n && k < SHM_CMA_IOV; i++)
				ps[k++] = (shm_piece){ ts[i], 0, ts[i]->length };
			shm_run_all(c, ps, k);
		}
		if (n >= STREAK_MIN_TRANSFERS)
			streak_touch(c);
		return 0;
	}
	/* A thread that waited for its last queued submit in progress() will
	 * most likely wait for this one too and copy it there: waking a worker
	 * for it would cost a futex wake-up, and on a busy machine the worker
	 * takes the caller's CPU or its copy. Up to caller_bytes that caller
	 * copies alone; should it not come, the kick timer tells the workers
	 * (and a status poll does at once). Larger submits are shared. */
	bool waiter = pthread_getspecific(c->waiter_key) != NULL;
	/* A streak's first submit past inline_bytes too: small batches one
	 * after the other (each done at once, so their waits never reach
	 * progress()) are copied by their caller's next wait, which ends the
	 * streak. A streak that goes on past twice inline_bytes is one large
	 * submit: its copies are shared at once. */
	bool lazy = (waiter && total <= c->cfg.caller_bytes) ||
		    (streak > 0 && streak <= 2 * c->cfg.inline_bytes && streak <= c->cfg.caller_bytes);
	if (waiter)
		(void)pthread_setspecific(c->waiter_key, NULL);
	for (size_t i = 0; i < n; i++) {
		te_transfer *t = ts[i];
		t->nr_slices = (uint32_t)((t->length + c->cfg.slice - 1) / c->cfg.slice);
		t->plugin_data[Q_NEXT] = 0;
		t->plugin_data[Q_CLAIM] = 0;
	}
	pthread_mutex_lock(&c->q_lock);
	for (size_t i = 0; i < n; i++) {
		if (c->q_tail != NULL)
			c->q_tail->plugin_data[Q_NEXT] = (uintptr_t)ts[i];
		else
			c->q_head = ts[i];
		c->q_tail = ts[i];
	}
	atomic_store_explicit(&c->q_any, true, memory_order_relaxed);
	bool arm = false;
	if (!lazy) {
		pthread_cond_signal(&c->q_cond);
	} else {
		atomic_store_explicit(&c->q_lazy, true, memory_order_relaxed);
		arm = !c->kick_armed;
		c->kick_armed = true;
	}
	/* Callers asleep in progress() help with it. */
	if (atomic_load_explicit(&c->p_sleepers, memory_order_relaxed) > 0)
		pthread_cond_broadcast(&c->p_cond);
	pthread_mutex_unlock(&c->q_lock);
	if (arm) {
		struct itimerspec its = { .it_value = { 0, SHM_KICK_NS } };
		if (timerfd_settime(c->kick_fd, 0, &its, NULL) < 0) {
			SLOG(c, TE_LOG_DEBUG, "shm: kick timer: %s", strerror(errno));
			pthread_mutex_lock(&c->q_lock);
			c->kick_armed = false;
			pthread_cond_signal(&c->q_cond); /* no timer: tell them now */
			pthread_mutex_unlock(&c->q_lock);
		}
	}
	return 0;
}
