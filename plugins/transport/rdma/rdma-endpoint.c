/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Endpoints: the connection between one local NIC and one peer NIC, made of
 * several RC queue pairs. They are created on first use through the
 * Connection handshake and kept in a per-NIC pool capped at
 * TE_RDMA_MAX_EP_PER_CTX with SIEVE eviction (or FIFO). An endpoint that hits
 * an error leaves the pool at once; the next transfer builds a new one, and
 * the peer replaces its side when that handshake arrives. Idle endpoints are
 * reclaimed periodically.
 *
 * Lifetime: the pool holds one reference, every posted slice one, and a
 * thread using an endpoint one; the queue pairs are destroyed with the last.
 */
#include <stdio.h>
#include <string.h>

#include "rdma.h"
#include "teu-dlist.h"

#define MAX_HOP_LIMIT 16
#define QP_TIMEOUT 14   /* 4.096 us << 14: 67 ms before a request is resent */
/* Resends before IBV_WC_RETRY_EXC_ERR. Not 7: Soft-RoCE (rdma_rxe) takes 7
 * as "retry for ever" (as the spec does for rnr_retry only), so a peer that
 * vanished would leave its requests in flight for good; 6 bounds the wait
 * to about half a second on every provider. */
#define QP_RETRY_CNT 6
#define QP_RNR_RETRY 7  /* RNR NAKs answer SENDs without a receive; never ours */

/* --------------------------------------------------------------- objects */

static rd_ep *ep_new(rd_ctx *c, const char *peer_nic_path, bool passive)
{
	rd_ep *ep = g_new0(rd_ep, 1);

	ep->ctx = c;
	ep->peer_nic_path = g_strdup(peer_nic_path);
	ep->passive = passive;
	atomic_init(&ep->state, EP_NEW);
	atomic_init(&ep->refs, 1);
	ep->cq = (int)(atomic_fetch_add(&c->ep_seq, 1) % (unsigned)MAX(c->ncq, 1));
	atomic_store(&ep->last_used, rd_now_ms());
	atomic_fetch_add(&c->nep_live, 1);
	g_mutex_lock(&c->live_lock);
	TEU_DLIST_PUSH(c->live, ep, lprev, lnext);
	g_mutex_unlock(&c->live_lock);
	return ep;
}

static void ep_destroy(rd_ep *ep)
{
	rd_ctx *c = ep->ctx;
	const rv_verbs *v = c->tr->verbs;

	g_mutex_lock(&c->live_lock);
	TEU_DLIST_REMOVE(c->live, ep, lprev, lnext);
	g_mutex_unlock(&c->live_lock);
	g_rw_lock_reader_lock(&c->verbs_lock);
	for (int i = 0; i < ep->nqp; i++)
		if (ep->qps[i] != NULL && v->destroy_qp(ep->qps[i]) != 0)
			RD_LOG(c->tr, TE_LOG_WARN, "%s: destroying a QP of the endpoint to %s failed",
			       c->name, ep->peer_nic_path);
	g_rw_lock_reader_unlock(&c->verbs_lock);
	g_free(ep->qps);
	g_free(ep->depth);
	g_free(ep->peer_nic_path);
	g_free(ep);
	atomic_fetch_sub(&c->nep_live, 1); /* last: the context may be torn down after */
}

void rd_ep_unref(rd_ep *ep)
{
	if (ep != NULL && atomic_fetch_sub_explicit(&ep->refs, 1, memory_order_acq_rel) == 1)
		ep_destroy(ep);
}

/* ------------------------------------------------------------ the pool */

static void list_unlink(rd_ctx *c, rd_ep *ep)
{
	if (c->hand == ep)
		c->hand = ep->prev;
	TEU_DLIST_REMOVE_TAIL(c->head, c->tail, ep, prev, next);
}

/* Takes an endpoint out of the pool (ep_lock held); the caller drops the
 * pool's reference once unlocked. */
static bool pool_remove(rd_ctx *c, rd_ep *ep)
{
	if (!ep->in_pool)
		return false;
	list_unlink(c, ep);
	g_hash_table_remove(c->eps, ep->peer_nic_path);
	ep->in_pool = false;
	c->nep--;
	return true;
}

