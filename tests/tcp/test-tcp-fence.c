/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fencing end to end (docs/tcp.md, "Fencing"): a WRITE that failed over to
 * another rail and completed there is never overwritten by its old copy,
 * which a lagging server thread reads from the abandoned connection later.
 *
 *   test-tcp-fence PLUGIN [ROUNDS]
 *
 * PLUGIN is the test-only build of the TCP plugin (fence/, on TE_PLUGIN_PATH
 * ahead of the real one): it can hold one server thread before it writes a
 * WRITE's body, and fail the initiator's connection that carried it over as
 * a suspect one. A target with two I/O threads publishes two rails,
 * 127.0.0.1 and 127.0.0.2; the initiator keeps one connection on each. Each
 * round waits for the last round's connections to close, opens the segment
 * afresh (both rails up) until both connections said HELLO and are served by
 * different server threads (accepted one after the other, they are), then:
 *
 *   1. WRITE X to a range; the server thread that takes it is held before it
 *      writes a byte;
 *   2. the connection that carried X is forced suspect: its rail goes down
 *      and X goes to the other rail (behind a FENCE of the first
 *      connection); it completes;
 *   3. WRITE Y to the same range completes;
 *   4. the held thread goes on; once it has written its copy of X or closed
 *      its connection, the range must hold Y.
 *
 * ROUNDS (default 1000) rounds hold the thread before it looks at its
 * connection's fence; 20 more hold it inside the write (the fence came while
 * it was writing): then the FENCE must wait for that write, so X cannot
 * complete while the thread is held; the test lets it go after 100 ms (or at
 * once if X completed anyway, a fence that did not wait, and then Y would be
 * overwritten).
 */
#include <dlfcn.h>

#include "tcp-test.h"

#define MIB (1u << 20)
#define XLEN 4096u
#define INSIDE_ROUNDS 20

static void (*f_arm)(uint64_t addr, int mode);
static int (*f_wait_held)(int ms);
static int (*f_force)(void);
static void (*f_release)(void);
static int (*f_wait_settled)(int ms);
static void (*f_counts)(unsigned *hellos, unsigned *fences, unsigned *ended);
static unsigned (*f_live)(unsigned *threads);

static te_engine *tgt, *ini;
static unsigned char *tbuf, *lbuf;

static void find_hooks(const char *path)
{
	te_plugin_foreach(NULL, NULL); /* makes libte load the plugins */
	void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
	if (h == NULL) {
		fprintf(stderr, "test-tcp-fence: libte did not load %s (TE_PLUGIN_PATH)\n", path);
		exit(1);
	}
	*(void **)&f_arm = dlsym(h, "te_test_fence_arm");
	*(void **)&f_wait_held = dlsym(h, "te_test_fence_wait_held");
	*(void **)&f_force = dlsym(h, "te_test_fence_force_suspect");
	*(void **)&f_release = dlsym(h, "te_test_fence_release");
	*(void **)&f_wait_settled = dlsym(h, "te_test_fence_wait_settled");
	*(void **)&f_counts = dlsym(h, "te_test_fence_counts");
	*(void **)&f_live = dlsym(h, "te_test_fence_live");
	REQUIRE(f_arm && f_wait_held && f_force && f_release && f_wait_settled && f_counts && f_live);
}

/* Server connections open that said HELLO; `threads`: the I/O threads
 * serving them, a bit each. */
static unsigned live(unsigned *threads)
{
	unsigned t;
	unsigned n = f_live(&t);
	if (threads)
		*threads = t;
	return n;
}

/* Waits (up to 5 s) until `n` connections that said HELLO are open. */
static bool live_is(unsigned n)
{
	for (int i = 0; i < 5000 && live(NULL) != n; i++)
		usleep(1000);
	return live(NULL) == n;
}

/* One request; its batch is left to the caller (waited for with `ms`). */
static te_batch_id submit1(te_segment_id seg, int op, void *local, uint64_t remote, uint64_t len)
{
	te_request r = { op, seg, local, remote, len };
	te_batch_id b;
	REQUIRE(te_batch_alloc(ini, 1, &b) == 0);
	REQUIRE(te_submit(ini, b, &r, 1) == 0);
	return b;
}

static int state_of(te_batch_id b, int ms, int *error)
{
	te_task_status st = { 0 };
	te_batch_wait(ini, b, ms);
	te_get_status(ini, b, 0, &st);
	*error = st.error;
	return st.state;
}

/* Both connections up and introduced (their HELLOs taken by the target).
 * Two slices: the first connection up takes one, and the other, left in the
 * queue, makes the second connect (a connection that is down connects only
 * for queued work). */
static int both_connected(te_segment_id seg)
{
	for (int i = 0; i < 200; i++) {
		int err;
		te_batch_id b = submit1(seg, TE_OP_READ, lbuf, (uintptr_t)tbuf, 2 * MIB);
		int st = state_of(b, 5000, &err);
		te_batch_free(ini, b);
		if (st != TE_TASK_COMPLETED) {
			fprintf(stderr, "test-tcp-fence: warm-up READ: state %d, %s\n", st, te_strerror(err));
			return 0;
		}
		if (live(NULL) >= 2)
			return 1;
		usleep(1000);
	}
	fprintf(stderr, "test-tcp-fence: the second connection did not come up in 200 READs\n");
	return -1;
}

/* One round; `inside`: the thread is held inside the write. 1: passed, 0:
 * failed, -1: the two connections did not come up on two server threads,
 * to be run again. */
