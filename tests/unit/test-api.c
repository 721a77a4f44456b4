/* SPDX-License-Identifier: Apache-2.0 */
/* Misuse and bad input for every public call: clear negative codes, a log
 * line naming the problem, never a crash. */
#include <stdlib.h>

#include <sys/wait.h>

#include "../common/util.h"

static void test_strerror(void)
{
	int codes[] = { TE_ERR_PLUGIN, TE_ERR_NO_TRANSPORT, TE_ERR_METADATA, TE_ERR_PROTOCOL,
			TE_ERR_REJECTED, TE_ERR_BATCH_FULL, TE_ERR_ADDRESS, TE_ERR_OVERLAP,
			TE_ERR_SEGMENT, TE_ERR_BATCH };
	for (size_t i = 0; i < sizeof codes / sizeof *codes; i++) {
		CHECK(codes[i] < -TE_ERR_BASE);
		CHECK(strcmp(te_strerror(codes[i]), "unknown error") != 0);
		for (size_t j = 0; j < i; j++)
			CHECK(strcmp(te_strerror(codes[i]), te_strerror(codes[j])) != 0);
	}
	CHECK(strstr(te_strerror(-EINVAL), "nvalid") != NULL);
	CHECK(strcmp(te_strerror(0), "success") == 0);
	CHECK(strcmp(te_strerror(-999999), "unknown error") == 0);
	CHECK(strcmp(te_strerror(12345), "unknown error") == 0);
	CHECK(strcmp(te_version(), "1.6.0") == 0);
}

static void test_create_bad(void)
{
	te_engine *e = (te_engine *)1;
	te_option bad_opt[] = { { NULL, "x" } };
	te_option bad_port[] = { { "rpc_port", "http" } };
	te_option bad_tp[] = { { "transports", "no-such-transport" } };

	cap_start();
	CHECK_EQ(te_engine_create("P2PHANDSHAKE", "127.0.0.1", NULL, 0, NULL), -EINVAL);
	CHECK_EQ(te_engine_create(NULL, "127.0.0.1", NULL, 0, &e), -EINVAL);
	CHECK(e == NULL);
	CHECK(cap_has("metadata connection string"));
	CHECK_EQ(te_engine_create("", "127.0.0.1", NULL, 0, &e), -EINVAL);
	CHECK_EQ(te_engine_create("zookeeper://h:1", "127.0.0.1", NULL, 0, &e), -EPROTONOSUPPORT);
	CHECK(cap_has("zookeeper"));
	CHECK_EQ(te_engine_create("://h:1", "127.0.0.1", NULL, 0, &e), -EINVAL);
	CHECK_EQ(te_engine_create("P2PHANDSHAKE", "127.0.0.1", bad_opt, 1, &e), -EINVAL);
	CHECK_EQ(te_engine_create("P2PHANDSHAKE", "127.0.0.1", NULL, 1, &e), -EINVAL);
	CHECK_EQ(te_engine_create("P2PHANDSHAKE", "127.0.0.1", bad_port, 1, &e), -EINVAL);
	CHECK(cap_has("rpc_port=http"));
	CHECK_EQ(te_engine_create("P2PHANDSHAKE", "a/b", NULL, 0, &e), -EINVAL);
	CHECK_EQ(te_engine_create("P2PHANDSHAKE", "127.0.0.1:99999", NULL, 0, &e), -EINVAL);
	CHECK_EQ(te_engine_create("P2PHANDSHAKE", "", NULL, 0, &e), -EINVAL);
	CHECK_EQ(te_engine_create("P2PHANDSHAKE", "127.0.0.1", bad_tp, 1, &e), -ENOENT);
	CHECK(cap_has("no-such-transport"));
	CHECK(e == NULL);
	te_engine_destroy(NULL);
}

