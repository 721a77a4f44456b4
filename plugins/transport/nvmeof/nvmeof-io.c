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
 *
 * This file: the hand-over, the slots, slices becoming SQEs and their
 * completions. nvmeof-worker.c runs the threads and worker submission, nvmeof-caller.c
 * caller submission and the collector role.
 */
#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>

#include "nvmeof.h"

#define NV_POLL_TAG (UINT64_MAX - 1) /* liburing keeps UINT64_MAX for itself */
/* A no-op standing for a transfer that ends in error without I/O; the rest
 * of its user_data is the transfer's address (user space: below bit 63). */
#define NV_FAIL_TAG (1ull << 63)
#define NV_MAX_RETRIES 64 /* EAGAIN/EINTR/ECANCELED in a row on one slice */

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
	if (q >= atomic_load(&w->want) && atomic_load(&w->sleeping) && atomic_exchange(&w->sleeping, 0))
		nv_efd_wake(w);
}

void nv_efd_wake(nv_worker *w)
{
	/* EAGAIN: the counter is full, so the worker has a wake-up pending. */
	if (eventfd_write(w->efd, 1) != 0 && errno != EAGAIN)
		w->ctx->host->log(w->ctx->host, TE_LOG_ERROR, "worker %u: wake-up failed: %s", w->index,
				  g_strerror(errno));
}

/* Moves everything pushed so far to the end of the worker's FIFO, oldest first. */
void nv_take_inbox(nv_worker *w)
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

struct io_uring_sqe *nv_get_sqe(nv_worker *w)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);

	/* The ring holds more entries than are ever outstanding, so this is
	 * only a safety net. */
	if (sqe == NULL && io_uring_submit(&w->ring) >= 0)
		sqe = io_uring_get_sqe(&w->ring);
	return sqe;
}

void nv_arm_wake(nv_worker *w)
{
	struct io_uring_sqe *sqe = nv_get_sqe(w);

	if (sqe == NULL) {
		w->ctx->host->log(w->ctx->host, TE_LOG_ERROR, "worker %u: no submission entry for its wake-up",
				  w->index);
		return;
	}
	io_uring_prep_poll_add(sqe, w->efd, POLLIN);
	io_uring_sqe_set_data64(sqe, NV_POLL_TAG);
}

void nv_pass_flush(const te_host *h, nv_pass *p)
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
void nv_fail_via_ring(nv_worker *w, te_transfer *t, uint32_t count, int err, nv_pass *p)
{
	struct io_uring_sqe *sqe = nv_get_sqe(w);

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
	struct io_uring_sqe *sqe = nv_get_sqe(w);

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
void nv_issue(nv_worker *w, nv_pass *p)
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
				nv_fail_via_ring(w, t, left, err, p);
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
		nv_arm_wake(w);
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
unsigned nv_reap(nv_worker *w, nv_pass *p, unsigned max)
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
