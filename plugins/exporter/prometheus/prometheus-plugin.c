/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Prometheus exporter: libsoup 3's SoupServer, on a thread and a
 * GMainContext of its own, serving the process's metrics.
 *
 *   GET /metrics   200, text format 0.0.4: the host's metrics_text()
 *   other paths    404
 *   other methods  405
 *   a request body 413 (never read)
 *
 * With a token file every request needs "Authorization: Bearer <token>"
 * (401 otherwise), compared through its SHA-256 in constant time, as
 * te-metadata-server does. Connections are accepted here, not by libsoup,
 * so that their number is bounded (TE_METRICS_MAX_CONNECTIONS, and
 * TE_METRICS_MAX_CONNECTIONS_PER_ADDR from one client address), the
 * request head must be complete within TE_METRICS_HEADER_TIMEOUT_S of the
 * accept (a TLS handshake included) and an idle connection is closed
 * (TE_METRICS_IDLE_TIMEOUT_S). With a certificate and its key
 * (TE_METRICS_TLS_CERT, TE_METRICS_TLS_KEY) each accepted connection is
 * wrapped in GIO's TLS (glib-networking) before libsoup sees it: https.
 *
 * Threads: everything here runs on the server thread but the release of a
 * connection's count, which runs where GIO finalizes the connection: with
 * TLS that may be glib-networking's handshake thread. So the counts are
 * under acct_lock, and destroy waits for every connection to be released
 * before the exporter is freed.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <gio/gio.h>
#include <glib.h>
#include <json-glib/json-glib.h>
#include <libsoup/soup.h>
#include <te/te-json.h>
#include "teu-bearer.h"
#include "teu-hostport.h"
#include "teu-refuse.h"

#include <te/te-plugin.h>

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

typedef struct exporter {
	const te_host *h;
	const te_metrics_service *metrics; /* the host's TE_SERVICE_METRICS */
	GMainContext *ctx;
	GMainLoop *loop;
	GThread *thread;
	GSocketAddress *want; /* where to listen */
	SoupServer *srv;
	GSocketService *svc;
	char *url;
	teu_bearer token;
	GTlsCertificate *cert; /* https when set */
	unsigned max_conns;
	unsigned max_per_addr;
	unsigned idle_s;
	unsigned head_s;
	GHashTable *live; /* "ADDR PORT" -> conn, the accepted ones (server thread only) */
	/* Accepted connections not yet finalized, in all and per client
	 * address ("ADDR" -> count): touched from any thread, under acct_lock. */
	GMutex acct_lock;
	unsigned conns;
	GHashTable *per_addr;
	bool stuck; /* connections outlived destroy's wait: the exporter is kept */
	/* create() waits for the server thread to listen or to fail */
	GMutex lock;
	GCond cond;
	bool settled;
	int start_rc;
	char why[256];
} exporter;

static te_ratelimit refusal_rl, busy_rl, head_rl;

/* One accepted connection. The table of live connections holds one
 * reference, the GSocketConnection's data the other: conn_release runs when
 * GIO finalizes the connection, on whichever thread drops it last. */
typedef struct conn {
	gint refs;
	exporter *x;
	char *ip;          /* the per-address count's key */
	char *key;         /* the live table's key */
	GSocket *sock;     /* server thread only */
	GSource *deadline; /* server thread only: the request head's */
	gint released;     /* atomic: the connection is finalized */
} conn;

static conn *conn_of(exporter *x, SoupServerMessage *msg);

/* NULL when `msg` may go on, else why not (for the log, never the token). */
static const char *unauthorized(exporter *x, SoupServerMessage *msg)
{
	return teu_bearer_refuse(&x->token, soup_message_headers_get_one(soup_server_message_get_request_headers(msg),
									 "Authorization"));
}

