/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Two engines in one process over P2PHANDSHAKE: descriptor exchange, Probe
 * and malformed frames on the RPC socket, transfers through a transport
 * plugin (the out-of-tree example, built in-tree here), notifications,
 * in-flight behaviour (free while busy, wait timeouts, cancel, failures)
 * through the "hold" test transport, and re-routing on uninstall; a
 * transport changing a buffer's descriptor fields (buffer_fields) and telling
 * the host a transfer's keys were refused (transfer_stale).
 */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <endian.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../common/rpc-raw.h"
#include "../common/util.h"
#include "../plugins/hold.h"


static bool probe_ok(int port)
{
	char in[256];
	ssize_t r = raw_frame(port, 3, "{}", in, sizeof in);
	return r == 9 + (ssize_t)strlen("{\"status\":\"success\"}") && in[8] == 3 &&
	       strcmp(in + 9, "{\"status\":\"success\"}") == 0;
}

static void test_probe_and_bad_frames(void)
{
	te_engine *a = p2p_engine(NULL);
	REQUIRE(a != NULL);
	int port = te_engine_rpc_port(a);
	char in[65536];

	CHECK(probe_ok(port));
	/* The Metadata frame returns the descriptor, Mooncake's fields present. */
	ssize_t r = raw_frame(port, 1, "{}", in, sizeof in);
	CHECK(r > 9 && in[8] == 1);
	CHECK(strstr(in + 9, "\"name\":\"") != NULL);
	CHECK(strstr(in + 9, "\"tcp_data_port\":0") != NULL);
	CHECK(strstr(in + 9, "\"timestamp\":\"") != NULL);
	CHECK(strstr(in + 9, "\"buffers\":[]") != NULL);

	cap_start();
	uint64_t zero = 0;
	CHECK_EQ(exchange_raw(port, &zero, 8, in, sizeof in), 0);
	uint64_t huge = htole64(1ull << 40);
	CHECK_EQ(exchange_raw(port, &huge, 8, in, sizeof in), 0);
	CHECK(cap_has("claims 1099511627776 bytes"));
	const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
	CHECK_EQ(exchange_raw(port, http, strlen(http), in, sizeof in), 0);
	/* truncated: promises 100 bytes, sends 10, closes */
	unsigned char trunc[18] = { 100 };
	trunc[8] = 3;
	CHECK_EQ(exchange_raw(port, trunc, sizeof trunc, in, sizeof in), 0);
	/* Connection frame with nobody handling it, old-style (no type byte) too */
	CHECK_EQ(raw_frame(port, 0, "{}", in, sizeof in), 0);
	CHECK(cap_has("nothing handles it"));
	unsigned char old[8 + 2];
	uint64_t ol = htole64(2);
	memcpy(old, &ol, 8);
	memcpy(old + 8, "{}", 2);
	CHECK_EQ(exchange_raw(port, old, sizeof old, in, sizeof in), 0);
	/* Notify with a body that is not the right JSON */
	CHECK_EQ(raw_frame(port, 2, "[1,2]", in, sizeof in), 0);
	CHECK_EQ(raw_frame(port, 2, "{\"name\":1,\"notify_msg\":\"x\"}", in, sizeof in), 0);
	CHECK(cap_has("must be strings"));
	/* a client that connects and says nothing must not block others */
	int idle = connect_port(port);
	CHECK(idle >= 0);
	CHECK(probe_ok(port));
	close(idle);
	te_engine_destroy(a);
}

/* Random frames: valid lengths with junk bodies and junk lengths; the engine
 * answers what is well-formed, closes the rest, and stays up. */
