/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gpu-copy-bench: what a GPU's copy engines give, measured with the driver
 * calls the CUDA device plugin makes (cuMemcpyAsync on a stream, then
 * cuStreamSynchronize; cuMemcpy for pageable memory), so that te-bench's
 * device-memory figures can be set beside the hardware's limits.
 *
 * libcuda.so.1 is opened with dlopen() and its types and calls come from
 * libteu's util/teu-cuda.h, the plugin's own: no CUDA toolkit is needed
 * to build it. Without the driver library or a device it
 * exits 77 with one line saying why (the status meson and automake read as
 * "skipped").
 *
 * Every figure is the median of --repeats timed runs after one untimed run,
 * wall clock from the first call to the end of the stream's synchronisation.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* the project defines it; for a build on its own */
#endif
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "teu-cuda.h"
#include "teu-gather.h"
#include "teu-fmt.h"

#define PROG "gpu-copy-bench"
#define EXIT_SKIP 77

static teu_cu_driver D;

static void die(int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	teu_fmt_verror(PROG, fmt, ap);
	va_end(ap);
	exit(code);
}

/* A failed driver call after setup is an error, not a skip: the device was
 * there, so a figure that is missing must not pass for a machine without one. */
#define CU(call)                                                                           \
	do {                                                                               \
		CUresult r_ = (call);                                                      \
		if (r_ != CUDA_SUCCESS)                                                    \
			die(1, "%s failed: %s (%d)", #call, teu_cu_errstr(&D, r_), r_);        \
	} while (0)

static void open_driver(void)
{
	char why[512];
	if (teu_cu_open(&D, why, sizeof why) != 0)
		die(EXIT_SKIP, "skipped: %s", why);
	/* Optional for the plugin, needed here. */
	const char *lacks = NULL;
	if (D.StreamCreate == NULL)
		lacks = "cuStreamCreate";
	else if (D.StreamDestroy == NULL)
		lacks = "cuStreamDestroy_v2";
	else if (D.MemcpyAsync == NULL)
		lacks = "cuMemcpyAsync";
	if (lacks != NULL)
		die(EXIT_SKIP, "skipped: libcuda.so.1 lacks %s", lacks);
}

/* ---------------------------------------------------------------- options */

static struct {
	uint64_t size;        /* one copy, and the pageable copies */
	uint64_t chunk_total; /* bytes moved by each chunked case */
	uint64_t big_chunk, small_chunk;
	unsigned repeats;
	int device;
	bool json;
} O = {
	.size = 1ull << 30,
	.chunk_total = 256ull << 20,
	.big_chunk = 1ull << 20,
	.small_chunk = 64ull << 10,
	.repeats = 5,
	.device = 0,
};

static uint64_t parse_size(const char *flag, const char *s)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	uint64_t mul = 1;
	switch (*end) {
	case 'k': case 'K': mul = 1ull << 10; end++; break;
	case 'm': case 'M': mul = 1ull << 20; end++; break;
	case 'g': case 'G': mul = 1ull << 30; end++; break;
	default: break;
	}
	if (errno != 0 || end == s || *end != '\0' || v == 0 || v > (1ull << 40) / mul)
		die(2, "%s=%s: want a size such as 65536, 64K, 1M or 1G", flag, s);
	return v * mul;
}

/* A whole number from lo to hi; `want` says which in the error. */
static long parse_long(const char *flag, const char *s, long lo, long hi, const char *want)
{
	char *end;
	long v = strtol(s, &end, 10);
	if (*end != '\0' || end == s || v < lo || v > hi)
		die(2, "%s=%s: want %s", flag, s, want);
	return v;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: " PROG " [--size=1G] [--chunk-total=256M] [--big-chunk=1M] [--small-chunk=64K]\n"
		"                      [--repeats=5] [--device=0] [--json]\n"
		"Copy-engine throughput of one CUDA device through the driver API:\n"
		"  pinned host<->device: one --size copy; --big-chunk and --small-chunk chunks of\n"
		"    --chunk-total bytes, each waited for (cuMemcpyAsync + cuStreamSynchronize) and\n"
		"    all queued then waited once; both directions at once on two streams\n"
		"  pageable host<->device: one --size cuMemcpy\n"
		"  device->device: one --size copy, and the two chunk sizes queued\n"
		"  the CUDA plugin's gather kernel: the two chunk sizes, up to 128 a launch,\n"
		"    pinned host->device, device->pinned host, device->device\n"
		"Medians of --repeats runs (after one untimed run). Sizes take K, M, G.\n"
		"Exit 77 with one line when there is no driver or no device.\n");
}