static void log_refusal(exporter *x, SoupServerMessage *msg, unsigned status, const char *why)
{
	unsigned held;

	if (!te_ratelimit_allow(&refusal_rl, &held))
		return;
	const char *host = soup_server_message_get_remote_host(msg);
	x->h->log(x->h, TE_LOG_WARN, "metrics endpoint: %u to %s for %s %s: %s (%u similar lines held back)",
		  status, host ? host : "?", soup_server_message_get_method(msg),
		  g_uri_get_path(soup_server_message_get_uri(msg)), why, held);
}

static void refuse_early(exporter *x, SoupServerMessage *msg, unsigned status)
{
	teu_refuse_early(x->ctx, msg, status, NULL, "libte metrics",
			g_strdup_printf("%s\n", soup_status_get_phrase(status)));
}

/* Runs once the headers are in, before any body is read. */
static void early_handler(SoupServer *srv, SoupServerMessage *msg, const char *path, GHashTable *query,
			  gpointer data)
{
	exporter *x = data;
	(void)srv;
	(void)path;
	(void)query;

	conn *c = conn_of(x, msg);
	if (c != NULL && c->deadline != NULL) { /* the head is in: in time */
		g_source_destroy(c->deadline);
		g_source_unref(c->deadline);
		c->deadline = NULL;
	}
	const char *why = unauthorized(x, msg);
	if (why != NULL) {
		log_refusal(x, msg, SOUP_STATUS_UNAUTHORIZED, why);
		refuse_early(x, msg, SOUP_STATUS_UNAUTHORIZED);
		return;
	}
	SoupMessageHeaders *hd = soup_server_message_get_request_headers(msg);
	SoupEncoding enc = soup_message_headers_get_encoding(hd);
	if (enc == SOUP_ENCODING_CHUNKED || enc == SOUP_ENCODING_EOF ||
	    (enc == SOUP_ENCODING_CONTENT_LENGTH && soup_message_headers_get_content_length(hd) > 0))
		refuse_early(x, msg, SOUP_STATUS_REQUEST_ENTITY_TOO_LARGE);
}

static void reply_text(SoupServerMessage *msg, unsigned status, const char *text)
{
	soup_server_message_set_status(msg, status, NULL);
	soup_server_message_set_response(msg, "text/plain; charset=utf-8", SOUP_MEMORY_COPY, text,
					 strlen(text));
}

static void handler(SoupServer *srv, SoupServerMessage *msg, const char *path, GHashTable *query,
		    gpointer data)
{
	exporter *x = data;
	const char *method = soup_server_message_get_method(msg);
	(void)srv;
	(void)query;

	if (unauthorized(x, msg) != NULL) { /* the early handler's check, once more */
		soup_message_headers_replace(soup_server_message_get_response_headers(msg), "WWW-Authenticate",
					     "Bearer realm=\"libte metrics\"");
		reply_text(msg, SOUP_STATUS_UNAUTHORIZED, "Unauthorized\n");
		return;
	}
	if (strcmp(path, "/metrics") != 0) {
		reply_text(msg, SOUP_STATUS_NOT_FOUND, "Not Found: the metrics are at /metrics\n");
		return;
	}
	if (strcmp(method, SOUP_METHOD_GET) != 0 && strcmp(method, SOUP_METHOD_HEAD) != 0) {
		soup_message_headers_replace(soup_server_message_get_response_headers(msg), "Allow", "GET, HEAD");
		reply_text(msg, SOUP_STATUS_METHOD_NOT_ALLOWED, "Method Not Allowed\n");
		return;
	}
	char *text = NULL;
	size_t len = 0;
	int rc = x->metrics->metrics_text(x->h, &text, &len);
	if (rc < 0 || text == NULL) {
		/* Counting is off (TE_METRICS=0) or memory ran out: say so
		 * rather than serve an empty page that looks like idle engines. */
		char *t = g_strdup_printf("metrics unavailable: %s\n",
					  rc == -ENOTSUP ? "counting is off (TE_METRICS=0)" : g_strerror(-rc));
		reply_text(msg, SOUP_STATUS_SERVICE_UNAVAILABLE, t);
		g_free(t);
		free(text);
		return;
	}
	soup_server_message_set_status(msg, SOUP_STATUS_OK, NULL);
	soup_server_message_set_response(msg, CONTENT_TYPE, SOUP_MEMORY_COPY, text, len);
	free(text);
}

