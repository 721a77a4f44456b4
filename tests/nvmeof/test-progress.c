/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Who collects NVMe-oF completions. With caller submission and one worker
 * (the defaults) the application thread waiting in te_batch_wait(), or
 * polling te_batch_status() / te_get_status(), collects them itself and the
 * transport's worker leaves them alone; the worker takes over only once no
 * application thread collected for a tick (TE_NVMEOF_REAP_TICK_MS). With
 * worker submission (TE_NVMEOF_SUBMIT=worker) or several workers
 * (TE_NVMEOF_WORKERS > 1) the worker collects and waiters sleep on the batch.
 * Also: several threads waiting and polling at once, batches that mix file
 * transfers with local copies and with another transport's transfers,
 * timeouts, and
 * uninstalling the transport while a thread waits through it. Data is
 * checked everywhere.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>

#include "nv-util.h"
#include "../plugins/hold.h"

#define FILE_LEN (8u << 20)
#define MEM (32u << 20)
static unsigned char *mem;
static unsigned char *model;
static bool app_collects; /* the configuration lets application threads collect */

static void make_segment(void)
{
	model = malloc(FILE_LEN);
	REQUIRE(model != NULL);
	fill_pattern(model, FILE_LEN, 9);
	nv_write_file(nv_path("d"), model, FILE_LEN);
	const char *paths[] = { nv_path("d") };
	const uint64_t lens[] = { FILE_LEN };
	nv_put_files("nvmeof/disk", paths, lens, 1);
}

static te_segment_id open_disk(te_engine *e)
{
	return nv_register_open(e, mem, MEM, "nvmeof/disk");
}

static void close_disk(te_engine *e, te_segment_id seg)
{
	CHECK_EQ(te_segment_close(e, seg), 0);
	CHECK_EQ(te_unregister_memory(e, mem), 0);
	te_engine_destroy(e);
}

/* A 4 KiB read of block `i` into its own 4 KiB of memory, waited for. */
static bool read_block(te_engine *e, te_segment_id seg, unsigned i)
{
	te_task_status st;
	uint64_t at = ((uint64_t)i * 4096) % FILE_LEN;
	memset(mem + (size_t)i % 1024 * 4096, 0, 4096);
	int s = run_one(e, TE_OP_READ, seg, mem + (size_t)i % 1024 * 4096, at, 4096, &st);
	return s == TE_TASK_COMPLETED && memcmp(mem + (size_t)i % 1024 * 4096, model + at, 4096) == 0;
}

/* The waiting thread collects: with a worker that looks only once a second,
 * 50 requests in a row still take far less than 50 s, and a request nobody
 * waits for stays uncollected while the application was active just before
 * (te_batch_free refuses the batch). */
static void test_waiter_collects(void)
{
	te_engine *e = nv_engine("nodeA", "TE_NVMEOF_REAP_TICK_MS", "1000", NULL);
	te_segment_id seg = open_disk(e);
	long long t0 = now_ms();
	int bad = 0;
	for (unsigned i = 0; i < 50; i++)
		bad += !read_block(e, seg, i);
	CHECK_EQ(bad, 0);
	CHECK(now_ms() - t0 < 20000);

	te_batch_id b;
	REQUIRE(te_batch_alloc(e, 1, &b) == 0);
	te_request r = { TE_OP_READ, seg, mem, 4096 * 7, 4096 };
	memset(mem, 0, 4096);
	CHECK_EQ(te_submit(e, b, &r, 1), 0);
	usleep(200 * 1000); /* no call into libte: nobody collects here */
	cap_start();
	int rc = te_batch_free(e, b);
	if (app_collects) {
		CHECK_EQ(rc, -EBUSY); /* the worker left it to the application */
		CHECK_EQ(te_batch_wait(e, b, 30000), 0);
		CHECK_EQ(te_batch_free(e, b), 0);
	} else {
		CHECK_EQ(rc, 0); /* the worker collected it */
	}
	te_set_log_handler(NULL, NULL);
	CHECK(memcmp(mem, model + 4096 * 7, 4096) == 0);
	close_disk(e, seg);
}

