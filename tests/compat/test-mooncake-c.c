/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A program written for Mooncake's C API (transfer_engine_c.h) and nothing
 * else: two engines over TCP through P2PHANDSHAKE, in one process (default)
 * or in two (argument "fork"). It moves data and compares it byte for byte,
 * passes notifications, follows a peer's registrations through the segment
 * cache calls, and checks the error returns for bad input. The same source is
 * built against the installed library by check-install-compat.sh.
 */
#define _POSIX_C_SOURCE 200809L
#include <transfer_engine_c.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/check.h"
#include "mc-util.h"

/* A pattern that differs per seed and per byte, so a misplaced byte shows. */
static void fill(unsigned char *p, size_t n, unsigned seed)
{
	unsigned x = seed * 2654435761u + 12345u;
	for (size_t i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		p[i] = (unsigned char)(x >> 16);
	}
}

static int matches(const unsigned char *p, size_t n, unsigned seed)
{
	unsigned char *want = malloc(n ? n : 1);
	int ok;
	REQUIRE(want != NULL);
	fill(want, n, seed);
	ok = memcmp(p, want, n) == 0;
	free(want);
	return ok;
}

/* One request through a batch of its own; the submit code, and the final
 * state in *state (STATUS_INVALID when refused at submit). */
static int transfer_one(transfer_engine_t e, int opcode, void *local, segment_id_t seg,
			uint64_t remote, uint64_t len, int *state)
{
	transfer_request_t r = { opcode, local, seg, remote, len };
	batch_id_t b = allocateBatchID(e, 1);
	transfer_status_t st;
	int rc;

	REQUIRE(b != INVALID_BATCH);
	rc = submitTransfer(e, b, &r, 1);
	*state = wait_tasks(e, b, 1);
	if (getTransferStatus(e, b, 0, &st) == 0 && st.status == STATUS_INVALID)
		*state = STATUS_INVALID;
	CHECK_EQ(freeBatchID(e, b), 0);
	return rc;
}

/* Waits up to 5 s for a notification on `e` and copies the first one out. */
static int wait_notify(transfer_engine_t e, char *name, size_t nlen, char *msg, size_t mlen)
{
	long long end = now_ms() + 5000;
	do {
		int n = -1;
		notify_msg_t *list = getNotifsFromEngine(e, &n);
		if (list != NULL) {
			int count = n;
			snprintf(name, nlen, "%s", list[0].name);
			snprintf(msg, mlen, "%s", list[0].msg);
			CHECK_EQ(freeNotifsMsgBuf(list, n), 0);
			return count;
		}
		CHECK_EQ(n, 0);
		sleep_ms(2);
	} while (now_ms() < end);
	return 0;
}

/* One fetch, no waiting: the number of notifications taken, the first one's
 * sender and text copied out. */
static int take_notify(transfer_engine_t e, char *name, size_t nlen, char *msg, size_t mlen)
{
	int n = -1;
	notify_msg_t *list = getNotifsFromEngine(e, &n);

	if (list == NULL) {
		CHECK_EQ(n, 0);
		return 0;
	}
	snprintf(name, nlen, "%s", list[0].name);
	snprintf(msg, mlen, "%s", list[0].msg);
	CHECK_EQ(freeNotifsMsgBuf(list, n), 0);
	return n;
}

/* --------------------------------------------------------- in one process */

#define BUF (8u << 20)

static transfer_engine_t A, B; /* A initiates, B is the target */
static transport_t tcp_a;
static char name_a[128], name_b[128];
static unsigned char *src, *dst, *tbuf; /* A's source and destination, B's buffer */
static segment_id_t seg_b;

static void test_create(void)
{
	/* The style of Mooncake's examples: P2PHANDSHAKE, then the transport. */
	A = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 12345, 0);
	REQUIRE(A != NULL);
	tcp_a = installTransport(A, "tcp", NULL);
	REQUIRE(tcp_a != NULL);
	CHECK(installTransport(A, "tcp", NULL) == tcp_a); /* installed: same handle */

	/* Auto discovery installs a transport itself (TCP here: no RDMA
	 * device). Same rpc_port and a port in the name: P2PHANDSHAKE picks a
	 * free port anyway, as Mooncake does, so both engines coexist. */
	B = createTransferEngine("P2PHANDSHAKE", "127.0.0.1:12345", NULL, 12345, 1);
	REQUIRE(B != NULL);
	CHECK(installTransport(B, "tcp", NULL) != NULL);

	CHECK_EQ(getLocalIpAndPort(A, name_a, sizeof name_a), 0);
	CHECK_EQ(getLocalIpAndPort(B, name_b, sizeof name_b), 0);
	CHECK(strncmp(name_a, "127.0.0.1:", 10) == 0);
	CHECK(strncmp(name_b, "127.0.0.1:", 10) == 0);
	CHECK(strcmp(name_a, name_b) != 0);
	int port = atoi(name_a + 10);
	CHECK(port > 0 && port < 65536);

	/* bad creation arguments */
	CHECK(createTransferEngine(NULL, "127.0.0.1", NULL, 0, 0) == NULL);
	CHECK(createTransferEngine("", "127.0.0.1", NULL, 0, 0) == NULL);
	CHECK(createTransferEngine("nosuchscheme://127.0.0.1:1", "n1", NULL, 0, 0) == NULL);
	CHECK(createTransferEngine("P2PHANDSHAKE", ":1", NULL, 0, 0) == NULL);
}

static void test_local_ip_and_port(void)
{
	char small[5], buf[128];

	/* snprintf semantics: truncated, terminated, still 0 */
	CHECK_EQ(getLocalIpAndPort(A, small, sizeof small), 0);
	CHECK_EQ(strlen(small), 4);
	CHECK(strncmp(small, name_a, 4) == 0);
	CHECK_EQ(getLocalIpAndPort(A, NULL, 10), ERR_INVALID_ARGUMENT);
	CHECK_EQ(getLocalIpAndPort(A, buf, 0), ERR_INVALID_ARGUMENT);
	CHECK_EQ(getLocalIpAndPort(NULL, buf, sizeof buf), ERR_INVALID_ARGUMENT);
}

static void test_register(void)
{
	src = malloc(BUF);
	dst = malloc(BUF);
	tbuf = malloc(BUF);
	REQUIRE(src && dst && tbuf);
	memset(tbuf, 0, BUF);
	CHECK_EQ(registerLocalMemory(A, src, BUF, "cpu:0", 0), 0);
	CHECK_EQ(registerLocalMemory(A, dst, BUF, "*", 0), 0);
	CHECK_EQ(registerLocalMemory(B, tbuf, BUF, "cpu:0", 1), 0);

	/* overlap, zero length, NULL address */
	CHECK_EQ(registerLocalMemory(A, src + 100, 10, "cpu:0", 0), ERR_ADDRESS_OVERLAPPED);
	CHECK_EQ(registerLocalMemory(A, src - 5, 10, "cpu:0", 0), ERR_ADDRESS_OVERLAPPED);
	CHECK_EQ(registerLocalMemory(A, src, 0, "cpu:0", 0), ERR_INVALID_ARGUMENT);
	CHECK_EQ(registerLocalMemory(A, NULL, 10, "cpu:0", 0), ERR_INVALID_ARGUMENT);
	unsigned char loose[64];
	CHECK_EQ(unregisterLocalMemory(A, loose), ERR_ADDRESS_NOT_REGISTERED);
	CHECK_EQ(unregisterLocalMemory(A, src + 1), ERR_ADDRESS_NOT_REGISTERED);
	CHECK_EQ(unregisterLocalMemory(A, NULL), ERR_INVALID_ARGUMENT);
}

