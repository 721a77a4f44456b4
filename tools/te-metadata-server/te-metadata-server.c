/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te-metadata-server: the HTTP metadata store that libte's http plugin (and
 * Mooncake's http metadata client) talk to.
 *
 *   GET    <path>?key=K   200 + value | 404
 *   PUT    <path>?key=K   body = value: 200 (413 too large, 411 without a length)
 *   DELETE <path>?key=K   200 | 404
 *   GET    <path>         200 + JSON array of the keys (optional ?prefix=P)
 *   GET    /health        200 + {"status":"ok","keys":N}
 *
 *   PUT    <path>?key=K&ttl=S   the same, and the key expires S seconds
 *                                (1 to 86400) after its last such PUT
 *
 * With --persist FILE every change is written to FILE (a new file, fsync'ed,
 * renamed over the old one) before the reply, so a restart, even after
 * kill -9, loses nothing that was acknowledged. A key with a TTL is kept
 * with its TTL, which it gets in full after a restart, so that its owner
 * has the time to renew it; a renewal (the same value and TTL again) does
 * not write the file.
 *
 * A TTL is how a crashed engine's keys vanish: libte's http plugin puts its
 * engine's keys with one and puts them again every third of it (the reply to
 * a PUT with a TTL says "expires in S s", which tells the client that this
 * store honours it; other stores ignore the parameter).
 *
 * With --token-file FILE (or TE_METADATA_TOKEN_FILE) requests to the store
 * need "Authorization: Bearer <token>": writes always, reads unless
 * --public-reads. Refusals are 401, logged with the client's address (at
 * most one line a second), never with what the client sent.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib-unix.h>
#include <glib.h>
#include <json-glib/json-glib.h>
#include <te/te-json.h>
#include <libsoup/soup.h>

#include "teu-bearer.h"
#include "teu-hostport.h"
#include "teu-json.h"
#include "teu-refuse.h"

#define PERSIST_FORMAT "te-metadata-server/1"
#define TTL_MAX 86400 /* seconds */

typedef struct key_ttl {
	gint64 deadline; /* monotonic µs */
	guint ttl;       /* seconds */
} key_ttl;

typedef struct server {
	GHashTable *kv; /* key → GBytes */
	GHashTable *expiry; /* key → key_ttl, the keys put with a TTL */
	char *path;     /* URL path of the store, e.g. "/metadata" */
	char *persist;
	guint64 max_body;
	guint max_keys;
	guint max_key_len;
	gboolean verbose;
	GMainLoop *loop;
	/* bearer token: SHA-256 of it, compared in constant time; none when unset */
	teu_bearer token;
	gboolean public_reads;
	gint64 refusal_logged_us; /* when the last refusal line was written */
	guint refusals_unlogged;  /* refusals since */
} server;

static void vlog(server *s, const char *fmt, ...) G_GNUC_PRINTF(2, 3);
static void vlog(server *s, const char *fmt, ...)
{
	if (!s->verbose)
		return;
	va_list ap;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* ------------------------------------------------------------ persistence */

static gboolean write_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return FALSE;
		p += w;
		n -= (size_t)w;
	}
	return TRUE;
}

/* The whole store as JSON: {"format":..., "entries":{key: value}, "binary":
 * {key: base64}} (values that are not UTF-8 text go to "binary"); NULL when
 * out of memory. free() frees it. */
static char *serialize(server *s, size_t *len)
{
	JsonBuilder *b = json_builder_new();
	GHashTableIter it;
	gpointer k, v;

	json_builder_begin_object(b);
	json_builder_set_member_name(b, "format");
	json_builder_add_string_value(b, PERSIST_FORMAT);
	/* The TTL of each key that has one (servers without TTLs skip it). */
	json_builder_set_member_name(b, "ttl");
	json_builder_begin_object(b);
	g_hash_table_iter_init(&it, s->expiry);
	while (g_hash_table_iter_next(&it, &k, &v)) {
		json_builder_set_member_name(b, k);
		json_builder_add_int_value(b, ((key_ttl *)v)->ttl);
	}
	json_builder_end_object(b);
	for (int pass = 0; pass < 2; pass++) {
		json_builder_set_member_name(b, pass == 0 ? "entries" : "binary");
		json_builder_begin_object(b);
		g_hash_table_iter_init(&it, s->kv);
		while (g_hash_table_iter_next(&it, &k, &v)) {
			gsize n;
			const char *d = g_bytes_get_data(v, &n);
			gboolean text = g_utf8_validate(d ? d : "", (gssize)n, NULL);
			if (text != (pass == 0))
				continue;
			json_builder_set_member_name(b, k);
			if (text) {
				char *t = g_strndup(d ? d : "", n);
				json_builder_add_string_value(b, t);
				g_free(t);
			} else {
				char *e = g_base64_encode((const guchar *)d, n);
				json_builder_add_string_value(b, e);
				g_free(e);
			}
		}
		json_builder_end_object(b);
	}
	json_builder_end_object(b);
	return teu_json_finish(b, len);
}

