/* SPDX-License-Identifier: Apache-2.0 */
/*
 * NVMe-oF transfers under pressure and at the edges of their lifetime: a
 * queue of depth 1 fed thousands of slices, several threads submitting at
 * once over several workers, a submitting thread that exits while its
 * requests run, cancellation mid-batch, a refresh while transfers run, and
 * engine shutdown with transfers in flight. Nothing may hang, every task must
 * end in a final state, and completed data must be right. Run once per
 * submission mode (TE_NVMEOF_SUBMIT from the environment).
 */
#include "nv-util.h"

#define FILE_LEN (4u << 20)
#define MEM (24u << 20)
static unsigned char *mem;
static unsigned char *model;

static void make_segment(void)
{
	model = malloc(2 * FILE_LEN);
	REQUIRE(model != NULL);
	fill_pattern(model, 2 * FILE_LEN, 5);
	nv_write_file(nv_path("a"), model, FILE_LEN);
	nv_write_file(nv_path("b"), model + FILE_LEN, FILE_LEN);
	const char *paths[] = { nv_path("a"), nv_path("b") };
	const uint64_t lens[] = { FILE_LEN, FILE_LEN };
	nv_put_files("nvmeof/two", paths, lens, 2);
}

/* Registers `mem` with engine `e` and opens the two-file segment. */
static te_segment_id open_two(te_engine *e)
{
	return nv_register_open(e, mem, MEM, "nvmeof/two");
}

static void test_depth_one(void)
{
	te_engine *e = nv_engine("nodeA", "TE_NVMEOF_QUEUE_DEPTH", "1", "TE_NVMEOF_SLICE_SIZE", "4096", NULL);
	te_segment_id seg = open_two(e);
	/* 2 x 4 MiB in 4 KiB slices through one slot, plus small odd ones */
	te_request r[66];
	r[0] = (te_request){ TE_OP_READ, seg, mem, 0, 2 * FILE_LEN };
	r[1] = (te_request){ TE_OP_READ, seg, mem + 2 * FILE_LEN, 3, 2 * FILE_LEN - 6 };
	for (int i = 2; i < 66; i++)
		r[i] = (te_request){ TE_OP_READ, seg, mem + 4 * FILE_LEN + (size_t)i * 5000,
				     FILE_LEN - 1000 + (uint64_t)i * 31, 4999 };
	CHECK_EQ(nv_run(e, r, 66, NULL), 0);
	CHECK_EQ(nv_reads_differ(r, 66, model), 0);
	CHECK_EQ(te_segment_close(e, seg), 0);
	CHECK_EQ(te_unregister_memory(e, mem), 0);
	te_engine_destroy(e);
}

static void *submit_thread(void *arg)
{
	nv_thread *s = arg;
	for (int round = 0; round < 20; round++) {
		te_request r[32];
		nv_random_reads(r, 32, s->seg, s->base, &s->rnd, 65536, 2 * FILE_LEN);
		s->bad += nv_run(s->e, r, 32, NULL);
		s->bad += nv_reads_differ(r, 32, model);
	}
	return NULL;
}

static void test_threads_and_workers(void)
{
	te_engine *e = nv_engine("nodeA", "TE_NVMEOF_WORKERS", "3", "TE_NVMEOF_QUEUE_DEPTH", "16",
				 "TE_NVMEOF_SLICE_SIZE", "16384", NULL);
	te_segment_id seg = open_two(e);
	/* each thread reads into its own quarter of memory */
	nv_threads_run(submit_thread, 4, 0, &(nv_thread){ .e = e, .seg = seg, .base = mem, .rnd = 1234567 }, MEM / 4);
	CHECK_EQ(te_segment_close(e, seg), 0);
	te_engine_destroy(e);
}

typedef struct exiting {
	te_engine *e;
	te_batch_id b;
	te_request r[4];
	int rc;
} exiting;

static void *submit_and_exit(void *arg)
{
	exiting *x = arg;
	x->rc = te_submit(x->e, x->b, x->r, 4);
	return NULL; /* the thread ends with its requests in the kernel */
}

/* With caller submission the kernel ties a request to the thread that
 * submitted it; the request must still complete, and be reported, after
 * that thread is gone. */
