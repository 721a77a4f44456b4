/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The I/O workers' threads: each one's io_uring (set up in the thread, with
 * the best flags the kernel takes), the worker-submission loop, start and
 * stop, and the rings' registered file tables.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "nvmeof.h"

/* ------------------------------------------- worker submission (its loop) */

static int ring_setup(nv_worker *w)
{
	/* Best first. Worker submission: completions run only when the worker
	 * asks (6.1+), as fio sets its rings up. Caller submission has several
	 * submitting threads, each running its own requests' completion work,
	 * and any thread may have to collect them: the kernel runs that work when
	 * the submitter enters the kernel or sleeps (it wakes a sleeping one),
	 * without an interrupt to a running one (5.19+), and flags it in the ring
	 * so that a caller can enter to run it; else the plain ring. */
	static const unsigned worker_sets[] = {
		IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
		IORING_SETUP_COOP_TASKRUN,
		0,
	};
	static const unsigned caller_sets[] = {
		IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG,
		0,
	};
	const unsigned *flag_sets = w->ctx->caller_submit ? caller_sets : worker_sets;
	size_t n_sets = w->ctx->caller_submit ? sizeof caller_sets / sizeof *caller_sets
					      : sizeof worker_sets / sizeof *worker_sets;
	int rc = -EINVAL;

	for (size_t i = 0; i < n_sets; i++) {
		struct io_uring_params p;
		memset(&p, 0, sizeof p);
		p.flags = flag_sets[i];
		/* a slot per slice, one for the eventfd poll, one for a wake-up
		 * no-op, one for the timeout liburing queues on kernels without
		 * IORING_FEAT_EXT_ARG */
		rc = io_uring_queue_init_params(w->depth + 3, &w->ring, &p);
		if (rc != -EINVAL)
			break;
	}
	if (rc == 0)
		w->ext_arg = (w->ring.features & IORING_FEAT_EXT_ARG) != 0;
	if (rc == 0 && w->ctx->n_fixed > 0) {
		int frc = io_uring_register_files_sparse(&w->ring, w->ctx->n_fixed);
		if (frc < 0) {
			w->ctx->host->log(w->ctx->host, TE_LOG_INFO,
					  "worker %u: no registered file table (%s); requests name descriptors",
					  w->index, g_strerror(-frc));
			w->fixed_failed = true;
		}
	}
	return rc;
}

/* Worker submission: the worker is the ring's only user. */
static void worker_loop(nv_worker *w)
{
	const te_host *h = w->ctx->host;
	nv_done done[NV_PASS_DONE];
	nv_pass p = { .done = done, .cap = NV_PASS_DONE };
	unsigned enter_errors = 0;
	int rc;

	nv_arm_wake(w);
	for (;;) {
		nv_take_inbox(w);
		nv_issue(w, &p);
		nv_pass_flush(h, &p); /* slices that found no SQE, canceled ones */
		if (w->n_free == w->depth && w->head == NULL && atomic_load(&w->stop) &&
		    atomic_load(&w->inbox) == NULL)
			break;
		bool block = true, timed = false;
		if (w->n_free > 0) {
			/* Completions just freed `freed` slots: their owners are likely
			 * to refill them at once. Gather those requests into one
			 * submission (one doorbell for the device) for at most the
			 * coalescing window; I/O still in flight wakes us anyway. When
			 * idle, the first request wakes us. */
			unsigned want = 1;
			if (w->freed > 1 && w->n_free < w->depth && w->ctx->coalesce_ns > 0) {
				want = w->freed < w->n_free ? w->freed : w->n_free;
				timed = true;
			}
			atomic_store(&w->want, want);
			atomic_store(&w->sleeping, 1);
			if (atomic_load(&w->inbox) != NULL && atomic_load(&w->queued) >= want)
				block = false;
		}
		w->freed = 0;
		if (!block) {
			rc = io_uring_submit_and_get_events(&w->ring);
		} else if (timed) {
			struct io_uring_cqe *cqe;
			struct __kernel_timespec ts = { .tv_sec = 0, .tv_nsec = (long long)w->ctx->coalesce_ns };
			rc = io_uring_submit_and_wait_timeout(&w->ring, &cqe, 1, &ts, NULL);
			if (rc == -ETIME)
				rc = 0;
		} else {
			rc = io_uring_submit_and_wait(&w->ring, 1);
		}
		atomic_store(&w->sleeping, 0);
		if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
			if (enter_errors++ % NV_LOG_EVERY == 0)
				h->log(h, TE_LOG_ERROR, "worker %u: io_uring_enter failed: %s", w->index,
				       g_strerror(-rc));
			g_usleep(1000); /* do not spin on a persistent failure */
		}
		unsigned n;
		do {
			n = nv_reap(w, &p, NV_PASS_CQES);
			nv_pass_flush(h, &p);
		} while (n == NV_PASS_CQES);
	}
}

