/* SPDX-License-Identifier: Apache-2.0 */
/* The metrics endpoint (TE_METRICS_ADDR, the prometheus exporter plugin):
 * what it serves, what it refuses, how engines share it, and that an
 * endpoint that cannot start fails the engine. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>

#include "../common/util.h"
#include "endpoint-client.h"

/* -------------------------------------------------------------- utilities */

static te_engine *engine_with(const te_option *opt, size_t n, int *rc)
{
	te_engine *e = NULL;
	*rc = te_engine_create("P2PHANDSHAKE", "127.0.0.1", opt, n, &e);
	return e;
}

static bool port_bindable(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 1) == 0;
	close(fd);
	return ok;
}

/* ------------------------------------------------------------------ tests */

/* An engine with the options `o` (metrics_addr among them) serving its
 * metrics on the port it logs (in *port), with the variable `name` set to
 * `value` while it starts (NULL: none); the log captured from its start. */
static te_engine *endpoint_with(const te_option *o, size_t n, const char *name, const char *value, int *port)
{
	int rc;

	if (name != NULL)
		setenv(name, value, 1);
	cap_start();
	te_engine *e = engine_with(o, n, &rc);
	if (name != NULL)
		unsetenv(name);
	REQUIRE(rc == 0 && e != NULL);
	*port = logged_port();
	REQUIRE(*port > 0);
	return e;
}

/* The same on a free loopback port, with no other option. */
static te_engine *endpoint_up(const char *name, const char *value, int *port)
{
	te_option o[] = { { "metrics_addr", "127.0.0.1:0" } };

	return endpoint_with(o, 1, name, value, port);
}

/* GET /metrics serves te_metrics_text(NULL), as it is, with the format's
 * content type; other paths, methods and request bodies are refused. */
static void test_serves_text(void)
{
	int port;
	te_engine *e = endpoint_up(NULL, NULL, &port);

	reply r;
	REQUIRE(http(port, "GET", "/metrics", NULL, &r) == 0);
	CHECK_EQ(r.status, 200);
	CHECK(strstr(r.head, "Content-Type: text/plain; version=0.0.4; charset=utf-8") != NULL);
	char *text = NULL;
	size_t len = 0;
	CHECK_EQ(te_metrics_text(NULL, &text, &len), 0);
	/* The engine is idle and has no transport: nothing moves between the
	 * two readings, so they are the same text. */
	CHECK_EQ(r.len, len);
	CHECK(text != NULL && r.len == len && memcmp(r.body, text, len) == 0);
	char seg[300];
	snprintf(seg, sizeof seg, "segment=\"%s\"", te_engine_name(e));
	CHECK(strstr(r.body, seg) != NULL);
	CHECK(strstr(r.body, "# TYPE te_transfer_bytes_total counter") != NULL);
	te_free(text);
	reply_free(&r);

	REQUIRE(http(port, "HEAD", "/metrics", NULL, &r) == 0);
	CHECK_EQ(r.status, 200);
	CHECK_EQ(r.len, 0);
	reply_free(&r);
	CHECK_EQ(http_status(port, "GET", "/", NULL), 404);
	CHECK_EQ(http_status(port, "GET", "/metrics/x", NULL), 404);
	REQUIRE(http(port, "DELETE", "/metrics", NULL, &r) == 0);
	CHECK_EQ(r.status, 405);
	CHECK(strstr(r.head, "Allow: GET, HEAD") != NULL);
	reply_free(&r);
	CHECK_EQ(http_status(port, "POST", "/metrics", "Content-Length: 0\r\n"), 405);
	/* A body is refused before it is read: 64 MiB announced, none sent. */
	CHECK_EQ(http_status(port, "POST", "/metrics", "Content-Length: 67108864\r\n"), 413);
	CHECK_EQ(http_status(port, "GET", "/metrics", "Transfer-Encoding: chunked\r\n"), 413);
	/* Still serving after the refusals. */
	CHECK_EQ(http_status(port, "GET", "/metrics", NULL), 200);
	te_engine_destroy(e);
	CHECK(connect_port(port) == -ECONNREFUSED);
}

