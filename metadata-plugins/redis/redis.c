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
 * Liveness: keys put with TE_META_OWNED get an expiry (TE_REDIS_KEY_TTL
 * seconds, 0 for none) that a keeper thread pushes back every third of it,
 * so a crashed engine's keys vanish on their own. A kept key found missing
 * (expired while redis or the engine stalled, or lost in a restart) is put
 * back with its value.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/time.h>

#include <glib.h>
#include <hiredis/hiredis.h>

#include <te/te-plugin.h>

#include "../common/te-keeper.h"

#define DEFAULT_PORT 6379
#define SCAN_COUNT "1000"

typedef struct rstore {
	const te_host *h;
	char *conn;    /* for logs: the connection string without a password */
	char *host;
	int port;
	char *user;
	char *password;
	int db;
	int timeout_ms;
	GMutex lock;
	redisContext *c; /* NULL: connect on the next call */
	/* owned keys */
	int64_t ttl_ms;      /* 0: owned keys do not expire */
	GMutex owned_lock;   /* owned; held across I/O so a removal cannot race a put-back */
	GHashTable *owned;   /* key → GBytes value */
	te_keeper keeper;
} rstore;

static struct timeval tv_of(int ms)
{
	return (struct timeval){ .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };
}

/* hiredis write()s to its socket: a peer that went away would raise SIGPIPE
 * and kill the process. The signal is blocked on this thread for the call and
 * a SIGPIPE the call raised is consumed. */
typedef struct pipe_guard {
	sigset_t old;
	bool pending_before;
} pipe_guard;

static void pipe_block(pipe_guard *g)
{
	sigset_t set, pend;

	sigemptyset(&set);
	sigaddset(&set, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &set, &g->old);
	sigpending(&pend);
	g->pending_before = sigismember(&pend, SIGPIPE) == 1;
}

static void pipe_restore(pipe_guard *g)
{
	if (!g->pending_before) {
		sigset_t set, pend;
		struct timespec zero = { 0, 0 };
		sigemptyset(&set);
		sigaddset(&set, SIGPIPE);
		sigpending(&pend);
		if (sigismember(&pend, SIGPIPE) == 1)
			sigtimedwait(&set, NULL, &zero);
	}
	pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

static int errno_of_ctx(const redisContext *c)
{
	switch (c->err) {
	case REDIS_ERR_IO:
		if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ETIMEDOUT || errno == EINPROGRESS)
			return -ETIMEDOUT;
		return errno == ECONNREFUSED ? -ECONNREFUSED : -EIO;
	case REDIS_ERR_EOF:
		return -ECONNRESET;
	case REDIS_ERR_OOM:
		return -ENOMEM;
	default:
		return -EIO;
	}
}

static void drop(rstore *s)
{
	if (s->c != NULL) {
		redisFree(s->c);
		s->c = NULL;
	}
}

/* Runs a command on the live connection; the reply or NULL (s->c->err set). */
static redisReply *command(rstore *s, int argc, const char **argv, const size_t *lens)
{
	return redisCommandArgv(s->c, argc, argv, lens);
}

/* Elements a reply may announce. hiredis allocates an array for the count a
 * reply announces before any element arrives, so a broken or hostile store
 * could make it allocate gigabytes with a few bytes ("*2000000000"): such a
 * reply fails the call (as out of memory) and the connection is dropped. */
#define MAX_REPLY_ELEMENTS (1 << 20)

static redisReplyObjectFunctions bounded_fns;
static void *(*hiredis_create_array)(const redisReadTask *, int);

static void *create_array_bounded(const redisReadTask *t, int elements)
{
	if (elements < 0 || elements > MAX_REPLY_ELEMENTS)
		return NULL;
	return hiredis_create_array(t, elements);
}

