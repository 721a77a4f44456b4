/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Hostile JSON against the RDMA plugin's three readers, through the entry
 * points that log: a peer's Connection frame (rd_ep_handle), a peer's
 * segment descriptor (rd_segment_open) and the install arguments
 * (rd_create). Deep nesting (arrays and objects, also where a string
 * belongs), huge arrays and strings, repeated keys, wrong types and numbers
 * out of range: each is refused with a log line that names the fault, and
 * each case checks that reason, so it fails if the bounded check (or the
 * field's check) is taken away. rdma-plugin.c is compiled in for its static
 * functions; the rest is the shipped plugin's sources (its provider
 * included), with a host of the test's own.
 */
#include "../common/host-log.h"
#include "../common/hostile.h"
#include "../../plugins/transport/rdma/rdma-plugin.c"

#include <stdarg.h>

#include "../common/check.h"

/* ------------------------------------------------------------- the host */

static const char *host_name(const te_host *h)
{
	(void)h;
	return "me";
}

/* Enough of a host for what runs before a refusal (an accepted argument
 * would get as far as looking for devices, and fail there). */
static te_host host = { .size = sizeof(te_host), .log = host_log, .config = host_config_none,
			.local_name = host_name };

/* The refusal lines of a peer's input are rate-limited per call site (five a
 * second): the test paces itself so that every one of its lines is let out. */
static void pace(unsigned *calls)
{
	if (*calls > 0 && *calls % TE_RATELIMIT_BURST == 0)
		g_usleep(1100 * 1000);
	(*calls)++;
}

/* ------------------------------------------------------------- the texts */

/* `tmpl` with each "$" replaced by `v` (g_free). */
static char *fill(const char *tmpl, const char *v)
{
	GString *s = g_string_new(NULL);
	for (const char *p = tmpl; *p; p++) {
		if (*p == '$')
			g_string_append(s, v);
		else
			g_string_append_c(s, *p);
	}
	return g_string_free(s, FALSE);
}

typedef struct hostile {
	const char *what;
	char *text; /* owned */
	const char *why; /* in the log line; "a|b": either */
} hostile;

static bool says(const char *line, const char *why)
{
	gchar **alt = g_strsplit(why, "|", -1);
	bool found = false;
	for (gchar **a = alt; *a != NULL && !found; a++)
		found = strstr(line, *a) != NULL;
	g_strfreev(alt);
	return found;
}

static void report(const hostile *c, bool ok)
{
	if (!ok)
		fprintf(stderr, "  %s: refused wrongly or not at all; log:\n%s\n", c->what,
			host_log_len > 600 ? host_log_text + host_log_len - 600 : host_log_text);
}

/* ----------------------------------------------------------- handshake */

#define GID "\"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01\""