static gboolean persist_now(server *s, char **why)
{
	size_t len;
	char *data, *tmp;
	int fd;
	gboolean ok;

	if (s->persist == NULL)
		return TRUE;
	data = serialize(s, &len);
	if (data == NULL) {
		*why = g_strdup_printf("writing %s failed: %s", s->persist, g_strerror(ENOMEM));
		return FALSE;
	}
	tmp = g_strdup_printf("%s.tmp", s->persist);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	ok = fd >= 0 && write_all(fd, data, len) && fsync(fd) == 0;
	int saved = errno;
	if (fd >= 0 && close(fd) != 0 && ok) {
		ok = FALSE;
		saved = errno;
	}
	if (ok && rename(tmp, s->persist) != 0) {
		ok = FALSE;
		saved = errno;
	}
	if (ok) {
		/* Make the rename itself durable. */
		char *dir = g_path_get_dirname(s->persist);
		int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd >= 0) {
			fsync(dfd);
			close(dfd);
		}
		g_free(dir);
	} else {
		*why = g_strdup_printf("writing %s failed: %s", s->persist, g_strerror(saved));
		unlink(tmp);
	}
	g_free(tmp);
	free(data);
	return ok;
}

static gboolean load_members(server *s, JsonObject *o, const char *name, gboolean binary, GError **err)
{
	JsonNode *n = json_object_get_member(o, name);

	if (n == NULL)
		return TRUE;
	if (!JSON_NODE_HOLDS_OBJECT(n)) {
		g_set_error(err, G_FILE_ERROR, G_FILE_ERROR_INVAL, "\"%s\" is not an object", name);
		return FALSE;
	}
	JsonObject *m = json_node_get_object(n);
	GList *members = json_object_get_members(m);
	for (GList *l = members; l; l = l->next) {
		JsonNode *v = json_object_get_member(m, l->data);
		if (!JSON_NODE_HOLDS_VALUE(v) || json_node_get_value_type(v) != G_TYPE_STRING) {
			g_set_error(err, G_FILE_ERROR, G_FILE_ERROR_INVAL, "value of \"%s\" is not a string",
				    (const char *)l->data);
			g_list_free(members);
			return FALSE;
		}
		const char *t = json_node_get_string(v);
		GBytes *b;
		if (binary) {
			gsize bl = 0;
			guchar *raw = g_base64_decode(t, &bl);
			b = g_bytes_new_take(raw, bl);
		} else {
			b = g_bytes_new(t, strlen(t));
		}
		g_hash_table_replace(s->kv, g_strdup(l->data), b);
	}
	g_list_free(members);
	return TRUE;
}

/* "ttl": {key: seconds}: each key of the store named there expires that
 * long after the start (the whole TTL again: its owner renews it). */
static gboolean load_ttls(server *s, JsonObject *o, GError **err)
{
	JsonNode *n = json_object_get_member(o, "ttl");

	if (n == NULL)
		return TRUE;
	if (!JSON_NODE_HOLDS_OBJECT(n)) {
		g_set_error(err, G_FILE_ERROR, G_FILE_ERROR_INVAL, "\"ttl\" is not an object");
		return FALSE;
	}
	JsonObject *m = json_node_get_object(n);
	GList *members = json_object_get_members(m);
	gint64 now = g_get_monotonic_time();
	gboolean ok = TRUE;
	for (GList *l = members; l && ok; l = l->next) {
		JsonNode *v = json_object_get_member(m, l->data);
		gint64 secs = JSON_NODE_HOLDS_VALUE(v) && json_node_get_value_type(v) == G_TYPE_INT64
				      ? json_node_get_int(v)
				      : 0;
		if (secs < 1 || secs > TTL_MAX) {
			g_set_error(err, G_FILE_ERROR, G_FILE_ERROR_INVAL,
				    "the TTL of \"%s\" is not 1 to %d seconds", (const char *)l->data, TTL_MAX);
			ok = FALSE;
		} else if (g_hash_table_contains(s->kv, l->data)) {
			key_ttl *t = g_new(key_ttl, 1);
			*t = (key_ttl){ now + secs * G_USEC_PER_SEC, (guint)secs };
			g_hash_table_replace(s->expiry, g_strdup(l->data), t);
		}
	}
	g_list_free(members);
	return ok;
}

