/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Metadata store tests against real servers (etcd, redis-server,
 * te-metadata-server) that the test starts on free loopback ports in a
 * temporary directory and stops at the end, even on failure.
 *
 *   test-md <case>     one case per meson test; see `cases` at the bottom
 */
#include <dlfcn.h>
#include <gio/gio.h>
#include <glib.h>
#include <pthread.h>
#include <stdatomic.h>

#include <te/te-plugin.h>

#include "b64.h"
#include "../common/hostile.h"
#include "md-harness.h"
#include "md-glib.h"

#define BUFSZ (1u << 20)

/* ----------------------------------------------------- plugin, directly */

/* The plugins' own ops with a host table of our own: for list(), which the
 * public API does not expose, and for options read from the environment. */
static void direct_log(const te_host *h, int level, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	(void)h;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	cap_log(level, "direct", msg, NULL);
}

static const char *direct_config(const te_host *h, const char *te_name, const char *mc_name)
{
	(void)h;
	const char *v = te_name ? getenv(te_name) : NULL;
	return v ? v : mc_name ? getenv(mc_name) : NULL;
}

static const te_host direct_host = {
	.size = sizeof(te_host),
	.abi_minor = TE_PLUGIN_ABI_MINOR,
	.log = direct_log,
	.config = direct_config,
};

static const te_metadata_ops *plugin_ops(const char *name)
{
	char path[4096];
	const char *dirs = getenv("TE_PLUGIN_PATH");
	REQUIRE(dirs != NULL);
	char *copy = strdup(dirs), *save = NULL;
	void *h = NULL;
	for (char *d = strtok_r(copy, ":", &save); d && !h; d = strtok_r(NULL, ":", &save)) {
		snprintf(path, sizeof path, "%s/libte-metadata-%s.so", d, name);
		h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	}
	free(copy);
	REQUIRE(h != NULL);
	te_plugin_entry_fn entry;
	*(void **)&entry = dlsym(h, TE_PLUGIN_ENTRY_SYMBOL);
	REQUIRE(entry != NULL);
	const te_plugin_desc *d = entry();
	REQUIRE(d && d->kind == TE_KIND_METADATA && strcmp(d->name, name) == 0);
	return d->ops;
}

static bool list_has(char **keys, size_t n, const char *k)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(keys[i], k) == 0)
			return true;
	return false;
}

static void free_list(char **keys, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(keys[i]);
	free(keys);
}

/* list() through the plugin: keys under a prefix, and only those. */
static void check_list(const char *plugin, const char *conn)
{
	const te_metadata_ops *o = plugin_ops(plugin);
	void *ctx = NULL;
	char **keys = NULL;
	size_t n = 0;
	char pre[64], k[128];

	REQUIRE(o->open(&direct_host, conn, &ctx) == 0);
	snprintf(pre, sizeof pre, "mooncake/list-%d/", (int)getpid());
	for (int i = 0; i < 5; i++) {
		snprintf(k, sizeof k, "%s%d", pre, i);
		CHECK_EQ(o->put(ctx, k, "{}", 2, 0), 0);
	}
	CHECK_EQ(o->put(ctx, "mooncake/list-other", "{}", 2, 0), 0);
	CHECK_EQ(o->list(ctx, pre, &keys, &n), 0);
	CHECK_EQ(n, 5);
	snprintf(k, sizeof k, "%s3", pre);
	CHECK(list_has(keys, n, k));
	CHECK(!list_has(keys, n, "mooncake/list-other"));
	free_list(keys, n);
	CHECK_EQ(o->list(ctx, "mooncake/list-nothing-here/", &keys, &n), 0);
	CHECK_EQ(n, 0);
	free_list(keys, n);
	for (int i = 0; i < 5; i++) {
		snprintf(k, sizeof k, "%s%d", pre, i);
		CHECK_EQ(o->remove(ctx, k), 0);
	}
	CHECK_EQ(o->remove(ctx, "mooncake/list-other"), 0);
	CHECK_EQ(o->list(ctx, pre, &keys, &n), 0);
	CHECK_EQ(n, 0);
	free_list(keys, n);
	o->close(ctx);
}

/* ---------------------------------------------------------- store basics */

typedef struct worker_arg {
	te_metadata *md;
	int id;
	int failures;
} worker_arg;

static void *worker(void *p)
{
	worker_arg *w = p;
	char key[96], val[96], *got = NULL;
	size_t len;

	for (int i = 0; i < 40; i++) {
		snprintf(key, sizeof key, "mooncake/thr-%d/%d", (int)getpid(), w->id);
		snprintf(val, sizeof val, "{\"thread\":%d,\"round\":%d}", w->id, i);
		int put = te_metadata_put(w->md, key, val, strlen(val));
		int get = put == 0 ? te_metadata_get(w->md, key, &got, &len) : 0;
		if (put != 0 || get != 0 || len != strlen(val) || strcmp(got, val) != 0) {
			if (w->failures++ == 0)
				fprintf(stderr, "  thread %d, round %d: put %d, get %d, got %.96s\n", w->id, i, put, get,
					got ? got : "nothing");
		}
		te_free(got);
		got = NULL;
	}
	if (te_metadata_remove(w->md, key) != 0)
		w->failures++;
	return NULL;
}

/* Put, get, overwrite, remove, odd keys and values, a large value, many
 * threads at once: what every store must do the same way. */
static void check_store_basics(const char *conn)
{
	te_metadata *md = NULL;
	char *v = NULL;
	size_t len = 0;
	const char *odd_key = "mooncake/ram/odd key+%&?=#/\xc3\xbc";
	const char *odd_val = "{\"s\":\"quote \\\" nl \\n \xe2\x82\xac\",\"n\":[1,2,3]}\n";

	REQUIRE(te_metadata_open(conn, &md) == 0);
	CHECK_EQ(te_metadata_get(md, "mooncake/ram/does-not-exist", &v, &len), -ENOENT);
	CHECK(v == NULL);
	CHECK_EQ(te_metadata_put(md, odd_key, odd_val, strlen(odd_val)), 0);
	CHECK_EQ(te_metadata_get(md, odd_key, &v, &len), 0);
	CHECK(v && len == strlen(odd_val) && strcmp(v, odd_val) == 0);
	te_free(v);
	CHECK_EQ(te_metadata_put(md, odd_key, "{\"v\":2}", 7), 0);
	CHECK_EQ(te_metadata_get(md, odd_key, &v, &len), 0);
	CHECK(v && len == 7 && strcmp(v, "{\"v\":2}") == 0);
	te_free(v);
	CHECK_EQ(te_metadata_remove(md, odd_key), 0);
	CHECK_EQ(te_metadata_get(md, odd_key, &v, &len), -ENOENT);
	CHECK_EQ(te_metadata_remove(md, odd_key), 0); /* missing: not an error */

	/* 1 MiB value, every byte checked */
	size_t big = 1u << 20;
	char *bv = malloc(big + 1);
	for (size_t i = 0; i < big; i++)
		bv[i] = (char)('a' + (i * 7) % 26);
	bv[big] = '\0';
	CHECK_EQ(te_metadata_put(md, "mooncake/big", bv, big), 0);
	CHECK_EQ(te_metadata_get(md, "mooncake/big", &v, &len), 0);
	CHECK(v && len == big && memcmp(v, bv, big) == 0);
	te_free(v);
	CHECK_EQ(te_metadata_remove(md, "mooncake/big"), 0);
	free(bv);

	/* the same handle from 8 threads */
	pthread_t t[8];
	worker_arg w[8];
	for (int i = 0; i < 8; i++) {
		w[i] = (worker_arg){ md, i, 0 };
		REQUIRE(pthread_create(&t[i], NULL, worker, &w[i]) == 0);
	}
	int fails = 0;
	for (int i = 0; i < 8; i++) {
		pthread_join(t[i], NULL);
		fails += w[i].failures;
	}
	CHECK_EQ(fails, 0);
	te_metadata_close(md);
}

/* An engine publishes rpc_meta and its descriptor in Mooncake's form, and
 * removes both at shutdown. */
static void check_engine_keys(const char *conn)
{
	te_engine *e = NULL;
	te_metadata *md = NULL;
	te_option opt[1] = { { "ip_or_host_name", "127.0.0.1" } };
	char name[64], rkey[256], skey[256], *v = NULL, want[128];
	size_t len;

	snprintf(name, sizeof name, "keys-%d", (int)getpid());
	REQUIRE(te_metadata_open(conn, &md) == 0);
	REQUIRE(te_engine_create(conn, name, opt, 1, &e) == 0);
	te_metadata_rpc_key(name, rkey, sizeof rkey);
	te_metadata_segment_key(name, skey, sizeof skey);
	CHECK_EQ(te_metadata_get(md, rkey, &v, &len), 0);
	snprintf(want, sizeof want, "\"rpc_port\":%d", te_engine_rpc_port(e));
	CHECK(v && strstr(v, want) && strstr(v, "\"ip_or_host_name\":\"127.0.0.1\""));
	te_free(v);
	CHECK_EQ(te_metadata_get(md, skey, &v, &len), 0);
	snprintf(want, sizeof want, "\"name\":\"%s\"", name);
	CHECK(v && strstr(v, want) && strstr(v, "\"buffers\":[]"));
	te_free(v);
	te_engine_destroy(e);
	CHECK_EQ(te_metadata_get(md, rkey, &v, &len), -ENOENT);
	CHECK_EQ(te_metadata_get(md, skey, &v, &len), -ENOENT);
	te_metadata_close(md);
}

/* Values that are not JSON, or not the JSON expected, under an engine's keys:
 * opening the segment fails with an error and a log line that names the key
 * and the store; the engine goes on working. */
static void check_malformed(const char *conn)
{
	te_engine *e = NULL;
	te_metadata *md = NULL;
	te_option opt[1] = { { "ip_or_host_name", "127.0.0.1" } };
	char me[64], bogus[64], rkey[256], skey[256], need[300];

	snprintf(me, sizeof me, "mal-%d", (int)getpid());
	snprintf(bogus, sizeof bogus, "bogus-%d", (int)getpid());
	te_metadata_rpc_key(bogus, rkey, sizeof rkey);
	te_metadata_segment_key(bogus, skey, sizeof skey);
	REQUIRE(te_metadata_open(conn, &md) == 0);
	REQUIRE(te_engine_create(conn, me, opt, 1, &e) == 0);

	cap_start();
	CHECK_EQ(te_metadata_put(md, rkey, "{\"ip_or_host_name\":\"127.0.0.1\",\"rpc_port\":1}", 44), 0);
	CHECK_EQ(te_metadata_put(md, skey, "{not json at all", 16), 0);
	CHECK(te_segment_open(e, bogus) < 0);
	snprintf(need, sizeof need, "malformed descriptor under %s in %s", skey, conn);
	CHECK(cap_has(need));

	CHECK_EQ(te_metadata_put(md, skey, "{\"name\":\"x\",\"protocol\":\"tcp\",\"buffers\":[]}", 41), 0);
	CHECK_EQ(te_metadata_put(md, rkey, "[\"not\",\"an object\"", 18), 0);
	CHECK(te_segment_open(e, bogus) < 0);
	snprintf(need, sizeof need, "malformed value under %s in %s", rkey, conn);
	CHECK(cap_has(need));

	/* the engine still works: its own segment and the store */
	CHECK_EQ(te_segment_open(e, me), TE_LOCAL_SEGMENT);
	CHECK_EQ(te_metadata_remove(md, rkey), 0);
	CHECK_EQ(te_metadata_remove(md, skey), 0);
	te_set_log_handler(NULL, NULL);
	te_engine_destroy(e);
	te_metadata_close(md);
}

