/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A background thread that wakes up periodically to keep something alive
 * (an etcd lease, the expiry of redis keys) and stops promptly when asked.
 * Header-only: each plugin compiles it in.
 */
#ifndef TE_KEEPER_H
#define TE_KEEPER_H

#include <stdbool.h>
#include <stdint.h>

#include <glib.h>

typedef struct te_keeper {
	GThread *thread;
	GMutex lock;
	GCond cond;
	bool stopping;
} te_keeper;

static inline void te_keeper_init(te_keeper *k)
{
	k->thread = NULL;
	k->stopping = false;
	g_mutex_init(&k->lock);
	g_cond_init(&k->cond);
}

/* Starts `fn(data)` once; true when the thread runs. */
static inline bool te_keeper_start(te_keeper *k, const char *name, GThreadFunc fn, gpointer data)
{
	if (k->thread == NULL)
		k->thread = g_thread_try_new(name, fn, data, NULL);
	return k->thread != NULL;
}

/* For the thread: sleeps `ms` milliseconds; false once asked to stop. */
static inline bool te_keeper_sleep(te_keeper *k, int64_t ms)
{
	gint64 until = g_get_monotonic_time() + ms * 1000;

	g_mutex_lock(&k->lock);
	while (!k->stopping)
		if (!g_cond_wait_until(&k->cond, &k->lock, until))
			break;
	bool go_on = !k->stopping;
	g_mutex_unlock(&k->lock);
	return go_on;
}

/* Stops and joins the thread (if it was started), then frees the rest. */
static inline void te_keeper_clear(te_keeper *k)
{
	if (k->thread != NULL) {
		g_mutex_lock(&k->lock);
		k->stopping = true;
		g_cond_signal(&k->cond);
		g_mutex_unlock(&k->lock);
		g_thread_join(k->thread);
		k->thread = NULL;
	}
	g_mutex_clear(&k->lock);
	g_cond_clear(&k->cond);
}

#endif
