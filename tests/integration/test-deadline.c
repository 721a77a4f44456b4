/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Deadlines and early ends in the host (libte/deadline.c), through the
 * "holddl" test transport, which honours deadlines but holds every transfer
 * until the test releases it (a peer that stopped answering), and "hold",
 * which does not honour them.
 */
#include <errno.h>
#include <string.h>

#include <te/te.h>

#include "../common/check.h"
#include "../common/util.h"
#include "../plugins/hold.h"

#define BUF (64u << 10)

/* How much later than its deadline a task may end: 20 ms, as promised;
 * more where a sanitizer slows every thread down. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SLACK_MS 120
#else
#define SLACK_MS 20
#endif

static int64_t ms_since(int64_t t0)
{
	return (te_now_ns() - t0) / 1000000;
}

static te_task_info info_of(te_engine *e, te_batch_id b, size_t i)
{
	te_task_info ti = { .size = sizeof ti };
	CHECK_EQ(te_get_task_info(e, b, i, &ti), 0);
	return ti;
}

/* A READ and a WRITE to a peer that never answers end at their deadline;
 * the bytes that come after do not move; the WRITE is unsettled until its
 * transport lets go. */
static void test_deadline_ends_tasks(void)
{
	engine_pair p;
	te_batch_id b;
	engine_pair_up(&p, "holddl", BUF);
	memset(p.abuf, 1, BUF);
	memset(p.bbuf, 2, BUF);
	te_request r[2] = {
		{ TE_OP_READ, p.seg, p.abuf, (uintptr_t)p.bbuf, 4096 },
		{ TE_OP_WRITE, p.seg, p.abuf + 8192, (uintptr_t)p.bbuf + 8192, 4096 },
	};
	REQUIRE(te_batch_alloc(p.a, 8, &b) == 0);
	size_t expired0 = hold_expired();
	int64_t t0 = te_now_ns();
	CHECK_EQ(te_submit_by(p.a, b, r, 2, t0 + 100 * 1000000LL), 0);
	CHECK_EQ(hold_count(), 2);
	CHECK_EQ(te_batch_wait(p.a, b, 5000), 0);
	int64_t took = ms_since(t0);
	CHECK(took >= 99 && took <= 100 + SLACK_MS);
	te_task_info ti = info_of(p.a, b, 0);
	CHECK_EQ(ti.state, TE_TASK_FAILED);
	CHECK_EQ(ti.error, -ETIMEDOUT);
	CHECK_EQ(ti.flags, TE_TASK_ENDED_EARLY); /* a READ is settled */
	CHECK_EQ(ti.deadline_ns, t0 + 100 * 1000000LL);
	ti = info_of(p.a, b, 1);
	CHECK_EQ(ti.state, TE_TASK_FAILED);
	CHECK_EQ(ti.flags, TE_TASK_ENDED_EARLY | TE_TASK_UNSETTLED);
	CHECK_EQ(hold_expired() - expired0, 2);
	te_task_status st;
	CHECK_EQ(te_get_status(p.a, b, 1, &st), 0);
	CHECK_EQ(st.state, TE_TASK_FAILED);
	CHECK_EQ(st.error, -ETIMEDOUT);
	CHECK_EQ(te_batch_wait_settled(p.a, b, 50), -ETIMEDOUT);

	/* The peer answers now: nothing moves, the WRITE settles. */
	CHECK_EQ(hold_release(0), 2);
	CHECK(p.abuf[0] == 1 && p.abuf[4095] == 1);   /* the READ's buffer untouched */
	CHECK(p.bbuf[8192] == 2 && p.bbuf[12287] == 2); /* the WRITE's bytes never left */
	CHECK_EQ(te_batch_wait_settled(p.a, b, 1000), 0);
	ti = info_of(p.a, b, 1);
	CHECK_EQ(ti.flags, TE_TASK_ENDED_EARLY);
	CHECK_EQ(ti.error, -ETIMEDOUT); /* the first end stays */
	CHECK_EQ(ti.transferred, 0);
	CHECK_EQ(te_batch_free(p.a, b), 0);
	engine_pair_down(&p);
}

/* The batch is freed while its transport still holds an expired task; the
 * transport's late completion touches only memory the host kept. A WRITE
 * whose transport gave up (-ETIMEDOUT) stays unsettled. */
static void test_free_and_give_up(void)
{
	engine_pair p;
	te_batch_id b = engine_pair_batch(&p, "holddl", BUF, 4), b2;
	te_request w = { TE_OP_WRITE, p.seg, p.abuf, (uintptr_t)p.bbuf, 4096 };
	REQUIRE(te_batch_alloc(p.a, 4, &b2) == 0);
	CHECK_EQ(te_batch_set_deadline(p.a, b, te_now_ns() + 30 * 1000000LL), 0);
	CHECK_EQ(te_submit(p.a, b, &w, 1), 0);
	CHECK_EQ(te_submit_by(p.a, b2, &w, 1, te_now_ns() + 30 * 1000000LL), 0);
	CHECK_EQ(te_batch_wait(p.a, b, 5000), 0);
	CHECK_EQ(te_batch_wait(p.a, b2, 5000), 0);
	CHECK_EQ(te_batch_free(p.a, b), 0); /* not in flight any more */
	CHECK_EQ(hold_release(-ETIMEDOUT), 2);
	/* ASan: the release above touched the freed batch's kept memory only */
	te_task_info ti = info_of(p.a, b2, 0);
	CHECK_EQ(ti.state, TE_TASK_FAILED);
	CHECK_EQ(ti.flags, TE_TASK_ENDED_EARLY | TE_TASK_UNSETTLED);
	CHECK_EQ(te_batch_wait_settled(p.a, b2, 20), -ETIMEDOUT);
	CHECK_EQ(te_batch_free(p.a, b2), 0);
	engine_pair_down(&p);
}

