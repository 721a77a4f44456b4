/* SPDX-License-Identifier: Apache-2.0 */
/* The metrics endpoint over https (TE_METRICS_TLS_CERT, TE_METRICS_TLS_KEY)
 * against clients that start a TLS handshake and never finish it: they are
 * cut at TE_METRICS_HEADER_TIMEOUT_S while a whole scrape is served, and an
 * engine destroyed while their handshakes are pending stops at once and
 * cleanly (this test runs under ASan and TSan too). Needs openssl to make
 * the certificate; skipped without it. */
#include <gio/gio.h>

#include "endpoint-client.h"

static char dir[] = "/tmp/te-metrics-tls-XXXXXX";
static char cert[256], key[256];

static te_engine *https_endpoint(const char *head_timeout_s, int *port)
{
	te_option o[] = { { "metrics_addr", "127.0.0.1:0" }, { "metrics_tls_cert", cert }, { "metrics_tls_key", key } };
	te_engine *e = NULL;

	setenv("TE_METRICS_HEADER_TIMEOUT_S", head_timeout_s, 1);
	setenv("TE_METRICS_IDLE_TIMEOUT_S", "30", 1);
	cap_start();
	int rc = te_engine_create("P2PHANDSHAKE", "127.0.0.1", o, 3, &e);
	unsetenv("TE_METRICS_HEADER_TIMEOUT_S");
	unsetenv("TE_METRICS_IDLE_TIMEOUT_S");
	REQUIRE(rc == 0 && e != NULL);
	*port = logged_port_of("https");
	REQUIRE(*port > 0);
	return e;
}

/* A connection from `from` that sends the first bytes of a ClientHello (a
 * handshake record announcing 512 bytes) and no more: the server's
 * handshake waits for the rest. */
static int half_hello(const char *from, int port)
{
	static const unsigned char hello[] = { 0x16, 0x03, 0x01, 0x02, 0x00, /* record: handshake, 512 bytes */
					       0x01, 0x00, 0x01, 0xfc,       /* ClientHello, 508 bytes */
					       0x03, 0x03, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 };
	int fd = connect_from(from, port);
	REQUIRE(fd >= 0);
	REQUIRE(send(fd, hello, sizeof hello, MSG_NOSIGNAL) == (ssize_t)sizeof hello);
	return fd;
}

/* GET /metrics over https, trusting the endpoint's certificate; the status
 * or -1. */
static int https_get(int port)
{
	GError *err = NULL;
	int status = -1;
	GTlsDatabase *db = g_tls_file_database_new(cert, &err);
	GSocketClient *client = g_socket_client_new();
	GSocketConnection *sc = NULL;
	GIOStream *tls = NULL;

	g_socket_client_set_timeout(client, 10);
	g_socket_client_set_enable_proxy(client, FALSE); /* no proxy resolver, no GSettings */
	if (db == NULL || (sc = g_socket_client_connect_to_host(client, "127.0.0.1", (guint16)port, NULL, &err)) == NULL)
		goto out;
	GSocketConnectable *id = g_network_address_new("127.0.0.1", (guint16)port);
	tls = g_tls_client_connection_new(G_IO_STREAM(sc), id, &err);
	g_object_unref(id);
	if (tls == NULL)
		goto out;
	g_tls_connection_set_database(G_TLS_CONNECTION(tls), db);
	static const char req[] = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
	if (!g_tls_connection_handshake(G_TLS_CONNECTION(tls), NULL, &err) ||
	    !g_output_stream_write_all(g_io_stream_get_output_stream(tls), req, sizeof req - 1, NULL, NULL, &err))
		goto out;
	char buf[4096];
	gsize got = 0;
	if (!g_input_stream_read_all(g_io_stream_get_input_stream(tls), buf, sizeof buf - 1, &got, NULL, &err))
		goto out;
	buf[got] = '\0';
	if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1)
		status = -1;
out:
	if (err != NULL)
		fprintf(stderr, "  https_get: %s\n", err->message);
	g_clear_error(&err);
	if (tls != NULL)
		g_io_stream_close(tls, NULL, NULL);
	g_clear_object(&tls);
	g_clear_object(&sc);
	g_clear_object(&client);
	g_clear_object(&db);
	return status;
}

/* Half-sent ClientHellos hold their places until the head deadline (3 s,
 * time for a whole scrape under a sanitizer on a loaded machine), well
 * before the idle timeout (30 s); a scrape meanwhile is served. */
static void test_half_hellos(void)
{
	enum { N = 6 };
	static const char *const from[N] = { "127.0.0.2", "127.0.0.2", "127.0.0.2",
					     "127.0.0.3", "127.0.0.3", "127.0.0.3" };
	int port, fd[N];

	te_engine *e = https_endpoint("3", &port);
	long long t0 = now_ms();
	for (int i = 0; i < N; i++)
		fd[i] = half_hello(from[i], port);
	CHECK_EQ(https_get(port), 200);
	for (int i = 0; i < N; i++) {
		CHECK_EQ(wait_closed(fd[i], 15000), 0);
		close(fd[i]);
	}
	long long took = now_ms() - t0;
	CHECK(took >= 3000 && took < 15000);
	CHECK(cap_has("TE_METRICS_HEADER_TIMEOUT_S"));
	CHECK_EQ(https_get(port), 200);
	te_engine_destroy(e);
}

/* Destroyed while handshakes wait for the rest of their ClientHello: the
 * engine goes without waiting for the idle timeout (30 s) to end them,
 * every connection is released (none outlives the exporter), the clients
 * see the end, and nothing of the exporter is touched after (ASan, TSan). */
static void test_destroy_pending(void)
{
	enum { N = 8, ROUNDS = 3 };
	static const char *const from[N] = { "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5",
					     "127.0.0.6", "127.0.0.7", "127.0.0.8", "127.0.0.9" };

	for (int round = 0; round < ROUNDS; round++) {
		int port, fd[N];
		te_engine *e = https_endpoint("60", &port);
		for (int i = 0; i < N; i++)
			fd[i] = half_hello(from[i], port);
		/* Give the handshakes (started on the first read after the
		 * accept) time to wait in their threads; some may yet be queued
		 * at destroy, which must be as clean. */
		sleep_ms(100 + 200 * round);
		long long t0 = now_ms();
		te_engine_destroy(e);
		long long took = now_ms() - t0;
		CHECK(took < 25000);
		CHECK(!cap_has_quiet("not released"));
		if (took >= 25000)
			fprintf(stderr, "  round %d: destroy took %lld ms\n", round, took);
		for (int i = 0; i < N; i++) {
			CHECK_EQ(wait_closed(fd[i], 2000), 0);
			close(fd[i]);
		}
	}
}

int main(void)
{
	char cmd[1024];

	unsetenv("TE_METRICS_ADDR");
	if (system("command -v openssl >/dev/null 2>&1") != 0) {
		fprintf(stderr, "SKIP: openssl is not installed\n");
		return 77;
	}
	REQUIRE(mkdtemp(dir) != NULL);
	snprintf(cert, sizeof cert, "%s/cert.pem", dir);
	snprintf(key, sizeof key, "%s/key.pem", dir);
	snprintf(cmd, sizeof cmd,
		 "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=127.0.0.1 "
		 "-addext subjectAltName=IP:127.0.0.1 -keyout %s -out %s 2>/dev/null", key, cert);
	REQUIRE(system(cmd) == 0);
	te_set_log_level(TE_LOG_INFO);
	TEST_RUN(test_half_hellos);
	TEST_RUN(test_destroy_pending);
	unlink(cert);
	unlink(key);
	rmdir(dir);
	return check_done();
}
