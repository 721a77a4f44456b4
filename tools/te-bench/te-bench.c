/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te-bench: reads or writes blocks between two engines as fast as it can and
 * reports throughput, IOPS and latency. Takes the flags of Mooncake's
 * transfer_engine_bench; with no flags it runs both engines in this process
 * over TCP on 127.0.0.1 with P2PHANDSHAKE, so it needs no setup at all.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <te/te.h>

#define PROG "te-bench"
#define WAIT_MS 120000 /* a batch that takes longer than this is reported as hung */

/* ------------------------------------------------------------------ flags */

typedef struct flags {
	const char *mode;
	const char *metadata_server;
	const char *local_server_name;
	const char *segment_id;
	const char *protocol;
	const char *memory;
	const char *device_name;
	const char *nic_priority_matrix;
	const char *auth_key_file;
	const char *metrics_addr;
	uint64_t metrics_linger;
	bool auto_discovery;
	const char *operation;
	uint64_t batch_size;
	uint64_t block_size;
	uint64_t remote_offset;
	uint64_t buffer_size;
	uint64_t duration;
	uint64_t threads;
	const char *report_unit;
	uint64_t report_precision;
	bool check;
	bool use_vram;
	uint64_t gpu_id;
	const char *vram_device;
	bool json;
	bool quiet;
	bool verbose;
	bool help;
} flags;

static flags F = {
	.mode = NULL, /* loopback, or initiator when --segment_id is given */
	.metadata_server = "P2PHANDSHAKE",
	.local_server_name = NULL,
	.segment_id = NULL,
	.protocol = "auto",
	.memory = "libte",
	.device_name = "",
	.nic_priority_matrix = "",
	.operation = "read",
	.batch_size = 128,
	.block_size = 65536,
	.buffer_size = 1ull << 30,
	.duration = 10,
	.threads = 1,
	.report_unit = "GB",
	.report_precision = 2,
	.vram_device = "cuda",
};

enum ftype { F_STR, F_U64, F_BOOL };

typedef struct flag_def {
	const char *name;
	int type;
	void *ptr;
	uint64_t min, max;
	const char *help;
} flag_def;

static const flag_def DEFS[] = {
	{ "mode", F_STR, &F.mode, 0, 0,
	  "loopback | target | initiator (default: loopback; initiator when --segment_id is set)" },
	{ "metadata_server", F_STR, &F.metadata_server, 0, 0,
	  "P2PHANDSHAKE, etcd://h:p[,h:p], h:p (etcd), redis://h:p or http://h:p/path (default P2PHANDSHAKE)" },
	{ "local_server_name", F_STR, &F.local_server_name, 0, 0,
	  "this engine's segment name (default: 127.0.0.1 in loopback mode, else the host name)" },
	{ "segment_id", F_STR, &F.segment_id, 0, 0,
	  "the target's segment name, e.g. 10.0.0.1:15123 or nvmeof/disk0 (initiator mode)" },
	{ "protocol", F_STR, &F.protocol, 0, 0,
	  "transport to install: auto (the best network transport, and shm for engines on this host), "
	  "tcp, shm, rdma, nvmeof, ... (default auto)" },
	{ "memory", F_STR, &F.memory, 0, 0,
	  "libte (te_mem_alloc: shared memory a same-host peer maps) or anonymous (mmap) (default libte)" },
	{ "device_name", F_STR, &F.device_name, 0, 0, "RDMA devices, comma-separated (protocol rdma)" },
	{ "nic_priority_matrix", F_STR, &F.nic_priority_matrix, 0, 0,
	  "file with an RDMA NIC priority matrix (JSON); overrides --device_name" },
	{ "auth_key_file", F_STR, &F.auth_key_file, 0, 0,
	  "the cluster key file: peers authenticate each connection (give it to target and initiator; "
	  "default: TE_AUTH_KEY_FILE, else none)" },
	{ "metrics_addr", F_STR, &F.metrics_addr, 0, 0,
	  "serve the engines' metrics at HOST:PORT while the run lasts (port 0 picks one; the URL is printed "
	  "on stderr); default: TE_METRICS_ADDR, else none" },
	{ "metrics_linger", F_U64, &F.metrics_linger, 0, 3600,
	  "seconds to keep the engines, and their metrics endpoint, after the run ends (default 0)" },
	{ "auto_discovery", F_BOOL, &F.auto_discovery, 0, 0,
	  "the same as --protocol=auto" },
	{ "operation", F_STR, &F.operation, 0, 0, "read | write | mixed (reads and writes by turns) (default read)" },
	{ "remote_offset", F_U64, &F.remote_offset, 0, 1ull << 40,
	  "start this many bytes into the target's buffer (initiators sharing a target) (default 0)" },
	{ "batch_size", F_U64, &F.batch_size, 1, 1u << 20, "requests per batch (default 128)" },
	{ "block_size", F_U64, &F.block_size, 1, 1ull << 36, "bytes per request (default 65536)" },
	{ "buffer_size", F_U64, &F.buffer_size, 1, 1ull << 40,
	  "bytes registered on each side (default 1 GiB, raised to block_size*batch_size*threads)" },
	{ "duration", F_U64, &F.duration, 1, 86400, "seconds to run (default 10)" },
	{ "threads", F_U64, &F.threads, 1, 1024, "submitting threads (default 1)" },
	{ "report_unit", F_STR, &F.report_unit, 0, 0, "GB | GiB | Gb | MB | MiB | Mb | KB | KiB | Kb (default GB)" },
	{ "report_precision", F_U64, &F.report_precision, 0, 9, "digits after the point (default 2)" },
	{ "check", F_BOOL, &F.check, 0, 0,
	  "write a pattern, read it back and compare every byte; fail loudly on a mismatch" },
	{ "use_vram", F_BOOL, &F.use_vram, 0, 0,
	  "buffers in device memory (GPU) on both sides, through a device plugin (te-info lists them)" },
	{ "gpu_id", F_U64, &F.gpu_id, 0, 65535, "the device of --use_vram (default 0)" },
	{ "vram_device", F_STR, &F.vram_device, 0, 0,
	  "the device plugin's location prefix for --use_vram (default cuda: cuda:<gpu_id>)" },
	{ "json", F_BOOL, &F.json, 0, 0, "print the result as one JSON object on stdout" },
	{ "quiet", F_BOOL, &F.quiet, 0, 0, "no progress line on stderr every second" },
	{ "verbose", F_BOOL, &F.verbose, 0, 0, "show libte's log (level info) on stderr" },
	{ "help", F_BOOL, &F.help, 0, 0, "this text" },
};

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: " PROG " [--flag=value ...]\n"
		"Moves blocks between two libte engines and reports throughput, IOPS and latency.\n"
		"With no flags: both engines in this process, TCP over 127.0.0.1, P2PHANDSHAKE, 10 s.\n"
		"Two machines: '" PROG " --mode=target' on one (it prints its segment name), then\n"
		"'" PROG " --segment_id=<that name>' on the other.\n\nFlags (also --flag value; booleans take "
		"--flag, --noflag or --flag=true|false):\n");
	for (size_t i = 0; i < sizeof DEFS / sizeof *DEFS; i++)
		fprintf(out, "  --%-20s %s\n", DEFS[i].name, DEFS[i].help);
	fprintf(out, "\nEnvironment: TE_LOG_LEVEL shows libte's log; TE_TCP_* tune the TCP transport, "
		     "TE_PLUGIN_PATH adds plugin folders.\n");
}