static void test_submitter_exits(void)
{
	te_engine *e = nv_engine("nodeA", "TE_NVMEOF_QUEUE_DEPTH", "2", "TE_NVMEOF_SLICE_SIZE", "4096", NULL);
	te_segment_id seg = open_two(e);
	memset(mem, 0, 4 * FILE_LEN);
	exiting x = { .e = e };
	REQUIRE(te_batch_alloc(e, 4, &x.b) == 0);
	/* 4096 aligned slices (direct I/O, really in flight) through two slots:
	 * most wait in the queue when the thread ends */
	for (int i = 0; i < 4; i++)
		x.r[i] = (te_request){ TE_OP_READ, seg, mem + (size_t)i * FILE_LEN, (uint64_t)(i % 2) * FILE_LEN,
				       FILE_LEN };
	pthread_t th;
	REQUIRE(pthread_create(&th, NULL, submit_and_exit, &x) == 0);
	pthread_join(th, NULL);
	CHECK_EQ(x.rc, 0);
	CHECK_EQ(te_batch_wait(e, x.b, 60000), 0);
	int32_t state;
	CHECK_EQ(te_batch_status(e, x.b, NULL, NULL, &state), 0);
	CHECK_EQ(state, TE_TASK_COMPLETED);
	for (int i = 0; i < 4; i++)
		CHECK(memcmp(x.r[i].local, model + x.r[i].remote, x.r[i].length) == 0);
	CHECK_EQ(te_batch_free(e, x.b), 0);

	/* Unaligned writes (buffered I/O, which the kernel may hand to its
	 * own workers, cancelled when the submitter exits) from an exiting
	 * thread: all complete, and the file holds them. */
	exiting y = { .e = e };
	REQUIRE(te_batch_alloc(e, 4, &y.b) == 0);
	fill_pattern(mem, FILE_LEN, 11);
	const uint64_t q = (FILE_LEN - 2) / 4;
	for (int i = 0; i < 4; i++)
		y.r[i] = (te_request){ TE_OP_WRITE, seg, mem + (size_t)i * q, 1 + (uint64_t)i * q, q };
	REQUIRE(pthread_create(&th, NULL, submit_and_exit, &y) == 0);
	pthread_join(th, NULL);
	CHECK_EQ(y.rc, 0);
	CHECK_EQ(te_batch_wait(e, y.b, 60000), 0);
	CHECK_EQ(te_batch_status(e, y.b, NULL, NULL, &state), 0);
	CHECK_EQ(state, TE_TASK_COMPLETED);
	unsigned char *back = nv_read_file(nv_path("a"), FILE_LEN);
	CHECK(back[0] == model[0] && memcmp(back + 1, mem, 4 * q) == 0);
	free(back);
	nv_write_file(nv_path("a"), model, FILE_LEN); /* as the other tests expect it */
	CHECK_EQ(te_batch_free(e, y.b), 0);
	CHECK_EQ(te_segment_close(e, seg), 0);
	te_engine_destroy(e);
}

static void test_cancel(void)
{
	cap_start();
	te_engine *e = nv_engine("nodeA", "TE_NVMEOF_QUEUE_DEPTH", "2", "TE_NVMEOF_SLICE_SIZE", "4096",
				 "TE_NVMEOF_DIRECT", "0", NULL);
	te_segment_id seg = open_two(e);
	enum { N = 64 };
	te_request r[N];
	for (int i = 0; i < N; i++)
		r[i] = (te_request){ TE_OP_READ, seg, mem + (size_t)(i % 2) * 2 * FILE_LEN, 0, 2 * FILE_LEN };
	te_batch_id b;
	REQUIRE(te_batch_alloc(e, N, &b) == 0);
	CHECK_EQ(te_submit(e, b, r, N), 0);
	CHECK_EQ(te_batch_cancel(e, b), 0);
	long long t0 = now_ms();
	CHECK_EQ(te_batch_wait(e, b, 30000), 0);
	CHECK(now_ms() - t0 < 30000);
	int canceled = 0, completed = 0, other = 0;
	for (int i = 0; i < N; i++) {
		te_task_status st;
		CHECK_EQ(te_get_status(e, b, i, &st), 0);
		if (st.state == TE_TASK_CANCELED)
			canceled++;
		else if (st.state == TE_TASK_COMPLETED)
			completed++;
		else
			other++;
	}
	/* 64 x 2048 slices through two slots cannot all finish before the cancel */
	CHECK(canceled > 0);
	CHECK_EQ(other, 0);
	CHECK_EQ(canceled + completed, N);
	CHECK_EQ(te_batch_free(e, b), 0);
	CHECK(!cap_has("transport bug")); /* every slice completed exactly once */
	/* the transport still works afterwards */
	te_task_status st;
	CHECK_EQ(run_one(e, TE_OP_READ, seg, mem, 100, 5000, &st), TE_TASK_COMPLETED);
	CHECK(memcmp(mem, model + 100, 5000) == 0);
	CHECK_EQ(te_segment_close(e, seg), 0);
	te_engine_destroy(e);
}

