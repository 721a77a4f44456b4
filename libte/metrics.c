/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Counters cheap enough to leave on (docs/metrics.md). The data path adds
 * into cache-line-aligned shards, one owned by each counting thread (plain
 * adds) and one shared by threads beyond them (atomic adds); reading sums
 * the shards (metrics.h has the data path itself). A reading is therefore
 * not one instant: gauges derived from two counters (in flight = requests -
 * ended) are clamped at zero.
 *
 * This file keeps the tables (blocks, peers, devices) and the adding;
 * metrics-snap.c reads them, metrics-json.c and metrics-text.c print what it
 * read.
 */
#include <limits.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "metrics-internal.h"

#if TE_METRICS_BUILD

#define PEERS_DEFAULT 64
#define PEERS_MAX 4096
#define NAMES_DEFAULT 16384
#define NAMES_MAX 1048576
#define DEVICES_DEFAULT 256
#define DEVICES_MAX 65536

GMutex te_mengines_lock;
GPtrArray *te_mengines; /* te_metrics*, added by te_metrics_new() */

static _Atomic uint64_t slots_free = (TE_MSLOTS >= 64 ? ~0ull : (1ull << TE_MSLOTS) - 1);
static pthread_key_t slot_key;
static pthread_once_t slot_once = PTHREAD_ONCE_INIT;
_Thread_local unsigned te_mshard_tls;
_Thread_local te_mlate *te_mlate_tls;
double te_mclock_ns_per_tick = 1.0;
uint64_t te_mclock_us_mult = (1ull << 32) / 1000;
bool te_mclock_tsc;
static pthread_once_t clock_once = PTHREAD_ONCE_INIT;

/* A thread that exits hands its shard on; the counts in it stay. */
static void slot_release(void *v)
{
	unsigned s = (unsigned)(uintptr_t)v - 1;

	if (s < TE_MSLOTS)
		atomic_fetch_or_explicit(&slots_free, 1ull << s, memory_order_release);
}

static void slot_key_make(void)
{
	if (pthread_key_create(&slot_key, slot_release) != 0)
		atomic_store(&slots_free, 0); /* no destructor: every thread shares */
}

unsigned te_mshard_take(void)
{
	uint64_t f;
	unsigned s = TE_MSLOTS;

	pthread_once(&slot_once, slot_key_make);
	f = atomic_load_explicit(&slots_free, memory_order_relaxed);
	while (f != 0) {
		unsigned k = (unsigned)__builtin_ctzll(f);
		if (atomic_compare_exchange_weak_explicit(&slots_free, &f, f & ~(1ull << k), memory_order_acquire,
							  memory_order_relaxed)) {
			s = k;
			if (pthread_setspecific(slot_key, (void *)(uintptr_t)(s + 1)) != 0) {
				slot_release((void *)(uintptr_t)(s + 1));
				s = TE_MSLOTS;
			}
			break;
		}
	}
	te_mshard_tls = s + 1;
	return s;
}

static inline unsigned shard(void)
{
	return te_mshard_index();
}

static inline void add_in(unsigned s, counter *c, uint64_t v)
{
	te_madd(s, c, v);
}

