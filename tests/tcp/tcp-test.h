/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers shared by the TCP transport's tests: engines, buffers, raw sockets
 * speaking the RPC and data protocols by hand. */
#ifndef TE_TCP_TEST_H
#define TE_TCP_TEST_H

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/rpc-raw.h"
#include "../common/child.h"
#include "../common/util.h"

/* The wire constants, spelled out here on purpose rather than taken from the
 * plugin, so that the tests check the plugin against docs/wire.md. */
#define W_HDR 24
#define W_STATUS_OK 0x4D43545600000000ull
#define W_STATUS_REJECTED 0x4D43545600000001ull

static inline void *map_buf(size_t n)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	REQUIRE(p != MAP_FAILED);
	return p;
}

/* The address tcp_engine() names its engines after (P2PHANDSHAKE). */
static const char *tcp_test_host = "127.0.0.1";

static inline te_engine *tcp_engine(const te_option *extra, size_t n_extra)
{
	te_option opt[8] = { { "transports", "tcp" } };
	size_t n = 1;
	te_engine *e = NULL;

	for (size_t i = 0; i < n_extra && n < 8; i++)
		opt[n++] = extra[i];
	int rc = te_engine_create("P2PHANDSHAKE", tcp_test_host, opt, n, &e);
	if (rc != 0)
		fprintf(stderr, "engine create failed: %s\n", te_strerror(rc));
	return e;
}

/* Two engines over TCP: `a` initiates into `b`'s remote-accessible buffer,
 * opened as segment `seg`. */
typedef struct pair {
	te_engine *a, *b;
	unsigned char *abuf, *bbuf;
	size_t alen, blen;
	te_segment_id seg;
} pair;

static inline void pair_open(pair *p, size_t alen, const te_option *aopt, size_t na, size_t blen,
			     const te_option *bopt, size_t nb)
{
	p->a = tcp_engine(aopt, na);
	p->b = tcp_engine(bopt, nb);
	REQUIRE(p->a && p->b);
	p->alen = alen;
	p->blen = blen;
	p->abuf = map_buf(alen);
	p->bbuf = map_buf(blen);
	p->seg = pair_segment(p->a, p->abuf, alen, 0, p->b, p->bbuf, blen, "cpu:0");
}

static inline void pair_down(pair *p)
{
	CHECK_EQ(te_segment_close(p->a, p->seg), 0);
	te_engine_destroy(p->a);
	te_engine_destroy(p->b);
	munmap(p->abuf, p->alen);
	munmap(p->bbuf, p->blen);
}

/* One of a test's threads on one pair: its number, its rounds and a style
 * of the test's own; what it counts: copies that came out wrong (bad) and
 * batches that failed. */
typedef struct pair_job {
	pair *p;
	unsigned id, rounds;
	int style;
	int bad, failed;
} pair_job;

/* Runs fn on a thread a job (16 at most) and checks, once all are done,
 * that none counted a failure or a wrong copy. */
static inline void pair_jobs_run(void *(*fn)(void *), pair_job *jobs, unsigned n)
{
	pthread_t th[16];
	REQUIRE(n <= 16);
	for (unsigned i = 0; i < n; i++)
		REQUIRE(pthread_create(&th[i], NULL, fn, &jobs[i]) == 0);
	int bad = 0, failed = 0;
	for (unsigned i = 0; i < n; i++) {
		pthread_join(th[i], NULL);
		bad += jobs[i].bad;
		failed += jobs[i].failed;
	}
	CHECK_EQ(failed, 0);
	CHECK_EQ(bad, 0);
}

/* ------------------------------------------------------------ raw sockets */

static inline int tcp_connect_port(int port)
{
	int fd = connect_port(port), one = 1;
	if (fd >= 0)
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	return fd;
}

/* 0 when something listens at addr:port (IPv4), else -errno. */
static inline int try_connect(const char *addr, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), rc = 0;
	if (fd < 0)
		return -errno;
	inet_pton(AF_INET, addr, &a.sin_addr);
	if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
		rc = -errno;
	close(fd);
	return rc;
}

