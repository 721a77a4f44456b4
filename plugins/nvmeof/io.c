/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The I/O workers, one io_uring each. A worker cuts transfers into slices,
 * one per slot (the ring's queue depth), resubmits short reads and writes for
 * their remainder, and reports each slice through host->complete(), called
 * without the submission lock held. Two ways to get requests into the ring:
 *
 * - caller submission (default): submit() queues the transfers and turns
 *   what fits into free slots into SQEs, submitting them from the calling
 *   thread, under the worker's lock (held only for that, never across a
 *   wait). No thread hand-off on the way in. Completions are collected by
 *   whichever thread holds the collector role: an application thread waiting
 *   in progress() (te_batch_wait(), and the status calls without sleeping)
 *   takes it and sleeps in io_uring_enter() itself, so a completion wakes the
 *   thread that waits for it and nothing else, the way fio waits. The kernel
 *   runs each request's completion work in the thread that submitted it,
 *   which is then usually that same thread. The worker collects only while
 *   no application thread does: it looks every TE_NVMEOF_REAP_TICK_MS
 *   whether they still do, and otherwise takes the role and sleeps in the
 *   ring as the only collector.
 * - worker submission: the worker is the ring's only submitter and reaper,
 *   so the ring needs no lock. submit() hands transfers over through a
 *   lock-free stack and writes the worker's eventfd only when the worker
 *   sleeps waiting for that much work.
 *
 * Either way the links live in the transfer's plugin_data, so nothing is
 * allocated per request.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nvmeof.h"

#define NV_POLL_TAG (UINT64_MAX - 1) /* liburing keeps UINT64_MAX for itself */
#define NV_WAKE_TAG (UINT64_MAX - 2) /* a no-op posted to wake the collector */
/* A no-op standing for a transfer that ends in error without I/O; the rest
 * of its user_data is the transfer's address (user space: below bit 63). */
#define NV_FAIL_TAG (1ull << 63)
#define NV_MAX_RETRIES 64 /* EAGAIN/EINTR/ECANCELED in a row on one slice */
#define NV_PASS_CQES 32u  /* completions taken from the ring per lock hold */
#define NV_PASS_DONE (2 * NV_PASS_CQES)
#define NV_STUCK_NS 1000000 /* retry interval while the kernel refuses entries */

static inline te_transfer *pd_next(const te_transfer *t)
{
	return (te_transfer *)t->plugin_data[NV_PD_NEXT];
}

/* ------------------------------------------------------------- hand-over */

void nv_worker_push(nv_worker *w, te_transfer *newest, te_transfer *oldest, uint32_t slices)
{
	te_transfer *old = atomic_load_explicit(&w->inbox, memory_order_relaxed);

	do {
		oldest->plugin_data[NV_PD_NEXT] = (uintptr_t)old;
	} while (!atomic_compare_exchange_weak(&w->inbox, &old, newest));
	unsigned q = atomic_fetch_add(&w->queued, slices) + slices;
	/* Pairs with the worker's store of `sleeping` then loads of `inbox` and
	 * `queued`: one of the two sides sees the other's write (all seq_cst). */
	if (q >= atomic_load(&w->want) && atomic_load(&w->sleeping) && atomic_exchange(&w->sleeping, 0)) {
		if (eventfd_write(w->efd, 1) != 0 && errno != EAGAIN)
			w->ctx->host->log(w->ctx->host, TE_LOG_ERROR, "worker %u: wake-up failed: %s",
					  w->index, g_strerror(errno));
	}
}

/* Moves everything pushed so far to the end of the worker's FIFO, oldest first. */
static void take_inbox(nv_worker *w)
{
	te_transfer *list, *rev = NULL, *last;

	/* The count only times wake-ups, so resetting it before the take may
	 * leave it a little off; the inbox itself is exact. */
	atomic_store(&w->queued, 0);
	last = list = atomic_exchange(&w->inbox, NULL);

	if (list == NULL)
		return;
	while (list != NULL) {
		te_transfer *next = pd_next(list);
		list->plugin_data[NV_PD_NEXT] = (uintptr_t)rev;
		rev = list;
		list = next;
	}
	last->plugin_data[NV_PD_NEXT] = 0;
	if (w->tail != NULL)
		w->tail->plugin_data[NV_PD_NEXT] = (uintptr_t)rev;
	else
		w->head = rev;
	w->tail = last;
}

