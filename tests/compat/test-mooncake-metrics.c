/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The load and throughput reports of Mooncake's C API: getNicLoadStats()
 * while transfers are in flight and after they ended, and the periodic line
 * MC_TE_METRIC asks for. One mode per run (the first argument):
 *   hold  the "hold" test transport (device "hold0"), TEST_PLUGIN_DIR set
 *   log   MC_TE_METRIC and MC_TE_METRIC_INTERVAL_SECONDS over TCP
 *   tcp   the TCP transport's rails
 *   off   TE_METRICS=0 in the environment: nothing is counted
 *   rdma  two NICs per engine: the software verbs layer (TE_RDMA_PLUGIN,
 *         TE_RDMA_SOFT and TE_RDMA_SYSFS_ROOT set by the test), or a real
 *         provider's devices named by TE_RDMA_TEST_DEVICES
 *   slice-timeout  MC_SLICE_TIMEOUT=1 (set by the test): a task held in
 *         flight by the "hold" transport reads as STATUS_TIMEOUT after a
 *         second, and completes once released; unset, it stays in flight
 *   slice-deadline  MC_SLICE_TIMEOUT=1 (set by the test): on "holddl", which
 *         honours deadlines, a held task ends STATUS_FAILED after a second
 * Log lines are caught through te.h's log handler, where the library writes
 * them.
 */
#define _POSIX_C_SOURCE 200809L
#include <transfer_engine_c.h>

#include <te/te.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/check.h"
#include "mc-util.h"
#include "../plugins/hold.h"

/* ------------------------------------------------------------ log capture */

#define MAX_LINES 256
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char *lines[MAX_LINES];
static size_t n_lines;

static void on_log(int level, const char *domain, const char *msg, void *user)
{
	(void)user;
	if (strcmp(domain, "mooncake") != 0) {
		fprintf(stderr, "[%d %s] %s\n", level, domain, msg);
		return;
	}
	pthread_mutex_lock(&log_lock);
	if (n_lines < MAX_LINES)
		lines[n_lines++] = strdup(msg);
	pthread_mutex_unlock(&log_lock);
}

static size_t log_mark(void)
{
	pthread_mutex_lock(&log_lock);
	size_t n = n_lines;
	pthread_mutex_unlock(&log_lock);
	return n;
}

/* The first line after `mark` that contains `s`, copied into `out`. */
static int log_find(size_t mark, const char *s, char *out, size_t size)
{
	int found = 0;

	pthread_mutex_lock(&log_lock);
	for (size_t i = mark; i < n_lines && !found; i++)
		if (lines[i] != NULL && strstr(lines[i], s) != NULL) {
			if (out != NULL)
				snprintf(out, size, "%s", lines[i]);
			found = 1;
		}
	pthread_mutex_unlock(&log_lock);
	return found;
}

static size_t log_count(size_t mark, const char *s)
{
	size_t n = 0;

	pthread_mutex_lock(&log_lock);
	for (size_t i = mark; i < n_lines; i++)
		n += lines[i] != NULL && strstr(lines[i], s) != NULL;
	pthread_mutex_unlock(&log_lock);
	return n;
}

/* --------------------------------------------------------------- helpers */

/* The entry of device `name` among `n`, or NULL. */
static const nic_load_stat_t *find_dev(const nic_load_stat_t *s, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(s[i].device_name, name) == 0)
			return &s[i];
	return NULL;
}

typedef struct pair {
	transfer_engine_t a, b;
	unsigned char *abuf, *bbuf;
	segment_id_t seg;
} pair;

#define BUF (1u << 20)

/* Two engines with `proto` installed (args[0] for each when given), a
 * buffer each, b's segment open in a. */
