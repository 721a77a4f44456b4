/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The store's operations: GET, SET (owned keys with an expiry a keeper
 * thread pushes back), DEL and SCAN.
 */
#include <errno.h>
#include <string.h>

#include "teu-store.h"
#include "redis.h"

#define SCAN_COUNT "1000"

/* ---------------------------------------------------------------- ops */

/* A command on one key (GET, DEL), through redis_run(). */
static redisReply *run_key(rstore *s, const char *cmd, const char *key, int *rc)
{
	const char *argv[2] = { cmd, key };
	size_t lens[2] = { strlen(cmd), strlen(key) };

	return redis_run(s, cmd, key, 2, argv, lens, rc);
}

int redis_get(void *ctx, const char *key, char **value, size_t *len)
{
	rstore *s = ctx;
	int rc;

	*value = NULL;
	if (teu_store_bad_key(s->h, "redis", "get", key))
		return -EINVAL;
	redisReply *r = run_key(s, "GET", key, &rc);
	if (r == NULL)
		return rc;
	if (r->type == REDIS_REPLY_NIL) {
		rc = -ENOENT;
	} else if (r->type != REDIS_REPLY_STRING) {
		s->h->log(s->h, TE_LOG_ERROR, "redis %s: GET '%s' returned a reply of type %d, not a string",
			  s->conn, key, r->type);
		rc = TE_ERR_METADATA;
	} else {
		rc = teu_store_value(r->str, r->len, value, len);
	}
	freeReplyObject(r);
	return rc;
}

/* SET, with an expiry of ttl_ms when it is not 0. */
static int set_key(rstore *s, const char *key, const char *value, size_t len, int64_t ttl_ms)
{
	char ms[24];
	int rc;

	g_snprintf(ms, sizeof ms, "%" G_GINT64_FORMAT, ttl_ms);
	const char *argv[5] = { "SET", key, value ? value : "", "PX", ms };
	size_t lens[5] = { 3, strlen(key), len, 2, strlen(ms) };
	redisReply *r = redis_run(s, "SET", key, ttl_ms > 0 ? 5 : 3, argv, lens, &rc);
	if (r == NULL)
		return rc;
	if (r->type != REDIS_REPLY_STATUS || strcmp(r->str, "OK") != 0) {
		s->h->log(s->h, TE_LOG_ERROR, "redis %s: SET '%s' did not answer OK", s->conn, key);
		rc = TE_ERR_METADATA;
	}
	freeReplyObject(r);
	return rc;
}

static gpointer keeper(gpointer data);

int redis_put(void *ctx, const char *key, const char *value, size_t len, unsigned flags)
{
	rstore *s = ctx;
	int rc;

	if (teu_store_bad_put(s->h, "redis", key, value, len))
		return -EINVAL;
	if (!(flags & TE_META_OWNED) || s->ttl_ms == 0)
		return set_key(s, key, value, len, 0);

	g_mutex_lock(&s->owned_lock);
	rc = set_key(s, key, value, len, s->ttl_ms);
	if (rc == 0) {
		g_hash_table_replace(s->owned, g_strdup(key), g_bytes_new(value ? value : "", len));
		if (!teu_keeper_start(&s->keeper, "te-redis-ttl", keeper, s))
			s->h->log(s->h, TE_LOG_ERROR,
				  "redis %s: cannot start the expiry keeper: owned keys expire after %" G_GINT64_FORMAT " ms",
				  s->conn, s->ttl_ms);
	}
	g_mutex_unlock(&s->owned_lock);
	return rc;
}

/* One pass over the owned keys: push each expiry back, put back any key that
 * is gone. With owned_lock held. 0, or the first error. */
static int keep_owned(rstore *s)
{
	GHashTableIter it;
	gpointer k, v;
	char ms[24];
	int first = 0;

	g_snprintf(ms, sizeof ms, "%" G_GINT64_FORMAT, s->ttl_ms);
	g_hash_table_iter_init(&it, s->owned);
	while (g_hash_table_iter_next(&it, &k, &v)) {
		const char *argv[3] = { "PEXPIRE", k, ms };
		size_t lens[3] = { 7, strlen(k), strlen(ms) };
		int rc;
		redisReply *r = redis_run(s, "PEXPIRE", k, 3, argv, lens, &rc);
		if (r != NULL) {
			bool gone = r->type == REDIS_REPLY_INTEGER && r->integer == 0;
			freeReplyObject(r);
			if (gone) {
				gsize n;
				const char *val = g_bytes_get_data(v, &n);
				rc = set_key(s, k, val, n, s->ttl_ms);
				if (rc == 0)
					s->h->log(s->h, TE_LOG_WARN, "redis %s: owned key '%s' had expired; put back",
						  s->conn, (const char *)k);
			}
		}
		if (rc < 0 && first == 0)
			first = rc;
	}
	return first;
}