static void fifo_pop(nv_worker *w)
{
	w->head = pd_next(w->head);
	if (w->head == NULL)
		w->tail = NULL;
}

/* ------------------------------------------------------------------ slots */

static bool aligned(const nv_file *f, const char *buf, uint64_t off, uint64_t len)
{
	return (uintptr_t)buf % f->mem_align == 0 && off % f->off_align == 0 && len % f->off_align == 0;
}

static struct io_uring_sqe *get_sqe(nv_worker *w)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);

	/* The ring holds more entries than are ever outstanding, so this is
	 * only a safety net. */
	if (sqe == NULL && io_uring_submit(&w->ring) >= 0)
		sqe = io_uring_get_sqe(&w->ring);
	return sqe;
}

static void arm_wake(nv_worker *w)
{
	struct io_uring_sqe *sqe = get_sqe(w);

	if (sqe == NULL) {
		w->ctx->host->log(w->ctx->host, TE_LOG_ERROR, "worker %u: no submission entry for its wake-up",
				  w->index);
		return;
	}
	io_uring_prep_poll_add(sqe, w->efd, POLLIN);
	io_uring_sqe_set_data64(sqe, NV_POLL_TAG);
}

static void pass_flush(const te_host *h, nv_pass *p)
{
	for (uint32_t i = 0; i < p->n; i++)
		h->complete(h, p->done[i].t, p->done[i].bytes, p->done[i].err);
	p->n = 0;
}

static void pass_add(const te_host *h, nv_pass *p, te_transfer *t, uint64_t bytes, int err)
{
	p->completed++;
	if (p->n < p->cap)
		p->done[p->n++] = (nv_done){ t, bytes, err };
	else
		h->complete(h, t, bytes, err);
}

/* Frees the slot and reports its slice: queued in the pass for a complete()
 * call once the lock is released, or at once when the pass has no room.
 * Touches nothing of the transfer after complete(): that may have been its
 * last slice. */
/* Counts for the file of a slot: a relaxed add in the host, no lock. */
static inline void count(const nv_ctx *c, const nv_file *f, int what, int64_t delta)
{
	if (c->metrics)
		c->host->metric_add(c->host, f->mdev, what, delta);
}

static void slot_finish(nv_worker *w, uint32_t idx, int err, nv_pass *p)
{
	const te_host *h = w->ctx->host;
	nv_slot *sl = &w->slots[idx];
	te_transfer *t = sl->t;
	uint64_t bytes = err ? sl->done : sl->len;

	count(w->ctx, sl->f, TE_METRIC_INFLIGHT_BYTES, -(int64_t)sl->len);
	count(w->ctx, sl->f, TE_METRIC_BYTES, (int64_t)bytes);
	if (err != 0 && err != -ECANCELED)
		count(w->ctx, sl->f, TE_METRIC_ERRORS, 1);

	if (err != 0 && t->plugin_data[NV_PD_ERROR] == 0)
		t->plugin_data[NV_PD_ERROR] = (uintptr_t)(intptr_t)err; /* stop its unissued slices */
	sl->t = NULL;
	w->free_slots[w->n_free++] = idx;
	w->freed++;
	pass_add(h, p, t, bytes, err);
}

/* Caller submission: ends `count` slices of `t` with `err` through the ring
 * (a no-op's completion), so that whoever waits for it is woken like by any
 * other completion; the submitting thread completes nothing itself. */
static void fail_via_ring(nv_worker *w, te_transfer *t, uint32_t count, int err, nv_pass *p)
{
	struct io_uring_sqe *sqe = get_sqe(w);

	if (sqe == NULL) {
		/* never seen: the ring has room for every slot and more */
		for (uint32_t i = 0; i < count; i++)
			pass_add(w->ctx->host, p, t, 0, err);
		return;
	}
	t->plugin_data[NV_PD_ERROR] = (uintptr_t)(intptr_t)err;
	t->plugin_data[NV_PD_CURSOR] = count;
	io_uring_prep_nop(sqe);
	io_uring_sqe_set_data64(sqe, NV_FAIL_TAG | (uint64_t)(uintptr_t)t);
}

