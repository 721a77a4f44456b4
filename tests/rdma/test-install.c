/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Installing the RDMA transport in an engine on the software verbs layer:
 * the descriptor fields it publishes (devices in canonical order with LID
 * and GID, the priority matrix from the fixture's topology, per-buffer
 * location, rkeys and lkeys, no rkey for local-only buffers), user matrices
 * and device allow-lists, the automatic GID choice, and every way an install
 * is refused, each with a log line naming the reason. Also probe/report (what
 * te-info prints) and auto-discovery.
 */
#include <json-glib/json-glib.h>
#include <stdlib.h>

#include "rdma-util.h"

typedef struct desc {
	JsonParser *p;
	JsonObject *o;
} desc;

static bool desc_get(te_engine *e, desc *d)
{
	char *text = descriptor_of(e);
	d->p = json_parser_new();
	d->o = NULL;
	if (text != NULL && json_parser_load_from_data(d->p, text, -1, NULL) &&
	    JSON_NODE_HOLDS_OBJECT(json_parser_get_root(d->p)))
		d->o = json_node_get_object(json_parser_get_root(d->p));
	free(text);
	return d->o != NULL;
}

/* The first line of a file, without its newline. */
static bool rd_line(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "r");
	bool ok = f != NULL && fgets(buf, (int)size, f) != NULL;
	if (f != NULL)
		fclose(f);
	if (ok)
		buf[strcspn(buf, "\n")] = '\0';
	return ok && buf[0] != '\0';
}

static void desc_free(desc *d)
{
	g_object_unref(d->p);
}

static char *node_text(JsonNode *n)
{
	JsonGenerator *g = json_generator_new();
	json_generator_set_root(g, n);
	char *s = json_generator_to_data(g, NULL);
	g_object_unref(g);
	return s;
}

static char *member_text(JsonObject *o, const char *m)
{
	JsonNode *n = json_object_get_member(o, m);
	return n ? node_text(n) : g_strdup("(missing)");
}

static JsonObject *buffer_at(JsonObject *o, const void *addr)
{
	JsonArray *a = json_object_get_array_member(o, "buffers");
	for (guint i = 0; a && i < json_array_get_length(a); i++) {
		JsonObject *b = json_array_get_object_element(a, i);
		if ((uint64_t)json_object_get_int_member(b, "addr") == (uintptr_t)addr)
			return b;
	}
	return NULL;
}

