/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Slices: the fixed pool they come from, how one completes or fails, and
 * routing: the (local NIC, peer NIC) path a slice takes, again after a
 * failure, with failing paths paused.
 */
#include "rdma.h"

/* ------------------------------------------------------------ slice pool */

/* The free list is a stack of indices + 1 with a 32-bit ABA tag on top, so
 * taking and returning a slice is one compare-and-swap. A waiting dispatcher
 * also wakes up every 100 ms, so a missed signal costs latency, not a hang. */
void rd_pool_put(rd_transport *tr, rd_slice *s)
{
	uint32_t idx = s->index;
	uint64_t top = atomic_load_explicit(&tr->free_top, memory_order_relaxed), nt;

	do {
		atomic_store_explicit(&tr->free_next[idx], (uint32_t)top, memory_order_relaxed);
		nt = ((top >> 32) + 1) << 32 | (uint64_t)(idx + 1);
	} while (!atomic_compare_exchange_weak_explicit(&tr->free_top, &top, nt, memory_order_release,
							memory_order_relaxed));
	if (atomic_load(&tr->pool_waiters) > 0) {
		g_mutex_lock(&tr->pool.lock);
		g_cond_signal(&tr->pool.cond);
		g_mutex_unlock(&tr->pool.lock);
	}
}

rd_slice *rd_pool_try_get(rd_transport *tr)
{
	uint64_t top = atomic_load_explicit(&tr->free_top, memory_order_acquire), nt;

	for (;;) {
		uint32_t idx1 = (uint32_t)top;
		if (idx1 == 0)
			return NULL;
		uint32_t next = atomic_load_explicit(&tr->free_next[idx1 - 1], memory_order_relaxed);
		nt = ((top >> 32) + 1) << 32 | next;
		if (atomic_compare_exchange_weak_explicit(&tr->free_top, &top, nt, memory_order_acquire,
							  memory_order_acquire)) {
			rd_slice *s = &tr->slices[idx1 - 1];
			uint32_t index = s->index;
			memset(s, 0, sizeof *s);
			s->index = index;
			s->ldev = s->rdev = -1;
			return s;
		}
	}
}

static void slice_free(rd_transport *tr, rd_slice *s)
{
	if (s->mr != NULL)
		rd_mr_unref(s->mr);
	s->mr = NULL;
	s->t = NULL;
	rd_pool_put(tr, s);
}

/* ------------------------------------------------------------ completion */

/* Whether to log a transfer's failure: its first failed slice only, and at
 * most RD_FAIL_LOGS_PER_SEC lines a second (the rest are counted and
 * reported with the next line), so a failed batch of thousands does not
 * flood the log. */
#define RD_FAIL_LOGS_PER_SEC 10

bool rd_failure_log_allowed(rd_transport *tr, te_transfer *t, unsigned *suppressed)
{
	if (__atomic_exchange_n(&t->plugin_data[1], (uintptr_t)1, __ATOMIC_RELAXED) != 0)
		return false;
	int64_t sec = rd_now_ms() / 1000;
	bool ok;
	g_mutex_lock(&tr->stats.lock);
	if (sec != tr->fail_log_sec) {
		tr->fail_log_sec = sec;
		tr->fail_log_count = 0;
	}
	ok = tr->fail_log_count++ < RD_FAIL_LOGS_PER_SEC;
	if (ok) {
		*suppressed = tr->fail_log_suppressed;
		tr->fail_log_suppressed = 0;
	} else {
		tr->fail_log_suppressed++;
	}
	g_mutex_unlock(&tr->stats.lock);
	return ok;
}

/* Completes a slice with an error, logging the first failure of a transfer. */
void rd_slice_fail(rd_transport *tr, rd_slice *s, int error, const char *why)
{
	te_transfer *t = s->t;
	unsigned more = 0;

	/* A transfer the host ended was reported there already. */
	if (error != -ECANCELED && !rd_t_expired(t) && rd_failure_log_allowed(tr, t, &more)) {
		char tries[48] = "";
		if (s->attempts > 0)
			snprintf(tries, sizeof tries, " after %u attempt%s", s->attempts,
				 s->attempts == 1 ? "" : "s");
		RD_LOG(tr, TE_LOG_ERROR, "%s of %llu bytes %s %s failed: slice at offset %llu%s: %s (%s)%s",
		       t->opcode == TE_OP_READ ? "READ" : "WRITE", (unsigned long long)t->length,
		       t->opcode == TE_OP_READ ? "from" : "to", s->seg ? s->seg->name : "?",
		       (unsigned long long)(s->local_addr - (uintptr_t)t->local), tries, why,
		       rd_strerror(error), more ? " (more failures not logged)" : "");
	}
	tr->host->complete(tr->host, t, 0, error);
	slice_free(tr, s);
}

