/* SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <time.h>

#include "internal.h"

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
	const char *colon;
	uint64_t p;

	*host = NULL;
	*port = -1;
	if (s == NULL || *s == '\0')
		return -EINVAL;
	if (s[0] == '[') {
		const char *close = strchr(s, ']');
		if (close == NULL || close == s + 1)
			return -EINVAL;
		*host = g_strndup(s + 1, (gsize)(close - s - 1));
		if (close[1] == '\0')
			return 0;
		if (close[1] != ':')
			goto bad;
		colon = close + 1;
	} else {
		colon = strrchr(s, ':');
		if (colon == NULL) {
			*host = g_strdup(s);
			return 0;
		}
		if (strchr(s, ':') != colon) { /* bare IPv6 without port */
			*host = g_strdup(s);
			return 0;
		}
		if (colon == s)
			return -EINVAL;
		*host = g_strndup(s, (gsize)(colon - s));
	}
	if (!te_parse_u64(colon + 1, &p) || p == 0 || p > 65535)
		goto bad;
	*port = (int)p;
	return 0;
bad:
	g_free(*host);
	*host = NULL;
	return -EINVAL;
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