static void test_descriptor(void)
{
	te_engine *e = soft_engine("two-socket", NULL);
	desc d;
	REQUIRE(e != NULL);

	/* Memory registered before the transport gets keys too. */
	unsigned char *early = buf_new(8192);
	CHECK_EQ(te_register_memory(e, early, 8192, "cpu:0", TE_MEM_REMOTE_ACCESS), 0);
	CHECK_EQ(te_transport_install(e, "rdma", NULL), 0);
	CHECK_EQ(te_transport_install(e, "rdma", NULL), -EEXIST);
	unsigned char *remote = buf_new(1 << 20), *local = buf_new(4096);
	CHECK_EQ(te_register_memory(e, remote, 1 << 20, "cpu:1", TE_MEM_REMOTE_ACCESS), 0);
	CHECK_EQ(te_register_memory(e, local, 4096, "cuda:2", 0), 0);

	REQUIRE(desc_get(e, &d));
	CHECK(strcmp(json_object_get_string_member(d.o, "protocol"), "rdma") == 0);
	char *devs = member_text(d.o, "devices");
	/* Sorted by name, GID index 3 (RoCE v2, IPv4) chosen on each. */
	CHECK(strcmp(devs,
		     "[{\"gid\":\"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01\",\"lid\":0,\"name\":\"mlx5_0\"},"
		     "{\"gid\":\"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:02\",\"lid\":0,\"name\":\"mlx5_1\"},"
		     "{\"gid\":\"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:03\",\"lid\":0,\"name\":\"mlx5_2\"},"
		     "{\"gid\":\"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:04\",\"lid\":0,\"name\":\"mlx5_3\"}]") == 0);
	g_free(devs);
	char *m = member_text(d.o, "priority_matrix");
	CHECK(strcmp(m, "{\"cpu:0\":[[\"mlx5_0\",\"mlx5_1\"],[\"mlx5_2\",\"mlx5_3\"]],"
			"\"cpu:1\":[[\"mlx5_2\",\"mlx5_3\"],[\"mlx5_0\",\"mlx5_1\"]],"
			"\"cuda:0\":[[\"mlx5_0\"],[\"mlx5_1\",\"mlx5_2\",\"mlx5_3\"]],"
			"\"cuda:1\":[[\"mlx5_1\"],[\"mlx5_0\",\"mlx5_2\",\"mlx5_3\"]],"
			"\"cuda:2\":[[\"mlx5_2\"],[\"mlx5_0\",\"mlx5_1\",\"mlx5_3\"]],"
			"\"cuda:3\":[[\"mlx5_3\"],[\"mlx5_0\",\"mlx5_1\",\"mlx5_2\"]],"
			"\"cuda:4\":[[\"mlx5_2\",\"mlx5_3\"],[\"mlx5_0\",\"mlx5_1\"]]}") == 0);
	g_free(m);

	JsonObject *b = buffer_at(d.o, remote);
	REQUIRE(b != NULL);
	CHECK(strcmp(json_object_get_string_member(b, "name"), "cpu:1") == 0);
	CHECK_EQ(json_array_get_length(json_object_get_array_member(b, "rkey")), 4);
	CHECK_EQ(json_array_get_length(json_object_get_array_member(b, "lkey")), 4);
	/* one key per device, distinct devices distinct keys */
	JsonArray *rk = json_object_get_array_member(b, "rkey");
	CHECK(json_array_get_int_element(rk, 0) != json_array_get_int_element(rk, 1));
	b = buffer_at(d.o, local);
	REQUIRE(b != NULL);
	CHECK(strcmp(json_object_get_string_member(b, "name"), "cuda:2") == 0);
	CHECK_EQ(json_array_get_length(json_object_get_array_member(b, "rkey")), 0);
	CHECK_EQ(json_array_get_length(json_object_get_array_member(b, "lkey")), 4);
	b = buffer_at(d.o, early);
	REQUIRE(b != NULL);
	CHECK_EQ(json_array_get_length(json_object_get_array_member(b, "rkey")), 4);
	desc_free(&d);

	CHECK_EQ(te_unregister_memory(e, remote), 0);
	REQUIRE(desc_get(e, &d));
	CHECK(buffer_at(d.o, remote) == NULL);
	CHECK(buffer_at(d.o, local) != NULL);
	desc_free(&d);

	/* Uninstalled: the RDMA fields go, the registry stays. */
	CHECK_EQ(te_transport_uninstall(e, "rdma"), 0);
	REQUIRE(desc_get(e, &d));
	CHECK(!json_object_has_member(d.o, "devices"));
	b = buffer_at(d.o, local);
	CHECK(b != NULL && !json_object_has_member(b, "rkey"));
	desc_free(&d);
	te_engine_destroy(e);
	free(remote);
	free(local);
	free(early);
}

/* Installs the transport on `e` (which must have started) with the log at
 * INFO: it must install, and say `why` of the GID it chose. */
static void install_says(te_engine *e, const char *why)
{
	REQUIRE(e != NULL);
	te_set_log_level(TE_LOG_INFO);
	cap_start();
	CHECK_EQ(te_transport_install(e, "rdma", NULL), 0);
	CHECK(cap_has(why));
	te_set_log_level(TE_LOG_WARN);
}

