/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The metrics (docs/metrics.md): exact counts after known transfers over
 * TCP, shm and local copies, a refused request, a cancel; the Prometheus
 * exposition parsed back (families, cumulative buckets, label escaping,
 * promtool when installed); the peer series bounded with 10,000 peers, and
 * the busiest of them shown, every series monotonic across the re-ranking;
 * device counters from the "hold" test transport; TE_METRICS=0; the size
 * versioning of te_stats; reading while other threads submit.
 */
#include <dlfcn.h>
#include <glib.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "../common/rpc-raw.h"
#include "../common/util.h"
#include "metric-util.h"
#include "../plugins/hold.h"

#define BUF (1u << 20)


static bool have_transport(const char *name)
{
	te_engine *e = p2p_engine(name);
	if (e == NULL)
		return false;
	te_engine_destroy(e);
	return true;
}

static char *text_of(te_engine *e)
{
	char *t = NULL;
	size_t len = 0;
	CHECK_EQ(te_metrics_text(e, &t, &len), 0);
	REQUIRE(t != NULL);
	CHECK_EQ(strlen(t), len);
	return t;
}

/* The value of the sample whose line starts with `prefix` (name and labels
 * up to the closing brace), or -1 when no line does. */
static long long sample_of(const char *text, const char *prefix)
{
	size_t n = strlen(prefix);
	for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
		if (strncmp(l, prefix, n) == 0 && l[n] == ' ')
			return atoll(l + n + 1);
	return -1;
}

static long long metric(const char *text, const char *name, const char *segment, const char *labels)
{
	char prefix[1024];
	snprintf(prefix, sizeof prefix, "%s{segment=\"%s\"%s%s}", name, segment, labels[0] ? "," : "",
		 labels);
	return sample_of(text, prefix);
}

static int count_lines(const char *text, const char *prefix);

static te_stats stats_of(te_engine *e)
{
	te_stats s = { .size = sizeof s };
	CHECK_EQ(te_engine_stats(e, &s), 0);
	return s;
}

/* Known transfers over `transport`, then every count. */
static void known_transfers(const char *transport)
{
	engine_pair p;
	char lbl[256];

	engine_pair_up(&p, transport, BUF);
	const char *an = te_engine_name(p.a), *bn = te_engine_name(p.b);
	/* three writes of 4 KiB, two reads of 8 KiB, one local copy (a read of
	 * 1000 bytes), one write outside the peer's buffers (refused), one empty
	 * write (done at submit, counted as a request of its own) */
	for (int i = 0; i < 3; i++)
		CHECK_EQ(run_one(p.a, TE_OP_WRITE, p.seg, p.abuf + 4096 * i, (uintptr_t)p.bbuf + 4096 * i, 4096, NULL),
			 TE_TASK_COMPLETED);
	for (int i = 0; i < 2; i++)
		CHECK_EQ(run_one(p.a, TE_OP_READ, p.seg, p.abuf + 65536, (uintptr_t)p.bbuf + 8192 * i, 8192, NULL),
			 TE_TASK_COMPLETED);
	CHECK_EQ(run_one(p.a, TE_OP_READ, TE_LOCAL_SEGMENT, p.abuf, (uintptr_t)p.abuf + 200000, 1000, NULL),
		 TE_TASK_COMPLETED);
	CHECK_EQ(run_one(p.a, TE_OP_WRITE, p.seg, p.abuf, (uintptr_t)p.bbuf + BUF, 4096, NULL), TE_TASK_INVALID);
	CHECK_EQ(run_one(p.a, TE_OP_WRITE, p.seg, p.abuf, (uintptr_t)p.bbuf, 0, NULL), TE_TASK_COMPLETED);

	te_stats s = stats_of(p.a);
	check_op_counts("a", &s, TE_OP_READ, 3, 3, 0, 2 * 8192 + 1000);
	check_op_counts("a", &s, TE_OP_WRITE, 5, 4, 1, 3 * 4096);
	CHECK_EQ(s.canceled[TE_OP_WRITE], 0);
	CHECK_EQ(s.in_flight, 0);
	CHECK_EQ(s.in_flight_bytes, 0);
	CHECK_EQ(s.registered_bytes, BUF);
	CHECK_EQ(s.registered_regions, 1);
	te_stats sb = stats_of(p.b);
	CHECK(sb.rpc_served >= 1); /* a's open fetched b's descriptor */
	CHECK_EQ(sb.requests[0] + sb.requests[1], 0);

	/* the same per transport and peer in the exposition */
	char *t = text_of(p.a);
	snprintf(lbl, sizeof lbl, "transport=\"%s\",op=\"write\"", transport);
	CHECK_EQ(metric(t, "te_transfer_requests_total", an, lbl), 5);
	CHECK_EQ(metric(t, "te_transfer_completed_total", an, lbl), 4);
	CHECK_EQ(metric(t, "te_transfer_failed_total", an, lbl), 1);
	CHECK_EQ(metric(t, "te_transfer_bytes_total", an, lbl), 3 * 4096);
	CHECK_EQ(metric(t, "te_transfer_latency_seconds_count", an, lbl), 5); /* completed + failed */
	snprintf(lbl, sizeof lbl, "transport=\"%s\",op=\"write\",le=\"+Inf\"", transport);
	CHECK_EQ(metric(t, "te_transfer_latency_seconds_bucket", an, lbl), 5);
	snprintf(lbl, sizeof lbl, "transport=\"%s\",op=\"read\"", transport);
	CHECK_EQ(metric(t, "te_transfer_requests_total", an, lbl), 2);
	CHECK_EQ(metric(t, "te_transfer_bytes_total", an, lbl), 2 * 8192);
	CHECK_EQ(metric(t, "te_transfer_latency_seconds_count", an, lbl), 2);
	CHECK_EQ(metric(t, "te_transfer_requests_total", an, "transport=\"local\",op=\"read\""), 1);
	CHECK_EQ(metric(t, "te_transfer_bytes_total", an, "transport=\"local\",op=\"read\""), 1000);
	snprintf(lbl, sizeof lbl, "transport=\"%s\"", transport);
	CHECK_EQ(metric(t, "te_transfer_in_flight", an, lbl), 0);
	snprintf(lbl, sizeof lbl, "peer=\"%s\",op=\"write\"", bn);
	CHECK_EQ(metric(t, "te_peer_bytes_total", an, lbl), 3 * 4096);
	CHECK_EQ(metric(t, "te_peer_requests_total", an, lbl), 5);
	CHECK_EQ(metric(t, "te_peer_failed_total", an, lbl), 1);
	snprintf(lbl, sizeof lbl, "peer=\"%s\",op=\"read\"", bn);
	CHECK_EQ(metric(t, "te_peer_bytes_total", an, lbl), 2 * 8192);
	CHECK_EQ(metric(t, "te_peer_requests_total", an, "peer=\"other\",op=\"write\""), 0);
	if (strcmp(transport, "tcp") == 0) {
		/* one device, the local address the connections leave by */
		CHECK_EQ(metric(t, "te_device_bytes_total", an, "transport=\"tcp\",device=\"127.0.0.1\""),
			 3 * 4096 + 2 * 8192);
		CHECK_EQ(metric(t, "te_device_in_flight_bytes", an, "transport=\"tcp\",device=\"127.0.0.1\""), 0);
		CHECK_EQ(metric(t, "te_device_errors_total", an, "transport=\"tcp\",device=\"127.0.0.1\""), 0);
	}
	CHECK_EQ(metric(t, "te_registered_memory_bytes", an, ""), BUF);
	CHECK_EQ(metric(t, "te_registered_memory_regions", an, ""), 1);
	te_free(t);

	/* the JSON form says the same */
	char *json = NULL;
	CHECK_EQ(te_engine_stats_json(p.a, &json), 0);
	REQUIRE(json != NULL);
	snprintf(lbl, sizeof lbl, "{\"transport\":\"%s\",\"op\":\"write\",\"requests\":5,\"bytes\":12288,"
		 "\"completed\":4,\"failed\":1,\"canceled\":0,\"in_flight\":0,\"in_flight_bytes\":0,", transport);
	CHECK(strstr(json, lbl) != NULL);
	CHECK(strstr(json, "\"memory\":{\"registered_bytes\":1048576,\"registered_regions\":1}") != NULL);
	te_free(json);

	/* notifications: one sent by a, one received by b */
	CHECK_EQ(te_notify_send(p.a, p.seg, "hello"), 0);
	CHECK_EQ(stats_of(p.a).notifies_sent, 1);
	CHECK_EQ(stats_of(p.b).notifies_received, 1);
	t = text_of(p.b);
	CHECK(metric(t, "te_rpc_frames_total", bn, "kind=\"Notify\",result=\"served\"") == 1);
	CHECK(metric(t, "te_rpc_frames_total", bn, "kind=\"Metadata\",result=\"served\"") >= 1);
	te_free(t);

	/* unregistering brings the gauges down */
	CHECK_EQ(te_unregister_memory(p.b, p.bbuf), 0);
	CHECK_EQ(stats_of(p.b).registered_bytes, 0);
	CHECK_EQ(stats_of(p.b).registered_regions, 0);
	engine_pair_down(&p);
}

