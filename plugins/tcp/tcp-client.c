/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Client connections: this engine's requests to one peer's data port.
 *
 * A connection pulls slices from its peer's backlog into a ring of wire
 * requests, as long as it has fewer than `depth` requests and `window` bytes
 * in flight, or fewer than two requests (so that slices larger than the
 * window still overlap one another's round trips). Replies come back in
 * order, so one readv can scatter many of them: status frames into the ring,
 * READ payloads straight into the registered destinations. Likewise one
 * sendmsg carries many headers and WRITE payloads, straight from the
 * registered sources.
 *
 * This file keeps the backlog, failures and connecting; tcp-client-wire.c
 * moves the bytes, tcp-client-drive.c is the I/O thread's side and
 * tcp-client-caller.c the callers' (tcp-client.h).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <unistd.h>

#include "tcp-client.h"
#include "teu-hostport.h"

/* ----------------------------------------------------------- the backlog */

/* Puts slices back for another connection (p->lock held). */
static void retry_add(tcp_peer *p, const tcp_retry *r, size_t n)
{
	if (n == 0)
		return;
	if (p->nretry + n > p->cap_retry) {
		p->cap_retry = MAX(p->cap_retry * 2, p->nretry + n);
		p->retry = g_renew(tcp_retry, p->retry, p->cap_retry);
	}
	memcpy(p->retry + p->nretry, r, n * sizeof *r);
	p->nretry += n;
	for (size_t i = 0; i < n; i++)
		p->bl_bytes += r[i].len;
	atomic_store(&p->has_work, 1);
}

/* Completes a slice that leaves a fence or a ring unanswered. */
static void complete_slice(const te_host *h, te_transfer *t, bool counted, uint64_t bytes, int err)
{
	if (counted)
		tcp_unsettled_add(t, -1);
	h->complete(h, t, bytes, err);
}

/* Whether `err` means the peer can apply nothing more of what it was sent:
 * the instance goes away (destroy), or nobody listens at its port. */
static bool err_final(int err)
{
	return err == -ESHUTDOWN || err == -ECANCELED || err == -ECONNREFUSED;
}

/* A FENCE that will not be answered on its connection. The WRITEs it holds
 * fail with `err`, except those of transfers the host ended whose bytes
 * left: the peer may still apply them, so they wait for the FENCE to be
 * answered on another connection (unless `err` is final). Returns the
 * fence holding those, to send again, or NULL (freed). */
static tcp_fence *fence_lost(tcp_ctx *c, tcp_fence *f, int err, size_t *nfailed)
{
	size_t k = 0;

	for (size_t i = 0; i < f->n; i++) {
		tcp_retry *r = &f->held[i];
		if (!err_final(err) && tcp_gate_closed(c, r->t)) {
			if (r->counted)
				f->held[k++] = *r;
			else
				tcp_dead_add(c, r->t, false);
			continue;
		}
		complete_slice(c->host, r->t, r->counted, 0, err);
		++*nfailed;
	}
	f->n = k;
	if (k > 0)
		return f;
	g_free(f);
	return NULL;
}

/* Puts fences back on the peer's list (p->lock held). */
static void fences_requeue(tcp_peer *p, tcp_fence *list)
{
	while (list != NULL) {
		tcp_fence *f = list;
		list = f->next;
		f->next = p->fences;
		p->fences = f;
		atomic_store(&p->has_work, 1);
	}
}

void tcp_fence_done(tcp_peer *p, tcp_fence *f)
{
	tcp_ctx *c = p->ctx;
	tcp_retry *back = g_new(tcp_retry, f->n);
	size_t k = 0, nback = 0;

	/* The peer applies nothing more from the fenced connection: what
	 * the host ended is settled now, the rest goes out again. */
	for (size_t i = 0; i < f->n; i++) {
		tcp_retry r = f->held[i];
		if (tcp_gate_closed(c, r.t)) {
			f->held[k++] = r;
			continue;
		}
		if (r.counted)
			tcp_unsettled_add(r.t, -1);
		r.counted = false;
		back[nback++] = r;
	}
	if (nback > 0) {
		g_mutex_lock(&p->lock);
		retry_add(p, back, nback);
		g_mutex_unlock(&p->lock);
	}
	g_free(back);
	for (size_t i = 0; i < k; i++)
		tcp_dead_add(c, f->held[i].t, f->held[i].counted);
	g_free(f);
	if (nback > 0)
		tcp_peer_kick_all(p);
}

/* Completes every slice still waiting in the peer's backlog and retry list,
 * and the WRITEs held by fences not yet sent (but those of transfers the host
 * ended, which wait for their FENCE's answer, see fence_lost). */
void tcp_peer_fail_pending(tcp_peer *p, int err)
{
	tcp_ctx *c = p->ctx;
	const te_host *h = c->host;
	uint64_t slice = c->cfg.slice;
	te_transfer *t;
	tcp_retry *retry;
	tcp_fence *fences, *kept = NULL;
	size_t nretry;

	g_mutex_lock(&p->lock);
	t = p->bl_head;
	/* Out of the backlog for expire(): no bytes left in plugin_data[1],
	 * the slices left in plugin_data[2] (no longer a link). */
	for (te_transfer *u = t; u != NULL; u = (te_transfer *)u->plugin_data[0]) {
		uint64_t left = u->plugin_data[1];
		u->plugin_data[2] = (uintptr_t)((left + slice - 1) / slice);
		u->plugin_data[1] = 0;
	}
	p->bl_head = p->bl_tail = NULL;
	retry = p->retry;
	nretry = p->nretry;
	p->retry = NULL;
	p->nretry = p->cap_retry = 0;
	p->bl_bytes = 0;
	fences = p->fences;
	p->fences = NULL;
	atomic_store(&p->has_work, 0);
	g_mutex_unlock(&p->lock);

	size_t n = 0;
	for (size_t i = 0; i < nretry; i++, n++)
		h->complete(h, retry[i].t, 0, err);
	g_free(retry);
	while (fences != NULL) {
		tcp_fence *next = fences->next, *f = fence_lost(c, fences, err, &n);
		if (f != NULL) {
			f->next = kept;
			kept = f;
		}
		fences = next;
	}
	while (t != NULL) {
		te_transfer *next = (te_transfer *)t->plugin_data[0];
		uint64_t slices = t->plugin_data[2];
		/* `t` may be reused once its last slice completes: read first. */
		for (uint64_t i = 0; i < slices; i++, n++)
			h->complete(h, t, 0, err);
		t = next;
	}
	if (kept != NULL) {
		g_mutex_lock(&p->lock);
		fences_requeue(p, kept);
		g_mutex_unlock(&p->lock);
	}
	if (n > 0)
		TE_HOST_LOG_LIMITED(p->ctx->host, TE_LOG_WARN, "%zu queued requests to %s failed: %s", n, p->name,
				    tcp_strerror(err));
}

/* The earliest deadline among the transfers waiting for a connection. */
int64_t tcp_peer_waiting_deadline(tcp_peer *p)
{
	const tcp_ctx *c = p->ctx;
	const te_host *h = c->host;
	int64_t dl = 0;

	if (!c->deadlines)
		return 0;
	g_mutex_lock(&p->lock);
	for (te_transfer *t = p->bl_head; t != NULL; t = (te_transfer *)t->plugin_data[0]) {
		int64_t d = h->transfer_deadline(h, t);
		if (d > 0 && (dl == 0 || d < dl))
			dl = d;
	}
	for (size_t i = 0; i < p->nretry; i++) {
		int64_t d = h->transfer_deadline(h, p->retry[i].t);
		if (d > 0 && (dl == 0 || d < dl))
			dl = d;
	}
	g_mutex_unlock(&p->lock);
	return dl;
}

static void prep(tcp_cconn *cc, tcp_slot *s)
{
	te_transfer *t = s->t;
	bool v2 = cc->peer->version >= 2;

	s->sg = false;
	s->sgn = 0;
	s->hlen = TCP_HDR_SIZE;
	s->err = 0;
	if (s->fence != NULL) {
		/* Only to peers that fence, which speak v2: answered with a status. */
		s->op = TCP_OP_FENCE;
		tcp_hdr_encode(s->hdr, s->fence->lane, s->fence->gen, TCP_OP_V2 | TCP_OP_FENCE);
		s->sent = s->rcvd = s->status = 0;
		s->stot = TCP_HDR_SIZE;
		s->rtot = TCP_STATUS_SIZE;
		return;
	}
	s->op = (uint8_t)t->opcode;
	tcp_hdr_encode(s->hdr, s->len, t->remote + s->off, (uint8_t)(s->op | (v2 ? TCP_OP_V2 : 0)));
	s->sent = 0;
	s->stot = TCP_HDR_SIZE + (s->op == TE_OP_WRITE ? s->len : 0);
	s->rcvd = 0;
	s->rtot = (v2 ? TCP_STATUS_SIZE : 0) + (s->op == TE_OP_READ ? s->len : 0);
	s->status = 0;
	TCP_HOOK(tcp_hook_prep(cc, s));
}

/* Room for one more wire request under the window: bytes in flight below it,
 * or fewer than two requests (each of them may be larger than the window). */
static inline bool window_open(const tcp_cconn *cc, uint64_t window)
{
	return cc->bytes < window || cc->head - cc->tail < 2;
}

/* Takes slices from the peer's retry list and backlog into the ring. */
void tcp_cconn_pull(tcp_cconn *cc)
{
	tcp_peer *p = cc->peer;
	tcp_ctx *c = p->ctx;
	const te_host *h = c->host;
	uint64_t room = c->cfg.depth - (cc->head - cc->tail);
	uint64_t first = cc->head;
	bool was_empty = cc->head == cc->tail;

	if (room == 0 || !window_open(cc, c->cfg.window) ||
	    !atomic_load_explicit(&p->has_work, memory_order_acquire) || !tcp_rail_usable(cc))
		return;
	g_mutex_lock(&p->lock);
	/* FENCEs first: WRITEs wait behind them. */
	while (room > 0 && p->fences != NULL) {
		tcp_fence *f = p->fences;
		p->fences = f->next;
		f->next = NULL;
		*slot_at(cc, cc->head++) = (tcp_slot){ .fence = f };
		room--;
	}
	/* A fair share of what is queued, so that one burst of requests keeps
	 * every connection (and core) of the peer busy, not just the first to
	 * wake up; at least one slice. */
	uint64_t share = (p->bl_bytes + p->nconns - 1) / p->nconns, took = 0;
	if (share < c->cfg.slice)
		share = c->cfg.slice;
	while (room > 0 && window_open(cc, c->cfg.window) && took < share) {
		te_transfer *t;
		uint64_t off, len;
		uint8_t tries = 0;
		if (p->nretry > 0) {
			tcp_retry *r = &p->retry[--p->nretry];
			t = r->t;
			off = r->off;
			len = r->len;
			tries = r->tries;
		} else if (p->bl_head != NULL) {
			t = p->bl_head;
			off = t->length - t->plugin_data[1];
			len = MIN(c->cfg.slice, t->plugin_data[1]);
			t->plugin_data[1] -= len;
			if (t->plugin_data[1] == 0) {
				p->bl_head = (te_transfer *)t->plugin_data[0];
				if (p->bl_head == NULL)
					p->bl_tail = NULL;
				else
					p->bl_head->plugin_data[2] = 0;
			}
		} else {
			break;
		}
		/* A canceled batch stops at a slice boundary. Completed with the
		 * lock dropped: complete() may submit (TE_TRANSPORT_NESTED_SUBMIT). */
		if (h->canceled(h, t) || tcp_gate_closed(c, t)) {
			p->bl_bytes -= len;
			g_mutex_unlock(&p->lock);
			if (c->deadlines)
				tcp_dead_add(c, t, false); /* ended by the host: completed once it published that */
			else
				h->complete(h, t, 0, -ECANCELED);
			g_mutex_lock(&p->lock);
			continue;
		}
		p->bl_bytes -= len;
		took += len;
		tcp_slot *s = slot_at(cc, cc->head++);
		s->t = t;
		s->fence = NULL;
		s->counted = false;
		s->off = off;
		s->len = len;
		s->tries = tries;
		room--;
		cc->bytes += len;
	}
	atomic_store_explicit(&p->has_work, p->bl_head != NULL || p->nretry > 0 || p->fences != NULL,
			      memory_order_release);
	g_mutex_unlock(&p->lock);
	count(cc, TE_METRIC_INFLIGHT_BYTES, (int64_t)took);
	for (uint64_t i = first; i < cc->head;) {
		unsigned n = tcp_sg_prep(cc, i);
		if (n == 0)
			prep(cc, slot_at(cc, i++));
		i += n;
	}
	if (cc->head != first)
		atomic_fetch_add_explicit(&tcp_rail_of(cc)->inflight, (long long)(cc->head - first), memory_order_relaxed);
	if (was_empty && cc->head != first)
		cc->io.last_progress = cc->last_rx = tcp_now_ms(); /* the stall clocks start now */
}

/* ------------------------------------------------------------ failures */

void tcp_cconn_go_down(tcp_cconn *cc)
{
	if (cc->io.fd >= 0) {
		close(cc->io.fd); /* also leaves the epoll set */
		cc->io.fd = -1;
	}
	if (cc->state != CS_DOWN)
		atomic_fetch_sub(&cc->peer->active, 1);
	cc->state = CS_DOWN;
	cc->io.rd = cc->io.wr = cc->io.hup = false;
}

/*
 * Ends the connection. Requests on it complete with `err`, except after a
 * rejection (`mode` FAIL_REJECT): the rejected one fails with TE_ERR_REJECTED
 * and the ones behind it, which the peer never ran, go back to the peer for
 * another connection. A peer-level failure with requests in flight fails the
 * peer's backlog too: a peer that reset or stopped answering would only make
 * queued requests wait for another timeout.
 *
 * Moved to another rail (FAIL_RAIL), a WRITE that was sent, in part or
 * whole, may still be applied by the target from this connection's socket
 * (a server thread that lags reads it later; a reset does not take back what
 * the target's kernel received), over what the application wrote there since
 * through the other rail. To a peer that fences, such WRITEs are held by a
 * FENCE naming this connection and go out again only once the peer answered
 * it; to one that cannot, they fail. FAIL_EXPIRE moves the requests of other
 * transfers the same way.
 *
 * A slice of a transfer the host ended (deadline, cancel) completes with
 * `err`; when it is a WRITE whose bytes left and the peer fences, only once
 * the FENCE of this connection is answered (held like a moved WRITE): until
 * then the host reports the transfer unsettled.
 */
void tcp_cconn_fail(tcp_cconn *cc, int err, int mode, uint64_t at, const char *why)
{
	tcp_peer *p = cc->peer;
	tcp_ctx *c = p->ctx;
	const te_host *h = host_of(cc);
	size_t n = cc->head - cc->tail, nback = 0, nfail = 0, nhold = 0, nstuck = 0, nended = 0;
	/* An idle connection that breaks says little about the peer; one that
	 * breaks with requests on it does. */
	bool busy = n > 0;
	tcp_retry *back = n ? g_new(tcp_retry, n) : NULL;
	/* A broken link (an errno, not a protocol error) takes the rail down;
	 * while another rail is up, nothing fails for it. */
	if (p->nrails > 1 && mode == FAIL_PEER && err < 0 && err > -TE_ERR_BASE) {
		tcp_rail_down(cc, why);
		if (atomic_load(&p->rails_up) > 0)
			mode = FAIL_RAIL;
	}
	bool move = mode == FAIL_RAIL || mode == FAIL_EXPIRE;
	/* Moves for the host's sake are not the slices' own failures. */
	uint8_t bump = mode == FAIL_EXPIRE ? 0 : 1;
	struct done { te_transfer *t; uint64_t bytes; int err; bool counted; } *done = n ? g_new(struct done, n) : NULL;
	size_t ndone = 0;
	uint64_t moved = 0, held = cc->bytes;
	tcp_fence *hold = n && p->fence ? g_malloc(sizeof *hold + n * sizeof(tcp_retry)) : NULL;
	/* FENCEs it carried: answered, to send again, or failed with their WRITEs. */
	tcp_fence *answered = NULL, *again = NULL, *lost = NULL;

	/* With requests on it, the connection is reset, not closed: a graceful
	 * close would leave the kernel sending what its buffer holds when the
	 * path returns. */
	if (busy && cc->io.fd >= 0) {
		struct linger lg = { .l_onoff = 1, .l_linger = 0 };
		(void)setsockopt(cc->io.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
	}
	tcp_cconn_go_down(cc);
	cc->gate_shut = false;
	for (uint64_t i = cc->tail; i < cc->head; i++) {
		tcp_slot *s = slot_at(cc, i);
		if (s->fence != NULL) {
			tcp_fence *f = s->fence, **to = &lost;
			s->fence = NULL;
			if (i != at && s->sent == s->stot && s->rcvd == s->rtot)
				to = &answered;
			else if (i != at && (move || (mode == FAIL_REJECT && i > at)))
				to = &again; /* never ran, or may have: it is harmless twice */
			f->next = *to;
			*to = f;
			continue;
		}
		bool finished = s->sent == s->stot && s->rcvd == s->rtot;
		if (i != at && !finished && tcp_gate_closed(c, s->t)) {
			/* ended by the host: nothing of it goes again */
			if (s->counted && hold != NULL && !err_final(err))
				hold->held[nhold++] = (tcp_retry){ s->t, s->off, s->len, s->tries, true };
			else
				tcp_dead_add(c, s->t, s->counted);
			nended++;
		} else if (i == at) { /* the request the failure is about */
			done[ndone++] = (struct done){ s->t, 0, mode == FAIL_REJECT ? TE_ERR_REJECTED : err, s->counted };
			nfail++;
		} else if (finished) {
			/* finished: a piece of a scatter-gather frame may have been rejected alone */
			done[ndone++] = (struct done){ s->t, s->err ? 0 : s->len, s->err, s->counted };
			moved += s->err ? 0 : s->len;
		} else if (mode == FAIL_REJECT && i > at && s->tries + 1 < TCP_MAX_TRIES) {
			/* behind the rejected one: the peer never ran it */
			if (s->counted)
				tcp_unsettled_add(s->t, -1);
			back[nback++] = (tcp_retry){ s->t, s->off, s->len, (uint8_t)(s->tries + 1), false };
		} else if (move && s->op == TE_OP_WRITE && s->sent > 0 &&
			   (hold == NULL || s->tries + bump >= TCP_MAX_FAILOVERS)) {
			done[ndone++] = (struct done){ s->t, 0, err, s->counted };
			nfail++;
			nstuck += hold == NULL;
		} else if (move && s->op == TE_OP_WRITE && s->sent > 0) {
			hold->held[nhold++] = (tcp_retry){ s->t, s->off, s->len, (uint8_t)(s->tries + bump), s->counted };
		} else if (move && s->tries + bump < TCP_MAX_FAILOVERS) {
			if (s->counted)
				tcp_unsettled_add(s->t, -1);
			back[nback++] = (tcp_retry){ s->t, s->off, s->len, (uint8_t)(s->tries + bump), false };
		} else {
			done[ndone++] = (struct done){ s->t, 0, mode == FAIL_REJECT ? -ECONNRESET : err, s->counted };
			nfail++;
		}
	}
	atomic_fetch_sub_explicit(&tcp_rail_of(cc)->inflight, (long long)(cc->head - cc->tail), memory_order_relaxed);
	cc->head = cc->snd = cc->rcv = cc->tail = 0;
	cc->bytes = 0;
	count(cc, TE_METRIC_INFLIGHT_BYTES, -(int64_t)held);
	count(cc, TE_METRIC_BYTES, (int64_t)moved);
	/* Slices put back: moved to another rail, or sent again behind a
	 * rejected one; a connection lost is an error of its local side. */
	count(cc, mode == FAIL_RAIL ? TE_METRIC_FAILOVERS : TE_METRIC_RETRIES, (int64_t)(nback + nhold));
	if (mode == FAIL_PEER || mode == FAIL_RAIL)
		count(cc, TE_METRIC_ERRORS, 1);
	if (mode == FAIL_EXPIRE)
		TLOG(c, TE_LOG_DEBUG, "connection %u to %s closed: %s; %zu requests ended, %zu go again%s", cc->idx,
		     p->name, why, nended, nback + nhold,
		     nhold ? " (WRITEs that left once the peer fenced this connection)" : "");
	else if (mode == FAIL_RAIL)
		TE_HOST_LOG_LIMITED(p->ctx->host, TE_LOG_WARN,
				    "connection %u to %s over %s closed: %s; %zu requests go to the other rails%s, "
				    "%zu failed%s",
				    cc->idx, p->name, tcp_rail_of(cc)->name, why, nback + nhold,
				    nhold ? " (the WRITEs among them once the peer fenced this connection)" : "", nfail,
				    nstuck ? " (WRITEs that may still land there: the peer cannot fence)" : "");
	else if (mode != FAIL_QUIET)
		TE_HOST_LOG_LIMITED(p->ctx->host, TE_LOG_WARN, "connection %u to %s closed: %s; %zu requests failed%s",
				    cc->idx, p->name, why, nfail,
				    nback ? ", the ones behind the rejected one go again" : "");
	/* The backlog goes before the completions below wake anyone up: what is
	 * submitted after them must not be failed for this. */
	if (mode == FAIL_PEER && busy)
		tcp_peer_fail_pending(p, err);
	if (nhold > 0) {
		hold->lane = cc->lane;
		hold->gen = cc->gen;
		hold->n = nhold;
		hold->next = again;
		again = hold;
	} else {
		g_free(hold);
	}
	/* FENCEs that will not be answered here: what they hold fails, but the
	 * ended transfers' WRITEs, which wait for an answer elsewhere. */
	while (lost != NULL) {
		tcp_fence *f = lost, *keep;
		lost = f->next;
		keep = fence_lost(c, f, err, &nfail);
		if (keep != NULL) {
			keep->next = again;
			again = keep;
		}
	}
	if (nback > 0 || again != NULL) {
		g_mutex_lock(&p->lock);
		retry_add(p, back, nback);
		fences_requeue(p, again);
		atomic_store(&p->has_work, 1);
		g_mutex_unlock(&p->lock);
	}
	/* Answered FENCEs release their WRITEs (or settle the ended ones). */
	while (answered != NULL) {
		tcp_fence *f = answered;
		answered = f->next;
		tcp_fence_done(p, f);
	}
	/* Work queued for the peer (put back above, or waiting in its backlog
	 * behind what this connection held) needs a connection, and this one is
	 * down now, as the others may be (a target can refuse on all of them at
	 * once): each is woken to take it, connecting again if need be. */
	if (atomic_load(&p->has_work))
		tcp_peer_kick_all(p);
	for (size_t i = 0; i < ndone; i++)
		complete_slice(h, done[i].t, done[i].counted, done[i].bytes, done[i].err);
	g_free(back);
	g_free(done);
}

/* A slice on the ring of a transfer the host ended (one gate look each). */
bool tcp_cconn_has_expired(tcp_cconn *cc)
{
	const tcp_ctx *c = cc->peer->ctx;

	for (uint64_t i = cc->tail; c->deadlines && i < cc->head; i++) {
		tcp_slot *s = slot_at(cc, i);
		if (s->fence == NULL && (s->sent != s->stot || s->rcvd != s->rtot) && tcp_gate_closed(c, s->t))
			return true;
	}
	return false;
}

/* A FENCE on the ring holding WRITEs the host ended, whose engine is being
 * destroyed: nobody will read whether they settle, and the destroy waits
 * for them. */
bool tcp_cconn_fence_canceled(tcp_cconn *cc)
{
	const te_host *h = host_of(cc);

	for (uint64_t i = cc->tail; i < cc->head; i++) {
		tcp_slot *s = slot_at(cc, i);
		if (s->fence != NULL && s->fence->n > 0 && h->canceled(h, s->fence->held[0].t) == 2)
			return true;
	}
	return false;
}

bool tcp_cconn_expire(tcp_cconn *cc)
{
	if (!cc->gate_shut && !tcp_cconn_has_expired(cc))
		return false;
	/* The requests behind it cannot be taken out of the stream: the
	 * connection ends, the others go again on another one. */
	tcp_cconn_fail(cc, -ETIMEDOUT, FAIL_EXPIRE, UINT64_MAX, "a transfer on it ended (deadline or cancel)");
	return true;
}

void tcp_cconn_connect_failed(tcp_cconn *cc, int err, const char *what)
{
	tcp_peer *p = cc->peer;
	tcp_rail *r = tcp_rail_of(cc);
	char addr[80];

	teu_sockaddr_name((struct sockaddr *)&r->addr[cc->addr_next % r->naddr], addr, sizeof addr);
	/* A probe of a rail known to be down is expected to fail: no warning. */
	if (cc->probing && !atomic_load(&r->up))
		TLOG(p->ctx, TE_LOG_DEBUG, "cannot connect to %s (%s): %s", p->name, addr, what);
	else
		TE_HOST_LOG_LIMITED(p->ctx->host, TE_LOG_WARN, "cannot connect to %s (%s): %s", p->name, addr,
				    what);
	tcp_cconn_go_down(cc);
	cc->addr_next++;
	/* The name may resolve to several addresses (::1 and 127.0.0.1 for
	 * localhost): try each before giving up. */
	if (++cc->addr_tries < r->naddr && !atomic_load(&p->ctx->stopping)) {
		tcp_cconn_start_connect(cc);
		return;
	}
	cc->addr_tries = 0;
	if (p->nrails > 1) {
		tcp_rail_down(cc, what);
		tcp_rail_probe_failed(cc);
		if (atomic_load(&p->rails_up) > 0)
			return; /* the other rails take the work */
	}
	/* Queued work fails only when no other connection can take it. */
	if (atomic_load(&p->active) == 0)
		tcp_peer_fail_pending(p, err);
}

void tcp_cconn_shutdown(tcp_cconn *cc, int err)
{
	const te_host *h = host_of(cc);

	for (uint64_t i = cc->tail; i < cc->head; i++) {
		tcp_slot *s = slot_at(cc, i);
		if (s->fence != NULL) {
			size_t nf = 0;
			/* -ECANCELED or -ESHUTDOWN: final, nothing is kept */
			g_free(fence_lost(cc->peer->ctx, s->fence, err_final(err) ? err : -ESHUTDOWN, &nf));
		} else {
			complete_slice(h, s->t, s->counted, 0, err);
		}
		s->fence = NULL;
	}
	atomic_fetch_sub_explicit(&tcp_rail_of(cc)->inflight, (long long)(cc->head - cc->tail), memory_order_relaxed);
	cc->head = cc->snd = cc->rcv = cc->tail = 0;
	count(cc, TE_METRIC_INFLIGHT_BYTES, -(int64_t)cc->bytes);
	cc->bytes = 0;
	tcp_cconn_go_down(cc);
}

/* ----------------------------------------------------------- connecting */

/* Which local interface the rail leaves by, for the link events: the one
 * holding the connection's local address (the route the kernel chose). */
static void learn_interface(tcp_cconn *cc)
{
	tcp_peer *p = cc->peer;
	tcp_rail *r = tcp_rail_of(cc);
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;

	if (getsockname(cc->io.fd, (struct sockaddr *)&ss, &sl) < 0)
		return;
	int idx = tcp_link_ifindex((struct sockaddr *)&ss);
	g_mutex_lock(&p->lock);
	r->local = ss;
	g_mutex_unlock(&p->lock);
	atomic_store(&r->ifindex, idx);
	atomic_store(&r->link_down, 0); /* it just connected over it */
}

/* The device a connection counts for: its local address (one per rail
 * or NIC), looked up once per connect. */
static void learn_device(tcp_cconn *cc)
{
	tcp_ctx *c = cc->peer->ctx;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	char name[INET6_ADDRSTRLEN] = "";

	if (!c->metrics)
		return;
	if (getsockname(cc->io.fd, (struct sockaddr *)&ss, &sl) == 0) {
		if (ss.ss_family == AF_INET)
			inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, name, sizeof name);
		else if (ss.ss_family == AF_INET6)
			inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, name, sizeof name);
	}
	te_metric_dev *dev = c->host->metric_device(c->host, name[0] ? name : "unknown");
	/* Slices taken while connecting move to the device they now leave by. */
	if (dev != cc->mdev && cc->bytes > 0) {
		count(cc, TE_METRIC_INFLIGHT_BYTES, -(int64_t)cc->bytes);
		cc->mdev = dev;
		count(cc, TE_METRIC_INFLIGHT_BYTES, (int64_t)cc->bytes);
	}
	cc->mdev = dev;
}