static pair pair_new(const char *proto, const char *args_a, const char *args_b)
{
	pair p;
	char name[128];
	void *args[2] = { NULL, NULL };

	p.a = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 0);
	p.b = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 0);
	REQUIRE(p.a != NULL && p.b != NULL);
	args[0] = (void *)args_a;
	REQUIRE(installTransport(p.a, proto, args_a != NULL ? args : NULL) != NULL);
	args[0] = (void *)args_b;
	REQUIRE(installTransport(p.b, proto, args_b != NULL ? args : NULL) != NULL);
	p.abuf = calloc(1, BUF);
	p.bbuf = calloc(1, BUF);
	REQUIRE(p.abuf != NULL && p.bbuf != NULL);
	for (size_t i = 0; i < BUF; i++)
		p.bbuf[i] = (unsigned char)(i * 7 + 1);
	REQUIRE(registerLocalMemory(p.a, p.abuf, BUF, "cpu:0", 1) == 0);
	REQUIRE(registerLocalMemory(p.b, p.bbuf, BUF, "cpu:0", 1) == 0);
	REQUIRE(getLocalIpAndPort(p.b, name, sizeof name) == 0);
	p.seg = openSegment(p.a, name);
	REQUIRE(p.seg >= 0);
	return p;
}

static void pair_free(pair *p)
{
	destroyTransferEngine(p->a);
	destroyTransferEngine(p->b);
	free(p->abuf);
	free(p->bbuf);
}

/* Submits `n` requests of `len` bytes each (consecutive ranges) as one batch. */
static batch_id_t submit_n(pair *p, int opcode, size_t n, uint64_t len)
{
	transfer_request_t r[16];
	batch_id_t b = allocateBatchID(p->a, n);

	REQUIRE(b != INVALID_BATCH && n <= 16 && n * len <= BUF);
	for (size_t i = 0; i < n; i++)
		r[i] = (transfer_request_t){ opcode, p->abuf + i * len, p->seg,
					     (uint64_t)(uintptr_t)p->bbuf + i * len, len };
	REQUIRE(submitTransfer(p->a, b, r, n) == 0);
	return b;
}

/* ------------------------------------------------------------------ hold */

static void mode_hold(void)
{
	nic_load_stat_t s[8], probe;
	size_t n;

	pair p = pair_new("hold", NULL, NULL);
	hold_find();

	/* Before any transfer: the call works; whatever it lists is idle. */
	n = 8;
	CHECK_EQ(getNicLoadStats(p.a, s, &n), 0);
	for (size_t i = 0; i < n && i < 8; i++)
		CHECK_EQ(s[i].inflight_bytes, 0);

	/* Two reads held in flight: 4096 + 8192 bytes on the transport's device. */
	transfer_request_t r[2] = {
		{ OPCODE_READ, p.abuf, p.seg, (uint64_t)(uintptr_t)p.bbuf, 4096 },
		{ OPCODE_READ, p.abuf + 65536, p.seg, (uint64_t)(uintptr_t)p.bbuf + 65536, 8192 },
	};
	batch_id_t b = allocateBatchID(p.a, 2);
	REQUIRE(b != INVALID_BATCH);
	REQUIRE(submitTransfer(p.a, b, r, 2) == 0);
	n = 8;
	CHECK_EQ(getNicLoadStats(p.a, s, &n), 0);
	REQUIRE(n >= 1 && n <= 8);
	const nic_load_stat_t *d = find_dev(s, n, "hold0");
	REQUIRE(d != NULL);
	CHECK_EQ(d->inflight_bytes, 4096 + 8192);

	/* Room for none: the count comes back, the array is left alone. */
	size_t want = n;
	memset(&probe, 0xab, sizeof probe);
	n = 0;
	CHECK_EQ(getNicLoadStats(p.a, &probe, &n), 0);
	CHECK_EQ(n, want);
	CHECK_EQ((unsigned char)probe.device_name[0], 0xab);
	/* Room for fewer than there are: as many as fit, the full count back. */
	if (want > 1) {
		n = 1;
		CHECK_EQ(getNicLoadStats(p.a, s, &n), 0);
		CHECK_EQ(n, want);
	}

	/* Bad arguments: -1, as Mooncake. */
	n = 8;
	CHECK_EQ(getNicLoadStats(NULL, s, &n), -1);
	CHECK_EQ(getNicLoadStats(p.a, NULL, &n), -1);
	CHECK_EQ(getNicLoadStats(p.a, s, NULL), -1);

	/* Released: nothing in flight, and the bytes moved since the reading
	 * above give the device a bandwidth. */
	CHECK_EQ(hold_release(0), 2);
	CHECK_EQ(wait_tasks(p.a, b, 2), STATUS_COMPLETED);
	sleep_ms(20);
	n = 8;
	CHECK_EQ(getNicLoadStats(p.a, s, &n), 0);
	d = find_dev(s, n, "hold0");
	REQUIRE(d != NULL);
	CHECK_EQ(d->inflight_bytes, 0);
	CHECK(d->ewma_bandwidth_bps > 0);
	CHECK(memcmp(p.abuf + 65536, p.bbuf + 65536, 8192) == 0);
	CHECK_EQ(freeBatchID(p.a, b), 0);
	pair_free(&p);
}

