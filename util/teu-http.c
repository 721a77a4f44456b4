/* SPDX-License-Identifier: Apache-2.0 */
/*
 * See teu-http.h. Each request runs on its caller's thread with libsoup's
 * synchronous API (libsoup 3.2 lets any thread send on one session; the
 * session is configured once, in teu_http_new(), before any request). A
 * watchdog thread of the client ends a request whose time is up: it cancels
 * the request and shuts down the request's socket under it, so the wait is
 * bounded even when a server accepts the connection and never answers, in
 * whatever phase, the TLS handshake included.
 *
 * No thread but the caller's runs a request's I/O and no main context is
 * shared: an earlier design ran requests on one I/O thread's context, and
 * every thread that handed work to it (callers, gio's TLS handshake workers)
 * reallocated that context's source bookkeeping under a lock inside GLib
 * that ThreadSanitizer cannot see (docs/reliability.md). Nor does a
 * handshake call back into a main context for the client certificate (see
 * on_network_event()).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gio/gio.h>
#include <libsoup/soup.h>

#include "teu-secret-file.h"
#include "teu-http.h"
#include "teu-keeper.h"
#include "teu-redact.h"

#define READ_CHUNK 65536

struct teu_http {
	SoupSession *session;
	teu_http_opts opts;
	char *ca_file;
	char *cert_file, *key_file;
	GTlsCertificate *cert; /* client certificate, or NULL */

	/* The watchdog thread; its lock guards `active` and the requests' fields
	 * that say so. */
	teu_keeper watchdog;
	GQueue active; /* requests in progress, each with its deadline */
};

/* Where a request stands, for the error text of one that timed out. */
enum { PHASE_CONNECT, PHASE_HANDSHAKE, PHASE_REPLY };
static const char *const phase_text[] = { "while connecting", "during the TLS handshake",
					  "waiting for the reply" };

typedef struct req {
	GList link;          /* in teu_http.active */
	teu_http *c;
	gint64 deadline;     /* monotonic, microseconds */
	GCancellable *cancel;
	gboolean timed_out;  /* set by the watchdog, under the watchdog's lock */
	int fd;              /* under the watchdog's lock: our duplicate of the connection's socket, or -1 */
	gint phase;          /* atomic: PHASE_* */
	/* The caller's thread only: the TLS connection being set up, watched
	 * for the server asking for a client certificate we lack. */
	GTlsConnection *tls;
	gulong cas_handler;
	gboolean cert_wanted;
} req;

static int errno_of(const GError *e, gboolean timed_out)
{
	if (timed_out)
		return -ETIMEDOUT;
	if (e->domain == G_IO_ERROR) {
		switch (e->code) {
		case G_IO_ERROR_TIMED_OUT:
			return -ETIMEDOUT;
		case G_IO_ERROR_CONNECTION_REFUSED:
			return -ECONNREFUSED;
		case G_IO_ERROR_HOST_NOT_FOUND:
		case G_IO_ERROR_HOST_UNREACHABLE:
		case G_IO_ERROR_NETWORK_UNREACHABLE:
			return -EHOSTUNREACH;
		case G_IO_ERROR_CANCELLED:
			return -ECANCELED;
		case G_IO_ERROR_CONNECTION_CLOSED: /* also BROKEN_PIPE */
			return -ECONNRESET;
		default:
			return -EIO;
		}
	}
	if (e->domain == G_RESOLVER_ERROR)
		return -EHOSTUNREACH;
	if (e->domain == G_TLS_ERROR || e->domain == SOUP_SESSION_ERROR)
		return -EPROTO;
	return -EIO;
}

/* Ends each request whose deadline passed, then sleeps until the next
 * deadline or a change of the list. Cancelling ends libsoup's waits and the
 * reads and writes of a TLS handshake (glib-networking runs it on a pool
 * thread, with the request's GCancellable), but the caller's wait for that
 * thread looks at nothing else: shutting the socket down as well ends any
 * read or write of the handshake that would not see the cancellation, and
 * with it the wait. Both under the lock: a request leaves the list (and
 * gives up its descriptor) under it, so neither outlives this. */
