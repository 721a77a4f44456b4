/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What goes wrong with NVMe-oF segments ends clearly: a store without the
 * key, malformed descriptors, a missing file, a directory, a short file, a
 * read past the end, a range outside the segment, GPU memory. Each yields the
 * documented error or task state and a log line naming the culprit, and
 * leaves the rest of the segment usable.
 */
#include <linux/fs.h>
#include <sys/ioctl.h>

#include "nv-util.h"

static te_engine *eng;
static unsigned char *mem;
#define MEM (1u << 20)

static void test_store_without_key(void)
{
	cap_start();
	CHECK_EQ(te_segment_open(eng, "nvmeof/nope"), -ENOENT);
	CHECK(cap_has("no descriptor under mooncake/nvmeof/nope"));
}

static void expect_refused(const char *name, const char *json, const char *log)
{
	nv_put_desc(name, json);
	cap_start();
	te_segment_id id = te_segment_open(eng, name);
	CHECK(id < 0);
	CHECK(cap_has(log));
	if (id > 0)
		te_segment_close(eng, id);
}

static void test_malformed_descriptors(void)
{
	/* the host's decoder refuses these */
	expect_refused("nvmeof/bad1", "not json", "descriptor rejected: unexpected 'n' at byte 0");
	expect_refused("nvmeof/bad2", "{\"protocol\":\"nvmeof\",\"buffers\":[{\"file_path\":\"/x\"}]}",
		       "missing or bad \"name\"");
	/* ours refuse the rest, saying which field */
	expect_refused("nvmeof/bad3", "{\"server_name\":\"s\",\"protocol\":\"nvmeof\",\"buffers\":[]}",
		       "lists no files");
	expect_refused("nvmeof/bad4",
		       "{\"server_name\":\"s\",\"protocol\":\"nvmeof\",\"buffers\":[{\"length\":4096}]}",
		       "buffer 0: missing or bad \"file_path\"");
	expect_refused("nvmeof/bad5",
		       "{\"server_name\":\"s\",\"protocol\":\"nvmeof\",\"buffers\":[{\"length\":4096,"
		       "\"file_path\":\"\"}]}",
		       "missing or bad \"file_path\"");
	expect_refused("nvmeof/bad6",
		       "{\"server_name\":\"s\",\"protocol\":\"nvmeof\",\"buffers\":[{\"length\":4096,"
		       "\"file_path\":\"/x\",\"local_path_map\":[1]}]}",
		       "\"local_path_map\" is not an object");
	expect_refused("nvmeof/bad7",
		       "{\"server_name\":\"s\",\"protocol\":\"nvmeof\",\"buffers\":[{\"length\":4096,"
		       "\"file_path\":\"/x\",\"local_path_map\":{\"nodeA\":7}}]}",
		       "local_path_map entry for nodeA is not a path");
	expect_refused("nvmeof/bad8",
		       "{\"server_name\":\"s\",\"protocol\":\"nvmeof\",\"buffers\":[{\"length\":4096,"
		       "\"file_path\":7}]}",
		       "buffer 0: missing or bad \"file_path\"");
	/* another host's entry may be anything: it is not ours to read */
	nv_put_desc("nvmeof/otherhost",
		    "{\"server_name\":\"s\",\"protocol\":\"nvmeof\",\"buffers\":[{\"length\":4096,"
		    "\"file_path\":\"/nonexistent\",\"local_path_map\":{\"nodeZ\":7}}]}");
	te_segment_id id = te_segment_open(eng, "nvmeof/otherhost");
	CHECK(id > 0);
	if (id > 0)
		CHECK_EQ(te_segment_close(eng, id), 0);
	/* forcing this transport onto a memory segment is refused */
	te_engine *other = NULL;
	REQUIRE(te_engine_create(nv_conn, "nodeRam", NULL, 0, &other) == 0);
	cap_start();
	CHECK(te_segment_open_with(eng, "nodeRam", "nvmeof") < 0);
	CHECK(cap_has("not \"nvmeof\""));
	te_engine_destroy(other);
}

