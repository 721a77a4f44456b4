/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The provider of the tests' copy of the RDMA plugin, in place of the
 * shipped plugin's rdma-provider.c: the software verbs layer over a sysfs fixture
 * tree when TE_RDMA_SOFT is set (engine option or environment), libibverbs
 * otherwise (the tests on real devices, tests/rdma-qemu). It also keeps the
 * instances by engine name for te_rdma_get_stats(). This file and
 * soft-verbs.c are built into this folder's plugin only, never installed.
 */
#include <string.h>

#include "rdma.h"
#include "rdma-test.h"
#include "soft-verbs.h"

#define RD_TEST_EXPORT __attribute__((visibility("default")))

static GMutex registry_lock;
static GList *registry;

void rd_provider_get(const te_host *h, rd_provider *out)
{
	const char *soft = h->config(h, "TE_RDMA_SOFT", NULL);
	const char *root = h->config(h, "TE_RDMA_SYSFS_ROOT", NULL);

	out->verbs = soft != NULL && *soft != '\0' && strcmp(soft, "0") != 0 ? rv_verbs_soft()
									      : rv_verbs_ibverbs();
	out->sysfs_root = root != NULL && *root != '\0' ? root : "/";
}

void rd_provider_track(rd_transport *tr, bool up)
{
	g_mutex_lock(&registry_lock);
	registry = up ? g_list_prepend(registry, tr) : g_list_remove(registry, tr);
	g_mutex_unlock(&registry_lock);
}

RD_TEST_EXPORT int te_rdma_get_stats(const char *engine, te_rdma_stats *out);

int te_rdma_get_stats(const char *engine, te_rdma_stats *out)
{
	int rc = -ENOENT;

	if (engine == NULL || out == NULL)
		return -EINVAL;
	memset(out, 0, sizeof *out);
	g_mutex_lock(&registry_lock);
	for (GList *l = registry; l != NULL; l = l->next) {
		rd_transport *tr = l->data;
		if (strcmp(tr->local_name, engine) != 0)
			continue;
		out->n_devices = MIN(tr->nctx, TE_RDMA_STATS_MAX_DEV);
		for (int i = 0; i < out->n_devices; i++) {
			rd_ctx *c = tr->ctx[i];
			g_strlcpy(out->device[i], c->name, sizeof out->device[i]);
			out->slices[i] = atomic_load(&c->slices_done);
			out->active[i] = atomic_load(&c->active);
			out->endpoints[i] = rd_ep_count(c);
			out->revivals[i] = atomic_load(&c->revivals);
		}
		rd_counters *s = &tr->stats;
		out->endpoints_created = atomic_load(&s->created);
		out->endpoints_evicted = atomic_load(&s->evicted);
		out->endpoints_reclaimed = atomic_load(&s->reclaimed);
		out->endpoints_failed = atomic_load(&s->failed);
		out->slice_retries = atomic_load(&s->retries);
		out->pair_pauses = atomic_load(&s->pauses);
		out->handshakes_rejected = atomic_load(&s->rejected);
		g_mutex_lock(&s->lock);
		out->n_evicted = MIN(s->n_evicted, TE_RDMA_STATS_EVICTIONS);
		for (unsigned i = 0; i < out->n_evicted; i++)
			g_strlcpy(out->evicted[i], s->evicted_paths[i], sizeof out->evicted[i]);
		g_mutex_unlock(&s->lock);
		rc = 0;
		break;
	}
	g_mutex_unlock(&registry_lock);
	return rc;
}