static void test_handshake(void)
{
	/* A frame let through would be answered "this is me, not b:2". */
	rd_transport tr = { .host = &host, .local_name = (char *)"me" };
	/* A good frame with one member's value in place of "$". */
	const char *qp = "{\"local_gid\":" GID ",\"local_lid\":0,\"local_nic_path\":\"a:1@y\","
			 "\"peer_nic_path\":\"b:2@x\",\"qp_num\":$,\"reply_msg\":\"\"}";
	const char *reply = "{\"local_gid\":" GID ",\"local_lid\":0,\"local_nic_path\":\"a:1@y\","
			    "\"peer_nic_path\":\"b:2@x\",\"qp_num\":[1],\"reply_msg\":$}";
	const char *path = "{\"local_gid\":" GID ",\"local_lid\":0,\"local_nic_path\":$,"
			   "\"peer_nic_path\":\"b:2@x\",\"qp_num\":[1]}";
	const char *lid = "{\"local_gid\":" GID ",\"local_lid\":$,\"local_nic_path\":\"a:1@y\","
			  "\"peer_nic_path\":\"b:2@x\",\"qp_num\":[1]}";
	const char *ack = "{\"local_gid\":" GID ",\"local_lid\":0,\"local_nic_path\":\"a:1@y\","
			  "\"peer_nic_path\":\"b:2@x\",\"qp_num\":[1],\"ready_ack\":$}";
	const char *payload = "{\"local_gid\":" GID ",\"local_lid\":0,\"local_nic_path\":\"a:1@y\","
			      "\"payload\":$,\"peer_nic_path\":\"b:2@x\",\"qp_num\":[1]}";
	char *d2000 = hostile_deep(2000, 0), *o2000 = hostile_deep(2000, 1);
	char *m1 = hostile_array("", 1000000, "1", ""), *m1k = hostile_array("", 1000, "1", "");
	char *s1m = hostile_string("", 1 << 20, ""), *s2k = hostile_string("", 2000, "");
	hostile cases[] = {
		{ "qp_num nested 2000 deep", fill(qp, d2000), "nested deeper than 2 levels" },
		{ "reply_msg: objects 2000 deep", fill(reply, o2000), "nested deeper than 2 levels" },
		{ "local_nic_path: arrays 2000 deep", fill(path, d2000), "nested deeper than 2 levels" },
		{ "qp_num of 1M elements", fill(qp, m1), "over the limit of 16384" },
		{ "qp_num of 1000 elements", fill(qp, m1k), "array with more than 64 elements" },
		{ "payload of 1 MiB", fill(payload, s1m), "over the limit of 16384" },
		{ "payload of 2000 bytes", fill(payload, s2k), "longer than 1024 bytes" },
		{ "local_nic_path twice",
		  g_strdup("{\"local_gid\":" GID ",\"local_nic_path\":\"a:1@y\",\"local_nic_path\":\"c:3@z\","
			   "\"peer_nic_path\":\"b:2@x\",\"qp_num\":[1]}"),
		  "key repeated" },
		{ "qp_num twice, once escaped",
		  g_strdup("{\"local_gid\":" GID ",\"local_nic_path\":\"a:1@y\",\"peer_nic_path\":\"b:2@x\","
			   "\"qp_num\":[1],\"qp\\u005fnum\":[2]}"),
		  "key repeated" },
		{ "local_lid a string", fill(lid, "\"17\""), "not a 16-bit LID" },
		{ "local_lid 65536", fill(lid, "65536"), "not a 16-bit LID" },
		{ "local_lid -1", fill(lid, "-1"), "not a 16-bit LID" },
		{ "local_lid 1.5", fill(lid, "1.5"), "not a 16-bit LID" },
		{ "local_lid 1e3", fill(lid, "1e3"), "not a 16-bit LID" },
		{ "local_lid 2^64", fill(lid, "18446744073709551616"), "outside [-2^63" },
		{ "qp_num 2^24", fill(qp, "[16777216]"), "not a 24-bit QP number" },
		{ "qp_num -1", fill(qp, "[-1]"), "not a 24-bit QP number" },
		{ "qp_num 2.5", fill(qp, "[2.5]"), "not a 24-bit QP number" },
		{ "qp_num 2^64-1", fill(qp, "[18446744073709551615]"),
		  "not a 24-bit QP number|outside [-2^63" },
		{ "qp_num 1e400", fill(qp, "[1e400]"), "out of range" },
		{ "qp_num a string", fill(qp, "\"1\""), "not an array" },
		{ "qp_num of strings", fill(qp, "[\"1\"]"), "not a 24-bit QP number" },
		{ "ready_ack a number", fill(ack, "1"), "not a boolean" },
		{ "reply_msg an object", fill(reply, "{}"), "\"reply_msg\" is not a string" },
		{ "local_nic_path a number", fill(path, "5"), "\"local_nic_path\"" },
	};
	unsigned calls = 0;

	for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
		hostile *c = &cases[i];
		rd_hs hs;
		GString *err = g_string_new(NULL);
		char *reply_text = NULL;
		size_t reply_len = 0;

		/* The decoder's own answer... */
		CHECK_EQ(rd_hs_decode(c->text, strlen(c->text), &hs, err), -EINVAL);
		bool ok = says(err->str, c->why);
		/* ... and the frame handler's: the connection closed, a line logged. */
		pace(&calls);
		unsigned before = host_log_lines;
		host_log_clear();
		CHECK_EQ(rd_ep_handle(&tr, "10.0.0.9:5000", c->text, strlen(c->text), &reply_text,
				      &reply_len),
			 TE_ERR_PROTOCOL);
		CHECK(reply_text == NULL);
		free(reply_text);
		ok = ok && host_log_lines == before + 1 && strstr(host_log_text, "Connection frame from 10.0.0.9:5000") &&
		     says(host_log_text, c->why);
		CHECK(ok);
		report(c, ok);
		g_string_free(err, TRUE);
		g_free(c->text);
	}
	/* The good frame the variants came from is accepted. */
	char *good = fill(qp, "[1,2]");
	rd_hs hs;
	GString *err = g_string_new(NULL);
	CHECK_EQ(rd_hs_decode(good, strlen(good), &hs, err), 0);
	CHECK(hs.nqp == 2 && hs.qp_num[1] == 2 && strcmp(hs.local_nic_path, "a:1@y") == 0);
	g_string_free(err, TRUE);
	g_free(good);
	g_free(d2000);
	g_free(o2000);
	g_free(m1);
	g_free(m1k);
	g_free(s1m);
	g_free(s2k);
}