static void test_tcp(void)
{
	known_transfers("tcp");
}

static void test_shm(void)
{
	if (!have_transport("shm")) {
		fprintf(stderr, "  (no shm transport in this build: skipped)\n");
		return;
	}
	known_transfers("shm");
}

/* Held transfers: in flight, failed with device errors, canceled. */
static void test_hold_devices_cancel(void)
{
	engine_pair p;
	te_batch_id b;
	te_request r[3];

	hold_find();
	engine_pair_up(&p, "hold", BUF);
	const char *an = te_engine_name(p.a);
	for (int i = 0; i < 3; i++)
		r[i] = (te_request){ TE_OP_WRITE, p.seg, p.abuf + 1000 * i, (uintptr_t)p.bbuf + 1000 * i, 1000 };
	REQUIRE(te_batch_alloc(p.a, 16, &b) == 0);
	CHECK_EQ(te_submit(p.a, b, r, 3), 0);
	CHECK_EQ(hold_count(), 3);
	te_stats s = stats_of(p.a);
	CHECK_EQ(s.in_flight, 3);
	CHECK_EQ(s.in_flight_bytes, 3000);
	char *t = text_of(p.a);
	CHECK_EQ(metric(t, "te_transfer_in_flight", an, "transport=\"hold\""), 3);
	CHECK_EQ(metric(t, "te_transfer_in_flight_bytes", an, "transport=\"hold\""), 3000);
	CHECK_EQ(metric(t, "te_device_in_flight_bytes", an, "transport=\"hold\",device=\"hold0\""), 3000);
	te_free(t);

	/* failed: one device error, one fail-over, one transport retry each */
	CHECK_EQ(hold_release(-EIO), 3);
	CHECK_EQ(te_batch_wait(p.a, b, 10000), 0);
	s = stats_of(p.a);
	CHECK_EQ(s.failed[TE_OP_WRITE], 3);
	CHECK_EQ(s.in_flight, 0);
	CHECK_EQ(s.failovers, 3);
	CHECK_EQ(s.retries, 3);
	/* moved */
	CHECK_EQ(te_submit(p.a, b, r, 2), 0);
	CHECK_EQ(hold_release(0), 2);
	CHECK_EQ(te_batch_wait(p.a, b, 10000), 0);
	/* canceled */
	CHECK_EQ(te_submit(p.a, b, r, 2), 0);
	CHECK_EQ(te_batch_cancel(p.a, b), 0);
	CHECK_EQ(hold_release(0), 2);
	te_batch_wait(p.a, b, 10000);
	s = stats_of(p.a);
	CHECK_EQ(s.requests[TE_OP_WRITE], 7);
	CHECK_EQ(s.completed[TE_OP_WRITE], 2);
	CHECK_EQ(s.canceled[TE_OP_WRITE], 2);
	CHECK_EQ(s.bytes[TE_OP_WRITE], 2000);
	t = text_of(p.a);
	CHECK_EQ(metric(t, "te_transfer_canceled_total", an, "transport=\"hold\",op=\"write\""), 2);
	/* the histogram leaves cancels out */
	CHECK_EQ(metric(t, "te_transfer_latency_seconds_count", an, "transport=\"hold\",op=\"write\""), 5);
	CHECK_EQ(metric(t, "te_device_bytes_total", an, "transport=\"hold\",device=\"hold0\""), 2000);
	CHECK_EQ(metric(t, "te_device_in_flight_bytes", an, "transport=\"hold\",device=\"hold0\""), 0);
	CHECK_EQ(metric(t, "te_device_errors_total", an, "transport=\"hold\",device=\"hold0\""), 3);
	CHECK_EQ(metric(t, "te_device_failovers_total", an, "transport=\"hold\",device=\"hold0\""), 3);
	CHECK_EQ(metric(t, "te_device_retries_total", an, "transport=\"hold\",device=\"hold0\""), 0);
	CHECK_EQ(metric(t, "te_transport_retries_total", an, "transport=\"hold\""), 3);
	CHECK_EQ(metric(t, "te_transport_failovers_total", an, "transport=\"hold\""), 3);
	CHECK(metric(t, "te_device_bandwidth_bytes_per_second", an, "transport=\"hold\",device=\"hold0\"") >= 0);
	te_free(t);
	char *json = NULL;
	CHECK_EQ(te_engine_stats_json(p.a, &json), 0);
	CHECK(json && strstr(json, "{\"transport\":\"hold\",\"device\":\"hold0\",\"bytes\":2000,\"in_flight_bytes\":0,"));
	te_free(json);
	te_batch_free(p.a, b);
	engine_pair_down(&p);
}

