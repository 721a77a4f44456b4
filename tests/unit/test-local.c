/* SPDX-License-Identifier: Apache-2.0 */
/* Transfers within one engine's own segment (memcpy, large ones split over
 * the copy workers): data checked byte for byte, surroundings untouched,
 * statuses and counters right, many threads at once. */
#include <stdlib.h>

#include "../common/util.h"

#define SRC_SIZE (72u << 20)
#define GUARD 64

static te_engine *e;
static unsigned char *src, *dst;

static void setup(void)
{
	e = p2p_engine(NULL);
	REQUIRE(e != NULL);
	src = aligned_alloc(4096, SRC_SIZE);
	dst = aligned_alloc(4096, SRC_SIZE);
	REQUIRE(src && dst);
	te_memory_region rs[] = { { src, SRC_SIZE, "cpu:0", 0 }, { dst, SRC_SIZE, "*", TE_MEM_REMOTE_ACCESS } };
	REQUIRE(te_register_memory_batch(e, rs, 2) == 0);
}

static void test_sizes(void)
{
	size_t sizes[] = { 1, 2, 63, 4096, 4097, 65536, (1u << 20) + 3, (4u << 20) - 1, 4u << 20,
			   (5u << 20) + 11, 64u << 20 };
	te_task_status st = { 0 };
	fill_pattern(src, SRC_SIZE, 1);
	for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
		size_t n = sizes[i], so = (i * 13) % 41, doff = GUARD + (i * 7) % 29;
		memset(dst, 0xEE, n + doff + GUARD);
		CHECK_EQ(run_one(e, TE_OP_WRITE, TE_LOCAL_SEGMENT, src + so, (uintptr_t)(dst + doff), n, &st),
			 TE_TASK_COMPLETED);
		CHECK_EQ(st.transferred, n);
		CHECK(memcmp(src + so, dst + doff, n) == 0);
		int guard_ok = 1;
		for (size_t g = 0; g < doff; g++)
			guard_ok &= dst[g] == 0xEE;
		for (size_t g = 0; g < GUARD; g++)
			guard_ok &= dst[doff + n + g] == 0xEE;
		CHECK(guard_ok);
		/* READ brings it back the other way */
		memset(src + so, 0, n);
		CHECK_EQ(run_one(e, TE_OP_READ, TE_LOCAL_SEGMENT, src + so, (uintptr_t)(dst + doff), n, &st),
			 TE_TASK_COMPLETED);
		CHECK(memcmp(src + so, dst + doff, n) == 0);
		fill_pattern(src, SRC_SIZE, 1);
	}
}

static void test_batch_many(void)
{
	enum { N = 1000 };
	te_request reqs[N];
	te_batch_id b;
	fill_pattern(src, SRC_SIZE, 7);
	memset(dst, 0, 8u << 20);
	for (int i = 0; i < N; i++)
		reqs[i] = (te_request){ TE_OP_WRITE, TE_LOCAL_SEGMENT, src + i * 4096 + (i % 3),
					(uintptr_t)(dst + (N - 1 - i) * 4100), 4096 - (i % 3) };
	REQUIRE(te_batch_alloc(e, N, &b) == 0);
	CHECK_EQ(te_submit(e, b, reqs, 400), 0);
	CHECK_EQ(te_submit(e, b, reqs + 400, 600), 0);
	CHECK_EQ(te_submit(e, b, reqs, 1), TE_ERR_BATCH_FULL);
	CHECK_EQ(te_batch_wait(e, b, -1), 0);
	size_t sub = 0, infl = 9;
	int32_t state = -1;
	CHECK_EQ(te_batch_status(e, b, &sub, &infl, &state), 0);
	CHECK_EQ(sub, N);
	CHECK_EQ(infl, 0);
	CHECK_EQ(state, TE_TASK_COMPLETED);
	int bad = 0;
	for (int i = 0; i < N; i++) {
		te_task_status st = { 0 };
		te_get_status(e, b, (size_t)i, &st);
		bad += st.state != TE_TASK_COMPLETED || st.transferred != reqs[i].length;
		bad += memcmp(reqs[i].local, (void *)(uintptr_t)reqs[i].remote, reqs[i].length) != 0;
	}
	CHECK_EQ(bad, 0);
	CHECK_EQ(te_batch_free(e, b), 0);
}

/* A canceled batch: the big copy either finished or ended CANCELED, and
 * nothing hangs. */
static void test_cancel_local(void)
{
	te_batch_id b;
	te_request r = { TE_OP_WRITE, TE_LOCAL_SEGMENT, src, (uintptr_t)dst, 64u << 20 };
	REQUIRE(te_batch_alloc(e, 2, &b) == 0);
	CHECK_EQ(te_batch_cancel(e, b), 0);
	CHECK_EQ(te_submit(e, b, &r, 1), 0);
	CHECK_EQ(te_batch_wait(e, b, 10000), 0);
	te_task_status st;
	CHECK_EQ(te_get_status(e, b, 0, &st), 0);
	CHECK_EQ(st.state, TE_TASK_CANCELED);
	CHECK_EQ(st.error, -ECANCELED);
	CHECK_EQ(te_batch_free(e, b), 0);
}

typedef struct worker {
	int id;
	int bad;
} worker;

static void *thread_main(void *arg)
{
	worker *w = arg;
	/* each thread owns a 4 MiB window of both buffers */
	unsigned char *s = src + (size_t)w->id * (4u << 20), *d = dst + (size_t)w->id * (4u << 20);
	for (int round = 0; round < 50; round++) {
		te_batch_id b;
		te_request reqs[16];
		size_t len = 1024 + (size_t)round * 512;
		fill_pattern(s, 16 * len, (unsigned)(w->id * 100 + round));
		for (int i = 0; i < 16; i++)
			reqs[i] = (te_request){ TE_OP_WRITE, TE_LOCAL_SEGMENT, s + i * len, (uintptr_t)(d + i * len), len };
		if (te_batch_alloc(e, 16, &b) != 0 || te_submit(e, b, reqs, 16) != 0 ||
		    te_batch_wait(e, b, 10000) != 0) {
			w->bad++;
			continue;
		}
		w->bad += memcmp(s, d, 16 * len) != 0;
		w->bad += te_batch_free(e, b) != 0;
	}
	return NULL;
}

static void test_threads(void)
{
	enum { T = 8 };
	pthread_t th[T];
	worker w[T];
	for (int i = 0; i < T; i++) {
		w[i] = (worker){ i, 0 };
		pthread_create(&th[i], NULL, thread_main, &w[i]);
	}
	int bad = 0;
	for (int i = 0; i < T; i++) {
		pthread_join(th[i], NULL);
		bad += w[i].bad;
	}
	CHECK_EQ(bad, 0);
}

int main(void)
{
	setup();
	TEST_RUN(test_sizes);
	TEST_RUN(test_batch_many);
	TEST_RUN(test_cancel_local);
	TEST_RUN(test_threads);
	void *both[] = { src, dst };
	CHECK_EQ(te_unregister_memory_batch(e, both, 2), 0);
	te_engine_destroy(e);
	free(src);
	free(dst);
	return check_done();
}