static void test_rpc_random(void)
{
	te_engine *a = p2p_engine(NULL);
	REQUIRE(a != NULL);
	int port = te_engine_rpc_port(a);
	const char *bodies[] = { "{}", "{\"name\":\"x\",\"notify_msg\":\"y\"}", "[]", "null", "\"s\"",
				 "{\"payload\":1}", "{\"name\":\"\\u0000\",\"notify_msg\":\"\"}", "" };
	unsigned seed = 42;
	char in[65536];
	for (int i = 0; i < 200; i++) {
		unsigned char out[300];
		seed = seed * 1103515245u + 12345u;
		size_t blen;
		if (seed % 3 == 0) { /* random bytes after a random header */
			blen = 8 + (seed >> 8) % 200;
			for (size_t k = 0; k < blen; k++) {
				seed = seed * 1103515245u + 12345u;
				out[k] = (unsigned char)(seed >> 16);
			}
		} else { /* a plausible frame with some body */
			const char *b = bodies[(seed >> 4) % 8];
			size_t jl = strlen(b);
			uint64_t len = htole64(jl + 1);
			memcpy(out, &len, 8);
			out[8] = (unsigned char)((seed >> 12) % 6); /* types 0..5 */
			memcpy(out + 9, b, jl);
			blen = 9 + jl;
		}
		exchange_raw(port, out, blen, in, sizeof in);
	}
	CHECK(probe_ok(port));
	te_notification *list = NULL;
	size_t n = 0;
	CHECK_EQ(te_notify_fetch(a, &list, &n), 0);
	for (size_t i = 0; i < n; i++)
		CHECK(list[i].name != NULL && list[i].msg != NULL);
	te_notifications_free(list, n);
	te_engine_destroy(a);
}

/* ------------------------------------------------------------ transfers */

#define BUF (4u << 20)

/* Fetches e's notifications until some have come or ms have passed. */
static void fetch_within(te_engine *e, te_notification **list, size_t *n, int ms)
{
	long long end = now_ms() + ms;
	do {
		te_notify_fetch(e, list, n);
		if (*n == 0)
			usleep(10000);
	} while (*n == 0 && now_ms() < end);
}

