/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Server connections: a peer's requests against our registered memory.
 *
 * The stream is header, body, header, ... A WRITE body is read straight into
 * the pinned destination, together with the next header in the same readv.
 * READ headers, which carry no body, are read many at a time once the stream
 * looks like reads; if a WRITE header turns up in such a bulk read, the few
 * body bytes that came with it are copied out of the header buffer (at most
 * TCP_HBUF bytes, only at a READ→WRITE switch). Replies go out in request
 * order from a ring, many per sendmsg, READ data straight from the pinned
 * source. Every range is pinned while it is in use, so unregistering memory
 * waits for the request instead of freeing under it; a peer that stalls must
 * not hold that wait forever, so the pins are revocable (ABI 1.4 hosts): each
 * readv, memcpy or sendmsg that touches pinned memory happens between
 * buffer_enter and buffer_leave, and a revoked pin closes the connection
 * without touching the memory again.
 *
 * Device memory (a GPU's) cannot be read or written by the socket calls: its
 * bytes go through host buffers of the connection (TCP_DEV_REPLY_STAGE and
 * TCP_DEV_STAGE bytes at a time) and the host's buffer_copy(), which reaches
 * the device plugin.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp.h"

#include "teu-stats.h"

/* TE_TCP_STATS=1: the device stage's copies, printed when the plugin is
 * unloaded (a diagnostic for tuning on a GPU machine). */
static struct {
	atomic_ullong fills, fill_pieces, fill_bytes, fill_ns, flushes, flush_pieces, flush_bytes, flush_ns;
} tst;
TEU_STATS_SWITCH(tst, "TE_TCP_STATS")
#define TST_ADD(field, v) TEU_STATS_ADD(tst_on, tst.field, v)
static void tst_print(void)
{
	unsigned long long f = atomic_load(&tst.fills), b = atomic_load(&tst.flushes);
	fprintf(stderr, "tcp-stats: read fills %llu, %.1f pieces %.0f bytes %.1f us avg; write flushes %llu, %.1f pieces %.0f bytes %.1f us avg\n",
		f, f ? (double)atomic_load(&tst.fill_pieces) / f : 0, f ? (double)atomic_load(&tst.fill_bytes) / f : 0,
		f ? atomic_load(&tst.fill_ns) / 1e3 / f : 0,
		b, b ? (double)atomic_load(&tst.flush_pieces) / b : 0, b ? (double)atomic_load(&tst.flush_bytes) / b : 0,
		b ? atomic_load(&tst.flush_ns) / 1e3 / b : 0);
}

#define ROUNDS 16
#define RX_BURST 64 /* receive calls before the replies go out */

static inline tcp_resp *resp_at(tcp_sconn *sc, uint64_t i)
{
	return &sc->ring[i & (sc->io.thr->ctx->cfg.depth - 1)];
}

static inline tcp_ctx *ctx_of(tcp_sconn *sc)
{
	return sc->io.thr->ctx;
}

tcp_sconn *tcp_sconn_new(tcp_ctx *c, int fd, const char *name)
{
	/* One allocation: the connection and its reply ring. */
	tcp_sconn *sc = g_try_malloc0(sizeof *sc + c->cfg.depth * sizeof(tcp_resp));

	if (sc == NULL)
		return NULL;
	sc->ring = (tcp_resp *)(sc + 1);
	sc->io.kind = IO_SERVER;
	sc->io.fd = fd;
	sc->io.last_progress = tcp_now_ms();
	g_strlcpy(sc->io.name, name, sizeof sc->io.name);
	sc->state = SS_OPEN;
	return sc;
}

static bool pin_is_device(const te_host *h, const te_buffer_pin *pin)
{
	return TE_HAS_OP(h, buffer_is_device) && h->buffer_is_device(h, pin) > 0;
}

/* A host before ABI 1.4 knows no revocation: its pins hold until released. */
static bool revocable(const te_host *h)
{
	return TE_HAS_OP(h, buffer_acquire_revocable) && TE_HAS_OP(h, buffer_enter) &&
	       TE_HAS_OP(h, buffer_leave);
}

static int pin_acquire(const te_host *h, uint64_t addr, uint64_t size, te_buffer_pin *pin)
{
	if (revocable(h))
		return h->buffer_acquire_revocable(h, addr, size, TE_MEM_REMOTE_ACCESS, pin);
	return h->buffer_acquire(h, addr, size, TE_MEM_REMOTE_ACCESS, pin);
}

/* Around every touch of pinned host memory: false when the memory was
 * unregistered under the request (touch nothing, end the connection). */
static bool touch_begin(const te_host *h, const te_buffer_pin *pin)
{
	return !revocable(h) || h->buffer_enter(h, pin);
}

static void touch_end(const te_host *h, const te_buffer_pin *pin)
{
	if (revocable(h))
		h->buffer_leave(h, pin);
}

#define REVOKED_WHY "the memory it was reading or writing was unregistered (TE_UNREGISTER_TIMEOUT_MS)"

/* Around every write into a WRITE's destination (a readv, a memcpy, a copy
 * to device memory): false once the initiator fenced the connection, and
 * then nothing may be written (tcp-fence.c says why setting `applying`
 * before looking at `fenced` suffices). Two atomic operations, no lock. */
static bool apply_begin(tcp_sconn *sc)
{
	TCP_HOOK(tcp_hook_apply(sc, false));
	atomic_store(&sc->applying, 1);
	if (atomic_load(&sc->fenced)) {
		atomic_store(&sc->applying, 0);
		return false;
	}
	TCP_HOOK(tcp_hook_apply(sc, true));
	return true;
}

static void apply_end(tcp_sconn *sc)
{
	atomic_store(&sc->applying, 0);
}

/* A fenced connection is closed as soon as its owner sees it: what it still
 * holds (bodies not yet applied, replies) is dropped. */
static bool fenced_close(tcp_sconn *sc)
{
	if (!atomic_load_explicit(&sc->fenced, memory_order_relaxed))
		return false;
	TLOG(ctx_of(sc), TE_LOG_DEBUG, "connection from %s was fenced by its initiator; closing it", sc->io.name);
	tcp_sconn_close(sc, NULL);
	return true;
}

static void stage_free(const te_host *h, void *p)
{
	if (TE_HAS_OP(h, host_buffer_alloc) && TE_HAS_OP(h, host_buffer_free))
		h->host_buffer_free(h, p);
	else
		g_free(p);
}

static bool stage_ready(tcp_sconn *sc)
{
	const te_host *h = ctx_of(sc)->host;

	if (sc->stage == NULL) {
		/* replies, then bodies; the list of staged replies apart */
		size_t len = TCP_DEV_REPLY_STAGE + TCP_DEV_STAGE;
		void *p = NULL;
		if (TE_HAS_OP(h, host_buffer_alloc) && TE_HAS_OP(h, host_buffer_free)) {
			if (h->host_buffer_alloc(h, len, &p) != 0)
				p = NULL;
		} else {
			p = g_try_malloc(len);
		}
		sc->stage_piece = p != NULL ? g_try_new(tcp_piece, TCP_STAGE_PIECES) : NULL;
		sc->pend = sc->stage_piece != NULL ? g_try_new(tcp_pend, TCP_PEND_MAX) : NULL;
		if (sc->pend == NULL) {
			if (p != NULL)
				stage_free(h, p);
			g_free(sc->stage_piece);
			sc->stage_piece = NULL;
			p = NULL;
		}
		sc->stage = p;
		sc->stage_n = 0;
		sc->pend_n = 0;
		sc->pend_bytes = 0;
	}
	return sc->stage != NULL;
}

void tcp_sconn_close(tcp_sconn *sc, const char *why)
{
	tcp_ctx *c = ctx_of(sc);
	const te_host *h = c->host;

	if (why != NULL)
		TE_HOST_LOG_LIMITED(c->host, TE_LOG_WARN, "closing connection from %s: %s", sc->io.name, why);
	tcp_sconn_unlane(sc);
	if (sc->in_body) {
		h->buffer_release(h, &sc->body_pin);
		sc->in_body = false;
	}
	for (uint64_t i = sc->snd; i < sc->head; i++) {
		tcp_resp *r = resp_at(sc, i);
		if (r->pinned)
			h->buffer_release(h, &r->pin);
		r->pinned = false;
	}
	sc->snd = sc->head = 0;
	for (unsigned i = 0; i < sc->pend_n; i++) /* never copied, never acknowledged */
		h->buffer_release(h, &sc->pend[i].pin);
	sc->pend_n = 0;
	sc->pend_bytes = 0;
	if (sc->stage != NULL)
		stage_free(h, sc->stage);
	g_free(sc->stage_piece);
	g_free(sc->pend);
	sc->pend = NULL;
	sc->stage = NULL;
	sc->stage_piece = NULL;
	sc->stage_n = 0;
	if (sc->io.fd >= 0) {
		close(sc->io.fd);
		sc->io.fd = -1;
		tcp_inbound_done(c, sc->host);
	}
	tcp_sg_free(sc);
	TCP_HOOK(tcp_hook_closed(sc));
	tcp_io_bury(&sc->io);
}

static void push(tcp_sconn *sc, bool v2, uint32_t code, char *data, uint64_t len, const te_buffer_pin *pin,
		 bool dev)
{
	tcp_resp *r = resp_at(sc, sc->head++);

	r->dev = dev;
	r->has_status = v2;
	r->status = tcp_status_frame(code);
	r->data = data;
	r->len = len;
	r->tot = (v2 ? TCP_STATUS_SIZE : 0) + len;
	r->sent = 0;
	r->pinned = pin != NULL;
	if (pin)
		r->pin = *pin;
}

static void finish_body(tcp_sconn *sc)
{
	const te_host *h = ctx_of(sc)->host;

	/* Every byte is in place: the pin can go, then the acknowledgment. */
	h->buffer_release(h, &sc->body_pin);
	sc->in_body = false;
	TCP_HOOK(tcp_hook_settled(sc));
	if (sc->body_v2)
		push(sc, true, TCP_STATUS_OK, NULL, 0, NULL, false);
}

/* Copies the bodies waiting in the stage to device memory, as one batch,
 * then acknowledges them in order. 0, or -1 when the copy failed: then none
 * is acknowledged and the connection ends once the replies before them are
 * out (as for a single failed WRITE). */
static int pend_flush(tcp_sconn *sc)
{
	const te_host *h = ctx_of(sc)->host;
	const te_buffer_pin *pins[TCP_PEND_MAX];
	te_copy copies[TCP_PEND_MAX];
	unsigned n = sc->pend_n;
	int rc = 0;

	if (n == 0)
		return 0;
	if (!apply_begin(sc)) {
		sc->state = SS_FLUSH; /* the bodies are dropped with the connection */
		return -1;
	}
	uint64_t t0 = tst_now();
	TST_ADD(flushes, 1);
	TST_ADD(flush_pieces, n);
	TST_ADD(flush_bytes, sc->pend_bytes);
	for (unsigned i = 0; i < n; i++) {
		pins[i] = &sc->pend[i].pin;
		copies[i] = (te_copy){ sc->pend[i].dst, sc->stage + TCP_DEV_REPLY_STAGE + sc->pend[i].off,
				       sc->pend[i].len };
	}
	if (n > 1 && TE_HAS_OP(h, buffer_copy_batch))
		rc = h->buffer_copy_batch(h, pins, copies, n);
	else
		for (unsigned i = 0; i < n && rc == 0; i++)
			rc = h->buffer_copy(h, pins[i], copies[i].dst, copies[i].src, copies[i].len);
	apply_end(sc);
	TST_ADD(flush_ns, tst_now() - t0);
	for (unsigned i = 0; i < n; i++) {
		h->buffer_release(h, &sc->pend[i].pin);
		if (rc == 0 && sc->pend[i].v2)
			push(sc, true, TCP_STATUS_OK, NULL, 0, NULL, false);
	}
	sc->pend_n = 0;
	sc->pend_bytes = 0;
	if (rc < 0) {
		TE_HOST_LOG_LIMITED(h, TE_LOG_WARN, "%u WRITEs from %s failed: copying to device memory failed; "
				    "closing the connection", n, sc->io.name);
		sc->state = SS_FLUSH;
		return -1;
	}
	return 0;
}

/* A body complete in the stage waits there with the others. */
static void pend_add(tcp_sconn *sc)
{
	sc->pend[sc->pend_n++] = (tcp_pend){ .pin = sc->body_pin, .dst = sc->body, .off = sc->body_base,
					     .len = (uint32_t)sc->body_len, .v2 = sc->body_v2 };
	sc->pend_bytes = sc->body_base + (uint32_t)sc->body_len;
	sc->in_body = false;
	if (sc->pend_n == TCP_PEND_MAX || sc->pend_bytes == TCP_DEV_STAGE)
		pend_flush(sc);
}

/* Parses the complete headers in hbuf while the reply ring has room. */
static void parse(tcp_sconn *sc)
{
	tcp_ctx *c = ctx_of(sc);
	const te_host *h = c->host;
	unsigned pos = 0;

	while (sc->state == SS_OPEN && !sc->in_body && !tcp_sg_busy(sc) && sc->hlen - pos >= TCP_HDR_SIZE &&
	       sc->head - sc->snd < c->cfg.depth) {
		const uint8_t *p = sc->hbuf + pos;
		tcp_hdr hd;
		tcp_hdr_decode(p, &hd);
		uint64_t size = hd.size, addr = hd.addr;
		bool v2 = tcp_hdr_v2(&hd);
		unsigned op = tcp_hdr_op(&hd);
		enum tcp_frame kind = tcp_frame_kind(&hd, c->cfg.sg);
		bool first = !sc->started;
		pos += TCP_HDR_SIZE;
		sc->started = true;
		/* Bodies waiting in the stage go first unless this one can wait
		 * beside them: no reply may overtake their acknowledgments. */
		if (sc->pend_n > 0 && (op != TE_OP_WRITE || size > TCP_DEV_STAGE - sc->pend_bytes) &&
		    pend_flush(sc) < 0)
			break;

		if (kind == TCP_FRAME_LANE) {
			int rc = tcp_sconn_frame(sc, &hd, first);
			if (rc < 0) {
				sc->state = SS_FLUSH; /* earlier replies still go out, in order */
				break;
			}
			if (rc > 0)
				push(sc, true, TCP_STATUS_OK, NULL, 0, NULL, false);
			continue;
		}
		if (kind == TCP_FRAME_SG) {
			if (tcp_sg_begin(sc, &hd) < 0) {
				sc->state = SS_FLUSH; /* earlier replies still go out, in order */
				break;
			}
			pos += (unsigned)tcp_sg_feed(sc, sc->hbuf + pos, sc->hlen - pos);
			continue;
		}
		if (kind != TCP_FRAME_DATA) {
			TE_HOST_LOG_LIMITED(h, TE_LOG_WARN,
					    "malformed request from %s: opcode 0x%02x; closing the connection",
					    sc->io.name, p[16]);
			sc->state = SS_FLUSH; /* earlier replies still go out, in order */
			break;
		}
		te_buffer_pin pin = { 0 };
		int rc = TE_ERR_ADDRESS;
		const char *bad = "not inside one remote-accessible registered buffer";
		if (tcp_range_check(addr, size, &bad))
			rc = pin_acquire(h, addr, size, &pin);
		bool dev = rc == 0 && pin_is_device(h, &pin);
		if (sc->pend_n > 0 && (rc < 0 || !dev) && pend_flush(sc) < 0) {
			if (rc == 0)
				h->buffer_release(h, &pin);
			break;
		}
		if (rc < 0) {
			TE_HOST_LOG_LIMITED(h, TE_LOG_WARN,
					    "rejected %s 0x%llx+%llu from %s: %s; closing the connection",
					    tcp_op_name(op), (unsigned long long)addr, (unsigned long long)size,
					    sc->io.name, bad);
			if (v2)
				push(sc, true, TCP_STATUS_REJECTED, NULL, 0, NULL, false);
			sc->state = SS_FLUSH;
			break;
		}
		if (dev && !stage_ready(sc)) {
			TE_HOST_LOG_LIMITED(h, TE_LOG_ERROR,
					    "no memory to stage device memory for %s; closing the connection",
					    sc->io.name);
			h->buffer_release(h, &pin);
			if (v2)
				push(sc, true, TCP_STATUS_REJECTED, NULL, 0, NULL, false);
			sc->state = SS_FLUSH;
			break;
		}
		if (op == TE_OP_READ) {
			push(sc, v2, TCP_STATUS_OK, (char *)(uintptr_t)addr, size, &pin, dev);
			sc->bulk = true;
			continue;
		}
		sc->in_body = true;
		sc->body_v2 = v2;
		sc->body = (char *)(uintptr_t)addr;
		sc->body_len = size;
		sc->body_pin = pin;
		sc->body_dev = dev;
		/* Whole in the stage beside the bodies already there (room was
		 * made above), or, larger than the stage, through all of it. */
		sc->body_defer = dev && size <= TCP_DEV_STAGE - sc->pend_bytes;
		sc->body_base = sc->body_defer ? sc->pend_bytes : 0;
		sc->bulk = false;
		/* Body bytes that came with a bulk header read. */
		uint64_t take = MIN((uint64_t)(sc->hlen - pos), size);
		bool ok = true;
		if (take > 0 && !dev) {
			if (!apply_begin(sc)) {
				sc->state = SS_FLUSH; /* fenced: closed without writing */
				break;
			}
			ok = touch_begin(h, &pin);
			if (ok) {
				memcpy(sc->body, sc->hbuf + pos, take);
				touch_end(h, &pin);
			}
			apply_end(sc);
		} else if (take > 0) {
			/* Into the stage (TCP_HBUF is far smaller) with the rest. */
			memcpy(sc->stage + TCP_DEV_REPLY_STAGE + sc->body_base, sc->hbuf + pos, take);
		}
		pos += (unsigned)take;
		if (!ok) {
			/* Not acknowledged: the connection ends once the replies
			 * before it are out, and the pin with it. */
			TE_HOST_LOG_LIMITED(h, TE_LOG_WARN, "WRITE 0x%llx+%llu from %s failed: %s; closing the "
					    "connection", (unsigned long long)addr, (unsigned long long)size,
					    sc->io.name, dev ? "copying to device memory failed" : REVOKED_WHY);
			sc->state = SS_FLUSH;
			break;
		}
		sc->body_got = take;
		sc->body_staged = dev ? (uint32_t)take : 0;
		bool copy = sc->body_got == sc->body_len && dev && !sc->body_defer;
		if (copy && !apply_begin(sc)) {
			sc->state = SS_FLUSH; /* fenced: closed without writing */
			break;
		}
		int crc = copy ? h->buffer_copy(h, &pin, sc->body, sc->stage + TCP_DEV_REPLY_STAGE, take) : 0;
		if (copy)
			apply_end(sc);
		if (crc < 0) {
			h->buffer_release(h, &pin);
			sc->in_body = false;
			TE_HOST_LOG_LIMITED(h, TE_LOG_WARN, "WRITE 0x%llx+%llu from %s failed: copying to device "
					    "memory failed; closing the connection", (unsigned long long)addr,
					    (unsigned long long)size, sc->io.name);
			sc->state = SS_FLUSH;
			break;
		}
		if (sc->body_got == sc->body_len) {
			if (sc->body_defer)
				pend_add(sc);
			else
				finish_body(sc);
		}
	}
	if (pos > 0) {
		memmove(sc->hbuf, sc->hbuf + pos, sc->hlen - pos);
		sc->hlen -= pos;
	}
}

/* The staged piece holding byte `done` of reply `i`'s data, looking from
 * piece *k on (replies are sent in order), or NULL. */
static const tcp_piece *staged(tcp_sconn *sc, uint64_t i, uint64_t done, unsigned *k)
{
	for (; *k < sc->stage_n; (*k)++) {
		const tcp_piece *p = &sc->stage_piece[*k];
		if (p->resp > i)
			break;
		if (p->resp == i && done >= p->off && done < p->off + p->len)
			return p;
	}
	return NULL;
}

/* Copies device READ data into the stage from byte `done` of reply `i` on,
 * and as much of the device replies after it as fits: the pieces of one
 * sendmsg. Fails only when the first copy does (a later one is tried again
 * when its turn comes). */
static int stage_fill(tcp_sconn *sc, uint64_t i, uint64_t done)
{
	const te_host *h = ctx_of(sc)->host;
	const te_buffer_pin *pins[TCP_STAGE_PIECES];
	te_copy copies[TCP_STAGE_PIECES];
	uint32_t pos = 0;

	sc->stage_n = 0;
	for (uint64_t j = i; j < sc->head && pos < TCP_DEV_REPLY_STAGE && sc->stage_n < TCP_STAGE_PIECES; j++) {
		tcp_resp *r = resp_at(sc, j);
		if (!r->dev || r->len == 0)
			continue;
		uint64_t from = j == i ? done : 0;
		uint32_t piece = (uint32_t)MIN((uint64_t)(TCP_DEV_REPLY_STAGE - pos), r->len - from);
		pins[sc->stage_n] = &r->pin;
		copies[sc->stage_n] = (te_copy){ sc->stage + pos, r->data + from, piece };
		sc->stage_piece[sc->stage_n++] = (tcp_piece){ .resp = j, .off = from, .len = piece, .pos = pos };
		pos += piece;
		if (from + piece < r->len)
			break;
	}
	if (sc->stage_n == 0)
		return -1;
	uint64_t t0 = tst_now();
	TST_ADD(fills, 1);
	TST_ADD(fill_pieces, sc->stage_n);
	TST_ADD(fill_bytes, pos);
	/* Queued on the device together and waited for once. */
	if (sc->stage_n > 1 && TE_HAS_OP(h, buffer_copy_batch) &&
	    h->buffer_copy_batch(h, pins, copies, sc->stage_n) == 0) {
		TST_ADD(fill_ns, tst_now() - t0);
		return 0;
	}
	/* One at a time (or again, after a failed batch): a failure past the
	 * first piece ends the stage there, and that piece is tried again
	 * when its turn comes. */
	for (unsigned k = 0; k < sc->stage_n; k++)
		if (h->buffer_copy(h, pins[k], copies[k].dst, copies[k].src, copies[k].len) < 0) {
			sc->stage_n = k;
			return k == 0 ? -1 : 0;
		}
	return 0;
}

/* 1: progress, 0: nothing to do or would block, -1: closed. */
static int send_replies(tcp_sconn *sc)
{
	tcp_ctx *c = ctx_of(sc);
	const te_host *h = c->host;
	struct iovec *iov = sc->io.thr->iov;
	unsigned n = 0, k = 0, ne = 0;
	size_t total = 0;
	bool stage_used = false, revoked = false;
	uint64_t entered[TCP_IOV_MAX]; /* replies whose pinned memory this call touches */

	for (uint64_t i = sc->snd; i < sc->head && n < TCP_IOV_MAX; i++) {
		tcp_resp *r = resp_at(sc, i);
		uint64_t hs = r->has_status ? TCP_STATUS_SIZE : 0;
		if (r->len > 0 && !r->dev && r->pinned) {
			/* Its data comes from pinned memory: sent only while the pin
			 * holds; the replies before a revoked one still go out. */
			if (!touch_begin(h, &r->pin)) {
				revoked = true;
				break;
			}
			entered[ne++] = i;
		}
		if (r->sent < hs) {
			iov[n++] = (struct iovec){ (char *)&r->status + r->sent, hs - r->sent };
			total += hs - r->sent;
		}
		if (r->len > 0 && r->dev) {
			/* Device memory: from the stage, refilled (with this reply
			 * and those after it) once nothing in this call points into
			 * it; a reply not staged to its end ends the call. */
			uint64_t done = r->sent > hs ? r->sent - hs : 0;
			const tcp_piece *p = staged(sc, i, done, &k);
			if (p == NULL) {
				if (stage_used)
					break;
				if (stage_fill(sc, i, done) < 0) {
					for (unsigned j = 0; j < ne; j++)
						touch_end(h, &resp_at(sc, entered[j])->pin);
					tcp_sconn_close(sc, "reading device memory failed");
					return -1;
				}
				k = 0;
				p = &sc->stage_piece[0];
			}
			uint64_t left = p->off + p->len - done;
			iov[n++] = (struct iovec){ sc->stage + p->pos + (done - p->off), left };
			total += left;
			stage_used = true;
			if (done + left < r->len)
				break;
			continue;
		}
		if (r->len > 0) {
			uint64_t done = r->sent > hs ? r->sent - hs : 0;
			iov[n++] = (struct iovec){ r->data + done, r->len - done };
			total += r->len - done;
		}
	}
	if (n == 0) {
		for (unsigned j = 0; j < ne; j++)
			touch_end(h, &resp_at(sc, entered[j])->pin);
		if (revoked) {
			tcp_sconn_close(sc, REVOKED_WHY);
			return -1;
		}
		return 0;
	}
	struct msghdr msg = { .msg_iov = iov, .msg_iovlen = n };
	ssize_t w;
	do
		w = sendmsg(sc->io.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (w < 0 && errno == EINTR);
	/* The kernel has copied what it took: the memory is not touched after. */
	for (unsigned j = 0; j < ne; j++)
		touch_end(h, &resp_at(sc, entered[j])->pin);
	if (w < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			sc->io.wr = false;
			return 0;
		}
		char why[96];
		snprintf(why, sizeof why, "sending replies failed: %s", g_strerror(errno));
		tcp_sconn_close(sc, errno == EPIPE || errno == ECONNRESET ? NULL : why);
		return -1;
	}
	if ((size_t)w < total)
		sc->io.wr = false;
	sc->io.last_progress = tcp_now_ms();
	uint64_t left = (uint64_t)w;
	while (sc->snd < sc->head) {
		tcp_resp *r = resp_at(sc, sc->snd);
		uint64_t take = MIN(r->tot - r->sent, left);
		r->sent += take;
		left -= take;
		if (r->sent < r->tot)
			break;
		if (r->pinned)
			h->buffer_release(h, &r->pin);
		r->pinned = false;
		sc->snd++;
	}
	return 1;
}

/* 1: progress, 0: would block or blocked by the reply ring, -1: closed. */
static int receive(tcp_sconn *sc)
{
	tcp_ctx *c = ctx_of(sc);
	struct iovec iov[2];
	ssize_t r;

	if (tcp_sg_busy(sc)) {
		int rc = tcp_sg_receive(sc);
		if (rc > 0)
			parse(sc);
		return rc;
	}
	if (sc->in_body) {
		const te_host *h = c->host;
		int n = 1;
		uint64_t room = sc->body_len - sc->body_got;
		if (sc->body_dev) /* into the stage, then on to the device */
			iov[0] = (struct iovec){ sc->stage + TCP_DEV_REPLY_STAGE + sc->body_base + sc->body_staged,
						 MIN(room, (uint64_t)(TCP_DEV_STAGE - sc->body_base - sc->body_staged)) };
		else
			iov[0] = (struct iovec){ sc->body + sc->body_got, room };
		/* The next header, in the same call (only once the rest of the
		 * body fits in this one). */
		if (sc->hlen < TCP_HDR_SIZE && iov[0].iov_len == room)
			iov[n++] = (struct iovec){ sc->hbuf + sc->hlen, TCP_HDR_SIZE - sc->hlen };
		size_t want = iov[0].iov_len + (n > 1 ? iov[1].iov_len : 0);
		/* The readv writes into pinned memory: only while the pin holds,
		 * and only while the initiator has not fenced the connection. */
		if (!sc->body_dev) {
			if (!apply_begin(sc)) {
				fenced_close(sc);
				return -1;
			}
			if (!touch_begin(h, &sc->body_pin)) {
				apply_end(sc);
				tcp_sconn_close(sc, REVOKED_WHY);
				return -1;
			}
		}
		do
			r = readv(sc->io.fd, iov, n);
		while (r < 0 && errno == EINTR);
		if (!sc->body_dev) {
			touch_end(h, &sc->body_pin);
			apply_end(sc);
		}
		if (r > 0) {
			if ((size_t)r < want && !sc->io.hup)
				sc->io.rd = false; /* drained: the next arrival brings a new edge */
			uint64_t take = MIN((uint64_t)r, (uint64_t)iov[0].iov_len);
			sc->body_got += take;
			if (sc->body_dev && take > 0) {
				/* A body larger than the stage goes on to the device
				 * each time the stage is full, and at its end; one that
				 * fits waits there for the batch (pend_add). */
				sc->body_staged += (uint32_t)take;
				bool flush = !sc->body_defer &&
					     (sc->body_staged == TCP_DEV_STAGE || sc->body_got == sc->body_len);
				if (flush && !apply_begin(sc)) {
					fenced_close(sc);
					return -1;
				}
				int crc = flush ? h->buffer_copy(h, &sc->body_pin, sc->body + sc->body_got - sc->body_staged,
								 sc->stage + TCP_DEV_REPLY_STAGE, sc->body_staged) : 0;
				if (flush)
					apply_end(sc);
				if (crc < 0) {
					tcp_sconn_close(sc, "writing device memory failed");
					return -1;
				}
				if (flush)
					sc->body_staged = 0;
			}
			sc->hlen += (unsigned)((uint64_t)r - take);
			sc->io.last_progress = tcp_now_ms();
			if (sc->body_got == sc->body_len) {
				if (sc->body_dev && sc->body_defer)
					pend_add(sc);
				else
					finish_body(sc);
			}
			parse(sc);
			return 1;
		}
	} else {
		if (sc->head - sc->snd >= c->cfg.depth)
			return 0; /* replies must drain first */
		size_t want = sc->bulk ? TCP_HBUF - sc->hlen : TCP_HDR_SIZE - sc->hlen % TCP_HDR_SIZE;
		if (want == 0)
			return 0; /* a full header buffer waits for parse() */
		do
			r = recv(sc->io.fd, sc->hbuf + sc->hlen, want, MSG_DONTWAIT);
		while (r < 0 && errno == EINTR);
		if (r > 0) {
			if ((size_t)r < want && !sc->io.hup)
				sc->io.rd = false; /* drained: the next arrival brings a new edge */
			sc->hlen += (unsigned)r;
			sc->io.last_progress = tcp_now_ms();
			parse(sc);
			return 1;
		}
	}
	if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
		sc->io.rd = false;
		return 0;
	}
	if (r < 0) {
		char why[96];
		snprintf(why, sizeof why, "receive failed: %s", g_strerror(errno));
		tcp_sconn_close(sc, errno == ECONNRESET ? NULL : why);
		return -1;
	}
	/* EOF */
	if (sc->in_body) {
		char why[128];
		snprintf(why, sizeof why, "the peer closed the connection %llu bytes into a %llu-byte WRITE",
			 (unsigned long long)sc->body_got, (unsigned long long)sc->body_len);
		tcp_sconn_close(sc, why);
	} else if (sc->hlen > 0) {
		char why[96];
		snprintf(why, sizeof why, "the peer closed the connection after %u bytes of a header",
			 sc->hlen);
		tcp_sconn_close(sc, why);
	} else {
		TLOG(c, TE_LOG_DEBUG, "%s closed its connection", sc->io.name);
		tcp_sconn_close(sc, NULL);
	}
	return -1;
}

