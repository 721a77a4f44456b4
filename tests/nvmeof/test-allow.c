/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TE_NVMEOF_ALLOW: the store names the files, this host decides which it
 * opens. A file in a listed directory is served; one outside, one reached by
 * "..", by a symlink (to a file or through a directory), or in a directory
 * whose name merely starts like a listed one is refused with TE_ERR_REJECTED
 * and a line naming the path and the variable, and is never touched. FIFOs
 * and character devices are refused even when listed, a block device below a
 * listed directory too. Unset, nothing is served. The environment variable
 * and the engine option both work, the option winning. Through all of it the
 * engine keeps serving what it may.
 */
#include <sys/sysmacros.h>

#include "nv-util.h"

#define LEN 8192u

static unsigned char data[LEN], secret[LEN];
static unsigned char *mem;
static char allowed[4200], outside[4200];

/* "<nv_dir>/<rel>" */
static const char *at(const char *rel)
{
	return nv_path(rel);
}

static te_engine *engine(const char *allow_option)
{
	te_option opt[2] = { { "transports", "nvmeof" }, { "TE_NVMEOF_ALLOW", allow_option } };
	te_engine *e = NULL;
	int rc = te_engine_create(nv_conn, "nodeA", opt, allow_option ? 2 : 1, &e);
	if (rc != 0)
		fprintf(stderr, "engine create failed: %s\n", te_strerror(rc));
	REQUIRE(e != NULL);
	REQUIRE(te_register_memory(e, mem, 4 * LEN, "cpu:0", 0) == 0);
	return e;
}

static void done(te_engine *e)
{
	CHECK_EQ(te_unregister_memory(e, mem), 0);
	te_engine_destroy(e);
}

/* A one-file segment over `path`. */
static te_segment_id open_one(te_engine *e, const char *seg, const char *path)
{
	const char *paths[] = { path };
	const uint64_t lens[] = { LEN };
	nv_put_files(seg, paths, lens, 1);
	te_segment_id id = te_segment_open(e, seg);
	CHECK(id > 0);
	return id;
}

/* Reading (and writing, when `write`) the segment's file ends `want_state`,
 * with `want_err`. */
static void expect_rw(te_engine *e, te_segment_id seg, int want_state, int want_err, bool write)
{
	te_task_status st;
	memset(mem, 0, LEN);
	CHECK_EQ(run_one(e, TE_OP_READ, seg, mem, 0, LEN, &st), want_state);
	CHECK_EQ(st.error, want_err);
	if (want_state == TE_TASK_COMPLETED)
		CHECK(memcmp(mem, data, LEN) == 0);
	/* the bytes the file holds, so a served file stays as it was and a
	 * refused one would show any write */
	memcpy(mem + LEN, data + LEN - 16, 16);
	if (!write)
		return;
	CHECK_EQ(run_one(e, TE_OP_WRITE, seg, mem + LEN, LEN - 16, 16, &st), want_state);
	CHECK_EQ(st.error, want_err);
}

static void expect(te_engine *e, te_segment_id seg, int want_state, int want_err)
{
	expect_rw(e, seg, want_state, want_err, true);
}

/* `path` is refused at open with a line naming it and the variable, the
 * transfers fail with TE_ERR_REJECTED (a write is tried only when `write`),
 * and the secret stays as it was. */
static void expect_refused_rw(te_engine *e, const char *seg, const char *path, const char *log,
			      bool write)
{
	cap_start();
	te_segment_id id = open_one(e, seg, path);
	CHECK(cap_has(path));
	CHECK(cap_has(log));
	CHECK(cap_has("refused"));
	cap_start();
	expect_rw(e, id, TE_TASK_FAILED, TE_ERR_REJECTED, write);
	CHECK(cap_has("refused (outside TE_NVMEOF_ALLOW"));
	unsigned char *now = nv_read_file(nv_path("outside/secret"), LEN);
	CHECK(memcmp(now, secret, LEN) == 0);
	free(now);
	if (id > 0)
		CHECK_EQ(te_segment_close(e, id), 0);
}

static void expect_refused(te_engine *e, const char *seg, const char *path, const char *log)
{
	expect_refused_rw(e, seg, path, log, true);
}

static void test_allowed_file(void)
{
	te_engine *e = engine(NULL); /* the environment's list */
	te_segment_id id = open_one(e, "nvmeof/ok", at("allowed/a"));
	expect(e, id, TE_TASK_COMPLETED, 0);
	CHECK_EQ(te_segment_close(e, id), 0);
	/* through a symlink and a ".." that stay inside, and a missing file
	 * inside: judged by where they are, so that one is a plain -ENOENT */
	id = open_one(e, "nvmeof/ok-link", at("allowed/link-in"));
	expect(e, id, TE_TASK_COMPLETED, 0);
	CHECK_EQ(te_segment_close(e, id), 0);
	id = open_one(e, "nvmeof/ok-dots", at("allowed/sub/../a"));
	expect(e, id, TE_TASK_COMPLETED, 0);
	CHECK_EQ(te_segment_close(e, id), 0);
	id = open_one(e, "nvmeof/ok-missing", at("allowed/not-yet"));
	expect(e, id, TE_TASK_FAILED, -ENOENT);
	CHECK_EQ(te_segment_close(e, id), 0);
	done(e);
}

