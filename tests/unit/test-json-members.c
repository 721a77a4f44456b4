/* SPDX-License-Identifier: Apache-2.0 */
/* te_json_load_members(): the members asked for, whatever the skipped ones
 * hold (strings with escaped quotes and brackets, nested containers, long
 * arrays); the check still runs on the whole text; a root that is not an
 * object comes back whole; and it is much cheaper than the whole tree for a
 * descriptor of many buffers. */
#include <json-glib/json-glib.h>
#include <te/te-json.h>
#include <time.h>

#include "../common/check.h"

static const char *const names[] = { "port", "obj", "s", NULL };

static JsonNode *load(const char *text, char *why, size_t n)
{
	return te_json_load_members(text, strlen(text), NULL, names, why, n);
}

static void test_picks(void)
{
	char why[160];
	const char *t = " { \"skip\" : \"a \\\" } ] , \\\\\" , \"port\" :8080,\"arr\":[1,{\"port\":1},\"]\"] ,"
			"\"obj\":{\"x\":[true,null],\"y\":\"}\"},\"n\":-1.5e3,\"t\":true,\"s\":\"v\\u00e9\", \"z\":null }";
	JsonNode *r = load(t, why, sizeof why);
	REQUIRE(r != NULL && JSON_NODE_HOLDS_OBJECT(r));
	JsonObject *o = json_node_get_object(r);
	uint64_t v = 0;
	CHECK_EQ(json_object_get_size(o), 3);
	CHECK(te_json_get_u64(o, "port", 65535, &v) == 0 && v == 8080);
	JsonNode *obj = json_object_get_member(o, "obj");
	CHECK(obj != NULL && JSON_NODE_HOLDS_OBJECT(obj) &&
	      strcmp(json_object_get_string_member(json_node_get_object(obj), "y"), "}") == 0);
	CHECK(json_object_has_member(o, "s") && strcmp(json_object_get_string_member(o, "s"), "v\xc3\xa9") == 0);
	CHECK(!json_object_has_member(o, "skip") && !json_object_has_member(o, "arr"));
	json_node_unref(r);

	/* Last member, scalar before the close, and none of the names at all. */
	r = load("{\"a\":[],\"port\":7}", why, sizeof why);
	CHECK(r != NULL && json_object_get_int_member(json_node_get_object(r), "port") == 7);
	json_node_unref(r);
	r = load("{\"a\":{}}", why, sizeof why);
	CHECK(r != NULL && json_object_get_size(json_node_get_object(r)) == 0);
	json_node_unref(r);
	r = load("{}", why, sizeof why);
	CHECK(r != NULL && json_object_get_size(json_node_get_object(r)) == 0);
	json_node_unref(r);
	/* A key spelled with escapes is not the name. */
	r = load("{\"p\\u006frt\":1}", why, sizeof why);
	CHECK(r != NULL && !json_object_has_member(json_node_get_object(r), "port"));
	json_node_unref(r);
	/* Not an object: whole. */
	r = load("[1,2]", why, sizeof why);
	CHECK(r != NULL && JSON_NODE_HOLDS_ARRAY(r));
	json_node_unref(r);
}

static void test_checked(void)
{
	char why[160];
	/* A fault in a member that is skipped still refuses the text. */
	CHECK(load("{\"port\":1,\"skip\":[1,}", why, sizeof why) == NULL && why[0] != '\0');
	CHECK(load("{\"port\":1,\"port\":2}", why, sizeof why) == NULL && strstr(why, "repeated") != NULL);
	/* The limits hold for the skipped part too: depth 3 allowed, 4 nested. */
	te_json_limits lim = TE_JSON_LIMITS_DEFAULT;
	lim.max_depth = 3;
	const char *deep = "{\"port\":1,\"skip\":[[[1]]]}";
	CHECK(te_json_load_members(deep, strlen(deep), &lim, names, why, sizeof why) == NULL &&
	      strstr(why, "deeper") != NULL);
	CHECK(load("{\"port\":1", why, sizeof why) == NULL);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A descriptor of 10,000 buffers: the few members at least 5 x faster than
 * the whole tree (measured here: tens of times). */
static void test_cheaper(void)
{
	GString *g = g_string_new("{\"name\":\"h:1\",\"protocol\":\"tcp\",\"buffers\":[");
	for (int i = 0; i < 10000; i++)
		g_string_append_printf(g, "%s{\"name\":\"cpu:0\",\"addr\":%d,\"length\":4096,\"lkey\":[%d],\"rkey\":[%d]}",
				       i ? "," : "", 4096 * (i + 1), i, i);
	g_string_append(g, "],\"port\":5000}");
	char why[160];
	double best_m = 1e9, best_w = 1e9;
	for (int k = 0; k < 3; k++) {
		double t0 = now_s();
		JsonNode *m = te_json_load_members(g->str, g->len, NULL, names, why, sizeof why);
		double t1 = now_s();
		JsonNode *w = te_json_load(g->str, g->len, NULL, why, sizeof why);
		double t2 = now_s();
		REQUIRE(m != NULL && w != NULL);
		CHECK_EQ(json_object_get_int_member(json_node_get_object(m), "port"), 5000);
		json_node_unref(m);
		json_node_unref(w);
		best_m = t1 - t0 < best_m ? t1 - t0 : best_m;
		best_w = t2 - t1 < best_w ? t2 - t1 : best_w;
	}
	printf("10,000 buffers (%zu bytes): members %.2f ms, whole tree %.2f ms\n", g->len, best_m * 1e3, best_w * 1e3);
#ifndef TE_SANITIZED /* sanitizers change the ratio */
	CHECK(best_m * 5 < best_w);
#endif
	g_string_free(g, TRUE);
}

int main(void)
{
	TEST_RUN(test_picks);
	TEST_RUN(test_checked);
	TEST_RUN(test_cheaper);
	return check_done();
}
