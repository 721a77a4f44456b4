/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Scatter-gather frames (docs/wire.md, "Scatter-gather frames") byte by
 * byte, from both sides: a client written by hand against a libte target
 * (pieces written and read, mixed with the usual frames, a piece out of
 * range failing alone, malformed frames closing only their connection), and
 * a fake target that checks what a libte initiator sends (one frame for
 * small pieces of one opcode when the descriptor says tcp_sg; the usual
 * frames otherwise, and for pieces above 64 KiB).
 */
#include <pthread.h>
#include <stdatomic.h>

#include "tcp-test.h"

#define W_SG_READ 0x90
#define W_SG_WRITE 0x91
#define W_SG_MAX 256
#define W_SG_PIECE_MAX 65536

/* =============================================== part A: libte as the target */

#define RBUF (1u << 20)

static te_engine *tgt;
static unsigned char *rbuf; /* remote-accessible */
static unsigned char *lbuf; /* registered, local only */
static int dport;

typedef struct piece {
	uint64_t addr, len;
} piece;

/* A frame: header (bytes, count, opcode), table, then `bodies` (NULL: none). */
static size_t sg_frame(unsigned char *out, uint8_t op, const piece *p, unsigned n, const unsigned char *bodies)
{
	uint64_t total = 0;
	for (unsigned i = 0; i < n; i++)
		total += p[i].len;
	put_hdr(out, total, n, op);
	size_t at = W_HDR;
	for (unsigned i = 0; i < n; i++, at += 16) {
		uint64_t a = htole64(p[i].addr), l = htole64(p[i].len);
		memcpy(out + at, &a, 8);
		memcpy(out + at + 8, &l, 8);
	}
	if (bodies != NULL) {
		memcpy(out + at, bodies, total);
		at += total;
	}
	return at;
}

static int dconnect(void)
{
	int fd = tcp_connect_port(dport);
	REQUIRE(fd >= 0);
	return fd;
}

static void test_advertised(void)
{
	char *d = rpc_exchange(te_engine_rpc_port(tgt), 1, "{}");
	CHECK_EQ(json_int(d, "tcp_sg"), 1);
	free(d);
}

/* WRITE then READ of three pieces, between a READ and a WRITE of the usual
 * kind, all in one send: every reply in order. */
static void test_write_read_mixed(void)
{
	static unsigned char out[8192], in[4096];
	unsigned char bodies[121];
	const piece p[3] = { { (uintptr_t)(rbuf + 0x100), 16 }, { (uintptr_t)(rbuf + 0x300), 5 },
			     { (uintptr_t)(rbuf + 0x1000), 100 } };
	int fd = dconnect();

	fill_pattern(rbuf, RBUF, 1);
	fill_pattern(bodies, sizeof bodies, 2);
	size_t at = 0;
	/* (a READ's bytes are sent from the memory itself, later: not from a
	 * range the WRITE behind it changes) */
	put_hdr(out, 8, (uintptr_t)(rbuf + 0x180), 0x80);
	at += W_HDR;
	unsigned char old[8];
	memcpy(old, rbuf + 0x180, 8);
	at += sg_frame(out + at, W_SG_WRITE, p, 3, bodies);
	at += sg_frame(out + at, W_SG_READ, p, 3, NULL);
	put_hdr(out + at, 4, (uintptr_t)(rbuf + 0x2000), 0x81);
	at += W_HDR;
	memcpy(out + at, "wxyz", 4);
	at += 4;
	CHECK(send_all(fd, out, at));
	size_t want = 8 + 8 + 3 * 8 + (3 * 8 + 121) + 8;
	CHECK_EQ(recv_exact(fd, in, want, 3000, NULL), (ssize_t)want);
	CHECK(get_le64(in) == W_STATUS_OK && memcmp(in + 8, old, 8) == 0);
	for (int i = 0; i < 3; i++)
		CHECK(get_le64(in + 16 + 8 * i) == W_STATUS_OK);
	CHECK(memcmp(rbuf + 0x100, bodies, 16) == 0);
	CHECK(memcmp(rbuf + 0x300, bodies + 16, 5) == 0);
	CHECK(memcmp(rbuf + 0x1000, bodies + 21, 100) == 0);
	/* READ answers: status, bytes; per piece */
	unsigned char *r = in + 40;
	CHECK(get_le64(r) == W_STATUS_OK && memcmp(r + 8, bodies, 16) == 0);
	r += 8 + 16;
	CHECK(get_le64(r) == W_STATUS_OK && memcmp(r + 8, bodies + 16, 5) == 0);
	r += 8 + 5;
	CHECK(get_le64(r) == W_STATUS_OK && memcmp(r + 8, bodies + 21, 100) == 0);
	r += 8 + 100;
	CHECK(get_le64(r) == W_STATUS_OK);
	CHECK(memcmp(rbuf + 0x2000, "wxyz", 4) == 0);
	CHECK(silent_for(fd, 100));
	close(fd);
}