/* TE_METRICS_DEVICES=0: no device gets counters; what a transport counts
 * for one goes to the transport itself, bytes aside. */
static void test_devices_bound(void)
{
	engine_pair p;
	te_request r;

	hold_find();
	setenv("TE_METRICS_DEVICES", "0", 1);
	engine_pair_up(&p, "hold", BUF);
	unsetenv("TE_METRICS_DEVICES");
	const char *an = te_engine_name(p.a);
	r = (te_request){ TE_OP_WRITE, p.seg, p.abuf, (uintptr_t)p.bbuf, 1000 };
	te_batch_id b;
	REQUIRE(te_batch_alloc(p.a, 4, &b) == 0);
	CHECK_EQ(te_submit(p.a, b, &r, 1), 0);
	CHECK_EQ(hold_release(-EIO), 1);
	CHECK_EQ(te_batch_wait(p.a, b, 10000), 0);
	char *t = text_of(p.a);
	CHECK_EQ(count_lines(t, "te_device_"), 0);
	CHECK_EQ(metric(t, "te_transport_failovers_total", an, "transport=\"hold\""), 1);
	CHECK_EQ(metric(t, "te_transport_retries_total", an, "transport=\"hold\""), 1);
	CHECK_EQ(metric(t, "te_transport_errors_total", an, "transport=\"hold\""), 1);
	te_free(t);
	te_batch_free(p.a, b);
	engine_pair_down(&p);
}

/* ------------------------------------------------------- the exposition */