static void die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

/* Engines alive, shut down on every exit path: an engine removes what it
 * published in a metadata store when it goes. */
static te_engine *engines[2];

static void drop_engines(void)
{
	for (int i = 1; i >= 0; i--) {
		te_engine_destroy(engines[i]);
		engines[i] = NULL;
	}
}

/* Errors are one line on stderr and an exit code: 1 bad use or failed run, 2
 * data mismatch. Called from the main thread only. */
static void die(int code, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, PROG ": ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	fflush(stdout);
	drop_engines();
	exit(code);
}

static bool parse_bool(const char *v, bool *out)
{
	if (!strcmp(v, "true") || !strcmp(v, "1") || !strcmp(v, "yes")) {
		*out = true;
		return true;
	}
	if (!strcmp(v, "false") || !strcmp(v, "0") || !strcmp(v, "no")) {
		*out = false;
		return true;
	}
	return false;
}

/* "64K", "1M", "1G" and plain numbers. */
static bool parse_size(const char *v, uint64_t *out)
{
	char *end = NULL;
	unsigned long long n;

	if (*v == '\0' || *v == '-' || *v == '+' || *v == ' ')
		return false;
	errno = 0;
	n = strtoull(v, &end, 10);
	if (errno != 0 || end == v)
		return false;
	unsigned shift = 0;
	switch (*end) {
	case '\0': break;
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	default: return false;
	}
	if (*end == 'i' || *end == 'B')
		end++;
	if (*end == 'B')
		end++;
	if (*end != '\0' || (shift && n > (UINT64_MAX >> shift)))
		return false;
	*out = (uint64_t)n << shift;
	return true;
}

static void parse_flags(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (a[0] != '-')
			die(1, "unexpected argument '%s' (flags look like --name=value; see --help)", a);
		a += a[1] == '-' ? 2 : 1;
		const char *eq = strchr(a, '=');
		size_t nl = eq ? (size_t)(eq - a) : strlen(a);
		const flag_def *d = NULL;
		bool negated = false;
		for (size_t k = 0; k < sizeof DEFS / sizeof *DEFS && !d; k++) {
			if (strlen(DEFS[k].name) == nl && !strncmp(DEFS[k].name, a, nl))
				d = &DEFS[k];
			else if (DEFS[k].type == F_BOOL && !eq && nl == strlen(DEFS[k].name) + 2 &&
				 !strncmp(a, "no", 2) && !strncmp(a + 2, DEFS[k].name, nl - 2)) {
				d = &DEFS[k];
				negated = true;
			}
		}
		if (d == NULL) {
			if (!strcmp(a, "h"))
				d = &DEFS[sizeof DEFS / sizeof *DEFS - 1];
			else
				die(1, "unknown flag '%s' (see --help)", argv[i]);
		}
		const char *v = eq ? eq + 1 : NULL;
		if (d->type == F_BOOL) {
			bool b = !negated;
			if (v != NULL && !parse_bool(v, &b))
				die(1, "--%s wants true or false, not '%s'", d->name, v);
			*(bool *)d->ptr = b;
			continue;
		}
		if (v == NULL) {
			if (i + 1 >= argc)
				die(1, "--%s needs a value", d->name);
			v = argv[++i];
		}
		if (d->type == F_STR) {
			*(const char **)d->ptr = v;
		} else {
			uint64_t n;
			if (!parse_size(v, &n) || n < d->min || n > d->max)
				die(1, "--%s=%s is not a number in [%" PRIu64 ", %" PRIu64 "]", d->name, v, d->min,
				    d->max);
			*(uint64_t *)d->ptr = n;
		}
	}
}

