/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Prepared transfers (te_xfer_list_prepare, te_submit_prepared) between two
 * engines of this process: every byte checked over TCP, the same-host
 * transport and local copies, adjacent pairs merged into one task (counted
 * by the batch), refused arguments (an index out of range, another engine's
 * list, pieces of different lengths, pieces outside the memory), memory
 * unregistered and registered again under a list, a list whose segment
 * was closed and opened again, and threads posting the same lists while the
 * registry changes under them.
 */
#include <pthread.h>
#include <stdlib.h>

#include "../common/util.h"

#define BLOCK 4096u
#define BLOCKS 64u
#define POOL (BLOCK * BLOCKS)

typedef struct pools {
	engine_pair p;
	te_xfer_list *L, *R; /* a's pool and b's, as BLOCKS pieces of BLOCK bytes */
} pools;

static te_xfer_list *blocks_list(te_engine *e, te_segment_id seg, const void *base)
{
	te_piece pc[BLOCKS];
	te_xfer_list *l = NULL;
	for (unsigned i = 0; i < BLOCKS; i++)
		pc[i] = (te_piece){ (uintptr_t)base + (uint64_t)i * BLOCK, BLOCK };
	int rc = te_xfer_list_prepare(e, seg, pc, BLOCKS, 0, &l);
	if (rc != 0)
		fprintf(stderr, "prepare failed: %s\n", te_strerror(rc));
	return l;
}

static void pools_up(pools *s, const char *transports)
{
	engine_pair_up(&s->p, transports, POOL);
	s->L = blocks_list(s->p.a, TE_LOCAL_SEGMENT, s->p.abuf);
	s->R = blocks_list(s->p.a, s->p.seg, s->p.bbuf);
	REQUIRE(s->L != NULL && s->R != NULL);
	CHECK_EQ(te_xfer_list_count(s->L), BLOCKS);
}

static void pools_down(pools *s)
{
	te_xfer_list_free(s->L);
	te_xfer_list_free(s->R);
	engine_pair_down(&s->p);
}

/* Posts n pairs as one batch, waits, returns the number of tasks made and
 * checks they all completed. */
static size_t post_all(te_engine *e, uint32_t op, te_xfer_list *L, const uint32_t *li, te_xfer_list *R,
		       const uint32_t *ri, size_t n)
{
	te_batch_id b;
	size_t first = 99, tasks = 0, submitted = 0;
	int32_t state = -1;
	REQUIRE(te_batch_alloc(e, n, &b) == 0);
	CHECK_EQ(te_submit_prepared(e, b, op, L, li, R, ri, n, &first, &tasks), 0);
	CHECK_EQ(first, 0);
	CHECK_EQ(te_batch_wait(e, b, 20000), 0);
	CHECK_EQ(te_batch_status(e, b, &submitted, NULL, &state), 0);
	CHECK_EQ(submitted, tasks);
	CHECK_EQ(state, TE_TASK_COMPLETED);
	CHECK_EQ(te_batch_free(e, b), 0);
	return tasks;
}

/* Scattered pairs, then runs that merge, both directions; every byte. */
static void exercise(const char *transports, const char *want_tp)
{
	pools s;
	pools_up(&s, transports);
	if (want_tp != NULL)
		CHECK(strcmp(te_segment_transport(s.p.a, s.p.seg), want_tp) == 0);
	fill_pattern(s.p.bbuf, POOL, 11);
	fill_pattern(s.p.abuf, POOL, 12);

	/* READ block 7k mod 64 of b into block k of a: no two pairs continue
	 * one another, one task each. */
	uint32_t li[BLOCKS], ri[BLOCKS];
	for (unsigned k = 0; k < BLOCKS; k++) {
		li[k] = k;
		ri[k] = (7 * k) % BLOCKS;
	}
	CHECK_EQ(post_all(s.p.a, TE_OP_READ, s.L, li, s.R, ri, BLOCKS), BLOCKS);
	int bad = 0;
	for (unsigned k = 0; k < BLOCKS; k++)
		bad += memcmp(s.p.abuf + k * BLOCK, s.p.bbuf + ri[k] * BLOCK, BLOCK) != 0;
	CHECK_EQ(bad, 0);

	/* WRITE runs: blocks 10..19 → 30..39 (one run), 40 → 5, 41 → 6, 50 →
	 * 7 (41 continues 40; 50 does not continue 41 locally), 0 → 63:
	 * four tasks of thirteen pairs. */
	fill_pattern(s.p.abuf, POOL, 13);
	size_t n = 0;
	for (unsigned k = 0; k < 10; k++, n++) {
		li[n] = 10 + k;
		ri[n] = 30 + k;
	}
	li[n] = 40, ri[n++] = 5;
	li[n] = 41, ri[n++] = 6;
	li[n] = 50, ri[n++] = 7;
	li[n] = 0, ri[n++] = 63;
	CHECK_EQ(post_all(s.p.a, TE_OP_WRITE, s.L, li, s.R, ri, n), 4);
	bad = 0;
	for (size_t k = 0; k < n; k++)
		bad += memcmp(s.p.abuf + li[k] * BLOCK, s.p.bbuf + ri[k] * BLOCK, BLOCK) != 0;
	CHECK_EQ(bad, 0);

	/* NULL index arrays: the whole pool in one task. */
	fill_pattern(s.p.bbuf, POOL, 14);
	CHECK_EQ(post_all(s.p.a, TE_OP_READ, s.L, NULL, s.R, NULL, BLOCKS), 1);
	CHECK(memcmp(s.p.abuf, s.p.bbuf, POOL) == 0);
	pools_down(&s);
}

