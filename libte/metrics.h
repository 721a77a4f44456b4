/* SPDX-License-Identifier: Apache-2.0 */
/* Private to libte: the counters behind te_engine_stats() and
 * te_metrics_text() (docs/metrics.md). */
#ifndef TE_METRICS_H
#define TE_METRICS_H

#include "internal.h"
#include "metrics-table.h"

#ifndef TE_METRICS_BUILD
#define TE_METRICS_BUILD 1
#endif

/* RPC frame kinds as the counters see them: the four of the protocol, then
 * whatever else a peer sent. */
#define TE_MRPC_UNKNOWN 4
#define TE_MRPC_KINDS 5

/* What one te_submit() call counts as handed over, added to the shared
 * counters when the transport or peer changes and once at the end: no
 * atomic operation per task on the way in. */
typedef struct te_msubmit {
	te_mblock *mb;
	te_mpeer *peer;
	uint64_t n[2], bytes[2];
} te_msubmit;

/* Tasks that end inside the te_submit() call that started them (copied by
 * the submitting thread, refused, empty) share one end-time reading, taken
 * as the call returns: a clock reading per task was most of what counting
 * cost where a request takes ~150 ns. Those that complete whole are counted
 * there altogether too (completed, bytes, the peer's bytes): a task then
 * costs a compare and three adds on the stack instead of adds into the
 * shards. Per (transport, peer, op), on te_submit()'s stack. */
#define TE_MLATE_SLOTS 4
typedef struct te_mlate {
	te_metrics *m;
	uint64_t t0;
	unsigned n, last; /* slots taken; the one used last */
	struct {
		te_mblock *mb;
		te_mpeer *peer;
		unsigned op;
		uint64_t done;  /* tasks completed whole, counted only here */
		uint64_t bytes; /* what those moved */
		uint64_t other; /* other tasks whose latency ends with the call */
	} slot[TE_MLATE_SLOTS];
	struct te_mlate *outer;
} te_mlate;

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

#include <stdalign.h>

/* ------------------------------------------------------------ data path */
/* Inline: every task ends through here. */

/* Each thread that counts owns one of TE_MSLOTS shards while it lives and
 * adds to it with plain loads and stores; threads beyond them share the
 * last shard with atomic adds. */
#define TE_MSLOTS 32
#define TE_MSHARDS (TE_MSLOTS + 1)
#define TE_MLINE 64
/* Latency buckets: le 1 µs, 2 µs, … 2^23 µs (8.4 s), then +Inf. */
#define TE_MLAT_BOUNDS 24
#define TE_MLAT_BUCKETS (TE_MLAT_BOUNDS + 1)

typedef _Atomic uint64_t te_mcounter;

/* One operation's counters in one shard. */
/* The storage of a table row (metrics-table.h), by its scope. */
#define TE_MFIELD(scope, id, kind, prom, json, stats, help) TE_MFIELD_##scope(id)
#define TE_MFIELD_OP(id) te_mcounter id;
#define TE_MFIELD_PEER(id) te_mcounter id[2];
#define TE_MFIELD_TP(id) te_mcounter id;

/* One operation's counters in one shard: the OP rows, then what the
 * readings derive the OPG and LAT rows from. */
typedef struct te_mop {
	TE_MTABLE_OP(TE_MFIELD)
	/* unmoved: what ended tasks did not move (length - moved), added only
	 * when not zero: bytes + unmoved is what ended, without a second add
	 * for every task that completed. */
	te_mcounter req_bytes, unmoved;
	te_mcounter lat_sum; /* in clock ticks */
	te_mcounter lat[TE_MLAT_BUCKETS];
} te_mop;

typedef struct te_mshard {
	alignas(TE_MLINE) te_mop op[2];
} te_mshard;

struct te_mblock {
	char *transport;
	te_mshard *shards;
	/* The TP rows, counted by transports through metric_add() with no
	 * device: rare events (a retry, a lost link), one line is enough. */
	TE_MTABLE_TP(TE_MFIELD)
};

/* The PEER rows, per operation. */
typedef struct te_pshard {
	alignas(TE_MLINE) struct {
		TE_MTABLE_PEER(TE_MFIELD)
	};
} te_pshard;

