/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Many engines on one store, measured: scale-run N [K [TTL]]
 *
 * A real 3-member etcd cluster on loopback ports; N engines, each in its own
 * process (TCP, 127.0.0.1), started all at once. Then:
 *   - start: time until every engine has published (its process says READY),
 *     with the etcd leader SIGKILLed halfway through starting them;
 *   - each engine opens K random peers (cold: store + RPC; then warm, the
 *     cache): open latency p50/p99/max;
 *   - each writes 64 KiB blocks into each of its peers and reads them back,
 *     every byte checked: aggregate throughput, per-engine min/max;
 *   - idle: per engine wake-ups/s, CPU, threads, fds, TCP connections, RSS
 *     from /proc over a window; keys in the store (2 per engine);
 *   - churn: 10 % of the engines (at least one) SIGKILLed: a transfer to one
 *     ends FAILED within a bound, its keys leave the store within the lease
 *     TTL, and the engine restarted under its name is opened and served again
 *     by a survivor (which closes and reopens it) without restarting anyone
 *     else.
 * Exits non-zero when a check fails. Prints one table; docs/scale.md has the
 * figures of runs by hand.
 *
 * SCALE_HOSTS=M SCALE_SUBNET=a.b.c (set by scale-hosts.sh, which makes them):
 * engine i runs in network namespace te-scale-<SCALE_TAG>-(i % M) at
 * a.b.c.(2 + i % M), as on M hosts; etcd listens on a.b.c.1 too, the bridge
 * that joins them.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* setns */
#endif
#include <sched.h>
#include <dirent.h>
#include <math.h>

#include <te/te.h>

#include "../common/check.h"
#pragma GCC diagnostic ignored "-Wunused-function" /* the harness serves many tests */
#include "../metadata/b64.h"
#include "../metadata/md-harness.h"
#include "teu-proc.h"

#ifndef MIN
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#endif

#define BLOCK (64u << 10)
#define MAX_N 256
#define ROUNDS 8
/* The engines' etcd lease TTL, seconds (third argument): short, so that the
 * churn step sees a killed engine's keys go soon. */
static int lease_ttl_s = 3;
/* A transfer to a killed engine ends within: its socket is reset or
 * refused at once; the connect timeout is the bound when neither comes. */
#define DEAD_BOUND_MS 7000

static char conn[512];
static int n_engines, k_peers;
/* Simulated hosts (SCALE_HOSTS): 0, all on 127.0.0.1. */
static int n_hosts;
static const char *subnet, *host_tag;

/* ------------------------------------------------------------- engines */

static long long us_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

/* fmt's text, cut to 511 bytes, written to fd: its length uncut, or -1 when
 * the write failed or fell short. */
static int vwrite_text(int fd, const char *fmt, va_list ap)
{
	char b[512];
	int n = vsnprintf(b, sizeof b, fmt, ap);
	size_t len = n > 0 ? (size_t)MIN(n, (int)sizeof b - 1) : 0;
	if (len > 0 && write(fd, b, len) != (ssize_t)len)
		return -1;
	return n;
}

/* An engine's line to the runner (a line that does not go ends the engine). */
static void say(int fd, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vwrite_text(fd, fmt, ap);
	va_end(ap);
	if (n < 0)
		_exit(3);
}

/* One block into slot `slot` of `seg`'s first buffer and back, checked. */
static int block_both_ways(te_engine *e, te_segment_id seg, char *local, unsigned slot, unsigned seed)
{
	te_segment_buffer rb;
	if (te_segment_buffers(e, seg, &rb, 1) < 1 || rb.length < (uint64_t)(slot + 1) * BLOCK)
		return -EINVAL;
	for (unsigned i = 0; i < BLOCK; i++)
		local[i] = (char)(seed * 131 + i * 7 + slot);
	int st = run_one(e, TE_OP_WRITE, seg, local, rb.addr + (uint64_t)slot * BLOCK, BLOCK, NULL);
	if (st != TE_TASK_COMPLETED)
		return -st - 1000;
	memset(local + BLOCK, 0, BLOCK);
	st = run_one(e, TE_OP_READ, seg, local + BLOCK, rb.addr + (uint64_t)slot * BLOCK, BLOCK, NULL);
	if (st != TE_TASK_COMPLETED)
		return -st - 1000;
	return memcmp(local, local + BLOCK, BLOCK) == 0 ? 0 : -EBADMSG;
}