static void test_open_segment(void)
{
	seg_b = openSegment(A, name_b);
	CHECK(seg_b > 0);
	CHECK_EQ(openSegment(A, name_b), seg_b); /* cached: same id */
	char slashed[160];
	snprintf(slashed, sizeof slashed, "//%s", name_b);
	CHECK_EQ(openSegment(A, slashed), seg_b); /* leading '/' dropped */
	CHECK_EQ(openSegment(A, name_a), LOCAL_SEGMENT);

	CHECK_EQ(openSegment(A, "127.0.0.1:1"), ERR_INVALID_ARGUMENT); /* nobody there */
	CHECK_EQ(openSegment(A, ""), ERR_INVALID_ARGUMENT);
	CHECK_EQ(openSegment(A, "///"), ERR_INVALID_ARGUMENT);
	CHECK_EQ(openSegment(A, NULL), ERR_INVALID_ARGUMENT);
	CHECK_EQ(openSegment(NULL, name_b), ERR_INVALID_ARGUMENT);
	/* a transport handle is not an engine (both are void *) */
	CHECK_EQ(openSegment((transfer_engine_t)tcp_a, name_b), ERR_INVALID_ARGUMENT);
}

/* Several sizes in one batch, written then read back. */
static void test_write_read(void)
{
	static const uint64_t sizes[] = { 1, 4095, 65536 + 3, 1u << 20, 3u << 20 };
	enum { N = sizeof sizes / sizeof sizes[0] };
	transfer_request_t reqs[N];
	uint64_t off = 0;

	fill(src, BUF, 1);
	for (int i = 0; i < N; i++) {
		reqs[i] = (transfer_request_t){ OPCODE_WRITE, src + off, seg_b,
						(uint64_t)(uintptr_t)(tbuf + off + 7), sizes[i] };
		off += sizes[i] + 4096;
	}
	batch_id_t b = allocateBatchID(A, N);
	REQUIRE(b != INVALID_BATCH);
	CHECK_EQ(submitTransfer(A, b, reqs, N), 0);
	CHECK_EQ(wait_tasks(A, b, N), STATUS_COMPLETED);
	for (int i = 0; i < N; i++) {
		transfer_status_t st;
		CHECK_EQ(getTransferStatus(A, b, i, &st), 0);
		CHECK_EQ(st.status, STATUS_COMPLETED);
		CHECK_EQ(st.transferred_bytes, sizes[i]);
		unsigned char *at = (unsigned char *)reqs[i].source;
		CHECK(memcmp(tbuf + (at - src) + 7, at, sizes[i]) == 0);
	}
	CHECK_EQ(freeBatchID(A, b), 0);

	/* read it all back into dst, one submit per request on one batch */
	memset(dst, 0, BUF);
	b = allocateBatchID(A, N);
	REQUIRE(b != INVALID_BATCH);
	for (int i = 0; i < N; i++) {
		transfer_request_t r = reqs[i];
		r.opcode = OPCODE_READ;
		r.source = dst + ((unsigned char *)reqs[i].source - src);
		CHECK_EQ(submitTransfer(A, b, &r, 1), 0);
	}
	CHECK_EQ(wait_tasks(A, b, N), STATUS_COMPLETED);
	for (int i = 0; i < N; i++) {
		size_t at = (size_t)((unsigned char *)reqs[i].source - src);
		CHECK(memcmp(dst + at, src + at, sizes[i]) == 0);
	}
	/* the batch is full: capacity counts every task of its life */
	CHECK_EQ(submitTransfer(A, b, reqs, 1), MC_STATUS_CODE_TOO_MANY_REQUESTS);
	CHECK_EQ(freeBatchID(A, b), 0);
}

static void test_local_segment(void)
{
	int state;
	fill(src, 1 << 16, 2);
	memset(dst, 0, 1 << 16);
	CHECK_EQ(transfer_one(A, OPCODE_WRITE, src, LOCAL_SEGMENT, (uint64_t)(uintptr_t)dst, 1 << 16,
			      &state), 0);
	CHECK_EQ(state, STATUS_COMPLETED);
	CHECK(memcmp(dst, src, 1 << 16) == 0);
}

static void test_notify(void)
{
	char name[256], msg[256];
	notify_msg_t m = { (char *)"sender-x", (char *)"hello" };
	int n = 7;

	CHECK(getNotifsFromEngine(B, &n) == NULL);
	CHECK_EQ(n, 0);

	CHECK_EQ(genNotifyInEngine(A, (uint64_t)seg_b, m), 0);
	CHECK_EQ(wait_notify(B, name, sizeof name, msg, sizeof msg), 1);
	CHECK(strcmp(name, "sender-x") == 0);
	CHECK(strcmp(msg, "hello") == 0);

	/* NULL name: the sender's own segment name */
	m.name = NULL;
	m.msg = (char *)"anon";
	CHECK_EQ(genNotifyInEngine(A, (uint64_t)seg_b, m), 0);
	CHECK_EQ(wait_notify(B, name, sizeof name, msg, sizeof msg), 1);
	CHECK(strcmp(name, name_a) == 0);
	CHECK(strcmp(msg, "anon") == 0);

	/* with a batch: sent once the write is done, so the data is there */
	fill(src, 1 << 20, 3);
	memset(tbuf, 0, 1 << 20);
	transfer_request_t r = { OPCODE_WRITE, src, seg_b, (uint64_t)(uintptr_t)tbuf, 1 << 20 };
	batch_id_t b = allocateBatchID(A, 1);
	REQUIRE(b != INVALID_BATCH);
	notify_msg_t done = { (char *)"writer-7", (char *)"done-1" };
	CHECK_EQ(submitTransferWithNotify(A, b, &r, 1, done), 0);
	CHECK_EQ(wait_tasks(A, b, 1), STATUS_COMPLETED);
	/* sent by the status call that saw the batch end, before it returned */
	CHECK_EQ(take_notify(B, name, sizeof name, msg, sizeof msg), 1);
	CHECK(strcmp(name, "writer-7") == 0);
	CHECK(strcmp(msg, "done-1") == 0);
	CHECK(matches(tbuf, 1 << 20, 3));
	CHECK_EQ(freeBatchID(A, b), 0);
	/* not polled to its end: freeBatchID sends it */
	b = allocateBatchID(A, 1);
	REQUIRE(b != INVALID_BATCH);
	done.msg = (char *)"done-2";
	CHECK_EQ(submitTransferWithNotify(A, b, &r, 1, done), 0);
	long long until = now_ms() + 20000;
	int rc;
	while ((rc = freeBatchID(A, b)) == MC_STATUS_CODE_BATCH_BUSY && now_ms() < until)
		sleep_ms(1);
	CHECK_EQ(rc, 0);
	CHECK_EQ(take_notify(B, name, sizeof name, msg, sizeof msg), 1);
	CHECK(strcmp(msg, "done-2") == 0);

	/* bad input */
	m.name = (char *)"x";
	m.msg = (char *)"y";
	CHECK_EQ(genNotifyInEngine(A, 4242, m), ERR_INVALID_ARGUMENT);
	CHECK_EQ(genNotifyInEngine(A, 1ull << 40, m), ERR_INVALID_ARGUMENT);
	CHECK_EQ(genNotifyInEngine(NULL, (uint64_t)seg_b, m), ERR_INVALID_ARGUMENT);
	m.msg = NULL;
	CHECK_EQ(genNotifyInEngine(A, (uint64_t)seg_b, m), ERR_INVALID_ARGUMENT);
	b = allocateBatchID(A, 1);
	CHECK_EQ(submitTransferWithNotify(A, b, &r, 0, done), MC_STATUS_CODE_INVALID_ARGUMENT);
	CHECK_EQ(submitTransferWithNotify(A, b, &r, 1, m), MC_STATUS_CODE_INVALID_ARGUMENT);
	CHECK_EQ(freeBatchID(A, b), 0);
	/* a refused request queues no notification */
	r.source = (void *)&r; /* not registered */
	b = allocateBatchID(A, 1);
	CHECK_EQ(submitTransferWithNotify(A, b, &r, 1, done), MC_STATUS_CODE_ADDRESS_NOT_REGISTERED);
	CHECK_EQ(freeBatchID(A, b), 0);
	sleep_ms(200);
	CHECK(getNotifsFromEngine(B, &n) == NULL);
	CHECK_EQ(n, 0);
	CHECK(getNotifsFromEngine(NULL, &n) == NULL);
	CHECK_EQ(n, 0);
	CHECK(getNotifsFromEngine(B, NULL) == NULL);
	CHECK_EQ(freeNotifsMsgBuf(NULL, 0), 0);
}

