/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One request at a time: a thread that submits a small request to an idle
 * connection sends it itself and, when it waits, receives the reply itself
 * (plugins/transport/tcp/tcp-conn-caller.c). These tests mix that with what the
 * I/O threads keep: deep batches, requests nobody waits for, a wait from
 * another thread, status polls, several callers on one connection, and the
 * spin option; every byte and every completion is checked.
 */
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include <te/te.h>

#include "tcp-test.h"

enum { AREA = 4u << 20 }; /* bytes of each side's buffer per thread */

static void pair_up(pair *p, const te_option *o, size_t n, unsigned threads)
{
	pair_open(p, (size_t)threads * AREA, o, n, (size_t)threads * AREA, o, n);
}

/* A length of round `i`: mostly small, now and then above the 1 MiB slice
 * (which goes through the backlog as before). */
static size_t len_of(unsigned i, unsigned id)
{
	unsigned k = (i * 2654435761u + id * 40503u) >> 7;
	switch (k % 8) {
	case 0: return 1 + k % 64;
	case 1: case 2: case 3: return 4096;
	case 4: return 1 + k % 70000;
	case 5: return 1u << 20;
	case 6: return (1u << 20) + 1 + k % 100000; /* two slices */
	default: return 65536;
	}
}

/* Waits for `b` from a thread of its own (style 3). */
typedef struct waiter {
	te_engine *e;
	te_batch_id b;
	int rc;
} waiter;

static void *wait_main(void *arg)
{
	waiter *w = arg;
	w->rc = te_batch_wait(w->e, w->b, 30000);
	return NULL;
}

static bool finish(pair_job *j, te_batch_id b, size_t n)
{
	pair *p = j->p;
	if (j->style == 1) {
		int32_t state = TE_TASK_PENDING;
		long long end = now_ms() + 30000;
		while (now_ms() < end) {
			if (te_batch_status(p->a, b, NULL, NULL, &state) != 0)
				return false;
			if (state == TE_TASK_COMPLETED || state == TE_TASK_FAILED)
				break;
			usleep(20);
		}
	} else if (j->style == 3) {
		waiter w = { p->a, b, -1 };
		pthread_t t;
		if (pthread_create(&t, NULL, wait_main, &w) != 0)
			return false;
		pthread_join(t, NULL);
		if (w.rc != 0)
			return false;
	} else if (te_batch_wait(p->a, b, 30000) != 0) {
		return false;
	}
	for (size_t i = 0; i < n; i++) {
		te_task_status st;
		if (te_get_status(p->a, b, i, &st) != 0 || st.state != TE_TASK_COMPLETED)
			return false;
	}
	return true;
}

static void *job_main(void *arg)
{
	pair_job *j = arg;
	pair *p = j->p;
	unsigned char *la = p->abuf + (size_t)j->id * AREA, *rb = p->bbuf + (size_t)j->id * AREA;
	enum { DEEP = 32 };
	te_request r[DEEP];

	for (unsigned i = 0; i < j->rounds; i++) {
		uint32_t op = (i + j->id) % 2 ? TE_OP_WRITE : TE_OP_READ;
		size_t n = j->style == 2 ? DEEP : 1, off = 0;
		for (size_t k = 0; k < n; k++) {
			size_t len = j->style == 2 ? 65536 + k : len_of(i, j->id);
			r[k] = (te_request){ op, p->seg, la + off, (uintptr_t)(rb + off) + 3, len };
			off += len + 7;
		}
		unsigned seed = i * 7919u + j->id;
		if (op == TE_OP_WRITE) {
			fill_pattern(la, off, seed);
		} else {
			fill_pattern(rb + 3, off, seed);
			memset(la, 0, off);
		}
		te_batch_id b;
		if (te_batch_alloc(p->a, n, &b) != 0) {
			j->failed++;
			return NULL;
		}
		bool ok = te_submit(p->a, b, r, n) == 0 && finish(j, b, n);
		te_batch_free(p->a, b);
		if (!ok) {
			j->failed++;
			return NULL;
		}
		for (size_t k = 0; k < n; k++)
			j->bad += memcmp(r[k].local, (void *)(uintptr_t)r[k].remote, r[k].length) != 0;
	}
	return NULL;
}

/* Callers in every style at once, against one peer. A job's style: 0: wait,
 * 1: poll te_batch_status, 2: deep batches, 3: another thread waits. */
static void mixed(const te_option *o, size_t no, unsigned rounds)
{
	enum { T = 6 };
	static const int styles[T] = { 0, 0, 0, 1, 2, 3 };
	pair p;
	pair_up(&p, o, no, T);
	pair_job jobs[T];
	for (unsigned i = 0; i < T; i++)
		jobs[i] = (pair_job){ &p, i, styles[i] == 2 ? rounds / 8 : rounds, styles[i], 0, 0 };
	pair_jobs_run(job_main, jobs, T);
	pair_down(&p);
}

static void test_mixed_default(void)
{
	mixed(NULL, 0, 400);
}