static void parse_args(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *eq = strchr(a, '=');
		size_t n = eq ? (size_t)(eq - a) : strlen(a);
		const char *v = eq ? eq + 1 : NULL;
#define IS(name) (n == strlen(name) && strncmp(a, name, n) == 0)
		if (IS("--help") || IS("-h")) {
			usage(stdout);
			exit(0);
		} else if (IS("--json") && v == NULL) {
			O.json = true;
		} else if (v == NULL) {
			usage(stderr);
			die(2, "%s: unknown flag, or a flag without '=VALUE'", a);
		} else if (IS("--size")) {
			O.size = parse_size("--size", v);
		} else if (IS("--chunk-total")) {
			O.chunk_total = parse_size("--chunk-total", v);
		} else if (IS("--big-chunk")) {
			O.big_chunk = parse_size("--big-chunk", v);
		} else if (IS("--small-chunk")) {
			O.small_chunk = parse_size("--small-chunk", v);
		} else if (IS("--repeats")) {
			O.repeats = (unsigned)parse_long("--repeats", v, 1, 1000, "1 to 1000");
		} else if (IS("--device")) {
			O.device = (int)parse_long("--device", v, 0, 1023, "a device index");
		} else {
			usage(stderr);
			die(2, "%s: unknown flag", a);
		}
#undef IS
	}
	if (O.big_chunk > O.chunk_total || O.small_chunk > O.chunk_total)
		die(2, "--chunk-total must hold at least one chunk of each size");
}

/* ------------------------------------------------------------ the cases */

typedef enum { SINGLE, WAIT_EACH, QUEUED, BOTH_WAYS, PAGEABLE, GATHER } mode;
static const char *const mode_keys[] = { "single", "wait_each", "queued", "both_ways", "pageable", "gather" };

typedef struct result {
	char name[48];
	const char *dir; /* h2d, d2h, d2d, h2d+d2h */
	const char *memory;
	mode m;
	uint64_t chunk, bytes, calls;
	double gbs, gbs_min, gbs_max, us_per_call;
} result;

#define MAX_RESULTS 32
static result results[MAX_RESULTS];
static unsigned nresults;

static struct {
	CUstream s[2];
	CUdeviceptr dev_a, dev_b; /* each max(size, chunk_total) */
	void *pinned_a, *pinned_b;
	CUdeviceptr pinned_a_dev; /* where kernels reach pinned_a */
	CUmodule gather_mod;      /* holds it */
	CUfunction gather;        /* the plugin's gather kernel, or NULL */
	char *pageable;
	uint64_t span;
} B;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static CUdeviceptr hp(void *p)
{
	return (CUdeviceptr)(uintptr_t)p;
}

/* One timed run: `bytes` from src to dst in `chunk`-byte calls. */
static double run_once(mode m, CUdeviceptr dst, CUdeviceptr src, uint64_t bytes, uint64_t chunk,
		       CUdeviceptr dst2, CUdeviceptr src2)
{
	double t0 = now();
	switch (m) {
	case PAGEABLE:
		CU(D.Memcpy(dst, src, bytes));
		break;
	case SINGLE:
	case QUEUED:
	case WAIT_EACH:
		/* The stream is waited for after each chunk (WAIT_EACH) or once
		 * after all. */
		for (uint64_t off = 0; off < bytes; off += chunk) {
			uint64_t n = bytes - off < chunk ? bytes - off : chunk;
			CU(D.MemcpyAsync(dst + off, src + off, n, B.s[0]));
			if (m == WAIT_EACH)
				CU(D.StreamSynchronize(B.s[0]));
		}
		if (m != WAIT_EACH)
			CU(D.StreamSynchronize(B.s[0]));
		break;
	case GATHER: {
		/* The CUDA plugin's gather kernel: up to TEU_GATHER_MAX chunks a
		 * launch, all queued then waited for once. */
		static teu_gather g;
		g.n = 0;
		for (uint64_t off = 0; off < bytes; off += chunk)
			if (teu_gather_add(&g, dst + off, src + off, bytes - off < chunk ? bytes - off : chunk))
				CU(teu_gather_flush(&D, B.gather, &g, B.s[0]));
		CU(teu_gather_flush(&D, B.gather, &g, B.s[0]));
		CU(D.StreamSynchronize(B.s[0]));
		break;
	}
	case BOTH_WAYS:
		/* Host to device on one stream and device to host on the other, as
		 * the plugin's two streams may run them. */
		CU(D.MemcpyAsync(dst, src, bytes, B.s[0]));
		CU(D.MemcpyAsync(dst2, src2, bytes, B.s[1]));
		CU(D.StreamSynchronize(B.s[0]));
		CU(D.StreamSynchronize(B.s[1]));
		break;
	}
	return now() - t0;
}