static void test_submit_errors(void)
{
	unsigned char loose[4096];
	uint64_t remote = (uint64_t)(uintptr_t)tbuf;
	int state;

	/* unknown segment */
	CHECK_EQ(transfer_one(A, OPCODE_WRITE, src, 4242, remote, 64, &state),
		 MC_STATUS_CODE_INVALID_ARGUMENT);
	CHECK_EQ(state, STATUS_INVALID);
	/* unregistered local memory */
	CHECK_EQ(transfer_one(A, OPCODE_WRITE, loose, seg_b, remote, sizeof loose, &state),
		 MC_STATUS_CODE_ADDRESS_NOT_REGISTERED);
	CHECK_EQ(state, STATUS_INVALID);
	/* a local range running past its registered region */
	CHECK_EQ(transfer_one(A, OPCODE_WRITE, src + BUF - 10, seg_b, remote, 20, &state),
		 MC_STATUS_CODE_ADDRESS_NOT_REGISTERED);
	/* outside the peer's buffers */
	CHECK_EQ(transfer_one(A, OPCODE_WRITE, src, seg_b, remote + BUF - 10, 20, &state),
		 MC_STATUS_CODE_ADDRESS_NOT_REGISTERED);
	CHECK_EQ(state, STATUS_INVALID);
	/* unknown opcode */
	CHECK_EQ(transfer_one(A, 7, src, seg_b, remote, 20, &state), MC_STATUS_CODE_INVALID_ARGUMENT);
	CHECK_EQ(transfer_one(A, -1, src, seg_b, remote, 20, &state), MC_STATUS_CODE_INVALID_ARGUMENT);

	/* the first refused request is reported; the valid ones still run */
	fill(src, 4096, 4);
	memset(tbuf, 0, 8192);
	transfer_request_t mixed[3] = {
		{ OPCODE_WRITE, src, seg_b, remote, 4096 },
		{ OPCODE_WRITE, loose, seg_b, remote + 4096, 64 },
		{ OPCODE_WRITE, src, 4242, remote, 64 },
	};
	batch_id_t b = allocateBatchID(A, 3);
	REQUIRE(b != INVALID_BATCH);
	CHECK_EQ(submitTransfer(A, b, mixed, 3), MC_STATUS_CODE_ADDRESS_NOT_REGISTERED);
	CHECK_EQ(wait_tasks(A, b, 1), STATUS_COMPLETED);
	transfer_status_t st;
	CHECK_EQ(getTransferStatus(A, b, 1, &st), 0);
	CHECK_EQ(st.status, STATUS_INVALID);
	CHECK_EQ(getTransferStatus(A, b, 2, &st), 0);
	CHECK_EQ(st.status, STATUS_INVALID);
	CHECK(matches(tbuf, 4096, 4));
	/* unknown task id, NULL status pointer */
	CHECK_EQ(getTransferStatus(A, b, 3, &st), MC_STATUS_CODE_INVALID_ARGUMENT);
	CHECK_EQ(getTransferStatus(A, b, 0, NULL), MC_STATUS_CODE_INVALID_ARGUMENT);
	CHECK_EQ(freeBatchID(A, b), 0);

	/* freed and made-up batch ids */
	CHECK_EQ(submitTransfer(A, b, mixed, 1), MC_STATUS_CODE_INVALID_ARGUMENT);
	CHECK_EQ(getTransferStatus(A, b, 0, &st), MC_STATUS_CODE_INVALID_ARGUMENT);
	CHECK_EQ(freeBatchID(A, b), MC_STATUS_CODE_INVALID_ARGUMENT);
	CHECK_EQ(submitTransfer(A, 0xdeadbeefull, mixed, 1), MC_STATUS_CODE_INVALID_ARGUMENT);
	CHECK_EQ(submitTransfer(A, INVALID_BATCH, mixed, 1), MC_STATUS_CODE_INVALID_ARGUMENT);
	CHECK_EQ(freeBatchID(A, 0xdeadbeefull), MC_STATUS_CODE_INVALID_ARGUMENT);
	/* a batch of one engine is unknown to the other */
	b = allocateBatchID(B, 1);
	REQUIRE(b != INVALID_BATCH);
	CHECK_EQ(submitTransfer(A, b, mixed, 1), MC_STATUS_CODE_INVALID_ARGUMENT);
	CHECK_EQ(freeBatchID(B, b), 0);

	/* capacity: a submit that does not fit appends nothing */
	b = allocateBatchID(A, 2);
	REQUIRE(b != INVALID_BATCH);
	transfer_request_t two[3] = {
		{ OPCODE_WRITE, src, seg_b, remote, 128 },
		{ OPCODE_WRITE, src + 128, seg_b, remote + 128, 128 },
		{ OPCODE_WRITE, src + 256, seg_b, remote + 256, 128 },
	};
	CHECK_EQ(submitTransfer(A, b, two, 3), MC_STATUS_CODE_TOO_MANY_REQUESTS);
	CHECK_EQ(getTransferStatus(A, b, 0, &st), MC_STATUS_CODE_INVALID_ARGUMENT); /* no task */
	CHECK_EQ(submitTransfer(A, b, two, 2), 0);
	CHECK_EQ(submitTransfer(A, b, two, 1), MC_STATUS_CODE_TOO_MANY_REQUESTS);
	CHECK_EQ(submitTransfer(A, b, two, 0), 0);
	CHECK_EQ(wait_tasks(A, b, 2), STATUS_COMPLETED);
	CHECK_EQ(freeBatchID(A, b), 0);
	CHECK(allocateBatchID(A, 0) == INVALID_BATCH);
	CHECK_EQ(submitTransfer(A, b, NULL, 1), MC_STATUS_CODE_INVALID_ARGUMENT);
}