/* ------------------------------------------------------------ connections */

/* "ADDR" of an inet socket address, or "ADDR PORT" with the port. */
static char *addr_key(GSocketAddress *a, bool with_port)
{
	if (!G_IS_INET_SOCKET_ADDRESS(a))
		return NULL;
	GInetSocketAddress *ia = G_INET_SOCKET_ADDRESS(a);
	char *host = g_inet_address_to_string(g_inet_socket_address_get_address(ia));
	if (!with_port)
		return host;
	char *k = g_strdup_printf("%s %u", host, g_inet_socket_address_get_port(ia));
	g_free(host);
	return k;
}

static void conn_unref(conn *c)
{
	if (!g_atomic_int_dec_and_test(&c->refs))
		return;
	g_clear_object(&c->sock);
	g_free(c->ip);
	g_free(c->key);
	g_free(c);
}

/* The connection's data notify: any thread, once per accepted connection. */
static void conn_release(gpointer data)
{
	conn *c = data;
	exporter *x = c->x;

	g_mutex_lock(&x->acct_lock);
	x->conns--;
	unsigned n = GPOINTER_TO_UINT(g_hash_table_lookup(x->per_addr, c->ip));
	if (n <= 1)
		g_hash_table_remove(x->per_addr, c->ip);
	else
		g_hash_table_insert(x->per_addr, g_strdup(c->ip), GUINT_TO_POINTER(n - 1));
	g_atomic_int_set(&c->released, 1);
	/* destroy may be waiting for the count to reach 0; x lives until it
	 * has seen that, under this lock. */
	g_main_context_wakeup(x->ctx);
	g_mutex_unlock(&x->acct_lock);
	conn_unref(c);
}

/* The live table's value destroy (server thread). */
static void conn_forget(gpointer data)
{
	conn *c = data;

	if (c->deadline != NULL) {
		g_source_destroy(c->deadline);
		g_source_unref(c->deadline);
		c->deadline = NULL;
	}
	conn_unref(c);
}

static gboolean is_released(gpointer key, gpointer value, gpointer data)
{
	conn *c = value;
	(void)key;
	(void)data;
	return g_atomic_int_get(&c->released);
}

/* Ends the connection at the socket: its reader, libsoup's on this thread
 * or a TLS handshake on glib-networking's, sees the end of input at once
 * and lets go of it. Only this thread closes these sockets (libsoup,
 * teu_refuse_early and on_incoming close a connection on it before they let
 * go of it), so one that is not closed is still this connection's. */
static void conn_shut(conn *c)
{
	if (!g_atomic_int_get(&c->released) && !g_socket_is_closed(c->sock))
		g_socket_shutdown(c->sock, TRUE, TRUE, NULL);
}

static gboolean head_overdue(gpointer data)
{
	conn *c = data;
	exporter *x = c->x;
	unsigned held;

	if (!g_atomic_int_get(&c->released)) {
		if (te_ratelimit_allow(&head_rl, &held))
			x->h->log(x->h, TE_LOG_WARN,
				  "metrics endpoint: %s sent no complete request head within %u s "
				  "(TE_METRICS_HEADER_TIMEOUT_S); closed (%u similar lines held back)",
				  c->ip, x->head_s, held);
		conn_shut(c);
	}
	g_source_unref(c->deadline);
	c->deadline = NULL;
	g_hash_table_remove(x->live, c->key); /* may free c */
	return G_SOURCE_REMOVE;
}

/* The request head is due within head_s from now. libsoup closes a
 * connection it did not accept itself after one response, so there is one
 * head per connection. */
static void arm_deadline(conn *c)
{
	c->deadline = g_timeout_source_new(c->x->head_s * 1000);
	g_source_set_callback(c->deadline, head_overdue, c, NULL);
	g_source_attach(c->deadline, c->x->ctx);
}

