/* SPDX-License-Identifier: Apache-2.0 */
/* libte's internals, linked in directly: descriptor decoding of hostile input,
 * descriptor encoding (sorted keys, merged plugin fields), host:port parsing
 * and the memory registry's lookups and pins. */
#include <json-glib/json-glib.h>

#include "../../libte/internal.h"
#include "../common/check.h"
#include "../common/mutate.h"

/* File segments by name here, so that these tests need no plugin; the
 * host's own judge (the transports' flags) is test_files_by_flag's. */
static bool files_by_name(const char *protocol)
{
	return strcmp(protocol, "nvmeof") == 0;
}

static int decode(const char *json, te_desc **d)
{
	return te_desc_decode_with(json, strlen(json), files_by_name, d);
}

static void test_decode_good(void)
{
	te_desc *d = NULL;
	const char *ok =
		"{\"buffers\":[{\"addr\":8192,\"length\":4096,\"name\":\"n\"},"
		"{\"addr\":4096,\"length\":1024,\"name\":\"n\"}],\"name\":\"n\",\"protocol\":\"tcp\","
		"\"tcp_data_port\":15123,\"tcp_proto_version\":2,\"timestamp\":\"x\"}";
	REQUIRE(decode(ok, &d) == 0);
	CHECK(strcmp(d->name, "n") == 0 && strcmp(d->protocol, "tcp") == 0);
	CHECK(!d->file_segment);
	CHECK(strstr(d->json, "\"tcp_data_port\":15123") != NULL); /* the transport's, as sent */
	CHECK_EQ(d->n_buffers, 2);
	CHECK_EQ(d->buffers[0].addr, 4096); /* sorted */
	CHECK(te_desc_contains(d, 4096, 1024));
	CHECK(!te_desc_contains(d, 4096, 1025));
	CHECK(te_desc_contains(d, 8192 + 4095, 1));
	CHECK(!te_desc_contains(d, 8192 + 4095, 2));
	CHECK(!te_desc_contains(d, 4095, 1));
	CHECK(!te_desc_contains(d, 5120, 1)); /* the hole between buffers */
	CHECK(!te_desc_contains(d, UINT64_MAX - 1, 4));
	te_desc_free(d);

	/* no buffers is fine */
	REQUIRE(decode("{\"name\":\"m\",\"protocol\":\"rdma\",\"devices\":[]}", &d) == 0);
	CHECK_EQ(d->n_buffers, 0);
	CHECK(!te_desc_contains(d, 0, 1));
	te_desc_free(d);

	/* RDMA: rkey/lkey arrays as long as devices; empty rkey for local-only */
	REQUIRE(decode("{\"name\":\"r\",\"protocol\":\"rdma\",\"devices\":[{\"name\":\"a\"},{\"name\":\"b\"}],"
		       "\"buffers\":[{\"addr\":1,\"length\":2,\"name\":\"cpu:0\",\"rkey\":[1,2],\"lkey\":[3,4]},"
		       "{\"addr\":10,\"length\":2,\"name\":\"cpu:0\",\"rkey\":[],\"lkey\":[3,4]}]}",
		       &d) == 0);
	te_desc_free(d);

	/* NVMe-oF: server_name, files laid end to end */
	REQUIRE(decode("{\"server_name\":\"nvmeof/d\",\"protocol\":\"nvmeof\",\"buffers\":["
		       "{\"length\":100,\"file_path\":\"/a\",\"local_path_map\":{}},"
		       "{\"length\":50,\"file_path\":\"/b\"}]}", &d) == 0);
	CHECK(d->file_segment);
	CHECK_EQ(d->file_size, 150);
	CHECK(te_desc_contains(d, 0, 150));
	CHECK(te_desc_contains(d, 99, 2));
	CHECK(!te_desc_contains(d, 100, 51));
	te_desc_free(d);

	/* Transports' own fields are theirs to judge in segment_open: the
	 * envelope passes whatever they hold. */
	const char *theirs[] = {
		"{\"name\":\"n\",\"protocol\":\"tcp\",\"tcp_data_port\":70000}",
		"{\"name\":\"n\",\"protocol\":\"tcp\",\"tcp_data_port\":-1}",
		"{\"name\":\"n\",\"protocol\":\"tcp\",\"tcp_data_port\":\"80\",\"tcp_proto_version\":256}",
		"{\"name\":\"n\",\"protocol\":\"rdma\",\"devices\":[{}],\"buffers\":[{\"addr\":4,\"length\":4,\"name\":\"c\",\"rkey\":[1,2],\"lkey\":[1]}]}",
		"{\"name\":\"n\",\"protocol\":\"rdma\",\"devices\":{},\"buffers\":[{\"addr\":4,\"length\":4,\"name\":\"c\",\"rkey\":{}}]}",
		"{\"name\":\"n\",\"protocol\":\"ext\",\"ext_port\":[]}",
	};
	for (size_t i = 0; i < sizeof theirs / sizeof *theirs; i++) {
		d = NULL;
		CHECK_EQ(decode(theirs[i], &d), 0);
		CHECK(d != NULL && strcmp(d->json, theirs[i]) == 0);
		te_desc_free(d);
	}
}