static void measure(const char *name, const char *dir, const char *memory, mode m, CUdeviceptr dst,
		    CUdeviceptr src, uint64_t bytes, uint64_t chunk, CUdeviceptr dst2, CUdeviceptr src2)
{
	if (nresults == MAX_RESULTS)
		die(1, "too many cases");
	double *secs = calloc(O.repeats, sizeof *secs);
	if (secs == NULL)
		die(1, "out of memory");
	run_once(m, dst, src, bytes, chunk, dst2, src2); /* untimed: first touch, driver warm-up */
	for (unsigned i = 0; i < O.repeats; i++)
		secs[i] = run_once(m, dst, src, bytes, chunk, dst2, src2);
	qsort(secs, O.repeats, sizeof *secs, cmp_double);
	double med = O.repeats % 2 ? secs[O.repeats / 2] : (secs[O.repeats / 2 - 1] + secs[O.repeats / 2]) / 2;
	uint64_t moved = m == BOTH_WAYS ? 2 * bytes : bytes;
	uint64_t calls = m == BOTH_WAYS ? 2 : (bytes + chunk - 1) / chunk;
	if (m == GATHER) /* launches */
		calls = (calls + TEU_GATHER_MAX - 1) / TEU_GATHER_MAX;
	if (med <= 0 || secs[0] <= 0)
		die(1, "%s: the clock did not advance", name);
	result *r = &results[nresults++];
	*r = (result){ .dir = dir, .memory = memory, .m = m, .chunk = chunk, .bytes = moved, .calls = calls,
		       .gbs = (double)moved / med / 1e9,
		       .gbs_min = (double)moved / secs[O.repeats - 1] / 1e9,
		       .gbs_max = (double)moved / secs[0] / 1e9,
		       .us_per_call = med * 1e6 / (double)calls };
	snprintf(r->name, sizeof r->name, "%s", name);
	free(secs);
	if (!O.json) {
		fprintf(stderr, "  %-26s %9.2f GB/s\n", name, r->gbs);
		fflush(stderr);
	}
}

static void json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

/* Loads the plugin's gather kernel: false, with a line saying why, when the
 * driver cannot (its cases are left out). */
static bool gather_load(void)
{
	bool calls = D.ModuleLoadData != NULL && D.ModuleGetFunction != NULL && D.LaunchKernel != NULL;
	CUresult r = CUDA_ERROR_NO_DEVICE; /* replaced by the driver's answer when it has the calls */
	if (calls && (r = D.ModuleLoadData(&B.gather_mod, teu_gather_ptx)) == CUDA_SUCCESS) {
		r = D.ModuleGetFunction(&B.gather, B.gather_mod, "te_gather_copy");
		if (r == CUDA_SUCCESS)
			r = D.PointerGetAttribute(&B.pinned_a_dev, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, hp(B.pinned_a));
		if (r != CUDA_SUCCESS)
			D.ModuleUnload(B.gather_mod);
	}
	if (r != CUDA_SUCCESS)
		fprintf(stderr, PROG ": no gather kernel cases: %s\n",
			calls ? teu_cu_errstr(&D, r) : "the driver has no kernel launches");
	return r == CUDA_SUCCESS;
}

