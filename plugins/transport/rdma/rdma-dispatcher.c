/* SPDX-License-Identifier: Apache-2.0 */
/* submit() and the dispatcher thread that cuts the queued transfers into
 * slices and routes them; the reclaimer thread for idle endpoints. */
#include <string.h>

#include "rdma.h"
#include "teu-search.h"

/* ------------------------------------------------------------- dispatcher */

static uint64_t mr_start(const void *arr, size_t i)
{
	return (uintptr_t)((rd_mr *const *)arr)[i]->addr;
}

static rd_mr *mr_find(rd_transport *tr, uint64_t addr, uint64_t len)
{
	rd_mr *found = NULL;

	g_rw_lock_reader_lock(&tr->mr_lock);
	size_t n = teu_count_at_or_below(tr->mrs->pdata, tr->mrs->len, mr_start, addr);
	if (n > 0) {
		rd_mr *m = g_ptr_array_index(tr->mrs, n - 1);
		if (teu_span_within(addr, len, (uintptr_t)m->addr, m->length)) {
			found = m;
			atomic_fetch_add(&m->refs, 1);
		}
	}
	g_rw_lock_reader_unlock(&tr->mr_lock);
	return found;
}

static uint64_t rbuf_start(const void *arr, size_t i)
{
	return ((const rd_rbuf *)arr)[i].addr;
}

static const rd_rbuf *rbuf_find(const rd_seg *seg, uint64_t addr, uint64_t len)
{
	size_t n = teu_count_at_or_below(seg->bufs, seg->nbuf, rbuf_start, addr);

	if (n == 0)
		return NULL;
	const rd_rbuf *b = &seg->bufs[n - 1];
	return teu_span_within(addr, len, b->addr, b->length) ? b : NULL;
}

/* Completes `n` slices of a transfer that cannot be cut. */
static void fail_transfer(rd_transport *tr, te_transfer *t, uint32_t n, int error, const char *why)
{
	unsigned more = 0;

	if (error != -ECANCELED && !rd_t_expired(t) && rd_failure_log_allowed(tr, t, &more))
		RD_LOG(tr, TE_LOG_ERROR, "%s of %llu bytes at 0x%llx failed: %s%s",
		       t->opcode == TE_OP_READ ? "READ" : "WRITE", (unsigned long long)t->length,
		       (unsigned long long)t->remote, why, more ? " (more failures not logged)" : "");
	for (uint32_t i = 0; i < n; i++)
		tr->host->complete(tr->host, t, 0, error);
}

typedef struct staged {
	rd_slice *head[RD_MAX_DEV], *tail[RD_MAX_DEV];
} staged;

static void stage_flush(rd_transport *tr, staged *st)
{
	for (int i = 0; i < tr->nctx; i++) {
		if (st->head[i] != NULL)
			rd_ctx_enqueue(tr->ctx[i], st->head[i], st->tail[i], false);
		st->head[i] = st->tail[i] = NULL;
	}
}

/* A free slice; flushes staged work and waits while the pool is empty. */
static rd_slice *pool_get(rd_transport *tr, staged *st)
{
	rd_slice *s = rd_pool_try_get(tr);

	if (s != NULL)
		return s;
	stage_flush(tr, st);
	g_mutex_lock(&tr->pool.lock);
	atomic_fetch_add(&tr->pool_waiters, 1);
	while ((s = rd_pool_try_get(tr)) == NULL && !atomic_load(&tr->stopping))
		g_cond_wait_until(&tr->pool.cond, &tr->pool.lock, g_get_monotonic_time() + 100000);
	atomic_fetch_sub(&tr->pool_waiters, 1);
	g_mutex_unlock(&tr->pool.lock);
	return s;
}

