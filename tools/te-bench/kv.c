/* SPDX-License-Identifier: Apache-2.0 */
/*
 * --pattern=kv: a request's KV cache moved as an LLM-serving stack moves it.
 * The cache is a paged pool: for each layer a K and a V region of blocks,
 * one block holding --block_tokens tokens of this rank's heads
 * (--kv_heads / --tp of them, --head_dim values of --dtype_bytes each). A
 * request of --tokens tokens owns ceil(tokens / block_tokens) blocks, here
 * every other block of the pool, so that no two pieces touch and nothing can
 * merge them; one batch moves all of them: layers x 2 x blocks descriptors.
 *
 * Each round times such requests for --duration seconds, then the same
 * bytes per batch in 1 MiB blocks (the large-block rate of the same run, on
 * the same connections), so that a figure for small pieces always stands
 * beside the rate the path reaches with large ones. --rounds rounds
 * alternate the two; the closing line gives medians with min and max.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "te-bench.h"

#define WAIT_MS 120000
#define LARGE (1ull << 20)

static uint64_t piece_bytes(void)
{
	return F.block_tokens * (F.kv_heads / F.tp) * F.head_dim * F.dtype_bytes;
}

static uint64_t kv_blocks(void)
{
	return (F.tokens + F.block_tokens - 1) / F.block_tokens;
}

static uint64_t kv_descs(void)
{
	return F.layers * 2 * kv_blocks();
}

void kv_check_flags(void)
{
	if (F.kv_heads % F.tp != 0)
		die(1, "--kv_heads=%" PRIu64 " is not a multiple of --tp=%" PRIu64, F.kv_heads, F.tp);
	uint64_t piece = piece_bytes();
	if (piece == 0 || piece > (1ull << 30))
		die(1, "a block of one layer is %" PRIu64 " bytes: want 1 B to 1 GiB", piece);
	if (kv_descs() > (1u << 20))
		die(1, "%" PRIu64 " descriptors per request: at most 1048576 (fewer --tokens or --layers)",
		    kv_descs());
	if (F.threads != 1)
		die(1, "--pattern=kv runs one request at a time: --threads must be 1");
	if (!strcmp(F.operation, "mixed"))
		die(1, "--pattern=kv moves one way: --operation=write (the default) or read");
	if (F.check && F.use_vram)
		die(1, "--pattern=kv --check compares host memory: not with --use_vram");
}

/* The pool: layers x {K,V} regions of 2 x blocks blocks each (every other
 * one used), which also holds the 1 MiB run's bytes. */
uint64_t kv_pool_bytes(void)
{
	uint64_t pool = F.layers * 2 * 2 * kv_blocks() * piece_bytes();
	uint64_t large = (kv_descs() * piece_bytes() + LARGE - 1) / LARGE * LARGE;
	return pool > large ? pool : large;
}

/* Descriptor i of a request: layer, K or V, block, in the order a serving
 * stack walks them (layer by layer). */
static uint64_t kv_offset(uint64_t i)
{
	uint64_t blocks = kv_blocks(), region = i / blocks, b = i % blocks;
	return (region * 2 * blocks + 2 * b) * piece_bytes();
}

static void fill(unsigned char *p, uint64_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
	for (uint64_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (unsigned char)x;
	}
}

/* One batch: 0, or exits with a line naming the first task that failed. */
static void one(te_engine *e, te_request *r, uint64_t n)
{
	te_batch_id b;
	int rc = te_batch_alloc(e, n, &b);
	if (rc < 0)
		die(1, "te_batch_alloc: %s", te_strerror(rc));
	rc = te_submit(e, b, r, n);
	if (rc < 0)
		die(1, "te_submit of %" PRIu64 " descriptors: %s%s", n, te_strerror(rc), why());
	rc = te_batch_wait(e, b, WAIT_MS);
	if (rc < 0)
		die(1, "a batch did not finish within %d s: %s", WAIT_MS / 1000, te_strerror(rc));
	int32_t state = 0;
	te_batch_status(e, b, NULL, NULL, &state);
	if (state != TE_TASK_COMPLETED) {
		for (uint64_t i = 0; i < n; i++) {
			te_task_status st;
			if (te_get_status(e, b, i, &st) == 0 && st.state != TE_TASK_COMPLETED)
				die(1, "descriptor %" PRIu64 " (%" PRIu64 " bytes at remote 0x%" PRIx64 ") failed: %s%s",
				    i, r[i].length, r[i].remote, te_strerror(st.error), why());
		}
		die(1, "a batch failed%s", why());
	}
	te_batch_free(e, b);
}