/* An engine's process: commands on `in`, answers on `out`.
 *   open NAME | close NAME | xfer NAME SLOT ROUNDS | quit */
static int engine_main(int idx, int in, int out)
{
	char ip[32] = "127.0.0.1";
	if (n_hosts > 0)
		snprintf(ip, sizeof ip, "%s.%d", subnet, 2 + idx % n_hosts);
	te_option opt[] = { { "ip_or_host_name", ip }, { "transports", "tcp" } };
	char name[64], line[512];
	te_engine *e;
	void *mem;

	snprintf(name, sizeof name, "scale-%d-%d", (int)getppid(), idx);
	int rc = te_engine_create(conn, name, opt, 2, &e);
	if (rc < 0) {
		say(out, "ERR create %s\n", te_strerror(rc));
		return 1;
	}
	size_t len = (size_t)(MAX_N + 2) * BLOCK;
	if (te_mem_alloc(len, &mem) < 0 || te_register_memory(e, mem, len, "cpu:0", TE_MEM_REMOTE_ACCESS) < 0) {
		say(out, "ERR register\n");
		return 1;
	}
	char *local = (char *)mem + (size_t)MAX_N * BLOCK;
	say(out, "READY %s\n", name);
	FILE *f = fdopen(in, "r");
	while (f != NULL && fgets(line, sizeof line, f) != NULL) {
		char peer[128];
		unsigned slot, rounds;
		if (sscanf(line, "open %127s", peer) == 1) {
			long long t0 = us_now();
			te_segment_id s = te_segment_open(e, peer);
			long long dt = us_now() - t0;
			if (s < 0)
				say(out, "ERR open %s: %s\n", peer, te_strerror(s));
			else
				say(out, "OPEN %lld\n", dt);
		} else if (sscanf(line, "close %127s", peer) == 1) {
			te_segment_id s = te_segment_find(e, peer);
			int rc = s > 0 ? te_segment_close(e, s) : s;
			if (rc == 0)
				say(out, "CLOSED\n");
			else
				say(out, "ERR close %s: %s\n", peer, te_strerror(rc));
		} else if (sscanf(line, "xfer %127s %u %u", peer, &slot, &rounds) == 3 && slot < MAX_N) {
			te_segment_id s = te_segment_find(e, peer);
			long long t0 = us_now();
			int r = s > 0 ? 0 : -ENOENT;
			for (unsigned i = 0; i < rounds && r == 0; i++)
				r = block_both_ways(e, s, local, slot, i + 1);
			long long dt = us_now() - t0;
			if (r == 0)
				say(out, "XFER %llu %lld\n", (unsigned long long)rounds * 2 * BLOCK, dt);
			else
				say(out, "FAIL %d %lld\n", r, dt);
		} else if (strncmp(line, "quit", 4) == 0) {
			break;
		} else {
			say(out, "ERR unknown command\n");
		}
	}
	te_engine_destroy(e);
	te_mem_free(mem);
	return 0;
}

typedef struct eng {
	pid_t pid;
	int in, out;
	char name[64];
	bool alive;
	int peers[MAX_N];
	double bytes, secs;
} eng;

static eng engs[MAX_N];