static bool ends_with(const char *s, size_t n, const char *suffix)
{
	size_t k = strlen(suffix);
	return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

/* Every sample's family declared by HELP and TYPE before it; histogram
 * buckets cumulative, ending with +Inf equal to _count. Returns the number
 * of samples. */
static int check_exposition(const char *text)
{
	char help[400][96], type[400][96], types[400][16];
	int n_help = 0, n_type = 0, samples = 0;
	long long last_bucket = -1;
	bool saw_inf = true;
	long long inf_value = -1;

	for (const char *l = text; *l;) {
		const char *end = strchr(l, '\n');
		REQUIRE(end != NULL); /* every line ends with a newline */
		size_t len = (size_t)(end - l);
		char line[4096];
		REQUIRE(len < sizeof line);
		memcpy(line, l, len);
		line[len] = '\0';
		if (strncmp(line, "# HELP ", 7) == 0) {
			REQUIRE(n_help < 400);
			sscanf(line + 7, "%95s", help[n_help]);
			for (int i = 0; i < n_help; i++)
				CHECK(strcmp(help[i], help[n_help]) != 0); /* once per family */
			n_help++;
		} else if (strncmp(line, "# TYPE ", 7) == 0) {
			REQUIRE(n_type < 400);
			CHECK_EQ(sscanf(line + 7, "%95s %15s", type[n_type], types[n_type]), 2);
			CHECK(n_help > 0 && strcmp(help[n_help - 1], type[n_type]) == 0);
			n_type++;
		} else {
			CHECK(line[0] != '#' && line[0] != '\0');
			const char *brace = strchr(line, '{');
			REQUIRE(brace != NULL); /* every series has the segment label */
			CHECK(strncmp(brace, "{segment=\"", 10) == 0);
			size_t nl = (size_t)(brace - line);
			char fam[128];
			REQUIRE(nl < sizeof fam);
			memcpy(fam, line, nl);
			fam[nl] = '\0';
			bool bucket = ends_with(fam, nl, "_bucket"), count = ends_with(fam, nl, "_count");
			bool sum = ends_with(fam, nl, "_sum");
			int f = -1;
			for (int i = 0; i < n_type && f < 0; i++)
				if (strcmp(type[i], fam) == 0)
					f = i;
			if (f < 0 && (bucket || count || sum)) {
				fam[nl - (bucket ? 7 : count ? 6 : 4)] = '\0';
				for (int i = 0; i < n_type && f < 0; i++)
					if (strcmp(type[i], fam) == 0 && strcmp(types[i], "histogram") == 0)
						f = i;
			}
			CHECK(f >= 0);
			if (f < 0)
				fprintf(stderr, "  undeclared family in: %s\n", line);
			/* the value: after the last '}' */
			const char *close = strrchr(line, '}');
			REQUIRE(close != NULL && close[1] == ' ');
			char *vend;
			double v = strtod(close + 2, &vend);
			CHECK(*vend == '\0' && v >= 0);
			if (bucket) {
				long long c = (long long)v;
				if (saw_inf)
					last_bucket = -1;
				saw_inf = strstr(line, "le=\"+Inf\"") != NULL;
				CHECK(c >= last_bucket); /* cumulative */
				last_bucket = c;
				if (saw_inf)
					inf_value = c;
			} else if (count && f >= 0 && strcmp(types[f], "histogram") == 0) {
				CHECK(saw_inf); /* the buckets ended with +Inf */
				CHECK_EQ((long long)v, inf_value);
			}
			samples++;
		}
		l = end + 1;
	}
	CHECK_EQ(n_help, n_type);
	return samples;
}

static void promtool_check(const char *text)
{
	if (system("command -v promtool >/dev/null 2>&1") != 0) {
		fprintf(stderr, "  (promtool not installed: the exposition was not checked by it)\n");
		return;
	}
	char path[] = "/tmp/te-metrics-XXXXXX";
	int fd = mkstemp(path);
	REQUIRE(fd >= 0);
	size_t n = strlen(text);
	CHECK_EQ(write(fd, text, n), (ssize_t)n);
	close(fd);
	char cmd[256];
	snprintf(cmd, sizeof cmd, "promtool check metrics < %s", path);
	int rc = system(cmd);
	CHECK_EQ(rc, 0);
	if (rc != 0)
		fprintf(stderr, "  promtool refused the exposition in %s\n", path);
	else
		unlink(path);
}

static void test_exposition(void)
{
	/* A host name with a quote and a backslash: the segment label escapes it. */
	te_engine *odd = NULL, *plain = p2p_engine(NULL);
	REQUIRE(plain != NULL);
	CHECK_EQ(te_engine_create("P2PHANDSHAKE", "q\"b\\s", NULL, 0, &odd), 0);
	REQUIRE(odd != NULL);
	char *buf = aligned_alloc(4096, 65536);
	REQUIRE(buf && te_register_memory(odd, buf, 65536, "cpu:0", 0) == 0);
	CHECK_EQ(run_one(odd, TE_OP_WRITE, TE_LOCAL_SEGMENT, buf, (uintptr_t)buf + 4096, 4096, NULL),
		 TE_TASK_COMPLETED);

	char *t = text_of(odd);
	char want[256];
	snprintf(want, sizeof want, "te_transfer_requests_total{segment=\"q\\\"b\\\\s:%d\",transport=\"local\",op=\"write\"} 1\n",
		 te_engine_rpc_port(odd));
	CHECK(strstr(t, want) != NULL);
	CHECK(check_exposition(t) > 0);
	promtool_check(t);
	te_free(t);

	/* Every engine of the process: each family declared once. */
	char *all = NULL;
	size_t len = 0;
	CHECK_EQ(te_metrics_text(NULL, &all, &len), 0);
	REQUIRE(all != NULL);
	CHECK(strstr(all, want) != NULL);
	snprintf(want, sizeof want, "te_transfer_requests_total{segment=\"%s\",transport=\"local\",op=\"write\"} 0\n",
		 te_engine_name(plain));
	CHECK(strstr(all, want) != NULL);
	int one = check_exposition(all);
	CHECK(one > 0);
	promtool_check(all);
	te_free(all);

	CHECK_EQ(te_unregister_memory(odd, buf), 0);
	te_engine_destroy(odd);
	te_engine_destroy(plain);
	free(buf);
}

/* ------------------------------------------------------------ many peers */

static int count_lines(const char *text, const char *prefix)
{
	int n = 0;
	size_t k = strlen(prefix);
	for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
		n += strncmp(l, prefix, k) == 0;
	return n;
}

/* The peer-set tests' engines: a (made by the caller, memcpy) with 64 KiB
 * at *abuf; b (memcpy) listening on every address, so that 127.x.y.z:port
 * all reach it, with 64 KiB at *bbuf that peers may write. */
static void peers_up(te_engine *a, te_engine **b, unsigned char **abuf, unsigned char **bbuf)
{
	te_option bopt[2] = { { "transports", "memcpy" }, { "TE_BIND_ADDRESS", "*" } };
	REQUIRE(a != NULL);
	REQUIRE(te_engine_create("P2PHANDSHAKE", "127.0.0.1", bopt, 2, b) == 0);
	*abuf = aligned_alloc(4096, 65536);
	*bbuf = aligned_alloc(4096, 65536);
	REQUIRE(*abuf && *bbuf);
	REQUIRE(te_register_memory(a, *abuf, 65536, "cpu:0", 0) == 0);
	REQUIRE(te_register_memory(*b, *bbuf, 65536, "*", TE_MEM_REMOTE_ACCESS) == 0);
}

static void peers_down(te_engine *a, te_engine *b, unsigned char *abuf, unsigned char *bbuf)
{
	te_engine_destroy(a);
	te_engine_destroy(b);
	free(abuf);
	free(bbuf);
}

/* 10,000 peer segments: b under as many names (127.x.y.z all reach its
 * port on any address), one write to each. */
static void test_many_peers(void)
{
	const char *env = getenv("TE_TEST_PEERS");
	int n = env ? atoi(env) : 10000;
	te_engine *a = p2p_engine("memcpy"), *b = NULL;
	unsigned char *abuf, *bbuf;
	peers_up(a, &b, &abuf, &bbuf);
	int port = te_engine_rpc_port(b);
	int opened = 0;
	for (int i = 0; i < n; i++) {
		char name[64];
		snprintf(name, sizeof name, "127.%d.%d.%d:%d", 1 + i / 62500, (i / 250) % 250, 1 + i % 250, port);
		te_segment_id seg = te_segment_open(a, name);
		if (seg <= 0) {
			fprintf(stderr, "  opening %s: %s\n", name, te_strerror(seg));
			break;
		}
		opened++;
		CHECK_EQ(run_one(a, TE_OP_WRITE, seg, abuf, (uintptr_t)bbuf, 64, NULL), TE_TASK_COMPLETED);
		CHECK_EQ(te_segment_close(a, seg), 0);
	}
	CHECK_EQ(opened, n);
	char *t = text_of(a);
	int series = count_lines(t, "te_peer_bytes_total{");
	CHECK_EQ(series, 2 * (64 + 1)); /* the default TE_METRICS_PEERS, "other", two ops each */
	const char *an = te_engine_name(a);
	CHECK_EQ(metric(t, "te_peer_bytes_total", an, "peer=\"other\",op=\"write\""), 64LL * (n - 64));
	CHECK_EQ(metric(t, "te_peer_requests_total", an, "peer=\"other\",op=\"write\""), n - 64);
	CHECK_EQ(metric(t, "te_peer_requests_total", an, "peer=\"127.1.0.1:0\",op=\"write\""), -1);
	char lbl[128];
	snprintf(lbl, sizeof lbl, "peer=\"127.1.0.1:%d\",op=\"write\"", port);
	CHECK_EQ(metric(t, "te_peer_bytes_total", an, lbl), 64);
	te_free(t);
	peers_down(a, b, abuf, bbuf);
}

/* The peer series of an exposition: name → bytes written, and every
 * te_peer_* sample by its full label set, for the monotonic check. */
static GHashTable *peer_samples(const char *text)
{
	GHashTable *h = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
	for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
		if (strncmp(l, "te_peer_", 8) != 0)
			continue;
		const char *sp = strstr(l, "} ");
		const char *nl = strchr(l, '\n');
		if (sp == NULL || (nl != NULL && sp > nl))
			continue;
		g_hash_table_insert(h, g_strndup(l, (size_t)(sp + 1 - l)), GINT_TO_POINTER(atoi(sp + 2)));
	}
	return h;
}

