/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Deadlines and cancels on TCP (docs/tcp.md, "Deadlines"): a target process
 * stopped with SIGSTOP under a batch of READs and WRITEs; the tasks end at
 * their deadline, nothing lands in a READ's buffer after that, the WRITEs
 * whose bytes left stay unsettled until the target, resumed, answers the
 * FENCE of their connection; a cancel ends a batch at once; a deadline that
 * passes on a connection shared with other transfers leaves those intact; the
 * cluster key's exchange with a stopped target ends by the deadline.
 *
 * argv[1]: the tcp-peer helper.
 */
#include "tcp-test.h"

#define TBYTES (4u << 20) /* the target's memory */
#define SEED 21u
#define LBYTES (16u << 20) /* ours */
#define MS 1000000LL

/* How late a task may end after its deadline: the host's timer and the
 * wake-up of the waiter, on a loaded two-core machine. Sanitizers slow every
 * thread several times over (TSan most), hence more there. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define LATE_MS 80
#else
#define LATE_MS 20
#endif
#if defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#undef LATE_MS
#define LATE_MS 80
#endif
#endif

static const char *peer_bin;

typedef struct target {
	child c;
	char name[128];
	uint64_t addr;
} target;

/* A target, with the cluster key in `key` when not NULL. */
static void target_start_key(target *t, const char *key)
{
	char bytes[32], sd[16], env_key[160];
	snprintf(bytes, sizeof bytes, "%u", TBYTES);
	snprintf(sd, sizeof sd, "%u", SEED);
	snprintf(env_key, sizeof env_key, "TE_AUTH_KEY_FILE=%s", key ? key : "");
	char *argv[] = { (char *)peer_bin, "target", "127.0.0.1", bytes, sd, NULL };
	char *env[] = { env_key, NULL };
	REQUIRE(child_start(&t->c, argv, key ? env : NULL));
	const char *rest = child_expect(&t->c, "READY ", 10000);
	REQUIRE(rest != NULL);
	unsigned long long a = 0;
	REQUIRE(sscanf(rest, "%127s %llu", t->name, &a) == 2);
	t->addr = a;
}

static void target_start(target *t)
{
	target_start_key(t, NULL);
}

/* Tasks of the batch that are TE_TASK_UNSETTLED now. */
static size_t count_unsettled(te_engine *e, te_batch_id b, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		te_task_info ti = { .size = sizeof ti };
		CHECK_EQ(te_get_task_info(e, b, i, &ti), 0);
		k += (ti.flags & TE_TASK_UNSETTLED) != 0;
	}
	return k;
}

/* Bytes of `p` that are not `v`. */
static size_t changed(const unsigned char *p, size_t n, unsigned char v)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		k += p[i] != v;
	return k;
}

/*
 * Local layout: [0, 2 MiB) READ destinations (filled with 0xA5 first),
 * [4 MiB, 6 MiB) WRITE sources. Remote: READs from the start of the
 * target's memory, WRITEs into its second half (its pattern stays in the
 * first, for read_back_ok).
 */
enum { NSMALL = 48, SMALL = 4096, BIG = 1u << 20 };
#define RDST 0u
#define WSRC (4u << 20)

typedef struct rig {
	target t;
	te_engine *e;
	unsigned char *buf;
	te_segment_id seg;
	/* stopped_rig()'s: make_batch()'s requests, their count, their batch */
	te_request q[2 * NSMALL + 2];
	size_t n;
	te_batch_id b;
} rig;

static void rig_up(rig *r, const te_option *o, size_t no)
{
	target_start(&r->t);
	r->e = tcp_engine(o, no);
	REQUIRE(r->e != NULL);
	r->buf = map_buf(LBYTES);
	REQUIRE(te_register_memory(r->e, r->buf, LBYTES, "cpu:0", 0) == 0);
	r->seg = te_segment_open(r->e, r->t.name);
	REQUIRE(r->seg > 0);
	te_task_status st;
	/* connected, and the descriptor known: nothing but the data path is timed */
	CHECK_EQ(run_one(r->e, TE_OP_READ, r->seg, r->buf, r->t.addr, 4096, &st), TE_TASK_COMPLETED);
}

static void rig_down(rig *r)
{
	CHECK_EQ(te_segment_close(r->e, r->seg), 0);
	te_engine_destroy(r->e);
	child_stop(&r->t.c, 0);
	munmap(r->buf, LBYTES);
}

