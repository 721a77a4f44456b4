/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Metadata store latency: put and get of a descriptor-sized value through
 * libte's plugin (te_metadata_put/get) against the same requests sent by a
 * minimal keep-alive client on a raw socket (the floor any client can reach).
 *
 *   md-bench etcd|redis|http PORT [OPS] [RUNS] [THREADS]
 *
 * Prints, per path and operation, the median over RUNS of the median and the
 * 99th-percentile latency (µs), and throughput with THREADS threads.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <te/te.h>

#include "b64.h"

static const char *kind;
static int port, ops = 2000, runs = 5, nthreads = 4;
static char conn[128];
static char value[512];

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* --------------------------------------------------------- raw clients */

static int raw_connect(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
		perror("connect");
		exit(1);
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	return fd;
}

static void send_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w <= 0) {
			perror("send");
			exit(1);
		}
		p += w;
		n -= (size_t)w;
	}
}

/* Reads one HTTP response (Content-Length framing); returns its status. */
static int http_read(int fd, char *buf, size_t cap)
{
	size_t got = 0;
	char *end = NULL;
	while (!(end = memmem(buf, got, "\r\n\r\n", 4))) {
		ssize_t r = recv(fd, buf + got, cap - got, 0);
		if (r <= 0) {
			fprintf(stderr, "recv failed\n");
			exit(1);
		}
		got += (size_t)r;
	}
	size_t hl = (size_t)(end - buf) + 4;
	buf[hl - 1] = '\0';
	const char *cl = strcasestr(buf, "content-length:");
	size_t want = hl + (cl ? strtoull(cl + 15, NULL, 10) : 0);
	while (got < want) {
		ssize_t r = recv(fd, buf + got, cap - got, 0);
		if (r <= 0)
			exit(1);
		got += (size_t)r;
	}
	return atoi(buf + 9);
}

static void raw_op(int fd, int put, const char *key, char *buf, size_t cap)
{
	char req[4096];
	int n;

	if (strcmp(kind, "redis") == 0) {
		n = put ? snprintf(req, sizeof req, "*3\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n", strlen(key), key,
				   strlen(value), value)
			: snprintf(req, sizeof req, "*2\r\n$3\r\nGET\r\n$%zu\r\n%s\r\n", strlen(key), key);
		send_all(fd, req, (size_t)n);
		size_t got = 0;
		for (;;) { /* +OK\r\n, or $len\r\n<len bytes>\r\n */
			ssize_t r = recv(fd, buf + got, cap - got, 0);
			if (r <= 0)
				exit(1);
			got += (size_t)r;
			if (buf[0] == '+' && memmem(buf, got, "\r\n", 2))
				break;
			if (buf[0] == '$') {
				char *e = memmem(buf, got, "\r\n", 2);
				if (e && got >= (size_t)(e - buf) + 2 + strtoull(buf + 1, NULL, 10) + 2)
					break;
			}
		}
		return;
	}
	if (strcmp(kind, "http") == 0) {
		char esc[256];
		size_t o = 0;
		for (const char *p = key; *p; p++)
			o += (size_t)(*p == '/' ? snprintf(esc + o, sizeof esc - o, "%%2F")
						: snprintf(esc + o, sizeof esc - o, "%c", *p));
		n = put ? snprintf(req, sizeof req,
				   "PUT /metadata?key=%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
				   "Content-Length: %zu\r\n\r\n%s",
				   esc, strlen(value), value)
			: snprintf(req, sizeof req, "GET /metadata?key=%s HTTP/1.1\r\nHost: x\r\n\r\n", esc);
	} else {
		char *k = b64(key), *v = b64(value), body[2048];
		int bl = put ? snprintf(body, sizeof body, "{\"key\":\"%s\",\"value\":\"%s\"}", k, v)
			     : snprintf(body, sizeof body, "{\"key\":\"%s\"}", k);
		n = snprintf(req, sizeof req,
			     "POST /v3/kv/%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
			     "Content-Length: %d\r\n\r\n%s",
			     put ? "put" : "range", bl, body);
		free(k);
		free(v);
	}
	send_all(fd, req, (size_t)n);
	if (http_read(fd, buf, cap) != 200) {
		fprintf(stderr, "raw request failed\n");
		exit(1);
	}
}

