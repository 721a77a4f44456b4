/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reading the counters: a snapshot sums the shards of one engine's blocks,
 * peers and devices under its lock, re-ranks the peers shown one by one and
 * advances the devices' bandwidth averages; te_engine_stats() folds one into
 * a te_stats.
 */
#include <stdlib.h>
#include <string.h>

#include "metrics-internal.h"

#if TE_METRICS_BUILD

#define BW_TAU_NS 1000000000.0 /* the bandwidth average's time constant: 1 s */

/* The labels both printed forms use. */
const char *const te_mop_names[2] = { "read", "write" };
const char *const te_mrpc_names[TE_MRPC_KINDS] = { "Connection", "Metadata", "Notify", "Probe", "unknown" };

static uint64_t gauge(uint64_t raw)
{
	return (int64_t)raw < 0 ? 0 : raw;
}

static uint64_t diff(uint64_t a, uint64_t b)
{
	return a > b ? a - b : 0;
}

/* A stored row's sum as read: gauges clamped at zero. */
#define READ_COUNTER(v) (v)
#define READ_GAUGE(v) gauge(v)
#define READ(kind, v) READ_##kind(v)

/* An OP row of one shard added into the snapshot. */
#define SUM_OP(scope, id, kind, prom, json, stats, help) o->id += get(&x->id);

static void read_block(const te_mblock *b, tp_snap *out)
{
	memset(out, 0, sizeof *out);
	out->transport = b->transport;
	for (unsigned op = 0; op < 2; op++) {
		op_snap *o = &out->op[op];
		uint64_t req_bytes = 0, unmoved = 0;
		for (unsigned s = 0; s < SHARDS; s++) {
			const mop *x = &b->shards[s].op[op];
			TE_MTABLE_OP(SUM_OP)
			req_bytes += get(&x->req_bytes);
			unmoved += get(&x->unmoved);
			o->lat_sum_ns += get(&x->lat_sum);
			for (unsigned k = 0; k < LAT_BUCKETS; k++)
				o->lat[k] += get(&x->lat[k]);
		}
		o->lat_sum_ns = (uint64_t)((double)o->lat_sum_ns * te_mclock_ns_per_tick);
		o->in_flight = diff(o->requests, o->completed + o->failed + o->canceled);
		o->in_flight_bytes = diff(req_bytes, o->bytes + unmoved);
	}
#define GET_TP(scope, id, kind, prom, json, stats, help) out->id = READ(kind, get(&b->id));
	TE_MTABLE_TP(GET_TP)
}

/* ---------------------------------------------------------------- peers */
/*
 * The shown set is re-ranked at each reading (docs/metrics.md, "Peers"):
 *  - each record's counts since the previous reading go to its own series
 *    when it was shown during the interval, else to "other"; a series only
 *    ever adds, so every exported counter is monotonic;
 *  - then the tracked peers with the most bytes (both operations, since
 *    first seen) make the new set; on a tie the one shown stays, then the
 *    one seen first. A peer that leaves the set keeps its series' values
 *    (not exported meanwhile) and continues them if it comes back; its
 *    traffic in between goes to "other".
 * Under m->lock; the data path never waits for it.
 */
static void peer_raw(te_mpeer *p, uint64_t raw[TE_MPEER_FIELDS][2])
{
	te_pshard *w = atomic_load_explicit(&p->wide, memory_order_acquire);

#define PEER_NARROW(scope, id, kind, prom, json, stats, help) raw[TE_MPEER_##id][op] = get(&p->narrow.id[op]);
#define PEER_WIDE(scope, id, kind, prom, json, stats, help) raw[TE_MPEER_##id][op] += get(&w[s].id[op]);
	for (unsigned op = 0; op < 2; op++) {
		TE_MTABLE_PEER(PEER_NARROW)
		for (unsigned s = 0; w != NULL && s < SHARDS; s++) {
			TE_MTABLE_PEER(PEER_WIDE)
		}
	}
}

static void peer_advance(te_metrics *m, te_mpeer *p)
{
	uint64_t raw[TE_MPEER_FIELDS][2];

	peer_raw(p, raw);
	for (unsigned f = 0; f < TE_MPEER_FIELDS; f++)
		for (unsigned op = 0; op < 2; op++) {
			uint64_t d = diff(raw[f][op], p->seen[f][op]);
			p->seen[f][op] += d;
			if (p->is_shown)
				p->shown[f][op] += d;
			else
				m->other[f][op] += d;
		}
	p->rank_bytes = p->seen[TE_MPEER_bytes][0] + p->seen[TE_MPEER_bytes][1];
}