static void slot_prep(nv_worker *w, uint32_t idx, nv_pass *p)
{
	nv_slot *sl = &w->slots[idx];
	struct io_uring_sqe *sqe = get_sqe(w);

	if (sqe == NULL) {
		nv_file_log(w->ctx, sl->f, TE_LOG_ERROR, "%s: no io_uring submission entry free", sl->f->path);
		slot_finish(w, idx, -EBUSY, p);
		return;
	}
	int fd = sl->direct ? sl->f->dfd : sl->f->fd;
	int fixed = sl->direct ? sl->f->dfixed : sl->f->fixed;
	if (fixed >= 0)
		fd = fixed; /* the kernel skips looking the descriptor up */
	if (sl->write)
		io_uring_prep_write(sqe, fd, sl->buf + sl->done, sl->len - sl->done, sl->off + sl->done);
	else
		io_uring_prep_read(sqe, fd, sl->buf + sl->done, sl->len - sl->done, sl->off + sl->done);
	if (fixed >= 0)
		sqe->flags |= IOSQE_FIXED_FILE;
	io_uring_sqe_set_data64(sqe, idx);
}

/* Hands slices of the queued transfers to free slots. */
static void issue(nv_worker *w, nv_pass *p)
{
	nv_ctx *c = w->ctx;
	const te_host *h = c->host;

	while (w->head != NULL) {
		te_transfer *t = w->head;
		nv_segment *s = t->seg_ctx;
		uint64_t cur = t->plugin_data[NV_PD_CURSOR];
		size_t fi = t->plugin_data[NV_PD_FILE];
		int err = (int)(intptr_t)t->plugin_data[NV_PD_ERROR];

		if (err == 0 && (atomic_load_explicit(&w->stop, memory_order_relaxed) || h->canceled(h, t)))
			err = -ECANCELED;
		if (err != 0) {
			/* One complete() per slice not yet issued; t may be gone after the last. */
			uint32_t left = nv_count_slices(s, fi, t->remote + cur, t->length - cur, c->slice);
			fifo_pop(w);
			if (c->caller_submit) {
				fail_via_ring(w, t, left, err, p);
				continue;
			}
			p->completed += left;
			for (uint32_t i = 0; i < left; i++)
				h->complete(h, t, 0, err);
			continue;
		}
		if (w->n_free == 0)
			break;

		uint64_t pos = t->remote + cur, end = t->remote + t->length;
		while (pos >= s->files[fi].start + s->files[fi].length)
			fi++;
		nv_file *f = &s->files[fi];
		uint64_t fend = f->start + f->length;
		uint64_t len = (fend < end ? fend : end) - pos;
		if (len > c->slice)
			len = c->slice;

		uint32_t idx = w->free_slots[--w->n_free];
		nv_slot *sl = &w->slots[idx];
		*sl = (nv_slot){
			.t = t,
			.f = f,
			.buf = (char *)t->local + cur,
			.off = pos - f->start,
			.len = (uint32_t)len,
			.write = t->opcode == TE_OP_WRITE,
		};
		sl->direct = f->dfd >= 0 && atomic_load_explicit(&f->direct, memory_order_relaxed) &&
			     aligned(f, sl->buf, sl->off, len);
		cur += len;
		t->plugin_data[NV_PD_CURSOR] = cur;
		t->plugin_data[NV_PD_FILE] = fi;
		if (cur == t->length)
			fifo_pop(w);
		count(c, f, TE_METRIC_INFLIGHT_BYTES, (int64_t)len);
		slot_prep(w, idx, p);
	}
}

static uint64_t current_size(const nv_file *f)
{
	struct stat st;

	if (!f->blockdev && fstat(f->fd, &st) == 0)
		return (uint64_t)st.st_size;
	return f->size;
}

