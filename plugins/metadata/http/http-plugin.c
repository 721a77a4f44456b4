/* SPDX-License-Identifier: Apache-2.0 */
/*
 * HTTP metadata store: the REST protocol of Mooncake's demo server.
 *   GET    <url>?key=<escaped key>   200 + value, 404 when missing
 *   PUT    <url>?key=<escaped key>   body = value, 200 on success
 *   DELETE <url>?key=<escaped key>   200 (404: already gone)
 *   GET    <url>                     te-metadata-server only: JSON array of keys
 * Anything but those statuses is an error. https works when GLib's TLS
 * backend (glib-networking) is installed. With TE_HTTP_TOKEN_FILE every
 * request carries "Authorization: Bearer <token>" (te-metadata-server
 * --token-file); the token is never logged.
 *
 * Liveness: keys put with TE_META_OWNED carry "&ttl=<TE_HTTP_KEY_TTL>"
 * (seconds, 10 by default, 0 for none). A store that honours it says so in
 * its reply ("... expires in N s", te-metadata-server); then a keeper thread
 * puts every owned key again each third of the TTL, with the value last put,
 * so a crashed engine's keys vanish on their own, and one deleted behind the
 * engine's back comes back. Other stores ignore the parameter and keep the
 * keys until they are removed, as before.
 */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include <glib.h>
#include <json-glib/json-glib.h>
#include <te/te-json.h>

#include <te/te-plugin.h>

#include "teu-http.h"
#include "teu-keeper.h"
#include "teu-redact.h"
#include "teu-store.h"

#define TTL_REPLY "metadata updated; expires in "

typedef struct hstore {
	const te_host *h;
	char *base;  /* the connection string without a fragment */
	char *log;   /* base for logs: its user-info password redacted */
	char *auth;  /* "Bearer <token>", or NULL */
	char sep;    /* '?' or '&': whether base already has a query */
	int timeout_ms;
	teu_http *http;
	unsigned ttl_s;      /* TE_HTTP_KEY_TTL: 0, owned keys are put as any other */
	/* Owned keys, key -> GBytes (the value last put), kept while the store
	 * honours TTLs. put_lock orders their PUTs and DELETEs with the
	 * keeper's, so it never puts back a removed key or an older value. */
	GMutex put_lock;
	GHashTable *owned;
	teu_keeper keeper;
	bool told_no_ttl;    /* (put_lock) logged once: the store ignores TTLs */
} hstore;

static char *key_url(hstore *s, const char *key)
{
	char *esc = g_uri_escape_string(key, NULL, FALSE);
	char *url = g_strdup_printf("%s%ckey=%s", s->base, s->sep, esc);
	g_free(esc);
	return url;
}

/* Runs one request; logs transport failures. */
static int call(hstore *s, const char *method, const char *url, const char *key, const void *body,
		size_t len, teu_http_reply *r)
{
	char *err = NULL;
	int rc = teu_http_request(s->http, method, url, "application/json", body, len, s->auth, s->timeout_ms,
				 r, &err);
	if (rc < 0)
		s->h->log(s->h, TE_LOG_ERROR, "http store %s: %s '%s' failed: %s", s->log, method, key,
			  err ? err : strerror(-rc));
	g_free(err);
	return rc;
}

static int refused(hstore *s, const char *method, const char *key, teu_http_reply *r)
{
	s->h->log(s->h, TE_LOG_ERROR, "http store %s: %s '%s' answered %d: %.200s%s", s->log, method, key,
		  r->status, r->body ? r->body : "",
		  r->status == 401 ? (s->auth ? " (the token was refused)" : " (the store wants a token: TE_HTTP_TOKEN_FILE)")
				   : "");
	teu_http_reply_clear(r);
	return TE_ERR_METADATA;
}

static bool bad_key(hstore *s, const char *key, const char *what)
{
	if (key == NULL || *key == '\0') {
		s->h->log(s->h, TE_LOG_ERROR, "http store %s: %s with an empty key", s->log, what);
		return true;
	}
	return false;
}