/* -------------------------------------------------------------- logging */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char last_log[512];

/* Without --verbose libte's log is kept, not shown: the last warning or
 * error explains a failure in the one line te-bench prints. */
static void keep_log(int level, const char *domain, const char *msg, void *user)
{
	(void)user;
	/* Where the metrics are served: a scraper needs it, a port 0 in
	 * particular. */
	if (level == TE_LOG_INFO && strncmp(msg, "metrics at ", 11) == 0) {
		fprintf(stderr, PROG ": %s\n", msg);
		return;
	}
	if (level > TE_LOG_WARN)
		return;
	pthread_mutex_lock(&log_lock);
	snprintf(last_log, sizeof last_log, "%s: %s", domain ? domain : "te", msg);
	pthread_mutex_unlock(&log_lock);
}

static const char *why(void)
{
	static char copy[520];
	pthread_mutex_lock(&log_lock);
	if (last_log[0])
		snprintf(copy, sizeof copy, " [%s]", last_log);
	else
		copy[0] = '\0';
	pthread_mutex_unlock(&log_lock);
	return copy;
}

/* ------------------------------------------------------------ histogram */

/* Log-linear buckets: 64 per power of two, under 1.6 % error. */
#define SUB_BITS 6
#define SUB (1u << SUB_BITS)
#define NBUCKETS ((64 - SUB_BITS + 1) * SUB)

typedef struct hist {
	uint64_t n[NBUCKETS];
	uint64_t count, max;
} hist;

static unsigned bucket_of(uint64_t v)
{
	if (v < SUB)
		return (unsigned)v;
	unsigned e = 63u - (unsigned)__builtin_clzll(v);
	return (e - SUB_BITS + 1) * SUB + (unsigned)((v >> (e - SUB_BITS)) & (SUB - 1));
}

static double bucket_mid(unsigned b)
{
	if (b < SUB)
		return b;
	unsigned e = b / SUB + SUB_BITS - 1, s = b % SUB;
	double lo = ldexp((double)(SUB + s), (int)e - SUB_BITS);
	return lo + ldexp(1.0, (int)e - SUB_BITS) / 2;
}

static void hist_add(hist *h, uint64_t v, uint64_t times)
{
	h->n[bucket_of(v)] += times;
	h->count += times;
	if (v > h->max)
		h->max = v;
}

static void hist_merge(hist *into, const hist *h)
{
	for (unsigned i = 0; i < NBUCKETS; i++)
		into->n[i] += h->n[i];
	into->count += h->count;
	if (h->max > into->max)
		into->max = h->max;
}

static double hist_pct(const hist *h, double p)
{
	if (h->count == 0)
		return 0;
	uint64_t want = (uint64_t)ceil(p * (double)h->count);
	uint64_t acc = 0;
	if (want == 0)
		want = 1;
	for (unsigned i = 0; i < NBUCKETS; i++) {
		acc += h->n[i];
		if (acc >= want)
			return bucket_mid(i) > (double)h->max ? (double)h->max : bucket_mid(i);
	}
	return (double)h->max;
}

/* --------------------------------------------------------------- helpers */

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void pattern_fill(unsigned char *p, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(p + i, &x, 8);
	}
	for (; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (unsigned char)x;
	}
}

static void *map_buffer(uint64_t size, bool vram)
{
	void *p;
	if (vram) {
		char loc[64];
		snprintf(loc, sizeof loc, "%s:%" PRIu64, F.vram_device, F.gpu_id);
		int rc = te_device_alloc(loc, size, &p);
		if (rc < 0)
			die(1, "cannot allocate %" PRIu64 " bytes of %s memory: %s%s", size, loc,
			    te_strerror(rc), why());
		return p;
	}
	if (strcmp(F.memory, "libte") == 0) {
		int rc = te_mem_alloc(size, &p);
		if (rc < 0)
			die(1, "cannot allocate a %" PRIu64 "-byte buffer: %s%s", size, te_strerror(rc), why());
		return p;
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		die(1, "cannot map a %" PRIu64 "-byte buffer: %s", size, strerror(errno));
	return p;
}

static uint64_t unit_bytes(const char *u)
{
	static const struct { const char *n; uint64_t v; } units[] = {
		{ "GB", 1000000000ull }, { "GiB", 1ull << 30 }, { "Gb", 1000000000ull / 8 },
		{ "MB", 1000000ull },    { "MiB", 1ull << 20 }, { "Mb", 1000000ull / 8 },
		{ "KB", 1000ull },       { "KiB", 1ull << 10 }, { "Kb", 1000ull / 8 },
	};
	for (size_t i = 0; i < sizeof units / sizeof *units; i++)
		if (!strcmp(u, units[i].n))
			return units[i].v;
	return 0;
}

static char *read_file(const char *path)
{
	FILE *f = fopen(path, "r");
	if (f == NULL)
		die(1, "cannot read --nic_priority_matrix file %s: %s", path, strerror(errno));
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap);
	size_t r;
	while (buf && (r = fread(buf + len, 1, cap - len - 1, f)) > 0) {
		len += r;
		if (len + 1 == cap) {
			if (cap >= (1u << 24))
				die(1, "--nic_priority_matrix file %s is too large", path);
			cap *= 2;
			buf = realloc(buf, cap);
		}
	}
	fclose(f);
	if (buf == NULL)
		die(1, "out of memory");
	buf[len] = '\0';
	return buf;
}