static void test_matrix_and_devices(void)
{
	desc d;
	te_engine *e = soft_engine("two-socket", "{\"devices\": [\"mlx5_2\", \"mlx5_1\"]}");
	REQUIRE(e != NULL);
	REQUIRE(desc_get(e, &d));
	char *m = member_text(d.o, "priority_matrix");
	CHECK(strstr(m, "\"cpu:0\":[[\"mlx5_1\"],[\"mlx5_2\"]]") != NULL);
	g_free(m);
	CHECK_EQ(json_array_get_length(json_object_get_array_member(d.o, "devices")), 2);
	desc_free(&d);
	te_engine_destroy(e);

	/* The seeds' form: the object is the matrix; its NICs are the devices. */
	e = soft_engine("two-socket", "{\"cpu:0\": [[\"mlx5_3\"], [\"mlx5_0\"]], "
				      "\"cuda:0\": [[\"mlx5_0\", \"mlx5_3\"]]}");
	REQUIRE(e != NULL);
	REQUIRE(desc_get(e, &d));
	m = member_text(d.o, "priority_matrix");
	CHECK(strcmp(m, "{\"cpu:0\":[[\"mlx5_3\"],[\"mlx5_0\"]],\"cuda:0\":[[\"mlx5_0\",\"mlx5_3\"],[]]}") == 0);
	g_free(m);
	JsonArray *dv = json_object_get_array_member(d.o, "devices");
	CHECK_EQ(json_array_get_length(dv), 2);
	CHECK(strcmp(json_object_get_string_member(json_array_get_object_element(dv, 1), "name"),
		     "mlx5_3") == 0);
	desc_free(&d);
	te_engine_destroy(e);

	/* te-bench's form: a matrix as a JSON string, and a device string; a
	 * bare list of names. */
	static const struct {
		const char *args;
		unsigned devices; /* published */
	} forms[] = {
		{ "{\"priority_matrix\": \"{\\\"cpu:0\\\": [[\\\"mlx5_1\\\"], []]}\"}", 1 },
		{ "{\"devices\": \"mlx5_0, mlx5_3\"}", 2 },
		{ "[\"mlx5_2\"]", 1 },
	};
	for (size_t i = 0; i < G_N_ELEMENTS(forms); i++) {
		e = soft_engine("two-socket", forms[i].args);
		REQUIRE(e != NULL);
		REQUIRE(desc_get(e, &d));
		unsigned n = json_array_get_length(json_object_get_array_member(d.o, "devices"));
		if (n != forms[i].devices)
			fprintf(stderr, "  %s: %u devices published\n", forms[i].args, n);
		CHECK_EQ(n, forms[i].devices);
		desc_free(&d);
		te_engine_destroy(e);
	}

	/* InfiniBand: the LID is published, the first IB GID chosen. */
	e = soft_engine("infiniband", NULL);
	install_says(e, "GID index 0 chosen automatically (IB");
	REQUIRE(desc_get(e, &d));
	JsonObject *dev0 = json_array_get_object_element(json_object_get_array_member(d.o, "devices"), 0);
	CHECK_EQ(json_object_get_int_member(dev0, "lid"), 17);
	CHECK(strcmp(json_object_get_string_member(dev0, "gid"),
		     "fe:80:00:00:00:00:00:00:00:02:c9:03:00:a1:b2:c3") == 0);
	desc_free(&d);
	te_engine_destroy(e);
}

static void expect_refused(const char *fx, const char *args, const char *const *opts, int rc,
			   const char *log)
{
	te_engine *e = soft_engine_v(fx, NULL, opts);
	REQUIRE(e != NULL);
	cap_start();
	int got = te_transport_install(e, "rdma", args);
	CHECK_EQ(got, rc);
	CHECK(cap_has(log));
	const char *names[4];
	CHECK_EQ(te_transport_list(e, names, 4), 0);
	te_engine_destroy(e);
}

