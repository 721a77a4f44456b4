/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The transport's descriptor reader facing hostile JSON from the store. The
 * first part calls the plugin's own code (its sources are built into this
 * test) with a stand-in host, so each refusal is its own, whatever the host's
 * decoder let through: deep nesting of arrays and objects (also where a
 * string belongs), a million-element array, huge strings and text, repeated
 * keys, wrong types, negative, fractional and out-of-range lengths. Each is
 * refused with a line saying what is wrong, and the next valid descriptor is
 * still served. The second part goes through an engine with descriptors the
 * host accepts but this format does not.
 */
#include <stdarg.h>

#include "../common/host-log.h"
#include "../common/hostile.h"
#include "../../plugins/transport/nvmeof/nvmeof.h"
#include "nv-hostile.h"
#include "nv-util.h"

/* ------------------------------------------------------- stand-in host */

static const char *fake_name(const te_host *h)
{
	(void)h;
	return "nodeA";
}

static te_host host;
static nv_ctx ctx;
static char good_file[4200];

/* Opens a segment of one file of 4096 bytes (as the host decoded it) from
 * `text`; the plugin's result. */
static int open_text(const char *text)
{
	te_buffer_desc b = { 0, 4096, "" };
	te_segment_info seg = { .size = sizeof seg, .name = "nvmeof/j", .protocol = "nvmeof",
				.descriptor = text, .buffers = &b, .n_buffers = 1 };
	nv_segment *s = NULL;
	host_log_clear();
	int rc = nv_segment_open(&ctx, &seg, &s);
	if (rc == 0)
		nv_segment_close(&ctx, s);
	return rc;
}

static char *valid(void)
{
	return g_strdup_printf("{\"buffers\":[{\"file_path\":\"/elsewhere\",\"length\":4096,"
			       "\"local_path_map\":{\"nodeA\":\"%s\",\"nodeB\":\"/b\"}}],"
			       "\"protocol\":\"nvmeof\",\"server_name\":\"s\"}",
			       good_file);
}

/* `text` is refused with a line holding `why`; a valid one after it is
 * served (its file opened). */
static void refused(const char *what, const char *text, int want_rc, const char *why)
{
	int rc = open_text(text);
	if (rc != want_rc)
		fprintf(stderr, "  %s: rc %d, wanted %d\n", what, rc, want_rc);
	CHECK_EQ(rc, want_rc);
	CHECK(host_logged(why));
	char *ok = valid();
	CHECK_EQ(open_text(ok), 0);
	CHECK(host_logged("1 of 1 files open"));
	g_free(ok);
}

/* nv-hostile.h's descriptors, too deep or too large; and a shallow wrong
 * type where the path belongs. */
static void test_nesting(void)
{
	const char *what, *why;
	char *t;
	for (size_t i = 0; (t = nv_hostile(i, &what, &why)) != NULL; i++) {
		char *line = g_strdup_printf("descriptor refused: %s", why);
		refused(what, t, TE_ERR_METADATA, line);
		g_free(line);
		free(t);
	}
	t = nv_buffer_with("\"file_path\":[\"/f\"]");
	refused("array path", t, TE_ERR_METADATA, "buffer 0: missing or bad \"file_path\"");
	g_free(t);
}

static void test_sizes(void)
{
	GString *s = g_string_new("{\"protocol\":\"nvmeof\",\"x\":{");
	for (size_t i = 0; i < 20000; i++)
		g_string_append_printf(s, "%s\"k%zu\":0", i ? "," : "", i);
	g_string_append(s, "}}");
	refused("many members", s->str, TE_ERR_METADATA, "object with more than 16384 members");
	g_string_free(s, TRUE);
}

static void test_duplicates(void)
{
	refused("protocol twice", "{\"protocol\":\"nvmeof\",\"buffers\":[],\"protocol\":\"tcp\"}",
		TE_ERR_METADATA, "descriptor refused: key repeated");
	char *t = nv_buffer_with("\"length\":4096,\"length\":8192");
	refused("length twice", t, TE_ERR_METADATA, "key repeated");
	g_free(t);
	/* the same key spelled with an escape */
	t = nv_buffer_with("\"\\u0066ile_path\":\"/etc/shadow\"");
	refused("escaped twin", t, TE_ERR_METADATA, "key repeated");
	g_free(t);
	t = nv_buffer_with("\"local_path_map\":{\"nodeA\":\"/a\",\"nodeA\":\"/etc/shadow\"}");
	refused("map entry twice", t, TE_ERR_METADATA, "key repeated");
	g_free(t);
}