/* The JSON arguments for a transport: RDMA takes a NIC priority matrix, made
 * from --device_name like Mooncake's bench does when no file is given. */
static char *transport_args(const char *proto)
{
	if (strcmp(proto, "rdma") != 0)
		return NULL;
	if (F.nic_priority_matrix[0])
		return read_file(F.nic_priority_matrix);
	if (F.device_name[0] == '\0')
		return NULL; /* the plugin builds the matrix from the topology */
	size_t cap = strlen(F.device_name) * 3 + 16;
	char *list = malloc(cap), *out = malloc(cap * 4 + 128);
	if (list == NULL || out == NULL)
		die(1, "out of memory");
	size_t l = 0;
	const char *p = F.device_name;
	while (*p) {
		size_t n = strcspn(p, ",");
		if (n > 0)
			l += (size_t)snprintf(list + l, cap - l, "%s\"%.*s\"", l ? "," : "", (int)n, p);
		p += n + (p[n] == ',');
	}
	snprintf(out, cap * 4 + 128, "{\"cpu:0\":[[%s],[]],\"cpu:1\":[[%s],[]],\"cuda:0\":[[%s],[]]}", list,
		 list, list);
	free(list);
	return out;
}

/* ---------------------------------------------------------------- engines */

/* --metadata_server for output: a password in its user-info
 * ("etcd://user:pw@host") shown as "***". */
static const char *store_for_log(void)
{
	static char buf[1024];
	const char *c = F.metadata_server;
	const char *start = strstr(c, "://");
	start = start ? start + 3 : c;
	size_t n = strcspn(start, "/?#");
	const char *at = NULL, *colon = NULL;
	for (const char *p = start; p < start + n; p++)
		if (*p == '@')
			at = p;
	if (at != NULL)
		colon = memchr(start, ':', (size_t)(at - start));
	if (colon == NULL)
		return c;
	snprintf(buf, sizeof buf, "%.*s:***%s", (int)(colon - c), c, at);
	return buf;
}

static te_engine *make_engine(const char *name, bool loopback_alias)
{
	te_engine *e = NULL;
	te_option opt[3];
	size_t n = 0;

	if (F.auth_key_file != NULL && *F.auth_key_file != '\0')
		opt[n++] = (te_option){ "auth_key_file", F.auth_key_file };
	if (F.metrics_addr != NULL && *F.metrics_addr != '\0')
		opt[n++] = (te_option){ "metrics_addr", F.metrics_addr };
	/* Outside P2PHANDSHAKE two loopback engines need distinct names that
	 * still say where to reach them. */
	if (loopback_alias)
		opt[n++] = (te_option){ "ip_or_host_name", "127.0.0.1" };
	int rc = te_engine_create(F.metadata_server, name, opt, n, &e);
	if (rc < 0)
		die(1, "cannot start an engine with metadata '%s' as '%s': %s%s", store_for_log(),
		    name ? name : "(host name)", te_strerror(rc), why());
	engines[engines[0] ? 1 : 0] = e;
	if (F.auto_discovery || strcmp(F.protocol, "auto") == 0) {
		const char *got = NULL;
		rc = te_transport_auto(e, &got);
		if (rc < 0)
			die(1, "auto-discovery installed no transport: %s%s", te_strerror(rc), why());
	} else {
		char *args = transport_args(F.protocol);
		rc = te_transport_install(e, F.protocol, args);
		free(args);
		if (rc < 0)
			die(1, "cannot install transport '%s': %s%s", F.protocol, te_strerror(rc), why());
	}
	return e;
}

static void *register_buffer(te_engine *e, uint64_t size, uint64_t touch, bool remote, bool vram)
{
	void *p = map_buffer(size, vram);
	/* Fault in the part in use, so that page faults do not show in the
	 * figures (device memory is the device plugin's: "*" finds its device). */
	if (!vram)
		memset(p, 0, touch);
	int rc = te_register_memory(e, p, size, vram ? "*" : "cpu:0",
				    remote ? TE_MEM_REMOTE_ACCESS : 0);
	if (rc < 0)
		die(1, "cannot register %" PRIu64 " bytes: %s%s", size, te_strerror(rc), why());
	return p;
}

