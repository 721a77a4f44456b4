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
 * This file is the connection's state machine: the ring filled from the
 * backlog, failures, connecting, the I/O thread's turns and the timeouts;
 * tcp-conn-wire.c moves the bytes, tcp-conn-caller.c is the callers' side
 * and tcp-peer.c the peer's (tcp-conn.h).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <unistd.h>

#include "tcp-conn.h"
#include "teu-hostport.h"

#define ROUNDS 16 /* send/receive rounds per turn before yielding to other connections */

/* ----------------------------------------------------------- the ring */


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
			if (s->counted && hold != NULL && !tcp_err_final(err))
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
		keep = tcp_fence_lost(c, f, err, &nfail);
		if (keep != NULL) {
			keep->next = again;
			again = keep;
		}
	}
	if (nback > 0 || again != NULL) {
		g_mutex_lock(&p->lock);
		tcp_peer_retry_add(p, back, nback);
		tcp_peer_fences_requeue(p, again);
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
		tcp_slice_complete(h, done[i].t, done[i].counted, done[i].bytes, done[i].err);
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
			g_free(tcp_fence_lost(cc->peer->ctx, s->fence, tcp_err_final(err) ? err : -ESHUTDOWN, &nf));
		} else {
			tcp_slice_complete(h, s->t, s->counted, 0, err);
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

/* ------------------------------------------------------- epoll events */

/*
 * What the owner's epoll set watches on the connection. Readable, unless a
 * caller waits on the socket itself (`muted`: else every piece of its reply
 * would wake the I/O thread too, for nothing). Writable only while a send
 * waits for room or a connect for its end: every change of the set raises
 * an edge for a writable socket, which would wake the I/O thread for
 * nothing; with no send waiting, `wr` is simply assumed (a send that finds
 * the buffer full arms it).
 */
void tcp_cconn_set_events(tcp_cconn *cc, bool muted)
{
	bool out = cc->state == CS_CONNECTING || (!cc->io.wr && cc->snd < cc->head);
	uint32_t want = EPOLLRDHUP | EPOLLET | (muted ? 0 : EPOLLIN) | (out && !muted ? EPOLLOUT : 0);

	if (!out && cc->state == CS_UP)
		cc->io.wr = true;
	if (cc->io.fd < 0 || want == cc->ep_events)
		return;
	struct epoll_event ev = { .events = want, .data.ptr = &cc->io };
	if (epoll_ctl(cc->io.thr->ep, EPOLL_CTL_MOD, cc->io.fd, &ev) < 0) {
		TLOG(cc->peer->ctx, TE_LOG_ERROR, "connection %u to %s: epoll_ctl: %s", cc->idx, cc->peer->name,
		     g_strerror(errno));
		return;
	}
	cc->ep_events = want;
}

/* ---------------------------------------------------------------- drive */

int tcp_cconn_step(tcp_cconn *cc, bool send, bool recv)
{
	tcp_rx_result res = { .mode = FAIL_PEER, .at = UINT64_MAX };
	bool moved = false;
	int rc;

	if (send) {
		rc = tcp_cconn_send(cc);
		if (rc < 0) {
			char why[128];
			snprintf(why, sizeof why, "send failed: %s", g_strerror(-rc));
			tcp_cconn_fail(cc, rc, FAIL_PEER, UINT64_MAX, why);
			return -1;
		}
		moved |= rc > 0;
	}
	if (recv) {
		rc = tcp_cconn_recv(cc, &res);
		if (rc < 0) {
			tcp_cconn_reap(cc); /* what fully arrived before the failure still counts */
			tcp_cconn_fail(cc, res.err, res.mode, res.at, res.why);
			return -1;
		}
		moved |= rc > 0;
	}
	tcp_cconn_reap(cc);
	return moved;
}

/* One turn of the I/O thread on a connection it holds. */
static void drive(tcp_cconn *cc)
{
	tcp_peer *p = cc->peer;

	if (cc->state == CS_DOWN) {
		if (!atomic_load(&p->has_work) || atomic_load(&p->ctx->stopping))
			return;
		if (!tcp_rail_usable(cc))
			return; /* a down rail is probed, not used */
		cc->probing = p->nrails > 1 && !atomic_load(&tcp_rail_of(cc)->up);
		tcp_cconn_start_connect(cc);
	}
	if (cc->state != CS_UP)
		return;
	if (TCP_HOOK_TRUE(tcp_hook_suspect(cc))) {
		tcp_cconn_fail(cc, -ECONNABORTED, FAIL_PEER, UINT64_MAX, "suspect: forced by a test");
		return;
	}
	if (p->nrails > 1 && !atomic_load(&tcp_rail_of(cc)->up)) {
		/* Another connection found the rail broken: this one is likely
		 * stuck too, so its requests move now rather than after a timeout
		 * (an idle one just closes). */
		if (cc->head == cc->tail)
			tcp_cconn_go_down(cc);
		else
			tcp_cconn_fail(cc, -ENETUNREACH, FAIL_PEER, UINT64_MAX, "its rail is down");
		return;
	}
	bool more = true;
	for (int round = 0; round < ROUNDS && more; round++) {
		tcp_cconn_pull(cc);
		int rc = tcp_cconn_step(cc, cc->io.wr && cc->snd < cc->head, cc->io.rd);
		if (rc < 0)
			return;
		if (cc->gate_shut) {
			/* a transfer on it ended: the connection ends, the rest goes again */
			tcp_cconn_expire(cc);
			if (atomic_load(&p->has_work))
				tcp_io_ready(&cc->io);
			return;
		}
		more = rc > 0;
	}
	if (cc->state == CS_UP)
		tcp_cconn_set_events(cc, false);
	if (more)
		tcp_io_ready(&cc->io); /* more to do: after the other connections had a turn */
}

/*
 * A dead path or a slow peer? A connection with work that received nothing
 * for TE_TCP_SUSPECT_MS, whose socket saw no packet from the peer for as long
 * (TCP_INFO; a WRITE still being sent keeps getting ACKs, a READ its data),
 * while another rail shows the peer alive (tcp_other_rail_alive), is on a path
 * that lost its packets: its rail is abandoned like a broken one. A peer slow
 * on every rail leaves requests unanswered on all of them, and is left to
 * TE_TCP_TIMEOUT_MS. Closing the connection first means no
 * late answer can arrive on it, so each slice completes once, over whichever
 * rail carries it then. True: the connection failed over.
 */
static bool suspect(tcp_cconn *cc, int64_t now)
{
	tcp_peer *p = cc->peer;
	int64_t ms = p->ctx->cfg.suspect_ms;
	tcp_rail *r = tcp_rail_of(cc), *o;
	char why[256];

	if (ms <= 0 || p->nrails < 2 || !atomic_load(&r->up))
		return false;
	int64_t since = tcp_rail_silent_since(cc, cc->last_rx);
	if (now - since <= ms || (o = tcp_other_rail_alive(p, r, now, since, ms)) == NULL)
		return false;
	struct tcp_info ti;
	socklen_t tl = sizeof ti;
	if (getsockopt(cc->io.fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) < 0)
		return false;
	if ((int64_t)ti.tcpi_last_ack_recv < ms)
		return false; /* packets still arrive: slow, not dead */
	snprintf(why, sizeof why,
		 "suspect: connection %u received nothing for %lld ms, no ACK for %u ms, %u segments unacknowledged, "
		 "%llu requests unanswered (%llu not sent in full), while %s answered (TE_TCP_SUSPECT_MS)",
		 cc->idx, (long long)(now - cc->last_rx), ti.tcpi_last_ack_recv, ti.tcpi_unacked,
		 (unsigned long long)(cc->head - cc->rcv), (unsigned long long)(cc->head - cc->snd), o->name);
	tcp_cconn_fail(cc, -ECONNABORTED, FAIL_PEER, UINT64_MAX, why);
	return true;
}

/* The checks of a connection that carries requests: a suspect path, or no
 * progress at all for TE_TCP_TIMEOUT_MS. */
void tcp_cconn_check_stall(tcp_cconn *cc, int64_t now)
{
	tcp_ctx *c = cc->peer->ctx;
	char why[128];

	if (cc->state != CS_UP || cc->head == cc->tail)
		return;
	/* A FENCE for WRITEs of a closing engine waits for nobody: its WRITEs
	 * end (-ECANCELED: settled as far as anyone can ask). */
	if (tcp_cconn_fence_canceled(cc)) {
		tcp_cconn_fail(cc, -ECANCELED, FAIL_QUIET, UINT64_MAX, "its engine is closing");
		return;
	}
	if (suspect(cc, now))
		return;
	if (now - cc->io.last_progress > c->cfg.timeout_ms) {
		/* Not -ETIMEDOUT: that would end the tasks as TIMEOUT, and a peer
		 * that stopped answering is a failure. */
		snprintf(why, sizeof why, "no progress for %lld ms (TE_TCP_TIMEOUT_MS)",
			 (long long)(now - cc->io.last_progress));
		tcp_cconn_fail(cc, -ECONNABORTED, FAIL_PEER, UINT64_MAX, why);
	}
}

static void check_timeout(tcp_cconn *cc, int64_t now)
{
	tcp_peer *p = cc->peer;
	tcp_ctx *c = p->ctx;
	char why[128];

	/* A down rail's first connection tries it again now and then, while
	 * another rail carries the work (with none up, work connects itself),
	 * whether or not its link is said to be down: the event saying it is
	 * back may have been lost. */
	tcp_rail *r = tcp_rail_of(cc);
	if (p->nrails > 1 && cc == &p->conns[cc->rail] && !atomic_load(&r->up) && atomic_load(&p->rails_up) > 0 &&
	    !atomic_load(&c->stopping)) {
		/* The link came back while a probe waited for an answer its SYN,
		 * sent into the dead link, cannot bring before a retransmission
		 * seconds away: it starts again. */
		if (cc->state == CS_CONNECTING && cc->probing && cc->head == cc->tail &&
		    atomic_exchange(&r->reprobe, 0))
			tcp_cconn_go_down(cc);
		if (cc->state == CS_DOWN && now >= atomic_load(&r->next_probe)) {
			TLOG(c, TE_LOG_DEBUG, "probing rail %s of %s", r->name, p->name);
			atomic_store(&r->reprobe, 0);
			cc->probing = true;
			tcp_cconn_start_connect(cc);
			return;
		}
	}
	if (cc->state == CS_CONNECTING && now > cc->connect_deadline && cc->soft_deadline) {
		/* The transfers it was for ended at their deadline; others
		 * waiting (with a later one, or none) start another attempt. */
		TLOG(c, TE_LOG_DEBUG, "connection %u to %s: connecting cut short by a transfer's deadline", cc->idx,
		     p->name);
		tcp_cconn_go_down(cc);
		if (atomic_load(&p->has_work))
			tcp_cconn_start_connect(cc);
		return;
	}
	/* FENCEs waiting for a connection (WRITEs of ended transfers wait for
	 * their answer) after every connect failed: tried again each second. */
	if (cc->state == CS_DOWN && cc->idx == 0 && atomic_load(&p->has_work) && !atomic_load(&c->stopping) &&
	    now >= cc->connect_deadline + 1000 && atomic_load(&p->active) == 0) {
		g_mutex_lock(&p->lock);
		bool fences = p->fences != NULL;
		g_mutex_unlock(&p->lock);
		if (fences) {
			tcp_cconn_start_connect(cc);
			return;
		}
	}
	if (cc->state == CS_CONNECTING && now > cc->connect_deadline) {
		snprintf(why, sizeof why, "no answer within %lld ms (TE_TCP_CONNECT_TIMEOUT_MS)",
			 (long long)c->cfg.connect_timeout_ms);
		tcp_cconn_connect_failed(cc, -EHOSTUNREACH, why);
		return;
	}
	tcp_cconn_check_stall(cc, now);
	/* Idle for TE_TCP_IDLE_MS: closed, so that the descriptors and rings an
	 * engine holds follow the peers it talks to now, not every peer it ever
	 * talked to; the next transfer connects again. Connections that fall
	 * idle within the last sixteenth of the time go with it, so that one
	 * wake-up closes a peer's connections together. */
	int64_t idle = c->cfg.idle_ms;
	if (idle > 0 && cc->state == CS_UP && cc->head == cc->tail && !atomic_load(&p->has_work) &&
	    now - cc->io.last_progress >= idle - idle / 16) {
		TLOG(c, TE_LOG_DEBUG, "connection %u to %s idle for %lld ms: closed (TE_TCP_IDLE_MS)", cc->idx,
		     p->name, (long long)(now - cc->io.last_progress));
		tcp_cconn_go_down(cc);
		g_free(cc->ring);
		cc->ring = NULL;
	}
}

/* When the connection wants its timeouts checked next (its holder calls):
 * 0 while it has work, connects or its rail is down (every check); its idle
 * close when it is up and idle; else never (INT64_MAX). */
static int64_t next_check(tcp_cconn *cc)
{
	tcp_peer *p = cc->peer;

	if (cc->state == CS_CONNECTING || cc->head != cc->tail || atomic_load(&p->has_work) ||
	    (p->nrails > 1 && !atomic_load(&tcp_rail_of(cc)->up)))
		return 0;
	if (cc->state == CS_UP && p->ctx->cfg.idle_ms > 0)
		return cc->io.last_progress + p->ctx->cfg.idle_ms;
	return INT64_MAX;
}

/* ------------------------------------------------------- the I/O thread */

static void apply_events(tcp_cconn *cc, unsigned m)
{
	if (m & MISS_RD)
		cc->io.rd = true;
	if (m & MISS_HUP)
		cc->io.hup = true; /* read on to the EOF: no further edge will come */
	if (m & MISS_WR)
		cc->io.wr = true;
}

/* The I/O thread takes the connection for `*what` (MISS_* bits), adding
 * what it missed before. False when a caller holds it: the caller hands
 * `*what` back when it lets go. */
static bool io_enter(tcp_cconn *cc, unsigned *what)
{
	if (!tcp_cconn_take(cc)) {
		atomic_fetch_or(&cc->missed, *what);
		/* The holder may have let go before these bits landed: one more
		 * look (if it still holds it, its letting go comes after them). */
		if (!tcp_cconn_take(cc))
			return false;
	}
	*what |= atomic_exchange(&cc->missed, 0);
	apply_events(cc, *what);
	return true;
}

/* Returns when the connection wants its next check (next_check; 0 too when
 * a caller holds it, INT64_MAX once it is closed). */
static int64_t io_service(tcp_cconn *cc, unsigned what)
{
	if (!io_enter(cc, &what))
		return 0;
	if (what & MISS_CLOSE) {
		if (cc->head > cc->tail)
			tcp_cconn_shutdown(cc, -ECANCELED);
		tcp_cconn_go_down(cc);
		g_free(cc->ring);
		cc->ring = NULL;
		tcp_io_bury(&cc->io);
		return INT64_MAX; /* held for good: nobody takes a closed connection */
	}
	if (what & MISS_EXPIRE)
		tcp_cconn_expire(cc);
	if (what & MISS_SCAN)
		check_timeout(cc, tcp_now_ms());
	if (cc->state == CS_CONNECTING && cc->io.fd >= 0 && (what & MISS_WR)) {
		int err = 0;
		socklen_t el = sizeof err;
		if (getsockopt(cc->io.fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0)
			err = errno;
		if (err != 0)
			tcp_cconn_connect_failed(cc, -err, g_strerror(err));
		else if (tcp_cconn_preamble(cc))
			tcp_cconn_become_up(cc);
	}
	/* Events of a socket closed since (by a caller) are stale. */
	if (cc->state != CS_CONNECTING && ((what & MISS_WORK) || ((what & MISS_EVENTS) && cc->io.fd >= 0)))
		drive(cc);
	int64_t due = next_check(cc);
	atomic_store(&cc->drv, 0);
	return due;
}

void tcp_cconn_event(tcp_cconn *cc, uint32_t events)
{
	unsigned what = 0;

	if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
		what |= MISS_RD;
	if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))
		what |= MISS_HUP;
	if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR))
		what |= MISS_WR;
	io_service(cc, what);
}

void tcp_cconn_mail(tcp_cconn *cc, unsigned mail)
{
	tcp_io_list(cc->io.thr, &cc->io);
	io_service(cc, (mail & MAIL_CLOSE ? MISS_CLOSE : 0) | (mail & MAIL_WORK ? MISS_WORK : 0));
}

void tcp_cconn_ready(tcp_cconn *cc)
{
	io_service(cc, MISS_WORK);
}

int64_t tcp_cconn_scan(tcp_cconn *cc, int64_t now)
{
	(void)now;
	return io_service(cc, MISS_SCAN);
}

