/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The initiator of test-tcp-rails.sh, run inside a network namespace with two
 * links (rails) to a target whose descriptor publishes an address on each:
 *
 *   tcp-rails SEGMENT DEV1 DEV2
 *
 * SEGMENT's first 32 MiB hold fill_pattern(seed 3) (tcp-peer target ... 3)
 * and are only read; the next 32 MiB are written and read back. Each phase
 * prints one "OK ..." line with what it measured, or a reason and exit 1:
 *
 *   OK both MIB1 MIB2 MS     both rails carried bytes (MiB on each link; the
 *                            round took MS)
 *   OK failover MS T         DEV1 went down mid-batch (T tasks in flight);
 *                            every task completed, every byte right, MS
 *                            after the link went down
 *   OK return MS             DEV1 up again: MS until it carried bytes again
 *   OK alldown MS F N        both down mid-batch: every task ended (F of N
 *                            FAILED, none COMPLETED wrongly) MS after
 *   OK alldown-new MS N      a batch submitted with both down: all N FAILED
 *   OK bothback MS           both up: MS until both carried bytes again
 *
 * The per-link byte counts come from /sys/class/net/DEV/statistics, which the
 * namespace's own sysfs shows (ip netns exec mounts it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tcp-test.h"

#define MIB (1u << 20)
#define RD_AREA (32u * MIB) /* pattern, read only */
#define WR_AREA (32u * MIB) /* written, then read back */
#define SEED 3

static te_engine *e;
static te_segment_id seg;
static uint64_t rbase;
static unsigned char *local, *ref, *src;
static const char *dev[2];

/* Bytes sent and received on a link so far. */
static unsigned long long link_bytes(const char *d)
{
	unsigned long long sum = 0;
	const char *which[] = { "rx_bytes", "tx_bytes" };
	for (int i = 0; i < 2; i++) {
		char path[256];
		unsigned long long v = 0;
		snprintf(path, sizeof path, "/sys/class/net/%s/statistics/%s", d, which[i]);
		FILE *f = fopen(path, "r");
		if (f == NULL || fscanf(f, "%llu", &v) != 1) {
			fprintf(stderr, "tcp-rails: cannot read %s\n", path);
			exit(1);
		}
		fclose(f);
		sum += v;
	}
	return sum;
}

static void link_set(const char *d, const char *state)
{
	char cmd[128];
	snprintf(cmd, sizeof cmd, "ip link set dev %s %s", d, state);
	if (system(cmd) != 0) {
		fprintf(stderr, "tcp-rails: '%s' failed\n", cmd);
		exit(1);
	}
}

/* One batch: `nr` 1 MiB READs of the pattern into distinct local MiBs, `nw`
 * 1 MiB WRITEs of `src` (seeded with `wseed`) into distinct MiBs of the
 * write area. Submitted; the caller waits. */
static te_batch_id submit_mixed(int nr, int nw, unsigned wseed)
{
	static te_request r[96];
	te_batch_id b;
	int n = 0;

	REQUIRE(nr <= 64 && nw <= 32);
	fill_pattern(src, (size_t)nw * MIB, wseed);
	memset(local, 0, (size_t)nr * MIB);
	for (int i = 0; i < nr; i++)
		r[n++] = (te_request){ TE_OP_READ, seg, local + (size_t)i * MIB,
				       rbase + (uint64_t)((i * 7) % 32) * MIB, MIB };
	for (int i = 0; i < nw; i++)
		r[n++] = (te_request){ TE_OP_WRITE, seg, src + (size_t)i * MIB, rbase + RD_AREA + (uint64_t)i * MIB,
				       MIB };
	REQUIRE(te_batch_alloc(e, (size_t)n, &b) == 0);
	REQUIRE(te_submit(e, b, r, (size_t)n) == 0);
	return b;
}

/* Every READ of a finished batch brought the right bytes. */
static bool reads_right(int nr)
{
	for (int i = 0; i < nr; i++)
		if (memcmp(local + (size_t)i * MIB, ref + (size_t)((i * 7) % 32) * MIB, MIB) != 0) {
			fprintf(stderr, "tcp-rails: READ %d brought wrong bytes\n", i);
			return false;
		}
	return true;
}