void tcp_cconn_become_up(tcp_cconn *cc)
{
	cc->state = CS_UP;
	learn_device(cc);
	cc->addr_tries = 0;
	cc->io.wr = true;
	cc->io.last_progress = cc->last_rx = tcp_now_ms();
	TLOG(cc->peer->ctx, TE_LOG_DEBUG, "connection %u to %s is up (%s)", cc->idx, cc->peer->name,
	     tcp_rail_of(cc)->name);
	cc->probing = false;
	if (cc->peer->nrails > 1)
		learn_interface(cc);
	tcp_rail_up(cc);
}

/* A lane: random, so that the lanes of every initiator a target serves
 * differ; never 0. */
static uint64_t new_lane(void)
{
	uint64_t v = 0;

	while (v == 0)
		if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
			v = ((uint64_t)g_random_int() << 32) ^ g_random_int() ^ (uint64_t)g_get_monotonic_time();
	return v;
}

/* What a connection sends before its first request, in the I/O thread
 * right after the connect. With a cluster key, a connection carries requests
 * only once both sides proved it: one round trip to a peer we chose, bounded
 * by the connect timeout (3 s at most). To a peer that fences, a HELLO then
 * names the connection: its lane and a new generation (24 bytes into an
 * empty socket buffer: one send). False: the connection failed and was
 * handled. */
