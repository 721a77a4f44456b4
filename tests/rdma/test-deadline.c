/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Deadlines and cancels on RDMA (docs/rdma.md, "Deadlines"), on two engines
 * with one emulated NIC each (A: mlx5_0, B: mlx5_2) and a peer that stops
 * answering (a huge latency injected on A's device, where its requests run):
 *  - READ and WRITE tasks submitted with a deadline end FAILED/-ETIMEDOUT by
 *    it, and once the peer answers again no byte reaches the READ's buffer:
 *    their queue pair was moved to ERR and the requests flushed;
 *  - a WRITE posted is TE_TASK_UNSETTLED until its flush comes (a NIC slow
 *    to flush), then settled;
 *  - te_batch_cancel() ends tasks in flight at once, with the same effect;
 *  - a task without a deadline in flight on the same endpoint when another
 *    one ends is sent again on a new endpoint and completes; so does a batch
 *    after each of the above.
 */
#include <infiniband/verbs.h>

#include "rdma-util.h"

#define BUF (4u << 20)
#define LEN (256u << 10) /* four slices */
#define STUCK_US 30000000u /* the peer's answer: 30 s away */
/* How late after its deadline a task may end: the host's timer and the
 * flush take a few ms; the sanitizers slow every thread several-fold. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define LATE_MS 120
#else
#define LATE_MS 20
#endif

static te_engine *A, *B;
static unsigned char *abuf, *bbuf;
static te_segment_id SEG;
static te_rdma_soft_set_flush_delay_fn soft_flush_delay;

static void setup(void)
{
	A = soft_engine("two-socket", "{\"devices\": [\"mlx5_0\"]}");
	B = soft_engine("two-socket", "{\"devices\": [\"mlx5_2\"]}");
	SEG = pair_buffers(A, B, BUF, 0, &abuf, &bbuf);
	void *h = dlopen(getenv("TE_RDMA_PLUGIN"), RTLD_NOW | RTLD_NOLOAD);
	REQUIRE(h != NULL);
	*(void **)&soft_flush_delay = dlsym(h, "te_rdma_soft_set_flush_delay");
	REQUIRE(soft_flush_delay != NULL);
	/* The endpoint is up before the peer stops answering: the tasks' slices
	 * are posted, not waiting for a handshake. */
	te_task_status st;
	CHECK_EQ(run_one(A, TE_OP_WRITE, SEG, abuf, (uintptr_t)bbuf, 4096, &st), TE_TASK_COMPLETED);
}

static void teardown(void)
{
	te_segment_close(A, SEG);
	te_engine_destroy(A);
	te_engine_destroy(B);
	free(abuf);
	free(bbuf);
}

static te_task_info info_of(te_batch_id b, size_t task)
{
	te_task_info ti = { .size = sizeof ti };
	CHECK_EQ(te_get_task_info(A, b, task, &ti), 0);
	return ti;
}

/* Requests the soft device `dev` flushed so far. */
static uint64_t flushed_on(const char *dev)
{
	te_rdma_soft_counters c;
	return soft_counters(dev, &c) == 0 ? c.flushed : 0;
}

/* Work requests of A's device out of its queues (run, failed or flushed). */
static uint64_t executed(void)
{
	te_rdma_soft_counters c;
	return soft_counters("mlx5_0", &c) == 0 ? c.wrs + c.errors + c.flushed : 0;
}

/* A READ into abuf[0, LEN) and a WRITE from abuf[LEN, 2 LEN), with the
 * bytes on both sides set so that any byte moved shows. */
static void prepare(te_request r[2])
{
	memset(abuf, 0xa5, LEN);
	fill_pattern(abuf + LEN, LEN, 7);
	fill_pattern(bbuf, LEN, 8);
	memset(bbuf + LEN, 0x5a, LEN);
	r[0] = (te_request){ TE_OP_READ, SEG, abuf, (uintptr_t)bbuf, LEN };
	r[1] = (te_request){ TE_OP_WRITE, SEG, abuf + LEN, (uintptr_t)(bbuf + LEN), LEN };
}

static bool all_bytes(const unsigned char *p, size_t n, unsigned char v)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != v)
			return false;
	return true;
}

/* After the peer answers again: neither the READ's buffer nor the WRITE's
 * destination changed (nothing of them ran). */