/* --------------------------------------------------------- slice-timeout */

/* How much later than its deadline a task may end: a few ms promised, more
 * where a sanitizer slows every thread down. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SLACK_MS 150
#else
#define SLACK_MS 50
#endif

/* The status of task 0 of a batch of one read held by the hold transport,
 * `wait_ms` after the submit. */
static int held_status(pair *p, batch_id_t *b, long wait_ms)
{
	transfer_request_t r = { OPCODE_READ, p->abuf, p->seg, (uint64_t)(uintptr_t)p->bbuf, 4096 };
	transfer_status_t st;

	*b = allocateBatchID(p->a, 1);
	REQUIRE(*b != INVALID_BATCH);
	REQUIRE(submitTransfer(p->a, *b, &r, 1) == 0);
	sleep_ms(wait_ms);
	REQUIRE(getTransferStatus(p->a, *b, 0, &st) == 0);
	return st.status;
}

static void mode_slice_timeout(void)
{
	batch_id_t b;

	REQUIRE(getenv("MC_SLICE_TIMEOUT") != NULL && strcmp(getenv("MC_SLICE_TIMEOUT"), "1") == 0);
	pair p = pair_new("hold", NULL, NULL); /* made while MC_SLICE_TIMEOUT=1 */
	hold_find();

	/* in flight, then past the second: TIMEOUT, though the task goes on */
	int st = held_status(&p, &b, 0);
	CHECK(st == STATUS_WAITING || st == STATUS_PENDING);
	transfer_status_t ts;
	sleep_ms(1300);
	REQUIRE(getTransferStatus(p.a, b, 0, &ts) == 0);
	CHECK_EQ(ts.status, STATUS_TIMEOUT);
	CHECK_EQ(hold_release(0), 1);
	CHECK_EQ(wait_tasks(p.a, b, 1), STATUS_COMPLETED);
	CHECK(memcmp(p.abuf, p.bbuf, 4096) == 0);
	CHECK_EQ(freeBatchID(p.a, b), 0);
	pair_free(&p);

	/* engines made without it: still in flight after the same wait */
	unsetenv("MC_SLICE_TIMEOUT");
	p = pair_new("hold", NULL, NULL);
	st = held_status(&p, &b, 1300);
	CHECK(st == STATUS_WAITING || st == STATUS_PENDING);
	CHECK_EQ(hold_release(0), 1);
	CHECK_EQ(wait_tasks(p.a, b, 1), STATUS_COMPLETED);
	CHECK_EQ(freeBatchID(p.a, b), 0);
	pair_free(&p);
}

/* On a transport that honours deadlines, MC_SLICE_TIMEOUT ends the task. */
static void mode_slice_deadline(void)
{
	REQUIRE(getenv("MC_SLICE_TIMEOUT") != NULL && strcmp(getenv("MC_SLICE_TIMEOUT"), "1") == 0);
	/* A transport that honours deadlines: libte ends the held read at
	 * MC_SLICE_TIMEOUT. It reads FAILED (TIMEOUT may show for the moment
	 * before), its batch is freed while the transfer is still held, and no
	 * byte moves when the transfer is let go. */
	pair p = pair_new("holddl", NULL, NULL); /* made while MC_SLICE_TIMEOUT=1 */
	hold_find_named("holddl");
	memset(p.abuf, 0xee, 4096);
	transfer_request_t r = { OPCODE_READ, p.abuf, p.seg, (uint64_t)(uintptr_t)p.bbuf, 4096 };
	batch_id_t b = allocateBatchID(p.a, 1);
	REQUIRE(b != INVALID_BATCH);
	long long t0 = now_ms();
	REQUIRE(submitTransfer(p.a, b, &r, 1) == 0);
	transfer_status_t ts;
	do {
		REQUIRE(getTransferStatus(p.a, b, 0, &ts) == 0);
		if (ts.status == STATUS_TIMEOUT)
			CHECK(now_ms() - t0 >= 1000);
		else if (ts.status != STATUS_FAILED)
			CHECK(ts.status == STATUS_WAITING || ts.status == STATUS_PENDING);
		if (ts.status != STATUS_FAILED)
			sleep_ms(1);
	} while (ts.status != STATUS_FAILED && now_ms() - t0 < 5000);
	long long took = now_ms() - t0;
	CHECK_EQ(ts.status, STATUS_FAILED);
	if (took < 990 || took > 1000 + SLACK_MS)
		fprintf(stderr, "the read ended after %lld ms, want 1000\n", took);
	CHECK(took >= 990 && took <= 1000 + SLACK_MS);
	CHECK_EQ(hold_count(), 1);
	CHECK_EQ(freeBatchID(p.a, b), 0);
	CHECK_EQ(hold_release(0), 1);
	for (size_t i = 0; i < 4096; i++)
		if (p.abuf[i] != 0xee) {
			CHECK(p.abuf[i] == 0xee);
			break;
		}
	pair_free(&p);
}

