/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A libte engine in a process of its own, for the TCP tests that need one to
 * die, stop, live in another network namespace, or be one of many.
 *
 *   tcp-peer target NAME BYTES SEED   an engine named NAME (P2PHANDSHAKE) with
 *                                     BYTES of remote-accessible memory filled
 *                                     with fill_pattern(SEED); prints
 *                                     "READY <segment name> <address>"
 *   tcp-peer multi N BYTES            N such engines, one "READY" line each,
 *                                     then "ALL"
 *   tcp-peer initiator SEGMENT [DEV]  verified writes and reads of many sizes
 *                                     to SEGMENT ("OK transfers"); with DEV,
 *                                     takes that link down mid-batch ("OK
 *                                     linkdown <ms>"), up again, and checks
 *                                     transfers work again ("OK relink")
 *
 * Targets run until their stdin closes. TE_* variables configure them;
 * TCP_PEER_TRANSPORTS replaces the transports of its engines ("tcp").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tcp-test.h"

static int wait_stdin(void)
{
	char line[64];
	while (fgets(line, sizeof line, stdin) != NULL)
		if (strncmp(line, "EXIT", 4) == 0)
			break;
	return 0;
}

static te_engine *make(const char *name)
{
	te_engine *e = NULL;
	const char *tp = getenv("TCP_PEER_TRANSPORTS");
	te_option opt = { "transports", tp ? tp : "tcp" };
	int rc = te_engine_create("P2PHANDSHAKE", name, &opt, 1, &e);
	if (rc < 0) {
		fprintf(stderr, "tcp-peer: engine %s: %s\n", name, te_strerror(rc));
		exit(1);
	}
	return e;
}

static int target(const char *name, size_t bytes, unsigned seed)
{
	te_engine *e = make(name);
	unsigned char *buf = map_buf(bytes);
	fill_pattern(buf, bytes, seed);
	REQUIRE(te_register_memory(e, buf, bytes, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
	printf("READY %s %llu\n", te_engine_name(e), (unsigned long long)(uintptr_t)buf);
	fflush(stdout);
	wait_stdin();
	te_engine_destroy(e);
	return 0;
}

static int multi(int n, size_t bytes)
{
	te_engine **es = calloc((size_t)n, sizeof *es);
	REQUIRE(es != NULL);
	for (int i = 0; i < n; i++) {
		es[i] = make("127.0.0.1");
		unsigned char *buf = map_buf(bytes);
		fill_pattern(buf, bytes, (unsigned)i);
		REQUIRE(te_register_memory(es[i], buf, bytes, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
		printf("READY %s %llu\n", te_engine_name(es[i]), (unsigned long long)(uintptr_t)buf);
		fflush(stdout); /* the reader times each line, not the whole set */
	}
	printf("ALL\n");
	fflush(stdout);
	wait_stdin();
	for (int i = 0; i < n; i++)
		te_engine_destroy(es[i]);
	free(es);
	return 0;
}

#define LOCAL (96u << 20)

/* Writes a pattern to the segment and reads it back, for several sizes. */
static bool verified_round(te_engine *e, te_segment_id seg, unsigned char *buf, uint64_t rbase,
			   uint64_t rlen, unsigned seed)
{
	static const size_t sizes[] = { 1, 100, 4096, 65537, (1u << 20) + 3, 8u << 20 };
	for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
		size_t n = sizes[i], lo = 3 + i, ro = 11 * i + 5;
		if (ro + n > rlen)
			continue;
		fill_pattern(buf + lo, n, seed + (unsigned)i);
		te_task_status st = { 0 };
		if (run_one(e, TE_OP_WRITE, seg, buf + lo, rbase + ro, n, &st) != TE_TASK_COMPLETED) {
			fprintf(stderr, "tcp-peer: WRITE %zu: state %d error %s\n", n, st.state, te_strerror(st.error));
			return false;
		}
		unsigned char *back = buf + (48u << 20);
		memset(back, 0, n);
		if (run_one(e, TE_OP_READ, seg, back, rbase + ro, n, &st) != TE_TASK_COMPLETED) {
			fprintf(stderr, "tcp-peer: READ %zu: state %d error %s\n", n, st.state, te_strerror(st.error));
			return false;
		}
		if (memcmp(back, buf + lo, n) != 0) {
			fprintf(stderr, "tcp-peer: %zu bytes came back different\n", n);
			return false;
		}
	}
	return true;
}

static int initiator(const char *segment, const char *dev)
{
	te_engine *e = NULL;
	te_option opt[2] = { { "transports", "tcp" }, { "TE_TCP_TIMEOUT_MS", "1000" } };
	/* The local name must be an address the target can reach us at. */
	REQUIRE(te_engine_create("P2PHANDSHAKE", getenv("TCP_PEER_NAME") ? getenv("TCP_PEER_NAME") : "127.0.0.1",
				 opt, 2, &e) == 0);
	unsigned char *buf = map_buf(LOCAL);
	REQUIRE(te_register_memory(e, buf, LOCAL, "cpu:0", 0) == 0);
	te_segment_id seg = te_segment_open(e, segment);
	if (seg < 0) {
		fprintf(stderr, "tcp-peer: cannot open %s: %s\n", segment, te_strerror(seg));
		return 1;
	}
	te_segment_buffer sb;
	REQUIRE(te_segment_buffers(e, seg, &sb, 1) >= 1);
	if (!verified_round(e, seg, buf, sb.addr, sb.length, 1))
		return 1;
	printf("OK transfers\n");
	fflush(stdout);
	if (dev == NULL)
		goto out;

	/* Mid-batch link failure: the tasks must fail within the bound. */
	/* Large enough to be still moving when the link goes down. */
	enum { N = 512, SZ = 1u << 20 };
	static te_request r[N];
	te_batch_id b;
	for (int i = 0; i < N; i++)
		r[i] = (te_request){ TE_OP_READ, seg, buf + (size_t)(i % 32) * SZ, sb.addr + (uint64_t)(i % 8) * SZ, SZ };
	REQUIRE(te_batch_alloc(e, N, &b) == 0);
	REQUIRE(te_submit(e, b, r, N) == 0);
	char cmd[256];
	snprintf(cmd, sizeof cmd, "ip link set dev %s down", dev);
	REQUIRE(system(cmd) == 0);
	long long t0 = now_ms();
	int rc = te_batch_wait(e, b, 20000);
	long long dt = now_ms() - t0;
	int32_t state = 0;
	te_batch_status(e, b, NULL, NULL, &state);
	int failed = 0;
	for (int i = 0; i < N; i++) {
		te_task_status st;
		te_get_status(e, b, (size_t)i, &st);
		failed += st.state == TE_TASK_FAILED;
	}
	te_batch_free(e, b);
	snprintf(cmd, sizeof cmd, "ip link set dev %s up", dev);
	REQUIRE(system(cmd) == 0);
	if (rc != 0 || state != TE_TASK_FAILED || failed == 0) {
		fprintf(stderr, "tcp-peer: after link down: wait %d, state %d, %d failed\n", rc, state, failed);
		return 1;
	}
	printf("OK linkdown %lld %d\n", dt, failed);
	fflush(stdout);
	/* The link is back: the next transfers reconnect (give routes a moment). */
	long long end = now_ms() + 10000;
	bool ok = false;
	while (!ok && now_ms() < end) {
		ok = verified_round(e, seg, buf, sb.addr, sb.length, 7);
		if (!ok)
			usleep(200000);
	}
	if (!ok)
		return 1;
	printf("OK relink\n");
	fflush(stdout);
out:
	te_segment_close(e, seg);
	te_engine_destroy(e);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 5 && strcmp(argv[1], "target") == 0)
		return target(argv[2], strtoull(argv[3], NULL, 0), (unsigned)atoi(argv[4]));
	if (argc >= 4 && strcmp(argv[1], "multi") == 0)
		return multi(atoi(argv[2]), strtoull(argv[3], NULL, 0));
	if (argc >= 3 && strcmp(argv[1], "initiator") == 0)
		return initiator(argv[2], argc > 3 ? argv[3] : NULL);
	fprintf(stderr, "usage: tcp-peer target NAME BYTES SEED | multi N BYTES | initiator SEGMENT [DEV]\n");
	return 2;
}