/* A large frame, sent in small parts with pauses: table and bodies arrive
 * split anywhere; the most pieces and the largest piece are taken. */
static void test_large_frame_split(void)
{
	static piece p[W_SG_MAX];
	static unsigned char bodies[W_SG_MAX * 1024 + W_SG_PIECE_MAX], out[sizeof bodies + 24 + 16 * W_SG_MAX];
	static unsigned char in[W_SG_MAX * 8];
	uint64_t total = 0;
	for (unsigned i = 0; i < W_SG_MAX; i++) {
		p[i].addr = (uintptr_t)(rbuf + 0x10000 + (uint64_t)i * 2048); /* every other KiB */
		p[i].len = i == 7 ? 1 : 1000 + i % 24;
		total += p[i].len;
	}
	p[W_SG_MAX - 1] = (piece){ (uintptr_t)(rbuf + 0x90000), W_SG_PIECE_MAX };
	total += W_SG_PIECE_MAX - (1000 + (W_SG_MAX - 1) % 24);
	fill_pattern(bodies, total, 3);
	memset(rbuf + 0x10000, 0xee, 0x90000 + W_SG_PIECE_MAX - 0x10000);
	size_t len = sg_frame(out, W_SG_WRITE, p, W_SG_MAX, bodies);
	int fd = dconnect();
	for (size_t at = 0; at < len;) {
		size_t n = len - at < 1500 ? len - at : 1500;
		CHECK(send_all(fd, out + at, n));
		at += n;
		if (at < 20000)
			usleep(500);
	}
	CHECK_EQ(recv_exact(fd, in, W_SG_MAX * 8, 5000, NULL), (ssize_t)(W_SG_MAX * 8));
	size_t off = 0;
	for (unsigned i = 0; i < W_SG_MAX; i++) {
		CHECK(get_le64(in + 8 * i) == W_STATUS_OK);
		unsigned char *at = (unsigned char *)(uintptr_t)p[i].addr;
		if (memcmp(at, bodies + off, p[i].len) != 0) {
			fprintf(stderr, "  piece %u differs\n", i);
			CHECK(false);
			break;
		}
		if (i + 1 < W_SG_MAX - 1)
			CHECK(at[p[i].len] == 0xee); /* nothing past the piece */
		off += p[i].len;
	}
	close(fd);
}

/* A piece outside remote-accessible memory fails alone; the connection goes
 * on. A WRITE's body for it is dropped, a READ answers it with zeros. */