static void test_log_write(void)
{
	cap_start();
	te_last_error_clear();
	te_log_write(TE_LOG_ERROR, "binding", "a line from a layer above");
	CHECK(cap_has("0 binding a line from a layer above"));
	CHECK(strcmp(te_last_error(), "a line from a layer above") == 0);
	te_log_write(TE_LOG_WARN, NULL, "no domain");
	CHECK(cap_has("1 app no domain"));
	te_log_write(TE_LOG_TRACE, "binding", "filtered"); /* above the level: dropped */
	CHECK(!cap_has_quiet("filtered"));
	te_log_write(TE_LOG_ERROR, "binding", NULL);        /* nothing, no crash */
	te_set_log_handler(NULL, NULL);
}

static void test_mem_alloc(void)
{
	void *p = NULL, *q = NULL;
	CHECK_EQ(te_mem_alloc(0, &p), -EINVAL);
	CHECK_EQ(te_mem_alloc(10, NULL), -EINVAL);
	CHECK_EQ(te_mem_alloc(SIZE_MAX, &p), -EINVAL);
	REQUIRE(te_mem_alloc(5000, &p) == 0 && p != NULL);
	CHECK((uintptr_t)p % 4096 == 0);
	CHECK(((unsigned char *)p)[4999] == 0 && ((unsigned char *)p)[8191] == 0); /* zeroed, whole pages */
	REQUIRE(te_mem_alloc(4096, &q) == 0 && q != p);
	/* shared with a child: what it writes, the parent sees */
	pid_t pid = fork();
	if (pid == 0) {
		memcpy(p, "from the child", 15);
		_exit(0);
	}
	int st;
	waitpid(pid, &st, 0);
	CHECK(memcmp(p, "from the child", 15) == 0);
	te_engine *e = p2p_engine(NULL);
	REQUIRE(e != NULL);
	CHECK_EQ(te_register_memory(e, p, 8192, "cpu:0", TE_MEM_REMOTE_ACCESS), 0);
	CHECK_EQ(te_unregister_memory(e, p), 0);
	te_engine_destroy(e);
	CHECK_EQ(te_mem_free(p), 0);
	CHECK_EQ(te_mem_free(p), -EINVAL); /* twice */
	CHECK_EQ(te_mem_free((char *)q + 1), -EINVAL);
	CHECK_EQ(te_mem_free(q), 0);
	CHECK_EQ(te_mem_free(NULL), 0);
}

static void test_port_in_use(void)
{
	te_engine *a = p2p_engine(NULL), *b = NULL;
	REQUIRE(a != NULL);
	char name[64];
	snprintf(name, sizeof name, "127.0.0.1:%d", te_engine_rpc_port(a));
	CHECK(strcmp(te_engine_name(a), name) == 0);
	CHECK_EQ(te_engine_create("P2PHANDSHAKE", name, NULL, 0, &b), -EADDRINUSE);
	CHECK(b == NULL);
	/* rpc_port 0: a free port whatever the name says */
	te_option any_port[] = { { "rpc_port", "0" } };
	CHECK_EQ(te_engine_create("P2PHANDSHAKE", name, any_port, 1, &b), 0);
	CHECK(b != NULL && te_engine_rpc_port(b) != te_engine_rpc_port(a) && te_engine_rpc_port(b) > 0);
	te_engine_destroy(b);
	te_engine_destroy(a);
}

