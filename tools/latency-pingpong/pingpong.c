/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The floors under tools/bench-latency.sh, one operation at a time:
 *
 *   pingpong tcp sleep|busy SECONDS [RESPONSE_BYTES]
 *       A server process (forked) and a client over loopback TCP with
 *       TCP_NODELAY: the client sends a 24-byte request, the server answers
 *       RESPONSE_BYTES (default 4096 + 8) and the client waits for all of it
 *       before the next request. "sleep": both sides wait in epoll_wait()
 *       before reading (the kernel wakes them); "busy": both spin on
 *       non-blocking recv() (no wake-up).
 *
 *   pingpong stream SPAN SECONDS
 *       One TCP stream over loopback (a forked sender, 1 MiB send() calls)
 *       whose bytes come from and go to SPAN bytes of distinct memory on each
 *       side, in turn: iperf3 sends one cached 1 MiB buffer over and over,
 *       while a transfer engine moves memory that is not in the cache (te-bench's
 *       batch of 128 x 1 MiB spans 128 MiB). SPAN = 1 MiB is iperf3's case.
 *       Prints {"what", "span", "bytes", "gb_per_s"}.
 *
 *   pingpong memcpy BYTES SECONDS
 *       memcpy of the same BYTES between two cached buffers; each sample times
 *       enough copies to last about 2 us (clock_gettime's cost kept out of
 *       small copies) and counts as that time divided by the copies.
 *
 * Prints one JSON object on stdout:
 *   {"what", "bytes", "count", "latency_us": {"p50", "p99", "p999", "mean", "max"}}
 * The first 0.2 s (at most 10 % of the run) are warm-up and not counted.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define REQ_BYTES 24

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *what)
{
	fprintf(stderr, "pingpong: %s: %s\n", what, strerror(errno));
	exit(1);
}

/* ---------------------------------------------------------------- samples */

typedef struct samples {
	double *v; /* nanoseconds */
	size_t n, cap;
} samples;

static void add(samples *s, double ns)
{
	if (s->n == s->cap) {
		s->cap = s->cap ? 2 * s->cap : 1 << 16;
		s->v = realloc(s->v, s->cap * sizeof *s->v);
		if (s->v == NULL)
			die("realloc");
	}
	s->v[s->n++] = ns;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double pct(const samples *s, double p)
{
	size_t i = (size_t)(p * (double)s->n);
	return s->v[i < s->n ? i : s->n - 1];
}

static void report(const char *what, size_t bytes, samples *s)
{
	if (s->n == 0) {
		fprintf(stderr, "pingpong: no samples\n");
		exit(1);
	}
	qsort(s->v, s->n, sizeof *s->v, cmp);
	double sum = 0;
	for (size_t i = 0; i < s->n; i++)
		sum += s->v[i];
	printf("{\"what\":\"%s\",\"bytes\":%zu,\"count\":%zu,\"latency_us\":{\"p50\":%.3f,\"p99\":%.3f,"
	       "\"p999\":%.3f,\"mean\":%.3f,\"max\":%.3f}}\n",
	       what, bytes, s->n, pct(s, 0.5) / 1e3, pct(s, 0.99) / 1e3, pct(s, 0.999) / 1e3,
	       sum / (double)s->n / 1e3, s->v[s->n - 1] / 1e3);
}

/* -------------------------------------------------------------- TCP ping */

static int busy;
static int ep = -1;

/* Reads exactly n bytes; 0 when the peer closed first. */
static int read_full(int fd, char *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		if (!busy) {
			struct epoll_event ev;
			int r = epoll_wait(ep, &ev, 1, -1);
			if (r < 0) {
				if (errno == EINTR)
					continue;
				die("epoll_wait");
			}
		}
		ssize_t r = recv(fd, buf + got, n - got, MSG_DONTWAIT);
		if (r > 0)
			got += (size_t)r;
		else if (r == 0)
			return 0;
		else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			die("recv");
	}
	return 1;
}