static void test_piece_out_of_range(void)
{
	unsigned char out[512], in[256], bodies[40];
	const piece p[3] = { { (uintptr_t)(rbuf + 0x400), 8 }, { (uintptr_t)lbuf, 16 }, { (uintptr_t)(rbuf + 0x500), 16 } };
	int fd = dconnect();

	cap_start();
	memset(lbuf, 0x11, 16);
	fill_pattern(bodies, sizeof bodies, 4);
	size_t n = sg_frame(out, W_SG_WRITE, p, 3, bodies);
	CHECK(send_all(fd, out, n));
	CHECK_EQ(recv_exact(fd, in, 24, 3000, NULL), 24);
	CHECK(get_le64(in) == W_STATUS_OK);
	CHECK(get_le64(in + 8) == W_STATUS_REJECTED);
	CHECK(get_le64(in + 16) == W_STATUS_OK);
	CHECK(lbuf[0] == 0x11 && lbuf[15] == 0x11);
	CHECK(memcmp(rbuf + 0x400, bodies, 8) == 0 && memcmp(rbuf + 0x500, bodies + 24, 16) == 0);
	CHECK(cap_has("rejected 1 of 3 pieces of a scatter-gather WRITE from 127.0.0.1:"));
	/* READ of the same, then a past-the-end piece and a wrapping one */
	const piece q[4] = { p[0], p[1], { (uintptr_t)(rbuf + RBUF - 4), 8 }, { 0xfffffffffffffff8ull, 16 } };
	n = sg_frame(out, W_SG_READ, q, 4, NULL);
	CHECK(send_all(fd, out, n));
	CHECK_EQ(recv_exact(fd, in, 4 * 8 + 8 + 16 + 8 + 16, 3000, NULL), 4 * 8 + 8 + 16 + 8 + 16);
	static const unsigned char zero[16];
	CHECK(get_le64(in) == W_STATUS_OK && memcmp(in + 8, bodies, 8) == 0);
	CHECK(get_le64(in + 16) == W_STATUS_REJECTED && memcmp(in + 24, zero, 16) == 0);
	CHECK(get_le64(in + 40) == W_STATUS_REJECTED && memcmp(in + 48, zero, 8) == 0);
	CHECK(get_le64(in + 56) == W_STATUS_REJECTED && memcmp(in + 64, zero, 16) == 0);
	/* still served */
	put_hdr(out, 4, (uintptr_t)(rbuf + 0x400), 0x80);
	CHECK(send_all(fd, out, W_HDR));
	CHECK_EQ(recv_exact(fd, in, 12, 3000, NULL), 12);
	CHECK(get_le64(in) == W_STATUS_OK && memcmp(in + 8, bodies, 4) == 0);
	close(fd);
	te_set_log_handler(NULL, NULL);
}

/* `frames` after a 4-byte READ: the READ is answered, then the connection
 * ends, with a line naming why (`line`; the lines are rate-limited, so only
 * the first cases look); nothing at rbuf + 0x8000 is written. */
static void expect_malformed(const unsigned char *frames, size_t len, const char *line)
{
	unsigned char out[2048], in[16];
	int fd = dconnect();
	cap_start();
	memset(rbuf + 0x8000, 0x5a, 64);
	put_hdr(out, 4, (uintptr_t)rbuf, 0x80);
	memcpy(out + W_HDR, frames, len);
	send_all(fd, out, W_HDR + len); /* may meet the close */
	CHECK_EQ(recv_exact(fd, in, 12, 3000, NULL), 12);
	CHECK(get_le64(in) == W_STATUS_OK);
	CHECK(ends_silently(fd, 3000));
	close(fd);
	usleep(20000);
	if (line != NULL)
		CHECK(cap_has(line));
	for (int i = 0; i < 64; i++)
		if (rbuf[0x8000 + i] != 0x5a) {
			CHECK(false);
			break;
		}
	te_set_log_handler(NULL, NULL);
}

static void test_malformed(void)
{
	unsigned char f[1024];
	unsigned char body[64] = { 0 };
	piece p[2] = { { (uintptr_t)(rbuf + 0x8000), 32 }, { (uintptr_t)(rbuf + 0x8020), 32 } };

	put_hdr(f, 0, 0, W_SG_WRITE); /* no pieces */
	expect_malformed(f, W_HDR, "0 pieces (1 to 256)");
	put_hdr(f, 257, 257, W_SG_READ); /* too many */
	expect_malformed(f, W_HDR, "257 pieces (1 to 256)");
	put_hdr(f, 1ull << 40, 2, W_SG_WRITE); /* more bytes than two pieces may hold */
	expect_malformed(f, W_HDR, "bytes in 2 pieces");
	size_t n = sg_frame(f, W_SG_WRITE, p, 2, body); /* the lengths do not add up */
	put_hdr(f, 63, 2, W_SG_WRITE);
	expect_malformed(f, n, "the pieces hold 64 bytes, the header says 63");
	p[1].len = 0; /* a piece of no bytes */
	n = sg_frame(f, W_SG_WRITE, p, 2, body);
	expect_malformed(f, n, "piece 1 of 2 is 0 bytes");
	p[1].len = W_SG_PIECE_MAX + 1; /* larger than a piece may be */
	n = sg_frame(f, W_SG_READ, p, 2, NULL);
	expect_malformed(f, n, NULL);
	p[1].len = 32;
	n = sg_frame(f, W_SG_WRITE, p, 2, body); /* reserved bytes */
	f[23] = 1;
	expect_malformed(f, n, NULL);
	/* other connections, and this target, go on */
	int fd = dconnect();
	n = sg_frame(f, W_SG_READ, p, 2, NULL);
	CHECK(send_all(fd, f, n));
	unsigned char in[80];
	CHECK_EQ(recv_exact(fd, in, 80, 3000, NULL), 80);
	CHECK(get_le64(in) == W_STATUS_OK && get_le64(in + 40) == W_STATUS_OK);
	close(fd);
}