/* A peer segment's counters, one per distinct name (docs/metrics.md,
 * "Peers"). Writers add into `narrow` with atomic adds until a reader that
 * ranks the peer among the busiest gives it sharded counters (`wide`,
 * published once and kept): a busy peer costs plain adds in the thread's
 * own shard, a quiet one a shared line. Readers sum both. The rest is the
 * readers', under the engine's lock. */
struct te_mpeer {
	te_pshard narrow;
	_Atomic(te_pshard *) wide;
	char *name; /* NULL for the shared record of names past the tracked bound */
	uint64_t seen[TE_MPEER_FIELDS][2];  /* the PEER rows at the last reading */
	uint64_t shown[TE_MPEER_FIELDS][2]; /* what the peer's own series shows */
	uint64_t rank_bytes;  /* bytes at the last reading, both operations */
	unsigned order;       /* when it was first seen: ties keep the earlier */
	bool is_shown;
};

/* The line of `p` a count in shard `s` goes to, and the shard index that
 * says how to add there (the shared index: atomically). */
static inline te_pshard *te_mpeer_line(te_mpeer *p, unsigned *s)
{
	te_pshard *w = atomic_load_explicit(&p->wide, memory_order_acquire);

	if (w != NULL)
		return &w[*s];
	*s = TE_MSLOTS;
	return &p->narrow;
}

/* 1 + this thread's shard; 0 before its first count. Initial-exec: a lookup
 * per count must not cost a call. */
extern _Thread_local unsigned te_mshard_tls __attribute__((tls_model("initial-exec")));
unsigned te_mshard_take(void);

static inline unsigned te_mshard_index(void)
{
	unsigned s = te_mshard_tls;

	return s != 0 ? s - 1 : te_mshard_take();
}

/* In the thread's own shard a plain add (no other writer); in the shared
 * one an atomic add. Readers load atomically either way. */
static inline void te_madd(unsigned s, te_mcounter *c, uint64_t v)
{
	if (s < TE_MSLOTS)
		atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v, memory_order_relaxed);
	else
		atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

/* Task latency comes from the TSC where it is invariant (one instruction,
 * no call), scaled by a ratio measured once against CLOCK_MONOTONIC; from
 * clock_gettime() elsewhere. */
extern double te_mclock_ns_per_tick;
extern uint64_t te_mclock_us_mult; /* microseconds per tick, times 2^32 */
extern bool te_mclock_tsc;
uint64_t te_metrics_mono_ns(void);

static inline uint64_t te_metrics_now(void)
{
#if defined(__x86_64__)
	if (te_mclock_tsc)
		return __builtin_ia32_rdtsc();
#endif
	return te_metrics_mono_ns();
}

/* The bucket of a latency: the first whose bound is not below it. */
static inline unsigned te_mlat_bucket(uint64_t ticks)
{
	if (ticks > (1ull << 43))
		return TE_MLAT_BOUNDS; /* beyond any bound, and past the multiply's range */
	uint64_t us = (ticks * te_mclock_us_mult + 0xffffffffull) >> 32;
	if (us <= 1)
		return 0;
	unsigned k = 64u - (unsigned)__builtin_clzll(us - 1); /* ceil(log2(us)) */
	return k < TE_MLAT_BOUNDS ? k : TE_MLAT_BOUNDS;
}

static inline unsigned te_mop_index(const te_task *t)
{
	/* A request refused for its unknown opcode counts as a read. */
	return t->xfer.opcode == TE_OP_WRITE ? 1 : 0;
}

/* A task that ends before it was handed over (refused, canceled at
 * submit, empty): its request counts now, before its end does. */
void te_metrics_task_unsubmitted(te_metrics *m, te_task *t);

/* The te_submit() call running on this thread, if it counts. */
extern _Thread_local te_mlate *te_mlate_tls __attribute__((tls_model("initial-exec")));

int te_mlate_slot_find(te_mlate *l, const te_task *t, unsigned op);

/* The slot of the running te_submit() call for a task that ended inside
 * it on this thread, or -1 (another call's task, or no slot free). The
 * slot used last is the likeliest (a call's tasks mostly go one way): it
 * is looked at inline, the others out of line. */