static void test_null_engine(void)
{
	transfer_request_t r = { OPCODE_WRITE, src, seg_b, 0, 1 };
	transfer_status_t st;
	notify_msg_t m = { (char *)"n", (char *)"m" };
	buffer_entry_t be = { src, 1 };
	void *addrs[1] = { src };
	char buf[64];
	int n = 3;

	CHECK(installTransport(NULL, "tcp", NULL) == NULL);
	CHECK_EQ(uninstallTransport(NULL, "tcp"), ERR_INVALID_ARGUMENT);
	CHECK_EQ(openSegmentNoCache(NULL, name_b), ERR_INVALID_ARGUMENT);
	CHECK_EQ(closeSegment(NULL, 1), ERR_INVALID_ARGUMENT);
	CHECK_EQ(removeLocalSegment(NULL, name_b), ERR_INVALID_ARGUMENT);
	CHECK_EQ(registerLocalMemory(NULL, src, 1, "cpu:0", 1), ERR_INVALID_ARGUMENT);
	CHECK_EQ(unregisterLocalMemory(NULL, src), ERR_INVALID_ARGUMENT);
	CHECK_EQ(registerLocalMemoryBatch(NULL, &be, 1, "cpu:0"), ERR_INVALID_ARGUMENT);
	CHECK_EQ(unregisterLocalMemoryBatch(NULL, addrs, 1), ERR_INVALID_ARGUMENT);
	CHECK(allocateBatchID(NULL, 1) == INVALID_BATCH);
	CHECK_EQ(submitTransfer(NULL, 1, &r, 1), MC_STATUS_CODE_INVALID_ARGUMENT);
	CHECK_EQ(submitTransferWithNotify(NULL, 1, &r, 1, m), MC_STATUS_CODE_INVALID_ARGUMENT);
	CHECK_EQ(getTransferStatus(NULL, 1, 0, &st), MC_STATUS_CODE_INVALID_ARGUMENT);
	CHECK_EQ(freeBatchID(NULL, 1), MC_STATUS_CODE_INVALID_ARGUMENT);
	CHECK(getNotifsFromEngine(NULL, &n) == NULL);
	CHECK_EQ(n, 0);
	CHECK_EQ(syncSegmentCache(NULL), ERR_INVALID_ARGUMENT);
	CHECK_EQ(discoverTopology(NULL), ERR_INVALID_ARGUMENT);
	CHECK_EQ(warmupEfaSegment(NULL, name_b), ERR_INVALID_ARGUMENT);
	CHECK_EQ(showLinks(NULL, buf, sizeof buf, 0), ERR_INVALID_ARGUMENT);
	enableGracefulShutdown(NULL);
	destroyTransferEngine(NULL);
}

static void test_batch_registration(void)
{
	unsigned char *p = malloc(3 * 65536);
	REQUIRE(p != NULL);
	buffer_entry_t list[3] = { { p, 65536 }, { p + 65536, 65536 }, { p + 2 * 65536, 65536 } };
	void *addrs[3] = { p, p + 65536, p + 2 * 65536 };
	int state;

	/* two entries overlapping: refused, and nothing stays registered */
	buffer_entry_t bad[2] = { { p, 65536 }, { p + 100, 65536 } };
	CHECK_EQ(registerLocalMemoryBatch(A, bad, 2, "cpu:0"), ERR_ADDRESS_OVERLAPPED);
	CHECK_EQ(unregisterLocalMemory(A, p), ERR_ADDRESS_NOT_REGISTERED);
	buffer_entry_t zero[1] = { { p, 0 } };
	CHECK_EQ(registerLocalMemoryBatch(A, zero, 1, "cpu:0"), ERR_INVALID_ARGUMENT);
	CHECK_EQ(registerLocalMemoryBatch(A, NULL, 1, "cpu:0"), ERR_INVALID_ARGUMENT);
	CHECK_EQ(registerLocalMemoryBatch(A, list, 0, "cpu:0"), 0);

	CHECK_EQ(registerLocalMemoryBatch(A, list, 3, "cpu:0"), 0);
	CHECK_EQ(registerLocalMemoryBatch(A, list + 1, 1, "cpu:0"), ERR_ADDRESS_OVERLAPPED);
	/* each buffer is usable as a source */
	for (int i = 0; i < 3; i++) {
		fill(p + i * 65536, 65536, 10 + (unsigned)i);
		CHECK_EQ(transfer_one(A, OPCODE_WRITE, p + i * 65536, seg_b,
				      (uint64_t)(uintptr_t)(tbuf + i * 65536), 65536, &state), 0);
		CHECK_EQ(state, STATUS_COMPLETED);
		CHECK(matches(tbuf + i * 65536, 65536, 10 + (unsigned)i));
	}
	/* all or nothing: one unknown address, nothing unregistered */
	void *partly[2] = { p, src + 1 };
	CHECK_EQ(unregisterLocalMemoryBatch(A, partly, 2), ERR_ADDRESS_NOT_REGISTERED);
	CHECK_EQ(unregisterLocalMemoryBatch(A, addrs, 3), 0);
	CHECK_EQ(unregisterLocalMemoryBatch(A, addrs, 3), ERR_ADDRESS_NOT_REGISTERED);
	CHECK_EQ(unregisterLocalMemoryBatch(A, NULL, 1), ERR_INVALID_ARGUMENT);
	CHECK_EQ(unregisterLocalMemoryBatch(A, addrs, 0), 0);
	CHECK_EQ(transfer_one(A, OPCODE_WRITE, p, seg_b, (uint64_t)(uintptr_t)tbuf, 64, &state),
		 MC_STATUS_CODE_ADDRESS_NOT_REGISTERED);
	free(p);
}

/* Four threads submit into one shared batch at once. */
struct submitter {
	batch_id_t batch;
	int index;
	int rc;
};

#define PER_THREAD 16
#define CHUNK 4096

static void *submit_thread(void *arg)
{
	struct submitter *s = arg;
	s->rc = 0;
	for (int i = 0; i < PER_THREAD; i++) {
		size_t at = ((size_t)s->index * PER_THREAD + (size_t)i) * CHUNK;
		transfer_request_t r = { OPCODE_WRITE, src + at, seg_b,
					 (uint64_t)(uintptr_t)(tbuf + at), CHUNK };
		int rc = submitTransfer(A, s->batch, &r, 1);
		if (rc != 0 && s->rc == 0)
			s->rc = rc;
	}
	return NULL;
}