/* Two engines, one endpoint: both are in its text; it lives until the
 * last one goes, and then its port is free to bind again. */
static void test_shared(void)
{
	te_option o[] = { { "metrics_addr", "127.0.0.1:0" } };
	int rc, port;

	te_engine *a = endpoint_with(o, 1, NULL, NULL, &port);
	cap_start();
	te_engine *b = engine_with(o, 1, &rc);
	REQUIRE(rc == 0);
	CHECK(!cap_has_quiet("metrics at ")); /* no second endpoint */

	char sa[300], sb[300];
	snprintf(sa, sizeof sa, "segment=\"%s\"", te_engine_name(a));
	snprintf(sb, sizeof sb, "segment=\"%s\"", te_engine_name(b));
	reply r;
	REQUIRE(http(port, "GET", "/metrics", NULL, &r) == 0);
	CHECK_EQ(r.status, 200);
	CHECK(strstr(r.body, sa) != NULL);
	CHECK(strstr(r.body, sb) != NULL);
	reply_free(&r);

	te_engine_destroy(a);
	REQUIRE(http(port, "GET", "/metrics", NULL, &r) == 0);
	CHECK_EQ(r.status, 200);
	CHECK(strstr(r.body, sa) == NULL);
	CHECK(strstr(r.body, sb) != NULL);
	reply_free(&r);

	te_engine_destroy(b);
	CHECK(connect_port(port) == -ECONNREFUSED);
	CHECK(port_bindable(port));
	/* And an engine asking for that very port gets it. */
	char addr[64];
	snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
	te_option same[] = { { "metrics_addr", addr } };
	te_engine *c = engine_with(same, 1, &rc);
	CHECK_EQ(rc, 0);
	CHECK_EQ(http_status(port, "GET", "/metrics", NULL), 200);
	te_engine_destroy(c);
}

/* TE_METRICS_ADDR in the environment works like the option. */
static void test_env(void)
{
	int rc;

	cap_start();
	setenv("TE_METRICS_ADDR", "127.0.0.1:0", 1);
	te_engine *e = engine_with(NULL, 0, &rc);
	unsetenv("TE_METRICS_ADDR");
	REQUIRE(rc == 0);
	int port = logged_port();
	CHECK(port > 0);
	reply r;
	CHECK(port > 0 && http(port, "GET", "/metrics", NULL, &r) == 0 && r.status == 200);
	reply_free(&r);
	te_engine_destroy(e);
}

/* An endpoint asked for and impossible fails the engine, saying why. */
static void test_bad_addr(void)
{
	int rc;
	te_engine *e;
	/* each address refused, the log naming what was wrong in it */
	static const char *const bad[][2] = {
		{ "nonsense", "TE_METRICS_ADDR=nonsense" },
		{ "127.0.0.1:65536", "65536" },
		{ "300.1.1.1:9464", "300.1.1.1" },
	};

	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		cap_start();
		te_option o[] = { { "metrics_addr", bad[i][0] } };
		e = engine_with(o, 1, &rc);
		bool said = cap_has(bad[i][1]);
		if (rc != -EINVAL || e != NULL || !said)
			fprintf(stderr, "  metrics_addr %s: %d, \"%s\" %s\n", bad[i][0], rc, bad[i][1],
				said ? "logged" : "not logged");
		CHECK_EQ(rc, -EINVAL);
		CHECK(e == NULL);
		CHECK(said);
	}

	cap_start();
	setenv("TE_METRICS_ADDR", "[::1:9464", 1);
	e = engine_with(NULL, 0, &rc);
	unsetenv("TE_METRICS_ADDR");
	CHECK_EQ(rc, -EINVAL);

	/* In use: a listener of this test holds the port. */
	struct sockaddr_in a = { .sin_family = AF_INET };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t al = sizeof a;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	REQUIRE(bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 1) == 0);
	getsockname(fd, (struct sockaddr *)&a, &al);
	char addr[64];
	snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(a.sin_port));
	te_option busy[] = { { "metrics_addr", addr } };
	cap_start();
	e = engine_with(busy, 1, &rc);
	CHECK_EQ(rc, -EADDRINUSE);
	CHECK(e == NULL);
	CHECK(cap_has(addr));
	close(fd);

	/* No such exporter plugin. */
	te_option none[] = { { "metrics_addr", "127.0.0.1:0" }, { "metrics_exporter", "no-such-exporter" } };
	cap_start();
	e = engine_with(none, 2, &rc);
	CHECK_EQ(rc, -ENOENT);
	CHECK(e == NULL);
	CHECK(cap_has("no-such-exporter"));

	/* A token file that is not there. */
	te_option tok[] = { { "metrics_addr", "127.0.0.1:0" }, { "metrics_token_file", "/nonexistent/token" } };
	cap_start();
	e = engine_with(tok, 2, &rc);
	CHECK_EQ(rc, -EINVAL);
	CHECK(cap_has("token file"));

	/* After all of these an endpoint still starts. */
	te_option ok[] = { { "metrics_addr", "127.0.0.1:0" } };
	e = engine_with(ok, 1, &rc);
	CHECK_EQ(rc, 0);
	te_engine_destroy(e);
}