bool tcp_cconn_preamble(tcp_cconn *cc)
{
	tcp_ctx *c = cc->peer->ctx;
	const te_host *h = c->host;

	if (c->auth) {
		/* A blocking exchange: it must not outlast the transfers waiting
		 * for the connection (the host ends them at their deadline). */
		int64_t ms = MIN(c->cfg.connect_timeout_ms, 3000), dl = tcp_peer_waiting_deadline(cc->peer);
		bool soft = false;
		if (dl > 0 && (dl - tcp_now_ns()) / 1000000 + 1 < ms) {
			ms = (dl - tcp_now_ns()) / 1000000 + 1;
			soft = true;
		}
		int rc = ms > 0 ? h->auth_connect(h, cc->io.fd, TE_AUTH_TCP, cc->peer->name, (int)ms) : -ETIMEDOUT;
		/* (a timeout comes back as TE_ERR_AUTH) */
		if (rc != 0 && soft && tcp_now_ns() >= dl) {
			/* The waiting transfers end by their deadline; the
			 * others wait for the next try (expire() kicks). */
			TLOG(c, TE_LOG_DEBUG, "connection %u to %s: authentication cut short by a transfer's deadline",
			     cc->idx, cc->peer->name);
			tcp_cconn_go_down(cc);
			return false;
		}
		if (rc != 0) {
			tcp_cconn_connect_failed(cc, rc == TE_ERR_AUTH || rc == -ETIMEDOUT ? TE_ERR_AUTH : rc,
						 "authentication failed");
			return false;
		}
	}
	if (!cc->peer->fence)
		return true;
	uint8_t hello[TCP_HDR_SIZE];
	if (cc->lane == 0)
		cc->lane = new_lane();
	cc->gen++;
	tcp_hdr_encode(hello, cc->lane, cc->gen, TCP_OP_V2 | TCP_OP_HELLO);
	ssize_t w;
	do
		w = send(cc->io.fd, hello, sizeof hello, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (w < 0 && errno == EINTR);
	if (w == (ssize_t)sizeof hello)
		return true;
	int err = w < 0 ? errno : EAGAIN;
	tcp_cconn_connect_failed(cc, -err, w < 0 ? g_strerror(err) : "the HELLO did not fit the socket buffer");
	return false;
}

void tcp_cconn_start_connect(tcp_cconn *cc)
{
	tcp_peer *p = cc->peer;
	tcp_ctx *c = p->ctx;
	tcp_rail *r = tcp_rail_of(cc);
	unsigned ai = cc->addr_next % r->naddr;
	const struct sockaddr *sa = (const struct sockaddr *)&r->addr[ai];
	int fd, rc;

	if (cc->ring == NULL) {
		/* The ring, then the scatter-gather tables: one entry per slot. */
		cc->ring = g_try_malloc0(c->cfg.depth * (sizeof(tcp_slot) + TCP_SG_ENTRY));
		cc->sgtab = cc->ring ? (uint8_t *)(cc->ring + c->cfg.depth) : NULL;
		if (cc->ring == NULL) {
			tcp_peer_fail_pending(p, -ENOMEM);
			return;
		}
	}
	fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		int err = -errno;
		TLOG(c, TE_LOG_ERROR, "socket: %s", g_strerror(errno));
		if (atomic_load(&p->active) == 0)
			tcp_peer_fail_pending(p, err);
		return;
	}
	tcp_sockopts(c, fd);
	cc->io.fd = fd;
	cc->io.rd = cc->io.wr = cc->io.hup = false;
	atomic_fetch_add(&p->active, 1);
	cc->state = CS_CONNECTING;
	int crc = connect(fd, sa, r->addrlen[ai]);
	if (crc < 0 && errno != EINPROGRESS) {
		int err = errno;
		tcp_cconn_connect_failed(cc, -err, g_strerror(err));
		return;
	}
	cc->ep_events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
	rc = tcp_io_register(&cc->io, cc->ep_events);
	if (rc < 0) {
		tcp_cconn_connect_failed(cc, rc, "cannot add the socket to the epoll set");
		return;
	}
	if (crc == 0 && tcp_cconn_preamble(cc)) {
		tcp_cconn_become_up(cc);
	} else {
		/* Not past the earliest deadline of the transfers waiting for it:
		 * then this attempt ends (the next transfer starts another). */
		int64_t now = tcp_now_ms(), dl = tcp_peer_waiting_deadline(p);
		cc->connect_deadline = now + c->cfg.connect_timeout_ms;
		cc->soft_deadline = false;
		if (dl > 0 && (dl - tcp_now_ns()) / 1000000 + now < cc->connect_deadline) {
			cc->connect_deadline = (dl - tcp_now_ns()) / 1000000 + now;
			cc->soft_deadline = true;
		}
	}
}