static void test_refresh_while_running(void)
{
	te_engine *e = nv_engine("nodeA", "TE_NVMEOF_QUEUE_DEPTH", "4", "TE_NVMEOF_SLICE_SIZE", "8192", NULL);
	te_segment_id seg = open_two(e);
	te_request r[3] = {
		{ TE_OP_READ, seg, mem, 0, 2 * FILE_LEN },
		{ TE_OP_READ, seg, mem + 2 * FILE_LEN, 1, 2 * FILE_LEN - 1 },
		{ TE_OP_READ, seg, mem + 4 * FILE_LEN, 7, FILE_LEN },
	};
	te_batch_id b;
	REQUIRE(te_batch_alloc(e, 6, &b) == 0);
	CHECK_EQ(te_submit(e, b, r, 3), 0);
	CHECK_EQ(te_segment_refresh(e, seg), 0); /* the old files stay open for these */
	CHECK_EQ(te_submit(e, b, r, 3), 0);      /* these use the new ones */
	CHECK_EQ(te_batch_wait(e, b, 60000), 0);
	int32_t state;
	CHECK_EQ(te_batch_status(e, b, NULL, NULL, &state), 0);
	CHECK_EQ(state, TE_TASK_COMPLETED);
	for (int i = 0; i < 3; i++)
		CHECK(memcmp(r[i].local, model + r[i].remote, r[i].length) == 0);
	CHECK_EQ(te_batch_free(e, b), 0);
	/* closing with the segment never used again, and reopening */
	CHECK_EQ(te_segment_close(e, seg), 0);
	seg = te_segment_open(e, "nvmeof/two");
	CHECK(seg > 0);
	te_engine_destroy(e); /* closes it */
}

static void test_destroy_in_flight(void)
{
	for (int round = 0; round < 3; round++) {
		te_engine *e = nv_engine("nodeA", "TE_NVMEOF_QUEUE_DEPTH", "4", "TE_NVMEOF_SLICE_SIZE", "4096",
					 "TE_NVMEOF_WORKERS", "2", NULL);
		te_segment_id seg = open_two(e);
		te_request r[16];
		for (int i = 0; i < 16; i++)
			r[i] = (te_request){ i % 2 ? TE_OP_READ : TE_OP_WRITE, seg,
					     mem + (size_t)(i % 4) * FILE_LEN, (uint64_t)(i % 2) * FILE_LEN, FILE_LEN };
		/* writes put back what the files hold, so the data stays the model */
		memcpy(mem, model, FILE_LEN);
		memcpy(mem + 2 * FILE_LEN, model, FILE_LEN);
		te_batch_id b;
		REQUIRE(te_batch_alloc(e, 16, &b) == 0);
		CHECK_EQ(te_submit(e, b, r, 16), 0);
		long long t0 = now_ms();
		te_engine_destroy(e); /* cancels, waits for the slices in flight, stops */
		CHECK(now_ms() - t0 < 30000);
	}
	unsigned char *a = nv_read_file(nv_path("a"), FILE_LEN);
	CHECK(memcmp(a, model, FILE_LEN) == 0);
	free(a);
}

int main(void)
{
	nv_setup();
	make_segment();
	mem = aligned_alloc(4096, MEM);
	REQUIRE(mem != NULL);
	TEST_RUN(test_depth_one);
	TEST_RUN(test_threads_and_workers);
	TEST_RUN(test_submitter_exits);
	TEST_RUN(test_cancel);
	TEST_RUN(test_refresh_while_running);
	TEST_RUN(test_destroy_in_flight);
	free(mem);
	free(model);
	return check_done();
}
