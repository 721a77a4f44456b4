/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The I/O workers, one io_uring each. A worker cuts transfers into slices,
 * one per slot (the ring's queue depth), resubmits short reads and writes for
 * their remainder, and reports each slice through host->complete(), called
 * without any lock held. Two ways to get requests into the ring:
 *
 * - caller submission (default): submit() queues the transfers and turns
 *   what fits into free slots into SQEs, submitting them from the calling
 *   thread, under the worker's lock (held only for that, never across a
 *   wait). The worker only reaps, refills the slots its completions free
 *   from the queue under the same lock, and sleeps in io_uring_enter() for
 *   completions. No thread hand-off on the way in.
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
#include <unistd.h>

#include "nvmeof.h"

#define NV_POLL_TAG (UINT64_MAX - 1) /* liburing keeps UINT64_MAX for itself */
#define NV_MAX_RETRIES 64 /* EAGAIN/EINTR/ECANCELED in a row on one slice */

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

/* Frees the slot and reports its slice: at once, or (`defer`, the worker)
 * into w->done for a complete() call once the lock is released. Touches
 * nothing of the transfer after complete(): that may have been its last
 * slice. */
static void slot_finish(nv_worker *w, uint32_t idx, int err, bool defer)
{
	const te_host *h = w->ctx->host;
	nv_slot *sl = &w->slots[idx];
	te_transfer *t = sl->t;
	uint64_t bytes = err ? sl->done : sl->len;

	if (err != 0 && t->plugin_data[NV_PD_ERROR] == 0)
		t->plugin_data[NV_PD_ERROR] = (uintptr_t)(intptr_t)err; /* stop its unissued slices */
	sl->t = NULL;
	w->free_slots[w->n_free++] = idx;
	w->freed++;
	if (defer)
		w->done[w->n_done++] = (nv_done){ t, bytes, err };
	else
		h->complete(h, t, bytes, err);
}

static void flush_done(nv_worker *w)
{
	const te_host *h = w->ctx->host;

	for (uint32_t i = 0; i < w->n_done; i++)
		h->complete(h, w->done[i].t, w->done[i].bytes, w->done[i].err);
	w->n_done = 0;
}

static void slot_prep(nv_worker *w, uint32_t idx, bool defer)
{
	nv_slot *sl = &w->slots[idx];
	struct io_uring_sqe *sqe = get_sqe(w);

	if (sqe == NULL) {
		nv_file_log(w->ctx, sl->f, TE_LOG_ERROR, "%s: no io_uring submission entry free", sl->f->path);
		slot_finish(w, idx, -EBUSY, defer);
		return;
	}
	int fd = sl->direct ? sl->f->dfd : sl->f->fd;
	if (sl->write)
		io_uring_prep_write(sqe, fd, sl->buf + sl->done, sl->len - sl->done, sl->off + sl->done);
	else
		io_uring_prep_read(sqe, fd, sl->buf + sl->done, sl->len - sl->done, sl->off + sl->done);
	io_uring_sqe_set_data64(sqe, idx);
}

/* Hands slices of the queued transfers to free slots. `defer`: running on
 * the worker (see slot_finish). */
static void issue(nv_worker *w, bool defer)
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
		slot_prep(w, idx, defer);
	}
}

static uint64_t current_size(const nv_file *f)
{
	struct stat st;

	if (!f->blockdev && fstat(f->fd, &st) == 0)
		return (uint64_t)st.st_size;
	return f->size;
}

static void on_cqe(nv_worker *w, uint64_t tag, int res)
{
	nv_ctx *c = w->ctx;

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
			slot_finish(w, idx, 0, true);
			return;
		}
		/* Short: resubmit the rest, buffered if it is no longer aligned. */
		if (sl->direct && !aligned(f, sl->buf + sl->done, sl->off + sl->done, sl->len - sl->done))
			sl->direct = false;
		slot_prep(w, idx, true);
		return;
	}
	if (res == 0) {
		if (!sl->write) {
			nv_file_log(c, f, TE_LOG_ERROR,
				    "read past the end of %s: %u bytes wanted at offset %llu, the file holds "
				    "%llu bytes (its descriptor declares %llu)",
				    f->path, sl->len - sl->done, (unsigned long long)(sl->off + sl->done),
				    (unsigned long long)current_size(f), (unsigned long long)f->length);
			slot_finish(w, idx, -ENODATA, true);
		} else {
			nv_file_log(c, f, TE_LOG_ERROR, "write to %s at offset %llu made no progress", f->path,
				    (unsigned long long)(sl->off + sl->done));
			slot_finish(w, idx, -EIO, true);
		}
		return;
	}
	/* The plugin never cancels an I/O in the kernel: ECANCELED means the
	 * thread that submitted it exited (caller submission) and the kernel
	 * dropped its queued work, so the worker submits it again. */
	if ((res == -EAGAIN || res == -EINTR || res == -ECANCELED) && ++sl->retries <= NV_MAX_RETRIES) {
		slot_prep(w, idx, true);
		return;
	}
	if (sl->direct && (res == -EINVAL || res == -EOPNOTSUPP)) {
		/* Some file systems accept O_DIRECT at open and refuse it per I/O. */
		if (atomic_exchange(&f->direct, 0))
			c->host->log(c->host, TE_LOG_WARN, "%s: direct I/O refused (%s); buffered I/O from now on",
				     f->path, g_strerror(-res));
		sl->direct = false;
		slot_prep(w, idx, true);
		return;
	}
	nv_file_log(c, f, TE_LOG_ERROR, "%s of %u bytes at offset %llu of %s failed: %s", op,
		    sl->len - sl->done, (unsigned long long)(sl->off + sl->done), f->path, g_strerror(-res));
	slot_finish(w, idx, res, true);
}

