/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The TCP transport's server side (docs/wire.md, "TCP data protocol"): a
 * peer's byte stream of 24-byte request headers and WRITE bodies, read and
 * checked by tcp-server.c. The input goes through a socketpair into a server
 * connection driven the way an I/O thread drives it, until the connection
 * closes; the replies are drained from the other end. One 64 KiB region at
 * 0x20000000 is "registered" (fuzz-host.h), so requests inside it are served
 * and the rest are refused. Afterwards every pin taken must have been
 * released, and the reply stream must hold exactly what the requests asked
 * for. tcp-io.c is compiled in for its per-thread list of closed connections.
 * HELLO and FENCE frames (libte's) are taken or refused as docs/wire.md says;
 * each input starts with no lane known. Scatter-gather frames (libte's) are
 * bounded, answered piece by piece, a piece outside the region failing
 * alone.
 */
#include "../../plugins/transport/tcp/tcp-server.c"
#include "../../plugins/transport/tcp/tcp-io.c"

#include <sys/ioctl.h>

#include "fuzz-host.h"

static tcp_ctx *ctx;
static tcp_thread *thr;

static void setup(void)
{
	if (ctx != NULL)
		return;
	fuzz_region_init();
	ctx = g_new0(tcp_ctx, 1);
	ctx->host = &fuzz_host;
	ctx->cfg.depth = 8; /* small: the ring fills and parsing waits */
	ctx->cfg.timeout_ms = 1000;
	ctx->cfg.max_per_peer = 4;
	ctx->cfg.sg = true;
	g_mutex_init(&ctx->inbound_lock);
	ctx->per_peer = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
	thr = g_new0(tcp_thread, 1);
	thr->ctx = ctx;
	/* Closed connections are kept here, not freed, so the harness can
	 * see that the connection closed. */
	tls_grave = g_ptr_array_new();
}

/* What the requests in `data` should produce, as far as the server gets:
 * the reply bytes of each accepted request, until the first refused one
 * (whose v2 status frame is the last thing sent). */
static uint64_t expected_reply(const uint8_t *data, size_t size)
{
	uint64_t base = (uint64_t)(uintptr_t)fuzz_region, total = 0, lane = 0, gen = 0;
	size_t pos = 0;
	static const uint8_t zeros[7];

	while (size - pos >= TCP_HDR_SIZE) {
		uint64_t len, addr;
		memcpy(&len, data + pos, 8);
		memcpy(&addr, data + pos + 8, 8);
		len = le64toh(len);
		addr = le64toh(addr);
		uint8_t op = data[pos + 16];
		bool v2 = op & TCP_OP_V2, first = pos == 0;
		bool pad = memcmp(data + pos + 17, zeros, sizeof zeros) == 0;
		op &= TCP_OP_MASK;
		pos += TCP_HDR_SIZE;
		if (v2 && op == TCP_OP_HELLO) {
			/* first, once, nothing zero: taken without a reply */
			if (!first || !pad || len == 0 || addr == 0)
				break;
			lane = len;
			gen = addr;
			continue;
		}
		if (v2 && op == TCP_OP_FENCE) {
			/* after a HELLO, naming an earlier connection: a status */
			if (lane == 0 || !pad || len == 0 || addr == 0 || (len == lane && addr >= gen))
				break;
			total += TCP_STATUS_SIZE;
			continue;
		}
		if (v2 && (op == TCP_OP_SG_READ || op == TCP_OP_SG_WRITE)) {
			/* `len` bytes in `addr` pieces, each 1 to TCP_SG_PIECE_MAX */
			if (!pad || addr == 0 || addr > TCP_SG_MAX || len < addr || len > addr * TCP_SG_PIECE_MAX ||
			    size - pos < addr * TCP_SG_ENTRY)
				break;
			const uint8_t *tab = data + pos;
			uint64_t sum = 0;
			bool good = true;
			for (uint64_t i = 0; i < addr && good; i++) {
				uint64_t pl;
				memcpy(&pl, tab + i * TCP_SG_ENTRY + 8, 8);
				pl = le64toh(pl);
				good = pl > 0 && pl <= TCP_SG_PIECE_MAX;
				sum += pl;
			}
			if (!good || sum != len)
				break;
			pos += addr * TCP_SG_ENTRY;
			bool cut = false;
			for (uint64_t i = 0; i < addr; i++) {
				uint64_t pl;
				memcpy(&pl, tab + i * TCP_SG_ENTRY + 8, 8);
				pl = le64toh(pl);
				if (op == TCP_OP_SG_READ) { /* a status and the bytes, or zeros */
					total += TCP_STATUS_SIZE + pl;
					continue;
				}
				if (size - pos < pl) {
					cut = true; /* the stream ends inside a body */
					break;
				}
				pos += pl;
				total += TCP_STATUS_SIZE;
			}
			if (cut)
				break;
			continue;
		}
		if (op != TE_OP_READ && op != TE_OP_WRITE)
			break;
		bool ok = len > 0 && addr >= base && len <= FUZZ_REGION_SIZE &&
			  addr - base <= FUZZ_REGION_SIZE - len;
		if (!ok) {
			total += v2 ? TCP_STATUS_SIZE : 0;
			break;
		}
		if (op == TE_OP_READ) {
			total += (v2 ? TCP_STATUS_SIZE : 0) + len;
			continue;
		}
		if (size - pos < len)
			break; /* the stream ends inside the body */
		pos += len;
		total += v2 ? TCP_STATUS_SIZE : 0;
	}
	return total;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int sv[2];
	uint64_t got = 0;
	char sink[65536];

	if (size > (1u << 20))
		return 0;
	setup();
	tcp_lanes_free(ctx);
	tcp_lanes_init(ctx);
	FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
	fuzz_send_all(sv[1], sv[0], data, size, 4 << 20);

	thr->ready = NULL;
	tcp_sconn *sc = tcp_sconn_new(ctx, sv[0], "127.0.0.2:40000");
	FUZZ_CHECK(sc != NULL);
	g_strlcpy(sc->host, "127.0.0.2", sizeof sc->host);
	FUZZ_CHECK(inbound_take(ctx, sc->host)); /* as the accepting thread counts it in */
	sc->io.thr = thr;
	/* The peer keeps its side open until the server has nothing more to
	 * say (a real client reads replies while it sends), then closes it. */
	bool shut = false;
	int idle = 0, unread = -1;
	for (int i = 0; i < 100000 && tls_grave->len == 0; i++) {
		/* What epoll would report: readable, writable, and once the
		 * peer shut its side, hung up. */
		sc->io.rd = sc->io.wr = true;
		sc->io.hup = shut;
		tcp_sconn_drive(sc);
		ssize_t r;
		uint64_t before = got;
		while ((r = recv(sv[1], sink, sizeof sink, MSG_DONTWAIT)) > 0)
			got += (uint64_t)r;
		int left = 0;
		if (tls_grave->len == 0)
			ioctl(sv[0], FIONREAD, &left);
		idle = got == before && left == unread ? idle + 1 : 0;
		unread = left;
		if (idle >= 2 && !shut) {
			shutdown(sv[1], SHUT_WR);
			shut = true;
		}
	}
	if (tls_grave->len == 0)
		tcp_sconn_close(sc, "the harness gave up"); /* a connection that never ends */
	FUZZ_CHECK(tls_grave->len == 1 && g_ptr_array_index(tls_grave, 0) == &sc->io);
	ssize_t r;
	while ((r = recv(sv[1], sink, sizeof sink, MSG_DONTWAIT)) > 0)
		got += (uint64_t)r;
	finalize_all(tls_grave);
	close(sv[1]);
	FUZZ_CHECK(fuzz_pins == 0);
	FUZZ_CHECK(atomic_load(&ctx->inbound) == 0 && g_hash_table_size(ctx->per_peer) == 0);
	FUZZ_CHECK(got == expected_reply(data, size));
	return 0;
}
