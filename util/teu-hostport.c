/* SPDX-License-Identifier: Apache-2.0 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "teu-hostport.h"

void teu_sockaddr_name(const struct sockaddr *sa, char *buf, size_t size)
{
	char host[INET6_ADDRSTRLEN] = "?";
	int port;

	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *a = (const void *)sa;
		inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
		port = ntohs(a->sin_port);
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const void *)sa;
		/* a dual-stack socket sees IPv4 peers as ::ffff:a.b.c.d */
		if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr))
			inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], host, sizeof host);
		else
			inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
		port = ntohs(a->sin6_port);
	} else {
		snprintf(buf, size, "?");
		return;
	}
	snprintf(buf, size, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
}

void teu_hostport_host(const char *name, char *host, size_t size)
{
	const char *colon = strrchr(name, ':');
	size_t n = colon ? (size_t)(colon - name) : strlen(name);

	snprintf(host, size, "%.*s", (int)n, name);
}

int teu_hostport_split(const char *s, char *host, size_t size, int *port)
{
	const char *h = s, *colon;
	size_t hl;

	*port = -1;
	if (size > 0)
		*host = '\0';
	if (s[0] == '[') {
		const char *rb = strchr(s, ']');
		if (rb == NULL || (rb[1] != '\0' && rb[1] != ':'))
			return -EINVAL;
		h = s + 1;
		hl = (size_t)(rb - h);
		colon = rb[1] == ':' ? rb + 1 : NULL;
	} else {
		colon = strrchr(s, ':');
		if (colon != NULL && strchr(s, ':') != colon)
			return -EINVAL;
		hl = colon ? (size_t)(colon - s) : strlen(s);
	}
	if (colon != NULL) {
		const char *p = colon + 1;
		size_t n = strspn(p, "0123456789");
		long v = 0;
		/* digits only (no sign, no white space), at most five of them */
		if (n == 0 || n > 5 || p[n] != '\0')
			return -EINVAL;
		for (size_t i = 0; i < n; i++)
			v = v * 10 + (p[i] - '0');
		if (v > 65535)
			return -EINVAL;
		*port = (int)v;
	}
	if (hl >= size)
		return -ENAMETOOLONG;
	memcpy(host, h, hl);
	host[hl] = '\0';
	return 0;
}
