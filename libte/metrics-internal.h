/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private to the metrics files: the counters' tables (metrics.c) and the
 * snapshot a reading takes of them (metrics-snap.c), which the JSON form
 * (metrics-json.c) and the text exposition (metrics-text.c) print.
 */
#ifndef TE_METRICS_INTERNAL_H
#define TE_METRICS_INTERNAL_H

#include <glib.h>
#include <stdalign.h>
#include <stdint.h>

#include "metrics.h"

#if TE_METRICS_BUILD

#define TE_MFIELD_ENGINE(id) te_mcounter id;

#define SHARDS TE_MSHARDS
#define LINE TE_MLINE
#define LAT_BOUNDS TE_MLAT_BOUNDS
#define LAT_BUCKETS TE_MLAT_BUCKETS
typedef te_mcounter counter;
typedef te_mop mop;
typedef te_mshard mshard;
typedef te_pshard pshard;

/* A device's counters in one shard: the DEV rows (DEVF ones are derived
 * at reading). */
#define TE_MFIELD_DEV(id) te_mcounter id;
#define TE_MFIELD_DEVF(id)
typedef struct dshard {
	alignas(LINE) struct {
		TE_MTABLE_DEV(TE_MFIELD)
	};
} dshard;

struct te_metric_dev {
	char *transport;
	char *name;
	dshard *shards;
	/* The moving average, advanced by readers under the engine's lock. */
	uint64_t last_bytes;
	uint64_t last_ns;
	double bw;
};

struct te_metrics {
	GMutex lock; /* the tables below and the averages; never on the data path */
	char *segment;
	te_mblock *local;
	GPtrArray *blocks; /* te_mblock*, the local one first */
	GHashTable *peers; /* name → te_mpeer*, every tracked one */
	GPtrArray *peer_recs; /* the same, in the order they were first seen */
	GPtrArray *shown; /* those with series of their own, at most max_peers */
	unsigned max_peers, max_names, n_wide, max_wide;
	te_mpeer *untracked; /* every name past max_names */
	uint64_t other[TE_MPEER_FIELDS][2]; /* what peer="other" shows, by PEER row */
	te_metric_dev **devs;
	unsigned n_devs, max_devs;
	/* The ENGINE rows (gauges by two's complement), and RPC's. */
	TE_MTABLE_ENGINE(TE_MFIELD)
	counter rpc[TE_MRPC_KINDS][TE_MRPC_RESULTS];
};


/* Every engine that counts, for te_metrics_text(NULL) (metrics.c). */
extern GMutex te_mengines_lock;
extern GPtrArray *te_mengines; /* te_metrics* */

static inline uint64_t get(const counter *c)
{
	return atomic_load_explicit((counter *)c, memory_order_relaxed);
}

/* metrics.c: zeroed shards of `each` bytes, TE_MSHARDS of them. */
void *te_mshards_new(size_t each);
/* metrics.c: under m->lock, the peer gets a series of its own. */
void te_mpeer_show(te_metrics *m, te_mpeer *p);

/* ------------------------------------------------ snapshots (metrics-snap.c) */

/* A row's field in a snapshot, by its scope. */
#define TE_MSNAP(scope, id, kind, prom, json, stats, help) TE_MSNAP_##scope(id)
#define TE_MSNAP_OP(id) uint64_t id;
#define TE_MSNAP_OPG(id) uint64_t id;
#define TE_MSNAP_PEER(id) uint64_t id[2];
#define TE_MSNAP_DEV(id) uint64_t id;
#define TE_MSNAP_DEVF(id) double id;
#define TE_MSNAP_TP(id) uint64_t id;
#define TE_MSNAP_ENGINE(id) uint64_t id;

typedef struct op_snap {
	TE_MTABLE_OP(TE_MSNAP)
	TE_MTABLE_OPG(TE_MSNAP)
	uint64_t lat_sum_ns;
	uint64_t lat[LAT_BUCKETS];
} op_snap;

typedef struct tp_snap {
	char *transport;
	op_snap op[2];
	TE_MTABLE_TP(TE_MSNAP)
} tp_snap;

typedef struct peer_snap {
	char *name;
	TE_MTABLE_PEER(TE_MSNAP)
} peer_snap;

typedef struct dev_snap {
	char *transport, *name;
	TE_MTABLE_DEV(TE_MSNAP)
} dev_snap;

typedef struct snap {
	char *segment;
	GArray *tps;   /* tp_snap */
	GArray *peers; /* peer_snap, "other" last */
	GArray *devs;  /* dev_snap */
	TE_MTABLE_ENGINE(TE_MSNAP)
	uint64_t rpc[TE_MRPC_KINDS][TE_MRPC_RESULTS];
} snap;

/* Under m->lock: reads every counter of `m` (advancing the peers' ranking
 * and the devices' averages); strings point into `m`. */
void te_msnap_take(te_metrics *m, snap *sn);
void te_msnap_clear(snap *sn);

extern const char *const te_mop_names[2];
extern const char *const te_mrpc_names[TE_MRPC_KINDS];

#endif /* TE_METRICS_BUILD */
#endif
