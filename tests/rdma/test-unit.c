/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The RDMA plugin's pure parts, linked in directly: the NIC priority matrix
 * from sysfs fixture trees (two sockets, four NICs, GPUs behind PCIe
 * switches), user matrices and their validation, peer matrices, and the
 * Connection frame's JSON in Mooncake's format (encode, decode, rejects).
 */
#include <stdlib.h>
#include <string.h>

#include "rdma.h"

#include "../common/check.h"
#include "../common/mutate.h"

static char root[4096];

static const char *fx(const char *name)
{
	const char *dir = getenv("TE_RDMA_FIXTURES");
	REQUIRE(dir != NULL);
	snprintf(root, sizeof root, "%s/%s", dir, name);
	return root;
}

/* The matrix as compact JSON text, g_free()d by the caller. */
static char *matrix_text(const rd_topo *t)
{
	char (*devs)[RD_NAME_MAX] = g_malloc0_n((gsize)t->nhca, RD_NAME_MAX);
	for (int i = 0; i < t->nhca; i++)
		g_strlcpy(devs[i], t->hcas[i].name, RD_NAME_MAX);
	JsonNode *n = rd_matrix_to_json(t->locs, t->nloc, devs);
	JsonGenerator *g = json_generator_new();
	json_generator_set_root(g, n);
	char *s = json_generator_to_data(g, NULL);
	g_object_unref(g);
	json_node_unref(n);
	g_free(devs);
	return s;
}

static void test_discover_two_socket(void)
{
	char *names[] = { "mlx5_3", "mlx5_1", "mlx5_0", "mlx5_2" }; /* any order in */
	GString *err = g_string_new(NULL);
	rd_topo t;

	REQUIRE(rd_topo_discover(fx("two-socket"), names, 4, &t, err) == 0);
	CHECK_EQ(t.nhca, 4);
	/* canonical order, PCI bus ids and NUMA nodes from sysfs */
	CHECK(strcmp(t.hcas[0].name, "mlx5_0") == 0 && strcmp(t.hcas[3].name, "mlx5_3") == 0);
	CHECK(strcmp(t.hcas[0].pci, "0000:04:00.0") == 0);
	CHECK(strcmp(t.hcas[2].pci, "0000:84:00.0") == 0);
	CHECK_EQ(t.hcas[1].numa, 0);
	CHECK_EQ(t.hcas[3].numa, 1);
	char *m = matrix_text(&t);
	/* cpu:N: NICs of node N first; cuda:N: the NIC behind the GPU's own
	 * PCIe switch first; cuda:4 has no NIC under its root complex and
	 * falls back to the NICs of its NUMA node. The VGA and the audio
	 * function are not GPUs. */
	const char *want =
		"{\"cpu:0\":[[\"mlx5_0\",\"mlx5_1\"],[\"mlx5_2\",\"mlx5_3\"]],"
		"\"cpu:1\":[[\"mlx5_2\",\"mlx5_3\"],[\"mlx5_0\",\"mlx5_1\"]],"
		"\"cuda:0\":[[\"mlx5_0\"],[\"mlx5_1\",\"mlx5_2\",\"mlx5_3\"]],"
		"\"cuda:1\":[[\"mlx5_1\"],[\"mlx5_0\",\"mlx5_2\",\"mlx5_3\"]],"
		"\"cuda:2\":[[\"mlx5_2\"],[\"mlx5_0\",\"mlx5_1\",\"mlx5_3\"]],"
		"\"cuda:3\":[[\"mlx5_3\"],[\"mlx5_0\",\"mlx5_1\",\"mlx5_2\"]],"
		"\"cuda:4\":[[\"mlx5_2\",\"mlx5_3\"],[\"mlx5_0\",\"mlx5_1\"]]}";
	CHECK(strcmp(m, want) == 0);
	if (strcmp(m, want) != 0)
		fprintf(stderr, "  got  %s\n  want %s\n", m, want);
	g_free(m);
	CHECK(rd_loc_find(t.locs, t.nloc, "cuda:3") != NULL);
	CHECK(rd_loc_find(t.locs, t.nloc, "cuda:5") == NULL);
	rd_topo_clear(&t);

	/* An allow-list of two NICs on different sockets. */
	char *two[] = { "mlx5_2", "mlx5_1" };
	REQUIRE(rd_topo_discover(fx("two-socket"), two, 2, &t, err) == 0);
	m = matrix_text(&t);
	CHECK(strstr(m, "\"cpu:0\":[[\"mlx5_1\"],[\"mlx5_2\"]]") != NULL);
	CHECK(strstr(m, "\"cpu:1\":[[\"mlx5_2\"],[\"mlx5_1\"]]") != NULL);
	CHECK(strstr(m, "\"cuda:0\":[[\"mlx5_1\"],[\"mlx5_2\"]]") != NULL); /* same socket, nearer */
	g_free(m);
	rd_topo_clear(&t);

	/* Nothing to discover. */
	CHECK_EQ(rd_topo_discover(fx("two-socket"), NULL, 0, &t, err), -ENODEV);
	CHECK(strstr(err->str, "no RDMA devices") != NULL);
	g_string_free(err, TRUE);
}