/* Busier first; on a tie the shown one, then the one seen first. */
static int peer_rank_cmp(const void *a, const void *b)
{
	const te_mpeer *x = *(te_mpeer *const *)a, *y = *(te_mpeer *const *)b;

	if (x->rank_bytes != y->rank_bytes)
		return x->rank_bytes > y->rank_bytes ? -1 : 1;
	if (x->is_shown != y->is_shown)
		return x->is_shown ? -1 : 1;
	return x->order < y->order ? -1 : x->order > y->order;
}

static void peers_rank(te_metrics *m)
{
	GPtrArray *r = m->peer_recs;
	uint64_t least = UINT64_MAX;
	bool change = false;

	if (m->shown->len < m->max_peers || r->len <= m->shown->len)
		return; /* every tracked name is shown already */
	for (guint i = 0; i < m->shown->len; i++) {
		const te_mpeer *p = g_ptr_array_index(m->shown, i);
		if (p->rank_bytes < least)
			least = p->rank_bytes;
	}
	for (guint i = 0; i < r->len && !change; i++) {
		const te_mpeer *p = g_ptr_array_index(r, i);
		change = !p->is_shown && p->rank_bytes > least;
	}
	if (!change)
		return;
	te_mpeer **v = g_new(te_mpeer *, r->len);
	memcpy(v, r->pdata, sizeof *v * r->len);
	qsort(v, r->len, sizeof *v, peer_rank_cmp);
	/* Those staying keep their place in the exposition; newcomers follow. */
	GPtrArray *old = m->shown;
	m->shown = g_ptr_array_sized_new(m->max_peers);
	for (guint i = m->max_peers; i < r->len; i++)
		v[i]->is_shown = false;
	for (guint i = 0; i < old->len; i++) {
		te_mpeer *p = g_ptr_array_index(old, i);
		if (p->is_shown)
			g_ptr_array_add(m->shown, p);
	}
	for (guint i = 0; i < m->max_peers; i++)
		if (!v[i]->is_shown)
			te_mpeer_show(m, v[i]);
	g_ptr_array_unref(old);
	g_free(v);
}

static void peers_update(te_metrics *m)
{
	for (guint i = 0; i < m->peer_recs->len; i++)
		peer_advance(m, g_ptr_array_index(m->peer_recs, i));
	peer_advance(m, m->untracked);
	peers_rank(m);
}

static void peer_snap_of(const char *name, const uint64_t v[TE_MPEER_FIELDS][2], peer_snap *out)
{
	out->name = (char *)name;
#define PEER_SNAP(scope, id, kind, prom, json, stats, help) out->id[op] = v[TE_MPEER_##id][op];
	for (unsigned op = 0; op < 2; op++) {
		TE_MTABLE_PEER(PEER_SNAP)
	}
}

/* Under m->lock: advances the device's average with the bytes since the
 * last reading, weighted dt / (τ + dt), τ = 1 s. */
static void read_dev(te_metric_dev *d, uint64_t now, dev_snap *out)
{
	memset(out, 0, sizeof *out);
	out->transport = d->transport;
	out->name = d->name;
#define DEV_SUM(scope, id, kind, prom, json, stats, help) DEV_SUM_##scope(id)
#define DEV_SUM_DEV(id) out->id += get(&d->shards[s].id);
#define DEV_SUM_DEVF(id)
#define DEV_READ(scope, id, kind, prom, json, stats, help) DEV_READ_##scope(id, kind)
#define DEV_READ_DEV(id, kind) out->id = READ(kind, out->id);
#define DEV_READ_DEVF(id, kind)
	for (unsigned s = 0; s < SHARDS; s++) {
		TE_MTABLE_DEV(DEV_SUM)
	}
	TE_MTABLE_DEV(DEV_READ)
	if (d->last_ns != 0 && now > d->last_ns) {
		double dt = (double)(now - d->last_ns);
		double rate = (double)diff(out->bytes, d->last_bytes) * 1e9 / dt;
		d->bw += (rate - d->bw) * dt / (BW_TAU_NS + dt);
	}
	if (d->last_ns == 0 || now > d->last_ns) {
		d->last_ns = now;
		d->last_bytes = out->bytes;
	}
	out->bw = d->bw;
}