static void dispatch_one(rd_transport *tr, te_transfer *t, staged *st)
{
	rd_seg *seg = t->seg_ctx;
	uint32_t n = t->nr_slices;
	uint64_t slice = tr->cfg.slice_size;
	rd_mr *mr;
	const rd_rbuf *rb;

	if (atomic_load(&tr->stopping)) {
		fail_transfer(tr, t, n, -ECANCELED, "transport shutting down");
		return;
	}
	if (rd_t_expired(t)) {
		fail_transfer(tr, t, n, RD_ENDED_ERR, RD_ENDED_WHY);
		return;
	}
	mr = mr_find(tr, (uintptr_t)t->local, t->length);
	if (mr == NULL) {
		fail_transfer(tr, t, n, TE_ERR_ADDRESS, "the local range is not registered with RDMA");
		return;
	}
	rb = rbuf_find(seg, t->remote, t->length);
	if (rb == NULL || rb->rkey == NULL) {
		char why[160];
		snprintf(why, sizeof why, "segment %s has %s at 0x%llx+%llu", seg->name,
			 rb ? "no rkey (not remote-accessible)" : "no RDMA buffer",
			 (unsigned long long)t->remote, (unsigned long long)t->length);
		fail_transfer(tr, t, n, TE_ERR_ADDRESS, why);
		rd_mr_unref(mr);
		return;
	}
	const rd_loc *lloc = rd_loc_find(tr->topo.locs, tr->topo.nloc, t->local_location);
	const rd_loc *rloc = rd_loc_find(seg->locs, seg->nloc, rb->location);
	uint32_t seq = atomic_fetch_add_explicit(&tr->route_seq, n, memory_order_relaxed);

	for (uint32_t i = 0; i < n; i++) {
		if (tr->host->canceled(tr->host, t) || atomic_load(&tr->stopping) || rd_t_expired(t)) {
			fail_transfer(tr, t, n - i, -ECANCELED, "canceled");
			break;
		}
		rd_slice *s = pool_get(tr, st);
		if (s == NULL) { /* stopping */
			fail_transfer(tr, t, n - i, -ECANCELED, "transport shutting down");
			break;
		}
		uint64_t off = (uint64_t)i * slice;
		atomic_fetch_add_explicit(&mr->refs, 1, memory_order_relaxed);
		s->t = t;
		s->mr = mr;
		s->seg = seg;
		s->local_addr = (uintptr_t)t->local + off;
		s->remote_addr = t->remote + off;
		s->length = (uint32_t)(i + 1 == n ? t->length - off : slice);
		s->opcode = t->opcode;
		s->rkey = rb->rkey;
		s->lloc = lloc;
		s->rloc = rloc;
		s->seq = seq + i;
		int rc = rd_route(tr, s, false);
		if (rc < 0) {
			rd_slice_fail(tr, s, rc,
				   rc == -ENETDOWN ? "every local RDMA device is out of service"
						   : "every path to the peer is paused");
			continue;
		}
		int d = s->ldev;
		if (st->tail[d])
			st->tail[d]->next = s;
		else
			st->head[d] = s;
		st->tail[d] = s;
	}
	rd_mr_unref(mr);
}

gpointer rd_dispatcher_thread(gpointer data)
{
	rd_transport *tr = data;
	staged st = { 0 };

	for (;;) {
		g_mutex_lock(&tr->pend.lock);
		while (tr->pend_head == NULL && !atomic_load(&tr->stopping))
			g_cond_wait(&tr->pend.cond, &tr->pend.lock);
		te_transfer *t = tr->pend_head;
		tr->pend_head = tr->pend_tail = NULL;
		g_mutex_unlock(&tr->pend.lock);
		if (t == NULL)
			break; /* stopping and nothing left */
		unsigned since_flush = 0;
		while (t != NULL) {
			te_transfer *next = (te_transfer *)t->plugin_data[0];
			dispatch_one(tr, t, &st);
			t = next;
			/* Hand work to the NICs early for large batches. */
			if (++since_flush == 16) {
				stage_flush(tr, &st);
				since_flush = 0;
			}
		}
		stage_flush(tr, &st);
	}
	return NULL;
}

void rd_reclaimer_kick(rd_transport *tr)
{
	g_mutex_lock(&tr->reclaim.lock);
	tr->reclaim_kick = true;
	g_cond_signal(&tr->reclaim.cond);
	g_mutex_unlock(&tr->reclaim.lock);
}