/* One connection for everybody: callers and the I/O thread take turns on it. */
static void test_mixed_one_connection(void)
{
	te_option o[] = { { "TE_TCP_CONNS_PER_PEER", "1" }, { "TE_TCP_THREADS", "1" } };
	mixed(o, 2, 400);
}

static void test_mixed_spin(void)
{
	te_option o[] = { { "TE_SPIN_US", "30" } };
	mixed(o, 1, 300);
}

/* The usual path only (TE_TCP_DIRECT=0) still works. */
static void test_mixed_no_direct(void)
{
	te_option o[] = { { "TE_TCP_DIRECT", "0" } };
	mixed(o, 1, 200);
}

/* Reads of `len` bytes, one at a time, each waited for with zero timeouts
 * only: after `sleep_us` (then the first look must find it done: the
 * submitter sent it, never waited, and the I/O thread took the reply), or at
 * once and again and again (the caller collects what is there and never
 * sleeps) until it completes. */
static void zero_timeout_reads(int rounds, size_t len, unsigned sleep_us)
{
	pair p;
	pair_up(&p, NULL, 0, 1);
	for (int i = 0; i < rounds; i++) {
		fill_pattern(p.bbuf, len, (unsigned)i + (unsigned)len);
		te_request r = { TE_OP_READ, p.seg, p.abuf, (uintptr_t)p.bbuf, len };
		te_batch_id b;
		REQUIRE(te_batch_alloc(p.a, 1, &b) == 0);
		CHECK_EQ(te_submit(p.a, b, &r, 1), 0);
		int rc;
		if (sleep_us > 0) {
			usleep(sleep_us);
			rc = te_batch_wait(p.a, b, 0);
		} else {
			long long end = now_ms() + 10000;
			while ((rc = te_batch_wait(p.a, b, 0)) == -ETIMEDOUT && now_ms() < end)
				;
		}
		CHECK_EQ(rc, 0);
		CHECK(memcmp(p.abuf, p.bbuf, len) == 0);
		te_batch_free(p.a, b);
	}
	pair_down(&p);
}

static void test_submit_and_leave(void)
{
	zero_timeout_reads(20, 4096, 30000);
}

static void test_zero_timeout_polls(void)
{
	zero_timeout_reads(50, 65536, 0);
}

/* A wait shorter than its request returns -ETIMEDOUT (or 0, on a machine
 * fast enough) and leaves the request going; the next wait finishes it. */
static void test_short_timeout(void)
{
	pair p;
	pair_up(&p, NULL, 0, 8);
	te_request r = { TE_OP_READ, p.seg, p.abuf, (uintptr_t)p.bbuf, 16u << 20 };
	te_batch_id b;
	REQUIRE(te_batch_alloc(p.a, 1, &b) == 0);
	CHECK_EQ(te_submit(p.a, b, &r, 1), 0);
	int rc = te_batch_wait(p.a, b, 1);
	CHECK(rc == -ETIMEDOUT || rc == 0);
	CHECK_EQ(te_batch_wait(p.a, b, 30000), 0);
	te_task_status st;
	CHECK_EQ(te_get_status(p.a, b, 0, &st), 0);
	CHECK_EQ(st.state, TE_TASK_COMPLETED);
	te_batch_free(p.a, b);
	pair_down(&p);
}

/* Sleeps (voluntary switches), wake-ups (voluntary and involuntary
 * switches) and CPU clock ticks of this process's TCP I/O threads so far. */
static void io_threads_usage(long *sleeps, long *switches, long *ticks)
{
	*sleeps = *switches = *ticks = 0;
	DIR *d = opendir("/proc/self/task");
	REQUIRE(d != NULL);
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		if (de->d_name[0] == '.')
			continue;
		char path[300], comm[32] = "", line[256];
		snprintf(path, sizeof path, "/proc/self/task/%s/comm", de->d_name);
		FILE *f = fopen(path, "r");
		if (f == NULL)
			continue; /* ended meanwhile */
		bool io = fgets(comm, sizeof comm, f) != NULL && strncmp(comm, "te-tcp", 6) == 0;
		fclose(f);
		if (!io)
			continue;
		snprintf(path, sizeof path, "/proc/self/task/%s/status", de->d_name);
		if ((f = fopen(path, "r")) != NULL) {
			long v;
			while (fgets(line, sizeof line, f) != NULL) {
				if (sscanf(line, "voluntary_ctxt_switches: %ld", &v) == 1) {
					*sleeps += v;
					*switches += v;
				} else if (sscanf(line, "nonvoluntary_ctxt_switches: %ld", &v) == 1) {
					*switches += v;
				}
			}
			fclose(f);
		}
		snprintf(path, sizeof path, "/proc/self/task/%s/stat", de->d_name);
		if ((f = fopen(path, "r")) != NULL) {
			unsigned long ut = 0, st = 0;
			/* after the ")" that ends the name: state is field 3, utime 14 */
			if (fgets(line, sizeof line, f) != NULL) {
				char *p = strrchr(line, ')');
				if (p != NULL && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
							 &ut, &st) == 2)
					*ticks += (long)(ut + st);
			}
			fclose(f);
		}
	}
	closedir(d);
}

