/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The TCP data protocol byte by byte (docs/wire.md, "TCP data protocol"),
 * from both sides: a client written by hand against a libte target, and a
 * fake target written by hand that checks what a libte initiator sends and
 * answers it, rightly and wrongly.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/ioctl.h>

#include "tcp-test.h"

/* =============================================== part A: libte as the target */

#define RBUF (1u << 20)

static te_engine *tgt;
static unsigned char *rbuf; /* remote-accessible */
static unsigned char *lbuf; /* registered, local only */
static int dport;

static int dconnect(void)
{
	int fd = tcp_connect_port(dport);
	REQUIRE(fd >= 0);
	return fd;
}

static void send_hdr(int fd, uint64_t size, uint64_t addr, uint8_t op)
{
	unsigned char h[W_HDR];
	put_hdr(h, size, addr, op);
	CHECK(send_all(fd, h, sizeof h));
}

static uint64_t recv_status(int fd)
{
	unsigned char s[8];
	if (recv_exact(fd, s, 8, 3000, NULL) != 8)
		return 0;
	return get_le64(s);
}

static void test_status_bytes(void)
{
	int fd = dconnect();
	unsigned char s[8], data[100];
	fill_pattern(rbuf, RBUF, 1);
	send_hdr(fd, 100, (uintptr_t)(rbuf + 5), 0x80);
	CHECK_EQ(recv_exact(fd, s, 8, 3000, NULL), 8);
	/* u64 LE: low 32 bits the status (0), high 32 bits "MCTV" 0x4D435456 */
	static const unsigned char ok[8] = { 0, 0, 0, 0, 0x56, 0x54, 0x43, 0x4d };
	CHECK(memcmp(s, ok, 8) == 0);
	CHECK_EQ(recv_exact(fd, data, 100, 3000, NULL), 100);
	CHECK(memcmp(data, rbuf + 5, 100) == 0);
	CHECK(silent_for(fd, 100)); /* nothing more */
	close(fd);
}

static void test_write_acked_after_body(void)
{
	int fd = dconnect();
	unsigned char body[50];
	fill_pattern(body, sizeof body, 2);
	send_hdr(fd, 50, (uintptr_t)(rbuf + 1000), 0x81);
	CHECK(send_all(fd, body, 25));
	CHECK(silent_for(fd, 200)); /* no status before the last byte */
	CHECK(send_all(fd, body + 25, 25));
	CHECK_EQ(recv_status(fd), W_STATUS_OK);
	CHECK(memcmp(rbuf + 1000, body, 50) == 0);
	close(fd);
}

static void test_pipelined_in_order(void)
{
	int fd = dconnect();
	unsigned char out[3 * W_HDR + 5], in[8 + 10 + 8 + 8 + 7];
	const unsigned char w[5] = { 9, 8, 7, 6, 5 };
	put_hdr(out, 10, (uintptr_t)(rbuf + 100), 0x80);
	put_hdr(out + W_HDR, 5, (uintptr_t)(rbuf + 200), 0x81);
	memcpy(out + 2 * W_HDR, w, 5);
	put_hdr(out + 2 * W_HDR + 5, 7, (uintptr_t)(rbuf + 200), 0x80);
	CHECK(send_all(fd, out, sizeof out)); /* all three in one segment */
	CHECK_EQ(recv_exact(fd, in, sizeof in, 3000, NULL), (ssize_t)sizeof in);
	CHECK(get_le64(in) == W_STATUS_OK);
	CHECK(memcmp(in + 8, rbuf + 100, 10) == 0);
	CHECK(get_le64(in + 18) == W_STATUS_OK);
	CHECK(get_le64(in + 26) == W_STATUS_OK);
	CHECK(memcmp(in + 34, w, 5) == 0); /* the READ ran after the WRITE */
	close(fd);
}

static void test_v1_client(void)
{
	int fd = dconnect();
	unsigned char data[64], w[16];
	fill_pattern(rbuf, RBUF, 3);
	send_hdr(fd, 64, (uintptr_t)(rbuf + 300), 0x00);
	CHECK_EQ(recv_exact(fd, data, 64, 3000, NULL), 64); /* data only: no status frame */
	CHECK(memcmp(data, rbuf + 300, 64) == 0);
	fill_pattern(w, sizeof w, 4);
	send_hdr(fd, 16, (uintptr_t)(rbuf + 400), 0x01);
	CHECK(send_all(fd, w, 16));
	CHECK(silent_for(fd, 150)); /* v1 WRITE: no reply at all */
	send_hdr(fd, 16, (uintptr_t)(rbuf + 400), 0x00);
	CHECK_EQ(recv_exact(fd, data, 16, 3000, NULL), 16);
	CHECK(memcmp(data, w, 16) == 0);
	close(fd);
}

static void test_padding_ignored(void)
{
	int fd = dconnect();
	unsigned char h[W_HDR], data[8];
	put_hdr(h, 8, (uintptr_t)(rbuf + 40), 0x80);
	memset(h + 17, 0xff, 7);
	CHECK(send_all(fd, h, sizeof h));
	CHECK_EQ(recv_status(fd), W_STATUS_OK);
	CHECK_EQ(recv_exact(fd, data, 8, 3000, NULL), 8);
	CHECK(memcmp(data, rbuf + 40, 8) == 0);
	close(fd);
}

/* A v2 request the target must refuse: status 1, then the connection ends. */
static void expect_reject(uint64_t size, uint64_t addr, uint8_t op, const char *what)
{
	int fd = dconnect();
	send_hdr(fd, size, addr, op);
	uint64_t st = recv_status(fd);
	if (st != W_STATUS_REJECTED)
		fprintf(stderr, "  %s: status 0x%016llx\n", what, (unsigned long long)st);
	CHECK(st == W_STATUS_REJECTED);
	CHECK(closed_quietly(fd, 3000));
	close(fd);
}

