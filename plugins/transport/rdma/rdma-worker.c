/* SPDX-License-Identifier: Apache-2.0 */
/* Each NIC's workers: post the queued slices as RDMA READ/WRITE work
 * requests and poll the completion queues, sleeping on the completion
 * channels when idle. */
#include <poll.h>
#include <string.h>

#include "rdma.h"

#define STOP_DRAIN_MS 10000
#define RD_SPIN_BUSY 64 /* idle polls before sleeping while requests are in flight */

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
	te_transfer *t = s->t;

	/* Before the slot is cleared, so that expire() sees it once it sees
	 * the slice gone (a WRITE's bytes may have left). */
	if (wc->status != IBV_WC_SUCCESS && s->opcode == TE_OP_WRITE)
		__atomic_fetch_or(&t->plugin_data[2], (uintptr_t)RD_T_WFAIL, __ATOMIC_SEQ_CST);
	rd_posted_clear(tr, s);
	/* Read after the clear: either expire() sees the slot empty, or this
	 * sees the transfer ended and wakes it (t lives until its slices end). */
	bool expired = rd_t_expired(t);
	atomic_fetch_sub_explicit(&ep->depth[s->qp], 1, memory_order_relaxed);
	atomic_fetch_sub_explicit(&c->cq_out[q], 1, memory_order_relaxed);
	RD_COUNT(tr, c, TE_METRIC_INFLIGHT_BYTES, -(int64_t)s->length);
	if (wc->status == IBV_WC_SUCCESS) {
		RD_COUNT(tr, c, TE_METRIC_BYTES, s->length);
		atomic_store_explicit(&ep->last_used, now, memory_order_relaxed);
		s->ep = NULL;
		rd_slice_done(tr, s);
		rd_ep_unref(ep);
		if (expired)
			rd_expire_wake(tr);
		return;
	}
	if (wc->status == IBV_WC_WR_FLUSH_ERR && atomic_load(&ep->fenced)) {
		/* Flushed because another transfer on this endpoint ended early:
		 * sent again on a new endpoint (or failed, if its own ended). */
		rd_slice_resend(tr, s, "its endpoint was closed for a transfer that ended early");
		if (expired)
			rd_expire_wake(tr);
		return;
	}
	int err = wc_error(wc->status);
	RD_COUNT(tr, c, TE_METRIC_ERRORS, 1);
	rd_ep_fail(ep, err, wc_status_name(wc->status));
	/* Keys the peer's NIC no longer knows (opened again after a fatal
	 * error, or the buffer gone): other paths may still serve this slice,
	 * and the host fetches the peer's descriptor for the next ones. */
	if (wc->status == IBV_WC_REM_ACCESS_ERR && TE_HAS_OP(tr->host, transfer_stale))
		tr->host->transfer_stale(tr->host, s->t);
	if (wc->status == IBV_WC_RETRY_EXC_ERR) {
		/* Our own port may be the one that went down: check it now
		 * rather than wait for the event. */
		struct ibv_port_attr pa;
		if (tr->verbs->query_port(c->vctx, c->port, &pa) == 0 && pa.state != IBV_PORT_ACTIVE)
			rd_ctx_set_active(c, false, "port found down after a failed request");
	}
	rd_slice_retry(tr, s, err, wc_status_name(wc->status)); /* drops s->ep */
	if (expired)
		rd_expire_wake(tr);
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
 * fit (queue pairs or the completion queue full): they go back to the queue.
 *
 * With deadlines each slice passes its transfer's gate (transfer_enter/
 * leave) before it is posted, and is marked in posted_t inside it: once the
 * host ended a transfer none of its slices is marked any more, and expire()
 * finds the marked ones (a marked slice whose post comes after expire()
 * moved its QP to ERR is flushed). The gate is left before the post: a
 * posted slice may complete, and its transfer end, at once. The one copy the
 * CPU makes of a transfer's memory, an inline WRITE's bytes, is made inside
 * the gate into a bounce buffer that the post copies from. */