static void test_tcp(void)
{
	exercise("tcp", "tcp");
}

static void test_same_host(void)
{
	exercise("shm,tcp", "shm");
}

/* A TE_LOCAL_SEGMENT list on the remote side: copies within a. */
static void test_local_copies(void)
{
	te_engine *e = p2p_engine("tcp");
	REQUIRE(e != NULL);
	unsigned char *buf = aligned_alloc(4096, 2 * POOL);
	REQUIRE(buf != NULL);
	REQUIRE(te_register_memory(e, buf, 2 * POOL, "cpu:0", 0) == 0);
	fill_pattern(buf, 2 * POOL, 21);
	te_xfer_list *lo = blocks_list(e, TE_LOCAL_SEGMENT, buf), *hi = blocks_list(e, TE_LOCAL_SEGMENT, buf + POOL);
	REQUIRE(lo && hi);
	uint32_t li[BLOCKS], ri[BLOCKS];
	for (unsigned k = 0; k < BLOCKS; k++) {
		li[k] = k;
		ri[k] = BLOCKS - 1 - k;
	}
	CHECK_EQ(post_all(e, TE_OP_READ, lo, li, hi, ri, BLOCKS), BLOCKS);
	int bad = 0;
	for (unsigned k = 0; k < BLOCKS; k++)
		bad += memcmp(buf + k * BLOCK, buf + POOL + ri[k] * BLOCK, BLOCK) != 0;
	CHECK_EQ(bad, 0);
	te_xfer_list_free(lo);
	te_xfer_list_free(hi);
	CHECK_EQ(te_unregister_memory(e, buf), 0);
	te_engine_destroy(e);
	free(buf);
}

