/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The connection to redis: connecting (behind sentinels, to the master they
 * name) with AUTH and SELECT, and one command with reconnection, retries
 * and backoff; SIGPIPE held off around hiredis's writes.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>

#include "redis.h"

/* Retries of one call: backoff from BACKOFF_MIN_MS doubling to
 * BACKOFF_MAX_MS, each wait drawn from its upper half; a single redis gets
 * PLAIN_ATTEMPTS tries in all (a refused connect is then a fact, not a
 * fail-over in progress). */
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 800
#define PLAIN_ATTEMPTS 3

void redis_pipe_block(pipe_guard *g)
{
	sigset_t set, pend;

	sigemptyset(&set);
	sigaddset(&set, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &set, &g->old);
	sigpending(&pend);
	g->pending_before = sigismember(&pend, SIGPIPE) == 1;
}

void redis_pipe_restore(pipe_guard *g)
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

int redis_errno_of_ctx(const redisContext *c)
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

void redis_drop(rstore *s)
{
	if (s->c != NULL) {
		redisFree(s->c);
		s->c = NULL;
	}
}

/* Runs a command on the live connection; the reply or NULL (s->c->err set). */
redisReply *redis_command(rstore *s, int argc, const char **argv, const size_t *lens)
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

void redis_bound_replies(redisContext *c)
{
	/* One table for every context (the store's and the sentinels'): all
	 * start from hiredis's own functions. */
	static GOnce fns_once = G_ONCE_INIT;

	if (c->reader->fn != NULL && c->reader->fn->createArray != NULL)
		c->reader->fn = g_once(&fns_once, bound_fns_init, c->reader->fn);
}

/* Connects (behind sentinels: to the master they name), authenticates and
 * selects the database. With the lock held. */
int redis_connect(rstore *s)
{
	redisReply *r;
	int rc;

	redis_drop(s);
	if (s->nsentinels > 0) {
		rc = redis_resolve_master(s);
		if (rc < 0)
			return rc;
	}
	s->c = redisConnectWithTimeout(s->host, s->port, tv_of(s->timeout_ms));
	if (s->c == NULL) {
		s->h->log(s->h, TE_LOG_ERROR, "redis %s: out of memory connecting", s->conn);
		return -ENOMEM;
	}
	if (s->c->err) {
		rc = redis_errno_of_ctx(s->c);
		/* Retried with backoff (a fail-over, a restart): limited. */
		TE_HOST_LOG_LIMITED(s->h, TE_LOG_ERROR, "redis %s: cannot connect to %s:%d: %s", s->conn, s->host,
				    s->port, s->c->errstr);
		redis_drop(s);
		return rc;
	}
	redis_bound_replies(s->c);
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
		r = redis_command(s, argc, argv, lens);
		if (r == NULL) {
			rc = redis_errno_of_ctx(s->c);
			s->h->log(s->h, TE_LOG_ERROR, "redis %s: AUTH failed: %s", s->conn, s->c->errstr);
			redis_drop(s);
			return rc;
		}
		if (r->type == REDIS_REPLY_ERROR) {
			/* The reply never contains the password; it is safe to log. */
			s->h->log(s->h, TE_LOG_ERROR, "redis %s: authentication failed%s%s: %s", s->conn,
				  s->user ? " for user " : "", s->user ? s->user : "", r->str);
			freeReplyObject(r);
			redis_drop(s);
			return -EACCES;
		}
		freeReplyObject(r);
	}
	if (s->db != 0) {
		char dbs[16];
		g_snprintf(dbs, sizeof dbs, "%d", s->db);
		const char *argv[2] = { "SELECT", dbs };
		size_t lens[2] = { 6, strlen(dbs) };
		r = redis_command(s, 2, argv, lens);
		if (r == NULL || r->type == REDIS_REPLY_ERROR) {
			rc = r ? (strncmp(r->str, "NOAUTH", 6) == 0 ? -EACCES : -EINVAL) : redis_errno_of_ctx(s->c);
			s->h->log(s->h, TE_LOG_ERROR, "redis %s: SELECT %d failed: %s%s", s->conn, s->db,
				  r ? r->str : s->c->errstr,
				  r && rc == -EACCES ? " (set a password: TE_REDIS_PASSWORD)" : "");
			if (r)
				freeReplyObject(r);
			redis_drop(s);
			return rc;
		}
		freeReplyObject(r);
	}
	if (s->nsentinels > 0) {
		rc = redis_check_master(s);
		if (rc < 0) {
			redis_drop(s);
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
redisReply *redis_run(rstore *s, const char *what, const char *key, int argc, const char **argv,
		       const size_t *lens, int *rc)
{
	redisReply *r = NULL;
	pipe_guard g;
	gint64 deadline = g_get_monotonic_time() + (gint64)s->timeout_ms * 1000;

	redis_pipe_block(&g);
	g_mutex_lock(&s->lock);
	for (int attempt = 0, tries = 0;; attempt++) {
		bool fresh = false;
		if (s->c == NULL) {
			*rc = redis_connect(s);
			if (*rc < 0) {
				if (transient(*rc) && back_off(s, tries++, deadline))
					continue;
				break;
			}
			fresh = true;
		}
		r = redis_command(s, argc, argv, lens);
		if (r == NULL) {
			*rc = redis_errno_of_ctx(s->c);
			bool quiet = !fresh && attempt == 0 && *rc != -ETIMEDOUT;
			s->h->log(s->h, quiet ? TE_LOG_WARN : TE_LOG_ERROR, "redis %s: %s '%s': %s%s", s->conn, what, key,
				  s->c->errstr, *rc == -ETIMEDOUT ? " (timed out)" : "");
			redis_drop(s);
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
				redis_drop(s); /* (the reply stays readable) */
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
	redis_pipe_restore(&g);
	return r;
}