/* A READ of the target's memory comes back as its pattern. */
static bool read_back_ok(rig *r, uint64_t off, size_t n)
{
	unsigned char *want = malloc(TBYTES);
	REQUIRE(want != NULL);
	fill_pattern(want, TBYTES, SEED);
	unsigned char *dst = r->buf + (12u << 20);
	memset(dst, 0, n);
	te_task_status st = { 0 };
	bool ok = run_one(r->e, TE_OP_READ, r->seg, dst, r->t.addr + off, n, &st) == TE_TASK_COMPLETED &&
		  memcmp(dst, want + off, n) == 0;
	if (!ok)
		fprintf(stderr, "  READ back: state %d, %s\n", st.state, te_strerror(st.error));
	free(want);
	return ok;
}

static size_t make_batch(rig *r, te_request *q)
{
	size_t n = 0;
	uint64_t rw = r->t.addr + TBYTES / 2;
	/* the small WRITEs first: their bodies leave before the socket fills */
	for (int i = 0; i < NSMALL; i++)
		q[n++] = (te_request){ TE_OP_WRITE, r->seg, r->buf + WSRC + BIG + (size_t)i * SMALL,
				       rw + BIG + (uint64_t)i * SMALL, SMALL };
	q[n++] = (te_request){ TE_OP_WRITE, r->seg, r->buf + WSRC, rw, BIG };
	q[n++] = (te_request){ TE_OP_READ, r->seg, r->buf + RDST, r->t.addr, BIG };
	for (int i = 0; i < NSMALL; i++)
		q[n++] = (te_request){ TE_OP_READ, r->seg, r->buf + RDST + BIG + (size_t)i * SMALL,
				       r->t.addr + BIG + (uint64_t)i * SMALL, SMALL };
	return n;
}

/* rig_up() with the default options, make_batch()'s requests in r->q
 * (their count in r->n) and a batch for them (r->b); the target is stopped
 * (SIGSTOP). */
static void stopped_rig(rig *r)
{
	rig_up(r, NULL, 0);
	r->n = make_batch(r, r->q);
	child_sigstop(r->t.c.pid);
	REQUIRE(te_batch_alloc(r->e, r->n, &r->b) == 0);
}

/* (a) (b) (d): a stopped target. */
static void test_stopped_target(void)
{
	static rig r;
	stopped_rig(&r);
	memset(r.buf + RDST, 0xA5, 2u << 20);
	fill_pattern(r.buf + WSRC, 2u << 20, 3);
	int64_t dl = te_now_ns() + 200 * MS;
	CHECK_EQ(te_submit_by(r.e, r.b, r.q, r.n, dl), 0);
	CHECK_EQ(te_batch_wait(r.e, r.b, 3000), 0);
	int64_t late = te_now_ns() - dl;
	fprintf(stderr, "  %zu tasks ended %.1f ms after their deadline\n", r.n, (double)late / MS);
	CHECK(late >= 0);
	CHECK(late <= LATE_MS * MS);
	size_t unsettled = 0, bad = 0;
	for (size_t i = 0; i < r.n; i++) {
		te_task_info ti = { .size = sizeof ti };
		CHECK_EQ(te_get_task_info(r.e, r.b, i, &ti), 0);
		if (ti.state != TE_TASK_FAILED || ti.error != -ETIMEDOUT) {
			if (bad++ == 0)
				fprintf(stderr, "  task %zu (%s %llu bytes) ended %d, %s\n", i,
					r.q[i].opcode == TE_OP_WRITE ? "WRITE" : "READ", (unsigned long long)r.q[i].length,
					ti.state, te_strerror(ti.error));
		}
		if (ti.flags & TE_TASK_UNSETTLED) {
			unsettled++;
			CHECK_EQ(r.q[i].opcode, TE_OP_WRITE); /* a READ is settled when it ends */
		}
	}
	CHECK_EQ(bad, 0);
	/* The first small WRITEs' bodies left (into the socket buffers the
	 * stopped target's kernel still fills): unsettled, until their FENCE
	 * is answered, which the stopped target cannot. */
	te_task_info t0 = { .size = sizeof t0 };
	CHECK_EQ(te_get_task_info(r.e, r.b, 0, &t0), 0);
	CHECK(t0.flags & TE_TASK_UNSETTLED);
	fprintf(stderr, "  %zu WRITEs unsettled\n", unsettled);
	CHECK_EQ(te_batch_wait_settled(r.e, r.b, 150), -ETIMEDOUT);
	CHECK_EQ(count_unsettled(r.e, r.b, r.n), unsettled); /* none settles while the target is stopped */

	/* (d) More transfers to the still stopped target end by their
	 * deadline too, not after the stall or connect timeouts. */
	te_batch_id b2;
	te_request q2[2] = { { TE_OP_READ, r.seg, r.buf + (8u << 20), r.t.addr + TBYTES / 2, SMALL },
			     { TE_OP_WRITE, r.seg, r.buf + (8u << 20) + SMALL, r.t.addr + TBYTES / 2, SMALL } };
	REQUIRE(te_batch_alloc(r.e, 2, &b2) == 0);
	int64_t dl2 = te_now_ns() + 200 * MS;
	CHECK_EQ(te_submit_by(r.e, b2, q2, 2, dl2), 0);
	CHECK_EQ(te_batch_wait(r.e, b2, 3000), 0);
	CHECK(te_now_ns() - dl2 <= LATE_MS * MS);
	for (size_t i = 0; i < 2; i++) {
		te_task_status st = { 0 };
		CHECK_EQ(te_get_status(r.e, b2, i, &st), 0);
		CHECK_EQ(st.state, TE_TASK_FAILED);
		CHECK_EQ(st.error, -ETIMEDOUT);
	}
	CHECK_EQ(te_batch_free(r.e, b2), 0);

	/* Resumed: the FENCE is answered, the WRITEs settle; nothing lands in
	 * the READs' buffers (the replies the target now sends are dropped). */
	CHECK_EQ(changed(r.buf + RDST, 2u << 20, 0xA5), 0);
	kill(r.t.c.pid, SIGCONT);
	int64_t t1 = te_now_ns();
	CHECK_EQ(te_batch_wait_settled(r.e, r.b, 2000), 0);
	fprintf(stderr, "  settled %.1f ms after the target resumed\n", (double)(te_now_ns() - t1) / MS);
	for (size_t i = 0; i < r.n; i++) {
		te_task_info ti = { .size = sizeof ti };
		CHECK_EQ(te_get_task_info(r.e, r.b, i, &ti), 0);
		CHECK_EQ(ti.flags & TE_TASK_UNSETTLED, 0);
	}
	usleep(300000);
	CHECK_EQ(changed(r.buf + RDST, 2u << 20, 0xA5), 0);
	CHECK_EQ(te_batch_free(r.e, r.b), 0);
	/* and the target serves us again */
	CHECK(read_back_ok(&r, 4096, BIG));
	te_task_status st;
	fill_pattern(r.buf + WSRC, SMALL, 9);
	CHECK_EQ(run_one(r.e, TE_OP_WRITE, r.seg, r.buf + WSRC, r.t.addr + TBYTES - SMALL, SMALL, &st),
		 TE_TASK_COMPLETED);
	rig_down(&r);
}

