/* SPDX-License-Identifier: Apache-2.0 */
/* te-top's reader of the text format: what it takes, and each of its
 * bounds broken (body, line, labels, samples). */
#include <errno.h>
#include <math.h>

#include "../common/check.h"
#include "../../tools/te-top/prom-text.h"

static int parse(const char *t, const prom_limits *lim, GPtrArray **out, char *why, size_t n)
{
	return prom_parse(t, strlen(t), lim, out, why, n);
}

static void test_reads(void)
{
	const char *t = "# HELP te_x_total A help with \"quotes\".\n"
			"# TYPE te_x_total counter\n"
			"te_x_total{segment=\"a:1\",op=\"read\"} 42\n"
			"te_x_total{segment=\"q\\\"\\\\\\n\", op = \"write\" ,} 1.5e3 1700000000000\r\n"
			"te_lat_bucket{le=\"+Inf\"} +Inf\n"
			"plain 7\n"
			"\n"
			"   # an indented comment\n"
			"nan_one NaN";
	GPtrArray *a = NULL;
	char why[200] = "";
	CHECK_EQ(parse(t, &prom_default_limits, &a, why, sizeof why), 0);
	REQUIRE(a != NULL);
	CHECK_EQ(a->len, 5);
	prom_sample *s = g_ptr_array_index(a, 0);
	CHECK(strcmp(s->name, "te_x_total") == 0 && s->value == 42 && s->n_labels == 2);
	CHECK(strcmp(prom_label_get(s, "segment"), "a:1") == 0);
	CHECK(strcmp(prom_label_get(s, "op"), "read") == 0);
	CHECK(prom_label_get(s, "le") == NULL);
	s = g_ptr_array_index(a, 1);
	CHECK(strcmp(prom_label_get(s, "segment"), "q\"\\\n") == 0);
	CHECK(strcmp(prom_label_get(s, "op"), "write") == 0);
	CHECK(s->value == 1500);
	s = g_ptr_array_index(a, 2);
	CHECK(isinf(s->value) && s->value > 0);
	s = g_ptr_array_index(a, 3);
	CHECK(strcmp(s->name, "plain") == 0 && s->n_labels == 0 && s->value == 7);
	s = g_ptr_array_index(a, 4);
	CHECK(isnan(s->value));
	g_ptr_array_unref(a);
}

static void test_refuses_junk(void)
{
	const char *bad[] = {
		"x{a=\"1\"\n",               /* not closed */
		"x{a=1} 2\n",                /* unquoted value */
		"x{a=\"1\",a=\"2\"} 2\n",    /* repeated label */
		"x{1a=\"1\"} 2\n",           /* bad label name */
		"x{a=\"\\q\"} 2\n",          /* unknown escape */
		"x 1 2 3\n",                 /* trailing text */
		"x\n",                       /* no value */
		"x inf\n",                   /* not the format's spelling */
		"x 0x10\n",                  /* hex */
		"9x 1\n",                    /* bad metric name */
		"x{a=\"1\"}2\n",             /* no blank before the value */
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		GPtrArray *a = (GPtrArray *)1;
		char why[200] = "";
		int rc = parse(bad[i], &prom_default_limits, &a, why, sizeof why);
		CHECK_EQ(rc, -EINVAL);
		CHECK(a == NULL);
		CHECK(strstr(why, "line 1") != NULL);
		if (rc != -EINVAL)
			fprintf(stderr, "  accepted: %s", bad[i]);
	}
	GPtrArray *a = NULL;
	char why[100];
	char nul[] = "x 1\ny\0 2\n";
	CHECK_EQ(prom_parse(nul, sizeof nul - 1, &prom_default_limits, &a, why, sizeof why), -EINVAL);
}

/* Each bound, just kept and just broken. */
static void test_bounds(void)
{
	prom_limits lim = { 1000, 40, 3, 4 };
	GPtrArray *a = NULL;
	char why[200];

	/* line: 40 bytes pass, 41 do not (comments too) */
	char line[64];
	snprintf(line, sizeof line, "x{a=\"%s\"} 1\n", "0123456789012345678901234567890"); /* 40 */
	CHECK_EQ(strlen(line), 41);
	CHECK_EQ(parse(line, &lim, &a, why, sizeof why), 0);
	g_ptr_array_unref(a);
	snprintf(line, sizeof line, "x{a=\"%s\"} 1\n", "01234567890123456789012345678901"); /* 41 */
	CHECK_EQ(parse(line, &lim, &a, why, sizeof why), -E2BIG);
	CHECK(strstr(why, "more than 40") != NULL);
	CHECK_EQ(parse("# 345678901234567890123456789012345678901\n", &lim, &a, why, sizeof why), -E2BIG);

	/* labels: 3 pass, 4 do not */
	CHECK_EQ(parse("x{a=\"1\",b=\"2\",c=\"3\"} 1\n", &lim, &a, why, sizeof why), 0);
	g_ptr_array_unref(a);
	CHECK_EQ(parse("x{a=\"1\",b=\"2\",c=\"3\",d=\"4\"} 1\n", &lim, &a, why, sizeof why), -E2BIG);
	CHECK(strstr(why, "labels") != NULL);

	/* samples: 4 pass, 5 do not */
	CHECK_EQ(parse("a 1\nb 2\nc 3\nd 4\n# e\n", &lim, &a, why, sizeof why), 0);
	CHECK_EQ(a->len, 4);
	g_ptr_array_unref(a);
	CHECK_EQ(parse("a 1\nb 2\nc 3\nd 4\ne 5\n", &lim, &a, why, sizeof why), -E2BIG);
	CHECK(strstr(why, "samples") != NULL);

	/* body: 1000 bytes pass, 1001 do not */
	char body[1002];
	memset(body, '\n', sizeof body);
	body[1001] = '\0';
	CHECK_EQ(prom_parse(body, 1000, &lim, &a, why, sizeof why), 0);
	g_ptr_array_unref(a);
	CHECK_EQ(prom_parse(body, 1001, &lim, &a, why, sizeof why), -E2BIG);
	CHECK(a == NULL);

	/* a label count above the hard cap is held to it */
	prom_limits wide = { 1 << 20, 1 << 16, 1000, 10 };
	GString *s = g_string_new("x{");
	for (int i = 0; i <= PROM_MAX_LABELS_HARD; i++)
		g_string_append_printf(s, "l%d=\"v\",", i);
	g_string_append(s, "} 1\n");
	CHECK_EQ(parse(s->str, &wide, &a, why, sizeof why), -E2BIG);
	g_string_free(s, TRUE);
}

int main(void)
{
	TEST_RUN(test_reads);
	TEST_RUN(test_refuses_junk);
	TEST_RUN(test_bounds);
	return check_done();
}
