/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device memory with the test device plugin (tests/device/testdev.c), whose
 * memory the CPU cannot touch: registration finds the device, local copies
 * and every transport present move device memory to and from host memory
 * and other device memory with every byte checked, and the plugin's
 * failures end tasks FAILED. A direct access to device memory anywhere in
 * libte or a transport crashes this program.
 */
#include <stdlib.h>
#include <sys/stat.h>

#include "../common/util.h"

#define MiB (1u << 20)

static const size_t sizes[] = { 1, 4095, 4097, MiB + 3, 3 * MiB + 17, 9 * MiB + 1 };

static void *dev_alloc(const char *loc, size_t len)
{
	void *p = NULL;
	REQUIRE(te_device_alloc(loc, len, &p) == 0 && p != NULL);
	return p;
}

/* Puts a pattern into device memory, through the plugin. */
static void dev_fill(void *dev, size_t len, unsigned seed)
{
	unsigned char *h = malloc(len);
	fill_pattern(h, len, seed);
	CHECK_EQ(te_device_copy(dev, h, len), 0);
	free(h);
}

/* Compares device memory with the pattern, through the plugin. */
static int dev_equals(const void *dev, size_t len, unsigned seed)
{
	unsigned char *h = malloc(len), *want = malloc(len);
	fill_pattern(want, len, seed);
	int ok = te_device_copy(h, dev, len) == 0 && memcmp(h, want, len) == 0;
	free(h);
	free(want);
	return ok;
}

static int host_equals(const unsigned char *p, size_t len, unsigned seed)
{
	unsigned char *want = malloc(len);
	fill_pattern(want, len, seed);
	int ok = memcmp(p, want, len) == 0;
	free(want);
	return ok;
}

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
		te_task_status st;
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

/* Two engines over a network transport: the initiator's device memory
 * against the target's host memory, both directions, many sizes. */
static void remote_case(const char *transport)
{
	te_engine *target = p2p_engine(transport), *init = p2p_engine(transport);
	size_t max = 9 * MiB + 1;
	unsigned char *tbuf = malloc(max);
	void *dev = dev_alloc("testdev:1", max);

	REQUIRE(target != NULL && init != NULL);
	CHECK_EQ(te_register_memory(target, tbuf, max, "*", TE_MEM_REMOTE_ACCESS), 0);
	CHECK_EQ(te_register_memory(init, dev, max, "*", 0), 0);
	te_segment_id seg = te_segment_open(init, te_engine_name(target));
	REQUIRE(seg >= 0);
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		size_t n = sizes[i];
		te_task_status st;
		/* device -> remote host */
		dev_fill(dev, n, 300 + (unsigned)i);
		memset(tbuf, 0, n);
		CHECK_EQ(run_one(init, TE_OP_WRITE, seg, dev, (uintptr_t)tbuf, n, &st),
			 TE_TASK_COMPLETED);
		CHECK_EQ(st.transferred, n);
		CHECK(host_equals(tbuf, n, 300 + (unsigned)i));
		/* remote host -> device */
		fill_pattern(tbuf, n, 400 + (unsigned)i);
		dev_fill(dev, n, 1);
		CHECK_EQ(run_one(init, TE_OP_READ, seg, dev, (uintptr_t)tbuf, n, &st),
			 TE_TASK_COMPLETED);
		CHECK_EQ(st.transferred, n);
		CHECK(dev_equals(dev, n, 400 + (unsigned)i));
	}
	/* Many staged tasks in one batch, at an unaligned offset. */
	{
		enum { N = 24 };
		size_t each = 256 * 1024 + 5;
		te_request r[N];
		te_batch_id b;
		dev_fill(dev, N * each + 3, 77);
		for (int k = 0; k < N; k++)
			r[k] = (te_request){ TE_OP_WRITE, seg, (char *)dev + 3 + (size_t)k * each,
					     (uintptr_t)tbuf + (size_t)k * each, each };
		REQUIRE(te_batch_alloc(init, N, &b) == 0);
		CHECK_EQ(te_submit(init, b, r, N), 0);
		CHECK_EQ(te_batch_wait(init, b, 30000), 0);
		int32_t state = -1;
		te_batch_status(init, b, NULL, NULL, &state);
		CHECK_EQ(state, TE_TASK_COMPLETED);
		te_batch_free(init, b);
		unsigned char *want = malloc(N * each + 3);
		fill_pattern(want, N * each + 3, 77);
		CHECK(memcmp(tbuf, want + 3, N * each) == 0);
		free(want);
	}
	/* The plugin failing mid-way: FAILED, never a crash or a hang. */
	setenv("TE_TESTDEV_FAIL", "1", 1);
	te_task_status st;
	CHECK_EQ(run_one(init, TE_OP_WRITE, seg, dev, (uintptr_t)tbuf, 3 * MiB, &st), TE_TASK_FAILED);
	CHECK_EQ(run_one(init, TE_OP_READ, seg, dev, (uintptr_t)tbuf, 3 * MiB, &st), TE_TASK_FAILED);
	unsetenv("TE_TESTDEV_FAIL");
	CHECK_EQ(run_one(init, TE_OP_READ, seg, dev, (uintptr_t)tbuf, 3 * MiB, &st),
		 TE_TASK_COMPLETED);

	/* Device memory of the target: a transport that cannot move device
	 * memory must refuse it rather than touch it. */
	void *tdev = dev_alloc("testdev:0", 65536);
	CHECK_EQ(te_register_memory(target, tdev, 65536, "*", TE_MEM_REMOTE_ACCESS), 0);
	te_segment_refresh(init, seg);
	unsigned char hostbuf[4096];
	CHECK_EQ(te_register_memory(init, hostbuf, sizeof hostbuf, "*", 0), 0);
	CHECK(run_one(init, TE_OP_READ, seg, hostbuf, (uintptr_t)tdev, sizeof hostbuf, &st) !=
	      TE_TASK_COMPLETED);
	CHECK(run_one(init, TE_OP_WRITE, seg, hostbuf, (uintptr_t)tdev, sizeof hostbuf, &st) !=
	      TE_TASK_COMPLETED);

	te_engine_destroy(init);
	te_engine_destroy(target);
	free(tbuf);
}

static void test_tcp(void)
{
	remote_case("tcp");
}

static void test_shm(void)
{
	remote_case("shm");
}

int main(void)
{
	TEST_RUN(test_alloc_and_locate);
	TEST_RUN(test_local);
	TEST_RUN(test_tcp);
	TEST_RUN(test_shm);
	return check_done();
}
