/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Chaos soak: an initiator moves a steady stream of mixed READ and WRITE
 * batches, each with a 200 ms deadline, to a target over RDMA (software
 * verbs) with TCP installed beside it, while the target's RDMA port goes
 * down and up and the target engine is destroyed and made again on the
 * same port (its memory, kept by the test, registered again). Asserted:
 *  - no batch outlives its deadline by more than SLACK_MS;
 *  - no byte is wrong: each region of the target holds a pattern of a
 *    known version once a WRITE of it completed; a READ that completes
 *    must show that version (a region whose WRITE failed is unknown until
 *    a later WRITE completes, after the failed one settled);
 *  - with the port down the tasks go on over TCP: no task fails unless
 *    the target went away while its batch ran or had not been back for
 *    RECOVER_MS when it was submitted, no gap without a completed
 *    task while the target is up, and both transports carried bytes;
 *  - after a restart a batch completes within RECOVER_MS;
 *  - first of all, with RDMA unusable from the start (the target's port
 *    down before the first transfer), the first batch completes over TCP.
 * CHAOS_SECONDS sets the length (20 s; docs/reliability.md has the longer
 * command).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <te/te.h>

#include "../common/check.h"
#include "../rdma/rdma-util.h"

/* ThreadSanitizer slows every thread of the test, the timer's included,
 * several times over: 207 ms once with other builds beside it. */
#if defined(__SANITIZE_THREAD__)
#define SLACK_MS 300
#define RECOVER_MS 1500
#elif defined(__SANITIZE_ADDRESS__)
#define SLACK_MS 150
#define RECOVER_MS 1500
#else
#define SLACK_MS 20
#define RECOVER_MS 100
#endif

#define REGION (64u << 10)
#define NREG 64
#define PER_BATCH 8
#define DEADLINE_MS 200

static unsigned char *tbuf; /* the target's memory, kept across restarts */
static unsigned char *ibuf;
static char tname[64];
static char tport[16];

static pthread_mutex_t tlock = PTHREAD_MUTEX_INITIALIZER;
static te_engine *target;
static atomic_int target_up;
static _Atomic int64_t target_back_ns; /* when it was last made again */
static atomic_int stop;
static atomic_int port_downs, restarts, stalls;
static atomic_int away; /* restarts begun: odd while the target is away */

static int64_t now_ns(void)
{
	return te_now_ns();
}

static te_engine *make_target(void)
{
	/* Both transports installed as the engine is made, as a target
	 * restarted by its operator is: no peer sees it without them. */
	const char *extra[] = { "rpc_port", tport, "transports", "rdma,tcp", "TE_RDMA_DEVICES", "mlx5_2", NULL };
	te_engine *e = soft_engine_at("127.0.0.1", "two-socket", NULL, extra);
	REQUIRE(e != NULL);
	REQUIRE(te_register_memory(e, tbuf, (size_t)NREG * REGION, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
	return e;
}

static void *chaos_main(void *arg)
{
	(void)arg;
	for (unsigned k = 0; !atomic_load(&stop); k++) {
		usleep(700 * 1000);
		if (atomic_load(&stop))
			break;
		if (k % 3 == 2) {
			/* RDMA stops answering for 500 ms (every request the
			 * initiator's device executes waits 10 s, and is flushed
			 * when its queue pair goes to error): tasks end at their
			 * deadline, WRITEs posted stay unsettled until their flush. */
			atomic_fetch_add(&away, 1);
			CHECK_EQ(soft_set_latency("mlx5_0", 10 * 1000 * 1000), 0);
			atomic_fetch_add(&stalls, 1);
			usleep(500 * 1000);
			CHECK_EQ(soft_set_latency("mlx5_0", 0), 0);
			atomic_store(&target_back_ns, now_ns());
			atomic_fetch_add(&away, 1);
		} else if (k % 3 == 0) {
			/* Every RDMA port of the target down for 400 ms. */
			CHECK_EQ(soft_set_link("mlx5_2", 0), 0);
			atomic_fetch_add(&port_downs, 1);
			usleep(400 * 1000);
			CHECK_EQ(soft_set_link("mlx5_2", 1), 0);
		} else {
			/* The target goes away and comes back under its name. */
			pthread_mutex_lock(&tlock);
			atomic_fetch_add(&away, 1);
			atomic_store(&target_up, 0);
			if (getenv("TEST_VERBOSE"))
				fprintf(stderr, "restart\n");
			te_engine_destroy(target);
			usleep(200 * 1000);
			target = make_target();
			atomic_store(&target_back_ns, now_ns());
			atomic_store(&target_up, 1);
			atomic_fetch_add(&away, 1);
			pthread_mutex_unlock(&tlock);
			atomic_fetch_add(&restarts, 1);
		}
	}
	return NULL;
}

/* The bytes a transport moved, from te_transfer_bytes_total's samples. */
static uint64_t metric_bytes(const char *text, const char *transport)
{
	uint64_t sum = 0;
	char want[64];
	snprintf(want, sizeof want, "transport=\"%s\"", transport);
	for (const char *l = text; l != NULL && *l != '\0';) {
		const char *nl = strchr(l, '\n');
		size_t n = nl ? (size_t)(nl - l) : strlen(l);
		if (strncmp(l, "te_transfer_bytes_total{", 24) == 0) {
			char line[512];
			snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line - 1 ? n : sizeof line - 1), l);
			const char *sp = strrchr(line, ' ');
			if (strstr(line, want) != NULL && sp != NULL)
				sum += strtoull(sp + 1, NULL, 10);
		}
		l = nl ? nl + 1 : NULL;
	}
	return sum;
}

