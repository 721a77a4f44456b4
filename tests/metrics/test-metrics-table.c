/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The metrics table (libte/metrics-table.h, docs/metrics.md "Adding a
 * metric"): its rows cover every byte of te_stats after the header exactly
 * once; its families, types and JSON keys are the exported ones (frozen
 * below: the bindings and dashboards read them); the exposition prints its
 * families and nothing else, in its order, each with samples; the JSON form
 * holds its keys and nothing else; and each te_stats field is the sum, over
 * what the JSON form shows, of the row that names it.
 */
#include <glib.h>
#include <json-glib/json-glib.h>
#include <stddef.h>
#include <stdint.h>

#include "../../libte/metrics-table.h"
#include "../common/util.h"
#include "metric-util.h"
#include "../plugins/hold.h"

#define BUF (1u << 16)

typedef struct row {
	const char *scope, *id, *type, *prom, *json, *help;
	size_t off, size; /* in te_stats; size 0: not in it */
	const char *field;
} row;

#define COV_TE_MS_(f) offsetof(te_stats, f), sizeof(((te_stats *)0)->f), #f
#define COV_TE_MS_NONE 0, 0, NULL
#define COV(stats) COV_##stats
#define ROW(scope, id, kind, prom, json, stats, help) { #scope, #id, TE_MTYPE_##kind, prom, json, help, COV(stats) },
#define RESULT(id, stats) { "RESULT", #id, NULL, NULL, #id, NULL, COV(stats) },

static const row rows[] = { TE_MTABLE(ROW) };
static const row results[] = { TE_MTABLE_RPC_RESULTS(RESULT) };
#define N_ROWS (sizeof rows / sizeof rows[0])
#define N_RESULTS (sizeof results / sizeof results[0])

/* What libte exports, as the bindings, te-top, the dashboard and scrapers
 * know it. A metric added to the table is added here too. */
static const struct {
	const char *prom, *type, *json;
} frozen[] = {
	{ "te_transfer_requests_total", "counter", "requests" },
	{ "te_transfer_bytes_total", "counter", "bytes" },
	{ "te_transfer_completed_total", "counter", "completed" },
	{ "te_transfer_failed_total", "counter", "failed" },
	{ "te_transfer_canceled_total", "counter", "canceled" },
	{ "te_transfer_in_flight", "gauge", "in_flight" },
	{ "te_transfer_in_flight_bytes", "gauge", "in_flight_bytes" },
	{ "te_transfer_latency_seconds", "histogram", "latency" },
	{ "te_peer_bytes_total", "counter", "bytes" },
	{ "te_peer_requests_total", "counter", "requests" },
	{ "te_peer_failed_total", "counter", "failed" },
	{ "te_device_bytes_total", "counter", "bytes" },
	{ "te_device_in_flight_bytes", "gauge", "in_flight_bytes" },
	{ "te_device_bandwidth_bytes_per_second", "gauge", "bandwidth_bytes_per_second" },
	{ "te_device_retries_total", "counter", "retries" },
	{ "te_device_failovers_total", "counter", "failovers" },
	{ "te_device_errors_total", "counter", "errors" },
	{ "te_transport_retries_total", "counter", "retries" },
	{ "te_transport_failovers_total", "counter", "failovers" },
	{ "te_transport_errors_total", "counter", "errors" },
	{ "te_notify_sent_total", "counter", "notifies.sent" },
	{ "te_notify_received_total", "counter", "notifies.received" },
	{ "te_registered_memory_bytes", "gauge", "memory.registered_bytes" },
	{ "te_registered_memory_regions", "gauge", "memory.registered_regions" },
	{ "te_auth_refused_total", "counter", "auth_refused" },
	{ "te_rpc_frames_total", "counter", "rpc" },
};

/* Every byte of te_stats past `size` and `reserved` belongs to exactly one
 * row (or RPC result); the header to none. */
static void test_stats_coverage(void)
{
	unsigned cover[sizeof(te_stats)] = { 0 };
	const char *who[sizeof(te_stats)] = { 0 };
	int bad = 0;

	for (size_t i = 0; i < N_ROWS + N_RESULTS; i++) {
		const row *r = i < N_ROWS ? &rows[i] : &results[i - N_ROWS];
		for (size_t b = r->off; b < r->off + r->size; b++) {
			cover[b]++;
			who[b] = r->field;
		}
	}
	for (size_t b = 0; b < sizeof(te_stats); b++) {
		unsigned want = b < offsetof(te_stats, requests) ? 0 : 1;
		if (cover[b] != want) {
			if (bad++ < 8)
				fprintf(stderr, "te_stats byte %zu: %u rows (%s), want %u\n", b, cover[b],
					who[b] ? who[b] : "none", want);
		}
	}
	CHECK_EQ(bad, 0);
}

static void test_frozen(void)
{
	CHECK_EQ(N_ROWS, sizeof frozen / sizeof frozen[0]);
	for (size_t i = 0; i < N_ROWS && i < sizeof frozen / sizeof frozen[0]; i++) {
		if (strcmp(rows[i].prom, frozen[i].prom) != 0 || strcmp(rows[i].type, frozen[i].type) != 0 ||
		    strcmp(rows[i].json, frozen[i].json) != 0)
			fprintf(stderr, "row %zu: %s %s %s, exported as %s %s %s\n", i, rows[i].prom, rows[i].type,
				rows[i].json, frozen[i].prom, frozen[i].type, frozen[i].json);
		CHECK(strcmp(rows[i].prom, frozen[i].prom) == 0);
		CHECK(strcmp(rows[i].type, frozen[i].type) == 0);
		CHECK(strcmp(rows[i].json, frozen[i].json) == 0);
	}
	/* Families are unique; so are JSON keys within a scope. */
	for (size_t i = 0; i < N_ROWS; i++)
		for (size_t j = i + 1; j < N_ROWS; j++) {
			CHECK(strcmp(rows[i].prom, rows[j].prom) != 0);
			CHECK(strcmp(rows[i].scope, rows[j].scope) != 0 || strcmp(rows[i].json, rows[j].json) != 0);
		}
}

/* An engine with a transport, a peer and a device, each with counts that
 * differ: one write held and failed (a device error, a fail-over, a
 * retry), then two writes and a read moved. */
static void pair_with_counts(engine_pair *p)
{
	te_batch_id b;

	hold_find();
	engine_pair_up(p, "hold", BUF);
	te_request r[3] = {
		{ TE_OP_WRITE, p->seg, p->abuf, (uintptr_t)p->bbuf, 1000 },
		{ TE_OP_WRITE, p->seg, p->abuf + 1000, (uintptr_t)p->bbuf + 1000, 500 },
		{ TE_OP_READ, p->seg, p->abuf + 2000, (uintptr_t)p->bbuf + 2000, 300 },
	};
	REQUIRE(te_batch_alloc(p->a, 4, &b) == 0);
	CHECK_EQ(te_submit(p->a, b, r, 1), 0);
	CHECK_EQ(hold_release(-EIO), 1);
	CHECK_EQ(te_batch_wait(p->a, b, 10000), 0);
	CHECK_EQ(te_submit(p->a, b, r, 3), 0);
	CHECK_EQ(hold_release(0), 3);
	CHECK_EQ(te_batch_wait(p->a, b, 10000), 0);
	CHECK_EQ(te_batch_free(p->a, b), 0);
}

static bool is_hist_part(const char *name, size_t len, const char *fam)
{
	size_t n = strlen(fam);
	if (len <= n || strncmp(name, fam, n) != 0)
		return false;
	name += n;
	len -= n;
	return (len == 7 && strncmp(name, "_bucket", 7) == 0) || (len == 4 && strncmp(name, "_sum", 4) == 0) ||
	       (len == 6 && strncmp(name, "_count", 6) == 0);
}

/* The exposition: the table's families in its order, with its help and
 * type, each with samples of its own name only. */
static void test_text(void)
{
	engine_pair p;
	char *text = NULL;
	size_t len = 0, fi = 0, samples = 0;

	pair_with_counts(&p);
	REQUIRE(te_metrics_text(p.a, &text, &len) == 0);
	gchar **lines = g_strsplit(text, "\n", -1);
	for (gchar **l = lines; *l != NULL; l++) {
		char want[1024];
		if (**l == '\0')
			continue;
		if (strncmp(*l, "# HELP ", 7) == 0) {
			if (fi > 0)
				CHECK(samples > 0); /* the previous family printed */
			samples = 0;
			CHECK(fi < N_ROWS);
			if (fi >= N_ROWS) {
				fprintf(stderr, "a family the table lacks: %s\n", *l);
				break;
			}
			snprintf(want, sizeof want, "# HELP %s %s", rows[fi].prom, rows[fi].help);
			if (strcmp(*l, want) != 0)
				fprintf(stderr, "got %s\nwant %s\n", *l, want);
			CHECK(strcmp(*l, want) == 0);
		} else if (strncmp(*l, "# TYPE ", 7) == 0) {
			REQUIRE(fi < N_ROWS);
			snprintf(want, sizeof want, "# TYPE %s %s", rows[fi].prom, rows[fi].type);
			CHECK(strcmp(*l, want) == 0);
			fi++;
		} else {
			REQUIRE(fi > 0);
			const row *r = &rows[fi - 1];
			size_t n = strcspn(*l, "{ ");
			bool ok = (n == strlen(r->prom) && strncmp(*l, r->prom, n) == 0) ||
				  (strcmp(r->type, "histogram") == 0 && is_hist_part(*l, n, r->prom));
			if (!ok)
				fprintf(stderr, "sample outside family %s: %s\n", r->prom, *l);
			CHECK(ok);
			samples++;
		}
	}
	CHECK(samples > 0);
	CHECK_EQ(fi, N_ROWS);
	g_strfreev(lines);
	te_free(text);
	engine_pair_down(&p);
}

static bool in_list(const char *s, const char *const *list)
{
	for (; *list != NULL; list++)
		if (strcmp(s, *list) == 0)
			return true;
	return false;
}

/* The rows of the scopes in `scopes` whose JSON key is `key`. */
static const row *row_of(const char *key, const char *const *scopes)
{
	for (size_t i = 0; i < N_ROWS; i++)
		if (in_list(rows[i].scope, scopes) && strcmp(rows[i].json, key) == 0)
			return &rows[i];
	return NULL;
}

static size_t rows_in(const char *const *scopes)
{
	size_t n = 0;
	for (size_t i = 0; i < N_ROWS; i++)
		n += in_list(rows[i].scope, scopes);
	return n;
}

/* Every member of `o` is a label or a row of `scopes`, and every such row
 * is there. */
static void check_members(JsonObject *o, const char *const *labels, const char *const *scopes)
{
	GList *ms = json_object_get_members(o);
	size_t n = 0;
	for (GList *m = ms; m != NULL; m = m->next) {
		const char *k = m->data;
		if (in_list(k, labels))
			continue;
		bool ok = row_of(k, scopes) != NULL;
		if (!ok)
			fprintf(stderr, "JSON key the table lacks: %s (a %s row)\n", k, scopes[0]);
		CHECK(ok);
		n++;
	}
	CHECK_EQ(n, rows_in(scopes));
	g_list_free(ms);
}

static const char *const tp_scopes[] = { "OP", "OPG", "LAT", NULL };
static const char *const ev_scopes[] = { "TP", NULL };
static const char *const peer_scopes[] = { "PEER", NULL };
static const char *const dev_scopes[] = { "DEV", "DEVF", NULL };

/* The array `name` of `root`, each element checked. */
static JsonArray *section(JsonObject *root, const char *name, const char *const *labels, const char *const *scopes)
{
	REQUIRE(json_object_has_member(root, name));
	JsonArray *a = json_object_get_array_member(root, name);
	REQUIRE(a != NULL);
	CHECK(json_array_get_length(a) > 0);
	for (guint i = 0; i < json_array_get_length(a); i++)
		check_members(json_array_get_object_element(a, i), labels, scopes);
	return a;
}

/* A te_stats field, [op] for a two-element one. */
static uint64_t stat_of(const te_stats *s, const row *r, unsigned op)
{
	uint64_t v[2] = { 0, 0 };
	memcpy(v, (const char *)s + r->off, r->size);
	return v[r->size > sizeof(uint64_t) ? op : 0];
}

/* Sum of key `k` over the elements of `a` (of operation `op` if >= 0). */
static uint64_t sum_of(JsonArray *a, const char *k, int op)
{
	uint64_t v = 0;
	for (guint i = 0; a != NULL && i < json_array_get_length(a); i++) {
		JsonObject *o = json_array_get_object_element(a, i);
		if (op >= 0 && strcmp(json_object_get_string_member(o, "op"), op ? "write" : "read") != 0)
			continue;
		if (json_object_has_member(o, k))
			v += (uint64_t)json_object_get_int_member(o, k);
	}
	return v;
}

/* A value of the JSON form lies between two te_stats readings around it. */
static void check_between(const row *r, unsigned op, uint64_t v, const te_stats *s0, const te_stats *s1)
{
	uint64_t a = stat_of(s0, r, op), b = stat_of(s1, r, op);
	bool ok = (a <= v && v <= b) || (b <= v && v <= a);
	if (!ok)
		fprintf(stderr, "te_stats.%s[%u] %llu..%llu, its row in JSON %llu\n", r->field, op,
			(unsigned long long)a, (unsigned long long)b, (unsigned long long)v);
	CHECK(ok);
}

static void test_json(void)
{
	static const char *const tp_labels[] = { "transport", "op", NULL };
	static const char *const ev_labels[] = { "transport", NULL };
	static const char *const peer_labels[] = { "peer", "other", "op", NULL };
	static const char *const dev_labels[] = { "transport", "device", NULL };
	static const char *const rpc_labels[] = { "kind", NULL };
	static const char *const top_labels[] = { "segment", "transports", "transport_events", "peers", "devices",
						   NULL };
	engine_pair p;
	char *json = NULL;
	te_stats s0 = { .size = sizeof s0 }, s1 = { .size = sizeof s1 };
	GError *err = NULL;

	pair_with_counts(&p);
	CHECK_EQ(te_engine_stats(p.a, &s0), 0);
	REQUIRE(te_engine_stats_json(p.a, &json) == 0);
	CHECK_EQ(te_engine_stats(p.a, &s1), 0);
	JsonParser *jp = json_parser_new();
	REQUIRE(json_parser_load_from_data(jp, json, -1, &err));
	JsonObject *root = json_node_get_object(json_parser_get_root(jp));
	REQUIRE(root != NULL);

	JsonArray *tps = section(root, "transports", tp_labels, tp_scopes);
	JsonArray *evs = section(root, "transport_events", ev_labels, ev_scopes);
	section(root, "peers", peer_labels, peer_scopes);
	JsonArray *devs = section(root, "devices", dev_labels, dev_scopes);

	/* The top level: structure, the RPC row's array, the ENGINE rows
	 * ("group.key" inside objects). */
	static const char *const rpc_scopes[] = { "RPC", NULL }, *const eng_scopes[] = { "ENGINE", NULL };
	const row *rpc = NULL;
	size_t engine = 0;
	for (size_t i = 0; i < N_ROWS && rpc == NULL; i++)
		if (in_list(rows[i].scope, rpc_scopes))
			rpc = &rows[i];
	REQUIRE(rpc != NULL);
	GList *ms = json_object_get_members(root);
	for (GList *m = ms; m != NULL; m = m->next) {
		const char *k = m->data;
		JsonNode *n = json_object_get_member(root, k);
		if (in_list(k, top_labels) || strcmp(k, rpc->json) == 0)
			continue;
		if (JSON_NODE_HOLDS_OBJECT(n)) {
			GList *gs = json_object_get_members(json_node_get_object(n));
			for (GList *g = gs; g != NULL; g = g->next) {
				char *path = g_strdup_printf("%s.%s", k, (const char *)g->data);
				const row *r = row_of(path, eng_scopes);
				if (r == NULL)
					fprintf(stderr, "JSON key the table lacks: %s\n", path);
				CHECK(r != NULL);
				if (r != NULL && r->size != 0)
					check_between(r, 0, (uint64_t)json_object_get_int_member(json_node_get_object(n),
												 g->data),
						      &s0, &s1);
				engine++;
				g_free(path);
			}
			g_list_free(gs);
			continue;
		}
		const row *r = row_of(k, eng_scopes);
		if (r == NULL)
			fprintf(stderr, "JSON key the table lacks: %s\n", k);
		CHECK(r != NULL);
		if (r != NULL && r->size != 0)
			check_between(r, 0, (uint64_t)json_node_get_int(n), &s0, &s1);
		engine++;
	}
	g_list_free(ms);
	CHECK_EQ(engine, rows_in(eng_scopes));
	JsonArray *rpcs = json_object_get_array_member(root, rpc->json);
	REQUIRE(rpcs != NULL);
	for (guint i = 0; i < json_array_get_length(rpcs); i++) {
		JsonObject *o = json_array_get_object_element(rpcs, i);
		GList *ks = json_object_get_members(o);
		size_t n = 0;
		for (GList *k = ks; k != NULL; k = k->next) {
			bool found = in_list(k->data, rpc_labels);
			for (size_t j = 0; j < N_RESULTS && !found; j++)
				found = strcmp(results[j].json, k->data) == 0 && ++n;
			CHECK(found);
		}
		CHECK_EQ(n, N_RESULTS);
		g_list_free(ks);
	}

	/* Each te_stats field is its row summed over what the JSON shows. */
	for (size_t i = 0; i < N_ROWS; i++) {
		const row *r = &rows[i];
		if (r->size == 0)
			continue;
		if (strcmp(r->scope, "OP") == 0) {
			for (int op = 0; op < 2; op++)
				check_between(r, (unsigned)op, sum_of(tps, r->json, op), &s0, &s1);
		} else if (strcmp(r->scope, "OPG") == 0) {
			check_between(r, 0, sum_of(tps, r->json, -1), &s0, &s1);
		} else if (strcmp(r->scope, "TP") == 0) {
			check_between(r, 0, sum_of(evs, r->json, -1) + sum_of(devs, r->json, -1), &s0, &s1);
		} else {
			CHECK(strcmp(r->scope, "ENGINE") == 0); /* checked above */
		}
	}
	for (size_t j = 0; j < N_RESULTS; j++)
		check_between(&results[j], 0, sum_of(rpcs, results[j].json, -1), &s0, &s1);
	/* Not all zero: the sums compare counts that happened. */
	check_op_counts("the sums", &s1, TE_OP_WRITE, 3, 2, 1, 1500);
	CHECK_EQ(s1.bytes[TE_OP_READ], 300);
	CHECK_EQ(s1.failovers, 1);
	CHECK_EQ(s1.retries, 1);
	CHECK_EQ(s1.registered_bytes, BUF);

	g_object_unref(jp);
	te_free(json);
	engine_pair_down(&p);
}

int main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	te_set_log_level(TE_LOG_ERROR);
	TEST_RUN(test_stats_coverage);
	TEST_RUN(test_frozen);
	TEST_RUN(test_text);
	TEST_RUN(test_json);
	return check_done();
}
