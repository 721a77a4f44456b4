/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Memory with many peers: one engine connected to 64 target engines (in a
 * helper process) must stay under 64 MiB of resident memory beyond the
 * memory it registered. Prints the figures ("MEM ...") for the docs.
 *
 * argv[1]: the tcp-peer helper.
 */
#include <dirent.h>

#include "tcp-test.h"

#define PEERS 64
#define TBYTES (16u << 20)
#define LOCAL (16u << 20)

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
	unsigned char *buf = map_buf(LOCAL), *want = malloc(65536 + 100);
	REQUIRE(want != NULL);
	memset(buf, 0, LOCAL); /* resident: counted as registered below */
	REQUIRE(te_register_memory(e, buf, LOCAL, "cpu:0", 0) == 0);
	te_segment_id seg[PEERS];
	int ok = 0;
	for (int i = 0; i < PEERS; i++) {
		seg[i] = te_segment_open(e, names[i]);
		REQUIRE(seg[i] > 0);
		te_task_status st;
		if (run_one(e, TE_OP_READ, seg[i], buf + (size_t)(i % 32) * 65536, addrs[i] + 100, 65536, &st) ==
		    TE_TASK_COMPLETED) {
			fill_pattern(want, 65536 + 100, (unsigned)i); /* the peer's first bytes */
			ok += memcmp(buf + (size_t)(i % 32) * 65536, want + 100, 65536 - 100) == 0;
		}
	}
	CHECK_EQ(ok, PEERS);
	/* Then all peers at once, 16 MiB each: more than one connection's share
	 * and window, so that every connection of every peer is up and busy. The
	 * reads land on the same local bytes; only the memory is of interest. */
	te_request r[PEERS];
	for (int i = 0; i < PEERS; i++)
		r[i] = (te_request){ TE_OP_READ, seg[i], buf, addrs[i], TBYTES };
	te_batch_id b;
	REQUIRE(te_batch_alloc(e, PEERS, &b) == 0);
	CHECK_EQ(te_submit(e, b, r, PEERS), 0);
	CHECK_EQ(te_batch_wait(e, b, 30000), 0);
	int32_t state;
	CHECK_EQ(te_batch_status(e, b, NULL, NULL, &state), 0);
	CHECK_EQ(state, TE_TASK_COMPLETED);
	CHECK_EQ(te_batch_free(e, b), 0);
	usleep(300000); /* the last connections finish connecting */

	long after = rss_kib();
	int socks = sockets_open() - socks_before;
	long registered = LOCAL / 1024;
	long engine = after - registered;
	printf("MEM peers=%d sockets=%d rss_before_kib=%ld rss_after_kib=%ld registered_kib=%ld "
	       "rss_minus_registered_kib=%ld engine_delta_kib=%ld\n",
	       PEERS, socks, before, after, registered, engine, after - before - registered);
	CHECK(socks >= 2 * PEERS); /* two connections to each peer (the default on two cores) */
	CHECK(before > 0 && after > 0);
	CHECK(engine < 64 * 1024);

	for (int i = 0; i < PEERS; i++)
		CHECK_EQ(te_segment_close(e, seg[i]), 0);
	te_engine_destroy(e);
	child_stop(&c, 0);
	free(want);
	return check_done();
}
