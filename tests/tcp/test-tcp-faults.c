/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Faults: requests a target rejects while other traffic on the same engine
 * goes on; memory unregistered under remote traffic; a target process killed
 * mid-batch, then restarted; a target process stopped mid-batch. Nothing may
 * hang: every batch ends within the configured bound.
 *
 * argv[1]: the tcp-peer helper.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "tcp-test.h"

static const char *peer_bin;

#define ABUF (64u << 20)
#define BBUF (32u << 20)

static void pair_up(pair *p)
{
	pair_open(p, ABUF, NULL, 0, BBUF, NULL, 0);
}

/* ------------------------------------------- rejected amid good traffic */

typedef struct traffic {
	pair *p;
	atomic_int stop;
	int ok, bad, failed;
} traffic;

static void *good_traffic(void *arg)
{
	traffic *t = arg;
	pair *p = t->p;
	enum { N = 16, SZ = 256u << 10 };
	te_request r[N];

	for (unsigned round = 0; !atomic_load(&t->stop); round++) {
		uint32_t op = round % 2 ? TE_OP_READ : TE_OP_WRITE;
		for (int i = 0; i < N; i++)
			r[i] = (te_request){ op, p->seg, p->abuf + (size_t)i * SZ, (uintptr_t)(p->bbuf + (size_t)i * SZ), SZ };
		if (op == TE_OP_WRITE)
			fill_pattern(p->abuf, N * SZ, round);
		else
			fill_pattern(p->bbuf, N * SZ, round);
		int state = batch_state(p->a, r, N, 20000);
		if (state < 0) {
			t->failed++;
			return NULL;
		}
		if (state != TE_TASK_COMPLETED)
			t->failed++;
		else if (memcmp(p->abuf, p->bbuf, N * SZ) != 0)
			t->bad++;
		else
			t->ok++;
	}
	return NULL;
}

static void test_reject_amid_traffic(void)
{
	pair p;
	pair_up(&p);
	unsigned char *priv = map_buf(1u << 20);
	memset(priv, 0x3c, 1u << 20);
	/* Registered without remote access: listed in b's descriptor, so a's
	 * submit lets it through, and b's transport must refuse it. */
	REQUIRE(te_register_memory(p.b, priv, 1u << 20, "cpu:0", 0) == 0);
	CHECK_EQ(te_segment_refresh(p.a, p.seg), 0);

	traffic t = { .p = &p };
	pthread_t th;
	cap_start();
	REQUIRE(pthread_create(&th, NULL, good_traffic, &t) == 0);
	int rejected = 0;
	long long end = now_ms() + 1500;
	for (int i = 0; now_ms() < end || i < 10; i++) {
		te_task_status st = { 0 };
		uint32_t op = i % 2 ? TE_OP_WRITE : TE_OP_READ;
		int s = run_one(p.a, op, p.seg, p.abuf + (48u << 20), (uintptr_t)(priv + 4096), 100000, &st);
		rejected += s == TE_TASK_FAILED && st.error == TE_ERR_REJECTED;
		if (s != TE_TASK_FAILED)
			fprintf(stderr, "  request %d to private memory ended %d\n", i, s);
		CHECK_EQ(s, TE_TASK_FAILED);
		usleep(20000);
	}
	atomic_store(&t.stop, 1);
	pthread_join(th, NULL);
	CHECK(rejected >= 10);
	CHECK(t.ok > 5);
	CHECK_EQ(t.failed, 0);
	CHECK_EQ(t.bad, 0);
	/* untouched by the rejected WRITEs */
	int changed = 0;
	for (size_t i = 0; i < (1u << 20); i++)
		changed += priv[i] != 0x3c;
	CHECK_EQ(changed, 0);
	CHECK(cap_has("rejected WRITE 0x"));
	CHECK(cap_has("from 127.0.0.1:"));
	CHECK(cap_has("the peer rejected"));
	te_set_log_handler(NULL, NULL);
	CHECK_EQ(te_unregister_memory(p.b, priv), 0);
	munmap(priv, 1u << 20);
	pair_down(&p);
}

/* ------------------------------------------------ unregister under load */

typedef struct hammer {
	pair *p;
	unsigned char *x;
	atomic_int stop;
	int completed, failed, other;
} hammer;

