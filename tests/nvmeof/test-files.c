/* SPDX-License-Identifier: Apache-2.0 */
/*
 * NVMe-oF segments over real files: one file and several, reads and writes
 * at aligned and unaligned offsets, across file boundaries, split into many
 * slices, many requests in one batch, local_path_map resolution, and proof
 * through the page cache that aligned slices go O_DIRECT and the others
 * buffered. Every byte is checked against the files and a model.
 */
#include <sys/mman.h>

#include "nv-util.h"
#include "../metrics/metric-util.h"

#define NF 3
static const uint64_t flen[NF] = { (1u << 20) + 3 * 4096, 100001, (2u << 20) + 7 };
static uint64_t total;
static unsigned char *model; /* the segment's bytes laid end to end */

static te_engine *eng;
static unsigned char *mem; /* registered local memory */
#define MEM (16u << 20)

static void make_files(void)
{
	const char *paths[NF];
	uint64_t off = 0;

	total = 0;
	for (int i = 0; i < NF; i++)
		total += flen[i];
	model = malloc(total);
	REQUIRE(model != NULL);
	fill_pattern(model, total, 7);
	for (int i = 0; i < NF; i++) {
		char name[32];
		snprintf(name, sizeof name, "f%d", i);
		paths[i] = nv_path(name);
		nv_write_file(paths[i], model + off, flen[i]);
		off += flen[i];
	}
	nv_put_files("nvmeof/three", paths, flen, NF);
	nv_put_files("nvmeof/one", paths, flen, 1);
}

/* The file bytes now on disk, laid end to end, equal the model. */
static bool files_match_model(void)
{
	uint64_t off = 0;
	bool ok = true;
	for (int i = 0; i < NF; i++) {
		char name[32];
		snprintf(name, sizeof name, "f%d", i);
		unsigned char *b = nv_read_file(nv_path(name), flen[i]);
		if (memcmp(b, model + off, flen[i]) != 0) {
			for (uint64_t j = 0; j < flen[i]; j++)
				if (b[j] != model[off + j]) {
					fprintf(stderr, "  file %d differs first at %llu\n", i, (unsigned long long)j);
					break;
				}
			ok = false;
		}
		free(b);
		off += flen[i];
	}
	return ok;
}

static int read_at(te_segment_id seg, size_t local_off, uint64_t remote, uint64_t len)
{
	te_task_status st;
	memset(mem + local_off, 0xee, len);
	int s = run_one(eng, TE_OP_READ, seg, mem + local_off, remote, len, &st);
	if (s == TE_TASK_COMPLETED && (st.transferred != len || memcmp(mem + local_off, model + remote, len) != 0))
		return -1;
	return s;
}

static int write_at(te_segment_id seg, size_t local_off, uint64_t remote, uint64_t len, unsigned seed)
{
	te_task_status st;
	fill_pattern(mem + local_off, len, seed);
	int s = run_one(eng, TE_OP_WRITE, seg, mem + local_off, remote, len, &st);
	if (s == TE_TASK_COMPLETED) {
		memcpy(model + remote, mem + local_off, len);
		if (st.transferred != len)
			return -1;
	}
	return s;
}

static void test_one_file(void)
{
	te_segment_id seg = te_segment_open(eng, "nvmeof/one");
	REQUIRE(seg > 0);
	te_segment_buffer sb[4];
	CHECK_EQ(te_segment_buffers(eng, seg, sb, 4), 1);
	CHECK_EQ(sb[0].length, flen[0]);

	/* { local offset, remote offset, length } */
	static const uint64_t cases[][3] = {
		{ 0, 0, 4096 },             /* aligned everything */
		{ 0, 0, (1u << 20) + 3 * 4096 }, /* the whole file */
		{ 4096, 8192, 65536 },
		{ 1, 0, 4096 },             /* unaligned memory */
		{ 0, 1, 4096 },             /* unaligned offset */
		{ 0, 0, 4097 },             /* unaligned length */
		{ 17, 12345, 300001 },
		{ 4096, (1u << 20) + 3 * 4096 - 1, 1 }, /* last byte */
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		CHECK_EQ(read_at(seg, cases[i][0], cases[i][1], cases[i][2]), TE_TASK_COMPLETED);
		CHECK_EQ(write_at(seg, cases[i][0], cases[i][1], cases[i][2], (unsigned)i + 100), TE_TASK_COMPLETED);
		CHECK_EQ(read_at(seg, cases[i][0] + 4096, cases[i][1], cases[i][2]), TE_TASK_COMPLETED);
	}
	CHECK(files_match_model());
	CHECK_EQ(te_segment_close(eng, seg), 0);
}

