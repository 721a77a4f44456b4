/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The RDMA transport plugin: options, memory registration, remote segments,
 * the data path and its fault handling, and the plugin's ops table.
 *
 * Data path. submit() only computes each transfer's slice count and queues
 * it (no allocation, one lock per call). A dispatcher thread cuts transfers
 * into slices taken from a fixed pool and routes each slice to a
 * (local NIC, peer NIC) path chosen from the priority matrices of both
 * buffers' locations; the slices queue per local NIC. Each NIC's workers
 * resolve endpoints, post RDMA READ/WRITE work requests and poll the NIC's
 * completion queues, reporting each slice to the host. Idle workers sleep on
 * the completion channels, never spin.
 *
 * Faults. A failed slice is routed again, to a path it has not tried first;
 * untried paths are always tried, then up to TE_RDMA_RETRY_CNT attempts in
 * all. A NIC pair that fails repeatedly is paused; a NIC whose port is down
 * is out of service until it is up again. A slice fails only when no usable
 * path is left.
 */
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "rdma-internal.h"

#define STOP_DRAIN_MS 10000
#define RD_SPIN_BUSY 64 /* idle polls before sleeping while requests are in flight */

int64_t rd_now_ms(void)
{
	return g_get_monotonic_time() / 1000;
}

/* --------------------------------------------------------------- options */

static unsigned cfg_u(const te_host *h, const char *te, const char *mc, unsigned def, unsigned lo,
		      unsigned hi)
{
	return (unsigned)te_host_config_u64(h, te, mc, def, lo, hi);
}

/* A switch: 1/true/yes/on or 0/false/no/off (any case); `def` when unset,
 * and with a warning when it is something else. */
static bool cfg_bool(const te_host *h, const char *te, const char *mc, bool def)
{
	const char *s = h->config(h, te, mc);
	static const char *const on[] = { "1", "true", "yes", "on" }, *const off[] = { "0", "false", "no", "off" };

	if (s == NULL || *s == '\0')
		return def;
	for (size_t i = 0; i < G_N_ELEMENTS(on); i++) {
		if (g_ascii_strcasecmp(s, on[i]) == 0)
			return true;
		if (g_ascii_strcasecmp(s, off[i]) == 0)
			return false;
	}
	h->log(h, TE_LOG_WARN, "%s=%s is not a switch (1/0, true/false, yes/no, on/off); using %d", te, s, def);
	return def;
}

static void read_config(const te_host *h, rd_config *c)
{
	const char *s;

	c->num_cq_per_ctx = cfg_u(h, "TE_RDMA_NUM_CQ_PER_CTX", "MC_NUM_CQ_PER_CTX", 1, 1, 64);
	c->num_comp_channels =
		cfg_u(h, "TE_RDMA_NUM_COMP_CHANNELS_PER_CTX", "MC_NUM_COMP_CHANNELS_PER_CTX", 1, 1, 64);
	c->ib_port = cfg_u(h, "TE_RDMA_IB_PORT", "MC_IB_PORT", 1, 1, 255);
	c->gid_index = -1;
	s = h->config(h, "TE_RDMA_GID_INDEX", "MC_GID_INDEX");
	if (s != NULL && *s != '\0')
		c->gid_index = (int)te_host_config_u64(h, "TE_RDMA_GID_INDEX", "MC_GID_INDEX", 0, 0, 255);
	c->max_cqe = cfg_u(h, "TE_RDMA_MAX_CQE_PER_CTX", "MC_MAX_CQE_PER_CTX", 4096, 16, 1u << 22);
	c->max_ep_per_ctx = cfg_u(h, "TE_RDMA_MAX_EP_PER_CTX", "MC_MAX_EP_PER_CTX", 65536, 1, 65536);
	c->num_qp_per_ep = cfg_u(h, "TE_RDMA_NUM_QP_PER_EP", "MC_NUM_QP_PER_EP", 2, 1, 64);
	c->max_sge = cfg_u(h, "TE_RDMA_MAX_SGE", "MC_MAX_SGE", 4, 1, 64);
	c->max_wr = cfg_u(h, "TE_RDMA_MAX_WR", "MC_MAX_WR", 256, 1, 1u << 16);
	c->max_inline = cfg_u(h, "TE_RDMA_MAX_INLINE", "MC_MAX_INLINE", 64, 0, 4096);
	c->mtu = cfg_u(h, "TE_RDMA_MTU", "MC_MTU", 4096, 256, 4096);
	if (c->mtu != 256 && c->mtu != 512 && c->mtu != 1024 && c->mtu != 2048 && c->mtu != 4096) {
		h->log(h, TE_LOG_WARN, "TE_RDMA_MTU=%u is not 256, 512, 1024, 2048 or 4096; using 4096",
		       c->mtu);
		c->mtu = 4096;
	}
	c->workers_per_ctx = cfg_u(h, "TE_RDMA_WORKERS_PER_CTX", "MC_WORKERS_PER_CTX", 2, 1, 64);
	c->slice_size = te_host_config_u64(h, "TE_RDMA_SLICE_SIZE", "MC_SLICE_SIZE", 65536, 4096,
					   1u << 30);
	c->retry_cnt = cfg_u(h, "TE_RDMA_RETRY_CNT", "MC_RETRY_CNT", 9, 0, 1000);
	c->fragment_ratio = cfg_u(h, "TE_RDMA_FRAGMENT_RATIO", "MC_FRAGMENT_RATIO", 4, 1, 1u << 20);
	c->handshake_timeout_ms = cfg_u(h, "TE_RDMA_HANDSHAKE_TIMEOUT_MS", NULL, 10000, 100, 600000);
	c->ep_idle_ms = te_host_config_u64(h, "TE_RDMA_EP_IDLE_MS", NULL, 300000, 10, UINT32_MAX);
	c->reclaim_interval_ms = te_host_config_u64(h, "TE_RDMA_RECLAIM_INTERVAL_MS", NULL, 1000, 10,
						    600000);
	c->pair_fail_threshold = cfg_u(h, "TE_RDMA_PATH_FAIL_THRESHOLD", NULL, 3, 1, 1000);
	c->pair_pause_ms = te_host_config_u64(h, "TE_RDMA_PATH_PAUSE_MS", NULL, 2000, 0, 3600000);
	c->parallel_reg = -1;
	s = h->config(h, "TE_RDMA_PARALLEL_REG_MR", "MC_ENABLE_PARALLEL_REG_MR");
	if (s != NULL) {
		if (strcmp(s, "-1") == 0 || strcmp(s, "0") == 0 || strcmp(s, "1") == 0)
			c->parallel_reg = atoi(s);
		else
			h->log(h, TE_LOG_WARN, "TE_RDMA_PARALLEL_REG_MR=%s is not -1, 0 or 1; using -1", s);
	}
	c->parallel_reg_min = te_host_config_u64(h, "TE_RDMA_PARALLEL_REG_MIN", NULL, 256u << 20, 0,
						 UINT64_MAX);
	s = h->config(h, "TE_RDMA_ENDPOINT_STORE_TYPE", "MC_ENDPOINT_STORE_TYPE");
	c->fifo_store = false;
	if (s != NULL) {
		if (g_ascii_strcasecmp(s, "FIFO") == 0)
			c->fifo_store = true;
		else if (g_ascii_strcasecmp(s, "SIEVE") != 0)
			h->log(h, TE_LOG_WARN, "TE_RDMA_ENDPOINT_STORE_TYPE=%s is not SIEVE or FIFO; using SIEVE",
			       s);
	}
	c->max_slices = cfg_u(h, "TE_RDMA_MAX_SLICES", NULL, 16384, 64, 1u << 22);
	c->ready_grace_ms = cfg_u(h, "TE_RDMA_READY_GRACE_MS", NULL, 1000, 0, 600000);
	c->ib_tc = -1;
	s = h->config(h, "TE_RDMA_IB_TC", "MC_IB_TC");
	if (s != NULL && strcmp(s, "-1") != 0)
		c->ib_tc = (int)te_host_config_u64(h, "TE_RDMA_IB_TC", "MC_IB_TC", 0, 0, 255);
	c->relaxed_ordering = cfg_bool(h, "TE_RDMA_IB_PCI_RELAXED_ORDERING", "MC_IB_PCI_RELAXED_ORDERING", false);
	c->dest_affinity = cfg_bool(h, "TE_RDMA_DEST_DEVICE_AFFINITY", "MC_ENABLE_DEST_DEVICE_AFFINITY", false);
}

/* ------------------------------------------------------------ slice pool */

/* The free list is a stack of indices + 1 with a 32-bit ABA tag on top, so
 * taking and returning a slice is one compare-and-swap. A waiting dispatcher
 * also wakes up every 100 ms, so a missed signal costs latency, not a hang. */