/* ---------------------------------------------------------- descriptor */

static int open_desc(rd_transport *tr, const char *text, rd_seg **seg)
{
	te_segment_info info = { .size = sizeof info, .name = "peer", .host = "10.0.0.9",
				 .protocol = "rdma", .descriptor = text };
	return rd_segment_open(tr, &info, (void **)seg);
}

static void test_descriptor(void)
{
	rd_transport tr = { .host = &host };
	/* One device, one buffer; "$" is the value under test. */
	const char *devs = "{\"name\":\"peer\",\"protocol\":\"rdma\",\"devices\":$,\"buffers\":[]}";
	const char *dname = "{\"name\":\"peer\",\"protocol\":\"rdma\",\"devices\":[{\"name\":$,\"lid\":0,"
			    "\"gid\":" GID "}]}";
	const char *lid = "{\"name\":\"peer\",\"protocol\":\"rdma\",\"devices\":[{\"name\":\"mlx5_0\","
			  "\"lid\":$,\"gid\":" GID "}]}";
	const char *gid = "{\"name\":\"peer\",\"protocol\":\"rdma\",\"devices\":[{\"name\":\"mlx5_0\","
			  "\"lid\":0,\"gid\":$}]}";
#define DEV "\"devices\":[{\"name\":\"mlx5_0\",\"lid\":0,\"gid\":" GID "}]"
	const char *bufs = "{\"name\":\"peer\",\"protocol\":\"rdma\"," DEV ",\"buffers\":$}";
	const char *bname = "{\"name\":\"peer\",\"protocol\":\"rdma\"," DEV ",\"buffers\":[{\"name\":$,"
			    "\"addr\":4096,\"length\":4096,\"rkey\":[7]}]}";
	const char *addr = "{\"name\":\"peer\",\"protocol\":\"rdma\"," DEV ",\"buffers\":[{\"name\":\"cpu:0\","
			   "\"addr\":$,\"length\":4096,\"rkey\":[7]}]}";
	const char *len = "{\"name\":\"peer\",\"protocol\":\"rdma\"," DEV ",\"buffers\":[{\"name\":\"cpu:0\","
			  "\"addr\":4096,\"length\":$,\"rkey\":[7]}]}";
	const char *rkey = "{\"name\":\"peer\",\"protocol\":\"rdma\"," DEV ",\"buffers\":[{\"name\":\"cpu:0\","
			   "\"addr\":4096,\"length\":4096,\"rkey\":$}]}";
	const char *lkey = "{\"name\":\"peer\",\"protocol\":\"rdma\"," DEV ",\"buffers\":[{\"name\":\"cpu:0\","
			   "\"addr\":4096,\"length\":4096,\"rkey\":[7],\"lkey\":$}]}";
	const char *other = "{\"name\":\"peer\",\"protocol\":\"rdma\"," DEV ",\"buffers\":[],\"nvmeof\":$}";
	char *d2000 = hostile_deep(2000, 0), *o2000 = hostile_deep(2000, 1);
	char *m1 = hostile_array("", 1000000, "1", ""), *s1m = hostile_string("", 1 << 20, "");
	hostile cases[] = {
		{ "buffers nested 2000 deep", fill(bufs, d2000), "nested deeper than 16 levels" },
		{ "a device name: objects 2000 deep", fill(dname, o2000), "nested deeper than 16 levels" },
		{ "another transport's field 2000 deep", fill(other, o2000), "nested deeper than 16 levels" },
		{ "devices of 1M elements", fill(devs, m1), "array with more than 65536 elements" },
		{ "a device name of 1 MiB", fill(dname, s1m), "longer than 65536 bytes" },
		{ "devices twice",
		  g_strdup("{\"name\":\"peer\"," DEV "," DEV ",\"buffers\":[]}"), "key repeated" },
		{ "a device's gid twice",
		  g_strdup("{\"name\":\"peer\",\"devices\":[{\"name\":\"mlx5_0\",\"lid\":0,\"gid\":" GID
			   ",\"gid\":" GID "}]}"),
		  "key repeated" },
		{ "devices a string", fill(devs, "\"mlx5_0\""), "\"devices\" is not an array" },
		{ "a device name a number", fill(dname, "5"), "has no valid \"name\"" },
		{ "a device name an array", fill(dname, "[\"mlx5_0\"]"), "has no valid \"name\"" },
		{ "a gid a number", fill(gid, "5"), "has no valid \"gid\"" },
		{ "lid a string", fill(lid, "\"0\""), "has no valid \"lid\"" },
		{ "lid 65536", fill(lid, "65536"), "has no valid \"lid\"" },
		{ "lid -1", fill(lid, "-1"), "has no valid \"lid\"" },
		{ "lid 0.5", fill(lid, "0.5"), "has no valid \"lid\"" },
		{ "buffers an object", fill(bufs, "{}"), "\"buffers\" is not an array" },
		{ "a buffer name an array", fill(bname, "[]"), "\"name\" is not a string" },
		{ "addr -1", fill(addr, "-1"), "no valid addr/length" },
		{ "addr 0", fill(addr, "0"), "no valid addr/length" },
		{ "addr 4096.5", fill(addr, "4096.5"), "no valid addr/length" },
		{ "addr 1e300", fill(addr, "1e300"), "no valid addr/length" },
		{ "addr 2^64-1", fill(addr, "18446744073709551615"),
		  "no valid addr/length|outside [-2^63" },
		{ "addr 2^64", fill(addr, "18446744073709551616"), "outside [-2^63" },
		{ "addr a string", fill(addr, "\"4096\""), "no valid addr/length" },
		{ "length -4096", fill(len, "-4096"), "no valid addr/length" },
		{ "length 4e3", fill(len, "4e3"), "no valid addr/length" },
		{ "rkey a number", fill(rkey, "7"), "\"rkey\" is not an array" },
		{ "rkey 2^32", fill(rkey, "[4294967296]"), "rkey 0 is not a 32-bit key" },
		{ "rkey -1", fill(rkey, "[-1]"), "rkey 0 is not a 32-bit key" },
		{ "rkey 7.0", fill(rkey, "[7.0]"), "rkey 0 is not a 32-bit key" },
		{ "rkey a string", fill(rkey, "[\"7\"]"), "rkey 0 is not a 32-bit key" },
		{ "rkeys for two devices", fill(rkey, "[7,8]"), "has 2 rkeys for 1 devices" },
		/* the host leaves the one-key-per-device rule to the transport */
		{ "lkeys for two devices", fill(lkey, "[7,8]"), "has 2 lkeys for 1 devices" },
		{ "no lkeys for one device", fill(lkey, "[]"), "has 0 lkeys for 1 devices" },
		{ "lkey an object", fill(lkey, "{}"), "\"lkey\" is not an array" },
	};
	unsigned calls = 0;

	for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
		hostile *c = &cases[i];
		rd_seg *seg = (rd_seg *)1;
		pace(&calls);
		unsigned before = host_log_lines;
		host_log_clear();
		CHECK_EQ(open_desc(&tr, c->text, &seg), TE_ERR_METADATA);
		CHECK(seg == NULL);
		bool ok = host_log_lines == before + 1 && strstr(host_log_text, "segment peer: descriptor rejected") &&
			  says(host_log_text, c->why);
		CHECK(ok);
		report(c, ok);
		g_free(c->text);
	}
	/* The descriptor the variants came from opens. */
	rd_seg *seg = NULL;
	char *good = fill(addr, "4096");
	CHECK_EQ(open_desc(&tr, good, &seg), 0);
	CHECK(seg != NULL && seg->nbuf == 1 && seg->bufs[0].rkey[0] == 7 && seg->ndev == 1);
	rd_segment_close(&tr, seg);
	g_free(good);
	g_free(d2000);
	g_free(o2000);
	g_free(m1);
	g_free(s1m);
}