static gpointer keeper(gpointer data)
{
	rstore *s = data;
	int64_t period = s->ttl_ms / 3 > 100 ? s->ttl_ms / 3 : 100;
	bool failing = false;

	while (teu_keeper_sleep(&s->keeper, failing ? 250 : period)) {
		g_mutex_lock(&s->owned_lock);
		int rc = keep_owned(s);
		g_mutex_unlock(&s->owned_lock);
		if (rc < 0 && !failing)
			s->h->log(s->h, TE_LOG_WARN, "redis %s: renewing the expiry of owned keys failed; retrying",
				  s->conn);
		else if (rc == 0 && failing)
			s->h->log(s->h, TE_LOG_INFO, "redis %s: owned keys renewed again", s->conn);
		failing = rc < 0;
	}
	return NULL;
}

int redis_remove(void *ctx, const char *key)
{
	rstore *s = ctx;
	int rc;

	if (teu_store_bad_key(s->h, "redis", "remove", key))
		return -EINVAL;
	g_mutex_lock(&s->owned_lock);
	redisReply *r = run_key(s, "DEL", key, &rc);
	if (r != NULL) {
		freeReplyObject(r);
		g_hash_table_remove(s->owned, key);
	}
	g_mutex_unlock(&s->owned_lock);
	return r != NULL ? 0 : rc;
}

/* A glob matching keys that start with `prefix` literally. */
static char *glob_prefix(const char *prefix)
{
	GString *g = g_string_new(NULL);

	for (const char *p = prefix; *p; p++) {
		if (strchr("*?[]\\", *p))
			g_string_append_c(g, '\\');
		g_string_append_c(g, *p);
	}
	g_string_append_c(g, '*');
	return g_string_free(g, FALSE);
}

/* g_ptr_array_sort() passes pointers to the elements, not the strings. */
static gint cmp_key(gconstpointer a, gconstpointer b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int redis_list(void *ctx, const char *prefix, char ***keys, size_t *n)
{
	rstore *s = ctx;
	if (prefix == NULL)
		prefix = "";
	size_t plen = strlen(prefix);
	char *pattern = glob_prefix(prefix);
	GPtrArray *out = g_ptr_array_new();
	char cursor[32] = "0";
	int rc = 0;

	*keys = NULL;
	*n = 0;
	/* Bounded: SCAN visits each key at least once and ends at cursor 0;
	 * the cap guards against a misbehaving server. */
	for (int rounds = 0; rounds < 1000000; rounds++) {
		const char *argv[6] = { "SCAN", cursor, "MATCH", pattern, "COUNT", SCAN_COUNT };
		size_t lens[6] = { 4, strlen(cursor), 5, strlen(pattern), 5, strlen(SCAN_COUNT) };
		redisReply *r = redis_run(s, "SCAN", pattern, 6, argv, lens, &rc);
		if (r == NULL)
			break;
		if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
		    r->element[0]->len >= sizeof cursor || r->element[1]->type != REDIS_REPLY_ARRAY) {
			s->h->log(s->h, TE_LOG_ERROR, "redis %s: malformed SCAN reply", s->conn);
			freeReplyObject(r);
			rc = TE_ERR_METADATA;
			break;
		}
		memcpy(cursor, r->element[0]->str, r->element[0]->len);
		cursor[r->element[0]->len] = '\0';
		for (size_t i = 0; i < r->element[1]->elements; i++) {
			redisReply *k = r->element[1]->element[i];
			/* Only keys under the prefix: the server's answer is not
			 * trusted to match the pattern. */
			if (k->type == REDIS_REPLY_STRING && memchr(k->str, '\0', k->len) == NULL &&
			    k->len >= plen && memcmp(k->str, prefix, plen) == 0)
				g_ptr_array_add(out, g_strndup(k->str, k->len));
		}
		freeReplyObject(r);
		if (strcmp(cursor, "0") == 0)
			break;
	}
	g_free(pattern);
	if (rc == 0 && out->len > 0) {
		/* Keys may repeat across SCAN rounds: sort and drop duplicates. */
		g_ptr_array_sort(out, cmp_key);
		char **arr = calloc(out->len, sizeof *arr);
		size_t got = 0;
		if (arr == NULL)
			rc = -ENOMEM;
		for (guint i = 0; rc == 0 && i < out->len; i++) {
			const char *k = g_ptr_array_index(out, i);
			if (got > 0 && strcmp(arr[got - 1], k) == 0)
				continue;
			rc = teu_store_key_add(arr, &got, k, strlen(k));
		}
		rc = teu_store_keys_done(arr, got, rc, keys, n);
	}
	g_ptr_array_foreach(out, (GFunc)(void *)g_free, NULL);
	g_ptr_array_free(out, TRUE);
	return rc;
}
