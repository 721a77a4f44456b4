/* SPDX-License-Identifier: Apache-2.0 */
/*
 * etcd metadata store: etcd's v3 JSON gateway (POST <api>/kv/range, put,
 * deleterange, lease/grant, lease/keepalive, lease/revoke; keys and values
 * base64), spoken through libsoup and json-glib.
 *
 * Endpoints: "etcd://h1:p1,h2:p2" or a bare "h:p"; "etcds://" speaks https to
 * every endpoint. A request goes to the endpoint that answered last; when it
 * cannot be reached, times out or answers 5xx (no leader, shutting down) the
 * next one is tried, each once.
 *
 * Authentication: with a user and password (user-info of the string, or
 * TE_ETCD_USERNAME / TE_ETCD_PASSWORD) the plugin asks <api>/auth/authenticate
 * for a token and sends it in the Authorization header. etcd's simple tokens
 * live on the member that issued them and expire when unused, so a token is
 * kept per endpoint and fetched again when an endpoint calls it invalid (the
 * call is then repeated once) and on fail-over. The password stays in memory
 * for that; logs name the store with "user:***@".
 *
 * Liveness: keys put with TE_META_OWNED are attached to one lease per store
 * handle, kept alive by a thread. If the lease is lost anyway (the store was
 * unreachable for longer than its TTL), the thread grants a new one and puts
 * the owned keys again, so a live engine never stays invisible. A crashed
 * engine stops the keep-alives and etcd deletes its keys after the TTL.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <string.h>

#include <glib.h>
#include <json-glib/json-glib.h>

#include <te/te-json.h>
#include <te/te-plugin.h>

#include "../common/te-http.h"
#include "../common/te-keeper.h"

/* etcd's gateway replies: {"header": …, "kvs": [{…}, …]}, shallow; a listing
 * holds one entry a key and values are base64 text. The reply's size is
 * bounded by TE_ETCD_MAX_REPLY before it gets here. */
#define ETCD_JSON_LIMITS { 16, 262144, 1u << 21, 64u << 20, SIZE_MAX }

#define DEFAULT_PORT 2379
#define MAX_ENDPOINTS 64

typedef struct etcd {
	const te_host *h;
	char *conn; /* for logs: the connection string with its password redacted */
	char **urls; /* "http://h:p<api>" per endpoint */
	int n_urls;
	gint cur; /* endpoint that answered last */
	int timeout_ms;
	te_http *http;

	/* authentication: none when user is NULL */
	char *user, *password;
	GMutex token_lock;  /* tokens[]; held while one is fetched */
	char **tokens;      /* per endpoint; NULL: none yet */
	gint auth_off_seen; /* the store said auth is not enabled (warned once) */
	gint auth_off;      /* ... and no token was issued since: calls go without */

	/* lease */
	bool lease_on;
	int64_t ttl;          /* seconds asked for */
	int64_t keepalive_ms; /* 0: a third of the granted TTL */
	GMutex lease_lock;    /* lease_id, granted_ttl, owned; held across I/O */
	int64_t lease_id;     /* 0: none */
	int64_t granted_ttl;
	GHashTable *owned;    /* key → value of TE_META_OWNED puts */
	te_keeper keeper;
} etcd;

/* json-glib's typed getters warn on a missing member or a wrong type; these
 * return NULL instead, since a peer's reply may be anything. */
static JsonObject *obj_member(JsonObject *o, const char *name)
{
	JsonNode *n = o ? json_object_get_member(o, name) : NULL;
	return n && JSON_NODE_HOLDS_OBJECT(n) ? json_node_get_object(n) : NULL;
}

static JsonArray *arr_member(JsonObject *o, const char *name)
{
	JsonNode *n = o ? json_object_get_member(o, name) : NULL;
	return n && JSON_NODE_HOLDS_ARRAY(n) ? json_node_get_array(n) : NULL;
}

static const char *str_member(JsonObject *o, const char *name, const char *def)
{
	JsonNode *n = o ? json_object_get_member(o, name) : NULL;
	if (n == NULL)
		return def;
	return JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == G_TYPE_STRING ? json_node_get_string(n)
											: NULL;
}

/* ----------------------------------------------------------- transport */

static char *error_text(const te_http_reply *r);
static JsonNode *load_reply(etcd *s, const te_http_reply *r, const char *what, const char *key);

/* Whether a reply says the token sent was not (or no longer) accepted:
 * expired or unknown to this member, or issued before an auth change.
 * Keys and values travel base64-encoded, so these phrases (with spaces)
 * cannot come from stored data. */
static bool token_refused(const te_http_reply *r)
{
	if (r->body == NULL || (r->status == 200 && strncmp(r->body, "{\"error\"", 9) != 0))
		return false;
	return strstr(r->body, "invalid auth token") != NULL || strstr(r->body, "auth store is old") != NULL ||
	       strstr(r->body, "user name is empty") != NULL;
}

/* Asks endpoint `ep` for a token; with token_lock held. 0 with the token in
 * tokens[ep] (NULL when the store has auth off), -EACCES when the store
 * refused the user or password, or a transport error. */
