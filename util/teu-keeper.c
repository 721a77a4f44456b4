/* SPDX-License-Identifier: Apache-2.0 */
#include "teu-keeper.h"

void teu_keeper_init(teu_keeper *k)
{
	k->thread = NULL;
	k->stopping = false;
	g_mutex_init(&k->lock);
	g_cond_init(&k->cond);
}

/* Starts `fn(data)` once; true when the thread runs. */
bool teu_keeper_start(teu_keeper *k, const char *name, GThreadFunc fn, gpointer data)
{
	if (k->thread == NULL)
		k->thread = g_thread_try_new(name, fn, data, NULL);
	return k->thread != NULL;
}

/* For the thread: sleeps `ms` milliseconds; false once asked to stop. */
bool teu_keeper_sleep(teu_keeper *k, int64_t ms)
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
void teu_keeper_clear(teu_keeper *k)
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
