/* SPDX-License-Identifier: Apache-2.0 */
/*
 * etcd's v3 JSON gateway as the other files use it: POSTs failing over
 * across the endpoints, the authentication token of each endpoint, and the
 * checked reading of replies (bounded JSON, proto3 integers, base64).
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "etcd.h"

/* json-glib's typed getters warn on a missing member or a wrong type; these
 * return NULL instead, since a peer's reply may be anything. */
JsonObject *etcd_obj_member(JsonObject *o, const char *name)
{
	JsonNode *n = o ? json_object_get_member(o, name) : NULL;
	return n && JSON_NODE_HOLDS_OBJECT(n) ? json_node_get_object(n) : NULL;
}

JsonArray *etcd_arr_member(JsonObject *o, const char *name)
{
	JsonNode *n = o ? json_object_get_member(o, name) : NULL;
	return n && JSON_NODE_HOLDS_ARRAY(n) ? json_node_get_array(n) : NULL;
}

const char *etcd_str_member(JsonObject *o, const char *name, const char *def)
{
	JsonNode *n = o ? json_object_get_member(o, name) : NULL;
	if (n == NULL)
		return def;
	return JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == G_TYPE_STRING ? json_node_get_string(n)
											: NULL;
}

/* ----------------------------------------------------------- transport */

static JsonNode *load_reply(etcd *s, const teu_http_reply *r, const char *what, const char *key);

/* Whether a reply says the token sent was not (or no longer) accepted:
 * expired or unknown to this member, or issued before an auth change.
 * Keys and values travel base64-encoded, so these phrases (with spaces)
 * cannot come from stored data. */
static bool token_refused(const teu_http_reply *r)
{
	if (r->body == NULL || (r->status == 200 && strncmp(r->body, "{\"error\"", 9) != 0))
		return false;
	return strstr(r->body, "invalid auth token") != NULL || strstr(r->body, "auth store is old") != NULL ||
	       strstr(r->body, "user name is empty") != NULL;
}

/* Asks endpoint `ep` for a token; with token_lock held. 0 with the token in
 * tokens[ep] (NULL when the store has auth off), -EACCES when the store
 * refused the user or password, or a transport error. */
int etcd_authenticate(etcd *s, int ep)
{
	JsonObject *o = json_object_new();
	teu_http_reply r;
	char *err = NULL;

	json_object_set_string_member(o, "name", s->user);
	json_object_set_string_member(o, "password", s->password);
	JsonNode *root = json_node_init_object(json_node_alloc(), o);
	char *body = json_to_string(root, FALSE);
	json_node_unref(root);
	json_object_unref(o);

	char *url = g_strconcat(s->urls[ep], "/auth/authenticate", NULL);
	int rc = teu_http_request(s->http, "POST", url, "application/json", body, strlen(body), NULL,
				 s->timeout_ms, &r, &err);
	g_free(url);
	teu_http_secret_free(body); /* it holds the password */
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
		teu_http_reply_clear(&r);
		return -EAGAIN;
	}
	JsonNode *reply = r.status == 200 ? load_reply(s, &r, "authenticate", "-") : NULL;
	const char *tok = NULL;
	if (reply != NULL && JSON_NODE_HOLDS_OBJECT(reply))
		tok = etcd_str_member(json_node_get_object(reply), "token", NULL);
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
		char *m = etcd_error_text(&r);
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: authentication as user '%s' refused by %s: %s", s->conn,
			  s->user, s->urls[ep], m);
		g_free(m);
		rc = -EACCES;
	}
	if (reply != NULL)
		json_node_unref(reply);
	teu_http_reply_clear(&r);
	return rc;
}

/* The token to send to endpoint `ep` (freed by the caller with
 * teu_http_secret_free(); NULL without authentication), fetched when there is
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
		rc = etcd_authenticate(s, ep);
	if (rc == 0)
		*out = g_strdup(s->tokens[ep]);
	g_mutex_unlock(&s->token_lock);
	return rc;
}

/* POSTs `body` to <endpoint><path>, failing over across endpoints. Returns 0
 * with the reply (any status below 500), or a negative errno when no endpoint
 * answered (-EACCES: the store refused the credentials). */
int etcd_post(etcd *s, const char *path, const char *body, teu_http_reply *reply)
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
			teu_http_secret_free(stale);
			auth_failed = rc < 0; /* etcd_authenticate() logged why */
			if (rc < 0)
				break;
			rc = teu_http_request(s->http, "POST", url, "application/json", body, strlen(body), token,
					     s->timeout_ms, reply, &err);
			/* An expired or foreign token (or none, while the store had
			 * auth off): fetch another, send once more. */
			if (rc == 0 && s->user != NULL && attempt == 0 && token_refused(reply)) {
				s->h->log(s->h, TE_LOG_DEBUG, "etcd endpoint %s refused the token for %s; "
					  "authenticating again", s->urls[ep], path);
				teu_http_reply_clear(reply);
				continue;
			}
			break;
		}
		if (token != NULL)
			teu_http_secret_free(token);
		if (rc == -EACCES) {
			g_free(url);
			return rc; /* the same credentials fail everywhere */
		}
		if (rc == 0 && reply->status >= 500) {
			s->h->log(s->h, TE_LOG_WARN, "etcd endpoint %s answered %d to %s: %.200s%s", s->urls[ep],
				  reply->status, path, reply->body,
				  i + 1 < s->n_urls ? "; trying the next endpoint" : "");
			teu_http_reply_clear(reply);
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
char *etcd_error_text(const teu_http_reply *r)
{
	static const te_json_limits lim = ETCD_JSON_LIMITS;
	JsonNode *root = r->body ? te_json_load(r->body, r->len, &lim, NULL, 0) : NULL;
	char *out = NULL;

	if (root != NULL && JSON_NODE_HOLDS_OBJECT(root)) {
		JsonObject *o = json_node_get_object(root);
		const char *m = etcd_str_member(o, "message", NULL);
		if (m == NULL)
			m = etcd_str_member(o, "error", NULL);
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
static JsonNode *load_reply(etcd *s, const teu_http_reply *r, const char *what, const char *key)
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
JsonObject *etcd_reply_object(etcd *s, const teu_http_reply *r, const char *what, const char *key,
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
bool etcd_member_i64(JsonObject *o, const char *name, int64_t *out)
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

char *etcd_b64(const void *data, size_t len)
{
	return g_base64_encode(data, len);
}