static void test_register_bad(void)
{
	te_engine *e = p2p_engine(NULL);
	static char buf[8192];
	REQUIRE(e != NULL);
	cap_start();
	CHECK_EQ(te_register_memory(NULL, buf, 10, "cpu:0", 0), -EINVAL);
	CHECK_EQ(te_register_memory(e, NULL, 10, "cpu:0", 0), -EINVAL);
	CHECK(cap_has("NULL address"));
	CHECK_EQ(te_register_memory(e, buf, 0, "cpu:0", 0), -EINVAL);
	CHECK(cap_has("zero length"));
	CHECK_EQ(te_register_memory(e, buf, 10, "gpu", 0), -EINVAL);
	CHECK(cap_has("bad location 'gpu'"));
	CHECK_EQ(te_register_memory(e, buf, 10, "cpu:x", 0), -EINVAL);
	CHECK_EQ(te_register_memory(e, buf, 10, NULL, 0), -EINVAL);
	CHECK_EQ(te_register_memory(e, buf, 10, "cpu:0", 0x80), -EINVAL);
	CHECK_EQ(te_register_memory(e, (void *)(uintptr_t)-16, 64, "cpu:0", 0), -EINVAL);

	CHECK_EQ(te_register_memory(e, buf + 1024, 1024, "cpu:0", TE_MEM_REMOTE_ACCESS), 0);
	CHECK_EQ(te_register_memory(e, buf + 1024, 1024, "cpu:0", 0), TE_ERR_OVERLAP);
	CHECK_EQ(te_register_memory(e, buf + 1000, 100, "cpu:0", 0), TE_ERR_OVERLAP);
	CHECK_EQ(te_register_memory(e, buf + 2047, 100, "cpu:0", 0), TE_ERR_OVERLAP);
	CHECK_EQ(te_register_memory(e, buf, 8192, "cpu:0", 0), TE_ERR_OVERLAP);
	CHECK(cap_has("overlaps"));
	/* adjacent is fine */
	CHECK_EQ(te_register_memory(e, buf + 2048, 1024, "*", 0), 0);
	CHECK_EQ(te_register_memory(e, buf, 1024, "cuda:0", 0), 0);

	/* batch: all or nothing */
	te_memory_region rs[] = { { buf + 4096, 512, "cpu:0", 0 }, { buf + 2100, 10, "cpu:0", 0 } };
	CHECK_EQ(te_register_memory_batch(e, rs, 2), TE_ERR_OVERLAP);
	CHECK_EQ(te_unregister_memory(e, buf + 4096), -ENOENT); /* first was not kept */
	te_memory_region self[] = { { buf + 4096, 512, "cpu:0", 0 }, { buf + 4100, 10, "cpu:0", 0 } };
	CHECK_EQ(te_register_memory_batch(e, self, 2), TE_ERR_OVERLAP);
	CHECK_EQ(te_register_memory_batch(e, NULL, 2), -EINVAL);
	CHECK_EQ(te_register_memory_batch(e, NULL, 0), 0);

	CHECK_EQ(te_unregister_memory(e, buf + 1025), -ENOENT);
	CHECK(cap_has("not the start of a registered region"));
	CHECK_EQ(te_unregister_memory(e, NULL), -ENOENT);
	CHECK_EQ(te_unregister_memory(NULL, buf), -EINVAL);
	void *both[] = { buf + 1024, buf + 1024 };
	CHECK_EQ(te_unregister_memory_batch(e, both, 2), -ENOENT); /* same twice */
	CHECK_EQ(te_unregister_memory(e, buf + 1024), 0);          /* ...so nothing was removed */
	CHECK_EQ(te_unregister_memory(e, buf + 1024), -ENOENT);
	void *rest[] = { buf + 2048, buf };
	CHECK_EQ(te_unregister_memory_batch(e, rest, 2), 0);
	te_engine_destroy(e);
}

static void test_segments_bad(void)
{
	te_engine *e = p2p_engine(NULL);
	char longname[400];
	REQUIRE(e != NULL);
	cap_start();
	memset(longname, 'a', sizeof longname - 1);
	longname[sizeof longname - 1] = '\0';
	CHECK_EQ(te_segment_open(NULL, "x"), -EINVAL);
	CHECK_EQ(te_segment_open(e, NULL), -EINVAL);
	CHECK_EQ(te_segment_open(e, ""), -EINVAL);
	CHECK_EQ(te_segment_open(e, longname), -EINVAL);
	CHECK_EQ(te_segment_open(e, "nohostport"), -EINVAL);
	CHECK(cap_has("not host:port"));
	CHECK(te_segment_open(e, "127.0.0.1:1") < 0); /* nobody listens */
	CHECK(cap_has("descriptor exchange failed"));
	CHECK_EQ(te_segment_open(e, te_engine_name(e)), TE_LOCAL_SEGMENT);
	CHECK_EQ(te_segment_close(e, 4242), TE_ERR_SEGMENT);
	CHECK_EQ(te_segment_close(e, TE_LOCAL_SEGMENT), 0);
	CHECK_EQ(te_segment_refresh(e, 4242), TE_ERR_SEGMENT);
	CHECK_EQ(te_segment_refresh(NULL, 1), -EINVAL);
	CHECK_EQ(te_segment_close(NULL, 1), -EINVAL);
	CHECK_EQ(te_segment_find(NULL, "x"), -EINVAL);
	CHECK_EQ(te_segment_find(e, NULL), -EINVAL);
	CHECK_EQ(te_segment_find(e, longname), -EINVAL);
	CHECK_EQ(te_segment_find(e, "127.0.0.1:1"), -ENOENT);
	CHECK_EQ(te_segment_refresh_all(NULL), -EINVAL);
	CHECK_EQ(te_segment_refresh_all(e), 0);
	CHECK_EQ(te_segment_probe(NULL, "x", 0), -EINVAL);
	CHECK_EQ(te_segment_probe(e, NULL, 0), -EINVAL);
	CHECK_EQ(te_segment_probe(e, "nohostport", 0), -EINVAL);
	/* A forced transport that is not installed */
	CHECK(te_segment_open_with(e, te_engine_name(e), "nope") == TE_LOCAL_SEGMENT);
	te_engine_destroy(e);
}