/* With a token file: the right bearer token or 401. */
static void test_token(void)
{
	char path[] = "/tmp/te-metrics-token-XXXXXX";
	int fd = mkstemp(path);
	REQUIRE(fd >= 0);
	const char *tok = "0123456789abcdef0123456789abcdef\n";
	REQUIRE(write(fd, tok, strlen(tok)) == (ssize_t)strlen(tok));
	close(fd);
	te_option o[] = { { "metrics_addr", "127.0.0.1:0" }, { "metrics_token_file", path } };
	int port;
	te_engine *e = endpoint_with(o, 2, NULL, NULL, &port);
	reply r;
	REQUIRE(http(port, "GET", "/metrics", NULL, &r) == 0);
	CHECK_EQ(r.status, 401);
	CHECK(strstr(r.head, "WWW-Authenticate: Bearer") != NULL);
	CHECK(strstr(r.body, "te_transfer") == NULL);
	reply_free(&r);
	CHECK_EQ(http_status(port, "GET", "/metrics", "Authorization: Bearer 0123456789abcdef0123456789abcdeX\r\n"), 401);
	CHECK_EQ(http_status(port, "GET", "/metrics", "Authorization: Basic MDEyMzQ1\r\n"), 401);
	/* Refused before the path is looked at: nothing to learn without it. */
	CHECK_EQ(http_status(port, "GET", "/nothing", NULL), 401);
	REQUIRE(http(port, "GET", "/metrics", "Authorization: Bearer 0123456789abcdef0123456789abcdef\r\n", &r) == 0);
	CHECK_EQ(r.status, 200);
	CHECK(strstr(r.body, "te_transfer_bytes_total") != NULL);
	reply_free(&r);
	CHECK(cap_has("401"));
	CHECK(!cap_has_quiet("0123456789abcdef0123456789abcdef")); /* never logged */
	te_engine_destroy(e);
	unlink(path);
}

/* At most TE_METRICS_MAX_CONNECTIONS connections; one more is turned away
 * with a 503, and a place that frees up serves again. */
static void test_connection_bound(void)
{
	int port;
	te_engine *e = endpoint_up("TE_METRICS_MAX_CONNECTIONS", "2", &port);
	int idle1 = connect_port(port), idle2 = connect_port(port);
	REQUIRE(idle1 >= 0 && idle2 >= 0);
	usleep(200000); /* both accepted */
	reply r;
	CHECK_EQ(http_status(port, "GET", "/metrics", NULL), 503);
	CHECK(cap_has("TE_METRICS_MAX_CONNECTIONS"));
	close(idle1);
	int status = 0;
	for (int i = 0; i < 50 && status != 200; i++) { /* the server sees the close soon */
		usleep(50000);
		if (http(port, "GET", "/metrics", NULL, &r) == 0)
			status = r.status;
		reply_free(&r);
	}
	CHECK_EQ(status, 200);
	close(idle2);
	te_engine_destroy(e);
}