/* A store that refuses connections, and one that never answers: clear,
 * bounded failures. `timeout_env` is set to 300 ms for the second. */
/* `phase`: how the timed-out call's log line says where it stood (the
 * HTTP client's stores), or NULL. */
static void check_unreachable(const char *scheme_fmt, const char *timeout_env, const char *phase)
{
	char conn[128];
	te_engine *e = NULL;
	te_metadata *md = NULL;
	char *v = NULL;
	size_t len;

	snprintf(conn, sizeof conn, scheme_fmt, free_port());
	cap_start();
	long long t0 = now_ms();
	int rc = te_engine_create(conn, "nobody", NULL, 0, &e);
	CHECK(rc < 0 && rc != -ENOENT && e == NULL);
	CHECK(now_ms() - t0 < 15000);
	CHECK(cap_has(conn));

	int hole_port;
	int hole = blackhole_listen(&hole_port);
	snprintf(conn, sizeof conn, scheme_fmt, hole_port);
	setenv(timeout_env, "300", 1);
	if (te_metadata_open(conn, &md) == 0) { /* redis connects at open: it fails there */
		t0 = now_ms();
		CHECK_EQ(te_metadata_get(md, "mooncake/x", &v, &len), -ETIMEDOUT);
		CHECK(now_ms() - t0 < 3000);
		if (phase != NULL)
			CHECK(cap_has(phase));
		te_metadata_close(md);
	} else {
		CHECK(now_ms() - t0 < 3000);
	}
	t0 = now_ms();
	rc = te_engine_create(conn, "nobody", NULL, 0, &e);
	CHECK(rc == -ETIMEDOUT && e == NULL);
	CHECK(now_ms() - t0 < 5000);
	unsetenv(timeout_env);
	close(hole);
	te_set_log_handler(NULL, NULL);
}

/* ------------------------------------------------------ peers, transfers */

typedef struct peer {
	pid_t pid;
	int in, out;
	char name[64];
} peer;

/* Starts a target engine; `transport` "" installs none (for tests of keys
 * only), NULL the default (tcp). */
static bool peer_start_with(peer *p, const char *conn, const char *tag, unsigned seed, char *const env[],
			    const char *transport)
{
	char size[32], seeds[16], line[256];

	snprintf(p->name, sizeof p->name, "%s-%d", tag, (int)getpid());
	snprintf(size, sizeof size, "%u", BUFSZ);
	snprintf(seeds, sizeof seeds, "%u", seed);
	char *argv[] = { getenv("TE_MD_PEER"), (char *)conn, p->name, size, seeds, (char *)transport, NULL };
	REQUIRE(argv[0] != NULL);
	p->pid = spawn(argv, env, NULL, &p->in, &p->out);
	if (!harness_read_line(p->out, line, sizeof line, 30000) || strncmp(line, "READY ", 6) != 0) {
		fprintf(stderr, "  peer %s did not come up (said '%s')\n", p->name, line);
		return false;
	}
	return true;
}

static bool peer_start(peer *p, const char *conn, const char *tag, unsigned seed, char *const env[])
{
	return peer_start_with(p, conn, tag, seed, env, NULL);
}

static bool peer_cmd(peer *p, const char *cmd, char *reply, size_t cap)
{
	size_t n = strlen(cmd);
	if (write(p->in, cmd, n) != (ssize_t)n || write(p->in, "\n", 1) != 1)
		return false;
	return harness_read_line(p->out, reply, cap, 30000);
}

/* Asks the peer to quit; its exit status (0 = clean) or -1. */
static int peer_quit(peer *p)
{
	char line[64] = "";
	peer_cmd(p, "quit", line, sizeof line);
	int st = wait_child(p->pid, 30000);
	close(p->in);
	close(p->out);
	if (st < 0) {
		stop_child(p->pid, SIGKILL);
		return -1;
	}
	return WIFEXITED(st) && strcmp(line, "BYE") == 0 ? WEXITSTATUS(st) : -1;
}

static void peer_kill(peer *p)
{
	stop_child(p->pid, SIGKILL);
	close(p->in);
	close(p->out);
}

static te_engine *initiator(const char *conn, char *const env[])
{
	te_engine *e = NULL;
	te_option opt[2] = { { "ip_or_host_name", "127.0.0.1" }, { "transports", "tcp" } };
	char name[64];

	for (int i = 0; env && env[i]; i++)
		putenv(env[i]);
	snprintf(name, sizeof name, "init-%d", (int)getpid());
	int rc = te_engine_create(conn, name, opt, 2, &e);
	if (rc != 0)
		fprintf(stderr, "  initiator on %s: %s\n", conn, te_strerror(rc));
	return e;
}

/* Reads the peer's first buffer (pattern `seed`), writes pattern `seed2`
 * over it, reads it back, and has the peer confirm what it holds. */
static void transfer_round(te_engine *e, te_segment_id seg, peer *p, unsigned seed, unsigned seed2)
{
	te_segment_buffer sb[4];
	unsigned char *local = aligned_alloc(4096, BUFSZ), *want = malloc(BUFSZ);
	char line[64], cmd[64];

	REQUIRE(te_register_memory(e, local, BUFSZ, "cpu:0", 0) == 0);
	int nb = te_segment_buffers(e, seg, sb, 4);
	CHECK(nb >= 1);
	/* buffers come sorted by address: find the first registration */
	for (int i = 1; i < nb && i < 4; i++)
		if (sb[i].length == BUFSZ)
			sb[0] = sb[i];
	CHECK(nb >= 1 && sb[0].length == BUFSZ);
	if (nb >= 1 && sb[0].length == BUFSZ) {
		memset(local, 0, BUFSZ);
		fill_pattern(want, BUFSZ, seed);
		CHECK_EQ(run_one(e, TE_OP_READ, seg, local, sb[0].addr, BUFSZ, NULL), TE_TASK_COMPLETED);
		CHECK(memcmp(local, want, BUFSZ) == 0);
		fill_pattern(local, BUFSZ, seed2);
		CHECK_EQ(run_one(e, TE_OP_WRITE, seg, local, sb[0].addr, BUFSZ, NULL), TE_TASK_COMPLETED);
		memset(local, 0, BUFSZ);
		CHECK_EQ(run_one(e, TE_OP_READ, seg, local, sb[0].addr + 4096, BUFSZ - 4096, NULL),
			 TE_TASK_COMPLETED);
		fill_pattern(want, BUFSZ, seed2);
		CHECK(memcmp(local, want + 4096, BUFSZ - 4096) == 0);
		snprintf(cmd, sizeof cmd, "check %u", seed2);
		CHECK(peer_cmd(p, cmd, line, sizeof line) && strcmp(line, "OK") == 0);
	}
	CHECK_EQ(te_unregister_memory(e, local), 0);
	free(local);
	free(want);
}

/* Opens p's segment on e afresh, runs transfer_round() over it and closes
 * it: whether it opened. */
static bool open_round(te_engine *e, peer *p, unsigned seed, unsigned seed2)
{
	te_segment_id seg = te_segment_open(e, p->name);
	CHECK(seg > 0);
	if (seg <= 0) {
		fprintf(stderr, "  segment %s did not open for round %u\n", p->name, seed);
		return false;
	}
	transfer_round(e, seg, p, seed, seed2);
	CHECK_EQ(te_segment_close(e, seg), 0);
	return true;
}

/* A handle on the store at `conn`, and target `p` started through it with
 * its memory filled from `seed`. */
static te_metadata *store_and_target(const char *conn, peer *p, unsigned seed, char *const env[])
{
	te_metadata *md = NULL;
	REQUIRE(te_metadata_open(conn, &md) == 0);
	REQUIRE(peer_start(p, conn, "target", seed, env));
	return md;
}

/* Whether `name`'s rpc_meta and descriptor keys exist. 2 both, 0 none. */
static int keys_of(te_metadata *md, const char *name)
{
	char k[256], *v = NULL;
	size_t len;
	int n = 0;

	te_metadata_rpc_key(name, k, sizeof k);
	if (te_metadata_get(md, k, &v, &len) == 0)
		n++;
	te_free(v);
	v = NULL;
	te_metadata_segment_key(name, k, sizeof k);
	if (te_metadata_get(md, k, &v, &len) == 0)
		n++;
	te_free(v);
	return n;
}

static bool have_tcp(void)
{
	char *text = NULL;
	te_plugin_foreach(NULL, NULL);
	int rc = te_plugin_report("tcp", &text);
	te_free(text);
	if (rc == -ENOENT)
		fprintf(stderr, "  the tcp transport plugin was not found\n");
	return rc != -ENOENT;
}

/* Two engines in two processes meet through the store at `conn` and move
 * verified data over TCP; their keys are gone after shutdown. */
static void two_engines(const char *conn, char *const peer_env[], char *const init_env[])
{
	peer p;

	REQUIRE(have_tcp());
	te_metadata *md = store_and_target(conn, &p, 7, peer_env);
	CHECK_EQ(keys_of(md, p.name), 2);
	te_engine *e = initiator(conn, init_env);
	REQUIRE(e != NULL);
	open_round(e, &p, 7, 8);
	char me[64];
	snprintf(me, sizeof me, "%s", te_engine_name(e));
	CHECK_EQ(keys_of(md, me), 2);
	CHECK_EQ(peer_quit(&p), 0);
	CHECK_EQ(keys_of(md, p.name), 0);
	te_engine_destroy(e);
	CHECK_EQ(keys_of(md, me), 0);
	te_metadata_close(md);
}

/* ------------------------------------------------------------------ etcd */

static etcd_member etcd1[1];
static char etcd_conn[256];

static void etcd_single(void)
{
	etcd_start(etcd1, 1, "single");
	snprintf(etcd_conn, sizeof etcd_conn, "etcd://127.0.0.1:%d", etcd1[0].client_port);
}

/* The lease an etcd key is attached to ("0" when none), read raw. */
static void etcd_key_lease(int port, const char *key, char *lease, size_t cap)
{
	char body[4096], req[512];
	char *k64 = b64(key);
	REQUIRE(k64 != NULL);
	snprintf(req, sizeof req, "{\"key\":\"%s\"}", k64);
	free(k64);
	snprintf(lease, cap, "none");
	if (http_raw(port, "POST", "/v3/kv/range", NULL, req, strlen(req), body, sizeof body) != 200)
		return;
	const char *l = strstr(body, "\"lease\":\"");
	if (strstr(body, "\"kvs\"") == NULL)
		return;
	if (l == NULL) {
		snprintf(lease, cap, "0");
		return;
	}
	l += 9;
	size_t m = strcspn(l, "\"");
	snprintf(lease, cap, "%.*s", (int)m, l);
}

