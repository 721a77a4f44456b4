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

#include "device-util.h"

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
}

/* The same-host transport copies straight between the two processes'
 * memory, so it moves the initiator's device memory (the host stages it) but
 * must never be handed the target's: that is refused, not touched. */
static void test_shm(void)
{
	remote_case("shm", true, false);

	te_engine *target = p2p_engine("shm"), *init = p2p_engine("shm");
	void *tdev = dev_alloc("testdev:0", 65536);
	unsigned char host[4096];
	te_task_status st;
	REQUIRE(target != NULL && init != NULL);
	CHECK_EQ(te_register_memory(target, tdev, 65536, "*", TE_MEM_REMOTE_ACCESS), 0);
	CHECK_EQ(te_register_memory(init, host, sizeof host, "*", 0), 0);
	te_segment_id seg = te_segment_open(init, te_engine_name(target));
	REQUIRE(seg >= 0);
	CHECK(run_one(init, TE_OP_READ, seg, host, (uintptr_t)tdev, sizeof host, &st) != TE_TASK_COMPLETED);
	CHECK(run_one(init, TE_OP_WRITE, seg, host, (uintptr_t)tdev, sizeof host, &st) != TE_TASK_COMPLETED);
	te_engine_destroy(init);
	te_engine_destroy(target);
	te_device_free(tdev);
}

int main(void)
{
	TEST_RUN(test_alloc_and_locate);
	TEST_RUN(test_local);
	TEST_RUN(test_tcp);
	TEST_RUN(test_shm);
	return check_done();
}
