/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The lease that TE_META_OWNED keys are attached to: granted on the first
 * owned put, kept alive by a thread, granted again (with every owned key
 * put again) when it was lost, revoked on close.
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "etcd.h"

/* -------------------------------------------------------------- lease */

/* Grants a lease; with lease_lock held. */
static int lease_grant(etcd *s)
{
	teu_http_reply r;
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
		char *m = etcd_error_text(&r);
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: granting a lease failed: %s", s->conn, m);
		g_free(m);
		teu_http_reply_clear(&r);
		return TE_ERR_METADATA;
	}
	JsonObject *o = etcd_reply_object(s, &r, "lease grant", "-", &p);
	rc = TE_ERR_METADATA;
	if (o != NULL && etcd_member_i64(o, "ID", &id) && id != 0 && etcd_member_i64(o, "TTL", &ttl) && ttl > 0) {
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
	teu_http_reply_clear(&r);
	return rc;
}

/* The lease is gone: grant a new one and put every owned key again. With
 * lease_lock held. */
int etcd_lease_renew(etcd *s)
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
		int prc = etcd_put_raw(s, k, d, n, s->lease_id);
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
	teu_http_reply r;
	JsonNode *p = NULL;
	char body[64];
	int64_t ttl = 0;

	g_snprintf(body, sizeof body, "{\"ID\":\"%" PRId64 "\"}", id);
	int rc = etcd_post(s, "/lease/keepalive", body, &r);
	if (rc < 0)
		return rc;
	if (r.status == 404) {
		teu_http_reply_clear(&r);
		return -ENOENT;
	}
	if (r.status != 200) {
		char *m = etcd_error_text(&r);
		s->h->log(s->h, TE_LOG_WARN, "etcd %s: keep-alive of lease %" PRIx64 " failed: %s", s->conn,
			  (uint64_t)id, m);
		g_free(m);
		teu_http_reply_clear(&r);
		return TE_ERR_METADATA;
	}
	/* A streamed reply: one JSON object per line; the first is ours. */
	char *nl = memchr(r.body, '\n', r.len);
	if (nl != NULL) {
		*nl = '\0';
		r.len = (size_t)(nl - r.body);
	}
	JsonObject *o = etcd_reply_object(s, &r, "lease keep-alive", "-", &p);
	rc = TE_ERR_METADATA;
	if (o != NULL) {
		JsonObject *res = etcd_obj_member(o, "result");
		JsonObject *er = etcd_obj_member(o, "error");
		if (res != NULL) {
			/* proto3 leaves out a zero TTL: the lease expired. */
			rc = etcd_member_i64(res, "TTL", &ttl) && ttl > 0 ? 0 : -ENOENT;
		} else if (er != NULL) {
			const char *m = etcd_str_member(er, "message", NULL);
			if (m == NULL)
				m = "?";
			rc = strstr(m, "lease not found") ? -ENOENT : TE_ERR_METADATA;
			if (rc != -ENOENT)
				s->h->log(s->h, TE_LOG_WARN, "etcd %s: keep-alive failed: %s", s->conn, m);
		}
	}
	if (p)
		json_node_unref(p);
	teu_http_reply_clear(&r);
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
	while (teu_keeper_sleep(&s->keeper, failing ? retry_ms : period)) {
		g_mutex_lock(&s->lease_lock);
		int rc = s->lease_id ? lease_keepalive(s, s->lease_id) : -ENOENT;
		if (rc == -ENOENT)
			rc = etcd_lease_renew(s);
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
int etcd_lease_ensure(etcd *s)
{
	if (s->lease_id != 0)
		return 0;
	int rc = lease_grant(s);
	if (rc < 0)
		return rc;
	if (!teu_keeper_start(&s->keeper, "te-etcd-lease", keeper, s)) {
		s->h->log(s->h, TE_LOG_ERROR, "etcd %s: cannot start the lease keep-alive thread", s->conn);
		return -EAGAIN;
	}
	return 0;
}

void etcd_lease_revoke(etcd *s)
{
	teu_http_reply r;
	char body[64];

	if (s->lease_id == 0)
		return;
	g_snprintf(body, sizeof body, "{\"ID\":\"%" PRId64 "\"}", s->lease_id);
	int rc = etcd_post(s, "/lease/revoke", body, &r);
	if (rc == 0 && r.status == 404 && strstr(r.body, "lease not found") == NULL) {
		/* Gateways of etcd 3.3 know only the older path. */
		teu_http_reply_clear(&r);
		rc = etcd_post(s, "/kv/lease/revoke", body, &r);
	}
	if (rc < 0)
		s->h->log(s->h, TE_LOG_WARN, "etcd %s: revoking lease %" PRIx64 " failed (%s); its keys expire "
			  "after %" PRId64 " s", s->conn, (uint64_t)s->lease_id, strerror(-rc), s->granted_ttl);
	else
		teu_http_reply_clear(&r);
	s->lease_id = 0;
}