/* Called once per connection at the end of the loop iteration that retired
 * it; the last one frees the peer. */
void tcp_peer_retire_conn(tcp_peer *p)
{
	if (atomic_fetch_sub(&p->live_conns, 1) != 1)
		return;
	tcp_ctx *c = p->ctx;
	for (unsigned r = 0; p->nrails > 1 && r < p->nrails; r++)
		TLOG(c, TE_LOG_DEBUG, "rail %s of %s carried %llu bytes", p->rails[r].name, p->name,
		     (unsigned long long)atomic_load(&p->rails[r].bytes));
	g_mutex_lock(&c->lock);
	g_ptr_array_remove_fast(c->all_peers, p);
	g_hash_table_remove(c->live_peers, p);
	g_mutex_unlock(&c->lock);
	/* A caller that found it live just before is done with it in moments
	 * (it sees `closing` and lets go). */
	while (atomic_load(&p->kicking) > 0)
		g_thread_yield();
	tcp_peer_fail_pending(p, -ECANCELED); /* nothing should be left; safe if so */
	g_mutex_clear(&p->lock);
	g_free(p->rails);
	g_free(p->key);
	g_free(p);
}

/* ------------------------------------------------------------- expire */

/* How long a slice of an ended transfer waits before it completes: the host
 * publishes the early end right after expire() returns (a few instructions),
 * and a completion that came first would be taken for the transfer's own
 * end. Nothing waits for these completions but the task's storage and, for
 * a WRITE held by a FENCE, its settling. */
