/* SPDX-License-Identifier: Apache-2.0 */
/*
 * See te-http.h. A request is a refcounted object shared by the calling
 * thread (which waits on its condition variable) and the I/O thread (which
 * runs it with libsoup's async API). The I/O thread arms a timer that cancels
 * the request, so the wait is bounded even when a server accepts the
 * connection and never answers.
 *
 * Callers hand requests to the I/O thread through a queue under the client's
 * lock and wake its context, which a source of the I/O thread's own drains.
 * No other thread attaches sources to that context: GMainContext keeps its
 * sources in lists and a table guarded by a lock inside GLib, allocated and
 * freed by whichever thread attaches or removes, and ThreadSanitizer cannot
 * see that lock (docs/reliability.md).
 */
#include <errno.h>
#include <string.h>

#include <gio/gio.h>
#include <libsoup/soup.h>

#include "te-http.h"

#define READ_CHUNK 65536
/* Extra time the caller waits beyond the request's own timeout before giving
 * up on the I/O thread: it should never be needed. */
#define CALLER_SLACK_MS 5000

struct te_http {
	GMainContext *ctx;
	GMainLoop *loop;
	GThread *thread;
	SoupSession *session;
	te_http_opts opts;
	char *ca_file;
	char *cert_file, *key_file;
	GTlsCertificate *cert; /* client certificate, or NULL */
	char *start_error;
	GMutex lock;
	GCond cond;
	int started; /* 0 starting, 1 running, -1 failed */
	/* guarded by lock */
	GQueue queue; /* requests not started yet */
	gboolean quit;
};

typedef struct req {
	gatomicrefcount refs;
	te_http *c;
	char *method, *url, *ctype, *auth;
	char *log_url; /* url for messages: a password in it redacted */
	GBytes *body;
	int timeout_ms;
	GCancellable *cancel;
	GSource *timer;
	SoupMessage *msg;
	GInputStream *in;
	GByteArray *buf;
	gboolean timed_out;
	gboolean cert_wanted; /* the server asked for a client certificate we lack */

	/* result, guarded by lock */
	GMutex lock;
	GCond cond;
	gboolean done;
	int rc;
	int status;
	char *err;
} req;

static void req_unref(req *r)
{
	if (!g_atomic_ref_count_dec(&r->refs))
		return;
	if (r->timer) {
		g_source_destroy(r->timer);
		g_source_unref(r->timer);
	}
	g_clear_object(&r->in);
	g_clear_object(&r->msg);
	g_clear_object(&r->cancel);
	if (r->buf)
		g_byte_array_unref(r->buf);
	if (r->body)
		g_bytes_unref(r->body);
	g_free(r->method);
	te_http_secret_free(r->url);
	g_free(r->log_url);
	g_free(r->ctype);
	te_http_secret_free(r->auth);
	g_free(r->err);
	g_mutex_clear(&r->lock);
	g_cond_clear(&r->cond);
	g_free(r);
}

/* Runs on the I/O thread: publishes the result and drops its reference. */
static void req_finish(req *r, int rc, const char *fmt, ...) G_GNUC_PRINTF(3, 4);
static void req_finish(req *r, int rc, const char *fmt, ...)
{
	if (r->timer) {
		g_source_destroy(r->timer);
		g_source_unref(r->timer);
		r->timer = NULL;
	}
	int status = r->msg ? (int)soup_message_get_status(r->msg) : 0;
	/* libsoup objects must go on this thread: the caller may hold the last
	 * reference to the request. */
	g_clear_object(&r->in);
	g_clear_object(&r->msg);
	g_mutex_lock(&r->lock);
	r->rc = rc;
	r->status = status;
	if (fmt != NULL) {
		va_list ap;
		va_start(ap, fmt);
		g_free(r->err);
		r->err = g_strdup_vprintf(fmt, ap);
		va_end(ap);
	}
	r->done = TRUE;
	g_cond_signal(&r->cond);
	g_mutex_unlock(&r->lock);
	req_unref(r);
}

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

static gboolean on_timeout(gpointer data)
{
	req *r = data;

	r->timed_out = TRUE;
	g_cancellable_cancel(r->cancel);
	g_source_unref(r->timer);
	r->timer = NULL;
	return G_SOURCE_REMOVE;
}

/* The server asks for a client certificate and none is configured. Going on
 * without one leaves libsoup 3.2's asynchronous send stuck for good once the
 * server refuses (TLS 1.3 refuses after the handshake), deaf to
 * cancellation. Closing the socket under the handshake ends the request at
 * once with a TLS error, reported below with what is missing. Servers that
 * ask for a certificate but would accept none are therefore refused too. */