/* ------------------------------------------------------------------- tcp */

/* TCP reports its rails (one here, on the loopback address). */
static void mode_tcp(void)
{
	nic_load_stat_t s[8];
	size_t n = 8;
	pair p = pair_new("tcp", NULL, NULL);

	/* A first transfer opens the connections; the reading after it is the
	 * baseline the next one's bandwidth is measured from. */
	batch_id_t b = submit_n(&p, OPCODE_WRITE, 1, 4096);
	CHECK_EQ(wait_tasks(p.a, b, 1), STATUS_COMPLETED);
	CHECK_EQ(freeBatchID(p.a, b), 0);
	CHECK_EQ(getNicLoadStats(p.a, s, &n), 0);
	REQUIRE(n >= 1 && n <= 8);
	uint64_t before = 0;
	for (size_t i = 0; i < n; i++)
		before += s[i].inflight_bytes;
	CHECK_EQ(before, 0);

	b = submit_n(&p, OPCODE_READ, 4, 256 << 10);
	CHECK_EQ(wait_tasks(p.a, b, 4), STATUS_COMPLETED);
	CHECK_EQ(freeBatchID(p.a, b), 0);
	CHECK(memcmp(p.abuf, p.bbuf, 4 * (256 << 10)) == 0);
	sleep_ms(10);
	n = 8;
	CHECK_EQ(getNicLoadStats(p.a, s, &n), 0);
	REQUIRE(n >= 1 && n <= 8);
	double bw = 0;
	for (size_t i = 0; i < n; i++) {
		CHECK(s[i].device_name[0] != '\0');
		CHECK_EQ(s[i].inflight_bytes, 0);
		bw += s[i].ewma_bandwidth_bps;
	}
	CHECK(bw > 0);
	pair_free(&p);
}

/* ------------------------------------------------------------------- off */

static void mode_off(void)
{
	nic_load_stat_t s[4];
	size_t n = 4;
	pair p = pair_new("tcp", NULL, NULL);

	CHECK_EQ(getNicLoadStats(p.a, s, &n), MC_STATUS_CODE_NOT_IMPLEMENTED);
	pair_free(&p);
}

/* ------------------------------------------------------------------- log */

/* An engine created with MC_TE_METRIC=`on` and the interval `interval`
 * (NULL: unset), and destroyed again; returns how long the destroy took. */
static long long create_destroy(const char *on, const char *interval)
{
	if (on != NULL)
		setenv("MC_TE_METRIC", on, 1);
	else
		unsetenv("MC_TE_METRIC");
	if (interval != NULL)
		setenv("MC_TE_METRIC_INTERVAL_SECONDS", interval, 1);
	else
		unsetenv("MC_TE_METRIC_INTERVAL_SECONDS");
	transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 0);
	REQUIRE(e != NULL);
	long long t0 = now_ms();
	destroyTransferEngine(e);
	return now_ms() - t0;
}

