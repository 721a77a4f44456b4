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

#define SHARDS TE_MSHARDS
#define LINE TE_MLINE
#define LAT_BOUNDS TE_MLAT_BOUNDS
#define LAT_BUCKETS TE_MLAT_BUCKETS
typedef te_mcounter counter;
typedef te_mop mop;
typedef te_mshard mshard;
typedef te_pshard pshard;

typedef struct dshard {
	alignas(LINE) counter bytes, inflight_bytes, retries, failovers, errors;
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
	uint64_t other[3][2]; /* what peer="other" shows: bytes, requests, failed */
	te_metric_dev **devs;
	unsigned n_devs, max_devs;
	counter notify_sent, notify_received;
	counter reg_bytes, reg_regions; /* gauges, by two's complement */
	counter rpc[TE_MRPC_KINDS][2];
	counter auth_refused;
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

typedef struct op_snap {
	uint64_t requests, bytes, completed, failed, canceled, in_flight, in_flight_bytes, lat_sum_ns;
	uint64_t lat[LAT_BUCKETS];
} op_snap;

typedef struct tp_snap {
	char *transport;
	op_snap op[2];
	uint64_t retries, failovers, errors;
} tp_snap;

typedef struct peer_snap {
	char *name;
	uint64_t bytes[2], requests[2], failed[2];
} peer_snap;

typedef struct dev_snap {
	char *transport, *name;
	uint64_t bytes, inflight_bytes, retries, failovers, errors;
	double bw;
} dev_snap;

typedef struct snap {
	char *segment;
	GArray *tps;   /* tp_snap */
	GArray *peers; /* peer_snap, "other" last */
	GArray *devs;  /* dev_snap */
	uint64_t notify_sent, notify_received, reg_bytes, reg_regions, auth_refused;
	uint64_t rpc[TE_MRPC_KINDS][2];
} snap;

/* Under m->lock: reads every counter of `m` (advancing the peers' ranking
 * and the devices' averages); strings point into `m`. */
void te_msnap_take(te_metrics *m, snap *sn);
void te_msnap_clear(snap *sn);

extern const char *const te_mop_names[2];
extern const char *const te_mrpc_names[TE_MRPC_KINDS];
/* GLib allocates with malloc(): what it returns te_free() can release. */
char *te_mas_malloced(char *g, size_t len);

#endif /* TE_METRICS_BUILD */
#endif