static void test_memcpy_transfers(void)
{
	engine_pair p;
	te_task_status st;
	engine_pair_up(&p, "memcpy", BUF);

	te_segment_buffer sb[4];
	CHECK_EQ(te_segment_buffers(p.a, p.seg, sb, 4), 1);
	CHECK(sb[0].addr == (uintptr_t)p.bbuf && sb[0].length == BUF);
	CHECK_EQ(te_segment_buffers(p.a, TE_LOCAL_SEGMENT, sb, 4), 1);
	CHECK(sb[0].addr == (uintptr_t)p.abuf && strcmp(sb[0].name, "cpu:0") == 0);
	CHECK_EQ(te_segment_buffers(p.a, 999, sb, 4), TE_ERR_SEGMENT);
	CHECK_EQ(te_segment_open(p.a, te_engine_name(p.b)), p.seg); /* same id again */
	CHECK_EQ(te_segment_close(p.a, p.seg), 0);                  /* one of two closes */

	size_t sizes[] = { 1, 3, 4096, 65535, 65536, 1u << 20, BUF - 17 };
	for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
		size_t n = sizes[i], off = i * 7 % 17;
		fill_pattern(p.abuf, BUF, (unsigned)i);
		memset(p.bbuf, 0, BUF);
		CHECK_EQ(run_one(p.a, TE_OP_WRITE, p.seg, p.abuf + off, (uintptr_t)(p.bbuf + 17 - off - (off > 0)), n, &st),
			 TE_TASK_COMPLETED);
		CHECK_EQ(st.transferred, n);
		CHECK(memcmp(p.abuf + off, p.bbuf + 17 - off - (off > 0), n) == 0);
		memset(p.abuf, 0, BUF);
		CHECK_EQ(run_one(p.a, TE_OP_READ, p.seg, p.abuf + 5, (uintptr_t)(p.bbuf + 17 - off - (off > 0)), n, &st),
			 TE_TASK_COMPLETED);
		CHECK(memcmp(p.abuf + 5, p.bbuf + 17 - off - (off > 0), n) == 0);
	}
	/* b registers more memory; a's first request to it refreshes the cached
	 * descriptor by itself and goes through */
	unsigned char *more = malloc(8192), *more2 = malloc(4096);
	CHECK_EQ(te_register_memory(p.b, more, 8192, "cpu:0", TE_MEM_REMOTE_ACCESS), 0);
	memset(more, 0x5a, 8192);
	CHECK_EQ(run_one(p.a, TE_OP_READ, p.seg, p.abuf, (uintptr_t)more, 8192, &st), TE_TASK_COMPLETED);
	CHECK(p.abuf[0] == 0x5a && p.abuf[8191] == 0x5a);
	/* automatic refreshes are at most one a second per segment... */
	CHECK_EQ(te_register_memory(p.b, more2, 4096, "cpu:0", TE_MEM_REMOTE_ACCESS), 0);
	CHECK_EQ(run_one(p.a, TE_OP_READ, p.seg, p.abuf, (uintptr_t)more2, 4096, &st), TE_TASK_INVALID);
	CHECK_EQ(st.error, TE_ERR_ADDRESS);
	/* ...and an explicit one any time */
	CHECK_EQ(te_segment_refresh(p.a, p.seg), 0);
	CHECK_EQ(run_one(p.a, TE_OP_READ, p.seg, p.abuf, (uintptr_t)more2, 4096, &st), TE_TASK_COMPLETED);
	CHECK_EQ(te_unregister_memory(p.b, more), 0);
	CHECK_EQ(te_unregister_memory(p.b, more2), 0);
	free(more);
	free(more2);
	/* outside b's buffers: INVALID, named in the log */
	cap_start();
	CHECK_EQ(run_one(p.a, TE_OP_READ, p.seg, p.abuf, (uintptr_t)(p.bbuf + BUF - 10), 11, &st),
		 TE_TASK_INVALID);
	CHECK_EQ(st.error, TE_ERR_ADDRESS);
	CHECK(cap_has("outside the buffers of segment"));

	/* a batch of many requests to many offsets */
	enum { N = 512 };
	te_request reqs[N];
	fill_pattern(p.abuf, BUF, 99);
	for (int i = 0; i < N; i++)
		reqs[i] = (te_request){ TE_OP_WRITE, p.seg, p.abuf + i * 4096, (uintptr_t)(p.bbuf + (N - 1 - i) * 4096), 4096 };
	batch_complete(p.a, reqs, N, 10000);
	CHECK_EQ(ranges_differ(reqs, N), 0);

	/* a forced transport that is not installed */
	CHECK(te_segment_open_with(p.b, te_engine_name(p.a), "hold") < 0);
	engine_pair_down(&p);
}

static void test_notifications(void)
{
	engine_pair p;
	te_notification *list = NULL;
	size_t n = 0;
	engine_pair_up(&p, "hold", BUF);

	CHECK_EQ(te_notify_send(p.a, p.seg, "hello from a"), 0);
	CHECK_EQ(te_notify_fetch(p.b, &list, &n), 0);
	REQUIRE(n == 1);
	CHECK(strcmp(list[0].name, te_engine_name(p.a)) == 0);
	CHECK(strcmp(list[0].msg, "hello from a") == 0);
	te_notifications_free(list, n);

	/* attached to a batch: sent once the batch drains, not before */
	te_batch_id b;
	te_request r = { TE_OP_WRITE, p.seg, p.abuf, (uintptr_t)p.bbuf, 64 };
	REQUIRE(te_batch_alloc(p.a, 2, &b) == 0);
	CHECK_EQ(te_submit(p.a, b, &r, 1), 0);
	CHECK_EQ(te_batch_notify(p.a, b, p.seg, "batch done"), 0);
	CHECK_EQ(te_batch_notify(p.a, b, p.seg, "again"), -EBUSY);
	usleep(100000);
	CHECK_EQ(te_notify_fetch(p.b, &list, &n), 0);
	CHECK_EQ(n, 0);
	CHECK_EQ(hold_release(0), 1);
	CHECK_EQ(te_batch_wait(p.a, b, 5000), 0);
	fetch_within(p.b, &list, &n, 5000);
	REQUIRE(n == 1);
	CHECK(strcmp(list[0].msg, "batch done") == 0);
	te_notifications_free(list, n);
	CHECK_EQ(te_batch_free(p.a, b), 0);

	/* a sender name of the caller's choosing, directly and after a batch */
	CHECK_EQ(te_notify_send_as(p.a, p.seg, "agent-7", "named"), 0);
	CHECK_EQ(te_notify_fetch(p.b, &list, &n), 0);
	REQUIRE(n == 1);
	CHECK(strcmp(list[0].name, "agent-7") == 0 && strcmp(list[0].msg, "named") == 0);
	te_notifications_free(list, n);
	REQUIRE(te_batch_alloc(p.a, 1, &b) == 0);
	CHECK_EQ(te_submit(p.a, b, &r, 1), 0);
	CHECK_EQ(te_batch_notify_as(p.a, b, p.seg, "agent-8", "named batch"), 0);
	CHECK_EQ(hold_release(0), 1);
	CHECK_EQ(te_batch_wait(p.a, b, 5000), 0);
	fetch_within(p.b, &list, &n, 5000);
	REQUIRE(n == 1);
	CHECK(strcmp(list[0].name, "agent-8") == 0 && strcmp(list[0].msg, "named batch") == 0);
	te_notifications_free(list, n);
	CHECK_EQ(te_batch_free(p.a, b), 0);
	char *longname = malloc(TE_NOTIFY_MAX + 2);
	memset(longname, 'n', TE_NOTIFY_MAX + 1);
	longname[TE_NOTIFY_MAX + 1] = '\0';
	CHECK_EQ(te_notify_send_as(p.a, p.seg, longname, "x"), -EMSGSIZE);
	free(longname);
	engine_pair_down(&p);
}