static void nothing_landed(void)
{
	/* What would still run, runs now: give it the time. */
	usleep(100000);
	CHECK(all_bytes(abuf, LEN, 0xa5));
	CHECK(all_bytes(bbuf + LEN, LEN, 0x5a));
}

/* A READ and a WRITE without deadline, on the same peer, complete with the
 * right bytes. */
static void works_again(void)
{
	te_request r[2];
	te_batch_id b;
	te_task_status st;

	prepare(r);
	REQUIRE(te_batch_alloc(A, 2, &b) == 0);
	CHECK_EQ(te_submit(A, b, r, 2), 0);
	CHECK_EQ(te_batch_wait(A, b, 10000), 0);
	for (size_t i = 0; i < 2; i++) {
		CHECK_EQ(te_get_status(A, b, i, &st), 0);
		CHECK_EQ(st.state, TE_TASK_COMPLETED);
	}
	CHECK(memcmp(abuf, bbuf, LEN) == 0);
	CHECK(memcmp(abuf + LEN, bbuf + LEN, LEN) == 0);
	CHECK_EQ(te_batch_free(A, b), 0);
}

/* The peer answers again: nothing of batch b (ended) landed; b is freed and
 * transfers work again. */
static void peer_back(te_batch_id b)
{
	CHECK_EQ(soft_set_latency("mlx5_0", 0), 0);
	nothing_landed();
	CHECK_EQ(te_batch_free(A, b), 0);
	works_again();
}

static void test_deadline(void)
{
	te_request r[2];
	te_batch_id b;
	te_task_status st;

	prepare(r);
	uint64_t f0 = flushed_on("mlx5_0");
	CHECK_EQ(soft_set_latency("mlx5_0", STUCK_US), 0);
	REQUIRE(te_batch_alloc(A, 2, &b) == 0);
	long long t0 = now_ms();
	CHECK_EQ(te_submit_by(A, b, r, 2, te_now_ns() + 200 * 1000000ll), 0);
	CHECK_EQ(te_batch_wait(A, b, 3000), 0);
	long long took = now_ms() - t0;
	fprintf(stderr, "  deadline 200 ms: ended after %lld ms\n", took);
	CHECK(took >= 195 && took <= 200 + LATE_MS);
	for (size_t i = 0; i < 2; i++) {
		CHECK_EQ(te_get_status(A, b, i, &st), 0);
		CHECK_EQ(st.state, TE_TASK_FAILED);
		CHECK_EQ(st.error, -ETIMEDOUT);
		CHECK(info_of(b, i).flags & TE_TASK_ENDED_EARLY);
	}
	/* A READ is settled when it ends. */
	CHECK(!(info_of(b, 0).flags & TE_TASK_UNSETTLED));
	/* Their requests were flushed, not left waiting for the peer. */
	CHECK(flushed_on("mlx5_0") >= f0 + 2);
	CHECK_EQ(te_batch_wait_settled(A, b, 1000), 0);
	CHECK(!(info_of(b, 1).flags & TE_TASK_UNSETTLED));
	peer_back(b);
}

static void test_unsettled_write(void)
{
	te_request r[2];
	te_batch_id b;
	te_task_status st;

	prepare(r);
	r[1].length = 65536; /* one slice: one flush to wait for */
	CHECK_EQ(soft_set_latency("mlx5_0", STUCK_US), 0);
	CHECK_EQ(soft_flush_delay("mlx5_0", 300000), 0);
	REQUIRE(te_batch_alloc(A, 1, &b) == 0);
	CHECK_EQ(te_submit_by(A, b, &r[1], 1, te_now_ns() + 100 * 1000000ll), 0);
	CHECK_EQ(te_batch_wait(A, b, 3000), 0);
	long long t_end = now_ms();
	CHECK_EQ(te_get_status(A, b, 0, &st), 0);
	CHECK_EQ(st.state, TE_TASK_FAILED);
	CHECK_EQ(st.error, -ETIMEDOUT);
	/* Posted, and its flush not come: its bytes may still land. */
	CHECK(info_of(b, 0).flags & TE_TASK_UNSETTLED);
	CHECK_EQ(te_batch_wait_settled(A, b, 0), -ETIMEDOUT);
	CHECK_EQ(te_batch_wait_settled(A, b, 3000), 0);
	long long settled = now_ms() - t_end;
	fprintf(stderr, "  WRITE settled %lld ms after it ended\n", settled);
	/* The flush came 300 ms after the QP went to ERR, less the 50 ms the
	 * plugin waited for it. */
	CHECK(settled >= 150);
	CHECK(!(info_of(b, 0).flags & TE_TASK_UNSETTLED));
	CHECK_EQ(soft_flush_delay("mlx5_0", 0), 0);
	peer_back(b);
}