static void test_types(void)
{
	refused("buffers an object", "{\"protocol\":\"nvmeof\",\"buffers\":{}}", TE_ERR_METADATA,
		"\"buffers\" not an array");
	refused("buffer a number", "{\"protocol\":\"nvmeof\",\"buffers\":[7]}", TE_ERR_METADATA,
		"buffer 0 is not an object");
	refused("protocol a number", "{\"protocol\":7,\"buffers\":[]}", -ENOTSUP,
		"protocol is \"?\", not \"nvmeof\"");
	refused("root an array", "[{\"protocol\":\"nvmeof\"}]", TE_ERR_METADATA, "not a JSON object");
	refused("not JSON", "{\"protocol\":'nvmeof'}", TE_ERR_METADATA, "descriptor refused: unexpected");
	refused("NaN", "{\"protocol\":\"nvmeof\",\"x\":NaN}", TE_ERR_METADATA, "descriptor refused");
	refused("trailing bytes", "{\"protocol\":\"nvmeof\"} {}", TE_ERR_METADATA, "bytes after the value");
	static const struct {
		const char *field, *why;
	} cases[] = {
		{ "\"length\":\"4096\"", "missing or bad \"length\" (not an integer)" },
		{ "\"length\":[4096]", "missing or bad \"length\" (not an integer)" },
		{ "\"length\":null", "missing or bad \"length\" (not an integer)" },
		{ "\"file_path\":7", "missing or bad \"file_path\"" },
		{ "\"file_path\":\"\"", "missing or bad \"file_path\"" },
		{ "\"local_path_map\":[1]", "\"local_path_map\" is not an object" },
		{ "\"local_path_map\":{\"nodeA\":7}", "local_path_map entry for nodeA is not a path" },
		{ "\"local_path_map\":{\"nodeA\":{}}", "local_path_map entry for nodeA is not a path" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *t = nv_buffer_with(cases[i].field);
		refused(cases[i].field, t, TE_ERR_METADATA, cases[i].why);
		g_free(t);
	}
	refused("no length", "{\"buffers\":[{\"file_path\":\"/f\"}],\"protocol\":\"nvmeof\"}",
		TE_ERR_METADATA, "missing or bad \"length\" (missing)");
	/* another host's entry is not ours to read: anything goes there */
	char *t = nv_buffer_with("\"local_path_map\":{\"nodeZ\":[1,{}]}");
	CHECK_EQ(open_text(t), 0);
	g_free(t);
}

static void test_numbers(void)
{
	static const struct {
		const char *len, *why;
	} cases[] = {
		{ "-4096", "(not in [1, 2^63))" },
		{ "0", "(not in [1, 2^63))" },
		{ "-0", "(not in [1, 2^63))" },
		{ "4096.5", "(not an integer)" },
		{ "4096.0", "(not an integer)" },
		{ "4.096e3", "(not an integer)" },
		/* from 2^63 up: refused by the check or, where it lets them
		 * through, by the reader (json-glib wraps them negative) */
		{ "9223372036854775808", "2^63" },
		{ "18446744073709551615", "2^63" },
		{ "18446744073709551616", "outside [-2^63, " },
		{ "-9223372036854775809", "outside [-2^63, " },
		{ "1e400", "out of range" },
		{ "123456789012345678901234567890123456789012345", "outside [-2^63, " },
		{ "8192", "(not the length the host decoded)" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *field = g_strdup_printf("\"length\":%s", cases[i].len);
		char *t = nv_buffer_with(field);
		refused(field, t, TE_ERR_METADATA, cases[i].why);
		g_free(t);
		g_free(field);
	}
}

/* ------------------------------------------------ through an engine */

/* Descriptors the host's decoder takes but this format does not: the
 * engine refuses the segment and goes on serving. */
static void test_engine(void)
{
	unsigned char data[4096], *mem = aligned_alloc(4096, 4096);
	REQUIRE(mem != NULL);
	fill_pattern(data, sizeof data, 5);
	nv_write_file(good_file, data, sizeof data);
	te_engine *e = nv_engine("nodeA", NULL);
	REQUIRE(e != NULL);
	REQUIRE(te_register_memory(e, mem, 4096, "cpu:0", 0) == 0);

	char pad[20001];
	memset(pad, 'p', sizeof pad - 1);
	pad[sizeof pad - 1] = '\0';
	char *many = hostile_array("", 20000, "0", "");
	char *deep = hostile_nest("", "[", 8, "1", "]", "");
	char big[20100];
	snprintf(big, sizeof big, "\"%s\"", pad);
	/* each in a member nobody reads, under the host's own limits */
	const char *extra[] = { deep, big, many };
	const char *why[] = { "nested deeper than 8 levels", "longer than 16384 bytes",
			      "array with more than 16384 elements" };
	for (size_t i = 0; i < 3; i++) {
		char *t = g_strdup_printf("{\"buffers\":[{\"file_path\":\"%s\",\"length\":4096}],"
					  "\"protocol\":\"nvmeof\",\"server_name\":\"s\",\"x\":%s}",
					  good_file, extra[i]);
		nv_put_desc("nvmeof/hostile", t);
		g_free(t);
		cap_start();
		te_segment_id id = te_segment_open(e, "nvmeof/hostile");
		CHECK(id < 0);
		CHECK(cap_has(why[i]));
		if (id > 0)
			te_segment_close(e, id);
		/* the same name, now valid: served */
		const char *paths[] = { good_file };
		const uint64_t lens[] = { 4096 };
		nv_put_files("nvmeof/hostile", paths, lens, 1);
		id = te_segment_open(e, "nvmeof/hostile");
		CHECK(id > 0);
		te_task_status st;
		memset(mem, 0, 4096);
		CHECK_EQ(run_one(e, TE_OP_READ, id, mem, 0, 4096, &st), TE_TASK_COMPLETED);
		CHECK(memcmp(mem, data, 4096) == 0);
		if (id > 0)
			CHECK_EQ(te_segment_close(e, id), 0);
	}
	g_free(deep);
	free(many);
	CHECK_EQ(te_unregister_memory(e, mem), 0);
	te_engine_destroy(e);
	free(mem);
}

int main(void)
{
	nv_setup();
	snprintf(good_file, sizeof good_file, "%s", nv_path("good"));
	unsigned char zero[4096] = { 0 };
	nv_write_file(good_file, zero, sizeof zero);

	host.size = sizeof host;
	host.log = host_log;
	host.config = host_config_none;
	host.local_name = fake_name;
	ctx.host = &host;
	ctx.allow_text = g_strdup(nv_dir);
	ctx.allow = nv_allow_parse(&host, nv_dir);

	TEST_RUN(test_nesting);
	TEST_RUN(test_sizes);
	TEST_RUN(test_duplicates);
	TEST_RUN(test_types);
	TEST_RUN(test_numbers);
	TEST_RUN(test_engine);

	g_strfreev(ctx.allow);
	g_free(ctx.allow_text);
	return check_done();
}
