/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prep-bench: what prepared transfers cost, and what a first transfer to a
 * new peer costs (docs/benchmarks.md, "Prepared transfers").
 *
 *   prep-bench submit [--transport tcp|shm] [--count N] [--size B] [--runs R] [--regions G]
 *                     [--adjacent 0|1]
 *       The submit side of posting N pieces of B bytes between two engines
 *       of this process (the target's pieces in a scattered order, so that
 *       none merge), through te_submit_prepared() and through te_submit()
 *       with a te_request array built beforehand; the call's CPU and wall
 *       time divided by N, median and minimum of R runs. Each side's pool is
 *       registered as G regions (1). --adjacent 1: the target's pieces in
 *       order instead, so that the pairs of each region merge into one task.
 *       Every run's bytes are checked.
 *   prep-bench first [--regs N] [--peers P]
 *       A target process with N registered buffers (P2PHANDSHAKE, TCP);
 *       P times over: a fresh engine of this process opens it and completes
 *       one 4 KiB READ. The time from te_segment_open() to the completed
 *       transfer (handshake included), median and 90th percentile.
 *   prep-bench target N   (the target of `first`; started by it)
 */
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <te/te.h>

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* This thread's CPU time: what a call costs without the time it spent
 * preempted (the transport's threads start moving data at once and share
 * the cores). */
static double cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static size_t gcd(size_t a, size_t b)
{
	while (b != 0) {
		size_t t = a % b;
		a = b;
		b = t;
	}
	return a;
}

static void die(const char *what, int rc)
{
	fprintf(stderr, "prep-bench: %s: %s\n", what, te_strerror(rc));
	exit(1);
}

static te_engine *engine(const char *transports)
{
	te_engine *e = NULL;
	te_option opt = { "transports", transports };
	int rc = te_engine_create("P2PHANDSHAKE", "127.0.0.1", &opt, 1, &e);
	if (rc < 0)
		die("te_engine_create", rc);
	return e;
}

static void wait_ok(te_engine *e, te_batch_id b)
{
	int32_t state = 0;
	int rc = te_batch_wait(e, b, 60000);
	if (rc < 0)
		die("te_batch_wait", rc);
	te_batch_status(e, b, NULL, NULL, &state);
	if (state != TE_TASK_COMPLETED) {
		fprintf(stderr, "prep-bench: batch ended in state %d\n", state);
		exit(1);
	}
}

/* ------------------------------------------------------------ submit */

/* Reads 32 MiB: each timed call starts with caches that hold neither its
 * lists nor its request array (as after the work between two requests). */
static unsigned char *sweep_buf;

static void sweep(void)
{
	enum { SWEEP = 32 << 20 };
	volatile unsigned sum = 0;
	if (sweep_buf == NULL && (sweep_buf = calloc(1, SWEEP)) == NULL)
		die("calloc", -ENOMEM);
	for (size_t i = 0; i < SWEEP; i += 64)
		sum += sweep_buf[i];
	(void)sum;
}

/* A batch for `n` requests, the caches swept after it is made. */
static te_batch_id swept_batch(te_engine *e, size_t n)
{
	te_batch_id b;
	int rc = te_batch_alloc(e, n, &b);
	if (rc < 0)
		die("te_batch_alloc", rc);
	sweep();
	return b;
}

/* Waits for the READs of batch `b`, frees it and checks that piece k of
 * `abuf` now holds piece ri[k] of `bbuf`. */
static void read_checked(te_engine *e, te_batch_id b, const unsigned char *abuf, const unsigned char *bbuf,
			 const uint32_t *ri, size_t n, size_t size, const char *what)
{
	wait_ok(e, b);
	te_batch_free(e, b);
	for (size_t k = 0; k < n; k++)
		if (memcmp(abuf + k * size, bbuf + ri[k] * size, size) != 0)
			die(what, -EPROTO);
}