static void test_missing_file(void)
{
	unsigned char data[8192];
	fill_pattern(data, sizeof data, 3);
	nv_write_file(nv_path("present"), data, sizeof data);
	const char *paths[] = { nv_path("present"), nv_path("absent"), nv_path("present") };
	const uint64_t lens[] = { 8192, 8192, 8192 };
	nv_put_files("nvmeof/holes", paths, lens, 3);

	cap_start();
	te_segment_id seg = te_segment_open(eng, "nvmeof/holes");
	REQUIRE(seg > 0); /* the segment opens: the other files are fine */
	CHECK(cap_has("cannot be opened: No such file or directory"));
	CHECK(cap_has(nv_path("absent")));

	te_request r[4] = {
		{ TE_OP_READ, seg, mem, 0, 8192 },             /* first file: fine */
		{ TE_OP_READ, seg, mem + 8192, 8192, 100 },    /* the missing file */
		{ TE_OP_WRITE, seg, mem + 16384, 8000, 400 },  /* spans into it */
		{ TE_OP_READ, seg, mem + 32768, 16384, 8192 }, /* third file */
	};
	int32_t st[4];
	cap_start();
	CHECK_EQ(nv_run(eng, r, 4, st), 2);
	CHECK_EQ(st[0], TE_TASK_COMPLETED);
	CHECK_EQ(st[1], TE_TASK_FAILED);
	CHECK_EQ(st[2], TE_TASK_FAILED);
	CHECK_EQ(st[3], TE_TASK_COMPLETED);
	CHECK(memcmp(mem, data, 8192) == 0);
	CHECK(memcmp(mem + 32768, data, 8192) == 0);
	CHECK(cap_has("needs file 1"));
	CHECK(cap_has("could not be opened: No such file or directory"));
	te_task_status ts;
	CHECK_EQ(run_one(eng, TE_OP_READ, seg, mem, 9000, 10, &ts), TE_TASK_FAILED);
	CHECK_EQ(ts.error, -ENOENT);
	CHECK_EQ(te_segment_close(eng, seg), 0);

	/* the file appears: a refresh opens it */
	seg = te_segment_open(eng, "nvmeof/holes");
	REQUIRE(seg > 0);
	nv_write_file(nv_path("absent"), data, sizeof data);
	CHECK_EQ(run_one(eng, TE_OP_READ, seg, mem, 8192, 8192, &ts), TE_TASK_FAILED);
	CHECK_EQ(te_segment_refresh(eng, seg), 0);
	CHECK_EQ(run_one(eng, TE_OP_READ, seg, mem, 8192, 8192, &ts), TE_TASK_COMPLETED);
	CHECK(memcmp(mem, data, 8192) == 0);
	CHECK_EQ(te_segment_close(eng, seg), 0);
}

/* Segment `name` of one file, `path`, declared `len` bytes long, put in the
 * store and opened here: its id; the log is captured from before the open. */
static te_segment_id one_file(const char *name, const char *path, uint64_t len)
{
	const char *paths[] = { path };
	const uint64_t lens[] = { len };
	nv_put_files(name, paths, lens, 1);
	cap_start();
	return te_segment_open(eng, name);
}

static void test_directory(void)
{
	te_segment_id seg = one_file("nvmeof/dir", nv_dir, 4096);
	REQUIRE(seg > 0);
	te_task_status ts;
	CHECK_EQ(run_one(eng, TE_OP_READ, seg, mem, 0, 4096, &ts), TE_TASK_FAILED);
	CHECK(cap_has("Is a directory"));
	CHECK_EQ(te_segment_close(eng, seg), 0);
}

