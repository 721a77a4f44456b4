/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device memory and NVMe-oF file segments: device memory written to two
 * files laid end to end and read back into device memory (through the host's
 * staging buffers: io_uring must never see a device address), odd sizes and
 * offsets across the file boundary, and the device plugin failing.
 */
#include "../nvmeof/nv-util.h"
#include "device-util.h"

#define FILE_LEN (5 * MiB + 7)

static void test_files(void)
{
	const char *paths[2] = { nv_path("f0"), nv_path("f1") };
	uint64_t lens[2] = { FILE_LEN, FILE_LEN };
	unsigned char *zero = calloc(1, FILE_LEN);
	static const size_t sizes[] = DEV_SIZES;

	nv_write_file(paths[0], zero, FILE_LEN);
	nv_write_file(paths[1], zero, FILE_LEN);
	nv_put_files("nvmeof/devfiles", paths, lens, 2);
	te_engine *e = nv_engine("nodeA", NULL);
	REQUIRE(e != NULL);
	void *dev = dev_alloc("testdev:0", 2 * FILE_LEN);
	CHECK_EQ(te_register_memory(e, dev, 2 * FILE_LEN, "*", 0), 0);
	te_segment_id seg = te_segment_open(e, "nvmeof/devfiles");
	REQUIRE(seg >= 0);

	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		size_t n = sizes[i];
		/* across the boundary between the files where it fits */
		uint64_t off = n < FILE_LEN ? FILE_LEN - n / 2 : 3;
		te_request w = { TE_OP_WRITE, seg, dev, off, n };
		dev_fill(dev, n, 50 + (unsigned)i);
		CHECK_EQ(nv_run(e, &w, 1, NULL), 0);
		/* what the files hold there */
		unsigned char *a = nv_read_file(paths[0], FILE_LEN), *b = nv_read_file(paths[1], FILE_LEN);
		unsigned char *got = malloc(n), *want = malloc(n);
		for (size_t k = 0; k < n; k++) {
			uint64_t at = off + k;
			got[k] = at < FILE_LEN ? a[at] : b[at - FILE_LEN];
		}
		fill_pattern(want, n, 50 + (unsigned)i);
		CHECK(memcmp(got, want, n) == 0);
		free(a);
		free(b);
		free(got);
		free(want);
		/* and back into device memory at another offset */
		dev_fill(dev, 2 * FILE_LEN, 1);
		te_request r = { TE_OP_READ, seg, (char *)dev + FILE_LEN - n / 2, off, n };
		CHECK_EQ(nv_run(e, &r, 1, NULL), 0);
		CHECK(dev_equals((char *)dev + FILE_LEN - n / 2, n, 50 + (unsigned)i));
	}
	setenv("TE_TESTDEV_FAIL", "1", 1);
	te_request w = { TE_OP_WRITE, seg, dev, 0, 2 * MiB };
	int32_t state = -1;
	CHECK_EQ(nv_run(e, &w, 1, &state), 1);
	CHECK_EQ(state, TE_TASK_FAILED);
	unsetenv("TE_TESTDEV_FAIL");
	CHECK_EQ(nv_run(e, &w, 1, NULL), 0);
	te_engine_destroy(e);
	te_device_free(dev);
	free(zero);
}

int main(void)
{
	nv_setup();
	TEST_RUN(test_files);
	return check_done();
}