static gboolean on_cert_requested(SoupMessage *msg, GTlsClientConnection *conn, gpointer data)
{
	req *r = data;
	GIOStream *base = NULL;
	(void)msg;

	r->cert_wanted = TRUE;
	g_object_get(conn, "base-io-stream", &base, NULL);
	if (base != NULL) {
		g_io_stream_close(base, NULL, NULL);
		g_object_unref(base);
	}
	return FALSE;
}

static void on_closed(GObject *src, GAsyncResult *res, gpointer data)
{
	req *r = data;

	g_input_stream_close_finish(G_INPUT_STREAM(src), res, NULL);
	req_finish(r, 0, NULL);
}

static void on_read(GObject *src, GAsyncResult *res, gpointer data)
{
	req *r = data;
	GError *e = NULL;
	GBytes *b = g_input_stream_read_bytes_finish(G_INPUT_STREAM(src), res, &e);

	if (b == NULL) {
		int rc = errno_of(e, r->timed_out);
		req_finish(r, rc, "reading the reply from %s failed: %s", r->log_url,
			   r->timed_out ? "timed out" : e->message);
		g_error_free(e);
		return;
	}
	gsize n = g_bytes_get_size(b);
	if (n == 0) {
		g_bytes_unref(b);
		/* Closing the stream (rather than dropping it) hands the
		 * connection back to the session for the next request. */
		g_input_stream_close_async(r->in, G_PRIORITY_DEFAULT, NULL, on_closed, r);
		return;
	}
	if (r->buf->len + n > r->c->opts.max_reply) {
		g_bytes_unref(b);
		req_finish(r, -EMSGSIZE, "the reply from %s exceeds %zu bytes", r->log_url, r->c->opts.max_reply);
		return;
	}
	g_byte_array_append(r->buf, g_bytes_get_data(b, NULL), (guint)n);
	g_bytes_unref(b);
	g_input_stream_read_bytes_async(r->in, READ_CHUNK, G_PRIORITY_DEFAULT, r->cancel, on_read, r);
}

static void on_sent(GObject *src, GAsyncResult *res, gpointer data)
{
	req *r = data;
	GError *e = NULL;

	r->in = soup_session_send_finish(SOUP_SESSION(src), res, &e);
	if (r->in == NULL && r->cert_wanted && !r->timed_out) {
		req_finish(r, -EPROTO, "%s %s failed: %s (the server asks for a TLS client certificate and none "
			   "is configured)", r->method, r->log_url, e->message);
		g_error_free(e);
		return;
	}
	if (r->in == NULL) {
		int rc = errno_of(e, r->timed_out);
		req_finish(r, rc, "%s %s failed: %s", r->method, r->log_url,
			   r->timed_out ? "timed out" : e->message);
		g_error_free(e);
		return;
	}
	goffset cl = soup_message_headers_get_content_length(soup_message_get_response_headers(r->msg));
	if (cl > 0 && (guint64)cl > r->c->opts.max_reply) {
		req_finish(r, -EMSGSIZE, "the reply from %s announces %lld bytes, more than %zu", r->log_url,
			   (long long)cl, r->c->opts.max_reply);
		return;
	}
	g_input_stream_read_bytes_async(r->in, READ_CHUNK, G_PRIORITY_DEFAULT, r->cancel, on_read, r);
}

static void start_req(req *r)
{
	r->msg = soup_message_new(r->method, r->url);
	if (r->msg == NULL) {
		req_finish(r, -EINVAL, "'%s' is not a valid http(s) URL", r->log_url);
		return;
	}
	if (r->body != NULL)
		soup_message_set_request_body_from_bytes(r->msg, r->ctype, r->body);
	if (r->auth != NULL)
		soup_message_headers_replace(soup_message_get_request_headers(r->msg), "Authorization", r->auth);
	/* Offered when the server asks for one (set per message: libsoup 3.2
	 * has no session-wide client certificate). */
	if (r->c->cert != NULL)
		soup_message_set_tls_client_certificate(r->msg, r->c->cert);
	else
		g_signal_connect(r->msg, "request-certificate", G_CALLBACK(on_cert_requested), r);
	/* libsoup opens a new connection for every request whose method is not
	 * idempotent, and etcd's gateway takes only POST. Every request sent here
	 * may be repeated safely (puts and deletes of whole keys, reads, lease
	 * calls whose duplicates expire), so let connections be reused. */
	soup_message_add_flags(r->msg, SOUP_MESSAGE_IDEMPOTENT);
	r->timer = g_timeout_source_new((guint)r->timeout_ms);
	g_source_set_callback(r->timer, on_timeout, r, NULL);
	g_source_attach(r->timer, r->c->ctx);
	soup_session_send_async(r->c->session, r->msg, G_PRIORITY_DEFAULT, r->cancel, on_sent, r);
}

