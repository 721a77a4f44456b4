/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te-idle-cost: what an idle engine costs its host.
 *
 * Starts one engine (the one measured) and N peers, each in a process of its
 * own; the measured engine opens every peer and the peers open it, and each
 * side writes a block to the other and reads it back (every byte checked).
 * Then nothing happens: after a settling time the tool samples the measured
 * process's threads in /proc over a window and prints, per thread, its
 * wake-ups per second (voluntary + involuntary context switches) and CPU
 * time, with the totals, threads, descriptors and RSS. With --max-wakeups or
 * --max-cpu it exits 1 when the engine exceeds them (the suite's bound).
 *
 * Wake-ups are the figure to assert on a shared machine: a thread that sleeps
 * until there is work switches the same number of times however loaded the
 * machine is, while CPU time spent also depends on caches and clocks.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <te/te.h>

#include "teu-proc.h"

#define BLOCK (64u << 10)
#define MAX_PEERS 64
#define MAX_THREADS 512

static void die(const char *what)
{
	fprintf(stderr, "te-idle-cost: %s\n", what);
	exit(2);
}

/* ------------------------------------------------------------ children */

/* One block to or from `seg` at `off` of its first buffer, then back. */
static int exchange(te_engine *e, te_segment_id seg, char *local, uint64_t off, unsigned seed)
{
	te_segment_buffer rb;
	if (te_segment_buffers(e, seg, &rb, 1) < 1 || rb.length < off + BLOCK)
		return -EINVAL;
	for (unsigned i = 0; i < BLOCK; i++)
		local[i] = (char)(seed * 131 + i * 7);
	for (int op = TE_OP_WRITE; op >= TE_OP_READ; op--) {
		char *buf = local + (op == TE_OP_READ ? BLOCK : 0);
		if (op == TE_OP_READ)
			memset(buf, 0, BLOCK);
		te_batch_id b;
		te_request r = { (uint32_t)op, seg, buf, rb.addr + off, BLOCK };
		int rc = te_batch_alloc(e, 1, &b);
		if (rc < 0)
			return rc;
		rc = te_submit(e, b, &r, 1);
		if (rc >= 0)
			rc = te_batch_wait(e, b, 30000);
		te_task_status st = { 0 };
		if (rc >= 0)
			rc = te_get_status(e, b, 0, &st);
		te_batch_free(e, b);
		if (rc < 0)
			return rc;
		if (st.state != TE_TASK_COMPLETED)
			return st.error ? st.error : -EIO;
	}
	return memcmp(local, local + BLOCK, BLOCK) == 0 ? 0 : -EBADMSG;
}

/* Reads commands on `in`, answers on `out`:
 *   open NAME TRANSPORT SLOT   open NAME ("any": the engine's choice), move a block
 *   quit                       destroy the engine and exit */
static int child(int in, int out, const char *transports)
{
	te_option opt[] = { { "transports", transports } };
	te_engine *e;
	void *mem;
	char line[512];

	if (te_engine_create("P2PHANDSHAKE", "127.0.0.1", opt, 1, &e) < 0)
		return 1;
	/* Shared memory, so that the same-host transport can serve it: a slot
	 * for each peer to write into, then the two local blocks. */
	const size_t len = (MAX_PEERS + 3) * (size_t)BLOCK;
	if (te_mem_alloc(len, &mem) < 0 || te_register_memory(e, mem, len, "cpu:0", TE_MEM_REMOTE_ACCESS) < 0)
		return 1;
	char *local = (char *)mem + (MAX_PEERS + 1) * (size_t)BLOCK;
	FILE *fin = fdopen(in, "r");
	if (fin == NULL)
		return 1;
	dprintf(out, "%s\n", te_engine_name(e));
	while (fgets(line, sizeof line, fin) != NULL) {
		char name[256], tp[32];
		unsigned slot;
		if (sscanf(line, "open %255s %31s %u", name, tp, &slot) == 3 && slot <= MAX_PEERS) {
			te_segment_id s = strcmp(tp, "any") == 0 ? te_segment_open(e, name) :
								   te_segment_open_with(e, name, tp);
			int rc = s < 0 ? s : exchange(e, s, local, (uint64_t)slot * BLOCK, slot + 1);
			if (rc < 0)
				dprintf(out, "error %s: %s\n", name, te_strerror(rc));
			else
				dprintf(out, "ok %s\n", te_segment_transport(e, s));
		} else {
			break;
		}
	}
	te_engine_destroy(e);
	te_mem_free(mem);
	fclose(fin);
	return 0;
}

typedef struct proc {
	pid_t pid;
	FILE *cmd, *resp;
	char name[256];
} proc;

static void spawn(proc *p, const char *transports)
{
	int c2p[2], p2c[2];

	if (pipe(c2p) < 0 || pipe(p2c) < 0)
		die("pipe");
	fflush(NULL);
	p->pid = fork();
	if (p->pid < 0)
		die("fork");
	if (p->pid == 0) {
		close(c2p[0]);
		close(p2c[1]);
		_exit(child(p2c[0], c2p[1], transports));
	}
	close(c2p[1]);
	close(p2c[0]);
	p->cmd = fdopen(p2c[1], "w");
	p->resp = fdopen(c2p[0], "r");
	if (p->cmd == NULL || p->resp == NULL)
		die("fdopen");
	setvbuf(p->cmd, NULL, _IOLBF, 0);
}

/* Closes its pipes and waits for it; 1 when it did not exit cleanly. */
static int finish(proc *p)
{
	int st;

	fclose(p->cmd);
	fclose(p->resp);
	if (waitpid(p->pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "te-idle-cost: process %d did not end cleanly\n", (int)p->pid);
		return 1;
	}
	return 0;
}

static void answer(proc *p, char *buf, size_t size, const char *what)
{
	if (fgets(buf, (int)size, p->resp) == NULL) {
		fprintf(stderr, "te-idle-cost: process %d ended while %s\n", (int)p->pid, what);
		exit(2);
	}
	buf[strcspn(buf, "\n")] = '\0';
}

/* ------------------------------------------------------------- sampling */

typedef struct thr {
	int tid;
	char comm[32];
	unsigned long long ctx;   /* voluntary + involuntary switches */
	unsigned long long ticks; /* utime + stime */
	bool seen;
} thr;

typedef struct sample {
	thr t[MAX_THREADS];
	int n;
	unsigned long long ticks; /* the whole process, exited threads included */
	double at;
	int fds;
	int tcp;                  /* established TCP connections among them */
	long rss_kb;
} sample;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* utime + stime from a stat line (fields 14 and 15, after the ")" of comm). */
static unsigned long long stat_ticks(const char *path)
{
	char buf[1024];
	unsigned long long ut = 0, st = 0;
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return 0;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	char *p = strrchr(buf, ')');
	if (p == NULL || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
		return 0;
	return ut + st;
}

static void take(pid_t pid, sample *s)
{
	char path[128], line[256];

	memset(s, 0, sizeof *s);
	s->at = now_s();
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	s->ticks = stat_ticks(path);
	snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
	DIR *d = opendir(path);
	if (d == NULL)
		die("cannot read the engine's /proc/PID/task");
	struct dirent *de;
	while ((de = readdir(d)) != NULL && s->n < MAX_THREADS) {
		if (de->d_name[0] == '.')
			continue;
		thr *t = &s->t[s->n];
		t->tid = atoi(de->d_name);
		snprintf(path, sizeof path, "/proc/%d/task/%d/comm", (int)pid, t->tid);
		FILE *f = fopen(path, "r");
		if (f == NULL)
			continue; /* exited meanwhile */
		if (fgets(t->comm, sizeof t->comm, f) == NULL)
			t->comm[0] = '\0';
		fclose(f);
		t->comm[strcspn(t->comm, "\n")] = '\0';
		snprintf(path, sizeof path, "/proc/%d/task/%d/status", (int)pid, t->tid);
		f = fopen(path, "r");
		if (f == NULL)
			continue;
		while (fgets(line, sizeof line, f) != NULL) {
			unsigned long long v;
			if (sscanf(line, "voluntary_ctxt_switches: %llu", &v) == 1 ||
			    sscanf(line, "nonvoluntary_ctxt_switches: %llu", &v) == 1)
				t->ctx += v;
		}
		fclose(f);
		snprintf(path, sizeof path, "/proc/%d/task/%d/stat", (int)pid, t->tid);
		t->ticks = stat_ticks(path);
		s->n++;
	}
	closedir(d);
	teu_proc_fds(pid, &s->fds, &s->tcp);
	s->rss_kb = teu_proc_rss_kb(pid);
}

static void usage(void)
{
	fprintf(stderr,
		"usage: te-idle-cost [--peers N] [--settle S] [--window S] [--transports LIST]\n"
		"                    [--max-wakeups W] [--max-cpu PERCENT]\n"
		"  --peers N          peers the measured engine talks to, then idles with (8; 1..%d)\n"
		"  --settle S         seconds between the last transfer and the window (3)\n"
		"  --window S         seconds sampled (60)\n"
		"  --transports LIST  installed in every engine (tcp,shm); peers open the measured\n"
		"                     engine with the engine's choice, it opens them over the first one\n"
		"  --max-wakeups W    exit 1 when the engine wakes more than W times a second\n"
		"  --max-cpu PERCENT  exit 1 when it uses more than PERCENT of a core\n"
		"  --expect-reclaim   exit 1 unless the engine's TCP connections, open after the\n"
		"                     transfers, are all closed by the window's end (run it with a\n"
		"                     short TE_TCP_IDLE_MS)\n",
		MAX_PEERS);
	exit(2);
}

int main(int argc, char **argv)
{
	int npeers = 8;
	double settle = 3, window = 60, max_wake = -1, max_cpu = -1;
	bool reclaim = false;
	const char *transports = "tcp,shm";
	static const struct option longopts[] = {
		{ "peers", required_argument, NULL, 'n' },   { "settle", required_argument, NULL, 's' },
		{ "window", required_argument, NULL, 'w' },  { "transports", required_argument, NULL, 't' },
		{ "max-wakeups", required_argument, NULL, 'W' }, { "max-cpu", required_argument, NULL, 'C' },
		{ "expect-reclaim", no_argument, NULL, 'r' }, { "help", no_argument, NULL, 'h' },          { NULL, 0, NULL, 0 },
	};
	int o;
	while ((o = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		char *end = NULL;
		switch (o) {
		case 'n': npeers = (int)strtol(optarg, &end, 10); break;
		case 's': settle = strtod(optarg, &end); break;
		case 'w': window = strtod(optarg, &end); break;
		case 't': transports = optarg; end = (char *)""; break;
		case 'W': max_wake = strtod(optarg, &end); break;
		case 'C': max_cpu = strtod(optarg, &end); break;
		case 'r': reclaim = true; end = (char *)""; break;
		default: usage();
		}
		if (end == NULL || *end != '\0')
			usage();
	}
	if (optind != argc || npeers < 1 || npeers > MAX_PEERS || settle < 0 || window < 1)
		usage();
	char first[32];
	snprintf(first, sizeof first, "%.*s", (int)strcspn(transports, ","), transports);
	signal(SIGPIPE, SIG_IGN);

	/* Processes first, engines inside them: this one stays single-threaded. */
	static proc ps[MAX_PEERS + 1];
	char buf[512];
	for (int i = 0; i <= npeers; i++)
		spawn(&ps[i], transports);
	for (int i = 0; i <= npeers; i++) {
		answer(&ps[i], ps[i].name, sizeof ps[i].name, "starting its engine");
		if (strchr(ps[i].name, ' ') != NULL || ps[i].name[0] == '\0')
			die("an engine did not start (see its log)");
	}
	proc *m = &ps[0];
	int failed = 0;
	static sample a, b, base, busy;
	take(m->pid, &base);
	for (int i = 1; i <= npeers; i++) {
		/* It reaches peer i over the first transport; peer i it over whatever
		 * the engine picks (the same-host one when installed). */
		fprintf(m->cmd, "open %s %s 0\n", ps[i].name, first);
		answer(m, buf, sizeof buf, "moving data");
		if (strncmp(buf, "ok", 2) != 0) {
			fprintf(stderr, "te-idle-cost: measured engine -> peer %d: %s\n", i, buf);
			failed = 1;
		}
		fprintf(ps[i].cmd, "open %s any %d\n", m->name, i);
		answer(&ps[i], buf, sizeof buf, "moving data");
		if (strncmp(buf, "ok", 2) != 0) {
			fprintf(stderr, "te-idle-cost: peer %d -> measured engine: %s\n", i, buf);
			failed = 1;
		}
	}
	printf("te-idle-cost: engine %s (pid %d, transports %s), %d peers each opened and written to and read from both "
	       "ways; idle %.0f s, then sampled for %.0f s\n",
	       m->name, (int)m->pid, transports, npeers, settle, window);
	fflush(stdout);
	take(m->pid, &busy);
	struct timespec ts = { (time_t)settle, (long)((settle - (double)(time_t)settle) * 1e9) };
	nanosleep(&ts, NULL);
	take(m->pid, &a);
	ts.tv_sec = (time_t)window;
	ts.tv_nsec = (long)((window - (double)(time_t)window) * 1e9);
	nanosleep(&ts, NULL);
	take(m->pid, &b);

	double dt = b.at - a.at, hz = (double)sysconf(_SC_CLK_TCK);
	unsigned long long total_ctx = 0;
	printf("%-8s %-16s %12s %10s\n", "tid", "thread", "wake-ups/s", "cpu %");
	for (int i = 0; i < b.n; i++) {
		thr *t = &b.t[i], *was = NULL;
		for (int j = 0; j < a.n && was == NULL; j++)
			if (a.t[j].tid == t->tid)
				was = &a.t[j];
		/* A thread started inside the window counts from zero. */
		unsigned long long dc = t->ctx - (was ? was->ctx : 0);
		unsigned long long dk = t->ticks - (was ? was->ticks : 0);
		total_ctx += dc;
		printf("%-8d %-16s %12.2f %10.3f%s\n", t->tid, t->comm, (double)dc / dt, 100.0 * (double)dk / hz / dt,
		       was ? "" : " (new)");
	}
	int gone = 0;
	for (int j = 0; j < a.n; j++) {
		bool found = false;
		for (int i = 0; i < b.n && !found; i++)
			found = b.t[i].tid == a.t[j].tid;
		gone += !found;
	}
	double wake = (double)total_ctx / dt;
	double cpu = 100.0 * (double)(b.ticks - a.ticks) / hz / dt;
	printf("total: %.2f wake-ups/s, %.3f %% of a core over %.1f s; %d threads (%d ended in the window), "
	       "%d fds (%d at the start), RSS %ld KiB\n",
	       wake, cpu, dt, b.n, gone, b.fds, a.fds, b.rss_kb);
	printf("descriptors (TCP connections): %d (%d) before any peer, %d (%d) after the transfers, %d (%d) at the end\n",
	       base.fds, base.tcp, busy.fds, busy.tcp, b.fds, b.tcp);
	if (reclaim && (busy.tcp == 0 || b.tcp != 0)) {
		printf("FAIL: idle TCP connections were not closed (%d after the transfers, %d at the end)\n", busy.tcp,
		       b.tcp);
		failed = 1;
	}
	if (max_wake >= 0 && wake > max_wake) {
		printf("FAIL: %.2f wake-ups/s > %.2f\n", wake, max_wake);
		failed = 1;
	}
	if (max_cpu >= 0 && cpu > max_cpu) {
		printf("FAIL: %.3f %% of a core > %.3f %%\n", cpu, max_cpu);
		failed = 1;
	}
	fflush(stdout);

	/* The peers first, then the measured engine: no peer sees it go. */
	for (int i = 1; i <= npeers; i++)
		fprintf(ps[i].cmd, "quit\n");
	for (int i = 1; i <= npeers; i++)
		failed |= finish(&ps[i]);
	fprintf(m->cmd, "quit\n");
	failed |= finish(m);
	return failed;
}