void rd_slice_done(rd_transport *tr, rd_slice *s)
{
	rd_seg *seg = s->seg;
	size_t idx = (size_t)s->ldev * (size_t)seg->ndev + (size_t)s->rdev;

	if (atomic_load_explicit(&seg->pair_fail[idx], memory_order_relaxed) != 0)
		atomic_store_explicit(&seg->pair_fail[idx], 0, memory_order_relaxed);
	atomic_fetch_add_explicit(&tr->ctx[s->ldev]->slices_done, 1, memory_order_relaxed);
	tr->host->complete(tr->host, s->t, s->length, 0);
	slice_free(tr, s);
}

/* ----------------------------------------------------------------- routing */

/* The NICs of a location in the order tried: preferred ones rotated by
 * `seq`, then the others rotated; an unknown location uses every NIC. */
static int candidates(const rd_loc *loc, int ndev, uint32_t seq, int *out)
{
	int n = 0;

	if (loc == NULL || loc->npref + loc->navail == 0) {
		for (int i = 0; i < ndev; i++)
			out[n++] = (int)((seq + (uint32_t)i) % (uint32_t)ndev);
		return n;
	}
	for (int i = 0; i < loc->npref; i++)
		out[n++] = loc->pref[(seq + (uint32_t)i) % (uint32_t)loc->npref];
	for (int i = 0; i < loc->navail; i++)
		out[n++] = loc->avail[(seq + (uint32_t)i) % (uint32_t)loc->navail];
	return n;
}

static uint64_t path_bit(const rd_slice *s, int l, int r)
{
	return 1ull << (((unsigned)l * (unsigned)s->seg->ndev + (unsigned)r) % 64);
}

/* Whether local NIC `l` may send to remote NIC `r` now: the pair is not
 * paused, and (`untried`) this slice has not tried it. */
static bool pair_usable(const rd_slice *s, int l, int r, bool untried, int64_t *now)
{
	size_t idx = (size_t)l * (size_t)s->seg->ndev + (size_t)r;
	int64_t until = atomic_load_explicit(&s->seg->pause_until[idx], memory_order_relaxed);

	if (until != 0) {
		if (*now == 0)
			*now = rd_now_ms();
		if (until > *now)
			return false;
	}
	return !(untried && (s->tried & path_bit(s, l, r)));
}

/* The remote candidate named like local NIC `l`, or -1. */
static int same_name(const rd_transport *tr, const rd_seg *seg, int l, const int *rc, int nr)
{
	for (int ri = 0; ri < nr; ri++)
		if (strcmp(seg->devs[rc[ri]].name, tr->ctx[l]->name) == 0)
			return rc[ri];
	return -1;
}

/* Picks a path for `s`: a pair not tried yet first; with `allow_tried` one
 * already tried. Paused pairs and NICs out of service are skipped.
 * 0, -ENETDOWN (no local NIC in service) or -EHOSTUNREACH (none left). */
int rd_route(rd_transport *tr, rd_slice *s, bool allow_tried)
{
	int lc[RD_MAX_DEV], rc[RD_MAX_DEV];
	int nl = candidates(s->lloc, tr->nctx, s->seq, lc);
	int nr = candidates(s->rloc, s->seg->ndev, s->seq, rc);
	int64_t now = 0;
	bool any_local = false;

	for (int pass = 0; pass < (allow_tried ? 2 : 1); pass++) {
		for (int li = 0; li < nl; li++) {
			int l = lc[li];
			if (!atomic_load_explicit(&tr->ctx[l]->active, memory_order_relaxed))
				continue;
			any_local = true;
			/* Rail-optimised fabrics: the remote NIC of the same name first,
			 * when it is a candidate at all (fewer QPs, one rail). */
			int same = tr->cfg.dest_affinity ? same_name(tr, s->seg, l, rc, nr) : -1;
			if (same >= 0 && pair_usable(s, l, same, pass == 0, &now)) {
				s->ldev = (int16_t)l;
				s->rdev = (int16_t)same;
				return 0;
			}
			for (int ri = 0; ri < nr; ri++) {
				if (rc[ri] == same || !pair_usable(s, l, rc[ri], pass == 0, &now))
					continue;
				s->ldev = (int16_t)l;
				s->rdev = (int16_t)rc[ri];
				return 0;
			}
		}
	}
	return any_local ? -EHOSTUNREACH : -ENETDOWN;
}