/* Every sample of `before` that `after` still exports has not gone down. */
static int samples_monotonic(GHashTable *before, GHashTable *after)
{
	GHashTableIter it;
	gpointer k, v;
	int bad = 0;
	g_hash_table_iter_init(&it, before);
	while (g_hash_table_iter_next(&it, &k, &v)) {
		gpointer w;
		if (g_hash_table_lookup_extended(after, k, NULL, &w) && GPOINTER_TO_INT(w) < GPOINTER_TO_INT(v)) {
			fprintf(stderr, "  %s went from %d to %d\n", (char *)k, GPOINTER_TO_INT(v), GPOINTER_TO_INT(w));
			bad++;
		}
	}
	return bad;
}

#define TOPN 8
/* 10,000 peer names, TE_METRICS_PEERS=8: the exposition holds the 8 with
 * the most bytes and "other", whatever order they were opened in; the
 * series of each reading are monotonic against the previous one; a peer
 * that left the set and comes back continues its series. */
static void test_busiest_peers(void)
{
	const char *env = getenv("TE_TEST_PEERS");
	int n = env ? atoi(env) : 10000;
	REQUIRE(n >= 100);
	setenv("TE_METRICS_PEERS", "8", 1);
	te_engine *a = p2p_engine("memcpy"), *b = NULL;
	unsetenv("TE_METRICS_PEERS");
	unsigned char *abuf, *bbuf;
	peers_up(a, &b, &abuf, &bbuf);
	int port = te_engine_rpc_port(b);
	const char *an = te_engine_name(a);
	/* The busy ones, spread over the opening order (the first, the middle,
	 * the last): busy k moves 1000 * (k + 2) bytes, every other one 64. */
	int busy[TOPN] = { 0, 1, n / 3, n / 2, n / 2 + 1, n - 100, n - 2, n - 1 };
	char name[64], lbl[160];
#define PEER_NAME(i) snprintf(name, sizeof name, "127.%d.%d.%d:%d", 1 + (i) / 62500, ((i) / 250) % 250, 1 + (i) % 250, port)
	long long total = 0;
	for (int i = 0; i < n; i++) {
		size_t len = 64;
		for (int k = 0; k < TOPN; k++)
			if (busy[k] == i)
				len = 1000u * (unsigned)(k + 2);
		PEER_NAME(i);
		te_segment_id seg = te_segment_open(a, name);
		REQUIRE(seg > 0);
		CHECK_EQ(run_one(a, TE_OP_WRITE, seg, abuf, (uintptr_t)bbuf, len, NULL), TE_TASK_COMPLETED);
		total += (long long)len;
		CHECK_EQ(te_segment_close(a, seg), 0);
	}
	/* Reading 1: peers 0 .. 7 were shown from their first byte (the set had
	 * room); this reading moves peers 0 and 1 on and ranks the busy ones in. */
	char *t1 = text_of(a);
	CHECK_EQ(count_lines(t1, "te_peer_bytes_total{"), 2 * (TOPN + 1));
	/* peers 2..7 (64 bytes each, shown while they moved them) left */
	CHECK_EQ(metric(t1, "te_peer_bytes_total", an, "peer=\"other\",op=\"write\""),
		 total - 2000 - 3000 - 6 * 64);
	char *t2 = text_of(a);
	GHashTable *s1 = peer_samples(t1), *s2 = peer_samples(t2);
	CHECK_EQ(samples_monotonic(s1, s2), 0);
	for (int k = 0; k < TOPN; k++) {
		PEER_NAME(busy[k]);
		snprintf(lbl, sizeof lbl, "peer=\"%s\",op=\"write\"", name);
		/* shown from the start (0, 1) or from reading 1 on (their bytes
		 * before it are in "other") */
		CHECK_EQ(metric(t2, "te_peer_bytes_total", an, lbl), k < 2 ? 1000 * (k + 2) : 0);
	}
	/* More to each busy peer: its series counts it exactly. */
	for (int k = 0; k < TOPN; k++) {
		PEER_NAME(busy[k]);
		te_segment_id seg = te_segment_open(a, name);
		REQUIRE(seg > 0);
		CHECK_EQ(run_one(a, TE_OP_WRITE, seg, abuf, (uintptr_t)bbuf, 4096, NULL), TE_TASK_COMPLETED);
		CHECK_EQ(te_segment_close(a, seg), 0);
	}
	char *t3 = text_of(a);
	GHashTable *s3 = peer_samples(t3);
	CHECK_EQ(samples_monotonic(s2, s3), 0);
	CHECK_EQ(count_lines(t3, "te_peer_bytes_total{"), 2 * (TOPN + 1));
	for (int k = 0; k < TOPN; k++) {
		PEER_NAME(busy[k]);
		snprintf(lbl, sizeof lbl, "peer=\"%s\",op=\"write\"", name);
		CHECK_EQ(metric(t3, "te_peer_bytes_total", an, lbl), (k < 2 ? 1000 * (k + 2) : 0) + 4096);
		CHECK_EQ(metric(t3, "te_peer_requests_total", an, lbl), k < 2 ? 2 : 1);
	}
	/* Peer 5 (shown at first with 64 bytes, then left) becomes the busiest:
	 * its traffic goes to "other" until the reading that ranks it in, and
	 * its series then continues from 64; peer 0, now the least busy of the
	 * set (2000 + 4096 bytes), leaves it. */
	PEER_NAME(5);
	snprintf(lbl, sizeof lbl, "peer=\"%s\",op=\"write\"", name);
	CHECK_EQ(metric(t3, "te_peer_bytes_total", an, lbl), -1);
	te_segment_id seg5 = te_segment_open(a, name);
	REQUIRE(seg5 > 0);
	CHECK_EQ(run_one(a, TE_OP_WRITE, seg5, abuf, (uintptr_t)bbuf, 65536, NULL), TE_TASK_COMPLETED);
	long long other3 = metric(t3, "te_peer_bytes_total", an, "peer=\"other\",op=\"write\"");
	char *t4 = text_of(a);
	GHashTable *s4 = peer_samples(t4);
	CHECK_EQ(samples_monotonic(s3, s4), 0);
	CHECK_EQ(count_lines(t4, "te_peer_bytes_total{"), 2 * (TOPN + 1));
	CHECK_EQ(metric(t4, "te_peer_bytes_total", an, "peer=\"other\",op=\"write\""), other3 + 65536);
	CHECK_EQ(metric(t4, "te_peer_bytes_total", an, lbl), 64);
	CHECK_EQ(run_one(a, TE_OP_WRITE, seg5, abuf, (uintptr_t)bbuf, 100, NULL), TE_TASK_COMPLETED);
	CHECK_EQ(te_segment_close(a, seg5), 0);
	char *t5 = text_of(a);
	GHashTable *s5 = peer_samples(t5);
	CHECK_EQ(samples_monotonic(s4, s5), 0);
	CHECK_EQ(metric(t5, "te_peer_bytes_total", an, lbl), 164);
	PEER_NAME(busy[0]);
	snprintf(lbl, sizeof lbl, "peer=\"%s\",op=\"write\"", name);
	CHECK_EQ(metric(t5, "te_peer_bytes_total", an, lbl), -1);
	CHECK_EQ(metric(t5, "te_peer_bytes_total", an, "peer=\"other\",op=\"write\""), other3 + 65536);
#undef PEER_NAME
	GHashTable *all[] = { s1, s2, s3, s4, s5 };
	for (size_t i = 0; i < sizeof all / sizeof *all; i++)
		g_hash_table_unref(all[i]);
	char *all_t[] = { t1, t2, t3, t4, t5 };
	for (size_t i = 0; i < sizeof all_t / sizeof *all_t; i++)
		te_free(all_t[i]);
	peers_down(a, b, abuf, bbuf);
}