static void test_rejects(void)
{
	cap_start();
	expect_reject(10, (uintptr_t)lbuf, 0x80, "not remote-accessible");
	CHECK(cap_has("rejected READ 0x"));
	/* A WRITE there too, with its payload sent: refused, the memory untouched. */
	{
		int fd = dconnect();
		unsigned char h[W_HDR], junk[10];
		memset(lbuf, 0x11, 10);
		memset(junk, 0xee, sizeof junk);
		put_hdr(h, sizeof junk, (uintptr_t)lbuf, 0x81);
		CHECK(send_all(fd, h, sizeof h));
		send_all(fd, junk, sizeof junk); /* may meet the close */
		CHECK(recv_status(fd) == W_STATUS_REJECTED);
		CHECK(closed_quietly(fd, 3000));
		close(fd);
		CHECK(lbuf[0] == 0x11 && lbuf[9] == 0x11);
		CHECK(cap_has("rejected WRITE 0x"));
	}
	CHECK(cap_has("from 127.0.0.1:")); /* the peer's address is in the log */
	expect_reject(10, (uintptr_t)(rbuf + RBUF - 5), 0x81, "past the end");
	expect_reject(0, (uintptr_t)rbuf, 0x80, "zero length");
	CHECK(cap_has("zero length"));
	expect_reject(0x20, 0xfffffffffffffff0ull, 0x80, "wraps");
	expect_reject(1ull << 60, (uintptr_t)rbuf, 0x80, "huge size");
	expect_reject(RBUF + 1, (uintptr_t)rbuf, 0x81, "one byte too many");
	expect_reject(10, 0x1000, 0x80, "unregistered");

	/* v1: no status, the connection just ends */
	int fd = dconnect();
	send_hdr(fd, 10, (uintptr_t)lbuf, 0x00);
	CHECK(closed_quietly(fd, 3000));
	close(fd);
	/* an opcode that is neither READ nor WRITE */
	fd = dconnect();
	send_hdr(fd, 10, (uintptr_t)rbuf, 0x85);
	CHECK(closed_quietly(fd, 3000));
	CHECK(cap_has("opcode 0x85"));
	close(fd);
	/* the earlier, good requests on a connection are answered before it ends */
	fd = dconnect();
	unsigned char two[2 * W_HDR], in[8 + 4];
	put_hdr(two, 4, (uintptr_t)rbuf, 0x80);
	put_hdr(two + W_HDR, 4, (uintptr_t)lbuf, 0x80);
	CHECK(send_all(fd, two, sizeof two));
	CHECK_EQ(recv_exact(fd, in, sizeof in, 3000, NULL), (ssize_t)sizeof in);
	CHECK(get_le64(in) == W_STATUS_OK);
	CHECK_EQ(recv_status(fd), W_STATUS_REJECTED);
	CHECK(closed_quietly(fd, 3000));
	close(fd);
	te_set_log_handler(NULL, NULL);
}

static void test_truncated_and_garbage(void)
{
	cap_start();
	int fd = dconnect();
	unsigned char ten[10] = { 0 };
	send_hdr(fd, 1000, (uintptr_t)(rbuf + 64), 0x81);
	CHECK(send_all(fd, ten, sizeof ten));
	close(fd);
	/* garbage that happens to be 24 bytes: a bad header */
	fd = dconnect();
	const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
	CHECK(send_all(fd, junk, sizeof junk - 1));
	unsigned char c;
	size_t got = 0;
	CHECK(recv_exact(fd, &c, 1, 3000, &got) <= 0); /* closed, maybe after a status */
	close(fd);
	usleep(100000);
	CHECK(cap_has("10 bytes into a 1000-byte WRITE"));
	te_set_log_handler(NULL, NULL);
	/* the target is still serving */
	fd = dconnect();
	unsigned char data[4];
	send_hdr(fd, 4, (uintptr_t)rbuf, 0x80);
	CHECK_EQ(recv_status(fd), W_STATUS_OK);
	CHECK_EQ(recv_exact(fd, data, 4, 3000, NULL), 4);
	close(fd);
}

/* ------------------------------------------------------- HELLO and FENCE */

#define W_HELLO 0x82
#define W_FENCE 0x83

/* A HELLO or FENCE frame: lane, generation, opcode, 7 zero bytes. */
static void send_frame(int fd, uint64_t lane, uint64_t gen, uint8_t op)
{
	unsigned char f[W_HDR];
	put_hdr(f, lane, gen, op);
	CHECK(send_all(fd, f, sizeof f));
}

/* A connection opened with a HELLO. */
static int hello_connect(uint64_t lane, uint64_t gen)
{
	int fd = dconnect();
	send_frame(fd, lane, gen, W_HELLO);
	return fd;
}

/* A WRITE of `n` bytes of pattern `seed` at `at` on `fd`: true when it was
 * acknowledged and the bytes are there. */
static bool write_ok(int fd, unsigned char *at, size_t n, unsigned seed)
{
	unsigned char body[256];
	REQUIRE(n <= sizeof body);
	fill_pattern(body, n, seed);
	send_hdr(fd, n, (uintptr_t)at, 0x81);
	CHECK(send_all(fd, body, n));
	return recv_status(fd) == W_STATUS_OK && memcmp(at, body, n) == 0;
}

/* A WRITE on a fenced connection: never applied, the connection ends. */
static void write_refused(int fd, unsigned char *at, size_t n)
{
	unsigned char h[W_HDR], body[256];
	REQUIRE(n <= sizeof body);
	memset(at, 0x5a, n);
	memset(body, 0xa5, n);
	put_hdr(h, n, (uintptr_t)at, 0x81);
	send_all(fd, h, sizeof h); /* may meet the close */
	send_all(fd, body, n);
	CHECK(ends_silently(fd, 3000));
	usleep(20000);
	for (size_t i = 0; i < n; i++)
		if (at[i] != 0x5a) {
			fprintf(stderr, "  byte %zu written by a fenced connection\n", i);
			CHECK(false);
			break;
		}
}

/* Lane `lane` fenced up to generation `gen`: a connection of that generation
 * is refused at its HELLO (its WRITE at `refused_at` never applied), one of
 * the next is served (a WRITE at `ok_at`, pattern `seed`); returns that one. */