static void test_refusals(void)
{
	char empty[] = "/tmp/te-rdma-empty-XXXXXX";
	REQUIRE(mkdtemp(empty) != NULL);

	/* refused by the host before the plugin sees it */
	expect_refused("two-socket", "{not json", NULL, -EINVAL, "not acceptable JSON: expected a key");
	expect_refused("two-socket", "{\"devices\": [\"mlx5_7\"]}", NULL, -ENODEV,
		       "RDMA device mlx5_7 was requested but not found (found: mlx5_0, mlx5_1, mlx5_2, mlx5_3)");
	expect_refused("two-socket", "{\"devices\": [3]}", NULL, -EINVAL, "entry 0 is not a device name");
	expect_refused("two-socket", "{\"cpu:0\": [[\"mlx5_9\"], []]}", NULL, -EINVAL,
		       "names NIC \"mlx5_9\"");
	expect_refused("two-socket", "{\"devices\": [\"mlx5_0\"], \"cpu:0\": [[\"mlx5_0\"]]}", NULL,
		       -EINVAL, "unknown argument \"cpu:0\"");
	expect_refused("two-socket", "{\"devices\": [\"mlx5_0\"], \"priority_matrix\": {\"cpu:0\": "
				     "[[\"mlx5_1\"], []]}}",
		       NULL, -EINVAL, "not among the RDMA devices found");
	expect_refused("two-socket", "42", NULL, -EINVAL, "neither a JSON object nor a list");
	const char *port2[] = { "TE_RDMA_IB_PORT", "2", NULL };
	expect_refused("two-socket", NULL, port2, -EINVAL, "port 2 requested");
	expect_refused("no-netdev", NULL, NULL, -ENODEV, "no GID with a network device");
	/* an empty machine: no devices at all */
	te_option o[2] = { { "TE_RDMA_SOFT", "1" }, { "TE_RDMA_SYSFS_ROOT", empty } };
	te_engine *e = NULL;
	REQUIRE(te_engine_create("P2PHANDSHAKE", "127.0.0.1", o, 2, &e) == 0);
	cap_start();
	CHECK_EQ(te_transport_install(e, "rdma", NULL), -ENODEV);
	CHECK(cap_has("RDMA transport not installed: no RDMA devices were found"));
	te_engine_destroy(e);

	/* The GID index can be forced; the log says so. */
	const char *gid3[] = { "TE_RDMA_GID_INDEX", "3", NULL };
	e = soft_engine_v("no-netdev", NULL, gid3);
	install_says(e, "GID index 3 as configured (RoCE v2)");
	te_engine_destroy(e);
	/* ... and through the Mooncake name, from the environment. */
	setenv("MC_GID_INDEX", "1", 1);
	e = soft_engine("no-netdev", NULL);
	install_says(e, "GID index 1 as configured (RoCE v2)");
	te_engine_destroy(e);
	unsetenv("MC_GID_INDEX");
	rmdir(empty);
}