static inline int te_mlate_slot(te_mlate *l, te_metrics *m, const te_task *t, unsigned op)
{
	if (l == NULL || l->m != m || l->t0 != t->t0)
		return -1;
	unsigned i = l->last; /* slot 0 holds no block until taken: no match */
	if (l->slot[i].mb == t->mb && l->slot[i].peer == t->mpeer && l->slot[i].op == op)
		return (int)i;
	return te_mlate_slot_find(l, t, op);
}

static inline void te_metrics_late_begin(te_metrics *m, uint64_t t0, te_mlate *l)
{
	l->m = m;
	l->t0 = t0;
	l->n = l->last = 0;
	l->slot[0].mb = NULL;
	l->outer = te_mlate_tls;
	te_mlate_tls = l;
}

/* One clock reading for every task left to the call, and the counts of
 * those that completed whole. */
static inline void te_metrics_late_end(te_mlate *l)
{
	te_mlate_tls = l->outer;
	if (l->n == 0)
		return;
	uint64_t now = te_metrics_now(), d = now > l->t0 ? now - l->t0 : 0;
	unsigned s = te_mshard_index(), b = te_mlat_bucket(d);
	for (unsigned i = 0; i < l->n; i++) {
		unsigned op = l->slot[i].op;
		te_mop *o = &l->slot[i].mb->shards[s].op[op];
		uint64_t ended = l->slot[i].done + l->slot[i].other;
		te_madd(s, &o->lat[b], ended);
		te_madd(s, &o->lat_sum, d * ended);
		if (l->slot[i].done == 0)
			continue;
		te_madd(s, &o->completed, l->slot[i].done);
		te_madd(s, &o->bytes, l->slot[i].bytes);
		if (l->slot[i].peer != NULL) {
			unsigned ps = s;
			te_madd(ps, &te_mpeer_line(l->slot[i].peer, &ps)->bytes[op], l->slot[i].bytes);
		}
	}
}

/* A task ended (task_finish). */
static inline void te_metrics_task_end(te_metrics *m, te_task *t, int state)
{
	unsigned op = te_mop_index(t);
	uint64_t moved = atomic_load_explicit(&t->transferred, memory_order_relaxed);
	/* Canceled tasks stay out of the latency: they measure the caller. */
	te_mlate *l = te_mlate_tls;
	int k = state != TE_TASK_CANCELED ? te_mlate_slot(l, m, t, op) : -1;
	if (k >= 0 && state == TE_TASK_COMPLETED && moved >= t->xfer.length) {
		l->slot[k].done++;
		l->slot[k].bytes += moved;
		return;
	}
	unsigned s = te_mshard_index();
	te_mop *o = &t->mb->shards[s].op[op];

	te_madd(s, &o->bytes, moved);
	if (moved < t->xfer.length)
		te_madd(s, &o->unmoved, t->xfer.length - moved);
	if (state == TE_TASK_COMPLETED)
		te_madd(s, &o->completed, 1);
	else if (state == TE_TASK_CANCELED)
		te_madd(s, &o->canceled, 1);
	else
		te_madd(s, &o->failed, 1);
	if (k >= 0) {
		l->slot[k].other++;
	} else if (state != TE_TASK_CANCELED) {
		uint64_t now = te_metrics_now();
		uint64_t d = now > t->t0 ? now - t->t0 : 0;
		te_madd(s, &o->lat[te_mlat_bucket(d)], 1);
		te_madd(s, &o->lat_sum, d);
	}
	if (t->mpeer != NULL) {
		unsigned ps = s;
		te_pshard *p = te_mpeer_line(t->mpeer, &ps);
		te_madd(ps, &p->bytes[op], moved);
		if (state != TE_TASK_COMPLETED && state != TE_TASK_CANCELED)
			te_madd(ps, &p->failed[op], 1);
	}
}

te_mblock *te_metrics_local(te_metrics *m);
void te_metrics_submit_switch(te_msubmit *acc, te_mblock *mb, te_mpeer *peer);
void te_metrics_submit_flush(te_msubmit *acc);

static inline void te_metrics_submit_one(te_metrics *m, te_msubmit *acc, te_task *t)
{
	unsigned op = t->xfer.opcode == TE_OP_WRITE ? 1 : 0;

	if (t->mb == NULL)
		t->mb = te_metrics_local(m);
	if (t->mb != acc->mb || t->mpeer != acc->peer)
		te_metrics_submit_switch(acc, t->mb, t->mpeer);
	acc->n[op]++;
	acc->bytes[op] += t->xfer.length;
}