/* Devices that device plugins report are placed where they say they are
 * (PCI bus id, else NUMA node), and take precedence over the sysfs guess. */
static void test_discover_reported_devices(void)
{
	char *names[] = { "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3" };
	rd_devloc devs[] = {
		{ "testdev:0", "0000:87:00.0", -1 }, /* behind mlx5_3's switch */
		{ "testdev:1", "0000:03:00.0", 0 },  /* behind mlx5_0's */
		{ "cuda:0", "0000:07:00.0", 0 },     /* sysfs order would say 03:00.0 */
		{ "testdev:2", "", 1 },              /* no PCI id: its NUMA node */
		{ "testdev:3", "0000:ff:00.0", -1 }, /* nowhere known: no preference */
	};
	GString *err = g_string_new(NULL);
	rd_topo t;

	REQUIRE(rd_topo_discover_devices(fx("two-socket"), names, 4, devs, 5, &t, err) == 0);
	char *m = matrix_text(&t);
	CHECK(strstr(m, "\"testdev:0\":[[\"mlx5_3\"],") != NULL);
	CHECK(strstr(m, "\"testdev:1\":[[\"mlx5_0\"],") != NULL);
	CHECK(strstr(m, "\"cuda:0\":[[\"mlx5_1\"],") != NULL);
	CHECK(strstr(m, "\"cuda:1\":[[\"mlx5_1\"],") != NULL); /* the rest still from sysfs */
	CHECK(strstr(m, "\"testdev:2\":[[\"mlx5_2\",\"mlx5_3\"],") != NULL);
	CHECK(strstr(m, "\"testdev:3\":[[],") != NULL);
	if (strstr(m, "\"cuda:0\":[[\"mlx5_1\"],") == NULL)
		fprintf(stderr, "  got %s\n", m);
	g_free(m);
	rd_topo_clear(&t);
	g_string_free(err, TRUE);
}

static void test_discover_single(void)
{
	char *ib[] = { "ibp59s0" };
	GString *err = g_string_new(NULL);
	rd_topo t;

	REQUIRE(rd_topo_discover(fx("infiniband"), ib, 1, &t, err) == 0);
	char *m = matrix_text(&t);
	CHECK(strcmp(m, "{\"cpu:0\":[[\"ibp59s0\"],[]]}") == 0);
	g_free(m);
	rd_topo_clear(&t);
	/* A device sysfs knows nothing about: NUMA unknown, usable from
	 * every node but preferred by none. */
	char *ghost[] = { "mlx5_9" };
	REQUIRE(rd_topo_discover(fx("two-socket"), ghost, 1, &t, err) == 0);
	CHECK_EQ(t.hcas[0].numa, -1);
	m = matrix_text(&t);
	CHECK(strstr(m, "\"cpu:0\":[[],[\"mlx5_9\"]]") != NULL);
	g_free(m);
	rd_topo_clear(&t);
	g_string_free(err, TRUE);
}