/* `method` on <base>?key=<escaped key>. */
static int key_call(hstore *s, const char *method, const char *key, const char *body, size_t len,
		    teu_http_reply *r)
{
	char *url = key_url(s, key);
	int rc = call(s, method, url, key, body, len, r);

	g_free(url);
	return rc;
}

static int http_get(void *ctx, const char *key, char **value, size_t *len)
{
	hstore *s = ctx;
	teu_http_reply r;

	*value = NULL;
	if (bad_key(s, key, "get"))
		return -EINVAL;
	int rc = key_call(s, "GET", key, NULL, 0, &r);
	if (rc < 0)
		return rc;
	if (r.status == 404) {
		teu_http_reply_clear(&r);
		return -ENOENT;
	}
	if (r.status != 200)
		return refused(s, "GET", key, &r);
	rc = teu_store_value(r.body, r.len, value, len);
	teu_http_reply_clear(&r);
	return rc;
}

/* PUT, with this store's TTL when `honoured` is not NULL; *honoured: the
 * reply said the key expires. */
static int put(hstore *s, const char *key, const void *value, size_t len, bool *honoured)
{
	teu_http_reply r;
	char *url = key_url(s, key);
	if (honoured != NULL) {
		char *with = g_strdup_printf("%s&ttl=%u", url, s->ttl_s);
		g_free(url);
		url = with;
	}
	int rc = call(s, "PUT", url, key, value, len, &r);

	g_free(url);
	if (rc < 0)
		return rc;
	if (r.status != 200)
		return refused(s, "PUT", key, &r);
	if (honoured != NULL)
		*honoured = r.body != NULL && g_str_has_prefix(r.body, TTL_REPLY);
	teu_http_reply_clear(&r);
	return 0;
}

/* Each third of the TTL, every owned key again, with its latest value. */
static gpointer keeper_main(gpointer data)
{
	hstore *s = data;
	int64_t period = (int64_t)s->ttl_s * 1000 / 3;

	while (teu_keeper_sleep(&s->keeper, period)) {
		g_mutex_lock(&s->put_lock);
		GList *keys = g_hash_table_get_keys(s->owned);
		for (GList *l = keys; l != NULL; l = l->next)
			l->data = g_strdup(l->data);
		g_mutex_unlock(&s->put_lock);
		for (GList *l = keys; l != NULL; l = l->next) {
			bool honoured = false;
			g_mutex_lock(&s->put_lock);
			GBytes *v = g_hash_table_lookup(s->owned, l->data); /* NULL: removed meanwhile */
			gsize n = 0;
			const void *d = v ? g_bytes_get_data(v, &n) : NULL;
			if (v != NULL && put(s, l->data, d ? d : "", n, &honoured) < 0)
				s->h->log(s->h, TE_LOG_WARN, "http store %s: renewing '%s' failed; tried again in "
					  "%lld ms", s->log, (const char *)l->data, (long long)period);
			g_mutex_unlock(&s->put_lock);
		}
		g_list_free_full(keys, g_free);
	}
	return NULL;
}

static int http_put(void *ctx, const char *key, const char *value, size_t len, unsigned flags)
{
	hstore *s = ctx;

	if (bad_key(s, key, "put"))
		return -EINVAL;
	if (value == NULL && len > 0) {
		s->h->log(s->h, TE_LOG_ERROR, "http store %s: put '%s' with a NULL value", s->log, key);
		return -EINVAL;
	}
	if ((flags & TE_META_OWNED) && s->ttl_s > 0) {
		bool honoured = false;
		g_mutex_lock(&s->put_lock);
		int rc = put(s, key, value ? value : "", len, &honoured);
		if (rc == 0 && honoured) {
			g_hash_table_replace(s->owned, g_strdup(key), g_bytes_new(value ? value : "", len));
			if (!teu_keeper_start(&s->keeper, "te-http-keeper", keeper_main, s))
				s->h->log(s->h, TE_LOG_WARN, "http store %s: cannot start the thread that renews "
					  "the engine's keys: they expire in %u s", s->log, s->ttl_s);
		} else if (rc == 0 && !s->told_no_ttl) {
			s->told_no_ttl = true;
			s->h->log(s->h, TE_LOG_INFO, "http store %s keeps keys until they are removed (it "
				  "ignores TTLs): a crashed engine's keys stay", s->log);
		}
		g_mutex_unlock(&s->put_lock);
		return rc;
	}
	return put(s, key, value ? value : "", len, NULL);
}