static gpointer bound_fns_init(gpointer reader_fns)
{
	bounded_fns = *(const redisReplyObjectFunctions *)reader_fns;
	hiredis_create_array = bounded_fns.createArray;
	bounded_fns.createArray = create_array_bounded;
	return &bounded_fns;
}

/* Connects, authenticates and selects the database. With the lock held. */
static int connect_store(rstore *s)
{
	redisReply *r;
	int rc;

	drop(s);
	s->c = redisConnectWithTimeout(s->host, s->port, tv_of(s->timeout_ms));
	if (s->c == NULL) {
		s->h->log(s->h, TE_LOG_ERROR, "redis %s: out of memory connecting", s->conn);
		return -ENOMEM;
	}
	if (s->c->err) {
		rc = errno_of_ctx(s->c);
		s->h->log(s->h, TE_LOG_ERROR, "redis %s: cannot connect: %s", s->conn, s->c->errstr);
		drop(s);
		return rc;
	}
	static GOnce fns_once = G_ONCE_INIT;
	if (s->c->reader->fn != NULL && s->c->reader->fn->createArray != NULL)
		s->c->reader->fn = g_once(&fns_once, bound_fns_init, s->c->reader->fn);
	if (redisSetTimeout(s->c, tv_of(s->timeout_ms)) != REDIS_OK)
		s->h->log(s->h, TE_LOG_WARN, "redis %s: cannot set the command timeout", s->conn);
	redisEnableKeepAlive(s->c);

	if (s->password != NULL) {
		const char *argv[3] = { "AUTH" };
		size_t lens[3] = { 4 };
		int argc = 1;
		if (s->user != NULL) {
			argv[argc] = s->user;
			lens[argc++] = strlen(s->user);
		}
		argv[argc] = s->password;
		lens[argc++] = strlen(s->password);
		r = command(s, argc, argv, lens);
		if (r == NULL) {
			rc = errno_of_ctx(s->c);
			s->h->log(s->h, TE_LOG_ERROR, "redis %s: AUTH failed: %s", s->conn, s->c->errstr);
			drop(s);
			return rc;
		}
		if (r->type == REDIS_REPLY_ERROR) {
			/* The reply never contains the password; it is safe to log. */
			s->h->log(s->h, TE_LOG_ERROR, "redis %s: authentication failed%s%s: %s", s->conn,
				  s->user ? " for user " : "", s->user ? s->user : "", r->str);
			freeReplyObject(r);
			drop(s);
			return -EACCES;
		}
		freeReplyObject(r);
	}
	if (s->db != 0) {
		char dbs[16];
		g_snprintf(dbs, sizeof dbs, "%d", s->db);
		const char *argv[2] = { "SELECT", dbs };
		size_t lens[2] = { 6, strlen(dbs) };
		r = command(s, 2, argv, lens);
		if (r == NULL || r->type == REDIS_REPLY_ERROR) {
			rc = r ? (strncmp(r->str, "NOAUTH", 6) == 0 ? -EACCES : -EINVAL) : errno_of_ctx(s->c);
			s->h->log(s->h, TE_LOG_ERROR, "redis %s: SELECT %d failed: %s%s", s->conn, s->db,
				  r ? r->str : s->c->errstr,
				  r && rc == -EACCES ? " (set a password: TE_REDIS_PASSWORD)" : "");
			if (r)
				freeReplyObject(r);
			drop(s);
			return rc;
		}
		freeReplyObject(r);
	}
	return 0;
}

/*
 * One command with reconnection: connects when there is no connection, and
 * when the connection turns out broken (EOF, reset) reconnects and retries
 * once. A timeout is not retried (the server may be wedged) but the
 * connection is dropped, since a late reply would answer the next command.
 * Returns the reply (never a redis error reply: those are logged and turned
 * into TE_ERR_METADATA / -EACCES) or NULL with *rc set.
 */