/* The connection `msg` came on, while it is in the live table. */
static conn *conn_of(exporter *x, SoupServerMessage *msg)
{
	char *key = addr_key(soup_server_message_get_remote_address(msg), true);
	conn *c = key ? g_hash_table_lookup(x->live, key) : NULL;
	g_free(key);
	return c != NULL && !g_atomic_int_get(&c->released) ? c : NULL;
}

static void refuse_busy(exporter *x, GSocketConnection *conn, const char *ip, unsigned total, bool crowded)
{
	static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
				   "Retry-After: 1\r\nConnection: close\r\n\r\n";
	unsigned held;

	if (te_ratelimit_allow(&busy_rl, &held)) {
		if (crowded)
			x->h->log(x->h, TE_LOG_WARN,
				  "metrics endpoint: %s has %u connections open (TE_METRICS_MAX_CONNECTIONS_PER_ADDR); "
				  "one more refused (%u similar lines held back)", ip, x->max_per_addr, held);
		else
			x->h->log(x->h, TE_LOG_WARN,
				  "metrics endpoint: %u connections open (TE_METRICS_MAX_CONNECTIONS); one more from %s "
				  "refused (%u similar lines held back)", total, ip, held);
	}
	/* non-blocking, best effort */
	g_socket_send(g_socket_connection_get_socket(conn), busy, sizeof busy - 1, NULL, NULL);
	g_io_stream_close(G_IO_STREAM(conn), NULL, NULL);
}

/* Accepted here, counted, and handed to libsoup while under the bounds;
 * the count is released when GIO finalizes the connection. */
static gboolean on_incoming(GSocketService *svc, GSocketConnection *sc, GObject *source, gpointer data)
{
	exporter *x = data;
	GError *err = NULL;
	(void)svc;
	(void)source;

	g_hash_table_foreach_remove(x->live, is_released, NULL);
	GSocket *sock = g_socket_connection_get_socket(sc);
	GSocketAddress *local = g_socket_connection_get_local_address(sc, NULL);
	GSocketAddress *remote = g_socket_connection_get_remote_address(sc, NULL);
	char *ip = remote ? addr_key(remote, false) : NULL;
	if (local == NULL || ip == NULL) {
		x->h->log(x->h, TE_LOG_WARN, "metrics endpoint: a connection without addresses closed");
		g_io_stream_close(G_IO_STREAM(sc), NULL, NULL);
		goto out;
	}
	g_mutex_lock(&x->acct_lock);
	unsigned total = x->conns, mine = GPOINTER_TO_UINT(g_hash_table_lookup(x->per_addr, ip));
	bool full = total >= x->max_conns, crowded = !full && mine >= x->max_per_addr;
	if (!full && !crowded) {
		x->conns++;
		g_hash_table_insert(x->per_addr, g_strdup(ip), GUINT_TO_POINTER(mine + 1));
	}
	g_mutex_unlock(&x->acct_lock);
	if (full || crowded) {
		refuse_busy(x, sc, ip, total, crowded);
		goto out;
	}
	conn *c = g_new0(conn, 1);
	c->refs = 2;
	c->x = x;
	c->ip = g_strdup(ip);
	c->key = addr_key(remote, true);
	c->sock = g_object_ref(sock);
	g_object_set_data_full(G_OBJECT(sc), "te-metrics-conn", c, conn_release);
	g_hash_table_replace(x->live, g_strdup(c->key), c);
	/* The head is due within head_s of now, a TLS handshake included; an
	 * idle or stalled client is dropped after idle_s in any case. */
	arm_deadline(c);
	g_socket_set_timeout(sock, x->idle_s);
	/* https: libsoup gets the TLS stream, whose handshake runs on its first read. */
	GIOStream *stream = x->cert ? g_tls_server_connection_new(G_IO_STREAM(sc), x->cert, &err)
				    : g_object_ref(G_IO_STREAM(sc));
	if (stream == NULL || !soup_server_accept_iostream(x->srv, stream, local, remote, &err)) {
		x->h->log(x->h, TE_LOG_WARN, "metrics endpoint: a connection could not be served: %s",
			  err ? err->message : "?");
		g_clear_error(&err);
		g_io_stream_close(G_IO_STREAM(sc), NULL, NULL);
	}
	g_clear_object(&stream);
out:
	g_free(ip);
	g_clear_object(&local);
	g_clear_object(&remote);
	return TRUE;
}

