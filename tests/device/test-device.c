/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device memory with the test device plugin (tests/device/testdev.c), whose
 * memory the CPU cannot touch: registration finds the device, local copies
 * and every transport present move device memory to and from host memory
 * and other device memory with every byte checked, and the plugin's
 * failures end tasks FAILED. A direct access to device memory anywhere in
 * libte or a transport crashes this program.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "device-util.h"
#include "stream-util.h"

static void test_alloc_and_locate(void)
{
	char loc[32];
	void *d0 = dev_alloc("testdev:0", 8192), *d1 = dev_alloc("testdev:1", 8192);
	char host[64];

	CHECK_EQ(te_device_locate(d0, 8192, loc, sizeof loc), 0);
	CHECK(strcmp(loc, "testdev:0") == 0);
	CHECK_EQ(te_device_locate(d1, 100, loc, sizeof loc), 0);
	CHECK(strcmp(loc, "testdev:1") == 0);
	CHECK_EQ(te_device_locate(host, sizeof host, loc, sizeof loc), -ENOENT);
	/* Bad arguments: clear errors, never a crash. */
	void *p = (void *)1;
	CHECK_EQ(te_device_alloc("nosuchdev:0", 64, &p), -ENODEV);
	CHECK(p == NULL);
	CHECK_EQ(te_device_alloc("testdev:0", 0, &p), -EINVAL);
	CHECK_EQ(te_device_alloc(NULL, 64, &p), -EINVAL);
	CHECK_EQ(te_device_free(host), -EINVAL);
	CHECK_EQ(te_device_copy(NULL, host, 1), -EINVAL);
	CHECK_EQ(te_device_stream_wait("testdev", (void *)1), 0);
	CHECK_EQ(te_device_stream_wait("testdev:1", (void *)1), 0);
	/* The N of "testdev:N" reaches the plugin, which has two devices. */
	CHECK_EQ(te_device_stream_wait("testdev:2", (void *)1), -ENODEV);
	CHECK_EQ(te_device_stream_wait("nosuchdev", (void *)1), -ENODEV);
	CHECK_EQ(te_device_stream_wait(NULL, (void *)1), -EINVAL);
	/* Device to device and back, through the plugin only. */
	dev_fill(d0, 8192, 7);
	CHECK_EQ(te_device_copy(d1, d0, 8192), 0);
	CHECK(dev_equals(d1, 8192, 7));
	CHECK_EQ(te_device_free(d0), 0);
	CHECK_EQ(te_device_free(d1), 0);
}

/* Local transfers (the engine's own segment) in every direction. */
static void test_local(void)
{
	static const size_t sizes[] = DEV_SIZES;
	te_engine *e = p2p_engine("tcp");
	size_t max = 9 * MiB + 1;
	unsigned char *host = malloc(max);
	void *d0 = dev_alloc("testdev:0", max), *d1 = dev_alloc("testdev:1", max);

	REQUIRE(e != NULL);
	CHECK_EQ(te_register_memory(e, host, max, "*", 0), 0);
	CHECK_EQ(te_register_memory(e, d0, max, "*", 0), 0);
	CHECK_EQ(te_register_memory(e, d1, max, "*", 0), 0);
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		size_t n = sizes[i];
		te_task_status st = { 0 };
		/* host -> device 0 (a WRITE from host to the segment's device memory) */
		fill_pattern(host, n, 100 + (unsigned)i);
		CHECK_EQ(run_one(e, TE_OP_WRITE, TE_LOCAL_SEGMENT, host, (uintptr_t)d0, n, &st),
			 TE_TASK_COMPLETED);
		CHECK_EQ(st.transferred, n);
		CHECK(dev_equals(d0, n, 100 + (unsigned)i));
		/* device 0 -> device 1 */
		CHECK_EQ(run_one(e, TE_OP_WRITE, TE_LOCAL_SEGMENT, d0, (uintptr_t)d1, n, &st),
			 TE_TASK_COMPLETED);
		CHECK(dev_equals(d1, n, 100 + (unsigned)i));
		/* device 1 -> host (a READ into host memory) */
		memset(host, 0, n);
		CHECK_EQ(run_one(e, TE_OP_READ, TE_LOCAL_SEGMENT, host, (uintptr_t)d1, n, &st),
			 TE_TASK_COMPLETED);
		CHECK(host_equals(host, n, 100 + (unsigned)i));
	}
	/* The plugin failing: the task ends FAILED with its error. */
	setenv("TE_TESTDEV_FAIL", "1", 1);
	te_task_status st;
	CHECK_EQ(run_one(e, TE_OP_WRITE, TE_LOCAL_SEGMENT, host, (uintptr_t)d0, 4096, &st),
		 TE_TASK_FAILED);
	CHECK_EQ(run_one(e, TE_OP_WRITE, TE_LOCAL_SEGMENT, host, (uintptr_t)d0, 5 * MiB, &st),
		 TE_TASK_FAILED);
	unsetenv("TE_TESTDEV_FAIL");
	CHECK_EQ(run_one(e, TE_OP_WRITE, TE_LOCAL_SEGMENT, host, (uintptr_t)d0, 4096, &st),
		 TE_TASK_COMPLETED);
	te_engine_destroy(e);
	free(host);
}