static void on_cqe(nv_worker *w, uint64_t tag, int res, nv_pass *p)
{
	nv_ctx *c = w->ctx;

	if (tag == NV_WAKE_TAG)
		return; /* its only job was to wake whoever slept in the ring */
	if (tag == NV_POLL_TAG) {
		eventfd_t v;
		if (res < 0 && res != -ECANCELED && res != -EINTR)
			c->host->log(c->host, TE_LOG_ERROR, "worker %u: waiting on its eventfd failed: %s",
				     w->index, g_strerror(-res));
		if (eventfd_read(w->efd, &v) != 0 && errno != EAGAIN)
			c->host->log(c->host, TE_LOG_ERROR, "worker %u: eventfd: %s", w->index, g_strerror(errno));
		arm_wake(w);
		return;
	}
	if (tag & NV_FAIL_TAG) {
		te_transfer *t = (te_transfer *)(uintptr_t)(tag & ~NV_FAIL_TAG);
		int err = (int)(intptr_t)t->plugin_data[NV_PD_ERROR];
		uint64_t left = t->plugin_data[NV_PD_CURSOR];
		/* t may be gone after its last complete() */
		for (uint64_t i = 0; i < left; i++)
			pass_add(c->host, p, t, 0, err);
		return;
	}
	if (tag >= w->depth || w->slots[tag].t == NULL) {
		c->host->log(c->host, TE_LOG_ERROR, "worker %u: completion for unknown slot %llu", w->index,
			     (unsigned long long)tag);
		return;
	}
	uint32_t idx = (uint32_t)tag;
	nv_slot *sl = &w->slots[idx];
	nv_file *f = sl->f;
	const char *op = sl->write ? "write" : "read";

	if (res > 0) {
		sl->done += (uint32_t)res;
		sl->retries = 0;
		if (sl->done >= sl->len) {
			slot_finish(w, idx, 0, p);
			return;
		}
		/* Short: resubmit the rest, buffered if it is no longer aligned. */
		if (sl->direct && !aligned(f, sl->buf + sl->done, sl->off + sl->done, sl->len - sl->done))
			sl->direct = false;
		slot_prep(w, idx, p);
		return;
	}
	if (res == 0) {
		if (!sl->write) {
			nv_file_log(c, f, TE_LOG_ERROR,
				    "read past the end of %s: %u bytes wanted at offset %llu, the file holds "
				    "%llu bytes (its descriptor declares %llu)",
				    f->path, sl->len - sl->done, (unsigned long long)(sl->off + sl->done),
				    (unsigned long long)current_size(f), (unsigned long long)f->length);
			slot_finish(w, idx, -ENODATA, p);
		} else {
			nv_file_log(c, f, TE_LOG_ERROR, "write to %s at offset %llu made no progress", f->path,
				    (unsigned long long)(sl->off + sl->done));
			slot_finish(w, idx, -EIO, p);
		}
		return;
	}
	/* The plugin never cancels an I/O in the kernel: ECANCELED means the
	 * thread that submitted it exited (caller submission) and the kernel
	 * dropped its queued work, so it is submitted again. */
	if ((res == -EAGAIN || res == -EINTR || res == -ECANCELED) && ++sl->retries <= NV_MAX_RETRIES) {
		count(c, f, TE_METRIC_RETRIES, 1);
		slot_prep(w, idx, p);
		return;
	}
	if (sl->direct && (res == -EINVAL || res == -EOPNOTSUPP)) {
		/* Some file systems accept O_DIRECT at open and refuse it per I/O. */
		if (atomic_exchange(&f->direct, 0))
			c->host->log(c->host, TE_LOG_WARN, "%s: direct I/O refused (%s); buffered I/O from now on",
				     f->path, g_strerror(-res));
		sl->direct = false;
		slot_prep(w, idx, p);
		return;
	}
	nv_file_log(c, f, TE_LOG_ERROR, "%s of %u bytes at offset %llu of %s failed: %s", op,
		    sl->len - sl->done, (unsigned long long)(sl->off + sl->done), f->path, g_strerror(-res));
	slot_finish(w, idx, res, p);
}

/* Handles up to `max` completions from the ring; returns how many. */
static unsigned reap(nv_worker *w, nv_pass *p, unsigned max)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;

	io_uring_for_each_cqe(&w->ring, head, cqe)
	{
		if (n == max)
			break;
		on_cqe(w, cqe->user_data, cqe->res, p);
		n++;
	}
	io_uring_cq_advance(&w->ring, n);
	return n;
}

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

	arm_wake(w);
	for (;;) {
		take_inbox(w);
		issue(w, &p);
		pass_flush(h, &p); /* slices that found no SQE, canceled ones */
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
			n = reap(w, &p, NV_PASS_CQES);
			pass_flush(h, &p);
		} while (n == NV_PASS_CQES);
	}
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
	g_mutex_lock(&w->cv_lock);
	g_cond_broadcast(&w->cv);
	g_mutex_unlock(&w->cv_lock);
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
		n = reap(w, &p, NV_PASS_CQES);
		issue(w, &p);
		rc = flush_sq(w);
		g_mutex_unlock(&w->lock);
		completed += p.completed;
		p.completed = 0;
		pass_flush(h, &p);
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

	g_mutex_lock(&w->cv_lock);
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
			g_cond_wait(&w->cv, &w->cv_lock);
			continue;
		}
		int64_t left = end - now_ns();
		if (left <= 0) {
			rc = -ETIMEDOUT;
			break;
		}
		g_cond_wait_until(&w->cv, &w->cv_lock, g_get_monotonic_time() + left / 1000 + 1);
	}
	atomic_fetch_sub(&w->secondaries, 1);
	g_mutex_unlock(&w->cv_lock);
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
	struct io_uring_sqe *sqe = get_sqe(w);
	if (sqe != NULL) {
		io_uring_prep_nop(sqe);
		io_uring_sqe_set_data64(sqe, NV_WAKE_TAG);
	}
	int rc = flush_sq(w);
	g_mutex_unlock(&w->lock);
	if ((sqe == NULL || rc < 0) && eventfd_write(w->efd, 1) != 0 && errno != EAGAIN)
		w->ctx->host->log(w->ctx->host, TE_LOG_ERROR, "worker %u: wake-up failed: %s", w->index,
				  g_strerror(errno));
	/* The others wait aside. */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load(&w->secondaries) > 0)
		wake_secondaries(w);
}