/* Refused posts append nothing and say why. */
static void test_refused(void)
{
	pools s;
	pools_up(&s, "tcp");
	te_batch_id b;
	size_t submitted = 1, first = 7, tasks = 7;
	REQUIRE(te_batch_alloc(s.p.a, 16, &b) == 0);
	uint32_t li[2] = { 0, 1 }, ri[2] = { 0, BLOCKS };
	cap_start();
	CHECK_EQ(te_submit_prepared(s.p.a, b, TE_OP_READ, s.L, li, s.R, ri, 2, &first, &tasks), -EINVAL);
	CHECK(cap_has("pair 1: remote index 64 outside the list's 64 pieces"));
	CHECK_EQ(tasks, 0);
	ri[1] = 1;
	li[0] = UINT32_MAX;
	CHECK_EQ(te_submit_prepared(s.p.a, b, TE_OP_READ, s.L, li, s.R, ri, 2, NULL, NULL), -EINVAL);
	CHECK(cap_has("pair 0: local index 4294967295"));
	li[0] = 0;
	CHECK_EQ(te_submit_prepared(s.p.a, b, 7, s.L, li, s.R, ri, 2, NULL, NULL), -EINVAL);
	CHECK(cap_has("unknown opcode 7"));
	/* the remote list as the local side */
	CHECK_EQ(te_submit_prepared(s.p.a, b, TE_OP_READ, s.R, li, s.R, ri, 2, NULL, NULL), -EINVAL);
	CHECK(cap_has("not of local memory"));
	/* more tasks than the batch holds (17 pairs that do not merge; 64
	 * that do make one task and fit) */
	uint32_t scattered[17];
	for (unsigned k = 0; k < 17; k++)
		scattered[k] = (7 * k) % BLOCKS;
	CHECK_EQ(te_submit_prepared(s.p.a, b, TE_OP_READ, s.L, NULL, s.R, scattered, 17, NULL, NULL),
		 TE_ERR_BATCH_FULL);

	/* Lists of another engine (b's own pool as b's local list). */
	te_xfer_list *other = blocks_list(s.p.b, TE_LOCAL_SEGMENT, s.p.bbuf);
	REQUIRE(other != NULL);
	CHECK_EQ(te_submit_prepared(s.p.a, b, TE_OP_READ, other, li, s.R, ri, 2, NULL, NULL), -EINVAL);
	CHECK(cap_has("the local list was prepared on another engine"));
	CHECK_EQ(te_submit_prepared(s.p.b, b, TE_OP_READ, other, li, s.R, ri, 2, NULL, NULL), -EINVAL);
	CHECK(cap_has("the remote list was prepared on another engine"));
	te_xfer_list_free(other);

	/* Pieces of different lengths. */
	te_piece half = { (uintptr_t)s.p.abuf, BLOCK / 2 };
	te_xfer_list *h = NULL;
	REQUIRE(te_xfer_list_prepare(s.p.a, TE_LOCAL_SEGMENT, &half, 1, 0, &h) == 0);
	CHECK_EQ(te_submit_prepared(s.p.a, b, TE_OP_READ, h, NULL, s.R, NULL, 1, NULL, NULL), -EINVAL);
	CHECK(cap_has("local piece 0 has 2048 bytes, remote piece 0 4096"));
	te_xfer_list_free(h);
	CHECK_EQ(te_batch_status(s.p.a, b, &submitted, NULL, NULL), 0);
	CHECK_EQ(submitted, 0);
	CHECK_EQ(te_batch_free(s.p.a, b), 0);

	/* A canceled batch's tasks end CANCELED at once. */
	REQUIRE(te_batch_alloc(s.p.a, 16, &b) == 0);
	CHECK_EQ(te_batch_cancel(s.p.a, b), 0);
	CHECK_EQ(te_submit_prepared(s.p.a, b, TE_OP_READ, s.L, NULL, s.R, scattered, 3, NULL, &tasks), 0);
	CHECK_EQ(tasks, 3);
	CHECK_EQ(te_batch_wait(s.p.a, b, 5000), 0);
	int32_t bstate = -1;
	CHECK_EQ(te_batch_status(s.p.a, b, NULL, NULL, &bstate), 0);
	CHECK_EQ(bstate, TE_TASK_CANCELED);
	CHECK_EQ(te_batch_free(s.p.a, b), 0);

	/* Prepare's own checks. */
	te_xfer_list *l = (te_xfer_list *)&b;
	te_piece out = { (uintptr_t)s.p.abuf + POOL - 8, 16 };
	CHECK_EQ(te_xfer_list_prepare(s.p.a, TE_LOCAL_SEGMENT, &out, 1, 0, &l), TE_ERR_ADDRESS);
	CHECK(l == NULL);
	CHECK(cap_has("piece 0 (0x"));
	out.addr = (uintptr_t)s.p.bbuf + POOL - 8;
	CHECK_EQ(te_xfer_list_prepare(s.p.a, s.p.seg, &out, 1, 0, &l), TE_ERR_ADDRESS);
	CHECK(cap_has("outside the segment's buffers"));
	te_piece empty = { (uintptr_t)s.p.abuf, 0 };
	CHECK_EQ(te_xfer_list_prepare(s.p.a, TE_LOCAL_SEGMENT, &empty, 1, 0, &l), -EINVAL);
	CHECK(cap_has("is empty"));
	CHECK_EQ(te_xfer_list_prepare(s.p.a, TE_LOCAL_SEGMENT, &half, 1, 4, &l), -EINVAL);
	CHECK_EQ(te_xfer_list_prepare(s.p.a, TE_LOCAL_SEGMENT, &half, 0, 0, &l), -EINVAL);
	CHECK_EQ(te_xfer_list_prepare(s.p.a, 999, &half, 1, 0, &l), TE_ERR_SEGMENT);
	CHECK_EQ(te_xfer_list_count(NULL), -EINVAL);
	te_set_log_handler(NULL, NULL);
	pools_down(&s);
}

