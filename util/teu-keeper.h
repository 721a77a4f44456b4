/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A background thread that wakes up periodically to keep something alive
 * (an etcd lease, the expiry of redis keys) and stops promptly when asked.
 */
#ifndef TEU_KEEPER_H
#define TEU_KEEPER_H

#include <stdbool.h>
#include <stdint.h>

#include <glib.h>

typedef struct teu_keeper {
	GThread *thread;
	GMutex lock;
	GCond cond;
	bool stopping;
} teu_keeper;

void teu_keeper_init(teu_keeper *k);

/* Starts `fn(data)` once; true when the thread runs. */
bool teu_keeper_start(teu_keeper *k, const char *name, GThreadFunc fn, gpointer data);

/* For the thread: sleeps `ms` milliseconds; false once asked to stop. */
bool teu_keeper_sleep(teu_keeper *k, int64_t ms);

/* Stops and joins the thread (if it was started), then frees the rest. */
void teu_keeper_clear(teu_keeper *k);

#endif