int main(int argc, char **argv)
{
	parse_args(argc, argv);
	open_driver();

	CUresult r = D.Init(0);
	if (r != CUDA_SUCCESS)
		die(EXIT_SKIP, "skipped: cuInit failed: %s (%d)", teu_cu_errstr(&D, r), r);
	int ndev = 0;
	r = D.DeviceGetCount(&ndev);
	if (r != CUDA_SUCCESS || ndev <= 0)
		die(EXIT_SKIP, "skipped: no CUDA device (%s)",
		    r != CUDA_SUCCESS ? teu_cu_errstr(&D, r) : "the driver counts none");
	if (O.device >= ndev)
		die(EXIT_SKIP, "skipped: --device=%d, but the driver counts %d device(s)", O.device, ndev);

	CUdevice dev;
	CUcontext ctx;
	char name[256] = "", bus[64] = "";
	size_t total = 0;
	int version = 0;
	CU(D.DeviceGet(&dev, O.device));
	CU(D.DeviceGetName(name, sizeof name, dev));
	CU(D.DeviceTotalMem(&total, dev));
	if (D.DeviceGetPCIBusId(bus, sizeof bus, dev) != CUDA_SUCCESS)
		bus[0] = '\0';
	if (D.DriverGetVersion == NULL || D.DriverGetVersion(&version) != CUDA_SUCCESS)
		version = 0;
	CU(D.DevicePrimaryCtxRetain(&ctx, dev));
	CU(D.CtxSetCurrent(ctx));

	B.span = O.size > O.chunk_total ? O.size : O.chunk_total;
	if (2 * B.span > total)
		die(1, "--size/--chunk-total: two buffers of %" PRIu64 " bytes do not fit the device's %zu",
		    B.span, total);
	CU(D.StreamCreate(&B.s[0], CU_STREAM_NON_BLOCKING));
	CU(D.StreamCreate(&B.s[1], CU_STREAM_NON_BLOCKING));
	CU(D.MemAlloc(&B.dev_a, B.span));
	CU(D.MemAlloc(&B.dev_b, B.span));
	CU(D.MemHostAlloc(&B.pinned_a, B.span, 0));
	CU(D.MemHostAlloc(&B.pinned_b, B.span, 0));
	/* Pageable memory as an application has it: touched, so no copy pays
	 * for page faults of fresh memory. */
	B.pageable = malloc(O.size);
	if (B.pageable == NULL)
		die(1, "cannot allocate %" PRIu64 " bytes of pageable memory", O.size);
	memset(B.pageable, 0x5a, O.size);
	memset(B.pinned_a, 0xa5, B.span);
	memset(B.pinned_b, 0x3c, B.span);
	/* Device memory is written once before it is read. */
	CU(D.Memcpy(B.dev_a, hp(B.pinned_a), B.span));
	CU(D.Memcpy(B.dev_b, hp(B.pinned_b), B.span));

	char sz[32], big[32], small[32], tot[32];
	teu_fmt_bytes(sz, sizeof sz, O.size);
	teu_fmt_bytes(big, sizeof big, O.big_chunk);
	teu_fmt_bytes(small, sizeof small, O.small_chunk);
	teu_fmt_bytes(tot, sizeof tot, O.chunk_total);
	if (!O.json)
		fprintf(stderr, PROG ": device %d (%s, %s), one copy %s, chunked %s, median of %u runs\n",
			O.device, name, bus, sz, tot, O.repeats);

	CUdeviceptr pa = hp(B.pinned_a), pb = hp(B.pinned_b), pg = hp(B.pageable);
	measure("h2d pinned", "h2d", "pinned", SINGLE, B.dev_a, pa, O.size, O.size, 0, 0);
	measure("d2h pinned", "d2h", "pinned", SINGLE, pa, B.dev_a, O.size, O.size, 0, 0);
	measure("h2d+d2h pinned", "h2d+d2h", "pinned", BOTH_WAYS, B.dev_a, pa, O.size, O.size, pb, B.dev_b);
	const uint64_t chunks[2] = { O.big_chunk, O.small_chunk };
	const char *cn[2] = { big, small };
	for (int c = 0; c < 2; c++) {
		char n[48];
		snprintf(n, sizeof n, "h2d pinned %s waited", cn[c]);
		measure(n, "h2d", "pinned", WAIT_EACH, B.dev_a, pa, O.chunk_total, chunks[c], 0, 0);
		snprintf(n, sizeof n, "h2d pinned %s queued", cn[c]);
		measure(n, "h2d", "pinned", QUEUED, B.dev_a, pa, O.chunk_total, chunks[c], 0, 0);
		snprintf(n, sizeof n, "d2h pinned %s waited", cn[c]);
		measure(n, "d2h", "pinned", WAIT_EACH, pa, B.dev_a, O.chunk_total, chunks[c], 0, 0);
		snprintf(n, sizeof n, "d2h pinned %s queued", cn[c]);
		measure(n, "d2h", "pinned", QUEUED, pa, B.dev_a, O.chunk_total, chunks[c], 0, 0);
	}
	measure("h2d pageable", "h2d", "pageable", PAGEABLE, B.dev_a, pg, O.size, O.size, 0, 0);
	measure("d2h pageable", "d2h", "pageable", PAGEABLE, pg, B.dev_a, O.size, O.size, 0, 0);
	measure("d2d", "d2d", "device", SINGLE, B.dev_b, B.dev_a, O.size, O.size, 0, 0);
	for (int c = 0; c < 2; c++) {
		char n[48];
		snprintf(n, sizeof n, "d2d %s queued", cn[c]);
		measure(n, "d2d", "device", QUEUED, B.dev_b, B.dev_a, O.chunk_total, chunks[c], 0, 0);
	}
	/* The gather kernel (TE_CUDA_GATHER): device to device, and between
	 * device memory and pinned host memory (=host), in chunks. */
	if (gather_load()) {
		for (int c = 0; c < 2; c++) {
			char n[48];
			snprintf(n, sizeof n, "h2d pinned %s gather", cn[c]);
			measure(n, "h2d", "pinned", GATHER, B.dev_a, B.pinned_a_dev, O.chunk_total, chunks[c], 0, 0);
			snprintf(n, sizeof n, "d2h pinned %s gather", cn[c]);
			measure(n, "d2h", "pinned", GATHER, B.pinned_a_dev, B.dev_a, O.chunk_total, chunks[c], 0, 0);
			snprintf(n, sizeof n, "d2d %s gather", cn[c]);
			measure(n, "d2d", "device", GATHER, B.dev_b, B.dev_a, O.chunk_total, chunks[c], 0, 0);
		}
		D.ModuleUnload(B.gather_mod);
	}

	if (O.json) {
		printf("{\"device\":{\"index\":%d,\"name\":", O.device);
		json_str(name);
		printf(",\"pci_bus_id\":");
		json_str(bus);
		printf(",\"total_memory\":%zu},\"driver_version\":%d,\"size\":%" PRIu64 ",\"chunk_total\":%" PRIu64
		       ",\"repeats\":%u,\"results\":[",
		       total, version, O.size, O.chunk_total, O.repeats);
		for (unsigned i = 0; i < nresults; i++) {
			const result *x = &results[i];
			printf("%s{\"name\":", i ? "," : "");
			json_str(x->name);
			printf(",\"direction\":\"%s\",\"memory\":\"%s\",\"mode\":\"%s\",\"chunk\":%" PRIu64
			       ",\"bytes\":%" PRIu64 ",\"calls\":%" PRIu64 ",\"gb_per_s\":%.3f,\"gb_per_s_min\":%.3f"
			       ",\"gb_per_s_max\":%.3f,\"us_per_call\":%.2f}",
			       x->dir, x->memory, mode_keys[x->m], x->chunk, x->bytes, x->calls, x->gbs, x->gbs_min,
			       x->gbs_max, x->us_per_call);
		}
		printf("]}\n");
	} else {
		printf("| case | chunk | calls | GB/s (median) | min–max | µs per call |\n");
		printf("|---|---:|---:|---:|---:|---:|\n");
		for (unsigned i = 0; i < nresults; i++) {
			const result *x = &results[i];
			char ch[32];
			teu_fmt_bytes(ch, sizeof ch, x->chunk);
			printf("| %s | %s | %" PRIu64 " | %.2f | %.2f–%.2f | %.1f |\n", x->name, ch, x->calls,
			       x->gbs, x->gbs_min, x->gbs_max, x->us_per_call);
		}
	}
	fflush(stdout);

	free(B.pageable);
	CU(D.MemFreeHost(B.pinned_a));
	CU(D.MemFreeHost(B.pinned_b));
	CU(D.MemFree(B.dev_a));
	CU(D.MemFree(B.dev_b));
	CU(D.StreamDestroy(B.s[0]));
	CU(D.StreamDestroy(B.s[1]));
	D.DevicePrimaryCtxRelease(dev);
	return 0;
}
