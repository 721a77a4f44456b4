/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The same-host transport moving another process's device memory: the
 * target (device-peer) exports its test device allocation, this process
 * opens it through its own test device plugin and copies with it. Reads
 * and writes of many sizes, from host memory and from device memory (which
 * the host stages), one at a time and in batches (the submitting thread and
 * the copy workers), with every byte checked in the target's device memory;
 * a region the target registers after first contact; the device plugin's
 * copies failing; a target whose device memory cannot be shared (left to
 * TCP, or not served when the same-host transport is the only one).
 *
 * argv[1]: the device-peer program.
 */
#include <dlfcn.h>

#include "../common/child.h"
#include "device-util.h"

#define REGION (12u << 20)

static const char *peer_prog;

typedef struct peer {
	child c;
	char name[128];
	uint64_t a;
} peer;

static bool peer_start(peer *p, char *const env[])
{
	char *argv[] = { (char *)peer_prog, NULL };
	if (!child_start(&p->c, argv, env))
		return false;
	const char *l = child_expect(&p->c, "READY ", 10000);
	unsigned long long a;
	if (l == NULL || sscanf(l, "%127s %llx", p->name, &a) != 2)
		return false;
	p->a = a;
	return true;
}

static bool peer_cmd(peer *p, const char *cmd, const char *want)
{
	return child_cmd(&p->c, cmd, want);
}

static bool peer_check(peer *p, char r, unsigned seed, size_t off, size_t len)
{
	char cmd[96];
	snprintf(cmd, sizeof cmd, "check %c %u %zu %zu", r, seed, off, len);
	return peer_cmd(p, cmd, "OK");
}

static bool peer_fill(peer *p, char r, unsigned seed)
{
	char cmd[64];
	snprintf(cmd, sizeof cmd, "fill %c %u", r, seed);
	return peer_cmd(p, cmd, "FILLED");
}

static unsigned long (*testdev_counter(const char *name))(void)
{
	void *h = dlopen(getenv("TE_TESTDEV_PLUGIN"), RTLD_NOW | RTLD_NOLOAD);
	unsigned long (*f)(void) = NULL;
	REQUIRE(h != NULL); /* libte loaded it */
	*(void **)&f = dlsym(h, name);
	REQUIRE(f != NULL);
	dlclose(h);
	return f;
}

/* Host or device memory here against the peer's device memory: single
 * requests of every size both ways, then batches of unaligned pieces. */