static void remote_case(const char *transport, bool init_dev, bool target_dev)
{
	remote_pair(transport, p2p_engine(transport), p2p_engine(transport), init_dev, target_dev,
		    true);
}

static void test_tcp(void)
{
	remote_case("tcp", true, false);
	remote_case("tcp", false, true);
	remote_case("tcp", true, true);
	/* READ chunks went into the initiator's device through copy_async;
	 * when the plugin declines it, through copy() on the staging threads. */
	void *h = dlopen(getenv("TE_TESTDEV_PLUGIN"), RTLD_NOW | RTLD_NOLOAD);
	REQUIRE(h != NULL); /* libte loaded it */
	unsigned long (*async_copies)(void);
	*(void **)&async_copies = dlsym(h, "te_testdev_async_copies");
	REQUIRE(async_copies != NULL);
	CHECK(async_copies() > 0);
	setenv("TE_TESTDEV_NO_ASYNC", "1", 1);
	unsigned long before = async_copies();
	remote_case("tcp", true, false);
	CHECK_EQ(async_copies(), before);
	unsetenv("TE_TESTDEV_NO_ASYNC");
	dlclose(h);
}

/* Many small staged tasks in one batch, both sides device memory: more
 * chunks than staging buffers (so buffers freed by finished chunks start
 * queued ones), more than the stager hands a transport at once, and READ
 * replies the TCP server stages several at a time. Then the same with three
 * 4 KiB buffers and READs and WRITEs mixed, and a batch canceled while its
 * chunks wait for buffers: every task ends, none hangs. With `target2`,
 * every other pair of tasks goes to it instead (another transport, say),
 * so that chunks of two transports are staged side by side. */