/* A cancel ends the tasks in flight at once; a deadline already passed ends
 * them at once too; tasks that completed before are left alone. */
static void test_cancel_and_past(void)
{
	engine_pair p;
	te_batch_id b = engine_pair_batch(&p, "holddl", BUF, 8);
	te_request r = { TE_OP_READ, p.seg, p.abuf, (uintptr_t)p.bbuf, 4096 };
	CHECK_EQ(te_submit(p.a, b, &r, 1), 0);
	CHECK_EQ(hold_release(0), 1); /* task 0 completes */
	CHECK_EQ(te_submit(p.a, b, &r, 1), 0);
	int64_t t0 = te_now_ns();
	CHECK_EQ(te_batch_cancel(p.a, b), 0);
	CHECK_EQ(te_batch_wait(p.a, b, 0), 0); /* ended within the call */
	CHECK(ms_since(t0) < SLACK_MS);
	te_task_info ti = info_of(p.a, b, 1);
	CHECK_EQ(ti.state, TE_TASK_CANCELED);
	CHECK_EQ(ti.error, -ECANCELED);
	CHECK_EQ(ti.flags, TE_TASK_ENDED_EARLY);
	ti = info_of(p.a, b, 0);
	CHECK_EQ(ti.state, TE_TASK_COMPLETED);
	CHECK_EQ(ti.flags, 0);
	CHECK_EQ(hold_release(0), 1);
	CHECK_EQ(te_batch_free(p.a, b), 0);

	REQUIRE(te_batch_alloc(p.a, 8, &b) == 0);
	t0 = te_now_ns();
	CHECK_EQ(te_submit_by(p.a, b, &r, 1, 1), 0); /* long past */
	CHECK_EQ(te_batch_wait(p.a, b, 5000), 0);
	CHECK(ms_since(t0) < (SLACK_MS + 30));
	CHECK_EQ(info_of(p.a, b, 0).error, -ETIMEDOUT);
	CHECK_EQ(hold_release(0), 1);
	CHECK_EQ(te_batch_free(p.a, b), 0);
	engine_pair_down(&p);
}

/* A transport that does not honour deadlines: the task waits for it (and
 * the log says why once); bad arguments are refused. */
static void test_no_deadlines_and_args(void)
{
	engine_pair p;
	te_batch_id b = engine_pair_batch(&p, "hold", BUF, 8);
	te_request r = { TE_OP_READ, p.seg, p.abuf, (uintptr_t)p.bbuf, 4096 };
	cap_start();
	CHECK_EQ(te_submit_by(p.a, b, &r, 1, te_now_ns() + 20 * 1000000LL), 0);
	CHECK_EQ(te_batch_wait(p.a, b, 150), -ETIMEDOUT);
	CHECK(cap_has("does not honour deadlines"));
	CHECK_EQ(hold_release(0), 1);
	CHECK_EQ(te_batch_wait(p.a, b, 5000), 0);
	CHECK_EQ(info_of(p.a, b, 0).state, TE_TASK_COMPLETED);

	CHECK_EQ(te_submit_by(p.a, b, &r, 1, -1), -EINVAL);
	CHECK(cap_has("negative deadline"));
	CHECK_EQ(te_batch_set_deadline(p.a, b, -5), -EINVAL);
	CHECK_EQ(te_batch_set_deadline(p.a, 999999, 0), TE_ERR_BATCH);
	te_task_info ti = { .size = 8 };
	CHECK_EQ(te_get_task_info(p.a, b, 0, &ti), -EINVAL);
	CHECK_EQ(te_get_task_info(p.a, b, 0, NULL), -EINVAL);
	ti.size = sizeof ti;
	CHECK_EQ(te_get_task_info(p.a, b, 7, &ti), -ERANGE);
	CHECK_EQ(te_batch_wait_settled(p.a, 999999, 0), TE_ERR_BATCH);
	te_set_log_handler(NULL, NULL);
	CHECK_EQ(te_batch_free(p.a, b), 0);
	engine_pair_down(&p);
}

/* Local copies (the engine's own segment) end by their deadline too: a
 * copy large enough to go to the copy threads. */
static void test_local_deadline(void)
{
	te_engine *e = p2p_engine("holddl");
	REQUIRE(e != NULL);
	size_t len = 64u << 20;
	unsigned char *m = aligned_alloc(4096, 2 * len);
	REQUIRE(m != NULL);
	memset(m, 3, 2 * len);
	REQUIRE(te_register_memory(e, m, 2 * len, "cpu:0", 0) == 0);
	te_batch_id b;
	REQUIRE(te_batch_alloc(e, 4, &b) == 0);
	te_request r = { TE_OP_WRITE, TE_LOCAL_SEGMENT, m, (uintptr_t)m + len, len };
	CHECK_EQ(te_submit_by(e, b, &r, 1, te_now_ns() + 2000 * 1000000LL), 0);
	CHECK_EQ(te_batch_wait(e, b, 5000), 0);
	CHECK_EQ(info_of(e, b, 0).state, TE_TASK_COMPLETED); /* well inside */
	CHECK_EQ(te_batch_free(e, b), 0);
	te_unregister_memory(e, m);
	te_engine_destroy(e);
	free(m);
}

int main(void)
{
	hold_find_named("holddl");
	TEST_RUN(test_deadline_ends_tasks);
	TEST_RUN(test_free_and_give_up);
	TEST_RUN(test_cancel_and_past);
	TEST_RUN(test_local_deadline);
	hold_find_named("hold");
	TEST_RUN(test_no_deadlines_and_args);
	return check_done();
}
