/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sentinel: where the master is (SENTINEL get-master-addr-by-name, the
 * sentinel that answered last asked first), and whether a server is one
 * (ROLE).
 */
#include <errno.h>
#include <string.h>

#include "redis.h"

/* Asks one sentinel where the master is: 0 and *host, *port set, or an error. */
static int ask_sentinel(rstore *s, const rsentinel *sn, char **host, int *port)
{
	/* A sentinel that does not answer within a second is skipped: another may. */
	int ms = s->timeout_ms < 1000 ? s->timeout_ms : 1000;
	redisContext *c = redisConnectWithTimeout(sn->host, sn->port, tv_of(ms));
	redisReply *r = NULL;
	int rc = TE_ERR_METADATA;

	if (c == NULL)
		return -ENOMEM;
	if (c->err) {
		rc = redis_errno_of_ctx(c);
		s->h->log(s->h, TE_LOG_DEBUG, "redis sentinel %s:%d: %s", sn->host, sn->port, c->errstr);
		redisFree(c);
		return rc;
	}
	redis_bound_replies(c);
	(void)redisSetTimeout(c, tv_of(ms));
	if (s->sentinel_password != NULL) {
		const char *av[2] = { "AUTH", s->sentinel_password };
		size_t lv[2] = { 4, strlen(s->sentinel_password) };
		r = redisCommandArgv(c, 2, av, lv);
		bool ok = r != NULL && r->type != REDIS_REPLY_ERROR;
		if (r != NULL)
			freeReplyObject(r);
		if (!ok) {
			s->h->log(s->h, TE_LOG_WARN, "redis sentinel %s:%d refused AUTH (TE_REDIS_SENTINEL_PASSWORD)",
				  sn->host, sn->port);
			redisFree(c);
			return -EACCES;
		}
	}
	const char *argv[3] = { "SENTINEL", "get-master-addr-by-name", s->master_name };
	size_t lens[3] = { 8, 23, strlen(s->master_name) };
	r = redisCommandArgv(c, 3, argv, lens);
	if (r == NULL) {
		rc = redis_errno_of_ctx(c);
		s->h->log(s->h, TE_LOG_DEBUG, "redis sentinel %s:%d: %s", sn->host, sn->port, c->errstr);
	} else if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[0]->type == REDIS_REPLY_STRING &&
		   r->element[1]->type == REDIS_REPLY_STRING && r->element[0]->len > 0 && r->element[0]->len < 256 &&
		   r->element[1]->len > 0 && r->element[1]->len < 6) {
		char *end = NULL;
		long p = strtol(r->element[1]->str, &end, 10);
		if (end != NULL && *end == '\0' && p > 0 && p < 65536 &&
		    strlen(r->element[0]->str) == r->element[0]->len) {
			*host = g_strdup(r->element[0]->str);
			*port = (int)p;
			rc = 0;
		} else {
			s->h->log(s->h, TE_LOG_WARN, "redis sentinel %s:%d named a malformed master address", sn->host,
				  sn->port);
		}
	} else if (r->type == REDIS_REPLY_NIL || (r->type == REDIS_REPLY_ARRAY && r->elements == 0)) {
		s->h->log(s->h, TE_LOG_WARN, "redis sentinel %s:%d does not know master '%s'", sn->host, sn->port,
			  s->master_name);
		rc = -ENOENT;
	} else {
		s->h->log(s->h, TE_LOG_WARN, "redis sentinel %s:%d: unexpected answer to get-master-addr-by-name%s%s",
			  sn->host, sn->port, r->type == REDIS_REPLY_ERROR ? ": " : "",
			  r->type == REDIS_REPLY_ERROR ? r->str : "");
	}
	if (r != NULL)
		freeReplyObject(r);
	redisFree(c);
	return rc;
}

/* Where the master is now, from the first sentinel that knows (the one that
 * answered last is asked first). With the lock held. */
int redis_resolve_master(rstore *s)
{
	int rc = -EHOSTUNREACH;

	for (int i = 0; i < s->nsentinels; i++) {
		int k = (s->sentinel_next + i) % s->nsentinels;
		char *host = NULL;
		int port = 0;
		int r = ask_sentinel(s, &s->sentinels[k], &host, &port);
		if (r == 0) {
			if (s->host == NULL || strcmp(host, s->host) != 0 || port != s->port)
				s->h->log(s->h, s->host ? TE_LOG_WARN : TE_LOG_INFO,
					  "redis %s: master '%s' is at %s:%d (sentinel %s:%d)", s->conn, s->master_name,
					  host, port, s->sentinels[k].host, s->sentinels[k].port);
			g_free(s->host);
			s->host = host;
			s->port = port;
			s->sentinel_next = k;
			return 0;
		}
		rc = r;
	}
	s->h->log(s->h, TE_LOG_WARN, "redis %s: no sentinel named the master '%s'", s->conn, s->master_name);
	return rc == -EACCES ? rc : -EHOSTUNREACH;
}

/* Behind sentinels: whether the server is a master (ROLE). A replica that
 * the sentinels still name (a fail-over in progress) is refused with -EAGAIN. */
int redis_check_master(rstore *s)
{
	const char *argv[1] = { "ROLE" };
	size_t lens[1] = { 4 };
	redisReply *r = redis_command(s, 1, argv, lens);
	int rc = 0;

	if (r == NULL)
		return redis_errno_of_ctx(s->c);
	if (r->type == REDIS_REPLY_ARRAY && r->elements > 0 && r->element[0]->type == REDIS_REPLY_STRING &&
	    strcmp(r->element[0]->str, "master") != 0) {
		s->h->log(s->h, TE_LOG_WARN, "redis %s: %s:%d is a %s, not the master; asking the sentinels again",
			  s->conn, s->host, s->port, r->element[0]->str);
		rc = -EAGAIN;
	}
	freeReplyObject(r);
	return rc;
}