/* Nobody collects for a while: the worker takes over after its ticks. */
static void test_worker_takes_over(void)
{
	te_engine *e = nv_engine("nodeA", "TE_NVMEOF_REAP_TICK_MS", "5", NULL);
	te_segment_id seg = open_disk(e);
	for (int round = 0; round < 3; round++) {
		int bad = 0;
		for (unsigned i = 0; i < 10; i++)
			bad += !read_block(e, seg, i);
		CHECK_EQ(bad, 0);
		te_batch_id b;
		REQUIRE(te_batch_alloc(e, 4, &b) == 0);
		te_request r[4];
		for (int i = 0; i < 4; i++)
			r[i] = (te_request){ TE_OP_READ, seg, mem + (size_t)i * 65536, (uint64_t)i * 65536 + 512,
					     65536 };
		memset(mem, 0, 4 * 65536);
		CHECK_EQ(te_submit(e, b, r, 4), 0);
		/* no call into libte meanwhile */
		cap_start();
		long long t0 = now_ms();
		int rc;
		do {
			usleep(20 * 1000);
			rc = te_batch_free(e, b); /* does not collect: refuses while in flight */
		} while (rc == -EBUSY && now_ms() - t0 < 5000);
		te_set_log_handler(NULL, NULL);
		CHECK_EQ(rc, 0);
		for (int i = 0; i < 4; i++)
			CHECK(memcmp(r[i].local, model + r[i].remote, 65536) == 0);
	}
	close_disk(e, seg);
}

/* Polling the status collects too: with a worker that looks once a second,
 * 40 requests polled to their end take far less than 40 s. Half the polls
 * sleep a little between looks, half spin without entering the kernel. */
static void test_polling_collects(void)
{
	te_engine *e = nv_engine("nodeA", "TE_NVMEOF_REAP_TICK_MS", "1000", NULL);
	te_segment_id seg = open_disk(e);
	long long t0 = now_ms();
	int bad = 0;
	for (unsigned i = 0; i < 40; i++) {
		te_batch_id b;
		REQUIRE(te_batch_alloc(e, 1, &b) == 0);
		uint64_t at = (uint64_t)i * 8192 + 4096;
		te_request r = { TE_OP_READ, seg, mem + (size_t)i * 4096, at, 4096 };
		memset(r.local, 0, 4096);
		CHECK_EQ(te_submit(e, b, &r, 1), 0);
		te_task_status st = { 0 };
		for (;;) {
			if (i % 4 < 2) {
				size_t in_flight = 1;
				CHECK_EQ(te_batch_status(e, b, NULL, &in_flight, NULL), 0);
				if (in_flight == 0)
					break;
			} else {
				CHECK_EQ(te_get_status(e, b, 0, &st), 0);
				if (st.state != TE_TASK_WAITING && st.state != TE_TASK_PENDING)
					break;
			}
			if (now_ms() - t0 > 15000)
				break;
			if (i % 2 == 0)
				usleep(50);
		}
		CHECK_EQ(te_get_status(e, b, 0, &st), 0);
		bad += st.state != TE_TASK_COMPLETED || memcmp(r.local, model + at, 4096) != 0;
		CHECK_EQ(te_batch_free(e, b), 0);
	}
	CHECK_EQ(bad, 0);
	CHECK(now_ms() - t0 < 20000);
	close_disk(e, seg);
}

static void *run_thread(void *arg)
{
	nv_thread *r = arg;
	for (int round = 0; round < 40; round++) {
		te_request q[8];
		nv_random_reads(q, 8, r->seg, r->base, &r->rnd, 40000, FILE_LEN);
		te_batch_id b;
		REQUIRE(te_batch_alloc(r->e, 8, &b) == 0);
		CHECK_EQ(te_submit(r->e, b, q, 8), 0);
		if (r->poll) {
			size_t in_flight = 1;
			long long t0 = now_ms();
			while (te_batch_status(r->e, b, NULL, &in_flight, NULL) == 0 && in_flight > 0 &&
			       now_ms() - t0 < 60000)
				sched_yield();
		} else {
			CHECK_EQ(te_batch_wait(r->e, b, 60000), 0);
		}
		int32_t state = 0;
		CHECK_EQ(te_batch_status(r->e, b, NULL, NULL, &state), 0);
		r->bad += state != TE_TASK_COMPLETED;
		r->bad += nv_reads_differ(q, 8, model);
		CHECK_EQ(te_batch_free(r->e, b), 0);
	}
	return NULL;
}