static void pause_pair(rd_transport *tr, rd_slice *s)
{
	rd_seg *seg = s->seg;
	size_t idx = (size_t)s->ldev * (size_t)seg->ndev + (size_t)s->rdev;
	int64_t now = rd_now_ms();

	/* Slices in flight when it was paused fail too: not new evidence. */
	if (atomic_load(&seg->pause_until[idx]) > now)
		return;
	unsigned n = atomic_fetch_add(&seg->pair_fail[idx], 1) + 1;
	if (n < tr->cfg.pair_fail_threshold || tr->cfg.pair_pause_ms == 0)
		return;
	int64_t until = atomic_load(&seg->pause_until[idx]);
	if (until > now || !atomic_compare_exchange_strong(&seg->pause_until[idx], &until,
							   now + (int64_t)tr->cfg.pair_pause_ms))
		return; /* another thread paused it */
	atomic_store(&seg->pair_fail[idx], 0);
	atomic_fetch_add(&tr->stats.pauses, 1);
	RD_LOG(tr, TE_LOG_WARN, "path %s -> %s paused for %llu ms after %u failures in a row",
	       tr->ctx[s->ldev]->nic_path, seg->devs[s->rdev].nic_path,
	       (unsigned long long)tr->cfg.pair_pause_ms, n);
}

/* Errors that say the path is bad (count towards pausing the pair). */
static bool path_error(int error)
{
	return error == -EHOSTUNREACH || error == -ECONNREFUSED || error == -ETIMEDOUT ||
	       error == TE_ERR_REJECTED || error == TE_ERR_PROTOCOL || error == -EIO;
}

/* What a slice that has no path left fails with. A refused or garbled
 * handshake on every path (the peer's NICs out of service, a QP count that
 * differs) is no path to the peer, -ENETUNREACH: to libte TE_ERR_REJECTED
 * would say the peer refused the range (it fetches the descriptor again),
 * and a path error lets it move the task to another transport (TCP). The
 * reasons are logged where each handshake failed. */
static int no_path_error(const rd_slice *s, int rc, int error)
{
	/* A flush or a replaced endpoint (-ECONNRESET) says nothing of the
	 * path: with no attempt of its own on record the slice fails for what
	 * routing found (no path left). */
	int err = rc == -ENETDOWN ? -ENETDOWN
		  : s->last_error ? s->last_error
		  : error == -ECONNRESET ? rc
					 : error;
	return err == TE_ERR_REJECTED || err == TE_ERR_PROTOCOL ? -ENETUNREACH : err;
}

/* `count`: the failure is the path's (an attempt, and evidence against the
 * pair); not when the slice was flushed for another transfer's sake. */
static void slice_retry(rd_transport *tr, rd_slice *s, int error, const char *why, bool count)
{
	te_transfer *t = s->t;

	if (s->ep != NULL) {
		rd_ep_unref(s->ep);
		s->ep = NULL;
	}
	if (atomic_load(&tr->stopping)) {
		rd_slice_fail(tr, s, -ECANCELED, "transport shutting down");
		return;
	}
	if (rd_t_expired(t)) {
		rd_slice_fail(tr, s, RD_ENDED_ERR, RD_ENDED_WHY);
		return;
	}
	if (tr->host->canceled(tr->host, t)) {
		rd_slice_fail(tr, s, -ECANCELED, "batch canceled");
		return;
	}
	if (!count) {
		int rc = rd_route(tr, s, true);
		if (rc < 0) {
			rd_slice_fail(tr, s, no_path_error(s, rc, error),
				      "no path left after its endpoint was closed");
			return;
		}
		rd_ctx_enqueue(tr->ctx[s->ldev], s, s, false);
		return;
	}
	if (s->ldev >= 0) {
		s->tried |= path_bit(s, s->ldev, s->rdev);
		s->attempts++;
		if (error != -ENETDOWN && error != -ECONNRESET)
			s->last_error = error;
		if (path_error(error))
			pause_pair(tr, s);
	}
	atomic_fetch_add(&tr->stats.retries, 1);
	int from = s->ldev;
	int rc = rd_route(tr, s, s->attempts <= tr->cfg.retry_cnt);
	/* Sent again: a fail-over of the NIC it left when it goes by another. */
	if (rc >= 0 && from >= 0)
		RD_COUNT(tr, tr->ctx[from], s->ldev != from ? TE_METRIC_FAILOVERS : TE_METRIC_RETRIES, 1);
	if (rc < 0) {
		rd_slice_fail(tr, s, no_path_error(s, rc, error),
			   rc == -ENETDOWN ? "every local RDMA device is out of service"
					   : "every path failed, is paused, or retries are exhausted");
		return;
	}
	RD_LOG(tr, TE_LOG_DEBUG, "slice retried on %s -> %s after: %s", tr->ctx[s->ldev]->nic_path,
	       s->seg->devs[s->rdev].nic_path, why);
	rd_ctx_enqueue(tr->ctx[s->ldev], s, s, false);
}

void rd_slice_retry(rd_transport *tr, rd_slice *s, int error, const char *why)
{
	slice_retry(tr, s, error, why, true);
}

void rd_slice_resend(rd_transport *tr, rd_slice *s, const char *why)
{
	slice_retry(tr, s, -ECONNRESET, why, false);
}
