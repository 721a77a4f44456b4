/* SPDX-License-Identifier: Apache-2.0 */
/* te_json_check(): every rule and every limit, each broken once, and the
 * largest input inside each limit accepted. */
#include <te/te-json.h>
#include <time.h>

#include "../common/check.h"
#include "../common/hostile.h"

static int chk(const char *s, const te_json_limits *lim)
{
	char why[160];
	int rc = te_json_check(s, strlen(s), lim, why, sizeof why);
	if (rc < 0 && why[0] == '\0')
		return -9999; /* every refusal must say why */
	return rc;
}

/* chk() gives `want` for every one of `texts`; each miss is printed after
 * `what`. */
static void chk_each(const char *const *texts, size_t n, int want, const char *what)
{
	for (size_t i = 0; i < n; i++) {
		int rc = chk(texts[i], NULL);
		if (rc != want)
			fprintf(stderr, "%s: '%s' (%d)\n", what, texts[i], rc);
		CHECK_EQ(rc, want);
	}
}

/* "[[[...]]]" or {"a":{"a":...}} nested `depth` levels. */
static void test_valid(void)
{
	const char *ok[] = {
		"{}", "[]", "1", "-0", "0.5e-3", "\"x\"", "true", "false", "null", " [ 1 , 2 ] ",
		"{\"a\":[],\"b\":{},\"c\":\"\\u00e9\\n\\\"\",\"d\":-9223372036854775808}",
		"9223372036854775807", "{\"a\":{\"a\":1},\"b\":{\"a\":2}}", "[[],[[]],{}]",
		"{ \"k\" : { } }", "1e300", "-1.5E+10", "\"\\ud83d\\ude00 \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"",
		"\"\\u00e9\\uFFFF\"", "\"a\tb\x1f\"", /* raw control characters, as json-glib writes */
	};
	chk_each(ok, sizeof ok / sizeof *ok, 0, "refused valid");
}

static void test_malformed(void)
{
	const char *bad[] = {
		"", " ", "[", "]", "{", "[1,]", "[,1]", "{\"a\":1,}", "{,}", "{\"a\"}", "{\"a\" 1}",
		"{1:2}", "[1 2]", "01", "1.", ".5", "-", "1e", "+1", "NaN", "-Infinity", "Infinity",
		"nul", "tru", "'a'", "\"a", "\"\\x\"", "\"\\u12g4\"", "[1]]", "[1] x",
		"{}{}", "// c\n1", "[\"\\u00\"]", "{\"a\":1 \"b\":2}", "[}", "{]",
		/* lone surrogates, an escaped NUL, bytes that are not UTF-8 */
		"\"\\ud800\"", "\"\\ud800x\"", "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"a\\u0000b\"",
		"\"\xff\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"", "\"\xe2\x82\"",
		"\"\x80\"",
	};
	chk_each(bad, sizeof bad / sizeof *bad, -EINVAL, "accepted or misjudged");
	/* A NUL inside the text is not JSON. */
	char why[128];
	CHECK_EQ(te_json_check("[1,\0 2]", 7, NULL, why, sizeof why), -EINVAL);
	CHECK_EQ(te_json_check("\"a\0b\"", 5, NULL, why, sizeof why), -EINVAL);
	CHECK_EQ(te_json_check(NULL, 0, NULL, why, sizeof why), -EINVAL);
}

static void test_depth(void)
{
	te_json_limits lim = TE_JSON_LIMITS_DEFAULT;
	for (int obj = 0; obj < 2; obj++) {
		char *at = hostile_deep(TE_JSON_MAX_DEPTH, obj), *over = hostile_deep(TE_JSON_MAX_DEPTH + 1, obj);
		CHECK_EQ(chk(at, NULL), 0);
		CHECK_EQ(chk(over, NULL), -E2BIG);
		free(at);
		free(over);
	}
	/* The attack: 300,000 levels in 600 KB, refused without recursion. */
	char *deep = hostile_deep(300000, 0);
	CHECK_EQ(chk(deep, NULL), -E2BIG);
	free(deep);
	/* Deep nesting where a string member's value belongs. */
	const char *pre = "{\"name\":";
	char *d = hostile_deep(1000, 1), *s = malloc(strlen(pre) + strlen(d) + 2);
	sprintf(s, "%s%s}", pre, d);
	CHECK_EQ(chk(s, NULL), -E2BIG);
	free(s);
	free(d);
	/* A caller's tighter bound, and the cap on a looser one. */
	lim.max_depth = 2;
	CHECK_EQ(chk("[[1]]", &lim), 0);
	CHECK_EQ(chk("[[[1]]]", &lim), -E2BIG);
	lim.max_depth = 100000;
	char *cap = hostile_deep(TE_JSON_DEPTH_CAP + 1, 0);
	CHECK_EQ(chk(cap, &lim), -E2BIG);
	free(cap);
}