static int fenced_up_to(uint64_t lane, uint64_t gen, unsigned char *refused_at, unsigned char *ok_at,
			unsigned seed)
{
	int fd = hello_connect(lane, gen);
	write_refused(fd, refused_at, 16);
	close(fd);
	fd = hello_connect(lane, gen + 1);
	bool ok = write_ok(fd, ok_at, 16, seed);
	if (!ok)
		fprintf(stderr, "  lane %#llx generation %llu not served\n", (unsigned long long)lane,
			(unsigned long long)gen + 1);
	CHECK(ok);
	return fd;
}

/* The frames byte by byte: HELLO unanswered, FENCE answered with status OK
 * once the connections it names can write nothing more; a connection of a
 * fenced lane and generation is refused at its HELLO, a later generation is
 * served. */
static void test_fence_frames(void)
{
	const uint64_t la = 0x1122334455667788ull, lb = 0x0102030405060708ull, lc = 0x00ff00ff00ff00ffull;
	char *d = rpc_exchange(te_engine_rpc_port(tgt), 1, "{}");
	CHECK_EQ(json_int(d, "tcp_fence"), 1); /* advertised: peers may send the frames */
	free(d);

	int a = hello_connect(la, 5);
	CHECK(silent_for(a, 100)); /* no reply to a HELLO */
	CHECK(write_ok(a, rbuf + 0x1000, 16, 60)); /* served as usual */
	int b = hello_connect(lb, 1);
	send_frame(b, la, 5, W_FENCE);
	unsigned char s[8];
	static const unsigned char ok[8] = { 0, 0, 0, 0, 0x56, 0x54, 0x43, 0x4d };
	CHECK_EQ(recv_exact(b, s, 8, 3000, NULL), 8);
	CHECK(memcmp(s, ok, 8) == 0);
	CHECK(silent_for(b, 100)); /* the status and nothing else */
	write_refused(a, rbuf + 0x2000, 16); /* fenced: writes nothing more */
	close(a);
	CHECK(write_ok(b, rbuf + 0x3000, 16, 61)); /* the fencing connection goes on */

	/* The same lane and generation again (a connection that was still in
	 * the accept queue): refused at its HELLO; a later generation is not. */
	a = fenced_up_to(la, 5, rbuf + 0x4000, rbuf + 0x5000, 62);

	/* A FENCE of a lane never seen: remembered for its connections to come. */
	send_frame(b, lc, 9, W_FENCE);
	CHECK_EQ(recv_status(b), W_STATUS_OK);
	int c = fenced_up_to(lc, 9, rbuf + 0x6000, rbuf + 0x6000, 63);
	/* A FENCE of an earlier generation of its own lane leaves it alone. */
	send_frame(a, la, 5, W_FENCE);
	CHECK_EQ(recv_status(a), W_STATUS_OK);
	CHECK(write_ok(a, rbuf + 0x7000, 16, 64));
	/* Pipelined behind READs and WRITEs, answered in order. */
	unsigned char out[3 * W_HDR + 4], in[8 + 4 + 8 + 8];
	put_hdr(out, 4, (uintptr_t)rbuf, 0x80);
	put_hdr(out + W_HDR, lc, 10, W_FENCE);
	put_hdr(out + 2 * W_HDR, 4, (uintptr_t)(rbuf + 0x8000), 0x81);
	memcpy(out + 3 * W_HDR, "abcd", 4);
	CHECK(send_all(b, out, sizeof out));
	CHECK_EQ(recv_exact(b, in, sizeof in, 3000, NULL), (ssize_t)sizeof in);
	CHECK(get_le64(in) == W_STATUS_OK && memcmp(in + 8, rbuf, 4) == 0);
	CHECK(get_le64(in + 12) == W_STATUS_OK && get_le64(in + 20) == W_STATUS_OK);
	CHECK(memcmp(rbuf + 0x8000, "abcd", 4) == 0);
	CHECK(ends_silently(c, 3000)); /* lane lc up to #10: c is fenced, and closed */
	close(c);
	close(a);
	close(b);
}

/* A frame the target cannot take: that connection ends (after the replies
 * before it), with a line naming the peer and why (`line`; the lines are
 * rate-limited, so only the first cases look); the rest go on. */
static void expect_frame_refused(const unsigned char *frames, size_t len, size_t replies, const char *line)
{
	int fd = dconnect();
	unsigned char in[64];
	cap_start();
	CHECK(send_all(fd, frames, len));
	if (replies > 0)
		CHECK_EQ(recv_exact(fd, in, replies, 3000, NULL), (ssize_t)replies);
	CHECK(ends_silently(fd, 3000));
	close(fd);
	usleep(20000);
	if (line != NULL)
		CHECK(cap_has(line));
	te_set_log_handler(NULL, NULL);
}