static int bench_submit(const char *tp, size_t n, size_t size, int runs, size_t nregs, int adjacent)
{
	te_engine *a = engine(strcmp(tp, "shm") == 0 ? "shm,tcp" : tp), *b = engine(strcmp(tp, "shm") == 0 ? "shm,tcp" : tp);
	size_t pool = n * size;
	unsigned char *abuf = NULL, *bbuf = NULL;
	int rc;

	if (strcmp(tp, "shm") == 0) {
		/* the same-host transport maps te_mem_alloc() memory */
		if ((rc = te_mem_alloc(pool, (void **)&abuf)) < 0 || (rc = te_mem_alloc(pool, (void **)&bbuf)) < 0)
			die("te_mem_alloc", rc);
	} else {
		abuf = aligned_alloc(4096, pool);
		bbuf = aligned_alloc(4096, pool);
		if (abuf == NULL || bbuf == NULL)
			die("aligned_alloc", -ENOMEM);
	}
	/* Each pool as nregs registrations (a paged pool registered per layer,
	 * say): what te_submit() searches per request. */
	te_memory_region *ra = calloc(nregs, sizeof *ra), *rb = calloc(nregs, sizeof *rb);
	if (ra == NULL || rb == NULL)
		die("calloc", -ENOMEM);
	for (size_t i = 0; i < nregs; i++) {
		ra[i] = (te_memory_region){ abuf + i * (pool / nregs), pool / nregs, "cpu:0", 0 };
		rb[i] = (te_memory_region){ bbuf + i * (pool / nregs), pool / nregs, "cpu:0", TE_MEM_REMOTE_ACCESS };
	}
	if ((rc = te_register_memory_batch(a, ra, nregs)) < 0 || (rc = te_register_memory_batch(b, rb, nregs)) < 0)
		die("te_register_memory_batch", rc);
	free(ra);
	free(rb);
	te_segment_id seg = te_segment_open(a, te_engine_name(b));
	if (seg < 0)
		die("te_segment_open", seg);
	const char *used = te_segment_transport(a, seg);

	te_piece *lp = malloc(n * sizeof *lp), *rp = malloc(n * sizeof *rp);
	uint32_t *ri = malloc(n * sizeof *ri);
	te_request *reqs = malloc(n * sizeof *reqs);
	double *tprep = malloc(runs * sizeof *tprep), *treq = malloc(runs * sizeof *treq);
	double *cprep = malloc(runs * sizeof *cprep), *creq = malloc(runs * sizeof *creq);
	double *cbuild = malloc(runs * sizeof *cbuild);
	if (!lp || !rp || !ri || !reqs || !tprep || !treq || !cprep || !creq || !cbuild)
		die("malloc", -ENOMEM);
	/* A permutation with no two neighbours adjacent: (k * step) mod n with
	 * a step near n/2 prime to n. */
	size_t step = (n / 2) | 1;
	while (gcd(step, n) != 1)
		step += 2;
	for (size_t k = 0; k < n; k++) {
		lp[k] = (te_piece){ (uintptr_t)abuf + k * size, size };
		rp[k] = (te_piece){ (uintptr_t)bbuf + k * size, size };
		ri[k] = adjacent ? (uint32_t)k : (uint32_t)((k * step) % n);
	}
	te_xfer_list *L = NULL, *R = NULL;
	double p0 = cpu_ns();
	if ((rc = te_xfer_list_prepare(a, TE_LOCAL_SEGMENT, lp, n, 0, &L)) < 0 ||
	    (rc = te_xfer_list_prepare(a, seg, rp, n, 0, &R)) < 0)
		die("te_xfer_list_prepare", rc);
	double prep_ns = cpu_ns() - p0;

	for (int r = 0; r < runs; r++) {
		for (size_t k = 0; k < pool; k += 4096)
			bbuf[k] = (unsigned char)(r + k / 4096);
		size_t tasks = 0;
		te_batch_id bid = swept_batch(a, n);
		double c0 = cpu_ns(), t0 = now_ns();
		rc = te_submit_prepared(a, bid, TE_OP_READ, L, NULL, R, ri, n, NULL, &tasks);
		tprep[r] = now_ns() - t0;
		cprep[r] = cpu_ns() - c0;
		if (rc != 0 || tasks != (adjacent ? nregs : n))
			die("te_submit_prepared", rc < 0 ? rc : -EPROTO);
		read_checked(a, bid, abuf, bbuf, ri, n, size, "prepared READ moved the wrong bytes");

		memset(abuf, 0, pool);
		/* What a caller of te_submit() does every time: requests from the
		 * same block tables (here: the prepared lists' pieces). */
		c0 = cpu_ns();
		for (size_t k = 0; k < n; k++)
			reqs[k] = (te_request){ TE_OP_READ, seg, (void *)(uintptr_t)lp[k].addr, rp[ri[k]].addr, size };
		cbuild[r] = cpu_ns() - c0;
		bid = swept_batch(a, n);
		c0 = cpu_ns();
		t0 = now_ns();
		rc = te_submit(a, bid, reqs, n);
		treq[r] = now_ns() - t0;
		creq[r] = cpu_ns() - c0;
		if (rc != 0)
			die("te_submit", rc < 0 ? rc : -EPROTO);
		read_checked(a, bid, abuf, bbuf, ri, n, size, "te_submit READ moved the wrong bytes");
	}
	qsort(tprep, runs, sizeof *tprep, cmp_double);
	qsort(treq, runs, sizeof *treq, cmp_double);
	qsort(cprep, runs, sizeof *cprep, cmp_double);
	qsort(creq, runs, sizeof *creq, cmp_double);
	qsort(cbuild, runs, sizeof *cbuild, cmp_double);
	printf("transport %s, %zu %s pieces of %zu bytes in %zu registrations a side, %d runs; prepare (both "
	       "lists, once) CPU %.0f ns/piece\n", used, n, adjacent ? "adjacent" : "scattered", size, nregs, runs,
	       prep_ns / (double)n);
	printf("  te_submit_prepared: CPU median %.1f ns/piece (min %.1f), wall median %.1f (min %.1f)\n",
	       cprep[runs / 2] / (double)n, cprep[0] / (double)n, tprep[runs / 2] / (double)n, tprep[0] / (double)n);
	printf("  te_submit:          CPU median %.1f ns/piece (min %.1f), wall median %.1f (min %.1f)\n",
	       creq[runs / 2] / (double)n, creq[0] / (double)n, treq[runs / 2] / (double)n, treq[0] / (double)n);
	printf("  (building the te_request array before it: CPU median %.1f ns/piece)\n", cbuild[runs / 2] / (double)n);
	te_xfer_list_free(L);
	te_xfer_list_free(R);
	te_segment_close(a, seg);
	te_engine_destroy(a);
	te_engine_destroy(b);
	if (strcmp(tp, "shm") == 0) {
		te_mem_free(abuf);
		te_mem_free(bbuf);
	} else {
		free(abuf);
		free(bbuf);
	}
	free(lp);
	free(rp);
	free(ri);
	free(reqs);
	free(tprep);
	free(treq);
	free(cprep);
	free(creq);
	free(cbuild);
	free(sweep_buf);
	sweep_buf = NULL;
	return 0;
}