/* The kick source: ready while requests wait or the client is closing. Its
 * functions run on the I/O thread; callers fill the queue and wake the
 * context (g_main_context_wakeup() takes no lock of the context). */
typedef struct {
	GSource base;
	te_http *c;
} kick_source;

static gboolean kick_ready(te_http *c)
{
	g_mutex_lock(&c->lock);
	gboolean ready = c->quit || c->queue.length > 0;
	g_mutex_unlock(&c->lock);
	return ready;
}

static gboolean kick_prepare(GSource *s, gint *timeout)
{
	*timeout = -1;
	return kick_ready(((kick_source *)s)->c);
}

static gboolean kick_check(GSource *s)
{
	return kick_ready(((kick_source *)s)->c);
}

/* Starts the queued requests; whether the client is closing. */
static gboolean start_queued(te_http *c)
{
	g_mutex_lock(&c->lock);
	GQueue todo = c->queue;
	g_queue_init(&c->queue);
	gboolean quit = c->quit;
	g_mutex_unlock(&c->lock);
	for (req *r; (r = g_queue_pop_head(&todo)) != NULL;)
		start_req(r);
	return quit;
}

static gboolean kick_dispatch(GSource *s, GSourceFunc cb, gpointer data)
{
	te_http *c = ((kick_source *)s)->c;
	(void)cb;
	(void)data;

	if (start_queued(c))
		g_main_loop_quit(c->loop);
	return G_SOURCE_CONTINUE;
}

static GSourceFuncs kick_funcs = {
	.prepare = kick_prepare,
	.check = kick_check,
	.dispatch = kick_dispatch,
};

int te_http_request(te_http *c, const char *method, const char *url, const char *content_type,
		    const void *body, size_t len, const char *auth, int timeout_ms, te_http_reply *reply,
		    char **err)
{
	req *r;
	int rc;

	if (err)
		*err = NULL;
	if (c == NULL || method == NULL || url == NULL || reply == NULL || (body == NULL && len > 0))
		return -EINVAL;
	memset(reply, 0, sizeof *reply);
	if (timeout_ms <= 0)
		timeout_ms = 5000;

	r = g_new0(req, 1);
	g_atomic_ref_count_init(&r->refs);
	g_atomic_ref_count_inc(&r->refs); /* one for the I/O thread */
	g_mutex_init(&r->lock);
	g_cond_init(&r->cond);
	r->c = c;
	r->method = g_strdup(method);
	r->url = g_strdup(url);
	r->log_url = te_http_redact(url);
	r->ctype = g_strdup(content_type ? content_type : "application/octet-stream");
	r->auth = g_strdup(auth);
	if (body != NULL)
		r->body = g_bytes_new(body, len);
	r->timeout_ms = timeout_ms;
	r->cancel = g_cancellable_new();
	r->buf = g_byte_array_new();

	g_mutex_lock(&c->lock);
	g_queue_push_tail(&c->queue, r);
	g_mutex_unlock(&c->lock);
	g_main_context_wakeup(c->ctx);

	gint64 deadline = g_get_monotonic_time() + (gint64)(timeout_ms + CALLER_SLACK_MS) * 1000;
	g_mutex_lock(&r->lock);
	while (!r->done)
		if (!g_cond_wait_until(&r->cond, &r->lock, deadline))
			break;
	if (!r->done) {
		g_mutex_unlock(&r->lock);
		g_cancellable_cancel(r->cancel);
		if (err)
			*err = g_strdup_printf("%s %s: no answer from the I/O thread", method, r->log_url);
		req_unref(r);
		return -ETIMEDOUT;
	}
	rc = r->rc;
	if (rc == 0) {
		reply->status = r->status;
		reply->len = r->buf->len;
		g_byte_array_append(r->buf, (const guint8 *)"", 1);
		reply->body = (char *)g_byte_array_free(r->buf, FALSE);
		r->buf = NULL;
	} else if (err) {
		*err = g_steal_pointer(&r->err);
	}
	g_mutex_unlock(&r->lock);
	req_unref(r);
	return rc;
}

void te_http_reply_clear(te_http_reply *reply)
{
	if (reply == NULL)
		return;
	g_free(reply->body);
	reply->body = NULL;
	reply->len = 0;
}