/* (c) A cancel ends a batch in flight to a stopped target at once. */
static void test_cancel(void)
{
	static rig r;
	stopped_rig(&r);
	memset(r.buf + RDST, 0xA5, 2u << 20);
	CHECK_EQ(te_submit(r.e, r.b, r.q, r.n), 0);
	usleep(50000); /* on the wire, or waiting in the socket buffers */
	int64_t t0 = te_now_ns();
	CHECK_EQ(te_batch_cancel(r.e, r.b), 0);
	CHECK_EQ(te_batch_wait(r.e, r.b, 3000), 0);
	int64_t took = te_now_ns() - t0;
	fprintf(stderr, "  canceled in %.1f ms\n", (double)took / MS);
	CHECK(took <= LATE_MS * MS);
	size_t bad = 0;
	for (size_t i = 0; i < r.n; i++) {
		te_task_status st = { 0 };
		CHECK_EQ(te_get_status(r.e, r.b, i, &st), 0);
		bad += st.state != TE_TASK_CANCELED;
	}
	CHECK_EQ(bad, 0);
	/* the WRITEs whose bytes left stay unsettled while the target is stopped */
	size_t unsettled = count_unsettled(r.e, r.b, r.n);
	CHECK(unsettled > 0);
	CHECK_EQ(te_batch_wait_settled(r.e, r.b, 100), -ETIMEDOUT);
	CHECK_EQ(count_unsettled(r.e, r.b, r.n), unsettled);
	kill(r.t.c.pid, SIGCONT);
	CHECK_EQ(te_batch_wait_settled(r.e, r.b, 2000), 0);
	usleep(100000);
	CHECK_EQ(changed(r.buf + RDST, 2u << 20, 0xA5), 0);
	CHECK_EQ(te_batch_free(r.e, r.b), 0);
	CHECK(read_back_ok(&r, 0, BIG));
	rig_down(&r);
}

/* Destroying the engine while WRITEs ended early still wait for a stopped
 * target's FENCE answer: the destroy does not wait for the target (nor for
 * its 60 s drain bound); nothing is freed under the transport (ASan). */
