/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A client connection driven by its I/O thread: the turns it takes on
 * events, mail and the ready list, the epoll set it watches, and the
 * timeouts (a suspect path, no progress, connecting, idle).
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <sys/epoll.h>

#include "tcp-client.h"

#define ROUNDS 16 /* send/receive rounds per turn before yielding to other connections */

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
		tcp_rx_result res = { .mode = FAIL_PEER, .at = UINT64_MAX };
		bool moved = false;
		int rc;

		tcp_cconn_pull(cc);
		if (cc->io.wr && cc->snd < cc->head) {
			rc = tcp_cconn_send(cc);
			if (rc < 0) {
				char why[128];
				snprintf(why, sizeof why, "send failed: %s", g_strerror(-rc));
				tcp_cconn_fail(cc, rc, FAIL_PEER, UINT64_MAX, why);
				return;
			}
			moved |= rc > 0;
		}
		if (cc->io.rd) {
			rc = tcp_cconn_recv(cc, &res);
			if (rc < 0) {
				tcp_cconn_reap(cc); /* what fully arrived before the failure still counts */
				tcp_cconn_fail(cc, res.err, res.mode, res.at, res.why);
				return;
			}
			moved |= rc > 0;
		}
		tcp_cconn_reap(cc);
		if (cc->gate_shut) {
			/* a transfer on it ended: the connection ends, the rest goes again */
			tcp_cconn_expire(cc);
			if (atomic_load(&p->has_work))
				tcp_io_ready(&cc->io);
			return;
		}
		more = moved;
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
	int free_ = 0;

	if (!atomic_compare_exchange_strong(&cc->drv, &free_, 1)) {
		atomic_fetch_or(&cc->missed, *what);
		/* The holder may have let go before these bits landed: one more
		 * look (if it still holds it, its letting go comes after them). */
		free_ = 0;
		if (!atomic_compare_exchange_strong(&cc->drv, &free_, 1))
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