/* After a rejection: replies flushed, our side shut; discard until the peer
 * closes (so the status frame is read, not lost to a reset) or time is up. */
static void linger(tcp_sconn *sc)
{
	for (;;) {
		ssize_t r = recv(sc->io.fd, sc->io.thr->scratch, sizeof sc->io.thr->scratch, MSG_DONTWAIT);
		if (r > 0)
			continue;
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			sc->io.rd = false;
			return;
		}
		tcp_sconn_close(sc, NULL);
		return;
	}
}

void tcp_sconn_drive(tcp_sconn *sc)
{
	tcp_ctx *c = ctx_of(sc);

	for (int round = 0; round < ROUNDS; round++) {
		bool moved = false;
		int rc;

		if (fenced_close(sc))
			return;
		/* Take in what has arrived first, then answer it all with one
		 * sendmsg: one wakeup of the peer for many replies. */
		if (sc->state == SS_OPEN && tcp_sg_busy(sc) && tcp_sg_resume(sc) > 0) {
			moved = true; /* replies that waited for room in the ring */
			parse(sc);
		}
		if (sc->state == SS_OPEN && !sc->in_body && sc->hlen >= TCP_HDR_SIZE) {
			/* Headers that waited for room in the reply ring. */
			unsigned before = sc->hlen;
			parse(sc);
			moved |= sc->hlen != before;
		}
		for (int k = 0; k < RX_BURST && sc->state == SS_OPEN && sc->io.rd; k++) {
			rc = receive(sc);
			if (rc < 0)
				return;
			if (rc == 0)
				break;
			moved = true;
		}
		/* What this burst left waiting in the stage goes to the device
		 * now, its acknowledgments with the replies below. */
		if (sc->pend_n > 0 && sc->state == SS_OPEN) {
			pend_flush(sc);
			moved = true;
		}
		if (sc->snd < sc->head && sc->io.wr) {
			rc = send_replies(sc);
			if (rc < 0)
				return;
			moved |= rc > 0;
		}
		if (fenced_close(sc))
			return;
		if (sc->state == SS_FLUSH && sc->snd == sc->head) {
			if (sc->in_body) { /* a WRITE whose first bytes could not be placed */
				c->host->buffer_release(c->host, &sc->body_pin);
				sc->in_body = false;
			}
			shutdown(sc->io.fd, SHUT_WR);
			sc->state = SS_LINGER;
			sc->linger_deadline = tcp_now_ms() + MIN((int64_t)TCP_LINGER_MS, c->cfg.timeout_ms);
			sc->io.rd = true;
		}
		if (sc->state == SS_LINGER) {
			if (sc->io.rd)
				linger(sc);
			return;
		}
		if (!moved)
			return;
	}
	tcp_io_ready(&sc->io);
}