/* ------------------------------------------------------------- first */

#define TARGET_BUF 4096

/* Registers n buffers of TARGET_BUF bytes (one call), prints
 * "READY <name> <first buffer>", serves until stdin closes. */
static int run_target(size_t n)
{
	te_engine *e = engine("tcp");
	unsigned char *mem = aligned_alloc(4096, n * TARGET_BUF);
	te_memory_region *regs = calloc(n, sizeof *regs);
	if (mem == NULL || regs == NULL)
		die("allocation", -ENOMEM);
	memset(mem, 0x5a, n * TARGET_BUF);
	for (size_t i = 0; i < n; i++)
		regs[i] = (te_memory_region){ mem + i * TARGET_BUF, TARGET_BUF, "cpu:0", TE_MEM_REMOTE_ACCESS };
	int rc = te_register_memory_batch(e, regs, n);
	if (rc < 0)
		die("te_register_memory_batch", rc);
	printf("READY %s %llx\n", te_engine_name(e), (unsigned long long)(uintptr_t)(mem + (n / 2) * TARGET_BUF));
	fflush(stdout);
	char c;
	while (read(0, &c, 1) > 0)
		;
	te_engine_destroy(e);
	free(regs);
	free(mem);
	return 0;
}

static int bench_first(const char *self, size_t regs, int peers)
{
	int in[2], out[2];
	if (pipe(in) != 0 || pipe(out) != 0)
		die("pipe", -errno);
	pid_t pid = fork();
	if (pid == 0) {
		dup2(in[0], 0);
		dup2(out[1], 1);
		close(in[1]);
		close(out[0]);
		char nbuf[32];
		snprintf(nbuf, sizeof nbuf, "%zu", regs);
		execl(self, self, "target", nbuf, (char *)NULL);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	FILE *f = fdopen(out[0], "r");
	char line[512], name[256];
	unsigned long long remote = 0;
	if (f == NULL || fgets(line, sizeof line, f) == NULL || sscanf(line, "READY %255s %llx", name, &remote) != 2) {
		fprintf(stderr, "prep-bench: the target did not start\n");
		return 1;
	}
	double *t = malloc(peers * sizeof *t);
	double *topen = malloc(peers * sizeof *topen);
	unsigned char *buf = aligned_alloc(4096, TARGET_BUF);
	for (int p = 0; p < peers; p++) {
		te_engine *a = engine("tcp");
		int rc = te_register_memory(a, buf, TARGET_BUF, "cpu:0", 0);
		if (rc < 0)
			die("te_register_memory", rc);
		memset(buf, 0, TARGET_BUF);
		te_batch_id b;
		if ((rc = te_batch_alloc(a, 1, &b)) < 0)
			die("te_batch_alloc", rc);
		double t0 = now_ns();
		te_segment_id seg = te_segment_open(a, name);
		if (seg < 0)
			die("te_segment_open", seg);
		topen[p] = now_ns() - t0;
		te_request r = { TE_OP_READ, seg, buf, remote, TARGET_BUF };
		if ((rc = te_submit(a, b, &r, 1)) != 0)
			die("te_submit", rc < 0 ? rc : -EPROTO);
		wait_ok(a, b);
		t[p] = now_ns() - t0;
		if (buf[0] != 0x5a || buf[TARGET_BUF - 1] != 0x5a)
			die("first READ moved the wrong bytes", -EPROTO);
		te_batch_free(a, b);
		te_segment_close(a, seg);
		te_unregister_memory(a, buf);
		te_engine_destroy(a);
	}
	close(in[1]);
	waitpid(pid, NULL, 0);
	qsort(t, peers, sizeof *t, cmp_double);
	qsort(topen, peers, sizeof *topen, cmp_double);
	printf("target with %zu registered buffers, %d fresh peers: open + first 4 KiB READ p50 %.2f ms, p90 %.2f ms "
	       "(the open alone p50 %.2f ms)\n",
	       regs, peers, t[peers / 2] / 1e6, t[peers * 9 / 10] / 1e6, topen[peers / 2] / 1e6);
	free(t);
	free(topen);
	free(buf);
	return 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: prep-bench submit [--transport tcp|shm] [--count N] [--size B] [--runs R] [--regions G]\n"
			"                         [--adjacent 0|1]\n"
			"       prep-bench first [--regs N] [--peers P]\n");
	exit(2);
}