static void write_full(int fd, const char *buf, size_t n)
{
	size_t put = 0;
	while (put < n) {
		ssize_t r = send(fd, buf + put, n - put, MSG_NOSIGNAL);
		if (r > 0)
			put += (size_t)r;
		else if (r < 0 && errno != EINTR && errno != EAGAIN)
			die("send");
	}
}

static void setup_fd(int fd)
{
	int one = 1;
	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
		die("TCP_NODELAY");
	if (!busy) {
		ep = epoll_create1(EPOLL_CLOEXEC);
		struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
		if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
			die("epoll");
	}
}

/* A socket listening on a free port of the loopback address, which it
 * leaves in *a. */
static int listen_loopback(struct sockaddr_in *a)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	socklen_t alen = sizeof *a;

	*a = (struct sockaddr_in){ .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	if (fd < 0 || bind(fd, (struct sockaddr *)a, sizeof *a) < 0 || listen(fd, 1) < 0 ||
	    getsockname(fd, (struct sockaddr *)a, &alen) < 0)
		die("listen");
	return fd;
}

/* fork(), the child never outliving its parent. */
static pid_t fork_child(void)
{
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0)
		prctl(PR_SET_PDEATHSIG, SIGKILL);
	return pid;
}

static void server(int lfd, size_t resp_bytes)
{
	int fd = accept(lfd, NULL, NULL);
	if (fd < 0)
		die("accept");
	close(lfd);
	setup_fd(fd);
	char req[REQ_BYTES];
	char *resp = calloc(1, resp_bytes);
	if (resp == NULL)
		die("calloc");
	uint64_t seq = 0;
	while (read_full(fd, req, sizeof req)) {
		memcpy(resp, req, 8); /* the request's sequence number, echoed */
		memcpy(resp + resp_bytes - 8, &seq, 8);
		write_full(fd, resp, resp_bytes);
		seq++;
	}
	_exit(0);
}

static int run_tcp(const char *mode, double secs, size_t resp_bytes)
{
	if (strcmp(mode, "busy") == 0)
		busy = 1;
	else if (strcmp(mode, "sleep") != 0) {
		fprintf(stderr, "pingpong: mode is sleep or busy\n");
		return 2;
	}
	struct sockaddr_in a;
	int lfd = listen_loopback(&a);
	pid_t pid = fork_child();
	if (pid == 0)
		server(lfd, resp_bytes);
	close(lfd);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
		die("connect");
	setup_fd(fd);
	char req[REQ_BYTES] = { 0 };
	char *resp = malloc(resp_bytes);
	if (resp == NULL)
		die("malloc");
	samples s = { 0 };
	uint64_t t_start = now_ns();
	uint64_t warm = (uint64_t)(secs * 1e9 / 10 < 2e8 ? secs * 1e9 / 10 : 2e8);
	uint64_t end = t_start + warm + (uint64_t)(secs * 1e9);
	for (uint64_t seq = 0;; seq++) {
		memcpy(req, &seq, 8);
		uint64_t t0 = now_ns();
		write_full(fd, req, sizeof req);
		if (!read_full(fd, resp, resp_bytes)) {
			fprintf(stderr, "pingpong: the server closed the connection\n");
			return 1;
		}
		uint64_t t1 = now_ns();
		if (memcmp(resp, &seq, 8) != 0) {
			fprintf(stderr, "pingpong: answer out of order\n");
			return 1;
		}
		if (t0 >= t_start + warm)
			add(&s, (double)(t1 - t0));
		if (t1 >= end)
			break;
	}
	close(fd);
	int st;
	waitpid(pid, &st, 0);
	char what[32];
	snprintf(what, sizeof what, "tcp-%s", mode);
	report(what, resp_bytes, &s);
	return 0;
}

/* ---------------------------------------------------------------- memcpy */

