/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The endpoint pool. Engine A has one NIC and a pool capped at 2 endpoints;
 * five peers each have one NIC. Transfers to all of them succeed, and the
 * endpoints A evicts follow SIEVE's order for the access sequence
 *   P1 P2 P2 P1 P3 P4 P3 P5
 * which differs from both FIFO's and LRU's:
 *   - at P3 the pool holds P2, P1 (both visited): the hand, starting at the
 *     oldest (P1), clears P1 and P2 and wraps to P1, which it evicts (LRU
 *     would evict P2);
 *   - at P4 the hand is at P2 (not visited since): P2 goes;
 *   - P3 is visited again, so at P5 the hand clears P3 and evicts P4 (FIFO
 *     would evict P3, the older).
 * So SIEVE evicts P1, P2, P4; FIFO (TE_RDMA_ENDPOINT_STORE_TYPE=FIFO) evicts
 * P1, P2, P3. A peer whose endpoint was evicted replaces its own side when A
 * connects again. Idle endpoints are reclaimed after TE_RDMA_EP_IDLE_MS.
 */
#include "rdma-util.h"

#define NPEER 5
#define LEN (64u << 10)

static te_engine *peer[NPEER];
static unsigned char *pbuf[NPEER];

static void peers_up(void)
{
	for (int i = 0; i < NPEER; i++) {
		peer[i] = soft_engine("two-socket", "{\"devices\": [\"mlx5_2\"]}");
		REQUIRE(peer[i] != NULL);
		pbuf[i] = buf_new(LEN);
		REQUIRE(te_register_memory(peer[i], pbuf[i], LEN, "cpu:1", TE_MEM_REMOTE_ACCESS) == 0);
	}
}

static void peers_down(void)
{
	for (int i = 0; i < NPEER; i++) {
		te_engine_destroy(peer[i]);
		free(pbuf[i]);
	}
}

typedef struct client {
	te_engine *e;
	unsigned char *buf;
	te_segment_id seg[NPEER];
} client;

static void client_up(client *c, const char *const *opts)
{
	c->e = soft_engine_v("two-socket", "{\"devices\": [\"mlx5_0\"]}", opts);
	REQUIRE(c->e != NULL);
	c->buf = buf_new(LEN);
	REQUIRE(te_register_memory(c->e, c->buf, LEN, "cpu:0", 0) == 0);
	for (int i = 0; i < NPEER; i++) {
		c->seg[i] = te_segment_open(c->e, te_engine_name(peer[i]));
		REQUIRE(c->seg[i] > 0);
	}
}

static void client_down(client *c)
{
	te_engine_destroy(c->e);
	free(c->buf);
}

/* One access: a WRITE to peer `i` (1-based), verified. */
static void access_peer(client *c, int i, unsigned seed)
{
	te_task_status st;
	fill_pattern(c->buf, LEN, seed);
	CHECK_EQ(run_one(c->e, TE_OP_WRITE, c->seg[i - 1], c->buf, (uintptr_t)pbuf[i - 1], LEN, &st),
		 TE_TASK_COMPLETED);
	CHECK(memcmp(c->buf, pbuf[i - 1], LEN) == 0);
}

/* Which peer (1-based) an evicted NIC path names. */
static int peer_of(const char *path)
{
	for (int i = 0; i < NPEER; i++) {
		char want[160];
		snprintf(want, sizeof want, "%s@%s", te_engine_name(peer[i]), dev_name("mlx5_2"));
		if (strcmp(path, want) == 0)
			return i + 1;
	}
	return -1;
}

static void run_sequence(client *c, const int *want, int nwant)
{
	static const int seq[] = { 1, 2, 2, 1, 3, 4, 3, 5 };
	te_rdma_stats st;

	for (size_t k = 0; k < sizeof seq / sizeof *seq; k++)
		access_peer(c, seq[k], (unsigned)k);
	REQUIRE(stats_of(c->e, &st) == 0);
	CHECK_EQ(st.endpoints[0], 2);
	CHECK_EQ(st.endpoints_evicted, (uint64_t)nwant);
	CHECK_EQ(st.n_evicted, (unsigned)nwant);
	for (int k = 0; k < nwant && k < (int)st.n_evicted; k++) {
		int got = peer_of(st.evicted[k]);
		CHECK_EQ(got, want[k]);
		if (got != want[k])
			fprintf(stderr, "  eviction %d: P%d, expected P%d\n", k, got, want[k]);
	}
	/* one handshake per miss: P1, P2, P3, P4, P5 (the other accesses hit) */
	CHECK_EQ(st.endpoints_created, 5);
}