static void shut_live(gpointer key, gpointer value, gpointer data)
{
	(void)key;
	(void)data;
	conn_shut(value);
}

/* Wakes the wait below now and then, to look at the clock. */
static gboolean keep_ticking(gpointer data)
{
	(void)data;
	return G_SOURCE_CONTINUE;
}

/* Runs the loop until GIO has finalized every connection or `end` has
 * passed; whether it has. */
static bool wait_released(exporter *x, gint64 end)
{
	for (;;) {
		g_mutex_lock(&x->acct_lock);
		unsigned left = x->conns;
		g_mutex_unlock(&x->acct_lock);
		if (left == 0)
			return true;
		if (g_get_monotonic_time() >= end)
			return false;
		g_main_context_iteration(x->ctx, TRUE);
	}
}

/* Destroy's end on the server thread: no connection of this exporter, nor
 * a handshake thread holding one, may outlive it. Every socket is shut, so
 * that its reader (libsoup here, a TLS handshake on glib-networking's
 * thread) sees the end of input at once and libsoup lets go of it as of any
 * failed connection; the loop runs until GIO has finalized them all.
 * (Closing them through soup_server_disconnect() first would not do: a
 * close during a handshake fails on the thread that started it, and the
 * TLS connection stays held by its own handshake.) Bounded: should one
 * never be released, the exporter is kept rather than freed under it. */
static void release_all(exporter *x)
{
	gint64 end = g_get_monotonic_time() + 10 * G_USEC_PER_SEC;
	GSource *tick = g_timeout_source_new(50);

	g_source_set_callback(tick, keep_ticking, NULL, NULL);
	g_source_attach(tick, x->ctx);
	g_hash_table_foreach(x->live, shut_live, NULL);
	bool done = wait_released(x, end);
	soup_server_disconnect(x->srv); /* whatever is left */
	g_clear_object(&x->svc);
	g_clear_object(&x->srv);
	if (!done && !wait_released(x, end)) {
		g_mutex_lock(&x->acct_lock);
		unsigned left = x->conns;
		g_mutex_unlock(&x->acct_lock);
		x->h->log(x->h, TE_LOG_ERROR, "metrics endpoint: %u connections not released 10 s after "
			  "stopping; the exporter's memory is kept", left);
		x->stuck = true;
	}
	g_source_destroy(tick);
	g_source_unref(tick);
	g_hash_table_remove_all(x->live);
}

/* ---------------------------------------------------------------- thread */

static void settle(exporter *x, int rc)
{
	g_mutex_lock(&x->lock);
	x->start_rc = rc;
	x->settled = true;
	g_cond_signal(&x->cond);
	g_mutex_unlock(&x->lock);
}

static char *url_of(GSocketAddress *a, bool https)
{
	GInetAddress *ia = g_inet_socket_address_get_address(G_INET_SOCKET_ADDRESS(a));
	char *host = g_inet_address_to_string(ia);
	guint16 port = g_inet_socket_address_get_port(G_INET_SOCKET_ADDRESS(a));
	const char *scheme = https ? "https" : "http";
	char *u = g_inet_address_get_family(ia) == G_SOCKET_FAMILY_IPV6
			  ? g_strdup_printf("%s://[%s]:%u/metrics", scheme, host, port)
			  : g_strdup_printf("%s://%s:%u/metrics", scheme, host, port);
	g_free(host);
	return u;
}

