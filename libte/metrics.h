/* SPDX-License-Identifier: Apache-2.0 */
/* Private to libte: the counters behind te_engine_stats() and
 * te_metrics_text() (docs/metrics.md). */
#ifndef TE_METRICS_H
#define TE_METRICS_H

#include "internal.h"

#ifndef TE_METRICS_BUILD
#define TE_METRICS_BUILD 1
#endif

/* RPC frame kinds as the counters see them: the four of the protocol, then
 * whatever else a peer sent. */
#define TE_MRPC_UNKNOWN 4
#define TE_MRPC_KINDS 5

#if TE_METRICS_BUILD

/* Created with the engine (NULL when TE_METRICS=0) and freed with it. */
te_metrics *te_metrics_new(te_engine *e);
void te_metrics_free(te_metrics *m);
/* The engine's name became known (the `segment` label). */
void te_metrics_named(te_metrics *m, const char *name);
/* The counters of a transport, by its name: one block for the engine's
 * life, so a transport installed again continues its series. */
te_mblock *te_metrics_block(te_metrics *m, const char *transport);
/* The peer counters a segment counts into: its own while there is room
 * among the exposed peers, else the shared "other" ones. */
te_mpeer *te_metrics_peer(te_metrics *m, const char *name);

/* The data path: a task handed over (counted once), a task ended (counts
 * it as handed over first when it never was). */
void te_metrics_task_start(te_metrics *m, te_task *t);
void te_metrics_task_end(te_metrics *m, te_task *t, int state);
uint64_t te_metrics_now_ns(void);

void te_metrics_add(_Atomic uint64_t *c, int64_t delta);
_Atomic uint64_t *te_metrics_counter_notify(te_metrics *m, bool received);
_Atomic uint64_t *te_metrics_counter_memory(te_metrics *m, bool regions);
_Atomic uint64_t *te_metrics_counter_rpc(te_metrics *m, int kind, bool refused);
_Atomic uint64_t *te_metrics_counter_auth(te_metrics *m);

/* te_host's metric_device / metric_add / metrics_text. */
te_metric_dev *te_metrics_device(te_metrics *m, const char *transport, const char *name);
void te_metrics_dev_add(te_metrics *m, te_mblock *tp, te_metric_dev *dev, int what, int64_t delta);

static inline void te_metric_count_notify(te_engine *e, bool received)
{
	if (e != NULL && e->metrics != NULL)
		te_metrics_add(te_metrics_counter_notify(e->metrics, received), 1);
}
static inline void te_metric_count_memory(te_engine *e, int64_t bytes, int64_t regions)
{
	if (e != NULL && e->metrics != NULL) {
		te_metrics_add(te_metrics_counter_memory(e->metrics, false), bytes);
		te_metrics_add(te_metrics_counter_memory(e->metrics, true), regions);
	}
}
static inline void te_metric_count_rpc(te_engine *e, int kind, bool refused)
{
	if (e != NULL && e->metrics != NULL)
		te_metrics_add(te_metrics_counter_rpc(e->metrics, kind, refused), 1);
}
static inline void te_metric_count_auth(te_engine *e)
{
	if (e != NULL && e->metrics != NULL)
		te_metrics_add(te_metrics_counter_auth(e->metrics), 1);
}

#else /* counting compiled out (-Dmetrics=false) */

static inline te_metrics *te_metrics_new(te_engine *e) { (void)e; return NULL; }
static inline void te_metrics_free(te_metrics *m) { (void)m; }
static inline void te_metrics_named(te_metrics *m, const char *n) { (void)m; (void)n; }
static inline te_mblock *te_metrics_block(te_metrics *m, const char *t) { (void)m; (void)t; return NULL; }
static inline te_mpeer *te_metrics_peer(te_metrics *m, const char *n) { (void)m; (void)n; return NULL; }
static inline void te_metrics_task_start(te_metrics *m, te_task *t) { (void)m; (void)t; }
static inline void te_metrics_task_end(te_metrics *m, te_task *t, int s) { (void)m; (void)t; (void)s; }
static inline uint64_t te_metrics_now_ns(void) { return 0; }
static inline te_metric_dev *te_metrics_device(te_metrics *m, const char *t, const char *n)
{
	(void)m; (void)t; (void)n;
	return NULL;
}
static inline void te_metrics_dev_add(te_metrics *m, te_mblock *tp, te_metric_dev *d, int w, int64_t v)
{
	(void)m; (void)tp; (void)d; (void)w; (void)v;
}
static inline void te_metric_count_notify(te_engine *e, bool r) { (void)e; (void)r; }
static inline void te_metric_count_memory(te_engine *e, int64_t b, int64_t r) { (void)e; (void)b; (void)r; }
static inline void te_metric_count_rpc(te_engine *e, int k, bool r) { (void)e; (void)k; (void)r; }
static inline void te_metric_count_auth(te_engine *e) { (void)e; }

#endif

#endif