static void test_destroy_unsettled(void)
{
	static rig r;
	stopped_rig(&r);
	CHECK_EQ(te_submit_by(r.e, r.b, r.q, r.n, te_now_ns() + 100 * MS), 0);
	CHECK_EQ(te_batch_wait(r.e, r.b, 3000), 0);
	CHECK(count_unsettled(r.e, r.b, r.n) > 0);
	CHECK_EQ(te_batch_free(r.e, r.b), 0); /* the tasks' storage is kept for the transport */
	CHECK_EQ(te_segment_close(r.e, r.seg), 0);
	int64_t t0 = te_now_ns();
	te_engine_destroy(r.e);
	int64_t took = (te_now_ns() - t0) / MS;
	fprintf(stderr, "  destroyed with unsettled WRITEs in %lld ms\n", (long long)took);
	CHECK(took < 2000);
	kill(r.t.c.pid, SIGCONT);
	child_stop(&r.t.c, 0);
	munmap(r.buf, LBYTES);
}

/* (e) A deadline that passes on the one connection to a live target: the
 * transfers beside it, without a deadline, complete with the right bytes. */
static void test_shared_connection(void)
{
	/* one connection, whose ring takes every request at once */
	te_option o[] = { { "TE_TCP_CONNS_PER_PEER", "1" }, { "TE_TCP_DIRECT", "0" }, { "TE_TCP_WINDOW", "67108864" } };
	rig r;
	rig_up(&r, o, 3);
	unsigned char *want = malloc(TBYTES);
	REQUIRE(want != NULL);
	fill_pattern(want, TBYTES, SEED);
	enum { N = 24 };
	static te_request doomed[N], kept[N];
	size_t ended = 0, rounds = 0;
	for (; rounds < 8 && (rounds < 3 || ended == 0); rounds++) {
		/* kept: READs of the target's pattern and WRITEs of ours into
		 * its second half, interleaved with READs whose deadline is a
		 * millisecond away (their bytes are still on the wire then) */
		memset(r.buf, 0, 8u << 20);
		fill_pattern(r.buf + (8u << 20), 4u << 20, (unsigned)rounds + 40);
		for (int i = 0; i < N; i++) {
			size_t sz = i % 2 ? (256u << 10) : (64u << 10) + 3;
			kept[i] = (i % 3 == 2) ? (te_request){ TE_OP_WRITE, r.seg, r.buf + (8u << 20) + (size_t)i * (128u << 10),
							       r.t.addr + TBYTES / 2 + (uint64_t)i * (64u << 10), 64u << 10 }
					       : (te_request){ TE_OP_READ, r.seg, r.buf + (size_t)i * (256u << 10),
							       r.t.addr + (uint64_t)i * 4099, sz };
			doomed[i] = (te_request){ TE_OP_READ, r.seg, r.buf + (6u << 20) + (size_t)(i % 2) * BIG,
						  r.t.addr + (uint64_t)(i % 2) * BIG, BIG }; /* not where the WRITEs go */
		}
		te_batch_id bd, bk;
		REQUIRE(te_batch_alloc(r.e, N, &bd) == 0);
		REQUIRE(te_batch_alloc(r.e, N, &bk) == 0);
		CHECK_EQ(te_submit(r.e, bk, kept, N / 2), 0);
		CHECK_EQ(te_submit_by(r.e, bd, doomed, N, te_now_ns() + MS), 0);
		CHECK_EQ(te_submit(r.e, bk, kept + N / 2, N / 2), 0);
		CHECK_EQ(te_batch_wait(r.e, bk, 10000), 0);
		CHECK_EQ(te_batch_wait(r.e, bd, 10000), 0);
		for (int i = 0; i < N; i++) {
			te_task_status st = { 0 };
			CHECK_EQ(te_get_status(r.e, bk, (size_t)i, &st), 0);
			CHECK_EQ(st.state, TE_TASK_COMPLETED);
			if (kept[i].opcode == TE_OP_READ)
				CHECK(memcmp(r.buf + (size_t)i * (256u << 10), want + (size_t)i * 4099, kept[i].length) == 0);
			CHECK_EQ(te_get_status(r.e, bd, (size_t)i, &st), 0);
			ended += st.state == TE_TASK_FAILED && st.error == -ETIMEDOUT;
		}
		CHECK_EQ(te_batch_wait_settled(r.e, bd, 2000), 0);
		CHECK_EQ(te_batch_free(r.e, bd), 0);
		CHECK_EQ(te_batch_free(r.e, bk), 0);
		/* the WRITEs landed whole */
		for (int i = 2; i < N; i += 3) {
			unsigned char *back = r.buf + (14u << 20);
			te_task_status st;
			CHECK_EQ(run_one(r.e, TE_OP_READ, r.seg, back, kept[i].remote, kept[i].length, &st),
				 TE_TASK_COMPLETED);
			CHECK(memcmp(back, kept[i].local, kept[i].length) == 0);
		}
	}
	fprintf(stderr, "  %zu READs ended at their deadline beside the others in %zu rounds\n", ended, rounds);
	CHECK(ended > 0);
	free(want);
	rig_down(&r);
}