static int authenticate(etcd *s, int ep)
{
	JsonBuilder *b = json_builder_new();
	te_http_reply r;
	char *err = NULL;

	json_builder_begin_object(b);
	json_builder_set_member_name(b, "name");
	json_builder_add_string_value(b, s->user);
	json_builder_set_member_name(b, "password");
	json_builder_add_string_value(b, s->password);
	json_builder_end_object(b);
	JsonGenerator *g = json_generator_new();
	JsonNode *root = json_builder_get_root(b);
	json_generator_set_root(g, root);
	char *body = json_generator_to_data(g, NULL);
	json_node_unref(root);
	g_object_unref(g);
	g_object_unref(b);

	char *url = g_strconcat(s->urls[ep], "/auth/authenticate", NULL);
	int rc = te_http_request(s->http, "POST", url, "application/json", body, strlen(body), NULL,
				 s->timeout_ms, &r, &err);
	g_free(url);
	te_http_secret_free(body); /* it holds the password */
	if (rc < 0) {
		s->h->log(s->h, TE_LOG_WARN, "etcd endpoint %s unusable: %s", s->urls[ep], err ? err : strerror(-rc));
		g_free(err);
		return rc;
	}
	g_free(s->tokens[ep]);
	s->tokens[ep] = NULL;
	if (r.status >= 500) {
		s->h->log(s->h, TE_LOG_WARN, "etcd endpoint %s answered %d to authenticate: %.200s", s->urls[ep],
			  r.status, r.body);
		te_http_reply_clear(&r);
		return -EAGAIN;
	}
	JsonNode *reply = r.status == 200 ? load_reply(s, &r, "authenticate", "-") : NULL;
	const char *tok = NULL;
	if (reply != NULL && JSON_NODE_HOLDS_OBJECT(reply))
		tok = str_member(json_node_get_object(reply), "token", NULL);
	if (tok != NULL && *tok != '\0' && strpbrk(tok, "\r\n") == NULL) {
		s->tokens[ep] = g_strdup(tok);
		g_atomic_int_set(&s->auth_off, 0);
		rc = 0;
	} else if (r.status != 200 && strstr(r.body, "authentication is not enabled") != NULL) {
		/* Nothing to prove: go on without a token. */
		g_atomic_int_set(&s->auth_off, 1);
		if (g_atomic_int_compare_and_exchange(&s->auth_off_seen, 0, 1))
			s->h->log(s->h, TE_LOG_WARN, "etcd %s: a user is configured but the store has "
				  "authentication off; requests go without a token", s->conn);
		rc = 0;
	} else {
		char *m = error_text(&r);
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: authentication as user '%s' refused by %s: %s", s->conn,
			  s->user, s->urls[ep], m);
		g_free(m);
		rc = -EACCES;
	}
	if (reply != NULL)
		json_node_unref(reply);
	te_http_reply_clear(&r);
	return rc;
}

/* The token to send to endpoint `ep` (freed by the caller with
 * te_http_secret_free(); NULL without authentication), fetched when there is
 * none (unless the store has auth off, and `retry` does not say it refused
 * a call without one) or `stale` is the one that was refused. */
static int token_for(etcd *s, int ep, const char *stale, bool retry, char **out)
{
	int rc = 0;

	*out = NULL;
	if (s->user == NULL)
		return 0;
	g_mutex_lock(&s->token_lock);
	if (s->tokens[ep] == NULL ? retry || !g_atomic_int_get(&s->auth_off)
				  : stale != NULL && strcmp(s->tokens[ep], stale) == 0)
		rc = authenticate(s, ep);
	if (rc == 0)
		*out = g_strdup(s->tokens[ep]);
	g_mutex_unlock(&s->token_lock);
	return rc;
}

/* POSTs `body` to <endpoint><path>, failing over across endpoints. Returns 0
 * with the reply (any status below 500), or a negative errno when no endpoint
 * answered (-EACCES: the store refused the credentials). */
static int etcd_post(etcd *s, const char *path, const char *body, te_http_reply *reply)
{
	int rc = -EIO;
	int start = g_atomic_int_get(&s->cur);

	for (int i = 0; i < s->n_urls; i++) {
		int ep = (start + i) % s->n_urls;
		char *url = g_strconcat(s->urls[ep], path, NULL);
		char *err = NULL, *token = NULL;
		bool auth_failed = false;

		for (int attempt = 0; attempt < 2; attempt++) {
			char *stale = token;
			rc = token_for(s, ep, stale, attempt > 0, &token);
			te_http_secret_free(stale);
			auth_failed = rc < 0; /* authenticate() logged why */
			if (rc < 0)
				break;
			rc = te_http_request(s->http, "POST", url, "application/json", body, strlen(body), token,
					     s->timeout_ms, reply, &err);
			/* An expired or foreign token (or none, while the store had
			 * auth off): fetch another, send once more. */
			if (rc == 0 && s->user != NULL && attempt == 0 && token_refused(reply)) {
				s->h->log(s->h, TE_LOG_DEBUG, "etcd endpoint %s refused the token for %s; "
					  "authenticating again", s->urls[ep], path);
				te_http_reply_clear(reply);
				continue;
			}
			break;
		}
		if (token != NULL)
			te_http_secret_free(token);
		if (rc == -EACCES) {
			g_free(url);
			return rc; /* the same credentials fail everywhere */
		}
		if (rc == 0 && reply->status >= 500) {
			s->h->log(s->h, TE_LOG_WARN, "etcd endpoint %s answered %d to %s: %.200s%s", s->urls[ep],
				  reply->status, path, reply->body,
				  i + 1 < s->n_urls ? "; trying the next endpoint" : "");
			te_http_reply_clear(reply);
			rc = -EAGAIN;
		} else if (rc < 0 && !auth_failed) {
			s->h->log(s->h, TE_LOG_WARN, "etcd endpoint %s unusable: %s%s", s->urls[ep],
				  err ? err : strerror(-rc), i + 1 < s->n_urls ? "; trying the next endpoint" : "");
		}
		g_free(err);
		g_free(url);
		if (rc == 0) {
			if (ep != start)
				g_atomic_int_set(&s->cur, ep);
			return 0;
		}
	}
	return rc == -EAGAIN ? -EIO : rc;
}