/* te_segment_find, te_segment_refresh_all, te_segment_probe,
 * te_engine_address and te_last_error. */
static void test_lookup_probe(void)
{
	engine_pair p;
	engine_pair_up(&p, "memcpy", BUF);
	const char *bn = te_engine_name(p.b);

	CHECK(strcmp(te_engine_address(p.a), "127.0.0.1") == 0);
	CHECK(te_segment_transport(p.a, p.seg) != NULL && strcmp(te_segment_transport(p.a, p.seg), "memcpy") == 0);
	CHECK(strcmp(te_segment_transport(p.a, TE_LOCAL_SEGMENT), "local") == 0);
	CHECK(te_segment_transport(p.a, 999) == NULL);
	CHECK(te_segment_transport(NULL, p.seg) == NULL);
	CHECK(te_engine_address(NULL) == NULL);
	CHECK_EQ(te_segment_find(p.a, bn), p.seg);
	CHECK_EQ(te_segment_find(p.a, te_engine_name(p.a)), TE_LOCAL_SEGMENT);
	CHECK_EQ(te_segment_find(p.a, "127.0.0.1:1"), -ENOENT);
	CHECK_EQ(te_segment_find(p.a, ""), -EINVAL);
	CHECK_EQ(te_segment_find(NULL, bn), -EINVAL);

	/* b grows; refresh_all makes the new buffer visible to a */
	unsigned char *more = aligned_alloc(4096, 4096);
	CHECK_EQ(te_register_memory(p.b, more, 4096, "cpu:0", TE_MEM_REMOTE_ACCESS), 0);
	te_segment_buffer sb[4];
	CHECK_EQ(te_segment_buffers(p.a, p.seg, sb, 4), 1);
	CHECK_EQ(te_segment_refresh_all(p.a), 1);
	CHECK_EQ(te_segment_buffers(p.a, p.seg, sb, 4), 2);
	CHECK_EQ(te_unregister_memory(p.b, more), 0);
	free(more);

	char *dj = NULL;
	CHECK_EQ(te_segment_descriptor(p.a, p.seg, &dj), 0);
	CHECK(dj != NULL && strstr(dj, "\"buffers\"") != NULL && strstr(dj, bn) != NULL);
	te_free(dj);
	CHECK_EQ(te_segment_descriptor(p.b, TE_LOCAL_SEGMENT, &dj), 0);
	CHECK(dj != NULL && strstr(dj, bn) != NULL);
	te_free(dj);
	CHECK_EQ(te_segment_descriptor(p.a, 999, &dj), TE_ERR_SEGMENT);
	CHECK(dj == NULL);
	CHECK_EQ(te_segment_descriptor(p.a, p.seg, NULL), -EINVAL);

	CHECK_EQ(te_segment_probe(p.a, bn, 2000), 0);
	CHECK_EQ(te_segment_probe(p.a, te_engine_name(p.a), 2000), 0); /* itself */
	te_last_error_clear();
	CHECK(te_last_error()[0] == '\0');
	CHECK_EQ(te_segment_probe(p.a, "no-port", 2000), -EINVAL);
	CHECK(strstr(te_last_error(), "no-port") != NULL);
	te_last_error_clear();
	CHECK(te_segment_probe(p.a, "127.0.0.1:1", 2000) < 0); /* nobody listens there */
	CHECK(strstr(te_last_error(), "127.0.0.1:1") != NULL);
	CHECK(te_segment_probe(NULL, bn, 0) == -EINVAL);

	/* the error text is per thread */
	te_last_error_clear();
	CHECK_EQ(te_segment_buffers(p.a, 999, sb, 4), TE_ERR_SEGMENT);
	CHECK(strstr(te_last_error(), "unknown segment id 999") != NULL);
	engine_pair_down(&p);

	/* a closed peer: probe fails, refresh_all reports the failure */
	engine_pair_up(&p, "memcpy", BUF);
	char name[64];
	snprintf(name, sizeof name, "%s", te_engine_name(p.b));
	te_engine_destroy(p.b);
	p.b = NULL;
	CHECK(te_segment_probe(p.a, name, 1000) < 0);
	CHECK(te_segment_refresh_all(p.a) < 0);
	CHECK_EQ(te_segment_close(p.a, p.seg), 0);
	CHECK_EQ(te_segment_refresh_all(p.a), 0);
	te_engine_destroy(p.a);
	free(p.abuf);
	free(p.bbuf);
}