static int http_remove(void *ctx, const char *key)
{
	hstore *s = ctx;
	teu_http_reply r;

	if (bad_key(s, key, "remove"))
		return -EINVAL;
	/* Not renewed from here on, and never put back by a renewal already
	 * under way (it holds put_lock). */
	g_mutex_lock(&s->put_lock);
	g_hash_table_remove(s->owned, key);
	int rc = key_call(s, "DELETE", key, NULL, 0, &r);
	g_mutex_unlock(&s->put_lock);
	if (rc < 0)
		return rc;
	if (r.status != 200 && r.status != 404)
		return refused(s, "DELETE", key, &r);
	teu_http_reply_clear(&r);
	return 0;
}

static int http_list(void *ctx, const char *prefix, char ***keys, size_t *n)
{
	hstore *s = ctx;
	teu_http_reply r;
	JsonNode *p = NULL;

	*keys = NULL;
	*n = 0;
	if (prefix == NULL)
		prefix = "";
	char *esc = g_uri_escape_string(prefix, NULL, FALSE);
	char *url = g_strdup_printf("%s%cprefix=%s", s->base, s->sep, esc);
	g_free(esc);
	int rc = call(s, "GET", url, prefix, NULL, 0, &r);
	g_free(url);
	if (rc < 0)
		return rc;
	if (r.status != 200) {
		/* Servers that only know the three key calls answer 400 or 404. */
		s->h->log(s->h, TE_LOG_INFO, "http store %s cannot list keys (answered %d)", s->log, r.status);
		teu_http_reply_clear(&r);
		return -ENOTSUP;
	}
	/* A flat array of key strings: depth 1, one value a key. */
	static const te_json_limits lim = { 1, 1u << 20, (1u << 20) + 1, 4096, SIZE_MAX };
	char why[160] = "empty";
	p = r.body ? te_json_load(r.body, r.len, &lim, why, sizeof why) : NULL;
	if (p == NULL || !JSON_NODE_HOLDS_ARRAY(p)) {
		s->h->log(s->h, TE_LOG_ERROR, "http store %s: the key list is not a JSON array of keys (%s)",
			  s->log, p ? "another JSON value" : why);
		if (p != NULL)
			json_node_unref(p);
		teu_http_reply_clear(&r);
		return TE_ERR_METADATA;
	}
	JsonArray *a = json_node_get_array(p);
	guint count = json_array_get_length(a);
	char **out = count ? calloc(count, sizeof *out) : NULL;
	size_t got = 0;
	rc = count && out == NULL ? -ENOMEM : 0;
	for (guint i = 0; rc == 0 && i < count; i++) {
		JsonNode *nd = json_array_get_element(a, i);
		const char *k = JSON_NODE_HOLDS_VALUE(nd) && json_node_get_value_type(nd) == G_TYPE_STRING
					? json_node_get_string(nd)
					: NULL;
		if (k == NULL || !g_str_has_prefix(k, prefix))
			continue;
		rc = teu_store_key_add(out, &got, k, strlen(k));
	}
	rc = teu_store_keys_done(out, got, rc, keys, n);
	json_node_unref(p);
	teu_http_reply_clear(&r);
	return rc;
}

static void http_close(void *ctx)
{
	hstore *s = ctx;

	if (s == NULL)
		return;
	teu_keeper_clear(&s->keeper);
	g_hash_table_destroy(s->owned);
	g_mutex_clear(&s->put_lock);
	teu_http_free(s->http);
	teu_http_secret_free(s->base);
	g_free(s->log);
	teu_http_secret_free(s->auth);
	g_free(s);
}