static void test_threads(void)
{
	enum { T = 4 };
	pthread_t th[T];
	struct submitter s[T];
	batch_id_t b = allocateBatchID(A, T * PER_THREAD);
	REQUIRE(b != INVALID_BATCH);
	fill(src, T * PER_THREAD * CHUNK, 20);
	memset(tbuf, 0, T * PER_THREAD * CHUNK);
	for (int i = 0; i < T; i++) {
		s[i] = (struct submitter){ b, i, -1 };
		REQUIRE(pthread_create(&th[i], NULL, submit_thread, &s[i]) == 0);
	}
	for (int i = 0; i < T; i++) {
		pthread_join(th[i], NULL);
		CHECK_EQ(s[i].rc, 0);
	}
	CHECK_EQ(wait_tasks(A, b, T * PER_THREAD), STATUS_COMPLETED);
	CHECK(matches(tbuf, T * PER_THREAD * CHUNK, 20));
	transfer_request_t r = { OPCODE_WRITE, src, seg_b, (uint64_t)(uintptr_t)tbuf, 1 };
	CHECK_EQ(submitTransfer(A, b, &r, 1), MC_STATUS_CODE_TOO_MANY_REQUESTS);
	CHECK_EQ(freeBatchID(A, b), 0);
}

static void test_transports(void)
{
	int state;
	char buf[8192], small[8];

	CHECK(installTransport(A, "nosuchtransport", NULL) == NULL);
	CHECK(installTransport(A, NULL, NULL) == NULL);
	CHECK(installTransport(A, "", NULL) == NULL);

	/* without its transport the segment cannot be reached */
	CHECK_EQ(uninstallTransport(A, "tcp"), 0);
	CHECK_EQ(uninstallTransport(A, "tcp"), 0); /* not installed: nothing to do */
	CHECK_EQ(uninstallTransport(A, NULL), ERR_INVALID_ARGUMENT);
	CHECK_EQ(transfer_one(A, OPCODE_WRITE, src, seg_b, (uint64_t)(uintptr_t)tbuf, 64, &state),
		 MC_STATUS_CODE_NOT_SUPPORTED_TRANSPORT);
	CHECK_EQ(state, STATUS_INVALID);
	void *args[] = { NULL };
	CHECK(installTransport(A, "tcp", args) == tcp_a); /* the handle survives */
	fill(src, 4096, 30);
	CHECK_EQ(transfer_one(A, OPCODE_WRITE, src, seg_b, (uint64_t)(uintptr_t)tbuf, 4096, &state), 0);
	CHECK_EQ(state, STATUS_COMPLETED);
	CHECK(matches(tbuf, 4096, 30));

	CHECK_EQ(discoverTopology(A), 0);
	CHECK_EQ(warmupEfaSegment(A, name_b), 0);

	CHECK_EQ(showLinks(A, buf, sizeof buf, 1), 0);
	CHECK(strncmp(buf, "{\"segment\":\"127.0.0.1:", 22) == 0);
	CHECK(strstr(buf, "{\"name\":\"tcp\",\"report\":\"") != NULL);
	CHECK(strlen(buf) >= 2 && strcmp(buf + strlen(buf) - 2, "]}") == 0);
	CHECK_EQ(showLinks(A, buf, sizeof buf, 0), 0);
	CHECK(strstr(buf, "transport tcp:") != NULL);
	CHECK(strstr(buf, name_a) != NULL);
	CHECK_EQ(showLinks(A, small, sizeof small, 1), 0);
	CHECK_EQ(strlen(small), sizeof small - 1);
	CHECK_EQ(showLinks(A, NULL, 10, 1), ERR_INVALID_ARGUMENT);
	CHECK_EQ(showLinks(A, buf, 0, 1), ERR_INVALID_ARGUMENT);
}

/* The segment cache: what the peer registers or unregisters later is seen
 * after syncSegmentCache, openSegmentNoCache, or removeLocalSegment and a new
 * openSegment. */
static void test_segment_cache(void)
{
	enum { R = 65536 };
	unsigned char *r1 = malloc(R), *r2 = malloc(R), *r3 = malloc(R), *r4 = malloc(R);
	int state;
	REQUIRE(r1 && r2 && r3 && r4);

	CHECK_EQ(registerLocalMemory(B, r1, R, "cpu:0", 1), 0);
	CHECK_EQ(registerLocalMemory(B, r2, R, "cpu:0", 1), 0);
	CHECK_EQ(syncSegmentCache(A), 0);
	fill(src, R, 40);
	CHECK_EQ(transfer_one(A, OPCODE_WRITE, src, seg_b, (uint64_t)(uintptr_t)r1, R, &state), 0);
	CHECK_EQ(state, STATUS_COMPLETED);
	CHECK(matches(r1, R, 40));

	/* Unregistered by the peer, still in A's cached descriptor: the request
	 * starts and the peer refuses it. */
	CHECK_EQ(unregisterLocalMemory(B, r1), 0);
	CHECK_EQ(transfer_one(A, OPCODE_WRITE, src, seg_b, (uint64_t)(uintptr_t)r1, R, &state), 0);
	CHECK_EQ(state, STATUS_FAILED);
	/* after syncSegmentCache the descriptor no longer lists it: refused at
	 * submit */
	CHECK_EQ(unregisterLocalMemory(B, r2), 0);
	CHECK_EQ(syncSegmentCache(A), 0);
	CHECK_EQ(transfer_one(A, OPCODE_WRITE, src, seg_b, (uint64_t)(uintptr_t)r2, R, &state),
		 MC_STATUS_CODE_ADDRESS_NOT_REGISTERED);
	CHECK_EQ(state, STATUS_INVALID);

	/* openSegmentNoCache: same id, fresh descriptor */
	CHECK_EQ(registerLocalMemory(B, r3, R, "cpu:0", 1), 0);
	CHECK_EQ(openSegmentNoCache(A, name_b), seg_b);
	fill(src, R, 41);
	CHECK_EQ(transfer_one(A, OPCODE_WRITE, src, seg_b, (uint64_t)(uintptr_t)r3, R, &state), 0);
	CHECK_EQ(state, STATUS_COMPLETED);
	CHECK(matches(r3, R, 41));

	/* closeSegment is accepted without effect: the id stays usable */
	CHECK_EQ(closeSegment(A, seg_b), 0);
	CHECK_EQ(closeSegment(A, -3), ERR_INVALID_ARGUMENT);
	CHECK_EQ(transfer_one(A, OPCODE_WRITE, src, seg_b, (uint64_t)(uintptr_t)r3, 64, &state), 0);
	CHECK_EQ(state, STATUS_COMPLETED);

	/* removeLocalSegment: the old id is gone, a new open fetches anew */
	CHECK_EQ(removeLocalSegment(A, name_b), 0);
	CHECK_EQ(transfer_one(A, OPCODE_WRITE, src, seg_b, (uint64_t)(uintptr_t)r3, 64, &state),
		 MC_STATUS_CODE_INVALID_ARGUMENT);
	CHECK_EQ(registerLocalMemory(B, r4, R, "cpu:0", 1), 0);
	segment_id_t again = openSegment(A, name_b);
	CHECK(again > 0 && again != seg_b);
	seg_b = again;
	fill(src, R, 42);
	CHECK_EQ(transfer_one(A, OPCODE_WRITE, src, seg_b, (uint64_t)(uintptr_t)r4, R, &state), 0);
	CHECK_EQ(state, STATUS_COMPLETED);
	CHECK(matches(r4, R, 42));
	CHECK_EQ(removeLocalSegment(A, "127.0.0.1:2"), 0); /* never opened */
	CHECK_EQ(removeLocalSegment(A, ""), ERR_INVALID_ARGUMENT);
	CHECK_EQ(removeLocalSegment(A, NULL), ERR_INVALID_ARGUMENT);
	CHECK_EQ(removeLocalSegment(A, name_a), 0); /* own segment left alone */
	CHECK_EQ(openSegment(A, name_a), LOCAL_SEGMENT);
	CHECK_EQ(openSegmentNoCache(A, name_a), LOCAL_SEGMENT);
	CHECK_EQ(openSegmentNoCache(A, "127.0.0.1:1"), ERR_INVALID_ARGUMENT);

	CHECK_EQ(unregisterLocalMemory(B, r3), 0);
	CHECK_EQ(unregisterLocalMemory(B, r4), 0);
	free(r1);
	free(r2);
	free(r3);
	free(r4);
}