/* ------------------------------------------------------ install arguments */

static void test_arguments(void)
{
	const char *devs = "{\"devices\":$}";
	const char *matrix = "{\"priority_matrix\":$}";
	const char *mstring = "{\"devices\":[\"mlx5_0\"],\"nic_priority_matrix\":$}";
	char *d2000 = hostile_deep(2000, 0), *o2000 = hostile_deep(2000, 1);
	char *m2k = hostile_array("", 2000, "\"mlx5_0\"", ""), *m1 = hostile_array("", 1000000, "\"x\"", "");
	char *s100k = hostile_string("", 100000, ""), *name100 = hostile_string("", 100, "");
	/* a matrix inside a string: nested, and with a key twice */
	GString *deep_str = g_string_new("\"");
	for (int i = 0; i < 2000; i++)
		g_string_append(deep_str, "{\\\"a\\\":");
	g_string_append(deep_str, "1");
	for (int i = 0; i < 2000; i++)
		g_string_append_c(deep_str, '}');
	g_string_append_c(deep_str, '"');
	char *long_name = g_strdup_printf("[%s]", name100);
	hostile cases[] = {
		{ "a matrix of objects 2000 deep", fill(matrix, o2000), "nested deeper than 4 levels" },
		{ "devices nested 2000 deep", fill(devs, d2000), "nested deeper than 4 levels" },
		{ "a matrix string nested 2000 deep", fill(mstring, deep_str->str), "nested deeper than 3 levels" },
		{ "devices of 2000 names", fill(devs, m2k), "array with more than 1024 elements" },
		{ "devices of 1M names", fill(devs, m1), "over the limit of 1048576" },
		{ "devices a 100 kB string", fill(devs, s100k), "longer than 65536 bytes" },
		{ "a device name of 100 bytes", fill(devs, long_name), "not a device name" },
		{ "devices twice", g_strdup("{\"devices\":[\"mlx5_0\"],\"devices\":[\"mlx5_1\"]}"), "key repeated" },
		{ "a matrix string with a key twice",
		  fill(mstring, "\"{\\\"cpu:0\\\":[[\\\"mlx5_0\\\"]],\\\"cpu:0\\\":[[\\\"mlx5_1\\\"]]}\""),
		  "key repeated" },
		{ "devices a number", fill(devs, "5"), "neither a list of names nor" },
		{ "a device name a number", fill(devs, "[1.5]"), "entry 0 is not a device name" },
		{ "a device name out of range", fill(devs, "[1e400]"), "out of range" },
		{ "a matrix a number", fill(matrix, "5"), "\"priority_matrix\" is not an object" },
		{ "a matrix string holding an array", fill(mstring, "\"[1]\""), "is not a JSON object" },
	};

	for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
		hostile *c = &cases[i];
		void *ctx = (void *)1;
		unsigned before = host_log_lines;
		host_log_clear();
		CHECK_EQ(rd_create(&host, c->text, &ctx), -EINVAL);
		CHECK(ctx == NULL);
		bool ok = host_log_lines == before + 1 && strstr(host_log_text, "invalid arguments") &&
			  says(host_log_text, c->why) && host_log_bytes < 1024;
		CHECK(ok);
		report(c, ok);
		g_free(c->text);
	}
	/* The forms the variants came from parse. */
	const char *good[] = { "{\"devices\":[\"mlx5_0\",\"mlx5_1\"]}",
			       "{\"priority_matrix\":{\"cpu:0\":[[\"mlx5_0\"],[\"mlx5_1\"]]}}",
			       "{\"devices\":[\"mlx5_0\"],\"nic_priority_matrix\":\"{\\\"cpu:0\\\":[[\\\"mlx5_0\\\"]]}\"}",
			       "[\"mlx5_0\"]" };
	for (size_t i = 0; i < G_N_ELEMENTS(good); i++) {
		rd_args a;
		GString *err = g_string_new(NULL);
		CHECK_EQ(rd_parse_args(good[i], &a, err), 0);
		CHECK(a.devices != NULL || a.matrix != NULL);
		rd_args_clear(&a);
		g_string_free(err, TRUE);
	}
	g_string_free(deep_str, TRUE);
	g_free(d2000);
	g_free(o2000);
	g_free(m2k);
	g_free(m1);
	g_free(s100k);
	g_free(name100);
	g_free(long_name);
}

int main(void)
{
	TEST_RUN(test_handshake);
	TEST_RUN(test_descriptor);
	TEST_RUN(test_arguments);
	return check_done();
}