static void both_ways(te_engine *e, peer *p, te_segment_id seg, bool local_dev)
{
	static const size_t sizes[] = DEV_SIZES;
	side l = side_new(local_dev, "testdev:1", REGION);
	unsigned seed = local_dev ? 500 : 100;

	fprintf(stderr, "  %s -> the peer's device\n", local_dev ? "device" : "host");
	CHECK_EQ(te_register_memory(e, l.p, REGION, "*", 0), 0);
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		size_t n = sizes[i], off = 1 + i * 7;
		te_task_status st = { 0 };
		side_fill(l, REGION, seed + (unsigned)i);
		CHECK(peer_fill(p, 'A', 9));
		CHECK_EQ(run_one(e, TE_OP_WRITE, seg, l.p, p->a + off, n, &st), TE_TASK_COMPLETED);
		CHECK_EQ(st.transferred, n);
		/* The bytes landed at off, and none around them moved. */
		unsigned char *want = malloc(REGION), *got = malloc(REGION);
		CHECK(peer_check(p, 'A', 9, 0, off));
		CHECK(peer_check(p, 'A', 9, off + n, REGION - off - n));
		/* ...and they are the initiator's: read them back into the
		 * initiator's memory over a different pattern. */
		side_fill(l, REGION, 7);
		CHECK_EQ(run_one(e, TE_OP_READ, seg, l.p, p->a + off, n, &st), TE_TASK_COMPLETED);
		CHECK_EQ(st.transferred, n);
		fill_pattern(want, REGION, seed + (unsigned)i);
		CHECK_EQ(te_device_copy(got, l.p, n), 0); /* host memory too */
		CHECK(memcmp(got, want, n) == 0);
		free(want);
		free(got);
	}
	/* Batches: 24 pieces of 256 KiB + 5 (over the inline limit: the copy
	 * workers) and 24 of 4001 bytes (the submitting thread). */
	for (int big = 0; big < 2; big++) {
		enum { N = 24 };
		size_t each = big ? 256 * 1024 + 5 : 4001;
		te_request r[N];
		for (int op = 0; op < 2; op++) {
			side_fill(l, REGION, 40 + (unsigned)op);
			CHECK(peer_fill(p, 'A', 50 + (unsigned)op));
			for (int k = 0; k < N; k++)
				r[k] = (te_request){ op == 0 ? TE_OP_WRITE : TE_OP_READ, seg,
						     l.p + 3 + (size_t)k * each, p->a + 3 + (size_t)k * each, each };
			CHECK_EQ(run_batch(e, r, N), TE_TASK_COMPLETED);
			if (op == 0) {
				/* The peer holds pattern 40 in [3, 3 + N*each): compare
				 * what it has with what we sent by reading it back whole. */
				side back = side_new(false, NULL, REGION);
				CHECK_EQ(te_register_memory(e, back.p, REGION, "*", 0), 0);
				te_task_status st;
				CHECK_EQ(run_one(e, TE_OP_READ, seg, back.p, p->a, REGION, &st), TE_TASK_COMPLETED);
				unsigned char *want = malloc(REGION), *other = malloc(REGION);
				fill_pattern(want, REGION, 40);
				fill_pattern(other, REGION, 50);
				size_t end = 3 + N * each;
				CHECK(memcmp(back.p, other, 3) == 0);
				CHECK(memcmp(back.p + 3, want + 3, end - 3) == 0);
				CHECK(memcmp(back.p + end, other + end, REGION - end) == 0);
				free(want);
				free(other);
				CHECK_EQ(te_unregister_memory(e, back.p), 0);
				side_free(back);
			} else {
				unsigned char *want = malloc(REGION), *got = malloc(REGION);
				fill_pattern(want, REGION, 51);
				CHECK_EQ(te_device_copy(got, l.p, REGION), 0); /* host memory too */
				CHECK(memcmp(got + 3, want + 3, N * each) == 0);
				free(want);
				free(got);
			}
		}
	}
	CHECK_EQ(te_unregister_memory(e, l.p), 0);
	side_free(l);
}

static void test_device_memory(void)
{
	peer p;
	REQUIRE(peer_start(&p, NULL));
	unsigned long (*opens)(void) = NULL;
	te_engine *e = p2p_engine("shm"); /* nothing else could serve it */
	REQUIRE(e != NULL);
	opens = testdev_counter("te_testdev_ipc_opens");
	unsigned long before = opens();
	te_segment_id seg = te_segment_open(e, p.name);
	REQUIRE(seg >= 0);
	both_ways(e, &p, seg, false);
	both_ways(e, &p, seg, true);
	CHECK(opens() > before); /* its device memory was opened here */

	/* A region registered after first contact: its export is new, the
	 * descriptor is fetched again and the segment opened anew. */
	const char *l = child_say(&p.c, "register B") ? child_expect(&p.c, "REGISTERED ", 10000) : NULL;
	unsigned long long b = 0;
	CHECK(l != NULL && sscanf(l, "%llx", &b) == 1);
	unsigned char buf[70000];
	te_task_status st;
	CHECK_EQ(te_register_memory(e, buf, sizeof buf, "*", 0), 0);
	fill_pattern(buf, sizeof buf, 77);
	CHECK_EQ(run_one(e, TE_OP_WRITE, seg, buf, b + 11, sizeof buf, &st), TE_TASK_COMPLETED);
	CHECK(peer_check(&p, 'B', 2, 0, 11));
	memset(buf, 0, sizeof buf);
	CHECK_EQ(run_one(e, TE_OP_READ, seg, buf, b + 11, sizeof buf, &st), TE_TASK_COMPLETED);
	CHECK(host_equals(buf, sizeof buf, 77));

	/* The device plugin's copies fail: FAILED with its error, then fine. */
	setenv("TE_TESTDEV_FAIL", "1", 1);
	CHECK_EQ(run_one(e, TE_OP_READ, seg, buf, p.a, 4096, &st), TE_TASK_FAILED);
	CHECK_EQ(st.error, -EIO);
	unsetenv("TE_TESTDEV_FAIL");
	CHECK_EQ(run_one(e, TE_OP_READ, seg, buf, p.a, 4096, &st), TE_TASK_COMPLETED);
	/* Outside the registered region: refused. */
	CHECK(run_one(e, TE_OP_READ, seg, buf, p.a + REGION - 100, 4096, &st) != TE_TASK_COMPLETED);
	CHECK_EQ(te_unregister_memory(e, buf), 0);
	te_engine_destroy(e);
	child_stop(&p.c, SIGTERM);
}

