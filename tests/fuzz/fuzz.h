/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What every harness shares: the libFuzzer entry point, and a copy of the
 * input with a NUL after it (the parsers take C strings or JSON text, and
 * libFuzzer's buffer has no terminator: reading past it is a bug ASan must
 * see in the parser, not in the harness).
 */
#ifndef TE_FUZZ_H
#define TE_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Stops the run with a message: an invariant of the code under test broke. */
#define FUZZ_CHECK(cond)                                                                 \
	do {                                                                             \
		if (!(cond)) {                                                           \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
			abort();                                                         \
		}                                                                        \
	} while (0)

static inline char *fuzz_str(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1);
	FUZZ_CHECK(s != NULL);
	memcpy(s, data, size);
	s[size] = '\0';
	return s;
}

/* Splits the input at the first byte `sep`: the part before it (a C string)
 * and the rest. Without `sep` the whole input is the first part. */
static inline char *fuzz_split(const uint8_t *data, size_t size, uint8_t sep, const uint8_t **rest,
			       size_t *rest_len)
{
	const uint8_t *p = memchr(data, sep, size);
	size_t n = p ? (size_t)(p - data) : size;
	*rest = p ? p + 1 : data + size;
	*rest_len = p ? size - n - 1 : 0;
	return fuzz_str(data, n);
}

/* Sends all of data from socket `to` to its peer `from` of a socket pair,
 * both buffers grown to `room` bytes first so that the whole input fits in
 * them before the code under test reads. */
static inline void fuzz_send_all(int to, int from, const void *data, size_t size, int room)
{
	setsockopt(to, SOL_SOCKET, SO_SNDBUF, &room, sizeof room);
	setsockopt(from, SOL_SOCKET, SO_RCVBUF, &room, sizeof room);
	size_t off = 0;
	while (off < size) {
		ssize_t w = send(to, (const char *)data + off, size - off, MSG_NOSIGNAL);
		FUZZ_CHECK(w > 0);
		off += (size_t)w;
	}
}

/* A log handler (te_set_log_handler) that drops every line: the harnesses
 * feed refusals by the million. */
static inline void fuzz_quiet(int level, const char *domain, const char *msg, void *user)
{
	(void)level;
	(void)domain;
	(void)msg;
	(void)user;
}

#endif