typedef struct seen {
	int prometheus_kind;
	const char *why[3]; /* badsize, badminor, nocreate */
	int loaded_bad;
} seen;

static void look(const te_plugin_info *p, void *user)
{
	seen *s = user;
	static const char *const bad[] = { "libte-exporter-badsize.so", "libte-exporter-badminor.so",
					   "libte-exporter-nocreate.so" };

	if (p->loaded && p->name != NULL && strcmp(p->name, "prometheus") == 0)
		s->prometheus_kind = p->kind;
	for (int i = 0; i < 3; i++)
		if (strstr(p->path, bad[i]) != NULL) {
			s->why[i] = p->reason;
			s->loaded_bad += p->loaded;
		}
}

/* The loader takes the exporter kind, checks its ops like the other kinds,
 * and refuses what would crash: the refused ones cannot be asked for. */
static void test_loader(void)
{
	seen s = { 0 };
	int rc;

	te_plugin_foreach(look, &s);
	CHECK_EQ(s.prometheus_kind, TE_KIND_EXPORTER);
	CHECK_EQ(s.loaded_bad, 0);
	CHECK(s.why[0] != NULL && strstr(s.why[0], "exporter ops table too small") != NULL);
	CHECK(s.why[1] != NULL && strstr(s.why[1], "ABI minor 5") != NULL);
	CHECK(s.why[2] != NULL && strstr(s.why[2], "lack create") != NULL);
	te_option o[] = { { "metrics_addr", "127.0.0.1:0" }, { "metrics_exporter", "nocreate" } };
	cap_start();
	te_engine *e = engine_with(o, 2, &rc);
	CHECK_EQ(rc, -ENOENT);
	CHECK(e == NULL);
	CHECK(cap_has("no exporter plugin named 'nocreate'"));
}

/* A connection that sends nothing is closed after TE_METRICS_IDLE_TIMEOUT_S:
 * silent clients cannot hold the connection slots. */
static void test_idle_timeout(void)
{
	int port;
	te_engine *e = endpoint_up("TE_METRICS_IDLE_TIMEOUT_S", "1", &port);
	int fd = connect_port(port);
	REQUIRE(fd >= 0);
	long long t0 = now_ms();
	struct pollfd p = { fd, POLLIN, 0 };
	char c;
	CHECK(poll(&p, 1, 10000) == 1 && read(fd, &c, 1) <= 0); /* closed, nothing said */
	long long waited = now_ms() - t0;
	CHECK(waited >= 900 && waited < 8000);
	close(fd);
	te_engine_destroy(e);
}

/* Slow clients: each sends its request head one byte at a time, often
 * enough that it is never idle, and holds a place meanwhile;
 * TE_METRICS_HEADER_TIMEOUT_S ends them all, and the endpoint serves
 * again. */