/* -------------------------------------------------------------- runs */

typedef struct job {
	int raw, put, id, count;
	te_metadata *md;
	double *lat;
} job;

static void *run_job(void *p)
{
	job *j = p;
	char key[64], *buf = malloc(1 << 16), *v = NULL;
	size_t len;
	int fd = j->raw ? raw_connect() : -1;

	for (int i = 0; i < j->count; i++) {
		snprintf(key, sizeof key, "mooncake/bench/%d/%d", j->id, i % 64);
		double t0 = now_us();
		if (j->raw) {
			raw_op(fd, j->put, key, buf, 1 << 16);
		} else if (j->put) {
			if (te_metadata_put(j->md, key, value, strlen(value)) != 0)
				exit(1);
		} else {
			if (te_metadata_get(j->md, key, &v, &len) != 0)
				exit(1);
			te_free(v);
		}
		if (j->lat)
			j->lat[i] = now_us() - t0;
	}
	if (fd >= 0)
		close(fd);
	free(buf);
	return NULL;
}

static void measure(int raw, int put, te_metadata *md)
{
	double med[16], p99[16], tput[16];
	double *lat = malloc(sizeof(double) * (size_t)ops);

	for (int r = 0; r < runs; r++) {
		job j = { raw, put, 0, ops, md, lat };
		run_job(&j);
		qsort(lat, (size_t)ops, sizeof *lat, cmp_d);
		med[r] = lat[ops / 2];
		p99[r] = lat[ops * 99 / 100];

		pthread_t t[64];
		job js[64];
		double t0 = now_us();
		for (int i = 0; i < nthreads; i++) {
			js[i] = (job){ raw, put, i, ops / nthreads, md, NULL };
			pthread_create(&t[i], NULL, run_job, &js[i]);
		}
		for (int i = 0; i < nthreads; i++)
			pthread_join(t[i], NULL);
		tput[r] = (ops / nthreads) * nthreads / ((now_us() - t0) / 1e6);
	}
	qsort(med, (size_t)runs, sizeof *med, cmp_d);
	qsort(p99, (size_t)runs, sizeof *p99, cmp_d);
	qsort(tput, (size_t)runs, sizeof *tput, cmp_d);
	printf("%-6s %-6s %-4s  median %8.1f us  p99 %8.1f us  %d threads %9.0f ops/s\n", kind,
	       raw ? "raw" : "plugin", put ? "put" : "get", med[runs / 2], p99[runs / 2], nthreads,
	       tput[runs / 2]);
	free(lat);
}

int main(int argc, char **argv)
{
	te_metadata *md = NULL;

	if (argc < 3) {
		fprintf(stderr, "usage: md-bench etcd|redis|http PORT [OPS] [RUNS] [THREADS]\n");
		return 2;
	}
	kind = argv[1];
	port = atoi(argv[2]);
	if (argc > 3)
		ops = atoi(argv[3]);
	if (argc > 4)
		runs = atoi(argv[4]);
	if (argc > 5)
		nthreads = atoi(argv[5]);
	if (runs < 1 || runs > 16 || ops < 100 || nthreads < 1 || nthreads > 64)
		return 2;
	/* about the size of a one-buffer TCP descriptor */
	snprintf(value, sizeof value,
		 "{\"buffers\":[{\"addr\":140737488355328,\"length\":1073741824,\"name\":\"bench\"}],"
		 "\"name\":\"bench\",\"protocol\":\"tcp\",\"tcp_data_port\":15123,\"tcp_proto_version\":2,"
		 "\"timestamp\":\"2026-01-01 00:00:00.000000\"}");
	if (strcmp(kind, "etcd") == 0)
		snprintf(conn, sizeof conn, "etcd://127.0.0.1:%d", port);
	else if (strcmp(kind, "redis") == 0)
		snprintf(conn, sizeof conn, "redis://127.0.0.1:%d", port);
	else
		snprintf(conn, sizeof conn, "http://127.0.0.1:%d/metadata", port);
	if (te_metadata_open(conn, &md) != 0)
		return 1;
	for (int put = 1; put >= 0; put--)
		for (int raw = 1; raw >= 0; raw--)
			measure(raw, put, md);
	te_metadata_close(md);
	return 0;
}