static void test_in_flight(void)
{
	engine_pair p;
	te_task_status st;
	te_batch_id b = engine_pair_batch(&p, "hold", BUF, 8);

	te_request r[3] = {
		{ TE_OP_WRITE, p.seg, p.abuf, (uintptr_t)p.bbuf, 100 },
		{ TE_OP_READ, p.seg, p.abuf + 100, (uintptr_t)p.bbuf + 200, 100 },
		{ TE_OP_WRITE, p.seg, p.abuf, (uintptr_t)p.bbuf, 0 }, /* zero length: done at once */
	};
	memset(p.abuf, 1, 100);
	memset(p.bbuf + 200, 2, 100);
	CHECK_EQ(te_submit(p.a, b, r, 3), 0);
	CHECK_EQ(hold_count(), 2);
	CHECK_EQ(te_get_status(p.a, b, 0, &st), 0);
	CHECK_EQ(st.state, TE_TASK_WAITING);
	CHECK_EQ(te_get_status(p.a, b, 2, &st), 0);
	CHECK_EQ(st.state, TE_TASK_COMPLETED);
	size_t infl;
	int32_t state;
	CHECK_EQ(te_batch_status(p.a, b, NULL, &infl, &state), 0);
	CHECK_EQ(infl, 2);
	CHECK_EQ(state, TE_TASK_WAITING);
	cap_start();
	CHECK_EQ(te_batch_free(p.a, b), -EBUSY);
	CHECK(cap_has("still has 2 tasks in flight"));
	long long t0 = now_ms();
	CHECK_EQ(te_batch_wait(p.a, b, 100), -ETIMEDOUT);
	CHECK(now_ms() - t0 >= 90);
	CHECK_EQ(hold_release(0), 2);
	CHECK_EQ(te_batch_wait(p.a, b, 5000), 0);
	for (int i = 0; i < 2; i++) {
		CHECK_EQ(te_get_status(p.a, b, (size_t)i, &st), 0);
		CHECK_EQ(st.state, TE_TASK_COMPLETED);
		CHECK_EQ(st.transferred, 100);
	}
	CHECK(p.bbuf[99] == 1 && p.abuf[199] == 2);

	/* failures map to FAILED and TIMEOUT with the error kept */
	CHECK_EQ(te_submit(p.a, b, r, 1), 0);
	CHECK_EQ(hold_release(-EIO), 1);
	CHECK_EQ(te_submit(p.a, b, r, 1), 0);
	CHECK_EQ(hold_release(-ETIMEDOUT), 1);
	CHECK_EQ(te_batch_wait(p.a, b, 5000), 0);
	CHECK_EQ(te_get_status(p.a, b, 3, &st), 0);
	CHECK_EQ(st.state, TE_TASK_FAILED);
	CHECK_EQ(st.error, -EIO);
	CHECK_EQ(te_get_status(p.a, b, 4, &st), 0);
	CHECK_EQ(st.state, TE_TASK_TIMEOUT);
	CHECK_EQ(te_batch_status(p.a, b, NULL, NULL, &state), 0);
	CHECK_EQ(state, TE_TASK_FAILED);
	CHECK_EQ(te_batch_free(p.a, b), 0);

	/* cancel: running tasks stop at their next slice, later ones never start */
	REQUIRE(te_batch_alloc(p.a, 8, &b) == 0);
	CHECK_EQ(te_submit(p.a, b, r, 2), 0);
	CHECK_EQ(te_batch_cancel(p.a, b), 0);
	CHECK_EQ(te_submit(p.a, b, r, 1), 0);
	CHECK_EQ(hold_count(), 2);
	CHECK_EQ(hold_release(0), 2);
	CHECK_EQ(te_batch_wait(p.a, b, 5000), 0);
	for (int i = 0; i < 3; i++) {
		CHECK_EQ(te_get_status(p.a, b, (size_t)i, &st), 0);
		CHECK_EQ(st.state, TE_TASK_CANCELED);
	}
	CHECK_EQ(te_batch_free(p.a, b), 0);
	engine_pair_down(&p);
}