static void case_etcd_basic(void)
{
	etcd_single();
	check_store_basics(etcd_conn);
	/* the bare host:port form means etcd too */
	char bare[64];
	snprintf(bare, sizeof bare, "127.0.0.1:%d", etcd1[0].client_port);
	check_store_basics(bare);
	check_engine_keys(etcd_conn);
	check_malformed(etcd_conn);
	check_list("etcd", etcd_conn);
	check_unreachable("etcd://127.0.0.1:%d", "TE_ETCD_TIMEOUT_MS", "after 300 ms waiting for the reply");

	/* connection strings that are wrong, and a scheme nobody serves */
	te_metadata *md = NULL;
	te_engine *e = NULL;
	CHECK_EQ(te_metadata_open("etcd://", &md), -EINVAL);
	CHECK_EQ(te_metadata_open("etcd://host:99999", &md), -EINVAL);
	CHECK_EQ(te_metadata_open("etcd://a b:1", &md), -EINVAL);
	CHECK(te_engine_create("gopher://127.0.0.1:70", "x", NULL, 0, &e) < 0 && e == NULL);

	/* Keys the engine owns are leased; keys put by hand are not. */
	te_option opt[1] = { { "ip_or_host_name", "127.0.0.1" } };
	REQUIRE(te_engine_create(etcd_conn, "leased", opt, 1, &e) == 0);
	REQUIRE(te_metadata_open(etcd_conn, &md) == 0);
	CHECK_EQ(te_metadata_put(md, "mooncake/plain", "{}", 2), 0);
	char k[256], lease[64];
	te_metadata_rpc_key("leased", k, sizeof k);
	etcd_key_lease(etcd1[0].client_port, k, lease, sizeof lease);
	CHECK(strcmp(lease, "0") != 0 && strcmp(lease, "none") != 0);
	etcd_key_lease(etcd1[0].client_port, "mooncake/plain", lease, sizeof lease);
	CHECK(strcmp(lease, "0") == 0);
	CHECK_EQ(te_metadata_remove(md, "mooncake/plain"), 0);
	te_engine_destroy(e);
	te_metadata_close(md);

	/* credentials for a store with auth off: one warning, then plain calls */
	char withpw[128];
	snprintf(withpw, sizeof withpw, "etcd://u:Off-pw-1@127.0.0.1:%d", etcd1[0].client_port);
	cap_start();
	REQUIRE(te_metadata_open(withpw, &md) == 0);
	CHECK(cap_has("authentication off"));
	CHECK_EQ(te_metadata_put(md, "mooncake/noauth", "{}", 2), 0);
	CHECK_EQ(te_metadata_remove(md, "mooncake/noauth"), 0);
	CHECK(!cap_has("Off-pw-1"));
	te_metadata_close(md);
	/* a user-info without a user, or with a bad escape, is refused */
	snprintf(withpw, sizeof withpw, "etcd://:Off-pw-1@127.0.0.1:%d", etcd1[0].client_port);
	CHECK_EQ(te_metadata_open(withpw, &md), -EINVAL);
	snprintf(withpw, sizeof withpw, "etcd://u:Off-pw-1%%zz@127.0.0.1:%d", etcd1[0].client_port);
	CHECK_EQ(te_metadata_open(withpw, &md), -EINVAL);
	CHECK(cap_has("is not user:password"));
	CHECK(!cap_has("Off-pw-1"));
	te_set_log_handler(NULL, NULL);
}

static void case_etcd_engines(void)
{
	etcd_single();
	two_engines(etcd_conn, NULL, NULL);
}

/* Three members; the one both engines talk to is killed mid-test. */
static void case_etcd_cluster(void)
{
	etcd_member m[3];
	char conn[256], only2[64], line[64];
	peer p;
	te_metadata *md2 = NULL;

	REQUIRE(have_tcp());
	etcd_start(m, 3, "cluster");
	snprintf(conn, sizeof conn, "etcd://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", m[0].client_port,
		 m[1].client_port, m[2].client_port);
	snprintf(only2, sizeof only2, "etcd://127.0.0.1:%d", m[2].client_port);
	REQUIRE(peer_start(&p, conn, "target", 11, NULL));
	te_engine *e = initiator(conn, NULL);
	REQUIRE(e != NULL);
	REQUIRE(open_round(e, &p, 11, 12));

	stop_child(m[0].pid, SIGKILL);
	fprintf(stderr, "  member 0 (port %d) killed\n", m[0].client_port);

	/* The target registers more memory: its descriptor is published again
	 * through the surviving members. */
	CHECK(peer_cmd(&p, "register 65536 99", line, sizeof line) && strcmp(line, "REG") == 0);
	te_segment_id seg = te_segment_open(e, p.name); /* fetched through the survivors */
	CHECK(seg > 0);
	if (seg > 0) {
		te_segment_buffer sb[4];
		CHECK_EQ(te_segment_buffers(e, seg, sb, 4), 2);
		transfer_round(e, seg, &p, 12, 13);
		CHECK_EQ(te_segment_close(e, seg), 0);
	}
	REQUIRE(te_metadata_open(only2, &md2) == 0);
	CHECK_EQ(keys_of(md2, p.name), 2);
	CHECK_EQ(peer_quit(&p), 0);
	CHECK_EQ(keys_of(md2, p.name), 0);
	char me[64];
	snprintf(me, sizeof me, "%s", te_engine_name(e));
	te_engine_destroy(e);
	CHECK_EQ(keys_of(md2, me), 0);
	te_metadata_close(md2);
}

/* Polls until `name`'s keys are in state `want` (2 or 0); elapsed ms or -1. */
static long long wait_keys(te_metadata *md, const char *name, int want, int timeout_ms)
{
	long long t0 = now_ms();
	while (now_ms() - t0 < timeout_ms) {
		if (keys_of(md, name) == want)
			return now_ms() - t0;
		usleep(100000);
	}
	return -1;
}

/* Kills `p` with SIGKILL and checks that its two keys are still there
 * `ms` later (its store keeps nothing alive for it); removes them. */
static void killed_keys_stay(te_metadata *md, peer *p, unsigned ms)
{
	char k[256];

	peer_kill(p);
	usleep(ms * 1000);
	CHECK_EQ(keys_of(md, p->name), 2);
	te_metadata_rpc_key(p->name, k, sizeof k);
	CHECK_EQ(te_metadata_remove(md, k), 0);
	te_metadata_segment_key(p->name, k, sizeof k);
	CHECK_EQ(te_metadata_remove(md, k), 0);
}

static void case_etcd_lease(void)
{
	static char ttl_env[] = "TE_ETCD_LEASE_TTL=2";
	static char off_env[] = "TE_ETCD_LEASE=0";
	char *leased[] = { ttl_env, NULL };
	char *unleased[] = { ttl_env, off_env, NULL };
	te_metadata *md = NULL;
	peer p;
	char k[256], lease[64], lease2[64];

	etcd_single();
	REQUIRE(te_metadata_open(etcd_conn, &md) == 0);

	/* Alive for three TTLs: the keep-alives hold the keys. */
	REQUIRE(peer_start_with(&p, etcd_conn, "leased", 1, leased, ""));
	usleep(6000 * 1000);
	CHECK_EQ(keys_of(md, p.name), 2);

	/* Revoked behind the engine's back: it notices and puts them back. */
	te_metadata_rpc_key(p.name, k, sizeof k);
	etcd_key_lease(etcd1[0].client_port, k, lease, sizeof lease);
	char body[128];
	snprintf(body, sizeof body, "{\"ID\":\"%s\"}", lease);
	CHECK_EQ(http_raw(etcd1[0].client_port, "POST", "/v3/lease/revoke", NULL, body, strlen(body), NULL, 0),
		 200);
	/* (the keys may be back before a poll could see them gone: the proof
	 * is that they come back under another lease) */
	long long t_rev = now_ms(), back = -1;
	while (now_ms() - t_rev < 5000) {
		etcd_key_lease(etcd1[0].client_port, k, lease2, sizeof lease2);
		if (strcmp(lease2, lease) != 0 && strcmp(lease2, "none") != 0 && keys_of(md, p.name) == 2) {
			back = now_ms() - t_rev;
			break;
		}
		usleep(50000);
	}
	CHECK(back >= 0);
	fprintf(stderr, "  keys back %lld ms after the lease was revoked\n", back);
	CHECK(strcmp(lease2, lease) != 0 && strcmp(lease2, "0") != 0);

	/* kill -9: the keys vanish within the TTL. */
	long long t0 = now_ms();
	peer_kill(&p);
	long long gone = wait_keys(md, p.name, 0, 10000);
	gone = gone < 0 ? -1 : now_ms() - t0;
	fprintf(stderr, "  keys of the killed engine gone after %lld ms (TTL 2 s)\n", gone);
	CHECK(gone >= 0 && gone <= 2000 + 1000); /* TTL plus etcd's 500 ms expiry sweep */

	/* With leases off the keys of a killed engine stay. */
	REQUIRE(peer_start_with(&p, etcd_conn, "unleased", 2, unleased, ""));
	te_metadata_rpc_key(p.name, k, sizeof k);
	etcd_key_lease(etcd1[0].client_port, k, lease, sizeof lease);
	CHECK(strcmp(lease, "0") == 0);
	killed_keys_stay(md, &p, 4000);
	te_metadata_close(md);
}


/* -------------------------------------------------- etcd authentication */

/* Lines logged and lines holding `secret`, counted as they arrive (a trace
 * log is larger than the capture buffer). */
static struct {
	pthread_mutex_t lock;
	const char *secret;
	const char *want; /* a line holding this must come by (the store was named) */
	int lines, leaks, wanted;
} scan = { .lock = PTHREAD_MUTEX_INITIALIZER };

static void scan_log(int level, const char *domain, const char *msg, void *user)
{
	(void)level;
	(void)domain;
	(void)user;
	pthread_mutex_lock(&scan.lock);
	scan.lines++;
	if (strstr(msg, scan.secret) != NULL) {
		if (scan.leaks++ == 0)
			fprintf(stderr, "  logged a secret: %s\n", msg);
	}
	if (scan.want && strstr(msg, scan.want) != NULL)
		scan.wanted++;
	pthread_mutex_unlock(&scan.lock);
}

static void scan_start(const char *secret, const char *want)
{
	pthread_mutex_lock(&scan.lock);
	scan.secret = secret;
	scan.want = want;
	scan.lines = scan.leaks = scan.wanted = 0;
	pthread_mutex_unlock(&scan.lock);
	te_set_log_handler(scan_log, NULL);
}

static int etcdctl_port; /* the member etcdctl talks to */

/* etcdctl (v3 API) against etcdctl_port; arguments end with NULL. */
static int etcdctl(const char *first, ...)
{
	char ep[64];
	static char api[] = "ETCDCTL_API=3";
	char *env[] = { api, NULL };
	char *argv[16] = { "etcdctl", ep };
	int argc = 2;
	va_list ap;

	snprintf(ep, sizeof ep, "--endpoints=http://127.0.0.1:%d", etcdctl_port);
	va_start(ap, first);
	for (const char *a = first; a && argc < 15; a = va_arg(ap, const char *))
		argv[argc++] = (char *)a;
	va_end(ap);
	argv[argc] = NULL;
	return run_cmd(argv, env, tmp_path("etcdctl.log"));
}

/* etcd with auth on: user "te" (password "te-pw-7Qx") holds a role that may
 * read and write the keys under mooncake/ only; simple tokens live 2 s. */
static void etcd_auth_on(etcd_member *m, int n, const char *tag)
{
	static const char *extra[] = { "--auth-token-ttl", "2", NULL };
	etcd_start_ex(m, n, tag, extra, false);
	etcdctl_port = m[0].client_port;
	REQUIRE(etcdctl("user", "add", "root:rootpw", NULL) == 0);
	REQUIRE(etcdctl("user", "grant-role", "root", "root", NULL) == 0);
	REQUIRE(etcdctl("role", "add", "te-role", NULL) == 0);
	REQUIRE(etcdctl("role", "grant-permission", "te-role", "--prefix=true", "readwrite", "mooncake/", NULL) == 0);
	REQUIRE(etcdctl("user", "add", "te:te-pw-7Qx", NULL) == 0);
	REQUIRE(etcdctl("user", "grant-role", "te", "te-role", NULL) == 0);
	REQUIRE(etcdctl("auth", "enable", NULL) == 0);
	/* auth is on: anonymous requests are refused from now on */
	char body[512];
	CHECK_EQ(http_raw(m[n - 1].client_port, "POST", "/v3/kv/range", NULL, "{\"key\":\"Zm9v\"}", 14, body,
			  sizeof body), 400);
	CHECK(strstr(body, "user name is empty") != NULL);
	if (strstr(body, "user name is empty") == NULL)
		fprintf(stderr, "  anonymous range answered: %s\n", body);
}