/* ---------------------------------------------------------------- workers */

typedef struct run {
	te_engine *e;
	bool mixed;
	const char *transport;
	te_segment_id seg;
	uint32_t op;
	unsigned char *local;  /* initiator buffer */
	unsigned char *verify; /* --check: expected data */
	uint64_t remote_base[64];
	uint64_t remote_len[64];
	unsigned nremote;
	atomic_bool stop;
	atomic_uint_fast64_t batches;
	atomic_int failed;
	char error[600];
	pthread_mutex_t error_lock;
} run;

static run R;

typedef struct worker {
	pthread_t th;
	unsigned id;
	hist h;
	uint64_t batches;
	unsigned char *scratch; /* --check with --use_vram: a host copy of one block */
} worker;

static void fail_run(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* --check touches the initiator's buffer only through these: with --use_vram
 * it is device memory, which only the device plugin may read or write. */
static void local_set(worker *w, unsigned char *dst, int byte, uint64_t n)
{
	if (!F.use_vram) {
		memset(dst, byte, n);
		return;
	}
	memset(w->scratch, byte, n);
	if (te_device_copy(dst, w->scratch, n) < 0)
		fail_run(1, "device copy failed%s", why());
}

static void local_put(unsigned char *dst, const unsigned char *src, uint64_t n)
{
	if (!F.use_vram)
		memcpy(dst, src, n);
	else if (te_device_copy(dst, src, n) < 0)
		fail_run(1, "device copy failed%s", why());
}

static const unsigned char *local_get(worker *w, const unsigned char *src, uint64_t n)
{
	if (!F.use_vram)
		return src;
	if (te_device_copy(w->scratch, src, n) < 0) {
		fail_run(1, "device copy failed%s", why());
		memset(w->scratch, 0, n);
	}
	return w->scratch;
}

static void fail_run(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fail_run(int code, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&R.error_lock);
	if (!atomic_load(&R.failed)) {
		va_start(ap, fmt);
		vsnprintf(R.error, sizeof R.error, fmt, ap);
		va_end(ap);
		atomic_store(&R.failed, code);
	}
	pthread_mutex_unlock(&R.error_lock);
	atomic_store(&R.stop, true);
}

static const char *state_name(int s)
{
	static const char *n[] = { "WAITING", "PENDING", "INVALID", "CANCELED", "COMPLETED", "TIMEOUT", "FAILED" };
	return s >= 0 && s <= 6 ? n[s] : "?";
}

/* One batch of `op` over this thread's blocks; false after recording a failure. */
static bool one_batch(worker *w, te_request *reqs, uint32_t op, unsigned char *local_base)
{
	te_batch_id b;
	int rc = te_batch_alloc(R.e, F.batch_size, &b);

	if (rc < 0) {
		fail_run(1, "te_batch_alloc: %s", te_strerror(rc));
		return false;
	}
	for (uint64_t i = 0; i < F.batch_size; i++) {
		uint64_t off = F.block_size * (i * F.threads + w->id);
		reqs[i].opcode = op;
		reqs[i].local = local_base + off;
	}
	rc = te_submit(R.e, b, reqs, F.batch_size);
	if (rc < 0) {
		te_batch_free(R.e, b);
		fail_run(1, "te_submit: %s%s", te_strerror(rc), why());
		return false;
	}
	rc = te_batch_wait(R.e, b, WAIT_MS);
	if (rc < 0) {
		fail_run(1, "a batch did not finish within %d s: %s", WAIT_MS / 1000, te_strerror(rc));
		return false; /* the batch stays allocated: its tasks are still running */
	}
	int32_t state = 0;
	te_batch_status(R.e, b, NULL, NULL, &state);
	if (state != TE_TASK_COMPLETED) {
		for (uint64_t i = 0; i < F.batch_size; i++) {
			te_task_status st;
			if (te_get_status(R.e, b, i, &st) == 0 && st.state != TE_TASK_COMPLETED) {
				fail_run(1, "%s of %" PRIu64 " bytes at remote 0x%" PRIx64 " ended %s: %s%s",
					 op == TE_OP_READ ? "READ" : "WRITE", F.block_size, reqs[i].remote,
					 state_name(st.state), te_strerror(st.error), why());
				break;
			}
		}
		te_batch_free(R.e, b);
		return false;
	}
	te_batch_free(R.e, b);
	return true;
}

static bool compare(worker *w, uint64_t iter, const te_request *reqs, uint32_t op)
{
	for (uint64_t i = 0; i < F.batch_size; i++) {
		uint64_t off = F.block_size * (i * F.threads + w->id);
		const unsigned char *got = local_get(w, R.local + off, F.block_size), *want = R.verify + off;
		if (memcmp(got, want, F.block_size) == 0)
			continue;
		uint64_t k = 0;
		while (got[k] == want[k])
			k++;
		fail_run(2, "DATA MISMATCH after %s: thread %u, batch %" PRIu64 ", block %" PRIu64
			 " (remote 0x%" PRIx64 "), byte %" PRIu64 ": got 0x%02x, want 0x%02x",
			 op == TE_OP_READ ? "READ" : "WRITE", w->id, iter, i, reqs[i].remote, k, got[k],
			 want[k]);
		return false;
	}
	return true;
}

static void *worker_main(void *arg)
{
	worker *w = arg;
	te_request *reqs = calloc(F.batch_size, sizeof *reqs);
	uint64_t base = R.remote_base[w->id % R.nremote] + F.remote_offset;

	if (reqs == NULL) {
		fail_run(1, "out of memory");
		return NULL;
	}
	for (uint64_t i = 0; i < F.batch_size; i++) {
		reqs[i].segment = R.seg;
		reqs[i].remote = base + F.block_size * (i * F.threads + w->id);
		reqs[i].length = F.block_size;
	}
	for (uint64_t iter = 0; !atomic_load_explicit(&R.stop, memory_order_relaxed); iter++) {
		/* --operation=mixed: reads and writes by turns */
		uint32_t op = R.mixed ? (iter % 2 ? TE_OP_WRITE : TE_OP_READ) : R.op;
		if (F.check) {
			/* Expected bytes in `verify`; the measured operation moves them
			 * through the remote side into `local`. */
			for (uint64_t i = 0; i < F.batch_size; i++) {
				uint64_t off = F.block_size * (i * F.threads + w->id);
				pattern_fill(R.verify + off, F.block_size, (iter << 20) ^ (i << 8) ^ w->id ^ 0x5eed);
				if (op == TE_OP_READ)
					local_set(w, R.local + off, 0xa5, F.block_size);
				else
					local_put(R.local + off, R.verify + off, F.block_size);
			}
			if (op == TE_OP_READ && !one_batch(w, reqs, TE_OP_WRITE, R.verify))
				break;
		}
		uint64_t t0 = now_ns();
		if (!one_batch(w, reqs, op, R.local))
			break;
		uint64_t dt = now_ns() - t0;
		if (F.check) {
			if (op == TE_OP_WRITE) {
				/* Read back what was written, into `local` over the source. */
				for (uint64_t i = 0; i < F.batch_size; i++)
					local_set(w, R.local + F.block_size * (i * F.threads + w->id), 0xa5,
						  F.block_size);
				if (!one_batch(w, reqs, TE_OP_READ, R.local))
					break;
			}
			if (!compare(w, iter, reqs, op))
				break;
		}
		/* Every request of the batch saw the batch's completion time. */
		hist_add(&w->h, dt, F.batch_size);
		w->batches++;
		atomic_fetch_add_explicit(&R.batches, 1, memory_order_relaxed);
	}
	free(reqs);
	return NULL;
}

/* --------------------------------------------------------------- results */

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	(void)sig;
	interrupted = 1;
}

