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
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "tcp-internal.h"

#define ROUNDS 16 /* send/receive rounds per turn before yielding to other connections */

/* The iovecs of one sendmsg or readv, of whichever thread drives a
 * connection: its I/O thread or a caller. */
static _Thread_local struct iovec tls_iov[TCP_IOV_MAX + 2];

/* FAIL_RAIL: the connection's rail failed while another rail is up: what it
 * carried goes to the other rails (re-sending a READ or WRITE of the same
 * range is harmless, even if the peer applied part of it). */
enum { FAIL_PEER = 0, FAIL_REJECT = 1, FAIL_QUIET = 2, FAIL_RAIL = 3 };

static inline tcp_slot *slot_at(tcp_cconn *cc, uint64_t i)
{
	return &cc->ring[i & (cc->peer->ctx->cfg.depth - 1)];
}

static inline const te_host *host_of(tcp_cconn *cc)
{
	return cc->peer->ctx->host;
}

static const char *op_name(unsigned op)
{
	return op == TE_OP_WRITE ? "WRITE" : "READ";
}

/* Counts for the device (local address) of a connection: a relaxed add in
 * the host, no lock. */
static inline void count(tcp_cconn *cc, int what, int64_t delta)
{
	const tcp_ctx *c = cc->peer->ctx;

	if (c->metrics && delta != 0)
		c->host->metric_add(c->host, cc->mdev, what, delta);
}

/* ----------------------------------------------------------- the backlog */

/* Completes every slice still waiting in the peer's backlog and retry list. */
void tcp_peer_fail_pending(tcp_peer *p, int err)
{
	const te_host *h = p->ctx->host;
	uint64_t slice = p->ctx->cfg.slice;
	te_transfer *t;
	tcp_retry *retry;
	size_t nretry;

	g_mutex_lock(&p->lock);
	t = p->bl_head;
	p->bl_head = p->bl_tail = NULL;
	retry = p->retry;
	nretry = p->nretry;
	p->retry = NULL;
	p->nretry = p->cap_retry = 0;
	p->bl_bytes = 0;
	atomic_store(&p->has_work, 0);
	g_mutex_unlock(&p->lock);

	size_t n = 0;
	for (size_t i = 0; i < nretry; i++, n++)
		h->complete(h, retry[i].t, 0, err);
	g_free(retry);
	while (t != NULL) {
		te_transfer *next = (te_transfer *)t->plugin_data[0];
		uint64_t left = t->length - t->plugin_data[1];
		uint64_t slices = (left + slice - 1) / slice;
		/* `t` may be reused once its last slice completes: read first. */
		for (uint64_t i = 0; i < slices; i++, n++)
			h->complete(h, t, 0, err);
		t = next;
	}
	if (n > 0)
		TE_HOST_LOG_LIMITED(p->ctx->host, TE_LOG_WARN, "%zu queued requests to %s failed: %s", n, p->name,
				    tcp_strerror(err));
}

static void prep(tcp_cconn *cc, tcp_slot *s)
{
	te_transfer *t = s->t;
	bool v2 = cc->peer->version >= 2;

	s->op = (uint8_t)t->opcode;
	tcp_hdr_encode(s->hdr, s->len, t->remote + s->off, (uint8_t)(s->op | (v2 ? TCP_OP_V2 : 0)));
	s->sent = 0;
	s->stot = TCP_HDR_SIZE + (s->op == TE_OP_WRITE ? s->len : 0);
	s->rcvd = 0;
	s->rtot = (v2 ? TCP_STATUS_SIZE : 0) + (s->op == TE_OP_READ ? s->len : 0);
	s->status = 0;
}

/* Room for one more wire request under the window: bytes in flight below it,
 * or fewer than two requests (each of them may be larger than the window). */
static inline bool window_open(const tcp_cconn *cc, uint64_t window)
{
	return cc->bytes < window || cc->head - cc->tail < 2;
}

/* Takes slices from the peer's retry list and backlog into the ring. */
static void pull(tcp_cconn *cc)
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
			off = t->plugin_data[1];
			len = MIN(c->cfg.slice, t->length - off);
			t->plugin_data[1] = off + len;
			if (off + len == t->length) {
				p->bl_head = (te_transfer *)t->plugin_data[0];
				if (p->bl_head == NULL)
					p->bl_tail = NULL;
			}
		} else {
			break;
		}
		/* A canceled batch stops at a slice boundary. Completed with the
		 * lock dropped: complete() may submit (TE_TRANSPORT_NESTED_SUBMIT). */
		if (h->canceled(h, t)) {
			p->bl_bytes -= len;
			g_mutex_unlock(&p->lock);
			h->complete(h, t, 0, -ECANCELED);
			g_mutex_lock(&p->lock);
			continue;
		}
		p->bl_bytes -= len;
		took += len;
		tcp_slot *s = slot_at(cc, cc->head++);
		s->t = t;
		s->off = off;
		s->len = len;
		s->tries = tries;
		room--;
		cc->bytes += len;
	}
	atomic_store_explicit(&p->has_work, p->bl_head != NULL || p->nretry > 0, memory_order_release);
	g_mutex_unlock(&p->lock);
	count(cc, TE_METRIC_INFLIGHT_BYTES, (int64_t)took);
	for (uint64_t i = first; i < cc->head; i++)
		prep(cc, slot_at(cc, i));
	if (cc->head != first)
		atomic_fetch_add_explicit(&tcp_rail_of(cc)->inflight, (long long)(cc->head - first), memory_order_relaxed);
	if (was_empty && cc->head != first)
		cc->io.last_progress = cc->last_rx = tcp_now_ms(); /* the stall clocks start now */
}