static void case_etcd_auth(void)
{
	te_engine *e = NULL;
	te_metadata *md = NULL;
	char conn[256], *v = NULL;
	size_t len;

	etcd_auth_on(etcd1, 1, "auth");
	snprintf(etcd_conn, sizeof etcd_conn, "etcd://127.0.0.1:%d", etcd1[0].client_port);
	int port = etcd1[0].client_port;

	/* no credentials: refused, and the log says which options are missing */
	cap_start();
	CHECK(te_engine_create(etcd_conn, "anon", NULL, 0, &e) < 0 && e == NULL);
	CHECK(cap_has("TE_ETCD_USERNAME"));

	/* a wrong password in the string: engine creation fails at once, the
	 * log names the store and the user, never the password */
	snprintf(conn, sizeof conn, "etcd://te:Wr0ng-pass@127.0.0.1:%d", port);
	cap_start();
	CHECK_EQ(te_engine_create(conn, "wrong", NULL, 0, &e), -EACCES);
	CHECK(e == NULL);
	CHECK(cap_has("authentication as user 'te' refused"));
	CHECK(cap_has("te:***@127.0.0.1"));
	CHECK(!cap_has("Wr0ng-pass"));
	/* the same from the environment */
	setenv("TE_ETCD_USERNAME", "te", 1);
	setenv("TE_ETCD_PASSWORD", "Wr0ng-pass", 1);
	cap_start();
	CHECK_EQ(te_metadata_open(etcd_conn, &md), -EACCES);
	CHECK(!cap_has("Wr0ng-pass"));
	/* a user without a password is a configuration error */
	unsetenv("TE_ETCD_PASSWORD");
	CHECK_EQ(te_metadata_open(etcd_conn, &md), -EINVAL);
	CHECK(cap_has("without a password"));

	/* the right one from the environment: keys under mooncake/ only */
	setenv("TE_ETCD_PASSWORD", "te-pw-7Qx", 1);
	REQUIRE(te_metadata_open(etcd_conn, &md) == 0);
	CHECK_EQ(te_metadata_put(md, "mooncake/auth-k", "{\"a\":1}", 7), 0);
	CHECK_EQ(te_metadata_get(md, "mooncake/auth-k", &v, &len), 0);
	CHECK(v && len == 7 && memcmp(v, "{\"a\":1}", 7) == 0);
	te_free(v);
	v = NULL;
	cap_start();
	CHECK_EQ(te_metadata_put(md, "elsewhere/k", "{}", 2), TE_ERR_METADATA);
	CHECK(cap_has("permission denied"));

	/* the token expires after 2 s unused: the next call fetches another
	 * and goes through */
	te_set_log_level(TE_LOG_DEBUG);
	cap_start();
	usleep(3500 * 1000);
	CHECK_EQ(te_metadata_get(md, "mooncake/auth-k", &v, &len), 0);
	te_free(v);
	v = NULL;
	CHECK(cap_has("refused the token"));
	te_set_log_level(TE_LOG_WARN);
	CHECK_EQ(te_metadata_remove(md, "mooncake/auth-k"), 0);
	te_metadata_close(md);
	unsetenv("TE_ETCD_USERNAME");
	unsetenv("TE_ETCD_PASSWORD");
	te_set_log_handler(NULL, NULL);

	/* two engines, the target with credentials from the environment, the
	 * initiator from the string; leases are kept alive through expiring
	 * tokens (keep-alives every 1 s, tokens live 2 s) */
	static char u[] = "TE_ETCD_USERNAME=te", pw[] = "TE_ETCD_PASSWORD=te-pw-7Qx",
		    ka[] = "TE_ETCD_KEEPALIVE_MS=1000";
	char *peer_env[] = { u, pw, ka, NULL };
	snprintf(conn, sizeof conn, "etcd://te:te-pw-7Qx@127.0.0.1:%d", port);
	two_engines(conn, peer_env, NULL);

	/* at trace level, a whole engine life: the password is never logged,
	 * the store is (redacted) */
	te_set_log_level(TE_LOG_TRACE);
	scan_start("te-pw-7Qx", "te:***@127.0.0.1");
	e = initiator(conn, NULL);
	CHECK(e != NULL);
	if (e) {
		REQUIRE(te_metadata_open(conn, &md) == 0);
		/* what the engine published holds no credential either */
		char key[256];
		for (int i = 0; i < 2; i++) {
			if (i == 0)
				te_metadata_segment_key(te_engine_name(e), key, sizeof key);
			else
				te_metadata_rpc_key(te_engine_name(e), key, sizeof key);
			CHECK_EQ(te_metadata_get(md, key, &v, &len), 0);
			CHECK(v != NULL && strstr(v, "te-pw-7Qx") == NULL && strstr(v, "te:") == NULL);
			te_free(v);
			v = NULL;
		}
		CHECK_EQ(te_metadata_get(md, "mooncake/none", &v, &len), -ENOENT);
		CHECK_EQ(te_metadata_put(md, "elsewhere/k", "{}", 2), TE_ERR_METADATA); /* logged, with the store */
		te_metadata_close(md);
		te_engine_destroy(e);
	}
	te_set_log_level(TE_LOG_WARN);
	te_set_log_handler(NULL, NULL);
	fprintf(stderr, "  %d lines logged at trace level, %d naming the store\n", scan.lines, scan.wanted);
	CHECK(scan.lines >= 4);
	CHECK(scan.wanted >= 3); /* engine up, the refused put in the plugin and in libte */
	CHECK_EQ(scan.leaks, 0);
}


/* Three members with auth on: tokens are per member, so when the member in
 * use dies the calls that fail over authenticate with the next one. */
static void case_etcd_auth_failover(void)
{
	etcd_member m[3];
	te_metadata *md = NULL;
	char conn[256], *v = NULL;
	size_t len;

	etcd_auth_on(m, 3, "authc");
	snprintf(conn, sizeof conn, "etcd://te:te-pw-7Qx@127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", m[0].client_port,
		 m[1].client_port, m[2].client_port);
	REQUIRE(te_metadata_open(conn, &md) == 0);
	CHECK_EQ(te_metadata_put(md, "mooncake/fo", "{\"n\":1}", 7), 0);
	stop_child(m[0].pid, SIGKILL);
	cap_start();
	CHECK_EQ(te_metadata_get(md, "mooncake/fo", &v, &len), 0);
	CHECK(v && len == 7 && memcmp(v, "{\"n\":1}", 7) == 0);
	te_free(v);
	v = NULL;
	CHECK(cap_has("unusable"));
	CHECK(!cap_has("te-pw-7Qx"));
	/* and the member taking over serves writes too, past its token's life */
	CHECK_EQ(te_metadata_put(md, "mooncake/fo", "{\"n\":2}", 7), 0);
	usleep(2500 * 1000);
	CHECK_EQ(te_metadata_get(md, "mooncake/fo", &v, &len), 0);
	CHECK(v && len == 7 && memcmp(v, "{\"n\":2}", 7) == 0);
	te_free(v);
	CHECK_EQ(te_metadata_remove(md, "mooncake/fo"), 0);
	te_metadata_close(md);
	te_set_log_handler(NULL, NULL);
}

/* ------------------------------------------------------------ etcd TLS */

static void case_etcd_tls(void)
{
	te_engine *e = NULL;
	te_metadata *md = NULL;
	char conn[128], *v = NULL;
	size_t len;

	/* Another thread owns the default main context throughout: a TLS
	 * handshake that waited for it (to be asked for the client certificate)
	 * would hang every call below for good. */
	atomic_int held = 0;
	pthread_t holder;
	REQUIRE(pthread_create(&holder, NULL, md_hold_default_context, &held) == 0);
	REQUIRE(WAIT_FOR(atomic_load(&held) == 1, 5000));

	make_certs(true);
	char cert[512], key[512], ca[512];
	snprintf(cert, sizeof cert, "%s", tmp_path("srv.pem"));
	snprintf(key, sizeof key, "%s", tmp_path("srv.key"));
	snprintf(ca, sizeof ca, "%s", tmp_path("ca.pem"));
	/* glib-networking parses the default database's CAs (the system's) for
	 * every new TLS connection before the CA file replaces them: up to
	 * seconds for the eight connections at once below under ThreadSanitizer
	 * on a loaded machine, past the calls' 5 s. The test's CA as the
	 * default keeps that cost out; every store here still trusts only
	 * TE_ETCD_CA_FILE. */
	GError *gerr = NULL;
	GTlsDatabase *test_db = g_tls_file_database_new(ca, &gerr);
	if (test_db == NULL)
		fprintf(stderr, "  %s: %s\n", ca, gerr->message);
	REQUIRE(test_db != NULL);
	g_tls_backend_set_default_database(g_tls_backend_get_default(), test_db);
	g_object_unref(test_db);
	const char *extra[] = { "--cert-file", cert, "--key-file", key, "--client-cert-auth", "--trusted-ca-file", ca,
				NULL };
	etcd_start_ex(etcd1, 1, "tls", extra, true);
	snprintf(conn, sizeof conn, "etcds://127.0.0.1:%d", etcd1[0].client_port);

	/* Refusals first: GLib's TLS backend resumes sessions within a process,
	 * and a resumed session is not asked for a certificate again. */
	/* no client certificate: refused, with the TLS failure in the log */
	setenv("TE_ETCD_CA_FILE", ca, 1);
	cap_start();
	int rc = te_engine_create(conn, "nocert", NULL, 0, &e);
	CHECK(rc < 0 && rc != -ENOENT && e == NULL);
	CHECK(cap_has("unusable"));
	CHECK(cap_has("TLS") || cap_has("certificate"));
	fprintf(stderr, "  without a client certificate: %s", strstr(cap_buf, "unusable") ? strstr(cap_buf, "unusable") : "?\n");

	/* trusting another CA: the server is not believed */
	setenv("TE_ETCD_CERT_FILE", tmp_path("cli.pem"), 1);
	setenv("TE_ETCD_KEY_FILE", tmp_path("cli.key"), 1);
	setenv("TE_ETCD_CA_FILE", tmp_path("other-ca.pem"), 1);
	cap_start();
	rc = te_engine_create(conn, "otherca", NULL, 0, &e);
	CHECK(rc < 0 && e == NULL);
	CHECK(cap_has("unusable"));
	CHECK(cap_has("certificate") || cap_has("TLS"));
	fprintf(stderr, "  trusting another CA: %s", strstr(cap_buf, "unusable") ? strstr(cap_buf, "unusable") : "?\n");

	/* trusted CA and a client certificate: engines meet through it */
	setenv("TE_ETCD_CA_FILE", ca, 1);
	setenv("TE_ETCD_CERT_FILE", tmp_path("cli.pem"), 1);
	setenv("TE_ETCD_KEY_FILE", tmp_path("cli.key"), 1);
	check_store_basics(conn);
	two_engines(conn, NULL, NULL);

	/* the same endpoint written https:// in an etcd:// list */
	char conn2[128];
	snprintf(conn2, sizeof conn2, "etcd://https://127.0.0.1:%d", etcd1[0].client_port);
	REQUIRE(te_metadata_open(conn2, &md) == 0);
	CHECK_EQ(te_metadata_get(md, "mooncake/none", &v, &len), -ENOENT);
	te_metadata_close(md);

	/* a certificate file that cannot be read: the store does not open */
	setenv("TE_ETCD_CA_FILE", ca, 1);
	setenv("TE_ETCD_CERT_FILE", "/nonexistent/cli.pem", 1);
	cap_start();
	CHECK_EQ(te_metadata_open(conn, &md), -EINVAL);
	CHECK(cap_has("cannot load the client certificate"));
	/* a key without a certificate neither */
	unsetenv("TE_ETCD_CERT_FILE");
	CHECK_EQ(te_metadata_open(conn, &md), -EINVAL);
	CHECK(cap_has("TE_ETCD_KEY_FILE needs TE_ETCD_CERT_FILE"));
	/* plain http to the https port gets no usable answer */
	unsetenv("TE_ETCD_KEY_FILE");
	unsetenv("TE_ETCD_CA_FILE");
	snprintf(conn2, sizeof conn2, "etcd://127.0.0.1:%d", etcd1[0].client_port);
	REQUIRE(te_metadata_open(conn2, &md) == 0);
	CHECK(te_metadata_get(md, "mooncake/none", &v, &len) < 0 && v == NULL);
	CHECK(te_metadata_get(md, "mooncake/none", &v, &len) != -ENOENT);
	te_metadata_close(md);

	/* a member that accepts and never answers the TLS handshake: the call
	 * ends by its timeout, saying where it stood */
	int hole_port, hole = blackhole_listen(&hole_port);
	setenv("TE_ETCD_CA_FILE", ca, 1);
	setenv("TE_ETCD_TIMEOUT_MS", "1500", 1); /* room for TLS set-up under a sanitizer */
	snprintf(conn2, sizeof conn2, "etcds://127.0.0.1:%d", hole_port);
	cap_start();
	REQUIRE(te_metadata_open(conn2, &md) == 0);
	long long t0 = now_ms();
	CHECK_EQ(te_metadata_get(md, "mooncake/none", &v, &len), -ETIMEDOUT);
	CHECK(now_ms() - t0 < 1500 + 1000);
	CHECK(cap_has("timed out after 1500 ms during the TLS handshake"));
	te_metadata_close(md);
	unsetenv("TE_ETCD_TIMEOUT_MS");
	unsetenv("TE_ETCD_CA_FILE");
	close(hole);
	te_set_log_handler(NULL, NULL);
	atomic_store(&held, 2);
	pthread_join(holder, NULL);
}