/* The "message" (or "error") of an error reply, for logs. */
static char *error_text(const te_http_reply *r)
{
	static const te_json_limits lim = ETCD_JSON_LIMITS;
	JsonNode *root = r->body ? te_json_load(r->body, r->len, &lim, NULL, 0) : NULL;
	char *out = NULL;

	if (root != NULL && JSON_NODE_HOLDS_OBJECT(root)) {
		JsonObject *o = json_node_get_object(root);
		const char *m = str_member(o, "message", NULL);
		if (m == NULL)
			m = str_member(o, "error", NULL);
		if (m)
			out = g_strdup(m);
	}
	if (root != NULL)
		json_node_unref(root);
	if (out == NULL)
		out = g_strdup_printf("HTTP %d: %.200s", r->status, r->body ? r->body : "");
	if (strstr(out, "user name is empty") != NULL) {
		char *t = g_strconcat(out, " (the store requires a user: TE_ETCD_USERNAME and TE_ETCD_PASSWORD, "
				      "or etcd://user:password@...)", NULL);
		g_free(out);
		out = t;
	}
	return out;
}

/* A reply's JSON through the bounded check; NULL, logged, when refused. */
static JsonNode *load_reply(etcd *s, const te_http_reply *r, const char *what, const char *key)
{
	static const te_json_limits lim = ETCD_JSON_LIMITS;
	char why[160] = "empty";
	JsonNode *root = r->body ? te_json_load(r->body, r->len, &lim, why, sizeof why) : NULL;

	if (root == NULL)
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: %s of '%s' returned a malformed reply (%s)",
			  s->conn, what, key, why);
	return root;
}

/* Parses a 200 reply into a JSON object (the caller unrefs *rootp). */
static JsonObject *reply_object(etcd *s, const te_http_reply *r, const char *what, const char *key,
				JsonNode **rootp)
{
	JsonNode *root = load_reply(s, r, what, key);

	if (root != NULL && !JSON_NODE_HOLDS_OBJECT(root)) {
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: %s of '%s' returned a reply that is not an object",
			  s->conn, what, key);
		json_node_unref(root);
		root = NULL;
	}
	*rootp = root;
	return root ? json_node_get_object(root) : NULL;
}

/* An int64 that proto3 JSON writes as a string (or a number). */
static bool member_i64(JsonObject *o, const char *name, int64_t *out)
{
	JsonNode *n = json_object_get_member(o, name);

	*out = 0;
	if (n == NULL || !JSON_NODE_HOLDS_VALUE(n))
		return false;
	if (json_node_get_value_type(n) == G_TYPE_STRING) {
		const char *t = json_node_get_string(n);
		char *end = NULL;
		errno = 0;
		long long v = g_ascii_strtoll(t, &end, 10);
		if (errno != 0 || end == t || *end != '\0')
			return false;
		*out = v;
		return true;
	}
	if (json_node_get_value_type(n) == G_TYPE_INT64) {
		*out = json_node_get_int(n);
		return true;
	}
	return false;
}

static char *b64(const void *data, size_t len)
{
	return g_base64_encode(data, len);
}

/* -------------------------------------------------------------- lease */

/* Grants a lease; with lease_lock held. */
static int lease_grant(etcd *s)
{
	te_http_reply r;
	JsonNode *p = NULL;
	char body[64];
	int64_t id = 0, ttl = 0;

	g_snprintf(body, sizeof body, "{\"TTL\":%" PRId64 "}", s->ttl);
	int rc = etcd_post(s, "/lease/grant", body, &r);
	if (rc < 0) {
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: granting a lease failed: %s", s->conn, strerror(-rc));
		return rc;
	}
	if (r.status != 200) {
		char *m = error_text(&r);
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: granting a lease failed: %s", s->conn, m);
		g_free(m);
		te_http_reply_clear(&r);
		return TE_ERR_METADATA;
	}
	JsonObject *o = reply_object(s, &r, "lease grant", "-", &p);
	rc = TE_ERR_METADATA;
	if (o != NULL && member_i64(o, "ID", &id) && id != 0 && member_i64(o, "TTL", &ttl) && ttl > 0) {
		s->lease_id = id;
		s->granted_ttl = ttl;
		rc = 0;
		s->h->log(s->h, TE_LOG_INFO, "etcd %s: lease %" PRIx64 " granted, TTL %" PRId64 " s", s->conn,
			  (uint64_t)id, ttl);
	} else if (o != NULL) {
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: lease grant reply lacks ID or TTL: %.200s", s->conn,
			  r.body);
	}
	if (p)
		json_node_unref(p);
	te_http_reply_clear(&r);
	return rc;
}