static gpointer watchdog_thread(gpointer data)
{
	teu_http *c = data;

	g_mutex_lock(&c->watchdog.lock);
	while (!c->watchdog.stopping) {
		gint64 now = g_get_monotonic_time(), next = G_MAXINT64;
		for (GList *l = c->active.head; l != NULL; l = l->next) {
			req *r = l->data;
			if (r->timed_out)
				continue;
			if (r->deadline <= now) {
				r->timed_out = TRUE;
				if (r->fd >= 0)
					shutdown(r->fd, SHUT_RDWR);
				g_cancellable_cancel(r->cancel);
			} else if (r->deadline < next) {
				next = r->deadline;
			}
		}
		if (next == G_MAXINT64)
			g_cond_wait(&c->watchdog.cond, &c->watchdog.lock);
		else
			g_cond_wait_until(&c->watchdog.cond, &c->watchdog.lock, next);
	}
	g_mutex_unlock(&c->watchdog.lock);
	return NULL;
}

static void watch(teu_http *c, req *r, int timeout_ms)
{
	r->link.data = r;
	g_mutex_lock(&c->watchdog.lock);
	r->deadline = g_get_monotonic_time() + (gint64)timeout_ms * 1000;
	g_queue_push_tail_link(&c->active, &r->link);
	g_cond_signal(&c->watchdog.cond);
	g_mutex_unlock(&c->watchdog.lock);
}

/* Closes the socket's duplicate: the watchdog no longer shuts it down. */
static void let_go_socket(teu_http *c, req *r)
{
	g_mutex_lock(&c->watchdog.lock);
	int fd = r->fd;
	r->fd = -1;
	g_mutex_unlock(&c->watchdog.lock);
	if (fd >= 0)
		close(fd);
}

/* Leaves the watchdog's list; whether the request's time ran out. */
static gboolean unwatch(teu_http *c, req *r)
{
	let_go_socket(c, r);
	g_mutex_lock(&c->watchdog.lock);
	g_queue_unlink(&c->active, &r->link);
	gboolean timed_out = r->timed_out;
	g_mutex_unlock(&c->watchdog.lock);
	return timed_out;
}

/* Keeps a duplicate of the descriptor of the socket the request's new
 * connection uses, for the watchdog to shut down. A duplicate of our own,
 * not the GSocket: libsoup may close its descriptor at any time (a dropped
 * connection), and a number it closed may be reused by an unrelated file
 * before the watchdog acts on it; ours refers to this socket until the
 * request ends. A message restarted on another connection replaces it. */
static void hold_socket(req *r, GSocket *sock)
{
	teu_http *c = r->c;
	int fd = fcntl(g_socket_get_fd(sock), F_DUPFD_CLOEXEC, 0);

	g_mutex_lock(&c->watchdog.lock);
	int old = r->fd;
	r->fd = fd;
	if (r->timed_out && fd >= 0) /* the deadline passed while it connected */
		shutdown(fd, SHUT_RDWR);
	g_mutex_unlock(&c->watchdog.lock);
	if (old >= 0)
		close(old);
}

/* glib-networking notes (after the handshake, on the caller's thread) the
 * CAs a server named when it asked for a client certificate. */
static void on_accepted_cas(GObject *conn, GParamSpec *pspec, gpointer data)
{
	req *r = data;
	(void)conn;
	(void)pspec;
	r->cert_wanted = TRUE;
}

static void forget_tls(req *r)
{
	if (r->tls == NULL)
		return;
	g_signal_handler_disconnect(r->tls, r->cas_handler);
	g_clear_object(&r->tls);
}

/* The connection's progress, on the caller's thread (the synchronous API
 * connects there). At TLS_HANDSHAKING the handshake has not started yet:
 * the client certificate goes onto the TLS connection itself and the
 * connection gets no GTlsInteraction. Otherwise libsoup 3.2 hands over the
 * certificate only when the handshake asks for it, through an interaction
 * that glib-networking's handshake thread invokes on the process's default
 * main context and then waits for without a bound: when another thread
 * owns that context at the moment (an application's main loop busy
 * elsewhere, a concurrent handshake doing the same), the handshake and its
 * caller hang for good, whatever the timeout. Without an interaction, a
 * server that asks for a certificate we lack gets none and refuses; that
 * it asked is seen on the connection's accepted-cas. */