static void test_three_files(void)
{
	te_segment_id seg = te_segment_open(eng, "nvmeof/three");
	REQUIRE(seg > 0);
	te_segment_buffer sb[4];
	CHECK_EQ(te_segment_buffers(eng, seg, sb, 4), NF);
	CHECK(sb[1].addr == flen[0] && sb[2].addr == flen[0] + flen[1] && sb[2].length == flen[2]);

	uint64_t b01 = flen[0], b12 = flen[0] + flen[1];
	static const int64_t spans[][2] = {
		/* start relative to a boundary, length */
		{ -4096, 8192 }, { -1, 2 }, { -3, 10000 }, { 0, 4096 }, { -65536, 65536 }, { -65536, 65537 },
	};
	for (size_t i = 0; i < sizeof spans / sizeof *spans; i++) {
		for (int b = 0; b < 2; b++) {
			uint64_t at = (b ? b12 : b01) + (uint64_t)spans[i][0], len = (uint64_t)spans[i][1];
			CHECK_EQ(read_at(seg, 0, at, len), TE_TASK_COMPLETED);
			CHECK_EQ(write_at(seg, 4096 * (i + 1), at, len, (unsigned)(i * 2 + (size_t)b)), TE_TASK_COMPLETED);
			CHECK_EQ(read_at(seg, 3, at, len), TE_TASK_COMPLETED);
		}
	}
	/* all three files in one request, in slices of 64 KiB (the engine's option) */
	CHECK_EQ(read_at(seg, 0, 0, total), TE_TASK_COMPLETED);
	CHECK_EQ(write_at(seg, 5, 1, total - 2, 55), TE_TASK_COMPLETED);
	CHECK_EQ(read_at(seg, 4096, 0, total), TE_TASK_COMPLETED);
	CHECK(files_match_model());
	/* a zero-length request completes without touching anything */
	te_task_status st;
	CHECK_EQ(run_one(eng, TE_OP_READ, seg, mem, 0, 0, &st), TE_TASK_COMPLETED);
	CHECK_EQ(te_segment_close(eng, seg), 0);
}

/* The device counters (docs/metrics.md): one device per file, named by its
 * path, counting exactly the bytes that went to or from that file; nothing
 * in flight once the requests are done. */
static long long file_bytes(int i)
{
	char name[32];
	snprintf(name, sizeof name, "f%d", i);
	return device_metric(eng, "te_device_bytes_total", "nvmeof", nv_path(name));
}

static long long file_in_flight(int i)
{
	char name[32];
	snprintf(name, sizeof name, "f%d", i);
	return device_metric(eng, "te_device_in_flight_bytes", "nvmeof", nv_path(name));
}

static void test_device_counts(void)
{
	if (!engine_counts(eng)) {
		fprintf(stderr, "  counting is off: nothing to check\n");
		return;
	}
	te_segment_id seg = te_segment_open(eng, "nvmeof/three");
	REQUIRE(seg > 0);
	long long b0[NF], b1[NF];
	uint64_t b01 = flen[0], b12 = flen[0] + flen[1];

	for (int i = 0; i < NF; i++)
		REQUIRE((b0[i] = file_bytes(i)) >= 0);
	/* a read of everything: each file its length */
	CHECK_EQ(read_at(seg, 0, 0, total), TE_TASK_COMPLETED);
	for (int i = 0; i < NF; i++)
		CHECK_EQ(file_bytes(i) - b0[i], (long long)flen[i]);
	/* a write across the first boundary: 1000 bytes of f0, 4000 of f1;
	 * a read across the second: 12345 bytes of f1, 7 of f2 */
	for (int i = 0; i < NF; i++)
		b1[i] = file_bytes(i);
	CHECK_EQ(write_at(seg, 4096, b01 - 1000, 5000, 77), TE_TASK_COMPLETED);
	CHECK_EQ(read_at(seg, 65536, b12 - 12345, 12352), TE_TASK_COMPLETED);
	CHECK_EQ(file_bytes(0) - b1[0], 1000);
	CHECK_EQ(file_bytes(1) - b1[1], 4000 + 12345);
	CHECK_EQ(file_bytes(2) - b1[2], 7);
	for (int i = 0; i < NF; i++)
		CHECK_EQ(file_in_flight(i), 0);
	CHECK(files_match_model());
	CHECK_EQ(te_segment_close(eng, seg), 0);
}

/* Many requests in one batch: reads to disjoint local ranges, then writes
 * of disjoint remote ranges, sizes from 1 byte to 128 KiB. */
