/* SPDX-License-Identifier: Apache-2.0 */
/* The clients of the metrics endpoint's tests (test-exporter.c,
 * test-exporter-tls.c): plain HTTP requests, connections from a chosen
 * loopback address, the endpoint's port from the log. */
#ifndef TE_TEST_ENDPOINT_CLIENT_H
#define TE_TEST_ENDPOINT_CLIENT_H

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>

#include "../common/util.h"

/* ---------------------------------------------------------- HTTP client */

typedef struct reply {
	int status;
	char head[4096];
	char *body; /* malloc()ed */
	size_t len;
} reply;

/* A connection to 127.0.0.1:port from `from` (a loopback address such as
 * 127.0.0.2: the endpoint tells clients apart by address), NULL: any. */
static inline int connect_from(const char *from, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return -errno;
	struct sockaddr_in me = { .sin_family = AF_INET };
	if (from != NULL && (inet_pton(AF_INET, from, &me.sin_addr) != 1 ||
			     bind(fd, (struct sockaddr *)&me, sizeof me) < 0)) {
		int e = errno ? errno : EINVAL;
		close(fd);
		return -e;
	}
	if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

/* Reads until the server closes, at most 5 s. */
static inline int read_reply(int fd, reply *r)
{
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap);
	long long end = now_ms() + 5000;

	memset(r, 0, sizeof *r);
	for (;;) {
		struct pollfd p = { fd, POLLIN, 0 };
		long long left = end - now_ms();
		if (left <= 0 || poll(&p, 1, (int)left) <= 0) {
			free(buf);
			return -ETIMEDOUT;
		}
		if (len + 4096 > cap)
			buf = realloc(buf, cap *= 2);
		ssize_t n = read(fd, buf + len, cap - len - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	buf[len] = '\0';
	char *sep = strstr(buf, "\r\n\r\n");
	if (sep == NULL || sscanf(buf, "HTTP/1.%*d %d", &r->status) != 1) {
		free(buf);
		return -EPROTO;
	}
	snprintf(r->head, sizeof r->head, "%.*s", (int)(sep - buf), buf);
	r->len = len - (size_t)(sep + 4 - buf);
	r->body = malloc(r->len + 1);
	memcpy(r->body, sep + 4, r->len);
	r->body[r->len] = '\0';
	free(buf);
	return 0;
}

static inline int connect_port(int port)
{
	return connect_from(NULL, port);
}

/* One request from `from` (connect_from()); `extra` is more header lines
 * (each ending in \r\n). */
static inline int http_from(const char *from, int port, const char *method, const char *path, const char *extra,
		     reply *r)
{
	char req[2048];
	int fd = connect_from(from, port);
	if (fd < 0)
		return fd;
	int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%sConnection: close\r\n\r\n",
			 method, path, extra ? extra : "");
	if (write(fd, req, (size_t)n) != n) {
		close(fd);
		return -EIO;
	}
	int rc = read_reply(fd, r);
	close(fd);
	return rc;
}

static inline int http(int port, const char *method, const char *path, const char *extra, reply *r)
{
	return http_from(NULL, port, method, path, extra, r);
}

static inline void reply_free(reply *r)
{
	free(r->body);
	r->body = NULL;
}

/* The status of one request (nothing else of the reply matters). */
static inline int http_status(int port, const char *method, const char *path, const char *extra)
{
	reply r;
	REQUIRE(http(port, method, path, extra, &r) == 0);
	int status = r.status;
	reply_free(&r);
	return status;
}

/* The port of the last "metrics at SCHEME://127.0.0.1:PORT/metrics" line. */
static inline int logged_port_of(const char *scheme)
{
	char what[64];
	int port = -1;
	snprintf(what, sizeof what, "metrics at %s://127.0.0.1:", scheme);
	pthread_mutex_lock(&cap_lock);
	const char *p = cap_buf, *hit;
	while ((hit = strstr(p, what)) != NULL) {
		port = atoi(hit + strlen(what));
		p = hit + 1;
	}
	pthread_mutex_unlock(&cap_lock);
	return port;
}

static inline int logged_port(void)
{
	return logged_port_of("http");
}

/* Waits up to `ms` for the peer to end the connection `fd` (end of input
 * or a reset), reading and dropping what comes; 0, or -ETIMEDOUT. */
static inline int wait_closed(int fd, long long ms)
{
	long long end = now_ms() + ms;
	char buf[4096];

	for (;;) {
		struct pollfd p = { fd, POLLIN, 0 };
		long long left = end - now_ms();
		if (left <= 0 || poll(&p, 1, (int)left) <= 0)
			return -ETIMEDOUT;
		ssize_t n = read(fd, buf, sizeof buf);
		if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
			return 0;
	}
}

/* Whether the peer has ended `fd` by now (nothing read waits). */
static inline bool is_closed(int fd)
{
	return wait_closed(fd, 0) == 0;
}

#endif