static void record_eviction(rd_transport *tr, const char *path)
{
	rd_counters *s = &tr->stats;

	atomic_fetch_add(&s->evicted, 1);
	g_mutex_lock(&s->lock);
	if (s->n_evicted == G_N_ELEMENTS(s->evicted_paths)) {
		memmove(s->evicted_paths[0], s->evicted_paths[1],
			sizeof s->evicted_paths - sizeof s->evicted_paths[0]);
		s->n_evicted--;
	}
	g_strlcpy(s->evicted_paths[s->n_evicted++], path, sizeof s->evicted_paths[0]);
	g_mutex_unlock(&s->lock);
}

/* SIEVE: the hand walks from the oldest entry towards the newest, clearing
 * visited bits, and evicts the first entry not visited since the hand last
 * passed it. Endpoints still connecting are passed over, and so is `skip`;
 * with `idle_only`, so are endpoints in use. */
static bool evictable(rd_ep *o, rd_ep *skip, bool idle_only)
{
	return o != skip && atomic_load(&o->state) != EP_NEW &&
	       (!idle_only || atomic_load(&o->refs) == 1);
}

static rd_ep *pool_victim(rd_ctx *c, rd_ep *skip, bool idle_only)
{
	rd_ep *o;
	unsigned steps = 0, limit = 2 * c->nep + 2;

	if (c->tr->cfg.fifo_store) {
		for (o = c->tail; o != NULL; o = o->prev)
			if (evictable(o, skip, idle_only))
				return o;
		return NULL;
	}
	o = c->hand ? c->hand : c->tail;
	while (o != NULL && steps++ < limit) {
		if (!evictable(o, skip, idle_only) || atomic_exchange(&o->visited, 0)) {
			o = o->prev ? o->prev : c->tail;
			continue;
		}
		c->hand = o->prev;
		return o;
	}
	return NULL;
}

/* Evicts down to the cap (ep_lock held); the evicted go to `gone`. */
static void pool_trim(rd_ctx *c, unsigned cap, rd_ep *skip, bool idle_only, GPtrArray *gone)
{
	while (c->nep > cap) {
		rd_ep *victim = pool_victim(c, skip, idle_only);
		if (victim == NULL)
			break; /* all busy or connecting: over the cap for now */
		pool_remove(c, victim);
		atomic_store(&victim->state, EP_DEAD);
		record_eviction(c->tr, victim->peer_nic_path);
		RD_LOG(c->tr, TE_LOG_DEBUG, "%s: evicted the endpoint to %s (pool of %u)", c->name,
		       victim->peer_nic_path, c->tr->cfg.max_ep_per_ctx);
		g_ptr_array_add(gone, victim);
	}
}

/* Inserts `ep` at the head, evicting to stay within the cap (ep_lock held).
 * Evicted endpoints are appended to `gone` for the caller to release. */
static void pool_insert(rd_ctx *c, rd_ep *ep, GPtrArray *gone)
{
	unsigned cap = c->tr->cfg.max_ep_per_ctx;
	pool_trim(c, cap > 0 ? cap - 1 : 0, NULL, false, gone);
	TEU_DLIST_PUSH_TAIL(c->head, c->tail, ep, prev, next);
	ep->in_pool = true;
	c->nep++;
	g_hash_table_insert(c->eps, ep->peer_nic_path, ep);
	rd_reclaimer_kick(c->tr); /* (lock order: ep_lock, then reclaim.lock) */
}

/* Slices parked on an endpoint leave with it: they are routed again. */
static rd_slice *take_pending(rd_ep *ep)
{
	rd_slice *s = ep->pending;
	ep->pending = ep->pending_tail = NULL;
	return s;
}

static void release_gone(GPtrArray *gone)
{
	for (guint i = 0; i < gone->len; i++) {
		rd_ep *ep = g_ptr_array_index(gone, i);
		g_mutex_lock(&ep->ctx->ep_lock);
		rd_slice *s = take_pending(ep);
		g_mutex_unlock(&ep->ctx->ep_lock);
		while (s != NULL) {
			rd_slice *n = s->next;
			rd_slice_retry(ep->ctx->tr, s, -ECONNRESET, "endpoint replaced");
			s = n;
		}
		rd_ep_unref(ep);
	}
}

unsigned rd_ep_count(rd_ctx *c)
{
	g_mutex_lock(&c->ep_lock);
	unsigned n = c->nep;
	g_mutex_unlock(&c->ep_lock);
	return n;
}