static void test_fence_rejects(void)
{
	unsigned char f[3 * W_HDR];
	const uint64_t lane = 0x7766554433221100ull;

	put_hdr(f, lane, 1, W_FENCE); /* no HELLO first */
	expect_frame_refused(f, W_HDR, 0, "malformed FENCE from 127.0.0.1:");
	put_hdr(f, 4, (uintptr_t)rbuf, 0x80); /* a HELLO that is not the first frame */
	put_hdr(f + W_HDR, lane, 1, W_HELLO);
	expect_frame_refused(f, 2 * W_HDR, 8 + 4, "malformed HELLO from 127.0.0.1:");
	put_hdr(f, lane, 1, W_HELLO); /* twice */
	put_hdr(f + W_HDR, lane, 1, W_HELLO);
	expect_frame_refused(f, 2 * W_HDR, 0, NULL);
	put_hdr(f, 0, 1, W_HELLO); /* lane 0 */
	expect_frame_refused(f, W_HDR, 0, NULL);
	put_hdr(f, lane, 0, W_HELLO); /* generation 0 */
	expect_frame_refused(f, W_HDR, 0, NULL);
	put_hdr(f, lane, 1, W_HELLO); /* reserved bytes */
	f[23] = 1;
	expect_frame_refused(f, W_HDR, 0, NULL);
	put_hdr(f, lane, 2, W_HELLO);
	put_hdr(f + W_HDR, lane + 1, 1, W_FENCE);
	f[2 * W_HDR - 7] = 0x80;
	expect_frame_refused(f, 2 * W_HDR, 0, NULL);
	put_hdr(f + W_HDR, 0, 1, W_FENCE);
	expect_frame_refused(f, 2 * W_HDR, 0, NULL);
	put_hdr(f + W_HDR, lane + 1, 0, W_FENCE);
	expect_frame_refused(f, 2 * W_HDR, 0, NULL);
	put_hdr(f + W_HDR, lane, 2, W_FENCE); /* its own connection */
	expect_frame_refused(f, 2 * W_HDR, 0, NULL);
	put_hdr(f + W_HDR, lane, 3, W_FENCE); /* a later one of its lane */
	expect_frame_refused(f, 2 * W_HDR, 0, NULL);
	put_hdr(f, lane, 1, 0x02); /* without the v2 bit: no such opcode */
	expect_frame_refused(f, W_HDR, 0, NULL);
	put_hdr(f, lane, 4, W_HELLO); /* READ answered, then the bad FENCE ends it */
	put_hdr(f + W_HDR, 4, (uintptr_t)rbuf, 0x80);
	put_hdr(f + 2 * W_HDR, lane + 1, 0, W_FENCE);
	expect_frame_refused(f, 3 * W_HDR, 8 + 4, NULL);
	/* and the target still serves */
	int fd = hello_connect(lane, 5);
	CHECK(write_ok(fd, rbuf + 0x9000, 16, 65));
	close(fd);
}

typedef struct unreg_job {
	void *addr;
	long long took;
	int rc;
} unreg_job;

static void *unregister_thread(void *arg)
{
	unreg_job *j = arg;
	long long t0 = now_ms();
	j->rc = te_unregister_memory(tgt, j->addr);
	j->took = now_ms() - t0;
	return NULL;
}