static void test_batches_bad(void)
{
	te_engine *e = p2p_engine(NULL);
	static char buf[4096], other[64];
	te_batch_id b = 0;
	te_task_status st;
	REQUIRE(e != NULL);
	cap_start();
	CHECK_EQ(te_batch_alloc(e, 0, &b), -EINVAL);
	CHECK(b == TE_INVALID_BATCH);
	CHECK_EQ(te_batch_alloc(e, (size_t)1 << 40, &b), -EINVAL);
	CHECK(cap_has("capacity"));
	CHECK_EQ(te_batch_alloc(e, 4, NULL), -EINVAL);
	CHECK_EQ(te_batch_alloc(NULL, 4, &b), -EINVAL);

	REQUIRE(te_register_memory(e, buf, sizeof buf, "cpu:0", 0) == 0);
	REQUIRE(te_batch_alloc(e, 4, &b) == 0);
	te_request ok = { TE_OP_WRITE, TE_LOCAL_SEGMENT, buf, (uintptr_t)(buf + 2048), 16 };
	te_request reqs[5] = { ok, ok, ok, ok, ok };
	CHECK_EQ(te_submit(e, b, reqs, 5), TE_ERR_BATCH_FULL);
	CHECK(cap_has("capacity"));
	size_t sub = 99;
	CHECK_EQ(te_batch_status(e, b, &sub, NULL, NULL), 0);
	CHECK_EQ(sub, 0);
	CHECK_EQ(te_submit(e, b + 1000, reqs, 1), TE_ERR_BATCH);
	CHECK_EQ(te_submit(e, b, NULL, 1), -EINVAL);
	CHECK_EQ(te_submit(NULL, b, reqs, 1), -EINVAL);
	CHECK_EQ(te_submit(e, b, reqs, 0), 0);

	te_request bad[4] = {
		{ 7, TE_LOCAL_SEGMENT, buf, (uintptr_t)(buf + 2048), 16 },          /* opcode */
		{ TE_OP_READ, TE_LOCAL_SEGMENT, other, (uintptr_t)(buf + 2048), 16 }, /* local unregistered */
		{ TE_OP_READ, 77, buf, 0, 16 },                                    /* unknown segment */
		{ TE_OP_READ, TE_LOCAL_SEGMENT, buf, (uintptr_t)(buf + 4090), 16 },  /* beyond the buffer */
	};
	CHECK_EQ(te_submit(e, b, bad, 4), 4);
	int errs[4] = { -EINVAL, TE_ERR_ADDRESS, TE_ERR_SEGMENT, TE_ERR_ADDRESS };
	for (size_t i = 0; i < 4; i++) {
		CHECK_EQ(te_get_status(e, b, i, &st), 0);
		CHECK_EQ(st.state, TE_TASK_INVALID);
		CHECK_EQ(st.error, errs[i]);
		CHECK_EQ(st.transferred, 0);
	}
	CHECK(cap_has("unknown opcode 7"));
	CHECK(cap_has("not inside one registered region"));
	CHECK(cap_has("unknown segment id 77"));
	CHECK(cap_has("outside the local segment"));
	int32_t state = -1;
	size_t infl = 99;
	CHECK_EQ(te_batch_status(e, b, &sub, &infl, &state), 0);
	CHECK_EQ(sub, 4);
	CHECK_EQ(infl, 0);
	CHECK_EQ(state, TE_TASK_INVALID);
	CHECK_EQ(te_submit(e, b, &ok, 1), TE_ERR_BATCH_FULL);
	CHECK_EQ(te_get_status(e, b, 4, &st), -ERANGE);
	CHECK_EQ(te_get_status(e, b, 0, NULL), -EINVAL);
	CHECK_EQ(te_get_status(e, b + 1, 0, &st), TE_ERR_BATCH);
	CHECK_EQ(te_batch_wait(e, b, 0), 0);
	CHECK_EQ(te_batch_wait(e, b + 1, 0), TE_ERR_BATCH);
	CHECK_EQ(te_batch_cancel(e, b + 1), TE_ERR_BATCH);
	CHECK_EQ(te_batch_free(e, b), 0);
	CHECK_EQ(te_batch_free(e, b), TE_ERR_BATCH);
	CHECK_EQ(te_get_status(e, b, 0, &st), TE_ERR_BATCH);
	te_engine_destroy(e);
}