static void test_outside(void)
{
	te_engine *e = engine(NULL);
	expect_refused(e, "nvmeof/out", at("outside/secret"), "is outside TE_NVMEOF_ALLOW");
	/* a listed name is a directory, not a prefix */
	expect_refused(e, "nvmeof/prefix", at("allowedX/f"), "is outside TE_NVMEOF_ALLOW");
	/* a missing file outside is refused, not reported missing */
	expect_refused(e, "nvmeof/out-missing", at("outside/nothing"), "is outside TE_NVMEOF_ALLOW");

	/* one refused file in a segment leaves the others served */
	const char *paths[] = { at("allowed/a"), at("outside/secret"), at("allowed/a") };
	const uint64_t lens[] = { LEN, LEN, LEN };
	nv_put_files("nvmeof/mixed", paths, lens, 3);
	te_segment_id id = te_segment_open(e, "nvmeof/mixed");
	REQUIRE(id > 0);
	te_task_status st;
	CHECK_EQ(run_one(e, TE_OP_READ, id, mem, 0, LEN, &st), TE_TASK_COMPLETED);
	CHECK_EQ(run_one(e, TE_OP_READ, id, mem, LEN, LEN, &st), TE_TASK_FAILED);
	CHECK_EQ(st.error, TE_ERR_REJECTED);
	CHECK_EQ(run_one(e, TE_OP_WRITE, id, mem, LEN - 8, 16, &st), TE_TASK_FAILED);
	CHECK_EQ(run_one(e, TE_OP_READ, id, mem, 2 * LEN, LEN, &st), TE_TASK_COMPLETED);
	CHECK(memcmp(mem, data, LEN) == 0);
	/* a refresh looks again, and refuses again */
	CHECK_EQ(te_segment_refresh(e, id), 0);
	CHECK_EQ(run_one(e, TE_OP_READ, id, mem, LEN, LEN, &st), TE_TASK_FAILED);
	CHECK_EQ(st.error, TE_ERR_REJECTED);
	CHECK_EQ(te_segment_close(e, id), 0);

	/* and the engine goes on serving */
	id = open_one(e, "nvmeof/after", at("allowed/a"));
	expect(e, id, TE_TASK_COMPLETED, 0);
	CHECK_EQ(te_segment_close(e, id), 0);
	done(e);
}

static void test_escapes(void)
{
	te_engine *e = engine(NULL);
	expect_refused(e, "nvmeof/dots", at("allowed/../outside/secret"), "is outside TE_NVMEOF_ALLOW");
	expect_refused(e, "nvmeof/dots2", at("allowed/sub/../../outside/secret"),
		       "is outside TE_NVMEOF_ALLOW");
	/* ".." past a part that is missing could lead anywhere once it exists */
	expect_refused(e, "nvmeof/dots3", at("allowed/missing/../../outside/secret"),
		       "is outside TE_NVMEOF_ALLOW");
	/* the line names where the symlink leads */
	char log[9000];
	snprintf(log, sizeof log, "(resolves to %s/secret) is outside TE_NVMEOF_ALLOW", outside);
	expect_refused(e, "nvmeof/link", at("allowed/link-out"), log);
	expect_refused(e, "nvmeof/link-dir", at("allowed/dir-out/secret"), log);
	done(e);
}

static void test_types(void)
{
	/* listed themselves, and their directory too: still refused */
	char allow[9000];
	snprintf(allow, sizeof allow, "%s:/dev/null:/dev/zero:/dev", allowed);
	te_engine *e = engine(allow);
	expect_refused(e, "nvmeof/null", "/dev/null", "is a character device");
	expect_refused(e, "nvmeof/zero", "/dev/zero", "is a character device");
	expect_refused(e, "nvmeof/fifo", at("allowed/fifo"), "is a FIFO");
	/* a whole disk is served only when named itself, not for its directory;
	 * any block device node will do: it is never opened, and should that
	 * break, only read */
	const char *disks[] = { "/dev/loop0", "/dev/vda", "/dev/sda", "/dev/nvme0n1" };
	const char *disk = NULL;
	for (size_t i = 0; i < sizeof disks / sizeof disks[0] && disk == NULL; i++) {
		struct stat st;
		if (stat(disks[i], &st) == 0 && S_ISBLK(st.st_mode))
			disk = disks[i];
	}
	if (disk != NULL)
		expect_refused_rw(e, "nvmeof/disk", disk, "does not name itself", false);
	else
		fprintf(stderr, "  (no block device node here; that case skipped)\n");
	done(e);
}