static void test_many_in_one_batch(void)
{
	enum { N = 1000 };
	te_segment_id seg = te_segment_open(eng, "nvmeof/three");
	REQUIRE(seg > 0);
	te_request *r = calloc(N, sizeof *r);
	uint64_t rnd = 0x9e3779b97f4a7c15ull;
	size_t lo = 0;
	REQUIRE(r != NULL);

	for (int i = 0; i < N; i++) {
		uint64_t len = 1 + nv_rand(&rnd) % (i % 10 == 0 ? 131072 : 4096);
		if (i % 3 == 0)
			len = 4096 * (1 + nv_rand(&rnd) % 4); /* some aligned ones */
		uint64_t at = nv_rand(&rnd) % (total - len);
		if (i % 3 == 0)
			at &= ~4095ull;
		lo = (lo + 4095) & ~(size_t)4095;
		REQUIRE(lo + len <= MEM); /* destinations must not overlap */
		r[i] = (te_request){ TE_OP_READ, seg, mem + lo, at, len };
		lo += len;
	}
	CHECK_EQ(nv_run(eng, r, N, NULL), 0);
	CHECK_EQ(nv_reads_differ(r, N, model), 0);

	/* writes: cut the segment into N disjoint pieces, written out of order */
	uint64_t piece = total / N;
	fill_pattern(mem, MEM, 4242);
	for (int i = 0; i < N; i++) {
		int j = (i * 7919) % N;
		uint64_t len = piece - (uint64_t)(j % 5);
		r[i] = (te_request){ TE_OP_WRITE, seg, mem + (size_t)i * (piece + 1) % (MEM - piece), (uint64_t)j * piece, len };
	}
	CHECK_EQ(nv_run(eng, r, N, NULL), 0);
	for (int i = 0; i < N; i++)
		memcpy(model + r[i].remote, r[i].local, r[i].length);
	CHECK(files_match_model());
	free(r);
	CHECK_EQ(te_segment_close(eng, seg), 0);
}

/* local_path_map: our name maps to a copy; file_path names nothing here. */
static void test_local_path_map(void)
{
	char json[8192];
	unsigned char *data = malloc(65536);
	REQUIRE(data != NULL);
	fill_pattern(data, 65536, 31);
	nv_write_file(nv_path("mounted"), data, 65536);
	nv_write_file(nv_path("other-host"), data + 1, 65535);
	snprintf(json, sizeof json,
		 "{\"buffers\":[{\"file_path\":\"/nonexistent/nvme0\",\"length\":65536,"
		 "\"local_path_map\":{\"nodeA\":\"%s\",\"nodeB\":\"%s\"}}],"
		 "\"protocol\":\"nvmeof\",\"server_name\":\"storage1\"}",
		 nv_path("mounted"), nv_path("other-host"));
	nv_put_desc("nvmeof/mapped", json);
	te_segment_id seg = te_segment_open(eng, "nvmeof/mapped");
	REQUIRE(seg > 0);
	te_task_status st;
	memset(mem, 0, 65536);
	CHECK_EQ(run_one(eng, TE_OP_READ, seg, mem, 0, 65536, &st), TE_TASK_COMPLETED);
	CHECK(memcmp(mem, data, 65536) == 0);
	fill_pattern(mem, 4096, 32);
	CHECK_EQ(run_one(eng, TE_OP_WRITE, seg, mem, 4096, 4096, &st), TE_TASK_COMPLETED);
	unsigned char *back = nv_read_file(nv_path("mounted"), 65536);
	CHECK(memcmp(back + 4096, mem, 4096) == 0);
	free(back);
	CHECK_EQ(te_segment_close(eng, seg), 0);
	free(data);
}

/* Aligned slices bypass the page cache (O_DIRECT), unaligned ones fill it. */
static size_t resident_pages(const char *path, uint64_t off, uint64_t len)
{
	int fd = open(path, O_RDONLY);
	REQUIRE(fd >= 0);
	void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, (off_t)off);
	REQUIRE(p != MAP_FAILED);
	size_t pages = (len + 4095) / 4096, n = 0;
	unsigned char *vec = malloc(pages);
	REQUIRE(mincore(p, len, vec) == 0);
	for (size_t i = 0; i < pages; i++)
		n += vec[i] & 1;
	free(vec);
	munmap(p, len);
	close(fd);
	return n;
}

static void drop_cache(const char *path)
{
	int fd = open(path, O_RDONLY);
	REQUIRE(fd >= 0);
	CHECK_EQ(fsync(fd), 0);
	CHECK_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
	close(fd);
}