void tcp_sconn_event(tcp_sconn *sc, uint32_t events)
{
	if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
		sc->io.rd = true;
	if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))
		sc->io.hup = true; /* read on to the EOF: no further edge will come */
	if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR))
		sc->io.wr = true;
	tcp_sconn_drive(sc);
}

bool tcp_sconn_busy(const tcp_sconn *sc)
{
	return sc->in_body || sc->snd < sc->head || sc->hlen > 0 || sc->state != SS_OPEN || tcp_sg_busy(sc);
}

void tcp_sconn_check_timeout(tcp_sconn *sc, int64_t now)
{
	tcp_ctx *c = ctx_of(sc);

	if (fenced_close(sc))
		return;
	if (sc->state == SS_LINGER) {
		if (now > sc->linger_deadline)
			tcp_sconn_close(sc, NULL);
		return;
	}
	if (tcp_sconn_busy(sc) && now - sc->io.last_progress > c->cfg.timeout_ms) {
		char why[128];
		snprintf(why, sizeof why, "no progress for %lld ms in the middle of a request (TE_TCP_TIMEOUT_MS)",
			 (long long)(now - sc->io.last_progress));
		tcp_sconn_close(sc, why);
	}
}

/* ------------------------------------------- the helpers of tcp-sg.c */

int tcp_sconn_pin(tcp_sconn *sc, uint64_t addr, uint64_t size, te_buffer_pin *pin)
{
	return pin_acquire(ctx_of(sc)->host, addr, size, pin);
}

bool tcp_sconn_pin_is_device(tcp_sconn *sc, const te_buffer_pin *pin)
{
	return pin_is_device(ctx_of(sc)->host, pin);
}

bool tcp_sconn_touch_begin(tcp_sconn *sc, const te_buffer_pin *pin)
{
	return touch_begin(ctx_of(sc)->host, pin);
}

void tcp_sconn_touch_end(tcp_sconn *sc, const te_buffer_pin *pin)
{
	touch_end(ctx_of(sc)->host, pin);
}

bool tcp_sconn_apply_begin(tcp_sconn *sc)
{
	return apply_begin(sc);
}

void tcp_sconn_apply_end(tcp_sconn *sc)
{
	apply_end(sc);
}

void tcp_sconn_push(tcp_sconn *sc, uint32_t code, const char *data, uint64_t len, const te_buffer_pin *pin,
		    bool dev)
{
	push(sc, true, code, (char *)(uintptr_t)data, len, pin, dev);
}

bool tcp_sconn_stage_ready(tcp_sconn *sc)
{
	return stage_ready(sc);
}

bool tcp_sconn_fenced_close(tcp_sconn *sc)
{
	return fenced_close(sc);
}