/* Our device memory against the peer's host memory, reached through a
 * shared mapping and by cross-memory attach: the same-host transport moves
 * it itself (the device plugin copies between our device memory and the
 * peer's bytes, through a host buffer where only the kernel reaches them),
 * no staging buffer of the engine in between. */
static void test_device_to_host(void)
{
	static const char *const kinds[] = { "TE_PEER_MEMORY=shared", "TE_PEER_MEMORY=host" };
	for (int k = 0; k < 2; k++) {
		char *env[] = { (char *)kinds[k], NULL };
		peer p;
		fprintf(stderr, " %s\n", kinds[k]);
		REQUIRE(peer_start(&p, env));
		te_engine *e = p2p_engine("shm");
		REQUIRE(e != NULL);
		te_segment_id seg = te_segment_open(e, p.name);
		REQUIRE(seg >= 0);
		both_ways(e, &p, seg, true);
		te_engine_destroy(e);
		child_stop(&p.c, SIGTERM);
	}
}

/* The target's device plugin cannot share its memory: the same-host
 * transport leaves the segment to TCP (which stages on the target's
 * side), or, alone, does not serve it. */
static void test_not_shared(void)
{
	char *env[] = { "TE_TESTDEV_NO_IPC=1", "TE_PEER_TRANSPORTS=shm,tcp", NULL };
	peer p;
	unsigned char buf[8192];
	te_task_status st;

	REQUIRE(peer_start(&p, env));
	te_engine *e = p2p_engine("shm,tcp");
	REQUIRE(e != NULL);
	CHECK_EQ(te_register_memory(e, buf, sizeof buf, "*", 0), 0);
	te_segment_id seg = te_segment_open(e, p.name);
	REQUIRE(seg >= 0);
	CHECK_EQ(run_one(e, TE_OP_READ, seg, buf, p.a + 5, sizeof buf, &st), TE_TASK_COMPLETED);
	unsigned char *want = malloc(sizeof buf + 5);
	fill_pattern(want, sizeof buf + 5, 1);
	CHECK(memcmp(buf, want + 5, sizeof buf) == 0);
	free(want);
	te_engine_destroy(e);

	e = p2p_engine("shm");
	REQUIRE(e != NULL);
	CHECK_EQ(te_register_memory(e, buf, sizeof buf, "*", 0), 0);
	seg = te_segment_open(e, p.name);
	CHECK(seg < 0 || run_one(e, TE_OP_READ, seg, buf, p.a, sizeof buf, &st) != TE_TASK_COMPLETED);
	te_engine_destroy(e);
	child_stop(&p.c, SIGTERM);
}

int main(int argc, char **argv)
{
	REQUIRE(argc > 1);
	peer_prog = argv[1];
	signal(SIGPIPE, SIG_IGN);
	TEST_RUN(test_device_memory);
	TEST_RUN(test_device_to_host);
	TEST_RUN(test_not_shared);
	return check_done();
}