static inline bool send_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n > 0) {
		ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
		if (w <= 0) {
			if (w < 0 && errno == EINTR)
				continue;
			return false;
		}
		c += w;
		n -= (size_t)w;
	}
	return true;
}

/* Reads exactly n bytes within timeout_ms: n, 0 on EOF first, -1 on timeout
 * or error (partial data is left in buf; *got tells how much). */
static inline ssize_t recv_exact(int fd, void *buf, size_t n, int timeout_ms, size_t *got_out)
{
	char *p = buf;
	size_t got = 0;
	long long end = now_ms() + timeout_ms;
	ssize_t rc = (ssize_t)n;

	while (got < n) {
		long long left = end - now_ms();
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		if (left <= 0 || poll(&pf, 1, (int)left) <= 0) {
			rc = -1;
			break;
		}
		ssize_t r = recv(fd, p + got, n - got, 0);
		if (r == 0) {
			rc = 0;
			break;
		}
		if (r < 0) {
			if (errno == EINTR)
				continue;
			rc = -1;
			break;
		}
		got += (size_t)r;
	}
	if (got_out)
		*got_out = got;
	return rc;
}

/* True when the peer closes within timeout_ms without sending anything. */
static inline bool closed_quietly(int fd, int timeout_ms)
{
	char c;
	size_t got = 0;
	return recv_exact(fd, &c, 1, timeout_ms, &got) == 0 && got == 0;
}

/* True when the peer ends the connection (a close, or a reset when our
 * bytes were left unread) within `ms` without sending anything. */
static inline bool ends_silently(int fd, int ms)
{
	unsigned char c;
	struct pollfd pf = { .fd = fd, .events = POLLIN };
	if (poll(&pf, 1, ms) <= 0)
		return false;
	ssize_t r = recv(fd, &c, 1, 0);
	return r == 0 || (r < 0 && (errno == ECONNRESET || errno == EPIPE));
}

/* True when nothing arrives for ms (and the connection stays open). */
static inline bool silent_for(int fd, int ms)
{
	struct pollfd pf = { .fd = fd, .events = POLLIN };
	return poll(&pf, 1, ms) == 0;
}

static inline void put_hdr(unsigned char *h, uint64_t size, uint64_t addr, uint8_t op)
{
	uint64_t v = htole64(size);
	memcpy(h, &v, 8);
	v = htole64(addr);
	memcpy(h + 8, &v, 8);
	h[16] = op;
	memset(h + 17, 0, 7);
}

static inline uint64_t get_le64(const void *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return le64toh(v);
}

/* One RPC exchange by hand (docs/wire.md, "RPC frames"); returns the reply
 * body, malloc()ed, or NULL. */
static inline char *rpc_exchange(int port, int type, const char *json)
{
	const size_t cap = 1u << 20;
	char *in = malloc(cap);
	ssize_t n = in ? raw_frame(port, type, json, in, cap) : -1;

	if (n < 9 || (unsigned char)in[8] != type || get_le64(in) != (uint64_t)n - 8) {
		free(in);
		return NULL;
	}
	memmove(in, in + 9, (size_t)n - 9);
	in[n - 9] = '\0';
	return in;
}