static void start_engine(int i)
{
	int c2p[2], p2c[2];
	REQUIRE(pipe2(c2p, O_CLOEXEC) == 0 && pipe2(p2c, O_CLOEXEC) == 0);
	pid_t pid = fork();
	REQUIRE(pid >= 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(c2p[0]);
		close(p2c[1]);
		/* The other engines' pipes are not this engine's descriptors. */
		for (int k = 0; k < MAX_N; k++)
			if (k != i && engs[k].alive) {
				close(engs[k].in);
				close(engs[k].out);
			}
		if (n_hosts > 0) { /* onto its host */
			char ns[128];
			snprintf(ns, sizeof ns, "/run/netns/te-scale-%s-%d", host_tag, i % n_hosts);
			int fd = open(ns, O_RDONLY | O_CLOEXEC);
			if (fd < 0 || setns(fd, CLONE_NEWNET) < 0) {
				say(c2p[1], "ERR cannot enter %s: %s\n", ns, strerror(errno));
				_exit(1);
			}
			close(fd);
		}
		_exit(engine_main(i, p2c[0], c2p[1]));
	}
	close(c2p[1]);
	close(p2c[0]);
	engs[i] = (eng){ .pid = pid, .in = p2c[1], .out = c2p[0], .alive = true };
	/* Killed with the test (the harness's list, while it has room; else
	 * PR_SET_PDEATHSIG when this process goes). */
	for (int k = 0; k < MAX_CHILDREN; k++)
		if (children[k] == 0) {
			children[k] = pid;
			break;
		}
}

static bool get_line(int i, char *buf, size_t cap, int timeout_ms)
{
	return harness_read_line(engs[i].out, buf, cap, timeout_ms);
}

/* A command to engine i, whole. */
static void cmd(int i, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vwrite_text(engs[i].in, fmt, ap);
	va_end(ap);
	REQUIRE(n > 0 && n < 512);
}

static int cmp_ll(const void *a, const void *b)
{
	long long x = *(const long long *)a, y = *(const long long *)b;
	return x < y ? -1 : x > y;
}

static long long pct(long long *v, int n, double p)
{
	qsort(v, (size_t)n, sizeof *v, cmp_ll);
	int k = (int)ceil(p * n) - 1;
	return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

/* ------------------------------------------------------------- /proc */

typedef struct usage {
	unsigned long long ctx, ticks;
	unsigned long long ka; /* of ctx: the store's keep-alive (its thread and the HTTP client's) */
	int threads, fds, tcp;
	long rss_kb;
} usage;

static void usage_of(pid_t pid, usage *u)
{
	char path[300], line[256];
	memset(u, 0, sizeof *u);
	snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
	DIR *d = opendir(path);
	struct dirent *de;
	while (d != NULL && (de = readdir(d)) != NULL) {
		if (de->d_name[0] == '.')
			continue;
		u->threads++;
		char comm[32] = "";
		snprintf(path, sizeof path, "/proc/%d/task/%s/comm", (int)pid, de->d_name);
		FILE *f = fopen(path, "r");
		if (f != NULL) {
			if (fgets(comm, sizeof comm, f) == NULL)
				comm[0] = '\0';
			fclose(f);
		}
		bool ka = strncmp(comm, "te-etcd-lease", 13) == 0 || strncmp(comm, "te-http", 7) == 0;
		snprintf(path, sizeof path, "/proc/%d/task/%s/status", (int)pid, de->d_name);
		f = fopen(path, "r");
		while (f != NULL && fgets(line, sizeof line, f) != NULL) {
			unsigned long long v;
			if (sscanf(line, "voluntary_ctxt_switches: %llu", &v) == 1 ||
			    sscanf(line, "nonvoluntary_ctxt_switches: %llu", &v) == 1) {
				u->ctx += v;
				if (ka)
					u->ka += v;
			}
		}
		if (f != NULL)
			fclose(f);
	}
	if (d != NULL)
		closedir(d);
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	char buf[1024];
	if (read_text(path, buf, sizeof buf) >= 0) {
		char *p = strrchr(buf, ')');
		unsigned long long ut = 0, st = 0;
		if (p != NULL && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) == 2)
			u->ticks = ut + st;
	}
	teu_proc_fds(pid, &u->fds, &u->tcp);
	u->rss_kb = teu_proc_rss_kb(pid);
}