static JsonObject *parse_obj(JsonParser *p, const char *text)
{
	REQUIRE(json_parser_load_from_data(p, text, -1, NULL));
	return json_node_get_object(json_parser_get_root(p));
}

static void test_user_matrix(void)
{
	char *known[] = { "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3" };
	GString *err = g_string_new(NULL);
	JsonParser *p = json_parser_new();
	rd_topo t;

	/* The seeds' example: a location with one list only is fine. */
	JsonObject *o = parse_obj(p, "{\"cpu:0\": [[\"mlx5_1\", \"mlx5_0\"], [\"mlx5_3\"]],"
				     " \"cuda:0\": [[\"mlx5_1\", \"mlx5_0\"]]}");
	REQUIRE(rd_topo_from_matrix(fx("two-socket"), o, known, 4, &t, err) == 0);
	CHECK_EQ(t.nhca, 3); /* the NICs it names, sorted */
	CHECK(strcmp(t.hcas[0].name, "mlx5_0") == 0 && strcmp(t.hcas[2].name, "mlx5_3") == 0);
	char *m = matrix_text(&t);
	/* preference order within a list is the user's */
	CHECK(strcmp(m, "{\"cpu:0\":[[\"mlx5_1\",\"mlx5_0\"],[\"mlx5_3\"]],"
			"\"cuda:0\":[[\"mlx5_1\",\"mlx5_0\"],[]]}") == 0);
	g_free(m);
	rd_topo_clear(&t);

	struct {
		const char *json, *msg;
	} bad[] = {
		{ "{\"cpu:0\": [[\"mlx5_7\"], []]}", "NIC \"mlx5_7\"" },
		{ "{\"cpu:0\": \"mlx5_0\"}", "is not [[preferred NICs], [other NICs]]" },
		{ "{\"cpu:0\": [[\"mlx5_0\"], [], []]}", "holds 3 lists" },
		{ "{\"cpu:0\": [[\"mlx5_0\"], [7]]}", "entry 0 is not a NIC name" },
		{ "{\"cpu:0\": [\"mlx5_0\"]}", "list 0 is not an array" },
		{ "{\"cpu:0\": [[], []]}", "names no NIC" },
		{ "{}", "empty" },
		{ "{\"\": [[\"mlx5_0\"], []]}", "bad location name" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		g_string_truncate(err, 0);
		o = parse_obj(p, bad[i].json);
		CHECK_EQ(rd_topo_from_matrix(fx("two-socket"), o, known, 4, &t, err), -EINVAL);
		CHECK(strstr(err->str, bad[i].msg) != NULL);
		if (strstr(err->str, bad[i].msg) == NULL)
			fprintf(stderr, "  %s -> \"%s\"\n", bad[i].json, err->str);
	}

	/* A peer's matrix: names outside its device list are skipped. */
	char devs[3][RD_NAME_MAX] = { "a", "b", "c" };
	rd_loc *locs = NULL;
	int nloc = 0;
	o = parse_obj(p, "{\"cpu:0\": [[\"b\", \"zz\"], [\"a\", \"b\"]], \"cpu:1\": [[\"c\"]]}");
	REQUIRE(rd_matrix_parse(o, devs, 3, &locs, &nloc, err) == 0);
	CHECK_EQ(nloc, 2);
	const rd_loc *l0 = rd_loc_find(locs, nloc, "cpu:0");
	REQUIRE(l0 != NULL);
	CHECK_EQ(l0->npref, 1);
	CHECK_EQ(l0->pref[0], 1);
	CHECK_EQ(l0->navail, 1); /* "b" once only */
	CHECK_EQ(l0->avail[0], 0);
	rd_locs_free(locs, nloc);
	g_object_unref(p);
	g_string_free(err, TRUE);
}

static void test_gid_and_paths(void)
{
	uint8_t gid[16], back[16];
	char s[48], srv[64], dev[64];

	for (int i = 0; i < 16; i++)
		gid[i] = (uint8_t)(i * 17);
	rd_gid_format(gid, s);
	CHECK(strcmp(s, "00:11:22:33:44:55:66:77:88:99:aa:bb:cc:dd:ee:ff") == 0);
	CHECK(rd_gid_parse(s, back) && memcmp(gid, back, 16) == 0);
	CHECK(rd_gid_parse("FE:80:00:00:00:00:00:00:02:02:C9:FF:FE:00:00:01", back) && back[0] == 0xfe);
	CHECK(!rd_gid_parse("fe:80", back));
	CHECK(!rd_gid_parse("fe:80:00:00:00:00:00:00:02:02:c9:ff:fe:00:00:0g", back));
	CHECK(!rd_gid_parse("fe-80-00-00-00-00-00-00-02-02-c9-ff-fe-00-00-01", back));
	CHECK(!rd_gid_parse(NULL, back));

	CHECK(rd_nic_path_split("10.0.0.1:15001@mlx5_0", srv, sizeof srv, dev, sizeof dev));
	CHECK(strcmp(srv, "10.0.0.1:15001") == 0 && strcmp(dev, "mlx5_0") == 0);
	CHECK(rd_nic_path_split("a@b@mlx5_1", srv, sizeof srv, dev, sizeof dev));
	CHECK(strcmp(srv, "a@b") == 0 && strcmp(dev, "mlx5_1") == 0);
	CHECK(!rd_nic_path_split("@mlx5_0", srv, sizeof srv, dev, sizeof dev));
	CHECK(!rd_nic_path_split("host@", srv, sizeof srv, dev, sizeof dev));
	CHECK(!rd_nic_path_split("host", srv, sizeof srv, dev, sizeof dev));
	CHECK(!rd_nic_path_split("host@dev", srv, 3, dev, sizeof dev));
}

static void test_handshake_codec(void)
{
	GString *err = g_string_new(NULL);
	rd_hs hs = { 0 }, back;
	size_t len = 0;

	g_strlcpy(hs.local_nic_path, "10.0.0.1:15001@mlx5_0", sizeof hs.local_nic_path);
	g_strlcpy(hs.peer_nic_path, "10.0.0.2:16002@mlx5_3", sizeof hs.peer_nic_path);
	hs.local_lid = 17;
	for (int i = 0; i < 16; i++)
		hs.local_gid[i] = (uint8_t)(0xf0 + i);
	hs.qp_num[0] = 1234;
	hs.qp_num[1] = 0xffffff;
	hs.nqp = 2;
	char *j = rd_hs_encode(&hs, &len);
	REQUIRE(j != NULL);
	/* Mooncake's field set, compact, keys sorted. */
	const char *want =
		"{\"local_gid\":\"f0:f1:f2:f3:f4:f5:f6:f7:f8:f9:fa:fb:fc:fd:fe:ff\",\"local_lid\":17,"
		"\"local_nic_path\":\"10.0.0.1:15001@mlx5_0\",\"payload\":\"\","
		"\"peer_nic_path\":\"10.0.0.2:16002@mlx5_3\",\"qp_num\":[1234,16777215],"
		"\"ready_ack\":false,\"reply_msg\":\"\"}";
	CHECK(strcmp(j, want) == 0);
	CHECK_EQ(len, strlen(want));
	REQUIRE(rd_hs_decode(j, len, &back, err) == 0);
	CHECK(memcmp(&hs, &back, sizeof hs) == 0);
	free(j);

	/* A rejection: reply_msg set, no QPs, no GID needed. */
	rd_hs rej = { 0 };
	g_strlcpy(rej.local_nic_path, "b@mlx5_3", sizeof rej.local_nic_path);
	g_strlcpy(rej.peer_nic_path, "a@mlx5_0", sizeof rej.peer_nic_path);
	g_strlcpy(rej.reply_msg, "QP count mismatch", sizeof rej.reply_msg);
	j = rd_hs_encode(&rej, &len);
	CHECK(strstr(j, "\"qp_num\":[]") != NULL);
	CHECK(rd_hs_decode(j, len, &back, err) == 0 && strcmp(back.reply_msg, "QP count mismatch") == 0);
	free(j);

	/* A frame as an older peer writes it: no payload, no ready_ack, keys in
	 * another order. */
	const char *old = "{\"qp_num\":[7,8],\"peer_nic_path\":\"b@x\",\"local_nic_path\":\"a@y\","
			  "\"local_gid\":\"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01\","
			  "\"local_lid\":0,\"reply_msg\":\"\"}";
	REQUIRE(rd_hs_decode(old, strlen(old), &back, err) == 0);
	CHECK_EQ(back.nqp, 2);
	CHECK_EQ(back.qp_num[1], 8);
	CHECK(!back.ready_ack);
	CHECK_EQ(back.local_gid[15], 1);

	struct {
		const char *json, *msg;
	} bad[] = {
		{ "not json", "handshake refused: unexpected 'n' at byte 0" },
		{ "[1,2]", "not a JSON object" },
		{ "{\"peer_nic_path\":\"b@x\",\"qp_num\":[1]}", "\"local_nic_path\"" },
		{ "{\"local_nic_path\":\"a\",\"peer_nic_path\":\"b@x\",\"qp_num\":[1]}", "\"local_nic_path\"" },
		{ "{\"local_nic_path\":\"a@y\",\"qp_num\":[1]}", "\"peer_nic_path\"" },
		{ "{\"local_nic_path\":\"a@y\",\"peer_nic_path\":\"b@x\",\"local_gid\":\"zz\",\"qp_num\":[1]}",
		  "\"local_gid\"" },
		{ "{\"local_nic_path\":\"a@y\",\"peer_nic_path\":\"b@x\",\"qp_num\":[1]}", "missing" },
		{ "{\"local_nic_path\":\"a@y\",\"peer_nic_path\":\"b@x\",\"local_gid\":"
		  "\"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01\",\"qp_num\":[16777216]}",
		  "24-bit" },
		{ "{\"local_nic_path\":\"a@y\",\"peer_nic_path\":\"b@x\",\"local_gid\":"
		  "\"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01\",\"qp_num\":[-1]}",
		  "24-bit" },
		{ "{\"local_nic_path\":\"a@y\",\"peer_nic_path\":\"b@x\",\"local_gid\":"
		  "\"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01\",\"qp_num\":\"1\"}",
		  "not an array" },
		{ "{\"local_nic_path\":\"a@y\",\"peer_nic_path\":\"b@x\",\"local_gid\":"
		  "\"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01\",\"qp_num\":[]}",
		  "no QP numbers" },
		{ "{\"local_nic_path\":\"a@y\",\"peer_nic_path\":\"b@x\",\"local_lid\":70000,\"qp_num\":[1]}",
		  "16-bit" },
		{ "{\"local_nic_path\":\"a@y\",\"peer_nic_path\":\"b@x\",\"ready_ack\":1,\"qp_num\":[1]}",
		  "boolean" },
		{ "{\"local_nic_path\":\"a@y\",\"peer_nic_path\":\"b@x\",\"reply_msg\":5,\"qp_num\":[1]}",
		  "not a string" },
		{ "{\"local_nic_path\":\"a@y\",\"peer_nic_path\":\"b@x\",\"payload\":[],\"reply_msg\":\"x\"}",
		  "\"payload\"" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		g_string_truncate(err, 0);
		CHECK_EQ(rd_hs_decode(bad[i].json, strlen(bad[i].json), &back, err), -EINVAL);
		CHECK(strstr(err->str, bad[i].msg) != NULL);
		if (strstr(err->str, bad[i].msg) == NULL)
			fprintf(stderr, "  %s -> \"%s\"\n", bad[i].json, err->str);
	}
	/* 65 QP numbers: more than any endpoint has */
	GString *many = g_string_new("{\"local_nic_path\":\"a@y\",\"peer_nic_path\":\"b@x\",\"qp_num\":[");
	for (int i = 0; i < 65; i++)
		g_string_append_printf(many, "%s%d", i ? "," : "", i);
	g_string_append(many, "]}");
	CHECK_EQ(rd_hs_decode(many->str, many->len, &back, err), -EINVAL);
	g_string_free(many, TRUE);
	g_string_free(err, TRUE);
}

/* Random edits of valid handshakes (what a broken peer could send): each
 * one is a clean accept with every field in range, or -EINVAL with a reason
 * (the sanitizers watch the rest). */
static void test_handshake_mutations(void)
{
	const char *seeds[] = {
		"{\"local_gid\":\"f0:f1:f2:f3:f4:f5:f6:f7:f8:f9:fa:fb:fc:fd:fe:ff\",\"local_lid\":17,"
		"\"local_nic_path\":\"10.0.0.1:15001@mlx5_0\",\"payload\":\"\","
		"\"peer_nic_path\":\"10.0.0.2:16002@mlx5_3\",\"qp_num\":[1234,16777215],"
		"\"ready_ack\":false,\"reply_msg\":\"\"}",
		"{\"local_gid\":\"00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00\",\"local_lid\":0,"
		"\"local_nic_path\":\"b@mlx5_3\",\"payload\":\"\",\"peer_nic_path\":\"a@mlx5_0\","
		"\"qp_num\":[],\"ready_ack\":true,\"reply_msg\":\"QP count mismatch\"}",
	};
	GString *err = g_string_new(NULL);
	GRand *rnd = g_rand_new_with_seed(4242);
	int accepted = 0, rejected = 0, other = 0;

	for (int iter = 0; iter < 20000; iter++) {
		size_t len;
		char *m = mutated_copy(rnd, seeds[iter % 2], &len);
		rd_hs hs;
		g_string_truncate(err, 0);
		int rc = rd_hs_decode(m, len, &hs, err);
		if (rc == 0) {
			accepted++;
			bool ok = hs.nqp >= 0 && hs.nqp <= 64 &&
				  memchr(hs.local_nic_path, '\0', sizeof hs.local_nic_path) != NULL &&
				  memchr(hs.peer_nic_path, '\0', sizeof hs.peer_nic_path) != NULL &&
				  memchr(hs.reply_msg, '\0', sizeof hs.reply_msg) != NULL;
			for (int i = 0; ok && i < hs.nqp; i++)
				ok = hs.qp_num[i] <= 0xffffff;
			if (!ok)
				other++;
		} else if (rc == -EINVAL && err->len > 0) {
			rejected++;
		} else {
			other++;
		}
		g_free(m);
	}
	g_rand_free(rnd);
	g_string_free(err, TRUE);
	CHECK(accepted > 0);
	CHECK(rejected > 0);
	CHECK_EQ(other, 0);
}

static void test_strerror(void)
{
	CHECK(strcmp(rd_strerror(TE_ERR_REJECTED), "rejected by the peer") == 0);
	CHECK(strcmp(rd_strerror(-ENETDOWN), g_strerror(ENETDOWN)) == 0);
}

int main(void)
{
	TEST_RUN(test_discover_two_socket);
	TEST_RUN(test_discover_reported_devices);
	TEST_RUN(test_discover_single);
	TEST_RUN(test_user_matrix);
	TEST_RUN(test_gid_and_paths);
	TEST_RUN(test_handshake_codec);
	TEST_RUN(test_handshake_mutations);
	TEST_RUN(test_strerror);
	return check_done();
}