static int put_raw(etcd *s, const char *key, const char *value, size_t len, int64_t lease);

/* The lease is gone: grant a new one and put every owned key again. With
 * lease_lock held. */
static int lease_renew(etcd *s)
{
	GHashTableIter it;
	gpointer k, v;
	int rc;

	s->lease_id = 0;
	rc = lease_grant(s);
	if (rc < 0)
		return rc;
	g_hash_table_iter_init(&it, s->owned);
	while (g_hash_table_iter_next(&it, &k, &v)) {
		GBytes *b = v;
		gsize n;
		const char *d = g_bytes_get_data(b, &n);
		int prc = put_raw(s, k, d, n, s->lease_id);
		if (prc < 0)
			rc = prc;
	}
	if (rc == 0)
		s->h->log(s->h, TE_LOG_WARN, "etcd %s: the lease had expired; a new one holds the %u keys of "
			  "this engine again", s->conn, g_hash_table_size(s->owned));
	return rc;
}

/* One keep-alive. 0, -ENOENT when the lease no longer exists, or an error. */
static int lease_keepalive(etcd *s, int64_t id)
{
	te_http_reply r;
	JsonNode *p = NULL;
	char body[64];
	int64_t ttl = 0;

	g_snprintf(body, sizeof body, "{\"ID\":\"%" PRId64 "\"}", id);
	int rc = etcd_post(s, "/lease/keepalive", body, &r);
	if (rc < 0)
		return rc;
	if (r.status == 404) {
		te_http_reply_clear(&r);
		return -ENOENT;
	}
	if (r.status != 200) {
		char *m = error_text(&r);
		s->h->log(s->h, TE_LOG_WARN, "etcd %s: keep-alive of lease %" PRIx64 " failed: %s", s->conn,
			  (uint64_t)id, m);
		g_free(m);
		te_http_reply_clear(&r);
		return TE_ERR_METADATA;
	}
	/* A streamed reply: one JSON object per line; the first is ours. */
	char *nl = memchr(r.body, '\n', r.len);
	if (nl != NULL) {
		*nl = '\0';
		r.len = (size_t)(nl - r.body);
	}
	JsonObject *o = reply_object(s, &r, "lease keep-alive", "-", &p);
	rc = TE_ERR_METADATA;
	if (o != NULL) {
		JsonObject *res = obj_member(o, "result");
		JsonObject *er = obj_member(o, "error");
		if (res != NULL) {
			/* proto3 leaves out a zero TTL: the lease expired. */
			rc = member_i64(res, "TTL", &ttl) && ttl > 0 ? 0 : -ENOENT;
		} else if (er != NULL) {
			const char *m = str_member(er, "message", NULL);
			if (m == NULL)
				m = "?";
			rc = strstr(m, "lease not found") ? -ENOENT : TE_ERR_METADATA;
			if (rc != -ENOENT)
				s->h->log(s->h, TE_LOG_WARN, "etcd %s: keep-alive failed: %s", s->conn, m);
		}
	}
	if (p)
		json_node_unref(p);
	te_http_reply_clear(&r);
	return rc;
}

static int64_t keepalive_period_ms(etcd *s)
{
	if (s->keepalive_ms > 0)
		return s->keepalive_ms;
	int64_t ms = s->granted_ttl * 1000 / 3;
	return ms < 100 ? 100 : ms;
}

static gpointer keeper(gpointer data)
{
	etcd *s = data;
	int64_t period, backoff = 0, retry_ms = 0;
	bool failing = false;

	g_mutex_lock(&s->lease_lock);
	period = keepalive_period_ms(s);
	g_mutex_unlock(&s->lease_lock);
	while (te_keeper_sleep(&s->keeper, failing ? retry_ms : period)) {
		g_mutex_lock(&s->lease_lock);
		int rc = s->lease_id ? lease_keepalive(s, s->lease_id) : -ENOENT;
		if (rc == -ENOENT)
			rc = lease_renew(s);
		period = keepalive_period_ms(s);
		g_mutex_unlock(&s->lease_lock);
		if (rc < 0 && !failing)
			s->h->log(s->h, TE_LOG_WARN, "etcd %s: keeping the lease alive failed (%s); retrying",
				  s->conn, strerror(rc < -4095 ? EIO : -rc));
		else if (rc == 0 && failing)
			s->h->log(s->h, TE_LOG_INFO, "etcd %s: lease keep-alives go through again", s->conn);
		failing = rc < 0;
		/* Failing: tried again after 250 ms doubling up to the period, each
		 * wait drawn from the upper half of that, so that the engines of a
		 * cluster whose store refuses or times out do not retry in step
		 * (nor faster as they grow). Within the period, the lease (three
		 * periods long) outlives a short outage. */
		if (failing) {
			backoff = backoff == 0 ? 250 : MIN(backoff * 2, MAX(period, 250));
			retry_ms = backoff / 2 + g_random_int_range(0, (gint32)(backoff / 2) + 1);
		} else {
			backoff = 0;
		}
	}
	return NULL;
}