static void mode_log(void)
{
	static const char prefix[] = "[Metrics] Transfer Engine Stats (over last 1s): Throughput: ";
	char line[512];
	size_t mark;

	te_set_log_level(TE_LOG_INFO);

	/* Interval values as Mooncake reads them (std::stoi). */
	mark = log_mark();
	create_destroy("1", "abc");
	CHECK(log_find(mark, "Failed to parse MC_TE_METRIC_INTERVAL_SECONDS: abc, using default: 5",
		       NULL, 0));
	mark = log_mark();
	create_destroy("1", "99999999999");
	CHECK(log_find(mark, "Failed to parse MC_TE_METRIC_INTERVAL_SECONDS: 99999999999", NULL, 0));
	mark = log_mark();
	create_destroy("1", "0");
	CHECK(log_find(mark, "Invalid MC_TE_METRIC_INTERVAL_SECONDS value: 0, must be positive. "
			     "Using default: 5", NULL, 0));
	mark = log_mark();
	create_destroy("1", "-3");
	CHECK(log_find(mark, "Invalid MC_TE_METRIC_INTERVAL_SECONDS value: -3", NULL, 0));
	mark = log_mark();
	create_destroy("1", " 7s");
	CHECK(log_find(mark, "Metrics reporting interval set to 7 seconds", NULL, 0));
	/* Off: the interval is not even read. */
	mark = log_mark();
	create_destroy("0", "abc");
	create_destroy("maybe", "abc");
	create_destroy(NULL, "abc");
	CHECK(!log_find(mark, "MC_TE_METRIC_INTERVAL_SECONDS", NULL, 0));
	/* Destroy does not wait for the interval (5 s by default) to run out. */
	CHECK(create_destroy("yes", NULL) < 2500);

	/* Enabled ("TRUE", any case) with a 1 s interval: while data moves, one
	 * line a second with the throughput, total and per operation. */
	setenv("MC_TE_METRIC", "TRUE", 1);
	setenv("MC_TE_METRIC_INTERVAL_SECONDS", "1", 1);
	pair p = pair_new("tcp", NULL, NULL);
	mark = log_mark();
	long long end = now_ms() + 2600;
	size_t rounds = 0;
	while (now_ms() < end) {
		batch_id_t b = submit_n(&p, OPCODE_WRITE, 4, 256 << 10);
		CHECK_EQ(wait_tasks(p.a, b, 4), STATUS_COMPLETED);
		CHECK_EQ(freeBatchID(p.a, b), 0);
		rounds++;
		sleep_ms(5);
	}
	size_t reported = log_count(mark, prefix);
	CHECK(reported >= 1 && reported <= 3);
	REQUIRE(log_find(mark, prefix, line, sizeof line));
	fprintf(stderr, "%zu rounds; %s\n", rounds, line);
	double mbs = -1, rd = -1, wr = -1;
	unsigned long long done = 0, failed = 1;
	const char *at = line + strlen(prefix);
	CHECK_EQ(sscanf(at, "%lf MB/s | read: %lf B/s, write: %lf B/s | tasks: %llu completed, %llu failed",
			&mbs, &rd, &wr, &done, &failed),
		 5);
	CHECK(mbs > 0 && wr > 0);
	CHECK(rd == 0);
	CHECK(done > 0 && failed == 0);
	/* 1 MiB a round: the line's rate is at most what moved in its second. */
	CHECK(wr <= (double)rounds * (1 << 20) * 1.5);
	/* Once the last busy second is reported, idle seconds log nothing, and
	 * the target engine, which started no transfer, never logs. */
	sleep_ms(1100);
	mark = log_mark();
	sleep_ms(1300);
	CHECK_EQ(log_count(mark, "[Metrics]"), 0);
	pair_free(&p);
	unsetenv("MC_TE_METRIC");
	unsetenv("MC_TE_METRIC_INTERVAL_SECONDS");
}

/* ------------------------------------------------------------------ rdma */

/*
 * Two NICs per engine. On the software verbs layer (the fixture's mlx5_0..3)
 * slow work requests keep a batch in flight while the load is read; on a
 * real provider (TE_RDMA_TEST_DEVICES=d0,d1,d2,d3, the qemu guest's rxe0..3)
 * batches are read right after their submit until one is caught in flight.
 */