static void qps_to_error(rd_ep *ep)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	rd_ctx *c = ep->ctx;

	/* The QPs are published under ep_lock; once there, they stay until
	 * the endpoint is destroyed, which our reference prevents. */
	g_mutex_lock(&c->ep_lock);
	int n = ep->nqp;
	struct ibv_qp **qps = ep->qps;
	g_mutex_unlock(&c->ep_lock);
	for (int i = 0; i < n; i++)
		if (qps[i] != NULL)
			c->tr->verbs->modify_qp(qps[i], &a, IBV_QP_STATE);
}

static void ep_fail(rd_ep *ep, int error, const char *why, bool fence)
{
	rd_ctx *c = ep->ctx;
	bool removed;
	rd_slice *pending;

	g_mutex_lock(&c->ep_lock);
	int was = atomic_exchange(&ep->state, EP_DEAD);
	removed = pool_remove(c, ep);
	pending = take_pending(ep);
	g_mutex_unlock(&c->ep_lock);
	if (was != EP_DEAD && fence) {
		RD_LOG(c->tr, TE_LOG_DEBUG, "endpoint %s -> %s closed: %s; rebuilt on next use",
		       c->nic_path, ep->peer_nic_path, why);
	} else if (was != EP_DEAD) {
		atomic_fetch_add(&c->tr->stats.failed, 1);
		RD_LOG(c->tr, atomic_load(&c->tr->stopping) ? TE_LOG_DEBUG : TE_LOG_WARN,
		       "endpoint %s -> %s failed: %s; removed (rebuilt on next use)", c->nic_path,
		       ep->peer_nic_path, why);
	}
	/* Flush what is posted: those slices come back with errors and are
	 * retried elsewhere. */
	qps_to_error(ep);
	while (pending != NULL) {
		rd_slice *n = pending->next;
		if (fence)
			rd_slice_resend(c->tr, pending, why);
		else
			rd_slice_retry(c->tr, pending, error, why);
		pending = n;
	}
	if (removed)
		rd_ep_unref(ep);
}

void rd_ep_fail(rd_ep *ep, int error, const char *why)
{
	ep_fail(ep, error, why, false);
}

/* A reference on an endpoint whose count may be reaching 0 elsewhere (its
 * destruction then waits for live_lock, which the caller holds). */
static bool ep_try_ref(rd_ep *ep)
{
	int n = atomic_load(&ep->refs);

	while (n > 0)
		if (atomic_compare_exchange_weak(&ep->refs, &n, n + 1))
			return true;
	return false;
}

int rd_ep_fence(rd_ctx *c, const uintptr_t *keys, int n, const char *why)
{
	GPtrArray *found = g_ptr_array_new();

	g_mutex_lock(&c->live_lock);
	for (rd_ep *ep = c->live; ep != NULL; ep = ep->lnext)
		for (int k = 0; k < n; k++)
			if ((uintptr_t)ep == keys[k]) {
				if (ep_try_ref(ep))
					g_ptr_array_add(found, ep);
				break;
			}
	g_mutex_unlock(&c->live_lock);
	for (guint i = 0; i < found->len; i++) {
		rd_ep *ep = g_ptr_array_index(found, i);
		/* Before the flush: its completions must find it set. */
		atomic_store(&ep->fenced, true);
		ep_fail(ep, -ECONNRESET, why, true);
		rd_ep_unref(ep);
	}
	int nf = (int)found->len;
	g_ptr_array_unref(found);
	return nf;
}

rd_slice *rd_ep_take_parked(rd_ctx *c, const te_transfer *t)
{
	rd_slice *out = NULL, **tail = &out;

	g_mutex_lock(&c->ep_lock);
	for (rd_ep *ep = c->head; ep != NULL; ep = ep->next) {
		rd_slice **pp = &ep->pending;
		ep->pending_tail = NULL;
		while (*pp != NULL) {
			rd_slice *s = *pp;
			if (s->t == t) {
				*pp = s->next;
				s->next = NULL;
				s->parked = false;
				*tail = s;
				tail = &s->next;
			} else {
				ep->pending_tail = s;
				pp = &s->next;
			}
		}
	}
	g_mutex_unlock(&c->ep_lock);
	return out;
}

void rd_ep_fail_qp(rd_ctx *c, struct ibv_qp *qp, const char *why)
{
	rd_ep *found = NULL;

	g_mutex_lock(&c->ep_lock);
	for (rd_ep *ep = c->head; ep != NULL && found == NULL; ep = ep->next)
		for (int i = 0; i < ep->nqp && ep->qps; i++)
			if (ep->qps[i] == qp) {
				found = ep;
				atomic_fetch_add(&ep->refs, 1);
				break;
			}
	g_mutex_unlock(&c->ep_lock);
	if (found != NULL) {
		rd_ep_fail(found, -EIO, why);
		rd_ep_unref(found);
	}
}