static void test_transports_bad(void)
{
	te_engine *e = p2p_engine(NULL);
	const char *names[4];
	REQUIRE(e != NULL);
	cap_start();
	CHECK_EQ(te_transport_install(e, "no-such", NULL), -ENOENT);
	CHECK(cap_has("no-such"));
	CHECK_EQ(te_transport_install(e, NULL, NULL), -EINVAL);
	CHECK_EQ(te_transport_install(NULL, "memcpy", NULL), -EINVAL);
	CHECK_EQ(te_transport_install(e, "memcpy", NULL), 0);
	CHECK_EQ(te_transport_install(e, "memcpy", NULL), -EEXIST);
	CHECK_EQ(te_transport_list(e, names, 4), 1);
	CHECK(strcmp(names[0], "memcpy") == 0);
	CHECK_EQ(te_transport_list(e, NULL, 4), -EINVAL);
	CHECK_EQ(te_transport_uninstall(e, "tcp-not-here"), -ENOENT);
	CHECK_EQ(te_transport_uninstall(e, "memcpy"), 0);
	CHECK_EQ(te_transport_list(e, names, 4), 0);
	CHECK_EQ(te_transport_uninstall(e, "memcpy"), -ENOENT);
	te_engine_destroy(e);
}

static void test_notify_bad(void)
{
	te_engine *e = p2p_engine(NULL);
	te_notification *list = (void *)1;
	size_t n = 9;
	REQUIRE(e != NULL);
	char *big = malloc(TE_NOTIFY_MAX + 2);
	memset(big, 'x', TE_NOTIFY_MAX + 1);
	big[TE_NOTIFY_MAX + 1] = '\0';
	CHECK_EQ(te_notify_send(e, 99, "hi"), TE_ERR_SEGMENT);
	CHECK_EQ(te_notify_send(e, TE_LOCAL_SEGMENT, big), -EMSGSIZE);
	CHECK_EQ(te_notify_send(e, TE_LOCAL_SEGMENT, NULL), -EINVAL);
	CHECK_EQ(te_notify_send_as(NULL, TE_LOCAL_SEGMENT, "s", "m"), -EINVAL);
	CHECK_EQ(te_notify_send_as(e, TE_LOCAL_SEGMENT, big, "m"), -EMSGSIZE);
	CHECK_EQ(te_notify_send_as(e, 99, "s", "m"), TE_ERR_SEGMENT);
	CHECK_EQ(te_batch_notify_as(e, 12345, TE_LOCAL_SEGMENT, "s", "m"), TE_ERR_BATCH);
	CHECK_EQ(te_batch_notify_as(e, 12345, TE_LOCAL_SEGMENT, big, "m"), -EINVAL);
	CHECK_EQ(te_notify_fetch(e, NULL, &n), -EINVAL);
	CHECK_EQ(te_notify_fetch(e, &list, &n), 0);
	CHECK(list == NULL);
	CHECK_EQ(n, 0);
	/* to itself: delivered through its own RPC socket */
	CHECK_EQ(te_notify_send(e, TE_LOCAL_SEGMENT, "self"), 0);
	CHECK_EQ(te_notify_fetch(e, &list, &n), 0);
	CHECK_EQ(n, 1);
	if (n == 1) {
		CHECK(strcmp(list[0].msg, "self") == 0);
		CHECK(strcmp(list[0].name, te_engine_name(e)) == 0);
	}
	te_notifications_free(list, n);
	te_notifications_free(NULL, 0);
	free(big);
	te_engine_destroy(e);
}

