/* SPDX-License-Identifier: Apache-2.0 */
/*
 * redis metadata store over hiredis: GET, SET, DEL and SCAN on one
 * connection per store handle, serialised by a mutex (metadata calls are
 * control-plane, rare and short).
 *
 * Connection string: redis://[user:password@]host[:port][/db]. Credentials
 * and database index from the string win over TE_REDIS_USERNAME,
 * TE_REDIS_PASSWORD, TE_REDIS_DB_INDEX (or their MC_REDIS_* names).
 *
 * A broken connection (redis restarted, network cut) is dropped and
 * re-established, with AUTH and SELECT, on the next call; a call that hit a
 * closed connection is retried once on a fresh one. Every connect and every
 * command is bounded by TE_REDIS_TIMEOUT_MS.
 *
 * Sentinel: redis-sentinel://[user:password@]host:port[,host:port...]/master
 * asks the sentinels (SENTINEL get-master-addr-by-name) where the master is
 * before every connect, and checks with ROLE that it is one; a connection
 * error, a READONLY answer (the old master, now a replica) or a refused
 * connect drops the connection and asks again, with backoff, within the
 * call's timeout, so calls follow a fail-over. The keeper below puts back
 * the owned keys a promoted replica had not received.
 *
 * Retries are bounded and back off exponentially with jitter (so that many
 * engines meeting one failing store do not retry in step): a few attempts
 * for a single redis, until the call's timeout behind sentinels (a
 * fail-over takes seconds).
 *
 * Liveness: keys put with TE_META_OWNED get an expiry (TE_REDIS_KEY_TTL
 * seconds, 0 for none) that a keeper thread pushes back every third of it,
 * so a crashed engine's keys vanish on their own. A kept key found missing
 * (expired while redis or the engine stalled, or lost in a restart) is put
 * back with its value.
 */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "redis.h"
#include "teu-hostport.h"
#include "teu-store.h"

#define DEFAULT_PORT 6379
#define DEFAULT_SENTINEL_PORT 26379

/* ----------------------------------------------------------- open/close */

static void redis_close(void *ctx)
{
	rstore *s = ctx;

	if (s == NULL)
		return;
	teu_keeper_clear(&s->keeper);
	redis_drop(s);
	g_hash_table_destroy(s->owned);
	g_mutex_clear(&s->owned_lock);
	g_free(s->conn);
	g_free(s->host);
	g_free(s->user);
	for (int i = 0; i < s->nsentinels; i++)
		g_free(s->sentinels[i].host);
	g_free(s->master_name);
	if (s->sentinel_password) {
		memset(s->sentinel_password, 0, strlen(s->sentinel_password));
		g_free(s->sentinel_password);
	}
	if (s->password) {
		memset(s->password, 0, strlen(s->password));
		g_free(s->password);
	}
	g_mutex_clear(&s->lock);
	g_free(s);
}

/* One "host[:port]" or "[v6]:port" of a sentinel list. */
static bool parse_hostport(const char *item, char **host, int *port)
{
	char h[TEU_HOST_MAX];
	int p;

	/* a bare IPv6 address needs brackets */
	if (teu_hostport_split(item, h, sizeof h, &p) < 0 || *h == '\0' || strlen(h) > 253 || p == 0)
		return false;
	*port = p < 0 ? DEFAULT_SENTINEL_PORT : p;
	*host = g_strdup(h);
	return true;
}