/* Times the calling thread slept (voluntary context switches) over
 * `rounds` 4 KiB reads waited for one at a time, with both engines at
 * TE_SPIN_US=`spin`; in *io, how often the I/O threads slept meanwhile. */
static long sleeps_over_reads(const char *spin, int rounds, long *io)
{
	long io0, io1, sw, ticks;
	te_option o[] = { { "TE_SPIN_US", spin } };
	pair p;
	pair_up(&p, o, 1, 1);
	te_request r = { TE_OP_READ, p.seg, p.abuf, (uintptr_t)p.bbuf, 4096 };
	struct rusage a, z;
	for (int i = -20; i < rounds; i++) { /* 20 first: connected, learned */
		if (i == 0) {
			getrusage(RUSAGE_THREAD, &a);
			io_threads_usage(&io0, &sw, &ticks);
		}
		te_batch_id b;
		REQUIRE(te_batch_alloc(p.a, 1, &b) == 0);
		CHECK_EQ(te_submit(p.a, b, &r, 1), 0);
		CHECK_EQ(te_batch_wait(p.a, b, 10000), 0);
		te_batch_free(p.a, b);
	}
	getrusage(RUSAGE_THREAD, &z);
	io_threads_usage(&io1, &sw, &ticks);
	pair_down(&p);
	*io = io1 - io0;
	return z.ru_nvcsw - a.ru_nvcsw;
}

/* TE_SPIN_US=0 never spins: a waiting caller sleeps for many replies, and
 * the I/O threads sleep between requests (their wake-up takes longer than
 * the caller's way to its own sleep; a reply that is back before the caller
 * looks is found without one: 40-60 % of them here, but a slow caller under
 * ThreadSanitizer slept for only 9 of 200 once, while the I/O threads slept
 * 356 times). Set to 1000, the caller finds nearly every reply while it
 * looks and the I/O threads never sleep (none slept here), so the sum of
 * both counts tells the two apart on a slow host too. */
static void test_spin_off(void)
{
	enum { ROUNDS = 200 };
	long io_off, io_on;
	long off = sleeps_over_reads("0", ROUNDS, &io_off);
	long on = sleeps_over_reads("1000", ROUNDS, &io_on);
	fprintf(stderr, "  sleeps over %d waits: %ld with TE_SPIN_US=0, %ld with 1000; the I/O threads' %ld, %ld\n",
		ROUNDS, off, on, io_off, io_on);
	CHECK(off + io_off >= ROUNDS / 2);
	CHECK(on + io_on < (off + io_off) / 4);
	/* Looking, the target's I/O thread never sleeps between requests, and
	 * the initiator's is never woken: the caller reads its own reply with
	 * the connection muted in that thread's epoll set, and asks for no
	 * timeout check it would be woken for. */
	CHECK(io_on <= ROUNDS / 5);
}

/* The target's I/O thread looks for the next request after serving one
 * (adaptive by default); once requests stop it must stop looking: over
 * half a second after a burst the I/O threads neither wake nor burn CPU. A
 * thread that kept looking would show as CPU time on an idle machine and
 * as switches (each look yields) on a busy one. */
static void test_spin_backs_off(void)
{
	pair p;
	pair_up(&p, NULL, 0, 1);
	te_request r = { TE_OP_READ, p.seg, p.abuf, (uintptr_t)p.bbuf, 4096 };
	for (int i = 0; i < 300; i++) {
		te_batch_id b;
		REQUIRE(te_batch_alloc(p.a, 1, &b) == 0);
		CHECK_EQ(te_submit(p.a, b, &r, 1), 0);
		CHECK_EQ(te_batch_wait(p.a, b, 10000), 0);
		te_batch_free(p.a, b);
	}
	usleep(300000); /* the last timeout checks after the burst are done */
	long v0, s0, t0, v1, s1, t1;
	io_threads_usage(&v0, &s0, &t0);
	usleep(500000);
	io_threads_usage(&v1, &s1, &t1);
	fprintf(stderr, "  idle I/O threads over 0.5 s: %ld switches, %ld clock ticks\n", s1 - s0, t1 - t0);
	CHECK(s1 - s0 <= 10);
	CHECK(t1 - t0 <= sysconf(_SC_CLK_TCK) / 10);
	pair_down(&p);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	TEST_RUN(test_submit_and_leave);
	TEST_RUN(test_zero_timeout_polls);
	TEST_RUN(test_short_timeout);
	TEST_RUN(test_mixed_default);
	TEST_RUN(test_mixed_one_connection);
	TEST_RUN(test_mixed_spin);
	TEST_RUN(test_mixed_no_direct);
	TEST_RUN(test_spin_off);
	TEST_RUN(test_spin_backs_off);
	return check_done();
}