static void fmt_bytes(char *buf, size_t n, uint64_t v)
{
	if (v >= (1ull << 30) && v % (1ull << 30) == 0)
		snprintf(buf, n, "%" PRIu64 " GiB", v >> 30);
	else if (v >= (1ull << 20) && v % (1ull << 20) == 0)
		snprintf(buf, n, "%" PRIu64 " MiB", v >> 20);
	else if (v >= 1024 && v % 1024 == 0)
		snprintf(buf, n, "%" PRIu64 " KiB", v >> 10);
	else
		snprintf(buf, n, "%" PRIu64 " B", v);
}

static void fmt_lat(char *buf, size_t n, double ns)
{
	if (ns >= 1e6)
		snprintf(buf, n, "%.2f ms", ns / 1e6);
	else
		snprintf(buf, n, "%.1f us", ns / 1e3);
}

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; s && *s; s++) {
		if (*s == '"' || *s == '\\')
			fprintf(f, "\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			fprintf(f, "\\u%04x", *s);
		else
			fputc(*s, f);
	}
	fputc('"', f);
}

static int run_initiator(te_engine *e, const char *target, const char *mode_name)
{
	te_segment_buffer bufs[64];
	uint64_t span = F.block_size * F.batch_size * F.threads;
	uint64_t unit = unit_bytes(F.report_unit);

	R.e = e;
	R.op = strcmp(F.operation, "write") == 0 ? TE_OP_WRITE : TE_OP_READ;
	R.mixed = strcmp(F.operation, "mixed") == 0;
	pthread_mutex_init(&R.error_lock, NULL);
	R.seg = te_segment_open(e, target);
	if (R.seg < 0)
		die(1, "cannot open segment '%s': %s%s", target, te_strerror(R.seg), why());
	R.transport = te_segment_transport(e, R.seg); /* what serves it: shm for this host */
	if (R.transport == NULL)
		R.transport = "?";
	int nb = te_segment_buffers(e, R.seg, bufs, 64);
	if (nb <= 0)
		die(1, "segment '%s' has no buffers to %s%s", target, F.operation, nb < 0 ? why() : "");
	R.nremote = (unsigned)(nb > 64 ? 64 : nb);
	for (unsigned i = 0; i < R.nremote; i++) {
		R.remote_base[i] = bufs[i].addr;
		R.remote_len[i] = bufs[i].length;
		if ((bufs[i].length < span || bufs[i].length - span < F.remote_offset) && i < F.threads)
			die(1, "segment '%s' buffer %u holds %" PRIu64 " bytes; remote_offset + block_size*batch_size*threads = %"
			       PRIu64, target, i, bufs[i].length, F.remote_offset + span);
	}
	R.local = register_buffer(e, F.buffer_size, span, false, F.use_vram);
	if (F.check) /* the expected bytes stay in host memory */
		R.verify = register_buffer(e, F.buffer_size, span, false, false);

	char bs[32];
	fmt_bytes(bs, sizeof bs, F.block_size);
	if (!F.json)
		printf("%s: %s %s over %s, %" PRIu64 " x %s per batch, %" PRIu64 " thread%s, %" PRIu64 " s%s%s\n",
		       PROG, mode_name, F.operation, R.transport,
		       F.batch_size, bs, F.threads, F.threads > 1 ? "s" : "", F.duration,
		       F.check ? ", checking every byte" : "", F.use_vram ? ", device memory" : "");
	fflush(stdout);

	worker *ws = calloc(F.threads, sizeof *ws);
	if (ws == NULL)
		die(1, "out of memory");
	uint64_t start = now_ns();
	for (unsigned i = 0; i < F.threads; i++) {
		ws[i].id = i;
		if (F.use_vram && F.check && (ws[i].scratch = malloc(F.block_size)) == NULL)
			die(1, "out of memory");
		if (pthread_create(&ws[i].th, NULL, worker_main, &ws[i]) != 0)
			die(1, "cannot start thread %u", i);
	}
	uint64_t last_b = 0, last_t = start;
	for (uint64_t sec = 1; !atomic_load(&R.stop); sec++) {
		uint64_t until = start + sec * 1000000000ull;
		while (now_ns() < until && !atomic_load(&R.stop) && !interrupted)
			usleep(20000);
		if (interrupted || sec >= F.duration)
			atomic_store(&R.stop, true);
		if (!F.quiet && !atomic_load(&R.failed)) {
			uint64_t b = atomic_load(&R.batches), t = now_ns();
			double dt = (double)(t - last_t) / 1e9;
			double reqs = (double)(b - last_b) * (double)F.batch_size;
			fprintf(stderr, "[%3" PRIu64 " s] %.*f %s/s, %.0f requests/s\n", sec, (int)F.report_precision,
				reqs * (double)F.block_size / dt / (double)unit, F.report_unit, reqs / dt);
			last_b = b;
			last_t = t;
		}
	}
	for (unsigned i = 0; i < F.threads; i++)
		pthread_join(ws[i].th, NULL);
	double duration = (double)(now_ns() - start) / 1e9;
	if (atomic_load(&R.failed))
		die(atomic_load(&R.failed), "%s", R.error);

	hist h = { 0 };
	uint64_t batches = 0;
	for (unsigned i = 0; i < F.threads; i++) {
		hist_merge(&h, &ws[i].h);
		batches += ws[i].batches;
	}
	for (unsigned i = 0; i < F.threads; i++)
		free(ws[i].scratch);
	free(ws);
	double bytes = (double)batches * (double)F.batch_size * (double)F.block_size;
	double rate = bytes / duration;
	double iops = (double)batches * (double)F.batch_size / duration;
	double p50 = hist_pct(&h, 0.50), p99 = hist_pct(&h, 0.99), p999 = hist_pct(&h, 0.999);
	if (F.json) {
		printf("{\"mode\":");
		json_str(stdout, mode_name);
		printf(",\"protocol\":");
		json_str(stdout, F.protocol);
		printf(",\"transport\":");
		json_str(stdout, R.transport);
		printf(",\"metadata_server\":");
		json_str(stdout, store_for_log());
		printf(",\"segment_id\":");
		json_str(stdout, target);
		printf(",\"operation\":\"%s\",\"block_size\":%" PRIu64 ",\"batch_size\":%" PRIu64
		       ",\"threads\":%" PRIu64 ",\"check\":%s,\"duration_s\":%.3f,\"batch_count\":%" PRIu64
		       ",\"requests\":%" PRIu64 ",\"bytes\":%.0f,\"throughput_bytes_per_s\":%.0f,\"throughput\":%.*f"
		       ",\"report_unit\":",
		       F.operation, F.block_size, F.batch_size, F.threads, F.check ? "true" : "false", duration,
		       batches, batches * F.batch_size, bytes, rate, (int)F.report_precision, rate / (double)unit);
		json_str(stdout, F.report_unit);
		printf(",\"iops\":%.0f,\"latency_us\":{\"p50\":%.1f,\"p99\":%.1f,\"p999\":%.1f,\"max\":%.1f}}\n",
		       iops, p50 / 1e3, p99 / 1e3, p999 / 1e3, (double)h.max / 1e3);
	} else {
		char a[32], b[32], c[32];
		fmt_lat(a, sizeof a, p50);
		fmt_lat(b, sizeof b, p99);
		fmt_lat(c, sizeof c, p999);
		printf("Test completed: duration %.2f, batch count %" PRIu64 ", throughput %.*f %s/s\n", duration,
		       batches, (int)F.report_precision, rate / (double)unit, F.report_unit);
		printf("IOPS %.0f requests/s; latency per request p50 %s, p99 %s, p99.9 %s (submit to batch "
		       "completion)%s\n",
		       iops, a, b, c, F.check ? "; every byte checked (figures include the check traffic)" : "");
	}
	fflush(stdout);
	te_segment_close(e, R.seg);
	return 0;
}