/* The write area holds what the last `nw` WRITEs sent (read back in one
 * request, over whichever rail). */
static bool writes_right(int nw)
{
	unsigned char *back = local + 64u * MIB;
	te_task_status st = { 0 };
	memset(back, 0, (size_t)nw * MIB);
	if (run_one(e, TE_OP_READ, seg, back, rbase + RD_AREA, (uint64_t)nw * MIB, &st) != TE_TASK_COMPLETED) {
		fprintf(stderr, "tcp-rails: reading the writes back: state %d error %s\n", st.state,
			te_strerror(st.error));
		return false;
	}
	if (memcmp(back, src, (size_t)nw * MIB) != 0) {
		fprintf(stderr, "tcp-rails: the written bytes came back different\n");
		return false;
	}
	return true;
}

/* Waits for a batch; counts its tasks by state. */
static void settle(te_batch_id b, int n, int wait_ms, int *completed, int *failed, int *other)
{
	te_batch_wait(e, b, wait_ms);
	*completed = *failed = *other = 0;
	for (int i = 0; i < n; i++) {
		te_task_status st = { 0 };
		te_get_status(e, b, (size_t)i, &st);
		if (st.state == TE_TASK_COMPLETED)
			(*completed)++;
		else if (st.state == TE_TASK_FAILED)
			(*failed)++;
		else
			(*other)++;
	}
}

/* A verified round; the MiB each link carried meanwhile. */
static bool round_on_links(double mib[2])
{
	unsigned long long b0[2] = { link_bytes(dev[0]), link_bytes(dev[1]) };
	int c, f, o;
	te_batch_id b = submit_mixed(64, 32, 11);
	settle(b, 96, 20000, &c, &f, &o);
	te_batch_free(e, b);
	for (int i = 0; i < 2; i++)
		mib[i] = (double)(link_bytes(dev[i]) - b0[i]) / MIB;
	if (c != 96) {
		fprintf(stderr, "tcp-rails: round: %d completed, %d failed, %d other\n", c, f, o);
		return false;
	}
	return reads_right(64) && writes_right(32);
}

/* Verified rounds until every link in `which` carried at least 4 MiB of
 * one round; ms taken, or -1 after 15 s. */
