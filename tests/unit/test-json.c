/* SPDX-License-Identifier: Apache-2.0 */
/* te_json_check(): every rule and every limit, each broken once, and the
 * largest input inside each limit accepted. */
#include <te/te-json.h>

#include "../common/check.h"

static int chk(const char *s, const te_json_limits *lim)
{
	char why[160];
	int rc = te_json_check(s, strlen(s), lim, why, sizeof why);
	if (rc < 0 && why[0] == '\0')
		return -9999; /* every refusal must say why */
	return rc;
}

/* "[[[...]]]" or {"a":{"a":...}} nested `depth` levels. */
static char *nest(unsigned depth, int object)
{
	size_t n = (size_t)depth * 6 + 8, k = 0;
	char *s = malloc(n);
	for (unsigned i = 0; i < depth; i++) {
		if (object) {
			memcpy(s + k, "{\"a\":", 5);
			k += 5;
		} else {
			s[k++] = '[';
		}
	}
	s[k++] = '1';
	for (unsigned i = 0; i < depth; i++)
		s[k++] = object ? '}' : ']';
	s[k] = '\0';
	return s;
}

static void test_valid(void)
{
	const char *ok[] = {
		"{}", "[]", "1", "-0", "0.5e-3", "\"x\"", "true", "false", "null", " [ 1 , 2 ] ",
		"{\"a\":[],\"b\":{},\"c\":\"\\u00e9\\n\\\"\",\"d\":-9223372036854775808}",
		"9223372036854775807", "{\"a\":{\"a\":1},\"b\":{\"a\":2}}", "[[],[[]],{}]",
		"{ \"k\" : { } }", "1e300", "-1.5E+10", "\"\\ud83d\\ude00 \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"",
		"\"\\u00e9\\uFFFF\"", "\"a\tb\x1f\"", /* raw control characters, as json-glib writes */
	};
	for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
		int rc = chk(ok[i], NULL);
		if (rc != 0)
			fprintf(stderr, "refused valid: %s (%d)\n", ok[i], rc);
		CHECK_EQ(rc, 0);
	}
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
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		int rc = chk(bad[i], NULL);
		if (rc != -EINVAL)
			fprintf(stderr, "accepted or misjudged: '%s' (%d)\n", bad[i], rc);
		CHECK_EQ(rc, -EINVAL);
	}
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
		char *at = nest(TE_JSON_MAX_DEPTH, obj), *over = nest(TE_JSON_MAX_DEPTH + 1, obj);
		CHECK_EQ(chk(at, NULL), 0);
		CHECK_EQ(chk(over, NULL), -E2BIG);
		free(at);
		free(over);
	}
	/* The attack: 300,000 levels in 600 KB, refused without recursion. */
	char *deep = nest(300000, 0);
	CHECK_EQ(chk(deep, NULL), -E2BIG);
	free(deep);
	/* Deep nesting where a string member's value belongs. */
	const char *pre = "{\"name\":";
	char *d = nest(1000, 1), *s = malloc(strlen(pre) + strlen(d) + 2);
	sprintf(s, "%s%s}", pre, d);
	CHECK_EQ(chk(s, NULL), -E2BIG);
	free(s);
	free(d);
	/* A caller's tighter bound, and the cap on a looser one. */
	lim.max_depth = 2;
	CHECK_EQ(chk("[[1]]", &lim), 0);
	CHECK_EQ(chk("[[[1]]]", &lim), -E2BIG);
	lim.max_depth = 100000;
	char *cap = nest(TE_JSON_DEPTH_CAP + 1, 0);
	CHECK_EQ(chk(cap, &lim), -E2BIG);
	free(cap);
}

static char *repeat_array(size_t n, const char *elem)
{
	size_t el = strlen(elem), k = 0;
	char *s = malloc(n * (el + 1) + 3);
	s[k++] = '[';
	for (size_t i = 0; i < n; i++) {
		if (i)
			s[k++] = ',';
		memcpy(s + k, elem, el);
		k += el;
	}
	s[k++] = ']';
	s[k] = '\0';
	return s;
}

static void test_counts(void)
{
	te_json_limits lim = TE_JSON_LIMITS_DEFAULT;
	char *a = repeat_array(TE_JSON_MAX_ITEMS, "0");
	CHECK_EQ(chk(a, NULL), 0);
	free(a);
	a = repeat_array(1000000, "0"); /* a 1M-element array */
	CHECK_EQ(chk(a, NULL), -E2BIG);
	free(a);
	/* Values over the document: many arrays, each under the item limit. */
	lim.max_values = 100;
	a = repeat_array(60, "[1]");
	CHECK_EQ(chk(a, &lim), -E2BIG);
	free(a);
	a = repeat_array(40, "[1]");
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
	CHECK_EQ(chk("18446744073709551616", NULL), -ERANGE); /* 2^64 */
	CHECK_EQ(chk("9223372036854775808", NULL), -ERANGE);  /* 2^63: parsers wrap it */
	CHECK_EQ(chk("18446744073709551615", NULL), -ERANGE);
	CHECK_EQ(chk("[99999999999999999999999]", NULL), -ERANGE);
	CHECK_EQ(chk("-9223372036854775809", NULL), -ERANGE);
	CHECK_EQ(chk("1e309", NULL), -ERANGE);
	CHECK_EQ(chk("1e-400", NULL), -ERANGE);
	CHECK_EQ(chk("0.00000000000000000000000000000000000000001", NULL), -ERANGE);
	CHECK_EQ(chk("1e99999999999999999999", NULL), -ERANGE);
}

static void test_duplicates(void)
{
	CHECK_EQ(chk("{\"a\":1,\"a\":2}", NULL), -EEXIST);
	CHECK_EQ(chk("{\"a\":1,\"\\u0061\":2}", NULL), -EEXIST);
	CHECK_EQ(chk("{\"a\":{\"b\":1,\"b\":1}}", NULL), -EEXIST);
	CHECK_EQ(chk("{\"a\":{\"b\":1},\"b\":{\"a\":1}}", NULL), 0); /* per object */
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
	k += (size_t)sprintf(s + k, ",\"k4321\":1}");
	CHECK_EQ(chk(s, NULL), -EEXIST);
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
	return check_done();
}
