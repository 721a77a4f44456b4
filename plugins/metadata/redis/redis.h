/* SPDX-License-Identifier: Apache-2.0 */
/* Private to the redis metadata plugin: the store handle and what its files
 * (redis-plugin.c, redis-conn.c, redis-sentinel.c, redis-kv.c) call of each other. */
#ifndef TE_REDIS_H
#define TE_REDIS_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/time.h>

#include <glib.h>
#include <hiredis/hiredis.h>

#include <te/te-plugin.h>

#include "teu-keeper.h"

#define MAX_SENTINELS 8

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
	teu_keeper keeper;
} rstore;

static inline struct timeval tv_of(int ms)
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

/* redis-conn.c */
void redis_pipe_block(pipe_guard *g);
void redis_pipe_restore(pipe_guard *g);
/* A failed context's error as a negative errno. */
int redis_errno_of_ctx(const redisContext *c);
/* Closes the connection; the next call connects again. */
void redis_drop(rstore *s);
/* Runs a command on the live connection; the reply or NULL (s->c->err set). */
redisReply *redis_command(rstore *s, int argc, const char **argv, const size_t *lens);
/* Bounds the arrays that replies on `c` may announce (a hostile count
 * would have hiredis allocate gigabytes). */
void redis_bound_replies(redisContext *c);
/* Connects (behind sentinels: to the master they name), authenticates and
 * selects the database. With the lock held. */
int redis_connect(rstore *s);
/* One command with reconnection and retries: the reply (never an error
 * reply) or NULL with *rc set. */
redisReply *redis_run(rstore *s, const char *what, const char *key, int argc, const char **argv,
		      const size_t *lens, int *rc);

/* redis-sentinel.c; with the lock held */
/* Where the master is now, from the first sentinel that knows. */
int redis_resolve_master(rstore *s);
/* Whether the server is a master (ROLE); -EAGAIN for a replica. */
int redis_check_master(rstore *s);

/* redis-kv.c */
int redis_get(void *ctx, const char *key, char **value, size_t *len);
int redis_put(void *ctx, const char *key, const char *value, size_t len, unsigned flags);
int redis_remove(void *ctx, const char *key);
int redis_list(void *ctx, const char *prefix, char ***keys, size_t *n);

#endif