/* ------------------------------------------------------------- the store */

/* Keys under `prefix` in the etcd cluster (any member). -1: no answer. */
static int etcd_count(const etcd_member *m, const char *prefix)
{
	char end[256], req[1024], body[4096];
	snprintf(end, sizeof end, "%s", prefix);
	end[strlen(end) - 1]++; /* the prefix's range end */
	char *k = b64(prefix), *e = b64(end);
	REQUIRE(k != NULL && e != NULL);
	snprintf(req, sizeof req, "{\"key\":\"%s\",\"range_end\":\"%s\",\"count_only\":true}", k, e);
	free(k);
	free(e);
	for (int i = 0; i < 3; i++) {
		if (m[i].pid <= 0 ||
		    http_raw(m[i].client_port, "POST", "/v3/kv/range", NULL, req, strlen(req), body, sizeof body) != 200)
			continue;
		const char *c = strstr(body, "\"count\":\"");
		return c ? atoi(c + 9) : 0; /* no "count": none */
	}
	return -1;
}

/* The member that leads the etcd cluster now, or -1. */
static int etcd_leader(const etcd_member *m)
{
	char body[4096];
	for (int i = 0; i < 3; i++) {
		if (m[i].pid <= 0 ||
		    http_raw(m[i].client_port, "POST", "/v3/maintenance/status", NULL, "{}", 2, body, sizeof body) != 200)
			continue;
		const char *me = strstr(body, "\"member_id\":\""), *lead = strstr(body, "\"leader\":\"");
		if (me != NULL && lead != NULL && strtoull(me + 13, NULL, 10) == strtoull(lead + 10, NULL, 10))
			return i;
	}
	return -1;
}

/* --------------------------------------------------------------- main */

