/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A client connection's bytes, for whichever thread drives it: one sendmsg
 * carries many headers and WRITE payloads straight from the registered
 * sources; one readv scatters many replies, status frames into the ring and
 * READ payloads straight into the registered destinations.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "tcp-conn.h"

/* The iovecs of one sendmsg or readv, of whichever thread drives a
 * connection: its I/O thread or a caller. */
static _Thread_local struct iovec tls_iov[TCP_IOV_MAX + 2];

/* ---------------------------------------------------------------- send */

/* The transfers whose memory one sendmsg or readv touches, entered into
 * their gates (consecutive slices of one transfer enter once). */
static _Thread_local te_transfer *tls_in[TCP_IOV_MAX + 2];

static void leave_all(const tcp_ctx *c, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		tcp_leave(c, tls_in[i]);
}

/* Enters `t`'s gate for this call unless the last one entered is `t`:
 * false when the host ended it (nothing of it may be touched). */
static bool enter_once(const tcp_ctx *c, te_transfer *t, unsigned *nin)
{
	if (*nin > 0 && tls_in[*nin - 1] == t)
		return true;
	if (!tcp_enter(c, t))
		return false;
	tls_in[(*nin)++] = t;
	return true;
}

/* 1: bytes moved, 0: nothing to do or would block, <0: error. A WRITE
 * whose transfer the host ended stops the sending before its request
 * (`gate_shut`: the connection ends after this turn). */