static void many_case(te_engine *target, te_engine *target2, te_engine *init, unsigned n, size_t step)
{
	size_t span = n * step + 64;
	side t = side_new(true, "testdev:0", span), l = side_new(true, "testdev:1", span);
	side t2 = side_new(true, "testdev:0", target2 != NULL ? span : 64);
	te_request *r = calloc(n, sizeof *r);
	unsigned char *want = malloc(span), *got = malloc(span), *tgt = malloc(span), *tgt2 = malloc(span);
	te_batch_id b;

	REQUIRE(target != NULL && init != NULL && r != NULL);
	CHECK_EQ(te_register_memory(target, t.p, span, "*", TE_MEM_REMOTE_ACCESS), 0);
	if (target2 != NULL)
		CHECK_EQ(te_register_memory(target2, t2.p, span, "*", TE_MEM_REMOTE_ACCESS), 0);
	CHECK_EQ(te_register_memory(init, l.p, span, "*", 0), 0);
	te_segment_id seg = te_segment_open(init, te_engine_name(target));
	te_segment_id seg2 = target2 != NULL ? te_segment_open(init, te_engine_name(target2)) : seg;
	REQUIRE(seg >= 0 && seg2 >= 0);
	/* Task k moves step - k % 7 bytes at 1 + k * step: odd sizes and
	 * offsets, gaps between them that must stay untouched. Odd tasks READ
	 * the target's pattern, even ones WRITE the initiator's. */
	side_fill(t, span, 41);
	side_fill(l, span, 42);
	fill_pattern(tgt, span, 41);
	fill_pattern(want, span, 42);
	if (target2 != NULL) {
		side_fill(t2, span, 44);
		fill_pattern(tgt2, span, 44);
	}
	for (unsigned k = 0; k < n; k++) {
		size_t off = 1 + (size_t)k * step, len = step - k % 7;
		bool rd = k % 2 == 1, two = target2 != NULL && (k / 2) % 2 == 1;
		unsigned char *tm = two ? tgt2 : tgt;
		uintptr_t base = (uintptr_t)(two ? t2.p : t.p);
		r[k] = (te_request){ rd ? TE_OP_READ : TE_OP_WRITE, two ? seg2 : seg, l.p + off, base + off, len };
		if (rd)
			memcpy(want + off, tm + off, len);
		else
			memcpy(tm + off, want + off, len);
	}
	CHECK_EQ(run_batch(init, r, n), TE_TASK_COMPLETED);
	CHECK_EQ(te_device_copy(got, l.p, span), 0);
	CHECK(memcmp(got, want, span) == 0);
	CHECK_EQ(te_device_copy(got, t.p, span), 0);
	CHECK(memcmp(got, tgt, span) == 0);
	if (target2 != NULL) {
		CHECK_EQ(te_device_copy(got, t2.p, span), 0);
		CHECK(memcmp(got, tgt2, span) == 0);
	}

	/* Canceled while most chunks wait: each task ends (CANCELED, or
	 * COMPLETED if it was done first), and the engine still works after. */
	REQUIRE(te_batch_alloc(init, n, &b) == 0);
	CHECK_EQ(te_submit(init, b, r, n), 0);
	CHECK_EQ(te_batch_cancel(init, b), 0);
	CHECK_EQ(te_batch_wait(init, b, 30000), 0);
	unsigned canceled = 0;
	for (unsigned k = 0; k < n; k++) {
		te_task_status st;
		CHECK_EQ(te_get_status(init, b, k, &st), 0);
		CHECK(st.state == TE_TASK_COMPLETED || st.state == TE_TASK_CANCELED);
		canceled += st.state == TE_TASK_CANCELED;
	}
	fprintf(stderr, "  %u of %u tasks canceled\n", canceled, n);
	CHECK_EQ(te_batch_free(init, b), 0);
	te_task_status st;
	side_fill(t, step, 43);
	CHECK_EQ(run_one(init, TE_OP_READ, seg, l.p, (uintptr_t)t.p, step, &st), TE_TASK_COMPLETED);
	CHECK(side_equals(l, step, 43));

	te_engine_destroy(init);
	te_engine_destroy(target);
	if (target2 != NULL)
		te_engine_destroy(target2);
	side_free(t);
	side_free(t2);
	side_free(l);
	free(r);
	free(want);
	free(got);
	free(tgt);
	free(tgt2);
}

static void test_tcp_many(void)
{
	many_case(p2p_engine("tcp"), NULL, p2p_engine("tcp"), 300, 5000);
	/* The stager reads its sizes when the engine starts. */
	setenv("TE_STAGE_BUFFERS", "3", 1);
	setenv("TE_STAGE_CHUNK_BYTES", "4096", 1);
	te_engine *init = p2p_engine("tcp");
	unsetenv("TE_STAGE_BUFFERS");
	unsetenv("TE_STAGE_CHUNK_BYTES");
	many_case(p2p_engine("tcp"), NULL, init, 120, 9000);
}

/* Copies reported in bursts (a device plugin's device_done_burst, plugin
 * ABI 1.7) of up to 1000, more than the stager hands a transport in one
 * call (64), with READs and WRITEs mixed and the chunks of two transports
 * (TCP and the same-host one) side by side in one batch: every byte where
 * it belongs, every task ends; then the same with TE_STAGE_BURST=0. */