/* Wakes the worker wherever it sleeps: in the ring (through the eventfd's
 * poll) or between its looks at the application threads. */
static void kick_worker(nv_worker *w)
{
	g_mutex_lock(&w->lazy_lock);
	w->lazy_kick = true;
	g_cond_signal(&w->lazy_cond);
	g_mutex_unlock(&w->lazy_lock);
	if (eventfd_write(w->efd, 1) != 0 && errno != EAGAIN)
		w->ctx->host->log(w->ctx->host, TE_LOG_ERROR, "worker %u: wake-up failed: %s", w->index,
				  g_strerror(errno));
}

static void lazy_sleep(nv_worker *w, int64_t ns)
{
	g_mutex_lock(&w->lazy_lock);
	if (!w->lazy_kick)
		g_cond_wait_until(&w->lazy_cond, &w->lazy_lock, g_get_monotonic_time() + ns / 1000);
	w->lazy_kick = false;
	g_mutex_unlock(&w->lazy_lock);
}

/* Caller submission, the worker: collects only while no application thread
 * does. A thread that called progress() since the last look (or is inside
 * it) counts as collecting; the worker then sleeps for a tick. Otherwise it
 * takes the role and sleeps in the ring, and gives the role back after each
 * wake-up so that an application thread can take it. */
static void caller_loop(nv_worker *w)
{

	g_mutex_lock(&w->lock);
	arm_wake(w);
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
		fail_via_ring(w, failed, 1, (int)(intptr_t)failed->plugin_data[NV_PD_ERROR], &p);
		failed = next;
	}
	if (oldest != NULL) {
		if (w->tail != NULL)
			w->tail->plugin_data[NV_PD_NEXT] = (uintptr_t)oldest;
		else
			w->head = oldest;
		w->tail = newest;
	}
	issue(w, &p);
	int rc = flush_sq(w);
	g_mutex_unlock(&w->lock);
	/* Entries the kernel did not take stay queued: whoever collects retries. */
	if (rc < 0)
		kick_worker(w);
}

static gpointer worker_main(gpointer data)
{
	nv_worker *w = data;
	int rc = ring_setup(w);

	g_mutex_lock(&w->start_lock);
	w->start_rc = rc;
	w->started = true;
	g_cond_signal(&w->start_cond);
	g_mutex_unlock(&w->start_lock);
	if (rc < 0)
		return NULL;
	if (w->ctx->caller_submit)
		caller_loop(w);
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
	g_mutex_clear(&w->cv_lock);
	g_cond_clear(&w->cv);
	g_mutex_clear(&w->lazy_lock);
	g_cond_clear(&w->lazy_cond);
	g_mutex_clear(&w->start_lock);
	g_cond_clear(&w->start_cond);
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
	g_mutex_init(&w->cv_lock);
	g_cond_init(&w->cv);
	g_mutex_init(&w->lazy_lock);
	g_cond_init(&w->lazy_cond);
	g_mutex_init(&w->start_lock);
	g_cond_init(&w->start_cond);
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
	g_mutex_lock(&w->start_lock);
	while (!w->started)
		g_cond_wait(&w->start_cond, &w->start_lock);
	int rc = w->start_rc;
	g_mutex_unlock(&w->start_lock);
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
	kick_worker(w);
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