static void test_counts(void)
{
	te_json_limits lim = TE_JSON_LIMITS_DEFAULT;
	char *a = hostile_array("", TE_JSON_MAX_ITEMS, "0", "");
	CHECK_EQ(chk(a, NULL), 0);
	free(a);
	a = hostile_array("", 1000000, "0", ""); /* a 1M-element array */
	CHECK_EQ(chk(a, NULL), -E2BIG);
	free(a);
	/* Values over the document: many arrays, each under the item limit. */
	lim.max_values = 100;
	a = hostile_array("", 60, "[1]", "");
	CHECK_EQ(chk(a, &lim), -E2BIG);
	free(a);
	a = hostile_array("", 40, "[1]", "");
	CHECK_EQ(chk(a, &lim), 0);
	free(a);
	/* Members of one object. */
	lim = (te_json_limits)TE_JSON_LIMITS_DEFAULT;
	lim.max_items = 3;
	CHECK_EQ(chk("{\"a\":1,\"b\":2,\"c\":3}", &lim), 0);
	CHECK_EQ(chk("{\"a\":1,\"b\":2,\"c\":3,\"d\":4}", &lim), -E2BIG);
	CHECK_EQ(chk("[1,2,3]", &lim), 0);
	CHECK_EQ(chk("[1,2,3,4]", &lim), -E2BIG);
}

static void test_strings(void)
{
	te_json_limits lim = TE_JSON_LIMITS_DEFAULT;
	lim.max_string = 8;
	CHECK_EQ(chk("\"12345678\"", &lim), 0);
	CHECK_EQ(chk("\"123456789\"", &lim), -E2BIG);
	CHECK_EQ(chk("{\"123456789\":1}", &lim), -E2BIG); /* keys too */
	/* A huge string under the default limit. */
	size_t n = TE_JSON_MAX_STRING + 10;
	char *s = malloc(n + 3);
	s[0] = '"';
	memset(s + 1, 'x', n);
	s[n + 1] = '"';
	s[n + 2] = '\0';
	CHECK_EQ(chk(s, NULL), -E2BIG);
	/* The text as a whole. */
	lim = (te_json_limits)TE_JSON_LIMITS_DEFAULT;
	lim.max_text = 100;
	CHECK_EQ(chk(s, &lim), -E2BIG);
	free(s);
}