#define DEAD_GRACE_NS 2000000

void tcp_dead_add(tcp_ctx *c, te_transfer *t, bool counted)
{
	struct tcp_dead d = { t, counted, tcp_now_ns() };

	g_mutex_lock(&c->dead_lock);
	g_array_append_val(c->dead, d);
	atomic_store(&c->ndead, (int)c->dead->len);
	g_mutex_unlock(&c->dead_lock);
	tcp_io_arm(&c->threads[0]);
}

bool tcp_dead_flush(tcp_ctx *c, bool all)
{
	const te_host *h = c->host;
	int64_t now = tcp_now_ns();
	GArray *due = NULL;
	bool left;

	g_mutex_lock(&c->dead_lock);
	if (all || atomic_load(&c->expiring) == 0) {
		guint k = 0;
		for (guint i = 0; i < c->dead->len; i++) {
			struct tcp_dead d = g_array_index(c->dead, struct tcp_dead, i);
			if (all || now - d.at >= DEAD_GRACE_NS) {
				if (due == NULL)
					due = g_array_new(FALSE, FALSE, sizeof d);
				g_array_append_val(due, d);
			} else {
				g_array_index(c->dead, struct tcp_dead, k++) = d;
			}
		}
		g_array_set_size(c->dead, k);
	}
	left = c->dead->len > 0;
	atomic_store(&c->ndead, (int)c->dead->len);
	g_mutex_unlock(&c->dead_lock);
	/* Completed with the lock dropped (complete() may submit); not with
	 * -ETIMEDOUT, which would tell the host it gave up on the peer. */
	for (guint i = 0; due != NULL && i < due->len; i++) {
		struct tcp_dead d = g_array_index(due, struct tcp_dead, i);
		complete_slice(h, d.t, d.counted, 0, -ECANCELED);
	}
	if (due != NULL)
		g_array_unref(due);
	return left;
}