static void test_header_deadline(void)
{
	enum { SLOW = 4 };
	static const char *const from[SLOW] = { "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5" };
	static const char head[] = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: "
				   "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
				   "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
	int port, fd[SLOW];
	long long t0[SLOW], closed_after[SLOW];

	setenv("TE_METRICS_MAX_CONNECTIONS", "4", 1);
	te_engine *e = endpoint_up("TE_METRICS_HEADER_TIMEOUT_S", "2", &port);
	unsetenv("TE_METRICS_MAX_CONNECTIONS");
	for (int i = 0; i < SLOW; i++) {
		fd[i] = connect_from(from[i], port);
		REQUIRE(fd[i] >= 0);
		t0[i] = now_ms();
	}
	for (int i = 0; i < SLOW; i++) {
		REQUIRE(send(fd[i], head, 1, MSG_NOSIGNAL) == 1);
		closed_after[i] = -1;
	}
	/* Accepted after the four: every place is taken. */
	CHECK_EQ(http_status(port, "GET", "/metrics", NULL), 503);
	/* A byte every 200 ms: never idle for TE_METRICS_IDLE_TIMEOUT_S (30),
	 * the head never complete. */
	long long end = now_ms() + 12000;
	int open = SLOW;
	for (size_t at = 1; open > 0 && now_ms() < end; at++) {
		sleep_ms(200);
		for (int i = 0; i < SLOW; i++) {
			if (closed_after[i] >= 0)
				continue;
			if (is_closed(fd[i]) || send(fd[i], head + at % (sizeof head - 1), 1, MSG_NOSIGNAL) != 1) {
				closed_after[i] = now_ms() - t0[i];
				open--;
			}
		}
	}
	for (int i = 0; i < SLOW; i++) {
		/* After the deadline (2 s), well before the idle timeout. */
		CHECK(closed_after[i] >= 1800 && closed_after[i] < 12000);
		if (closed_after[i] < 1800 || closed_after[i] >= 12000)
			fprintf(stderr, "  client %s closed after %lld ms\n", from[i], closed_after[i]);
		close(fd[i]);
	}
	CHECK(cap_has("TE_METRICS_HEADER_TIMEOUT_S"));
	/* Their places are free again. */
	int status = 0;
	for (int i = 0; i < 50 && status != 200; i++) {
		if (i > 0)
			usleep(50000);
		status = http_status(port, "GET", "/metrics", NULL);
	}
	CHECK_EQ(status, 200);
	te_engine_destroy(e);
}

/* TE_METRICS_MAX_CONNECTIONS_PER_ADDR: one address gets that many
 * connections and a 503 for the next, while another address is served;
 * a place it frees serves it again. */
static void test_per_addr_cap(void)
{
	int port;

	setenv("TE_METRICS_HEADER_TIMEOUT_S", "60", 1); /* the idle ones stay */
	te_engine *e = endpoint_up("TE_METRICS_MAX_CONNECTIONS_PER_ADDR", "2", &port);
	unsetenv("TE_METRICS_HEADER_TIMEOUT_S");
	int idle1 = connect_from("127.0.0.2", port), idle2 = connect_from("127.0.0.2", port);
	REQUIRE(idle1 >= 0 && idle2 >= 0);
	reply r;
	REQUIRE(http_from("127.0.0.2", port, "GET", "/metrics", NULL, &r) == 0);
	CHECK_EQ(r.status, 503);
	CHECK(strstr(r.head, "Retry-After: 1") != NULL);
	reply_free(&r);
	CHECK(cap_has("127.0.0.2 has 2 connections open (TE_METRICS_MAX_CONNECTIONS_PER_ADDR)"));
	REQUIRE(http_from("127.0.0.3", port, "GET", "/metrics", NULL, &r) == 0);
	CHECK_EQ(r.status, 200);
	reply_free(&r);
	CHECK_EQ(http_status(port, "GET", "/metrics", NULL), 200); /* 127.0.0.1 */
	close(idle1);
	int status = 0;
	for (int i = 0; i < 50 && status != 200; i++) { /* the server sees the close soon */
		usleep(50000);
		if (http_from("127.0.0.2", port, "GET", "/metrics", NULL, &r) == 0)
			status = r.status;
		reply_free(&r);
	}
	CHECK_EQ(status, 200);
	close(idle2);
	te_engine_destroy(e);
}

/* An engine without TE_METRICS_ADDR starts no endpoint. */
static void test_off_by_default(void)
{
	int rc;

	cap_start();
	te_engine *e = engine_with(NULL, 0, &rc);
	REQUIRE(rc == 0);
	CHECK(!cap_has_quiet("metrics at "));
	te_engine_destroy(e);
}

int main(void)
{
	unsetenv("TE_METRICS_ADDR");
	te_set_log_level(TE_LOG_INFO);
	TEST_RUN(test_loader);
	TEST_RUN(test_serves_text);
	TEST_RUN(test_shared);
	TEST_RUN(test_env);
	TEST_RUN(test_bad_addr);
	TEST_RUN(test_token);
	TEST_RUN(test_connection_bound);
	TEST_RUN(test_idle_timeout);
	TEST_RUN(test_header_deadline);
	TEST_RUN(test_per_addr_cap);
	TEST_RUN(test_off_by_default);
	return check_done();
}