/* Closes idle endpoints and watches devices that are out of service. It
 * wakes when a pass is due, not on a fixed tick: every interval while a
 * device is down or an endpoint is being set up or used, at the earliest
 * idle close otherwise, and not at all (until an endpoint comes) when there
 * is none: an idle engine's reclaimer sleeps. */
gpointer rd_reclaimer_thread(gpointer data)
{
	rd_transport *tr = data;
	int64_t interval = (int64_t)MIN(tr->cfg.reclaim_interval_ms, 500);

	if (tr->cfg.ready_grace_ms > 0 && (int64_t)tr->cfg.ready_grace_ms < interval)
		interval = tr->cfg.ready_grace_ms;
	int64_t next = rd_now_ms() + interval;
	g_mutex_lock(&tr->reclaim.lock);
	while (!atomic_load(&tr->stopping)) {
		while (!tr->reclaim_kick && !atomic_load(&tr->stopping)) {
			int64_t left = next == INT64_MAX ? -1 : next - rd_now_ms();
			if (left < 0 && next != INT64_MAX)
				break;
			if (left < 0)
				g_cond_wait(&tr->reclaim.cond, &tr->reclaim.lock);
			else if (!g_cond_wait_until(&tr->reclaim.cond, &tr->reclaim.lock,
						    g_get_monotonic_time() + left * 1000))
				break;
		}
		tr->reclaim_kick = false;
		if (atomic_load(&tr->stopping))
			break;
		g_mutex_unlock(&tr->reclaim.lock);
		int64_t now = rd_now_ms();
		next = INT64_MAX;
		for (int i = 0; i < tr->nctx; i++) {
			rd_ctx_check_port(tr->ctx[i]);
			if (!atomic_load(&tr->ctx[i]->active))
				next = MIN(next, now + interval); /* (its port is polled) */
			next = MIN(next, rd_ep_reclaim(tr->ctx[i], now, interval));
		}
		/* Not sooner than a tenth of the interval: coalesced. */
		if (next != INT64_MAX)
			next = MAX(next, now + interval / 10);
		g_mutex_lock(&tr->reclaim.lock);
	}
	g_mutex_unlock(&tr->reclaim.lock);
	return NULL;
}


/* ---------------------------------------------------------------- submit */

int rd_submit(void *ctx, te_transfer *const *ts, size_t n)
{
	rd_transport *tr = ctx;
	te_transfer *head = NULL, *tail = NULL;
	uint64_t slice = tr->cfg.slice_size;

	for (size_t i = 0; i < n; i++) {
		te_transfer *t = ts[i];
		uint64_t k = (t->length + slice - 1) / slice;
		/* A short tail rides with the slice before it. */
		if (k > 1 && (t->length - (k - 1) * slice) * tr->cfg.fragment_ratio <= slice)
			k--;
		t->plugin_data[0] = 0;
		t->plugin_data[1] = 0;
		t->plugin_data[2] = 0;
		if (t->seg_ctx == NULL || k == 0 || k > UINT32_MAX) {
			t->nr_slices = 1;
			RD_LOG(tr, TE_LOG_ERROR, "submit: transfer of %llu bytes cannot be sliced",
			       (unsigned long long)t->length);
			tr->host->complete(tr->host, t, 0, -EINVAL);
			continue;
		}
		t->nr_slices = (uint32_t)k;
		if (tail)
			tail->plugin_data[0] = (uintptr_t)t;
		else
			head = t;
		tail = t;
	}
	if (head == NULL)
		return 0;
	g_mutex_lock(&tr->pend.lock);
	if (tr->pend_tail)
		tr->pend_tail->plugin_data[0] = (uintptr_t)head;
	else
		tr->pend_head = head;
	tr->pend_tail = tail;
	g_cond_signal(&tr->pend.cond);
	g_mutex_unlock(&tr->pend.lock);
	return 0;
}