/* redis-sentinel://[user:password@]host[:port][,host[:port]...]/master[/db] */
static int parse_sentinel_conn(const te_host *h, rstore *s, const char *conn)
{
	const char *rest = conn + strlen("redis-sentinel://");
	const char *slash = strchr(rest, '/');
	int rc = -EINVAL;

	if (slash == NULL || slash[1] == '\0' || strpbrk(conn, "?#") != NULL) {
		h->log(h, TE_LOG_ERROR,
		       "redis: '%s' needs the form redis-sentinel://[user:password@]host:port[,host:port...]/master[/db]",
		       s->conn);
		return -EINVAL;
	}
	char *auth = NULL, *hosts;
	/* The last '@' before the path ends the credentials. */
	const char *at = NULL;
	for (const char *a = rest; a < slash; a++)
		if (*a == '@')
			at = a;
	if (at != NULL) {
		auth = g_strndup(rest, (size_t)(at - rest));
		hosts = g_strndup(at + 1, (size_t)(slash - at - 1));
	} else {
		hosts = g_strndup(rest, (size_t)(slash - rest));
	}
	char **items = g_strsplit(hosts, ",", -1);
	guint n = g_strv_length(items);
	if (n == 0 || n > MAX_SENTINELS) {
		h->log(h, TE_LOG_ERROR, "redis: '%s' names %u sentinels (1..%d)", s->conn, n, MAX_SENTINELS);
		goto out;
	}
	for (guint i = 0; i < n; i++) {
		if (!parse_hostport(items[i], &s->sentinels[i].host, &s->sentinels[i].port)) {
			h->log(h, TE_LOG_ERROR, "redis: sentinel '%s' in '%s' is not host[:port]", items[i], s->conn);
			goto out;
		}
		s->nsentinels++;
	}
	const char *name = slash + 1, *dbs = strchr(name, '/');
	size_t nl = dbs ? (size_t)(dbs - name) : strlen(name);
	if (nl == 0 || nl > 200) {
		h->log(h, TE_LOG_ERROR, "redis: '%s' needs a master name after the sentinels", s->conn);
		goto out;
	}
	s->master_name = g_uri_unescape_segment(name, name + nl, NULL);
	if (s->master_name == NULL || *s->master_name == '\0') {
		h->log(h, TE_LOG_ERROR, "redis: master name in '%s' is malformed", s->conn);
		goto out;
	}
	s->db = -1;
	if (dbs != NULL) {
		char *end = NULL;
		errno = 0;
		long db = strtol(dbs + 1, &end, 10);
		if (errno || end == dbs + 1 || *end != '\0' || db < 0 || db > 255) {
			h->log(h, TE_LOG_ERROR, "redis: database '%s' in '%s' is not a number in 0..255", dbs + 1,
			       s->conn);
			goto out;
		}
		s->db = (int)db;
	}
	if (auth != NULL) {
		char *colon = strchr(auth, ':');
		char *user = colon ? g_uri_unescape_segment(auth, colon, NULL) : NULL;
		char *pw = g_uri_unescape_string(colon ? colon + 1 : auth, NULL);
		if (pw == NULL || (colon != NULL && user == NULL)) {
			h->log(h, TE_LOG_ERROR, "redis: credentials in the connection string are malformed");
			g_free(user);
			g_free(pw);
			goto out;
		}
		if (user != NULL && *user == '\0') {
			g_free(user);
			user = NULL;
		}
		s->user = user;
		if (*pw != '\0') {
			s->password = pw;
		} else {
			g_free(pw);
		}
	}
	rc = 0;
out:
	if (auth != NULL) {
		memset(auth, 0, strlen(auth));
		g_free(auth);
	}
	g_free(hosts);
	g_strfreev(items);
	return rc;
}

static int parse_conn(const te_host *h, rstore *s, const char *conn)
{
	if (g_ascii_strncasecmp(conn, "redis-sentinel://", strlen("redis-sentinel://")) == 0)
		return parse_sentinel_conn(h, s, conn);

	GError *e = NULL;
	GUri *u = g_uri_parse(conn, G_URI_FLAGS_HAS_PASSWORD, &e);

	if (u == NULL) {
		h->log(h, TE_LOG_ERROR, "redis: connection string is not a URL (%s)", e->message);
		g_error_free(e);
		return -EINVAL;
	}
	int rc = -EINVAL;
	const char *host = g_uri_get_host(u), *path = g_uri_get_path(u);
	if (g_ascii_strcasecmp(g_uri_get_scheme(u), "redis") != 0 || host == NULL || *host == '\0') {
		h->log(h, TE_LOG_ERROR, "redis: '%s' needs the form redis://[user:password@]host:port[/db]",
		       s->conn);
		goto out;
	}
	if (g_uri_get_query(u) != NULL || g_uri_get_fragment(u) != NULL) {
		h->log(h, TE_LOG_ERROR, "redis: '%s' must not carry a query or fragment", s->conn);
		goto out;
	}
	s->host = g_strdup(host);
	s->port = g_uri_get_port(u) > 0 ? g_uri_get_port(u) : DEFAULT_PORT;
	if (g_uri_get_user(u) && *g_uri_get_user(u))
		s->user = g_strdup(g_uri_get_user(u));
	if (g_uri_get_password(u))
		s->password = g_strdup(g_uri_get_password(u));
	s->db = -1;
	if (path != NULL && *path != '\0' && strcmp(path, "/") != 0) {
		char *end = NULL;
		errno = 0;
		long db = strtol(path + 1, &end, 10);
		if (path[0] != '/' || errno || end == path + 1 || *end != '\0' || db < 0 || db > 255) {
			h->log(h, TE_LOG_ERROR, "redis: database '%s' in '%s' is not a number in 0..255", path + 1,
			       s->conn);
			goto out;
		}
		s->db = (int)db;
	}
	rc = 0;
out:
	g_uri_unref(u);
	return rc;
}

