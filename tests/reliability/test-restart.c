/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A target killed (SIGKILL) while batches run, then started again under the
 * same name: the initiator's batches in flight end FAILED within a bound, and
 * after the restart the initiator reaches the new process without being
 * restarted or told: the segment is fetched again because its peer went
 * away, its buffers are where the new process has them, the next batch
 * completes and every byte is the new process's. Over TCP, and over the
 * same-host transport.
 *
 * argv[1]: tests/tcp/tcp-peer.
 */
#include <netinet/in.h>
#include <sys/socket.h>

#include "../common/child.h"
#include "../common/util.h"

#define BYTES (4u << 20)
#define BLOCK 65536

static const char *peer_prog;

static int free_port(void)
{
	int port = te_test_free_port();
	return port > 0 ? port : 0;
}

static bool start(child *c, const char *name, unsigned seed, const char *transports, uint64_t *addr)
{
	char bytes[32], sd[32], tp[64];
	snprintf(bytes, sizeof bytes, "%u", BYTES);
	snprintf(sd, sizeof sd, "%u", seed);
	snprintf(tp, sizeof tp, "TCP_PEER_TRANSPORTS=%s", transports);
	char *argv[] = { (char *)peer_prog, "target", (char *)name, bytes, sd, NULL };
	char *env[] = { tp, NULL };
	for (int tries = 0; tries < 50; tries++) { /* the port may linger a moment */
		if (!child_start(c, argv, env))
			return false;
		const char *l = child_expect(c, "READY ", 5000);
		unsigned long long a;
		char got[128];
		if (l != NULL && sscanf(l, "%127s %llu", got, &a) == 2) {
			*addr = a;
			return strcmp(got, name) == 0;
		}
		child_stop(c, SIGKILL);
		usleep(100000);
	}
	return false;
}

/* One batch of reads of the whole target buffer; its worst state. */
static int read_all(te_engine *e, te_segment_id seg, unsigned char *local, uint64_t remote)
{
	enum { N = BYTES / BLOCK };
	te_request r[N];
	te_batch_id b;
	int32_t state = -1;
	for (int i = 0; i < N; i++)
		r[i] = (te_request){ TE_OP_READ, seg, local + i * BLOCK, remote + (uint64_t)i * BLOCK, BLOCK };
	if (te_batch_alloc(e, N, &b) < 0)
		return -1;
	te_submit(e, b, r, N);
	if (te_batch_wait(e, b, 10000) < 0)
		return -2; /* stuck */
	te_batch_status(e, b, NULL, NULL, &state);
	te_batch_free(e, b);
	return state;
}

static void restart(const char *transports, const char *want)
{
	char name[64];
	child c;
	uint64_t remote = 0;
	snprintf(name, sizeof name, "127.0.0.1:%d", free_port());
	REQUIRE(start(&c, name, 1, transports, &remote));
	te_engine *e = NULL;
	te_option opt[2] = { { "transports", transports }, { "TE_TCP_TIMEOUT_MS", "2000" } };
	REQUIRE(te_engine_create("P2PHANDSHAKE", "127.0.0.1", opt, 2, &e) == 0);
	unsigned char *local = malloc(BYTES), *want_bytes = malloc(BYTES);
	REQUIRE(local && want_bytes);
	REQUIRE(te_register_memory(e, local, BYTES, "cpu:0", 0) == 0);
	te_segment_id seg = te_segment_open(e, name);
	REQUIRE(seg > 0);
	CHECK(strcmp(te_segment_transport(e, seg), want) == 0);
	fill_pattern(want_bytes, BYTES, 1);
	CHECK_EQ(read_all(e, seg, local, remote), TE_TASK_COMPLETED);
	CHECK(memcmp(local, want_bytes, BYTES) == 0);

	/* killed while batches run: they end FAILED, none stuck */
	long long killed = 0, failed = 0;
	for (int i = 0; i < 1000 && !failed; i++) {
		if (i == 3) {
			kill(c.pid, SIGKILL);
			killed = now_ms();
		}
		int st = read_all(e, seg, local, remote);
		CHECK(st != -2);
		if (st != TE_TASK_COMPLETED)
			failed = now_ms();
	}
	CHECK(failed > 0 && failed - killed < 3000);
	fprintf(stderr, "  %s: first failed batch %lld ms after the kill\n", want, failed - killed);
	child_stop(&c, 0);

	/* back under the same name, with other buffers and other bytes */
	uint64_t remote2 = 0;
	REQUIRE(start(&c, name, 2, transports, &remote2));
	long long back = now_ms();
	te_segment_buffer sb;
	CHECK_EQ(te_segment_buffers(e, seg, &sb, 1), 1); /* the new process's buffer */
	CHECK_EQ(sb.addr, remote2);
	CHECK(strcmp(te_segment_transport(e, seg), want) == 0);
	CHECK_EQ(read_all(e, seg, local, sb.addr), TE_TASK_COMPLETED); /* the very next batch */
	fill_pattern(want_bytes, BYTES, 2);
	CHECK(memcmp(local, want_bytes, BYTES) == 0);
	fprintf(stderr, "  %s: reached the restarted target %lld ms after it was back\n", want, now_ms() - back);
	child_stop(&c, 0);
	te_engine_destroy(e);
	free(local);
	free(want_bytes);
}

static void test_restart_tcp(void)
{
	restart("tcp", "tcp");
}

static void test_restart_same_host(void)
{
	restart("tcp,shm", "shm");
}

int main(int argc, char **argv)
{
	REQUIRE(argc == 2);
	peer_prog = argv[1];
	signal(SIGPIPE, SIG_IGN);
	TEST_RUN(test_restart_tcp);
	TEST_RUN(test_restart_same_host);
	return check_done();
}