/* The host's judge of file segments is the flag a transport declares, not
 * its name: the test transports "extfile" (TE_TRANSPORT_FILES only) and
 * "ext" (TE_TRANSPORT_MEMORY), loaded from TE_PLUGIN_PATH. */
static void test_files_by_flag(void)
{
	te_desc *d = NULL;
	REQUIRE(te_plugin_find(TE_KIND_TRANSPORT, "extfile") != NULL);
	REQUIRE(te_plugin_find(TE_KIND_TRANSPORT, "ext") != NULL);
	CHECK(te_transport_files_only("extfile"));
	CHECK(!te_transport_files_only("ext"));
	CHECK(!te_transport_files_only("no-such-transport"));
	if (te_plugin_find(TE_KIND_TRANSPORT, "nvmeof") != NULL)
		CHECK(te_transport_files_only("nvmeof"));
	const char *files = "{\"name\":\"f\",\"protocol\":\"extfile\",\"buffers\":[{\"length\":100},"
			    "{\"length\":28,\"name\":\"b\"}]}";
	REQUIRE(te_desc_decode(files, strlen(files), &d) == 0);
	CHECK(d->file_segment);
	CHECK_EQ(d->file_size, 128);
	CHECK(te_desc_contains(d, 100, 28));
	te_desc_free(d);
	REQUIRE(te_desc_decode_dom(files, strlen(files), te_transport_files_only, &d) == 0);
	CHECK(d->file_segment && d->file_size == 128);
	te_desc_free(d);
	/* the same buffers under a transport for memory: addresses required */
	const char *mem = "{\"name\":\"f\",\"protocol\":\"ext\",\"buffers\":[{\"length\":100}]}";
	d = (te_desc *)1;
	CHECK_EQ(te_desc_decode(mem, strlen(mem), &d), TE_ERR_METADATA);
	CHECK(d == NULL);
}

static void test_decode_bad(void)
{
	const char *bad[] = {
		"",
		"not json",
		"[1,2]",
		"{\"protocol\":\"tcp\"}",                                  /* no name */
		"{\"name\":\"\",\"protocol\":\"tcp\"}",                       /* empty name */
		"{\"name\":5,\"protocol\":\"tcp\"}",
		"{\"name\":\"n\"}",                                          /* no protocol */
		"{\"name\":\"n\",\"protocol\":\"tcp\",\"buffers\":{}}",
		"{\"name\":\"n\",\"protocol\":\"tcp\",\"buffers\":[1]}",
		"{\"name\":\"n\",\"protocol\":\"tcp\",\"buffers\":[{\"addr\":0,\"length\":4,\"name\":\"n\"}]}",
		"{\"name\":\"n\",\"protocol\":\"tcp\",\"buffers\":[{\"addr\":4,\"length\":0,\"name\":\"n\"}]}",
		"{\"name\":\"n\",\"protocol\":\"tcp\",\"buffers\":[{\"addr\":4,\"length\":4}]}",
		"{\"name\":\"n\",\"protocol\":\"tcp\",\"buffers\":[{\"addr\":4,\"length\":4,\"name\":\"\"}]}",
		"{\"name\":\"n\",\"protocol\":\"tcp\",\"buffers\":[{\"addr\":-4,\"length\":4,\"name\":\"n\"}]}",
		"{\"name\":\"n\",\"protocol\":\"tcp\",\"buffers\":[{\"addr\":1.5,\"length\":4,\"name\":\"n\"}]}",
		"{\"name\":\"n\",\"protocol\":\"tcp\",\"buffers\":[{\"addr\":18446744073709551615,\"length\":4,\"name\":\"n\"}]}",
		"{\"name\":\"n\",\"protocol\":\"nvmeof\",\"buffers\":[{\"file_path\":\"/a\"}]}",
		"{\"name\":\"n\",\"protocol\":\"nvmeof\",\"buffers\":[{\"length\":9223372036854775807},{\"length\":9223372036854775807},{\"length\":9223372036854775807}]}",
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		te_desc *d = (te_desc *)1;
		int rc = decode(bad[i], &d);
		if (rc != TE_ERR_METADATA || d != NULL)
			fprintf(stderr, "  accepted: %s\n", bad[i]);
		CHECK_EQ(rc, TE_ERR_METADATA);
		CHECK(d == NULL);
	}
	te_desc *d = NULL;
	CHECK_EQ(te_desc_decode(NULL, 0, &d), TE_ERR_METADATA);
	CHECK_EQ(te_desc_decode_dom(NULL, 0, files_by_name, &d), TE_ERR_METADATA);
}