/* An integer member of a flat JSON text, or -1. */
static inline long long json_int(const char *json, const char *key)
{
	char pat[96];
	snprintf(pat, sizeof pat, "\"%s\":", key);
	const char *p = json ? strstr(json, pat) : NULL;
	return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

/* The data port an engine publishes, read from its descriptor over RPC. */
static inline int data_port_of(te_engine *e)
{
	char *d = rpc_exchange(te_engine_rpc_port(e), 1, "{}");
	long long p = json_int(d, "tcp_data_port");
	free(d);
	return (int)p;
}

/* ----------------------------------------------------------------- ports */

/* A currently free loopback TCP port. */
static inline int free_port(void)
{
	return te_test_free_port();
}

static inline int listen_any(int *port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t l = sizeof a;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	REQUIRE(fd >= 0);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	REQUIRE(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
	REQUIRE(listen(fd, 16) == 0);
	REQUIRE(getsockname(fd, (struct sockaddr *)&a, &l) == 0);
	*port = ntohs(a.sin_port);
	return fd;
}

static inline int accept_timeout(int lfd, int ms)
{
	struct pollfd pf = { .fd = lfd, .events = POLLIN };
	if (poll(&pf, 1, ms) <= 0)
		return -1;
	int fd = accept(lfd, NULL, NULL);
	if (fd >= 0) {
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	}
	return fd;
}

/* A fake peer's RPC port: answers every frame on `lfd` with `desc` (as a
 * Metadata reply of the frame's type) until *stop is set. */
static inline void serve_descriptor(int lfd, const char *desc, atomic_int *stop)
{
	while (!atomic_load(stop)) {
		int fd = accept_timeout(lfd, 100);
		if (fd < 0)
			continue;
		unsigned char h[9];
		if (recv_exact(fd, h, 9, 2000, NULL) == 9) {
			uint64_t n = get_le64(h);
			char *body = n > 0 && n < (1u << 20) ? malloc(n) : NULL;
			if (body && recv_exact(fd, body, n - 1, 2000, NULL) == (ssize_t)(n - 1)) {
				size_t dl = strlen(desc);
				uint64_t len = htole64(dl + 1);
				unsigned char rh[9];
				memcpy(rh, &len, 8);
				rh[8] = h[8];
				send_all(fd, rh, 9);
				send_all(fd, desc, dl);
			}
			free(body);
		}
		close(fd);
	}
}

/* ------------------------------------------------- libte as the target */

/* An engine that frames made by hand are sent to (TE_TCP_TIMEOUT_MS
 * `timeout_ms`): `rlen` bytes at *rbuf that peers may reach, 64 KiB at
 * *lbuf registered for itself only. Its data port in *dport. */
static inline te_engine *wire_target(const char *timeout_ms, unsigned char **rbuf, size_t rlen,
				     unsigned char **lbuf, int *dport)
{
	te_option o = { "TE_TCP_TIMEOUT_MS", timeout_ms };
	te_engine *e = tcp_engine(&o, 1);
	REQUIRE(e != NULL);
	*rbuf = map_buf(rlen);
	*lbuf = map_buf(65536);
	REQUIRE(te_register_memory(e, *rbuf, rlen, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
	REQUIRE(te_register_memory(e, *lbuf, 65536, "cpu:0", 0) == 0);
	*dport = data_port_of(e);
	REQUIRE(*dport > 0);
	return e;
}

/* ------------------------------------------------------------ fake peers */

/* A peer that is not an engine: its RPC port answers every frame with
 * `desc` (serve_descriptor) until fake_stop(); its data port, when one was
 * asked for, listens for the test to accept. Named "127.0.0.1:<rpc_port>". */
typedef struct fake {
	int rpc_lfd, rpc_port, data_lfd, data_port;
	char name[64];
	char desc[2048];
	pthread_t th;
	atomic_int stop;
} fake;

static inline void *fake_rpc_main(void *arg)
{
	fake *f = arg;
	serve_descriptor(f->rpc_lfd, f->desc, &f->stop);
	return NULL;
}

/* Opens the ports; the caller writes f->desc, then calls fake_serve(). */
static inline void fake_listen(fake *f, bool data)
{
	memset(f, 0, sizeof *f);
	f->rpc_lfd = listen_any(&f->rpc_port);
	f->data_lfd = data ? listen_any(&f->data_port) : -1;
	snprintf(f->name, sizeof f->name, "127.0.0.1:%d", f->rpc_port);
}

static inline void fake_serve(fake *f)
{
	REQUIRE(pthread_create(&f->th, NULL, fake_rpc_main, f) == 0);
}

static inline void fake_stop(fake *f)
{
	atomic_store(&f->stop, 1);
	pthread_join(f->th, NULL);
	close(f->rpc_lfd);
	if (f->data_lfd >= 0)
		close(f->data_lfd);
}

/* A TCP target with one buffer of FAKE_LEN bytes at FAKE_BASE. `version`:
 * its tcp_proto_version (1: the member left out, as version 1 peers do);
 * `extra`: more descriptor members (",\"tcp_fence\":1"), or NULL. */
#define FAKE_BASE 0x10000000ull
#define FAKE_LEN (64ull << 20)

/* Writes f->desc: the target above, at f->data_port. */
static inline void fake_tcp_desc(fake *f, int version, const char *extra)
{
	char ver[200] = "";
	if (version >= 2)
		snprintf(ver, sizeof ver, ",\"tcp_proto_version\":%d", version);
	if (extra != NULL) {
		size_t l = strlen(ver);
		snprintf(ver + l, sizeof ver - l, "%s", extra);
	}
	snprintf(f->desc, sizeof f->desc,
		 "{\"buffers\":[{\"addr\":%llu,\"length\":%llu,\"name\":\"%s\"}],\"name\":\"%s\","
		 "\"protocol\":\"tcp\",\"tcp_data_port\":%d%s,\"timestamp\":\"2026-01-01 00:00:00.000000\"}",
		 FAKE_BASE, FAKE_LEN, f->name, f->name, f->data_port, ver);
}

static inline void fake_tcp_start(fake *f, int version, const char *extra)
{
	fake_listen(f, true);
	fake_tcp_desc(f, version, extra);
	fake_serve(f);
}

/* An engine initiating into a fake TCP target: one connection a peer (plus
 * `extra`), `len` bytes of its own registered, the fake's segment open, and
 * the batch the test works with. */
typedef struct init {
	te_engine *e;
	unsigned char *buf;
	size_t len;
	te_segment_id seg;
	te_batch_id b;
} init;

static inline void init_up(init *in, const fake *f, size_t len, const te_option *extra, size_t n)
{
	te_option o[6] = { { "TE_TCP_CONNS_PER_PEER", "1" } };
	REQUIRE(n < 6);
	for (size_t i = 0; i < n; i++)
		o[1 + i] = extra[i];
	in->e = tcp_engine(o, 1 + n);
	REQUIRE(in->e != NULL);
	in->len = len;
	in->buf = map_buf(len);
	REQUIRE(te_register_memory(in->e, in->buf, len, "cpu:0", 0) == 0);
	in->seg = te_segment_open(in->e, f->name);
	REQUIRE(in->seg > 0);
}

static inline void init_down(init *in)
{
	CHECK_EQ(te_segment_close(in->e, in->seg), 0);
	te_engine_destroy(in->e);
	munmap(in->buf, in->len);
}

static inline void init_submit(init *in, const te_request *r, size_t n)
{
	REQUIRE(te_batch_alloc(in->e, n, &in->b) == 0);
	CHECK_EQ(te_submit(in->e, in->b, r, n), 0);
}

/* init_submit(), then the data connection the requests come on to f. */
static inline int init_submit_accept(init *in, const fake *f, const te_request *r, size_t n)
{
	init_submit(in, r, n);
	int fd = accept_timeout(f->data_lfd, 3000);
	REQUIRE(fd >= 0);
	return fd;
}

/* Task i's state, its error in *err when err is not NULL. */
static inline int init_task_state(init *in, size_t i, int *err)
{
	te_task_status st = { 0 };
	te_get_status(in->e, in->b, i, &st);
	if (err)
		*err = st.error;
	return st.state;
}

/* A data frame's header as docs/wire.md has it: size, address, opcode, and
 * seven zero bytes. */
static inline void check_hdr(const unsigned char *h, uint64_t size, uint64_t addr, uint8_t op)
{
	static const unsigned char zero[7] = { 0 };
	CHECK(get_le64(h) == size);
	CHECK(get_le64(h + 8) == addr);
	CHECK_EQ(h[16], op);
	CHECK(memcmp(h + 17, zero, 7) == 0);
}

#endif