/* CPU time of this process (every thread: in loopback mode both engines'), s. */
static double cpu_s(void)
{
	struct rusage ru;
	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return 0;
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* Requests of `n` descriptors for `secs` seconds (at least 3): seconds per
 * request; `cpu`: CPU seconds of this process per request. On a shared
 * machine the CPU time says what the path costs better than the clock. */
static double timed(te_engine *e, te_request *r, uint64_t n, uint64_t secs, double *cpu)
{
	uint64_t t0 = now_ns(), end = t0 + secs * 1000000000ull, count = 0;
	double c0 = cpu_s();
	while ((count < 3 || now_ns() < end) && !interrupted) {
		one(e, r, n);
		count++;
	}
	*cpu = (cpu_s() - c0) / (double)count;
	return (double)(now_ns() - t0) / 1e9 / (double)count;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, size_t n)
{
	qsort(v, n, sizeof *v, cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* --check: the pieces written, read back into a cleared buffer, compared;
 * the blocks between them, which no descriptor names, must come back as
 * they were (nothing spilled over). */
static void kv_check(te_engine *e, uint64_t rbase, unsigned char *local, te_request *r,
		     uint64_t n)
{
	uint64_t piece = piece_bytes(), pool = F.layers * 2 * 2 * kv_blocks() * piece;
	te_request *gap = calloc(n, sizeof *gap);
	unsigned char *want = malloc(pool);
	if (gap == NULL || want == NULL)
		die(1, "out of memory");
	/* The gaps first get a pattern of their own through the pieces' path. */
	fill(local, pool, 0x6a9);
	for (uint64_t i = 0; i < n; i++) {
		gap[i] = r[i];
		gap[i].opcode = TE_OP_WRITE;
		gap[i].local = local + kv_offset(i) + piece;
		gap[i].remote = rbase + kv_offset(i) + piece;
		r[i].opcode = TE_OP_WRITE;
	}
	one(e, gap, n);
	fill(local, pool, 0x5eed);
	memcpy(want, local, pool);
	one(e, r, n);
	/* Back into a cleared buffer: the pieces, then the gaps. */
	memset(local, 0, pool);
	for (uint64_t i = 0; i < n; i++) {
		r[i].opcode = TE_OP_READ;
		gap[i].opcode = TE_OP_READ;
	}
	one(e, r, n);
	one(e, gap, n);
	unsigned char *gwant = malloc(pool);
	if (gwant == NULL)
		die(1, "out of memory");
	fill(gwant, pool, 0x6a9);
	for (uint64_t i = 0; i < n; i++) {
		uint64_t off = kv_offset(i);
		if (memcmp(local + off, want + off, piece) != 0)
			die(2, "DATA MISMATCH: descriptor %" PRIu64 " (remote 0x%" PRIx64 ") came back different", i,
			    rbase + off);
		if (memcmp(local + off + piece, gwant + off + piece, piece) != 0)
			die(2, "DATA MISMATCH: the block after descriptor %" PRIu64 " (remote 0x%" PRIx64
			       ") changed: a piece spilled over", i, rbase + off + piece);
	}
	free(gwant);
	free(want);
	free(gap);
}

int run_kv(te_engine *e, const char *target, const char *mode_name)
{
	te_segment_buffer bufs[1];
	uint64_t piece = piece_bytes(), n = kv_descs(), bytes = n * piece, pool = kv_pool_bytes();
	uint64_t nlarge = (bytes + LARGE - 1) / LARGE;
	uint32_t op = strcmp(F.operation, "read") == 0 ? TE_OP_READ : TE_OP_WRITE;
	uint64_t unit = unit_bytes(F.report_unit);

	te_segment_id seg = te_segment_open(e, target);
	if (seg < 0)
		die(1, "cannot open segment '%s': %s%s", target, te_strerror(seg), why());
	const char *transport = te_segment_transport(e, seg);
	if (transport == NULL)
		transport = "?";
	int nb = te_segment_buffers(e, seg, bufs, 1);
	if (nb <= 0)
		die(1, "segment '%s' has no buffers%s", target, nb < 0 ? why() : "");
	if (bufs[0].length < pool || bufs[0].length - pool < F.remote_offset)
		die(1, "segment '%s' buffer 0 holds %" PRIu64 " bytes; the KV pool needs %" PRIu64, target,
		    bufs[0].length, F.remote_offset + pool);
	uint64_t rbase = bufs[0].addr + F.remote_offset;
	unsigned char *local = register_buffer(e, pool, pool, false, F.use_vram);
	te_request *r = calloc(n, sizeof *r), *big = calloc(nlarge, sizeof *big);
	if (r == NULL || big == NULL)
		die(1, "out of memory");
	for (uint64_t i = 0; i < n; i++)
		r[i] = (te_request){ op, seg, local + kv_offset(i), rbase + kv_offset(i), piece };
	for (uint64_t i = 0; i < nlarge; i++) {
		uint64_t len = i + 1 < nlarge ? LARGE : bytes - i * LARGE;
		big[i] = (te_request){ op, seg, local + i * LARGE, rbase + i * LARGE, len };
	}
	char ps[32], rs[32];
	teu_fmt_bytes(ps, sizeof ps, piece);
	teu_fmt_bytes(rs, sizeof rs, bytes);
	if (!F.json)
		printf("%s: %s kv %s over %s: %" PRIu64 " layers x K,V x %" PRIu64 " blocks of %s (%" PRIu64
		       " tokens, %" PRIu64 " descriptors, %s per request, every other block), beside %" PRIu64
		       " x 1 MiB; %" PRIu64 " round%s of %" PRIu64 " s each%s\n",
		       PROG, mode_name, F.operation, transport, F.layers, kv_blocks(), ps, F.tokens, n, rs, nlarge,
		       F.rounds, F.rounds > 1 ? "s" : "", F.duration, F.check ? ", checking every byte" : "");
	fflush(stdout);
	if (F.check) {
		kv_check(e, rbase, local, r, n);
		for (uint64_t i = 0; i < n; i++)
			r[i].opcode = op;
	}
	one(e, r, n); /* connections up, pages touched: not in the figures */
	one(e, big, nlarge);
	double *kv = calloc(F.rounds, sizeof *kv), *lg = calloc(F.rounds, sizeof *lg);
	double *kc = calloc(F.rounds, sizeof *kc), *lc = calloc(F.rounds, sizeof *lc);
	if (kv == NULL || lg == NULL || kc == NULL || lc == NULL)
		die(1, "out of memory");
	uint64_t done = 0;
	for (uint64_t k = 0; k < F.rounds && !interrupted; k++, done++) {
		kv[k] = timed(e, r, n, F.duration, &kc[k]);
		lg[k] = timed(e, big, nlarge, F.duration, &lc[k]);
		if (!F.json && !F.quiet)
			fprintf(stderr, "[round %" PRIu64 "] kv %.3f ms per request, %.*f %s/s; 1 MiB blocks %.*f %s/s\n",
				k + 1, kv[k] * 1e3, (int)F.report_precision, (double)bytes / kv[k] / (double)unit,
				F.report_unit, (int)F.report_precision, (double)bytes / lg[k] / (double)unit,
				F.report_unit);
	}
	if (done == 0)
		die(1, "interrupted before the first round ended");
	/* Times: the median request, and the fastest and slowest rounds. */
	double kmin = kv[0], kmax = kv[0], lmin = lg[0], lmax = lg[0];
	for (uint64_t k = 1; k < done; k++) {
		kmin = kv[k] < kmin ? kv[k] : kmin;
		kmax = kv[k] > kmax ? kv[k] : kmax;
		lmin = lg[k] < lmin ? lg[k] : lmin;
		lmax = lg[k] > lmax ? lg[k] : lmax;
	}
	double km = median(kv, done), lm = median(lg, done);
	/* CPU per descriptor, and per the same bytes in 1 MiB blocks, in us */
	double kcpu = median(kc, done) * 1e6 / (double)n, lcpu = median(lc, done) * 1e6 / (double)n;
	double rate = (double)bytes / km / (double)unit, lrate = (double)bytes / lm / (double)unit;
	int pr = (int)F.report_precision;
	if (F.json) {
		printf("{\"mode\":\"%s\",\"pattern\":\"kv\",\"transport\":\"%s\",\"operation\":\"%s\",\"layers\":%" PRIu64
		       ",\"blocks\":%" PRIu64 ",\"tokens\":%" PRIu64 ",\"piece_bytes\":%" PRIu64
		       ",\"descriptors\":%" PRIu64 ",\"bytes_per_request\":%" PRIu64 ",\"rounds\":%" PRIu64
		       ",\"ms_per_request\":{\"median\":%.4f,\"min\":%.4f,\"max\":%.4f},\"us_per_token\":%.4f"
		       ",\"descriptors_per_s\":%.0f,\"throughput_bytes_per_s\":%.0f,\"throughput_min_bytes_per_s\":%.0f"
		       ",\"throughput_max_bytes_per_s\":%.0f,\"large_bytes_per_s\":%.0f,\"large_min_bytes_per_s\":%.0f"
		       ",\"large_max_bytes_per_s\":%.0f,\"ratio\":%.3f,\"cpu_us_per_descriptor\":%.3f"
		       ",\"large_cpu_us_per_piece_bytes\":%.3f,\"check\":%s}\n",
		       mode_name, transport, F.operation, F.layers, kv_blocks(), F.tokens, piece, n, bytes, done,
		       km * 1e3, kmin * 1e3, kmax * 1e3, km * 1e6 / (double)F.tokens, (double)n / km,
		       (double)bytes / km, (double)bytes / kmax, (double)bytes / kmin, (double)bytes / lm,
		       (double)bytes / lmax, (double)bytes / lmin, lm / km, kcpu, lcpu, F.check ? "true" : "false");
	} else {
		printf("KV pattern, median of %" PRIu64 " round%s: %.3f ms per request (min %.3f, max %.3f), %.3f us per "
		       "token, %.0f descriptors/s, %.*f %s/s (min %.*f, max %.*f)\n",
		       done, done > 1 ? "s" : "", km * 1e3, kmin * 1e3, kmax * 1e3, km * 1e6 / (double)F.tokens,
		       (double)n / km, pr, rate, F.report_unit, pr, (double)bytes / kmax / (double)unit, pr,
		       (double)bytes / kmin / (double)unit);
		printf("1 MiB blocks, same bytes, same run: %.*f %s/s (min %.*f, max %.*f); kv / 1 MiB = %.2f%s\n", pr,
		       lrate, F.report_unit, pr, (double)bytes / lmax / (double)unit, pr,
		       (double)bytes / lmin / (double)unit, lm / km, F.check ? "; every byte checked first" : "");
		printf("CPU of this process%s: %.3f us per descriptor; %.3f us per as many bytes in 1 MiB blocks\n",
		       strcmp(mode_name, "loopback") ? "" : " (both engines)", kcpu, lcpu);
	}
	fflush(stdout);
	free(kv);
	free(lg);
	free(kc);
	free(lc);
	free(r);
	free(big);
	te_segment_close(e, seg);
	return 0;
}