static gboolean load(server *s, GError **err)
{
	GMappedFile *f;
	JsonNode *root = NULL;
	gboolean ok = FALSE;
	char why[160] = "";

	if (s->persist == NULL || !g_file_test(s->persist, G_FILE_TEST_EXISTS))
		return TRUE;
	f = g_mapped_file_new(s->persist, FALSE, err);
	if (f == NULL)
		return FALSE;
	/* {"format": …, "entries": {key: value, …}, "binary": {…}}: depth 2, as
	 * many members as keys the server holds, strings as long as the largest
	 * key or value written with every byte escaped (six bytes each). */
	uint64_t longest = s->max_body > s->max_key_len ? s->max_body : s->max_key_len;
	te_json_limits lim = { 2, (size_t)s->max_keys + 1, 3 * (size_t)s->max_keys + 8,
			       longest > SIZE_MAX / 8 ? SIZE_MAX : (size_t)(6 * longest + 8), SIZE_MAX };
	root = te_json_load(g_mapped_file_get_contents(f), g_mapped_file_get_length(f), &lim, why,
			    sizeof why);
	if (root == NULL) {
		g_set_error(err, G_FILE_ERROR, G_FILE_ERROR_INVAL, "refused: %s", why);
		goto out;
	}
	JsonObject *o = JSON_NODE_HOLDS_OBJECT(root) ? json_node_get_object(root) : NULL;
	JsonNode *fmt = o ? json_object_get_member(o, "format") : NULL;
	if (fmt == NULL || !JSON_NODE_HOLDS_VALUE(fmt) || json_node_get_value_type(fmt) != G_TYPE_STRING ||
	    strcmp(json_node_get_string(fmt), PERSIST_FORMAT) != 0) {
		g_set_error(err, G_FILE_ERROR, G_FILE_ERROR_INVAL, "not a %s file", PERSIST_FORMAT);
		goto out;
	}
	ok = load_members(s, o, "entries", FALSE, err) && load_members(s, o, "binary", TRUE, err) &&
	     load_ttls(s, o, err);
out:
	if (root != NULL)
		json_node_unref(root);
	g_mapped_file_unref(f);
	return ok;
}

/* ----------------------------------------------------------------- TTLs */

/* Drops every key whose TTL ran out, and writes the file if one went. */
static void sweep(server *s)
{
	gint64 now = g_get_monotonic_time();
	GHashTableIter it;
	gpointer k, v;
	guint gone = 0;

	g_hash_table_iter_init(&it, s->expiry);
	while (g_hash_table_iter_next(&it, &k, &v)) {
		if (((key_ttl *)v)->deadline > now)
			continue;
		vlog(s, "EXPIRED %s", (const char *)k);
		g_hash_table_remove(s->kv, k);
		g_hash_table_iter_remove(&it);
		gone++;
	}
	char *why = NULL;
	if (gone > 0 && !persist_now(s, &why)) {
		/* The file keeps them until the next change is written: they
		 * come back after a restart, with their TTL, and expire again. */
		g_printerr("te-metadata-server: %s\n", why);
		g_free(why);
	}
}

static gboolean sweep_tick(gpointer data)
{
	sweep(data);
	return G_SOURCE_CONTINUE;
}

/* The value of `key`, NULL when there is none; a key whose TTL ran out has
 * none (the sweep that this calls for runs first). */
static GBytes *lookup(server *s, const char *key)
{
	key_ttl *t = g_hash_table_lookup(s->expiry, key);
	if (t != NULL && t->deadline <= g_get_monotonic_time())
		sweep(s);
	return g_hash_table_lookup(s->kv, key);
}

/* ----------------------------------------------------------------- HTTP */

static void reply(SoupServerMessage *msg, guint status, const char *ctype, const char *body, gsize len)
{
	soup_server_message_set_status(msg, status, NULL);
	soup_server_message_set_response(msg, ctype, SOUP_MEMORY_COPY, body, len);
}

static void reply_text(SoupServerMessage *msg, guint status, const char *text)
{
	reply(msg, status, "text/plain", text, strlen(text));
}