static void test_cancel(void)
{
	te_request r[2];
	te_batch_id b;
	te_task_status st;

	prepare(r);
	uint64_t x0 = executed(), f0 = flushed_on("mlx5_0");
	CHECK_EQ(soft_set_latency("mlx5_0", STUCK_US), 0);
	REQUIRE(te_batch_alloc(A, 2, &b) == 0);
	CHECK_EQ(te_submit(A, b, r, 2), 0);
	usleep(50000); /* posted, the first one waiting for the peer */
	CHECK_EQ(executed(), x0);
	long long t0 = now_ms();
	CHECK_EQ(te_batch_cancel(A, b), 0);
	CHECK_EQ(te_batch_wait(A, b, 3000), 0);
	long long took = now_ms() - t0;
	fprintf(stderr, "  canceled in flight: ended after %lld ms\n", took);
	CHECK(took <= LATE_MS);
	for (size_t i = 0; i < 2; i++) {
		CHECK_EQ(te_get_status(A, b, i, &st), 0);
		CHECK_EQ(st.state, TE_TASK_CANCELED);
	}
	CHECK(flushed_on("mlx5_0") >= f0 + 2);
	CHECK_EQ(te_batch_wait_settled(A, b, 1000), 0);
	peer_back(b);
}

/* A READ without deadline shares the endpoint with a WRITE that ends at its
 * deadline: the endpoint is closed under it, and it is sent again on a new
 * one, completing once the peer answers; no failure is counted. */
static void test_neighbour_survives(void)
{
	te_request r[2];
	te_batch_id bn, bd;
	te_task_status st;
	te_rdma_stats s0, s1;

	prepare(r);
	REQUIRE(stats_of(A, &s0) == 0);
	CHECK_EQ(soft_set_latency("mlx5_0", STUCK_US), 0);
	REQUIRE(te_batch_alloc(A, 1, &bn) == 0);
	REQUIRE(te_batch_alloc(A, 1, &bd) == 0);
	CHECK_EQ(te_submit(A, bn, &r[0], 1), 0);
	CHECK_EQ(te_submit_by(A, bd, &r[1], 1, te_now_ns() + 100 * 1000000ll), 0);
	CHECK_EQ(te_batch_wait(A, bd, 3000), 0);
	CHECK_EQ(te_get_status(A, bd, 0, &st), 0);
	CHECK_EQ(st.state, TE_TASK_FAILED);
	/* The READ goes on, on a new endpoint, still waiting for the peer. */
	CHECK(WAIT_FOR(stats_of(A, &s1) == 0 && s1.endpoints_created > s0.endpoints_created, 3000));
	CHECK_EQ(te_get_status(A, bn, 0, &st), 0);
	CHECK(st.state == TE_TASK_WAITING || st.state == TE_TASK_PENDING);
	CHECK_EQ(soft_set_latency("mlx5_0", 0), 0);
	CHECK_EQ(te_batch_wait(A, bn, 5000), 0);
	CHECK_EQ(te_get_status(A, bn, 0, &st), 0);
	CHECK_EQ(st.state, TE_TASK_COMPLETED);
	CHECK(memcmp(abuf, bbuf, LEN) == 0);
	CHECK(all_bytes(bbuf + LEN, LEN, 0x5a));
	REQUIRE(stats_of(A, &s1) == 0);
	CHECK_EQ(s1.endpoints_failed, s0.endpoints_failed);
	CHECK_EQ(s1.slice_retries, s0.slice_retries);
	CHECK_EQ(te_batch_wait_settled(A, bd, 1000), 0);
	CHECK_EQ(te_batch_free(A, bn), 0);
	CHECK_EQ(te_batch_free(A, bd), 0);
	works_again();
}

int main(void)
{
	find_controls();
	if (real_mode()) {
		fprintf(stderr, "skipped on a real device: needs the software layer's latency\n");
		return 0;
	}
	setup();
	TEST_RUN(test_deadline);
	TEST_RUN(test_unsettled_write);
	TEST_RUN(test_cancel);
	TEST_RUN(test_neighbour_survives);
	teardown();
	return check_done();
}