/* ----------------------------------------------------------------- redis */

static int redis_port;
static char redis_conn[256];

static pid_t redis_single(const char *const *extra)
{
	redis_port = free_port();
	pid_t pid = redis_start(redis_port, tmp_path("redis"), extra);
	snprintf(redis_conn, sizeof redis_conn, "redis://127.0.0.1:%d", redis_port);
	return pid;
}

static void case_redis_basic(void)
{
	te_metadata *md = NULL;
	char c[128];

	redis_single(NULL);
	check_store_basics(redis_conn);
	check_engine_keys(redis_conn);
	check_malformed(redis_conn);
	check_list("redis", redis_conn);
	check_unreachable("redis://127.0.0.1:%d", "TE_REDIS_TIMEOUT_MS", NULL);
	snprintf(c, sizeof c, "redis://127.0.0.1:%d/abc", redis_port);
	CHECK_EQ(te_metadata_open(c, &md), -EINVAL);
	snprintf(c, sizeof c, "redis://127.0.0.1:%d/256", redis_port);
	CHECK_EQ(te_metadata_open(c, &md), -EINVAL);
	snprintf(c, sizeof c, "redis://127.0.0.1:%d?x=1", redis_port);
	CHECK_EQ(te_metadata_open(c, &md), -EINVAL);
}

static void case_redis_auth(void)
{
	static const char *extra[] = { "--requirepass", "s3cret", NULL };
	te_metadata *md = NULL, *md3 = NULL;
	te_engine *e = NULL;
	char c[160], *v = NULL, r[256];
	size_t len;

	redis_single(extra);
	/* no password: refused, and the log says what is missing */
	cap_start();
	CHECK_EQ(te_engine_create(redis_conn, "x", NULL, 0, &e), -EACCES);
	CHECK(cap_has("TE_REDIS_PASSWORD"));
	/* wrong password, from the environment; the password is never logged */
	setenv("TE_REDIS_PASSWORD", "wrong-pw", 1);
	cap_start();
	CHECK_EQ(te_metadata_open(redis_conn, &md), -EACCES);
	CHECK(cap_has("authentication failed"));
	CHECK(!strstr(cap_buf, "wrong-pw"));
	/* right password, under both names */
	setenv("TE_REDIS_PASSWORD", "s3cret", 1);
	CHECK_EQ(te_metadata_open(redis_conn, &md), 0);
	te_metadata_close(md);
	unsetenv("TE_REDIS_PASSWORD");
	setenv("MC_REDIS_PASSWORD", "s3cret", 1);
	CHECK_EQ(te_metadata_open(redis_conn, &md), 0);
	unsetenv("MC_REDIS_PASSWORD");

	/* database 3 by URL, seen by database 3 by environment, not by 0 */
	snprintf(c, sizeof c, "redis://:s3cret@127.0.0.1:%d/3", redis_port);
	REQUIRE(te_metadata_open(c, &md3) == 0);
	CHECK_EQ(te_metadata_put(md3, "mooncake/in-db3", "{}", 2), 0);
	CHECK_EQ(te_metadata_get(md, "mooncake/in-db3", &v, &len), -ENOENT);
	te_metadata_close(md);
	setenv("TE_REDIS_PASSWORD", "s3cret", 1);
	setenv("MC_REDIS_DB_INDEX", "3", 1);
	REQUIRE(te_metadata_open(redis_conn, &md) == 0);
	CHECK_EQ(te_metadata_get(md, "mooncake/in-db3", &v, &len), 0);
	te_free(v);
	te_metadata_close(md);
	/* an index out of range falls back to 0, with a warning */
	setenv("MC_REDIS_DB_INDEX", "300", 1);
	cap_start();
	REQUIRE(te_metadata_open(redis_conn, &md) == 0);
	CHECK(cap_has("REDIS_DB_INDEX=300"));
	CHECK_EQ(te_metadata_get(md, "mooncake/in-db3", &v, &len), -ENOENT);
	te_metadata_close(md);
	unsetenv("MC_REDIS_DB_INDEX");
	unsetenv("TE_REDIS_PASSWORD");
	CHECK_EQ(te_metadata_remove(md3, "mooncake/in-db3"), 0);
	te_metadata_close(md3);

	/* an ACL user, from the URL and from the environment */
	CHECK(redis_raw(redis_port, r, sizeof r, 2, "AUTH", "s3cret") > 0 && strncmp(r, "+OK", 3) == 0);
	int fd = connect_loopback(redis_port, 5000);
	const char *acl2 = "*2\r\n$4\r\nAUTH\r\n$6\r\ns3cret\r\n"
			   "*7\r\n$3\r\nACL\r\n$7\r\nSETUSER\r\n$5\r\nalice\r\n$2\r\non\r\n$4\r\n>pw1\r\n$5\r\n+@all\r\n$2\r\n~*\r\n";
	REQUIRE(fd >= 0);
	REQUIRE(send(fd, acl2, strlen(acl2), MSG_NOSIGNAL) == (ssize_t)strlen(acl2));
	char got[256] = "";
	size_t gl = 0;
	while (gl < 10 && strstr(got, "+OK\r\n+OK") == NULL) {
		ssize_t n = recv(fd, got + gl, sizeof got - gl - 1, 0);
		if (n <= 0)
			break;
		gl += (size_t)n;
		got[gl] = '\0';
	}
	close(fd);
	CHECK(strstr(got, "+OK\r\n+OK") != NULL);
	snprintf(c, sizeof c, "redis://alice:pw1@127.0.0.1:%d/2", redis_port);
	CHECK_EQ(te_metadata_open(c, &md), 0);
	CHECK_EQ(te_metadata_put(md, "mooncake/alice", "{}", 2), 0);
	te_metadata_close(md);
	snprintf(c, sizeof c, "redis://alice:nope@127.0.0.1:%d", redis_port);
	CHECK_EQ(te_metadata_open(c, &md), -EACCES);
	setenv("MC_REDIS_USERNAME", "alice", 1);
	setenv("MC_REDIS_PASSWORD", "pw1", 1);
	setenv("TE_REDIS_DB_INDEX", "2", 1);
	REQUIRE(te_metadata_open(redis_conn, &md) == 0);
	CHECK_EQ(te_metadata_get(md, "mooncake/alice", &v, &len), 0);
	te_free(v);
	CHECK_EQ(te_metadata_remove(md, "mooncake/alice"), 0);
	te_metadata_close(md);
	unsetenv("MC_REDIS_USERNAME");
	unsetenv("MC_REDIS_PASSWORD");
	unsetenv("TE_REDIS_DB_INDEX");
	te_set_log_handler(NULL, NULL);
}

/* Password required and database 7: the target reads both from MC_ names,
 * the initiator from the URL. */
static void case_redis_engines(void)
{
	static const char *extra[] = { "--requirepass", "pa55", NULL };
	static char pw[] = "MC_REDIS_PASSWORD=pa55", db[] = "MC_REDIS_DB_INDEX=7";
	char *peer_env[] = { pw, db, NULL };
	char conn[160], *v = NULL;
	size_t len;
	te_metadata *md0 = NULL;

	redis_single(extra);
	snprintf(conn, sizeof conn, "redis://:pa55@127.0.0.1:%d/7", redis_port);
	two_engines(conn, peer_env, NULL);
	/* nothing landed in database 0 */
	snprintf(conn, sizeof conn, "redis://:pa55@127.0.0.1:%d/0", redis_port);
	REQUIRE(te_metadata_open(conn, &md0) == 0);
	char k[128];
	snprintf(k, sizeof k, "mooncake/rpc_meta/target-%d", (int)getpid());
	CHECK_EQ(te_metadata_get(md0, k, &v, &len), -ENOENT);
	te_metadata_close(md0);
}

/* redis goes away and comes back; the same store handles carry on. */
static void case_redis_restart(void)
{
	static const char *extra[] = { "--appendonly", "yes", "--appendfsync", "always", NULL };
	peer p;
	char *v = NULL;
	size_t len;

	REQUIRE(have_tcp());
	pid_t rp = redis_single(extra);
	te_metadata *md = store_and_target(redis_conn, &p, 21, NULL);
	te_engine *e = initiator(redis_conn, NULL);
	REQUIRE(e != NULL);
	REQUIRE(open_round(e, &p, 21, 22));

	stop_child(rp, SIGTERM);
	/* down: errors, quickly, not "not found" */
	long long t0 = now_ms();
	int rc = te_metadata_get(md, "mooncake/anything", &v, &len);
	CHECK(rc < 0 && rc != -ENOENT);
	CHECK(te_segment_open(e, p.name) < 0);
	CHECK(now_ms() - t0 < 10000);

	redis_start(redis_port, tmp_path("redis"), extra);
	/* same handles, new connections */
	CHECK_EQ(te_metadata_put(md, "mooncake/after-restart", "{}", 2), 0);
	CHECK_EQ(te_metadata_get(md, "mooncake/after-restart", &v, &len), 0);
	te_free(v);
	CHECK_EQ(te_metadata_remove(md, "mooncake/after-restart"), 0);
	open_round(e, &p, 22, 23);
	/* the target's connection was broken too: its removal must go through */
	CHECK_EQ(peer_quit(&p), 0);
	CHECK_EQ(keys_of(md, p.name), 0);
	te_engine_destroy(e);
	te_metadata_close(md);
}