static int http_open(const te_host *h, const char *conn, void **ctx)
{
	GError *e = NULL;
	char *err = NULL;

	*ctx = NULL;
	GUri *u = conn ? g_uri_parse(conn, G_URI_FLAGS_ENCODED, &e) : NULL;
	if (u == NULL) {
		char *red = teu_redact(conn);
		h->log(h, TE_LOG_ERROR, "http store: '%s' is not a URL: %s", red, e ? e->message : "NULL");
		g_free(red);
		if (e)
			g_error_free(e);
		return -EINVAL;
	}
	const char *scheme = g_uri_get_scheme(u);
	if ((g_ascii_strcasecmp(scheme, "http") != 0 && g_ascii_strcasecmp(scheme, "https") != 0) ||
	    g_uri_get_host(u) == NULL || *g_uri_get_host(u) == '\0') {
		char *red = teu_redact(conn);
		h->log(h, TE_LOG_ERROR, "http store: '%s' needs an http:// or https:// URL with a host", red);
		g_free(red);
		g_uri_unref(u);
		return -EINVAL;
	}
	hstore *s = g_new0(hstore, 1);
	s->h = h;
	g_mutex_init(&s->put_lock);
	teu_keeper_init(&s->keeper);
	s->owned = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, (GDestroyNotify)g_bytes_unref);
	GUri *nofrag = g_uri_build(g_uri_get_flags(u), scheme, g_uri_get_userinfo(u), g_uri_get_host(u),
				   g_uri_get_port(u), g_uri_get_path(u), g_uri_get_query(u), NULL);
	s->base = g_uri_to_string(nofrag);
	s->sep = g_uri_get_query(u) != NULL ? '&' : '?';
	s->log = teu_redact(s->base);
	g_uri_unref(nofrag);
	g_uri_unref(u);

	s->timeout_ms = (int)te_host_config_u64(h, "TE_HTTP_TIMEOUT_MS", NULL, 5000, 10, 600000);
	s->ttl_s = (unsigned)te_host_config_u64(h, "TE_HTTP_KEY_TTL", NULL, 10, 0, 86400);
	teu_http_opts o = {
		.max_reply = te_host_config_u64(h, "TE_HTTP_MAX_REPLY", NULL, 64u << 20, 4096, 1ull << 32),
		.max_conns = 8,
		.ca_file = h->config(h, "TE_HTTP_CA_FILE", NULL),
	};
	const char *tf = h->config(h, "TE_HTTP_TOKEN_FILE", NULL);
	if (tf != NULL && *tf != '\0') {
		char *tok = teu_http_read_secret(tf, &err);
		if (tok == NULL) {
			h->log(h, TE_LOG_ERROR, "http store %s: TE_HTTP_TOKEN_FILE: %s", s->log, err);
			g_free(err);
			http_close(s);
			return -EINVAL;
		}
		if (strspn(tok, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/=") !=
		    strlen(tok)) {
			/* RFC 6750's token68: anything else could break the header */
			h->log(h, TE_LOG_ERROR, "http store %s: the token in %s holds characters other than "
			       "letters, digits and -._~+/=", s->log, tf);
			teu_http_secret_free(tok);
			http_close(s);
			return -EINVAL;
		}
		s->auth = g_strconcat("Bearer ", tok, NULL);
		teu_http_secret_free(tok);
	}
	s->http = teu_http_new(&o, &err);
	if (s->http == NULL) {
		h->log(h, TE_LOG_ERROR, "http store %s: %s", s->log, err ? err : "HTTP client failed to start");
		g_free(err);
		http_close(s);
		return -EINVAL;
	}
	*ctx = s;
	return 0;
}

static const char *const http_schemes[] = { "http", "https", NULL };

TEU_STORE_PLUGIN(http, "HTTP metadata store (GET/PUT/DELETE <url>?key=..., te-metadata-server or compatible)")