static long long until_used(bool which[2])
{
	long long t0 = now_ms();
	while (now_ms() - t0 < 15000) {
		double mib[2];
		bool ok = round_on_links(mib);
		if (ok && (!which[0] || mib[0] >= 4) && (!which[1] || mib[1] >= 4))
			return now_ms() - t0;
		usleep(50000);
	}
	return -1;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: tcp-rails SEGMENT DEV1 DEV2\n");
		return 2;
	}
	dev[0] = argv[2];
	dev[1] = argv[3];
	te_option opt[3] = { { "transports", "tcp" }, { "TE_TCP_TIMEOUT_MS", "1000" },
			     { "TE_TCP_CONNECT_TIMEOUT_MS", "1000" } };
	const char *me = getenv("TCP_PEER_NAME");
	REQUIRE(te_engine_create("P2PHANDSHAKE", me ? me : "127.0.0.1", opt, 3, &e) == 0);
	/* 64 MiB for reads, 32 for write sources, 32 to read writes back. */
	local = map_buf(96u * MIB);
	src = map_buf(WR_AREA);
	ref = map_buf(RD_AREA);
	REQUIRE(te_register_memory(e, local, 96u * MIB, "cpu:0", 0) == 0);
	REQUIRE(te_register_memory(e, src, WR_AREA, "cpu:0", 0) == 0);
	seg = te_segment_open(e, argv[1]);
	if (seg < 0) {
		fprintf(stderr, "tcp-rails: cannot open %s: %s\n", argv[1], te_strerror(seg));
		return 1;
	}
	te_segment_buffer sb;
	REQUIRE(te_segment_buffers(e, seg, &sb, 1) >= 1);
	REQUIRE(sb.length >= RD_AREA + WR_AREA);
	rbase = sb.addr;
	/* The target filled its whole buffer from one seed: the first 32 MiB of
	 * that pattern is what reads must bring. */
	unsigned char *whole = map_buf(sb.length);
	fill_pattern(whole, sb.length, SEED);
	memcpy(ref, whole, RD_AREA);
	munmap(whole, sb.length);

	/* (a) both rails up: both carry. */
	double mib[2];
	long long ta = now_ms();
	if (!round_on_links(mib))
		return 1;
	ta = now_ms() - ta;
	if (mib[0] < 8 || mib[1] < 8) {
		fprintf(stderr, "tcp-rails: 96 MiB moved, %.1f MiB over %s and %.1f over %s: not spread\n", mib[0],
			dev[0], mib[1], dev[1]);
		return 1;
	}
	printf("OK both %.1f %.1f %lld\n", mib[0], mib[1], ta);
	fflush(stdout);

	/* (b) rail 1 down mid-batch: every task completes, every byte right. */
	te_batch_id b = submit_mixed(64, 32, 21);
	link_set(dev[0], "down");
	long long t0 = now_ms();
	size_t in_flight = 0;
	te_batch_status(e, b, NULL, &in_flight, NULL);
	int c, f, o;
	settle(b, 96, 20000, &c, &f, &o);
	long long dt = now_ms() - t0;
	te_batch_free(e, b);
	if (in_flight == 0) {
		fprintf(stderr, "tcp-rails: the batch was over before the link went down: nothing tested\n");
		return 1;
	}
	if (c != 96) {
		fprintf(stderr, "tcp-rails: after %s went down: %d completed, %d failed, %d other\n", dev[0], c, f, o);
		return 1;
	}
	if (!reads_right(64) || !writes_right(32))
		return 1;
	printf("OK failover %lld %zu\n", dt, in_flight);
	fflush(stdout);
	/* Still going on the other rail alone. */
	if (!round_on_links(mib) || mib[1] < 64) {
		fprintf(stderr, "tcp-rails: with %s down: %.1f MiB over %s\n", dev[0], mib[1], dev[1]);
		return 1;
	}

	/* (b') rail 1 back: used again once its probe answers. */
	link_set(dev[0], "up");
	long long back = until_used((bool[2]){ true, false });
	if (back < 0) {
		fprintf(stderr, "tcp-rails: %s up again but unused after 15 s\n", dev[0]);
		return 1;
	}
	printf("OK return %lld\n", back);
	fflush(stdout);

	/* (c) both down mid-batch: every task ends, none stuck. */
	b = submit_mixed(64, 32, 31);
	link_set(dev[0], "down");
	link_set(dev[1], "down");
	t0 = now_ms();
	settle(b, 96, 20000, &c, &f, &o);
	dt = now_ms() - t0;
	/* A READ that ended COMPLETED (before the links went) must be right. */
	for (int i = 0; i < 64; i++) {
		te_task_status st = { 0 };
		te_get_status(e, b, (size_t)i, &st);
		if (st.state == TE_TASK_COMPLETED &&
		    memcmp(local + (size_t)i * MIB, ref + (size_t)((i * 7) % 32) * MIB, MIB) != 0) {
			fprintf(stderr, "tcp-rails: READ %d COMPLETED with wrong bytes\n", i);
			return 1;
		}
	}
	te_batch_free(e, b);
	if (o != 0 || f == 0) {
		fprintf(stderr, "tcp-rails: both down: %d completed, %d failed, %d not ended after %lld ms\n", c, f, o,
			dt);
		return 1;
	}
	printf("OK alldown %lld %d 96\n", dt, f);
	fflush(stdout);
	/* And a batch submitted while both are down fails whole. */
	b = submit_mixed(16, 0, 41);
	t0 = now_ms();
	settle(b, 16, 20000, &c, &f, &o);
	dt = now_ms() - t0;
	te_batch_free(e, b);
	if (f != 16) {
		fprintf(stderr, "tcp-rails: new batch with both down: %d completed, %d failed, %d other\n", c, f, o);
		return 1;
	}
	printf("OK alldown-new %lld 16\n", dt);
	fflush(stdout);

	/* (d) both back: both used again. */
	link_set(dev[0], "up");
	link_set(dev[1], "up");
	back = until_used((bool[2]){ true, true });
	if (back < 0) {
		fprintf(stderr, "tcp-rails: both links up again, not both used after 15 s\n");
		return 1;
	}
	printf("OK bothback %lld\n", back);
	fflush(stdout);
	te_segment_close(e, seg);
	te_engine_destroy(e);
	return 0;
}