/* An option's value: a whole number and nothing else, or usage(). */
static size_t number(const char *v)
{
	char *end = NULL;
	unsigned long long n;

	errno = 0;
	n = strtoull(v, &end, 10);
	if (errno != 0 || end == v || *end != '\0' || *v == '-' || n > SIZE_MAX)
		usage();
	return (size_t)n;
}

int main(int argc, char **argv)
{
	const char *tp = "tcp";
	size_t count = 32768, size = 1024, regs = 10000, nregs = 1;
	size_t adjacent = 0, runs = 7, peers = 25;
	/* The options taking a whole number, and where each goes. */
	const struct {
		const char *name;
		size_t *value;
	} numbers[] = {
		{ "--count", &count }, { "--size", &size }, { "--runs", &runs }, { "--adjacent", &adjacent },
		{ "--regions", &nregs }, { "--regs", &regs }, { "--peers", &peers },
	};
	const size_t nnumbers = sizeof numbers / sizeof numbers[0];

	signal(SIGPIPE, SIG_IGN);
	/* A batch of 32,768 tasks is 7 MiB: kept on the heap once freed, so
	 * that the timed calls do not fault in fresh pages of each new batch
	 * (a server reusing its memory does not either). */
	mallopt(M_MMAP_THRESHOLD, 256 << 20);
	mallopt(M_TRIM_THRESHOLD, 512 << 20);
	if (argc < 2)
		usage();
	if (strcmp(argv[1], "target") == 0 && argc == 3)
		return run_target(strtoull(argv[2], NULL, 10));
	for (int i = 2; i < argc; i++) {
		if (i + 1 >= argc)
			usage();
		const char *k = argv[i], *v = argv[++i];
		size_t o = 0;

		if (strcmp(k, "--transport") == 0) {
			tp = v;
			continue;
		}
		while (o < nnumbers && strcmp(k, numbers[o].name) != 0)
			o++;
		if (o == nnumbers)
			usage();
		*numbers[o].value = number(v);
	}
	if (count == 0 || count > (1u << 20) || size == 0 || runs < 1 || runs > INT_MAX || regs == 0 || peers < 1 ||
	    peers > INT_MAX || nregs == 0 || count % nregs != 0)
		usage();
	if (strcmp(argv[1], "submit") == 0)
		return bench_submit(tp, count, size, (int)runs, nregs, adjacent != 0);
	if (strcmp(argv[1], "first") == 0)
		return bench_first(argv[0], regs, (int)peers);
	usage();
	return 2;
}