/* Four threads waiting and two polling at once: one collects at a time,
 * the others wait aside and are woken for their batches. */
static void test_threads_together(void)
{
	te_engine *e = nv_engine("nodeA", "TE_NVMEOF_QUEUE_DEPTH", "16", "TE_NVMEOF_SLICE_SIZE", "8192", NULL);
	te_segment_id seg = open_disk(e);
	long long t0 = now_ms();
	nv_threads_run(run_thread, 6, 2, &(nv_thread){ .e = e, .seg = seg, .base = mem, .rnd = 99 }, MEM / 8);
	CHECK(now_ms() - t0 < 120000);
	close_disk(e, seg);
}

/* Batches that mix a file read with a local copy done by the copy workers:
 * whichever ends last, the waiter returns and the data is right. */
static void test_mixed_with_copies(void)
{
	te_engine *e = nv_engine("nodeA", "TE_LOCAL_SPLIT_BYTES", "1048576", NULL);
	te_segment_id seg = open_disk(e);
	unsigned char *copy_src = mem + (16u << 20), *copy_dst = mem + (24u << 20);
	int bad = 0;
	for (int i = 0; i < 30; i++) {
		te_batch_id b;
		REQUIRE(te_batch_alloc(e, 2, &b) == 0);
		fill_pattern(copy_src, 8u << 20, (unsigned)i);
		te_request r[2] = {
			{ TE_OP_READ, seg, mem + (size_t)i * 4096, (uint64_t)i * 4096, 4096 },
			/* 8 MiB local copy, split over the copy workers */
			{ TE_OP_READ, TE_LOCAL_SEGMENT, copy_dst, (uint64_t)(uintptr_t)copy_src, 8u << 20 },
		};
		CHECK_EQ(te_submit(e, b, r, 2), 0);
		CHECK_EQ(te_batch_wait(e, b, 30000), 0);
		int32_t state = 0;
		CHECK_EQ(te_batch_status(e, b, NULL, NULL, &state), 0);
		bad += state != TE_TASK_COMPLETED || memcmp(copy_dst, copy_src, 8u << 20) != 0 ||
		       memcmp(r[0].local, model + r[0].remote, 4096) != 0;
		CHECK_EQ(te_batch_free(e, b), 0);
	}
	CHECK_EQ(bad, 0);
	close_disk(e, seg);
}

typedef struct waiter {
	te_engine *e;
	te_batch_id b;
	int rc;
	long long returned; /* now_ms() when the wait returned */
} waiter;

static void *wait_thread(void *arg)
{
	waiter *w = arg;
	w->rc = te_batch_wait(w->e, w->b, 60000);
	w->returned = now_ms();
	return NULL;
}

/* A batch whose file read ends long before its other task, held by another
 * transport: the thread sleeping through the NVMe-oF transport is woken when
 * that task ends. Ten such waits return within milliseconds of the release,
 * not at the host's 100 ms re-check. */
