/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The deadline of the metadata plugins' HTTP client (util/teu-http.c, also
 * in te-top): every request ends by its timeout, whatever the server or the
 * TLS library does, with -ETIMEDOUT and an error text that
 * names the URL (password hidden) and where the request stood.
 *
 *   silent-handshake  a server accepts TCP and never answers the ClientHello
 *   stalled-handshake a relay passes on the first bytes of a real TLS
 *                     server's reply (te-metadata-server), then nothing
 *   silent-reply      plain http: accepted, the request sent, no reply
 *   full-backlog      the listener's queue is full: connecting never ends
 *   held-context      another thread owns GLib's default main context while
 *                     a server asks for the client certificate (openssl
 *                     s_server -Verify): the handshake must not wait for it
 *
 * Four threads call at once in each of the first four; each call must
 * return within its timeout + 1 s. Calls run on threads the test waits for
 * with its own timer, so a call that hangs fails the test instead of
 * hanging it.
 */
#include <gio/gio.h>
#include <glib.h>
#include <pthread.h>
#include <stdatomic.h>

#include "teu-http.h"

#include "../common/acceptor.h"
/* The harness serves the store tests too: not all of it is used here. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "md-harness.h"
#include "md-glib.h"
#pragma GCC diagnostic pop

#define CALLS 4
#define TIMEOUT_MS 600
#define SLACK_MS 1000

/* ---------------------------------------------------------------- calls */

typedef struct call {
	teu_http *c;
	const char *method, *url;
	int timeout_ms;
	int rc;
	char *err;
	int status;
	long long took_ms;
	bool done; /* under calls_lock */
} call;

static pthread_mutex_t calls_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t calls_cond = PTHREAD_COND_INITIALIZER;

static void *call_thread(void *arg)
{
	call *k = arg;
	teu_http_reply r;
	long long t0 = now_ms();
	k->rc = teu_http_request(k->c, k->method, k->url, NULL, NULL, 0, NULL, k->timeout_ms, &r, &k->err);
	k->took_ms = now_ms() - t0;
	k->status = k->rc == 0 ? r.status : 0;
	teu_http_reply_clear(&r);
	pthread_mutex_lock(&calls_lock);
	k->done = true;
	pthread_cond_broadcast(&calls_cond);
	pthread_mutex_unlock(&calls_lock);
	return NULL;
}

/* Runs `n` calls at once and waits for them up to `limit_ms`. A call still
 * running then is a hang: the test reports it and ends, as its thread
 * cannot be joined. */
static void run_calls(call *k, int n, long long limit_ms)
{
	pthread_t t[CALLS];
	REQUIRE(n <= CALLS);
	for (int i = 0; i < n; i++)
		REQUIRE(pthread_create(&t[i], NULL, call_thread, &k[i]) == 0);
	struct timespec end;
	clock_gettime(CLOCK_REALTIME, &end);
	end.tv_sec += limit_ms / 1000;
	end.tv_nsec += (limit_ms % 1000) * 1000000L;
	if (end.tv_nsec >= 1000000000L) {
		end.tv_sec++;
		end.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&calls_lock);
	for (;;) {
		int left = 0;
		for (int i = 0; i < n; i++)
			left += !k[i].done;
		if (left == 0)
			break;
		if (pthread_cond_timedwait(&calls_cond, &calls_lock, &end) == ETIMEDOUT) {
			fprintf(stderr, "  %d of %d calls to %s still running after %lld ms: hung\n", left, n,
				k[0].url, limit_ms);
			CHECK(!"every call returned");
			fflush(stderr);
			harness_cleanup();
			_exit(check_done());
		}
	}
	pthread_mutex_unlock(&calls_lock);
	for (int i = 0; i < n; i++)
		pthread_join(t[i], NULL);
}

/* `n` calls of `url` at once on one client: each ends with -ETIMEDOUT by
 * its timeout + SLACK_MS, its text naming `phase` and the URL. */
static void check_deadline(teu_http *c, const char *url, const char *shown_url, const char *phase)
{
	call k[CALLS];
	for (int i = 0; i < CALLS; i++)
		k[i] = (call){ .c = c, .method = "GET", .url = url, .timeout_ms = TIMEOUT_MS };
	run_calls(k, CALLS, TIMEOUT_MS + SLACK_MS + 5000);
	for (int i = 0; i < CALLS; i++) {
		fprintf(stderr, "  call %d: %d after %lld ms: %s\n", i, k[i].rc, k[i].took_ms,
			k[i].err ? k[i].err : "");
		CHECK_EQ(k[i].rc, -ETIMEDOUT);
		CHECK(k[i].took_ms >= TIMEOUT_MS - 50);
		CHECK(k[i].took_ms <= TIMEOUT_MS + SLACK_MS);
		CHECK(k[i].err != NULL && strstr(k[i].err, phase) != NULL);
		CHECK(k[i].err != NULL && strstr(k[i].err, shown_url) != NULL);
		CHECK(k[i].err != NULL && strstr(k[i].err, "pw-9Zq") == NULL);
		g_free(k[i].err);
	}
}

