/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device memory over the RDMA transport, on its software verbs layer (two
 * emulated NICs per engine):
 * - GPUDirect: the test device exports its memory as a dma-buf, the plugin
 *   registers it with ibv_reg_dmabuf_mr, and the "NICs" move device memory
 *   to and from device and host memory on both sides without a single copy
 *   through the CPU (the device plugin's copy count does not move);
 * - no GPUDirect (no dma-buf, and plain registration fails as it does
 *   without the vendor's peer-memory module): the initiator's device memory
 *   is staged through host memory, and the target's cannot be reached, so
 *   requests for it fail instead of touching it.
 */
#include <dlfcn.h>

#include "../rdma/rdma-util.h"
#include "device-util.h"

static unsigned long (*testdev_copies)(void);

static te_engine *engine(const char *dev0, const char *dev1)
{
	char args[128];
	if (dev1)
		snprintf(args, sizeof args, "{\"devices\": [\"%s\", \"%s\"]}", dev0, dev1);
	else
		snprintf(args, sizeof args, "{\"devices\": [\"%s\"]}", dev0);
	te_engine *e = soft_engine("two-socket", args);
	REQUIRE(e != NULL);
	return e;
}

static void test_gpudirect(void)
{
	cap_start();
	te_set_log_level(TE_LOG_INFO);
	remote_pair("rdma, GPUDirect", engine("mlx5_2", "mlx5_3"), engine("mlx5_0", "mlx5_1"), true,
		    true, false);
	remote_pair("rdma, GPUDirect", engine("mlx5_2", "mlx5_3"), engine("mlx5_0", "mlx5_1"), true,
		    false, false);
	CHECK(cap_has("GPUDirect RDMA (dma-buf)"));
	te_set_log_level(TE_LOG_WARN);

	/* Device to device: not one byte through the CPU. */
	te_engine *b = engine("mlx5_2", NULL), *a = engine("mlx5_0", NULL);
	size_t n = 3 * MiB + 5;
	void *src = dev_alloc("testdev:1", n), *dst = dev_alloc("testdev:0", n);
	CHECK_EQ(te_register_memory(b, dst, n, "*", TE_MEM_REMOTE_ACCESS), 0);
	CHECK_EQ(te_register_memory(a, src, n, "*", 0), 0);
	te_segment_id seg = te_segment_open(a, te_engine_name(b));
	REQUIRE(seg >= 0);
	dev_fill(src, n, 31);
	unsigned long before = testdev_copies();
	te_task_status st;
	CHECK_EQ(run_one(a, TE_OP_WRITE, seg, src, (uintptr_t)dst, n, &st), TE_TASK_COMPLETED);
	CHECK_EQ(testdev_copies() - before, 0);
	CHECK(dev_equals(dst, n, 31));
	te_engine_destroy(a);
	te_engine_destroy(b);
}

static void test_staged(void)
{
	setenv("TE_TESTDEV_NO_DMABUF", "1", 1);
	cap_start();
	te_set_log_level(TE_LOG_INFO);
	remote_pair("rdma, staged", engine("mlx5_2", "mlx5_3"), engine("mlx5_0", "mlx5_1"), true,
		    false, true);
	CHECK(cap_has("staged through host memory"));
	te_set_log_level(TE_LOG_WARN);

	/* The target's device memory: not reachable, refused, never touched. */
	te_engine *b = engine("mlx5_2", NULL), *a = engine("mlx5_0", NULL);
	void *tdev = dev_alloc("testdev:0", 65536);
	unsigned char *host = buf_new(4096);
	te_task_status st;
	CHECK_EQ(te_register_memory(b, tdev, 65536, "*", TE_MEM_REMOTE_ACCESS), 0);
	CHECK_EQ(te_register_memory(a, host, 4096, "*", 0), 0);
	te_segment_id seg = te_segment_open(a, te_engine_name(b));
	REQUIRE(seg >= 0);
	CHECK(run_one(a, TE_OP_READ, seg, host, (uintptr_t)tdev, 4096, &st) != TE_TASK_COMPLETED);
	CHECK(run_one(a, TE_OP_WRITE, seg, host, (uintptr_t)tdev, 4096, &st) != TE_TASK_COMPLETED);
	te_engine_destroy(a);
	te_engine_destroy(b);
	free(host);
	unsetenv("TE_TESTDEV_NO_DMABUF");
}

/* Fail-over across transports with device memory: GPUDirect over RDMA,
 * TCP installed beside it; with every RDMA link of the target down, a
 * WRITE and a READ of the initiator's device memory move to TCP, staged
 * through host memory there, and complete with every byte. */
static void test_failover_staged(void)
{
	te_engine *b = engine("mlx5_2", "mlx5_3"), *a = engine("mlx5_0", "mlx5_1");
	REQUIRE(te_transport_install(a, "tcp", NULL) == 0);
	REQUIRE(te_transport_install(b, "tcp", NULL) == 0);
	size_t len = MiB + 17;
	void *dev = dev_alloc("testdev:1", len);
	unsigned char *host = buf_new(len);
	CHECK_EQ(te_register_memory(b, host, len, "*", TE_MEM_REMOTE_ACCESS), 0);
	CHECK_EQ(te_register_memory(a, dev, len, "*", 0), 0);
	te_segment_id seg = te_segment_open(a, te_engine_name(b));
	REQUIRE(seg >= 0);
	te_task_status st;
	dev_fill(dev, len, 11);
	CHECK_EQ(run_one(a, TE_OP_WRITE, seg, dev, (uintptr_t)host, len, &st), TE_TASK_COMPLETED);
	unsigned long copies0 = testdev_copies();
	CHECK_EQ(soft_set_link("mlx5_2", 0), 0);
	CHECK_EQ(soft_set_link("mlx5_3", 0), 0);
	cap_start();
	dev_fill(dev, len, 12);
	CHECK_EQ(run_one(a, TE_OP_WRITE, seg, dev, (uintptr_t)host, len, &st), TE_TASK_COMPLETED);
	CHECK(host_equals(host, len, 12));
	CHECK(cap_has("its tasks go over tcp"));
	dev_fill(dev, len, 0);
	CHECK_EQ(run_one(a, TE_OP_READ, seg, dev, (uintptr_t)host, len, &st), TE_TASK_COMPLETED);
	CHECK(dev_equals(dev, len, 12));
	CHECK(testdev_copies() > copies0); /* staged through host memory */
	CHECK_EQ(soft_set_link("mlx5_2", 1), 0);
	CHECK_EQ(soft_set_link("mlx5_3", 1), 0);
	te_segment_close(a, seg);
	te_engine_destroy(a);
	te_engine_destroy(b);
	free(host);
	te_device_free(dev);
}

int main(void)
{
	find_controls();
	void *h = dlopen(getenv("TE_TESTDEV_PLUGIN"), RTLD_NOW | RTLD_NOLOAD);
	REQUIRE(h != NULL); /* libte loaded it */
	*(void **)&testdev_copies = dlsym(h, "te_testdev_copies");
	REQUIRE(testdev_copies != NULL);
	TEST_RUN(test_gpudirect);
	TEST_RUN(test_staged);
	TEST_RUN(test_failover_staged);
	return check_done();
}
