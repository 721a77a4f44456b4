/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Memory with many peers: one engine connected to 64 target engines (in a
 * helper process) must stay under 64 MiB of resident memory beyond the
 * memory it registered (under ThreadSanitizer, that memory is counted with
 * its shadow and the limit scaled alike). Prints the figures ("MEM ...")
 * for the docs.
 *
 * argv[1]: the tcp-peer helper.
 */
#include <dirent.h>

#include "tcp-test.h"

#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif

#define PEERS 64
/* Read from each peer at once: more than a full window (TE_TCP_WINDOW) for
 * each of its two connections, so that both carry requests. */
#define TBYTES (4u << 20)
/* Every peer's bytes land in a slice of their own: no two transfers in
 * flight write the same local bytes. */
#define LOCAL ((size_t)PEERS * TBYTES)

static long rss_kib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long v = -1;
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "VmRSS: %ld kB", &v) == 1)
			break;
	if (f)
		fclose(f);
	return v;
}

static int sockets_open(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;
	char path[300], target[64];
	while (d && (e = readdir(d)) != NULL) {
		snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
		ssize_t l = readlink(path, target, sizeof target - 1);
		if (l > 0) {
			target[l] = '\0';
			n += strncmp(target, "socket:", 7) == 0;
		}
	}
	if (d)
		closedir(d);
	return n;
}

int main(int argc, char **argv)
{
	REQUIRE(argc > 1);
	signal(SIGPIPE, SIG_IGN);
	char n[16], bytes[32];
	snprintf(n, sizeof n, "%d", PEERS);
	snprintf(bytes, sizeof bytes, "%u", TBYTES);
	char *av[] = { argv[1], "multi", n, bytes, NULL };
	char *env[] = { "TE_TCP_THREADS=1", NULL };
	child c;
	REQUIRE(child_start(&c, av, env));
	static char names[PEERS][128];
	static uint64_t addrs[PEERS];
	for (int i = 0; i < PEERS; i++) {
		const char *rest = child_expect(&c, "READY ", 30000);
		REQUIRE(rest != NULL);
		unsigned long long a;
		REQUIRE(sscanf(rest, "%127s %llu", names[i], &a) == 2);
		addrs[i] = a;
	}
	REQUIRE(child_expect(&c, "ALL", 5000) != NULL);

	long before = rss_kib();
	int socks_before = sockets_open();
	/* Two connections per peer whatever the core count (two is the default
	 * on the two-core machines the figures come from). */
	te_option two = { "TE_TCP_CONNS_PER_PEER", "2" };
	te_engine *e = tcp_engine(&two, 1);
	REQUIRE(e != NULL);
	unsigned char *want = malloc(65536 + 100);
	REQUIRE(want != NULL);
	long before_buf = rss_kib();
	unsigned char *buf = map_buf(LOCAL);
	memset(buf, 0, LOCAL); /* resident: counted as registered below */
	long buf_kib = rss_kib() - before_buf;
	REQUIRE(te_register_memory(e, buf, LOCAL, "cpu:0", 0) == 0);
	te_segment_id seg[PEERS];
	int ok = 0;
	for (int i = 0; i < PEERS; i++) {
		seg[i] = te_segment_open(e, names[i]);
		REQUIRE(seg[i] > 0);
		te_task_status st;
		unsigned char *mine = buf + (size_t)i * TBYTES;
		if (run_one(e, TE_OP_READ, seg[i], mine, addrs[i] + 100, 65536, &st) == TE_TASK_COMPLETED) {
			fill_pattern(want, 65536 + 100, (unsigned)i); /* the peer's first bytes */
			ok += memcmp(mine, want + 100, 65536) == 0;
		}
	}
	CHECK_EQ(ok, PEERS);
	/* Then all peers at once, each into its own slice, so that every
	 * connection of every peer is up and busy. A connection connects when it
	 * finds work queued for its peer: should the peer's other connection
	 * have taken all of it first (a slow run, now and then), another round
	 * gives it some. */
	te_request r[PEERS];
	for (int i = 0; i < PEERS; i++)
		r[i] = (te_request){ TE_OP_READ, seg[i], buf + (size_t)i * TBYTES, addrs[i], TBYTES };
	int rounds = 0, socks;
	do {
		batch_complete(e, r, PEERS, 30000);
		usleep(300000); /* the last connections finish connecting */
		socks = sockets_open() - socks_before;
	} while (++rounds < 4 && socks < 2 * PEERS);

	long after = rss_kib();
	long registered = (long)(LOCAL / 1024), limit = 64 * 1024;
#ifdef UNDER_TSAN
	/* Under TSan every byte the program touches has shadow bytes resident
	 * beside it. What the registered buffer really costs was measured above
	 * (its bytes and their shadow, five times its size with GCC 12's
	 * runtime); the engine's own memory is inflated alike, so the limit
	 * grows by the same factor and still stands for 64 MiB of its own. */
	CHECK(buf_kib >= registered);
	double factor = (double)buf_kib / (double)registered;
	fprintf(stderr, "  under TSan: the registered buffer costs %ld KiB, %.2f times its size\n", buf_kib,
		factor);
	registered = buf_kib;
	limit = (long)(limit * factor);
#else
	(void)buf_kib;
#endif
	long engine = after - registered;
	printf("MEM peers=%d sockets=%d rounds=%d rss_before_kib=%ld rss_after_kib=%ld registered_kib=%ld "
	       "rss_minus_registered_kib=%ld engine_delta_kib=%ld limit_kib=%ld\n",
	       PEERS, socks, rounds, before, after, registered, engine, after - before - registered, limit);
	CHECK(socks >= 2 * PEERS); /* two connections to each peer (the default on two cores) */
	CHECK(before > 0 && after > 0);
	CHECK(engine < limit);

	/* Every slice holds its peer's bytes (checked after measuring: the
	 * expected bytes take memory of their own). */
	unsigned char *expect = malloc(TBYTES);
	REQUIRE(expect != NULL);
	ok = 0;
	for (int i = 0; i < PEERS; i++) {
		fill_pattern(expect, TBYTES, (unsigned)i);
		ok += memcmp(buf + (size_t)i * TBYTES, expect, TBYTES) == 0;
	}
	CHECK_EQ(ok, PEERS);
	free(expect);

	for (int i = 0; i < PEERS; i++)
		CHECK_EQ(te_segment_close(e, seg[i]), 0);
	te_engine_destroy(e);
	child_stop(&c, 0);
	free(want);
	return check_done();
}