/* Memory unregistered under a list: its pieces' transfers become INVALID
 * (the rest move), and work again once registered again. */
static void test_unregistered(void)
{
	pools s;
	engine_pair_up(&s.p, "tcp", POOL);
	/* a's pool as two regions: the second half registered on its own */
	unsigned char *extra = aligned_alloc(4096, POOL);
	REQUIRE(extra != NULL);
	REQUIRE(te_register_memory(s.p.a, extra, POOL, "cpu:0", 0) == 0);
	s.L = blocks_list(s.p.a, TE_LOCAL_SEGMENT, extra);
	s.R = blocks_list(s.p.a, s.p.seg, s.p.bbuf);
	REQUIRE(s.L && s.R);
	fill_pattern(s.p.bbuf, POOL, 31);
	CHECK_EQ(post_all(s.p.a, TE_OP_READ, s.L, NULL, s.R, NULL, 4), 1);
	CHECK(memcmp(extra, s.p.bbuf, 4 * BLOCK) == 0);

	CHECK_EQ(te_unregister_memory(s.p.a, extra), 0);
	te_batch_id b;
	size_t tasks = 0;
	REQUIRE(te_batch_alloc(s.p.a, 8, &b) == 0);
	cap_start();
	CHECK_EQ(te_submit_prepared(s.p.a, b, TE_OP_READ, s.L, NULL, s.R, NULL, 4, NULL, &tasks), 4);
	CHECK_EQ(tasks, 4); /* no merging across pieces no longer resolved */
	CHECK(cap_has("is no longer inside registered memory"));
	te_set_log_handler(NULL, NULL);
	CHECK_EQ(te_batch_wait(s.p.a, b, 5000), 0);
	te_task_status st;
	CHECK_EQ(te_get_status(s.p.a, b, 0, &st), 0);
	CHECK_EQ(st.state, TE_TASK_INVALID);
	CHECK_EQ(st.error, TE_ERR_ADDRESS);
	CHECK_EQ(te_batch_free(s.p.a, b), 0);

	/* registered again (elsewhere too: the list follows the registry) */
	REQUIRE(te_register_memory(s.p.a, extra, POOL, "cpu:0", 0) == 0);
	memset(extra, 0, POOL);
	CHECK_EQ(post_all(s.p.a, TE_OP_READ, s.L, NULL, s.R, NULL, BLOCKS), 1);
	CHECK(memcmp(extra, s.p.bbuf, POOL) == 0);

	/* The peer unregisters: once a's descriptor of it is fetched again,
	 * the remote pieces are refused at submit. */
	CHECK_EQ(te_unregister_memory(s.p.b, s.p.bbuf), 0);
	CHECK_EQ(te_segment_refresh(s.p.a, s.p.seg), 0);
	REQUIRE(te_batch_alloc(s.p.a, 8, &b) == 0);
	CHECK_EQ(te_submit_prepared(s.p.a, b, TE_OP_WRITE, s.L, NULL, s.R, NULL, 2, NULL, &tasks), 2);
	CHECK_EQ(te_batch_wait(s.p.a, b, 5000), 0);
	CHECK_EQ(te_get_status(s.p.a, b, 1, &st), 0);
	CHECK_EQ(st.state, TE_TASK_INVALID);
	CHECK_EQ(te_batch_free(s.p.a, b), 0);
	REQUIRE(te_register_memory(s.p.b, s.p.bbuf, POOL, "*", TE_MEM_REMOTE_ACCESS) == 0);
	CHECK_EQ(te_segment_refresh(s.p.a, s.p.seg), 0);
	fill_pattern(extra, POOL, 32);
	CHECK_EQ(post_all(s.p.a, TE_OP_WRITE, s.L, NULL, s.R, NULL, BLOCKS), 1);
	CHECK(memcmp(extra, s.p.bbuf, POOL) == 0);

	pools_down(&s);
	free(extra);
}

/* Once its segment is closed a list is refused, even with the name open
 * again; a list prepared again works. */