static void test_metadata_api_bad(void)
{
	te_metadata *md = NULL;
	char key[128];
	char *v = NULL;
	CHECK_EQ(te_metadata_open(NULL, &md), -EINVAL);
	CHECK_EQ(te_metadata_open("P2PHANDSHAKE", NULL), -EINVAL);
	CHECK_EQ(te_metadata_open("nope://x", &md), -EPROTONOSUPPORT);
	CHECK_EQ(te_metadata_open("P2PHANDSHAKE", &md), 0);
	CHECK_EQ(te_metadata_get(md, "k", &v, NULL), -ENOENT);
	CHECK_EQ(te_metadata_get(md, "", &v, NULL), -EINVAL);
	CHECK_EQ(te_metadata_get(md, "k", NULL, NULL), -EINVAL);
	CHECK_EQ(te_metadata_put(md, "k", NULL, 0), -EINVAL);
	CHECK_EQ(te_metadata_remove(NULL, "k"), -EINVAL);
	te_metadata_close(md);
	CHECK_EQ(te_metadata_segment_key("node1:1", key, sizeof key), (int)strlen("mooncake/ram/node1:1"));
	CHECK(strcmp(key, "mooncake/ram/node1:1") == 0);
	CHECK(te_metadata_segment_key("nvmeof/disk1", key, sizeof key) > 0);
	CHECK(strcmp(key, "mooncake/nvmeof/disk1") == 0);
	CHECK(te_metadata_rpc_key("n", key, sizeof key) > 0);
	CHECK(strcmp(key, "mooncake/rpc_meta/n") == 0);
	CHECK_EQ(te_metadata_rpc_key("", key, sizeof key), -EINVAL);
	CHECK_EQ(te_metadata_segment_key("n", NULL, 10), -EINVAL);
	CHECK_EQ(te_metadata_segment_key("n", NULL, 0), (int)strlen("mooncake/ram/n"));
}

static void test_log_level(void)
{
	int old = te_get_log_level();
	te_set_log_level(99);
	CHECK_EQ(te_get_log_level(), TE_LOG_TRACE);
	te_set_log_level(-5);
	CHECK_EQ(te_get_log_level(), TE_LOG_ERROR);
	cap_start();
	te_engine *e = NULL;
	te_engine_create("P2PHANDSHAKE", "127.0.0.1", NULL, 0, &e);
	te_register_memory(e, NULL, 1, "cpu:0", 0);
	CHECK(cap_has("NULL address")); /* errors still show at the lowest level */
	te_engine_destroy(e);
	te_set_log_level(old);
	CHECK(te_plugin_dirs(NULL, NULL) == -EINVAL);
	char *text = NULL;
	CHECK_EQ(te_plugin_report("not-a-plugin", &text), -ENOENT);
	CHECK_EQ(te_plugin_report(NULL, &text), -EINVAL);
}

int main(void)
{
	TEST_RUN(test_strerror);
	TEST_RUN(test_create_bad);
	TEST_RUN(test_log_write);
	TEST_RUN(test_mem_alloc);
	TEST_RUN(test_port_in_use);
	TEST_RUN(test_register_bad);
	TEST_RUN(test_segments_bad);
	TEST_RUN(test_batches_bad);
	TEST_RUN(test_transports_bad);
	TEST_RUN(test_notify_bad);
	TEST_RUN(test_metadata_api_bad);
	TEST_RUN(test_log_level);
	return check_done();
}
