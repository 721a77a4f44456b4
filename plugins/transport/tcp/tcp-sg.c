/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Scatter-gather frames, the target's side (docs/tcp.md, "Small pieces").
 * A KV cache moves as thousands of small blocks; one wire request each costs
 * the target a header to parse and, for a WRITE, one readv per body. A
 * scatter-gather frame carries up to TCP_SG_MAX pieces behind one header and
 * one table, so that one readv scatters many bodies straight into their
 * destinations, and one sendmsg answers many pieces.
 *
 * Everything from the peer is bounded before use: the count (1 to
 * TCP_SG_MAX) and the total at the header, each length (1 to
 * TCP_SG_PIECE_MAX) and the sum of the lengths once the table is in; a
 * frame that breaks them ends the connection. A piece outside this engine's
 * remote-accessible memory fails alone: its status says REJECTED, a WRITE
 * body for it is read and dropped, a READ answer for it is zeros.
 *
 * Every piece is pinned from the end of its table until its reply is
 * pushed (a READ's pin then travels with the reply); writes into a
 * destination happen inside apply_begin/apply_end and, for host memory,
 * between touch_begin and touch_end, as for single requests
 * (tcp-server.c).
 */
#include <errno.h>
#include <stdio.h>
#include <sys/uio.h>

#include "tcp-conn.h"

enum { PIECE_HOST, PIECE_DEV, PIECE_REJECTED, PIECE_DONE };

typedef struct tcp_sg_piece {
	uint64_t addr, len;
	te_buffer_pin pin;
	int state;
} tcp_sg_piece;

typedef struct tcp_sg_rx {
	bool active, write, table_done;
	uint32_t n;
	uint64_t total;
	uint32_t tab_got; /* bytes of the table in */
	uint32_t cur;     /* the next piece to take a body for (WRITE) or to answer (READ) */
	uint64_t got;     /* bytes of piece `cur`'s body in */
	uint8_t tab[TCP_SG_MAX * TCP_SG_ENTRY];
	tcp_sg_piece p[TCP_SG_MAX];
} tcp_sg_rx;

/* The bytes of a rejected READ piece. */
static const char zeros[TCP_SG_PIECE_MAX];

static inline tcp_ctx *ctx_of(tcp_sconn *sc)
{
	return sc->io.thr->ctx;
}

static inline uint64_t room(tcp_sconn *sc)
{
	return ctx_of(sc)->cfg.depth - (sc->head - sc->snd);
}

bool tcp_sg_busy(const tcp_sconn *sc)
{
	return sc->sg != NULL && sc->sg->active;
}

/* The pins still held by the frame go (it ends, one way or another). */
static void sg_end(tcp_sconn *sc)
{
	const te_host *h = ctx_of(sc)->host;
	tcp_sg_rx *g = sc->sg;

	for (uint32_t i = g->cur; g->table_done && i < g->n; i++)
		if (g->p[i].state == PIECE_HOST || g->p[i].state == PIECE_DEV)
			h->buffer_release(h, &g->p[i].pin);
	g->active = false;
	g->table_done = false;
}

void tcp_sg_free(tcp_sconn *sc)
{
	if (sc->sg == NULL)
		return;
	if (sc->sg->active)
		sg_end(sc);
	g_free(sc->sg);
	sc->sg = NULL;
}

/* The frame breaks the protocol: it ends, and the connection once the
 * replies before it are out. */
static void sg_malformed(tcp_sconn *sc, const char *why)
{
	TE_HOST_LOG_LIMITED(ctx_of(sc)->host, TE_LOG_WARN,
			    "malformed scatter-gather frame from %s: %s; closing the connection", sc->io.name, why);
	if (tcp_sg_busy(sc))
		sg_end(sc);
	sc->state = SS_FLUSH;
}

/* A failure that ends the connection (logged by the caller when `why`). */
static void sg_fail(tcp_sconn *sc, const char *why)
{
	if (why != NULL)
		TE_HOST_LOG_LIMITED(ctx_of(sc)->host, TE_LOG_WARN, "scatter-gather frame from %s: %s; closing the "
				    "connection", sc->io.name, why);
	sg_end(sc);
	sc->state = SS_FLUSH;
}

int tcp_sg_begin(tcp_sconn *sc, const tcp_hdr *f)
{
	uint64_t size = f->size, count = f->addr;
	char why[96];

	sc->started = true;
	if (!tcp_sg_hdr_check(f, why, sizeof why)) {
		sg_malformed(sc, why);
		return -1;
	}
	if (sc->sg == NULL && (sc->sg = g_try_new(tcp_sg_rx, 1)) == NULL) {
		TE_HOST_LOG_LIMITED(ctx_of(sc)->host, TE_LOG_ERROR, "no memory for a scatter-gather frame from %s; "
				    "closing the connection", sc->io.name);
		sc->state = SS_FLUSH;
		return -1;
	}
	tcp_sg_rx *g = sc->sg;
	g->active = true;
	g->table_done = false;
	g->write = tcp_hdr_op(f) == TCP_OP_SG_WRITE;
	g->n = (uint32_t)count;
	g->total = size;
	g->tab_got = 0;
	g->cur = 0;
	g->got = 0;
	return 0;
}

/* READ: replies for the pieces while the ring has room; the frame ends with
 * the last. True when something was pushed. */
static bool answer(tcp_sconn *sc)
{
	tcp_sg_rx *g = sc->sg;
	bool any = false;

	while (g->cur < g->n && room(sc) > 0) {
		tcp_sg_piece *p = &g->p[g->cur++];
		if (p->state == PIECE_REJECTED)
			tcp_sconn_push(sc, TCP_STATUS_REJECTED, zeros, p->len, NULL, false);
		else /* the pin goes with the reply, released once it is sent */
			tcp_sconn_push(sc, TCP_STATUS_OK, (const char *)(uintptr_t)p->addr, p->len, &p->pin,
				       p->state == PIECE_DEV);
		any = true;
	}
	if (g->cur == g->n)
		g->active = false;
	return any;
}

/* The table is in: checked whole, then each piece pinned or rejected. */
static void table_done(tcp_sconn *sc)
{
	tcp_ctx *c = ctx_of(sc);
	tcp_sg_rx *g = sc->sg;
	uint32_t rejected = 0, first_bad = 0;
	char why[96];

	if (!tcp_sg_table_check(g->tab, g->n, g->total, why, sizeof why)) {
		sg_malformed(sc, why);
		return;
	}
	for (uint32_t i = 0; i < g->n; i++)
		tcp_sg_entry_decode(g->tab + (size_t)i * TCP_SG_ENTRY, &g->p[i].addr, &g->p[i].len);
	for (uint32_t i = 0; i < g->n; i++) {
		tcp_sg_piece *p = &g->p[i];
		int rc = TE_ERR_ADDRESS;
		const char *bad;
		if (tcp_range_check(p->addr, p->len, &bad))
			rc = tcp_sconn_pin(sc, p->addr, p->len, &p->pin);
		p->state = rc < 0 ? PIECE_REJECTED : PIECE_HOST;
		if (rc == 0 && tcp_sconn_pin_is_device(sc, &p->pin)) {
			p->state = PIECE_DEV;
			if (!tcp_sconn_stage_ready(sc)) {
				c->host->buffer_release(c->host, &p->pin);
				p->state = PIECE_REJECTED;
			}
		}
		if (p->state == PIECE_REJECTED && rejected++ == 0)
			first_bad = i;
	}
	g->table_done = true;
	if (rejected > 0)
		TE_HOST_LOG_LIMITED(c->host, TE_LOG_WARN,
				    "rejected %u of %u pieces of a scatter-gather %s from %s (the first 0x%llx+%llu): not "
				    "inside one remote-accessible registered buffer",
				    rejected, g->n, g->write ? "WRITE" : "READ", sc->io.name,
				    (unsigned long long)g->p[first_bad].addr, (unsigned long long)g->p[first_bad].len);
	if (!g->write)
		answer(sc);
}

/* Piece `cur` of a WRITE has all its bytes: settled (a device piece copied
 * on from the stage), its pin released, its status pushed. False: the
 * connection ends. */
static bool piece_done(tcp_sconn *sc)
{
	const te_host *h = ctx_of(sc)->host;
	tcp_sg_rx *g = sc->sg;
	tcp_sg_piece *p = &g->p[g->cur];

	if (p->state == PIECE_DEV) {
		if (!tcp_sconn_apply_begin(sc)) {
			sg_fail(sc, NULL); /* fenced: nothing written */
			return false;
		}
		int rc = h->buffer_copy(h, &p->pin, (void *)(uintptr_t)p->addr, sc->stage + TCP_DEV_REPLY_STAGE,
					p->len);
		tcp_sconn_apply_end(sc);
		if (rc < 0) {
			sg_fail(sc, "copying to device memory failed");
			return false;
		}
	}
	if (p->state == PIECE_HOST || p->state == PIECE_DEV) {
		h->buffer_release(h, &p->pin);
		TCP_HOOK(tcp_hook_settled(sc));
	}
	tcp_sconn_push(sc, p->state == PIECE_REJECTED ? TCP_STATUS_REJECTED : TCP_STATUS_OK, NULL, 0, NULL, false);
	p->state = PIECE_DONE;
	g->cur++;
	g->got = 0;
	if (g->cur == g->n)
		g->active = false;
	return true;
}

/* Bytes of a WRITE body that came in the header buffer: copied into place.
 * How many were taken (up to the ring's room). */
static size_t feed_bodies(tcp_sconn *sc, const uint8_t *buf, size_t len)
{
	tcp_sg_rx *g = sc->sg;
	size_t used = 0;

	while (g->active && used < len && room(sc) > 0) {
		tcp_sg_piece *p = &g->p[g->cur];
		uint64_t take = MIN(p->len - g->got, (uint64_t)(len - used));
		if (p->state == PIECE_HOST) {
			if (!tcp_sconn_apply_begin(sc)) {
				sg_fail(sc, NULL);
				return used;
			}
			bool ok = tcp_sconn_touch_begin(sc, &p->pin);
			if (ok) {
				memcpy((char *)(uintptr_t)p->addr + g->got, buf + used, take);
				tcp_sconn_touch_end(sc, &p->pin);
			}
			tcp_sconn_apply_end(sc);
			if (!ok) {
				sg_fail(sc, "the memory it was writing was unregistered (TE_UNREGISTER_TIMEOUT_MS)");
				return used;
			}
		} else if (p->state == PIECE_DEV) {
			memcpy(sc->stage + TCP_DEV_REPLY_STAGE + g->got, buf + used, take);
		}
		used += take;
		g->got += take;
		if (g->got == p->len && !piece_done(sc))
			return used;
	}
	return used;
}

size_t tcp_sg_feed(tcp_sconn *sc, const uint8_t *buf, size_t len)
{
	tcp_sg_rx *g = sc->sg;
	size_t used = 0;

	if (!tcp_sg_busy(sc))
		return 0;
	if (!g->table_done) {
		uint32_t want = g->n * TCP_SG_ENTRY - g->tab_got;
		used = MIN((size_t)want, len);
		memcpy(g->tab + g->tab_got, buf, used);
		g->tab_got += (uint32_t)used;
		if (g->tab_got < g->n * TCP_SG_ENTRY)
			return used;
		table_done(sc);
		if (!tcp_sg_busy(sc) || sc->state != SS_OPEN)
			return used;
	}
	if (g->write)
		used += feed_bodies(sc, buf + used, len - used);
	return used;
}

int tcp_sg_resume(tcp_sconn *sc)
{
	tcp_sg_rx *g = sc->sg;

	if (!tcp_sg_busy(sc) || !g->table_done)
		return 0;
	if (!g->write)
		return answer(sc) ? 1 : 0;
	/* WRITE bodies that came with the header buffer and waited for room */
	if (sc->hlen == 0 || room(sc) == 0)
		return 0;
	size_t used = feed_bodies(sc, sc->hbuf, sc->hlen);
	memmove(sc->hbuf, sc->hbuf + used, sc->hlen - used);
	sc->hlen -= (unsigned)used;
	return used > 0;
}

/* A failed or empty read: 0 would block, -1 closed. */
static int read_end(tcp_sconn *sc, ssize_t r)
{
	if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
		sc->io.rd = false;
		return 0;
	}
	char why[128];
	if (r < 0)
		snprintf(why, sizeof why, "receive failed: %s", g_strerror(errno));
	else
		snprintf(why, sizeof why, "the peer closed the connection inside a scatter-gather frame");
	tcp_sconn_close(sc, r < 0 && errno == ECONNRESET ? NULL : why);
	return -1;
}