/* A PUT's success, with when the key expires when it has a TTL. */
static void reply_updated(SoupServerMessage *msg, guint64 ttl)
{
	if (ttl == 0) {
		reply_text(msg, SOUP_STATUS_OK, "metadata updated");
		return;
	}
	char *t = g_strdup_printf("metadata updated; expires in %llu s unless put again", (unsigned long long)ttl);
	reply_text(msg, SOUP_STATUS_OK, t);
	g_free(t);
}

/* Before the body is read (util/teu-refuse.h); the
 * connection is closed after the short reply. */
static void refuse_early(SoupServerMessage *msg, guint status, char *text)
{
	teu_refuse_early(NULL, msg, status, "te-metadata-server", "te-metadata-server", text);
}

/* NULL when `msg` may go on; else why it may not (for the log). With
 * --public-reads a GET or HEAD needs no token. */
static const char *unauthorized(server *s, SoupServerMessage *msg)
{
	if (!s->token.on)
		return NULL;
	const char *m = soup_server_message_get_method(msg);
	if (s->public_reads && (strcmp(m, SOUP_METHOD_GET) == 0 || strcmp(m, SOUP_METHOD_HEAD) == 0))
		return NULL;
	return teu_bearer_refuse(&s->token, soup_message_headers_get_one(soup_server_message_get_request_headers(msg),
									 "Authorization"));
}

/* One line per refusal, at most one a second (the others are counted):
 * a client guessing tokens must not fill the disk. */
static void log_refusal(server *s, SoupServerMessage *msg, const char *why)
{
	gint64 now = g_get_monotonic_time();

	if (s->refusal_logged_us != 0 && now - s->refusal_logged_us < G_USEC_PER_SEC) {
		s->refusals_unlogged++;
		return;
	}
	const char *host = soup_server_message_get_remote_host(msg);
	fprintf(stderr, "te-metadata-server: 401 to %s for %s %s: %s", host ? host : "?",
		soup_server_message_get_method(msg), g_uri_get_path(soup_server_message_get_uri(msg)), why);
	if (s->refusals_unlogged > 0)
		fprintf(stderr, " (and %u more refusals in the last second)", s->refusals_unlogged);
	fputc('\n', stderr);
	s->refusal_logged_us = now;
	s->refusals_unlogged = 0;
}

/* Early handler: runs once the headers are in, before the body is read, so
 * an oversized or unbounded PUT is refused without reading it. */
static void early_handler(SoupServer *srv, SoupServerMessage *msg, const char *path, GHashTable *query,
			  gpointer data)
{
	server *s = data;
	(void)srv;
	(void)path;
	(void)query;

	/* Before anything else, so an unauthorized client learns nothing about
	 * the limits and its body is never read. */
	const char *why = unauthorized(s, msg);
	if (why != NULL) {
		log_refusal(s, msg, why);
		refuse_early(msg, SOUP_STATUS_UNAUTHORIZED, g_strdup("unauthorized"));
		return;
	}
	if (strcmp(soup_server_message_get_method(msg), SOUP_METHOD_PUT) != 0)
		return;
	SoupMessageHeaders *h = soup_server_message_get_request_headers(msg);
	SoupEncoding enc = soup_message_headers_get_encoding(h);
	if (enc == SOUP_ENCODING_CHUNKED || enc == SOUP_ENCODING_EOF) {
		vlog(s, "PUT refused: no Content-Length");
		refuse_early(msg, SOUP_STATUS_LENGTH_REQUIRED, g_strdup("a PUT needs a Content-Length"));
		return;
	}
	goffset n = soup_message_headers_get_content_length(h);
	if ((guint64)n > s->max_body) {
		char *t = g_strdup_printf("value of %lld bytes exceeds the limit of %llu", (long long)n,
					  (unsigned long long)s->max_body);
		vlog(s, "PUT refused: %s", t);
		refuse_early(msg, SOUP_STATUS_REQUEST_ENTITY_TOO_LARGE, t);
	}
}