/* With lease_lock held: a lease exists and its keeper runs. */
static int lease_ensure(etcd *s)
{
	if (s->lease_id != 0)
		return 0;
	int rc = lease_grant(s);
	if (rc < 0)
		return rc;
	if (!te_keeper_start(&s->keeper, "te-etcd-lease", keeper, s)) {
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: cannot start the lease keep-alive thread", s->conn);
		return -EAGAIN;
	}
	return 0;
}

static void lease_revoke(etcd *s)
{
	te_http_reply r;
	char body[64];

	if (s->lease_id == 0)
		return;
	g_snprintf(body, sizeof body, "{\"ID\":\"%" PRId64 "\"}", s->lease_id);
	int rc = etcd_post(s, "/lease/revoke", body, &r);
	if (rc == 0 && r.status == 404 && strstr(r.body, "lease not found") == NULL) {
		/* Gateways of etcd 3.3 know only the older path. */
		te_http_reply_clear(&r);
		rc = etcd_post(s, "/kv/lease/revoke", body, &r);
	}
	if (rc < 0)
		s->h->log(s->h, TE_LOG_WARN, "etcd %s: revoking lease %" PRIx64 " failed (%s); its keys expire "
			  "after %" PRId64 " s", s->conn, (uint64_t)s->lease_id, strerror(-rc), s->granted_ttl);
	else
		te_http_reply_clear(&r);
	s->lease_id = 0;
}

/* ---------------------------------------------------------------- ops */

static int put_raw(etcd *s, const char *key, const char *value, size_t len, int64_t lease)
{
	char *k = b64(key, strlen(key)), *v = b64(value, len);
	char *body = lease ? g_strdup_printf("{\"key\":\"%s\",\"value\":\"%s\",\"lease\":\"%" PRId64 "\"}",
					     k, v, lease)
			   : g_strdup_printf("{\"key\":\"%s\",\"value\":\"%s\"}", k, v);
	te_http_reply r;
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
		te_http_reply_clear(&r);
		return 0;
	}
	char *m = error_text(&r);
	rc = lease && r.status == 404 && strstr(m, "lease not found") ? -ENOENT : TE_ERR_METADATA;
	if (rc != -ENOENT)
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: put '%s' refused: %s", s->conn, key, m);
	g_free(m);
	te_http_reply_clear(&r);
	return rc;
}