static void *hammer_main(void *arg)
{
	hammer *h = arg;
	enum { N = 8, SZ = 1u << 20 };
	te_request r[N];
	while (!atomic_load(&h->stop)) {
		for (int i = 0; i < N; i++)
			r[i] = (te_request){ i % 2 ? TE_OP_READ : TE_OP_WRITE, h->p->seg, h->p->abuf + (size_t)i * SZ,
					     (uintptr_t)(h->x + (size_t)i * SZ), SZ };
		te_batch_id b;
		if (te_batch_alloc(h->p->a, N, &b) != 0)
			return NULL;
		te_submit(h->p->a, b, r, N);
		if (te_batch_wait(h->p->a, b, 20000) != 0) {
			h->other++;
			return NULL;
		}
		for (int i = 0; i < N; i++) {
			te_task_status st;
			te_get_status(h->p->a, b, (size_t)i, &st);
			if (st.state == TE_TASK_COMPLETED)
				h->completed++;
			else if (st.state == TE_TASK_FAILED || st.state == TE_TASK_INVALID)
				h->failed++;
			else
				h->other++;
		}
		te_batch_free(h->p->a, b);
	}
	return NULL;
}

static void test_unregister_under_traffic(void)
{
	pair p;
	pair_up(&p);
	enum { X = 8u << 20 };
	unsigned char *x = map_buf(X);
	REQUIRE(te_register_memory(p.b, x, X, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
	CHECK_EQ(te_segment_refresh(p.a, p.seg), 0);
	hammer h = { .p = &p, .x = x };
	pthread_t th;
	REQUIRE(pthread_create(&th, NULL, hammer_main, &h) == 0);
	usleep(300000);
	long long t0 = now_ms();
	CHECK_EQ(te_unregister_memory(p.b, x), 0);
	CHECK(now_ms() - t0 < 5000);
	/* Gone from b's registry: were a request still writing into it, this
	 * would crash the test. */
	munmap(x, X);
	usleep(300000);
	atomic_store(&h.stop, 1);
	pthread_join(th, NULL);
	CHECK(h.completed > 0);
	CHECK(h.failed > 0); /* those after the unregister, refused by b */
	CHECK_EQ(h.other, 0);
	/* b's refusals made a fetch b's descriptor again by itself (no
	 * te_segment_refresh here): x leaves a's view of b within a bound, and
	 * a request to it is then refused at submit, never sent. */
	te_segment_buffer sb[4];
	long long end = now_ms() + 5000;
	int nb;
	while ((nb = te_segment_buffers(p.a, p.seg, sb, 4)) != 1 && now_ms() < end)
		usleep(20000);
	CHECK_EQ(nb, 1);
	CHECK(nb >= 1 && sb[0].addr == (uintptr_t)p.bbuf);
	te_task_status st;
	CHECK_EQ(run_one(p.a, TE_OP_READ, p.seg, p.abuf, (uintptr_t)x, 4096, &st), TE_TASK_INVALID);
	CHECK_EQ(st.error, TE_ERR_ADDRESS);
	/* b still serves its other memory */
	CHECK_EQ(run_one(p.a, TE_OP_READ, p.seg, p.abuf, (uintptr_t)p.bbuf, 4096, &st), TE_TASK_COMPLETED);
	pair_down(&p);
}

/* ------------------------------------------------- a target process dies */

#define TBYTES (64u << 20)

static bool start_target(child *c, const char *name, int data_port, unsigned seed, char *seg_name,
			 uint64_t *addr)
{
	char bytes[32], sd[16], env_port[40];
	snprintf(bytes, sizeof bytes, "%u", TBYTES);
	snprintf(sd, sizeof sd, "%u", seed);
	char *argv[] = { (char *)peer_bin, "target", (char *)name, bytes, sd, NULL };
	char *env[2] = { NULL, NULL };
	if (data_port > 0) {
		snprintf(env_port, sizeof env_port, "TE_TCP_PORT=%d", data_port);
		env[0] = env_port;
	}
	if (!child_start(c, argv, env))
		return false;
	const char *rest = child_expect(c, "READY ", 10000);
	if (rest == NULL)
		return false;
	unsigned long long a = 0;
	if (sscanf(rest, "%127s %llu", seg_name, &a) != 2)
		return false;
	*addr = a;
	return true;
}

/* A batch big enough to be moving when the target goes (`sig`, `what` it
 * did then): every task ends, some fail (*errcode: how). Returns how long
 * the batch took to end. */
static long long doomed_batch(te_engine *a, te_segment_id seg, unsigned char *buf, uint64_t raddr, int sig,
			      const char *what, pid_t pid, int *errcode)
{
	int completed = 0, failed = 0;
	enum { N = 512, SZ = 1u << 20 };
	static te_request r[N];
	te_batch_id b;
	for (int i = 0; i < N; i++)
		r[i] = (te_request){ TE_OP_READ, seg, buf + (size_t)(i % 32) * SZ, raddr + (uint64_t)(i % 32) * SZ, SZ };
	REQUIRE(te_batch_alloc(a, N, &b) == 0);
	CHECK_EQ(te_submit(a, b, r, N), 0);
	kill(pid, sig);
	long long t0 = now_ms();
	CHECK_EQ(te_batch_wait(a, b, 15000), 0);
	long long dt = now_ms() - t0;
	for (int i = 0; i < N; i++) {
		te_task_status st;
		te_get_status(a, b, (size_t)i, &st);
		if (st.state == TE_TASK_COMPLETED)
			completed++;
		if (st.state == TE_TASK_FAILED) {
			failed++;
			*errcode = st.error;
		}
	}
	CHECK_EQ(te_batch_free(a, b), 0);
	fprintf(stderr, "  %s mid-batch: %d completed, %d failed (%s) in %lld ms\n", what, completed, failed,
		te_strerror(*errcode), dt);
	CHECK_EQ(completed + failed, N);
	CHECK(failed > 0);
	return dt;
}

static void test_killed_and_restarted(void)
{
	int rpc = free_port(), dp = free_port();
	REQUIRE(rpc > 0 && dp > 0);
	char name[64], seg_name[128];
	snprintf(name, sizeof name, "127.0.0.1:%d", rpc);
	child c;
	uint64_t raddr = 0;
	REQUIRE(start_target(&c, name, dp, 5, seg_name, &raddr));
	CHECK(strcmp(seg_name, name) == 0);

	te_option o = { "TE_TCP_TIMEOUT_MS", "2000" };
	te_engine *a = tcp_engine(&o, 1);
	REQUIRE(a != NULL);
	unsigned char *buf = map_buf(64u << 20), *want = malloc(TBYTES);
	REQUIRE(want != NULL);
	fill_pattern(want, TBYTES, 5);
	REQUIRE(te_register_memory(a, buf, 64u << 20, "cpu:0", 0) == 0);
	te_segment_id seg = te_segment_open(a, name);
	REQUIRE(seg > 0);
	te_task_status st;
	CHECK_EQ(run_one(a, TE_OP_READ, seg, buf, raddr + 77, 1u << 20, &st), TE_TASK_COMPLETED);
	CHECK(memcmp(buf, want + 77, 1u << 20) == 0);

	int err = 0;
	long long dt = doomed_batch(a, seg, buf, raddr, SIGKILL, "killed", c.pid, &err);
	CHECK(dt < 2000 + 3000); /* a reset is seen at once; the bound is the stall timeout */
	child_stop(&c, 0);

	/* The target comes back on the same ports; the next transfers reconnect. */
	REQUIRE(start_target(&c, name, dp, 6, seg_name, &raddr));
	fill_pattern(want, TBYTES, 6);
	CHECK_EQ(te_segment_refresh(a, seg), 0); /* its buffer moved */
	CHECK_EQ(run_one(a, TE_OP_READ, seg, buf, raddr + 1, 3u << 20, &st), TE_TASK_COMPLETED);
	CHECK(memcmp(buf, want + 1, 3u << 20) == 0);
	fill_pattern(buf, 1u << 20, 99);
	CHECK_EQ(run_one(a, TE_OP_WRITE, seg, buf, raddr + 5, 1u << 20, &st), TE_TASK_COMPLETED);
	memset(buf + (8u << 20), 0, 1u << 20);
	CHECK_EQ(run_one(a, TE_OP_READ, seg, buf + (8u << 20), raddr + 5, 1u << 20, &st), TE_TASK_COMPLETED);
	CHECK(memcmp(buf, buf + (8u << 20), 1u << 20) == 0);
	child_stop(&c, 0);
	/* Its ports stay closed: a test beside may pick the same free ports. */
	int hold_rpc = te_test_hold_port(rpc), hold_dp = te_test_hold_port(dp);

	/* Gone for good: a transfer fails at once (connection refused). */
	long long t0 = now_ms();
	CHECK_EQ(run_one(a, TE_OP_READ, seg, buf, raddr, 4096, &st), TE_TASK_FAILED);
	CHECK(now_ms() - t0 < 3000);
	if (hold_rpc >= 0 && hold_dp >= 0)
		CHECK_EQ(st.error, -ECONNREFUSED);
	else
		fprintf(stderr, "  a port of the stopped target was taken again: %s\n",
			te_strerror(st.error));
	if (hold_rpc >= 0)
		close(hold_rpc);
	if (hold_dp >= 0)
		close(hold_dp);
	CHECK_EQ(te_segment_close(a, seg), 0);
	te_engine_destroy(a);
	munmap(buf, 64u << 20);
	free(want);
}

static void test_stopped(void)
{
	child c;
	char seg_name[128];
	uint64_t raddr = 0;
	REQUIRE(start_target(&c, "127.0.0.1", 0, 8, seg_name, &raddr));
	te_option o = { "TE_TCP_TIMEOUT_MS", "1000" };
	te_engine *a = tcp_engine(&o, 1);
	REQUIRE(a != NULL);
	unsigned char *buf = map_buf(64u << 20);
	REQUIRE(te_register_memory(a, buf, 64u << 20, "cpu:0", 0) == 0);
	te_segment_id seg = te_segment_open(a, seg_name);
	REQUIRE(seg > 0);
	te_task_status st;
	CHECK_EQ(run_one(a, TE_OP_READ, seg, buf, raddr, 1u << 20, &st), TE_TASK_COMPLETED);

	int err = 0;
	long long dt = doomed_batch(a, seg, buf, raddr, SIGSTOP, "stopped", c.pid, &err);
	CHECK_EQ(err, -ECONNABORTED);
	/* the bound is TE_TCP_TIMEOUT_MS plus the 100 ms check period; the rest is
	 * slack for a loaded machine */
	CHECK(dt >= 800 && dt < 1000 + 3000);
	kill(c.pid, SIGCONT);
	/* awake again: the next transfer reconnects */
	CHECK_EQ(run_one(a, TE_OP_READ, seg, buf, raddr, 1u << 20, &st), TE_TASK_COMPLETED);

	/* One small request at a time: its submitter sends it on the idle
	 * connection and waits on the socket itself; a target that stops is
	 * found all the same, within the stall timeout. */
	for (int i = 0; i < 3; i++)
		CHECK_EQ(run_one(a, TE_OP_READ, seg, buf, raddr, 4096, &st), TE_TASK_COMPLETED);
	child_sigstop(c.pid);
	long long t0 = now_ms();
	CHECK_EQ(run_one(a, TE_OP_READ, seg, buf, raddr, 4096, &st), TE_TASK_FAILED);
	dt = now_ms() - t0;
	fprintf(stderr, "  stopped under one request: failed (%s) in %lld ms\n", te_strerror(st.error), dt);
	CHECK_EQ(st.error, -ECONNABORTED);
	CHECK(dt >= 800 && dt < 1000 + 3000);
	kill(c.pid, SIGCONT);
	CHECK_EQ(run_one(a, TE_OP_READ, seg, buf, raddr, 4096, &st), TE_TASK_COMPLETED);
	child_stop(&c, 0);
	CHECK_EQ(te_segment_close(a, seg), 0);
	te_engine_destroy(a);
	munmap(buf, 64u << 20);
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	REQUIRE(argc > 1);
	peer_bin = argv[1];
	TEST_RUN(test_reject_amid_traffic);
	TEST_RUN(test_unregister_under_traffic);
	TEST_RUN(test_killed_and_restarted);
	TEST_RUN(test_stopped);
	return check_done();
}
