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
#define DEFAULT_SENTINEL_PORT 26379
#define MAX_SENTINELS 8
#define SCAN_COUNT "1000"
/* Retries of one call: backoff from BACKOFF_MIN_MS doubling to
 * BACKOFF_MAX_MS, each wait drawn from its upper half; a single redis gets
 * PLAIN_ATTEMPTS tries in all (a refused connect is then a fact, not a
 * fail-over in progress). */
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 800
#define PLAIN_ATTEMPTS 3

typedef struct rsentinel {
	char *host;
	int port;
} rsentinel;

typedef struct rstore {
	const te_host *h;
	char *conn;    /* for logs: the connection string without a password */
	char *host;
	int port;
	char *user;
	char *password;
	int db;
	int timeout_ms;
	/* Behind sentinels (nsentinels > 0): host and port are the master they
	 * named last. */
	rsentinel sentinels[MAX_SENTINELS];
	int nsentinels;
	int sentinel_next;     /* the one that answered last: asked first */
	char *master_name;
	char *sentinel_password; /* TE_REDIS_SENTINEL_PASSWORD: the sentinels' own */
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
		rc = errno_of_ctx(c);
		s->h->log(s->h, TE_LOG_DEBUG, "redis sentinel %s:%d: %s", sn->host, sn->port, c->errstr);
		redisFree(c);
		return rc;
	}
	static GOnce fns_once = G_ONCE_INIT;
	if (c->reader->fn != NULL && c->reader->fn->createArray != NULL)
		c->reader->fn = g_once(&fns_once, bound_fns_init, c->reader->fn);
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
		rc = errno_of_ctx(c);
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
static int resolve_master(rstore *s)
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
static int check_master(rstore *s)
{
	const char *argv[1] = { "ROLE" };
	size_t lens[1] = { 4 };
	redisReply *r = command(s, 1, argv, lens);
	int rc = 0;

	if (r == NULL)
		return errno_of_ctx(s->c);
	if (r->type == REDIS_REPLY_ARRAY && r->elements > 0 && r->element[0]->type == REDIS_REPLY_STRING &&
	    strcmp(r->element[0]->str, "master") != 0) {
		s->h->log(s->h, TE_LOG_WARN, "redis %s: %s:%d is a %s, not the master; asking the sentinels again",
			  s->conn, s->host, s->port, r->element[0]->str);
		rc = -EAGAIN;
	}
	freeReplyObject(r);
	return rc;
}

/* Connects (behind sentinels: to the master they name), authenticates and
 * selects the database. With the lock held. */