static int etcd_put(void *ctx, const char *key, const char *value, size_t len, unsigned flags)
{
	etcd *s = ctx;
	int rc;

	if (key == NULL || *key == '\0' || (value == NULL && len > 0)) {
		s->h->log(s->h, TE_LOG_ERROR, "etcd put: empty key or NULL value");
		return -EINVAL;
	}
	if (!(flags & TE_META_OWNED) || !s->lease_on)
		return put_raw(s, key, value ? value : "", len, 0);

	g_mutex_lock(&s->lease_lock);
	rc = lease_ensure(s);
	if (rc == 0) {
		rc = put_raw(s, key, value, len, s->lease_id);
		if (rc == -ENOENT) { /* the lease expired under us */
			rc = lease_renew(s);
			if (rc == 0)
				rc = put_raw(s, key, value, len, s->lease_id);
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

static int etcd_get(void *ctx, const char *key, char **value, size_t *len)
{
	etcd *s = ctx;
	te_http_reply r;
	JsonNode *p = NULL;
	int rc;

	*value = NULL;
	if (key == NULL || *key == '\0') {
		s->h->log(s->h, TE_LOG_ERROR, "etcd get: empty key");
		return -EINVAL;
	}
	char *k = b64(key, strlen(key));
	char *body = g_strdup_printf("{\"key\":\"%s\"}", k);
	g_free(k);
	rc = etcd_post(s, "/kv/range", body, &r);
	g_free(body);
	if (rc < 0) {
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: get '%s' failed: %s", s->conn, key, strerror(-rc));
		return rc;
	}
	if (r.status != 200) {
		char *m = error_text(&r);
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: get '%s' refused: %s", s->conn, key, m);
		g_free(m);
		te_http_reply_clear(&r);
		return TE_ERR_METADATA;
	}
	JsonObject *o = reply_object(s, &r, "get", key, &p);
	rc = TE_ERR_METADATA;
	if (o != NULL) {
		JsonArray *kvs = arr_member(o, "kvs");
		if (kvs == NULL && json_object_has_member(o, "kvs")) {
			s->h->log(s->h, TE_LOG_ERROR, "etcd %s: get '%s': \"kvs\" is not an array", s->conn,
				  key);
		} else if (kvs == NULL || json_array_get_length(kvs) == 0) {
			rc = -ENOENT;
		} else {
			JsonNode *n = json_array_get_element(kvs, 0);
			JsonObject *kv = JSON_NODE_HOLDS_OBJECT(n) ? json_node_get_object(n) : NULL;
			/* proto3 leaves out an empty value */
			const char *v64 = kv ? str_member(kv, "value", "") : NULL;
			if (v64 == NULL) {
				s->h->log(s->h, TE_LOG_ERROR, "etcd %s: get '%s': malformed kvs entry", s->conn, key);
			} else {
				gsize n_out = 0;
				guchar *raw = *v64 ? g_base64_decode(v64, &n_out) : NULL;
				char *out = malloc(n_out + 1);
				if (out == NULL) {
					rc = -ENOMEM;
				} else {
					if (n_out)
						memcpy(out, raw, n_out);
					out[n_out] = '\0';
					*value = out;
					if (len)
						*len = n_out;
					rc = 0;
				}
				g_free(raw);
			}
		}
	}
	if (p)
		json_node_unref(p);
	te_http_reply_clear(&r);
	return rc;
}

static int delete_raw(etcd *s, const char *key)
{
	te_http_reply r;
	char *k = b64(key, strlen(key));
	char *body = g_strdup_printf("{\"key\":\"%s\"}", k);
	int rc;

	g_free(k);
	rc = etcd_post(s, "/kv/deleterange", body, &r);
	g_free(body);
	if (rc < 0) {
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: remove '%s' failed: %s", s->conn, key, strerror(-rc));
		return rc;
	}
	if (r.status != 200) {
		char *m = error_text(&r);
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: remove '%s' refused: %s", s->conn, key, m);
		g_free(m);
		rc = TE_ERR_METADATA;
	}
	te_http_reply_clear(&r);
	return rc;
}

static int etcd_remove(void *ctx, const char *key)
{
	etcd *s = ctx;

	if (key == NULL || *key == '\0') {
		s->h->log(s->h, TE_LOG_ERROR, "etcd remove: empty key");
		return -EINVAL;
	}
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

static int etcd_list(void *ctx, const char *prefix, char ***keys, size_t *n)
{
	etcd *s = ctx;
	te_http_reply r;
	JsonNode *p = NULL;
	int rc;

	*keys = NULL;
	*n = 0;
	if (prefix == NULL)
		prefix = "";
	GByteArray *end = range_end(prefix);
	char *k = *prefix ? b64(prefix, strlen(prefix)) : b64("", 1);
	char *e = b64(end->data, end->len);
	char *body = g_strdup_printf("{\"key\":\"%s\",\"range_end\":\"%s\",\"keys_only\":true}", k, e);
	g_byte_array_unref(end);
	g_free(k);
	g_free(e);
	rc = etcd_post(s, "/kv/range", body, &r);
	g_free(body);
	if (rc < 0) {
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: list '%s' failed: %s", s->conn, prefix, strerror(-rc));
		return rc;
	}
	if (r.status != 200) {
		char *m = error_text(&r);
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: list '%s' refused: %s", s->conn, prefix, m);
		g_free(m);
		te_http_reply_clear(&r);
		return TE_ERR_METADATA;
	}
	JsonObject *o = reply_object(s, &r, "list", prefix, &p);
	rc = o ? 0 : TE_ERR_METADATA;
	JsonArray *kvs = o ? arr_member(o, "kvs") : NULL;
	guint count = kvs ? json_array_get_length(kvs) : 0;
	char **out = count ? calloc(count, sizeof *out) : NULL;
	size_t got = 0;
	if (count && out == NULL)
		rc = -ENOMEM;
	for (guint i = 0; rc == 0 && i < count; i++) {
		JsonNode *nd = json_array_get_element(kvs, i);
		const char *k64 = JSON_NODE_HOLDS_OBJECT(nd)
					  ? str_member(json_node_get_object(nd), "key", NULL)
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
		out[got] = malloc(kl + 1);
		if (out[got] == NULL) {
			g_free(raw);
			rc = -ENOMEM;
			break;
		}
		memcpy(out[got], raw, kl);
		out[got][kl] = '\0';
		got++;
		g_free(raw);
	}
	if (rc < 0) {
		for (size_t i = 0; i < got; i++)
			free(out[i]);
		free(out);
	} else {
		*keys = out;
		*n = got;
	}
	if (p)
		json_node_unref(p);
	te_http_reply_clear(&r);
	return rc;
}

/* ----------------------------------------------------------- open/close */

/* "h:p", "[v6]:p" or "h" (port 2379); an http:// or https:// prefix chooses
 * the scheme of this endpoint, else `scheme`. */
static char *endpoint_url(const char *ep, const char *api, const char *scheme)
{
	const char *s = ep;
	char *host = NULL;
	long port = DEFAULT_PORT;

	if (g_ascii_strncasecmp(s, "http://", 7) == 0) {
		s += 7;
		scheme = "http";
	} else if (g_ascii_strncasecmp(s, "https://", 8) == 0) {
		s += 8;
		scheme = "https";
	}
	size_t n = strlen(s);
	while (n > 0 && s[n - 1] == '/')
		n--;
	if (n == 0)
		return NULL;
	char *t = g_strndup(s, n);
	const char *colon;
	if (t[0] == '[') {
		char *rb = strchr(t, ']');
		if (rb == NULL || (rb[1] != '\0' && rb[1] != ':'))
			goto bad;
		host = g_strndup(t, (gsize)(rb - t + 1));
		colon = rb[1] == ':' ? rb + 1 : NULL;
	} else {
		colon = strrchr(t, ':');
		if (colon && strchr(t, ':') != colon)
			goto bad; /* bare IPv6 without brackets */
		host = colon ? g_strndup(t, (gsize)(colon - t)) : g_strdup(t);
	}
	if (colon) {
		char *end = NULL;
		errno = 0;
		port = strtol(colon + 1, &end, 10);
		if (errno || end == colon + 1 || *end != '\0' || port <= 0 || port > 65535)
			goto bad;
	}
	if (*host == '\0')
		goto bad;
	for (const char *c = host; *c; c++)
		if (!(g_ascii_isalnum(*c) || strchr(".-_[]:", *c)))
			goto bad;
	char *url = g_strdup_printf("%s://%s:%ld%s", scheme, host, port, api);
	g_free(host);
	g_free(t);
	return url;
bad:
	g_free(host);
	g_free(t);
	return NULL;
}

static void etcd_close(void *ctx)
{
	etcd *s = ctx;

	if (s == NULL)
		return;
	te_keeper_clear(&s->keeper);
	if (s->http != NULL) {
		g_mutex_lock(&s->lease_lock);
		lease_revoke(s);
		g_mutex_unlock(&s->lease_lock);
	}
	te_http_free(s->http);
	for (int i = 0; s->tokens && i < s->n_urls; i++)
		te_http_secret_free(s->tokens[i]);
	g_free(s->tokens);
	g_strfreev(s->urls);
	g_free(s->conn);
	g_free(s->user);
	te_http_secret_free(s->password);
	g_mutex_clear(&s->token_lock);
	if (s->owned)
		g_hash_table_unref(s->owned);
	g_mutex_clear(&s->lease_lock);
	g_free(s);
}

/* Splits "user:password@" off the endpoint list (the last '@' ends it, so a
 * password may hold one); both percent-decoded. -EINVAL on a malformed
 * user-info, logged without it. */
static int split_userinfo(const te_host *h, const char *redacted, const char **list, char **user,
			  char **password)
{
	const char *at = strrchr(*list, '@');

	*user = *password = NULL;
	if (at == NULL)
		return 0;
	const char *colon = memchr(*list, ':', (size_t)(at - *list));
	char *u = g_strndup(*list, (gsize)((colon ? colon : at) - *list));
	char *pw = colon ? g_strndup(colon + 1, (gsize)(at - colon - 1)) : NULL;
	*user = g_uri_unescape_string(u, NULL);
	*password = pw ? g_uri_unescape_string(pw, NULL) : NULL;
	g_free(u);
	te_http_secret_free(pw);
	if (*user == NULL || **user == '\0' || (pw != NULL && *password == NULL)) {
		h->log(h, TE_LOG_ERROR, "etcd: the user-info of '%s' is not user:password (percent-encode "
		       "special characters)", redacted);
		g_free(*user);
		te_http_secret_free(*password);
		*user = *password = NULL;
		return -EINVAL;
	}
	*list = at + 1;
	return 0;
}

static int etcd_open(const te_host *h, const char *conn, void **ctx)
{
	etcd *s;
	const char *list = conn;
	const char *scheme = "http";
	char *err = NULL;
	int rc;

	*ctx = NULL;
	if (conn == NULL || *conn == '\0') {
		h->log(h, TE_LOG_ERROR, "etcd: empty connection string");
		return -EINVAL;
	}
	char *redacted = te_http_redact(conn);
	if (g_ascii_strncasecmp(list, "etcd://", 7) == 0) {
		list += 7;
	} else if (g_ascii_strncasecmp(list, "etcds://", 8) == 0) {
		list += 8;
		scheme = "https";
	} else if (strstr(list, "://") != NULL) {
		h->log(h, TE_LOG_ERROR, "etcd: '%s' is not an etcd:// or etcds:// connection string", redacted);
		g_free(redacted);
		return -EINVAL;
	}

	s = g_new0(etcd, 1);
	s->h = h;
	s->conn = redacted;
	g_mutex_init(&s->lease_lock);
	g_mutex_init(&s->token_lock);
	te_keeper_init(&s->keeper);
	s->owned = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, (GDestroyNotify)g_bytes_unref);

	rc = split_userinfo(h, s->conn, &list, &s->user, &s->password);
	if (rc < 0) {
		etcd_close(s);
		return rc;
	}
	/* As the redis plugin: the string's credentials win over the options. */
	if (s->user == NULL) {
		const char *v = h->config(h, "TE_ETCD_USERNAME", NULL);
		if (v && *v)
			s->user = g_strdup(v);
	}
	if (s->password == NULL && s->user != NULL) {
		const char *v = h->config(h, "TE_ETCD_PASSWORD", NULL);
		if (v && *v)
			s->password = g_strdup(v);
	}
	if (s->user != NULL && s->password == NULL) {
		h->log(h, TE_LOG_ERROR, "etcd %s: user '%s' given without a password (TE_ETCD_PASSWORD)", s->conn,
		       s->user);
		etcd_close(s);
		return -EINVAL;
	}
	if (s->user == NULL && h->config(h, "TE_ETCD_PASSWORD", NULL) != NULL)
		h->log(h, TE_LOG_WARN, "etcd %s: TE_ETCD_PASSWORD is set without a user (TE_ETCD_USERNAME); "
		       "requests go without authentication", s->conn);

	const char *api = h->config(h, "TE_ETCD_API_PREFIX", NULL);
	if (api == NULL || *api == '\0')
		api = "/v3";
	if (api[0] != '/' || strpbrk(api, "?#% ") != NULL) {
		h->log(h, TE_LOG_ERROR, "etcd: TE_ETCD_API_PREFIX=%s must be a path such as /v3", api);
		etcd_close(s);
		return -EINVAL;
	}
	gchar **eps = g_strsplit(list, ",", -1);
	GPtrArray *urls = g_ptr_array_new();
	bool bad = false, tls = false;
	for (gchar **e = eps; *e && !bad; e++) {
		const char *t = g_strstrip(*e);
		if (*t == '\0')
			continue;
		char *u = endpoint_url(t, api, scheme);
		if (u == NULL) {
			h->log(h, TE_LOG_ERROR, "etcd: endpoint '%s' of '%s' is not host:port", t, s->conn);
			bad = true;
		} else if (urls->len >= MAX_ENDPOINTS) {
			h->log(h, TE_LOG_ERROR, "etcd: more than %d endpoints in '%s'", MAX_ENDPOINTS, s->conn);
			g_free(u);
			bad = true;
		} else {
			tls = tls || g_str_has_prefix(u, "https:");
			g_ptr_array_add(urls, u);
		}
	}
	g_strfreev(eps);
	if (!bad && urls->len == 0) {
		h->log(h, TE_LOG_ERROR, "etcd: no endpoint in '%s'", s->conn);
		bad = true;
	}
	g_ptr_array_add(urls, NULL);
	s->urls = (char **)g_ptr_array_free(urls, FALSE);
	s->n_urls = (int)g_strv_length(s->urls);
	s->tokens = g_new0(char *, s->n_urls + 1);
	if (bad) {
		etcd_close(s);
		return -EINVAL;
	}

	s->timeout_ms = (int)te_host_config_u64(h, "TE_ETCD_TIMEOUT_MS", NULL, 5000, 10, 600000);
	s->ttl = (int64_t)te_host_config_u64(h, "TE_ETCD_LEASE_TTL", NULL, 10, 1, 86400);
	s->keepalive_ms = (int64_t)te_host_config_u64(h, "TE_ETCD_KEEPALIVE_MS", NULL, 0, 0, 3600000);
	s->lease_on = te_host_config_u64(h, "TE_ETCD_LEASE", NULL, 1, 0, 1) != 0;
	if (s->keepalive_ms > 0 && s->keepalive_ms >= s->ttl * 1000)
		h->log(h, TE_LOG_WARN, "etcd: TE_ETCD_KEEPALIVE_MS=%" PRId64 " is not below the lease TTL of "
		       "%" PRId64 " s; keys may expire between keep-alives", s->keepalive_ms, s->ttl);

	const char *ca = h->config(h, "TE_ETCD_CA_FILE", NULL);
	const char *cert = h->config(h, "TE_ETCD_CERT_FILE", NULL);
	const char *key = h->config(h, "TE_ETCD_KEY_FILE", NULL);
	if (ca && !*ca)
		ca = NULL;
	if (cert && !*cert)
		cert = NULL;
	if (key && !*key)
		key = NULL;
	if (key != NULL && cert == NULL) {
		h->log(h, TE_LOG_ERROR, "etcd %s: TE_ETCD_KEY_FILE needs TE_ETCD_CERT_FILE", s->conn);
		etcd_close(s);
		return -EINVAL;
	}
	if (!tls && (ca || cert))
		h->log(h, TE_LOG_WARN, "etcd %s: TE_ETCD_CA_FILE / TE_ETCD_CERT_FILE are set but no endpoint "
		       "is https (use etcds://); they are not used", s->conn);
	te_http_opts o = {
		.max_reply = te_host_config_u64(h, "TE_ETCD_MAX_REPLY", NULL, 64u << 20, 4096, 1ull << 32),
		.max_conns = 8,
		.ca_file = tls ? ca : NULL,
		.cert_file = tls ? cert : NULL,
		.key_file = tls ? key : NULL,
	};
	s->http = te_http_new(&o, &err);
	if (s->http == NULL) {
		h->log(h, TE_LOG_ERROR, "etcd %s: %s", s->conn, err ? err : "HTTP client failed to start");
		rc = err && (ca || cert) ? -EINVAL : -ENOMEM;
		g_free(err);
		etcd_close(s);
		return rc;
	}

	/* With credentials, authenticate now: a wrong password fails engine
	 * creation with its reason instead of the first lookup. */
	if (s->user != NULL) {
		rc = -EIO;
		for (int i = 0; i < s->n_urls && rc < 0 && rc != -EACCES; i++) {
			g_mutex_lock(&s->token_lock);
			rc = authenticate(s, i);
			g_mutex_unlock(&s->token_lock);
			if (rc == 0)
				s->cur = i;
		}
		if (rc < 0) {
			if (rc != -EACCES)
				h->log(h, TE_LOG_ERROR, "etcd %s: no endpoint answered the authentication: %s",
				       s->conn, strerror(rc == -EAGAIN ? EIO : -rc));
			rc = rc == -EAGAIN ? -EIO : rc;
			etcd_close(s);
			return rc;
		}
	}
	*ctx = s;
	return 0;
}

static const char *const etcd_schemes[] = { "etcd", "etcds", NULL };

static const te_metadata_ops etcd_ops = {
	.size = sizeof(te_metadata_ops),
	.schemes = etcd_schemes,
	.open = etcd_open,
	.close = etcd_close,
	.get = etcd_get,
	.put = etcd_put,
	.remove = etcd_remove,
	.list = etcd_list,
};

TE_PLUGIN_DEFINE(TE_KIND_METADATA, "etcd", "1.0.0",
		 "etcd metadata store (v3 JSON gateway, leases tie keys to engine liveness)",
		 "Apache-2.0", &etcd_ops)