static void reap(nv_worker *w)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;

	io_uring_for_each_cqe(&w->ring, head, cqe)
	{
		on_cqe(w, cqe->user_data, cqe->res);
		n++;
	}
	io_uring_cq_advance(&w->ring, n);
}

/* ----------------------------------------------------------------- thread */

static int ring_setup(nv_worker *w)
{
	/* Best first: completions run only when this thread asks (6.1+), then
	 * without interrupting the thread (5.19+), then the plain ring. With
	 * caller submission the submitting threads run their requests'
	 * completion work, and they must be interrupted for it while the worker
	 * waits: the plain ring only. */
	static const unsigned flag_sets[] = {
#if defined(IORING_SETUP_SINGLE_ISSUER) && defined(IORING_SETUP_DEFER_TASKRUN)
		IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
#endif
#ifdef IORING_SETUP_COOP_TASKRUN
		IORING_SETUP_COOP_TASKRUN,
#endif
		0,
	};
	size_t first = w->ctx->caller_submit ? sizeof flag_sets / sizeof *flag_sets - 1 : 0;
	int rc = -EINVAL;

	for (size_t i = first; i < sizeof flag_sets / sizeof *flag_sets; i++) {
		struct io_uring_params p;
		memset(&p, 0, sizeof p);
		p.flags = flag_sets[i];
		/* a slot per slice, one for the eventfd poll, one for the timeout
		 * liburing queues on kernels without IORING_FEAT_EXT_ARG */
		rc = io_uring_queue_init_params(w->depth + 2, &w->ring, &p);
		if (rc != -EINVAL)
			break;
	}
	return rc;
}

/* Worker submission: the worker is the ring's only user. */
static void worker_loop(nv_worker *w)
{
	const te_host *h = w->ctx->host;
	unsigned enter_errors = 0;
	int rc;

	arm_wake(w);
	for (;;) {
		take_inbox(w);
		issue(w, true);
		flush_done(w); /* slices that found no SQE */
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
		reap(w);
		flush_done(w);
	}
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

/* Caller submission: submitters and the worker share the submission side
 * under w->lock; the worker alone reaps, and waits for completions with a
 * bare io_uring_enter(GETEVENTS), which leaves the submission queue alone. */
static void caller_loop(nv_worker *w)
{
	const te_host *h = w->ctx->host;
	unsigned enter_errors = 0;

	g_mutex_lock(&w->lock);
	arm_wake(w);
	int rc = flush_sq(w);
	g_mutex_unlock(&w->lock);
	for (;;) {
		if (rc == 0 && io_uring_cq_ready(&w->ring) == 0) {
			rc = io_uring_enter(w->ring.ring_fd, 0, 1, IORING_ENTER_GETEVENTS, NULL);
			if (rc == -EINTR)
				rc = 0;
		}
		if (rc < 0) {
			/* Entries left queued, or a failed wait: pause rather than spin,
			 * then retry. */
			if (rc != -EAGAIN && rc != -EBUSY && enter_errors++ % NV_LOG_EVERY == 0)
				h->log(h, TE_LOG_ERROR, "worker %u: io_uring_enter failed: %s", w->index,
				       g_strerror(-rc));
			g_usleep(1000);
		}
		g_mutex_lock(&w->lock);
		reap(w);
		issue(w, true);
		rc = flush_sq(w);
		bool idle = w->n_free == w->depth && w->head == NULL;
		g_mutex_unlock(&w->lock);
		flush_done(w);
		if (idle && atomic_load(&w->stop))
			break;
	}
}

void nv_worker_submit(nv_worker *w, te_transfer *newest, te_transfer *oldest)
{
	te_transfer *list = newest, *rev = NULL;

	/* newest-first chain to oldest-first, before taking the lock */
	while (list != NULL) {
		te_transfer *next = pd_next(list);
		list->plugin_data[NV_PD_NEXT] = (uintptr_t)rev;
		rev = list;
		list = next;
	}
	g_mutex_lock(&w->lock);
	if (w->tail != NULL)
		w->tail->plugin_data[NV_PD_NEXT] = (uintptr_t)oldest;
	else
		w->head = oldest;
	w->tail = newest;
	issue(w, false);
	int rc = flush_sq(w);
	g_mutex_unlock(&w->lock);
	/* Entries the kernel did not take stay queued: the worker retries them. */
	if (rc < 0 && eventfd_write(w->efd, 1) != 0 && errno != EAGAIN)
		w->ctx->host->log(w->ctx->host, TE_LOG_ERROR, "worker %u: wake-up failed: %s", w->index,
				  g_strerror(errno));
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
	g_free(w->done);
	w->slots = NULL;
	w->free_slots = NULL;
	w->done = NULL;
	g_mutex_clear(&w->lock);
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
	/* a pass frees at most every slot, and every refill of them may fail */
	w->done = g_new(nv_done, 2 * (size_t)w->depth);
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
			     w->depth + 2, g_strerror(-rc));
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
	if (eventfd_write(w->efd, 1) != 0 && errno != EAGAIN)
		w->ctx->host->log(w->ctx->host, TE_LOG_ERROR, "worker %u: wake-up failed: %s", w->index,
				  g_strerror(errno));
	g_thread_join(w->thread);
	w->thread = NULL;
	worker_free(w);
}

int nv_workers_start(nv_ctx *c)
{
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