int tcp_cconn_send(tcp_cconn *cc)
{
	const tcp_ctx *c = cc->peer->ctx;
	struct iovec *iov = tls_iov;
	unsigned n = 0, nin = 0;
	size_t total = 0;

	/* up to three iovecs a request: header, table, body */
	for (uint64_t i = cc->snd; i < cc->head && n + 3 <= TCP_IOV_MAX + 2; i++) {
		tcp_slot *s = slot_at(cc, i);
		if (s->sent == s->stot)
			continue;
		/* The body comes from the transfer's memory: its gate first,
		 * and nothing of this request goes when it is shut. */
		if (s->op == TE_OP_WRITE && s->fence == NULL && !enter_once(c, s->t, &nin)) {
			cc->gate_shut = true;
			break;
		}
		if (s->hlen > 0 && s->sent < TCP_HDR_SIZE) {
			iov[n++] = (struct iovec){ s->hdr + s->sent, TCP_HDR_SIZE - s->sent };
			total += TCP_HDR_SIZE - s->sent;
		}
		if (s->hlen > TCP_HDR_SIZE && s->sent < s->hlen) {
			/* a scatter-gather frame's table, at the frame's ring position */
			uint64_t from = s->sent > TCP_HDR_SIZE ? s->sent - TCP_HDR_SIZE : 0;
			uint8_t *tab = cc->sgtab + (i & (cc->peer->ctx->cfg.depth - 1)) * TCP_SG_ENTRY;
			iov[n++] = (struct iovec){ tab + from, s->hlen - TCP_HDR_SIZE - from };
			total += s->hlen - TCP_HDR_SIZE - from;
		}
		if (s->op == TE_OP_WRITE) {
			uint64_t done = s->sent > s->hlen ? s->sent - s->hlen : 0;
			iov[n++] = (struct iovec){ (char *)s->t->local + s->off + done, s->len - done };
			total += s->len - done;
		}
	}
	if (n == 0) {
		leave_all(c, nin);
		return 0;
	}
	struct msghdr msg = { .msg_iov = iov, .msg_iovlen = n };
	ssize_t w;
	do
		w = sendmsg(cc->io.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (w < 0 && errno == EINTR);
	if (w < 0) {
		int err = errno;
		leave_all(c, nin);
		if (err == EAGAIN || err == EWOULDBLOCK) {
			cc->io.wr = false;
			return 0;
		}
		return -err;
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
		/* Body bytes left: counted before the gate is left, so that an
		 * expire() after it sees them. */
		if (s->op == TE_OP_WRITE && s->fence == NULL && !s->counted && s->sent > s->hlen) {
			s->counted = true;
			tcp_unsettled_add(s->t, 1);
		}
	}
	leave_all(c, nin);
	while (cc->snd < cc->head && slot_at(cc, cc->snd)->sent == slot_at(cc, cc->snd)->stot)
		cc->snd++;
	return 1;
}

/* ------------------------------------------------------------- receive */

/* Checks a status frame that just arrived for slot `i`. */
static bool check_status(uint64_t i, tcp_slot *s, tcp_rx_result *res)
{
	uint32_t code;
	bool framed = tcp_status_decode(s->status, &code);
	unsigned long long f = (unsigned long long)le64toh(s->status);

	res->at = i;
	if (s->fence != NULL) {
		/* A target that fences honours every well-formed FENCE. */
		if (framed && code == TCP_STATUS_OK)
			return true;
		res->err = TE_ERR_PROTOCOL;
		snprintf(res->why, sizeof res->why, "status frame 0x%016llx for a FENCE", f);
		return false;
	}
	if (!framed) {
		res->err = TE_ERR_PROTOCOL;
		snprintf(res->why, sizeof res->why, "malformed status frame 0x%016llx for %s 0x%llx+%llu",
			 f, tcp_op_name(s->op), (unsigned long long)(s->t->remote + s->off),
			 (unsigned long long)s->len);
		return false;
	}
	if (code == TCP_STATUS_REJECTED && s->sg) {
		/* A piece of a scatter-gather frame fails alone; the frame and
		 * the connection go on (a READ's bytes that follow are zeros). */
		s->err = TE_ERR_REJECTED;
		return true;
	}
	if (code == TCP_STATUS_REJECTED) {
		res->err = TE_ERR_REJECTED;
		res->mode = FAIL_REJECT;
		snprintf(res->why, sizeof res->why,
			 "the peer rejected %s 0x%llx+%llu (not inside one of its remote-accessible buffers)",
			 tcp_op_name(s->op), (unsigned long long)(s->t->remote + s->off), (unsigned long long)s->len);
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
static int recv_error(tcp_cconn *cc, tcp_rx_result *res)
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
int tcp_cconn_recv(tcp_cconn *cc, tcp_rx_result *res)
{
	const tcp_ctx *c = cc->peer->ctx;
	struct iovec *iov = tls_iov;
	bool v2 = cc->peer->version >= 2;
	unsigned n = 0, nin = 0;
	size_t total = 0;

	while (cc->rcv < cc->head && slot_at(cc, cc->rcv)->rcvd == slot_at(cc, cc->rcv)->rtot)
		cc->rcv++;
	for (uint64_t i = cc->rcv; i < cc->head && n < TCP_IOV_MAX; i++) {
		tcp_slot *s = slot_at(cc, i);
		if (s->rcvd == s->rtot)
			continue;
		uint64_t pre = v2 ? TCP_STATUS_SIZE : 0;
		/* A READ's body goes into the transfer's memory: its gate first.
		 * Shut, nothing more is taken from the socket for it or after it
		 * (the connection ends after this turn). */
		if (s->op == TE_OP_READ && s->fence == NULL && !enter_once(c, s->t, &nin)) {
			cc->gate_shut = true;
			break;
		}
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
	if (n == 0 && cc->gate_shut) {
		leave_all(c, nin);
		return 0;
	}
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
	int rerr = errno;
	leave_all(c, nin);
	errno = rerr;
	if (r < 0)
		return recv_error(cc, res);
	if (r == 0) {
		res->err = -ECONNRESET;
		snprintf(res->why, sizeof res->why, "the peer closed the connection mid-transfer");
		return -1;
	}
	if ((size_t)r < total && !cc->io.hup)
		cc->io.rd = false; /* drained: the next arrival brings a new edge */
	int64_t now = tcp_now_ms();
	tcp_rail_heard(cc, now);
	cc->io.last_progress = cc->last_rx = now;
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

/* Finished requests reported together: complete_many() lowers what their
 * tasks share once per run (a scatter-gather frame answers many). */
#define REAP_MAX 64
typedef struct reaped {
	size_t n;
	te_transfer *ts[REAP_MAX];
	uint64_t bytes[REAP_MAX];
	int err[REAP_MAX];
} reaped;

static void reap_flush(tcp_cconn *cc, reaped *r)
{
	te_host_complete_slices(host_of(cc), cc->peer->ctx->complete_many, r->ts, r->bytes, r->err, r->n);
	r->n = 0;
}

/* Completes finished requests, in order. */
void tcp_cconn_reap(tcp_cconn *cc)
{
	const te_host *h = host_of(cc);
	uint64_t moved = 0, first = cc->tail;
	reaped r;

	r.n = 0;
	while (cc->tail < cc->head) {
		tcp_slot *s = slot_at(cc, cc->tail);
		if (s->sent != s->stot || s->rcvd != s->rtot)
			break;
		cc->bytes -= s->len;
		moved += s->err ? 0 : s->len;
		cc->tail++;
		if (s->counted) { /* answered: settled */
			s->counted = false;
			tcp_unsettled_add(s->t, -1);
		}
		if (s->fence != NULL) {
			tcp_fence *f = s->fence;
			s->fence = NULL;
			reap_flush(cc, &r); /* what came before the fence is reported first */
			tcp_fence_done(cc->peer, f);
			continue;
		}
		if (s->err != 0)
			TE_HOST_LOG_LIMITED(h, TE_LOG_WARN, "the peer %s rejected %s 0x%llx+%llu (not inside one of its "
					    "remote-accessible buffers)", cc->peer->name, tcp_op_name(s->op),
					    (unsigned long long)(s->t->remote + s->off), (unsigned long long)s->len);
		r.ts[r.n] = s->t;
		r.bytes[r.n] = s->err ? 0 : s->len;
		r.err[r.n++] = s->err;
		if (r.n == REAP_MAX)
			reap_flush(cc, &r);
	}
	reap_flush(cc, &r);
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