/* Takes e's notifications at once (they arrive before the sender's transfer
 * reads done) and checks there is one, from whom and what. */
static void expect_notify(transfer_engine_t e, const char *name, const char *msg)
{
	char got_name[64] = "", got_msg[64] = "";

	CHECK_EQ(take_notify(e, got_name, sizeof got_name, got_msg, sizeof got_msg), 1);
	CHECK(strcmp(got_name, name) == 0);
	CHECK(strcmp(got_msg, msg) == 0);
}

/* Polls every task of b until none is WAITING or PENDING and requires all
 * COMPLETED, one getTransferStatus per task as NIXL's checkXfer does. */
static void expect_done(transfer_engine_t e, batch_id_t b, size_t n)
{
	CHECK_EQ(wait_tasks(e, b, n), STATUS_COMPLETED);
	for (size_t i = 0; i < n; i++) {
		transfer_status_t st;
		CHECK_EQ(getTransferStatus(e, b, i, &st), 0);
		CHECK_EQ(st.status, STATUS_COMPLETED);
	}
}

/* The calls NIXL's Mooncake backend makes, in its order and with its
 * arguments: engines made with an empty ip_or_host_name and auto discovery
 * and never given a transport by hand, the peer named by the string
 * getLocalIpAndPort wrote into 64 bytes, memory registered as "*", one batch
 * of 1024 tasks per posted transfer, a notification naming the sending agent
 * (which the receiver reports as the remote agent), a transfer of more
 * descriptors than the batch holds refused whole, and transfers to the
 * engine's own name (NIXL's transfers inside one agent). */
static void test_nixl_calls(void)
{
	enum { DESCS = 64, DESC = 4096, LEN = DESCS * DESC, MAX_REQS = 1024 };
	static transfer_request_t reqs[MAX_REQS + 1];
	transfer_engine_t n1, n2;
	char conn1[64], conn2[64];
	unsigned char *b1, *b2;
	segment_id_t to2, self;
	batch_id_t b;
	int count = -1;

	n1 = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
	n2 = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
	REQUIRE(n1 != NULL && n2 != NULL);
	CHECK_EQ(getLocalIpAndPort(n1, conn1, sizeof conn1), 0);
	CHECK_EQ(getLocalIpAndPort(n2, conn2, sizeof conn2), 0);
	CHECK(strncmp(conn2, "127.0.0.1:", 10) == 0);
	b1 = calloc(1, 2 * LEN);
	b2 = calloc(1, LEN);
	REQUIRE(b1 != NULL && b2 != NULL);
	CHECK_EQ(registerLocalMemory(n1, b1, 2 * LEN, "*", 1), 0);
	CHECK_EQ(registerLocalMemory(n2, b2, LEN, "*", 1), 0);
	to2 = openSegment(n1, conn2);
	CHECK(to2 > 0);

	/* WRITE with a notification: the data is there when it arrives */
	fill(b1, LEN, 11);
	for (int i = 0; i < DESCS; i++)
		reqs[i] = (transfer_request_t){ OPCODE_WRITE, b1 + i * DESC, to2,
						(uint64_t)(uintptr_t)(b2 + i * DESC), DESC };
	b = allocateBatchID(n1, MAX_REQS);
	REQUIRE(b != INVALID_BATCH);
	notify_msg_t notif = { (char *)"Agent1", (char *)"test" };
	CHECK_EQ(submitTransferWithNotify(n1, b, reqs, DESCS, notif), 0);
	expect_done(n1, b, DESCS);
	expect_notify(n2, "Agent1", "test");
	CHECK(matches(b2, LEN, 11));
	CHECK_EQ(freeBatchID(n1, b), 0);

	/* NIXL's checkXfer spins on getTransferStatus and its peer acts on the
	 * notification: once the last task reads COMPLETED the notification is
	 * in the peer's queue, and successive ones come in order. */
	for (int round = 0; round < 100; round++) {
		char want[16];
		transfer_status_t st;
		long long until = now_ms() + 20000;

		snprintf(want, sizeof want, "n%d", round);
		b = allocateBatchID(n1, MAX_REQS);
		REQUIRE(b != INVALID_BATCH);
		notif.msg = want;
		CHECK_EQ(submitTransferWithNotify(n1, b, reqs, 1, notif), 0);
		do
			CHECK_EQ(getTransferStatus(n1, b, 0, &st), 0);
		while ((st.status == STATUS_WAITING || st.status == STATUS_PENDING) &&
		       now_ms() < until);
		CHECK_EQ(st.status, STATUS_COMPLETED);
		expect_notify(n2, "Agent1", want);
		CHECK_EQ(freeBatchID(n1, b), 0);
	}
	notif.msg = (char *)"test";

	/* READ back into the second half, with a notification to the target */
	for (int i = 0; i < DESCS; i++) {
		reqs[i].opcode = OPCODE_READ;
		reqs[i].source = b1 + LEN + i * DESC;
	}
	b = allocateBatchID(n1, MAX_REQS);
	REQUIRE(b != INVALID_BATCH);
	notif.msg = (char *)"read-done";
	CHECK_EQ(submitTransferWithNotify(n1, b, reqs, DESCS, notif), 0);
	expect_done(n1, b, DESCS);
	CHECK(memcmp(b1 + LEN, b1, LEN) == 0);
	expect_notify(n2, "Agent1", "read-done");
	CHECK_EQ(freeBatchID(n1, b), 0);

	/* genNotif: a notification alone, answered from the other side */
	to2 = openSegment(n1, conn2); /* loadRemoteConnInfo again: same id */
	CHECK(to2 > 0);
	notif = (notify_msg_t){ (char *)"Agent1", (char *)"gen" };
	CHECK_EQ(genNotifyInEngine(n1, (uint64_t)to2, notif), 0);
	expect_notify(n2, "Agent1", "gen");
	segment_id_t to1 = openSegment(n2, conn1);
	CHECK(to1 > 0);
	notif = (notify_msg_t){ (char *)"Agent2", (char *)"back" };
	CHECK_EQ(genNotifyInEngine(n2, (uint64_t)to1, notif), 0);
	expect_notify(n1, "Agent2", "back");

	/* more descriptors than a batch holds: refused whole, nothing sent
	 * (8 bytes each, to places of their own: the tasks run in parallel) */
	for (int i = 0; i <= MAX_REQS; i++)
		reqs[i] = (transfer_request_t){ OPCODE_WRITE, b1 + i * 8, to2,
						(uint64_t)(uintptr_t)(b2 + i * 8), 8 };
	b = allocateBatchID(n1, MAX_REQS);
	REQUIRE(b != INVALID_BATCH);
	notif = (notify_msg_t){ (char *)"Agent1", (char *)"too-many" };
	CHECK_EQ(submitTransferWithNotify(n1, b, reqs, MAX_REQS + 1, notif),
		 MC_STATUS_CODE_TOO_MANY_REQUESTS);
	memset(b2, 0, MAX_REQS * 8);
	CHECK_EQ(submitTransferWithNotify(n1, b, reqs, MAX_REQS, notif), 0);
	expect_done(n1, b, MAX_REQS);
	CHECK(memcmp(b2, b1, MAX_REQS * 8) == 0);
	expect_notify(n2, "Agent1", "too-many");
	CHECK_EQ(freeBatchID(n1, b), 0);
	sleep_ms(50);
	CHECK(getNotifsFromEngine(n2, &count) == NULL); /* exactly one came */
	CHECK_EQ(count, 0);
	CHECK_EQ(freeNotifsMsgBuf(NULL, count), 0);

	/* inside one agent: the engine's own name is its local segment */
	self = openSegment(n1, conn1);
	CHECK_EQ(self, LOCAL_SEGMENT);
	memset(b1 + LEN, 0, LEN);
	reqs[0] = (transfer_request_t){ OPCODE_WRITE, b1, self,
					(uint64_t)(uintptr_t)(b1 + LEN), LEN };
	b = allocateBatchID(n1, MAX_REQS);
	REQUIRE(b != INVALID_BATCH);
	notif = (notify_msg_t){ (char *)"Agent1", (char *)"local" };
	CHECK_EQ(submitTransferWithNotify(n1, b, reqs, 1, notif), 0);
	expect_done(n1, b, 1);
	CHECK(memcmp(b1 + LEN, b1, LEN) == 0);
	expect_notify(n1, "Agent1", "local");
	CHECK_EQ(freeBatchID(n1, b), 0);

	mc_engine_down(n1, b1);
	mc_engine_down(n2, b2);
	free(b1);
	free(b2);
}

