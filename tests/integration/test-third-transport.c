/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A transport the host does not know (tests/plugins/ext-transport.c) gets
 * what TCP and RDMA get: its own descriptor fields, published by every
 * engine (default_fields) and checked by itself alone in segment_open; a
 * place in te_transport_auto() by the rank it declares, and by its name's
 * old rank when built against the 1.11 header; file segments because it
 * says TE_TRANSPORT_FILES. Peers are engines of this process, or a fake
 * RPC port that hands out a descriptor written here. One that reports a
 * submit's transfers together (complete_many) ends each as complete() would.
 * TE_PLUGINS leaves out
 * RDMA, whose probe depends on the machine.
 */
#include <pthread.h>
#include <stdatomic.h>

#include <te/te-plugin.h>

#include "../tcp/tcp-test.h"

/* -------------------------------------------------------------- fakes */

/* A peer whose descriptor is `{"name": <its name>, <members>}`. */
static void fake_start(fake *f, const char *members)
{
	fake_listen(f, false);
	snprintf(f->desc, sizeof f->desc, "{\"name\":\"%s\",%s}", f->name, members);
	fake_serve(f);
}

/* A peer publishing `members` is refused by e with -EINVAL, the log naming
 * the field as `says`. */
static void refused_field(te_engine *e, const char *members, const char *says)
{
	fake f;
	fake_start(&f, members);
	cap_start();
	CHECK_EQ(te_segment_open(e, f.name), -EINVAL);
	CHECK(cap_has(says));
	fake_stop(&f);
}

static te_engine *engine_with(const char *transports, const char *probe, const char *tcp_port)
{
	te_option o[3];
	size_t n = 0;
	te_engine *e = NULL;

	if (transports != NULL)
		o[n++] = (te_option){ "transports", transports };
	if (probe != NULL)
		o[n++] = (te_option){ "TE_EXT_PROBE", probe };
	if (tcp_port != NULL)
		o[n++] = (te_option){ "TE_TCP_PORT", tcp_port };
	int rc = te_engine_create("P2PHANDSHAKE", "127.0.0.1", o, n, &e);
	if (rc != 0)
		fprintf(stderr, "engine create failed: %s\n", te_strerror(rc));
	return e;
}

static char *own_descriptor(te_engine *e)
{
	char *json = NULL;
	REQUIRE(te_segment_descriptor(e, TE_LOCAL_SEGMENT, &json) == 0 && json != NULL);
	return json;
}

/* ------------------------------------------------------- own fields */

static unsigned char peer_mem[4096];