static void list_keys(server *s, SoupServerMessage *msg, GHashTable *query)
{
	const char *prefix = query ? g_hash_table_lookup(query, "prefix") : NULL;
	sweep(s);
	GList *keys = g_hash_table_get_keys(s->kv);
	JsonBuilder *b = json_builder_new();

	keys = g_list_sort(keys, (GCompareFunc)g_strcmp0);
	json_builder_begin_array(b);
	for (GList *l = keys; l; l = l->next)
		if (prefix == NULL || g_str_has_prefix(l->data, prefix))
			json_builder_add_string_value(b, l->data);
	json_builder_end_array(b);
	g_list_free(keys);
	size_t len;
	char *out = teu_json_finish(b, &len);
	if (out == NULL) {
		reply_text(msg, SOUP_STATUS_INTERNAL_SERVER_ERROR, "out of memory\n");
		return;
	}
	reply(msg, SOUP_STATUS_OK, "application/json", out, len);
	free(out);
}

static void store_handler(SoupServer *srv, SoupServerMessage *msg, const char *path, GHashTable *query,
			  gpointer data)
{
	server *s = data;
	const char *method = soup_server_message_get_method(msg);
	const char *key = query ? g_hash_table_lookup(query, "key") : NULL;
	char *why = NULL;
	(void)srv;

	const char *refused = unauthorized(s, msg); /* the early handler's check, once more */
	if (refused != NULL) {
		log_refusal(s, msg, refused);
		soup_message_headers_replace(soup_server_message_get_response_headers(msg), "WWW-Authenticate",
					     "Bearer realm=\"te-metadata-server\"");
		reply_text(msg, SOUP_STATUS_UNAUTHORIZED, "unauthorized");
		return;
	}
	if (strcmp(path, s->path) != 0) {
		reply_text(msg, SOUP_STATUS_NOT_FOUND, "no such path");
		return;
	}
	if (key == NULL && strcmp(method, SOUP_METHOD_GET) == 0) {
		list_keys(s, msg, query);
		return;
	}
	if (strcmp(method, SOUP_METHOD_GET) != 0 && strcmp(method, SOUP_METHOD_PUT) != 0 &&
	    strcmp(method, SOUP_METHOD_DELETE) != 0) {
		soup_message_headers_replace(soup_server_message_get_response_headers(msg), "Allow",
					     "GET, PUT, DELETE");
		reply_text(msg, SOUP_STATUS_METHOD_NOT_ALLOWED, "method not allowed");
		return;
	}
	if (key == NULL || *key == '\0') {
		reply_text(msg, SOUP_STATUS_BAD_REQUEST, "missing or empty key parameter");
		return;
	}
	if (strlen(key) > s->max_key_len || !g_utf8_validate(key, -1, NULL)) {
		reply_text(msg, SOUP_STATUS_BAD_REQUEST, "key too long or not UTF-8");
		return;
	}
	if (strcmp(method, SOUP_METHOD_GET) == 0) {
		GBytes *v = lookup(s, key);
		if (v == NULL) {
			reply_text(msg, SOUP_STATUS_NOT_FOUND, "metadata not found");
			return;
		}
		gsize n;
		const char *d = g_bytes_get_data(v, &n);
		reply(msg, SOUP_STATUS_OK, "application/json", d ? d : "", n);
		return;
	}
	if (strcmp(method, SOUP_METHOD_PUT) == 0) {
		const char *ttl_text = query ? g_hash_table_lookup(query, "ttl") : NULL;
		guint64 ttl = 0;
		if (ttl_text != NULL && !g_ascii_string_to_unsigned(ttl_text, 10, 1, TTL_MAX, &ttl, NULL)) {
			reply_text(msg, SOUP_STATUS_BAD_REQUEST, "ttl must be a whole number of seconds from 1 to 86400");
			return;
		}
		SoupMessageBody *body = soup_server_message_get_request_body(msg);
		GBytes *b = soup_message_body_flatten(body);
		if (g_bytes_get_size(b) > s->max_body) { /* the early handler's check, once more */
			g_bytes_unref(b);
			reply_text(msg, SOUP_STATUS_REQUEST_ENTITY_TOO_LARGE, "value too large");
			return;
		}
		GBytes *old = lookup(s, key); /* one whose time ran out: a PUT now makes a new key */
		if (old == NULL && g_hash_table_size(s->kv) >= s->max_keys) {
			g_bytes_unref(b);
			reply_text(msg, SOUP_STATUS_INSUFFICIENT_STORAGE, "too many keys");
			return;
		}
		key_ttl *cur = g_hash_table_lookup(s->expiry, key);
		gint64 deadline = g_get_monotonic_time() + (gint64)ttl * G_USEC_PER_SEC;
		if (old != NULL && ttl > 0 && cur != NULL && cur->ttl == ttl && g_bytes_equal(old, b)) {
			/* A renewal: the file, which holds the TTL, not the deadline,
			 * stays as it is. */
			cur->deadline = deadline;
			g_bytes_unref(b);
			reply_updated(msg, ttl);
			return;
		}
		key_ttl was = cur ? *cur : (key_ttl){ 0, 0 };
		if (old)
			g_bytes_ref(old);
		g_hash_table_replace(s->kv, g_strdup(key), b);
		if (ttl > 0) {
			key_ttl *t = g_new(key_ttl, 1);
			*t = (key_ttl){ deadline, (guint)ttl };
			g_hash_table_replace(s->expiry, g_strdup(key), t);
		} else {
			g_hash_table_remove(s->expiry, key); /* kept until deleted */
		}
		if (!persist_now(s, &why)) {
			/* Keep memory and file in agreement: undo. */
			if (old)
				g_hash_table_replace(s->kv, g_strdup(key), old);
			else
				g_hash_table_remove(s->kv, key);
			if (was.ttl > 0)
				g_hash_table_replace(s->expiry, g_strdup(key), g_memdup2(&was, sizeof was));
			else
				g_hash_table_remove(s->expiry, key);
			g_printerr("te-metadata-server: %s\n", why);
			reply_text(msg, SOUP_STATUS_INTERNAL_SERVER_ERROR, why);
			g_free(why);
			return;
		}
		if (old)
			g_bytes_unref(old);
		vlog(s, "PUT %s (%zu bytes%s)", key, g_bytes_get_size(b), ttl ? ", with a TTL" : "");
		reply_updated(msg, ttl);
		return;
	}
	/* DELETE */
	GBytes *old = lookup(s, key);
	if (old == NULL) {
		reply_text(msg, SOUP_STATUS_NOT_FOUND, "metadata not found");
		return;
	}
	g_bytes_ref(old);
	key_ttl *cur = g_hash_table_lookup(s->expiry, key);
	key_ttl was = cur ? *cur : (key_ttl){ 0, 0 };
	g_hash_table_remove(s->kv, key);
	g_hash_table_remove(s->expiry, key);
	if (!persist_now(s, &why)) {
		g_hash_table_replace(s->kv, g_strdup(key), old);
		if (was.ttl > 0)
			g_hash_table_replace(s->expiry, g_strdup(key), g_memdup2(&was, sizeof was));
		g_printerr("te-metadata-server: %s\n", why);
		reply_text(msg, SOUP_STATUS_INTERNAL_SERVER_ERROR, why);
		g_free(why);
		return;
	}
	g_bytes_unref(old);
	vlog(s, "DELETE %s", key);
	reply_text(msg, SOUP_STATUS_OK, "metadata deleted");
}