static void test_uninstall_reroutes(void)
{
	engine_pair p;
	te_task_status st;
	engine_pair_up(&p, "memcpy,hold", BUF);
	/* memcpy comes first: the descriptor names it, transfers finish at once */
	CHECK_EQ(run_one(p.a, TE_OP_WRITE, p.seg, p.abuf, (uintptr_t)p.bbuf, 10, &st), TE_TASK_COMPLETED);
	CHECK_EQ(hold_count(), 0);
	CHECK_EQ(te_transport_uninstall(p.a, "memcpy"), 0);
	/* the open segment moved to "hold" */
	te_batch_id b;
	te_request r = { TE_OP_WRITE, p.seg, p.abuf, (uintptr_t)p.bbuf, 10 };
	REQUIRE(te_batch_alloc(p.a, 1, &b) == 0);
	CHECK_EQ(te_submit(p.a, b, &r, 1), 0);
	CHECK_EQ(hold_count(), 1);
	hold_release(0);
	CHECK_EQ(te_batch_wait(p.a, b, 5000), 0);
	CHECK_EQ(te_get_status(p.a, b, 0, &st), 0);
	CHECK_EQ(st.state, TE_TASK_COMPLETED);
	CHECK_EQ(te_batch_free(p.a, b), 0);
	/* with no transport left the segment cannot be served */
	CHECK_EQ(te_transport_uninstall(p.a, "hold"), 0);
	CHECK_EQ(run_one(p.a, TE_OP_WRITE, p.seg, p.abuf, (uintptr_t)p.bbuf, 10, &st), TE_TASK_INVALID);
	CHECK_EQ(st.error, TE_ERR_NO_TRANSPORT);
	CHECK_EQ(te_transport_install(p.a, "memcpy", NULL), 0);
	CHECK_EQ(te_segment_refresh(p.a, p.seg), 0);
	CHECK_EQ(run_one(p.a, TE_OP_WRITE, p.seg, p.abuf, (uintptr_t)p.bbuf, 10, &st), TE_TASK_COMPLETED);
	engine_pair_down(&p);
}