int tcp_sg_receive(tcp_sconn *sc)
{
	tcp_sg_rx *g = sc->sg;
	struct iovec *iov = sc->io.thr->iov;
	ssize_t r;

	if (sc->hlen > 0 || (g->table_done && !g->write)) {
		/* Bytes of it still in the header buffer, or READ answers that
		 * wait for room: those first. */
		int rc = tcp_sg_resume(sc);
		if (sc->state != SS_OPEN)
			return 1; /* the drive loop flushes and lingers */
		if (sc->hlen > 0 || !g->write || rc > 0)
			return rc;
	}
	if (!g->table_done) {
		size_t want = g->n * TCP_SG_ENTRY - g->tab_got;
		do
			r = recv(sc->io.fd, g->tab + g->tab_got, want, MSG_DONTWAIT);
		while (r < 0 && errno == EINTR);
		if (r <= 0)
			return read_end(sc, r);
		if ((size_t)r < want && !sc->io.hup)
			sc->io.rd = false;
		sc->io.last_progress = tcp_now_ms();
		g->tab_got += (uint32_t)r;
		if (g->tab_got == g->n * TCP_SG_ENTRY)
			table_done(sc);
		return 1;
	}
	/* WRITE bodies: one readv into as many destinations as the ring has
	 * room to answer, ending at a device piece (copied on before the next);
	 * after the frame's last byte, the next header. */
	uint64_t space = room(sc);
	if (space == 0)
		return 0; /* replies must drain first */
	unsigned n = 0, entered = 0;
	size_t want = 0;
	bool host = false;
	uint32_t i = g->cur;
	for (; i < g->n && n < TCP_IOV_MAX && i - g->cur < space; i++) {
		tcp_sg_piece *p = &g->p[i];
		uint64_t from = i == g->cur ? g->got : 0, left = p->len - from;
		if (p->state == PIECE_HOST) {
			iov[n++] = (struct iovec){ (char *)(uintptr_t)p->addr + from, left };
			host = true;
		} else if (p->state == PIECE_DEV) {
			iov[n++] = (struct iovec){ sc->stage + TCP_DEV_REPLY_STAGE + from, left };
		} else {
			iov[n++] = (struct iovec){ sc->io.thr->scratch, left };
		}
		want += left;
		if (p->state == PIECE_DEV) {
			i++;
			break;
		}
	}
	if (i == g->n && sc->hlen < TCP_HDR_SIZE) {
		iov[n++] = (struct iovec){ sc->hbuf + sc->hlen, TCP_HDR_SIZE - sc->hlen };
		want += TCP_HDR_SIZE - sc->hlen;
	}
	/* Only while the initiator has not fenced the connection, and only
	 * while every pin written into holds. */
	if (host && !tcp_sconn_apply_begin(sc)) {
		tcp_sconn_fenced_close(sc);
		return -1;
	}
	for (uint32_t k = g->cur; host && k < i; k++, entered++)
		if (g->p[k].state == PIECE_HOST && !tcp_sconn_touch_begin(sc, &g->p[k].pin))
			break;
	if (host && g->cur + entered < i) {
		for (uint32_t k = g->cur; k < g->cur + entered; k++)
			if (g->p[k].state == PIECE_HOST)
				tcp_sconn_touch_end(sc, &g->p[k].pin);
		tcp_sconn_apply_end(sc);
		tcp_sconn_close(sc, "the memory it was writing was unregistered (TE_UNREGISTER_TIMEOUT_MS)");
		return -1;
	}
	do
		r = readv(sc->io.fd, iov, (int)n);
	while (r < 0 && errno == EINTR);
	for (uint32_t k = g->cur; host && k < i; k++)
		if (g->p[k].state == PIECE_HOST)
			tcp_sconn_touch_end(sc, &g->p[k].pin);
	if (host)
		tcp_sconn_apply_end(sc);
	if (r <= 0)
		return read_end(sc, r);
	if ((size_t)r < want && !sc->io.hup)
		sc->io.rd = false; /* drained: the next arrival brings a new edge */
	sc->io.last_progress = tcp_now_ms();
	uint64_t left = (uint64_t)r;
	while (left > 0 && g->active) {
		tcp_sg_piece *p = &g->p[g->cur];
		uint64_t take = MIN(p->len - g->got, left);
		g->got += take;
		left -= take;
		if (g->got == p->len && !piece_done(sc))
			return 1;
	}
	sc->hlen += (unsigned)left; /* the next header's first bytes */
	return 1;
}

