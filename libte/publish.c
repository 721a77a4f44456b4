/* SPDX-License-Identifier: Apache-2.0 */
/* Publishing the engine's descriptor and RPC address to the metadata store
 * (publish.h): what registration, transports and the engine's start ask for. */
#include <string.h>

#include "internal.h"

static int publish_rpc_meta(te_engine *e)
{
	char key[TE_MAX_NAME + 64];
	int rc = te_metadata_rpc_key(e->name, key, sizeof key);

	if (rc < 0 || (size_t)rc >= sizeof key)
		return -ENAMETOOLONG;
	/* {"ip_or_host_name": ..., "rpc_port": ...}, keys sorted */
	char *esc = g_strescape(e->address, NULL);
	char *val = g_strdup_printf("{\"ip_or_host_name\":\"%s\",\"rpc_port\":%d}", esc, e->rpc_port);
	g_free(esc);
	rc = te_metadata_put_flags(e->md, key, val, strlen(val), TE_META_OWNED);
	g_free(val);
	return rc;
}

/* The engine te_engine_create() is installing the transports of on this
 * thread: its descriptor goes to the store once, when they are all in, not
 * once per transport (one put per key for an engine's start). */
static _Thread_local te_engine *creating;

void te_publish_defer(te_engine *e)
{
	creating = e;
}

/* Called with ctl held. */
int te_engine_publish(te_engine *e)
{
	char *desc = te_engine_encode_descriptor(e);
	char key[TE_MAX_NAME + 64];
	int rc = 0;

	g_mutex_lock(&e->desc_lock);
	g_free(e->desc_cache);
	e->desc_cache = g_strdup(desc);
	g_mutex_unlock(&e->desc_lock);
	if (!e->md->p2p && creating != e) {
		rc = te_metadata_segment_key(e->name, key, sizeof key);
		if (rc >= 0 && (size_t)rc < sizeof key)
			rc = te_metadata_put_flags(e->md, key, desc, strlen(desc), TE_META_OWNED);
		else
			rc = -ENAMETOOLONG;
		if (rc == 0 && !e->published)
			rc = publish_rpc_meta(e);
		if (rc == 0)
			e->published = true;
	}
	g_free(desc);
	return rc < 0 ? rc : 0;
}

static void publish_job(gpointer data, gpointer user)
{
	te_engine *e = user;

	(void)data;
	/* Cleared first: an ask that comes while this one publishes gets a
	 * publication of its own. */
	atomic_store(&e->publish_queued, false);
	g_rec_mutex_lock(&e->ctl);
	if (!atomic_load(&e->closing)) {
		int rc = te_engine_publish(e);
		if (rc < 0)
			te_warn("publishing the descriptor a transport changed failed: %s", te_strerror(rc));
	}
	g_rec_mutex_unlock(&e->ctl);
}

GThreadPool *te_publish_pool_new(te_engine *e)
{
	return g_thread_pool_new(publish_job, e, 1, FALSE, NULL);
}

void te_engine_publish_later(te_engine *e)
{
	if (e->publish_pool == NULL || atomic_exchange(&e->publish_queued, true))
		return;
	g_thread_pool_push(e->publish_pool, GINT_TO_POINTER(1), NULL);
}

void te_engine_unpublish(te_engine *e)
{
	char key[TE_MAX_NAME + 64];
	int rc;

	if (e->md == NULL || e->md->p2p || !e->published)
		return;
	rc = te_metadata_segment_key(e->name, key, sizeof key);
	if (rc > 0 && (size_t)rc < sizeof key)
		te_metadata_remove(e->md, key);
	rc = te_metadata_rpc_key(e->name, key, sizeof key);
	if (rc > 0 && (size_t)rc < sizeof key)
		te_metadata_remove(e->md, key);
	e->published = false;
}

/* The registry's hook (te_memreg.publish): at once, or soon on the
 * engine's own thread. */
int te_engine_publish_mem(te_engine *e, bool later)
{
	if (!later)
		return te_engine_publish(e);
	te_engine_publish_later(e);
	return 0;
}