/* The descriptor declares more than the file holds. */
static void test_short_file(void)
{
	unsigned char data[4096 + 10];
	fill_pattern(data, sizeof data, 9);
	nv_write_file(nv_path("short"), data, sizeof data);
	te_segment_id seg = one_file("nvmeof/short", nv_path("short"), 1u << 20);
	REQUIRE(seg > 0);
	CHECK(cap_has("holds 4106 bytes but its descriptor declares 1048576"));
	te_task_status ts;
	CHECK_EQ(run_one(eng, TE_OP_READ, seg, mem, 0, 4096, &ts), TE_TASK_COMPLETED);
	CHECK(memcmp(mem, data, 4096) == 0);
	CHECK_EQ(run_one(eng, TE_OP_READ, seg, mem, 4000, 106, &ts), TE_TASK_COMPLETED);
	CHECK(memcmp(mem, data + 4000, 106) == 0);

	/* straddling the real end: the bytes up to it arrive, then the error */
	cap_start();
	CHECK_EQ(run_one(eng, TE_OP_READ, seg, mem, 4000, 200, &ts), TE_TASK_FAILED);
	CHECK_EQ(ts.error, -ENODATA);
	CHECK(cap_has("read past the end of"));
	CHECK(cap_has("the file holds 4106 bytes (its descriptor declares 1048576)"));
	/* wholly past it, aligned (the direct path) and not */
	CHECK_EQ(run_one(eng, TE_OP_READ, seg, mem, 65536, 65536, &ts), TE_TASK_FAILED);
	CHECK_EQ(ts.error, -ENODATA);
	CHECK_EQ(run_one(eng, TE_OP_READ, seg, mem + 1, 65537, 100, &ts), TE_TASK_FAILED);
	/* a write there extends the file; then the read succeeds */
	fill_pattern(mem, 65536, 10);
	CHECK_EQ(run_one(eng, TE_OP_WRITE, seg, mem, 65536, 65536, &ts), TE_TASK_COMPLETED);
	CHECK_EQ(run_one(eng, TE_OP_READ, seg, mem + 65536, 65536, 65536, &ts), TE_TASK_COMPLETED);
	CHECK(memcmp(mem, mem + 65536, 65536) == 0);
	CHECK_EQ(te_segment_close(eng, seg), 0);
}

static void test_outside_segment(void)
{
	unsigned char data[4096];
	fill_pattern(data, sizeof data, 1);
	nv_write_file(nv_path("small"), data, sizeof data);
	te_segment_id seg = one_file("nvmeof/small", nv_path("small"), 4096);
	REQUIRE(seg > 0);
	te_task_status ts;
	cap_start();
	CHECK_EQ(run_one(eng, TE_OP_READ, seg, mem, 4000, 97, &ts), TE_TASK_INVALID);
	CHECK_EQ(ts.error, TE_ERR_ADDRESS);
	CHECK(cap_has("outside the buffers of segment"));
	CHECK_EQ(run_one(eng, TE_OP_WRITE, seg, mem, UINT64_MAX - 10, 20, &ts), TE_TASK_INVALID);
	CHECK_EQ(run_one(eng, TE_OP_READ, seg, mem, 4096, 1, &ts), TE_TASK_INVALID);
	CHECK_EQ(run_one(eng, TE_OP_READ, seg, mem, 4095, 1, &ts), TE_TASK_COMPLETED);
	CHECK_EQ(mem[0], data[4095]);

	/* GPU memory cannot be reached without GPUDirect Storage */
	unsigned char *gpu = aligned_alloc(4096, 4096);
	REQUIRE(gpu != NULL);
	CHECK_EQ(te_register_memory(eng, gpu, 4096, "cuda:0", 0), 0);
	cap_start();
	CHECK_EQ(run_one(eng, TE_OP_READ, seg, gpu, 0, 4096, &ts), TE_TASK_FAILED);
	CHECK_EQ(ts.error, -ENOTSUP);
	CHECK(cap_has("GPUDirect Storage"));
	CHECK_EQ(te_unregister_memory(eng, gpu), 0);
	free(gpu);
	CHECK_EQ(te_segment_close(eng, seg), 0);
}

/* A file this host may only read (immutable: even root cannot write it):
 * reads work, writes fail with -EROFS and say why. */