static void test_direct_and_buffered(void)
{
	const char *f0 = nv_path("f0");
	int probe = open(f0, O_RDONLY | O_DIRECT);
	if (probe < 0) {
		fprintf(stderr, "  (the file system of %s has no O_DIRECT: check skipped)\n", f0);
		return;
	}
	close(probe);
	te_segment_id seg = te_segment_open(eng, "nvmeof/one");
	REQUIRE(seg > 0);
	drop_cache(f0);
	CHECK_EQ(resident_pages(f0, 0, 1u << 20), 0);
	CHECK_EQ(read_at(seg, 0, 0, 512 * 1024), TE_TASK_COMPLETED);    /* aligned: direct */
	CHECK_EQ(read_at(seg, 1, 524288, 256 * 1024), TE_TASK_COMPLETED); /* unaligned memory: buffered */
	CHECK_EQ(resident_pages(f0, 0, 512 * 1024), 0);
	CHECK(resident_pages(f0, 524288, 256 * 1024) >= 64);
	/* a direct write leaves nothing cached, a buffered one does */
	drop_cache(f0);
	CHECK_EQ(write_at(seg, 0, 0, 65536, 77), TE_TASK_COMPLETED);
	CHECK_EQ(write_at(seg, 0, 65536 + 1, 65536, 78), TE_TASK_COMPLETED);
	CHECK_EQ(resident_pages(f0, 0, 65536), 0);
	CHECK(resident_pages(f0, 65536, 65536) >= 8);
	CHECK(files_match_model());
	CHECK_EQ(te_segment_close(eng, seg), 0);
}

/* The rings' registered file tables: with room for three descriptors, the
 * first file's two (buffered and O_DIRECT) and the second's buffered one go
 * in, the rest of the files are named by descriptor; data moves right either
 * way, and closing the segment frees the entries for the next one. Worker
 * submission (a single-issuer ring) registers none. */
static void test_registered_files(void)
{
	const char *mode = getenv("TE_NVMEOF_SUBMIT");
	bool worker = mode != NULL && strcmp(mode, "worker") == 0;
	te_engine *saved = eng;
	int level = te_get_log_level();
	eng = nv_engine("nodeA", "TE_NVMEOF_FIXED_FILES", "3", "TE_NVMEOF_SLICE_SIZE", "65536", NULL);
	REQUIRE(eng != NULL);
	REQUIRE(te_register_memory(eng, mem, MEM, "cpu:0", 0) == 0);
	for (int round = 0; round < 2; round++) {
		te_set_log_level(TE_LOG_INFO);
		cap_start();
		te_segment_id seg = te_segment_open(eng, "nvmeof/three");
		REQUIRE(seg > 0);
		te_set_log_level(level);
		char want[4][256];
		for (int i = 0; i < NF; i++) {
			char name[32];
			snprintf(name, sizeof name, "f%d", i);
			snprintf(want[i], sizeof want[i], "file %d (%s) open, direct and buffered I/O, %s", i,
				 nv_path(name),
				 worker ? "not registered with the rings"
				 : i == 0 ? "registered with the rings"
					  : "not registered with the rings (their file tables are full)");
			CHECK(cap_has(want[i]));
		}
		te_set_log_handler(NULL, NULL);
		/* every file, aligned (O_DIRECT) and not, across the boundaries */
		CHECK_EQ(read_at(seg, 0, 0, total), TE_TASK_COMPLETED);
		CHECK_EQ(write_at(seg, 5, 1, total - 2, 70 + (unsigned)round), TE_TASK_COMPLETED);
		CHECK_EQ(read_at(seg, 4096, 0, total), TE_TASK_COMPLETED);
		CHECK_EQ(write_at(seg, 0, flen[0], 65536, 80 + (unsigned)round), TE_TASK_COMPLETED);
		CHECK_EQ(read_at(seg, 0, flen[0] - 4096, 8192), TE_TASK_COMPLETED);
		CHECK(files_match_model());
		CHECK_EQ(te_segment_close(eng, seg), 0); /* frees the entries for round 2 */
	}
	CHECK_EQ(te_unregister_memory(eng, mem), 0);
	te_engine_destroy(eng);
	eng = saved;
}

int main(void)
{
	nv_setup();
	make_files();
	/* small slices, a shallow queue and two workers: slicing, queueing and
	 * hand-over all get exercised by the requests below */
	eng = nv_engine("nodeA", "TE_NVMEOF_SLICE_SIZE", "65536", "TE_NVMEOF_QUEUE_DEPTH", "8",
			"TE_NVMEOF_WORKERS", "2", NULL);
	mem = nv_memory(eng, MEM);

	TEST_RUN(test_one_file);
	TEST_RUN(test_three_files);
	TEST_RUN(test_device_counts);
	TEST_RUN(test_many_in_one_batch);
	TEST_RUN(test_local_path_map);
	TEST_RUN(test_direct_and_buffered);
	TEST_RUN(test_registered_files);

	CHECK_EQ(te_unregister_memory(eng, mem), 0);
	te_engine_destroy(eng);
	free(mem);
	free(model);
	return check_done();
}