/* An engine with a 2 s TTL on its keys (env `kept`): alive for three TTLs,
 * the renewals hold its keys; one deleted behind its back comes back; killed
 * (kill -9), its keys vanish within the TTL. With TTLs off (env `unkept`)
 * the keys of a killed engine stay. */
static void check_keys_expire(const char *conn, char *kept[], char *unkept[])
{
	te_metadata *md = NULL;
	peer p;
	char k[256];

	REQUIRE(te_metadata_open(conn, &md) == 0);
	REQUIRE(peer_start_with(&p, conn, "kept", 1, kept, ""));
	usleep(6000 * 1000);
	CHECK_EQ(keys_of(md, p.name), 2);
	te_metadata_rpc_key(p.name, k, sizeof k);
	CHECK_EQ(te_metadata_remove(md, k), 0);
	long long back = wait_keys(md, p.name, 2, 3000);
	CHECK(back >= 0);
	fprintf(stderr, "  key back %lld ms after it was deleted\n", back);
	long long t0 = now_ms();
	peer_kill(&p);
	long long gone = wait_keys(md, p.name, 0, 10000);
	gone = gone < 0 ? -1 : now_ms() - t0;
	fprintf(stderr, "  keys of the killed engine gone after %lld ms (TTL 2 s)\n", gone);
	CHECK(gone >= 0 && gone <= 2000 + 500);
	REQUIRE(peer_start_with(&p, conn, "unkept", 2, unkept, ""));
	killed_keys_stay(md, &p, 3000);
	te_metadata_close(md);
}

/* An engine's own keys expire unless it keeps them alive. */
static void case_redis_ttl(void)
{
	static char ttl_env[] = "TE_REDIS_KEY_TTL=2";
	static char off_env[] = "TE_REDIS_KEY_TTL=0";
	char *kept[] = { ttl_env, NULL };
	char *unkept[] = { off_env, NULL };

	redis_single(NULL);
	check_keys_expire(redis_conn, kept, unkept);
}

/* ------------------------------------------------------------------ http */

static int mds_port;
static char http_conn[256];

static pid_t http_single(const char *const *extra)
{
	mds_port = free_port();
	snprintf(http_conn, sizeof http_conn, "http://127.0.0.1:%d/metadata", mds_port);
	return mds_start(mds_port, extra);
}

static void case_http_basic(void)
{
	te_metadata *md = NULL;

	http_single(NULL);
	check_store_basics(http_conn);
	check_engine_keys(http_conn);
	check_malformed(http_conn);
	check_list("http", http_conn);
	check_unreachable("http://127.0.0.1:%d/metadata", "TE_HTTP_TIMEOUT_MS", "after 300 ms waiting for the reply");
	CHECK_EQ(te_metadata_open("http://", &md), -EINVAL);
	CHECK_EQ(te_metadata_open("http:///metadata", &md), -EINVAL);
}

static void case_http_engines(void)
{
	http_single(NULL);
	two_engines(http_conn, NULL, NULL);
}

/* Restarts with --persist, after SIGTERM and after SIGKILL: nothing lost. */
/* te-metadata-server refuses to start over a store file holding `text`
 * (exit status 1) rather than overwrite it. */
static void check_store_refused(const char *file, const char *text)
{
	FILE *f = fopen(file, "w");
	REQUIRE(f != NULL);
	fputs(text, f);
	fclose(f);
	char *argv[] = { getenv("TE_METADATA_SERVER_BIN"), "--listen", "127.0.0.1:0", "--persist",
			 (char *)file, NULL };
	pid_t bad = spawn(argv, NULL, tmp_path("mds-bad.log"), NULL, NULL);
	int st = wait_child(bad, 10000);
	CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 1);
}

static void case_http_persist(void)
{
	const char *file = tmp_path("store.json");
	const char *extra[] = { "--persist", file, NULL };
	peer p;
	char *v = NULL;
	size_t len;

	REQUIRE(have_tcp());
	pid_t srv = http_single(extra);
	te_metadata *md = store_and_target(http_conn, &p, 31, NULL);
	const char *bin = "{\"b\":\"\xff\xfe not UTF-8\"}";
	CHECK_EQ(te_metadata_put(md, "mooncake/binary", bin, strlen(bin)), 0);
	CHECK_EQ(te_metadata_put(md, "mooncake/gone", "{}", 2), 0);
	CHECK_EQ(te_metadata_remove(md, "mooncake/gone"), 0);

	for (int round = 0; round < 2; round++) {
		int sig = round == 0 ? SIGTERM : SIGKILL;
		stop_child(srv, sig);
		CHECK(te_metadata_get(md, "mooncake/binary", &v, &len) < 0);
		srv = mds_start(mds_port, extra);
		CHECK_EQ(keys_of(md, p.name), 2);
		CHECK_EQ(te_metadata_get(md, "mooncake/binary", &v, &len), 0);
		CHECK(v && len == strlen(bin) && memcmp(v, bin, len) == 0);
		te_free(v);
		CHECK_EQ(te_metadata_get(md, "mooncake/gone", &v, &len), -ENOENT);
	}
	te_engine *e = initiator(http_conn, NULL);
	REQUIRE(e != NULL);
	open_round(e, &p, 31, 32);
	CHECK_EQ(peer_quit(&p), 0);
	CHECK_EQ(keys_of(md, p.name), 0);
	te_engine_destroy(e);
	CHECK_EQ(te_metadata_remove(md, "mooncake/binary"), 0);
	te_metadata_close(md);

	/* a damaged store file: the server refuses to start over it */
	stop_child(srv, SIGTERM);
	check_store_refused(file, "{\"format\":\"te-metadata-server/1\",\"entries\":{\"k\":1}}");
}

/* Keys with a TTL: te-metadata-server's rules first (raw requests), then an
 * engine's keys, kept alive by the plugin while it runs, put back when
 * deleted behind its back, gone within the TTL once it is killed; with
 * TE_HTTP_KEY_TTL=0 they stay. */
static void case_http_ttl(void)
{
	static char ttl_env[] = "TE_HTTP_KEY_TTL=2";
	static char off_env[] = "TE_HTTP_KEY_TTL=0";
	char *kept[] = { ttl_env, NULL };
	char *unkept[] = { off_env, NULL };
	const char *file = tmp_path("ttl-store.json");
	const char *extra[] = { "--persist", file, NULL };
	char body[512];

	pid_t srv = http_single(extra);
	const char *bad[] = { "0", "86401", "1x", "-1", "", "99999999999999999999" };
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		char t[128];
		snprintf(t, sizeof t, "/metadata?key=t&ttl=%s", bad[i]);
		CHECK_EQ(http_raw(mds_port, "PUT", t, NULL, "{}", 2, body, sizeof body), 400);
	}
	CHECK(strstr(body, "ttl must be a whole number of seconds") != NULL);
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata?key=t", NULL, NULL, 0, NULL, 0), 404);
	/* TTL 1 s: there, then gone; "u", put again without one, stays */
	CHECK_EQ(http_raw(mds_port, "PUT", "/metadata?key=t&ttl=1", NULL, "{}", 2, body, sizeof body), 200);
	CHECK(strstr(body, "expires in 1 s") != NULL);
	CHECK_EQ(http_raw(mds_port, "PUT", "/metadata?key=u&ttl=1", NULL, "{}", 2, NULL, 0), 200);
	CHECK_EQ(http_raw(mds_port, "PUT", "/metadata?key=u", NULL, "{}", 2, body, sizeof body), 200);
	CHECK(strstr(body, "expires") == NULL);
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata?key=t", NULL, NULL, 0, NULL, 0), 200);
	usleep(1300 * 1000);
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata?key=t", NULL, NULL, 0, NULL, 0), 404);
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata?key=u", NULL, NULL, 0, NULL, 0), 200);
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata", NULL, NULL, 0, body, sizeof body), 200);
	CHECK(strstr(body, "\"t\"") == NULL && strstr(body, "\"u\"") != NULL);
	/* A restart (kill -9) keeps a key with its TTL, given in full again */
	CHECK_EQ(http_raw(mds_port, "PUT", "/metadata?key=v&ttl=2", NULL, "{}", 2, NULL, 0), 200);
	/* ... and a renewal (same value, same TTL) does not write the file,
	 * which each write replaces (a new inode) */
	struct stat st1, st2;
	CHECK_EQ(stat(file, &st1), 0);
	CHECK_EQ(http_raw(mds_port, "PUT", "/metadata?key=v&ttl=2", NULL, "{}", 2, NULL, 0), 200);
	CHECK_EQ(stat(file, &st2), 0);
	CHECK_EQ(st1.st_ino, st2.st_ino);
	CHECK_EQ(http_raw(mds_port, "PUT", "/metadata?key=v&ttl=3", NULL, "{}", 2, NULL, 0), 200);
	CHECK_EQ(stat(file, &st2), 0);
	CHECK(st1.st_ino != st2.st_ino);
	CHECK_EQ(http_raw(mds_port, "PUT", "/metadata?key=v&ttl=2", NULL, "{}", 2, NULL, 0), 200);
	stop_child(srv, SIGKILL);
	srv = mds_start(mds_port, extra);
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata?key=v", NULL, NULL, 0, NULL, 0), 200);
	usleep(2300 * 1000);
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata?key=v", NULL, NULL, 0, NULL, 0), 404);
	CHECK_EQ(http_raw(mds_port, "DELETE", "/metadata?key=u", NULL, NULL, 0, NULL, 0), 200);

	check_keys_expire(http_conn, kept, unkept);
	stop_child(srv, SIGTERM);
	/* A file whose TTLs are not 1 to 86400 seconds is refused */
	const char *bad_ttl[] = { "0", "86401", "\"10\"", "[1]", "1.5" };
	for (size_t i = 0; i < sizeof bad_ttl / sizeof *bad_ttl; i++) {
		char t[256];
		snprintf(t, sizeof t, "{\"format\":\"te-metadata-server/1\",\"entries\":{\"k\":\"v\"},"
				      "\"ttl\":{\"k\":%s}}", bad_ttl[i]);
		check_store_refused(file, t);
	}
	check_store_refused(file, "{\"format\":\"te-metadata-server/1\",\"ttl\":[]}");
}

static void check_reply_limit(void);