int main(int argc, char **argv)
{
	if (argc < 2 || (n_engines = atoi(argv[1])) < 2 || n_engines > MAX_N) {
		fprintf(stderr, "usage: scale-run N [K [TTL]]  (2 <= N <= %d; K peers each, 8; lease TTL, 3 s)\n", MAX_N);
		return 2;
	}
	k_peers = argc > 2 ? atoi(argv[2]) : 8;
	if (k_peers < 1)
		k_peers = 1;
	if (k_peers > n_engines - 1)
		k_peers = n_engines - 1;
	if (argc > 3 && (lease_ttl_s = atoi(argv[3])) < 2)
		lease_ttl_s = 2;
	const char *hv = getenv("SCALE_HOSTS");
	if (hv != NULL && (n_hosts = atoi(hv)) > 0) {
		subnet = getenv("SCALE_SUBNET");
		host_tag = getenv("SCALE_TAG");
		if (subnet == NULL || host_tag == NULL || n_hosts > 250) {
			fprintf(stderr, "scale-run: SCALE_HOSTS needs SCALE_SUBNET and SCALE_TAG (scale-hosts.sh sets them), at most 250 hosts\n");
			return 2;
		}
	}
	harness_init("scale");
	fprintf(stderr, "temporary directory %s\n", tmp_root);
	etcd_member m[3];
	char hub[40];
	const char *store = "127.0.0.1";
	if (n_hosts > 0) {
		snprintf(hub, sizeof hub, "%s.1", subnet);
		etcd_also_listen = store = hub;
	}
	etcd_start(m, 3, "scale");
	snprintf(conn, sizeof conn, "etcd://%s:%d,%s:%d,%s:%d", store, m[0].client_port, store, m[1].client_port,
		 store, m[2].client_port);
	char ttl[16];
	snprintf(ttl, sizeof ttl, "%d", lease_ttl_s);
	setenv("TE_ETCD_LEASE_TTL", ttl, 1);
	char line[512];
	unsigned seed = (unsigned)getpid();

	/* Start: every engine at once; the etcd leader is killed in the middle
	 * of it (the plugin fails over to the other endpoints, the cluster
	 * elects another leader). */
	int leader = etcd_leader(m);
	REQUIRE(leader >= 0);
	long long t0 = now_ms();
	for (int i = 0; i < n_engines; i++) {
		start_engine(i);
		if (i == n_engines / 2) {
			stop_child(m[leader].pid, SIGKILL);
			m[leader].pid = 0;
		}
	}
	for (int i = 0; i < n_engines; i++) {
		REQUIRE(get_line(i, line, sizeof line, 120000) && sscanf(line, "READY %63s", engs[i].name) == 1);
	}
	long long start_ms = now_ms() - t0;
	int keys = etcd_count(m, "mooncake/");
	CHECK_EQ(keys, 2 * n_engines);

	/* Opens: K random peers each; all engines at once. */
	static long long cold[MAX_N * MAX_N], warm[MAX_N * MAX_N];
	int nc = 0, nw = 0;
	for (int i = 0; i < n_engines; i++) {
		bool used[MAX_N] = { false };
		used[i] = true;
		for (int k = 0; k < k_peers; k++) {
			int j;
			do
				j = (int)(rand_r(&seed) % (unsigned)n_engines);
			while (used[j]);
			used[j] = true;
			engs[i].peers[k] = j;
		}
	}
	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < n_engines; i++)
			for (int k = 0; k < k_peers; k++)
				cmd(i, "open %s\n", engs[engs[i].peers[k]].name);
		for (int i = 0; i < n_engines; i++)
			for (int k = 0; k < k_peers; k++) {
				long long us;
				bool ok = get_line(i, line, sizeof line, 60000) && sscanf(line, "OPEN %lld", &us) == 1;
				if (!ok)
					fprintf(stderr, "  engine %d: %s\n", i, line);
				CHECK(ok);
				if (ok && pass == 0)
					cold[nc++] = us;
				else if (ok)
					warm[nw++] = us;
			}
	}
	/* Each warm open took a second reference: one close each. */
	for (int i = 0; i < n_engines; i++)
		for (int k = 0; k < k_peers; k++)
			cmd(i, "close %s\n", engs[engs[i].peers[k]].name);
	for (int i = 0; i < n_engines; i++)
		for (int k = 0; k < k_peers; k++)
			CHECK(get_line(i, line, sizeof line, 30000) && strcmp(line, "CLOSED") == 0);

	/* Transfers: every engine to each of its peers, all engines at once. */
	long long tx0 = now_ms();
	for (int i = 0; i < n_engines; i++)
		for (int k = 0; k < k_peers; k++)
			cmd(i, "xfer %s %d %d\n", engs[engs[i].peers[k]].name, i, ROUNDS);
	double total = 0;
	for (int i = 0; i < n_engines; i++) {
		for (int k = 0; k < k_peers; k++) {
			unsigned long long b;
			long long us;
			bool ok = get_line(i, line, sizeof line, 120000) && sscanf(line, "XFER %llu %lld", &b, &us) == 2;
			if (!ok)
				fprintf(stderr, "  engine %d -> %d: %s\n", i, engs[i].peers[k], line);
			CHECK(ok);
			if (ok) {
				engs[i].bytes += (double)b;
				engs[i].secs += (double)us / 1e6;
				total += (double)b;
			}
		}
	}
	double tx_s = (double)(now_ms() - tx0) / 1000.0;
	double rmin = INFINITY, rmax = 0;
	for (int i = 0; i < n_engines; i++) {
		double r = engs[i].secs > 0 ? engs[i].bytes / engs[i].secs : 0;
		rmin = MIN(rmin, r);
		rmax = MAX(rmax, r);
	}

	/* Idle: nothing happens for a while; then a window. */
	usleep(2000000);
	static usage a[MAX_N], b[MAX_N];
	for (int i = 0; i < n_engines; i++)
		usage_of(engs[i].pid, &a[i]);
	long long w0 = now_ms();
	usleep(5000000);
	for (int i = 0; i < n_engines; i++)
		usage_of(engs[i].pid, &b[i]);
	double wsec = (double)(now_ms() - w0) / 1000.0, hz = (double)sysconf(_SC_CLK_TCK);
	static long long wake[MAX_N], other[MAX_N], cpu[MAX_N], thr[MAX_N], fds[MAX_N], tcp[MAX_N], rss[MAX_N];
	for (int i = 0; i < n_engines; i++) {
		wake[i] = (long long)llround(100.0 * (double)(b[i].ctx - a[i].ctx) / wsec); /* 1/100 s */
		other[i] = (long long)llround(100.0 * (double)((b[i].ctx - b[i].ka) - (a[i].ctx - a[i].ka)) / wsec);
		cpu[i] = (long long)llround(1000.0 * 100.0 * (double)(b[i].ticks - a[i].ticks) / hz / wsec);
		thr[i] = b[i].threads;
		fds[i] = b[i].fds;
		tcp[i] = b[i].tcp;
		rss[i] = b[i].rss_kb;
	}
	/* The lease keep-alive runs every third of its TTL (here each second:
	 * a few switches of its thread and the HTTP client's); every other
	 * thread sleeps: at most one wake-up a second in all of them. */