static void test_report_and_auto(void)
{
	char empty[] = "/tmp/te-rdma-empty-XXXXXX";
	char *text = NULL;
	REQUIRE(mkdtemp(empty) != NULL);

	/* What te-info prints: the report reads the environment. */
	setenv("TE_RDMA_SOFT", "1", 1);
	setenv("TE_RDMA_SYSFS_ROOT", fixture("two-socket"), 1);
	CHECK_EQ(te_plugin_report("rdma", &text), 0);
	REQUIRE(text != NULL);
	CHECK(strstr(text, "verbs: soft") != NULL);
	CHECK(strstr(text, "mlx5_3     PCI 0000:88:00.0, NUMA node 1") != NULL);
	CHECK(strstr(text, "port 1 ACTIVE, Ethernet") != NULL);
	CHECK(strstr(text, "GID index 3 chosen automatically (RoCE v2, IPv4") != NULL);
	CHECK(strstr(text, "priority matrix: {\"cpu:0\":[[\"mlx5_0\",\"mlx5_1\"],[\"mlx5_2\",\"mlx5_3\"]]") != NULL);
	te_free(text);
	setenv("TE_RDMA_DEVICES", "mlx5_3", 1);
	CHECK_EQ(te_plugin_report("rdma", &text), 0);
	CHECK(text && strstr(text, "mlx5_3") && !strstr(text, "mlx5_0"));
	te_free(text);
	unsetenv("TE_RDMA_DEVICES");

	/* Auto-discovery installs RDMA when the probe finds devices. */
	te_engine *e = p2p_engine(NULL);
	REQUIRE(e != NULL);
	const char *which = NULL;
	CHECK_EQ(te_transport_auto(e, &which), 0);
	CHECK(which && strcmp(which, "rdma") == 0);
	te_engine_destroy(e);

	setenv("TE_RDMA_SYSFS_ROOT", empty, 1);
	CHECK_EQ(te_plugin_report("rdma", &text), 0);
	CHECK(text && strstr(text, "no RDMA devices were found") != NULL);
	te_free(text);
	/* ... and refuses it, with the reason, when there are none. */
	setenv("TE_FORCE_HCA", "1", 1);
	e = p2p_engine(NULL);
	REQUIRE(e != NULL);
	cap_start();
	CHECK_EQ(te_transport_auto(e, &which), TE_ERR_NO_TRANSPORT);
	CHECK(cap_has("RDMA is unusable: no RDMA devices were found"));
	te_engine_destroy(e);
	unsetenv("TE_FORCE_HCA");

	/* The production table: libibverbs, which finds nothing on this machine
	 * (when the kernel has no RDMA devices). */
	unsetenv("TE_RDMA_SOFT");
	unsetenv("TE_RDMA_SYSFS_ROOT");
	CHECK_EQ(te_plugin_report("rdma", &text), 0);
	CHECK(text && strstr(text, "verbs: libibverbs") != NULL);
	if (access("/sys/class/infiniband", F_OK) != 0)
		CHECK(text && strstr(text, "no RDMA devices were found (libibverbs lists none") != NULL);
	te_free(text);
	rmdir(empty);
}

/* The GID sysfs shows at `index` of port 1, in the descriptor's notation
 * ("fe:80:00:..."); false when unreadable. */
static bool sysfs_gid(const char *dev, int index, char out[48])
{
	char path[256], line[64];
	snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/1/gids/%d", dev, index);
	if (!rd_line(path, line, sizeof line))
		return false;
	/* "0000:0000:0000:0000:0000:ffff:0a09:0001": 8 groups of 4 digits */
	char hex[33];
	size_t n = 0;
	for (const char *p = line; *p != '\0' && n < 32; p++)
		if (*p != ':')
			hex[n++] = *p;
	if (n != 32)
		return false;
	for (size_t i = 0; i < 16; i++)
		snprintf(out + 3 * i, 4, "%c%c%s", hex[2 * i], hex[2 * i + 1], i < 15 ? ":" : "");
	return true;
}

/* On a real device (real-device mode): what the descriptor publishes comes
 * from the provider: the GID the kernel lists at the index chosen (logged),
 * LID 0 on RoCE, keys from ibv_reg_mr; and refusals name what is wrong. */