/* A target started with TE_TCP_SG=0 publishes no tcp_sg and takes no such
 * frame (an unknown opcode: the connection ends). */
static void test_target_without_sg(void)
{
	te_option o = { "TE_TCP_SG", "0" };
	te_engine *e = tcp_engine(&o, 1);
	REQUIRE(e != NULL);
	unsigned char *x = map_buf(4096);
	REQUIRE(te_register_memory(e, x, 4096, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
	char *d = rpc_exchange(te_engine_rpc_port(e), 1, "{}");
	CHECK(d != NULL && strstr(d, "tcp_sg") == NULL);
	CHECK_EQ(json_int(d, "tcp_fence"), 1);
	free(d);
	int fd = tcp_connect_port(data_port_of(e));
	REQUIRE(fd >= 0);
	unsigned char f[64];
	piece p = { (uintptr_t)x, 8 };
	size_t n = sg_frame(f, W_SG_READ, &p, 1, NULL);
	cap_start();
	send_all(fd, f, n);
	CHECK(ends_silently(fd, 3000));
	close(fd);
	usleep(20000);
	CHECK(cap_has("opcode 0x90"));
	te_set_log_handler(NULL, NULL);
	te_engine_destroy(e);
	munmap(x, 4096);
}

static void part_a(void)
{
	tgt = wire_target("2000", &rbuf, RBUF, &lbuf, &dport);
	TEST_RUN(test_advertised);
	TEST_RUN(test_write_read_mixed);
	TEST_RUN(test_large_frame_split);
	TEST_RUN(test_piece_out_of_range);
	TEST_RUN(test_malformed);
	TEST_RUN(test_target_without_sg);
	te_engine_destroy(tgt);
}

/* ============================================ part B: libte as the initiator */

#define IBUF (4u << 20)

/* A v2 target; `sg`: its descriptor says tcp_sg. */
static void fake_start(fake *f, bool sg)
{
	fake_tcp_start(f, 2, sg ? ",\"tcp_sg\":1" : NULL);
}

static void check_table(const unsigned char *t, const te_request *r, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		CHECK(get_le64(t + 16 * i) == r[i].remote);
		CHECK(get_le64(t + 16 * i + 8) == r[i].length);
	}
}

/* Submits three WRITEs of 16, 7 and `last` bytes from in's buffer (its
 * pieces apart) to spread-out places of the fake target, put in w; returns
 * the data connection they come on. */
static int three_writes(init *in, const fake *f, te_request w[3], uint64_t last)
{
	w[0] = (te_request){ TE_OP_WRITE, in->seg, in->buf, FAKE_BASE + 0x100, 16 };
	w[1] = (te_request){ TE_OP_WRITE, in->seg, in->buf + 1024, FAKE_BASE + 0x900, 7 };
	w[2] = (te_request){ TE_OP_WRITE, in->seg, in->buf + 2048, FAKE_BASE + 0x40, last };
	return init_submit_accept(in, f, w, 3);
}

/* Three small WRITEs and three small READs to a target that takes
 * scatter-gather frames: one frame each, answered piece by piece; the
 * middle piece rejected fails alone. */
static void test_initiator_sg(void)
{
	fake f;
	init in;
	fake_start(&f, true);
	init_up(&in, &f, IBUF, NULL, 0);
	unsigned char h[W_HDR + 3 * 16], body[200];
	uint64_t ok = htole64(W_STATUS_OK), rej = htole64(W_STATUS_REJECTED);

	fill_pattern(in.buf, 4096, 20);
	te_request w[3];
	int fd = three_writes(&in, &f, w, 100);
	CHECK_EQ(recv_exact(fd, h, sizeof h, 3000, NULL), (ssize_t)sizeof h);
	check_hdr(h, 123, 3, W_SG_WRITE);
	check_table(h + W_HDR, w, 3);
	CHECK_EQ(recv_exact(fd, body, 123, 3000, NULL), 123);
	CHECK(memcmp(body, in.buf, 16) == 0 && memcmp(body + 16, in.buf + 1024, 7) == 0 &&
	      memcmp(body + 23, in.buf + 2048, 100) == 0);
	CHECK(silent_for(fd, 100));
	CHECK(send_all(fd, &ok, 8) && send_all(fd, &rej, 8) && send_all(fd, &ok, 8));
	CHECK_EQ(te_batch_wait(in.e, in.b, 10000), 0);
	int err = 0;
	CHECK_EQ(init_task_state(&in, 0, NULL), TE_TASK_COMPLETED);
	CHECK_EQ(init_task_state(&in, 1, &err), TE_TASK_FAILED);
	CHECK_EQ(err, TE_ERR_REJECTED);
	CHECK_EQ(init_task_state(&in, 2, NULL), TE_TASK_COMPLETED);
	CHECK_EQ(te_batch_free(in.e, in.b), 0);

	/* READs on the same connection: status and bytes per piece, zeros for
	 * the rejected one */
	te_request r[3] = { { TE_OP_READ, in.seg, in.buf + 8192, FAKE_BASE + 0x2000, 10 },
			    { TE_OP_READ, in.seg, in.buf + 9000, FAKE_BASE + 0x3000, 20 },
			    { TE_OP_READ, in.seg, in.buf + 10000, FAKE_BASE + 0x4000, 30 } };
	memset(in.buf + 8192, 0x77, 4096);
	init_submit(&in, r, 3);
	CHECK_EQ(recv_exact(fd, h, sizeof h, 3000, NULL), (ssize_t)sizeof h);
	check_hdr(h, 60, 3, W_SG_READ);
	check_table(h + W_HDR, r, 3);
	CHECK(silent_for(fd, 100));
	fill_pattern(body, 60, 21);
	static const unsigned char zero[20];
	CHECK(send_all(fd, &ok, 8) && send_all(fd, body, 10));
	CHECK(send_all(fd, &rej, 8) && send_all(fd, zero, 20));
	CHECK(send_all(fd, &ok, 8) && send_all(fd, body + 30, 30));
	CHECK_EQ(te_batch_wait(in.e, in.b, 10000), 0);
	CHECK_EQ(init_task_state(&in, 0, NULL), TE_TASK_COMPLETED);
	CHECK_EQ(init_task_state(&in, 1, &err), TE_TASK_FAILED);
	CHECK_EQ(err, TE_ERR_REJECTED);
	CHECK_EQ(init_task_state(&in, 2, NULL), TE_TASK_COMPLETED);
	CHECK_EQ(te_batch_free(in.e, in.b), 0);
	CHECK(memcmp(in.buf + 8192, body, 10) == 0);
	CHECK(memcmp(in.buf + 10000, body + 30, 30) == 0);

	/* Mixed: two small WRITEs in a frame, one of 100 KiB in the usual
	 * frame, then the last small one alone in the usual frame too. */
	te_request m[4] = { { TE_OP_WRITE, in.seg, in.buf, FAKE_BASE, 8 },
			    { TE_OP_WRITE, in.seg, in.buf + 64, FAKE_BASE + 64, 8 },
			    { TE_OP_WRITE, in.seg, in.buf + 65536, FAKE_BASE + 65536, 100 << 10 },
			    { TE_OP_WRITE, in.seg, in.buf + 4096, FAKE_BASE + 4096, 12 } };
	init_submit(&in, m, 4);
	unsigned char h2[W_HDR + 2 * 16];
	static unsigned char big[100 << 10];
	CHECK_EQ(recv_exact(fd, h2, sizeof h2, 3000, NULL), (ssize_t)sizeof h2);
	check_hdr(h2, 16, 2, W_SG_WRITE);
	check_table(h2 + W_HDR, m, 2);
	CHECK_EQ(recv_exact(fd, body, 16, 3000, NULL), 16);
	CHECK_EQ(recv_exact(fd, h, W_HDR, 3000, NULL), W_HDR);
	check_hdr(h, 100 << 10, FAKE_BASE + 65536, 0x81);
	CHECK_EQ(recv_exact(fd, big, sizeof big, 3000, NULL), (ssize_t)sizeof big);
	CHECK(memcmp(big, in.buf + 65536, sizeof big) == 0);
	CHECK_EQ(recv_exact(fd, h, W_HDR, 3000, NULL), W_HDR);
	check_hdr(h, 12, FAKE_BASE + 4096, 0x81);
	CHECK_EQ(recv_exact(fd, body, 12, 3000, NULL), 12);
	for (int i = 0; i < 4; i++)
		CHECK(send_all(fd, &ok, 8));
	CHECK_EQ(te_batch_wait(in.e, in.b, 10000), 0);
	for (int i = 0; i < 4; i++)
		CHECK_EQ(init_task_state(&in, (size_t)i, NULL), TE_TASK_COMPLETED);
	CHECK_EQ(te_batch_free(in.e, in.b), 0);
	close(fd);
	init_down(&in);
	fake_stop(&f);
}

/* A target whose descriptor lacks tcp_sg (Mooncake, an older libte) gets
 * one usual frame per piece. */
static void test_initiator_without_sg(void)
{
	fake f;
	init in;
	fake_start(&f, false);
	init_up(&in, &f, IBUF, NULL, 0);
	unsigned char h[W_HDR], body[16];
	uint64_t ok = htole64(W_STATUS_OK);
	te_request w[3];
	int fd = three_writes(&in, &f, w, 10);
	for (int i = 0; i < 3; i++) {
		CHECK_EQ(recv_exact(fd, h, W_HDR, 3000, NULL), W_HDR);
		check_hdr(h, w[i].length, w[i].remote, 0x81);
		CHECK_EQ(recv_exact(fd, body, w[i].length, 3000, NULL), (ssize_t)w[i].length);
	}
	for (int i = 0; i < 3; i++)
		CHECK(send_all(fd, &ok, 8));
	CHECK_EQ(te_batch_wait(in.e, in.b, 10000), 0);
	CHECK_EQ(te_batch_free(in.e, in.b), 0);
	close(fd);
	init_down(&in);
	fake_stop(&f);
}

/* Runs the n requests as one batch of p->a and checks that each completed
 * with its two ends alike (the first piece that differs is named). */
static void run_alike(pair *p, const te_request *r, int n, const char *what)
{
	te_batch_id b;
	REQUIRE(te_batch_alloc(p->a, (size_t)n, &b) == 0);
	CHECK_EQ(te_submit(p->a, b, r, (size_t)n), 0);
	CHECK_EQ(te_batch_wait(p->a, b, 10000), 0);
	for (int i = 0; i < n; i++) {
		te_task_status st;
		CHECK_EQ(te_get_status(p->a, b, (size_t)i, &st), 0);
		CHECK_EQ(st.state, TE_TASK_COMPLETED);
		if (memcmp(r[i].local, (const void *)(uintptr_t)r[i].remote, r[i].length) != 0) {
			fprintf(stderr, "  %s piece %d differs\n", what, i);
			CHECK(false);
			break;
		}
	}
	te_batch_free(p->a, b);
}

/* Both sides libte: scattered small pieces, WRITE then READ. */
static void test_libte_both_sides(void)
{
	pair p;
	pair_open(&p, 1u << 20, NULL, 0, 1u << 20, NULL, 0);
	enum { N = 600 };
	static te_request r[N];
	fill_pattern(p.abuf, 1u << 20, 30);
	memset(p.bbuf, 0, 1u << 20);
	for (int i = 0; i < N; i++)
		r[i] = (te_request){ TE_OP_WRITE, p.seg, p.abuf + i * 1024, (uintptr_t)(p.bbuf + i * 1024 + 8),
				     500 + i % 7 };
	run_alike(&p, r, N, "WRITE");
	for (int i = 0; i < N; i++) {
		r[i].opcode = TE_OP_READ;
		r[i].local = p.abuf + (512u << 10) + i * 512;
		r[i].length = 300 + i % 5;
	}
	run_alike(&p, r, N, "READ");
	pair_down(&p);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	part_a();
	TEST_RUN(test_initiator_sg);
	TEST_RUN(test_initiator_without_sg);
	TEST_RUN(test_libte_both_sides);
	return check_done();
}