/* (d) With a cluster key the data connection's exchange is the one step
 * that blocks (in an I/O thread): to a stopped target it must not outlast
 * the deadline of the transfer waiting for the connection, or it holds up
 * the other peers that thread serves (3 s otherwise). */
static void test_auth_bounded(void)
{
	char key[64];
	snprintf(key, sizeof key, "/tmp/te-deadline-key-%d", (int)getpid());
	int fd = open(key, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	REQUIRE(fd >= 0);
	static const char k[] = "0123456789abcdef-deadline-test-key\n";
	REQUIRE(write(fd, k, sizeof k - 1) == (ssize_t)(sizeof k - 1));
	close(fd);
	target ta, tb;
	target_start_key(&ta, key);
	target_start_key(&tb, key);
	/* one I/O thread for both peers; idle connections close at once */
	te_option o[] = { { "TE_TCP_THREADS", "1" }, { "TE_TCP_CONNS_PER_PEER", "1" }, { "TE_TCP_IDLE_MS", "100" },
			  { "auth_key_file", key } };
	te_engine *e = tcp_engine(o, 4);
	REQUIRE(e != NULL);
	unsigned char *buf = map_buf(1u << 20);
	REQUIRE(te_register_memory(e, buf, 1u << 20, "cpu:0", 0) == 0);
	te_segment_id sa = te_segment_open(e, ta.name), sb = te_segment_open(e, tb.name);
	REQUIRE(sa > 0 && sb > 0);
	te_task_status st;
	CHECK_EQ(run_one(e, TE_OP_READ, sa, buf, ta.addr, SMALL, &st), TE_TASK_COMPLETED);
	CHECK_EQ(run_one(e, TE_OP_READ, sb, buf, tb.addr, SMALL, &st), TE_TASK_COMPLETED);
	usleep(300000); /* both connections closed idle: the next transfers connect anew */

	child_sigstop(ta.c.pid);
	te_batch_id b;
	REQUIRE(te_batch_alloc(e, 1, &b) == 0);
	te_request q = { TE_OP_READ, sa, buf, ta.addr, SMALL };
	int64_t dl = te_now_ns() + 200 * MS;
	CHECK_EQ(te_submit_by(e, b, &q, 1, dl), 0);
	usleep(20000); /* its connection's exchange under way */
	int64_t t0 = te_now_ns();
	CHECK_EQ(run_one(e, TE_OP_READ, sb, buf + SMALL, tb.addr, SMALL, &st), TE_TASK_COMPLETED);
	int64_t took = te_now_ns() - t0;
	fprintf(stderr, "  a transfer to the live target took %.1f ms beside the stopped one's exchange\n",
		(double)took / MS);
	CHECK(took < 1000 * MS);
	CHECK_EQ(te_batch_wait(e, b, 3000), 0);
	CHECK(te_now_ns() - dl <= LATE_MS * MS);
	CHECK_EQ(te_get_status(e, b, 0, &st), 0);
	CHECK_EQ(st.state, TE_TASK_FAILED);
	CHECK_EQ(te_batch_free(e, b), 0);

	kill(ta.c.pid, SIGCONT);
	CHECK_EQ(run_one(e, TE_OP_READ, sa, buf, ta.addr, SMALL, &st), TE_TASK_COMPLETED);
	CHECK_EQ(te_segment_close(e, sa), 0);
	CHECK_EQ(te_segment_close(e, sb), 0);
	te_engine_destroy(e);
	/* (the targets' engines would wait for exchanges they still hold) */
	child_stop(&ta.c, SIGKILL);
	child_stop(&tb.c, SIGKILL);
	munmap(buf, 1u << 20);
	unlink(key);
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	REQUIRE(argc > 1);
	peer_bin = argv[1];
	TEST_RUN(test_stopped_target);
	TEST_RUN(test_cancel);
	TEST_RUN(test_destroy_unsettled);
	TEST_RUN(test_shared_connection);
	TEST_RUN(test_auth_bounded);
	return check_done();
}
