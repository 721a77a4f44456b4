/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Prometheus exporter: libsoup 3's SoupServer, on a thread and a
 * GMainContext of its own, serving the process's metrics.
 *
 *   GET /metrics   200, text format 0.0.4: host->metrics_text()
 *   other paths    404
 *   other methods  405
 *   a request body 413 (never read)
 *
 * With a token file every request needs "Authorization: Bearer <token>"
 * (401 otherwise), compared through its SHA-256 in constant time, as
 * te-metadata-server does. Connections are accepted here, not by libsoup,
 * so that their number is bounded (TE_METRICS_MAX_CONNECTIONS) and an idle
 * one is closed (TE_METRICS_IDLE_TIMEOUT_S). With a certificate and its key
 * (TE_METRICS_TLS_CERT, TE_METRICS_TLS_KEY) each accepted connection is
 * wrapped in GIO's TLS (glib-networking) before libsoup sees it: https.
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
#include "../common/te-bearer.h"
#include "../common/te-refuse.h"

#include <te/te-plugin.h>

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

typedef struct exporter {
	const te_host *h;
	GMainContext *ctx;
	GMainLoop *loop;
	GThread *thread;
	GSocketAddress *want; /* where to listen */
	SoupServer *srv;
	GSocketService *svc;
	char *url;
	te_bearer token;
	GTlsCertificate *cert; /* https when set */
	unsigned max_conns;
	unsigned idle_s;
	unsigned conns; /* accepted and not yet released by libsoup (server thread only) */
	/* create() waits for the server thread to listen or to fail */
	GMutex lock;
	GCond cond;
	bool settled;
	int start_rc;
	char why[256];
} exporter;

static te_ratelimit refusal_rl, busy_rl;