#ifndef __SANITIZE_THREAD__ /* (TSan's runtime keeps a thread of its own that wakes 10 times a second) */
	CHECK(pct(other, n_engines, 1.0) <= 100);
#endif

	printf("scale-run: %d engines, %d peers each, etcd cluster of 3, lease TTL %d s, ", n_engines, k_peers,
	       lease_ttl_s);
	if (n_hosts > 0)
		printf("on %d hosts (network namespaces on a bridge, %s.0/24)\n", n_hosts, subnet);
	else
		printf("all on 127.0.0.1\n");
	printf("start: all published in %lld ms, the etcd leader killed after half of them were started; %d keys "
	       "in the store (%.1f per engine)\n",
	       start_ms, keys, (double)keys / n_engines);
	printf("open cold: p50 %.2f ms, p99 %.2f ms, max %.2f ms; warm: p50 %.3f ms, max %.3f ms (%d, %d opens)\n",
	       (double)pct(cold, nc, 0.5) / 1000, (double)pct(cold, nc, 0.99) / 1000, (double)pct(cold, nc, 1.0) / 1000,
	       (double)pct(warm, nw, 0.5) / 1000, (double)pct(warm, nw, 1.0) / 1000, nc, nw);
	printf("transfers: %.1f MiB in %.2f s, %.1f MiB/s in all; per engine %.1f to %.1f MiB/s (min/max %.2f), "
	       "every byte checked\n",
	       total / 1048576, tx_s, total / 1048576 / tx_s, rmin / 1048576, rmax / 1048576,
	       rmax > 0 ? rmin / rmax : 0);
	printf("idle, per engine (median / max): wake-ups/s %.2f / %.2f (without the lease keep-alive's threads "
	       "%.2f / %.2f), CPU %% %.3f / %.3f, threads %lld / %lld, fds %lld / %lld, TCP connections %lld / %lld, "
	       "RSS %lld / %lld KiB\n",
	       (double)pct(wake, n_engines, 0.5) / 100, (double)pct(wake, n_engines, 1.0) / 100,
	       (double)pct(other, n_engines, 0.5) / 100, (double)pct(other, n_engines, 1.0) / 100,
	       (double)pct(cpu, n_engines, 0.5) / 1000, (double)pct(cpu, n_engines, 1.0) / 1000,
	       pct(thr, n_engines, 0.5), pct(thr, n_engines, 1.0), pct(fds, n_engines, 0.5), pct(fds, n_engines, 1.0),
	       pct(tcp, n_engines, 0.5), pct(tcp, n_engines, 1.0), pct(rss, n_engines, 0.5), pct(rss, n_engines, 1.0));

	/* Churn: kill 10 %, at least one; engine 0 talks to each victim. */
	int nvict = MAX(1, n_engines / 10);
	int victims[MAX_N];
	for (int v = 0; v < nvict; v++)
		victims[v] = n_engines - 1 - v; /* never engine 0 */
	for (int v = 0; v < nvict; v++) {
		int j = victims[v];
		bool open = false;
		for (int k = 0; k < k_peers; k++)
			open = open || engs[0].peers[k] == j;
		if (!open) {
			cmd(0, "open %s\n", engs[j].name);
			CHECK(get_line(0, line, sizeof line, 30000) && strncmp(line, "OPEN ", 5) == 0);
		}
		cmd(0, "xfer %s %d 1\n", engs[j].name, 0);
		CHECK(get_line(0, line, sizeof line, 30000) && strncmp(line, "XFER ", 5) == 0);
	}
	long long k0 = now_ms();
	for (int v = 0; v < nvict; v++) {
		stop_child(engs[victims[v]].pid, SIGKILL);
		close(engs[victims[v]].in);
		close(engs[victims[v]].out);
		engs[victims[v]].alive = false;
	}
	long long worst_fail = 0;
	for (int v = 0; v < nvict; v++) {
		int r;
		long long us;
		cmd(0, "xfer %s %d 1\n", engs[victims[v]].name, 0);
		bool got = get_line(0, line, sizeof line, 60000) && sscanf(line, "FAIL %d %lld", &r, &us) == 2;
		CHECK(got);
		if (got)
			worst_fail = MAX(worst_fail, us / 1000);
	}
	CHECK(worst_fail <= DEAD_BOUND_MS);
	long long gone_ms = -1;
	while (now_ms() - k0 < (lease_ttl_s + 5) * 1000LL) {
		if (etcd_count(m, "mooncake/") == 2 * (n_engines - nvict)) {
			gone_ms = now_ms() - k0;
			break;
		}
		usleep(100000);
	}
	CHECK(gone_ms >= 0);
	/* Restarted under their names: a survivor that had them open reopens
	 * them (a fresh descriptor: new ports) and is served. */
	for (int v = 0; v < nvict; v++) {
		int j = victims[v];
		start_engine(j);
		REQUIRE(get_line(j, line, sizeof line, 60000) && sscanf(line, "READY %63s", engs[j].name) == 1);
		cmd(0, "close %s\n", engs[j].name);
		bool closed = get_line(0, line, sizeof line, 30000) && strcmp(line, "CLOSED") == 0;
		if (!closed)
			fprintf(stderr, "  engine 0: %s\n", line);
		CHECK(closed);
		cmd(0, "open %s\n", engs[j].name);
		CHECK(get_line(0, line, sizeof line, 30000) && strncmp(line, "OPEN ", 5) == 0);
		cmd(0, "xfer %s %d %d\n", engs[j].name, 0, ROUNDS);
		CHECK(get_line(0, line, sizeof line, 60000) && strncmp(line, "XFER ", 5) == 0);
	}
	CHECK_EQ(etcd_count(m, "mooncake/"), 2 * n_engines);
	printf("churn: %d of %d killed; a transfer to one ended FAILED after %lld ms at most; their keys left the "
	       "store %lld ms after the kill (lease TTL %d s); restarted, each was opened and served again\n",
	       nvict, n_engines, worst_fail, gone_ms, lease_ttl_s);
	fflush(stdout);

	/* Everyone leaves; their keys with them. */
	for (int i = 0; i < n_engines; i++)
		cmd(i, "quit\n");
	for (int i = 0; i < n_engines; i++) {
		int st = wait_child(engs[i].pid, 60000);
		CHECK(st == 0);
		close(engs[i].in);
		close(engs[i].out);
	}
	CHECK_EQ(etcd_count(m, "mooncake/"), 0);
	harness_passed = check_failures == 0;
	return check_done();
}