static void test_sieve(void)
{
	const char *opts[] = { "TE_RDMA_MAX_EP_PER_CTX", "2", NULL };
	client c;
	te_rdma_stats ps;
	static const int want[] = { 1, 2, 4 };

	client_up(&c, opts);
	run_sequence(&c, want, 3);

	/* P1 was evicted; A connects again and P1 replaces its stale side
	 * rather than adding a second endpoint. */
	access_peer(&c, 1, 77);
	REQUIRE(stats_of(peer[0], &ps) == 0);
	CHECK_EQ(ps.endpoints_created, 2);
	CHECK_EQ(ps.endpoints[0], 1);

	/* Many more transfers to all five, in batches across peers: they all
	 * succeed with the pool never above its cap. */
	enum { N = 40 };
	te_request r[N];
	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < N; i++)
			r[i] = (te_request){ TE_OP_WRITE, c.seg[i % NPEER], c.buf + (size_t)(i / NPEER) * 4096,
					     (uintptr_t)(pbuf[i % NPEER] + (size_t)(i / NPEER) * 4096), 4096 };
		fill_pattern(c.buf, LEN, (unsigned)round + 50);
		batch_complete(c.e, r, N, 30000);
		for (int i = 0; i < NPEER; i++)
			CHECK(memcmp(c.buf, pbuf[i], (N / NPEER) * 4096) == 0);
		/* Endpoints connecting at once may briefly exceed the cap;
		 * idle ones are evicted back under it. */
		te_rdma_stats st;
		CHECK(WAIT_FOR(stats_of(c.e, &st) == 0 && st.endpoints[0] <= 2, 2000));
	}
	client_down(&c);
}

static void test_fifo(void)
{
	const char *opts[] = { "TE_RDMA_MAX_EP_PER_CTX", "2", "TE_RDMA_ENDPOINT_STORE_TYPE", "FIFO", NULL };
	static const int want[] = { 1, 2, 3 };
	client c;

	client_up(&c, opts);
	run_sequence(&c, want, 3);
	client_down(&c);
}

static void test_idle_reclaim(void)
{
	const char *opts[] = { "TE_RDMA_EP_IDLE_MS", "400", "TE_RDMA_RECLAIM_INTERVAL_MS", "20", NULL };
	client c;
	te_rdma_stats st;

	client_up(&c, opts);
	access_peer(&c, 1, 1);
	access_peer(&c, 2, 2);
	REQUIRE(stats_of(c.e, &st) == 0);
	CHECK_EQ(st.endpoints[0], 2);
	/* Busy endpoints stay: keep P1 in use for longer than the idle time. */
	long long end = now_ms() + 1000;
	while (now_ms() < end) {
		access_peer(&c, 1, 3);
		usleep(20000);
	}
	REQUIRE(stats_of(c.e, &st) == 0);
	CHECK_EQ(st.endpoints[0], 1);
	CHECK_EQ(st.endpoints_reclaimed, 1);
	CHECK(WAIT_FOR(stats_of(c.e, &st) == 0 && st.endpoints[0] == 0, 3000));
	CHECK_EQ(st.endpoints_reclaimed, 2);
	/* and rebuilt on the next use */
	access_peer(&c, 2, 4);
	REQUIRE(stats_of(c.e, &st) == 0);
	CHECK_EQ(st.endpoints[0], 1);
	CHECK_EQ(st.endpoints_created, 3);
	client_down(&c);
}

int main(void)
{
	find_controls();
	peers_up();
	TEST_RUN(test_sieve);
	TEST_RUN(test_fifo);
	TEST_RUN(test_idle_reclaim);
	peers_down();
	return check_done();
}