void rd_ep_pool_flush(rd_ctx *c)
{
	GPtrArray *all = g_ptr_array_new();

	g_mutex_lock(&c->ep_lock);
	for (rd_ep *ep = c->head; ep != NULL; ep = ep->next) {
		atomic_fetch_add(&ep->refs, 1);
		g_ptr_array_add(all, ep);
	}
	g_mutex_unlock(&c->ep_lock);
	for (guint i = 0; i < all->len; i++) {
		qps_to_error(g_ptr_array_index(all, i));
		rd_ep_unref(g_ptr_array_index(all, i));
	}
	g_ptr_array_unref(all);
}

void rd_ep_pool_clear(rd_ctx *c)
{
	GPtrArray *gone = g_ptr_array_new();

	g_mutex_lock(&c->ep_lock);
	while (c->head != NULL) {
		rd_ep *ep = c->head;
		pool_remove(c, ep);
		atomic_store(&ep->state, EP_DEAD);
		g_ptr_array_add(gone, ep);
	}
	g_mutex_unlock(&c->ep_lock);
	release_gone(gone);
	g_ptr_array_unref(gone);
}

/* Moves a ready endpoint's parked slices back to the NIC's queue. */
static void ep_ready(rd_ep *ep)
{
	rd_ctx *c = ep->ctx;
	rd_slice *s, *tail = NULL;
	GPtrArray *gone = g_ptr_array_new();

	g_mutex_lock(&c->ep_lock);
	int expect = ep->passive ? EP_WAIT_ACK : EP_NEW;
	bool ok = atomic_compare_exchange_strong(&ep->state, &expect, EP_READY);
	s = ok ? take_pending(ep) : NULL;
	/* Endpoints that connected at the same time may have left the pool
	 * above its cap: evict idle ones now (not this one: its slices wait). */
	pool_trim(c, c->tr->cfg.max_ep_per_ctx, ep, true, gone);
	g_mutex_unlock(&c->ep_lock);
	for (rd_slice *p = s; p != NULL; p = p->next)
		tail = p;
	rd_ctx_enqueue(c, s, tail, true);
	release_gone(gone);
	g_ptr_array_unref(gone);
}

int64_t rd_ep_reclaim(rd_ctx *c, int64_t now, int64_t interval)
{
	const rd_config *cfg = &c->tr->cfg;
	GPtrArray *gone = g_ptr_array_new(), *ready = g_ptr_array_new();
	int64_t due = INT64_MAX;

	g_mutex_lock(&c->ep_lock);
	for (rd_ep *ep = c->head, *next; ep != NULL; ep = next) {
		next = ep->next;
		int st = atomic_load(&ep->state);
		if (st == EP_WAIT_ACK && now - ep->connected_at >= (int64_t)cfg->ready_grace_ms) {
			/* A peer that never sends ready_ack (older ones). */
			atomic_fetch_add(&ep->refs, 1);
			g_ptr_array_add(ready, ep);
			continue;
		}
		/* When this endpoint needs a look: its idle close when it is
		 * ready and unused; every interval while it is used or being
		 * set up. */
		if (st == EP_READY && atomic_load(&ep->refs) == 1)
			due = MIN(due, atomic_load(&ep->last_used) + (int64_t)cfg->ep_idle_ms);
		else
			due = MIN(due, now + interval);
		/* Idle: nothing posted (only the pool's reference) for long. */
		if (st == EP_READY && atomic_load(&ep->refs) == 1 &&
		    now - atomic_load(&ep->last_used) >= (int64_t)cfg->ep_idle_ms) {
			pool_remove(c, ep);
			atomic_store(&ep->state, EP_DEAD);
			atomic_fetch_add(&c->tr->stats.reclaimed, 1);
			RD_LOG(c->tr, TE_LOG_DEBUG, "%s: reclaimed the idle endpoint to %s", c->name,
			       ep->peer_nic_path);
			g_ptr_array_add(gone, ep);
		}
	}
	pool_trim(c, cfg->max_ep_per_ctx, NULL, true, gone);
	g_mutex_unlock(&c->ep_lock);
	for (guint i = 0; i < ready->len; i++) {
		rd_ep *ep = g_ptr_array_index(ready, i);
		ep_ready(ep);
		rd_ep_unref(ep);
	}
	if (ready->len > 0)
		due = MIN(due, now + interval);
	release_gone(gone);
	g_ptr_array_unref(gone);
	g_ptr_array_unref(ready);
	return due;
}