static void test_read_only_file(void)
{
	unsigned char data[4096];
	const char *path = nv_path("immutable");
	fill_pattern(data, sizeof data, 12);
	nv_write_file(path, data, sizeof data);
	int fd = open(path, O_RDONLY), flags = 0;
	REQUIRE(fd >= 0);
	if (ioctl(fd, FS_IOC_GETFLAGS, &flags) != 0 ||
	    (flags |= FS_IMMUTABLE_FL, ioctl(fd, FS_IOC_SETFLAGS, &flags)) != 0) {
		fprintf(stderr, "  (cannot make %s immutable here: %s; check skipped)\n", path, strerror(errno));
		close(fd);
		return;
	}
	te_segment_id seg = one_file("nvmeof/ro", path, 4096);
	CHECK(seg > 0);
	CHECK(cap_has("is read-only here; writes to it will fail"));
	te_task_status ts;
	CHECK_EQ(run_one(eng, TE_OP_READ, seg, mem, 0, 4096, &ts), TE_TASK_COMPLETED);
	CHECK(memcmp(mem, data, 4096) == 0);
	cap_start();
	CHECK_EQ(run_one(eng, TE_OP_WRITE, seg, mem, 0, 10, &ts), TE_TASK_FAILED);
	CHECK_EQ(ts.error, -EROFS);
	CHECK(cap_has("which is read-only here"));
	if (seg > 0)
		CHECK_EQ(te_segment_close(eng, seg), 0);
	flags &= ~FS_IMMUTABLE_FL;
	CHECK_EQ(ioctl(fd, FS_IOC_SETFLAGS, &flags), 0); /* or the cleanup cannot remove it */
	close(fd);
}

static void test_report(void)
{
	char *text = NULL;
	CHECK_EQ(te_plugin_report("nvmeof", &text), 0);
	CHECK(text != NULL && strstr(text, "io_uring: available") != NULL);
	CHECK(text != NULL && strstr(text, "TE_NVMEOF_QUEUE_DEPTH=128") != NULL);
	CHECK(text != NULL && strstr(text, "TE_NVMEOF_REAP_TICK_MS=100") != NULL);
	/* the submission mode in effect: caller unless the environment says worker */
	const char *mode = getenv("TE_NVMEOF_SUBMIT");
	char want[64];
	snprintf(want, sizeof want, "TE_NVMEOF_SUBMIT=%s", mode != NULL && !strcmp(mode, "worker") ? "worker" : "caller");
	CHECK(text != NULL && strstr(text, want) != NULL);
	te_free(text);
}

static void test_bad_config(void)
{
	cap_start();
	te_engine *e = nv_engine("nodeC", "TE_NVMEOF_QUEUE_DEPTH", "0", "TE_NVMEOF_SLICE_SIZE", "12",
				 "TE_NVMEOF_WORKERS", "lots", "TE_NVMEOF_REAP_TICK_MS", "0", NULL);
	REQUIRE(e != NULL); /* defaults, with warnings naming each variable */
	CHECK(cap_has("TE_NVMEOF_QUEUE_DEPTH=0 is not a number in [1, 4096]"));
	CHECK(cap_has("TE_NVMEOF_REAP_TICK_MS=0 is not a number in [1, 1000]"));
	CHECK(cap_has("TE_NVMEOF_SLICE_SIZE=12 is not a number"));
	CHECK(cap_has("TE_NVMEOF_WORKERS=lots is not a number"));
	te_engine_destroy(e);
	e = nv_engine("nodeC", "TE_NVMEOF_SLICE_SIZE", "10000", NULL);
	REQUIRE(e != NULL);
	CHECK(cap_has("TE_NVMEOF_SLICE_SIZE=10000 is not a multiple of 4096; using 8192"));
	te_engine_destroy(e);
	e = nv_engine("nodeC", "TE_NVMEOF_SUBMIT", "sideways", NULL);
	REQUIRE(e != NULL);
	CHECK(cap_has("TE_NVMEOF_SUBMIT=sideways is neither \"caller\" nor \"worker\"; using caller"));
	te_engine_destroy(e);
}

int main(void)
{
	nv_setup();
	eng = nv_engine("nodeA", NULL);
	mem = nv_memory(eng, MEM);

	TEST_RUN(test_store_without_key);
	TEST_RUN(test_malformed_descriptors);
	TEST_RUN(test_missing_file);
	TEST_RUN(test_directory);
	TEST_RUN(test_short_file);
	TEST_RUN(test_outside_segment);
	TEST_RUN(test_read_only_file);
	TEST_RUN(test_report);
	TEST_RUN(test_bad_config);

	CHECK_EQ(te_unregister_memory(eng, mem), 0);
	te_engine_destroy(eng);
	free(mem);
	return check_done();
}