/* TE_METRICS_PEER_NAMES bounds the names ranked: with 2 shown and 3
 * tracked, the busiest of five peers is the fifth, past the bound: it
 * counts into "other" and is never shown; the busier of the tracked
 * third and the first two takes a place. */
static void test_peer_names_bound(void)
{
	setenv("TE_METRICS_PEERS", "2", 1);
	setenv("TE_METRICS_PEER_NAMES", "3", 1);
	te_engine *a = p2p_engine("memcpy"), *b = NULL;
	unsetenv("TE_METRICS_PEERS");
	unsetenv("TE_METRICS_PEER_NAMES");
	unsigned char *abuf, *bbuf;
	peers_up(a, &b, &abuf, &bbuf);
	int port = te_engine_rpc_port(b);
	const char *an = te_engine_name(a);
	static const size_t len[5] = { 100, 200, 3000, 50, 60000 };
	char name[5][64], lbl[400];
	for (int i = 0; i < 5; i++) {
		snprintf(name[i], sizeof name[i], "127.0.0.%d:%d", i + 1, port);
		te_segment_id seg = te_segment_open(a, name[i]);
		REQUIRE(seg > 0);
		CHECK_EQ(run_one(a, TE_OP_WRITE, seg, abuf, (uintptr_t)bbuf, len[i], NULL), TE_TASK_COMPLETED);
		CHECK_EQ(te_segment_close(a, seg), 0);
	}
	char *t = text_of(a);
	CHECK_EQ(count_lines(t, "te_peer_bytes_total{"), 2 * 3);
	/* shown: peer 2 (ranked in, from 0) and peer 1 (200 bytes, shown from
	 * the start); peer 0 left; peers 3 and 4 counted into "other" */
	snprintf(lbl, sizeof lbl, "peer=\"%s\",op=\"write\"", name[2]);
	CHECK_EQ(metric(t, "te_peer_bytes_total", an, lbl), 0);
	snprintf(lbl, sizeof lbl, "peer=\"%s\",op=\"write\"", name[1]);
	CHECK_EQ(metric(t, "te_peer_bytes_total", an, lbl), 200);
	for (int i = 0; i < 5; i += 4) {
		snprintf(lbl, sizeof lbl, "peer=\"%s\",op=\"write\"", name[i]);
		CHECK_EQ(metric(t, "te_peer_bytes_total", an, lbl), -1);
	}
	CHECK_EQ(metric(t, "te_peer_bytes_total", an, "peer=\"other\",op=\"write\""), 3000 + 50 + 60000);
	te_free(t);
	peers_down(a, b, abuf, bbuf);
}

