/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device memory over the RDMA transport, on its software verbs layer (two
 * emulated NICs per engine): the initiator's device memory moves through the
 * host's staging buffers in both directions; the target's device memory is
 * not registered with a transport that cannot reach it, so requests for it
 * fail instead of touching it.
 */
#include "../rdma/rdma-util.h"
#include "device-util.h"

static void test_staged(void)
{
	te_engine *b = soft_engine("two-socket", "{\"devices\": [\"mlx5_2\", \"mlx5_3\"]}");
	te_engine *a = soft_engine("two-socket", "{\"devices\": [\"mlx5_0\", \"mlx5_1\"]}");
	REQUIRE(a != NULL && b != NULL);
	remote_pair("rdma", b, a, true, false);
}

static void test_target_device_refused(void)
{
	te_engine *b = soft_engine("two-socket", "{\"devices\": [\"mlx5_2\"]}");
	te_engine *a = soft_engine("two-socket", "{\"devices\": [\"mlx5_0\"]}");
	void *tdev = dev_alloc("testdev:0", 65536);
	unsigned char *host = buf_new(4096);
	te_task_status st;

	REQUIRE(a != NULL && b != NULL);
	CHECK_EQ(te_register_memory(b, tdev, 65536, "*", TE_MEM_REMOTE_ACCESS), 0);
	CHECK_EQ(te_register_memory(a, host, 4096, "*", 0), 0);
	te_segment_id seg = te_segment_open(a, te_engine_name(b));
	REQUIRE(seg >= 0);
	CHECK(run_one(a, TE_OP_READ, seg, host, (uintptr_t)tdev, 4096, &st) != TE_TASK_COMPLETED);
	CHECK(run_one(a, TE_OP_WRITE, seg, host, (uintptr_t)tdev, 4096, &st) != TE_TASK_COMPLETED);
	te_engine_destroy(a);
	te_engine_destroy(b);
	te_device_free(tdev);
	free(host);
}

int main(void)
{
	find_controls();
	TEST_RUN(test_staged);
	TEST_RUN(test_target_device_refused);
	return check_done();
}