static void test_split(void)
{
	char *h = NULL;
	int p = 0;
	CHECK_EQ(te_split_host_port("node1", &h, &p), 0);
	CHECK(strcmp(h, "node1") == 0 && p == -1);
	g_free(h);
	CHECK_EQ(te_split_host_port("10.0.0.1:15001", &h, &p), 0);
	CHECK(strcmp(h, "10.0.0.1") == 0 && p == 15001);
	g_free(h);
	CHECK_EQ(te_split_host_port("[::1]:80", &h, &p), 0);
	CHECK(strcmp(h, "::1") == 0 && p == 80);
	g_free(h);
	CHECK_EQ(te_split_host_port("fe80::1", &h, &p), 0);
	CHECK(strcmp(h, "fe80::1") == 0 && p == -1);
	g_free(h);
	const char *bad[] = { "", ":80", "h:0", "h:65536", "h:-1", "h:8x", "h:", "[::1", "[]:1", "[::1]x", "h:0x50", "h:+80" };
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		CHECK_EQ(te_split_host_port(bad[i], &h, &p), -EINVAL);
		CHECK(h == NULL);
	}
	uint64_t v;
	CHECK(te_parse_u64("0x10", &v) && v == 16);
	CHECK(!te_parse_u64("-1", &v));
	CHECK(!te_parse_u64("99999999999999999999", &v));
	CHECK(!te_parse_u64(" 1", &v));
}

