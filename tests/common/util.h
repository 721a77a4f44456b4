/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers shared by libte's C tests. */
#ifndef TE_TEST_UTIL_H
#define TE_TEST_UTIL_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <te/te.h>

#include "check.h"
#include "clock.h"

/* Captures log lines so tests can check that errors name what was wrong. */
static pthread_mutex_t cap_lock = PTHREAD_MUTEX_INITIALIZER;
static char cap_buf[65536];
static size_t cap_len;

static void cap_log(int level, const char *domain, const char *msg, void *user)
{
	(void)user;
	pthread_mutex_lock(&cap_lock);
	int n = snprintf(cap_buf + cap_len, sizeof cap_buf - cap_len, "%d %s %s\n", level, domain, msg);
	if (n > 0 && (size_t)n < sizeof cap_buf - cap_len)
		cap_len += (size_t)n;
	pthread_mutex_unlock(&cap_lock);
	if (getenv("TEST_VERBOSE"))
		fprintf(stderr, "  log[%d %s] %s\n", level, domain, msg);
}

static inline void cap_start(void)
{
	pthread_mutex_lock(&cap_lock);
	cap_len = 0;
	cap_buf[0] = '\0';
	pthread_mutex_unlock(&cap_lock);
	te_set_log_handler(cap_log, NULL);
}

static inline int cap_has(const char *needle)
{
	pthread_mutex_lock(&cap_lock);
	int r = strstr(cap_buf, needle) != NULL;
	if (!r) /* under the lock: engine threads may be logging */
		fprintf(stderr, "  (log lacks \"%s\"; it holds: %.400s)\n", needle, cap_buf);
	pthread_mutex_unlock(&cap_lock);
	return r;
}

static inline int cap_has_quiet(const char *needle)
{
	pthread_mutex_lock(&cap_lock);
	int r = strstr(cap_buf, needle) != NULL;
	pthread_mutex_unlock(&cap_lock);
	return r;
}

/* The first size - 1 bytes of file `path` into buf, NUL-terminated (empty
 * when it cannot be read); the bytes read, or -1 when it does not open. */
static inline ssize_t read_text(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "r");
	buf[0] = '\0';
	if (f == NULL)
		return -1;
	size_t n = fread(buf, 1, size - 1, f);
	fclose(f);
	buf[n] = '\0';
	return (ssize_t)n;
}

static inline te_engine *p2p_engine(const char *transports)
{
	te_engine *e = NULL;
	te_option opt[1] = { { "transports", transports } };
	int rc = te_engine_create("P2PHANDSHAKE", "127.0.0.1", opt, transports ? 1 : 0, &e);
	if (rc != 0)
		fprintf(stderr, "engine create failed: %s\n", te_strerror(rc));
	return e;
}

/* Submits one request and waits for it; returns the final state. */
static inline int run_one(te_engine *e, uint32_t op, te_segment_id seg, void *local, uint64_t remote,
			  uint64_t len, te_task_status *st)
{
	te_batch_id b;
	te_request r = { op, seg, local, remote, len };
	te_task_status s = { 0 };
	if (te_batch_alloc(e, 1, &b) != 0)
		return -1;
	te_submit(e, b, &r, 1);
	te_batch_wait(e, b, 30000);
	te_get_status(e, b, 0, &s);
	te_batch_free(e, b);
	if (st)
		*st = s;
	return s.state;
}

/* Registers `abuf` on initiator a ("cpu:0", with `aflags`) and `bbuf` on
 * target b (at `bloc`, open to its peers); returns b's segment opened on a.
 * The pair fixtures of every suite end here. */
static inline te_segment_id pair_segment(te_engine *a, void *abuf, size_t alen, uint32_t aflags, te_engine *b,
					 void *bbuf, size_t blen, const char *bloc)
{
	REQUIRE(a && b);
	REQUIRE(te_register_memory(a, abuf, alen, "cpu:0", aflags) == 0);
	REQUIRE(te_register_memory(b, bbuf, blen, bloc, TE_MEM_REMOTE_ACCESS) == 0);
	te_segment_id seg = te_segment_open(a, te_engine_name(b));
	REQUIRE(seg > 0);
	return seg;
}

/* Two engines of this process over `transports`: a with len bytes at abuf
 * (registered as "cpu:0", local only), b with len bytes at bbuf that peers
 * may reach, open on a as seg. */