/* -------------------------------------------------- the initiator's side */

/* A piece a scatter-gather frame may carry. */
static bool sg_piece(const tcp_slot *s, unsigned op)
{
	return s->fence == NULL && s->t->opcode == op && s->len <= TCP_SG_PIECE_MAX;
}

unsigned tcp_sg_prep(tcp_cconn *cc, uint64_t first)
{
	unsigned depth = cc->peer->ctx->cfg.depth;
	tcp_slot *s0 = slot_at(cc, first);

	if (!cc->peer->sg || s0->fence != NULL || s0->len > TCP_SG_PIECE_MAX)
		return 0;
	/* Consecutive pieces of one opcode, not past the end of the ring (the
	 * table is one run of `sgtab`). */
	unsigned op = s0->t->opcode, pos = (unsigned)(first & (depth - 1));
	unsigned n = 1;
	uint64_t bytes = s0->len;
	while (first + n < cc->head && n < TCP_SG_MAX && pos + n < depth && sg_piece(slot_at(cc, first + n), op)) {
		bytes += slot_at(cc, first + n)->len;
		n++;
	}
	if (n < 2)
		return 0; /* a single request goes in its usual frame */
	uint8_t *tab = cc->sgtab + (size_t)pos * TCP_SG_ENTRY;
	for (unsigned k = 0; k < n; k++) {
		tcp_slot *s = slot_at(cc, first + k);
		tcp_sg_entry_encode(tab + (size_t)k * TCP_SG_ENTRY, s->t->remote + s->off, s->len);
		s->op = (uint8_t)op;
		s->sg = true;
		s->sgn = k == 0 ? (uint16_t)n : 0;
		s->hlen = k == 0 ? TCP_HDR_SIZE + n * TCP_SG_ENTRY : 0;
		s->err = 0;
		s->sent = s->rcvd = s->status = 0;
		s->stot = s->hlen + (op == TE_OP_WRITE ? s->len : 0);
		s->rtot = TCP_STATUS_SIZE + (op == TE_OP_READ ? s->len : 0);
		TCP_HOOK(tcp_hook_prep(cc, s));
	}
	tcp_hdr_encode(s0->hdr, bytes, n, (uint8_t)(TCP_OP_V2 | (op == TE_OP_WRITE ? TCP_OP_SG_WRITE : TCP_OP_SG_READ)));
	return n;
}