static gpointer server_main(gpointer data)
{
	exporter *x = data;
	GError *err = NULL;
	GSocketAddress *got = NULL;

	/* Every source below (listener, connections, libsoup's I/O) is made in
	 * this context, so it runs on this thread only. */
	g_main_context_push_thread_default(x->ctx);
	x->srv = soup_server_new("server-header", "libte-metrics", NULL);
	soup_server_add_early_handler(x->srv, NULL, early_handler, x, NULL);
	soup_server_add_handler(x->srv, NULL, handler, x, NULL);
	x->svc = g_socket_service_new();
	g_socket_listener_set_backlog(G_SOCKET_LISTENER(x->svc), 64);
	if (!g_socket_listener_add_address(G_SOCKET_LISTENER(x->svc), x->want, G_SOCKET_TYPE_STREAM,
					   G_SOCKET_PROTOCOL_TCP, NULL, (GSocketAddress **)&got, &err)) {
		int rc = g_error_matches(err, G_IO_ERROR, G_IO_ERROR_ADDRESS_IN_USE) ? -EADDRINUSE
										     : -EADDRNOTAVAIL;
		g_strlcpy(x->why, err->message, sizeof x->why);
		g_error_free(err);
		settle(x, rc);
		goto out;
	}
	x->url = url_of(got, x->cert != NULL);
	g_object_unref(got);
	g_signal_connect(x->svc, "incoming", G_CALLBACK(on_incoming), x);
	g_socket_service_start(x->svc);
	settle(x, 0);
	g_main_loop_run(x->loop);
	g_socket_service_stop(x->svc);
	g_socket_listener_close(G_SOCKET_LISTENER(x->svc));
out:
	release_all(x);
	/* Connections closed above release their sources on the way out. */
	while (g_main_context_iteration(x->ctx, FALSE))
		;
	g_main_context_pop_thread_default(x->ctx);
	return NULL;
}

static gboolean quit_loop(gpointer data)
{
	g_main_loop_quit(data);
	return G_SOURCE_REMOVE;
}

/* ------------------------------------------------------------------- ops */

/* "host:port", "[v6]:port", ":port" or "port" (the last two: loopback).
 * Numeric addresses and "localhost" only: where the endpoint listens must
 * not depend on a resolver. */
static GSocketAddress *parse_addr(const char *s, char *why, size_t whylen)
{
	char host[TEU_HOST_MAX], only_port[8];
	int port = -1;

	/* a bare port: the loopback address */
	if (strlen(s) < sizeof only_port - 1 && strspn(s, "0123456789") == strlen(s)) {
		g_snprintf(only_port, sizeof only_port, ":%s", s);
		s = only_port;
	}
	if (teu_hostport_split(s, host, sizeof host, &port) < 0 || port < 0)
		goto bad;
	if (*host == '\0' || g_ascii_strcasecmp(host, "localhost") == 0)
		g_strlcpy(host, "127.0.0.1", sizeof host);
	GInetAddress *ia = g_inet_address_new_from_string(host);
	if (ia == NULL)
		goto bad;
	GSocketAddress *a = g_inet_socket_address_new(ia, (guint16)port);
	g_object_unref(ia);
	return a;
bad:
	g_snprintf(why, whylen, "'%s' is not HOST:PORT with a numeric address and a port from 0 to 65535",
		   s == only_port ? s + 1 : s);
	return NULL;
}

/* The token (util/teu-bearer.h says what one is). */
static int load_token(exporter *x, const char *path)
{
	char why[512];
	bool weak = false;
	int rc = teu_bearer_load(&x->token, path, &weak, why, sizeof why);

	if (rc < 0) {
		x->h->log(x->h, TE_LOG_ERROR, "metrics endpoint: %s", why);
		return -EINVAL;
	}
	if (weak)
		x->h->log(x->h, TE_LOG_WARN,
			  "metrics endpoint: the token in %s is shorter than 16 characters; a long random "
			  "one (openssl rand -hex 32) resists guessing", path);
	return 0;
}