/* ------------------------------------------------------------ failures */

static void go_down(tcp_cconn *cc)
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
 */
static void cconn_fail(tcp_cconn *cc, int err, int mode, uint64_t at, const char *why)
{
	tcp_peer *p = cc->peer;
	const te_host *h = host_of(cc);
	size_t n = cc->head - cc->tail, nback = 0, nfail = 0;
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
	struct done { te_transfer *t; uint64_t bytes; int err; } *done = n ? g_new(struct done, n) : NULL;
	size_t ndone = 0;
	uint64_t moved = 0, held = cc->bytes;

	/* With requests on it, the connection is reset, not closed: a graceful
	 * close would leave the kernel sending what its buffer holds when the
	 * path returns, and a WRITE moved to another rail and completed could
	 * then be overwritten by its stale copy after the application reused
	 * the range. */
	if (busy && cc->io.fd >= 0) {
		struct linger lg = { .l_onoff = 1, .l_linger = 0 };
		(void)setsockopt(cc->io.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
	}
	go_down(cc);
	for (uint64_t i = cc->tail; i < cc->head; i++) {
		tcp_slot *s = slot_at(cc, i);
		if (i == at) { /* the request the failure is about */
			done[ndone++] = (struct done){ s->t, 0, mode == FAIL_REJECT ? TE_ERR_REJECTED : err };
			nfail++;
		} else if (s->sent == s->stot && s->rcvd == s->rtot) {
			done[ndone++] = (struct done){ s->t, s->len, 0 };
			moved += s->len;
		} else if (mode == FAIL_REJECT && i > at && s->tries + 1 < TCP_MAX_TRIES) {
			back[nback++] = (tcp_retry){ s->t, s->off, s->len, (uint8_t)(s->tries + 1) };
		} else if (mode == FAIL_RAIL && s->tries + 1 < TCP_MAX_FAILOVERS) {
			back[nback++] = (tcp_retry){ s->t, s->off, s->len, (uint8_t)(s->tries + 1) };
		} else {
			done[ndone++] = (struct done){ s->t, 0, mode == FAIL_REJECT ? -ECONNRESET : err };
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
	count(cc, mode == FAIL_RAIL ? TE_METRIC_FAILOVERS : TE_METRIC_RETRIES, (int64_t)nback);
	if (mode == FAIL_PEER || mode == FAIL_RAIL)
		count(cc, TE_METRIC_ERRORS, 1);
	if (mode == FAIL_RAIL)
		TE_HOST_LOG_LIMITED(p->ctx->host, TE_LOG_WARN,
				    "connection %u to %s over %s closed: %s; %zu requests go to the other rails, %zu failed",
				    cc->idx, p->name, tcp_rail_of(cc)->name, why, nback, nfail);
	else if (mode != FAIL_QUIET)
		TE_HOST_LOG_LIMITED(p->ctx->host, TE_LOG_WARN, "connection %u to %s closed: %s; %zu requests failed%s",
				    cc->idx, p->name, why, nfail,
				    nback ? ", the ones behind the rejected one go again" : "");
	/* The backlog goes before the completions below wake anyone up: what is
	 * submitted after them must not be failed for this. */
	if (mode == FAIL_PEER && busy)
		tcp_peer_fail_pending(p, err);
	if (nback > 0) {
		g_mutex_lock(&p->lock);
		if (p->nretry + nback > p->cap_retry) {
			p->cap_retry = MAX(p->cap_retry * 2, p->nretry + nback);
			p->retry = g_renew(tcp_retry, p->retry, p->cap_retry);
		}
		memcpy(p->retry + p->nretry, back, nback * sizeof *back);
		p->nretry += nback;
		for (size_t i = 0; i < nback; i++)
			p->bl_bytes += back[i].len;
		atomic_store(&p->has_work, 1);
		g_mutex_unlock(&p->lock);
	}
	/* Work queued for the peer (put back above, or waiting in its backlog
	 * behind what this connection held) needs a connection, and this one is
	 * down now, as the others may be (a target can refuse on all of them at
	 * once): each is woken to take it, connecting again if need be. */
	if (atomic_load(&p->has_work))
		tcp_peer_kick_all(p);
	for (size_t i = 0; i < ndone; i++)
		h->complete(h, done[i].t, done[i].bytes, done[i].err);
	g_free(back);
	g_free(done);
}

static void start_connect(tcp_cconn *cc);

static void connect_failed(tcp_cconn *cc, int err, const char *what)
{
	tcp_peer *p = cc->peer;
	tcp_rail *r = tcp_rail_of(cc);
	char addr[80];

	tcp_addr_name((struct sockaddr *)&r->addr[cc->addr_next % r->naddr], addr, sizeof addr);
	/* A probe of a rail known to be down is expected to fail: no warning. */
	if (cc->probing && !atomic_load(&r->up))
		TLOG(p->ctx, TE_LOG_DEBUG, "cannot connect to %s (%s): %s", p->name, addr, what);
	else
		TE_HOST_LOG_LIMITED(p->ctx->host, TE_LOG_WARN, "cannot connect to %s (%s): %s", p->name, addr,
				    what);
	go_down(cc);
	cc->addr_next++;
	/* The name may resolve to several addresses (::1 and 127.0.0.1 for
	 * localhost): try each before giving up. */
	if (++cc->addr_tries < r->naddr && !atomic_load(&p->ctx->stopping)) {
		start_connect(cc);
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
		h->complete(h, s->t, 0, err);
	}
	atomic_fetch_sub_explicit(&tcp_rail_of(cc)->inflight, (long long)(cc->head - cc->tail), memory_order_relaxed);
	cc->head = cc->snd = cc->rcv = cc->tail = 0;
	count(cc, TE_METRIC_INFLIGHT_BYTES, -(int64_t)cc->bytes);
	cc->bytes = 0;
	go_down(cc);
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

static void become_up(tcp_cconn *cc)
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

/* With a cluster key, a connection carries requests only once both sides
 * proved it. The exchange runs here, in the I/O thread, right after the
 * connect: one round trip to a peer we chose, bounded by the connect timeout
 * (3 s at most). False: the connection failed and was handled. */
static bool authenticated(tcp_cconn *cc)
{
	tcp_ctx *c = cc->peer->ctx;
	const te_host *h = c->host;

	if (!c->auth)
		return true;
	int rc = h->auth_connect(h, cc->io.fd, TE_AUTH_TCP, cc->peer->name,
				 (int)MIN(c->cfg.connect_timeout_ms, 3000));
	if (rc == 0)
		return true;
	connect_failed(cc, rc == TE_ERR_AUTH || rc == -ETIMEDOUT ? TE_ERR_AUTH : rc, "authentication failed");
	return false;
}

static void start_connect(tcp_cconn *cc)
{
	tcp_peer *p = cc->peer;
	tcp_ctx *c = p->ctx;
	tcp_rail *r = tcp_rail_of(cc);
	unsigned ai = cc->addr_next % r->naddr;
	const struct sockaddr *sa = (const struct sockaddr *)&r->addr[ai];
	int fd, rc;

	if (cc->ring == NULL) {
		cc->ring = g_try_new0(tcp_slot, c->cfg.depth);
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
		connect_failed(cc, -err, g_strerror(err));
		return;
	}
	cc->ep_events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
	rc = tcp_io_register(&cc->io, cc->ep_events);
	if (rc < 0) {
		connect_failed(cc, rc, "cannot add the socket to the epoll set");
		return;
	}
	if (crc == 0 && authenticated(cc))
		become_up(cc);
	else
		cc->connect_deadline = tcp_now_ms() + c->cfg.connect_timeout_ms;
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
static void set_events(tcp_cconn *cc, bool muted)
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

/* ---------------------------------------------------------------- send */

/* 1: bytes moved, 0: nothing to do or would block, <0: error. */
static int do_send(tcp_cconn *cc)
{
	struct iovec *iov = tls_iov;
	unsigned n = 0;
	size_t total = 0;

	for (uint64_t i = cc->snd; i < cc->head && n < TCP_IOV_MAX; i++) {
		tcp_slot *s = slot_at(cc, i);
		if (s->sent == s->stot)
			continue;
		if (s->sent < TCP_HDR_SIZE) {
			iov[n++] = (struct iovec){ s->hdr + s->sent, TCP_HDR_SIZE - s->sent };
			total += TCP_HDR_SIZE - s->sent;
		}
		if (s->op == TE_OP_WRITE) {
			uint64_t done = s->sent > TCP_HDR_SIZE ? s->sent - TCP_HDR_SIZE : 0;
			iov[n++] = (struct iovec){ (char *)s->t->local + s->off + done, s->len - done };
			total += s->len - done;
		}
	}
	if (n == 0)
		return 0;
	struct msghdr msg = { .msg_iov = iov, .msg_iovlen = n };
	ssize_t w;
	do
		w = sendmsg(cc->io.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (w < 0 && errno == EINTR);
	if (w < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			cc->io.wr = false;
			return 0;
		}
		return -errno;
	}
	if ((size_t)w < total)
		cc->io.wr = false; /* the socket buffer is full: wait for EPOLLOUT */
	cc->io.last_progress = tcp_now_ms();
	uint64_t left = (uint64_t)w;
	for (uint64_t i = cc->snd; left > 0 && i < cc->head; i++) {
		tcp_slot *s = slot_at(cc, i);
		uint64_t take = MIN(s->stot - s->sent, left);
		s->sent += take;
		left -= take;
	}
	while (cc->snd < cc->head && slot_at(cc, cc->snd)->sent == slot_at(cc, cc->snd)->stot)
		cc->snd++;
	return 1;
}

/* ------------------------------------------------------------- receive */

typedef struct rx_result {
	int err;
	int mode;
	uint64_t at;
	char why[160];
} rx_result;

/* Checks a status frame that just arrived for slot `i`. */
static bool check_status(uint64_t i, tcp_slot *s, rx_result *res)
{
	uint64_t f = le64toh(s->status);
	uint32_t code = (uint32_t)f;

	res->at = i;
	if ((uint32_t)(f >> 32) != TCP_STATUS_MAGIC) {
		res->err = TE_ERR_PROTOCOL;
		snprintf(res->why, sizeof res->why, "malformed status frame 0x%016llx for %s 0x%llx+%llu",
			 (unsigned long long)f, op_name(s->op), (unsigned long long)(s->t->remote + s->off),
			 (unsigned long long)s->len);
		return false;
	}
	if (code == TCP_STATUS_REJECTED) {
		res->err = TE_ERR_REJECTED;
		res->mode = FAIL_REJECT;
		snprintf(res->why, sizeof res->why,
			 "the peer rejected %s 0x%llx+%llu (not inside one of its remote-accessible buffers)",
			 op_name(s->op), (unsigned long long)(s->t->remote + s->off), (unsigned long long)s->len);
		return false;
	}
	if (code != TCP_STATUS_OK) {
		res->err = TE_ERR_PROTOCOL;
		snprintf(res->why, sizeof res->why, "unknown status %u", code);
		return false;
	}
	if (s->op == TE_OP_WRITE && s->sent < s->stot) {
		res->err = TE_ERR_PROTOCOL;
		snprintf(res->why, sizeof res->why, "WRITE acknowledged before its last byte was sent");
		return false;
	}
	return true;
}

/* A failed recv()/readv(), from errno: 0 when it would block (the socket is
 * drained until its next edge), -1 with the reason in `res` otherwise. */
static int recv_error(tcp_cconn *cc, rx_result *res)
{
	if (errno == EAGAIN || errno == EWOULDBLOCK) {
		cc->io.rd = false;
		return 0;
	}
	res->err = -errno;
	snprintf(res->why, sizeof res->why, "%s", g_strerror(errno));
	return -1;
}

/* 1: bytes moved, 0: would block or idle, <0: failed (details in `res`). */
static int do_recv(tcp_cconn *cc, rx_result *res)
{
	struct iovec *iov = tls_iov;
	bool v2 = cc->peer->version >= 2;
	unsigned n = 0;
	size_t total = 0;

	while (cc->rcv < cc->head && slot_at(cc, cc->rcv)->rcvd == slot_at(cc, cc->rcv)->rtot)
		cc->rcv++;
	for (uint64_t i = cc->rcv; i < cc->head && n < TCP_IOV_MAX; i++) {
		tcp_slot *s = slot_at(cc, i);
		if (s->rcvd == s->rtot)
			continue;
		uint64_t pre = v2 ? TCP_STATUS_SIZE : 0;
		if (s->rcvd < pre) {
			iov[n++] = (struct iovec){ (char *)&s->status + s->rcvd, pre - s->rcvd };
			total += pre - s->rcvd;
		}
		if (s->op == TE_OP_READ) {
			uint64_t done = s->rcvd > pre ? s->rcvd - pre : 0;
			iov[n++] = (struct iovec){ (char *)s->t->local + s->off + done, s->len - done };
			total += s->len - done;
		}
	}
	ssize_t r;
	if (n == 0) {
		/* Nothing expected: only an EOF (an idle close) or junk can come. */
		char junk[64];
		do
			r = recv(cc->io.fd, junk, sizeof junk, MSG_DONTWAIT);
		while (r < 0 && errno == EINTR);
		if (r < 0)
			return recv_error(cc, res);
		if (r == 0) {
			res->err = -ECONNRESET;
			res->mode = cc->tail == cc->head ? FAIL_QUIET : FAIL_PEER;
			snprintf(res->why, sizeof res->why, "the peer closed the connection");
			return -1;
		}
		res->err = TE_ERR_PROTOCOL;
		snprintf(res->why, sizeof res->why, "%zd bytes arrived that no request asked for", r);
		return -1;
	}
	do
		r = readv(cc->io.fd, iov, (int)n);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return recv_error(cc, res);
	if (r == 0) {
		res->err = -ECONNRESET;
		snprintf(res->why, sizeof res->why, "the peer closed the connection mid-transfer");
		return -1;
	}
	if ((size_t)r < total && !cc->io.hup)
		cc->io.rd = false; /* drained: the next arrival brings a new edge */
	cc->io.last_progress = cc->last_rx = tcp_now_ms();
	atomic_store_explicit(&tcp_rail_of(cc)->last_rx, cc->last_rx, memory_order_relaxed);
	uint64_t left = (uint64_t)r;
	for (uint64_t i = cc->rcv; left > 0 && i < cc->head; i++) {
		tcp_slot *s = slot_at(cc, i);
		uint64_t before = s->rcvd;
		uint64_t take = MIN(s->rtot - s->rcvd, left);
		s->rcvd += take;
		left -= take;
		if (v2 && before < TCP_STATUS_SIZE && s->rcvd >= TCP_STATUS_SIZE && !check_status(i, s, res)) {
			s->rcvd = 0; /* never to be taken for a finished request */
			return -1;
		}
	}
	return 1;
}

/* Completes finished requests, in order. */
static void reap(tcp_cconn *cc)
{
	const te_host *h = host_of(cc);
	uint64_t moved = 0, first = cc->tail;

	while (cc->tail < cc->head) {
		tcp_slot *s = slot_at(cc, cc->tail);
		if (s->sent != s->stot || s->rcvd != s->rtot)
			break;
		cc->bytes -= s->len;
		moved += s->len;
		cc->tail++;
		h->complete(h, s->t, s->len, 0);
	}
	if (moved > 0 && cc->peer->nrails > 1)
		atomic_fetch_add_explicit(&tcp_rail_of(cc)->bytes, moved, memory_order_relaxed);
	if (moved > 0) {
		count(cc, TE_METRIC_BYTES, (int64_t)moved);
		count(cc, TE_METRIC_INFLIGHT_BYTES, -(int64_t)moved);
	}
	if (cc->tail != first)
		atomic_fetch_sub_explicit(&tcp_rail_of(cc)->inflight, (long long)(cc->tail - first), memory_order_relaxed);
	if (cc->snd < cc->tail)
		cc->snd = cc->tail;
	if (cc->rcv < cc->tail)
		cc->rcv = cc->tail;
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
		start_connect(cc);
	}
	if (cc->state != CS_UP)
		return;
	if (p->nrails > 1 && !atomic_load(&tcp_rail_of(cc)->up)) {
		/* Another connection found the rail broken: this one is likely
		 * stuck too, so its requests move now rather than after a timeout
		 * (an idle one just closes). */
		if (cc->head == cc->tail)
			go_down(cc);
		else
			cconn_fail(cc, -ENETUNREACH, FAIL_PEER, UINT64_MAX, "its rail is down");
		return;
	}
	bool more = true;
	for (int round = 0; round < ROUNDS && more; round++) {
		rx_result res = { .mode = FAIL_PEER, .at = UINT64_MAX };
		bool moved = false;
		int rc;

		pull(cc);
		if (cc->io.wr && cc->snd < cc->head) {
			rc = do_send(cc);
			if (rc < 0) {
				char why[128];
				snprintf(why, sizeof why, "send failed: %s", g_strerror(-rc));
				cconn_fail(cc, rc, FAIL_PEER, UINT64_MAX, why);
				return;
			}
			moved |= rc > 0;
		}
		if (cc->io.rd) {
			rc = do_recv(cc, &res);
			if (rc < 0) {
				reap(cc); /* what fully arrived before the failure still counts */
				cconn_fail(cc, res.err, res.mode, res.at, res.why);
				return;
			}
			moved |= rc > 0;
		}
		reap(cc);
		more = moved;
	}
	if (cc->state == CS_UP)
		set_events(cc, false);
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

	if (ms <= 0 || p->nrails < 2 || !atomic_load(&r->up) || now - cc->last_rx <= ms ||
	    (o = tcp_other_rail_alive(p, r, now, cc->last_rx, ms)) == NULL)
		return false;
	struct tcp_info ti;
	socklen_t tl = sizeof ti;
	if (getsockopt(cc->io.fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) < 0)
		return false;
	if ((int64_t)ti.tcpi_last_ack_recv < ms)
		return false; /* packets still arrive: slow, not dead */
	snprintf(why, sizeof why,
		 "suspect: connection %u received nothing for %lld ms, no ACK for %u ms, %u segments unacknowledged, "
		 "while %s answered (TE_TCP_SUSPECT_MS)",
		 cc->idx, (long long)(now - cc->last_rx), ti.tcpi_last_ack_recv, ti.tcpi_unacked, o->name);
	cconn_fail(cc, -ECONNABORTED, FAIL_PEER, UINT64_MAX, why);
	return true;
}

/* The checks of a connection that carries requests: a suspect path, or no
 * progress at all for TE_TCP_TIMEOUT_MS. */
static void check_stall(tcp_cconn *cc, int64_t now)
{
	tcp_ctx *c = cc->peer->ctx;
	char why[128];

	if (cc->state != CS_UP || cc->head == cc->tail || suspect(cc, now))
		return;
	if (now - cc->io.last_progress > c->cfg.timeout_ms) {
		/* Not -ETIMEDOUT: that would end the tasks as TIMEOUT, and a peer
		 * that stopped answering is a failure. */
		snprintf(why, sizeof why, "no progress for %lld ms (TE_TCP_TIMEOUT_MS)",
			 (long long)(now - cc->io.last_progress));
		cconn_fail(cc, -ECONNABORTED, FAIL_PEER, UINT64_MAX, why);
	}
}

static void check_timeout(tcp_cconn *cc, int64_t now)
{
	tcp_peer *p = cc->peer;
	tcp_ctx *c = p->ctx;
	char why[128];

	/* A down rail's first connection tries it again now and then, while
	 * another rail carries the work (with none up, work connects itself). */
	if (p->nrails > 1 && cc == &p->conns[cc->rail] && cc->state == CS_DOWN &&
	    !atomic_load(&tcp_rail_of(cc)->up) && atomic_load(&p->rails_up) > 0 &&
	    !atomic_load(&tcp_rail_of(cc)->link_down) &&
	    now >= atomic_load(&tcp_rail_of(cc)->next_probe) && !atomic_load(&c->stopping)) {
		TLOG(c, TE_LOG_DEBUG, "probing rail %s of %s", tcp_rail_of(cc)->name, p->name);
		cc->probing = true;
		start_connect(cc);
		return;
	}
	if (cc->state == CS_CONNECTING && now > cc->connect_deadline) {
		snprintf(why, sizeof why, "no answer within %lld ms (TE_TCP_CONNECT_TIMEOUT_MS)",
			 (long long)c->cfg.connect_timeout_ms);
		connect_failed(cc, -EHOSTUNREACH, why);
		return;
	}
	check_stall(cc, now);
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
		go_down(cc);
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
		go_down(cc);
		g_free(cc->ring);
		cc->ring = NULL;
		tcp_io_bury(&cc->io);
		return INT64_MAX; /* held for good: nobody takes a closed connection */
	}
	if (what & MISS_SCAN)
		check_timeout(cc, tcp_now_ms());
	if (cc->state == CS_CONNECTING && cc->io.fd >= 0 && (what & MISS_WR)) {
		int err = 0;
		socklen_t el = sizeof err;
		if (getsockopt(cc->io.fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0)
			err = errno;
		if (err != 0)
			connect_failed(cc, -err, g_strerror(err));
		else if (authenticated(cc))
			become_up(cc);
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

/* -------------------------------------------------------------- callers */

/*
 * One request, waited for, costs four thread hand-offs when the I/O threads
 * do everything: the submitter wakes the connection's I/O thread, which
 * sends; the reply wakes it again, and it wakes the waiter. A thread that
 * submits a small run of requests to a peer whose connection is idle sends
 * them itself instead (tcp_direct_submit), and when it then waits
 * (te_batch_wait, through tcp_progress) it receives the replies itself,
 * sleeping in poll() on the socket: the reply wakes the waiter directly. The
 * I/O thread keeps everything else: deep batches, busy connections, connects,
 * a request whose submitter does not wait for it (the reply raises its epoll
 * edge as always, and a caller that holds the connection then hands that over
 * when it lets go).
 *
 * A caller only ever tries to take a connection (never waits for it), holds
 * the peer's `kicking` count meanwhile so that the segment's close waits for
 * it, and lets go before it returns to the application.
 */

/* This thread's last submit that went out directly. The peer is only a name
 * until it is found in live_peers (it may have been freed since). */
static _Thread_local struct {
	tcp_ctx *c;
	tcp_peer *p;
	unsigned idx;
} tls_direct;

static inline int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static bool caller_take(tcp_cconn *cc)
{
	int free_ = 0;

	return atomic_compare_exchange_strong(&cc->drv, &free_, 1);
}

/* Lets go of a connection, handing to its I/O thread what it missed
 * meanwhile: mail, a timeout check, and readiness while requests are still
 * on the ring (the I/O thread finishes them). With nothing on the ring, a
 * missed readable or writable edge means nothing (an EOF also raises
 * MISS_HUP). */
static void caller_let_go(tcp_cconn *cc)
{
	const unsigned idle_noise = MISS_RD | MISS_WR;
	bool work = cc->head != cc->tail;
	unsigned m = atomic_load(&cc->missed);

	if ((m & MISS_SCAN) && cc->state == CS_UP) {
		/* The periodic check came while the application held it: done
		 * here (a caller may hold it turn after turn of its wait). */
		atomic_fetch_and(&cc->missed, ~(unsigned)MISS_SCAN);
		check_stall(cc, tcp_now_ms());
		work = cc->head != cc->tail;
	}
	if (!work)
		atomic_fetch_and(&cc->missed, ~idle_noise);
	atomic_store(&cc->drv, 0);
	m = atomic_load(&cc->missed);
	if (!work)
		m &= ~idle_noise;
	if (m != 0)
		tcp_kick(&cc->io, MAIL_WORK);
	else if (work)
		tcp_io_arm(cc->io.thr); /* its I/O thread may be asleep with no check due */
}

/* Sends what is pending, takes in what arrived, completes what finished.
 * 1: something moved, 0: nothing, -1: the connection failed (its requests
 * completed or moved). */
static int caller_turn(tcp_cconn *cc)
{
	rx_result res = { .mode = FAIL_PEER, .at = UINT64_MAX };
	int moved = 0, rc;

	if (cc->snd < cc->head) {
		rc = do_send(cc);
		if (rc < 0) {
			char why[128];
			snprintf(why, sizeof why, "send failed: %s", g_strerror(-rc));
			cconn_fail(cc, rc, FAIL_PEER, UINT64_MAX, why);
			return -1;
		}
		moved |= rc;
	}
	if (cc->rcv < cc->head || cc->tail < cc->head) {
		rc = do_recv(cc, &res);
		if (rc < 0) {
			reap(cc);
			cconn_fail(cc, res.err, res.mode, res.at, res.why);
			return -1;
		}
		moved |= rc;
	}
	reap(cc);
	return moved;
}

bool tcp_direct_submit(tcp_peer *p)
{
	tcp_ctx *c = p->ctx;
	bool sent = false;

	atomic_fetch_add(&p->kicking, 1);
	for (unsigned k = 0; k < p->nconns && !atomic_load(&p->closing); k++) {
		tcp_cconn *cc = &p->conns[k];
		if (!caller_take(cc))
			continue;
		/* Only an idle connection that is up and whose rail is up: the rest
		 * is the I/O thread's. */
		if (cc->state != CS_UP || cc->head != cc->tail || !tcp_rail_usable(cc) ||
		    (p->nrails > 1 && !atomic_load(&tcp_rail_of(cc)->up))) {
			caller_let_go(cc);
			continue;
		}
		pull(cc);
		if (cc->head != cc->tail && caller_turn(cc) >= 0 && cc->head != cc->tail) {
			tls_direct.c = c;
			tls_direct.p = p;
			tls_direct.idx = k;
		}
		if (cc->state == CS_UP)
			set_events(cc, false); /* a send that waits for room: the I/O thread's if need be */
		caller_let_go(cc);
		sent = true;
		break;
	}
	atomic_fetch_sub(&p->kicking, 1);
	return sent;
}

void tcp_direct_forget(void)
{
	tls_direct.c = NULL;
}

/* Callers asleep in tcp_progress(), each on an eventfd that tcp_wake()
 * rings. The eventfds are kept for reuse, per instance (not per thread: a
 * plugin cannot rely on a thread-exit hook after it is unloaded). */
typedef struct tcp_sleeper {
	int efd;
	struct tcp_sleeper *next, *prev;
} tcp_sleeper;

static tcp_sleeper *sleeper_get(tcp_ctx *c)
{
	g_mutex_lock(&c->sleep_lock);
	tcp_sleeper *s = c->idle_sleepers;
	if (s != NULL) {
		c->idle_sleepers = s->next;
	} else {
		int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (fd < 0) {
			g_mutex_unlock(&c->sleep_lock);
			return NULL;
		}
		s = g_new0(tcp_sleeper, 1);
		s->efd = fd;
	}
	s->prev = NULL;
	s->next = c->sleepers;
	if (c->sleepers != NULL)
		c->sleepers->prev = s;
	c->sleepers = s;
	g_mutex_unlock(&c->sleep_lock);
	uint64_t v;
	while (read(s->efd, &v, sizeof v) > 0) /* rung for an earlier sleep */
		;
	return s;
}

static void sleeper_put(tcp_ctx *c, tcp_sleeper *s)
{
	g_mutex_lock(&c->sleep_lock);
	if (s->prev != NULL)
		s->prev->next = s->next;
	else
		c->sleepers = s->next;
	if (s->next != NULL)
		s->next->prev = s->prev;
	s->prev = NULL;
	s->next = c->idle_sleepers;
	c->idle_sleepers = s;
	g_mutex_unlock(&c->sleep_lock);
}

void tcp_wake(void *ctx)
{
	tcp_ctx *c = ctx;
	uint64_t one = 1;

	g_mutex_lock(&c->sleep_lock);
	for (tcp_sleeper *s = c->sleepers; s != NULL; s = s->next)
		if (write(s->efd, &one, sizeof one) < 0 && errno != EAGAIN)
			TLOG(c, TE_LOG_ERROR, "cannot wake a waiting thread: %s", g_strerror(errno));
	g_mutex_unlock(&c->sleep_lock);
}

void tcp_sleepers_free(tcp_ctx *c)
{
	for (int i = 0; i < 2; i++) {
		tcp_sleeper *s = i ? c->idle_sleepers : c->sleepers;
		while (s != NULL) {
			tcp_sleeper *next = s->next;
			close(s->efd);
			g_free(s);
			s = next;
		}
	}
	c->sleepers = c->idle_sleepers = NULL;
}

/* Sleeps until the socket has something for the connection, tcp_wake()
 * rings, or `left_ns` passes. */
static void caller_sleep(tcp_cconn *cc, int (*done)(void *), void *arg, int64_t left_ns)
{
	tcp_ctx *c = cc->peer->ctx;
	tcp_sleeper *s = sleeper_get(c);
	struct pollfd pf[2] = {
		{ .fd = cc->io.fd, .events = (short)(POLLIN | (cc->snd < cc->head ? POLLOUT : 0)) },
		{ .fd = s != NULL ? s->efd : -1, .events = POLLIN },
	};
	/* Without an eventfd, a drain elsewhere is seen within a millisecond. */
	if (s == NULL && left_ns > 1000000)
		left_ns = 1000000;
	/* Registered first, then checked: a drain after the check rings. */
	if (!done(arg)) {
		struct timespec ts = { .tv_sec = left_ns / 1000000000, .tv_nsec = left_ns % 1000000000 };
		if (ppoll(pf, 2, &ts, NULL) < 0 && errno != EINTR)
			TLOG(c, TE_LOG_DEBUG, "poll: %s", g_strerror(errno));
	}
	if (s != NULL)
		sleeper_put(c, s);
}

/* Drives the connection until done(arg), the time is up, or nothing of
 * ours can be on it any more (its ring is empty: -EAGAIN, the host waits
 * its usual way). */
static int caller_wait(tcp_cconn *cc, int (*done)(void *), void *arg, int64_t timeout_ns)
{
	tcp_ctx *c = cc->peer->ctx;
	int64_t start = now_ns();
	int64_t end = timeout_ns < 0 ? INT64_MAX : start + timeout_ns;
	int64_t spin_end = start + c->cfg.spin_ns;

	for (;;) {
		if (cc->state != CS_UP || cc->head == cc->tail)
			return done != NULL && done(arg) ? 0 : -EAGAIN;
		int rc = caller_turn(cc);
		if (done == NULL || done(arg))
			return 0;
		if (rc != 0)
			continue;
		int64_t now = now_ns();
		if (now >= end)
			return -ETIMEDOUT;
		if (now < spin_end) {
			/* Yield, not just pause: a thread that has work for us (the
			 * target's, on a machine with few cores) may be waiting for
			 * this very core; a spinner that keeps it only adds its spin
			 * to the round trip. */
			sched_yield();
			continue;
		}
		set_events(cc, true);
		caller_sleep(cc, done, arg, end - now);
	}
}

int tcp_progress(void *ctx, int (*done)(void *arg), void *arg, int64_t timeout_ns)
{
	tcp_ctx *c = ctx;
	tcp_peer *p = tls_direct.p;
	int rc = -EAGAIN;

	if (tls_direct.c != c)
		return -EAGAIN;
	g_mutex_lock(&c->lock);
	bool live = g_hash_table_contains(c->live_peers, p);
	if (live)
		atomic_fetch_add(&p->kicking, 1); /* p stays until this drops */
	g_mutex_unlock(&c->lock);
	if (!live) {
		tls_direct.c = NULL;
		return -EAGAIN;
	}
	if (!atomic_load(&p->closing) && tls_direct.idx < p->nconns) {
		tcp_cconn *cc = &p->conns[tls_direct.idx];
		/* A connection whose I/O thread has business with it (mail, a
		 * check) is left to it: taken turn after turn of a long wait, it
		 * would never get its turn. */
		if ((atomic_load(&cc->missed) & ~(unsigned)MISS_EVENTS) == 0 && caller_take(cc)) {
			rc = caller_wait(cc, done, arg, timeout_ns);
			if (rc == -EAGAIN && cc->head == cc->tail)
				tls_direct.c = NULL; /* nothing left there */
			if (cc->state == CS_UP)
				set_events(cc, false); /* an edge now if bytes wait for the I/O thread */
			caller_let_go(cc);
		}
	}
	atomic_fetch_sub(&p->kicking, 1);
	return rc;
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