static void test_real_device(void)
{
	desc d;
	char line[256];
	te_engine *e = soft_engine_v(NULL, NULL, NULL);
	REQUIRE(e != NULL);
	te_set_log_level(TE_LOG_INFO);
	cap_start();
	char *args = map_names("{\"devices\": [\"mlx5_1\", \"mlx5_0\"]}");
	CHECK_EQ(te_transport_install(e, "rdma", args), 0);
	free(args);
	te_set_log_level(TE_LOG_WARN);
	unsigned char *remote = buf_new(1 << 20), *local = buf_new(8192);
	CHECK_EQ(te_register_memory(e, remote, 1 << 20, "cpu:0", TE_MEM_REMOTE_ACCESS), 0);
	CHECK_EQ(te_register_memory(e, local, 8192, "cpu:0", 0), 0);
	REQUIRE(desc_get(e, &d));
	JsonArray *dv = json_object_get_array_member(d.o, "devices");
	REQUIRE(dv != NULL);
	CHECK_EQ(json_array_get_length(dv), 2);
	for (guint i = 0; i < json_array_get_length(dv) && i < 2; i++) {
		JsonObject *o = json_array_get_object_element(dv, i);
		const char *name = json_object_get_string_member(o, "name");
		/* canonical order: sorted by name */
		CHECK(strcmp(name, dev_name(i == 0 ? "mlx5_0" : "mlx5_1")) == 0);
		CHECK_EQ(json_object_get_int_member(o, "lid"), 0); /* RoCE has none */
		/* "<dev> port 1: GID index N chosen automatically (RoCE v2, IPv4, ..." */
		snprintf(line, sizeof line, "%s port 1: GID index ", name);
		int index = -1;
		pthread_mutex_lock(&cap_lock);
		const char *at = strstr(cap_buf, line);
		if (at != NULL)
			index = atoi(at + strlen(line));
		pthread_mutex_unlock(&cap_lock);
		CHECK(index >= 0);
		snprintf(line, sizeof line, "%s port 1: GID index %d chosen automatically (RoCE v2, IPv4", name,
			 index);
		CHECK(cap_has(line));
		char gid[48];
		CHECK(sysfs_gid(name, index, gid));
		CHECK(strcmp(json_object_get_string_member(o, "gid"), gid) == 0);
		fprintf(stderr, "  %s: GID index %d, %s\n", name, index, gid);
	}
	JsonObject *b = buffer_at(d.o, remote);
	REQUIRE(b != NULL);
	JsonArray *rk = json_object_get_array_member(b, "rkey"), *lk = json_object_get_array_member(b, "lkey");
	CHECK_EQ(json_array_get_length(rk), 2);
	CHECK_EQ(json_array_get_length(lk), 2);
	for (guint i = 0; i < 2 && i < json_array_get_length(rk); i++)
		CHECK(json_array_get_int_element(rk, i) != 0 && json_array_get_int_element(lk, i) != 0);
	b = buffer_at(d.o, local);
	REQUIRE(b != NULL);
	CHECK_EQ(json_array_get_length(json_object_get_array_member(b, "rkey")), 0);
	desc_free(&d);
	CHECK_EQ(te_unregister_memory(e, remote), 0);
	CHECK_EQ(te_unregister_memory(e, local), 0);
	te_engine_destroy(e);
	free(remote);
	free(local);

	/* Refusals: an unknown device (the log lists the real ones), a port the
	 * device lacks, a GID index the port lacks. */
	snprintf(line, sizeof line, "RDMA device nosuch0 was requested but not found (found: %s",
		 dev_name("mlx5_0"));
	expect_refused(NULL, "{\"devices\": [\"nosuch0\"]}", NULL, -ENODEV, line);
	args = map_names("[\"mlx5_0\"]");
	const char *port2[] = { "TE_RDMA_IB_PORT", "2", NULL };
	expect_refused(NULL, args, port2, -EINVAL, "port 2 requested");
	const char *gid200[] = { "TE_RDMA_GID_INDEX", "200", NULL };
	expect_refused(NULL, args, gid200, -EINVAL, "GID index 200 (TE_RDMA_GID_INDEX/MC_GID_INDEX) is not usable");
	free(args);
}

int main(void)
{
	find_controls();
	if (real_mode()) {
		fprintf(stderr, "  the fixtures' topologies are skipped on real devices\n");
		TEST_RUN(test_real_device);
		return check_done();
	}
	TEST_RUN(test_descriptor);
	TEST_RUN(test_matrix_and_devices);
	TEST_RUN(test_refusals);
	TEST_RUN(test_report_and_auto);
	return check_done();
}