static int run_memcpy(size_t bytes, double secs)
{
	char *src = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
	char *dst = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
	if (src == NULL || dst == NULL)
		die("aligned_alloc");
	memset(src, 1, bytes);
	memset(dst, 2, bytes);
	/* copies per sample: enough for about 2 us */
	unsigned per = 1;
	for (;;) {
		uint64_t t0 = now_ns();
		for (unsigned i = 0; i < per; i++) {
			memcpy(dst, src, bytes);
			__asm__ volatile("" : : "r"(dst) : "memory");
		}
		if (now_ns() - t0 >= 2000 || per >= 1u << 20)
			break;
		per *= 2;
	}
	samples s = { 0 };
	uint64_t t_start = now_ns();
	uint64_t warm = (uint64_t)(secs * 1e9 / 10 < 2e8 ? secs * 1e9 / 10 : 2e8);
	uint64_t end = t_start + warm + (uint64_t)(secs * 1e9);
	for (;;) {
		uint64_t t0 = now_ns();
		for (unsigned i = 0; i < per; i++) {
			memcpy(dst, src, bytes);
			__asm__ volatile("" : : "r"(dst) : "memory");
		}
		uint64_t t1 = now_ns();
		if (t0 >= t_start + warm)
			add(&s, (double)(t1 - t0) / per);
		if (t1 >= end)
			break;
	}
	report("memcpy", bytes, &s);
	return 0;
}

/* ------------------------------------------------------------- stream */

static char *touched(size_t n, int byte)
{
	char *p = malloc(n);
	if (p == NULL)
		die("malloc");
	memset(p, byte, n);
	return p;
}

static int run_stream(size_t span, double secs)
{
	const size_t blk = 1u << 20;
	struct sockaddr_in a;
	int l = listen_loopback(&a);
	pid_t pid = fork_child();
	if (pid == 0) {
		int s = socket(AF_INET, SOCK_STREAM, 0);
		if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) < 0)
			die("connect");
		char *b = touched(span, 1);
		uint64_t end = now_ns() + (uint64_t)(secs * 1e9);
		size_t off = 0;
		while (now_ns() < end) {
			ssize_t n = send(s, b + off, blk - off % blk, 0);
			if (n <= 0)
				die("send");
			off = (off + (size_t)n) % span;
		}
		_exit(0);
	}
	int s = accept(l, NULL, NULL);
	if (s < 0)
		die("accept");
	char *b = touched(span, 2);
	uint64_t total = 0, t0 = now_ns(), t1 = t0;
	size_t off = 0;
	for (;;) {
		ssize_t n = recv(s, b + off, blk - off % blk, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		t1 = now_ns();
		total += (uint64_t)n;
		off = (off + (size_t)n) % span;
	}
	waitpid(pid, NULL, 0);
	printf("{\"what\":\"stream\",\"span\":%zu,\"bytes\":%llu,\"gb_per_s\":%.3f}\n", span,
	       (unsigned long long)total, t1 > t0 ? (double)total / (double)(t1 - t0) : 0.0);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 4 && strcmp(argv[1], "tcp") == 0) {
		double secs = strtod(argv[3], NULL);
		size_t resp = argc > 4 ? strtoull(argv[4], NULL, 0) : 4096 + 8;
		if (secs <= 0 || resp < 16 || resp > 1u << 30)
			return 2;
		return run_tcp(argv[2], secs, resp);
	}
	if (argc >= 4 && strcmp(argv[1], "memcpy") == 0) {
		size_t bytes = strtoull(argv[2], NULL, 0);
		double secs = strtod(argv[3], NULL);
		if (bytes == 0 || bytes > 1ull << 32 || secs <= 0)
			return 2;
		return run_memcpy(bytes, secs);
	}
	if (argc >= 4 && strcmp(argv[1], "stream") == 0) {
		size_t span = strtoull(argv[2], NULL, 0);
		double secs = strtod(argv[3], NULL);
		if (span < 1u << 20 || span % (1u << 20) != 0 || span > 1ull << 34 || secs <= 0)
			return 2;
		return run_stream(span, secs);
	}
	fprintf(stderr, "usage: pingpong tcp sleep|busy SECONDS [RESPONSE_BYTES]\n"
			"       pingpong stream SPAN SECONDS (SPAN: a multiple of 1 MiB)\n"
			"       pingpong memcpy BYTES SECONDS\n");
	return 2;
}