static void case_http_limits(void)
{
	static const char *extra[] = { "--max-body", "4096", "--max-key-length", "256", NULL };
	te_metadata *md = NULL;
	char body[4096];
	char *big = malloc(5000), target[600];

	http_single(extra);
	memset(big, 'x', 5000);
	CHECK_EQ(http_raw(mds_port, "PUT", "/metadata?key=k1", NULL, big, 4096, NULL, 0), 200);
	CHECK_EQ(http_raw(mds_port, "PUT", "/metadata?key=k2", NULL, big, 4097, body, sizeof body), 413);
	CHECK(strstr(body, "exceeds") != NULL);
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata?key=k2", NULL, NULL, 0, NULL, 0), 404);
	/* a PUT without a length cannot be bounded before reading it */
	CHECK_EQ(http_raw(mds_port, "PUT", "/metadata?key=k3", "Transfer-Encoding: chunked\r\n", NULL, 0, NULL, 0),
		 411);
	CHECK_EQ(http_raw(mds_port, "PUT", "/metadata", NULL, "{}", 2, NULL, 0), 400);
	CHECK_EQ(http_raw(mds_port, "PUT", "/metadata?key=", NULL, "{}", 2, NULL, 0), 400);
	CHECK_EQ(http_raw(mds_port, "DELETE", "/metadata", NULL, NULL, 0, NULL, 0), 400);
	CHECK_EQ(http_raw(mds_port, "POST", "/metadata?key=k1", NULL, "{}", 2, NULL, 0), 405);
	CHECK_EQ(http_raw(mds_port, "GET", "/elsewhere", NULL, NULL, 0, NULL, 0), 404);
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata/sub?key=k1", NULL, NULL, 0, NULL, 0), 404);
	snprintf(target, sizeof target, "/metadata?key=%0300d", 7);
	CHECK_EQ(http_raw(mds_port, "PUT", target, NULL, "{}", 2, NULL, 0), 400);
	char resp[512];
	CHECK(exchange(mds_port, "GARBAGE\r\n\r\n", 11, resp, sizeof resp, NULL) > 0 &&
	      strncmp(resp, "HTTP/1.", 7) == 0 && strncmp(resp + 8, " 400 ", 5) == 0);
	/* a huge announced body is refused at once, without being sent */
	CHECK(exchange(mds_port, "PUT /metadata?key=h HTTP/1.1\r\nHost: a\r\nContent-Length: 100000000000\r\n\r\n", 71, resp,
		       sizeof resp, "exceeds") > 0 &&
	      strstr(resp, " 413 ") != NULL);
	CHECK_EQ(http_raw(mds_port, "DELETE", "/metadata?key=k1", NULL, NULL, 0, NULL, 0), 200);
	CHECK_EQ(http_raw(mds_port, "DELETE", "/metadata?key=k1", NULL, NULL, 0, NULL, 0), 404);

	/* the plugin reports the refusal */
	REQUIRE(te_metadata_open(http_conn, &md) == 0);
	cap_start();
	big[4999] = '\0';
	CHECK_EQ(te_metadata_put(md, "mooncake/too-big", big, 4999), TE_ERR_METADATA);
	CHECK(cap_has("answered 413"));
	CHECK(cap_has("mooncake/too-big"));
	te_set_log_handler(NULL, NULL);
	CHECK_EQ(te_metadata_put(md, "mooncake/a", "{}", 2), 0);
	CHECK_EQ(te_metadata_put(md, "mooncake/b", "{}", 2), 0);

	/* listing and health */
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata", NULL, NULL, 0, body, sizeof body), 200);
	CHECK(strcmp(body, "[\"mooncake/a\",\"mooncake/b\"]") == 0);
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata?prefix=mooncake%2Fb", NULL, NULL, 0, body, sizeof body), 200);
	CHECK(strcmp(body, "[\"mooncake/b\"]") == 0);
	CHECK_EQ(http_raw(mds_port, "GET", "/health", NULL, NULL, 0, body, sizeof body), 200);
	CHECK(strstr(body, "\"keys\":2") != NULL);
	te_metadata_close(md);
	free(big);
	check_reply_limit();
}

/* https: te-metadata-server with a self-signed certificate; the plugin
 * trusts it only through TE_HTTP_CA_FILE. */
static void case_http_tls(void)
{
	const char *cert = tmp_path("cert.pem"), *key = tmp_path("key.pem");
	char *gen[] = { "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", (char *)key,
			"-out", (char *)cert, "-days", "2", "-subj", "/CN=127.0.0.1", "-addext",
			"subjectAltName=IP:127.0.0.1", NULL };
	pid_t g = spawn(gen, NULL, tmp_path("openssl.log"), NULL, NULL);
	int st = wait_child(g, 60000);
	REQUIRE(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	const char *extra[] = { "--tls-cert", cert, "--tls-key", key, NULL };
	te_metadata *md = NULL;
	char conn[128], *v = NULL;
	size_t len;

	mds_port = free_port();
	mds_start(mds_port, extra);
	snprintf(conn, sizeof conn, "https://127.0.0.1:%d/metadata", mds_port);

	/* not trusted: a clear error, not "not found" */
	cap_start();
	REQUIRE(te_metadata_open(conn, &md) == 0);
	int rc = te_metadata_get(md, "mooncake/x", &v, &len);
	CHECK(rc < 0 && rc != -ENOENT);
	CHECK(cap_has(conn));
	te_metadata_close(md);

	setenv("TE_HTTP_CA_FILE", "/nonexistent/ca.pem", 1);
	CHECK_EQ(te_metadata_open(conn, &md), -EINVAL);
	CHECK(cap_has("cannot read CA file"));
	te_set_log_handler(NULL, NULL);

	setenv("TE_HTTP_CA_FILE", cert, 1);
	check_store_basics(conn);
	check_engine_keys(conn);
	/* a server that accepts and never answers the TLS handshake: the
	 * request's timeout still ends it */
	check_unreachable("https://127.0.0.1:%d/metadata", "TE_HTTP_TIMEOUT_MS", "after 300 ms during the TLS handshake");
	unsetenv("TE_HTTP_CA_FILE");
}


/* A server that answers every request on its one connection with the same
 * canned reply (replies: how many to give). */
typedef struct canned {
	int fd, replies;
	const char *head;  /* status line and headers, ending with a blank line */
	size_t body_len;   /* that many 'v's follow (chunked: in 1 KiB chunks) */
	bool chunked;
	const char *body;  /* or this text, after the headers, when set */
} canned;

static void *canned_server(void *arg)
{
	canned *k = arg;
	char req[8192], chunk[1024 + 16];

	for (int i = 0; i < k->replies; i++) {
		int fd = accept(k->fd, NULL, NULL);
		if (fd < 0)
			break;
		/* the request's headers (the plugin's GETs have no body) */
		size_t got = 0;
		while (got < sizeof req - 1) {
			ssize_t n = read(fd, req + got, sizeof req - 1 - got);
			if (n <= 0)
				break;
			got += (size_t)n;
			req[got] = '\0';
			if (strstr(req, "\r\n\r\n") != NULL)
				break;
		}
		bool ok = write(fd, k->head, strlen(k->head)) == (ssize_t)strlen(k->head);
		if (ok && k->body != NULL) {
			size_t bl = strlen(k->body), sent = 0;
			while (sent < bl) {
				ssize_t n = write(fd, k->body + sent, bl - sent);
				if (n <= 0)
					break;
				sent += (size_t)n;
			}
		}
		for (size_t sent = 0; ok && sent < k->body_len;) {
			size_t n = k->body_len - sent < 1024 ? k->body_len - sent : 1024, h = 0;
			if (k->chunked)
				h = (size_t)snprintf(chunk, sizeof chunk, "%zx\r\n", n);
			memset(chunk + h, 'v', n);
			if (k->chunked)
				memcpy(chunk + h + n, "\r\n", 2);
			size_t total = h + n + (k->chunked ? 2 : 0);
			ok = write(fd, chunk, total) == (ssize_t)total;
			sent += n;
		}
		if (ok && k->chunked)
			ok = write(fd, "0\r\n\r\n", 5) == 5;
		/* Read what is left of the request (a POST's body) until the client
		 * closes: closing with it unread would reset the connection and
		 * lose the reply. */
		struct timeval tv = { .tv_sec = 2 };
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
		shutdown(fd, SHUT_WR);
		while (read(fd, req, sizeof req) > 0)
			;
		close(fd);
	}
	return NULL;
}

/* The client's reply limit (TE_HTTP_MAX_REPLY): a reply that announces more
 * is refused before its body is read, and one without a length (chunked) is
 * cut off once it passes the limit; each a clear error, not the store's
 * "not found". A reply within the limit still arrives whole. */
static void check_reply_limit(void)
{
	static const struct {
		const char *head;
		size_t body;
		bool chunked;
		const char *says; /* in the log; NULL: the reply is taken */
	} cases[] = {
		{ "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 100000\r\n"
		  "Connection: close\r\n\r\n", 100000, false, "announces 100000 bytes" },
		{ "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n"
		  "Connection: close\r\n\r\n", 9000, true, "exceeds 4096 bytes" },
		{ "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n"
		  "Connection: close\r\n\r\n", 4000, true, NULL },
	};

	setenv("TE_HTTP_MAX_REPLY", "4096", 1);
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		int port;
		canned k = { .fd = blackhole_listen(&port), .replies = 1, .head = cases[i].head,
			     .body_len = cases[i].body, .chunked = cases[i].chunked };
		pthread_t th;
		char conn[128], *v = NULL;
		size_t len = 0;
		te_metadata *md = NULL;

		REQUIRE(pthread_create(&th, NULL, canned_server, &k) == 0);
		snprintf(conn, sizeof conn, "http://127.0.0.1:%d/metadata", port);
		REQUIRE(te_metadata_open(conn, &md) == 0);
		cap_start();
		int rc = te_metadata_get(md, "mooncake/x", &v, &len);
		if (cases[i].says != NULL) {
			CHECK(rc < 0 && rc != -ENOENT);
			CHECK(cap_has(cases[i].says));
		} else {
			CHECK_EQ(rc, 0);
			CHECK(len == cases[i].body && v != NULL && v[0] == 'v' && v[len - 1] == 'v');
		}
		te_free(v);
		te_set_log_handler(NULL, NULL);
		te_metadata_close(md);
		shutdown(k.fd, SHUT_RDWR); /* ends an accept() still waiting */
		pthread_join(th, NULL);
		close(k.fd);
	}
	unsetenv("TE_HTTP_MAX_REPLY");
}

/* ------------------------------------------------- hostile store replies */

/* An etcd endpoint that answers with hostile JSON: each get fails with a
 * clear error (not "not found", not a crash), and the line says why. */
static void case_etcd_hostile(void)
{
	char *deep = hostile_deep(300000, 0);
	char *deep_in = hostile_nest("{\"kvs\":[{\"value\":", "[", 100000, "1", "]", "}]}");
	char *many = hostile_array("{\"kvs\":", 1000000, "0", "}");
	const struct {
		const char *body, *says;
	} cases[] = {
		{ deep, "nested deeper than 16 levels" },
		{ deep_in, "nested deeper than 16 levels" },
		{ many, "more than 262144 elements" },
		{ "{\"kvs\":[{\"value\":\"eA==\"}],\"kvs\":[]}", "key repeated" },
		{ "{\"kvs\":{\"value\":\"eA==\"}}", "\"kvs\" is not an array" },
		{ "{\"kvs\":[{\"value\":5}]}", "malformed kvs entry" },
		{ "{\"header\":{\"revision\":1e999},\"kvs\":[]}", "out of range" },
		{ "{\"header\":{\"revision\":18446744073709551616}}", "outside [-2^63" },
		{ "{\"kvs\":[{\"value\":NaN}]}", "unexpected 'N'" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		int port;
		char head[256], conn[128], *v = NULL;
		size_t len = 0;
		te_metadata *md = NULL;
		snprintf(head, sizeof head,
			 "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
			 "Connection: close\r\n\r\n",
			 strlen(cases[i].body));
		canned c = { .fd = blackhole_listen(&port), .replies = 4, .head = head, .body = cases[i].body };
		pthread_t th;
		REQUIRE(pthread_create(&th, NULL, canned_server, &c) == 0);
		snprintf(conn, sizeof conn, "etcd://127.0.0.1:%d", port);
		cap_start();
		if (te_metadata_open(conn, &md) == 0) {
			int rc = te_metadata_get(md, "mooncake/x", &v, &len);
			if (rc >= 0 || rc == -ENOENT)
				fprintf(stderr, "  reply %zu: get gave %d\n", i, rc);
			CHECK(rc < 0 && rc != -ENOENT);
			CHECK(cap_has(cases[i].says));
			te_free(v);
			te_metadata_close(md);
		} else {
			CHECK(!"te_metadata_open");
		}
		te_set_log_handler(NULL, NULL);
		shutdown(c.fd, SHUT_RDWR);
		pthread_join(th, NULL);
		close(c.fd);
	}
	free(deep);
	free(deep_in);
	free(many);
}

/* te-metadata-server given a hostile persistence file: it refuses to start,
 * saying why, and does not crash. */
static void case_http_hostile(void)
{
	const char *bin = getenv("TE_METADATA_SERVER_BIN");
	char *deep = hostile_nest("{\"format\":", "[", 300000, "1", "]", "}");
	const char *texts[] = {
		deep,
		"{\"format\":\"te-metadata-server/1\",\"entries\":{\"a\":\"1\",\"a\":\"2\"}}",
		"{\"format\":\"te-metadata-server/1\",\"entries\":{\"a\":{\"b\":{}}}}",
	};
	const char *says[] = { "nested deeper than 2 levels", "key repeated", "nested deeper than 2 levels" };
	REQUIRE(bin != NULL);
	for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
		const char *file = tmp_path("hostile-%zu.json", i), *log = tmp_path("hostile-%zu.log", i);
		FILE *f = fopen(file, "w");
		REQUIRE(f != NULL);
		fputs(texts[i], f);
		fclose(f);
		char listen[64];
		snprintf(listen, sizeof listen, "127.0.0.1:%d", free_port());
		char *argv[] = { (char *)bin, "--listen", listen, "--persist", (char *)file, NULL };
		pid_t pid = spawn(argv, NULL, log, NULL, NULL);
		int st = 0;
		REQUIRE(waitpid(pid, &st, 0) == pid);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) != 0);
		char buf[4096];
		read_text(log, buf, sizeof buf);
		if (strstr(buf, says[i]) == NULL)
			fprintf(stderr, "  file %zu: the server said: %s\n", i, buf);
		CHECK(strstr(buf, says[i]) != NULL);
	}
	free(deep);
}