void te_metrics_add(_Atomic uint64_t *c, int64_t delta);
/* The counter of ENGINE row `row` (enum te_mengine_row). */
_Atomic uint64_t *te_metrics_counter_engine(te_metrics *m, unsigned row);
_Atomic uint64_t *te_metrics_counter_rpc(te_metrics *m, int kind, bool refused);

/* te_host's metric_device / metric_add / metrics_text. */
te_metric_dev *te_metrics_device(te_metrics *m, const char *transport, const char *name);
void te_metrics_dev_add(te_metrics *m, te_mblock *tp, te_metric_dev *dev, int what, int64_t delta);

/* Adds `delta` to an ENGINE row of `e` (metrics-table.h): one line counts
 * a new engine metric. */
static inline void te_metric_count(te_engine *e, unsigned row, int64_t delta)
{
	if (e != NULL && e->metrics != NULL)
		te_metrics_add(te_metrics_counter_engine(e->metrics, row), delta);
}
static inline void te_metric_count_notify(te_engine *e, bool received)
{
	te_metric_count(e, received ? TE_MENGINE_notify_received : TE_MENGINE_notify_sent, 1);
}
static inline void te_metric_count_memory(te_engine *e, int64_t bytes, int64_t regions)
{
	te_metric_count(e, TE_MENGINE_reg_bytes, bytes);
	te_metric_count(e, TE_MENGINE_reg_regions, regions);
}
static inline void te_metric_count_rpc(te_engine *e, int kind, bool refused)
{
	if (e != NULL && e->metrics != NULL)
		te_metrics_add(te_metrics_counter_rpc(e->metrics, kind, refused), 1);
}
static inline void te_metric_count_auth(te_engine *e)
{
	te_metric_count(e, TE_MENGINE_auth_refused, 1);
}

#else /* counting compiled out (-Dmetrics=false) */

static inline te_metrics *te_metrics_new(te_engine *e) { (void)e; return NULL; }
static inline void te_metrics_free(te_metrics *m) { (void)m; }
static inline void te_metrics_named(te_metrics *m, const char *n) { (void)m; (void)n; }
static inline te_mblock *te_metrics_block(te_metrics *m, const char *t) { (void)m; (void)t; return NULL; }
static inline te_mpeer *te_metrics_peer(te_metrics *m, const char *n) { (void)m; (void)n; return NULL; }
static inline void te_metrics_task_end(te_metrics *m, te_task *t, int s) { (void)m; (void)t; (void)s; }
static inline void te_metrics_task_unsubmitted(te_metrics *m, te_task *t) { (void)m; (void)t; }
static inline uint64_t te_metrics_now(void) { return 0; }
static inline void te_metrics_submit_one(te_metrics *m, te_msubmit *acc, te_task *t)
{
	(void)m; (void)acc; (void)t;
}
static inline void te_metrics_submit_flush(te_msubmit *acc) { (void)acc; }
static inline void te_metrics_late_begin(te_metrics *m, uint64_t t0, te_mlate *l)
{
	(void)m; (void)t0; (void)l;
}
static inline void te_metrics_late_end(te_mlate *l) { (void)l; }
static inline te_metric_dev *te_metrics_device(te_metrics *m, const char *t, const char *n)
{
	(void)m; (void)t; (void)n;
	return NULL;
}
static inline void te_metrics_dev_add(te_metrics *m, te_mblock *tp, te_metric_dev *d, int w, int64_t v)
{
	(void)m; (void)tp; (void)d; (void)w; (void)v;
}
static inline void te_metric_count(te_engine *e, unsigned r, int64_t d) { (void)e; (void)r; (void)d; }
static inline void te_metric_count_notify(te_engine *e, bool r) { (void)e; (void)r; }
static inline void te_metric_count_memory(te_engine *e, int64_t b, int64_t r) { (void)e; (void)b; (void)r; }
static inline void te_metric_count_rpc(te_engine *e, int k, bool r) { (void)e; (void)k; (void)r; }
static inline void te_metric_count_auth(te_engine *e) { (void)e; }

#endif

#endif