static void test_burst(void)
{
	void *h = dlopen(getenv("TE_TESTDEV_PLUGIN"), RTLD_NOW | RTLD_NOLOAD);
	REQUIRE(h != NULL);
	unsigned long (*bursts)(void), (*burst_max)(void);
	*(void **)&bursts = dlsym(h, "te_testdev_bursts");
	*(void **)&burst_max = dlsym(h, "te_testdev_burst_max");
	REQUIRE(bursts != NULL && burst_max != NULL);
	setenv("TE_TESTDEV_BURST", "1000", 1);
	for (int off = 0; off < 2; off++) {
		setenv("TE_STAGE_BUFFERS", "512", 1);
		setenv("TE_STAGE_CHUNK_BYTES", "4096", 1);
		setenv("TE_STAGE_BURST", off ? "0" : "1", 1);
		te_engine *init = p2p_engine("tcp,shm");
		unsetenv("TE_STAGE_BUFFERS");
		unsetenv("TE_STAGE_CHUNK_BYTES");
		unsetenv("TE_STAGE_BURST");
		unsigned long before = bursts();
		many_case(p2p_engine("tcp"), p2p_engine("shm"), init, 600, 5000);
		fprintf(stderr, "  %lu bursts, the largest %lu copies\n", bursts() - before, burst_max());
		CHECK(bursts() > before);
	}
	CHECK(burst_max() > 64);
	unsetenv("TE_TESTDEV_BURST");
	dlclose(h);
}

/* The same-host transport with both engines in this process: the
 * initiator's device memory is staged by the host, the target's is copied
 * by the device plugin at its own address (the other process's case is
 * test-device-shm). When the target's plugin cannot share its memory, the
 * transport declines the segment: not served, never touched. */
static void test_shm(void)
{
	remote_case("shm", true, false);
	remote_case("shm", false, true);
	remote_case("shm", true, true);

	setenv("TE_TESTDEV_NO_IPC", "1", 1);
	te_engine *target = p2p_engine("shm"), *init = p2p_engine("shm");
	void *tdev = dev_alloc("testdev:0", 65536);
	unsigned char host[4096];
	te_task_status st;
	REQUIRE(target != NULL && init != NULL);
	CHECK_EQ(te_register_memory(target, tdev, 65536, "*", TE_MEM_REMOTE_ACCESS), 0);
	CHECK_EQ(te_register_memory(init, host, sizeof host, "*", 0), 0);
	te_segment_id seg = te_segment_open(init, te_engine_name(target));
	CHECK(seg < 0 || run_one(init, TE_OP_READ, seg, host, (uintptr_t)tdev, sizeof host, &st) != TE_TASK_COMPLETED);
	CHECK(seg < 0 || run_one(init, TE_OP_WRITE, seg, host, (uintptr_t)tdev, sizeof host, &st) != TE_TASK_COMPLETED);
	te_engine_destroy(init);
	te_engine_destroy(target);
	te_device_free(tdev);
	unsetenv("TE_TESTDEV_NO_IPC");
}

/* ----------------------------------------------- te_submit_on_stream() */

static stream_launch_fn stream_launch;
static unsigned long (*launches)(void);
static void (*launch_fail)(unsigned n);

/* Transfers in a stream's order: they start only once the stream's earlier
 * work has finished, the stream's later work runs only once they have
 * ended, and the caller never waits for either. Device memory on both
 * sides, over TCP (staged, so starting them copies: off the stream's
 * thread). Then a canceled batch, a runtime that refuses, refusals of bad
 * calls, a request found INVALID when the stream reaches it, and an engine
 * destroyed before its stream got there. */
