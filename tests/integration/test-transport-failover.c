/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fail-over across transports (libte/failover.c): engines with two
 * transports, "holddl" (the test transport that holds transfers until the
 * test releases them, here with a path error: its peer unreachable) and
 * "memcpy" (the example transport, which reaches engines of this process).
 * A task its transport fails on a path error finishes over the other one;
 * new tasks follow for a while, then one probes the first transport again.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include <te/te.h>

#include "../common/check.h"
#include "../common/util.h"
#include "../plugins/hold.h"

#define BUF (64u << 10)

static int submit_one(te_engine *e, te_batch_id b, te_request *r)
{
	return te_submit(e, b, r, 1);
}

static int state_of(te_engine *e, te_batch_id b, size_t i, int *error)
{
	te_task_status st;
	CHECK_EQ(te_get_status(e, b, i, &st), 0);
	if (error != NULL)
		*error = st.error;
	return st.state;
}

static int has_metric(te_engine *e, const char *needle)
{
	char *text = NULL;
	size_t len = 0;
	REQUIRE(te_metrics_text(e, &text, &len) == 0);
	int r = strstr(text, needle) != NULL;
	if (!r)
		fprintf(stderr, "  (metrics lack %s)\n", needle);
	te_free(text);
	return r;
}

static void test_moves_and_comes_back(void)
{
	engine_pair p;
	te_batch_id b = engine_pair_batch(&p, "holddl,memcpy", BUF, 16);
	fill_pattern(p.abuf, BUF, 7);
	memset(p.bbuf, 0, BUF);
	te_request w = { TE_OP_WRITE, p.seg, p.abuf, (uintptr_t)p.bbuf, 4096 };

	/* Held by holddl, which then loses its path: finished by memcpy. */
	CHECK_EQ(submit_one(p.a, b, &w), 0);
	CHECK_EQ(hold_count(), 1);
	cap_start();
	CHECK_EQ(hold_release(-ENETUNREACH), 1);
	CHECK_EQ(te_batch_wait(p.a, b, 5000), 0);
	CHECK_EQ(state_of(p.a, b, 0, NULL), TE_TASK_COMPLETED);
	CHECK(memcmp(p.abuf, p.bbuf, 4096) == 0);
	CHECK(cap_has("its tasks go over memcpy"));
	te_set_log_handler(NULL, NULL);
	CHECK(has_metric(p.a, "transport=\"holddl\"} 1"));

	/* For a while new tasks go to memcpy straight away. */
	w.local = p.abuf + 4096;
	w.remote += 4096;
	CHECK_EQ(submit_one(p.a, b, &w), 0);
	CHECK_EQ(hold_count(), 0);
	CHECK_EQ(te_batch_wait(p.a, b, 5000), 0);
	CHECK_EQ(state_of(p.a, b, 1, NULL), TE_TASK_COMPLETED);

	/* Then one task probes holddl again: back on it once that completes. */
	usleep(150 * 1000);
	CHECK_EQ(submit_one(p.a, b, &w), 0);
	CHECK_EQ(hold_count(), 1);
	CHECK_EQ(submit_one(p.a, b, &w), 0); /* not the probe: memcpy */
	CHECK_EQ(hold_count(), 1);
	CHECK_EQ(hold_release(0), 1);
	CHECK_EQ(te_batch_wait(p.a, b, 5000), 0);
	CHECK_EQ(submit_one(p.a, b, &w), 0);
	CHECK_EQ(hold_count(), 1); /* recovered: holddl again */
	CHECK_EQ(hold_release(0), 1);
	CHECK_EQ(te_batch_wait(p.a, b, 5000), 0);
	for (size_t i = 2; i < 5; i++)
		CHECK_EQ(state_of(p.a, b, i, NULL), TE_TASK_COMPLETED);
	CHECK_EQ(te_batch_free(p.a, b), 0);
	engine_pair_down(&p);
}

/* Only path errors move a task, and only once; a task ended early stays
 * ended; a segment opened through a named transport has no alternate. */
static void test_what_does_not_move(void)
{
	engine_pair p;
	int err = 0;
	te_batch_id b = engine_pair_batch(&p, "holddl,memcpy", BUF, 16);
	te_request r = { TE_OP_READ, p.seg, p.abuf, (uintptr_t)p.bbuf, 4096 };

	CHECK_EQ(submit_one(p.a, b, &r), 0);
	CHECK_EQ(hold_release(TE_ERR_REJECTED), 1); /* the peer refused the range */
	CHECK_EQ(te_batch_wait(p.a, b, 5000), 0);
	CHECK_EQ(state_of(p.a, b, 0, &err), TE_TASK_FAILED);
	CHECK_EQ(err, TE_ERR_REJECTED);

	CHECK_EQ(te_submit_by(p.a, b, &r, 1, te_now_ns() + 20 * 1000000LL), 0);
	CHECK_EQ(te_batch_wait(p.a, b, 5000), 0); /* ended at its deadline */
	CHECK_EQ(hold_release(-ENETUNREACH), 1);  /* too late to move */
	CHECK_EQ(state_of(p.a, b, 1, &err), TE_TASK_FAILED);
	CHECK_EQ(err, -ETIMEDOUT);
	CHECK_EQ(te_batch_free(p.a, b), 0);

	CHECK_EQ(te_segment_close(p.a, p.seg), 0);
	te_segment_id forced = te_segment_open_with(p.a, te_engine_name(p.b), "holddl");
	CHECK(forced > 0);
	REQUIRE(te_batch_alloc(p.a, 4, &b) == 0);
	r.segment = forced;
	CHECK_EQ(submit_one(p.a, b, &r), 0);
	CHECK_EQ(hold_release(-ENETUNREACH), 1);
	CHECK_EQ(te_batch_wait(p.a, b, 5000), 0);
	CHECK_EQ(state_of(p.a, b, 0, &err), TE_TASK_FAILED);
	CHECK_EQ(err, -ENETUNREACH);
	CHECK_EQ(te_batch_free(p.a, b), 0);
	p.seg = forced; /* closed by engine_pair_down */
	engine_pair_down(&p);
}

int main(void)
{
	hold_find_named("holddl");
	TEST_RUN(test_moves_and_comes_back);
	TEST_RUN(test_what_does_not_move);
	return check_done();
}