static gpointer io_thread(gpointer data)
{
	te_http *c = data;
	GError *e = NULL;

	g_main_context_push_thread_default(c->ctx);
	/* No proxy: stores live on the cluster network, and a stray http_proxy
	 * in the environment would route metadata through it. */
	c->session = soup_session_new_with_options("max-conns-per-host", (int)c->opts.max_conns,
						   "max-conns", (int)c->opts.max_conns * 4,
						   "proxy-resolver", NULL,
						   "user-agent", "libte", NULL);
	if (c->cert_file != NULL) {
		c->cert = g_tls_certificate_new_from_files(c->cert_file, c->key_file ? c->key_file : c->cert_file,
							   &e);
		if (c->cert == NULL) {
			c->start_error = g_strdup_printf("cannot load the client certificate %s (key %s): %s",
							 c->cert_file, c->key_file ? c->key_file : c->cert_file,
							 e->message);
			g_clear_error(&e);
		}
	}
	if (c->ca_file != NULL && c->start_error == NULL) {
		GTlsDatabase *db = g_tls_file_database_new(c->ca_file, &e);
		if (db == NULL) {
			c->start_error = g_strdup_printf("cannot read CA file %s: %s", c->ca_file, e->message);
			g_error_free(e);
		} else {
			soup_session_set_tls_database(c->session, db);
			g_object_unref(db);
		}
	}
	GSource *kick = g_source_new(&kick_funcs, sizeof(kick_source));
	((kick_source *)kick)->c = c;
	g_source_attach(kick, c->ctx);
	g_mutex_lock(&c->lock);
	c->started = c->start_error ? -1 : 1;
	g_cond_signal(&c->cond);
	g_mutex_unlock(&c->lock);
	if (c->started == 1)
		g_main_loop_run(c->loop);
	g_source_destroy(kick);
	g_source_unref(kick);
	/* A request queued with the quit is started and then aborted below. */
	start_queued(c);
	soup_session_abort(c->session);
	g_clear_object(&c->session);
	g_clear_object(&c->cert);
	/* Let aborted requests deliver their callbacks before leaving. */
	while (g_main_context_iteration(c->ctx, FALSE))
		;
	g_main_context_pop_thread_default(c->ctx);
	return NULL;
}

te_http *te_http_new(const te_http_opts *opts, char **err)
{
	te_http *c = g_new0(te_http, 1);

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
	g_mutex_init(&c->lock);
	g_cond_init(&c->cond);
	c->ctx = g_main_context_new();
	c->loop = g_main_loop_new(c->ctx, FALSE);
	c->thread = g_thread_try_new("te-http", io_thread, c, NULL);
	if (c->thread == NULL) {
		*err = g_strdup("cannot start the HTTP I/O thread");
		c->started = -1;
	} else {
		g_mutex_lock(&c->lock);
		while (c->started == 0)
			g_cond_wait(&c->cond, &c->lock);
		g_mutex_unlock(&c->lock);
	}
	if (c->started < 0) {
		if (*err == NULL)
			*err = g_steal_pointer(&c->start_error);
		te_http_free(c);
		return NULL;
	}
	return c;
}

void te_http_free(te_http *c)
{
	if (c == NULL)
		return;
	if (c->thread != NULL) {
		g_mutex_lock(&c->lock);
		c->quit = TRUE;
		g_mutex_unlock(&c->lock);
		g_main_context_wakeup(c->ctx);
		g_thread_join(c->thread);
	}
	g_main_loop_unref(c->loop);
	g_main_context_unref(c->ctx);
	g_mutex_clear(&c->lock);
	g_cond_clear(&c->cond);
	g_free(c->start_error);
	g_free(c->ca_file);
	g_free(c->cert_file);
	g_free(c->key_file);
	g_free(c);
}

#define SECRET_MAX 4096

char *te_http_read_secret(const char *path, char **err)
{
	GError *e = NULL;
	char *data = NULL;
	gsize n = 0;

	*err = NULL;
	if (path == NULL || *path == '\0') {
		*err = g_strdup("empty file name");
		return NULL;
	}
	if (!g_file_get_contents(path, &data, &n, &e)) {
		*err = g_strdup(e->message);
		g_error_free(e);
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
			te_http_secret_free(out);
			out = NULL;
		}
	}
	memset(data, 0, n);
	g_free(data);
	return out;
}

void te_http_secret_free(char *secret)
{
	if (secret == NULL)
		return;
	/* volatile: the compiler may not drop a store to memory about to be freed */
	volatile char *p = secret;
	while (*p)
		*p++ = '\0';
	g_free(secret);
}

char *te_http_redact(const char *url)
{
	if (url == NULL)
		return g_strdup("(null)");
	/* user-info sits between "://" (or the start) and the first '@' before
	 * the host part's end */
	const char *start = strstr(url, "://");
	start = start ? start + 3 : url;
	size_t auth_len = strcspn(start, "/?#");
	const char *at = NULL;
	for (const char *p = start; p < start + auth_len; p++)
		if (*p == '@')
			at = p; /* the last '@': a password may hold one */
	if (at == NULL)
		return g_strdup(url);
	const char *colon = memchr(start, ':', (size_t)(at - start));
	if (colon == NULL)
		return g_strdup(url); /* a user name alone is no secret */
	return g_strdup_printf("%.*s:***%s", (int)(colon - url), url, at);
}