static teu_http *client(const char *ca, const char *cert, const char *key)
{
	teu_http_opts o = { .ca_file = ca, .cert_file = cert, .key_file = key };
	char *err = NULL;
	teu_http *c = teu_http_new(&o, &err);
	if (c == NULL)
		fprintf(stderr, "  teu_http_new: %s\n", err);
	REQUIRE(c != NULL);
	return c;
}

/* ---------------------------------------------------------------- peers */

/* A relay to `upstream` that passes on everything the client sends but
 * only the first `pass` bytes of the answer; the rest is read and dropped,
 * so the server is never held up. One thread per client connection, each
 * ending within 100 ms of the acceptor's stop. */
#define RELAY_CONNS 16

typedef struct relay {
	acceptor acc;
	int lfd, port, upstream;
	size_t pass;
	pthread_t conns[RELAY_CONNS]; /* the acceptor's, joined after it */
	int nconns;
} relay;

typedef struct relay_conn {
	relay *r;
	int cfd;
} relay_conn;

static void *relay_conn_thread(void *arg)
{
	relay_conn *rc = arg;
	relay *r = rc->r;
	int cfd = rc->cfd, ufd = connect_loopback(r->upstream, 2000);
	size_t passed = 0;
	char buf[4096];

	free(rc);
	while (ufd >= 0 && !atomic_load(&r->acc.stop)) {
		struct pollfd p[2] = { { cfd, POLLIN, 0 }, { ufd, POLLIN, 0 } };
		if (poll(p, 2, 100) < 0 && errno != EINTR)
			break;
		if (p[0].revents) {
			ssize_t n = read(cfd, buf, sizeof buf);
			if (n <= 0 || write(ufd, buf, (size_t)n) != n)
				break; /* the client gave up (its socket was shut down) */
		}
		if (p[1].revents) {
			ssize_t n = read(ufd, buf, sizeof buf);
			if (n <= 0)
				break;
			size_t give = passed < r->pass ? r->pass - passed : 0;
			if (give > (size_t)n)
				give = (size_t)n;
			if (give > 0 && write(cfd, buf, give) != (ssize_t)give)
				break;
			passed += give;
		}
	}
	if (ufd >= 0)
		close(ufd);
	close(cfd);
	return NULL;
}

static void relay_serve(acceptor *a, int cfd)
{
	relay *r = a->arg;
	if (r->nconns == RELAY_CONNS) { /* more than the test makes */
		close(cfd);
		return;
	}
	relay_conn *rc = malloc(sizeof *rc);
	REQUIRE(rc != NULL);
	*rc = (relay_conn){ r, cfd };
	REQUIRE(pthread_create(&r->conns[r->nconns++], NULL, relay_conn_thread, rc) == 0);
}

static void relay_start(relay *r, int upstream, size_t pass)
{
	r->upstream = upstream;
	r->pass = pass;
	r->nconns = 0;
	r->lfd = blackhole_listen(&r->port);
	acceptor_start(&r->acc, r->lfd, relay_serve, r);
}

static void relay_stop(relay *r)
{
	acceptor_stop(&r->acc);
	for (int i = 0; i < r->nconns; i++)
		pthread_join(r->conns[i], NULL);
	close(r->lfd);
}

/* ---------------------------------------------------------------- cases */

/* A listener that takes connections and says nothing, called by a client
 * without CA or credentials at `start`127.0.0.1:port`path`: check_deadline()
 * for `phase`, the errors showing the URL begun with `shown_start`. */
static void silent_peer(const char *start, const char *shown_start, const char *path, const char *phase)
{
	int port, hole = blackhole_listen(&port);
	char url[128], shown[128];
	snprintf(url, sizeof url, "%s127.0.0.1:%d%s", start, port, path);
	snprintf(shown, sizeof shown, "%s127.0.0.1:%d%s", shown_start, port, path);
	teu_http *c = client(NULL, NULL, NULL);
	check_deadline(c, url, shown, phase);
	teu_http_free(c);
	close(hole);
}

static void silent_handshake(void)
{
	/* a password in the URL: the error texts hide it */
	silent_peer("https://te:pw-9Zq@", "https://te:***@", "/metadata", "during the TLS handshake");
}

static void stalled_handshake(void)
{
	int mds = free_port();
	const char *extra[] = { "--tls-cert", tmp_path("srv.pem"), "--tls-key", tmp_path("srv.key"), NULL };
	mds_start(mds, extra);
	relay r;
	/* 40 bytes: the record header and the start of the ServerHello */
	relay_start(&r, mds, 40);
	char url[128];
	snprintf(url, sizeof url, "https://127.0.0.1:%d/health", r.port);
	teu_http *c = client(tmp_path("ca.pem"), NULL, NULL);
	check_deadline(c, url, url, "during the TLS handshake");
	/* the same server without the relay answers: the stall was the relay's */
	snprintf(url, sizeof url, "https://127.0.0.1:%d/health", mds);
	call k = { .c = c, .method = "GET", .url = url, .timeout_ms = 5000 };
	run_calls(&k, 1, 10000);
	CHECK_EQ(k.rc, 0);
	CHECK_EQ(k.status, 200);
	g_free(k.err);
	teu_http_free(c);
	relay_stop(&r);
}