typedef struct engine_pair {
	te_engine *a, *b;
	unsigned char *abuf, *bbuf;
	te_segment_id seg; /* b as seen from a */
} engine_pair;

static inline void engine_pair_up(engine_pair *p, const char *transports, size_t len)
{
	p->a = p2p_engine(transports);
	p->b = p2p_engine(transports);
	REQUIRE(p->a && p->b);
	p->abuf = aligned_alloc(4096, len);
	p->bbuf = aligned_alloc(4096, len);
	REQUIRE(p->abuf && p->bbuf);
	memset(p->abuf, 1, len); /* different bytes on each side: a copy shows */
	memset(p->bbuf, 2, len);
	p->seg = pair_segment(p->a, p->abuf, len, 0, p->b, p->bbuf, len, "*");
}

/* engine_pair_up(), and a batch of `n` tasks on a (freed by the test). */
static inline te_batch_id engine_pair_batch(engine_pair *p, const char *transports, size_t len, size_t n)
{
	te_batch_id b;
	engine_pair_up(p, transports, len);
	REQUIRE(te_batch_alloc(p->a, n, &b) == 0);
	return b;
}

static inline void engine_pair_down(engine_pair *p)
{
	CHECK_EQ(te_segment_close(p->a, p->seg), 0);
	te_engine_destroy(p->a);
	te_engine_destroy(p->b);
	free(p->abuf);
	free(p->bbuf);
}

/* Submits n requests as one batch of e, waits up to timeout_ms and checks
 * that every step worked and the batch completed; frees the batch. */
static inline void batch_complete(te_engine *e, const te_request *r, size_t n, int timeout_ms)
{
	te_batch_id b;
	REQUIRE(te_batch_alloc(e, n, &b) == 0);
	CHECK_EQ(te_submit(e, b, r, n), 0);
	CHECK_EQ(te_batch_wait(e, b, timeout_ms), 0);
	int32_t state;
	CHECK_EQ(te_batch_status(e, b, NULL, NULL, &state), 0);
	CHECK_EQ(state, TE_TASK_COMPLETED);
	CHECK_EQ(te_batch_free(e, b), 0);
}

/* batch_complete() for a thread that counts its faults instead of checking:
 * the batch's state (TE_TASK_COMPLETED when every task did), or -1 when it
 * could not be allocated, submitted, waited for, read or freed. A batch
 * that did not end is left to the engine's destroy. */
static inline int batch_state(te_engine *e, const te_request *r, size_t n, int timeout_ms)
{
	te_batch_id b;
	int32_t state;

	if (te_batch_alloc(e, n, &b) != 0)
		return -1;
	if (te_submit(e, b, r, n) != 0 || te_batch_wait(e, b, timeout_ms) != 0)
		return -1;
	if (te_batch_status(e, b, NULL, NULL, &state) != 0)
		state = -1;
	if (te_batch_free(e, b) != 0)
		state = -1;
	return state;
}

/* How many of n requests, both of whose ends lie in this process, left
 * their local and remote bytes different. */
static inline int ranges_differ(const te_request *r, size_t n)
{
	int bad = 0;
	for (size_t i = 0; i < n; i++)
		bad += memcmp(r[i].local, (const void *)(uintptr_t)r[i].remote, r[i].length) != 0;
	return bad;
}

/* A loopback TCP port free right now, for a server a test starts later. It
 * comes from below the kernel's ephemeral range (32768 and up by default):
 * a port from that range (bind to port 0) may be taken, before the server
 * binds it, by an outgoing connection of a test running beside. */
static inline int te_test_free_port(void)
{
	static unsigned seed;
	if (seed == 0)
		seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
	for (int i = 0; i < 500; i++) {
		int port = 20000 + (int)(rand_r(&seed) % 12000u);
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
		a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd < 0)
			return -1;
		int rc = bind(fd, (struct sockaddr *)&a, sizeof a);
		close(fd);
		if (rc == 0)
			return port;
	}
	return -1;
}

/* Keeps a port that a test's server has closed from being taken by a test
 * running beside, so that a connection to it is refused: binds
 * 127.0.0.1:port without listening and without SO_REUSEADDR (no other
 * socket can bind it then, wildcard or not). The descriptor to close after,
 * or -1 when the port is in use already. */
static inline int te_test_hold_port(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

#endif