static redisReply *run(rstore *s, const char *what, const char *key, int argc, const char **argv,
		       const size_t *lens, int *rc)
{
	redisReply *r = NULL;
	pipe_guard g;
	gint64 deadline = g_get_monotonic_time() + (gint64)s->timeout_ms * 1000;

	pipe_block(&g);
	g_mutex_lock(&s->lock);
	for (int attempt = 0;; attempt++) {
		bool fresh = false;
		if (s->c == NULL) {
			*rc = connect_store(s);
			if (*rc < 0)
				break;
			fresh = true;
		}
		r = command(s, argc, argv, lens);
		if (r == NULL) {
			*rc = errno_of_ctx(s->c);
			s->h->log(s->h, fresh || attempt > 0 || *rc == -ETIMEDOUT ? TE_LOG_ERROR : TE_LOG_WARN,
				  "redis %s: %s '%s': %s%s", s->conn, what, key, s->c->errstr,
				  *rc == -ETIMEDOUT ? " (timed out)" : "");
			drop(s);
			if (*rc != -ETIMEDOUT && !fresh && attempt == 0)
				continue; /* the old connection was dead: once more on a new one */
			break;
		}
		if (r->type == REDIS_REPLY_ERROR) {
			/* LOADING: a restarted redis reads its data back; wait, bounded. */
			if (strncmp(r->str, "LOADING", 7) == 0 && g_get_monotonic_time() < deadline) {
				freeReplyObject(r);
				r = NULL;
				g_usleep(50000);
				continue;
			}
			*rc = strncmp(r->str, "NOAUTH", 6) == 0 || strncmp(r->str, "WRONGPASS", 9) == 0 ||
					      strncmp(r->str, "NOPERM", 6) == 0
				      ? -EACCES
				      : TE_ERR_METADATA;
			s->h->log(s->h, TE_LOG_ERROR, "redis %s: %s '%s' refused: %s%s", s->conn, what, key, r->str,
				  *rc == -EACCES && s->password == NULL ? " (set a password: TE_REDIS_PASSWORD)" : "");
			freeReplyObject(r);
			r = NULL;
			break;
		}
		*rc = 0;
		break;
	}
	g_mutex_unlock(&s->lock);
	pipe_restore(&g);
	return r;
}

/* ---------------------------------------------------------------- ops */