static void on_network_event(SoupMessage *msg, GSocketClientEvent event, GIOStream *conn, gpointer data)
{
	req *r = data;
	(void)msg;

	switch (event) {
	case G_SOCKET_CLIENT_RESOLVING: /* again when a restarted message connects anew */
		g_atomic_int_set(&r->phase, PHASE_CONNECT);
		break;
	case G_SOCKET_CLIENT_CONNECTED:
		if (G_IS_SOCKET_CONNECTION(conn))
			hold_socket(r, g_socket_connection_get_socket(G_SOCKET_CONNECTION(conn)));
		break;
	case G_SOCKET_CLIENT_TLS_HANDSHAKING:
		g_atomic_int_set(&r->phase, PHASE_HANDSHAKE);
		if (!G_IS_TLS_CONNECTION(conn))
			break;
		g_tls_connection_set_interaction(G_TLS_CONNECTION(conn), NULL);
		if (r->c->cert != NULL) {
			g_tls_connection_set_certificate(G_TLS_CONNECTION(conn), r->c->cert);
		} else {
			forget_tls(r);
			r->tls = G_TLS_CONNECTION(g_object_ref(conn));
			r->cas_handler = g_signal_connect(conn, "notify::accepted-cas", G_CALLBACK(on_accepted_cas), r);
		}
		break;
	default:
		break;
	}
}

/* The connection is ready and the request goes out. */
static void on_starting(SoupMessage *msg, gpointer data)
{
	req *r = data;
	(void)msg;
	g_atomic_int_set(&r->phase, PHASE_REPLY);
}

static SoupMessage *new_message(req *r, const char *method, const char *url, const char *content_type,
				const void *body, size_t len, const char *auth)
{
	SoupMessage *msg = soup_message_new(method, url);
	if (msg == NULL)
		return NULL;
	if (body != NULL) {
		GBytes *b = g_bytes_new(body, len);
		soup_message_set_request_body_from_bytes(msg, content_type ? content_type : "application/octet-stream",
							 b);
		g_bytes_unref(b);
	}
	if (auth != NULL)
		soup_message_headers_replace(soup_message_get_request_headers(msg), "Authorization", auth);
	g_signal_connect(msg, "network-event", G_CALLBACK(on_network_event), r);
	g_signal_connect(msg, "starting", G_CALLBACK(on_starting), r);
	/* libsoup opens a new connection for every request whose method is not
	 * idempotent, and etcd's gateway takes only POST. Every request sent here
	 * may be repeated safely (puts and deletes of whole keys, reads, lease
	 * calls whose duplicates expire), so let connections be reused. */
	soup_message_add_flags(msg, SOUP_MESSAGE_IDEMPOTENT);
	return msg;
}

/* Reads the reply body into `buf`: 0, -EMSGSIZE, or -EIO with *gerr set. */
static int read_body(teu_http *c, GInputStream *in, GCancellable *cancel, GByteArray *buf, GError **gerr)
{
	for (;;) {
		guint old = buf->len;
		size_t room = c->opts.max_reply - old + 1; /* one more: detects an oversized reply */
		guint want = room < READ_CHUNK ? (guint)room : READ_CHUNK;
		g_byte_array_set_size(buf, old + want);
		gssize n = g_input_stream_read(in, buf->data + old, want, cancel, gerr);
		g_byte_array_set_size(buf, old + (n > 0 ? (guint)n : 0));
		if (n < 0)
			return -EIO;
		if (n == 0)
			return 0;
		if (buf->len > c->opts.max_reply)
			return -EMSGSIZE;
	}
}