/* Whether the descriptor of `seg` as `e` last fetched it holds `needle`. */
static bool desc_has(te_engine *e, te_segment_id seg, const char *needle)
{
	char *json = NULL;
	bool has = te_segment_descriptor(e, seg, &json) == 0 && strstr(json, needle) != NULL;
	free(json);
	return has;
}

/* B's transport gives its buffer new fields: B publishes them by itself;
 * A, holding the old descriptor, fetches it again when its transport says a
 * transfer's keys were refused, without te_segment_refresh(). Bad calls are
 * refused with a code and a line. */
static void test_fields_and_stale(void)
{
	engine_pair p;
	te_batch_id b;
	engine_pair_up(&p, "hold", BUF);
	const char *bname = te_engine_name(p.b);

	CHECK(desc_has(p.a, p.seg, "\"hold_gen\":0"));
	cap_start();
	CHECK_EQ(hold_fields(bname, p.bbuf + 1, "{\"hold_gen\":1}"), -ENOENT);
	CHECK(cap_has("which is not registered"));
	CHECK_EQ(hold_fields(bname, p.bbuf, "[1]"), -EINVAL);
	CHECK_EQ(hold_fields(bname, p.bbuf, "{\"hold_gen\":"), -EINVAL);
	/* Deeper than the descriptor's bound (te-json.h): refused before parsing. */
	char deep[512];
	size_t dl = (size_t)snprintf(deep, sizeof deep, "{\"d\":");
	for (int i = 0; i < 100; i++)
		deep[dl++] = '[';
	for (int i = 0; i < 100; i++)
		deep[dl++] = ']';
	deep[dl++] = '}';
	deep[dl] = '\0';
	CHECK_EQ(hold_fields(bname, p.bbuf, deep), -EINVAL);
	CHECK(cap_has("deep"));
	CHECK_EQ(hold_fields(bname, NULL, "{}"), -EINVAL);
	CHECK_EQ(hold_fields(bname, p.bbuf, NULL), -EINVAL);
	CHECK(cap_has("not a JSON object"));
	CHECK(cap_has("is NULL"));

	CHECK_EQ(hold_fields(bname, p.bbuf, "{\"hold_gen\":1}"), 0);
	CHECK(WAIT_FOR(desc_has(p.b, TE_LOCAL_SEGMENT, "\"hold_gen\":1"), 5000)); /* published */
	usleep(200000);
	CHECK(desc_has(p.a, p.seg, "\"hold_gen\":0")); /* A did not look again on its own */

	te_request r = { TE_OP_WRITE, p.seg, p.abuf, (uintptr_t)p.bbuf, 100 };
	REQUIRE(te_batch_alloc(p.a, 4, &b) == 0);
	CHECK_EQ(te_submit(p.a, b, &r, 1), 0);
	CHECK_EQ(hold_count(), 1);
	CHECK_EQ(hold_stale(), 0);
	CHECK(WAIT_FOR(desc_has(p.a, p.seg, "\"hold_gen\":1"), 5000));
	CHECK_EQ(hold_release(0), 1);
	CHECK_EQ(te_batch_wait(p.a, b, 5000), 0);
	CHECK_EQ(te_batch_free(p.a, b), 0);
	engine_pair_down(&p);
}

static void test_unreachable_peer(void)
{
	te_engine *a = p2p_engine("memcpy"), *b = p2p_engine("memcpy");
	REQUIRE(a && b);
	char name[64];
	snprintf(name, sizeof name, "%s", te_engine_name(b));
	te_engine_destroy(b);
	CHECK(te_segment_open(a, name) < 0);
	te_engine_destroy(a);
}

int main(void)
{
	hold_find();
	TEST_RUN(test_probe_and_bad_frames);
	TEST_RUN(test_rpc_random);
	TEST_RUN(test_memcpy_transfers);
	TEST_RUN(test_notifications);
	TEST_RUN(test_lookup_probe);
	TEST_RUN(test_in_flight);
	TEST_RUN(test_uninstall_reroutes);
	TEST_RUN(test_fields_and_stale);
	TEST_RUN(test_unreachable_peer);
	return check_done();
}
