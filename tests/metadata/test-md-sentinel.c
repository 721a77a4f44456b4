/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The redis plugin behind Sentinel (redis-sentinel://): a master, a replica
 * and three sentinels (redis-server --sentinel) on loopback ports; a target
 * engine in its own process publishes through the sentinels, an initiator
 * here reads from it without pause while the master is killed (SIGKILL).
 * Then: every transfer that ran across the fail-over completed with the
 * right bytes, an engine created afterwards publishes and opens the target
 * through the promoted replica, and keys the new master lacks are put back by
 * their owner.
 *
 *   test-md-sentinel failover | syntax
 */
#include <pthread.h>
#include <stdatomic.h>

#include <te/te.h>

#include "../common/check.h"
/* (the harness serves every store's tests: some of it is not used here) */
#pragma GCC diagnostic ignored "-Wunused-function"
#include "md-harness.h"

#define BUFSZ (1u << 20)
#define SEED 7u
#define MASTER "mymaster"

static int master_port, replica_port, sentinel_port[3];
static char conn[256];

/* ------------------------------------------------------------- servers */

/* The master's address as sentinel `i` names it; its port, or 0. */
static int sentinel_master(int i)
{
	char r[512];
	if (redis_raw(sentinel_port[i], r, sizeof r, 3, "SENTINEL", "get-master-addr-by-name", MASTER) <= 0)
		return 0;
	/* *2\r\n$9\r\n127.0.0.1\r\n$4\r\nPORT\r\n */
	const char *p = strstr(r, "127.0.0.1\r\n$");
	if (p == NULL || (p = strstr(p + 11, "\r\n")) == NULL)
		return 0;
	return atoi(p + 2);
}

static bool quorum_ok(int port)
{
	char r[512];
	return redis_raw(port, r, sizeof r, 3, "SENTINEL", "ckquorum", MASTER) > 0 && strncmp(r, "+OK", 3) == 0;
}

static bool replica_synced(int port)
{
	char r[4096];
	return redis_raw(port, r, sizeof r, 2, "INFO", "replication") > 0 && strstr(r, "master_link_status:up") != NULL;
}

static pid_t sentinel_start(int i)
{
	char path[600];
	snprintf(path, sizeof path, "%s", tmp_path("sentinel-%d.conf", i));
	FILE *f = fopen(path, "w");
	REQUIRE(f != NULL);
	/* Quick to decide (the test waits for it), and a quorum of two of three. */
	fprintf(f,
		"port %d\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir %s\n"
		"sentinel monitor %s 127.0.0.1 %d 2\n"
		"sentinel down-after-milliseconds %s 1000\n"
		"sentinel failover-timeout %s 10000\n"
		"sentinel parallel-syncs %s 1\n",
		sentinel_port[i], tmp_root, MASTER, master_port, MASTER, MASTER, MASTER);
	fclose(f);
	char *argv[] = { "redis-server", path, "--sentinel", NULL };
	return spawn(argv, NULL, tmp_path("sentinel-%d.log", i), NULL, NULL);
}

/* Master, replica and three sentinels that agree on the master and could
 * fail it over. Returns the master's pid. */
static pid_t cluster_start(void)
{
	master_port = free_port();
	replica_port = free_port();
	pid_t m = redis_start(master_port, tmp_path("master"), NULL);
	char mp[16];
	snprintf(mp, sizeof mp, "%d", master_port);
	const char *rep[] = { "--replicaof", "127.0.0.1", mp, NULL };
	redis_start(replica_port, tmp_path("replica"), rep);
	REQUIRE(wait_until(replica_synced, replica_port, 20000));
	for (int i = 0; i < 3; i++) {
		sentinel_port[i] = free_port();
		sentinel_start(i);
	}
	for (int i = 0; i < 3; i++)
		REQUIRE(wait_until(redis_ready, sentinel_port[i], 20000));
	/* Sentinels find each other through the master's hello channel (every
	 * 2 s): a fail-over needs two of them to agree. */
	for (int i = 0; i < 3; i++)
		REQUIRE(wait_until(quorum_ok, sentinel_port[i], 30000));
	snprintf(conn, sizeof conn, "redis-sentinel://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d/%s", sentinel_port[0],
		 sentinel_port[1], sentinel_port[2], MASTER);
	return m;
}

/* Whether `key` is in the redis on `port` (behind the plugins' back). */
static bool has_key(int port, const char *key)
{
	char r[64];
	return redis_raw(port, r, sizeof r, 2, "EXISTS", key) > 0 && strncmp(r, ":1", 2) == 0;
}

/* ---------------------------------------------------------------- peers */

typedef struct peer {
	pid_t pid;
	int in, out;
	char name[64];
} peer;

static bool peer_start(peer *p, const char *tag, char *const env[])
{
	char size[32], seed[16], line[256];

	snprintf(p->name, sizeof p->name, "%s-%d", tag, (int)getpid());
	snprintf(size, sizeof size, "%u", BUFSZ);
	snprintf(seed, sizeof seed, "%u", SEED);
	char *argv[] = { getenv("TE_MD_PEER"), conn, p->name, size, seed, NULL };
	REQUIRE(argv[0] != NULL);
	p->pid = spawn(argv, env, tmp_path("%s.log", tag), &p->in, &p->out);
	if (!harness_read_line(p->out, line, sizeof line, 30000) || strncmp(line, "READY ", 6) != 0) {
		fprintf(stderr, "  peer %s did not come up (said '%s')\n", p->name, line);
		return false;
	}
	return true;
}

static int peer_quit(peer *p)
{
	char line[64];
	if (write(p->in, "quit\n", 5) != 5)
		return -1;
	bool bye = harness_read_line(p->out, line, sizeof line, 30000) && strcmp(line, "BYE") == 0;
	int st = wait_child(p->pid, 30000);
	close(p->in);
	close(p->out);
	return bye && st == 0 ? 0 : -1;
}

static te_engine *engine(const char *tag)
{
	te_engine *e = NULL;
	te_option opt[2] = { { "ip_or_host_name", "127.0.0.1" }, { "transports", "tcp" } };
	char name[64];

	snprintf(name, sizeof name, "%s-%d", tag, (int)getpid());
	int rc = te_engine_create(conn, name, opt, 2, &e);
	if (rc != 0)
		fprintf(stderr, "  engine %s on %s: %s\n", name, conn, te_strerror(rc));
	return e;
}

/* Reads the target's buffer and compares it with its pattern. */
static bool read_checked(te_engine *e, te_segment_id seg, unsigned char *local, const unsigned char *want)
{
	te_segment_buffer sb;
	if (te_segment_buffers(e, seg, &sb, 1) != 1 || sb.length != BUFSZ)
		return false;
	memset(local, 0, BUFSZ);
	return run_one(e, TE_OP_READ, seg, local, sb.addr, BUFSZ, NULL) == TE_TASK_COMPLETED &&
	       memcmp(local, want, BUFSZ) == 0;
}

/* The initiator's reads while the master fails over. */
typedef struct reader {
	te_engine *e;
	te_segment_id seg;
	unsigned char *local, *want;
	atomic_int stop;
	atomic_int ok, bad;
} reader;

static void *reader_main(void *arg)
{
	reader *r = arg;
	while (!atomic_load(&r->stop)) {
		if (read_checked(r->e, r->seg, r->local, r->want))
			atomic_fetch_add(&r->ok, 1);
		else
			atomic_fetch_add(&r->bad, 1);
		usleep(20000);
	}
	return NULL;
}

/* --------------------------------------------------------------- cases */

static void case_failover(void)
{
	static char ttl[] = "TE_REDIS_KEY_TTL=3";
	char *env[] = { ttl, NULL };
	char rk[256], sk[256];
	peer p;

	pid_t master = cluster_start();
	setenv("TE_REDIS_KEY_TTL", "3", 1); /* the keeper runs every second */
	REQUIRE(peer_start(&p, "target", env));
	te_engine *e = engine("init");
	REQUIRE(e != NULL);
	te_segment_id seg = te_segment_open(e, p.name);
	REQUIRE(seg > 0);

	reader r = { .e = e, .seg = seg };
	r.local = aligned_alloc(4096, BUFSZ);
	r.want = malloc(BUFSZ);
	REQUIRE(r.local != NULL && r.want != NULL);
	fill_pattern(r.want, BUFSZ, SEED);
	REQUIRE(te_register_memory(e, r.local, BUFSZ, "cpu:0", 0) == 0);
	CHECK(read_checked(e, seg, r.local, r.want));
	pthread_t th;
	REQUIRE(pthread_create(&th, NULL, reader_main, &r) == 0);
	usleep(300000);

	/* The master dies; the sentinels promote the replica. */
	stop_child(master, SIGKILL);
	long long t0 = now_ms();
	int ok_at_kill = atomic_load(&r.ok);
	bool moved = false;
	while (!moved && now_ms() - t0 < 60000) {
		moved = sentinel_master(0) == replica_port;
		if (!moved)
			usleep(100000);
	}
	REQUIRE(moved);
	fprintf(stderr, "  fail-over: the sentinels named the replica after %lld ms\n", now_ms() - t0);

	/* An engine started now publishes and resolves through the new master. */
	te_engine *e2 = engine("late");
	CHECK(e2 != NULL);
	if (e2 != NULL) {
		te_segment_id s2 = te_segment_open(e2, p.name);
		CHECK(s2 > 0);
		unsigned char *l2 = aligned_alloc(4096, BUFSZ);
		REQUIRE(l2 != NULL && te_register_memory(e2, l2, BUFSZ, "cpu:0", 0) == 0);
		if (s2 > 0)
			CHECK(read_checked(e2, s2, l2, r.want));
		CHECK_EQ(te_unregister_memory(e2, l2), 0);
		free(l2);
		te_metadata_rpc_key(te_engine_name(e2), rk, sizeof rk);
		CHECK(has_key(replica_port, rk));
	}

	/* The target's keys: whatever the promoted replica had or lacked, its
	 * owner puts them back (they are deleted here to make sure it lacks them). */
	te_metadata_rpc_key(p.name, rk, sizeof rk);
	te_metadata_segment_key(p.name, sk, sizeof sk);
	char r1[64];
	redis_raw(replica_port, r1, sizeof r1, 3, "DEL", rk, sk);
	long long t1 = now_ms();
	bool back = false;
	while (!back && now_ms() - t1 < 15000) {
		back = has_key(replica_port, rk) && has_key(replica_port, sk);
		if (!back)
			usleep(100000);
	}
	CHECK(back);
	fprintf(stderr, "  the target's keys were back on the new master after %lld ms\n", now_ms() - t1);

	usleep(500000);
	atomic_store(&r.stop, 1);
	pthread_join(th, NULL);
	fprintf(stderr, "  %d reads completed across the fail-over (%d after the kill), %d failed\n",
		atomic_load(&r.ok), atomic_load(&r.ok) - ok_at_kill, atomic_load(&r.bad));
	CHECK(atomic_load(&r.ok) - ok_at_kill > 0);
	CHECK_EQ(atomic_load(&r.bad), 0);

	/* A segment opened anew is served too (descriptor from the new master). */
	CHECK_EQ(te_segment_close(e, seg), 0);
	te_segment_id s3 = te_segment_open(e, p.name);
	CHECK(s3 > 0);
	if (s3 > 0) {
		CHECK(read_checked(e, s3, r.local, r.want));
		CHECK_EQ(te_segment_close(e, s3), 0);
	}
	/* The target removes its keys on the new master as it goes. */
	CHECK_EQ(peer_quit(&p), 0);
	CHECK(!has_key(replica_port, rk) && !has_key(replica_port, sk));
	CHECK_EQ(te_unregister_memory(e, r.local), 0);
	te_engine_destroy(e2);
	te_engine_destroy(e);
	free(r.local);
	free(r.want);
}

/* Malformed connection strings are refused at open, naming the problem. */
static void case_syntax(void)
{
	static const char *const bad[] = {
		"redis-sentinel://127.0.0.1:26379",          /* no master name */
		"redis-sentinel://127.0.0.1:26379/",         /* empty master name */
		"redis-sentinel:///mymaster",                /* no sentinel */
		"redis-sentinel://127.0.0.1:0/mymaster",     /* port 0 */
		"redis-sentinel://127.0.0.1:70000/mymaster", /* port out of range */
		"redis-sentinel://::1:26379/mymaster",       /* IPv6 without brackets */
		"redis-sentinel://127.0.0.1:1,,127.0.0.1:2/m", /* empty item */
		"redis-sentinel://127.0.0.1:1/m/256",        /* database out of range */
		"redis-sentinel://127.0.0.1:1/m?x=1",        /* a query */
		"redis-sentinel://a:1,b:2,c:3,d:4,e:5,f:6,g:7,h:8,i:9/m", /* too many */
	};
	te_metadata *md = NULL;
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		int rc = te_metadata_open(bad[i], &md);
		if (rc == 0) {
			fprintf(stderr, "  accepted: %s\n", bad[i]);
			te_metadata_close(md);
		}
		CHECK_EQ(rc, -EINVAL);
	}
	/* Well formed, but no sentinel listens: refused within the timeout. */
	char none[128];
	snprintf(none, sizeof none, "redis-sentinel://127.0.0.1:%d,[::1]:%d/mymaster", free_port(), free_port());
	long long t0 = now_ms();
	int rc = te_metadata_open(none, &md);
	CHECK(rc < 0 && rc != -EINVAL);
	CHECK(now_ms() - t0 < 10000);
}

int main(int argc, char **argv)
{
	if (argc != 2 || (strcmp(argv[1], "failover") != 0 && strcmp(argv[1], "syntax") != 0)) {
		fprintf(stderr, "usage: test-md-sentinel failover|syntax\n");
		return 2;
	}
	harness_init(argv[1]);
	fprintf(stderr, "temporary directory %s\n", tmp_root);
	if (strcmp(argv[1], "failover") == 0)
		case_failover();
	else
		case_syntax();
	harness_passed = check_failures == 0;
	return check_done();
}