static void pool_put(rd_transport *tr, rd_slice *s)
{
	uint32_t idx = s->index;
	uint64_t top = atomic_load_explicit(&tr->free_top, memory_order_relaxed), nt;

	do {
		atomic_store_explicit(&tr->free_next[idx], (uint32_t)top, memory_order_relaxed);
		nt = ((top >> 32) + 1) << 32 | (uint64_t)(idx + 1);
	} while (!atomic_compare_exchange_weak_explicit(&tr->free_top, &top, nt, memory_order_release,
							memory_order_relaxed));
	if (atomic_load(&tr->pool_waiters) > 0) {
		g_mutex_lock(&tr->pool_lock);
		g_cond_signal(&tr->pool_cond);
		g_mutex_unlock(&tr->pool_lock);
	}
}

static rd_slice *pool_try_get(rd_transport *tr)
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

static void mr_unref(rd_mr *m);

static void slice_free(rd_transport *tr, rd_slice *s)
{
	if (s->mr != NULL)
		mr_unref(s->mr);
	s->mr = NULL;
	s->t = NULL;
	pool_put(tr, s);
}

/* ------------------------------------------------------------ completion */

/* Whether to log a transfer's failure: its first failed slice only, and at
 * most RD_FAIL_LOGS_PER_SEC lines a second (the rest are counted and
 * reported with the next line), so a failed batch of thousands does not
 * flood the log. */
#define RD_FAIL_LOGS_PER_SEC 10