static void run_in_process(void)
{
	TEST_RUN(test_create);
	TEST_RUN(test_local_ip_and_port);
	TEST_RUN(test_register);
	TEST_RUN(test_open_segment);
	TEST_RUN(test_write_read);
	TEST_RUN(test_local_segment);
	TEST_RUN(test_notify);
	TEST_RUN(test_submit_errors);
	TEST_RUN(test_null_engine);
	TEST_RUN(test_batch_registration);
	TEST_RUN(test_threads);
	TEST_RUN(test_transports);
	TEST_RUN(test_segment_cache);
	TEST_RUN(test_nixl_calls);
	destroyTransferEngine(A);
	destroyTransferEngine(B);
	free(src);
	free(dst);
	free(tbuf);
}

/* ------------------------------------------------------- in two processes */

/* The target runs in a child process and answers commands on a pipe. */
struct cmd {
	char op; /* 'v' verify, 'z' all zero, 'f' fill, 'n' wait for a notification, 'q' quit */
	uint64_t off, len;
	unsigned seed;
	char name[64], msg[64];
};

#define TARGET_BUF (32u << 20)
#define INIT_BUF (16u << 20)

static int child_main(int in, int out)
{
	transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 0);
	unsigned char *buf = malloc(TARGET_BUF);
	char hello[256];
	struct cmd c;

	if (e == NULL || buf == NULL || installTransport(e, "tcp", NULL) == NULL ||
	    registerLocalMemory(e, buf, TARGET_BUF, "cpu:0", 1) != 0)
		return 2;
	memset(buf, 0, TARGET_BUF);
	char name[128];
	getLocalIpAndPort(e, name, sizeof name);
	snprintf(hello, sizeof hello, "%s %llu", name, (unsigned long long)(uintptr_t)buf);
	if (write(out, hello, sizeof hello) != (ssize_t)sizeof hello)
		return 3;
	while (read(in, &c, sizeof c) == (ssize_t)sizeof c) {
		int reply = 0;
		if (c.op == 'q')
			break;
		if (c.off + c.len > TARGET_BUF)
			reply = 0;
		else if (c.op == 'v')
			reply = matches(buf + c.off, c.len, c.seed);
		else if (c.op == 'z') {
			reply = 1;
			for (uint64_t i = 0; i < c.len; i++)
				reply &= buf[c.off + i] == 0;
		} else if (c.op == 'f')
			fill(buf + c.off, c.len, c.seed), reply = 1;
		else if (c.op == 'n') {
			char n[64], m[64];
			reply = wait_notify(e, n, sizeof n, m, sizeof m) == 1 && strcmp(n, c.name) == 0 &&
				strcmp(m, c.msg) == 0;
		}
		if (write(out, &reply, sizeof reply) != (ssize_t)sizeof reply)
			return 4;
	}
	destroyTransferEngine(e);
	free(buf);
	return 0;
}

static int to_child, from_child;

static int ask(char op, uint64_t off, uint64_t len, unsigned seed, const char *name, const char *msg)
{
	struct cmd c;
	int reply = -1;
	memset(&c, 0, sizeof c);
	c.op = op;
	c.off = off;
	c.len = len;
	c.seed = seed;
	snprintf(c.name, sizeof c.name, "%s", name ? name : "");
	snprintf(c.msg, sizeof c.msg, "%s", msg ? msg : "");
	REQUIRE(write(to_child, &c, sizeof c) == (ssize_t)sizeof c);
	if (op != 'q')
		REQUIRE(read(from_child, &reply, sizeof reply) == (ssize_t)sizeof reply);
	return reply;
}

/* Stops the child and returns once it is stopped (kill() alone returns
 * before the signal takes effect). */
static void stop_child(pid_t pid)
{
	int st;
	REQUIRE(kill(pid, SIGSTOP) == 0);
	REQUIRE(waitpid(pid, &st, WUNTRACED) == pid && WIFSTOPPED(st));
}

struct resume {
	pid_t pid;
	long after_ms;
};

static void *resume_later(void *arg)
{
	struct resume *r = arg;
	sleep_ms(r->after_ms);
	kill(r->pid, SIGCONT);
	return NULL;
}

/* An initiator engine in this process, opened on the child's segment. */
static transfer_engine_t initiator(const char *peer, segment_id_t *seg, unsigned char *mem)
{
	transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", NULL, 0, 0);
	REQUIRE(e != NULL);
	REQUIRE(installTransport(e, "tcp", NULL) != NULL);
	REQUIRE(registerLocalMemory(e, mem, INIT_BUF, "cpu:0", 0) == 0);
	*seg = openSegment(e, peer);
	REQUIRE(*seg > 0);
	return e;
}