/*
 * The host ended `t` (deadline, cancel) and closed its gate: nothing of
 * its memory is touched any more (every touch is inside its gate). Its
 * slices still waiting in the peer's backlog and retries complete here; the
 * connections carrying the others are told (MISS_EXPIRE) and end (their
 * other requests go again), completing them. Returns 1 while a WRITE slice
 * of `t` whose bytes left has neither its answer nor its FENCE's: those
 * complete once the peer answers the FENCE of their connection.
 */
int tcp_expire(void *ctx, te_transfer *t)
{
	tcp_ctx *c = ctx;
	tcp_peer *p = t->seg_ctx;
	uint64_t slice = c->cfg.slice, n = 0;

	atomic_fetch_add(&c->expiring, 1);
	/* `t` may have completed meanwhile and its peer gone with it. */
	g_mutex_lock(&c->lock);
	bool live = g_hash_table_contains(c->live_peers, p);
	if (live)
		atomic_fetch_add(&p->kicking, 1); /* p stays until this drops */
	g_mutex_unlock(&c->lock);
	if (!live) {
		atomic_fetch_sub(&c->expiring, 1);
		return 0;
	}
	g_mutex_lock(&p->lock);
	/* Still in the backlog (slices not taken): out of it. */
	if (t->plugin_data[1] > 0) {
		te_transfer *next = (te_transfer *)t->plugin_data[0], *prev = (te_transfer *)t->plugin_data[2];
		uint64_t left = t->plugin_data[1];
		if (prev != NULL)
			prev->plugin_data[0] = (uintptr_t)next;
		else
			p->bl_head = next;
		if (next != NULL)
			next->plugin_data[2] = (uintptr_t)prev;
		else
			p->bl_tail = prev;
		p->bl_bytes -= left;
		n += (left + slice - 1) / slice;
		t->plugin_data[1] = 0;
	}
	for (size_t i = 0; i < p->nretry;) {
		if (p->retry[i].t != t) {
			i++;
			continue;
		}
		p->bl_bytes -= p->retry[i].len;
		p->retry[i] = p->retry[--p->nretry];
		n++;
	}
	atomic_store(&p->has_work, p->bl_head != NULL || p->nretry > 0 || p->fences != NULL);
	g_mutex_unlock(&p->lock);
	/* Read before any completion: the last one may release `t`. */
	int unsettled = t->opcode == TE_OP_WRITE && tcp_unsettled(t) > 0;
	/* Its slices on rings, sent or not: their connections end. Every
	 * connection is told (which carries them is its holder's to know:
	 * its I/O thread, or a caller waiting on it, woken below); one
	 * without them does nothing. */
	if (!atomic_load(&p->closing))
		for (unsigned k = 0; k < p->nconns; k++) {
			atomic_fetch_or(&p->conns[k].missed, MISS_EXPIRE);
			tcp_kick(&p->conns[k].io, MAIL_WORK);
		}
	atomic_fetch_sub(&p->kicking, 1);
	tcp_wake(c);
	for (uint64_t i = 0; i < n; i++)
		tcp_dead_add(c, t, false);
	atomic_fetch_sub(&c->expiring, 1);
	return unsettled;
}