static void test_woken_by_other_transport(void)
{
	te_engine *a = nv_engine("nodeA", "transports", "nvmeof,hold", NULL);
	te_engine *b = nv_engine("nodeB", "transports", "hold", NULL);
	REQUIRE(b != NULL);
	te_segment_id seg = open_disk(a);
	unsigned char *peer_mem = aligned_alloc(4096, 1u << 20);
	REQUIRE(peer_mem != NULL);
	REQUIRE(te_register_memory(b, peer_mem, 1u << 20, "*", TE_MEM_REMOTE_ACCESS) == 0);
	te_segment_id peer = te_segment_open(a, "nodeB");
	REQUIRE(peer > 0);
	hold_find(); /* the "hold" transport keeps its transfers until released */
	long long late = 0;
	int bad = 0;
	for (int i = 0; i < 10; i++) {
		waiter w = { .e = a };
		REQUIRE(te_batch_alloc(a, 2, &w.b) == 0);
		fill_pattern(mem + (1u << 20), 4096, (unsigned)i);
		te_request r[2] = {
			{ TE_OP_READ, seg, mem + (size_t)i * 4096, (uint64_t)i * 4096, 4096 },
			{ TE_OP_WRITE, peer, mem + (1u << 20), (uint64_t)(uintptr_t)peer_mem, 4096 },
		};
		CHECK_EQ(te_submit(a, w.b, r, 2), 0);
		pthread_t th;
		REQUIRE(pthread_create(&th, NULL, wait_thread, &w) == 0);
		usleep(20 * 1000); /* the read is done by now; the waiter sleeps */
		long long t0 = now_ms();
		CHECK_EQ(hold_release(0), 1);
		pthread_join(th, NULL);
		CHECK_EQ(w.rc, 0);
		late += w.returned - t0;
		int32_t state = 0;
		CHECK_EQ(te_batch_status(a, w.b, NULL, NULL, &state), 0);
		bad += state != TE_TASK_COMPLETED || memcmp(peer_mem, mem + (1u << 20), 4096) != 0 ||
		       memcmp(r[0].local, model + r[0].remote, 4096) != 0;
		CHECK_EQ(te_batch_free(a, w.b), 0);
	}
	CHECK_EQ(bad, 0);
	CHECK(late < 400);
	CHECK_EQ(te_segment_close(a, peer), 0);
	CHECK_EQ(te_unregister_memory(b, peer_mem), 0);
	te_engine_destroy(b);
	close_disk(a, seg);
	free(peer_mem);
}

/* Voluntary context switches of the calling thread over 200 requests
 * waited for one at a time. */
static long switches_over_waits(const char *spin_us)
{
	te_engine *e = nv_engine("nodeA", "TE_NVMEOF_SPIN_US", spin_us, NULL);
	te_segment_id seg = open_disk(e);
	struct rusage before, after;
	int bad = 0;
	getrusage(RUSAGE_THREAD, &before);
	for (unsigned i = 0; i < 200; i++)
		bad += !read_block(e, seg, i * 7);
	getrusage(RUSAGE_THREAD, &after);
	CHECK_EQ(bad, 0);
	close_disk(e, seg);
	return after.ru_nvcsw - before.ru_nvcsw;
}

/* A waiting thread looks for its completion a while before it sleeps: with
 * a look of up to 1 ms, most of 200 direct reads (a fraction of a
 * millisecond each) end without the thread sleeping; without it, each wait
 * sleeps. Where the reads end at once (no direct I/O, a page cache hit)
 * neither sleeps and there is nothing to compare. */
static void test_spin_before_sleep(void)
{
	long sleeping = switches_over_waits("0");
	long spinning = switches_over_waits("1000");
	fprintf(stderr, "  voluntary switches over 200 waits: %ld without a look, %ld with\n", sleeping,
		spinning);
	if (!app_collects || sleeping < 50)
		return;
	CHECK(spinning * 2 < sleeping);
}

/* Timeouts: a wait of 0 looks once; a short one returns -ETIMEDOUT while
 * slices still run; a long one returns when they are done. */
static void test_timeouts(void)
{
	te_engine *e = nv_engine("nodeA", "TE_NVMEOF_QUEUE_DEPTH", "1", "TE_NVMEOF_SLICE_SIZE", "4096", NULL);
	te_segment_id seg = open_disk(e);
	te_batch_id b;
	REQUIRE(te_batch_alloc(e, 1, &b) == 0);
	/* 1024 slices one after another: one look cannot finish them */
	te_request r = { TE_OP_READ, seg, mem, 0, 4u << 20 };
	memset(mem, 0, 4u << 20);
	CHECK_EQ(te_submit(e, b, &r, 1), 0);
	CHECK_EQ(te_batch_wait(e, b, 0), -ETIMEDOUT);
	long long t0 = now_ms();
	int rc = te_batch_wait(e, b, 2);
	CHECK(rc == -ETIMEDOUT || rc == 0);
	CHECK(now_ms() - t0 < 5000);
	CHECK_EQ(te_batch_wait(e, b, 60000), 0);
	CHECK(memcmp(mem, model, 4u << 20) == 0);
	CHECK_EQ(te_batch_free(e, b), 0);
	close_disk(e, seg);
}