static void test_segment_closed(void)
{
	pools s;
	pools_up(&s, "tcp");
	te_segment_id again = te_segment_open(s.p.a, te_engine_name(s.p.b));
	CHECK_EQ(again, s.p.seg); /* a second open of the same segment */
	CHECK_EQ(te_segment_close(s.p.a, again), 0);
	CHECK_EQ(post_all(s.p.a, TE_OP_READ, s.L, NULL, s.R, NULL, 2), 1);

	CHECK_EQ(te_segment_close(s.p.a, s.p.seg), 0);
	te_batch_id b;
	REQUIRE(te_batch_alloc(s.p.a, 8, &b) == 0);
	cap_start();
	CHECK_EQ(te_submit_prepared(s.p.a, b, TE_OP_READ, s.L, NULL, s.R, NULL, 2, NULL, NULL), TE_ERR_SEGMENT);
	CHECK(cap_has("was closed; prepare it again"));
	s.p.seg = te_segment_open(s.p.a, te_engine_name(s.p.b));
	REQUIRE(s.p.seg > 0);
	CHECK_EQ(te_submit_prepared(s.p.a, b, TE_OP_READ, s.L, NULL, s.R, NULL, 2, NULL, NULL), TE_ERR_SEGMENT);
	te_set_log_handler(NULL, NULL);
	size_t submitted = 1;
	CHECK_EQ(te_batch_status(s.p.a, b, &submitted, NULL, NULL), 0);
	CHECK_EQ(submitted, 0);
	CHECK_EQ(te_batch_free(s.p.a, b), 0);
	te_xfer_list_free(s.R);
	s.R = blocks_list(s.p.a, s.p.seg, s.p.bbuf);
	REQUIRE(s.R != NULL);
	fill_pattern(s.p.bbuf, POOL, 41);
	CHECK_EQ(post_all(s.p.a, TE_OP_READ, s.L, NULL, s.R, NULL, BLOCKS), 1);
	CHECK(memcmp(s.p.abuf, s.p.bbuf, POOL) == 0);
	pools_down(&s);
}

typedef struct poster {
	pools *s;
	unsigned seed;
	int failed;
} poster;

/* Reads blocks of b into a's pool in a scattered order, again and again. */
static void *post_loop(void *arg)
{
	poster *p = arg;
	uint32_t li[8], ri[8];
	for (int round = 0; round < 40; round++) {
		for (unsigned k = 0; k < 8; k++) {
			li[k] = (p->seed * 8 + k) % BLOCKS;
			ri[k] = (li[k] * 5 + (unsigned)round) % BLOCKS;
		}
		te_batch_id b;
		size_t tasks = 0;
		if (te_batch_alloc(p->s->p.a, 8, &b) != 0) {
			p->failed++;
			continue;
		}
		if (te_submit_prepared(p->s->p.a, b, TE_OP_READ, p->s->L, li, p->s->R, ri, 8, NULL, &tasks) != 0 ||
		    tasks != 8 || te_batch_wait(p->s->p.a, b, 20000) != 0)
			p->failed++;
		int32_t state = -1;
		te_batch_status(p->s->p.a, b, NULL, NULL, &state);
		p->failed += state != TE_TASK_COMPLETED;
		p->failed += te_batch_free(p->s->p.a, b) != 0;
		for (unsigned k = 0; k < 8; k++)
			p->failed += memcmp(p->s->p.abuf + li[k] * BLOCK, p->s->p.bbuf + ri[k] * BLOCK, BLOCK) != 0;
	}
	return NULL;
}

/* Threads posting the same lists while other memory comes and goes (each
 * change has the lists resolved again under their posts). */
static void test_threads(void)
{
	pools s;
	pools_up(&s, "tcp");
	fill_pattern(s.p.bbuf, POOL, 51);
	poster ps[3] = { { &s, 0, 0 }, { &s, 3, 0 }, { &s, 6, 0 } };
	pthread_t th[3];
	for (int i = 0; i < 3; i++)
		REQUIRE(pthread_create(&th[i], NULL, post_loop, &ps[i]) == 0);
	static unsigned char other[4096];
	for (int i = 0; i < 30; i++) {
		CHECK_EQ(te_register_memory(s.p.a, other, sizeof other, "cpu:0", 0), 0);
		CHECK_EQ(te_unregister_memory(s.p.a, other), 0);
	}
	for (int i = 0; i < 3; i++) {
		pthread_join(th[i], NULL);
		CHECK_EQ(ps[i].failed, 0);
	}
	pools_down(&s);
}

int main(void)
{
	te_set_log_level(TE_LOG_WARN); /* the checked lines are warnings and errors */
	TEST_RUN(test_tcp);
	TEST_RUN(test_same_host);
	TEST_RUN(test_local_copies);
	TEST_RUN(test_refused);
	TEST_RUN(test_unregistered);
	TEST_RUN(test_segment_closed);
	TEST_RUN(test_threads);
	return check_done();
}