static void health_handler(SoupServer *srv, SoupServerMessage *msg, const char *path, GHashTable *query,
			   gpointer data)
{
	server *s = data;
	(void)srv;
	(void)query;

	if (strcmp(path, "/health") != 0) {
		reply_text(msg, SOUP_STATUS_NOT_FOUND, "no such path");
		return;
	}
	if (strcmp(soup_server_message_get_method(msg), SOUP_METHOD_GET) != 0) {
		reply_text(msg, SOUP_STATUS_METHOD_NOT_ALLOWED, "method not allowed");
		return;
	}
	sweep(s);
	char *t = g_strdup_printf("{\"status\":\"ok\",\"keys\":%u}", g_hash_table_size(s->kv));
	reply(msg, SOUP_STATUS_OK, "application/json", t, strlen(t));
	g_free(t);
}

static void default_handler(SoupServer *srv, SoupServerMessage *msg, const char *path, GHashTable *query,
			    gpointer data)
{
	(void)srv;
	(void)path;
	(void)query;
	(void)data;
	reply_text(msg, SOUP_STATUS_NOT_FOUND, "no such path");
}

static gboolean on_signal(gpointer data)
{
	g_main_loop_quit(data);
	return G_SOURCE_REMOVE;
}

/* "host:port", "[v6]:port" or ":port". */
static GSocketAddress *parse_listen(const char *s, GError **err)
{
	char host[TEU_HOST_MAX];
	int port = -1;

	if (teu_hostport_split(s, host, sizeof host, &port) < 0 || port < 0)
		goto bad;
	GInetAddress *ia = *host ? g_inet_address_new_from_string(host) : g_inet_address_new_any(G_SOCKET_FAMILY_IPV4);
	if (ia == NULL)
		goto bad;
	GSocketAddress *a = g_inet_socket_address_new(ia, (guint16)port);
	g_object_unref(ia);
	return a;
bad:
	g_set_error(err, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
		    "--listen '%s' is not ADDRESS:PORT (a numeric address, e.g. 0.0.0.0:8080)", s);
	return NULL;
}