/* te-metadata-server with a bearer token: calls without it or with another
 * are refused with 401, logged with the client's address and never with
 * what it sent; the plugin with TE_HTTP_TOKEN_FILE works end to end. */
static void case_http_token(void)
{
	const char *tok = "tok-3f9a1c0e5b7d2468ace13579bdf02468";
	char tfile[512], wfile[512]; /* copies: tmp_path's storage rotates */
	snprintf(tfile, sizeof tfile, "%s", tmp_path("token"));
	snprintf(wfile, sizeof wfile, "%s", tmp_path("wrong-token"));
	char body[512], hdr[256], log[65536];
	te_metadata *md = NULL;
	char *v = NULL;
	size_t len;

	FILE *f = fopen(tfile, "w");
	REQUIRE(f != NULL);
	fprintf(f, "%s\n", tok);
	fclose(f);
	f = fopen(wfile, "w");
	REQUIRE(f != NULL);
	fprintf(f, "guess-0123456789abcdef\n");
	fclose(f);

	const char *extra[] = { "--token-file", tfile, NULL };
	pid_t srv = http_single(extra);
	/* raw calls: without a token, with a wrong one, with a malformed header */
	CHECK_EQ(http_raw(mds_port, "PUT", "/metadata?key=k", NULL, "{}", 2, body, sizeof body), 401);
	CHECK(strcmp(body, "unauthorized") == 0);
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata?key=k", NULL, NULL, 0, NULL, 0), 401);
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata", NULL, NULL, 0, NULL, 0), 401);
	CHECK_EQ(http_raw(mds_port, "DELETE", "/metadata?key=k", NULL, NULL, 0, NULL, 0), 401);
	CHECK_EQ(http_raw(mds_port, "PUT", "/metadata?key=k", "Authorization: Bearer guess-0123456789abcdef\r\n", "{}",
			  2, NULL, 0), 401);
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata?key=k", "Authorization: Bearer guess-0123456789abcdef\r\n", NULL,
			  0, NULL, 0), 401);
	snprintf(hdr, sizeof hdr, "Authorization: Basic %s\r\n", tok);
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata?key=k", hdr, NULL, 0, NULL, 0), 401);
	/* a prefix of the token is not the token */
	snprintf(hdr, sizeof hdr, "Authorization: Bearer %.20s\r\n", tok);
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata?key=k", hdr, NULL, 0, NULL, 0), 401);
	/* nothing was written by the refused calls */
	snprintf(hdr, sizeof hdr, "Authorization: Bearer %s\r\n", tok);
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata?key=k", hdr, NULL, 0, NULL, 0), 404);
	CHECK_EQ(http_raw(mds_port, "PUT", "/metadata?key=k", hdr, "{}", 2, NULL, 0), 200);
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata?key=k", hdr, NULL, 0, body, sizeof body), 200);
	CHECK(strcmp(body, "{}") == 0);
	/* health stays open (a count, no keys) */
	CHECK_EQ(http_raw(mds_port, "GET", "/health", NULL, NULL, 0, NULL, 0), 200);

	/* the plugin without a token: refused with a hint; a wrong token too */
	cap_start();
	REQUIRE(te_metadata_open(http_conn, &md) == 0);
	CHECK_EQ(te_metadata_put(md, "mooncake/x", "{}", 2), TE_ERR_METADATA);
	CHECK(cap_has("answered 401"));
	CHECK(cap_has("TE_HTTP_TOKEN_FILE"));
	te_metadata_close(md);
	setenv("TE_HTTP_TOKEN_FILE", wfile, 1);
	REQUIRE(te_metadata_open(http_conn, &md) == 0);
	CHECK_EQ(te_metadata_get(md, "mooncake/x", &v, &len), TE_ERR_METADATA);
	CHECK(cap_has("the token was refused"));
	CHECK(!cap_has("guess-0123456789abcdef"));
	te_metadata_close(md);
	/* a token file that is missing or empty stops the store from opening */
	setenv("TE_HTTP_TOKEN_FILE", tmp_path("no-such-file"), 1);
	CHECK_EQ(te_metadata_open(http_conn, &md), -EINVAL);
	CHECK(cap_has("TE_HTTP_TOKEN_FILE"));
	f = fopen(tmp_path("empty-token"), "w");
	REQUIRE(f != NULL);
	fputs("  \n", f);
	fclose(f);
	setenv("TE_HTTP_TOKEN_FILE", tmp_path("empty-token"), 1);
	CHECK_EQ(te_metadata_open(http_conn, &md), -EINVAL);
	/* so does the right token in a file its group could have written */
	char gfile[512];
	snprintf(gfile, sizeof gfile, "%s", tmp_path("group-token"));
	f = fopen(gfile, "w");
	REQUIRE(f != NULL);
	fprintf(f, "%s\n", tok);
	fclose(f);
	REQUIRE(chmod(gfile, 0660) == 0);
	setenv("TE_HTTP_TOKEN_FILE", gfile, 1);
	CHECK_EQ(te_metadata_open(http_conn, &md), -EINVAL);
	CHECK(cap_has("group-token (uid"));
	CHECK(cap_has("mode 0660) can be written by its group"));
	CHECK(!cap_has_quiet(tok));
	te_set_log_handler(NULL, NULL);

	/* with the token: two engines exchange descriptors and move data */
	setenv("TE_HTTP_TOKEN_FILE", tfile, 1);
	two_engines(http_conn, NULL, NULL);
	check_store_basics(http_conn);
	unsetenv("TE_HTTP_TOKEN_FILE");

	/* the server's log names the refused clients, never a token */
	stop_child(srv, SIGTERM);
	REQUIRE(read_text(tmp_path("mds.log"), log, sizeof log) >= 0);
	CHECK(strstr(log, "401 to 127.0.0.1") != NULL);
	CHECK(strstr(log, "no Authorization header") != NULL);
	CHECK(strstr(log, "guess-0123456789abcdef") == NULL);
	CHECK(strstr(log, tok) == NULL);

	/* --public-reads, token from TE_METADATA_TOKEN_FILE: reads open, writes not */
	setenv("TE_METADATA_TOKEN_FILE", tfile, 1);
	const char *extra2[] = { "--public-reads", NULL };
	http_single(extra2);
	unsetenv("TE_METADATA_TOKEN_FILE");
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata?key=k", NULL, NULL, 0, NULL, 0), 404);
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata", NULL, NULL, 0, NULL, 0), 200);
	CHECK_EQ(http_raw(mds_port, "PUT", "/metadata?key=k", NULL, "{}", 2, NULL, 0), 401);
	CHECK_EQ(http_raw(mds_port, "DELETE", "/metadata?key=k", NULL, NULL, 0, NULL, 0), 401);
	CHECK_EQ(http_raw(mds_port, "PUT", "/metadata?key=k", hdr, "{}", 2, NULL, 0), 200);
	CHECK_EQ(http_raw(mds_port, "GET", "/metadata?key=k", NULL, NULL, 0, body, sizeof body), 200);

	/* --public-reads alone is refused, and so is a bad token file */
	char *argv1[] = { getenv("TE_METADATA_SERVER_BIN"), "--listen", "127.0.0.1:0", "--public-reads", NULL };
	CHECK(run_cmd(argv1, NULL, tmp_path("mds-bad.log")) > 0);
	char *argv2[] = { getenv("TE_METADATA_SERVER_BIN"), "--listen", "127.0.0.1:0", "--token-file",
			  (char *)tmp_path("empty-token"), NULL };
	CHECK(run_cmd(argv2, NULL, tmp_path("mds-bad.log")) > 0);

	/* an http store named with a password: it never reaches the log */
	char conn[128];
	snprintf(conn, sizeof conn, "http://ops:Pw-in-url-42@127.0.0.1:%d/metadata", free_port());
	scan_start("Pw-in-url-42", "ops:***@127.0.0.1");
	te_engine *e = NULL;
	CHECK(te_engine_create(conn, "pw", NULL, 0, &e) < 0);
	te_set_log_handler(NULL, NULL);
	CHECK(scan.wanted > 0);
	CHECK_EQ(scan.leaks, 0);
}

/* ------------------------------------------------------------------ main */

static const struct {
	const char *name;
	void (*fn)(void);
} cases[] = {
	{ "etcd-basic", case_etcd_basic },	   { "etcd-engines", case_etcd_engines },
	{ "etcd-cluster", case_etcd_cluster },	   { "etcd-lease", case_etcd_lease },
	{ "etcd-auth", case_etcd_auth },	   { "etcd-tls", case_etcd_tls },
	{ "etcd-auth-failover", case_etcd_auth_failover },
	{ "redis-basic", case_redis_basic },	   { "redis-auth", case_redis_auth },
	{ "redis-engines", case_redis_engines },   { "redis-restart", case_redis_restart },
	{ "redis-ttl", case_redis_ttl },
	{ "http-basic", case_http_basic },	   { "http-engines", case_http_engines },
	{ "http-persist", case_http_persist },	   { "http-limits", case_http_limits },
	{ "http-ttl", case_http_ttl },
	{ "http-tls", case_http_tls },		   { "http-token", case_http_token },
	{ "etcd-hostile", case_etcd_hostile },	   { "http-hostile", case_http_hostile },
};

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: test-md CASE\n");
		return 2;
	}
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		if (strcmp(argv[1], cases[i].name) != 0)
			continue;
		harness_init(cases[i].name);
		fprintf(stderr, "temporary directory %s\n", tmp_root);
		cases[i].fn();
		fprintf(stderr, "%s %s\n", check_failures ? "FAIL" : "ok  ", cases[i].name);
		harness_passed = check_failures == 0;
		return check_done();
	}
	fprintf(stderr, "test-md: unknown case %s\n", argv[1]);
	return 2;
}