static void silent_reply(void)
{
	silent_peer("http://", "http://", "/metadata?key=x", "waiting for the reply");
}

/* Connections the kernel completed fill the accept queue of a listener
 * nobody accepts on; further SYNs are dropped and connecting waits. */
static void full_backlog(void)
{
	int port, hole = blackhole_listen(&port);
	REQUIRE(listen(hole, 0) == 0);
	int fill[8];
	for (int i = 0; i < 8; i++) {
		fill[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
		a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		REQUIRE(fill[i] >= 0);
		int rc = connect(fill[i], (struct sockaddr *)&a, sizeof a);
		REQUIRE(rc == 0 || errno == EINPROGRESS);
	}
	sleep_ms(100);
	char url[128];
	snprintf(url, sizeof url, "https://127.0.0.1:%d/metadata", port);
	teu_http *c = client(NULL, NULL, NULL);
	check_deadline(c, url, url, "while connecting");
	teu_http_free(c);
	for (int i = 0; i < 8; i++)
		close(fill[i]);
	close(hole);
}

static void held_context(void)
{
	int port = free_port();
	char accept_arg[64];
	snprintf(accept_arg, sizeof accept_arg, "127.0.0.1:%d", port);
	char *argv[] = { "openssl", "s_server", "-accept", accept_arg, "-cert", (char *)tmp_path("srv.pem"),
			 "-key", (char *)tmp_path("srv.key"), "-CAfile", (char *)tmp_path("ca.pem"), "-Verify",
			 "1", "-www", "-quiet", NULL };
	pid_t srv = spawn(argv, NULL, tmp_path("s_server.log"), NULL, NULL);
	REQUIRE(wait_until(tcp_ready, port, 20000));

	atomic_int state = 0;
	pthread_t holder;
	REQUIRE(pthread_create(&holder, NULL, md_hold_default_context, &state) == 0);
	REQUIRE(WAIT_FOR(atomic_load(&state) == 1, 5000));

	char url[128];
	snprintf(url, sizeof url, "https://127.0.0.1:%d/", port);
	/* Refused first: a session resumed later would not be asked again. */
	teu_http *c = client(tmp_path("ca.pem"), NULL, NULL);
	call k = { .c = c, .method = "GET", .url = url, .timeout_ms = 3000 };
	run_calls(&k, 1, 3000 + SLACK_MS + 5000);
	fprintf(stderr, "  without a certificate: %d after %lld ms: %s\n", k.rc, k.took_ms, k.err ? k.err : "");
	CHECK(k.rc < 0 && k.rc != -ETIMEDOUT);
	CHECK(k.took_ms < 3000);
	CHECK(k.err != NULL && strstr(k.err, "certificate") != NULL);
	g_free(k.err);
	teu_http_free(c);

	c = client(tmp_path("ca.pem"), tmp_path("cli.pem"), tmp_path("cli.key"));
	k = (call){ .c = c, .method = "GET", .url = url, .timeout_ms = 3000 };
	run_calls(&k, 1, 3000 + SLACK_MS + 5000);
	fprintf(stderr, "  with a certificate: %d (status %d) after %lld ms: %s\n", k.rc, k.status, k.took_ms,
		k.err ? k.err : "");
	CHECK_EQ(k.rc, 0);
	CHECK_EQ(k.status, 200);
	g_free(k.err);
	teu_http_free(c);

	atomic_store(&state, 2);
	pthread_join(holder, NULL);
	stop_child(srv, SIGTERM);
}

int main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	harness_init("http-deadline");
	make_certs(false);
	/* glib-networking builds each TLS connection's trust list from the
	 * default database before libsoup gives it the session's CA file: the
	 * system's CA list, parsed anew for every connection, CPU work that no
	 * deadline interrupts (milliseconds, but 2 s for four connections at
	 * once under ThreadSanitizer). The test's CA as the default keeps that
	 * out of the timings. */
	GError *e = NULL;
	GTlsDatabase *db = g_tls_file_database_new(tmp_path("ca.pem"), &e);
	if (db == NULL)
		fprintf(stderr, "  %s: %s\n", tmp_path("ca.pem"), e->message);
	REQUIRE(db != NULL);
	g_tls_backend_set_default_database(g_tls_backend_get_default(), db);
	g_object_unref(db);
	TEST_RUN(silent_handshake);
	TEST_RUN(silent_reply);
	TEST_RUN(full_backlog);
	if (getenv("TE_METADATA_SERVER_BIN") != NULL)
		TEST_RUN(stalled_handshake);
	TEST_RUN(held_context);
	harness_passed = check_failures == 0;
	return check_done();
}