static inline void add(counter *c, uint64_t v)
{
	atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

/* ----------------------------------------------------------------- time */

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#if defined(__x86_64__)
#include <cpuid.h>

static void clock_calibrate(void)
{
	unsigned a, b, c, d;

	/* CPUID 0x80000007 EDX bit 8: the TSC runs at one rate in every state. */
	if (!__get_cpuid(0x80000007, &a, &b, &c, &d) || !(d & (1u << 8)))
		return;
	uint64_t n0 = mono_ns(), t0 = __builtin_ia32_rdtsc(), n1, t1;
	do { /* 2 ms: a 0.1 % error at most from the clock reads around it */
		n1 = mono_ns();
		t1 = __builtin_ia32_rdtsc();
	} while (n1 - n0 < 2000000);
	if (t1 <= t0)
		return;
	te_mclock_ns_per_tick = (double)(n1 - n0) / (double)(t1 - t0);
	te_mclock_us_mult = (uint64_t)(te_mclock_ns_per_tick / 1000.0 * 4294967296.0);
	te_mclock_tsc = true;
}
#else
static void clock_calibrate(void)
{
}
#endif

void *te_mshards_new(size_t each)
{
	void *p = aligned_alloc(LINE, each * SHARDS);

	if (p == NULL)
		g_error("out of memory for %zu bytes of counters", each * SHARDS);
	memset(p, 0, each * SHARDS);
	return p;
}

uint64_t te_metrics_mono_ns(void)
{
	return mono_ns();
}

static te_mblock *block_new(const char *transport)
{
	te_mblock *b = g_new0(te_mblock, 1);

	b->transport = g_strdup(transport);
	b->shards = te_mshards_new(sizeof(mshard));
	return b;
}

static void block_free(gpointer p)
{
	te_mblock *b = p;

	free(b->shards);
	g_free(b->transport);
	g_free(b);
}

static te_mpeer *peer_new(const char *name, unsigned order)
{
	te_mpeer *p = aligned_alloc(LINE, (sizeof(te_mpeer) + LINE - 1) / LINE * LINE);

	if (p == NULL)
		g_error("out of memory for a peer's counters");
	memset(p, 0, sizeof *p);
	atomic_init(&p->wide, NULL);
	p->name = g_strdup(name);
	p->order = order;
	return p;
}

static void peer_free(gpointer v)
{
	te_mpeer *p = v;

	free(atomic_load_explicit(&p->wide, memory_order_relaxed));
	g_free(p->name);
	free(p);
}

te_metrics *te_metrics_new(te_engine *e)
{
	if (te_engine_option_u64(e, "TE_METRICS", 1, 0, 1) == 0)
		return NULL;
	pthread_once(&clock_once, clock_calibrate);
	te_metrics *m = g_new0(te_metrics, 1);
	g_mutex_init(&m->lock);
	m->max_peers = (unsigned)te_engine_option_u64(e, "TE_METRICS_PEERS", PEERS_DEFAULT, 0, PEERS_MAX);
	m->max_names = (unsigned)te_engine_option_u64(e, "TE_METRICS_PEER_NAMES", NAMES_DEFAULT, 0, NAMES_MAX);
	if (m->max_names < m->max_peers)
		m->max_names = m->max_peers;
	/* Sharded counters go to the busiest; a bound on how many ever get
	 * them keeps a ranking that keeps changing from adding without end. */
	m->max_wide = 4 * m->max_peers;
	m->max_devs = (unsigned)te_engine_option_u64(e, "TE_METRICS_DEVICES", DEVICES_DEFAULT, 0, DEVICES_MAX);
	m->local = block_new("local");
	m->blocks = g_ptr_array_new_with_free_func(block_free);
	g_ptr_array_add(m->blocks, m->local);
	m->peers = g_hash_table_new(g_str_hash, g_str_equal);
	m->peer_recs = g_ptr_array_new_with_free_func(peer_free);
	m->shown = g_ptr_array_new();
	m->untracked = peer_new(NULL, UINT_MAX);
	m->devs = g_new0(te_metric_dev *, m->max_devs ? m->max_devs : 1);
	m->segment = g_strdup("");
	g_mutex_lock(&te_mengines_lock);
	if (te_mengines == NULL)
		te_mengines = g_ptr_array_new();
	g_ptr_array_add(te_mengines, m);
	g_mutex_unlock(&te_mengines_lock);
	return m;
}

void te_metrics_free(te_metrics *m)
{
	if (m == NULL)
		return;
	g_mutex_lock(&te_mengines_lock);
	g_ptr_array_remove(te_mengines, m);
	g_mutex_unlock(&te_mengines_lock);
	for (unsigned i = 0; i < m->n_devs; i++) {
		free(m->devs[i]->shards);
		g_free(m->devs[i]->transport);
		g_free(m->devs[i]->name);
		g_free(m->devs[i]);
	}
	g_free(m->devs);
	peer_free(m->untracked);
	g_hash_table_unref(m->peers);
	g_ptr_array_unref(m->shown);
	g_ptr_array_unref(m->peer_recs);
	g_ptr_array_unref(m->blocks);
	g_free(m->segment);
	g_mutex_clear(&m->lock);
	g_free(m);
}

void te_metrics_named(te_metrics *m, const char *name)
{
	if (m == NULL)
		return;
	g_mutex_lock(&m->lock);
	g_free(m->segment);
	m->segment = g_strdup(name ? name : "");
	g_mutex_unlock(&m->lock);
}

te_mblock *te_metrics_block(te_metrics *m, const char *transport)
{
	te_mblock *b = NULL;

	if (m == NULL)
		return NULL;
	g_mutex_lock(&m->lock);
	for (guint i = 0; i < m->blocks->len && b == NULL; i++) {
		te_mblock *x = g_ptr_array_index(m->blocks, i);
		if (strcmp(x->transport, transport) == 0)
			b = x;
	}
	if (b == NULL) {
		b = block_new(transport);
		g_ptr_array_add(m->blocks, b);
	}
	g_mutex_unlock(&m->lock);
	return b;
}

/* Under m->lock: the peer gets a series of its own, and sharded counters
 * while the bound allows. */
void te_mpeer_show(te_metrics *m, te_mpeer *p)
{
	p->is_shown = true;
	g_ptr_array_add(m->shown, p);
	if (atomic_load_explicit(&p->wide, memory_order_relaxed) == NULL && m->n_wide < m->max_wide) {
		atomic_store_explicit(&p->wide, te_mshards_new(sizeof(pshard)), memory_order_release);
		m->n_wide++;
	}
}

/* One record per distinct name for the engine's life (a segment holds its
 * pointer and the data path writes into it), up to TE_METRICS_PEER_NAMES;
 * later names share one record counted as "other". A name joins the shown
 * set at once while it has room; past that, the readings rank (below). */
te_mpeer *te_metrics_peer(te_metrics *m, const char *name)
{
	te_mpeer *p;

	if (m == NULL)
		return NULL;
	g_mutex_lock(&m->lock);
	p = g_hash_table_lookup(m->peers, name);
	if (p == NULL && m->peer_recs->len < m->max_names) {
		p = peer_new(name, m->peer_recs->len);
		g_ptr_array_add(m->peer_recs, p);
		g_hash_table_insert(m->peers, p->name, p);
		if (m->shown->len < m->max_peers)
			te_mpeer_show(m, p);
	}
	g_mutex_unlock(&m->lock);
	return p != NULL ? p : m->untracked;
}


void te_metrics_submit_flush(te_msubmit *acc)
{
	if (acc->mb == NULL)
		return;
	unsigned s = shard();
	for (unsigned op = 0; op < 2; op++) {
		if (acc->n[op] == 0)
			continue;
		mop *o = &acc->mb->shards[s].op[op];
		add_in(s, &o->requests, acc->n[op]);
		add_in(s, &o->req_bytes, acc->bytes[op]);
		if (acc->peer != NULL) {
			unsigned ps = s;
			add_in(ps, &te_mpeer_line(acc->peer, &ps)->requests[op], acc->n[op]);
		}
		acc->n[op] = acc->bytes[op] = 0;
	}
}

void te_metrics_submit_switch(te_msubmit *acc, te_mblock *mb, te_mpeer *peer)
{
	te_metrics_submit_flush(acc);
	acc->mb = mb;
	acc->peer = peer;
}

int te_mlate_slot_find(te_mlate *l, const te_task *t, unsigned op)
{
	for (unsigned i = 0; i < l->n; i++)
		if (l->slot[i].mb == t->mb && l->slot[i].peer == t->mpeer && l->slot[i].op == op) {
			l->last = i;
			return (int)i;
		}
	if (l->n == TE_MLATE_SLOTS)
		return -1;
	unsigned i = l->n++;
	l->slot[i].mb = t->mb;
	l->slot[i].peer = t->mpeer;
	l->slot[i].op = op;
	l->slot[i].done = l->slot[i].bytes = l->slot[i].other = 0;
	l->last = i;
	return (int)i;
}

te_mblock *te_metrics_local(te_metrics *m)
{
	return m->local;
}

void te_metrics_task_unsubmitted(te_metrics *m, te_task *t)
{
	unsigned op = te_mop_index(t);
	te_msubmit one = { .mb = t->mb != NULL ? t->mb : m->local, .peer = t->mpeer };

	one.n[op] = 1;
	one.bytes[op] = t->xfer.length;
	t->mb = one.mb;
	te_metrics_submit_flush(&one);
}

void te_metrics_add(counter *c, int64_t delta)
{
	add(c, (uint64_t)delta);
}

counter *te_metrics_counter_engine(te_metrics *m, unsigned row)
{
	switch (row) {
#define ENGINE_CASE(scope, id, kind, prom, json, stats, help)                                              \
	case TE_MENGINE_##id:                                                                               \
		return &m->id;
		TE_MTABLE_ENGINE(ENGINE_CASE)
	default:
		/* Only libte passes rows, from the enum: a bug, not an input. */
		g_error("te_metrics_counter_engine: no ENGINE row %u", row);
	}
}

counter *te_metrics_counter_rpc(te_metrics *m, int kind, bool refused)
{
	if (kind < 0 || kind >= TE_MRPC_KINDS)
		kind = TE_MRPC_UNKNOWN;
	return &m->rpc[kind][refused ? TE_MRPC_refused : TE_MRPC_served];
}

te_metric_dev *te_metrics_device(te_metrics *m, const char *transport, const char *name)
{
	te_metric_dev *d = NULL;

	if (m == NULL || name == NULL || *name == '\0' || strlen(name) >= TE_MAX_NAME)
		return NULL;
	g_mutex_lock(&m->lock);
	for (unsigned i = 0; i < m->n_devs && d == NULL; i++)
		if (strcmp(m->devs[i]->transport, transport) == 0 && strcmp(m->devs[i]->name, name) == 0)
			d = m->devs[i];
	if (d == NULL && m->n_devs < m->max_devs) {
		d = g_new0(te_metric_dev, 1);
		d->transport = g_strdup(transport);
		d->name = g_strdup(name);
		d->shards = te_mshards_new(sizeof(dshard));
		m->devs[m->n_devs++] = d;
	}
	g_mutex_unlock(&m->lock);
	return d;
}

void te_metrics_dev_add(te_metrics *m, te_mblock *tp, te_metric_dev *dev, int what, int64_t delta)
{
	(void)m;
	if (dev == NULL) {
		if (tp == NULL)
			return;
		switch (what) {
		case TE_METRIC_RETRIES: add(&tp->retries, (uint64_t)delta); break;
		case TE_METRIC_FAILOVERS: add(&tp->failovers, (uint64_t)delta); break;
		case TE_METRIC_ERRORS: add(&tp->errors, (uint64_t)delta); break;
		default: break; /* bytes belong to a device */
		}
		return;
	}
	unsigned s = shard();
	dshard *d = &dev->shards[s];
	switch (what) {
	case TE_METRIC_BYTES: add_in(s, &d->bytes, (uint64_t)delta); break;
	case TE_METRIC_INFLIGHT_BYTES: add_in(s, &d->inflight_bytes, (uint64_t)delta); break;
	case TE_METRIC_RETRIES: add_in(s, &d->retries, (uint64_t)delta); break;
	case TE_METRIC_FAILOVERS: add_in(s, &d->failovers, (uint64_t)delta); break;
	case TE_METRIC_ERRORS: add_in(s, &d->errors, (uint64_t)delta); break;
	default: break; /* a kind from a newer ABI: nothing to count it in */
	}
}

#endif