/* TE_METRICS_PEERS bounds the set; 0 leaves only "other". */
static void test_peers_option(void)
{
	engine_pair p;
	setenv("TE_METRICS_PEERS", "0", 1);
	engine_pair_up(&p, "memcpy", BUF);
	unsetenv("TE_METRICS_PEERS");
	CHECK_EQ(run_one(p.a, TE_OP_WRITE, p.seg, p.abuf, (uintptr_t)p.bbuf, 100, NULL), TE_TASK_COMPLETED);
	char *t = text_of(p.a);
	CHECK_EQ(count_lines(t, "te_peer_bytes_total{"), 2);
	CHECK_EQ(metric(t, "te_peer_bytes_total", te_engine_name(p.a), "peer=\"other\",op=\"write\""), 100);
	te_free(t);
	engine_pair_down(&p);
}

/* RPC frames served and refused by kind; a peer refused by the key. */
static void test_rpc_auth(void)
{
	te_engine *e = p2p_engine(NULL);
	char in[4096];
	REQUIRE(e != NULL);
	int port = te_engine_rpc_port(e);
	CHECK(raw_frame(port, 3, "{}", in, sizeof in) > 0);
	CHECK_EQ(raw_frame(port, 3, "not json", in, sizeof in), 0);
	uint64_t huge = htole64(1ull << 40);
	CHECK_EQ(exchange_raw(port, &huge, 8, in, sizeof in), 0);
	te_stats s = stats_of(e);
	CHECK_EQ(s.rpc_served, 1);
	CHECK_EQ(s.rpc_refused, 2);
	CHECK_EQ(s.auth_refused, 0);
	char *t = text_of(e);
	const char *n = te_engine_name(e);
	CHECK_EQ(metric(t, "te_rpc_frames_total", n, "kind=\"Probe\",result=\"served\""), 1);
	CHECK_EQ(metric(t, "te_rpc_frames_total", n, "kind=\"Probe\",result=\"refused\""), 1);
	CHECK_EQ(metric(t, "te_rpc_frames_total", n, "kind=\"unknown\",result=\"refused\""), 1);
	CHECK_EQ(metric(t, "te_rpc_frames_total", n, "kind=\"Metadata\",result=\"served\""), 0);
	te_free(t);
	te_engine_destroy(e);

	/* a server with a cluster key refuses a peer that does not authenticate */
	char path[] = "/tmp/te-metrics-key-XXXXXX";
	int fd = mkstemp(path);
	REQUIRE(fd >= 0);
	const char *key = "0123456789abcdef0123456789abcdef\n";
	CHECK_EQ(write(fd, key, strlen(key)), (ssize_t)strlen(key));
	close(fd);
	te_option opt[1] = { { "auth_key_file", path } };
	REQUIRE(te_engine_create("P2PHANDSHAKE", "127.0.0.1", opt, 1, &e) == 0);
	port = te_engine_rpc_port(e);
	CHECK(raw_frame(port, 3, "{}", in, sizeof in) > 0); /* answered: authentication required */
	CHECK(strstr(in + 9, "auth_required") != NULL);
	s = stats_of(e);
	CHECK_EQ(s.auth_refused, 1);
	CHECK_EQ(s.rpc_served, 0);
	te_engine_destroy(e);
	unlink(path);
}

/* --------------------------------------------------------------- the API */

static void test_off(void)
{
	te_option opt[1] = { { "TE_METRICS", "0" } };
	te_engine *e = NULL;
	REQUIRE(te_engine_create("P2PHANDSHAKE", "127.0.0.1", opt, 1, &e) == 0);
	te_stats s = { .size = sizeof s };
	char *j = (char *)1, *t = (char *)1;
	size_t len = 7;
	CHECK_EQ(te_engine_stats(e, &s), -ENOTSUP);
	CHECK_EQ(te_engine_stats_json(e, &j), -ENOTSUP);
	CHECK(j == NULL);
	CHECK_EQ(te_metrics_text(e, &t, &len), -ENOTSUP);
	CHECK(t == NULL && len == 0);
	/* the process-wide text leaves it out */
	CHECK_EQ(te_metrics_text(NULL, &t, &len), 0);
	char want[128];
	snprintf(want, sizeof want, "segment=\"%s\"", te_engine_name(e));
	CHECK(t && strstr(t, want) == NULL);
	te_free(t);
	te_engine_destroy(e);

	CHECK_EQ(te_engine_stats(NULL, &s), -EINVAL);
	CHECK_EQ(te_engine_stats_json(NULL, &j), -EINVAL);
	CHECK_EQ(te_metrics_text(NULL, NULL, &len), -EINVAL);
}