/* https: the certificate (chain) and its key, PEM files, both or neither. */
static int load_tls(exporter *x, const char *cert, const char *key)
{
	GError *err = NULL;

	if ((cert == NULL) != (key == NULL)) {
		x->h->log(x->h, TE_LOG_ERROR, "metrics endpoint: TE_METRICS_TLS_CERT and TE_METRICS_TLS_KEY "
			  "go together (%s is missing)", cert ? "the key" : "the certificate");
		return -EINVAL;
	}
	if (cert == NULL)
		return 0;
	if (!g_tls_backend_supports_tls(g_tls_backend_get_default())) {
		x->h->log(x->h, TE_LOG_ERROR, "metrics endpoint: https asked for, but GLib has no TLS backend "
			  "here (install glib-networking)");
		return -ENOTSUP;
	}
	x->cert = g_tls_certificate_new_from_files(cert, key, &err);
	if (x->cert == NULL) {
		x->h->log(x->h, TE_LOG_ERROR, "metrics endpoint: cannot load the certificate %s and key %s: %s",
			  cert, key, err->message);
		g_error_free(err);
		return -EINVAL;
	}
	return 0;
}

/* {"token_file": PATH, "tls_cert": PATH, "tls_key": PATH}: bounded before
 * it is parsed, like every JSON text from outside. */
static int parse_args(exporter *x, const char *json_args)
{
	static const te_json_limits lim = { 2, 16, 16, 4096, 16384 };
	char why[160];
	const char *cert = NULL, *key = NULL;
	int rc = 0;

	if (json_args == NULL || *json_args == '\0')
		return 0;
	JsonNode *root = te_json_load(json_args, strlen(json_args), &lim, why, sizeof why);
	if (root == NULL || !JSON_NODE_HOLDS_OBJECT(root)) {
		x->h->log(x->h, TE_LOG_ERROR, "metrics endpoint: arguments are not a JSON object: %s",
			  root ? "not an object" : why);
		if (root)
			json_node_unref(root);
		return -EINVAL;
	}
	JsonObject *o = json_node_get_object(root);
	GList *members = json_object_get_members(o);
	for (GList *l = members; l != NULL && rc == 0; l = l->next) {
		const char *k = l->data;
		JsonNode *v = json_object_get_member(o, k);
		if (strcmp(k, "token_file") != 0 && strcmp(k, "tls_cert") != 0 && strcmp(k, "tls_key") != 0) {
			x->h->log(x->h, TE_LOG_ERROR, "metrics endpoint: unknown argument '%s'", k);
			rc = -EINVAL;
		} else if (!JSON_NODE_HOLDS_VALUE(v) || json_node_get_value_type(v) != G_TYPE_STRING ||
			   *json_node_get_string(v) == '\0') {
			x->h->log(x->h, TE_LOG_ERROR, "metrics endpoint: %s is not a file name", k);
			rc = -EINVAL;
		} else if (strcmp(k, "token_file") == 0) {
			rc = load_token(x, json_node_get_string(v));
		} else if (strcmp(k, "tls_cert") == 0) {
			cert = json_node_get_string(v);
		} else {
			key = json_node_get_string(v);
		}
	}
	if (rc == 0)
		rc = load_tls(x, cert, key);
	g_list_free(members);
	json_node_unref(root);
	return rc;
}

static void prom_free(exporter *x)
{
	if (x->live)
		g_hash_table_destroy(x->live);
	if (x->per_addr)
		g_hash_table_destroy(x->per_addr);
	g_mutex_clear(&x->acct_lock);
	if (x->ctx)
		g_main_context_unref(x->ctx);
	if (x->loop)
		g_main_loop_unref(x->loop);
	g_clear_object(&x->want);
	g_clear_object(&x->cert);
	g_free(x->url);
	g_mutex_clear(&x->lock);
	g_cond_clear(&x->cond);
	teu_bearer_clear(&x->token);
	g_free(x);
}