/* TE_TCP_TIMEOUT_MS is 600 on this target. */
static void test_stalls(void)
{
	/* A partial header: the connection is closed after the timeout. */
	int fd = dconnect();
	unsigned char h[W_HDR];
	put_hdr(h, 4, (uintptr_t)rbuf, 0x80);
	CHECK(send_all(fd, h, 10));
	long long t0 = now_ms();
	CHECK(closed_quietly(fd, 5000));
	long long dt = now_ms() - t0;
	CHECK(dt >= 500 && dt < 600 + 3000);
	close(fd);

	/* A WRITE stalled mid-body pins its buffer: unregistering waits for the
	 * timeout to close the connection, then goes through. */
	unsigned char *x = map_buf(65536);
	REQUIRE(te_register_memory(tgt, x, 65536, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
	fd = dconnect();
	send_hdr(fd, 1000, (uintptr_t)x, 0x81);
	/* From another buffer: the target is writing these bytes into x. */
	static const unsigned char body[100];
	CHECK(send_all(fd, body, sizeof body));
	usleep(50000); /* the target is now inside the body */
	unreg_job j = { x, 0, -1 };
	pthread_t th;
	REQUIRE(pthread_create(&th, NULL, unregister_thread, &j) == 0);
	pthread_join(th, NULL);
	CHECK_EQ(j.rc, 0);
	CHECK(j.took >= 300 && j.took < 600 + 3000);
	CHECK(closed_quietly(fd, 1000));
	close(fd);
	/* and it is gone: a request there is rejected now */
	expect_reject(8, (uintptr_t)x, 0x80, "unregistered meanwhile");
	munmap(x, 65536);
}

static void part_a(void)
{
	tgt = wire_target("600", &rbuf, RBUF, &lbuf, &dport);
	TEST_RUN(test_status_bytes);
	TEST_RUN(test_write_acked_after_body);
	TEST_RUN(test_pipelined_in_order);
	TEST_RUN(test_v1_client);
	TEST_RUN(test_padding_ignored);
	TEST_RUN(test_rejects);
	TEST_RUN(test_truncated_and_garbage);
	TEST_RUN(test_fence_frames);
	TEST_RUN(test_fence_rejects);
	TEST_RUN(test_stalls);
	te_engine_destroy(tgt);
}

/* ============================================ part B: libte as the initiator */

static void fake_start(fake *f, int version)
{
	fake_tcp_start(f, version, NULL);
}

#define IBUF (64u << 20)

static void finish(init *in)
{
	CHECK_EQ(te_batch_wait(in->e, in->b, 10000), 0);
	CHECK_EQ(te_batch_free(in->e, in->b), 0);
}

/* A fake target speaking protocol version `version` (1: none in its
 * descriptor) and an initiator with the options `o` against it. */
static void wire_up(fake *f, init *in, int version, const te_option *o, size_t n)
{
	fake_start(f, version);
	init_up(in, f, IBUF, o, n);
}

static void wire_down(fake *f, init *in)
{
	init_down(in);
	fake_stop(f);
}

static void test_initiator_v2(void)
{
	fake f;
	init in;
	wire_up(&f, &in, 2, NULL, 0);
	unsigned char h[W_HDR], data[100];

	/* READ: header checked byte by byte, status then data back */
	te_request r = { TE_OP_READ, in.seg, in.buf + 1, FAKE_BASE + 0x10, 100 };
	int fd = init_submit_accept(&in, &f, &r, 1);
	CHECK_EQ(recv_exact(fd, h, W_HDR, 3000, NULL), W_HDR);
	check_hdr(h, 100, FAKE_BASE + 0x10, 0x80);
	uint64_t ok = htole64(W_STATUS_OK);
	fill_pattern(data, sizeof data, 11);
	CHECK(send_all(fd, &ok, 8) && send_all(fd, data, 100));
	finish(&in);
	CHECK(memcmp(in.buf + 1, data, 100) == 0);

	/* WRITE: header and body arrive; COMPLETED only after our status */
	fill_pattern(in.buf + 200, 64, 12);
	te_request w = { TE_OP_WRITE, in.seg, in.buf + 200, FAKE_BASE + 0x100, 64 };
	init_submit(&in, &w, 1);
	CHECK_EQ(recv_exact(fd, h, W_HDR, 3000, NULL), W_HDR); /* same, persistent connection */
	check_hdr(h, 64, FAKE_BASE + 0x100, 0x81);
	CHECK_EQ(recv_exact(fd, data, 64, 3000, NULL), 64);
	CHECK(memcmp(data, in.buf + 200, 64) == 0);
	usleep(200000);
	CHECK_EQ(init_task_state(&in, 0, NULL), TE_TASK_WAITING);
	CHECK(send_all(fd, &ok, 8));
	finish(&in);

	/* junk while idle: the initiator drops the connection, the next request
	 * comes on a new one */
	CHECK(send_all(fd, "xyz", 3));
	CHECK(closed_quietly(fd, 3000));
	close(fd);
	fd = init_submit_accept(&in, &f, &r, 1);
	CHECK_EQ(recv_exact(fd, h, W_HDR, 3000, NULL), W_HDR);
	CHECK(send_all(fd, &ok, 8) && send_all(fd, data, 100));
	finish(&in);
	close(fd);
	wire_down(&f, &in);
}

/* Requests are pipelined and large ones split into slices. */
static void test_initiator_pipelined_slices(void)
{
	fake f;
	init in;
	te_option o = { "TE_TCP_SLICE_SIZE", "65536" };
	wire_up(&f, &in, 2, &o, 1);
	te_request r[2] = { { TE_OP_READ, in.seg, in.buf, FAKE_BASE, 3 * 65536 },
			    { TE_OP_READ, in.seg, in.buf + (1u << 20), FAKE_BASE + (4u << 20), 10 } };
	int fd = init_submit_accept(&in, &f, r, 2);
	unsigned char h[4 * W_HDR];
	/* all four headers arrive before we answer anything */
	CHECK_EQ(recv_exact(fd, h, sizeof h, 3000, NULL), (ssize_t)sizeof h);
	for (int i = 0; i < 3; i++)
		check_hdr(h + i * W_HDR, 65536, FAKE_BASE + (uint64_t)i * 65536, 0x80);
	check_hdr(h + 3 * W_HDR, 10, FAKE_BASE + (4u << 20), 0x80);
	unsigned char *data = malloc(3 * 65536 + 10);
	REQUIRE(data != NULL);
	fill_pattern(data, 3 * 65536 + 10, 13);
	uint64_t ok = htole64(W_STATUS_OK);
	for (int i = 0; i < 3; i++)
		CHECK(send_all(fd, &ok, 8) && send_all(fd, data + i * 65536, 65536));
	CHECK(send_all(fd, &ok, 8) && send_all(fd, data + 3 * 65536, 10));
	finish(&in);
	CHECK(memcmp(in.buf, data, 3 * 65536) == 0);
	CHECK(memcmp(in.buf + (1u << 20), data + 3 * 65536, 10) == 0);
	free(data);
	close(fd);
	wire_down(&f, &in);
}

/* Answers the oldest READ asked for: its status, then `len` bytes of
 * pattern `seed`. */
static void answer_read(int fd, size_t len, unsigned seed)
{
	unsigned char *data = malloc(len);
	uint64_t ok = htole64(W_STATUS_OK);
	REQUIRE(data != NULL);
	fill_pattern(data, len, seed);
	CHECK(send_all(fd, &ok, 8) && send_all(fd, data, len));
	free(data);
}

/* Six 64 KiB READs on a connection with window `window`: exactly two on the
 * wire until a reply comes, then one more for each reply. */
static void window_case(fake *f, const char *window, unsigned seed)
{
	init in;
	unsigned char h[W_HDR];
	te_option o[2] = { { "TE_TCP_SLICE_SIZE", "65536" }, { "TE_TCP_WINDOW", window } };

	init_up(&in, f, IBUF, o, 2);
	te_request r = { TE_OP_READ, in.seg, in.buf, FAKE_BASE, 6 * 65536 };
	int fd = init_submit_accept(&in, f, &r, 1);
	for (int i = 0; i < 2; i++) {
		CHECK_EQ(recv_exact(fd, h, W_HDR, 3000, NULL), W_HDR);
		check_hdr(h, 65536, FAKE_BASE + (uint64_t)i * 65536, 0x80);
	}
	CHECK(silent_for(fd, 300));
	for (int i = 0; i < 6; i++) {
		answer_read(fd, 65536, seed + (unsigned)i);
		if (i + 2 < 6) { /* the reply made room for exactly one more */
			CHECK_EQ(recv_exact(fd, h, W_HDR, 3000, NULL), W_HDR);
			check_hdr(h, 65536, FAKE_BASE + (uint64_t)(i + 2) * 65536, 0x80);
			CHECK(silent_for(fd, 100));
		}
	}
	finish(&in);
	for (int i = 0; i < 6; i++) {
		unsigned char want[65536];
		fill_pattern(want, sizeof want, seed + (unsigned)i);
		CHECK(memcmp(in.buf + (size_t)i * 65536, want, sizeof want) == 0);
	}
	close(fd);
	init_down(&in);
}

/* A connection keeps at most TE_TCP_WINDOW bytes in flight, and a reply
 * frees room for the next request; requests larger than the window still go
 * two at a time (so that their round trips overlap). */
static void test_initiator_window(void)
{
	fake f;
	fake_start(&f, 2);
	window_case(&f, "131072", 40); /* two 64 KiB requests fill it */
	window_case(&f, "4096", 50);   /* smaller than one: still two */
	fake_stop(&f);
}

static void test_initiator_v1(void)
{
	fake f;
	init in;
	wire_up(&f, &in, 1, NULL, 0); /* no tcp_proto_version in the descriptor */
	unsigned char h[W_HDR], data[100];
	te_request r = { TE_OP_READ, in.seg, in.buf, FAKE_BASE + 8, 100 };
	int fd = init_submit_accept(&in, &f, &r, 1);
	CHECK_EQ(recv_exact(fd, h, W_HDR, 3000, NULL), W_HDR);
	check_hdr(h, 100, FAKE_BASE + 8, 0x00);
	fill_pattern(data, 100, 14);
	CHECK(send_all(fd, data, 100)); /* v1: data, no status */
	finish(&in);
	CHECK(memcmp(in.buf, data, 100) == 0);

	fill_pattern(in.buf + 512, 64, 15);
	te_request w = { TE_OP_WRITE, in.seg, in.buf + 512, FAKE_BASE + 1024, 64 };
	init_submit(&in, &w, 1);
	/* v1 WRITE: complete once sent; the fake answers nothing */
	CHECK_EQ(te_batch_wait(in.e, in.b, 3000), 0);
	CHECK_EQ(init_task_state(&in, 0, NULL), TE_TASK_COMPLETED);
	CHECK_EQ(te_batch_free(in.e, in.b), 0);
	CHECK_EQ(recv_exact(fd, h, W_HDR, 3000, NULL), W_HDR);
	check_hdr(h, 64, FAKE_BASE + 1024, 0x01);
	CHECK_EQ(recv_exact(fd, data, 64, 3000, NULL), 64);
	CHECK(memcmp(data, in.buf + 512, 64) == 0);
	close(fd);
	wire_down(&f, &in);
}

/* One READ the fake answers with `reply` (len bytes) and then closes. */
static int fake_answer(init *in, fake *f, const void *reply, size_t len, int *err)
{
	te_request r = { TE_OP_READ, in->seg, in->buf, FAKE_BASE, 100 };
	unsigned char h[W_HDR];
	int fd = init_submit_accept(in, f, &r, 1);
	CHECK_EQ(recv_exact(fd, h, W_HDR, 3000, NULL), W_HDR);
	if (len)
		CHECK(send_all(fd, reply, len));
	if (reply != NULL)
		close(fd);
	CHECK_EQ(te_batch_wait(in->e, in->b, 10000), 0);
	int st = init_task_state(in, 0, err);
	CHECK_EQ(te_batch_free(in->e, in->b), 0);
	if (reply == NULL)
		close(fd);
	return st;
}

static void test_initiator_errors(void)
{
	fake f;
	init in;
	int err = 0;
	/* one slice for the 48 MiB WRITE below */
	te_option o[2] = { { "TE_TCP_TIMEOUT_MS", "500" }, { "TE_TCP_SLICE_SIZE", "67108864" } };
	wire_up(&f, &in, 2, o, 2);
	cap_start();

	uint64_t bad = htole64(0x1234567800000000ull);
	CHECK_EQ(fake_answer(&in, &f, &bad, 8, &err), TE_TASK_FAILED);
	CHECK_EQ(err, TE_ERR_PROTOCOL);
	CHECK(cap_has("malformed status frame"));

	uint64_t rej = htole64(W_STATUS_REJECTED);
	CHECK_EQ(fake_answer(&in, &f, &rej, 8, &err), TE_TASK_FAILED);
	CHECK_EQ(err, TE_ERR_REJECTED);
	CHECK(cap_has("rejected READ"));

	unsigned char half[8 + 50];
	uint64_t ok = htole64(W_STATUS_OK);
	memcpy(half, &ok, 8);
	memset(half + 8, 1, 50);
	CHECK_EQ(fake_answer(&in, &f, half, sizeof half, &err), TE_TASK_FAILED);
	CHECK_EQ(err, -ECONNRESET);

	/* silence: FAILED (not TIMEOUT) after TE_TCP_TIMEOUT_MS */
	long long t0 = now_ms();
	CHECK_EQ(fake_answer(&in, &f, NULL, 0, &err), TE_TASK_FAILED);
	long long dt = now_ms() - t0;
	CHECK(dt >= 400 && dt < 500 + 3000); /* timeout + check period + slack for a loaded machine */
	CHECK(cap_has("no progress for"));

	/* an acknowledgment before the body was sent is a protocol error */
	enum { BIG = 48u << 20 };
	te_request w = { TE_OP_WRITE, in.seg, in.buf, FAKE_BASE, BIG };
	unsigned char h[W_HDR];
	int fd = init_submit_accept(&in, &f, &w, 1);
	CHECK_EQ(recv_exact(fd, h, W_HDR, 3000, NULL), W_HDR);
	CHECK(send_all(fd, &ok, 8)); /* without reading 48 MiB: cannot all be sent */
	CHECK_EQ(te_batch_wait(in.e, in.b, 10000), 0);
	CHECK_EQ(init_task_state(&in, 0, &err), TE_TASK_FAILED);
	CHECK_EQ(err, TE_ERR_PROTOCOL);
	CHECK(cap_has("before its last byte"));
	CHECK_EQ(te_batch_free(in.e, in.b), 0);
	close(fd);
	te_set_log_handler(NULL, NULL);
	wire_down(&f, &in);
}

/* Submits n READs of 10 bytes, 100 apart on both sides, from the fake
 * target, put in r; returns the data connection they come on. */
static int reads_of_ten(init *in, const fake *f, te_request *r, int n)
{
	for (int i = 0; i < n; i++)
		r[i] = (te_request){ TE_OP_READ, in->seg, in->buf + i * 100, FAKE_BASE + (uint64_t)i * 100, 10 };
	return init_submit_accept(in, f, r, (size_t)n);
}

/* The initiator's next data connection, after the peer closed the last
 * one: accepted, with one READ of ten bytes at `addr` on it, answered with
 * ten bytes of `v`. Returns the connection. */
static int reconnect_read_of_ten(const fake *f, uint64_t addr, unsigned char v)
{
	unsigned char h[W_HDR], ten[10];
	uint64_t ok = htole64(W_STATUS_OK);
	int fd = accept_timeout(f->data_lfd, 3000);
	REQUIRE(fd >= 0);
	CHECK_EQ(recv_exact(fd, h, W_HDR, 3000, NULL), W_HDR);
	check_hdr(h, 10, addr, 0x80);
	memset(ten, v, sizeof ten);
	CHECK(send_all(fd, &ok, 8) && send_all(fd, ten, 10));
	return fd;
}

/* A rejection in the middle of a pipeline: the request behind it was never
 * run by the peer and goes again on a new connection. */
static void test_initiator_reject_midway(void)
{
	fake f;
	init in;
	int err = 0;
	wire_up(&f, &in, 2, NULL, 0);
	te_request r[3];
	int fd = reads_of_ten(&in, &f, r, 3);
	unsigned char h[3 * W_HDR], ten[10];
	CHECK_EQ(recv_exact(fd, h, sizeof h, 3000, NULL), (ssize_t)sizeof h);
	uint64_t ok = htole64(W_STATUS_OK), rej = htole64(W_STATUS_REJECTED);
	memset(ten, 7, sizeof ten);
	CHECK(send_all(fd, &ok, 8) && send_all(fd, ten, 10) && send_all(fd, &rej, 8));
	close(fd);
	fd = reconnect_read_of_ten(&f, FAKE_BASE + 200, 9);
	CHECK_EQ(te_batch_wait(in.e, in.b, 10000), 0);
	CHECK_EQ(init_task_state(&in, 0, NULL), TE_TASK_COMPLETED);
	CHECK_EQ(init_task_state(&in, 1, &err), TE_TASK_FAILED);
	CHECK_EQ(err, TE_ERR_REJECTED);
	CHECK_EQ(init_task_state(&in, 2, NULL), TE_TASK_COMPLETED);
	CHECK(in.buf[0] == 7 && in.buf[200] == 9);
	CHECK_EQ(te_batch_free(in.e, in.b), 0);
	close(fd);
	wire_down(&f, &in);
}

/* A rejection that closes the connection with nothing behind the rejected
 * request, while more wait in the peer's queue (one request in flight at a
 * time): the connection comes back for them at once, without waiting for
 * another submit. */
static void test_initiator_reject_then_queued(void)
{
	fake f;
	init in;
	int err = 0;
	te_option o[1] = { { "TE_TCP_QUEUE_DEPTH", "1" } };
	wire_up(&f, &in, 2, o, 1);
	te_request r[2];
	int fd = reads_of_ten(&in, &f, r, 2);
	unsigned char h[W_HDR];
	CHECK_EQ(recv_exact(fd, h, W_HDR, 3000, NULL), W_HDR);
	check_hdr(h, 10, FAKE_BASE, 0x80);
	CHECK(silent_for(fd, 200)); /* the second waits in the queue */
	uint64_t rej = htole64(W_STATUS_REJECTED);
	CHECK(send_all(fd, &rej, 8));
	close(fd);
	fd = reconnect_read_of_ten(&f, FAKE_BASE + 100, 9);
	CHECK_EQ(te_batch_wait(in.e, in.b, 10000), 0);
	CHECK_EQ(init_task_state(&in, 0, &err), TE_TASK_FAILED);
	CHECK_EQ(err, TE_ERR_REJECTED);
	CHECK_EQ(init_task_state(&in, 1, NULL), TE_TASK_COMPLETED);
	CHECK(in.buf[100] == 9);
	CHECK_EQ(te_batch_free(in.e, in.b), 0);
	close(fd);
	wire_down(&f, &in);
}

/* To a peer that says tcp_fence, every connection starts with a HELLO: a
 * lane (the same for the connections a connection slot opens in turn) and a
 * generation (one more each time); to a v1 peer, none. */
static void test_initiator_hello(void)
{
	fake f;
	init in;
	fake_tcp_start(&f, 2, ",\"tcp_fence\":1");
	init_up(&in, &f, IBUF, NULL, 0);
	unsigned char h[2 * W_HDR], data[100];
	uint64_t ok = htole64(W_STATUS_OK), lane = 0;
	te_request r = { TE_OP_READ, in.seg, in.buf, FAKE_BASE + 0x20, 100 };
	fill_pattern(data, sizeof data, 16);
	for (uint64_t gen = 1; gen <= 2; gen++) {
		int fd = init_submit_accept(&in, &f, &r, 1);
		CHECK_EQ(recv_exact(fd, h, sizeof h, 3000, NULL), (ssize_t)sizeof h);
		if (gen == 1)
			lane = get_le64(h);
		CHECK(lane != 0);
		check_hdr(h, lane, gen, 0x82);
		check_hdr(h + W_HDR, 100, FAKE_BASE + 0x20, 0x80);
		CHECK(send_all(fd, &ok, 8) && send_all(fd, data, 100));
		finish(&in);
		CHECK(memcmp(in.buf, data, 100) == 0);
		/* closed while idle: the next request connects again */
		close(fd);
		usleep(100000);
	}
	wire_down(&f, &in);

	/* v1 has no status frames to answer a FENCE: no HELLO either. */
	fake_tcp_start(&f, 1, ",\"tcp_fence\":1");
	init_up(&in, &f, IBUF, NULL, 0);
	r.segment = in.seg; /* a new engine and buffer: where they are now */
	r.local = in.buf;
	int fd = init_submit_accept(&in, &f, &r, 1);
	CHECK_EQ(recv_exact(fd, h, W_HDR, 3000, NULL), W_HDR);
	check_hdr(h, 100, FAKE_BASE + 0x20, 0x00);
	CHECK(send_all(fd, data, 100));
	finish(&in);
	close(fd);
	wire_down(&f, &in);
}

/* A listener on `addr`:`port`, or -1 when that port is taken there. */
static int listen_on(const char *addr, int port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	REQUIRE(fd >= 0);
	inet_pton(AF_INET, addr, &a.sin_addr);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 16) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Listeners on 127.0.0.1 and 127.0.0.2 at one port (from below the
 * ephemeral range, which other tests' connections may hold on either). */
static int listen_two(int lfd[2])
{
	for (int i = 0; i < 100; i++) {
		int port = free_port();
		lfd[0] = listen_on("127.0.0.1", port);
		lfd[1] = lfd[0] >= 0 ? listen_on("127.0.0.2", port) : -1;
		if (lfd[1] >= 0)
			return port;
		if (lfd[0] >= 0)
			close(lfd[0]);
	}
	REQUIRE(!"no port free on both 127.0.0.1 and 127.0.0.2");
	return -1;
}

/* Until `want` bytes are readable on one of the connections accepted from
 * `lfd` so far (accepting the new ones): its index in fds, or -1. */
static int first_with(int lfd[2], int *fds, int *nfds, size_t want, int ms)
{
	long long end = now_ms() + ms;
	while (now_ms() < end) {
		struct pollfd pf[10];
		int n = 0;
		for (int i = 0; i < 2; i++)
			pf[n++] = (struct pollfd){ .fd = lfd[i], .events = POLLIN };
		for (int i = 0; i < *nfds; i++)
			pf[n++] = (struct pollfd){ .fd = fds[i], .events = POLLIN };
		if (poll(pf, (nfds_t)n, 50) <= 0)
			continue;
		for (int i = 0; i < 2 && *nfds < 8; i++)
			if (pf[i].revents & POLLIN)
				fds[(*nfds)++] = accept(lfd[i], NULL, NULL);
		for (int i = 0; i < *nfds; i++) {
			int q = 0;
			if (fds[i] >= 0 && ioctl(fds[i], FIONREAD, &q) == 0 && (size_t)q >= want)
				return i;
		}
	}
	return -1;
}

/* Two rails (127.0.0.1, 127.0.0.2); the connection that carries a WRITE is
 * reset after its last byte arrived, unanswered. With tcp_fence, the WRITE
 * goes again over the other rail, but only after a FENCE naming the first
 * connection (its HELLO's lane and generation) was answered; without, it
 * fails, since the target may still apply the copy it received. */
static void fence_failover_case(bool fence)
{
	int lfd[2], fds[8], nfds = 0;
	int port = listen_two(lfd);
	char extra[160];
	snprintf(extra, sizeof extra, ",\"tcp_data_addresses\":[\"127.0.0.1\",\"127.0.0.2\"]%s",
		 fence ? ",\"tcp_fence\":1" : "");
	fake f;
	init in;
	/* The descriptor names the data port the rails listen on. */
	fake_listen(&f, false);
	f.data_port = port;
	fake_tcp_desc(&f, 2, extra);
	fake_serve(&f);
	te_option o[2] = { { "TE_TCP_DIRECT", "0" }, { "TE_TCP_SUSPECT_MS", "0" } };
	init_up(&in, &f, IBUF, o, 2);
	cap_start();
	fill_pattern(in.buf, 64, 17);
	te_request w = { TE_OP_WRITE, in.seg, in.buf, FAKE_BASE + 0x40, 64 };
	init_submit(&in, &w, 1);
	size_t pre = fence ? W_HDR : 0;
	int a = first_with(lfd, fds, &nfds, pre + W_HDR + 64, 5000);
	REQUIRE(a >= 0);
	unsigned char hello[W_HDR], h[2 * W_HDR], body[64];
	if (fence) {
		CHECK_EQ(recv_exact(fds[a], hello, W_HDR, 3000, NULL), W_HDR);
		CHECK_EQ(hello[16], 0x82);
	}
	CHECK_EQ(recv_exact(fds[a], h, W_HDR, 3000, NULL), W_HDR);
	check_hdr(h, 64, FAKE_BASE + 0x40, 0x81);
	CHECK_EQ(recv_exact(fds[a], body, 64, 3000, NULL), 64);
	struct linger lg = { 1, 0 };
	setsockopt(fds[a], SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
	close(fds[a]); /* a reset: that rail goes down */
	fds[a] = -1;
	uint64_t ok = htole64(W_STATUS_OK);
	if (!fence) {
		int err = 0;
		CHECK_EQ(te_batch_wait(in.e, in.b, 10000), 0);
		CHECK_EQ(init_task_state(&in, 0, &err), TE_TASK_FAILED);
		CHECK_EQ(err, -ECONNRESET);
		CHECK_EQ(te_batch_free(in.e, in.b), 0);
		CHECK(cap_has("the peer cannot fence"));
		/* and it went nowhere else */
		CHECK(first_with(lfd, fds, &nfds, 1, 300) < 0);
	} else {
		/* The other connection: its HELLO (the same lane if it is the
		 * same slot, which it is not), then the FENCE of the first. */
		int b = first_with(lfd, fds, &nfds, 2 * W_HDR, 5000);
		REQUIRE(b >= 0);
		CHECK_EQ(recv_exact(fds[b], h, 2 * W_HDR, 3000, NULL), 2 * W_HDR);
		CHECK_EQ(h[16], 0x82);
		CHECK(get_le64(h) != get_le64(hello));
		check_hdr(h + W_HDR, get_le64(hello), get_le64(hello + 8), 0x83);
		CHECK(silent_for(fds[b], 200)); /* the WRITE waits for the answer */
		CHECK_EQ(init_task_state(&in, 0, NULL), TE_TASK_WAITING);
		CHECK(send_all(fds[b], &ok, 8));
		CHECK_EQ(recv_exact(fds[b], h, W_HDR, 3000, NULL), W_HDR);
		check_hdr(h, 64, FAKE_BASE + 0x40, 0x81);
		CHECK_EQ(recv_exact(fds[b], body, 64, 3000, NULL), 64);
		CHECK(memcmp(body, in.buf, 64) == 0);
		CHECK(send_all(fds[b], &ok, 8));
		finish(&in);
		CHECK(cap_has("once the peer fenced this connection"));
	}
	te_set_log_handler(NULL, NULL);
	for (int i = 0; i < nfds; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	init_down(&in);
	close(lfd[0]);
	close(lfd[1]);
	atomic_store(&f.stop, 1);
	pthread_join(f.th, NULL);
	close(f.rpc_lfd);
}

static void test_initiator_fence(void)
{
	fence_failover_case(true);
	fence_failover_case(false);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	part_a();
	TEST_RUN(test_initiator_v2);
	TEST_RUN(test_initiator_pipelined_slices);
	TEST_RUN(test_initiator_window);
	TEST_RUN(test_initiator_v1);
	TEST_RUN(test_initiator_errors);
	TEST_RUN(test_initiator_reject_midway);
	TEST_RUN(test_initiator_reject_then_queued);
	TEST_RUN(test_initiator_hello);
	TEST_RUN(test_initiator_fence);
	return check_done();
}