static void mode_rdma(void)
{
	const char *real = getenv("TE_RDMA_TEST_DEVICES");
	char dev[4][32] = { "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3" };
	char args_a[160], args_b[160];
	int (*set_latency)(const char *, unsigned) = NULL;
	nic_load_stat_t s[8];
	uint64_t max_during = 0;
	size_t n;

	if (real != NULL) {
		char list[256], *save = NULL;
		snprintf(list, sizeof list, "%s", real);
		int k = 0;
		for (char *t = strtok_r(list, ",", &save); t != NULL && k < 4; t = strtok_r(NULL, ",", &save))
			snprintf(dev[k++], sizeof dev[0], "%s", t);
		REQUIRE(k == 4);
	}
	snprintf(args_a, sizeof args_a, "{\"devices\": [\"%s\", \"%s\"]}", dev[0], dev[1]);
	snprintf(args_b, sizeof args_b, "{\"devices\": [\"%s\", \"%s\"]}", dev[2], dev[3]);
	pair p = pair_new("rdma", args_a, args_b);
	if (real == NULL) {
		const char *path = getenv("TE_RDMA_PLUGIN");
		REQUIRE(path != NULL);
		void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD); /* libte's copy */
		REQUIRE(h != NULL);
		*(void **)&set_latency = dlsym(h, "te_rdma_soft_set_latency");
		REQUIRE(set_latency != NULL);
		REQUIRE(set_latency(NULL, 20000) == 0);
	}

	/* A batch whose posts are seen in flight: the counters are read again
	 * and again while it runs (a look may come before its posts reach the
	 * NICs or, on a fast device, after they ended), and on a busy machine
	 * another batch goes, up to 20 (50 on real NICs, with no latency set). */
	for (int round = 0; round < (real != NULL ? 50 : 20) && max_during == 0; round++) {
		batch_id_t b = submit_n(&p, OPCODE_READ, 8, 64 << 10);
		if (real == NULL)
			sleep_ms(5);
		for (int look = 0; look < 500 && max_during == 0; look++) {
			n = 8;
			CHECK_EQ(getNicLoadStats(p.a, s, &n), 0);
			const nic_load_stat_t *d0 = find_dev(s, n, dev[0]), *d1 = find_dev(s, n, dev[1]);
			if (d0 == NULL || d1 == NULL) {
				for (size_t i = 0; i < n && i < 8; i++)
					fprintf(stderr, "device %s\n", s[i].device_name);
			}
			REQUIRE(d0 != NULL && d1 != NULL);
			CHECK(find_dev(s, n, dev[2]) == NULL); /* b's NICs are b's */
			uint64_t during = d0->inflight_bytes + d1->inflight_bytes;
			CHECK(during <= 8 * (64 << 10));
			if (during > max_during)
				max_during = during;
		}
		CHECK_EQ(wait_tasks(p.a, b, 8), STATUS_COMPLETED);
		CHECK_EQ(freeBatchID(p.a, b), 0);
	}
	CHECK(max_during > 0);
	if (set_latency != NULL)
		REQUIRE(set_latency(NULL, 0) == 0);
	CHECK(memcmp(p.abuf, p.bbuf, 8 * (64 << 10)) == 0);
	n = 8;
	CHECK_EQ(getNicLoadStats(p.a, s, &n), 0);
	const nic_load_stat_t *d0 = find_dev(s, n, dev[0]), *d1 = find_dev(s, n, dev[1]);
	REQUIRE(d0 != NULL && d1 != NULL);
	CHECK_EQ(d0->inflight_bytes + d1->inflight_bytes, 0);
	CHECK(d0->ewma_bandwidth_bps > 0 || d1->ewma_bandwidth_bps > 0);
	pair_free(&p);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "hold";

	static const struct {
		const char *name;
		void (*run)(void);
	} modes[] = {
		{ "hold", mode_hold }, { "log", mode_log }, { "off", mode_off }, { "tcp", mode_tcp },
		{ "rdma", mode_rdma }, { "slice-timeout", mode_slice_timeout },
		{ "slice-deadline", mode_slice_deadline },
	};
	size_t m = 0;
	while (m < sizeof modes / sizeof modes[0] && strcmp(mode, modes[m].name) != 0)
		m++;
	if (m == sizeof modes / sizeof modes[0]) {
		fprintf(stderr, "usage: %s hold|log|off|tcp|rdma|slice-timeout|slice-deadline\n", argv[0]);
		return 2;
	}
	te_set_log_handler(on_log, NULL);
	modes[m].run();
	te_set_log_handler(NULL, NULL);
	for (size_t i = 0; i < n_lines; i++)
		free(lines[i]);
	fprintf(stderr, "%s: %d of %d checks failed\n", mode, (int)check_failures, (int)check_count);
	return check_failures == 0 ? 0 : 1;
}