/* Strings in a snapshot point into `m`: used under m->lock only. */
void te_msnap_take(te_metrics *m, snap *sn)
{
	uint64_t now = te_metrics_mono_ns();

	memset(sn, 0, sizeof *sn);
	sn->segment = m->segment;
	sn->tps = g_array_sized_new(FALSE, FALSE, sizeof(tp_snap), m->blocks->len);
	for (guint i = 0; i < m->blocks->len; i++) {
		tp_snap t;
		read_block(g_ptr_array_index(m->blocks, i), &t);
		g_array_append_val(sn->tps, t);
	}
	peers_update(m);
	sn->peers = g_array_sized_new(FALSE, FALSE, sizeof(peer_snap), m->shown->len + 1);
	for (guint i = 0; i < m->shown->len; i++) {
		const te_mpeer *x = g_ptr_array_index(m->shown, i);
		peer_snap p;
		peer_snap_of(x->name, (const uint64_t(*)[2])x->shown, &p);
		g_array_append_val(sn->peers, p);
	}
	peer_snap other;
	peer_snap_of(NULL, (const uint64_t(*)[2])m->other, &other);
	g_array_append_val(sn->peers, other);
	sn->devs = g_array_sized_new(FALSE, FALSE, sizeof(dev_snap), m->n_devs);
	for (unsigned i = 0; i < m->n_devs; i++) {
		dev_snap d;
		read_dev(m->devs[i], now, &d);
		g_array_append_val(sn->devs, d);
	}
#define GET_ENGINE(scope, id, kind, prom, json, stats, help) sn->id = READ(kind, get(&m->id));
	TE_MTABLE_ENGINE(GET_ENGINE)
	for (unsigned k = 0; k < TE_MRPC_KINDS; k++)
		for (unsigned r = 0; r < TE_MRPC_RESULTS; r++)
			sn->rpc[k][r] = get(&m->rpc[k][r]);
}

void te_msnap_clear(snap *sn)
{
	g_array_unref(sn->tps);
	g_array_unref(sn->peers);
	g_array_unref(sn->devs);
}

/* ------------------------------------------------------------ te_stats */

int te_engine_stats(te_engine *e, te_stats *out)
{
	if (e == NULL || out == NULL || out->size < offsetof(te_stats, requests)) {
		te_err("te_engine_stats: NULL engine or output, or an output size below %zu",
		       offsetof(te_stats, requests));
		return -EINVAL;
	}
	if (e->metrics == NULL)
		return -ENOTSUP;
	te_metrics *m = e->metrics;
	te_stats st = { 0 };
	snap sn;

	/* Rows not in te_stats add into `none`. */
	uint64_t none[2] = { 0, 0 };
#define STAT_TE_MS_(f) st.f
#define STAT_TE_MS_NONE none[0]
#define STATA_TE_MS_(f) st.f
#define STATA_TE_MS_NONE none
#define STAT(stats) STAT_##stats
#define STATA(stats) STATA_##stats
#define FOLD_OP(scope, id, kind, prom, json, stats, help) STATA(stats)[op] += t->op[op].id;
#define FOLD_OPG(scope, id, kind, prom, json, stats, help) STAT(stats) += t->op[op].id;
#define FOLD_TP(scope, id, kind, prom, json, stats, help) STAT(stats) += t->id;
#define FOLD_TP_DEV(scope, id, kind, prom, json, stats, help) STAT(stats) += d->id;
#define FOLD_ENGINE(scope, id, kind, prom, json, stats, help) STAT(stats) = sn.id;
#define FOLD_RPC(id, stats) STAT(stats) += sn.rpc[k][TE_MRPC_##id];

	g_mutex_lock(&m->lock);
	te_msnap_take(m, &sn);
	for (guint i = 0; i < sn.tps->len; i++) {
		const tp_snap *t = &g_array_index(sn.tps, tp_snap, i);
		for (unsigned op = 0; op < 2; op++) {
			TE_MTABLE_OP(FOLD_OP)
			TE_MTABLE_OPG(FOLD_OPG)
		}
		TE_MTABLE_TP(FOLD_TP)
	}
	for (guint i = 0; i < sn.devs->len; i++) {
		const dev_snap *d = &g_array_index(sn.devs, dev_snap, i);
		TE_MTABLE_TP(FOLD_TP_DEV)
	}
	TE_MTABLE_ENGINE(FOLD_ENGINE)
	for (unsigned k = 0; k < TE_MRPC_KINDS; k++) {
		TE_MTABLE_RPC_RESULTS(FOLD_RPC)
	}
	(void)none;
	te_msnap_clear(&sn);
	g_mutex_unlock(&m->lock);

	/* Whole fields only, up to what the caller's struct holds. */
	size_t n = out->size < sizeof st ? out->size : sizeof st;
	n -= n % sizeof(uint64_t);
	memcpy((char *)out + offsetof(te_stats, requests), (char *)&st + offsetof(te_stats, requests),
	       n - offsetof(te_stats, requests));
	return 0;
}

#else /* counting compiled out */

int te_engine_stats(te_engine *e, te_stats *out)
{
	(void)e;
	(void)out;
	return -ENOTSUP;
}

#endif