/* Encoding goes through a real engine: sorted keys, plugin fields merged. */
static void test_encode(void)
{
	te_engine *e = NULL;
	static char buf[100];
	te_option opt = { "transports", "memcpy" };
	REQUIRE(te_engine_create("P2PHANDSHAKE", "127.0.0.1", &opt, 1, &e) == 0);
	REQUIRE(te_register_memory(e, buf, sizeof buf, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
	char *json = te_engine_encode_descriptor(e);
	if (getenv("TEST_VERBOSE"))
		fprintf(stderr, "%s\n", json);
	/* keys in sorted order at the top level (after the buffers array) */
	const char *order[] = { "\"buffers\"", "\"memcpy_pid\"", "\"name\"", "\"protocol\"", "\"timestamp\"" };
	const char *prev = json;
	for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
		const char *at = strstr(prev, order[i]);
		CHECK(at != NULL);
		if (at)
			prev = at;
	}
	CHECK(strstr(json, "\"protocol\":\"memcpy\"") != NULL);
	/* The TCP plugin's fields for every descriptor, though TCP is not
	 * installed (Mooncake peers read them); its "protocol" gave way to the
	 * engine's transport for memory. */
	if (te_plugin_find(TE_KIND_TRANSPORT, "tcp") != NULL)
		CHECK(strstr(json, "\"protocol\":\"memcpy\",\"tcp_data_port\":0,\"tcp_proto_version\":2,") != NULL);
	char want[128];
	snprintf(want, sizeof want, "{\"addr\":%llu,\"length\":100,\"name\":\"%s\"}",
		 (unsigned long long)(uintptr_t)buf, te_engine_name(e));
	CHECK(strstr(json, want) != NULL);
	/* and it decodes back */
	te_desc *d = NULL;
	CHECK_EQ(te_desc_decode(json, strlen(json), &d), 0);
	CHECK(d && d->n_buffers == 1 && d->buffers[0].addr == (uintptr_t)buf);
	te_desc_free(d);
	g_free(json);

	/* registry lookups and pins */
	te_buffer_pin pin;
	CHECK_EQ(te_memreg_acquire(&e->mem, (uintptr_t)buf + 10, 90, TE_MEM_REMOTE_ACCESS, &pin), 0);
	CHECK(pin.addr == buf && pin.length == 100);
	CHECK_EQ(atomic_load(&((te_region *)pin.priv)->pins), 1);
	te_memreg_release(&e->mem, &pin);
	CHECK_EQ(te_memreg_acquire(&e->mem, (uintptr_t)buf + 10, 91, 0, &pin), TE_ERR_ADDRESS);
	CHECK_EQ(te_memreg_acquire(&e->mem, UINT64_MAX - 2, 5, 0, &pin), TE_ERR_ADDRESS);
	static char priv[10];
	REQUIRE(te_register_memory(e, priv, sizeof priv, "cpu:0", 0) == 0);
	CHECK_EQ(te_memreg_acquire(&e->mem, (uintptr_t)priv, 1, TE_MEM_REMOTE_ACCESS, &pin), TE_ERR_ADDRESS);
	CHECK_EQ(te_memreg_acquire(&e->mem, (uintptr_t)priv, 1, 0, &pin), 0);
	te_memreg_release(&e->mem, &pin);
	te_engine_destroy(e);
}

/* Random mutations of valid descriptors: every outcome is a clean accept or
 * a clean TE_ERR_METADATA (the sanitizers watch the rest). */
static void test_decode_mutations(void)
{
	const char *seeds[] = {
		"{\"buffers\":[{\"addr\":8192,\"length\":4096,\"name\":\"n\"}],\"name\":\"n\","
		"\"protocol\":\"tcp\",\"tcp_data_port\":15123,\"tcp_proto_version\":2}",
		"{\"name\":\"r\",\"protocol\":\"rdma\",\"devices\":[{\"name\":\"a\",\"lid\":1,"
		"\"gid\":\"00:01\"}],\"priority_matrix\":{\"cpu:0\":[[\"a\"],[]]},"
		"\"buffers\":[{\"addr\":1,\"length\":2,\"name\":\"cpu:0\",\"rkey\":[1],\"lkey\":[3]}]}",
		"{\"server_name\":\"nvmeof/d\",\"protocol\":\"nvmeof\",\"buffers\":["
		"{\"length\":100,\"file_path\":\"/a\",\"local_path_map\":{\"h\":\"/m\"}}]}",
	};
	GRand *rnd = g_rand_new_with_seed(12345);
	int accepted = 0, rejected = 0, other = 0;
	for (int iter = 0; iter < 30000; iter++) {
		size_t len;
		char *m = mutated_copy(rnd, seeds[iter % 3], &len);
		te_desc *d = NULL;
		int rc = te_desc_decode_with(m, len, files_by_name, &d);
		if (rc == 0 && d != NULL) {
			accepted++;
			/* whatever was accepted is internally consistent */
			for (size_t i = 0; i < d->n_buffers; i++)
				if (!d->file_segment && (d->buffers[i].addr == 0 || d->buffers[i].length == 0))
					other++;
			te_desc_contains(d, 1, 1);
			te_desc_free(d);
		} else if (rc == TE_ERR_METADATA && d == NULL) {
			rejected++;
		} else {
			other++;
		}
		g_free(m);
	}
	g_rand_free(rnd);
	CHECK(accepted > 0);
	CHECK(rejected > 0);
	CHECK_EQ(other, 0);
}

/* Two decoded descriptors alike, or both refused. */
static bool same_desc(int rc1, const te_desc *a, int rc2, const te_desc *b)
{
	if (rc1 != rc2)
		return false;
	if (rc1 != 0)
		return a == NULL && b == NULL;
	if (strcmp(a->name, b->name) != 0 || strcmp(a->protocol, b->protocol) != 0 ||
	    (a->auth == NULL) != (b->auth == NULL) || (a->auth && strcmp(a->auth, b->auth) != 0) ||
	    a->file_segment != b->file_segment || a->file_size != b->file_size || a->n_buffers != b->n_buffers ||
	    strcmp(a->json, b->json) != 0)
		return false;
	for (size_t i = 0; i < a->n_buffers; i++)
		if (a->buffers[i].addr != b->buffers[i].addr || a->buffers[i].length != b->buffers[i].length ||
		    strcmp(a->buffers[i].name, b->buffers[i].name) != 0)
			return false;
	return true;
}

/* The one-pass reader of escape-free descriptors answers as the document
 * tree does: on odd but valid values and on random mutations. */
static void test_decode_fast_matches_dom(void)
{
	const char *seeds[] = {
		"{\"buffers\":[{\"addr\":8192,\"length\":4096,\"name\":\"n\"},{\"addr\":4096,\"length\":1,"
		"\"name\":\"cpu:0\",\"x\":{\"a\":[\"]}\",{\"b\":\"[\"}]}}],\"name\":\"n\",\"protocol\":\"tcp\","
		"\"tcp_data_port\":15123,\"tcp_proto_version\":2,\"timestamp\":\"x\"}",
		" { \"name\" : \"r\" , \"protocol\" : \"rdma\", \"devices\" : [ {\"name\":\"a\"} , {\"name\":\"b\"} ] ,"
		"\"auth\":\"hmac\", \"buffers\" : [ {\"addr\": 1 , \"length\" : 2 , \"name\" : \"cpu:0\" ,"
		"\"rkey\" : [ 1 , 2 ] , \"lkey\" : [ 3 , 4 ] } ] } ",
		"{\"server_name\":\"nvmeof/d\",\"protocol\":\"nvmeof\",\"buffers\":["
		"{\"length\":100,\"file_path\":\"/a\"},{\"length\":5,\"name\":7}]}",
		"{\"name\":5,\"server_name\":\"s\",\"protocol\":\"tcp\",\"tcp_data_port\":-0,\"buffers\":[]}",
		"{\"name\":\"n\",\"protocol\":\"tcp\",\"tcp_data_port\":1.0}",
		"{\"name\":\"n\",\"protocol\":\"tcp\",\"buffers\":[{\"addr\":-1,\"length\":1,\"name\":\"a\"}]}",
		"{\"name\":\"n\",\"protocol\":\"tcp\",\"devices\":null,\"buffers\":null}",
		"{\"name\":\"n\",\"protocol\":\"tcp\",\"buffers\":[{\"addr\":9223372036854775807,\"length\":1,"
		"\"name\":\"a\"}]}",
		"[{\"name\":\"n\"}]",
		"{\"name\":\"n\",\"protocol\":\"tcp\",\"buffers\":[{\"addr\":4096,\"length\":1,\"name\":\"\"}]}",
	};
	const size_t n_seeds = sizeof seeds / sizeof *seeds;
	int differ = 0, accepted = 0;
	for (size_t i = 0; i < n_seeds; i++) {
		te_desc *a = NULL, *b = NULL;
		int r1 = te_desc_decode_with(seeds[i], strlen(seeds[i]), files_by_name, &a);
		int r2 = te_desc_decode_dom(seeds[i], strlen(seeds[i]), files_by_name, &b);
		if (!same_desc(r1, a, r2, b)) {
			fprintf(stderr, "  seed %zu: fast %d, tree %d\n", i, r1, r2);
			differ++;
		}
		accepted += r1 == 0;
		te_desc_free(a);
		te_desc_free(b);
	}
	CHECK(accepted >= 3);
	GRand *rnd = g_rand_new_with_seed(54321);
	for (int iter = 0; iter < 20000; iter++) {
		size_t len;
		char *m = mutated_copy(rnd, seeds[iter % n_seeds], &len);
		te_desc *a = NULL, *b = NULL;
		int r1 = te_desc_decode_with(m, len, files_by_name, &a);
		int r2 = te_desc_decode_dom(m, len, files_by_name, &b);
		if (!same_desc(r1, a, r2, b)) {
			if (differ++ < 5)
				fprintf(stderr, "  mutation differs (fast %d, tree %d): %.*s\n", r1, r2, (int)len, m);
		}
		te_desc_free(a);
		te_desc_free(b);
		g_free(m);
	}
	g_rand_free(rnd);
	CHECK_EQ(differ, 0);
}

int main(void)
{
	te_set_log_level(TE_LOG_ERROR);
	TEST_RUN(test_decode_good);
	TEST_RUN(test_decode_bad);
	TEST_RUN(test_files_by_flag);
	TEST_RUN(test_decode_mutations);
	TEST_RUN(test_decode_fast_matches_dom);
	TEST_RUN(test_split);
	TEST_RUN(test_encode);
	return check_done();
}