static gpointer worker_main(gpointer data)
{
	nv_worker *w = data;
	int rc = ring_setup(w);

	g_mutex_lock(&w->start.lock);
	w->start_rc = rc;
	w->started = true;
	g_cond_signal(&w->start.cond);
	g_mutex_unlock(&w->start.lock);
	if (rc < 0)
		return NULL;
	if (w->ctx->caller_submit)
		nv_caller_loop(w);
	else
		worker_loop(w);
	io_uring_queue_exit(&w->ring);
	return NULL;
}

static void worker_free(nv_worker *w)
{
	if (w->efd >= 0)
		close(w->efd);
	w->efd = -1;
	g_free(w->slots);
	g_free(w->free_slots);
	w->slots = NULL;
	w->free_slots = NULL;
	g_mutex_clear(&w->lock);
	teu_mon_clear(&w->cv);
	teu_mon_clear(&w->lazy);
	teu_mon_clear(&w->start);
}

static int worker_start(nv_ctx *c, nv_worker *w, unsigned index)
{
	GError *err = NULL;
	char name[32];

	w->ctx = c;
	w->index = index;
	w->depth = c->depth;
	w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	g_mutex_init(&w->lock);
	teu_mon_init(&w->cv);
	teu_mon_init(&w->lazy);
	teu_mon_init(&w->start);
	if (w->efd < 0) {
		int e = errno;
		c->host->log(c->host, TE_LOG_ERROR, "eventfd: %s", g_strerror(e));
		worker_free(w);
		return -e;
	}
	w->slots = g_new0(nv_slot, w->depth);
	w->free_slots = g_new(uint32_t, w->depth);
	for (uint32_t i = 0; i < w->depth; i++)
		w->free_slots[i] = w->depth - 1 - i;
	w->n_free = w->depth;

	snprintf(name, sizeof name, "te-nvmeof-%u", index);
	w->thread = g_thread_try_new(name, worker_main, w, &err);
	if (w->thread == NULL) {
		c->host->log(c->host, TE_LOG_ERROR, "cannot start an I/O thread: %s", err->message);
		g_error_free(err);
		worker_free(w);
		return -EAGAIN;
	}
	g_mutex_lock(&w->start.lock);
	while (!w->started)
		g_cond_wait(&w->start.cond, &w->start.lock);
	int rc = w->start_rc;
	g_mutex_unlock(&w->start.lock);
	if (rc < 0) {
		g_thread_join(w->thread);
		w->thread = NULL;
		c->host->log(c->host, TE_LOG_ERROR,
			     "io_uring setup with %u entries failed: %s (is io_uring disabled by "
			     "kernel.io_uring_disabled or a seccomp filter?)",
			     w->depth + 3, g_strerror(-rc));
		worker_free(w);
		return rc;
	}
	return 0;
}

static void worker_stop(nv_worker *w)
{
	if (w->thread == NULL)
		return;
	atomic_store(&w->stop, 1);
	nv_kick_worker(w);
	g_thread_join(w->thread);
	w->thread = NULL;
	worker_free(w);
}

