/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A Mooncake C API program (transfer_engine_c.h) moving GPU memory: two
 * engines over TCP, memory of the test device plugin (standing for
 * cudaMalloc; only te_device_* from te.h reach it) registered with
 * registerLocalMemory, device to device WRITE and READ with submitTransfer,
 * every byte checked through the plugin.
 */
#include <transfer_engine_c.h>

#include <te/te.h>

#include "../compat/mc-util.h"
#include "device-util.h"

#define N ((1u << 20) * 3 + 11)

static int run(transfer_engine_t e, int op, void *local, segment_id_t seg, uint64_t remote)
{
	transfer_request_t r = { op, local, seg, remote, N };
	batch_id_t b = allocateBatchID(e, 1);

	REQUIRE(b != INVALID_BATCH);
	CHECK_EQ(submitTransfer(e, b, &r, 1), 0);
	int status = wait_tasks(e, b, 1);
	CHECK_EQ(freeBatchID(e, b), 0);
	return status;
}

static void test_device_to_device(void)
{
	transfer_engine_t a = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", NULL, 0, 0);
	transfer_engine_t b = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", NULL, 0, 0);
	void *src = NULL, *dst = NULL;
	char name_b[128];
	unsigned char *host = malloc(N);

	REQUIRE(a != NULL && b != NULL);
	REQUIRE(installTransport(a, "tcp", NULL) != NULL && installTransport(b, "tcp", NULL) != NULL);
	REQUIRE(te_device_alloc("testdev:0", N, &src) == 0 && te_device_alloc("testdev:1", N, &dst) == 0);
	CHECK_EQ(registerLocalMemory(a, src, N, "*", 1), 0);
	CHECK_EQ(registerLocalMemory(b, dst, N, "*", 1), 0);
	CHECK_EQ(getLocalIpAndPort(b, name_b, sizeof name_b), 0);
	segment_id_t seg = openSegment(a, name_b);
	REQUIRE(seg >= 0);

	fill_pattern(host, N, 21);
	REQUIRE(te_device_copy(src, host, N) == 0);
	CHECK_EQ(run(a, OPCODE_WRITE, src, seg, (uintptr_t)dst), STATUS_COMPLETED);
	CHECK(dev_equals(dst, N, 21));

	fill_pattern(host, N, 22);
	REQUIRE(te_device_copy(dst, host, N) == 0);
	CHECK_EQ(run(a, OPCODE_READ, src, seg, (uintptr_t)dst), STATUS_COMPLETED);
	CHECK(dev_equals(src, N, 22));

	mc_engine_down(a, src);
	mc_engine_down(b, dst);
	te_device_free(src);
	te_device_free(dst);
	free(host);
}

int main(void)
{
	TEST_RUN(test_device_to_device);
	return check_done();
}