static void test_size_versioning(void)
{
	te_engine *e = p2p_engine(NULL);
	REQUIRE(e != NULL);
	char *buf = aligned_alloc(4096, 8192);
	REQUIRE(buf && te_register_memory(e, buf, 8192, "cpu:0", 0) == 0);
	CHECK_EQ(run_one(e, TE_OP_READ, TE_LOCAL_SEGMENT, buf, (uintptr_t)buf + 4096, 100, NULL), TE_TASK_COMPLETED);

	/* a caller built when te_stats ended after `requests` */
	te_stats s;
	memset(&s, 0xAB, sizeof s);
	s.size = offsetof(te_stats, bytes);
	CHECK_EQ(te_engine_stats(e, &s), 0);
	CHECK_EQ(s.size, offsetof(te_stats, bytes));
	CHECK_EQ(s.requests[TE_OP_READ], 1);
	CHECK_EQ(s.requests[TE_OP_WRITE], 0);
	CHECK(s.bytes[0] == 0xABABABABABABABABull && s.auth_refused == 0xABABABABABABABABull);
	/* too small for anything */
	s.size = 4;
	CHECK_EQ(te_engine_stats(e, &s), -EINVAL);
	/* a larger struct from a newer header: filled up to what this one knows */
	struct {
		te_stats st;
		uint64_t later;
	} big;
	memset(&big, 0xCD, sizeof big);
	big.st.size = sizeof big;
	CHECK_EQ(te_engine_stats(e, &big.st), 0);
	CHECK_EQ(big.st.bytes[TE_OP_READ], 100);
	CHECK(big.later == 0xCDCDCDCDCDCDCDCDull);
	CHECK_EQ(te_unregister_memory(e, buf), 0);
	te_engine_destroy(e);
	free(buf);
}

/* -------------------------------------------------------- concurrency */

#define THREADS 4
#define ROUNDS 400

typedef struct worker {
	te_engine *e;
	char *buf;
	int id;
} worker;

static atomic_bool readers_stop;

static void *submitter(void *arg)
{
	worker *w = arg;
	te_batch_id b;
	REQUIRE(te_batch_alloc(w->e, 8, &b) == 0);
	for (int r = 0; r < ROUNDS; r++) {
		te_request req[4];
		for (int k = 0; k < 4; k++)
			req[k] = (te_request){ k & 1 ? TE_OP_WRITE : TE_OP_READ, TE_LOCAL_SEGMENT,
					       w->buf + 4096 * (2 * w->id), (uintptr_t)w->buf + 4096 * (2 * w->id + 1), 512 };
		CHECK_EQ(te_submit(w->e, b, req, 4), 0);
		CHECK_EQ(te_batch_wait(w->e, b, 30000), 0);
		te_batch_free(w->e, b);
		REQUIRE(te_batch_alloc(w->e, 8, &b) == 0);
	}
	te_batch_free(w->e, b);
	return NULL;
}

static void *reader(void *arg)
{
	te_engine *e = arg;
	uint64_t last = 0;
	while (!atomic_load(&readers_stop)) {
		char *t = NULL;
		size_t len;
		CHECK_EQ(te_metrics_text(NULL, &t, &len), 0);
		te_free(t);
		te_stats s = { .size = sizeof s };
		CHECK_EQ(te_engine_stats(e, &s), 0);
		CHECK(s.requests[0] + s.requests[1] >= last); /* never goes back */
		last = s.requests[0] + s.requests[1];
		char *j = NULL;
		CHECK_EQ(te_engine_stats_json(e, &j), 0);
		te_free(j);
	}
	return NULL;
}

static void test_concurrent(void)
{
	te_engine *e = p2p_engine(NULL);
	REQUIRE(e != NULL);
	char *buf = aligned_alloc(4096, 4096 * 2 * THREADS);
	REQUIRE(buf && te_register_memory(e, buf, 4096 * 2 * THREADS, "cpu:0", 0) == 0);
	pthread_t th[THREADS], rd;
	worker w[THREADS];
	atomic_store(&readers_stop, false);
	pthread_create(&rd, NULL, reader, e);
	for (int i = 0; i < THREADS; i++) {
		w[i] = (worker){ e, buf, i };
		pthread_create(&th[i], NULL, submitter, &w[i]);
	}
	for (int i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	atomic_store(&readers_stop, true);
	pthread_join(rd, NULL);
	te_stats s = stats_of(e);
	CHECK_EQ(s.requests[0], THREADS * ROUNDS * 2);
	CHECK_EQ(s.requests[1], THREADS * ROUNDS * 2);
	CHECK_EQ(s.completed[0] + s.completed[1], THREADS * ROUNDS * 4);
	CHECK_EQ(s.bytes[1], 512ull * THREADS * ROUNDS * 2);
	CHECK_EQ(s.in_flight, 0);
	CHECK_EQ(te_unregister_memory(e, buf), 0);
	te_engine_destroy(e);
	free(buf);
}

int main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	te_set_log_level(TE_LOG_ERROR);
	TEST_RUN(test_tcp);
	TEST_RUN(test_shm);
	TEST_RUN(test_hold_devices_cancel);
	TEST_RUN(test_devices_bound);
	TEST_RUN(test_exposition);
	TEST_RUN(test_rpc_auth);
	TEST_RUN(test_off);
	TEST_RUN(test_size_versioning);
	TEST_RUN(test_peers_option);
	TEST_RUN(test_concurrent);
	TEST_RUN(test_many_peers);
	TEST_RUN(test_busiest_peers);
	TEST_RUN(test_peer_names_bound);
	return check_done();
}
