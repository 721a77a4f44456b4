/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A block device as the file of an NVMe-oF segment: the segment takes the
 * size the device reports, reads and writes land at the right offsets
 * (aligned ones go O_DIRECT, unaligned ones through the page cache), a range
 * past the segment is refused at submit, and a descriptor declaring more
 * than the device holds makes transfers past the device's end fail rather
 * than touch anything. NV_BLOCKDEV names the device (blockdev.sh attaches a
 * loop device over a scratch file); without it the test is skipped.
 */
#include <errno.h>
#include <linux/fs.h>
#include <sys/ioctl.h>

#include "nv-util.h"

static const char *dev;
static uint64_t dev_size;
static unsigned char *model, *mem;
#define MEM (4u << 20)

static void dev_write(const unsigned char *data, uint64_t at, size_t n)
{
	int fd = open(dev, O_WRONLY);
	REQUIRE(fd >= 0);
	REQUIRE(pwrite(fd, data, n, (off_t)at) == (ssize_t)n);
	REQUIRE(fsync(fd) == 0);
	close(fd);
}

static bool dev_matches(uint64_t at, size_t n)
{
	unsigned char *b = malloc(n);
	int fd = open(dev, O_RDONLY);
	REQUIRE(b != NULL && fd >= 0);
	REQUIRE(pread(fd, b, n, (off_t)at) == (ssize_t)n);
	close(fd);
	bool ok = memcmp(b, model + at, n) == 0;
	free(b);
	return ok;
}

static void put_device(const char *name, uint64_t length)
{
	const char *paths[] = { dev };
	const uint64_t lens[] = { length };
	nv_put_files(name, paths, lens, 1);
}

static void test_reads_and_writes(void)
{
	te_engine *e = nv_engine("nodeA", NULL);
	REQUIRE(e != NULL);
	REQUIRE(te_register_memory(e, mem, MEM, "cpu:0", 0) == 0);
	put_device("nvmeof/dev", dev_size);
	te_segment_id seg = te_segment_open(e, "nvmeof/dev");
	REQUIRE(seg > 0);
	te_segment_buffer sb[2];
	CHECK_EQ(te_segment_buffers(e, seg, sb, 2), 1);
	CHECK_EQ(sb[0].length, dev_size);

	/* reads: aligned, unaligned, the device's last bytes */
	struct { uint64_t at, len; } rd[] = { { 0, 65536 }, { 4096 * 3, 4096 }, { 12345, 5000 },
					      { dev_size - 8192, 8192 }, { dev_size - 7, 7 } };
	for (size_t i = 0; i < sizeof rd / sizeof *rd; i++) {
		te_task_status st = { 0 };
		memset(mem, 0xee, rd[i].len);
		CHECK_EQ(run_one(e, TE_OP_READ, seg, mem, rd[i].at, rd[i].len, &st), TE_TASK_COMPLETED);
		CHECK_EQ(st.transferred, rd[i].len);
		CHECK(memcmp(mem, model + rd[i].at, rd[i].len) == 0);
	}
	/* writes, then the device holds them */
	struct { uint64_t at, len; } wr[] = { { 1u << 20, 65536 }, { 77777, 3333 }, { dev_size - 4096, 4096 } };
	for (size_t i = 0; i < sizeof wr / sizeof *wr; i++) {
		te_task_status st = { 0 };
		fill_pattern(mem, wr[i].len, 40 + (unsigned)i);
		memcpy(model + wr[i].at, mem, wr[i].len);
		CHECK_EQ(run_one(e, TE_OP_WRITE, seg, mem, wr[i].at, wr[i].len, &st), TE_TASK_COMPLETED);
		CHECK_EQ(st.transferred, wr[i].len);
		CHECK(dev_matches(wr[i].at, wr[i].len));
	}
	/* past the segment: refused at submit */
	cap_start();
	te_task_status st = { 0 };
	CHECK_EQ(run_one(e, TE_OP_READ, seg, mem, dev_size - 100, 4096, &st), TE_TASK_INVALID);
	CHECK_EQ(st.error, TE_ERR_ADDRESS);
	te_set_log_handler(NULL, NULL);
	CHECK_EQ(te_segment_close(e, seg), 0);
	CHECK_EQ(te_unregister_memory(e, mem), 0);
	te_engine_destroy(e);
}

/* A descriptor that declares 1 MiB more than the device: the open warns,
 * transfers past the device's end fail, the ones inside still work. */
static void test_declared_longer(void)
{
	cap_start();
	te_engine *e = nv_engine("nodeA", NULL);
	REQUIRE(e != NULL);
	REQUIRE(te_register_memory(e, mem, MEM, "cpu:0", 0) == 0);
	put_device("nvmeof/longer", dev_size + (1u << 20));
	te_segment_id seg = te_segment_open(e, "nvmeof/longer");
	REQUIRE(seg > 0);
	char want[128];
	snprintf(want, sizeof want, "holds %llu bytes but its descriptor declares", (unsigned long long)dev_size);
	CHECK(cap_has(want));
	te_task_status st = { 0 };
	CHECK_EQ(run_one(e, TE_OP_READ, seg, mem, dev_size, 4096, &st), TE_TASK_FAILED);
	CHECK_EQ(run_one(e, TE_OP_WRITE, seg, mem, dev_size + 4096, 4096, &st), TE_TASK_FAILED);
	CHECK_EQ(run_one(e, TE_OP_READ, seg, mem, 4096, 4096, &st), TE_TASK_COMPLETED);
	CHECK(memcmp(mem, model + 4096, 4096) == 0);
	te_set_log_handler(NULL, NULL);
	CHECK_EQ(te_segment_close(e, seg), 0);
	CHECK_EQ(te_unregister_memory(e, mem), 0);
	te_engine_destroy(e);
	CHECK(dev_matches(0, (size_t)dev_size)); /* nothing else was touched */
}

int main(void)
{
	dev = getenv("NV_BLOCKDEV");
	if (dev == NULL) {
		fprintf(stderr, "NV_BLOCKDEV not set: no block device to test with\n");
		return 77;
	}
	int fd = open(dev, O_RDONLY);
	REQUIRE(fd >= 0);
	REQUIRE(ioctl(fd, BLKGETSIZE64, &dev_size) == 0);
	close(fd);
	REQUIRE(dev_size >= (4u << 20) && dev_size <= (256u << 20));
	nv_setup();
	/* the device, named itself: a listed directory allows regular files only */
	char allow[8400];
	snprintf(allow, sizeof allow, "%s:%s", nv_dir, dev);
	REQUIRE(setenv("TE_NVMEOF_ALLOW", allow, 1) == 0);
	model = malloc(dev_size);
	mem = aligned_alloc(4096, MEM);
	REQUIRE(model != NULL && mem != NULL);
	fill_pattern(model, dev_size, 3);
	dev_write(model, 0, dev_size);
	TEST_RUN(test_reads_and_writes);
	TEST_RUN(test_declared_longer);
	free(model);
	free(mem);
	return check_done();
}
