/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The store's operations: get, put (owned keys under the lease), remove and
 * list, each one call of the gateway with base64 keys and values.
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "teu-store.h"
#include "etcd.h"

/* ---------------------------------------------------------------- ops */

/* POSTs `body` (freed here) to `path` for the op `what` on `key`: 0 with a
 * 200 reply in *r, else the error, logged ("failed" when no endpoint
 * answered, "refused" with the store's message). */
static int kv_call(etcd *s, const char *path, char *body, const char *what, const char *key,
		   teu_http_reply *r)
{
	int rc = etcd_post(s, path, body, r);

	g_free(body);
	if (rc < 0) {
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: %s '%s' failed: %s", s->conn, what, key, strerror(-rc));
		return rc;
	}
	if (r->status != 200) {
		char *m = etcd_error_text(r);
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: %s '%s' refused: %s", s->conn, what, key, m);
		g_free(m);
		teu_http_reply_clear(r);
		return TE_ERR_METADATA;
	}
	return 0;
}

int etcd_put_raw(etcd *s, const char *key, const char *value, size_t len, int64_t lease)
{
	char *k = etcd_b64(key, strlen(key)), *v = etcd_b64(value, len);
	char *body = lease ? g_strdup_printf("{\"key\":\"%s\",\"value\":\"%s\",\"lease\":\"%" PRId64 "\"}",
					     k, v, lease)
			   : g_strdup_printf("{\"key\":\"%s\",\"value\":\"%s\"}", k, v);
	teu_http_reply r;
	int rc;

	g_free(k);
	g_free(v);
	rc = etcd_post(s, "/kv/put", body, &r);
	g_free(body);
	if (rc < 0) {
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: put '%s' failed: %s", s->conn, key, strerror(-rc));
		return rc;
	}
	if (r.status == 200) {
		teu_http_reply_clear(&r);
		return 0;
	}
	char *m = etcd_error_text(&r);
	rc = lease && r.status == 404 && strstr(m, "lease not found") ? -ENOENT : TE_ERR_METADATA;
	if (rc != -ENOENT)
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: put '%s' refused: %s", s->conn, key, m);
	g_free(m);
	teu_http_reply_clear(&r);
	return rc;
}

int etcd_put(void *ctx, const char *key, const char *value, size_t len, unsigned flags)
{
	etcd *s = ctx;
	int rc;

	if (teu_store_bad_put(s->h, "etcd", key, value, len))
		return -EINVAL;
	if (!(flags & TE_META_OWNED) || !s->lease_on)
		return etcd_put_raw(s, key, value ? value : "", len, 0);

	g_mutex_lock(&s->lease_lock);
	rc = etcd_lease_ensure(s);
	if (rc == 0) {
		rc = etcd_put_raw(s, key, value, len, s->lease_id);
		if (rc == -ENOENT) { /* the lease expired under us */
			rc = etcd_lease_renew(s);
			if (rc == 0)
				rc = etcd_put_raw(s, key, value, len, s->lease_id);
		}
	}
	if (rc == 0)
		g_hash_table_replace(s->owned, g_strdup(key), g_bytes_new(value, len));
	g_mutex_unlock(&s->lease_lock);
	if (rc == -ENOENT) {
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: put '%s' failed: its lease vanished again", s->conn, key);
		rc = TE_ERR_METADATA;
	}
	return rc;
}

int etcd_get(void *ctx, const char *key, char **value, size_t *len)
{
	etcd *s = ctx;
	teu_http_reply r;
	JsonNode *p = NULL;
	int rc;

	*value = NULL;
	if (teu_store_bad_key(s->h, "etcd", "get", key))
		return -EINVAL;
	char *k = etcd_b64(key, strlen(key));
	rc = kv_call(s, "/kv/range", g_strdup_printf("{\"key\":\"%s\"}", k), "get", key, &r);
	g_free(k);
	if (rc < 0)
		return rc;
	JsonObject *o = etcd_reply_object(s, &r, "get", key, &p);
	rc = TE_ERR_METADATA;
	if (o != NULL) {
		JsonArray *kvs = etcd_arr_member(o, "kvs");
		if (kvs == NULL && json_object_has_member(o, "kvs")) {
			s->h->log(s->h, TE_LOG_ERROR, "etcd %s: get '%s': \"kvs\" is not an array", s->conn,
				  key);
		} else if (kvs == NULL || json_array_get_length(kvs) == 0) {
			rc = -ENOENT;
		} else {
			JsonNode *n = json_array_get_element(kvs, 0);
			JsonObject *kv = JSON_NODE_HOLDS_OBJECT(n) ? json_node_get_object(n) : NULL;
			/* proto3 leaves out an empty value */
			const char *v64 = kv ? etcd_str_member(kv, "value", "") : NULL;
			if (v64 == NULL) {
				s->h->log(s->h, TE_LOG_ERROR, "etcd %s: get '%s': malformed kvs entry", s->conn, key);
			} else {
				gsize n_out = 0;
				guchar *raw = *v64 ? g_base64_decode(v64, &n_out) : NULL;
				rc = teu_store_value(raw, n_out, value, len);
				g_free(raw);
			}
		}
	}
	if (p)
		json_node_unref(p);
	teu_http_reply_clear(&r);
	return rc;
}