/* Uninstalling the transport while a thread waits through it: the
 * uninstall waits for the transfers and the waiter, the waiter sees its
 * batch done, and later calls on the batch (whose record still names the
 * old instance) are safe. Reinstalled, the transport serves the same batch. */
static void test_uninstall_while_waiting(void)
{
	te_engine *e = nv_engine("nodeA", "TE_NVMEOF_QUEUE_DEPTH", "1", "TE_NVMEOF_SLICE_SIZE", "4096", NULL);
	te_segment_id seg = open_disk(e);
	waiter w = { .e = e };
	REQUIRE(te_batch_alloc(e, 2, &w.b) == 0);
	te_request r = { TE_OP_READ, seg, mem, 4096, 2u << 20 };
	memset(mem, 0, 2u << 20);
	CHECK_EQ(te_submit(e, w.b, &r, 1), 0);
	pthread_t th;
	REQUIRE(pthread_create(&th, NULL, wait_thread, &w) == 0);
	usleep(2000);
	cap_start();
	CHECK_EQ(te_transport_uninstall(e, "nvmeof"), 0);
	pthread_join(th, NULL);
	CHECK_EQ(w.rc, 0);
	CHECK(memcmp(mem, model + 4096, 2u << 20) == 0);
	size_t in_flight = 1;
	te_task_status st;
	CHECK_EQ(te_batch_status(e, w.b, NULL, &in_flight, NULL), 0);
	CHECK_EQ(in_flight, 0);
	CHECK_EQ(te_get_status(e, w.b, 0, &st), 0);
	CHECK_EQ(st.state, TE_TASK_COMPLETED);
	CHECK_EQ(te_batch_wait(e, w.b, 0), 0);

	CHECK_EQ(te_transport_install(e, "nvmeof", NULL), 0);
	CHECK_EQ(te_segment_refresh(e, seg), 0);
	te_set_log_handler(NULL, NULL);
	te_request r2 = { TE_OP_READ, seg, mem, 8192, 4096 };
	memset(mem, 0, 4096);
	CHECK_EQ(te_submit(e, w.b, &r2, 1), 0);
	CHECK_EQ(te_batch_wait(e, w.b, 30000), 0);
	CHECK_EQ(te_get_status(e, w.b, 1, &st), 0);
	CHECK_EQ(st.state, TE_TASK_COMPLETED);
	CHECK(memcmp(mem, model + 8192, 4096) == 0);
	CHECK_EQ(te_batch_free(e, w.b), 0);
	close_disk(e, seg);
}

int main(void)
{
	const char *submit = getenv("TE_NVMEOF_SUBMIT"), *workers = getenv("TE_NVMEOF_WORKERS");
	app_collects = (submit == NULL || strcmp(submit, "worker") != 0) &&
		       (workers == NULL || strcmp(workers, "1") == 0);
	nv_setup();
	make_segment();
	mem = aligned_alloc(4096, MEM);
	REQUIRE(mem != NULL);
	TEST_RUN(test_waiter_collects);
	TEST_RUN(test_worker_takes_over);
	TEST_RUN(test_polling_collects);
	TEST_RUN(test_threads_together);
	TEST_RUN(test_mixed_with_copies);
	TEST_RUN(test_woken_by_other_transport);
	TEST_RUN(test_spin_before_sleep);
	TEST_RUN(test_timeouts);
	TEST_RUN(test_uninstall_while_waiting);
	free(mem);
	free(model);
	return check_done();
}