static int connect_store(rstore *s)
{
	redisReply *r;
	int rc;

	drop(s);
	if (s->nsentinels > 0) {
		rc = resolve_master(s);
		if (rc < 0)
			return rc;
	}
	s->c = redisConnectWithTimeout(s->host, s->port, tv_of(s->timeout_ms));
	if (s->c == NULL) {
		s->h->log(s->h, TE_LOG_ERROR, "redis %s: out of memory connecting", s->conn);
		return -ENOMEM;
	}
	if (s->c->err) {
		rc = errno_of_ctx(s->c);
		/* Retried with backoff (a fail-over, a restart): limited. */
		TE_HOST_LOG_LIMITED(s->h, TE_LOG_ERROR, "redis %s: cannot connect to %s:%d: %s", s->conn, s->host,
				    s->port, s->c->errstr);
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
	if (s->nsentinels > 0) {
		rc = check_master(s);
		if (rc < 0) {
			drop(s);
			return rc;
		}
	}
	return 0;
}

/* Errors after which another try may succeed: the store went away, refused
 * the connection, or (behind sentinels) is changing masters. */
static bool transient(int rc)
{
	return rc == -ECONNREFUSED || rc == -ECONNRESET || rc == -EIO || rc == -EAGAIN || rc == -EHOSTUNREACH;
}

/* Waits before try number `attempt` + 1 (from 1): exponential, with jitter,
 * never past `deadline`; false when no time is left or the tries are used up. */
static bool back_off(const rstore *s, int attempt, gint64 deadline)
{
	if (s->nsentinels == 0 && attempt + 1 >= PLAIN_ATTEMPTS)
		return false;
	int64_t ms = BACKOFF_MIN_MS << (attempt < 5 ? attempt : 5);
	if (ms > BACKOFF_MAX_MS)
		ms = BACKOFF_MAX_MS;
	ms = ms / 2 + g_random_int_range(0, (gint32)(ms / 2) + 1);
	gint64 left = deadline - g_get_monotonic_time();
	if (left <= ms * 1000)
		return false;
	g_usleep((gulong)(ms * 1000));
	return true;
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
	for (int attempt = 0, tries = 0;; attempt++) {
		bool fresh = false;
		if (s->c == NULL) {
			*rc = connect_store(s);
			if (*rc < 0) {
				if (transient(*rc) && back_off(s, tries++, deadline))
					continue;
				break;
			}
			fresh = true;
		}
		r = command(s, argc, argv, lens);
		if (r == NULL) {
			*rc = errno_of_ctx(s->c);
			bool quiet = !fresh && attempt == 0 && *rc != -ETIMEDOUT;
			s->h->log(s->h, quiet ? TE_LOG_WARN : TE_LOG_ERROR, "redis %s: %s '%s': %s%s", s->conn, what, key,
				  s->c->errstr, *rc == -ETIMEDOUT ? " (timed out)" : "");
			drop(s);
			/* A timeout is not retried: the call's time is spent. */
			if (*rc == -ETIMEDOUT)
				break;
			if (quiet)
				continue; /* the old connection was dead: once more on a new one, now */
			if (transient(*rc) && back_off(s, tries++, deadline))
				continue;
			break;
		}
		if (r->type == REDIS_REPLY_ERROR) {
			/* LOADING: a restarted redis reads its data back; wait, bounded.
			 * READONLY: we reached a replica (the old master, demoted);
			 * MASTERDOWN, TRYAGAIN: a fail-over in progress. Behind
			 * sentinels, ask them again. */
			bool loading = strncmp(r->str, "LOADING", 7) == 0;
			bool moved = s->nsentinels > 0 && (strncmp(r->str, "READONLY", 8) == 0 ||
							   strncmp(r->str, "MASTERDOWN", 10) == 0 ||
							   strncmp(r->str, "TRYAGAIN", 8) == 0);
			if (moved)
				drop(s); /* (the reply stays readable) */
			bool again = false;
			if (loading)
				again = g_get_monotonic_time() + 50000 < deadline;
			else if (moved)
				again = back_off(s, tries++, deadline);
			if (again) {
				if (moved)
					s->h->log(s->h, TE_LOG_WARN, "redis %s: %s '%s': %s; asking the sentinels again",
						  s->conn, what, key, r->str);
				else
					g_usleep(50000);
				freeReplyObject(r);
				r = NULL;
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
	const char *colon, *h = item;
	size_t hl;

	if (item[0] == '[') {
		const char *close = strchr(item, ']');
		if (close == NULL || close == item + 1)
			return false;
		h = item + 1;
		hl = (size_t)(close - h);
		colon = close[1] == ':' ? close + 1 : NULL;
		if (close[1] != '\0' && colon == NULL)
			return false;
	} else {
		colon = strrchr(item, ':');
		hl = colon ? (size_t)(colon - item) : strlen(item);
		if (colon != NULL && strchr(item, ':') != colon)
			return false; /* a bare IPv6 address needs brackets */
	}
	if (hl == 0 || hl > 253)
		return false;
	*port = DEFAULT_SENTINEL_PORT;
	if (colon != NULL) {
		char *end = NULL;
		errno = 0;
		long p = strtol(colon + 1, &end, 10);
		if (errno || end == colon + 1 || *end != '\0' || p <= 0 || p > 65535)
			return false;
		*port = (int)p;
	}
	*host = g_strndup(h, hl);
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
	te_keeper_init(&s->keeper);
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

static const char *const redis_schemes[] = { "redis", "redis-sentinel", NULL };

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