int teu_http_request(teu_http *c, const char *method, const char *url, const char *content_type,
		    const void *body, size_t len, const char *auth, int timeout_ms, teu_http_reply *reply,
		    char **err)
{
	GError *e = NULL;
	int rc = 0;

	if (err)
		*err = NULL;
	if (c == NULL || method == NULL || url == NULL || reply == NULL || (body == NULL && len > 0))
		return -EINVAL;
	memset(reply, 0, sizeof *reply);
	if (timeout_ms <= 0)
		timeout_ms = 5000;

	char *log_url = teu_redact(url);
	req r = { .c = c, .cancel = g_cancellable_new(), .fd = -1, .phase = PHASE_CONNECT };
	SoupMessage *msg = new_message(&r, method, url, content_type, body, len, auth);
	if (msg == NULL) {
		if (err)
			*err = g_strdup_printf("'%s' is not a valid http(s) URL", log_url);
		g_free(log_url);
		g_object_unref(r.cancel);
		return -EINVAL;
	}

	GByteArray *buf = g_byte_array_new();
	watch(c, &r, timeout_ms);
	GInputStream *in = soup_session_send(c->session, msg, r.cancel, &e);
	if (in != NULL) {
		goffset cl = soup_message_headers_get_content_length(soup_message_get_response_headers(msg));
		if (cl > 0 && (guint64)cl > c->opts.max_reply) {
			rc = -EMSGSIZE;
			if (err)
				*err = g_strdup_printf("the reply from %s announces %lld bytes, more than %zu", log_url,
						       (long long)cl, c->opts.max_reply);
		} else {
			rc = read_body(c, in, r.cancel, buf, &e);
			/* Closing the stream (rather than dropping it) hands the
			 * connection back to the session for the next request, which
			 * another thread may take at once: the watchdog lets go of
			 * its socket first. */
			if (rc == 0) {
				let_go_socket(c, &r);
				g_input_stream_close(in, r.cancel, NULL);
			}
			else if (rc == -EMSGSIZE && err)
				*err = g_strdup_printf("the reply from %s exceeds %zu bytes", log_url,
						       c->opts.max_reply);
		}
		g_object_unref(in);
	}
	gboolean timed_out = unwatch(c, &r);
	forget_tls(&r);
	const char *phase = phase_text[g_atomic_int_get(&r.phase)];

	if (in == NULL) {
		if (timed_out) {
			rc = -ETIMEDOUT;
			if (err)
				*err = g_strdup_printf("%s %s failed: timed out after %d ms %s", method, log_url,
						       timeout_ms, phase);
		} else if (g_error_matches(e, G_TLS_ERROR, G_TLS_ERROR_CERTIFICATE_REQUIRED) ||
			   (r.cert_wanted && e->domain == G_TLS_ERROR && e->code != G_TLS_ERROR_BAD_CERTIFICATE)) {
			rc = -EPROTO;
			if (err)
				*err = g_strdup_printf("%s %s failed: %s (the server asks for a TLS client certificate "
						       "and %s)", method, log_url, e->message,
						       c->cert ? "refused the one configured" : "none is configured");
		} else {
			rc = errno_of(e, FALSE);
			if (err)
				*err = g_strdup_printf("%s %s failed: %s", method, log_url, e->message);
		}
	} else if (rc == -EIO) {
		rc = errno_of(e, timed_out);
		if (err) {
			if (timed_out)
				*err = g_strdup_printf("reading the reply from %s failed: timed out after %d ms",
						       log_url, timeout_ms);
			else
				*err = g_strdup_printf("reading the reply from %s failed: %s", log_url, e->message);
		}
	}
	if (rc == 0) {
		reply->status = (int)soup_message_get_status(msg);
		reply->len = buf->len;
		g_byte_array_append(buf, (const guint8 *)"", 1);
		reply->body = (char *)g_byte_array_free(buf, FALSE);
	} else {
		g_byte_array_unref(buf);
	}
	g_clear_error(&e);
	/* The message may outlive the call inside libsoup; `r` does not. */
	g_signal_handlers_disconnect_by_data(msg, &r);
	g_object_unref(msg);
	g_object_unref(r.cancel);
	g_free(log_url);
	return rc;
}

void teu_http_reply_clear(teu_http_reply *reply)
{
	if (reply == NULL)
		return;
	g_free(reply->body);
	reply->body = NULL;
	reply->len = 0;
}

