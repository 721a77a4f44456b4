/* SPDX-License-Identifier: Apache-2.0 */
/*
 * "host:port" both ways, as libte's control plane, the transports and the
 * HTTP servers write and read it: an IPv6 address in brackets ("[::1]:80"),
 * an IPv4 peer of a dual-stack socket (::ffff:a.b.c.d) as plain IPv4.
 */
#ifndef TEU_HOSTPORT_H
#define TEU_HOSTPORT_H

#include <stddef.h>
#include <sys/socket.h>

/* Room for a host name (at most 253 bytes) or a numeric address. */
#define TEU_HOST_MAX 256

/* Room for any name teu_sockaddr_name() writes: "[" IPv6 "]:" port. */
#define TEU_SOCKADDR_NAME_MAX 56

/* `sa` as "10.0.0.1:80" or "[fe80::1]:80" ("?" for a family other than
 * IPv4 and IPv6), cut to `size`. */
void teu_sockaddr_name(const struct sockaddr *sa, char *buf, size_t size);

/* The host of a name teu_sockaddr_name() wrote: all before the last ':'
 * ("[fe80::1]" of "[fe80::1]:80"), or all of it when it has none. */
void teu_hostport_host(const char *name, char *host, size_t size);

/* Splits "host:port", "[v6]:port", "host" or "[v6]" into the host (brackets
 * dropped; copied to `host`, which may come out empty as of ":80") and the
 * port (-1 when none is given). 0, or -EINVAL: an unclosed bracket or one
 * followed by anything but ":port", an IPv6 address without brackets (its
 * last group would pass for the port), a port that is not 0 to 65535 in
 * decimal digits; -ENAMETOOLONG: the host needs more than `size` bytes. */
int teu_hostport_split(const char *s, char *host, size_t size, int *port);

#endif
