/* SPDX-License-Identifier: Apache-2.0 */
/* A raw client of the RPC/handshake socket, for tests that speak frames by
 * hand: well-formed ones to check replies byte for byte, broken ones to check
 * that the server only closes the connection. */
#ifndef TE_TEST_RPC_RAW_H
#define TE_TEST_RPC_RAW_H

#include <arpa/inet.h>
#include <endian.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

/* The numeric address connect_port() connects to. */
static const char *rpc_raw_host = "127.0.0.1";

/* A connection to rpc_raw_host:port with a 15 s receive timeout, or -1. */
static inline int connect_port(int port)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV };
	struct addrinfo *res = NULL;
	char ps[16];
	snprintf(ps, sizeof ps, "%d", port);
	if (getaddrinfo(rpc_raw_host, ps, &hints, &res) != 0 || res == NULL)
		return -1;
	int fd = socket(res->ai_family, SOCK_STREAM, 0);
	if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0)
		return -1;
	struct timeval tv = { .tv_sec = 15 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	return fd;
}

/* Sends raw bytes on the connection `fd` (and shuts its sending side, with
 * `shut`), then reads what comes back until the server closes, `stop` (not
 * NULL) appears or `in` is full; NUL-terminated in `in`. Closes fd. Returns
 * the bytes read, or -1 (also for an fd < 0: a failed connect). */
static inline ssize_t exchange_fd(int fd, const void *out, size_t n, bool shut, char *in, size_t cap,
				  const char *stop)
{
	size_t got = 0;

	if (fd < 0)
		return -1;
	if (n && send(fd, out, n, MSG_NOSIGNAL) != (ssize_t)n) {
		close(fd);
		return -1;
	}
	if (shut)
		shutdown(fd, SHUT_WR);
	while (got + 1 < cap) {
		ssize_t r = recv(fd, in + got, cap - got - 1, 0);
		if (r <= 0)
			break;
		got += (size_t)r;
		in[got] = '\0';
		if (stop != NULL && strstr(in, stop) != NULL)
			break;
	}
	close(fd);
	in[got] = '\0';
	return (ssize_t)got;
}

/* Sends raw bytes, shuts the sending side, and returns everything that came
 * back until the server closed (NUL-terminated in `in`), or -1. */
static inline ssize_t exchange_raw(int port, const void *out, size_t n, char *in, size_t cap)
{
	return exchange_fd(connect_port(port), out, n, true, in, cap, NULL);
}

/* Sends one frame (type < 0: old style, without a type byte) and returns the
 * whole answer: 8-byte length, type, body. */
static inline ssize_t raw_frame(int port, int type, const char *json, char *in, size_t cap)
{
	size_t jl = strlen(json), hl = type >= 0 ? 9 : 8;
	unsigned char *buf = malloc(hl + jl);
	uint64_t len = htole64(jl + (type >= 0 ? 1 : 0));

	if (buf == NULL)
		return -1;
	memcpy(buf, &len, 8);
	if (type >= 0)
		buf[8] = (unsigned char)type;
	memcpy(buf + hl, json, jl);
	ssize_t r = exchange_raw(port, buf, hl + jl, in, cap);
	free(buf);
	return r;
}

#endif