teu_http *teu_http_new(const teu_http_opts *opts, char **err)
{
	teu_http *c = g_new0(teu_http, 1);
	GError *e = NULL;

	*err = NULL;
	c->opts = *opts;
	if (c->opts.max_reply == 0)
		c->opts.max_reply = 64u << 20;
	if (c->opts.max_conns == 0)
		c->opts.max_conns = 8;
	c->ca_file = g_strdup(opts->ca_file);
	c->opts.ca_file = c->ca_file;
	c->cert_file = g_strdup(opts->cert_file);
	c->key_file = g_strdup(opts->key_file);
	c->opts.cert_file = c->cert_file;
	c->opts.key_file = c->key_file;
	teu_keeper_init(&c->watchdog);

	/* No proxy: stores live on the cluster network, and a stray http_proxy
	 * in the environment would route metadata through it. No idle timeout:
	 * its timer would be a source on the default main context, attached by
	 * whichever thread last used a connection; a server that closes an idle
	 * connection is noticed when the connection is next taken. */
	c->session = soup_session_new_with_options("max-conns-per-host", (int)c->opts.max_conns,
						   "max-conns", (int)c->opts.max_conns * 4,
						   "proxy-resolver", NULL,
						   "idle-timeout", 0,
						   "user-agent", "libte", NULL);
	if (c->cert_file != NULL) {
		c->cert = g_tls_certificate_new_from_files(c->cert_file, c->key_file ? c->key_file : c->cert_file,
							   &e);
		if (c->cert == NULL) {
			*err = g_strdup_printf("cannot load the client certificate %s (key %s): %s", c->cert_file,
					       c->key_file ? c->key_file : c->cert_file, e->message);
			g_clear_error(&e);
		}
	}
	/* The first use of TLS in a process loads glib-networking and, for a
	 * client without a CA file, the system's trusted CAs (a second under a
	 * sanitizer): work that nothing interrupts, done here rather than in the
	 * first request's time. A CA file below loads the former. */
	if (c->ca_file == NULL && *err == NULL) {
		GTlsDatabase *system_db = g_tls_backend_get_default_database(g_tls_backend_get_default());
		if (system_db != NULL)
			g_object_unref(system_db);
	}
	if (c->ca_file != NULL && *err == NULL) {
		GTlsDatabase *db = g_tls_file_database_new(c->ca_file, &e);
		if (db == NULL) {
			*err = g_strdup_printf("cannot read CA file %s: %s", c->ca_file, e->message);
			g_clear_error(&e);
		} else {
			soup_session_set_tls_database(c->session, db);
			g_object_unref(db);
		}
	}
	if (*err == NULL) {
		if (!teu_keeper_start(&c->watchdog, "te-http", watchdog_thread, c))
			*err = g_strdup("cannot start the HTTP client's timer thread");
	}
	if (*err != NULL) {
		teu_http_free(c);
		return NULL;
	}
	return c;
}

void teu_http_free(teu_http *c)
{
	if (c == NULL)
		return;
	teu_keeper_clear(&c->watchdog);
	g_clear_object(&c->session);
	g_clear_object(&c->cert);
	g_free(c->ca_file);
	g_free(c->cert_file);
	g_free(c->key_file);
	g_free(c);
}

#define SECRET_MAX 4096

char *teu_http_read_secret(const char *path, char **err)
{
	char why[PATH_MAX + 256];
	struct stat st;
	size_t n = 0;

	*err = NULL;
	if (path == NULL || *path == '\0') {
		*err = g_strdup("empty file name");
		return NULL;
	}
	/* A secret anyone could have written is a secret anyone holds. */
	int fd = teu_secret_open(path, &st, why, sizeof why);
	if (fd < 0) {
		*err = fd == -EPERM ? g_strdup_printf("refused %s: %s", path, why) : g_strdup(why);
		return NULL;
	}
	/* Only the first line counts: reading past SECRET_MAX says whether it ends in time. */
	char *data = g_malloc(SECRET_MAX + 1);
	int rc = teu_secret_read(fd, data, SECRET_MAX + 1, &n);
	close(fd);
	if (rc < 0) {
		memset(data, 0, SECRET_MAX + 1);
		g_free(data);
		*err = g_strdup_printf("cannot read %s: %s", path, g_strerror(-rc));
		return NULL;
	}
	char *nl = memchr(data, '\n', n);
	size_t len = nl ? (size_t)(nl - data) : n;
	char *out = NULL;
	if (len > SECRET_MAX) {
		*err = g_strdup_printf("%s: the first line is longer than %d bytes", path, SECRET_MAX);
	} else {
		out = g_strstrip(g_strndup(data, len));
		if (*out == '\0' || memchr(data, '\0', len) != NULL || strpbrk(out, "\r\t") != NULL) {
			*err = g_strdup_printf("%s holds no usable secret on its first line", path);
			teu_http_secret_free(out);
			out = NULL;
		}
	}
	memset(data, 0, n);
	g_free(data);
	return out;
}

void teu_http_secret_free(char *secret)
{
	if (secret == NULL)
		return;
	/* volatile: the compiler may not drop a store to memory about to be freed */
	volatile char *p = secret;
	while (*p)
		*p++ = '\0';
	g_free(secret);
}