int nv_workers_start(nv_ctx *c)
{
	/* A single-issuer ring takes registrations from its worker only. */
	if (!c->caller_submit)
		c->n_fixed = 0;
	c->workers = g_new0(nv_worker, c->n_workers);
	for (unsigned i = 0; i < c->n_workers; i++) {
		int rc = worker_start(c, &c->workers[i], i);
		if (rc < 0) {
			for (unsigned j = 0; j < i; j++)
				worker_stop(&c->workers[j]);
			g_free(c->workers);
			c->workers = NULL;
			return rc;
		}
	}
	for (unsigned i = 0; i < c->n_workers; i++)
		if (c->workers[i].fixed_failed)
			c->n_fixed = 0;
	g_mutex_init(&c->fixed_lock);
	c->fixed_free = g_new(uint32_t, c->n_fixed ? c->n_fixed : 1);
	for (uint32_t i = 0; i < c->n_fixed; i++)
		c->fixed_free[i] = c->n_fixed - 1 - i;
	c->n_fixed_free = c->n_fixed;
	return 0;
}

void nv_workers_stop(nv_ctx *c)
{
	if (c->workers == NULL)
		return;
	for (unsigned i = 0; i < c->n_workers; i++)
		worker_stop(&c->workers[i]);
	g_free(c->workers);
	c->workers = NULL;
	g_free(c->fixed_free);
	c->fixed_free = NULL;
	g_mutex_clear(&c->fixed_lock);
}

/* Puts `fd` at `idx` of the first `n` rings' tables (-1 empties it). */
static int fixed_set(nv_ctx *c, uint32_t idx, int fd, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		int rc = io_uring_register_files_update(&c->workers[i].ring, idx, &fd, 1);
		if (rc != 1)
			return rc < 0 ? rc : -EIO;
	}
	return 0;
}

int nv_fixed_add(nv_ctx *c, int fd)
{
	if (c->n_fixed == 0 || fd < 0)
		return -1;
	g_mutex_lock(&c->fixed_lock);
	if (c->n_fixed_free == 0) {
		g_mutex_unlock(&c->fixed_lock);
		return -1; /* the descriptor itself serves as well, a little slower */
	}
	uint32_t idx = c->fixed_free[--c->n_fixed_free];
	g_mutex_unlock(&c->fixed_lock);
	int rc = fixed_set(c, idx, fd, c->n_workers);
	if (rc < 0) {
		c->host->log(c->host, TE_LOG_INFO, "registering a file with the rings failed: %s",
			     g_strerror(-rc));
		fixed_set(c, idx, -1, c->n_workers);
		nv_fixed_remove(c, -1 - (int)idx);
		return -1;
	}
	return (int)idx;
}

/* idx < -1 stands for table entry -1 - idx, already empty in the rings. */
void nv_fixed_remove(nv_ctx *c, int idx)
{
	if (idx == -1)
		return;
	uint32_t slot = idx >= 0 ? (uint32_t)idx : (uint32_t)(-1 - idx);
	if (idx >= 0) {
		int rc = fixed_set(c, slot, -1, c->n_workers);
		if (rc < 0) {
			/* the entry keeps its file: leave it out of the free list */
			c->host->log(c->host, TE_LOG_WARN, "unregistering a file from the rings failed: %s",
				     g_strerror(-rc));
			return;
		}
	}
	g_mutex_lock(&c->fixed_lock);
	c->fixed_free[c->n_fixed_free++] = slot;
	g_mutex_unlock(&c->fixed_lock);
}

int nv_uring_probe(char *why, size_t why_len)
{
	struct io_uring ring;
	int rc = io_uring_queue_init(2, &ring, 0);

	if (rc < 0) {
		if (why != NULL && why_len > 0)
			snprintf(why, why_len, "io_uring unavailable: %s (kernel.io_uring_disabled, a "
					       "seccomp filter or an old kernel)",
				 g_strerror(-rc));
		return rc;
	}
	io_uring_queue_exit(&ring);
	return 0;
}