static void test_numbers(void)
{
	te_json_limits lim = TE_JSON_LIMITS_DEFAULT;

	CHECK_EQ(chk("18446744073709551616", NULL), -ERANGE); /* 2^64 */
	CHECK_EQ(chk("9223372036854775808", NULL), -ERANGE);  /* 2^63: parsers wrap it */
	CHECK_EQ(chk("18446744073709551615", NULL), -ERANGE);
	CHECK_EQ(chk("[99999999999999999999999]", NULL), -ERANGE);
	CHECK_EQ(chk("-9223372036854775809", NULL), -ERANGE);
	/* Numbers that round to no finite double: json-glib reads infinity. */
	const char *inf[] = {
		"1e309", "1.8e308", "-1.8e308", "1.7976931348623159e308", "0.1e310", "1E+309",
		"100000000000000000000000000000000e300", /* 1e332, under 40 characters */
		"1000000000000000000000000000000000000000e300", /* a 40-digit mantissa */
		"1e99999999999999999999", "1e999999999999", "-1e999999999999999999999999999999",
		"1e0000000000000000000000000000000000000000000000000000000000000000000309",
		"0.001e312", "[1,{\"a\":2e308}]",
		/* 2^1024 - 2^970, halfway between DBL_MAX and 2^1024: rounds up */
		"17976931348623158079372897140530341507993413271003782693617377898044496829276475094664"
		"90179775872070963302864166928879109465555478519404026306574886715058206819089020007083"
		"83676273854845817711531764475730270069855571366959622842914819860834936475292719074168"
		"444365510704342711559699508093042880177904174497792.0",
		"0.17976931348623158079372897140530341507993413271003782693617377898044496829276475094664"
		"90179775872070963302864166928879109465555478519404026306574886715058206819089020007083"
		"83676273854845817711531764475730270069855571366959622842914819860834936475292719074168"
		"4443655107043427115596995080930428801779041744977920000000000000000001e309",
	};
	chk_each(inf, sizeof inf / sizeof *inf, -ERANGE, "accepted or misjudged");
	/* Finite ones, however written; too small for a double is 0 or a
	 * denormal, finite, and passes. */
	const char *fin[] = {
		"1.7976931348623157e308", "-1.7976931348623157e308", "1.7976931348623158e308",
		"0.17976931348623157e309", "1e308", "0.001e311", "1e-400", "-1e-400", "4.9e-324",
		"1e-99999999999999999999", "0e999999999999999999", "0.0e99999", "-0.0",
		"1e0000000000000000000000000000000000000000000000000000000000000000000308",
		"0.00000000000000000000000000000000000000001", "[1e300,-1e-300,{\"a\":5e-324}]",
		"123456789012345678901234567890123456789012345678901234567890.5e200",
		/* one below 2^1024 - 2^970: DBL_MAX */
		"17976931348623158079372897140530341507993413271003782693617377898044496829276475094664"
		"90179775872070963302864166928879109465555478519404026306574886715058206819089020007083"
		"83676273854845817711531764475730270069855571366959622842914819860834936475292719074168"
		"444365510704342711559699508093042880177904174497791.9999999999999999999999999999999",
	};
	chk_each(fin, sizeof fin / sizeof *fin, 0, "refused finite");
	/* The check and strtod() agree on every number near the edge, written
	 * in several ways: digits drawn around DBL_MAX's, the point moved. */
	uint64_t x = 88172645463325252ull;
	char num[64], digits[40];
	int disagree = 0;
	for (int t = 0; t < 20000; t++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		int nd = 17 + (int)(x % 20), point = 1 + (int)((x >> 8) % 3);
		snprintf(digits, sizeof digits, "%s", "17976931348623157");
		if ((x >> 16) % 4 == 0)
			digits[16] = (char)('6' + (x >> 20) % 4); /* ...156 to ...159 */
		for (int j = 17; j < nd; j++)
			digits[j] = (char)('0' + (x >> (24 + j)) % 10);
		digits[nd] = '\0';
		snprintf(num, sizeof num, "%.*s.%se%d", point, digits, digits + point, 309 - point);
		double d = strtod(num, NULL);
		int finite = d <= 1.7976931348623157e308;
		if ((chk(num, NULL) == 0) != finite && disagree++ < 5)
			fprintf(stderr, "check and strtod() disagree on %s\n", num);
	}
	CHECK_EQ(disagree, 0);
	/* A number is a token the parser copies: the string limit bounds it. */
	lim.max_string = 8;
	CHECK_EQ(chk("123456.5", &lim), 0);
	CHECK_EQ(chk("123456.55", &lim), -E2BIG);
	CHECK_EQ(chk("[1e0000000001]", &lim), -E2BIG);
}

static void test_duplicates(void)
{
	CHECK_EQ(chk("{\"a\":1,\"a\":2}", NULL), -EEXIST);
	CHECK_EQ(chk("{\"a\":1,\"\\u0061\":2}", NULL), -EEXIST);
	CHECK_EQ(chk("{\"a\":{\"b\":1,\"b\":1}}", NULL), -EEXIST);
	CHECK_EQ(chk("{\"a\":{\"b\":1},\"b\":{\"a\":1}}", NULL), 0); /* per object */
	/* One key, two spellings: json-glib decodes both to the same UTF-8 and
	 * keeps the last. */
	const char *twins[] = {
		"{\"\xc3\xa9\":1,\"\\u00e9\":2}",                  /* raw é, escaped é */
		"{\"\\u00E9\":1,\"\xc3\xa9\":2}",                  /* upper-case hex first */
		"{\"/\":1,\"\\/\":2}",                             /* \/ is / */
		"{\"a/b\":1,\"a\\/b\":2}",
		"{\"\xf0\x9f\x98\x80\":1,\"\\ud83d\\ude00\":2}",    /* raw U+1F600, its surrogate pair */
		"{\"\\uD83D\\uDE00x\":1,\"\xf0\x9f\x98\x80x\":2}",
		"{\"\xe2\x82\xac\":1,\"\\u20ac\":2}",              /* 3-byte UTF-8 */
		"{\"\\n\":1,\"\\u000a\":2}", "{\"\\\"\":1,\"\\u0022\":2}", "{\"\\\\\":1,\"\\u005c\":2}",
		"{\"\\t\":1,\"\t\":2}",                            /* raw tab, as json-glib writes it */
		"{\"x\xc3\xa9y\":1,\"z\":0,\"x\\u00e9y\":2}",
		"{\"k\":{\"\xf4\x8f\xbf\xbf\":1,\"\\udbff\\udfff\":2}}", /* U+10FFFF */
	};
	chk_each(twins, sizeof twins / sizeof *twins, -EEXIST, "missed a repeated key");
	/* Keys that differ in one code point, or only in length, are two. */
	const char *two[] = {
		"{\"\xc3\xa9\":1,\"e\":2}", "{\"\\u00e9\":1,\"\\u00ea\":2}",
		"{\"\xf0\x9f\x98\x80\":1,\"\\ud83d\\ude01\":2}", "{\"a\":1,\"a \":2}",
		"{\"ab\":1,\"ba\":2}", "{\"\":1,\"\\/\":2,\"/ \":3}", "{\"\\u00e9\":1,\"\\u00e9\\u00e9\":2}",
	};
	chk_each(two, sizeof two / sizeof *two, 0, "refused distinct keys");
	/* Many members: the sorted check finds the one repeat among them. */
	size_t n = 5000, k = 0;
	char *s = malloc(n * 16 + 16);
	s[k++] = '{';
	for (size_t i = 0; i < n; i++)
		k += (size_t)sprintf(s + k, "%s\"k%zu\":0", i ? "," : "", i);
	s[k++] = '}';
	s[k] = '\0';
	CHECK_EQ(chk(s, NULL), 0);
	k -= 1;
	k += (size_t)sprintf(s + k, ",\"k\\u00343\\u00321\":1}"); /* k4321 */
	CHECK_EQ(chk(s, NULL), -EEXIST);
	free(s);
}