/* ------------------------------------------------------------ QP states */

/* Creates the endpoint's QPs (in INIT). They are published under ep_lock,
 * where other threads look at them, even when creating one failed (so the
 * endpoint's destruction frees those made). */
static int create_qps(rd_ep *ep, GString *why)
{
	rd_ctx *c = ep->ctx;
	const rv_verbs *v = c->tr->verbs;
	int n = (int)MAX(c->tr->cfg.num_qp_per_ep, 1), rc = 0;
	struct ibv_qp **qps = g_new0(struct ibv_qp *, n);
	atomic_int *depth = g_new0(atomic_int, n);

	/* Held until the endpoint is published: a device being opened again
	 * waits for it, and then sees it among the live endpoints. */
	g_rw_lock_reader_lock(&c->verbs_lock);
	if (atomic_load(&c->fatal) || c->pd == NULL || ep->cq >= c->ncq) {
		g_string_printf(why, "%s is out of service after a fatal error", c->name);
		rc = -ENETDOWN;
	}
	for (int i = 0; i < n && rc == 0; i++) {
		struct ibv_qp_init_attr a = {
			.qp_context = ep,
			.send_cq = c->cqs[ep->cq],
			.recv_cq = c->cqs[ep->cq],
			.qp_type = IBV_QPT_RC,
			.sq_sig_all = 0,
			.cap = {
				.max_send_wr = c->max_wr,
				.max_recv_wr = 1,
				.max_send_sge = c->max_sge,
				.max_recv_sge = 1,
				.max_inline_data = c->max_inline,
			},
		};
		qps[i] = v->create_qp(c->pd, &a);
		if (qps[i] == NULL) {
			g_string_printf(why, "cannot create a QP on %s: %s", c->name, g_strerror(errno));
			rc = -ENOMEM;
			break;
		}
		/* The device may grant less inline room than asked. */
		if (a.cap.max_inline_data < c->max_inline)
			c->max_inline = a.cap.max_inline_data;
		struct ibv_qp_attr at = {
			.qp_state = IBV_QPS_INIT,
			.port_num = c->port,
			.pkey_index = 0,
			.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
					   IBV_ACCESS_REMOTE_WRITE,
		};
		int mrc = v->modify_qp(qps[i], &at,
				       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
		if (mrc != 0) {
			g_string_printf(why, "QP RESET->INIT on %s failed: %s", c->name, g_strerror(mrc));
			rc = -mrc;
		}
	}
	g_mutex_lock(&c->ep_lock);
	ep->qps = qps;
	ep->depth = depth;
	ep->nqp = n;
	g_mutex_unlock(&c->ep_lock);
	g_rw_lock_reader_unlock(&c->verbs_lock);
	return rc;
}

/* INIT -> RTR -> RTS towards the peer's QPs. */
static int connect_qps(rd_ep *ep, const rd_hs *peer, GString *why)
{
	rd_ctx *c = ep->ctx;
	const rv_verbs *v = c->tr->verbs;
	uint8_t sgid[16];
	int sgid_index;

	rd_ctx_gid(c, sgid, &sgid_index);
	for (int i = 0; i < ep->nqp; i++) {
		struct ibv_qp_attr a = {
			.qp_state = IBV_QPS_RTR,
			.path_mtu = c->mtu,
			.dest_qp_num = peer->qp_num[i],
			.rq_psn = 0,
			.max_dest_rd_atomic = c->max_dest_rd_atomic,
			.min_rnr_timer = 12,
			.ah_attr = {
				.is_global = 1,
				.dlid = peer->local_lid,
				.sl = 0,
				.src_path_bits = 0,
				.port_num = c->port,
				.grh = {
					.sgid_index = (uint8_t)sgid_index,
					.hop_limit = MAX_HOP_LIMIT,
				},
			},
		};
		memcpy(a.ah_attr.grh.dgid.raw, peer->local_gid, 16);
		if (c->tr->cfg.ib_tc >= 0)
			a.ah_attr.grh.traffic_class = (uint8_t)c->tr->cfg.ib_tc;
		int rc = v->modify_qp(ep->qps[i], &a,
				      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					      IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
					      IBV_QP_MIN_RNR_TIMER);
		if (rc != 0) {
			g_string_printf(why, "QP INIT->RTR on %s failed: %s", c->name, g_strerror(rc));
			return -rc;
		}
		struct ibv_qp_attr r = {
			.qp_state = IBV_QPS_RTS,
			.timeout = QP_TIMEOUT,
			.retry_cnt = QP_RETRY_CNT,
			.rnr_retry = QP_RNR_RETRY,
			.sq_psn = 0,
			.max_rd_atomic = c->max_rd_atomic,
		};
		rc = v->modify_qp(ep->qps[i], &r,
				  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
		if (rc != 0) {
			g_string_printf(why, "QP RTR->RTS on %s failed: %s", c->name, g_strerror(rc));
			return -rc;
		}
	}
	return 0;
}

/* Our side of a handshake; the caller created `ep` or holds ep_lock. */
static void fill_local(const rd_ep *ep, rd_hs *hs, const char *peer_path)
{
	rd_ctx *c = ep->ctx;

	g_strlcpy(hs->local_nic_path, c->nic_path, sizeof hs->local_nic_path);
	g_strlcpy(hs->peer_nic_path, peer_path, sizeof hs->peer_nic_path);
	int index;
	hs->local_lid = c->lid;
	rd_ctx_gid(c, hs->local_gid, &index);
	hs->nqp = 0;
	for (int i = 0; i < ep->nqp && ep->qps && ep->qps[i]; i++)
		hs->qp_num[hs->nqp++] = ep->qps[i]->qp_num;
}

/* ------------------------------------------------------------- initiator */

int rd_ep_connect(rd_ep *ep, const char *seg_name)
{
	rd_ctx *c = ep->ctx;
	rd_transport *tr = c->tr;
	GString *why = g_string_new(NULL);
	rd_hs hs = { 0 }, peer;
	char *req = NULL, *reply = NULL;
	size_t req_len = 0, reply_len = 0;
	int rc;

	rc = create_qps(ep, why);
	if (rc < 0)
		goto fail;
	fill_local(ep, &hs, ep->peer_nic_path);
	req = rd_hs_encode(&hs, &req_len);
	if (req == NULL) {
		rc = -ENOMEM;
		g_string_assign(why, "out of memory");
		goto fail;
	}
	rc = tr->host->rpc_call(tr->host, seg_name, TE_RPC_CONNECTION, req, req_len, &reply,
				&reply_len, (int)tr->cfg.handshake_timeout_ms);
	if (rc < 0) {
		g_string_printf(why, "handshake with %s failed: %s", seg_name, rd_strerror(rc));
		goto fail;
	}
	rc = rd_hs_decode(reply, reply_len, &peer, why);
	if (rc < 0) {
		g_string_prepend(why, "malformed reply: ");
		rc = TE_ERR_PROTOCOL;
		goto fail;
	}
	if (peer.reply_msg[0] != '\0') {
		atomic_fetch_add(&tr->stats.rejected, 1);
		g_string_printf(why, "%s rejected the handshake: %s", seg_name, peer.reply_msg);
		rc = TE_ERR_REJECTED;
		goto fail;
	}
	if (strcmp(peer.local_nic_path, hs.peer_nic_path) != 0 ||
	    strcmp(peer.peer_nic_path, hs.local_nic_path) != 0) {
		g_string_printf(why, "reply names %s -> %s, expected %s -> %s", peer.local_nic_path,
				peer.peer_nic_path, hs.peer_nic_path, hs.local_nic_path);
		rc = TE_ERR_PROTOCOL;
		goto fail;
	}
	if (peer.nqp != ep->nqp) {
		g_string_printf(why, "peer offers %d QPs, %d expected (TE_RDMA_NUM_QP_PER_EP differs)",
				peer.nqp, ep->nqp);
		rc = TE_ERR_PROTOCOL;
		goto fail;
	}
	rc = connect_qps(ep, &peer, why);
	if (rc < 0)
		goto fail;
	ep->connected_at = rd_now_ms();
	atomic_fetch_add(&tr->stats.created, 1);
	/* Tell the peer our side is ready: it may then post on its side too. */
	free(req);
	free(reply);
	reply = NULL;
	hs.ready_ack = true;
	req = rd_hs_encode(&hs, &req_len);
	if (req != NULL && tr->host->rpc_call(tr->host, seg_name, TE_RPC_CONNECTION, req, req_len,
					      &reply, &reply_len,
					      (int)tr->cfg.handshake_timeout_ms) < 0)
		RD_LOG(tr, TE_LOG_DEBUG, "ready_ack to %s was not answered", seg_name);
	RD_LOG(tr, TE_LOG_DEBUG, "endpoint %s -> %s connected (%d QPs)", c->nic_path, ep->peer_nic_path,
	       ep->nqp);
	free(req);
	free(reply);
	g_string_free(why, TRUE);
	ep_ready(ep);
	return 0;
fail:
	free(req);
	free(reply);
	rc = rc < 0 ? rc : -EIO;
	rd_ep_fail(ep, rc, why->str);
	g_string_free(why, TRUE);
	return rc;
}

/* ------------------------------------------------------------- responder */

static int reply_hs(rd_hs *hs, char **reply, size_t *reply_len)
{
	*reply = rd_hs_encode(hs, reply_len);
	return *reply ? 0 : -ENOMEM;
}

static int reject(rd_transport *tr, const char *peer, rd_hs *in, char **reply, size_t *reply_len,
		  const char *fmt, ...) TE_PRINTF(6, 7);

static int reject(rd_transport *tr, const char *peer, rd_hs *in, char **reply, size_t *reply_len,
		  const char *fmt, ...)
{
	rd_hs out = { 0 };
	va_list ap;

	va_start(ap, fmt);
	g_vsnprintf(out.reply_msg, sizeof out.reply_msg, fmt, ap);
	va_end(ap);
	/* Echo the paths swapped, as a reply from the addressed NIC would. */
	g_strlcpy(out.local_nic_path, in->peer_nic_path, sizeof out.local_nic_path);
	g_strlcpy(out.peer_nic_path, in->local_nic_path, sizeof out.peer_nic_path);
	RD_LOG(tr, TE_LOG_WARN, "handshake from %s (%s) rejected: %s", peer, in->local_nic_path,
	       out.reply_msg);
	return reply_hs(&out, reply, reply_len);
}

int rd_ep_handle(void *user, const char *peer, const char *body, size_t len, char **reply,
		 size_t *reply_len)
{
	rd_transport *tr = user;
	GString *why = g_string_new(NULL);
	rd_hs in, out = { 0 };
	char server[RD_PATH_MAX], dev[RD_NAME_MAX];
	rd_ctx *c = NULL;
	rd_ep *ep = NULL;
	int rc;

	*reply = NULL;
	if (rd_hs_decode(body, len, &in, why) < 0) {
		/* Not a handshake at all: close the connection, answer nothing. A
		 * peer can send these at will, so a flood of lines is held back. */
		TE_HOST_LOG_LIMITED(tr->host, TE_LOG_WARN, "Connection frame from %s: %s; closing", peer,
				    why->str);
		g_string_free(why, TRUE);
		return TE_ERR_PROTOCOL;
	}
	g_string_free(why, TRUE);
	if (!rd_nic_path_split(in.peer_nic_path, server, sizeof server, dev, sizeof dev))
		return reject(tr, peer, &in, reply, reply_len, "bad peer_nic_path \"%s\"",
			      in.peer_nic_path);
	if (strcmp(server, tr->local_name) != 0)
		return reject(tr, peer, &in, reply, reply_len, "this is %s, not %s", tr->local_name, server);
	for (int i = 0; i < tr->nctx; i++)
		if (strcmp(tr->ctx[i]->name, dev) == 0)
			c = tr->ctx[i];
	if (c == NULL)
		return reject(tr, peer, &in, reply, reply_len, "no RDMA device %s on %s", dev,
			      tr->local_name);
	if (!atomic_load(&c->active))
		return reject(tr, peer, &in, reply, reply_len, "device %s is out of service", dev);

	if (in.ready_ack) {
		g_mutex_lock(&c->ep_lock);
		ep = g_hash_table_lookup(c->eps, in.local_nic_path);
		if (ep != NULL) {
			atomic_fetch_add(&ep->refs, 1);
			fill_local(ep, &out, in.local_nic_path); /* its QPs, under the lock */
		}
		g_mutex_unlock(&c->ep_lock);
		if (ep == NULL)
			return reject(tr, peer, &in, reply, reply_len, "no endpoint for %s",
				      in.local_nic_path);
		if (ep->passive)
			ep_ready(ep);
		rd_ep_unref(ep);
		return reply_hs(&out, reply, reply_len);
	}
	if (in.nqp != (int)tr->cfg.num_qp_per_ep)
		return reject(tr, peer, &in, reply, reply_len,
			      "QP count mismatch: %d offered, %u expected here (check MC_NUM_QP_PER_EP)",
			      in.nqp, tr->cfg.num_qp_per_ep);

	/* Both sides connecting to each other at once: the side with the
	 * smaller NIC path keeps its own attempt. */
	g_mutex_lock(&c->ep_lock);
	rd_ep *mine = g_hash_table_lookup(c->eps, in.local_nic_path);
	bool keep_mine = mine != NULL && atomic_load(&mine->state) == EP_NEW && !mine->passive &&
			 strcmp(c->nic_path, in.local_nic_path) < 0;
	g_mutex_unlock(&c->ep_lock);
	if (keep_mine)
		return reject(tr, peer, &in, reply, reply_len,
			      "simultaneous connection attempt; %s proceeds with its own", c->nic_path);

	GString *err = g_string_new(NULL);
	ep = ep_new(c, in.local_nic_path, true);
	rc = create_qps(ep, err);
	if (rc == 0)
		rc = connect_qps(ep, &in, err);
	if (rc < 0) {
		int r = reject(tr, peer, &in, reply, reply_len, "cannot set up QPs: %s", err->str);
		g_string_free(err, TRUE);
		rd_ep_unref(ep);
		return r;
	}
	g_string_free(err, TRUE);
	ep->connected_at = rd_now_ms();
	atomic_store(&ep->state, EP_WAIT_ACK);

	GPtrArray *gone = g_ptr_array_new();
	g_mutex_lock(&c->ep_lock);
	rd_ep *old = g_hash_table_lookup(c->eps, in.local_nic_path);
	if (old != NULL) {
		/* The peer rebuilt its side (after an error or an eviction there):
		 * ours is stale. */
		pool_remove(c, old);
		atomic_store(&old->state, EP_DEAD);
		atomic_fetch_add(&old->refs, 1);
	}
	pool_insert(c, ep, gone);
	fill_local(ep, &out, in.local_nic_path);
	g_mutex_unlock(&c->ep_lock);
	if (old != NULL) {
		/* Its posted requests can no longer reach the peer: flush them
		 * now so they are retried on the new endpoint. */
		qps_to_error(old);
		g_ptr_array_add(gone, old);      /* the pool's reference */
		rd_ep_unref(old);                /* ours */
	}
	release_gone(gone);
	g_ptr_array_unref(gone);
	atomic_fetch_add(&tr->stats.created, 1);
	RD_LOG(tr, TE_LOG_DEBUG, "endpoint %s <- %s accepted (%d QPs)", c->nic_path, in.local_nic_path,
	       in.nqp);
	return reply_hs(&out, reply, reply_len);
}

/* ------------------------------------------------------------ resolving */

int rd_ep_resolve(rd_ctx *c, rd_slice **in, int n, rd_slice **ready, rd_ep **connect, char **connect_name,
		  int *nconnect)
{
	GPtrArray *gone = g_ptr_array_new();
	int nready = 0;
	rd_ep *last = NULL;

	*nconnect = 0;
	g_mutex_lock(&c->ep_lock);
	for (int i = 0; i < n; i++) {
		rd_slice *s = in[i];
		const char *path = s->seg->devs[s->rdev].nic_path;
		rd_ep *ep = last && strcmp(last->peer_nic_path, path) == 0 && last->in_pool
				    ? last
				    : g_hash_table_lookup(c->eps, path);
		if (ep == NULL) {
			ep = ep_new(c, path, false);
			pool_insert(c, ep, gone);
			atomic_fetch_add(&ep->refs, 1);
			/* The segment's name, copied while the slice is ours: once
			 * parked, expire() may end it, and the segment may close
			 * during the handshake. */
			connect[*nconnect] = ep;
			connect_name[(*nconnect)++] = g_strdup(s->seg->name);
		} else if (!s->parked) {
			/* A parked slice coming back is the same access. */
			atomic_store(&ep->visited, 1);
		}
		s->parked = false;
		last = ep;
		/* Parked until connected, or until the peer's ready_ack (the
		 * reclaimer releases them after a grace period for peers that
		 * send none). State changes happen under ep_lock too. */
		if (atomic_load(&ep->state) == EP_READY) {
			atomic_fetch_add(&ep->refs, 1);
			s->ep = ep;
			ready[nready++] = s;
		} else {
			s->parked = true;
			TEU_FIFO_PUSH(ep->pending, ep->pending_tail, s);
		}
	}
	g_mutex_unlock(&c->ep_lock);
	release_gone(gone);
	g_ptr_array_unref(gone);
	return nready;
}