static int delete_raw(etcd *s, const char *key)
{
	teu_http_reply r;
	char *k = etcd_b64(key, strlen(key));
	int rc = kv_call(s, "/kv/deleterange", g_strdup_printf("{\"key\":\"%s\"}", k), "remove", key, &r);

	g_free(k);
	if (rc == 0)
		teu_http_reply_clear(&r);
	return rc;
}

int etcd_remove(void *ctx, const char *key)
{
	etcd *s = ctx;

	if (teu_store_bad_key(s->h, "etcd", "remove", key))
		return -EINVAL;
	if (s->lease_on) {
		/* No longer ours to keep alive or to restore. */
		g_mutex_lock(&s->lease_lock);
		g_hash_table_remove(s->owned, key);
		g_mutex_unlock(&s->lease_lock);
	}
	return delete_raw(s, key);
}

/* The end of the range of keys starting with `prefix`: the prefix with its
 * last byte below 0xff incremented; "\0" (all keys) when there is none. */
static GByteArray *range_end(const char *prefix)
{
	GByteArray *a = g_byte_array_new();
	size_t n = strlen(prefix);

	g_byte_array_append(a, (const guint8 *)prefix, (guint)n);
	while (a->len > 0 && a->data[a->len - 1] == 0xff)
		g_byte_array_set_size(a, a->len - 1);
	if (a->len == 0)
		g_byte_array_append(a, (const guint8 *)"", 1);
	else
		a->data[a->len - 1]++;
	return a;
}

int etcd_list(void *ctx, const char *prefix, char ***keys, size_t *n)
{
	etcd *s = ctx;
	teu_http_reply r;
	JsonNode *p = NULL;
	int rc;

	*keys = NULL;
	*n = 0;
	if (prefix == NULL)
		prefix = "";
	GByteArray *end = range_end(prefix);
	char *k = *prefix ? etcd_b64(prefix, strlen(prefix)) : etcd_b64("", 1);
	char *e = etcd_b64(end->data, end->len);
	char *body = g_strdup_printf("{\"key\":\"%s\",\"range_end\":\"%s\",\"keys_only\":true}", k, e);
	g_byte_array_unref(end);
	g_free(k);
	g_free(e);
	rc = kv_call(s, "/kv/range", body, "list", prefix, &r);
	if (rc < 0)
		return rc;
	JsonObject *o = etcd_reply_object(s, &r, "list", prefix, &p);
	rc = o ? 0 : TE_ERR_METADATA;
	JsonArray *kvs = o ? etcd_arr_member(o, "kvs") : NULL;
	guint count = kvs ? json_array_get_length(kvs) : 0;
	char **out = count ? calloc(count, sizeof *out) : NULL;
	size_t got = 0;
	if (count && out == NULL)
		rc = -ENOMEM;
	for (guint i = 0; rc == 0 && i < count; i++) {
		JsonNode *nd = json_array_get_element(kvs, i);
		const char *k64 = JSON_NODE_HOLDS_OBJECT(nd)
					  ? etcd_str_member(json_node_get_object(nd), "key", NULL)
					  : NULL;
		gsize kl = 0;
		guchar *raw = k64 ? g_base64_decode(k64, &kl) : NULL;
		/* Not a key we could name, or one outside the prefix asked for
		 * (the store's answer is not trusted to match the range). */
		if (raw == NULL || memchr(raw, '\0', kl) != NULL || kl < strlen(prefix) ||
		    memcmp(raw, prefix, strlen(prefix)) != 0) {
			g_free(raw);
			continue;
		}
		rc = teu_store_key_add(out, &got, raw, kl);
		g_free(raw);
	}
	rc = teu_store_keys_done(out, got, rc, keys, n);
	if (p)
		json_node_unref(p);
	teu_http_reply_clear(&r);
	return rc;
}