static void pattern(unsigned char *p, unsigned region, unsigned version)
{
	uint32_t x = region * 2654435761u ^ version * 40503u;
	for (size_t i = 0; i < REGION; i += 4) {
		x = x * 1103515245u + 12345u;
		memcpy(p + i, &x, 4);
	}
}

static void test_chaos(void)
{
	const char *v = getenv("CHAOS_SECONDS");
	int secs = v ? atoi(v) : 20;
	tbuf = aligned_alloc(4096, (size_t)NREG * REGION);
	ibuf = aligned_alloc(4096, (size_t)NREG * REGION);
	REQUIRE(tbuf && ibuf);
	memset(tbuf, 0, (size_t)NREG * REGION);

	/* A free port for the target's RPC, kept across its restarts. */
	te_engine *probe = soft_engine_at("127.0.0.1", "two-socket", "{\"devices\": [\"mlx5_2\"]}", NULL);
	REQUIRE(probe != NULL);
	snprintf(tport, sizeof tport, "%d", te_engine_rpc_port(probe));
	te_engine_destroy(probe);
	target = make_target();
	snprintf(tname, sizeof tname, "%s", te_engine_name(target));
	atomic_store(&target_up, 1);

	te_engine *ini = soft_engine_at("127.0.0.1", "two-socket", "{\"devices\": [\"mlx5_0\"]}", NULL);
	REQUIRE(ini != NULL);
	REQUIRE(te_transport_install(ini, "tcp", NULL) == 0);
	REQUIRE(te_register_memory(ini, ibuf, (size_t)NREG * REGION, "cpu:0", 0) == 0);
	te_segment_id seg = te_segment_open(ini, tname);
	REQUIRE(seg > 0);

	/* RDMA unusable from the start (the target's port down before the
	 * first transfer): the first batch completes over TCP all the same. */
	CHECK_EQ(soft_set_link("mlx5_2", 0), 0);
	{
		te_batch_id b0;
		te_request r0[PER_BATCH];
		for (unsigned k = 0; k < PER_BATCH; k++) {
			pattern(ibuf + (size_t)k * REGION, k, 0);
			r0[k] = (te_request){ TE_OP_WRITE, seg, ibuf + (size_t)k * REGION,
					      (uintptr_t)(tbuf + (size_t)k * REGION), REGION };
		}
		REQUIRE(te_batch_alloc(ini, PER_BATCH, &b0) == 0);
		CHECK_EQ(te_submit_by(ini, b0, r0, PER_BATCH, now_ns() + 2000 * 1000000LL), 0);
		CHECK_EQ(te_batch_wait(ini, b0, 5000), 0);
		int32_t st0 = -1;
		CHECK_EQ(te_batch_status(ini, b0, NULL, NULL, &st0), 0);
		CHECK_EQ(st0, TE_TASK_COMPLETED);
		CHECK(memcmp(ibuf, tbuf, (size_t)PER_BATCH * REGION) == 0);
		CHECK_EQ(te_batch_free(ini, b0), 0);
	}
	CHECK_EQ(soft_set_link("mlx5_2", 1), 0);

	int version[NREG]; /* the version a region holds, -1: unknown */
	for (int i = 0; i < NREG; i++)
		version[i] = -1;
	unsigned next_version = 1, seed = 12345;
	uint64_t rounds = 0, tasks_ok = 0, tasks_failed = 0, reads_checked = 0, unsettled_waits = 0;
	uint64_t steady_failed = 0;
	int64_t worst_late = 0, worst_recover = 0, last_ok = now_ns(), longest_gap = 0;
	int64_t seen_back = 0;

	pthread_t th;
	REQUIRE(pthread_create(&th, NULL, chaos_main, NULL) == 0);
	int64_t end = now_ns() + (int64_t)secs * 1000000000;
	while (now_ns() < end) {
		te_batch_id b;
		REQUIRE(te_batch_alloc(ini, PER_BATCH, &b) == 0);
		te_request r[PER_BATCH];
		unsigned reg[PER_BATCH], ver[PER_BATCH];
		unsigned used = 0;
		for (unsigned k = 0; k < PER_BATCH; k++) {
			unsigned g;
			bool dup;
			do { /* distinct regions per batch */
				seed = seed * 1103515245u + 12345u;
				g = (seed >> 8) % NREG;
				dup = false;
				for (unsigned j = 0; j < k; j++)
					dup |= reg[j] == g;
			} while (dup);
			reg[k] = g;
			bool rd = version[g] >= 0 && ((seed >> 20) & 1);
			ver[k] = rd ? (unsigned)version[g] : next_version++;
			if (!rd)
				pattern(ibuf + (size_t)g * REGION, g, ver[k]);
			else
				memset(ibuf + (size_t)g * REGION, 0xee, REGION);
			r[k] = (te_request){ rd ? TE_OP_READ : TE_OP_WRITE, seg, ibuf + (size_t)g * REGION,
					     (uintptr_t)(tbuf + (size_t)g * REGION), REGION };
			used++;
		}
		int away0 = atomic_load(&away);
		int64_t t_submit = now_ns();
		int64_t dl = t_submit + (int64_t)DEADLINE_MS * 1000000;
		int rc = te_submit_by(ini, b, r, used, dl);
		CHECK(rc >= 0);
		CHECK_EQ(te_batch_wait(ini, b, DEADLINE_MS + 5000), 0);
		int64_t late = (now_ns() - dl) / 1000000;
		if (late > worst_late)
			worst_late = late;
		if (late > SLACK_MS && getenv("TEST_VERBOSE"))
			for (unsigned k = 0; k < used; k++) {
				te_task_info ti = { .size = sizeof ti };
				te_get_task_info(ini, b, k, &ti);
				fprintf(stderr, "late by %lld ms: %s %s flags %u (stalls %d, port downs %d, away %d)\n",
					(long long)late, r[k].opcode == TE_OP_READ ? "READ" : "WRITE",
					te_strerror(ti.error), ti.flags, atomic_load(&stalls),
					atomic_load(&port_downs), atomic_load(&away));
			}
		bool any_ok = false, any_unsettled = false;
		/* The target stayed up the whole time, and was back for long
		 * enough to have been seen again (a peer lost is fetched again
		 * at most every 50 ms): nothing may fail. */
		bool steady = away0 % 2 == 0 && atomic_load(&away) == away0 &&
			      t_submit - atomic_load(&target_back_ns) >= (int64_t)RECOVER_MS * 1000000;
		for (unsigned k = 0; k < used; k++) {
			te_task_info ti = { .size = sizeof ti };
			CHECK_EQ(te_get_task_info(ini, b, k, &ti), 0);
			unsigned g = reg[k];
			if (ti.state == TE_TASK_COMPLETED) {
				tasks_ok++;
				any_ok = true;
				if (r[k].opcode == TE_OP_WRITE) {
					version[g] = (int)ver[k];
				} else {
					unsigned char want[REGION];
					pattern(want, g, ver[k]);
					CHECK(memcmp(ibuf + (size_t)g * REGION, want, REGION) == 0);
					reads_checked++;
				}
			} else {
				tasks_failed++;
				if (steady)
					steady_failed++;
				if (getenv("TEST_VERBOSE") && atomic_load(&target_up))
					fprintf(stderr, "%lld: task %s failed while the target is up: %s%s\n",
						(long long)(now_ns() / 1000000 % 100000),
						r[k].opcode == TE_OP_READ ? "READ" : "WRITE", te_strerror(ti.error),
						(ti.flags & TE_TASK_ENDED_EARLY) ? " (ended early)" : "");
				if (r[k].opcode == TE_OP_WRITE) {
					version[g] = -1; /* it may or may not have landed */
					any_unsettled |= (ti.flags & TE_TASK_UNSETTLED) != 0;
				}
			}
		}
		if (any_unsettled) {
			/* A later WRITE of the region must not be overtaken by this
			 * one: wait until it cannot land any more. */
			unsettled_waits++;
			if (te_batch_wait_settled(ini, b, 10000) != 0) {
				CHECK(!"a WRITE stayed unsettled for 10 s");
				for (unsigned k = 0; k < used; k++)
					if (r[k].opcode == TE_OP_WRITE)
						version[reg[k]] = -2; /* never again */
			}
		}
		int64_t now = now_ns();
		if (any_ok) {
			int64_t back = atomic_load(&target_back_ns);
			if (back != 0 && back != seen_back && t_submit >= back) {
				/* The first completion of a batch submitted since the
				 * target came back (one in flight when it went away ends
				 * at its deadline: the lateness bound's to check). */
				int64_t rec = (now - back) / 1000000;
				if (getenv("TEST_VERBOSE"))
					fprintf(stderr, "recovered %lld ms after a restart\n", (long long)rec);
				if (rec > worst_recover)
					worst_recover = rec;
				seen_back = back;
			}
			if (atomic_load(&away) % 2 == 0 && now - last_ok > longest_gap)
				longest_gap = now - last_ok;
			last_ok = now;
		} else {
			if (atomic_load(&away) % 2 == 1)
				last_ok = now; /* a gap while it is away or stalled is expected */
			usleep(1000); /* bounded: a failing path does not spin */
		}
		for (unsigned k = 0; k < used; k++)
			if (version[reg[k]] == -2)
				version[reg[k]] = -1; /* left unknown */
		CHECK_EQ(te_batch_free(ini, b), 0);
		rounds++;
	}
	atomic_store(&stop, 1);
	pthread_join(th, NULL);
	printf("chaos: %d s, %llu batches, %llu tasks completed, %llu failed (%llu with the target up), %llu "
	       "reads checked, %d port downs, %d restarts, %d stalls, %llu waits for unsettled writes; worst "
	       "lateness %lld ms, worst recovery after a restart or stall %lld ms, longest gap %lld ms\n",
	       secs, (unsigned long long)rounds, (unsigned long long)tasks_ok, (unsigned long long)tasks_failed,
	       (unsigned long long)steady_failed,
	       (unsigned long long)reads_checked, atomic_load(&port_downs), atomic_load(&restarts),
	       atomic_load(&stalls),
	       (unsigned long long)unsettled_waits, (long long)worst_late, (long long)worst_recover,
	       (long long)(longest_gap / 1000000));
	CHECK(worst_late <= SLACK_MS);
	CHECK_EQ(steady_failed, 0);
	/* Both transports carried the initiator's bytes. */
	char *text = NULL;
	size_t tlen = 0;
	REQUIRE(te_metrics_text(ini, &text, &tlen) == 0);
	CHECK(strstr(text, "transport=\"rdma\"") != NULL && strstr(text, "transport=\"tcp\"") != NULL);
	CHECK(metric_bytes(text, "rdma") > 0 && metric_bytes(text, "tcp") > 0);
	te_free(text);
	CHECK(worst_recover <= RECOVER_MS);
	CHECK(longest_gap / 1000000 <= DEADLINE_MS + RECOVER_MS + SLACK_MS);
	CHECK(tasks_ok > 0 && reads_checked > 0);
	CHECK((atomic_load(&port_downs) > 0 && atomic_load(&restarts) > 0) || secs < 2);

	CHECK_EQ(te_segment_close(ini, seg), 0);
	te_unregister_memory(ini, ibuf);
	te_engine_destroy(ini);
	te_engine_destroy(target);
	free(tbuf);
	free(ibuf);
}

int main(void)
{
	find_controls();
	TEST_RUN(test_chaos);
	return check_done();
}
