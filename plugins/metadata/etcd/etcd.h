/* SPDX-License-Identifier: Apache-2.0 */
/* Private to the etcd metadata plugin: the store handle and what its files
 * (etcd-plugin.c, etcd-client.c, etcd-lease.c, etcd-kv.c) call of each other. */
#ifndef TE_ETCD_H
#define TE_ETCD_H

#include <stdbool.h>
#include <stdint.h>

#include <glib.h>
#include <json-glib/json-glib.h>

#include <te/te-json.h>
#include <te/te-plugin.h>

#include "teu-http.h"
#include "teu-keeper.h"

/* etcd's gateway replies: {"header": …, "kvs": [{…}, …]}, shallow; a listing
 * holds one entry a key and values are base64 text. The reply's size is
 * bounded by TE_ETCD_MAX_REPLY before it gets here. */
#define ETCD_JSON_LIMITS { 16, 262144, 1u << 21, 64u << 20, SIZE_MAX }

typedef struct etcd {
	const te_host *h;
	char *conn; /* for logs: the connection string with its password redacted */
	char **urls; /* "http://h:p<api>" per endpoint */
	int n_urls;
	gint cur; /* endpoint that answered last */
	int timeout_ms;
	teu_http *http;

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
	teu_keeper keeper;
} etcd;

/* etcd-client.c */
/* json-glib's typed getters warn on a missing member or a wrong type; these
 * return NULL instead, since a peer's reply may be anything. */
JsonObject *etcd_obj_member(JsonObject *o, const char *name);
JsonArray *etcd_arr_member(JsonObject *o, const char *name);
const char *etcd_str_member(JsonObject *o, const char *name, const char *def);
/* Asks endpoint `ep` for a token; with token_lock held. */
int etcd_authenticate(etcd *s, int ep);
/* POSTs `body` to <endpoint><path>, failing over across endpoints. */
int etcd_post(etcd *s, const char *path, const char *body, teu_http_reply *reply);
/* The "message" (or "error") of an error reply, for logs (g_free()). */
char *etcd_error_text(const teu_http_reply *r);
/* Parses a 200 reply into a JSON object (the caller unrefs *rootp). */
JsonObject *etcd_reply_object(etcd *s, const teu_http_reply *r, const char *what, const char *key,
			      JsonNode **rootp);
/* An int64 that proto3 JSON writes as a string (or a number). */
bool etcd_member_i64(JsonObject *o, const char *name, int64_t *out);
char *etcd_b64(const void *data, size_t len);

/* etcd-lease.c; each with lease_lock held */
/* The lease is gone: grant a new one and put every owned key again. */
int etcd_lease_renew(etcd *s);
/* A lease exists and its keeper runs. */
int etcd_lease_ensure(etcd *s);
void etcd_lease_revoke(etcd *s);

/* etcd-kv.c */
/* A put, under `lease` when it is not 0; -ENOENT when that lease is gone. */
int etcd_put_raw(etcd *s, const char *key, const char *value, size_t len, int64_t lease);
int etcd_get(void *ctx, const char *key, char **value, size_t *len);
int etcd_put(void *ctx, const char *key, const char *value, size_t len, unsigned flags);
int etcd_remove(void *ctx, const char *key);
int etcd_list(void *ctx, const char *prefix, char ***keys, size_t *n);

#endif