#define RD_INLINE_BOUNCE 256
static int post_run(rd_ctx *c, rd_ep *ep, rd_slice **sl, int k, rd_slice **back, int *nback)
{
	rd_transport *tr = c->tr;
	const rv_verbs *v = tr->verbs;
	const te_host *h = tr->host;
	struct ibv_send_wr wr[RD_POST_BATCH];
	struct ibv_sge sge[RD_POST_BATCH];
	rd_slice *ps[RD_POST_BATCH];
	uint8_t bounce[RD_POST_BATCH][RD_INLINE_BOUNCE];
	int done = 0;

	for (int tries = 0; tries < ep->nqp && done < k; tries++) {
		unsigned turn = atomic_fetch_add_explicit(&ep->rr, 1, memory_order_relaxed);
		int qi = (int)(turn % (unsigned)ep->nqp);
		int room = (int)c->max_wr - atomic_load(&ep->depth[qi]);
		int croom = (int)c->max_cqe - atomic_load(&c->cq_out[ep->cq]);
		int m = MIN(MIN(room, croom), k - done);
		if (m <= 0)
			continue;
		int np = 0;
		for (int i = 0; i < m; i++) {
			rd_slice *s = sl[done + i];
			bool is_write = s->opcode == TE_OP_WRITE;
			/* Inline data is copied by the CPU: never device memory. */
			bool inl = is_write && s->length <= c->max_inline && !s->mr->device &&
				   (!tr->deadlines || s->length <= RD_INLINE_BOUNCE);
			uint64_t addr = s->local_addr;
			s->qp = qi;
			if (tr->deadlines) {
				if (!h->transfer_enter(h, s->t)) {
					s->ep = NULL;
					rd_ep_unref(ep); /* the caller holds one of its own */
					rd_slice_fail(tr, s, RD_ENDED_ERR, RD_ENDED_WHY);
					continue;
				}
				if (inl) {
					memcpy(bounce[np], (const void *)(uintptr_t)s->local_addr, s->length);
					addr = (uintptr_t)bounce[np];
				}
				rd_posted_set(tr, s, c->index);
				h->transfer_leave(h, s->t);
			} else {
				rd_posted_set(tr, s, c->index);
			}
			sge[np] = (struct ibv_sge){ .addr = addr, .length = s->length,
						    .lkey = s->mr->lkey[c->index] };
			wr[np] = (struct ibv_send_wr){
				.wr_id = (uintptr_t)s,
				.sg_list = &sge[np],
				.num_sge = 1,
				.opcode = is_write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ,
				.send_flags = IBV_SEND_SIGNALED | (inl ? IBV_SEND_INLINE : 0),
			};
			wr[np].wr.rdma.remote_addr = s->remote_addr;
			wr[np].wr.rdma.rkey = s->rkey[s->rdev];
			if (np > 0)
				wr[np - 1].next = &wr[np];
			ps[np++] = s;
		}
		done += m;
		if (np == 0)
			continue;
		/* Before the post: completions may come at once. */
		atomic_fetch_add(&ep->depth[qi], np);
		atomic_fetch_add(&c->cq_out[ep->cq], np);
		struct ibv_send_wr *bad = NULL;
		int rc = v->post_send(ep->qps[qi], wr, &bad);
		int posted = np;
		if (rc != 0)
			posted = bad ? (int)(bad - wr) : 0;
		if (tr->metrics) { /* each posted request completes once, and is counted out then */
			uint64_t bytes = 0;
			for (int i = 0; i < posted; i++)
				bytes += sge[i].length;
			RD_COUNT(tr, c, TE_METRIC_INFLIGHT_BYTES, bytes);
		}
		if (rc != 0) {
			int failed = np - posted;
			atomic_fetch_sub(&ep->depth[qi], failed);
			atomic_fetch_sub(&c->cq_out[ep->cq], failed);
			rd_ep_fail(ep, -EIO, "posting work requests failed");
			for (int i = posted; i < np; i++) {
				rd_posted_clear(tr, ps[i]);
				rd_slice_retry(tr, ps[i], -EIO, g_strerror(rc));
			}
			/* The rest of the run goes back; the endpoint is gone. */
			break;
		}
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
	char *connect_name[RD_POST_BATCH];
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
		if (rd_t_expired(in[i]->t))
			rd_slice_fail(tr, in[i], RD_ENDED_ERR, RD_ENDED_WHY);
		else if (tr->host->canceled(tr->host, in[i]->t))
			rd_slice_fail(tr, in[i], -ECANCELED, "batch canceled");
		else
			in[keep++] = in[i];
	}
	nready = rd_ep_resolve(c, in, keep, ready, connect, connect_name, &nconnect);
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
		rd_ep_connect(connect[i], connect_name[i]);
		g_free(connect_name[i]);
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
		if (atomic_load(&c->halt))
			break; /* the device is being opened again: its queues go */
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
		/* With nothing in flight and nothing queued only new work (which
		 * rings wake_fd) can end the sleep: no timer, so an idle engine's
		 * workers do not wake. With requests out, or work waiting for
		 * room, a look every second besides the events. */
		int wait_ms = atomic_load(&tr->stopping) ? 10 : outstanding(c) || blocked ? 1000 : -1;
		if (poll(pf, (nfds_t)npf, wait_ms) < 0 && errno != EINTR)
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