static bool failure_log_allowed(rd_transport *tr, te_transfer *t, unsigned *suppressed)
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
static void slice_fail(rd_transport *tr, rd_slice *s, int error, const char *why)
{
	te_transfer *t = s->t;
	unsigned more = 0;

	if (error != -ECANCELED && failure_log_allowed(tr, t, &more)) {
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

static void slice_done(rd_transport *tr, rd_slice *s)
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
static int route(rd_transport *tr, rd_slice *s, bool allow_tried)
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

void rd_slice_retry(rd_transport *tr, rd_slice *s, int error, const char *why)
{
	te_transfer *t = s->t;

	if (s->ep != NULL) {
		rd_ep_unref(s->ep);
		s->ep = NULL;
	}
	if (atomic_load(&tr->stopping)) {
		slice_fail(tr, s, -ECANCELED, "transport shutting down");
		return;
	}
	if (tr->host->canceled(tr->host, t)) {
		slice_fail(tr, s, -ECANCELED, "batch canceled");
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
	int rc = route(tr, s, s->attempts <= tr->cfg.retry_cnt);
	/* Sent again: a fail-over of the NIC it left when it goes by another. */
	if (rc >= 0 && from >= 0)
		RD_COUNT(tr, tr->ctx[from], s->ldev != from ? TE_METRIC_FAILOVERS : TE_METRIC_RETRIES, 1);
	if (rc < 0) {
		int err = rc == -ENETDOWN ? -ENETDOWN : s->last_error ? s->last_error : error;
		slice_fail(tr, s, err,
			   rc == -ENETDOWN ? "every local RDMA device is out of service"
					   : "every path failed, is paused, or retries are exhausted");
		return;
	}
	RD_LOG(tr, TE_LOG_DEBUG, "slice retried on %s -> %s after: %s", tr->ctx[s->ldev]->nic_path,
	       s->seg->devs[s->rdev].nic_path, why);
	rd_ctx_enqueue(tr->ctx[s->ldev], s, s, false);
}

/* ---------------------------------------------------------------- workers */

static const char *wc_status_name(enum ibv_wc_status st)
{
	switch (st) {
	case IBV_WC_SUCCESS: return "success";
	case IBV_WC_LOC_LEN_ERR: return "local length error";
	case IBV_WC_LOC_QP_OP_ERR: return "local QP operation error";
	case IBV_WC_LOC_PROT_ERR: return "local protection error";
	case IBV_WC_WR_FLUSH_ERR: return "flushed";
	case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request";
	case IBV_WC_REM_ACCESS_ERR: return "remote access error (bad rkey or range)";
	case IBV_WC_REM_OP_ERR: return "remote operation error";
	case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded (peer unreachable)";
	case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
	case IBV_WC_FATAL_ERR: return "fatal error";
	default: return "work request error";
	}
}

static int wc_error(enum ibv_wc_status st)
{
	switch (st) {
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR: return -EHOSTUNREACH;
	case IBV_WC_REM_ACCESS_ERR:
	case IBV_WC_REM_INV_REQ_ERR:
	case IBV_WC_LOC_PROT_ERR: return TE_ERR_ADDRESS;
	case IBV_WC_WR_FLUSH_ERR: return -ECONNRESET;
	default: return -EIO;
	}
}

static void handle_wc(rd_ctx *c, int q, const struct ibv_wc *wc, int64_t now)
{
	rd_transport *tr = c->tr;
	rd_slice *s = (rd_slice *)(uintptr_t)wc->wr_id;
	rd_ep *ep = s->ep;

	atomic_fetch_sub_explicit(&ep->depth[s->qp], 1, memory_order_relaxed);
	atomic_fetch_sub_explicit(&c->cq_out[q], 1, memory_order_relaxed);
	RD_COUNT(tr, c, TE_METRIC_INFLIGHT_BYTES, -(int64_t)s->length);
	if (wc->status == IBV_WC_SUCCESS) {
		RD_COUNT(tr, c, TE_METRIC_BYTES, s->length);
		atomic_store_explicit(&ep->last_used, now, memory_order_relaxed);
		s->ep = NULL;
		slice_done(tr, s);
		rd_ep_unref(ep);
		return;
	}
	int err = wc_error(wc->status);
	RD_COUNT(tr, c, TE_METRIC_ERRORS, 1);
	rd_ep_fail(ep, err, wc_status_name(wc->status));
	if (wc->status == IBV_WC_RETRY_EXC_ERR) {
		/* Our own port may be the one that went down: check it now
		 * rather than wait for the event. */
		struct ibv_port_attr pa;
		if (tr->verbs->query_port(c->vctx, c->port, &pa) == 0 && pa.state != IBV_PORT_ACTIVE)
			rd_ctx_set_active(c, false, "port found down after a failed request");
	}
	rd_slice_retry(tr, s, err, wc_status_name(wc->status)); /* drops s->ep */
}

static int poll_completions(rd_ctx *c)
{
	const rv_verbs *v = c->tr->verbs;
	struct ibv_wc wc[RD_POLL_BATCH];
	int total = 0;

	for (int q = 0; q < c->ncq; q++) {
		if (atomic_load_explicit(&c->cq_out[q], memory_order_relaxed) == 0)
			continue;
		for (;;) {
			int n = v->poll_cq(c->cqs[q], RD_POLL_BATCH, wc);
			if (n < 0) {
				rd_ctx_set_active(c, false, "polling its completion queue failed");
				break;
			}
			int64_t now = n > 0 ? rd_now_ms() : 0;
			for (int i = 0; i < n; i++)
				handle_wc(c, q, &wc[i], now);
			total += n;
			if (n < RD_POLL_BATCH)
				break;
		}
	}
	return total;
}

/* Posts a run of slices that share one endpoint; returns how many did not
 * fit (queue pairs or the completion queue full): they go back to the queue. */
static int post_run(rd_ctx *c, rd_ep *ep, rd_slice **sl, int k, rd_slice **back, int *nback)
{
	const rv_verbs *v = c->tr->verbs;
	struct ibv_send_wr wr[RD_POST_BATCH];
	struct ibv_sge sge[RD_POST_BATCH];
	int done = 0;

	for (int tries = 0; tries < ep->nqp && done < k; tries++) {
		unsigned turn = atomic_fetch_add_explicit(&ep->rr, 1, memory_order_relaxed);
		int qi = (int)(turn % (unsigned)ep->nqp);
		int room = (int)c->max_wr - atomic_load(&ep->depth[qi]);
		int croom = (int)c->max_cqe - atomic_load(&c->cq_out[ep->cq]);
		int m = MIN(MIN(room, croom), k - done);
		if (m <= 0)
			continue;
		atomic_fetch_add(&ep->depth[qi], m);
		atomic_fetch_add(&c->cq_out[ep->cq], m);
		for (int i = 0; i < m; i++) {
			rd_slice *s = sl[done + i];
			bool is_write = s->opcode == TE_OP_WRITE;
			s->qp = qi;
			sge[i] = (struct ibv_sge){ .addr = s->local_addr, .length = s->length,
						   .lkey = s->mr->lkey[c->index] };
			wr[i] = (struct ibv_send_wr){
				.wr_id = (uintptr_t)s,
				.next = i + 1 < m ? &wr[i + 1] : NULL,
				.sg_list = &sge[i],
				.num_sge = 1,
				.opcode = is_write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ,
				.send_flags = IBV_SEND_SIGNALED |
					      /* inline data is copied by the CPU: never device memory */
					      (is_write && s->length <= c->max_inline && !s->mr->device
						       ? IBV_SEND_INLINE
						       : 0),
			};
			wr[i].wr.rdma.remote_addr = s->remote_addr;
			wr[i].wr.rdma.rkey = s->rkey[s->rdev];
		}
		struct ibv_send_wr *bad = NULL;
		int rc = v->post_send(ep->qps[qi], wr, &bad);
		int posted = m;
		if (rc != 0)
			posted = bad ? (int)(bad - wr) : 0;
		if (c->tr->metrics) { /* each posted request completes once, and is counted out then */
			uint64_t bytes = 0;
			for (int i = 0; i < posted; i++)
				bytes += sge[i].length;
			RD_COUNT(c->tr, c, TE_METRIC_INFLIGHT_BYTES, bytes);
		}
		if (rc != 0) {
			int failed = m - posted;
			atomic_fetch_sub(&ep->depth[qi], failed);
			atomic_fetch_sub(&c->cq_out[ep->cq], failed);
			rd_ep_fail(ep, -EIO, "posting work requests failed");
			for (int i = posted; i < m; i++)
				rd_slice_retry(c->tr, sl[done + i], -EIO, g_strerror(rc));
			done += m;
			/* The rest of the run goes back; the endpoint is gone. */
			break;
		}
		done += posted;
	}
	for (int i = done; i < k; i++) {
		sl[i]->ep = NULL;
		rd_ep_unref(ep);
		back[(*nback)++] = sl[i];
	}
	return k - done;
}

/* Takes slices off the NIC's queue, connects what needs connecting and
 * posts the rest. Returns the number of slices handled; sets *blocked when
 * queue pairs are full so the worker waits for completions. */
static int post_work(rd_worker *w, bool *blocked)
{
	rd_ctx *c = w->ctx;
	rd_transport *tr = c->tr;
	rd_slice *in[RD_POST_BATCH], *ready[RD_POST_BATCH], *back[RD_POST_BATCH];
	rd_ep *connect[RD_POST_BATCH];
	rd_slice *connect_for[RD_POST_BATCH];
	int n = 0, nready, nconnect = 0, nback = 0;

	g_mutex_lock(&c->qlock);
	while (n < RD_POST_BATCH && c->qhead != NULL) {
		in[n] = c->qhead;
		c->qhead = c->qhead->next;
		in[n++]->next = NULL;
	}
	if (c->qhead == NULL)
		c->qtail = NULL;
	g_mutex_unlock(&c->qlock);
	if (n == 0)
		return 0;
	if (!atomic_load(&c->active) || atomic_load(&tr->stopping)) {
		for (int i = 0; i < n; i++)
			rd_slice_retry(tr, in[i], -ENETDOWN, "device out of service");
		return n;
	}
	int keep = 0;
	for (int i = 0; i < n; i++) {
		if (tr->host->canceled(tr->host, in[i]->t))
			slice_fail(tr, in[i], -ECANCELED, "batch canceled");
		else
			in[keep++] = in[i];
	}
	nready = rd_ep_resolve(c, in, keep, ready, connect, connect_for, &nconnect);
	for (int i = 0; i < nready;) {
		int j = i + 1;
		while (j < nready && ready[j]->ep == ready[i]->ep)
			j++;
		/* Posted slices may complete, and drop their references, while
		 * the run is still being posted: hold one of our own. */
		rd_ep *ep = ready[i]->ep;
		atomic_fetch_add(&ep->refs, 1);
		if (post_run(c, ep, &ready[i], j - i, back, &nback) > 0)
			*blocked = true;
		rd_ep_unref(ep);
		i = j;
	}
	if (nback > 0) {
		for (int i = 0; i + 1 < nback; i++)
			back[i]->next = back[i + 1];
		rd_ctx_enqueue(c, back[0], back[nback - 1], true);
	}
	for (int i = 0; i < nconnect; i++) {
		rd_ep_connect(connect[i], connect_for[i]->seg, connect_for[i]->rdev);
		rd_ep_unref(connect[i]);
	}
	return n;
}

static bool queue_empty(rd_ctx *c)
{
	g_mutex_lock(&c->qlock);
	bool e = c->qhead == NULL;
	g_mutex_unlock(&c->qlock);
	return e;
}

static bool outstanding(rd_ctx *c)
{
	for (int q = 0; q < c->ncq; q++)
		if (atomic_load_explicit(&c->cq_out[q], memory_order_relaxed) > 0)
			return true;
	return false;
}

static bool drained(rd_ctx *c)
{
	for (int q = 0; q < c->ncq; q++)
		if (atomic_load(&c->cq_out[q]) > 0)
			return false;
	return queue_empty(c);
}

static int worker_main(rd_worker *w)
{
	rd_ctx *c = w->ctx;
	rd_transport *tr = c->tr;
	const rv_verbs *v = tr->verbs;
	struct pollfd pf[1 + 64];
	int npf = 0, idle = 0;
	bool blocked = false;
	int64_t stop_deadline = 0;

	pf[npf++] = (struct pollfd){ .fd = w->wake_fd, .events = POLLIN };
	for (int i = 0; i < c->nchan && npf < (int)G_N_ELEMENTS(pf); i++)
		pf[npf++] = (struct pollfd){ .fd = c->chans[i]->fd, .events = POLLIN };

	for (;;) {
		int progress = poll_completions(c);
		if (progress > 0)
			blocked = false;
		if (!blocked)
			progress += post_work(w, &blocked);
		if (atomic_load(&tr->stopping)) {
			if (stop_deadline == 0)
				stop_deadline = rd_now_ms() + STOP_DRAIN_MS;
			if (drained(c) || rd_now_ms() > stop_deadline)
				break;
		}
		if (progress > 0) {
			idle = 0;
			continue;
		}
		/* With requests in flight their completions are microseconds
		 * away: yield-poll a while before paying for a sleep and a
		 * wake-up; with nothing in flight, sleep almost at once. */
		if (++idle < (outstanding(c) ? RD_SPIN_BUSY : 3)) {
			g_thread_yield();
			continue;
		}
		/* Sleep until a completion, new work or a wake-up. Arm first,
		 * then look again, so nothing that arrived between is missed. */
		atomic_store(&w->sleeping, 1);
		for (int q = 0; q < c->ncq; q++)
			v->req_notify_cq(c->cqs[q], 0);
		if ((!blocked && !queue_empty(c)) || poll_completions(c) > 0) {
			atomic_store(&w->sleeping, 0);
			blocked = false;
			idle = 0;
			continue;
		}
		if (poll(pf, (nfds_t)npf, atomic_load(&tr->stopping) ? 10 : 1000) < 0 && errno != EINTR)
			RD_LOG(tr, TE_LOG_WARN, "%s: worker poll failed: %s", c->name, g_strerror(errno));
		atomic_store(&w->sleeping, 0);
		uint64_t val;
		while (read(w->wake_fd, &val, sizeof val) > 0)
			;
		for (int i = 0; i < c->nchan; i++) {
			struct ibv_cq *cq;
			void *cctx;
			while (v->get_cq_event(c->chans[i], &cq, &cctx) == 0)
				v->ack_cq_events(cq, 1);
		}
		idle = 0;
	}
	return 0;
}

gpointer rd_worker_thread(gpointer data)
{
	worker_main(data);
	return NULL;
}

/* ------------------------------------------------------------- dispatcher */

static rd_mr *mr_find(rd_transport *tr, uint64_t addr, uint64_t len)
{
	rd_mr *found = NULL;
	guint lo = 0, hi;

	g_rw_lock_reader_lock(&tr->mr_lock);
	hi = tr->mrs->len;
	while (lo < hi) {
		guint mid = lo + (hi - lo) / 2;
		rd_mr *m = g_ptr_array_index(tr->mrs, mid);
		if ((uintptr_t)m->addr <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo > 0) {
		rd_mr *m = g_ptr_array_index(tr->mrs, lo - 1);
		uint64_t start = (uintptr_t)m->addr;
		if (addr + len >= addr && addr - start <= m->length && len <= m->length - (addr - start)) {
			found = m;
			atomic_fetch_add(&m->refs, 1);
		}
	}
	g_rw_lock_reader_unlock(&tr->mr_lock);
	return found;
}

static const rd_rbuf *rbuf_find(const rd_seg *seg, uint64_t addr, uint64_t len)
{
	size_t lo = 0, hi = seg->nbuf;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (seg->bufs[mid].addr <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0 || addr + len < addr)
		return NULL;
	const rd_rbuf *b = &seg->bufs[lo - 1];
	if (addr - b->addr > b->length || len > b->length - (addr - b->addr))
		return NULL;
	return b;
}

/* Completes `n` slices of a transfer that cannot be cut. */
static void fail_transfer(rd_transport *tr, te_transfer *t, uint32_t n, int error, const char *why)
{
	unsigned more = 0;

	if (error != -ECANCELED && failure_log_allowed(tr, t, &more))
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
	rd_slice *s = pool_try_get(tr);

	if (s != NULL)
		return s;
	stage_flush(tr, st);
	g_mutex_lock(&tr->pool_lock);
	atomic_fetch_add(&tr->pool_waiters, 1);
	while ((s = pool_try_get(tr)) == NULL && !atomic_load(&tr->stopping))
		g_cond_wait_until(&tr->pool_cond, &tr->pool_lock, g_get_monotonic_time() + 100000);
	atomic_fetch_sub(&tr->pool_waiters, 1);
	g_mutex_unlock(&tr->pool_lock);
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
		mr_unref(mr);
		return;
	}
	const rd_loc *lloc = rd_loc_find(tr->topo.locs, tr->topo.nloc, t->local_location);
	const rd_loc *rloc = rd_loc_find(seg->locs, seg->nloc, rb->location);
	uint32_t seq = atomic_fetch_add_explicit(&tr->route_seq, n, memory_order_relaxed);

	for (uint32_t i = 0; i < n; i++) {
		if (tr->host->canceled(tr->host, t) || atomic_load(&tr->stopping)) {
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
		int rc = route(tr, s, false);
		if (rc < 0) {
			slice_fail(tr, s, rc,
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
	mr_unref(mr);
}

static gpointer dispatcher_thread(gpointer data)
{
	rd_transport *tr = data;
	staged st = { 0 };

	for (;;) {
		g_mutex_lock(&tr->pend_lock);
		while (tr->pend_head == NULL && !atomic_load(&tr->stopping))
			g_cond_wait(&tr->pend_cond, &tr->pend_lock);
		te_transfer *t = tr->pend_head;
		tr->pend_head = tr->pend_tail = NULL;
		g_mutex_unlock(&tr->pend_lock);
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

static gpointer reclaimer_thread(gpointer data)
{
	rd_transport *tr = data;
	int64_t interval = (int64_t)MIN(tr->cfg.reclaim_interval_ms, 500);

	if (tr->cfg.ready_grace_ms > 0 && (int64_t)tr->cfg.ready_grace_ms < interval)
		interval = tr->cfg.ready_grace_ms;
	g_mutex_lock(&tr->reclaim_lock);
	while (!atomic_load(&tr->stopping)) {
		g_cond_wait_until(&tr->reclaim_cond, &tr->reclaim_lock,
				  g_get_monotonic_time() + interval * 1000);
		if (atomic_load(&tr->stopping))
			break;
		g_mutex_unlock(&tr->reclaim_lock);
		int64_t now = rd_now_ms();
		for (int i = 0; i < tr->nctx; i++) {
			rd_ctx_check_port(tr->ctx[i]);
			rd_ep_reclaim(tr->ctx[i], now);
		}
		g_mutex_lock(&tr->reclaim_lock);
	}
	g_mutex_unlock(&tr->reclaim_lock);
	return NULL;
}

/* ---------------------------------------------------------------- memory */

static void mr_free(rd_mr *m)
{
	rd_transport *tr = m->tr;

	for (int i = 0; i < tr->nctx; i++)
		if (m->mr[i] != NULL && tr->verbs->dereg_mr(m->mr[i]) != 0)
			RD_LOG(tr, TE_LOG_WARN, "%s: deregistering %p+%zu failed", tr->ctx[i]->name, m->addr,
			       m->length);
	g_free(m->location);
	g_free(m);
}

static void mr_unref(rd_mr *m)
{
	if (atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) == 1)
		mr_free(m);
}

typedef struct reg_job {
	rd_transport *tr;
	rd_mr *m;
	int dev;
	int access;
	int dmabuf_fd; /* device memory through a dma-buf, else -1 */
	uint64_t dmabuf_off;
	int err;
} reg_job;

static gpointer reg_one(gpointer data)
{
	reg_job *j = data;
	rd_ctx *c = j->tr->ctx[j->dev];

	errno = 0;
	if (j->dmabuf_fd >= 0)
		j->m->mr[j->dev] = j->tr->verbs->reg_dmabuf_mr(c->pd, j->dmabuf_off, j->m->length,
							       (uintptr_t)j->m->addr, j->dmabuf_fd,
							       j->access);
	else
		j->m->mr[j->dev] = j->tr->verbs->reg_mr(c->pd, j->m->addr, j->m->length, j->access);
	j->err = j->m->mr[j->dev] ? 0 : (errno ? errno : EIO);
	return NULL;
}

/* Device memory: with every NIC through a dma-buf (the way GPUDirect RDMA
 * works on current kernels), else as plain memory (which works where the
 * GPU vendor's peer-memory module is loaded), else -ENOTSUP: the host then
 * stages it through host memory. Logged either way. */
static int reg_device(rd_transport *tr, rd_mr *m, int access, reg_job *jobs)
{
	const te_host *h = tr->host;
	int fd = -1;
	uint64_t off = 0;
	int rc = TE_HAS_OP(h, device_dmabuf) ? h->device_dmabuf(h, m->addr, m->length, &fd, &off)
					     : -ENOTSUP;
	const char *how = "dma-buf";

	for (int pass = rc == 0 ? 0 : 1; pass < 2; pass++) {
		int failed = 0;
		for (int i = 0; i < tr->nctx; i++) {
			jobs[i] = (reg_job){ tr, m, i, access, pass == 0 ? fd : -1, off, 0 };
			reg_one(&jobs[i]);
			failed |= jobs[i].err != 0;
		}
		if (!failed) {
			if (fd >= 0)
				close(fd);
			RD_LOG(tr, TE_LOG_INFO, "%s memory at %p+%zu: GPUDirect RDMA (%s)", m->location,
			       m->addr, m->length, pass == 0 ? how : "peer memory");
			return 0;
		}
		for (int i = 0; i < tr->nctx; i++)
			if (m->mr[i] != NULL) {
				tr->verbs->dereg_mr(m->mr[i]);
				m->mr[i] = NULL;
			}
		if (pass == 0)
			RD_LOG(tr, TE_LOG_INFO, "%s memory at %p: no dma-buf registration: %s",
			       m->location, m->addr, g_strerror(jobs[0].err ? jobs[0].err : EIO));
	}
	if (fd >= 0)
		close(fd);
	RD_LOG(tr, TE_LOG_INFO, "%s memory at %p+%zu: no GPUDirect RDMA here (%s); staged through "
	       "host memory", m->location, m->addr, m->length,
	       rc == 0 ? "the NICs refused it" : "the device offers no dma-buf, and plain "
						   "registration failed");
	return -ENOTSUP;
}

static char *json_text(JsonNode *root)
{
	JsonGenerator *g = json_generator_new();
	gsize n = 0;
	json_generator_set_root(g, root);
	char *gt = json_generator_to_data(g, &n);
	g_object_unref(g);
	char *out = malloc(n + 1);
	if (out != NULL)
		memcpy(out, gt, n + 1);
	g_free(gt);
	return out;
}

static int rd_mem_register(void *ctx, const te_mem_info *mem, char **json)
{
	rd_transport *tr = ctx;
	rd_mr *m;
	int access = IBV_ACCESS_LOCAL_WRITE;
	reg_job jobs[RD_MAX_DEV];
	int rc = 0;

	*json = NULL;
	if (mem == NULL || mem->addr == NULL || mem->length == 0) {
		RD_LOG(tr, TE_LOG_ERROR, "mem_register: empty region");
		return -EINVAL;
	}
	m = g_new0(rd_mr, 1);
	m->tr = tr;
	m->addr = mem->addr;
	m->length = mem->length;
	m->location = g_strdup(mem->location ? mem->location : "cpu:0");
	m->remote = (mem->flags & TE_MEM_REMOTE_ACCESS) != 0;
	atomic_init(&m->refs, 1);
	if (m->remote)
		access |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
	/* An optional flag: libibverbs drops it where the device lacks it. */
	if (tr->cfg.relaxed_ordering)
		access |= IBV_ACCESS_RELAXED_ORDERING;

	/* Pinning a large region takes long: register it with every NIC at once. */
	bool parallel = tr->nctx > 1 && (tr->cfg.parallel_reg == 1 ||
					 (tr->cfg.parallel_reg == -1 && mem->length >= tr->cfg.parallel_reg_min));
	GThread *th[RD_MAX_DEV] = { 0 };
	if (mem->size > offsetof(te_mem_info, device) && mem->device) {
		m->device = true;
		rc = reg_device(tr, m, access, jobs);
		if (rc < 0) {
			mr_free(m);
			return rc;
		}
		parallel = false;
	}
	for (int i = 0; !m->device && i < tr->nctx; i++) {
		jobs[i] = (reg_job){ tr, m, i, access, -1, 0, 0 };
		if (parallel)
			th[i] = g_thread_new("te-rdma-reg", reg_one, &jobs[i]);
		else
			reg_one(&jobs[i]);
	}
	for (int i = 0; i < tr->nctx; i++) {
		if (th[i] != NULL)
			g_thread_join(th[i]);
		if (jobs[i].err != 0 && rc == 0) {
			RD_LOG(tr, TE_LOG_ERROR, "registering %p+%zu with %s failed: %s", mem->addr, mem->length,
			       tr->ctx[i]->name, g_strerror(jobs[i].err));
			rc = -jobs[i].err;
		}
	}
	if (rc < 0) {
		mr_free(m);
		return rc;
	}
	for (int i = 0; i < tr->nctx; i++) {
		m->lkey[i] = m->mr[i]->lkey;
		m->rkey[i] = m->mr[i]->rkey;
	}

	g_rw_lock_writer_lock(&tr->mr_lock);
	guint pos = 0;
	while (pos < tr->mrs->len && (uintptr_t)((rd_mr *)g_ptr_array_index(tr->mrs, pos))->addr <
					     (uintptr_t)m->addr)
		pos++;
	g_ptr_array_insert(tr->mrs, (gint)pos, m);
	g_rw_lock_writer_unlock(&tr->mr_lock);

	JsonObject *o = json_object_new();
	JsonArray *lk = json_array_new(), *rk = json_array_new();
	for (int i = 0; i < tr->nctx; i++) {
		json_array_add_int_element(lk, m->lkey[i]);
		if (m->remote)
			json_array_add_int_element(rk, m->rkey[i]);
	}
	json_object_set_array_member(o, "lkey", lk);
	json_object_set_string_member(o, "name", m->location);
	json_object_set_array_member(o, "rkey", rk);
	JsonNode *root = json_node_new(JSON_NODE_OBJECT);
	json_node_take_object(root, o);
	*json = json_text(root);
	json_node_unref(root);
	return *json ? 0 : -ENOMEM;
}

static int rd_mem_unregister(void *ctx, void *addr, size_t length)
{
	rd_transport *tr = ctx;
	rd_mr *m = NULL;

	(void)length;
	g_rw_lock_writer_lock(&tr->mr_lock);
	for (guint i = 0; i < tr->mrs->len; i++) {
		rd_mr *x = g_ptr_array_index(tr->mrs, i);
		if (x->addr == addr) {
			m = x;
			g_ptr_array_remove_index(tr->mrs, i);
			break;
		}
	}
	g_rw_lock_writer_unlock(&tr->mr_lock);
	if (m == NULL) {
		RD_LOG(tr, TE_LOG_WARN, "mem_unregister: %p is not registered with RDMA", addr);
		return -ENOENT;
	}
	mr_unref(m); /* slices still using it keep it registered */
	return 0;
}

/* -------------------------------------------------------------- segments */

static void seg_free(rd_seg *seg)
{
	if (seg == NULL)
		return;
	for (size_t i = 0; i < seg->nbuf; i++) {
		g_free(seg->bufs[i].location);
		g_free(seg->bufs[i].rkey);
	}
	g_free(seg->bufs);
	g_free(seg->devs);
	g_free(seg->devnames);
	rd_locs_free(seg->locs, seg->nloc);
	g_free((void *)seg->pair_fail);
	g_free((void *)seg->pause_until);
	g_free(seg->name);
	g_free(seg);
}

static bool get_int(JsonObject *o, const char *name, int64_t lo, int64_t hi, int64_t *out)
{
	JsonNode *n = json_object_get_member(o, name);
	if (n == NULL || !JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_INT64)
		return false;
	int64_t v = json_node_get_int(n);
	if (v < lo || v > hi)
		return false;
	*out = v;
	return true;
}

static int cmp_rbuf(const void *a, const void *b)
{
	const rd_rbuf *x = a, *y = b;
	return x->addr < y->addr ? -1 : x->addr > y->addr;
}

#define SEG_BAD(...)                                                             \
	do {                                                                         \
		g_string_printf(err, __VA_ARGS__);                                       \
		rc = TE_ERR_METADATA;                                                    \
		goto out;                                                                \
	} while (0)

/* A peer's whole segment descriptor, every transport's fields in it. Its
 * own are objects of lists of objects at most (buffers and their keys, the
 * matrix's lists): depth 16 leaves the other transports room. Strings as
 * libte allows them in a descriptor (file paths); counts as its defaults (a
 * segment may hold many buffers). */
static const te_json_limits desc_limits = { 16, TE_JSON_MAX_ITEMS, TE_JSON_MAX_VALUES, 65536,
					    TE_JSON_MAX_TEXT };

static int seg_parse(rd_transport *tr, const te_segment_info *info, rd_seg **out, GString *err)
{
	JsonNode *rootn = NULL;
	JsonObject *root;
	JsonNode *n;
	rd_seg *seg = g_new0(rd_seg, 1);
	bool bad = false;
	int rc = 0;

	*out = NULL;
	seg->tr = tr;
	seg->name = g_strdup(info->name);
	if (info->descriptor == NULL)
		SEG_BAD("no descriptor");
	rootn = rd_json_load(info->descriptor, strlen(info->descriptor), &desc_limits, "descriptor", err);
	if (rootn == NULL) {
		rc = TE_ERR_METADATA;
		goto out;
	}
	if (!JSON_NODE_HOLDS_OBJECT(rootn))
		SEG_BAD("descriptor is not a JSON object");
	root = json_node_get_object(rootn);
	n = json_object_get_member(root, "devices");
	if (n != NULL && !JSON_NODE_HOLDS_ARRAY(n))
		SEG_BAD("\"devices\" is not an array");
	if (n == NULL || json_array_get_length(json_node_get_array(n)) == 0) {
		g_string_assign(err, "it lists no RDMA devices");
		rc = -ENOTSUP;
		goto out;
	}
	JsonArray *da = json_node_get_array(n);
	seg->ndev = (int)json_array_get_length(da);
	if (seg->ndev > RD_MAX_DEV)
		SEG_BAD("%d RDMA devices (at most %d)", seg->ndev, RD_MAX_DEV);
	seg->devs = g_new0(rd_rdev, seg->ndev);
	seg->devnames = g_malloc0_n((gsize)(seg->ndev), RD_NAME_MAX);
	for (int i = 0; i < seg->ndev; i++) {
		JsonNode *e = json_array_get_element(da, (guint)i);
		int64_t lid = 0;
		if (!JSON_NODE_HOLDS_OBJECT(e))
			SEG_BAD("device %d is not an object", i);
		JsonObject *d = json_node_get_object(e);
		const char *nm = rd_json_str(d, "name", &bad);
		const char *gid = rd_json_str(d, "gid", &bad);
		if (nm == NULL || *nm == '\0' || strlen(nm) >= RD_NAME_MAX || strchr(nm, '@'))
			SEG_BAD("device %d has no valid \"name\"", i);
		if (!get_int(d, "lid", 0, 0xffff, &lid))
			SEG_BAD("device %s has no valid \"lid\"", nm);
		if (gid == NULL || !rd_gid_parse(gid, seg->devs[i].gid))
			SEG_BAD("device %s has no valid \"gid\"", nm);
		for (int k = 0; k < i; k++)
			if (strcmp(seg->devs[k].name, nm) == 0)
				SEG_BAD("device %s is listed twice", nm);
		g_strlcpy(seg->devs[i].name, nm, RD_NAME_MAX);
		g_strlcpy(seg->devnames[i], nm, RD_NAME_MAX);
		seg->devs[i].lid = (uint16_t)lid;
		if ((size_t)snprintf(seg->devs[i].nic_path, RD_PATH_MAX, "%s@%s", info->name, nm) >= RD_PATH_MAX)
			SEG_BAD("segment name too long");
	}
	n = json_object_get_member(root, "priority_matrix");
	if (n != NULL) {
		if (!JSON_NODE_HOLDS_OBJECT(n))
			SEG_BAD("\"priority_matrix\" is not an object");
		if (rd_matrix_parse(json_node_get_object(n), seg->devnames, seg->ndev, &seg->locs,
				    &seg->nloc, err) < 0) {
			rc = TE_ERR_METADATA;
			goto out;
		}
	}
	n = json_object_get_member(root, "buffers");
	if (n != NULL && !JSON_NODE_HOLDS_ARRAY(n))
		SEG_BAD("\"buffers\" is not an array");
	if (n != NULL) {
		JsonArray *ba = json_node_get_array(n);
		seg->nbuf = json_array_get_length(ba);
		seg->bufs = g_new0(rd_rbuf, seg->nbuf ? seg->nbuf : 1);
		for (size_t i = 0; i < seg->nbuf; i++) {
			JsonNode *e = json_array_get_element(ba, (guint)i);
			rd_rbuf *b = &seg->bufs[i];
			int64_t addr, len;
			if (!JSON_NODE_HOLDS_OBJECT(e))
				SEG_BAD("buffer %zu is not an object", i);
			JsonObject *bo = json_node_get_object(e);
			if (!get_int(bo, "addr", 1, INT64_MAX, &addr) || !get_int(bo, "length", 1, INT64_MAX, &len))
				SEG_BAD("buffer %zu has no valid addr/length", i);
			b->addr = (uint64_t)addr;
			b->length = (uint64_t)len;
			bool nbad = false;
			const char *loc = rd_json_str(bo, "name", &nbad);
			if (nbad)
				SEG_BAD("buffer %zu: \"name\" is not a string", i);
			b->location = g_strdup(loc ? loc : "");
			JsonNode *rk = json_object_get_member(bo, "rkey");
			if (rk == NULL)
				continue; /* a buffer of another transport only */
			if (!JSON_NODE_HOLDS_ARRAY(rk))
				SEG_BAD("buffer %zu: \"rkey\" is not an array", i);
			JsonArray *ra = json_node_get_array(rk);
			guint nr = json_array_get_length(ra);
			if (nr == 0)
				continue; /* not remote-accessible */
			if ((int)nr != seg->ndev)
				SEG_BAD("buffer %zu has %u rkeys for %d devices", i, nr, seg->ndev);
			b->rkey = g_new0(uint32_t, nr);
			for (guint k = 0; k < nr; k++) {
				JsonNode *kv = json_array_get_element(ra, k);
				if (!JSON_NODE_HOLDS_VALUE(kv) || json_node_get_value_type(kv) != G_TYPE_INT64 ||
				    json_node_get_int(kv) < 0 || json_node_get_int(kv) > UINT32_MAX)
					SEG_BAD("buffer %zu: rkey %u is not a 32-bit key", i, k);
				b->rkey[k] = (uint32_t)json_node_get_int(kv);
			}
		}
		qsort(seg->bufs, seg->nbuf, sizeof *seg->bufs, cmp_rbuf);
	}
	size_t pairs = (size_t)tr->nctx * (size_t)seg->ndev;
	seg->pair_fail = g_new0(atomic_uint, pairs);
	seg->pause_until = g_new0(_Atomic int64_t, pairs);
out:
	if (rootn != NULL)
		json_node_unref(rootn);
	if (rc < 0) {
		seg_free(seg);
		return rc;
	}
	*out = seg;
	return 0;
}

static int rd_segment_open(void *ctx, const te_segment_info *info, void **seg_ctx)
{
	rd_transport *tr = ctx;
	GString *err = g_string_new(NULL);
	rd_seg *seg = NULL;
	int rc = seg_parse(tr, info, &seg, err);

	if (rc == -ENOTSUP)
		RD_LOG(tr, TE_LOG_DEBUG, "segment %s: %s; not served by RDMA", info->name, err->str);
	else if (rc < 0) /* the peer's text: a flood of these is held back */
		TE_HOST_LOG_LIMITED(tr->host, TE_LOG_ERROR, "segment %.200s: descriptor rejected: %s",
				    info->name, err->str);
	g_string_free(err, TRUE);
	*seg_ctx = seg;
	return rc;
}

static void rd_segment_close(void *ctx, void *seg_ctx)
{
	(void)ctx;
	seg_free(seg_ctx);
}

/* ---------------------------------------------------------------- submit */

static int rd_submit(void *ctx, te_transfer *const *ts, size_t n)
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
	g_mutex_lock(&tr->pend_lock);
	if (tr->pend_tail)
		tr->pend_tail->plugin_data[0] = (uintptr_t)head;
	else
		tr->pend_head = head;
	tr->pend_tail = tail;
	g_cond_signal(&tr->pend_cond);
	g_mutex_unlock(&tr->pend_lock);
	return 0;
}

/* -------------------------------------------------------------- describe */

static int rd_describe(void *ctx, char **json)
{
	rd_transport *tr = ctx;
	JsonObject *o = json_object_new();
	JsonArray *devs = json_array_new();
	char (*names)[RD_NAME_MAX] = g_malloc0_n((gsize)(tr->nctx), RD_NAME_MAX);

	for (int i = 0; i < tr->nctx; i++) {
		rd_ctx *c = tr->ctx[i];
		JsonObject *d = json_object_new();
		char gid[48];
		uint8_t raw[16];
		int index;
		rd_ctx_gid(c, raw, &index);
		rd_gid_format(raw, gid);
		json_object_set_string_member(d, "gid", gid);
		json_object_set_int_member(d, "lid", c->lid);
		json_object_set_string_member(d, "name", c->name);
		json_array_add_object_element(devs, d);
		g_strlcpy(names[i], c->name, RD_NAME_MAX);
	}
	json_object_set_array_member(o, "devices", devs);
	json_object_set_member(o, "priority_matrix", rd_matrix_to_json(tr->topo.locs, tr->topo.nloc, names));
	g_free(names);
	JsonNode *root = json_node_new(JSON_NODE_OBJECT);
	json_node_take_object(root, o);
	*json = json_text(root);
	json_node_unref(root);
	return *json ? 0 : -ENOMEM;
}

/* ------------------------------------------------------------ arguments */

typedef struct rd_args {
	GPtrArray *devices;   /* allow-list, or NULL */
	JsonObject *matrix;   /* user priority matrix, or NULL */
	JsonNode *root;       /* owns the arguments */
	JsonNode *mroot;      /* owns a matrix given as a JSON string */
} rd_args;

static void args_clear(rd_args *a)
{
	if (a->devices)
		g_ptr_array_unref(a->devices);
	if (a->root)
		json_node_unref(a->root);
	if (a->mroot)
		json_node_unref(a->mroot);
	memset(a, 0, sizeof *a);
}

static int add_device_names(GPtrArray *out, JsonNode *n, GString *err)
{
	if (JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == G_TYPE_STRING) {
		gchar **parts = g_strsplit(json_node_get_string(n), ",", -1);
		for (gchar **p = parts; *p; p++) {
			char *s = g_strstrip(*p);
			if (*s)
				g_ptr_array_add(out, g_strdup(s));
		}
		g_strfreev(parts);
		return 0;
	}
	if (!JSON_NODE_HOLDS_ARRAY(n)) {
		g_string_assign(err, "\"devices\" is neither a list of names nor a comma-separated string");
		return -EINVAL;
	}
	JsonArray *a = json_node_get_array(n);
	for (guint i = 0; i < json_array_get_length(a); i++) {
		JsonNode *e = json_array_get_element(a, i);
		if (!JSON_NODE_HOLDS_VALUE(e) || json_node_get_value_type(e) != G_TYPE_STRING ||
		    *json_node_get_string(e) == '\0' || strlen(json_node_get_string(e)) >= RD_NAME_MAX) {
			g_string_printf(err, "\"devices\" entry %u is not a device name", i);
			return -EINVAL;
		}
		g_ptr_array_add(out, g_strdup(json_node_get_string(e)));
	}
	return 0;
}

/* The arguments: {"priority_matrix": {"loc": [[...], [...]]}} is the
 * deepest form. Devices are at most RD_MAX_DEV, but a matrix may list many
 * locations; a string may be a whole matrix. */
static const te_json_limits args_limits = { 4, 1024, 16384, 65536, 1024 * 1024 };
/* A matrix given as a JSON string: {"loc": [[names], [names]]}; location
 * and NIC names are at most 64 bytes (escapes allowed for). */
static const te_json_limits matrix_limits = { 3, 1024, 16384, 512, 65536 };

/* json_args: NULL; a priority matrix {"cpu:0": [[...], [...]], ...}; a list
 * of device names; or {"devices": [...] | "a,b", "priority_matrix": {...}}. */
static int parse_args(const char *text, rd_args *a, GString *err)
{
	JsonNode *root;
	static const char *const keys[] = { "devices", "device_name", "priority_matrix",
					    "nic_priority_matrix" };

	memset(a, 0, sizeof *a);
	if (text == NULL || *text == '\0')
		return 0;
	a->root = root = rd_json_load(text, strlen(text), &args_limits, "arguments", err);
	if (root == NULL)
		return -EINVAL;
	if (JSON_NODE_HOLDS_ARRAY(root)) {
		a->devices = g_ptr_array_new_with_free_func(g_free);
		return add_device_names(a->devices, root, err);
	}
	if (!JSON_NODE_HOLDS_OBJECT(root)) {
		g_string_assign(err, "arguments are neither a JSON object nor a list of device names");
		return -EINVAL;
	}
	JsonObject *o = json_node_get_object(root);
	bool options = false;
	for (size_t i = 0; i < G_N_ELEMENTS(keys); i++)
		options |= json_object_has_member(o, keys[i]);
	if (!options) {
		a->matrix = o; /* the seeds' form: the object is the matrix */
		return 0;
	}
	JsonObjectIter it;
	const gchar *k;
	JsonNode *v;
	json_object_iter_init(&it, o);
	while (json_object_iter_next(&it, &k, &v)) {
		if (strcmp(k, "devices") == 0 || strcmp(k, "device_name") == 0) {
			if (a->devices == NULL)
				a->devices = g_ptr_array_new_with_free_func(g_free);
			if (add_device_names(a->devices, v, err) < 0)
				return -EINVAL;
		} else if (strcmp(k, "priority_matrix") == 0 || strcmp(k, "nic_priority_matrix") == 0) {
			if (JSON_NODE_HOLDS_VALUE(v) && json_node_get_value_type(v) == G_TYPE_STRING) {
				/* a matrix passed as a JSON string */
				const char *mt = json_node_get_string(v);
				GString *why = g_string_new(NULL);
				JsonNode *mr = rd_json_load(mt, strlen(mt), &matrix_limits, k, why);
				if (mr == NULL || !JSON_NODE_HOLDS_OBJECT(mr)) {
					if (mr == NULL)
						g_string_printf(err, "\"%s\" is not a JSON object (%s)", k, why->str);
					else
						g_string_printf(err, "\"%s\" is not a JSON object", k);
					g_string_free(why, TRUE);
					if (mr != NULL)
						json_node_unref(mr);
					return -EINVAL;
				}
				g_string_free(why, TRUE);
				if (a->mroot)
					json_node_unref(a->mroot);
				a->mroot = mr;
				a->matrix = json_node_get_object(mr);
				continue;
			}
			if (!JSON_NODE_HOLDS_OBJECT(v)) {
				g_string_printf(err, "\"%s\" is not an object", k);
				return -EINVAL;
			}
			a->matrix = json_node_get_object(v);
		} else {
			g_string_printf(err, "unknown argument \"%s\" (known: devices, priority_matrix)", k);
			return -EINVAL;
		}
	}
	return 0;
}

/* ------------------------------------------------------------- devices */

/* The devices to use: every device found, or the allow-list (each entry must
 * exist). Names are g_strdup()ed into `names`. */
static int select_devices(const rv_verbs *v, const char *root, GPtrArray *allow,
			  struct ibv_device ***list_out, int *num_out, GPtrArray *names, GString *err)
{
	int num = 0;
	struct ibv_device **list = v->get_device_list(root, &num);

	if (list == NULL)
		num = 0;
	if (allow != NULL && allow->len > 0) {
		for (guint i = 0; i < allow->len; i++) {
			const char *want = g_ptr_array_index(allow, i);
			bool found = false, dup = false;
			for (int k = 0; k < num && !found; k++)
				found = strcmp(v->get_device_name(list[k]), want) == 0;
			for (guint k = 0; k < names->len && !dup; k++)
				dup = strcmp(g_ptr_array_index(names, k), want) == 0;
			if (!found) {
				GString *have = g_string_new(NULL);
				for (int k = 0; k < num; k++)
					g_string_append_printf(have, "%s%s", k ? ", " : "",
							       v->get_device_name(list[k]));
				g_string_printf(err, "RDMA device %s was requested but not found (found: %s)", want,
						num ? have->str : "none");
				g_string_free(have, TRUE);
				if (list)
					v->free_device_list(list);
				return -ENODEV;
			}
			if (!dup)
				g_ptr_array_add(names, g_strdup(want));
		}
	} else {
		for (int k = 0; k < num; k++)
			g_ptr_array_add(names, g_strdup(v->get_device_name(list[k])));
	}
	if (names->len == 0) {
		g_string_printf(err, "no RDMA devices were found (%s)", v->none_found);
		if (list)
			v->free_device_list(list);
		return -ENODEV;
	}
	*list_out = list;
	*num_out = num;
	return 0;
}

static GPtrArray *env_devices(const te_host *h)
{
	const char *s = h->config(h, "TE_RDMA_DEVICES", NULL);
	GPtrArray *out;

	if (s == NULL || *s == '\0')
		return NULL;
	out = g_ptr_array_new_with_free_func(g_free);
	gchar **parts = g_strsplit(s, ",", -1);
	for (gchar **p = parts; *p; p++) {
		char *x = g_strstrip(*p);
		if (*x)
			g_ptr_array_add(out, g_strdup(x));
	}
	g_strfreev(parts);
	return out;
}

/* --------------------------------------------------------- create/destroy */

static void tr_free(rd_transport *tr)
{
	for (int i = 0; i < tr->nctx; i++)
		rd_ctx_close(tr->ctx[i]);
	if (tr->mrs)
		g_ptr_array_unref(tr->mrs);
	rd_topo_clear(&tr->topo);
	g_free(tr->slices);
	g_free((void *)tr->free_next);
	g_free(tr->sysfs_root);
	g_free(tr->local_name);
	g_mutex_clear(&tr->pend_lock);
	g_cond_clear(&tr->pend_cond);
	g_mutex_clear(&tr->pool_lock);
	g_cond_clear(&tr->pool_cond);
	g_mutex_clear(&tr->reclaim_lock);
	g_cond_clear(&tr->reclaim_cond);
	g_rw_lock_clear(&tr->mr_lock);
	g_mutex_clear(&tr->stats.lock);
	g_free(tr);
}

/* The topology, with the devices the device plugins report placed where
 * they say they are. */
static int discover(const te_host *h, const char *root, GPtrArray *names, rd_topo *topo,
		    GString *err)
{
	te_device_info info[RD_MAX_DEV * 2];
	rd_devloc devs[RD_MAX_DEV * 2];
	size_t n = 0;

	if (TE_HAS_OP(h, devices)) {
		for (size_t i = 0; i < G_N_ELEMENTS(info); i++)
			info[i] = (te_device_info){ .size = sizeof info[i], .numa_node = -1 };
		if (h->devices(h, info, G_N_ELEMENTS(info), &n) < 0)
			n = 0;
		n = MIN(n, G_N_ELEMENTS(info));
		for (size_t i = 0; i < n; i++) {
			g_strlcpy(devs[i].location, info[i].location, sizeof devs[i].location);
			g_strlcpy(devs[i].pci, info[i].pci_bus_id, sizeof devs[i].pci);
			devs[i].numa = info[i].numa_node;
		}
	}
	return rd_topo_discover_devices(root, (char *const *)names->pdata, (int)names->len, devs,
					(int)n, topo, err);
}

static int rd_create(const te_host *h, const char *json_args, void **out)
{
	rd_transport *tr = g_new0(rd_transport, 1);
	GString *err = g_string_new(NULL);
	GPtrArray *names = g_ptr_array_new_with_free_func(g_free);
	struct ibv_device **list = NULL;
	int num = 0, rc;
	rd_provider prov;
	rd_args a;

	*out = NULL;
	tr->host = h;
	tr->metrics = TE_HAS_OP(h, metric_device) && TE_HAS_OP(h, metric_add);
	g_mutex_init(&tr->pend_lock);
	g_cond_init(&tr->pend_cond);
	g_mutex_init(&tr->pool_lock);
	g_cond_init(&tr->pool_cond);
	g_mutex_init(&tr->reclaim_lock);
	g_cond_init(&tr->reclaim_cond);
	g_rw_lock_init(&tr->mr_lock);
	g_mutex_init(&tr->stats.lock);
	read_config(h, &tr->cfg);
	rc = parse_args(json_args, &a, err);
	if (rc < 0) {
		h->log(h, TE_LOG_ERROR, "invalid arguments %.200s%s: %s", json_args,
		       strlen(json_args) > 200 ? "..." : "", err->str);
		goto fail;
	}
	if (a.devices == NULL)
		a.devices = env_devices(h);
	rd_provider_get(h, &prov);
	tr->verbs = prov.verbs;
	tr->sysfs_root = g_strdup(prov.sysfs_root);
	tr->local_name = g_strdup(h->local_name(h) ? h->local_name(h) : "localhost");

	rc = select_devices(tr->verbs, tr->sysfs_root, a.devices, &list, &num, names, err);
	if (rc < 0) {
		h->log(h, TE_LOG_ERROR, "RDMA transport not installed: %s", err->str);
		goto fail;
	}
	if (a.matrix != NULL)
		rc = rd_topo_from_matrix(tr->sysfs_root, a.matrix, (char *const *)names->pdata,
					 (int)names->len, &tr->topo, err);
	else
		rc = discover(h, tr->sysfs_root, names, &tr->topo, err);
	if (rc < 0) {
		h->log(h, TE_LOG_ERROR, "RDMA transport not installed: %s", err->str);
		goto fail;
	}
	for (int i = 0; i < tr->topo.nhca; i++) {
		struct ibv_device *dev = NULL;
		for (int k = 0; k < num && dev == NULL; k++)
			if (strcmp(tr->verbs->get_device_name(list[k]), tr->topo.hcas[i].name) == 0)
				dev = list[k];
		g_string_truncate(err, 0);
		rc = dev ? rd_ctx_open(tr, i, dev, &tr->ctx[i], err) : -ENODEV;
		if (rc < 0) {
			h->log(h, TE_LOG_ERROR, "RDMA transport not installed: %s",
			       dev ? err->str : "a device vanished");
			goto fail;
		}
		tr->nctx = i + 1;
	}
	tr->verbs->free_device_list(list);
	list = NULL;

	tr->nslices = tr->cfg.max_slices;
	tr->slices = g_new0(rd_slice, tr->nslices);
	tr->free_next = g_new0(atomic_uint, tr->nslices);
	for (uint32_t i = 0; i < tr->nslices; i++) {
		tr->slices[i].index = i;
		pool_put(tr, &tr->slices[i]);
	}
	tr->mrs = g_ptr_array_new();
	rc = h->rpc_handle(h, TE_RPC_CONNECTION, rd_ep_handle, tr);
	if (rc < 0) {
		h->log(h, TE_LOG_ERROR, "RDMA transport not installed: cannot receive handshakes: %s",
		       rd_strerror(rc));
		goto fail;
	}
	for (int i = 0; i < tr->nctx; i++) {
		rc = rd_ctx_start(tr->ctx[i]);
		if (rc < 0) {
			h->log(h, TE_LOG_ERROR, "RDMA transport not installed: %s: cannot start its threads",
			       tr->ctx[i]->name);
			atomic_store(&tr->stopping, true);
			for (int k = 0; k <= i; k++)
				rd_ctx_stop(tr->ctx[k]);
			h->rpc_handle(h, TE_RPC_CONNECTION, NULL, NULL);
			goto fail;
		}
	}
	tr->dispatcher = g_thread_new("te-rdma-dispatch", dispatcher_thread, tr);
	tr->reclaimer = g_thread_new("te-rdma-reclaim", reclaimer_thread, tr);
	rd_provider_track(tr, true);

	GString *desc = g_string_new(NULL);
	for (int i = 0; i < tr->nctx; i++)
		g_string_append_printf(desc, "%s%s", i ? ", " : "", tr->ctx[i]->name);
	h->log(h, TE_LOG_INFO, "RDMA transport up on %s (verbs: %s, slice %llu bytes, %u QPs per "
			       "endpoint, %u workers per device)",
	       desc->str, tr->verbs->name, (unsigned long long)tr->cfg.slice_size, tr->cfg.num_qp_per_ep,
	       tr->cfg.workers_per_ctx);
	g_string_free(desc, TRUE);
	args_clear(&a);
	g_ptr_array_unref(names);
	g_string_free(err, TRUE);
	*out = tr;
	return 0;
fail:
	if (list)
		tr->verbs->free_device_list(list);
	args_clear(&a);
	g_ptr_array_unref(names);
	g_string_free(err, TRUE);
	tr_free(tr);
	return rc < 0 ? rc : -EINVAL;
}

static void rd_destroy(void *ctx)
{
	rd_transport *tr = ctx;

	rd_provider_track(tr, false);
	/* Waits for a handshake being served, and refuses new ones. */
	tr->host->rpc_handle(tr->host, TE_RPC_CONNECTION, NULL, NULL);
	atomic_store(&tr->stopping, true);
	g_mutex_lock(&tr->pend_lock);
	g_cond_broadcast(&tr->pend_cond);
	g_mutex_unlock(&tr->pend_lock);
	g_mutex_lock(&tr->pool_lock);
	g_cond_broadcast(&tr->pool_cond);
	g_mutex_unlock(&tr->pool_lock);
	g_mutex_lock(&tr->reclaim_lock);
	g_cond_broadcast(&tr->reclaim_cond);
	g_mutex_unlock(&tr->reclaim_lock);
	g_thread_join(tr->dispatcher);
	g_thread_join(tr->reclaimer);
	/* Flush whatever is posted so the workers see it come back. */
	for (int i = 0; i < tr->nctx; i++)
		rd_ep_pool_flush(tr->ctx[i]);
	for (int i = 0; i < tr->nctx; i++)
		rd_ctx_kick(tr->ctx[i]);
	for (int i = 0; i < tr->nctx; i++)
		rd_ctx_stop(tr->ctx[i]);
	/* Requests the hardware never completed: end them here. */
	for (uint32_t i = 0; i < tr->nslices; i++) {
		rd_slice *s = &tr->slices[i];
		if (s->t != NULL && s->ep != NULL) {
			RD_LOG(tr, TE_LOG_WARN, "a slice posted on %s never completed; failing it",
			       s->ep->peer_nic_path);
			rd_ep *ep = s->ep;
			s->ep = NULL;
			slice_fail(tr, s, -ECANCELED, "transport shutting down");
			rd_ep_unref(ep);
		}
	}
	/* Registrations the host did not remove. */
	for (guint i = 0; i < tr->mrs->len; i++)
		mr_unref(g_ptr_array_index(tr->mrs, i));
	g_ptr_array_set_size(tr->mrs, 0);
	tr_free(tr);
}

/* ------------------------------------------------------------ probe/report */

static int rd_probe(const te_host *h, char *why, size_t why_len)
{
	rd_provider prov;
	rd_provider_get(h, &prov);
	const rv_verbs *v = prov.verbs;
	GPtrArray *names = g_ptr_array_new_with_free_func(g_free);
	GPtrArray *allow = env_devices(h);
	GString *err = g_string_new(NULL);
	struct ibv_device **list = NULL;
	int num = 0;
	int rc = select_devices(v, prov.sysfs_root, allow, &list, &num, names, err);

	if (rc < 0)
		snprintf(why, why_len, "%s", err->str);
	else
		v->free_device_list(list);
	if (allow)
		g_ptr_array_unref(allow);
	g_ptr_array_unref(names);
	g_string_free(err, TRUE);
	return rc;
}

static const char *port_state_name(enum ibv_port_state s)
{
	switch (s) {
	case IBV_PORT_DOWN: return "DOWN";
	case IBV_PORT_INIT: return "INIT";
	case IBV_PORT_ARMED: return "ARMED";
	case IBV_PORT_ACTIVE: return "ACTIVE";
	default: return "?";
	}
}

static int rd_report(const te_host *h, char **text)
{
	rd_provider prov;
	rd_provider_get(h, &prov);
	const rv_verbs *v = prov.verbs;
	const char *root = prov.sysfs_root;
	GPtrArray *names = g_ptr_array_new_with_free_func(g_free);
	GPtrArray *allow = env_devices(h);
	GString *out = g_string_new(NULL), *err = g_string_new(NULL);
	struct ibv_device **list = NULL;
	rd_topo topo = { 0 };
	rd_config cfg;
	int num = 0;

	read_config(h, &cfg);
	g_string_append_printf(out, "  verbs: %s%s%s\n", v->name, strcmp(root, "/") ? ", sysfs root " : "",
			       strcmp(root, "/") ? root : "");
	if (select_devices(v, root, allow, &list, &num, names, err) < 0) {
		g_string_append_printf(out, "  %s\n", err->str);
		goto done;
	}
	if (discover(h, root, names, &topo, err) < 0) {
		g_string_append_printf(out, "  topology: %s\n", err->str);
		goto done;
	}
	g_string_append(out, "  devices (canonical order):\n");
	for (int i = 0; i < topo.nhca; i++) {
		rd_hca *hc = &topo.hcas[i];
		struct ibv_device *dev = NULL;
		for (int k = 0; k < num && !dev; k++)
			if (strcmp(v->get_device_name(list[k]), hc->name) == 0)
				dev = list[k];
		g_string_append_printf(out, "    %-10s PCI %s, NUMA node %d\n", hc->name,
				       hc->pci[0] ? hc->pci : "?", hc->numa);
		struct ibv_context *vc = dev ? v->open_device(dev) : NULL;
		if (vc == NULL) {
			g_string_append_printf(out, "               cannot open: %s\n", g_strerror(errno));
			continue;
		}
		struct ibv_port_attr pa;
		if (v->query_port(vc, (uint8_t)cfg.ib_port, &pa) == 0) {
			static const int mtu_bytes[] = { 0, 256, 512, 1024, 2048, 4096 };
			int mtu = pa.active_mtu <= 5 ? mtu_bytes[pa.active_mtu] : 0;
			g_string_append_printf(out, "               port %u %s, %s, LID %u, MTU %d\n", cfg.ib_port,
					       port_state_name(pa.state),
					       pa.link_layer == IBV_LINK_LAYER_INFINIBAND ? "InfiniBand"
											  : "Ethernet",
					       pa.lid, mtu);
			GString *why = g_string_new(NULL);
			int gi = 0;
			uint8_t gid[16];
			char gs[48];
			if (rd_pick_gid(v, vc, (uint8_t)cfg.ib_port, cfg.gid_index, &gi, gid, why) == 0) {
				rd_gid_format(gid, gs);
				g_string_append_printf(out, "               %s: %s\n", why->str, gs);
			} else {
				g_string_append_printf(out, "               GID: %s\n", why->str);
			}
			g_string_free(why, TRUE);
		} else {
			g_string_append_printf(out, "               port %u cannot be queried\n", cfg.ib_port);
		}
		v->close_device(vc);
	}
	char (*devs)[RD_NAME_MAX] = g_malloc0_n((gsize)(topo.nhca), RD_NAME_MAX);
	for (int i = 0; i < topo.nhca; i++)
		g_strlcpy(devs[i], topo.hcas[i].name, RD_NAME_MAX);
	JsonNode *m = rd_matrix_to_json(topo.locs, topo.nloc, devs);
	char *mt = json_text(m);
	json_node_unref(m);
	g_free(devs);
	g_string_append_printf(out, "  priority matrix: %s\n", mt ? mt : "?");
	free(mt);
done:
	if (list)
		v->free_device_list(list);
	rd_topo_clear(&topo);
	if (allow)
		g_ptr_array_unref(allow);
	g_ptr_array_unref(names);
	g_string_free(err, TRUE);
	*text = malloc(out->len + 1);
	if (*text != NULL)
		memcpy(*text, out->str, out->len + 1);
	g_string_free(out, TRUE);
	return *text ? 0 : -ENOMEM;
}

/* ------------------------------------------------------------------ ops */

static const te_transport_ops rd_ops = {
	.size = sizeof(te_transport_ops),
	.flags = TE_TRANSPORT_MEMORY | TE_TRANSPORT_DEVICE_MEMORY,
	.probe = rd_probe,
	.create = rd_create,
	.destroy = rd_destroy,
	.describe = rd_describe,
	.mem_register = rd_mem_register,
	.mem_unregister = rd_mem_unregister,
	.segment_open = rd_segment_open,
	.segment_close = rd_segment_close,
	.submit = rd_submit,
	.report = rd_report,
};

TE_PLUGIN_DEFINE(TE_KIND_TRANSPORT, "rdma", "1.0.0",
		 "RDMA (InfiniBand, RoCE) through libibverbs: topology-aware, multi-NIC, with failover",
		 "Apache-2.0", &rd_ops)