static void run_two_processes(void)
{
	/* Bounds what one peer has on the wire (below) on machines with many
	 * cores; a program may set libte's options in the environment. */
	setenv("TE_TCP_CONNS_PER_PEER", "2", 1);
	setenv("TE_TCP_WINDOW", "2097152", 1);
	int down[2], up[2], status;
	char hello[256], peer[128];
	unsigned long long remote;
	unsigned char *mem = malloc(INIT_BUF);
	segment_id_t seg;
	int state;

	REQUIRE(mem != NULL);
	REQUIRE(pipe(down) == 0 && pipe(up) == 0);
	pid_t pid = fork();
	REQUIRE(pid >= 0);
	if (pid == 0) {
		close(down[1]);
		close(up[0]);
		_exit(child_main(down[0], up[1]));
	}
	close(down[0]);
	close(up[1]);
	to_child = down[1];
	from_child = up[0];
	REQUIRE(read(from_child, hello, sizeof hello) == (ssize_t)sizeof hello);
	REQUIRE(sscanf(hello, "%127s %llu", peer, &remote) == 2);

	/* data both ways */
	transfer_engine_t e = initiator(peer, &seg, mem);
	fill(mem, 3u << 20, 50);
	CHECK_EQ(transfer_one(e, OPCODE_WRITE, mem, seg, remote + 4096, 3u << 20, &state), 0);
	CHECK_EQ(state, STATUS_COMPLETED);
	CHECK_EQ(ask('v', 4096, 3u << 20, 50, NULL, NULL), 1);
	CHECK_EQ(ask('f', 8u << 20, 1u << 20, 51, NULL, NULL), 1);
	memset(mem, 0, 1u << 20);
	CHECK_EQ(transfer_one(e, OPCODE_READ, mem, seg, remote + (8u << 20), 1u << 20, &state), 0);
	CHECK_EQ(state, STATUS_COMPLETED);
	CHECK(matches(mem, 1u << 20, 51));

	/* a notification across processes */
	notify_msg_t m = { (char *)"far-sender", (char *)"across" };
	CHECK_EQ(genNotifyInEngine(e, (uint64_t)seg, m), 0);
	CHECK_EQ(ask('n', 0, 0, 0, "far-sender", "across"), 1);

	/* A stopped peer holds the write in flight: freeing the batch is
	 * refused while it is. */
	fill(mem, 65536, 52);
	transfer_request_t r = { OPCODE_WRITE, mem, seg, remote, 65536 };
	batch_id_t b = allocateBatchID(e, 1);
	REQUIRE(b != INVALID_BATCH);
	stop_child(pid);
	CHECK_EQ(submitTransfer(e, b, &r, 1), 0);
	sleep_ms(50);
	transfer_status_t st;
	CHECK_EQ(getTransferStatus(e, b, 0, &st), 0);
	if (st.status != STATUS_WAITING && st.status != STATUS_PENDING)
		fprintf(stderr, "state %d while the peer is stopped\n", st.status);
	CHECK(st.status == STATUS_WAITING || st.status == STATUS_PENDING);
	CHECK_EQ(freeBatchID(e, b), MC_STATUS_CODE_BATCH_BUSY);
	REQUIRE(kill(pid, SIGCONT) == 0);
	CHECK_EQ(wait_tasks(e, b, 1), STATUS_COMPLETED);
	CHECK_EQ(freeBatchID(e, b), 0);
	CHECK_EQ(ask('v', 0, 65536, 52, NULL, NULL), 1);
	destroyTransferEngine(e);

	/* A 12 MiB write to a stopped peer: two connections of a 2 MiB window
	 * each hold at most a few 1 MiB slices on the wire; the rest waits in
	 * the queue. Without enableGracefulShutdown, destroying cancels what has
	 * not started, so the tail of the range never arrives... */
	long long t0;
	pthread_t th;
	struct resume res = { pid, 300 };
	const uint64_t big = 12u << 20, at = 16u << 20;
	e = initiator(peer, &seg, mem);
	fill(mem, big, 53);
	r = (transfer_request_t){ OPCODE_WRITE, mem, seg, remote + at, big };
	b = allocateBatchID(e, 1);
	REQUIRE(b != INVALID_BATCH);
	stop_child(pid);
	CHECK_EQ(submitTransfer(e, b, &r, 1), 0);
	REQUIRE(pthread_create(&th, NULL, resume_later, &res) == 0);
	destroyTransferEngine(e);
	pthread_join(th, NULL);
	CHECK_EQ(ask('z', at + big - (4u << 20), 4u << 20, 0, NULL, NULL), 1);
	CHECK_EQ(ask('v', at, big, 53, NULL, NULL), 0);

	/* ...and with it, destroying waits until all of it has landed. */
	e = initiator(peer, &seg, mem);
	enableGracefulShutdown(e);
	fill(mem, big, 54);
	b = allocateBatchID(e, 1);
	REQUIRE(b != INVALID_BATCH);
	stop_child(pid);
	CHECK_EQ(submitTransfer(e, b, &r, 1), 0);
	res.after_ms = 400;
	REQUIRE(pthread_create(&th, NULL, resume_later, &res) == 0);
	t0 = now_ms();
	destroyTransferEngine(e);
	long long waited = now_ms() - t0;
	pthread_join(th, NULL);
	CHECK(waited >= 300);
	CHECK_EQ(ask('v', at, big, 54, NULL, NULL), 1);

	/* With MC_SLICE_TIMEOUT the tasks have a deadline: a read from the
	 * stopped child ends FAILED once it passed (TIMEOUT may show for the
	 * moment before), its batch is freed while the child is still stopped,
	 * and no byte of the child's late answer lands afterwards. */
	setenv("MC_SLICE_TIMEOUT", "1", 1);
	e = initiator(peer, &seg, mem);
	unsetenv("MC_SLICE_TIMEOUT");
	fill(mem, 1u << 20, 55);
	r = (transfer_request_t){ OPCODE_READ, mem, seg, remote, 1u << 20 };
	b = allocateBatchID(e, 1);
	REQUIRE(b != INVALID_BATCH);
	stop_child(pid);
	t0 = now_ms();
	CHECK_EQ(submitTransfer(e, b, &r, 1), 0);
	transfer_status_t ds;
	do {
		REQUIRE(getTransferStatus(e, b, 0, &ds) == 0);
		if (ds.status == STATUS_TIMEOUT)
			CHECK(now_ms() - t0 >= 1000);
		if (ds.status != STATUS_FAILED)
			sleep_ms(1);
	} while (ds.status != STATUS_FAILED && now_ms() - t0 < 5000);
	waited = now_ms() - t0;
	CHECK_EQ(ds.status, STATUS_FAILED);
	if (waited < 990 || waited > 1300)
		fprintf(stderr, "the read ended after %lld ms, want 1000\n", waited);
	CHECK(waited >= 990 && waited <= 1300);
	CHECK_EQ(freeBatchID(e, b), 0);
	REQUIRE(kill(pid, SIGCONT) == 0);
	sleep_ms(300);
	CHECK(matches(mem, 1u << 20, 55));
	destroyTransferEngine(e);

	ask('q', 0, 0, 0, NULL, NULL);
	REQUIRE(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	close(to_child);
	close(from_child);
	free(mem);
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "fork") == 0)
		TEST_RUN(run_two_processes);
	else
		run_in_process();
	return check_done();
}