/* The hash hostile_fnv_key()'s keys share (te-json.h's before), over a key
 * as written: raw bytes and \uXXXX escapes are one unit each. */
static uint64_t fnv_units(const char *k, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n;) {
		unsigned u = (unsigned char)k[i++];
		if (u == '\\') {
			u = (unsigned)strtoul((char[5]){ k[i + 1], k[i + 2], k[i + 3], k[i + 4], 0 }, NULL, 16);
			i += 5;
		}
		h = (h ^ u) * 1099511628211ull;
	}
	return h;
}

/* The bound on checking 65,536 keys, in the thread's CPU time (a clock that
 * only moves forward, and one that a loaded machine's waits do not move):
 * five times what an optimised build takes (20 ms on a 2-vCPU VM), looser under sanitizers and
 * without optimisation. Pairwise comparison of colliding keys took seconds. */
static double cpu_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || !defined(__OPTIMIZE__)
#define KEYS_MS 2000
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KEYS_MS 2000
#endif
#endif
#ifndef KEYS_MS
#define KEYS_MS 100
#endif

static void test_many_keys(void)
{
	const size_t n = TE_JSON_MAX_ITEMS, ncoll = (size_t)1 << HOSTILE_FNV_ROWS;
	char key[256];
	size_t k = 0;
	uint64_t h0 = 0;
	int same_hash = 1;

	/* The first 16,384 keys all collide in the old hash. */
	for (size_t i = 0; i < ncoll; i++) {
		uint64_t h = fnv_units(key, hostile_fnv_key(i, key));
		if (i == 0)
			h0 = h;
		same_hash &= h == h0;
	}
	CHECK(same_hash);

	char *s = hostile_keys(n, &k);
	double best = -1;
	for (int run = 0; run < 3; run++) { /* the best of three: the machine is shared */
		double t = cpu_ms();
		CHECK_EQ(chk(s, NULL), 0);
		t = cpu_ms() - t;
		if (best < 0 || t < best)
			best = t;
	}
	printf("65,536 keys (%zu colliding in FNV-1a), %zu bytes: %.1f ms of CPU\n", ncoll, k, best);
	CHECK(best < KEYS_MS);

	/* One repeat among them, spelled differently, is still found: the
	 * first piece's A as \u0041. */
	size_t kl = hostile_fnv_key(ncoll - 2, key);
	char *t = malloc(k + kl + 16);
	REQUIRE(t != NULL && key[8] == 'A');
	sprintf(t, "%.*s,\"%.8s\\u0041%s\":0}", (int)(k - 1), s, key, key + 9);
	te_json_limits lim = TE_JSON_LIMITS_DEFAULT;
	lim.max_items = n + 1;
	CHECK_EQ(chk(t, &lim), -EEXIST);
	free(t);
	free(s);
}

int main(void)
{
	TEST_RUN(test_valid);
	TEST_RUN(test_malformed);
	TEST_RUN(test_depth);
	TEST_RUN(test_counts);
	TEST_RUN(test_strings);
	TEST_RUN(test_numbers);
	TEST_RUN(test_duplicates);
	TEST_RUN(test_many_keys);
	return check_done();
}