static void test_env_and_option(void)
{
	char *saved = strdup(getenv("TE_NVMEOF_ALLOW"));
	te_segment_id id;

	/* unset: nothing, with a line saying what to set */
	REQUIRE(unsetenv("TE_NVMEOF_ALLOW") == 0);
	te_engine *e = engine(NULL);
	expect_refused(e, "nvmeof/unset", at("allowed/a"), "TE_NVMEOF_ALLOW is unset");
	done(e);
	/* set to nothing is unset */
	REQUIRE(setenv("TE_NVMEOF_ALLOW", "", 1) == 0);
	e = engine(NULL);
	expect_refused(e, "nvmeof/empty", at("allowed/a"), "TE_NVMEOF_ALLOW is unset");
	done(e);
	/* relative entries are ignored, with a warning */
	REQUIRE(setenv("TE_NVMEOF_ALLOW", "allowed", 1) == 0);
	cap_start();
	e = engine(NULL);
	CHECK(cap_has("TE_NVMEOF_ALLOW: \"allowed\" is not an absolute path; ignored"));
	expect_refused(e, "nvmeof/relative", at("allowed/a"), "is outside TE_NVMEOF_ALLOW (allowed)");
	done(e);

	/* the option alone */
	REQUIRE(unsetenv("TE_NVMEOF_ALLOW") == 0);
	e = engine(allowed);
	id = open_one(e, "nvmeof/opt", at("allowed/a"));
	expect(e, id, TE_TASK_COMPLETED, 0);
	CHECK_EQ(te_segment_close(e, id), 0);
	done(e);
	/* the variable alone, several entries, empty ones skipped */
	char list[9000];
	snprintf(list, sizeof list, "/nonexistent::%s:", allowed);
	REQUIRE(setenv("TE_NVMEOF_ALLOW", list, 1) == 0);
	e = engine(NULL);
	id = open_one(e, "nvmeof/env", at("allowed/a"));
	expect(e, id, TE_TASK_COMPLETED, 0);
	CHECK_EQ(te_segment_close(e, id), 0);
	done(e);
	/* both: the option wins */
	REQUIRE(setenv("TE_NVMEOF_ALLOW", allowed, 1) == 0);
	e = engine(outside);
	expect_refused(e, "nvmeof/both", at("allowed/a"), "is outside TE_NVMEOF_ALLOW");
	done(e);
	/* a single file named itself */
	REQUIRE(unsetenv("TE_NVMEOF_ALLOW") == 0);
	e = engine(at("allowed/a"));
	id = open_one(e, "nvmeof/exact", at("allowed/a"));
	expect(e, id, TE_TASK_COMPLETED, 0);
	CHECK_EQ(te_segment_close(e, id), 0);
	expect_refused(e, "nvmeof/exact-other", at("allowed/b"), "is outside TE_NVMEOF_ALLOW");
	done(e);

	/* te-info shows the list in effect */
	REQUIRE(setenv("TE_NVMEOF_ALLOW", allowed, 1) == 0);
	char *text = NULL;
	CHECK_EQ(te_plugin_report("nvmeof", &text), 0);
	char want[9000];
	snprintf(want, sizeof want, "TE_NVMEOF_ALLOW=%s", allowed);
	CHECK(text != NULL && strstr(text, want) != NULL);
	te_free(text);
	REQUIRE(setenv("TE_NVMEOF_ALLOW", saved, 1) == 0);
	free(saved);
}

int main(void)
{
	nv_setup();
	mem = aligned_alloc(4096, 4 * LEN);
	REQUIRE(mem != NULL);
	fill_pattern(data, LEN, 21);
	fill_pattern(secret, LEN, 22);
	snprintf(allowed, sizeof allowed, "%s", at("allowed"));
	snprintf(outside, sizeof outside, "%s", at("outside"));
	REQUIRE(mkdir(allowed, 0755) == 0 && mkdir(outside, 0755) == 0);
	REQUIRE(mkdir(at("allowed/sub"), 0755) == 0 && mkdir(at("allowedX"), 0755) == 0);
	nv_write_file(at("allowed/a"), data, LEN);
	nv_write_file(at("allowed/b"), data, LEN);
	nv_write_file(at("allowedX/f"), secret, LEN);
	nv_write_file(at("outside/secret"), secret, LEN);
	REQUIRE(symlink("a", at("allowed/link-in")) == 0);
	REQUIRE(symlink("../outside/secret", at("allowed/link-out")) == 0);
	REQUIRE(symlink("../outside", at("allowed/dir-out")) == 0);
	REQUIRE(mkfifo(at("allowed/fifo"), 0644) == 0);
	REQUIRE(setenv("TE_NVMEOF_ALLOW", allowed, 1) == 0);

	TEST_RUN(test_allowed_file);
	TEST_RUN(test_outside);
	TEST_RUN(test_escapes);
	TEST_RUN(test_types);
	TEST_RUN(test_env_and_option);

	free(mem);
	return check_done();
}