static void test_on_stream(void)
{
	void *h = dlopen(getenv("TE_TESTDEV_PLUGIN"), RTLD_NOW | RTLD_NOLOAD);
	REQUIRE(h != NULL);
	*(void **)&stream_launch = dlsym(h, "te_testdev_stream_launch");
	*(void **)&launches = dlsym(h, "te_testdev_launches");
	*(void **)&launch_fail = dlsym(h, "te_testdev_launch_fail");
	REQUIRE(stream_launch && launches && launch_fail);
	void *S = (void *)0x5151;
	const size_t len = 256 << 10, n = 4;
	te_engine *target = p2p_engine("tcp"), *init = p2p_engine("tcp");
	REQUIRE(target != NULL && init != NULL);
	void *t = dev_alloc("testdev:0", 2 * n * len), *l = dev_alloc("testdev:1", 2 * n * len);
	CHECK_EQ(te_register_memory(target, t, 2 * n * len, "*", TE_MEM_REMOTE_ACCESS), 0);
	CHECK_EQ(te_register_memory(init, l, 2 * n * len, "*", 0), 0);
	te_segment_id seg = te_segment_open(init, te_engine_name(target));
	REQUIRE(seg >= 0);
	dev_fill(l, n * len, 21);  /* written to the target's first half */
	dev_fill((char *)t + n * len, n * len, 22); /* read into the initiator's second half */
	dev_fill(t, n * len, 0);
	te_request r[8];
	for (size_t i = 0; i < n; i++) {
		r[i] = (te_request){ TE_OP_WRITE, seg, (char *)l + i * len, (uintptr_t)t + i * len, len };
		r[n + i] = (te_request){ TE_OP_READ, seg, (char *)l + (n + i) * len,
					 (uintptr_t)t + (n + i) * len, len };
	}
	te_batch_id b;
	CHECK_EQ(te_batch_alloc(init, 16, &b), 0);

	/* The stream is busy: the call returns at once, its tasks wait. */
	gate g;
	gate_close(&g, stream_launch, S);
	unsigned long l0 = launches();
	long long t0 = ms_now();
	CHECK_EQ(te_submit_on_stream(init, b, r, 2 * n, "testdev", S), 0);
	CHECK(ms_now() - t0 < 1000);
	CHECK_EQ(launches(), l0 + 1);
	probe p = { .e = init, .b = b, .first = 0, .n = 2 * n };
	REQUIRE(stream_launch(S, probe_fn, &p) == 0);
	size_t sub = 0, infl = 0;
	int32_t state = -1;
	CHECK_EQ(te_batch_status(init, b, &sub, &infl, &state), 0);
	CHECK_EQ(sub, 2 * n);
	CHECK_EQ(infl, 2 * n);
	CHECK_EQ(state, TE_TASK_WAITING);
	usleep(200000);
	CHECK_EQ(te_batch_wait(init, b, 50), -ETIMEDOUT);
	CHECK_EQ(te_batch_free(init, b), -EBUSY);
	CHECK(dev_equals(t, n * len, 0)); /* nothing written yet */
	CHECK(!atomic_load(&p.ran));
	/* The stream gets there: the transfers run, then the probe behind them. */
	gate_open(&g);
	CHECK_EQ(te_device_stream_wait("testdev", S), 0);
	CHECK(atomic_load(&p.ran));
	CHECK_EQ(atomic_load(&p.ended), (int)(2 * n)); /* all ended before the stream went on */
	CHECK_EQ(te_batch_wait(init, b, 10000), 0);
	CHECK_EQ(te_batch_status(init, b, &sub, &infl, &state), 0);
	CHECK_EQ(state, TE_TASK_COMPLETED);
	CHECK(dev_equals(t, n * len, 21));
	CHECK(dev_equals((char *)l + n * len, n * len, 22));

	/* A batch canceled before the stream gets there: CANCELED, the stream goes on. */
	gate_close(&g, stream_launch, S);
	CHECK_EQ(te_submit_on_stream(init, b, r, 2, "testdev:1", S), 0);
	CHECK_EQ(te_batch_cancel(init, b), 0);
	gate_open(&g);
	CHECK_EQ(te_device_stream_wait("testdev", S), 0);
	CHECK_EQ(te_batch_wait(init, b, 10000), 0);
	te_task_status st;
	CHECK_EQ(te_get_status(init, b, 2 * n, &st), 0);
	CHECK_EQ(st.state, TE_TASK_CANCELED);
	CHECK_EQ(te_batch_free(init, b), 0);

	/* The runtime refuses to queue: an error, and the tasks appended end FAILED. */
	CHECK_EQ(te_batch_alloc(init, 4, &b), 0);
	cap_start();
	launch_fail(1);
	CHECK_EQ(te_submit_on_stream(init, b, r, 1, "testdev", S), -EIO);
	CHECK(cap_has("te_submit_on_stream: queuing on stream"));
	CHECK_EQ(te_batch_status(init, b, &sub, &infl, &state), 0);
	CHECK_EQ(sub, 1);
	CHECK_EQ(state, TE_TASK_FAILED);
	/* A device the plugin has not (the N of "testdev:N" reaches it): refused
	 * there, the task appended ends FAILED. */
	CHECK_EQ(te_submit_on_stream(init, b, r, 1, "testdev:2", S), -ENODEV);
	CHECK_EQ(te_batch_status(init, b, &sub, &infl, &state), 0);
	CHECK_EQ(sub, 2);
	CHECK_EQ(state, TE_TASK_FAILED);
	/* Bad calls: refused, nothing appended. */
	CHECK_EQ(te_submit_on_stream(NULL, b, r, 1, "testdev", S), -EINVAL);
	CHECK_EQ(te_submit_on_stream(init, b, NULL, 1, "testdev", S), -EINVAL);
	CHECK_EQ(te_submit_on_stream(init, b, r, 1, "nosuchdev", S), -ENODEV);
	CHECK_EQ(te_submit_on_stream(init, b, r, 1, NULL, S), -EINVAL);
	CHECK_EQ(te_submit_on_stream(init, b + 1000, r, 1, "testdev", S), TE_ERR_BATCH);
	CHECK_EQ(te_submit_on_stream(init, b, r, 3, "testdev", S), TE_ERR_BATCH_FULL);
	CHECK(cap_has("te_submit_on_stream: 3 requests exceed batch"));
	CHECK_EQ(te_submit_on_stream(init, b, r, 0, "testdev", S), 0);
	CHECK_EQ(te_batch_status(init, b, &sub, &infl, &state), 0);
	CHECK_EQ(sub, 2);
	/* Checked when the stream gets there, as te_submit() checks: local
	 * memory not registered is INVALID then. */
	unsigned char stray[64];
	te_request bad = { TE_OP_WRITE, seg, stray, (uintptr_t)t, sizeof stray };
	CHECK_EQ(te_submit_on_stream(init, b, &bad, 1, "testdev", S), 0);
	CHECK_EQ(te_device_stream_wait("testdev", S), 0);
	CHECK_EQ(te_get_status(init, b, 2, &st), 0);
	CHECK_EQ(st.state, TE_TASK_INVALID);
	CHECK_EQ(te_batch_free(init, b), 0);

	/* An engine destroyed before its stream got there: the call does not
	 * wait for the stream, the tasks are canceled, and the host function,
	 * when it runs, touches nothing of the engine (AddressSanitizer). */
	te_engine *gone = p2p_engine("tcp");
	REQUIRE(gone != NULL);
	CHECK_EQ(te_register_memory(gone, l, 2 * n * len, "*", 0), 0);
	te_segment_id seg2 = te_segment_open(gone, te_engine_name(target));
	REQUIRE(seg2 >= 0);
	te_request r2 = { TE_OP_WRITE, seg2, l, (uintptr_t)t, len };
	CHECK_EQ(te_batch_alloc(gone, 4, &b), 0);
	gate_close(&g, stream_launch, S);
	CHECK_EQ(te_submit_on_stream(gone, b, &r2, 1, "testdev", S), 0);
	dev_fill(t, len, 0);
	t0 = ms_now();
	te_engine_destroy(gone);
	CHECK(ms_now() - t0 < 5000);
	CHECK(cap_has("requests queued on stream"));
	gate_open(&g);
	CHECK_EQ(te_device_stream_wait("testdev", S), 0);
	CHECK(dev_equals(t, len, 0)); /* never written */

	te_engine_destroy(init);
	te_engine_destroy(target);
	te_device_free(t);
	te_device_free(l);
	dlclose(h);
}

int main(void)
{
	TEST_RUN(test_alloc_and_locate);
	TEST_RUN(test_local);
	TEST_RUN(test_tcp);
	TEST_RUN(test_tcp_many);
	TEST_RUN(test_burst);
	TEST_RUN(test_shm);
	TEST_RUN(test_on_stream);
	return check_done();
}