static int redis_open(const te_host *h, const char *conn, void **ctx)
{
	rstore *s;
	int rc;

	*ctx = NULL;
	if (conn == NULL || *conn == '\0') {
		h->log(h, TE_LOG_ERROR, "redis: empty connection string");
		return -EINVAL;
	}
	s = g_new0(rstore, 1);
	g_mutex_init(&s->lock);
	g_mutex_init(&s->owned_lock);
	teu_keeper_init(&s->keeper);
	s->owned = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, (GDestroyNotify)g_bytes_unref);
	s->h = h;
	/* Logs name the store without its password. */
	const char *at = strrchr(conn, '@');
	bool sentinel = g_ascii_strncasecmp(conn, "redis-sentinel://", strlen("redis-sentinel://")) == 0;
	s->conn = at ? g_strdup_printf("%s://%s", sentinel ? "redis-sentinel" : "redis", at + 1) : g_strdup(conn);
	rc = parse_conn(h, s, conn);
	if (rc < 0) {
		redis_close(s);
		return rc;
	}
	if (s->user == NULL) {
		const char *v = h->config(h, "TE_REDIS_USERNAME", "MC_REDIS_USERNAME");
		if (v && *v)
			s->user = g_strdup(v);
	}
	if (s->password == NULL) {
		const char *v = h->config(h, "TE_REDIS_PASSWORD", "MC_REDIS_PASSWORD");
		if (v && *v)
			s->password = g_strdup(v);
	}
	if (s->user != NULL && s->password == NULL) {
		h->log(h, TE_LOG_ERROR, "redis %s: user '%s' given without a password", s->conn, s->user);
		redis_close(s);
		return -EINVAL;
	}
	if (s->db < 0)
		s->db = (int)te_host_config_u64(h, "TE_REDIS_DB_INDEX", "MC_REDIS_DB_INDEX", 0, 0, 255);
	s->timeout_ms = (int)te_host_config_u64(h, "TE_REDIS_TIMEOUT_MS", NULL, 5000, 10, 600000);
	s->ttl_ms = (int64_t)te_host_config_u64(h, "TE_REDIS_KEY_TTL", NULL, 10, 0, 86400) * 1000;
	if (sentinel) {
		const char *v = h->config(h, "TE_REDIS_SENTINEL_PASSWORD", NULL);
		if (v && *v)
			s->sentinel_password = g_strdup(v);
	}

	/* Connect now, so a wrong address or password fails engine creation
	 * with a clear reason instead of the first lookup. */
	pipe_guard g;
	redis_pipe_block(&g);
	g_mutex_lock(&s->lock);
	rc = redis_connect(s);
	if (rc == 0) {
		const char *argv[1] = { "PING" };
		size_t lens[1] = { 4 };
		redisReply *r = redis_command(s, 1, argv, lens);
		if (r == NULL) {
			rc = redis_errno_of_ctx(s->c);
			h->log(h, TE_LOG_ERROR, "redis %s: PING failed: %s", s->conn, s->c->errstr);
		} else if (r->type == REDIS_REPLY_ERROR) {
			rc = strncmp(r->str, "NOAUTH", 6) == 0 ? -EACCES : TE_ERR_METADATA;
			h->log(h, TE_LOG_ERROR, "redis %s: PING refused: %s%s", s->conn, r->str,
			       rc == -EACCES ? " (the server requires a password: TE_REDIS_PASSWORD)" : "");
		}
		if (r)
			freeReplyObject(r);
	}
	g_mutex_unlock(&s->lock);
	redis_pipe_restore(&g);
	if (rc < 0) {
		redis_close(s);
		return rc;
	}
	*ctx = s;
	return 0;
}

static const char *const redis_schemes[] = { "redis", "redis-sentinel", NULL };

TEU_STORE_PLUGIN(redis, "redis metadata store (hiredis; an engine's keys expire unless it renews them)")