static int prom_create(const te_host *h, const char *addr, const char *json_args, void **ctx)
{
	if (h == NULL || ctx == NULL)
		return -EINVAL;
	*ctx = NULL;
	const te_metrics_service *metrics = te_host_service(h, TE_SERVICE_METRICS, 1);
	if (metrics == NULL || !TE_HAS_OP(metrics, metrics_text)) {
		h->log(h, TE_LOG_ERROR, "metrics endpoint: this libte offers no metrics_text (plugin ABI 1.13)");
		return -ENOTSUP;
	}
	if (addr == NULL || *addr == '\0') {
		h->log(h, TE_LOG_ERROR, "metrics endpoint: no address to listen on");
		return -EINVAL;
	}
	exporter *x = g_new0(exporter, 1);
	char why[200];
	x->h = h;
	x->metrics = metrics;
	g_mutex_init(&x->lock);
	g_cond_init(&x->cond);
	g_mutex_init(&x->acct_lock);
	x->live = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, conn_forget);
	x->per_addr = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
	x->max_conns = (unsigned)te_host_config_u64(h, "TE_METRICS_MAX_CONNECTIONS", NULL, 16, 1, 1024);
	/* Half the default bound: one address (a scanner, a broken client)
	 * leaves room for a Prometheus server and te-top elsewhere. */
	x->max_per_addr = (unsigned)te_host_config_u64(h, "TE_METRICS_MAX_CONNECTIONS_PER_ADDR", NULL, 8, 1, 1024);
	x->idle_s = (unsigned)te_host_config_u64(h, "TE_METRICS_IDLE_TIMEOUT_S", NULL, 30, 1, 3600);
	x->head_s = (unsigned)te_host_config_u64(h, "TE_METRICS_HEADER_TIMEOUT_S", NULL, 5, 1, 3600);
	x->want = parse_addr(addr, why, sizeof why);
	if (x->want == NULL) {
		h->log(h, TE_LOG_ERROR, "metrics endpoint: TE_METRICS_ADDR %s", why);
		prom_free(x);
		return -EINVAL;
	}
	int rc = parse_args(x, json_args);
	if (rc < 0) {
		prom_free(x);
		return rc;
	}
	x->ctx = g_main_context_new();
	x->loop = g_main_loop_new(x->ctx, FALSE);
	x->thread = g_thread_try_new("te-metrics", server_main, x, NULL);
	if (x->thread == NULL) {
		h->log(h, TE_LOG_ERROR, "metrics endpoint: cannot start its thread");
		prom_free(x);
		return -ENOMEM;
	}
	g_mutex_lock(&x->lock);
	while (!x->settled)
		g_cond_wait(&x->cond, &x->lock);
	g_mutex_unlock(&x->lock);
	if (x->start_rc < 0) {
		g_thread_join(x->thread);
		h->log(h, TE_LOG_ERROR, "metrics endpoint: cannot listen on %s: %s", addr, x->why);
		rc = x->start_rc;
		prom_free(x);
		return rc;
	}
	*ctx = x;
	return 0;
}

static void prom_destroy(void *ctx)
{
	exporter *x = ctx;

	if (x == NULL)
		return;
	GSource *s = g_idle_source_new();
	g_source_set_callback(s, quit_loop, x->loop, NULL);
	g_source_attach(s, x->ctx);
	g_source_unref(s);
	g_thread_join(x->thread);
	if (!x->stuck)
		prom_free(x);
}

static int prom_url(void *ctx, char *buf, size_t size)
{
	exporter *x = ctx;

	if (x == NULL || buf == NULL || size == 0)
		return -EINVAL;
	if (g_strlcpy(buf, x->url, size) >= size)
		return -ENAMETOOLONG;
	return 0;
}

static const te_exporter_ops prom_ops = {
	.size = sizeof(te_exporter_ops),
	.create = prom_create,
	.destroy = prom_destroy,
	.url = prom_url,
};

TE_PLUGIN_DEFINE(TE_KIND_EXPORTER, "prometheus", "1.0.0",
		 "Prometheus endpoint: GET /metrics in the text format (libsoup 3)", "Apache-2.0", &prom_ops)