static void test_own_fields(void)
{
	char want[64];
	snprintf(want, sizeof want, "\"ext_pid\":%d", (int)getpid());

	/* An engine with ext publishes its field; one without, ext's default,
	 * beside TCP's (neither installed there). */
	te_engine *a = engine_with("ext", NULL, NULL), *b = engine_with("ext", NULL, NULL);
	te_engine *t = engine_with("tcp", NULL, NULL);
	REQUIRE(a && b && t);
	static unsigned char abuf[4096], bbuf[4096];
	memset(abuf, 0xa5, sizeof abuf);
	REQUIRE(te_register_memory(a, abuf, sizeof abuf, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
	REQUIRE(te_register_memory(b, bbuf, sizeof bbuf, "cpu:0", 0) == 0);
	char *da = own_descriptor(a), *dt = own_descriptor(t);
	CHECK(strstr(da, want) != NULL);
	CHECK(strstr(da, "\"protocol\":\"ext\"") != NULL);
	CHECK(strstr(da, "\"tcp_data_port\":0") != NULL);
	CHECK(strstr(dt, "\"ext_pid\":0") != NULL);
	CHECK(strstr(dt, "\"protocol\":\"tcp\"") != NULL);
	te_free(da);
	te_free(dt);

	/* ext serves a's segment to b and moves its bytes. */
	te_segment_id s = te_segment_open(b, te_engine_name(a));
	CHECK(s > 0);
	if (s > 0) {
		CHECK(strcmp(te_segment_transport(b, s), "ext") == 0);
		te_task_status st;
		CHECK_EQ(run_one(b, TE_OP_READ, s, bbuf, (uint64_t)(uintptr_t)abuf, sizeof abuf, &st),
			 TE_TASK_COMPLETED);
		CHECK(memcmp(abuf, bbuf, sizeof abuf) == 0);
		CHECK_EQ(te_segment_close(b, s), 0);
	}
	/* ext's 0 (t has not installed it) is a segment it does not serve;
	 * TCP's 0 (a has not installed it) the same for TCP. */
	cap_start();
	CHECK(te_segment_open(b, te_engine_name(t)) < 0);
	CHECK(cap_has("no installed transport serves it"));
	CHECK(te_segment_open(t, te_engine_name(a)) < 0);

	/* The host reads neither transport's fields: a port TCP refuses does
	 * not keep ext from serving the segment. */
	fake f;
	char members[512];
	memset(peer_mem, 0x3c, sizeof peer_mem);
	snprintf(members, sizeof members,
		 "\"protocol\":\"ext\",\"ext_pid\":%d,\"tcp_data_port\":70000,\"buffers\":[{\"addr\":%llu,"
		 "\"length\":%zu,\"name\":\"cpu:0\"}]",
		 (int)getpid(), (unsigned long long)(uintptr_t)peer_mem, sizeof peer_mem);
	fake_start(&f, members);
	s = te_segment_open(b, f.name);
	CHECK(s > 0);
	if (s > 0) {
		te_task_status st;
		CHECK_EQ(run_one(b, TE_OP_READ, s, bbuf, (uint64_t)(uintptr_t)peer_mem + 8, 100, &st),
			 TE_TASK_COMPLETED);
		CHECK(bbuf[0] == 0x3c && bbuf[99] == 0x3c);
		CHECK_EQ(te_segment_close(b, s), 0);
	}
	cap_start();
	CHECK(te_segment_open(t, f.name) < 0); /* not ext's: "no installed transport serves it" */
	CHECK(cap_has("descriptor rejected: \"tcp_data_port\" is not an integer from 0 to 65535"));
	fake_stop(&f);

	/* ... and ext alone refuses a bad field of its own, naming it. */
	refused_field(b, "\"protocol\":\"ext\",\"ext_pid\":\"1\",\"tcp_data_port\":0,\"buffers\":[]",
		      "descriptor rejected: \"ext_pid\" is not an integer from 0 to 2147483647");
	refused_field(t, "\"protocol\":\"tcp\",\"tcp_proto_version\":256,\"tcp_data_port\":1,\"buffers\":[]",
		      "descriptor rejected: \"tcp_proto_version\" is not an integer from 0 to 255");

	te_engine_destroy(t);
	te_engine_destroy(b);
	te_engine_destroy(a);
}

/* ------------------------------------------------- complete_many */

/* Tasks of two peers, interleaved in runs of 1 to 4 so that what they share
 * changes within one report, one failing (ext fails 7 bytes with -EIO):
 * each ends with its own state and bytes, the batch ends and frees, and
 * the segments and engines close (their counts came back to zero). */
static void test_complete_many(void)
{
	enum { N = 300, LEN = 16 };
	te_engine *a = engine_with("ext", NULL, NULL), *c = engine_with("ext", NULL, NULL), *b = NULL;
	te_option o[2] = { { "transports", "ext" }, { "TE_EXT_MANY", "1" } };
	REQUIRE(a && c && te_engine_create("P2PHANDSHAKE", "127.0.0.1", o, 2, &b) == 0);
	static unsigned char abuf[N * LEN], cbuf[N * LEN], bbuf[N * LEN];
	REQUIRE(te_register_memory(a, abuf, sizeof abuf, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
	REQUIRE(te_register_memory(c, cbuf, sizeof cbuf, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
	REQUIRE(te_register_memory(b, bbuf, sizeof bbuf, "cpu:0", 0) == 0);
	te_segment_id sa = te_segment_open(b, te_engine_name(a)), sc = te_segment_open(b, te_engine_name(c));
	REQUIRE(sa > 0 && sc > 0);

	for (int round = 0; round < 2; round++) {
		uint32_t op = round == 0 ? TE_OP_WRITE : TE_OP_READ;
		te_request r[N];
		for (size_t i = 0; i < N; i++)
			bbuf[i * LEN] = (unsigned char)(round == 0 ? i : 0);
		memset(abuf, round == 0 ? 0 : 0xaa, sizeof abuf);
		memset(cbuf, round == 0 ? 0 : 0xcc, sizeof cbuf);
		for (size_t i = 0, run = 0; i < N; run++) {
			te_segment_id s = run % 2 ? sc : sa;
			unsigned char *mem = run % 2 ? cbuf : abuf;
			for (size_t k = 0; k < 1 + run % 4 && i < N; k++, i++)
				r[i] = (te_request){ op, s, bbuf + i * LEN, (uint64_t)(uintptr_t)(mem + i * LEN),
						     i == 77 ? 7 : LEN };
		}
		te_batch_id id;
		REQUIRE(te_batch_alloc(b, N, &id) == 0);
		REQUIRE(te_submit(b, id, r, N) == 0);
		CHECK_EQ(te_batch_wait(b, id, 5000), 0);
		size_t good = 0;
		for (size_t i = 0; i < N; i++) {
			te_task_status st;
			REQUIRE(te_get_status(b, id, i, &st) == 0);
			if (i == 77) {
				CHECK_EQ(st.state, TE_TASK_FAILED);
				CHECK_EQ(st.error, -EIO);
				CHECK_EQ(st.transferred, 0);
				continue;
			}
			const unsigned char *there = (const unsigned char *)(uintptr_t)r[i].remote;
			bool moved = round == 0 ? there[0] == (unsigned char)i
						: bbuf[i * LEN] == (r[i].segment == sa ? 0xaa : 0xcc);
			good += st.state == TE_TASK_COMPLETED && st.error == 0 && st.transferred == LEN && moved;
		}
		CHECK_EQ(good, N - 1);
		CHECK_EQ(te_batch_free(b, id), 0);
	}
	CHECK_EQ(te_segment_close(b, sa), 0);
	CHECK_EQ(te_segment_close(b, sc), 0);
	te_engine_destroy(b);
	te_engine_destroy(c);
	te_engine_destroy(a);
}

/* ------------------------------------------------------------ files */

static void test_files(void)
{
	te_engine *e = engine_with("extfile", NULL, NULL);
	REQUIRE(e != NULL);
	static unsigned char buf[8192];
	REQUIRE(te_register_memory(e, buf, sizeof buf, "cpu:0", 0) == 0);

	/* Buffers without addresses, laid end to end, for a transport that
	 * says TE_TRANSPORT_FILES: its own "extfile_seed" beside them. */
	fake f;
	fake_start(&f, "\"protocol\":\"extfile\",\"extfile_seed\":7,\"buffers\":[{\"length\":4096,"
		       "\"file_path\":\"/a\"},{\"length\":1000,\"file_path\":\"/b\"}]");
	te_segment_id s = te_segment_open(e, f.name);
	CHECK(s > 0);
	if (s > 0) {
		te_segment_buffer sb[4];
		CHECK(strcmp(te_segment_transport(e, s), "extfile") == 0);
		CHECK_EQ(te_segment_buffers(e, s, sb, 4), 2);
		CHECK(sb[0].addr == 0 && sb[0].length == 4096 && sb[1].addr == 4096 && sb[1].length == 1000);
		te_task_status st;
		CHECK_EQ(run_one(e, TE_OP_READ, s, buf, 4000, 500, &st), TE_TASK_COMPLETED);
		int bad = 0;
		for (int k = 0; k < 500; k++)
			bad += buf[k] != (unsigned char)(7 + 4000 + k);
		CHECK_EQ(bad, 0);
		/* past the files' 5096 bytes: the host refuses it */
		CHECK(run_one(e, TE_OP_READ, s, buf, 5000, 200, &st) != TE_TASK_COMPLETED);
		CHECK_EQ(te_segment_close(e, s), 0);
	}
	fake_stop(&f);

	refused_field(e, "\"protocol\":\"extfile\",\"extfile_seed\":256,\"buffers\":[{\"length\":4096}]",
		      "descriptor rejected: \"extfile_seed\" is not an integer from 0 to 255");
	te_engine_destroy(e);
}

/* ------------------------------------------------------------ ranks */

typedef struct abis {
	int ext, extold;
} abis;

static void note_abi(const te_plugin_info *p, void *user)
{
	abis *a = user;
	if (p->name != NULL && p->loaded && strcmp(p->name, "ext") == 0)
		a->ext = (int)p->abi_minor;
	if (p->name != NULL && p->loaded && strcmp(p->name, "extold") == 0)
		a->extold = (int)p->abi_minor;
}

static const char *auto_pick(const char *probe, const char *tcp_port)
{
	te_engine *e = engine_with(NULL, probe, tcp_port);
	const char *which = NULL;
	REQUIRE(e != NULL);
	int rc = te_transport_auto(e, &which);
	static char name[32];
	snprintf(name, sizeof name, "%s", rc == 0 && which ? which : "(none)");
	te_engine_destroy(e);
	return name;
}

static void test_auto_rank(void)
{
	abis a = { -1, -1 };
	te_plugin_foreach(note_abi, &a);
	CHECK_EQ(a.ext, TE_PLUGIN_ABI_MINOR);
	CHECK_EQ(a.extold, 11); /* loads, though its table ends before priority */

	te_set_log_level(TE_LOG_INFO); /* the choice's reasons are info lines */
	/* ext (250) before TCP (200) when it works here ... */
	CHECK(strcmp(auto_pick("ext,extold", NULL), "ext") == 0);
	/* ... TCP when it does not */
	cap_start();
	CHECK(strcmp(auto_pick(NULL, NULL), "tcp") == 0);
	CHECK(cap_has("ext unusable (TE_EXT_PROBE does not list ext); trying tcp"));
	/* A 1.11 plugin of another name ranks after TCP, as hosts then chose. */
	CHECK(strcmp(auto_pick("extold", NULL), "tcp") == 0);
	int busy_port;
	int busy = listen_any(&busy_port);
	char port[16];
	snprintf(port, sizeof port, "%d", busy_port);
	cap_start();
	CHECK(strcmp(auto_pick("extold", port), "extold") == 0);
	CHECK(cap_has("tcp unusable ("));
	CHECK(cap_has("; trying extold"));
	close(busy);
	/* Mooncake's MC_FORCE_TCP still means TCP whatever ranks higher. */
	setenv("TE_FORCE_TCP", "1", 1);
	CHECK(strcmp(auto_pick("ext", NULL), "tcp") == 0);
	unsetenv("TE_FORCE_TCP");
	te_set_log_level(TE_LOG_WARN);
}

int main(void)
{
	TEST_RUN(test_own_fields);
	TEST_RUN(test_complete_many);
	TEST_RUN(test_files);
	TEST_RUN(test_auto_rank);
	return check_done();
}
