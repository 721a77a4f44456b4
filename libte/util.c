/* SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <poll.h>
#include <sys/auxv.h>
#include <sys/socket.h>
#include <time.h>

#include "internal.h"
#include "teu-hostport.h"

const char *te_secure_getenv(const char *name)
{
	/* Path-like and behaviour-changing variables must not steer a setuid
	 * program: secure_getenv() returns NULL there. */
	return secure_getenv(name);
}

const char *te_env2(const char *te_name, const char *mc_name)
{
	const char *v = te_name ? te_secure_getenv(te_name) : NULL;

	if ((v == NULL || *v == '\0') && mc_name != NULL)
		v = te_secure_getenv(mc_name);
	return (v != NULL && *v != '\0') ? v : NULL;
}

bool te_parse_u64(const char *s, uint64_t *out)
{
	char *end = NULL;
	unsigned long long v;

	/* strtoull() would skip leading white space (\v and \f too, which
	 * g_ascii_isspace() does not count) and take a sign: only a digit may
	 * start the number. */
	if (s == NULL || !g_ascii_isdigit(*s))
		return false;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno != 0 || end == s || *end != '\0')
		return false;
	*out = v;
	return true;
}

int te_split_host_port(const char *s, char **host, int *port)
{
	char h[TEU_HOST_MAX];

	*host = NULL;
	*port = -1;
	if (s == NULL || *s == '\0')
		return -EINVAL;
	/* An engine's or segment's name may be a bare IPv6 address: a host,
	 * no port (libteu's parser, for addresses to listen on, refuses it). */
	if (s[0] != '[' && strchr(s, ':') != strrchr(s, ':')) {
		*host = g_strdup(s);
		return 0;
	}
	/* libteu's parser, and libte's names' own rules: a host, a port > 0. */
	if (teu_hostport_split(s, h, sizeof h, port) < 0 || h[0] == '\0' || *port == 0) {
		*port = -1;
		return -EINVAL;
	}
	*host = g_strdup(h);
	return 0;
}

void te_timestamp(char *buf, size_t size)
{
	struct timespec ts;
	struct tm tm;
	char base[32];

	clock_gettime(CLOCK_REALTIME, &ts);
	localtime_r(&ts.tv_sec, &tm);
	strftime(base, sizeof base, "%Y-%m-%d %H:%M:%S", &tm);
	snprintf(buf, size, "%s.%06ld", base, ts.tv_nsec / 1000);
}

int64_t te_now_ms(void)
{
	return g_get_monotonic_time() / 1000;
}

/* ------------------------------------------------------------- socket I/O */

/* Both work on blocking and non-blocking sockets alike (MSG_DONTWAIT, then
 * poll until the deadline). */

int te_fd_wait(int fd, short events, int64_t deadline)
{
	for (;;) {
		int64_t left = deadline - te_now_ms();
		struct pollfd p = { .fd = fd, .events = events };
		if (left <= 0)
			return -ETIMEDOUT;
		int rc = poll(&p, 1, left > INT32_MAX ? INT32_MAX : (int)left);
		if (rc > 0)
			return 0;
		if (rc == 0)
			return -ETIMEDOUT;
		if (errno != EINTR)
			return -errno;
	}
}

int te_fd_read(int fd, void *buf, size_t n, int64_t deadline)
{
	char *p = buf;

	while (n > 0) {
		ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
		if (r > 0) {
			p += r;
			n -= (size_t)r;
			continue;
		}
		if (r == 0)
			return -ECONNRESET;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
		int rc = te_fd_wait(fd, POLLIN, deadline);
		if (rc < 0)
			return rc;
	}
	return 0;
}

int te_fd_write(int fd, const void *buf, size_t n, int64_t deadline)
{
	const char *p = buf;

	while (n > 0) {
		ssize_t w = send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w > 0) {
			p += w;
			n -= (size_t)w;
			continue;
		}
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
		int rc = te_fd_wait(fd, POLLOUT, deadline);
		if (rc < 0)
			return rc;
	}
	return 0;
}