static int round_once(int r, int inside, const char *name)
{
	unsigned char *x = lbuf + 2 * MIB, *y = x + XLEN;
	uint64_t range = (uintptr_t)tbuf + 3 * MIB + (uint64_t)(r % 64) * XLEN;
	unsigned h0, f0, e0, h1, f1, e1, threads;
	int err, st, ok = 0;

	fill_pattern(x, XLEN, (unsigned)(2 * r + 1));
	fill_pattern(y, XLEN, (unsigned)(2 * r + 2));
	if (!live_is(0)) {
		fprintf(stderr, "test-tcp-fence: round %d: the last round's connections are still open\n", r);
		return 0;
	}
	f_counts(&h0, &f0, &e0);
	te_segment_id seg = te_segment_open(ini, name);
	REQUIRE(seg > 0);
	ok = both_connected(seg);
	if (ok <= 0)
		goto out;
	ok = 0;
	if (live(&threads) != 2 || threads != 3) {
		ok = -1;
		goto out;
	}

	f_arm(range, inside ? 2 : 1);
	te_batch_id bx = submit1(seg, TE_OP_WRITE, x, range, XLEN);
	if (f_wait_held(10000) < 0) {
		fprintf(stderr, "test-tcp-fence: round %d: no server thread took the WRITE\n", r);
		f_release();
		te_batch_wait(ini, bx, 10000);
		te_batch_free(ini, bx);
		goto out;
	}
	REQUIRE(f_force() == 0);
	bool let_go = false;
	if (inside) {
		/* The FENCE waits for the held write: X cannot complete yet. */
		st = state_of(bx, 100, &err);
		if (st != TE_TASK_COMPLETED) {
			f_release();
			let_go = true;
		}
	}
	st = state_of(bx, 10000, &err);
	te_batch_free(ini, bx);
	if (st != TE_TASK_COMPLETED) {
		fprintf(stderr, "test-tcp-fence: round %d: WRITE X: state %d, %s\n", r, st, te_strerror(err));
		if (!let_go)
			f_release();
		goto out;
	}
	te_batch_id by = submit1(seg, TE_OP_WRITE, y, range, XLEN);
	st = state_of(by, 10000, &err);
	te_batch_free(ini, by);
	if (!let_go)
		f_release();
	if (st != TE_TASK_COMPLETED) {
		fprintf(stderr, "test-tcp-fence: round %d: WRITE Y: state %d, %s\n", r, st, te_strerror(err));
		goto out;
	}
	if (f_wait_settled(10000) < 0) {
		fprintf(stderr, "test-tcp-fence: round %d: the held thread did not finish\n", r);
		goto out;
	}
	if (memcmp(tbuf + (range - (uintptr_t)tbuf), y, XLEN) != 0) {
		bool old = memcmp(tbuf + (range - (uintptr_t)tbuf), x, XLEN) == 0;
		fprintf(stderr, "test-tcp-fence: round %d (%s): after WRITE Y completed the range holds %s\n", r,
			inside ? "held inside the write" : "held before it",
			old ? "X, written again by the held thread" : "bytes other than Y's");
		goto out;
	}
	f_counts(&h1, &f1, &e1);
	if (f1 - f0 != 1 || e1 - e0 != 1) {
		fprintf(stderr, "test-tcp-fence: round %d: %u FENCEs ending %u connections (want 1 and 1)\n", r,
			f1 - f0, e1 - e0);
		goto out;
	}
	ok = 1;
out:
	CHECK_EQ(te_segment_close(ini, seg), 0);
	return ok;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: test-tcp-fence PLUGIN [ROUNDS]\n");
		return 2;
	}
	int rounds = argc > 2 ? atoi(argv[2]) : 1000;
	te_option topt[2] = { { "TE_TCP_THREADS", "2" }, { "TE_TCP_RAILS", "127.0.0.1,127.0.0.2" } };
	/* The I/O threads do everything (a caller driving a connection itself
	 * would take the forced fail-over late), and only forced connections
	 * are suspect. */
	te_option iopt[4] = { { "TE_TCP_CONNS_PER_PEER", "1" }, { "TE_TCP_DIRECT", "0" },
			      { "TE_TCP_SUSPECT_MS", "0" }, { "TE_TCP_THREADS", "2" } };

	tgt = tcp_engine(topt, 2);
	ini = tcp_engine(iopt, 4);
	REQUIRE(tgt != NULL && ini != NULL);
	find_hooks(argv[1]);
	tbuf = map_buf(4 * MIB);
	lbuf = map_buf(4 * MIB);
	REQUIRE(te_register_memory(tgt, tbuf, 4 * MIB, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
	REQUIRE(te_register_memory(ini, lbuf, 4 * MIB, "cpu:0", 0) == 0);

	long long t0 = now_ms();
	int failed = 0, again = 0, r = 0;
	while (r < rounds + INSIDE_ROUNDS && failed < 3 && again < 100) {
		int rc = round_once(r, r >= rounds, te_engine_name(tgt));
		again += rc < 0;
		failed += rc == 0;
		r += rc >= 0;
	}
	printf("%d rounds (%d held before the write, %d inside it) in %lld ms, %d failed, %d run again\n", r,
	       r < rounds ? r : rounds, r > rounds ? r - rounds : 0, now_ms() - t0, failed, again);
	if (again >= 100)
		fprintf(stderr, "test-tcp-fence: 100 rounds without two connections on two server threads\n");
	te_engine_destroy(ini);
	te_engine_destroy(tgt);
	return failed || again >= 100 ? 1 : 0;
}