/* ------------------------------------------------------------------ main */

/* --metrics_linger: the engines stay, idle, so that a scraper sees the
 * run's final counts. Ctrl-C ends it early. */
static void linger(void)
{
	if (F.metrics_linger == 0)
		return;
	uint64_t end = now_ns() + F.metrics_linger * 1000000000ull;
	while (!interrupted && now_ns() < end)
		usleep(20000);
}

static const char *hostname(void)
{
	static char h[256];
	if (gethostname(h, sizeof h - 1) != 0 || h[0] == '\0')
		snprintf(h, sizeof h, "localhost");
	return h;
}

int main(int argc, char **argv)
{
	parse_flags(argc, argv);
	if (F.help) {
		usage(stdout);
		return 0;
	}
	if (F.mode == NULL)
		F.mode = F.segment_id ? "initiator" : "loopback";
	if (strcmp(F.mode, "loopback") && strcmp(F.mode, "target") && strcmp(F.mode, "initiator"))
		die(1, "--mode=%s: want loopback, target or initiator", F.mode);
	if (strcmp(F.memory, "libte") && strcmp(F.memory, "anonymous"))
		die(1, "--memory=%s: want libte or anonymous", F.memory);
	if (strcmp(F.operation, "read") && strcmp(F.operation, "write") && strcmp(F.operation, "mixed"))
		die(1, "--operation=%s: want read, write or mixed", F.operation);
	if (unit_bytes(F.report_unit) == 0)
		die(1, "--report_unit=%s: want GB, GiB, Gb, MB, MiB, Mb, KB, KiB or Kb", F.report_unit);
	if (!strcmp(F.mode, "initiator") && (F.segment_id == NULL || !*F.segment_id))
		die(1, "--mode=initiator needs --segment_id=<the target's segment name>");
	if (F.segment_id && strchr(F.segment_id, '/') && !strcmp(F.metadata_server, "P2PHANDSHAKE"))
		die(1, "--segment_id=%s names a file (NVMe-oF) segment, which lives in a metadata store: "
		       "give --metadata_server=etcd://... (or redis://, http://)", F.segment_id);
	if (F.block_size > UINT64_MAX / F.batch_size / F.threads)
		die(1, "block_size*batch_size*threads overflows");
	uint64_t need = F.block_size * F.batch_size * F.threads;
	if (F.buffer_size < need) {
		if (!F.json)
			fprintf(stderr, PROG ": --buffer_size raised to %" PRIu64 " (block_size*batch_size*threads)\n",
				need);
		F.buffer_size = need;
	}

	if (F.verbose) {
		te_set_log_level(TE_LOG_INFO);
	} else if (getenv("TE_LOG_LEVEL") == NULL && getenv("MC_LOG_LEVEL") == NULL) {
		te_set_log_handler(keep_log, NULL);
		if (F.metrics_addr != NULL || getenv("TE_METRICS_ADDR") != NULL)
			te_set_log_level(TE_LOG_INFO); /* for the endpoint's URL; keep_log drops the rest */
	}
	struct sigaction sa = { .sa_handler = on_signal };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	if (!strcmp(F.mode, "target")) {
		te_engine *e = make_engine(F.local_server_name ? F.local_server_name : hostname(), false);
		/* touched now, so first use by an initiator does not count page faults */
		register_buffer(e, F.buffer_size, F.buffer_size, true, F.use_vram);
		printf("%s: target ready, segment name %s (metadata %s, protocol %s); Ctrl-C stops it\n", PROG,
		       te_engine_name(e), store_for_log(), F.protocol);
		fflush(stdout);
		while (!interrupted)
			pause();
		drop_engines();
		return 0;
	}
	if (!strcmp(F.mode, "initiator")) {
		te_engine *e = make_engine(F.local_server_name ? F.local_server_name : hostname(), false);
		int rc = run_initiator(e, F.segment_id, "initiator");
		linger();
		drop_engines();
		return rc;
	}

	/* loopback: a target and an initiator engine in this process */
	bool p2p = !strcmp(F.metadata_server, "P2PHANDSHAKE");
	char tname[128], iname[128];
	if (p2p) {
		snprintf(tname, sizeof tname, "%s", F.local_server_name ? F.local_server_name : "127.0.0.1");
		snprintf(iname, sizeof iname, "%s", tname);
	} else {
		snprintf(tname, sizeof tname, "te-bench-target-%d", (int)getpid());
		snprintf(iname, sizeof iname, "te-bench-initiator-%d", (int)getpid());
	}
	te_engine *target = make_engine(tname, !p2p);
	register_buffer(target, F.buffer_size, need, true, F.use_vram);
	te_engine *init = make_engine(iname, !p2p);
	int rc = run_initiator(init, te_engine_name(target), "loopback");
	linger();
	drop_engines(); /* the initiator first, then the target */
	return rc;
}
