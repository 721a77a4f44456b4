/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers of the NVMe-oF tests: a scratch directory with a file store
 * (file://<dir>/store, or the store NV_METADATA names), files filled with
 * known bytes, descriptors, engines. */
#ifndef TE_NV_UTIL_H
#define TE_NV_UTIL_H

#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/util.h"

static char nv_dir[4096];
static char nv_conn[4300];

static inline int nv_rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(p);
}

static inline void nv_cleanup(void)
{
	if (nv_dir[0] != '\0' && getenv("TEST_KEEP") == NULL)
		nftw(nv_dir, nv_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* A scratch directory on a disk file system (the build folder's, unless
 * TEST_TMPDIR says otherwise), removed at exit. Engines may open the files
 * in it and nothing else: TE_NVMEOF_ALLOW names it (tests that need more,
 * or less, set their own). */
static inline void nv_setup(void)
{
	const char *base = getenv("TEST_TMPDIR");
	char store[4200];

	if (base == NULL)
		base = getenv("TMPDIR");
	if (base == NULL)
		base = "/var/tmp";
	snprintf(nv_dir, sizeof nv_dir, "%s/te-nvmeof-XXXXXX", base);
	REQUIRE(mkdtemp(nv_dir) != NULL);
	atexit(nv_cleanup);
	REQUIRE(setenv("TE_NVMEOF_ALLOW", nv_dir, 1) == 0);
	snprintf(store, sizeof store, "%s/store", nv_dir);
	REQUIRE(mkdir(store, 0755) == 0);
	/* a real store when a wrapper started one (with-store.sh), else the folder */
	if (getenv("NV_METADATA") != NULL)
		snprintf(nv_conn, sizeof nv_conn, "%s", getenv("NV_METADATA"));
	else
		snprintf(nv_conn, sizeof nv_conn, "file://%s", store);
}

/* "<dir>/<name>" in a rotating static buffer. */
static inline const char *nv_path(const char *name)
{
	static char bufs[8][4200];
	static int next;
	char *b = bufs[next++ % 8];
	snprintf(b, sizeof bufs[0], "%s/%s", nv_dir, name);
	return b;
}

static inline void nv_write_file(const char *path, const unsigned char *data, size_t n)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	REQUIRE(fd >= 0);
	for (size_t done = 0; done < n;) {
		ssize_t w = write(fd, data + done, n - done);
		REQUIRE(w > 0);
		done += (size_t)w;
	}
	REQUIRE(fsync(fd) == 0);
	close(fd);
}

/* Reads a file's first n bytes into a fresh buffer (free()). */
static inline unsigned char *nv_read_file(const char *path, size_t n)
{
	unsigned char *b = malloc(n ? n : 1);
	int fd = open(path, O_RDONLY);
	REQUIRE(b != NULL && fd >= 0);
	size_t got = 0;
	while (got < n) {
		ssize_t r = pread(fd, b + got, n - got, (off_t)got);
		REQUIRE(r > 0);
		got += (size_t)r;
	}
	close(fd);
	return b;
}

/* Stores `json` as the descriptor of segment `name` ("nvmeof/x"). */
static inline void nv_put_desc(const char *name, const char *json)
{
	te_metadata *md = NULL;
	char key[512];
	REQUIRE(te_metadata_open(nv_conn, &md) == 0);
	REQUIRE(te_metadata_segment_key(name, key, sizeof key) > 0);
	REQUIRE(te_metadata_put(md, key, json, strlen(json)) == 0);
	te_metadata_close(md);
}

/* A descriptor of plain files: paths[i] with lengths[i], no mount paths. */
static inline void nv_put_files(const char *name, const char *const *paths, const uint64_t *lengths, size_t n)
{
	char json[16384];
	int o = snprintf(json, sizeof json, "{\"buffers\":[");
	for (size_t i = 0; i < n; i++)
		o += snprintf(json + o, sizeof json - (size_t)o,
			      "%s{\"file_path\":\"%s\",\"length\":%llu,\"local_path_map\":{}}", i ? "," : "",
			      paths[i], (unsigned long long)lengths[i]);
	snprintf(json + o, sizeof json - (size_t)o, "],\"protocol\":\"nvmeof\",\"server_name\":\"storage1\"}");
	nv_put_desc(name, json);
}

/* An engine named `name` on the test store with the nvmeof transport and
 * extra options as key, value pairs ending with NULL. */
static inline te_engine *nv_engine(const char *name, ...)
{
	te_option opts[16];
	size_t n = 0;
	va_list ap;
	te_engine *e = NULL;

	opts[n++] = (te_option){ "transports", "nvmeof" };
	va_start(ap, name);
	for (;;) {
		const char *k = va_arg(ap, const char *);
		if (k == NULL || n == 16)
			break;
		opts[n++] = (te_option){ k, va_arg(ap, const char *) };
	}
	va_end(ap);
	int rc = te_engine_create(nv_conn, name, opts, n, &e);
	if (rc != 0)
		fprintf(stderr, "engine create failed: %s\n", te_strerror(rc));
	return e;
}

/* `len` bytes of page-aligned memory registered on engine e as "cpu:0". */
static inline unsigned char *nv_memory(te_engine *e, size_t len)
{
	unsigned char *m = aligned_alloc(4096, len);
	REQUIRE(e != NULL && m != NULL);
	REQUIRE(te_register_memory(e, m, len, "cpu:0", 0) == 0);
	return m;
}

/* Runs requests as one batch; returns how many did not complete. */
static inline int nv_run(te_engine *e, const te_request *reqs, size_t n, int32_t *states)
{
	te_batch_id b;
	int bad = 0;
	REQUIRE(te_batch_alloc(e, n, &b) == 0);
	te_submit(e, b, reqs, n);
	CHECK_EQ(te_batch_wait(e, b, 60000), 0);
	for (size_t i = 0; i < n; i++) {
		te_task_status st = { 0 };
		CHECK_EQ(te_get_status(e, b, i, &st), 0);
		if (states)
			states[i] = st.state;
		if (st.state != TE_TASK_COMPLETED)
			bad++;
		else if (st.transferred != reqs[i].length)
			bad++;
	}
	CHECK_EQ(te_batch_free(e, b), 0);
	return bad;
}

static inline uint64_t nv_rand(uint64_t *s)
{
	/* xorshift64*: reproducible request mixes */
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ull;
}

/* n reads from seg of 1 to maxlen bytes each, at random offsets below span,
 * into base, each starting a page of its own (rnd: nv_rand's state). */
static inline void nv_random_reads(te_request *r, int n, te_segment_id seg, unsigned char *base, uint64_t *rnd,
				   uint64_t maxlen, uint64_t span)
{
	size_t lo = 0;
	for (int i = 0; i < n; i++) {
		uint64_t len = 1 + nv_rand(rnd) % maxlen;
		uint64_t at = nv_rand(rnd) % (span - len);
		r[i] = (te_request){ TE_OP_READ, seg, base + lo, at, len };
		lo += (len + 4095) & ~4095ull;
	}
}

/* How many of n reads brought other bytes than model holds at their offsets. */
static inline int nv_reads_differ(const te_request *r, int n, const unsigned char *model)
{
	int bad = 0;
	for (int i = 0; i < n; i++)
		bad += memcmp(r[i].local, model + r[i].remote, r[i].length) != 0;
	return bad;
}

/* Registers `len` bytes at `mem` with `e` (an engine that must have
 * started) and opens the segment `name`. */
static inline te_segment_id nv_register_open(te_engine *e, void *mem, size_t len, const char *name)
{
	REQUIRE(e != NULL);
	REQUIRE(te_register_memory(e, mem, len, "cpu:0", 0) == 0);
	te_segment_id seg = te_segment_open(e, name);
	REQUIRE(seg > 0);
	return seg;
}

/* One of the threads of nv_threads_run(): the engine, the segment it
 * reads, its index, its part of memory (base), its random state (rnd, for
 * nv_random_reads()), whether it polls for its batches rather than waits;
 * it counts its faults in `bad`. */
typedef struct nv_thread {
	te_engine *e;
	te_segment_id seg;
	unsigned char *base;
	uint64_t rnd;
	int index;
	bool poll;
	int bad;
} nv_thread;

#define NV_THREADS_MAX 8

/* Runs `fn` on `n` threads at once, each on a copy of `proto` of its own:
 * thread i has index i, base proto->base + i * part, rnd proto->rnd + i,
 * and polls when it is among the last `npoll`. Joins them all, then checks
 * that none counted a fault. */
static inline void nv_threads_run(void *(*fn)(void *), int n, int npoll, const nv_thread *proto, size_t part)
{
	pthread_t th[NV_THREADS_MAX];
	nv_thread w[NV_THREADS_MAX];

	REQUIRE(n <= NV_THREADS_MAX);
	for (int i = 0; i < n; i++) {
		w[i] = *proto;
		w[i].index = i;
		w[i].base = proto->base + (size_t)i * part;
		w[i].rnd = proto->rnd + (uint64_t)i;
		w[i].poll = i >= n - npoll;
		w[i].bad = 0;
		REQUIRE(pthread_create(&th[i], NULL, fn, &w[i]) == 0);
	}
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < n; i++) {
		if (w[i].bad != 0)
			fprintf(stderr, "  thread %d of %d counted %d faults\n", i, n, w[i].bad);
		CHECK_EQ(w[i].bad, 0);
	}
}

#endif
