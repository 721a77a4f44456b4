/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te-nvmeof-register end to end: register files (sized from disk, given
 * lengths, allocated), record mount paths for hosts, update without losing
 * them, refuse what is wrong with a message saying so, and finally open the
 * registered segment from an engine whose name has a mount path, proving the
 * transport reads and writes the mounted file and not file_path. Stored
 * descriptors it cannot trust (deep, huge, repeated keys, wrong types, bad
 * lengths) are refused with a line saying why and left as they are.
 */
#include <sys/wait.h>

#include <json-glib/json-glib.h>

#include "../common/hostile.h"
#include "nv-hostile.h"
#include "nv-util.h"

static const char *tool;
static char out[65536];

/* Runs the tool with `args` (shell words); returns its exit status, output in `out`. */
static int run_tool(const char *fmt, ...)
{
	char args[8192], cmd[9000];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(args, sizeof args, fmt, ap);
	va_end(ap);
	snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", tool, args);
	FILE *p = popen(cmd, "r");
	REQUIRE(p != NULL);
	size_t n = fread(out, 1, sizeof out - 1, p);
	out[n] = '\0';
	int st = pclose(p);
	if (getenv("TEST_VERBOSE"))
		fprintf(stderr, "$ %s\n%s", args, out);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int out_has(const char *s)
{
	int r = strstr(out, s) != NULL;
	if (!r)
		fprintf(stderr, "  (output lacks \"%s\": %.500s)\n", s, out);
	return r;
}

/* The stored descriptor, parsed. */
static JsonObject *stored(const char *key, JsonParser **parser)
{
	te_metadata *md = NULL;
	char *val = NULL;
	REQUIRE(te_metadata_open(nv_conn, &md) == 0);
	int rc = te_metadata_get(md, key, &val, NULL);
	te_metadata_close(md);
	if (rc != 0)
		return NULL;
	*parser = json_parser_new();
	REQUIRE(json_parser_load_from_data(*parser, val, -1, NULL));
	te_free(val);
	return json_node_get_object(json_parser_get_root(*parser));
}

static JsonObject *buffer(JsonObject *d, guint i)
{
	return json_array_get_object_element(json_object_get_array_member(d, "buffers"), i);
}

static const char *mapped(JsonObject *d, guint i, const char *host)
{
	JsonObject *m = json_object_get_object_member(buffer(d, i), "local_path_map");
	return m && json_object_has_member(m, host) ? json_object_get_string_member(m, host) : NULL;
}

static void test_register_and_mount(void)
{
	unsigned char data[12345];
	JsonParser *p = NULL;
	JsonObject *d;
	struct stat st;
	fill_pattern(data, sizeof data, 1);
	nv_write_file(nv_path("disk-a"), data, sizeof data);

	/* sized from disk, and a new file allocated with a length */
	CHECK_EQ(run_tool("-m %s register disk0 %s %s:1M --allocate --server-name storage7", nv_conn,
			  nv_path("disk-a"), nv_path("disk-b")), 0);
	CHECK(out_has("mooncake/nvmeof/disk0 = {\"buffers\":["));
	CHECK(stat(nv_path("disk-b"), &st) == 0 && st.st_size == 1 << 20);
	d = stored("mooncake/nvmeof/disk0", &p);
	REQUIRE(d != NULL);
	CHECK(strcmp(json_object_get_string_member(d, "protocol"), "nvmeof") == 0);
	CHECK(strcmp(json_object_get_string_member(d, "server_name"), "storage7") == 0);
	CHECK_EQ(json_array_get_length(json_object_get_array_member(d, "buffers")), 2);
	CHECK_EQ(json_object_get_int_member(buffer(d, 0), "length"), 12345);
	CHECK(strcmp(json_object_get_string_member(buffer(d, 0), "file_path"), nv_path("disk-a")) == 0);
	CHECK_EQ(json_object_get_int_member(buffer(d, 1), "length"), 1 << 20);
	g_object_unref(p);

	/* mount paths for two hosts, one removed again */
	CHECK_EQ(run_tool("-m %s mount nvmeof/disk0 %s %s --host nodeA", nv_conn, nv_path("disk-a"),
			  nv_path("mnt-a")), 0);
	CHECK(out_has("is not readable here")); /* mnt-a does not exist yet: a warning only */
	CHECK_EQ(run_tool("--metadata=%s mount disk0 %s /mnt/te/b --host=nodeB", nv_conn, nv_path("disk-b")), 0);
	CHECK_EQ(run_tool("-m %s mount disk0 %s /mnt/te/x --host nodeX", nv_conn, nv_path("disk-b")), 0);
	CHECK_EQ(run_tool("-m %s unmount disk0 %s --host nodeX", nv_conn, nv_path("disk-b")), 0);
	d = stored("mooncake/nvmeof/disk0", &p);
	REQUIRE(d != NULL);
	CHECK(mapped(d, 0, "nodeA") && strcmp(mapped(d, 0, "nodeA"), nv_path("mnt-a")) == 0);
	CHECK(mapped(d, 1, "nodeB") && strcmp(mapped(d, 1, "nodeB"), "/mnt/te/b") == 0);
	CHECK(mapped(d, 1, "nodeX") == NULL);
	g_object_unref(p);

	/* re-register: the order changes, a length is given, the mounts stay */
	CHECK_EQ(run_tool("-m %s register disk0 %s %s:4096", nv_conn, nv_path("disk-b"), nv_path("disk-a")), 0);
	d = stored("mooncake/nvmeof/disk0", &p);
	REQUIRE(d != NULL);
	CHECK_EQ(json_object_get_int_member(buffer(d, 1), "length"), 4096);
	CHECK(mapped(d, 0, "nodeB") && strcmp(mapped(d, 0, "nodeB"), "/mnt/te/b") == 0);
	CHECK(mapped(d, 1, "nodeA") != NULL);
	CHECK(strcmp(json_object_get_string_member(d, "server_name"), "storage7") == 0);
	g_object_unref(p);

	CHECK_EQ(run_tool("-m %s show disk0", nv_conn), 0);
	CHECK(out_has("\"server_name\":\"storage7\""));
}

static void test_errors(void)
{
	CHECK_EQ(run_tool("-m %s register bad %s", nv_conn, nv_path("no-such-file")), 1);
	CHECK(out_has("does not exist (--allocate with a LENGTH creates it)"));
	CHECK_EQ(run_tool("-m %s register bad %s --allocate", nv_conn, nv_path("no-such-file")), 1);
	CHECK(out_has("give its length"));
	CHECK_EQ(run_tool("-m %s register bad %s:1G", nv_conn, nv_path("disk-a")), 1);
	CHECK(out_has("holds 12345 bytes, less than the 1073741824 to register"));
	CHECK_EQ(run_tool("-m %s register bad %s", nv_conn, nv_dir), 1);
	CHECK(out_has("not a regular file or block device"));
	CHECK_EQ(run_tool("-m %s show bad", nv_conn), 1);
	CHECK(out_has("no descriptor under mooncake/nvmeof/bad"));
	CHECK_EQ(run_tool("-m %s mount nothere /x /y", nv_conn), 1);
	CHECK(out_has("register the segment first"));
	CHECK_EQ(run_tool("-m %s mount disk0 /not/a/file/of/it /y", nv_conn), 1);
	CHECK(out_has("has no file /not/a/file/of/it"));
	CHECK_EQ(run_tool("-m zookeeper://h:1 show disk0"), 1);
	CHECK(out_has("cannot open metadata store"));
	CHECK_EQ(run_tool("show disk0"), 1);
	CHECK(out_has("no metadata store"));
	CHECK_EQ(run_tool("-m %s frobnicate disk0", nv_conn), 2);
	CHECK(out_has("unknown command"));
	CHECK_EQ(run_tool("-m %s register", nv_conn), 2);
	CHECK_EQ(run_tool("-m %s register \"\" %s", nv_conn, nv_path("disk-a")), 1);
	CHECK(out_has("empty segment name"));
	CHECK_EQ(run_tool("-m %s mount disk0 %s", nv_conn, nv_path("disk-a")), 2);
	/* a key that holds something else is not overwritten by a mount */
	nv_put_desc("nvmeof/notours", "{\"name\":\"x\",\"protocol\":\"tcp\"}");
	CHECK_EQ(run_tool("-m %s mount notours /a /b", nv_conn), 1);
	CHECK(out_has("is not an NVMe-oF descriptor"));
	CHECK_EQ(run_tool("-m %s remove disk-gone", nv_conn), 0);
}

/* The segment as registered is what the transport serves, through the mount
 * path of the engine's own name. */
static void test_engine_uses_registration(void)
{
	unsigned char data[8192];
	fill_pattern(data, sizeof data, 77);
	/* file_path names the storage server's file, the mount is a copy here */
	nv_write_file(nv_path("server-file"), data, sizeof data);
	nv_write_file(nv_path("mounted-copy"), data, sizeof data);
	CHECK_EQ(run_tool("-m %s register disk9 %s", nv_conn, nv_path("server-file")), 0);
	CHECK_EQ(run_tool("-m %s mount disk9 %s %s --host reader1", nv_conn, nv_path("server-file"),
			  nv_path("mounted-copy")), 0);

	te_engine *e = nv_engine("reader1", NULL);
	REQUIRE(e != NULL);
	unsigned char *mem = aligned_alloc(4096, 8192);
	REQUIRE(mem != NULL);
	REQUIRE(te_register_memory(e, mem, 8192, "cpu:0", 0) == 0);
	te_segment_id seg = te_segment_open(e, "nvmeof/disk9");
	REQUIRE(seg > 0);
	te_task_status st;
	memset(mem, 0xab, 4096);
	CHECK_EQ(run_one(e, TE_OP_WRITE, seg, mem, 4096, 4096, &st), TE_TASK_COMPLETED);
	unsigned char *copy = nv_read_file(nv_path("mounted-copy"), 8192);
	unsigned char *orig = nv_read_file(nv_path("server-file"), 8192);
	CHECK(copy[4096] == 0xab && copy[8191] == 0xab && memcmp(copy, data, 4096) == 0);
	CHECK(memcmp(orig, data, 8192) == 0); /* untouched */
	free(copy);
	free(orig);
	CHECK_EQ(te_segment_close(e, seg), 0);
	te_engine_destroy(e);
	free(mem);

	CHECK_EQ(run_tool("-m %s remove disk9", nv_conn), 0);
	CHECK(out_has("removed mooncake/nvmeof/disk9"));
	CHECK_EQ(run_tool("-m %s show disk9", nv_conn), 1);
}

/* ------------------------------------------------ hostile descriptors */

static const char *valid_desc =
	"{\"buffers\":[{\"file_path\":\"/f\",\"length\":4096,\"local_path_map\":{}}],"
	"\"protocol\":\"nvmeof\",\"server_name\":\"s\"}";

/* Stores `text` under nvmeof/hostile; false when the store refuses a value
 * that large (etcd takes 1.5 MiB by default). */
static bool put_raw(const char *text)
{
	te_metadata *md = NULL;
	char key[512];
	REQUIRE(te_metadata_open(nv_conn, &md) == 0);
	REQUIRE(te_metadata_segment_key("nvmeof/hostile", key, sizeof key) > 0);
	int rc = te_metadata_put(md, key, text, strlen(text));
	te_metadata_close(md);
	if (rc != 0)
		fprintf(stderr, "  (the store refuses %zu bytes: %s; case skipped)\n", strlen(text),
			te_strerror(rc));
	return rc == 0;
}

static bool stored_is(const char *text)
{
	te_metadata *md = NULL;
	char *val = NULL;
	size_t len = 0;
	REQUIRE(te_metadata_open(nv_conn, &md) == 0);
	int rc = te_metadata_get(md, "mooncake/nvmeof/hostile", &val, &len);
	te_metadata_close(md);
	bool same = rc == 0 && len == strlen(text) && memcmp(val, text, len) == 0;
	te_free(val);
	return same;
}

/* The tool refuses `text` with a line holding `why`, leaves it as it was,
 * and takes a valid descriptor right after. */
static void tool_refuses(const char *what, const char *text, const char *why)
{
	if (!put_raw(text))
		return;
	int rc = run_tool("-m %s mount hostile /f /mnt/f --host h1", nv_conn);
	if (rc != 1)
		fprintf(stderr, "  %s: exit %d\n", what, rc);
	CHECK_EQ(rc, 1);
	CHECK(out_has(why));
	CHECK(stored_is(text));
	REQUIRE(put_raw(valid_desc));
	CHECK_EQ(run_tool("-m %s mount hostile /f /mnt/f --host h1", nv_conn), 0);
	CHECK(out_has("\"local_path_map\":{\"h1\":\"/mnt/f\"}"));
}

static void test_hostile_descriptors(void)
{
	const char *what, *why;
	char *t;
	for (size_t i = 0; (t = nv_hostile(i, &what, &why)) != NULL; i++) {
		tool_refuses(what, t, why);
		free(t);
	}

	tool_refuses("protocol twice", "{\"protocol\":\"nvmeof\",\"buffers\":[],\"protocol\":\"nvmeof\"}",
		     "key repeated");
	static const struct {
		const char *field, *why;
	} cases[] = {
		{ "\"length\":4096,\"length\":8192", "key repeated" },
		{ "\"\\u0066ile_path\":\"/g\"", "key repeated" },
		{ "\"local_path_map\":{\"h1\":\"/a\",\"h1\":\"/b\"}", "key repeated" },
		{ "\"length\":\"4096\"", "\"length\" is of another type" },
		{ "\"length\":null", "\"length\" is of another type" },
		{ "\"file_path\":7", "\"file_path\" is not a path" },
		{ "\"file_path\":[\"/f\"]", "\"file_path\" is not a path" },
		{ "\"file_path\":\"\"", "\"file_path\" is not a path" },
		{ "\"local_path_map\":[1]", "\"local_path_map\" is not an object" },
		{ "\"local_path_map\":{\"h2\":7}", "local_path_map entry \"h2\" is not a host name and a path" },
		{ "\"local_path_map\":{\"h2\":{}}", "local_path_map entry \"h2\" is not" },
		{ "\"length\":-4096", "2^63" },
		{ "\"length\":0", "2^63" },
		{ "\"length\":4096.5", "\"length\" is of another type" },
		{ "\"length\":4.096e3", "\"length\" is of another type" },
		{ "\"length\":9223372036854775808", "2^63" },
		{ "\"length\":18446744073709551615", "2^63" },
		{ "\"length\":18446744073709551616", "outside [-2^63, " },
		{ "\"length\":1e400", "out of range" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		t = nv_buffer_with(cases[i].field);
		tool_refuses(cases[i].field, t, cases[i].why);
		g_free(t);
	}
	tool_refuses("no length", "{\"buffers\":[{\"file_path\":\"/f\"}],\"protocol\":\"nvmeof\"}",
		     "\"length\" is missing");
	tool_refuses("buffers an object", "{\"protocol\":\"nvmeof\",\"buffers\":{}}", "has no \"buffers\" array");
	tool_refuses("buffer a number", "{\"protocol\":\"nvmeof\",\"buffers\":[7]}", "buffer 0 is not an object");
	tool_refuses("server name a number", "{\"protocol\":\"nvmeof\",\"buffers\":[],\"server_name\":7}",
		     "\"server_name\" is not a name");
	tool_refuses("protocol a number", "{\"protocol\":7,\"buffers\":[]}",
		     "is not an NVMe-oF descriptor (protocol not a string)");
	tool_refuses("not JSON", "{\"protocol\":'nvmeof'}", "does not hold a descriptor this tool accepts");
	tool_refuses("trailing bytes", "{\"protocol\":\"nvmeof\",\"buffers\":[]} x", "bytes after the value");
	/* register keeps the mount paths of the stored descriptor, so it reads
	 * it first, and refuses it the same way */
	t = nv_buffer_with("\"length\":-1");
	REQUIRE(put_raw(t));
	CHECK_EQ(run_tool("-m %s register hostile %s", nv_conn, nv_path("disk-a")), 1);
	CHECK(out_has("2^63"));
	CHECK(out_has("te-nvmeof-register remove deletes it"));
	CHECK(stored_is(t));
	g_free(t);
	CHECK_EQ(run_tool("-m %s remove hostile", nv_conn), 0);
	CHECK_EQ(run_tool("-m %s register hostile %s", nv_conn, nv_path("disk-a")), 0);
}

int main(void)
{
	tool = getenv("NV_REGISTER_TOOL");
	REQUIRE(tool != NULL);
	unsetenv("TE_METADATA_SERVER");
	unsetenv("MC_METADATA_SERVER");
	nv_setup();
	fprintf(stderr, "metadata store: %s\n", nv_conn);
	TEST_RUN(test_register_and_mount);
	TEST_RUN(test_errors);
	TEST_RUN(test_engine_uses_registration);
	TEST_RUN(test_hostile_descriptors);
	return check_done();
}