static int redis_get(void *ctx, const char *key, char **value, size_t *len)
{
	rstore *s = ctx;
	int rc;

	*value = NULL;
	if (key == NULL || *key == '\0') {
		s->h->log(s->h, TE_LOG_ERROR, "redis get: empty key");
		return -EINVAL;
	}
	const char *argv[2] = { "GET", key };
	size_t lens[2] = { 3, strlen(key) };
	redisReply *r = run(s, "GET", key, 2, argv, lens, &rc);
	if (r == NULL)
		return rc;
	if (r->type == REDIS_REPLY_NIL) {
		rc = -ENOENT;
	} else if (r->type != REDIS_REPLY_STRING) {
		s->h->log(s->h, TE_LOG_ERROR, "redis %s: GET '%s' returned a reply of type %d, not a string",
			  s->conn, key, r->type);
		rc = TE_ERR_METADATA;
	} else {
		char *out = malloc(r->len + 1);
		if (out == NULL) {
			rc = -ENOMEM;
		} else {
			memcpy(out, r->str, r->len);
			out[r->len] = '\0';
			*value = out;
			if (len)
				*len = r->len;
		}
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
	redisReply *r = run(s, "SET", key, ttl_ms > 0 ? 5 : 3, argv, lens, &rc);
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

static int redis_put(void *ctx, const char *key, const char *value, size_t len, unsigned flags)
{
	rstore *s = ctx;
	int rc;

	if (key == NULL || *key == '\0' || (value == NULL && len > 0)) {
		s->h->log(s->h, TE_LOG_ERROR, "redis put: empty key or NULL value");
		return -EINVAL;
	}
	if (!(flags & TE_META_OWNED) || s->ttl_ms == 0)
		return set_key(s, key, value, len, 0);

	g_mutex_lock(&s->owned_lock);
	rc = set_key(s, key, value, len, s->ttl_ms);
	if (rc == 0) {
		g_hash_table_replace(s->owned, g_strdup(key), g_bytes_new(value ? value : "", len));
		if (!te_keeper_start(&s->keeper, "te-redis-ttl", keeper, s))
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
		redisReply *r = run(s, "PEXPIRE", k, 3, argv, lens, &rc);
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

	while (te_keeper_sleep(&s->keeper, failing ? 250 : period)) {
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

static int redis_remove(void *ctx, const char *key)
{
	rstore *s = ctx;
	int rc;

	if (key == NULL || *key == '\0') {
		s->h->log(s->h, TE_LOG_ERROR, "redis remove: empty key");
		return -EINVAL;
	}
	const char *argv[2] = { "DEL", key };
	size_t lens[2] = { 3, strlen(key) };
	g_mutex_lock(&s->owned_lock);
	redisReply *r = run(s, "DEL", key, 2, argv, lens, &rc);
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

static int redis_list(void *ctx, const char *prefix, char ***keys, size_t *n)
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
		redisReply *r = run(s, "SCAN", pattern, 6, argv, lens, &rc);
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
			arr[got] = strdup(k);
			if (arr[got] == NULL)
				rc = -ENOMEM;
			else
				got++;
		}
		if (rc < 0) {
			for (size_t i = 0; i < got; i++)
				free(arr[i]);
			free(arr);
		} else {
			*keys = arr;
			*n = got;
		}
	}
	g_ptr_array_foreach(out, (GFunc)(void *)g_free, NULL);
	g_ptr_array_free(out, TRUE);
	return rc;
}

/* ----------------------------------------------------------- open/close */

static void redis_close(void *ctx)
{
	rstore *s = ctx;

	if (s == NULL)
		return;
	te_keeper_clear(&s->keeper);
	drop(s);
	g_hash_table_destroy(s->owned);
	g_mutex_clear(&s->owned_lock);
	g_free(s->conn);
	g_free(s->host);
	g_free(s->user);
	if (s->password) {
		memset(s->password, 0, strlen(s->password));
		g_free(s->password);
	}
	g_mutex_clear(&s->lock);
	g_free(s);
}

static int parse_conn(const te_host *h, rstore *s, const char *conn)
{
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
	te_keeper_init(&s->keeper);
	s->owned = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, (GDestroyNotify)g_bytes_unref);
	s->h = h;
	/* Logs name the store without its password. */
	const char *at = strrchr(conn, '@');
	s->conn = at ? g_strdup_printf("redis://%s", at + 1) : g_strdup(conn);
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

	/* Connect now, so a wrong address or password fails engine creation
	 * with a clear reason instead of the first lookup. */
	pipe_guard g;
	pipe_block(&g);
	g_mutex_lock(&s->lock);
	rc = connect_store(s);
	if (rc == 0) {
		const char *argv[1] = { "PING" };
		size_t lens[1] = { 4 };
		redisReply *r = command(s, 1, argv, lens);
		if (r == NULL) {
			rc = errno_of_ctx(s->c);
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
	pipe_restore(&g);
	if (rc < 0) {
		redis_close(s);
		return rc;
	}
	*ctx = s;
	return 0;
}

static const char *const redis_schemes[] = { "redis", NULL };

static const te_metadata_ops redis_ops = {
	.size = sizeof(te_metadata_ops),
	.schemes = redis_schemes,
	.open = redis_open,
	.close = redis_close,
	.get = redis_get,
	.put = redis_put,
	.remove = redis_remove,
	.list = redis_list,
};

TE_PLUGIN_DEFINE(TE_KIND_METADATA, "redis", "1.0.0",
		 "redis metadata store (hiredis; an engine's keys expire unless it renews them)", "Apache-2.0",
		 &redis_ops)