/* NULL when `msg` may go on, else why not (for the log, never the token). */
static const char *unauthorized(exporter *x, SoupServerMessage *msg)
{
	return te_bearer_refuse(&x->token, soup_message_headers_get_one(soup_server_message_get_request_headers(msg),
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
	te_refuse_early(x->ctx, msg, status, NULL, "libte metrics",
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
	int rc = x->h->metrics_text(x->h, &text, &len);
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

static void conn_gone(gpointer data, GObject *where_it_was)
{
	exporter *x = data;
	(void)where_it_was;
	x->conns--;
}

/* Accepted here, handed to libsoup while under the bound; the weak
 * reference counts it until libsoup lets go of it. */
static gboolean on_incoming(GSocketService *svc, GSocketConnection *conn, GObject *source, gpointer data)
{
	exporter *x = data;
	GError *err = NULL;
	(void)svc;
	(void)source;

	GSocket *sock = g_socket_connection_get_socket(conn);
	if (x->conns >= x->max_conns) {
		static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
					   "Retry-After: 1\r\nConnection: close\r\n\r\n";
		unsigned held;
		if (te_ratelimit_allow(&busy_rl, &held))
			x->h->log(x->h, TE_LOG_WARN,
				  "metrics endpoint: %u connections open (TE_METRICS_MAX_CONNECTIONS); one more refused "
				  "(%u similar lines held back)", x->conns, held);
		g_socket_send(sock, busy, sizeof busy - 1, NULL, NULL); /* non-blocking, best effort */
		g_io_stream_close(G_IO_STREAM(conn), NULL, NULL);
		return TRUE;
	}
	/* An idle or stalled client is dropped after this long (a TLS
	 * handshake that never comes included). */
	g_socket_set_timeout(sock, x->idle_s);
	GSocketAddress *local = g_socket_connection_get_local_address(conn, NULL);
	GSocketAddress *remote = g_socket_connection_get_remote_address(conn, NULL);
	/* https: libsoup gets the TLS stream, whose handshake runs on its first read. */
	GIOStream *stream = x->cert ? g_tls_server_connection_new(G_IO_STREAM(conn), x->cert, &err)
				    : g_object_ref(G_IO_STREAM(conn));
	if (local == NULL || remote == NULL || stream == NULL ||
	    !soup_server_accept_iostream(x->srv, stream, local, remote, &err)) {
		x->h->log(x->h, TE_LOG_WARN, "metrics endpoint: a connection could not be served: %s",
			  err ? err->message : "no address");
		g_clear_error(&err);
		g_io_stream_close(G_IO_STREAM(conn), NULL, NULL);
	} else {
		x->conns++;
		g_object_weak_ref(G_OBJECT(conn), conn_gone, x);
	}
	g_clear_object(&stream);
	g_clear_object(&local);
	g_clear_object(&remote);
	return TRUE;
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
	soup_server_disconnect(x->srv);
	g_clear_object(&x->svc);
	g_clear_object(&x->srv);
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
	char *host = NULL;
	const char *port_s;

	if (s[0] == '[') {
		const char *rb = strchr(s, ']');
		if (rb == NULL || rb[1] != ':')
			goto bad;
		host = g_strndup(s + 1, (gsize)(rb - s - 1));
		port_s = rb + 2;
	} else {
		const char *colon = strrchr(s, ':');
		if (colon != NULL && strchr(s, ':') != colon)
			goto bad; /* a bare IPv6 address: [addr]:port */
		host = colon ? g_strndup(s, (gsize)(colon - s)) : g_strdup("");
		port_s = colon ? colon + 1 : s;
	}
	guint64 port;
	if (*port_s == '\0' || !g_ascii_string_to_unsigned(port_s, 10, 0, 65535, &port, NULL))
		goto bad;
	if (*host == '\0' || g_ascii_strcasecmp(host, "localhost") == 0) {
		g_free(host);
		host = g_strdup("127.0.0.1");
	}
	GInetAddress *ia = g_inet_address_new_from_string(host);
	if (ia == NULL)
		goto bad;
	GSocketAddress *a = g_inet_socket_address_new(ia, (guint16)port);
	g_object_unref(ia);
	g_free(host);
	return a;
bad:
	g_free(host);
	g_snprintf(why, whylen, "'%s' is not HOST:PORT with a numeric address and a port from 0 to 65535", s);
	return NULL;
}

/* The token (exporter-plugins/common/te-bearer.h says what one is). */
static int load_token(exporter *x, const char *path)
{
	char why[512];
	bool weak = false;
	int rc = te_bearer_load(&x->token, path, &weak, why, sizeof why);

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
	if (x->ctx)
		g_main_context_unref(x->ctx);
	if (x->loop)
		g_main_loop_unref(x->loop);
	g_clear_object(&x->want);
	g_clear_object(&x->cert);
	g_free(x->url);
	g_mutex_clear(&x->lock);
	g_cond_clear(&x->cond);
	te_bearer_clear(&x->token);
	g_free(x);
}

static int prom_create(const te_host *h, const char *addr, const char *json_args, void **ctx)
{
	if (h == NULL || ctx == NULL)
		return -EINVAL;
	*ctx = NULL;
	if (!TE_HAS_OP(h, metrics_text)) {
		h->log(h, TE_LOG_ERROR, "metrics endpoint: this libte offers no metrics_text (plugin ABI 1.6)");
		return -ENOTSUP;
	}
	if (addr == NULL || *addr == '\0') {
		h->log(h, TE_LOG_ERROR, "metrics endpoint: no address to listen on");
		return -EINVAL;
	}
	exporter *x = g_new0(exporter, 1);
	char why[200];
	x->h = h;
	g_mutex_init(&x->lock);
	g_cond_init(&x->cond);
	x->max_conns = (unsigned)te_host_config_u64(h, "TE_METRICS_MAX_CONNECTIONS", NULL, 16, 1, 1024);
	x->idle_s = (unsigned)te_host_config_u64(h, "TE_METRICS_IDLE_TIMEOUT_S", NULL, 30, 1, 3600);
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