int main(int argc, char **argv)
{
	server s = { 0 };
	char *listen = NULL, *path = NULL, *port_file = NULL, *tls_cert = NULL, *tls_key = NULL;
	char *token_file = NULL;
	gint64 max_body = 4 << 20, max_keys = 1000000, max_key_len = 4096;
	GError *err = NULL;
	GSocketAddress *addr = NULL;
	SoupServer *srv = NULL;
	int rc = 2;
	GOptionEntry entries[] = {
		{ "listen", 'l', 0, G_OPTION_ARG_STRING, &listen,
		  "ADDRESS:PORT to listen on (default 127.0.0.1:8080; port 0 picks one)", "ADDR:PORT" },
		{ "path", 'p', 0, G_OPTION_ARG_STRING, &path, "URL path of the store (default /metadata)", "PATH" },
		{ "persist", 'f', 0, G_OPTION_ARG_FILENAME, &s.persist,
		  "keep the store in FILE: loaded at start, rewritten on every change", "FILE" },
		{ "max-body", 0, 0, G_OPTION_ARG_INT64, &max_body, "largest value accepted (default 4194304)",
		  "BYTES" },
		{ "max-keys", 0, 0, G_OPTION_ARG_INT64, &max_keys, "most keys held (default 1000000)", "N" },
		{ "max-key-length", 0, 0, G_OPTION_ARG_INT64, &max_key_len, "longest key (default 4096)", "BYTES" },
		{ "port-file", 0, 0, G_OPTION_ARG_FILENAME, &port_file,
		  "write the bound port to FILE once listening", "FILE" },
		{ "tls-cert", 0, 0, G_OPTION_ARG_FILENAME, &tls_cert,
		  "serve https with this PEM certificate (chain)", "FILE" },
		{ "tls-key", 0, 0, G_OPTION_ARG_FILENAME, &tls_key, "PEM private key of --tls-cert", "FILE" },
		{ "token-file", 0, 0, G_OPTION_ARG_FILENAME, &token_file,
		  "require 'Authorization: Bearer <token>', the token being FILE's first line "
		  "(default: $TE_METADATA_TOKEN_FILE)", "FILE" },
		{ "public-reads", 0, 0, G_OPTION_ARG_NONE, &s.public_reads,
		  "with a token, let GET through without it (writes still need it)", NULL },
		{ "verbose", 'v', 0, G_OPTION_ARG_NONE, &s.verbose, "log every change", NULL },
		{ NULL, 0, 0, 0, NULL, NULL, NULL },
	};
	GOptionContext *oc = g_option_context_new("- HTTP metadata store for libte and Mooncake nodes");
	g_option_context_add_main_entries(oc, entries, NULL);
	gboolean parsed = g_option_context_parse(oc, &argc, &argv, &err);
	g_option_context_free(oc);
	if (!parsed) {
		g_printerr("te-metadata-server: %s\n", err->message);
		goto out;
	}
	if (argc > 1) {
		g_printerr("te-metadata-server: unexpected argument '%s'\n", argv[1]);
		goto out;
	}
	if (max_body < 0 || max_keys <= 0 || max_keys > G_MAXUINT || max_key_len <= 0 || max_key_len > 1 << 20) {
		g_printerr("te-metadata-server: --max-body, --max-keys or --max-key-length out of range\n");
		goto out;
	}
	s.max_body = (guint64)max_body;
	s.max_keys = (guint)max_keys;
	s.max_key_len = (guint)max_key_len;
	s.path = g_strdup(path ? path : "/metadata");
	if (s.path[0] != '/' || strcmp(s.path, "/health") == 0 || strcmp(s.path, "/") == 0) {
		g_printerr("te-metadata-server: --path must start with '/' and be neither / nor /health\n");
		goto out;
	}
	if (token_file == NULL && g_getenv("TE_METADATA_TOKEN_FILE") && *g_getenv("TE_METADATA_TOKEN_FILE"))
		token_file = g_strdup(g_getenv("TE_METADATA_TOKEN_FILE"));
	if (token_file != NULL) {
		char why[512];
		bool weak = false;
		int trc = teu_bearer_load(&s.token, token_file, &weak, why, sizeof why);
		if (trc < 0) {
			g_printerr("te-metadata-server: %s\n", why);
			rc = trc == -EIO ? 1 : 2;
			goto out;
		}
		if (weak)
			g_printerr("te-metadata-server: warning: the token in %s is shorter than 16 "
				   "characters; a long random one (openssl rand -hex 32) resists guessing\n",
				   token_file);
	} else if (s.public_reads) {
		g_printerr("te-metadata-server: --public-reads needs --token-file\n");
		goto out;
	}
	s.kv = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, (GDestroyNotify)g_bytes_unref);
	s.expiry = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
	rc = 1;
	if (!load(&s, &err)) {
		g_printerr("te-metadata-server: cannot load %s: %s (refusing to start over it)\n", s.persist,
			   err->message);
		goto out;
	}
	addr = parse_listen(listen ? listen : "127.0.0.1:8080", &err);
	if (addr == NULL) {
		g_printerr("te-metadata-server: %s\n", err->message);
		rc = 2;
		goto out;
	}

	GTlsCertificate *cert = NULL;
	if ((tls_cert == NULL) != (tls_key == NULL)) {
		g_printerr("te-metadata-server: --tls-cert and --tls-key go together\n");
		rc = 2;
		goto out;
	}
	if (tls_cert != NULL) {
		cert = g_tls_certificate_new_from_files(tls_cert, tls_key, &err);
		if (cert == NULL) {
			g_printerr("te-metadata-server: cannot load %s / %s: %s\n", tls_cert, tls_key, err->message);
			goto out;
		}
	}
	srv = soup_server_new("server-header", "te-metadata-server", "tls-certificate", cert, NULL);
	if (cert)
		g_object_unref(cert);
	soup_server_add_early_handler(srv, s.path, early_handler, &s, NULL);
	soup_server_add_handler(srv, s.path, store_handler, &s, NULL);
	soup_server_add_handler(srv, "/health", health_handler, &s, NULL);
	soup_server_add_handler(srv, NULL, default_handler, &s, NULL);
	if (!soup_server_listen(srv, addr, tls_cert ? SOUP_SERVER_LISTEN_HTTPS : 0, &err)) {
		g_printerr("te-metadata-server: cannot listen on %s: %s\n", listen ? listen : "127.0.0.1:8080",
			   err->message);
		goto out;
	}

	GSList *uris = soup_server_get_uris(srv);
	int port = uris ? g_uri_get_port(uris->data) : -1;
	if (uris) {
		char *u = g_uri_to_string(uris->data);
		fprintf(stderr, "te-metadata-server: %zu keys, listening on %s (store at %s%s)\n",
			(size_t)g_hash_table_size(s.kv), u, s.path,
			!s.token.on ? ", no token" : s.public_reads ? ", token for writes" : ", token for all calls");
		g_free(u);
	}
	g_slist_free_full(uris, (GDestroyNotify)g_uri_unref);
	if (port_file != NULL) {
		char *t = g_strdup_printf("%d\n", port);
		char *tmp = g_strdup_printf("%s.tmp", port_file);
		/* Written aside and renamed: a reader never sees half a number. */
		gboolean ok = g_file_set_contents(tmp, t, -1, &err) && rename(tmp, port_file) == 0;
		g_free(tmp);
		g_free(t);
		if (!ok) {
			g_printerr("te-metadata-server: cannot write %s: %s\n", port_file,
				   err ? err->message : g_strerror(errno));
			goto out;
		}
	}

	s.loop = g_main_loop_new(NULL, FALSE);
	g_timeout_add(250, sweep_tick, &s); /* keys whose TTL ran out go within a quarter second */
	g_unix_signal_add(SIGINT, on_signal, s.loop);
	g_unix_signal_add(SIGTERM, on_signal, s.loop);
	g_main_loop_run(s.loop);
	soup_server_disconnect(srv);
	g_main_loop_unref(s.loop);
	rc = 0;
out:
	if (err)
		g_error_free(err);
	if (srv)
		g_object_unref(srv);
	if (addr)
		g_object_unref(addr);
	if (s.kv)
		g_hash_table_unref(s.kv);
	if (s.expiry)
		g_hash_table_unref(s.expiry);
	g_free(s.path);
	g_free(s.persist);
	g_free(listen);
	g_free(path);
	g_free(port_file);
	g_free(tls_cert);
	g_free(tls_key);
	g_free(token_file);
	return rc;
}
