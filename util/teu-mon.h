/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A monitor: a lock and the condition its waiters sleep on, kept, made and
 * cleared together, and woken the one safe way (the waker takes the lock, so
 * a waiter between its check and its wait cannot miss the wake-up). Header
 * only, on GLib.
 */
#ifndef TEU_MON_H
#define TEU_MON_H

#include <glib.h>

typedef struct teu_mon {
	GMutex lock;
	GCond cond;
} teu_mon;

static inline void teu_mon_init(teu_mon *m)
{
	g_mutex_init(&m->lock);
	g_cond_init(&m->cond);
}

static inline void teu_mon_clear(teu_mon *m)
{
	g_mutex_clear(&m->lock);
	g_cond_clear(&m->cond);
}

/* Wakes every waiter. */
static inline void teu_mon_broadcast(teu_mon *m)
{
	g_mutex_lock(&m->lock);
	g_cond_broadcast(&m->cond);
	g_mutex_unlock(&m->lock);
}

#endif
