/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Counters cheap enough to leave on (docs/metrics.md). The data path adds
 * into cache-line-aligned shards, one owned by each counting thread (plain
 * adds) and one shared by threads beyond them (atomic adds); reading sums
 * the shards (metrics.h has the data path itself). A reading is therefore
 * not one instant: gauges derived from two counters (in flight = requests -
 * ended) are clamped at zero.
 */
#include <json-glib/json-glib.h>
#include <limits.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
#define PEERS_DEFAULT 64
#define PEERS_MAX 4096
#define NAMES_DEFAULT 16384
#define NAMES_MAX 1048576
#define DEVICES_DEFAULT 256
#define DEVICES_MAX 65536
#define BW_TAU_NS 1000000000.0 /* the bandwidth average's time constant: 1 s */

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

/* Every engine that counts, for te_metrics_text(NULL). */
static GMutex engines_lock;
static GPtrArray *engines; /* te_metrics* */

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

static inline uint64_t get(const counter *c)
{
	return atomic_load_explicit((counter *)c, memory_order_relaxed);
}

static void *shards_new(size_t each)
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
	b->shards = shards_new(sizeof(mshard));
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
	g_mutex_lock(&engines_lock);
	if (engines == NULL)
		engines = g_ptr_array_new();
	g_ptr_array_add(engines, m);
	g_mutex_unlock(&engines_lock);
	return m;
}

void te_metrics_free(te_metrics *m)
{
	if (m == NULL)
		return;
	g_mutex_lock(&engines_lock);
	g_ptr_array_remove(engines, m);
	g_mutex_unlock(&engines_lock);
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
static void peer_show(te_metrics *m, te_mpeer *p)
{
	p->is_shown = true;
	g_ptr_array_add(m->shown, p);
	if (atomic_load_explicit(&p->wide, memory_order_relaxed) == NULL && m->n_wide < m->max_wide) {
		atomic_store_explicit(&p->wide, shards_new(sizeof(pshard)), memory_order_release);
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
			peer_show(m, p);
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
	l->slot[i].ended = l->slot[i].done = l->slot[i].bytes = 0;
	l->last = i;
	return (int)i;
}

te_mblock *te_metrics_local(te_metrics *m)
{
	return m->local;
}

/* A task that ended before it was handed over (refused, canceled, empty):
 * counted as handed over first. */
void te_metrics_task_unsubmitted(te_metrics *m, te_task *t)
{
	unsigned op = te_mop_index(t);
	te_msubmit one = { .mb = t->mb != NULL ? t->mb : m->local, .peer = t->mpeer };

	one.n[op] = 1;
	one.bytes[op] = t->xfer.length;
	t->mb = one.mb;
	te_metrics_submit_flush(&one);
	t->mcounted = true;
}

void te_metrics_add(counter *c, int64_t delta)
{
	add(c, (uint64_t)delta);
}

counter *te_metrics_counter_notify(te_metrics *m, bool received)
{
	return received ? &m->notify_received : &m->notify_sent;
}

counter *te_metrics_counter_memory(te_metrics *m, bool regions)
{
	return regions ? &m->reg_regions : &m->reg_bytes;
}

counter *te_metrics_counter_rpc(te_metrics *m, int kind, bool refused)
{
	if (kind < 0 || kind >= TE_MRPC_KINDS)
		kind = TE_MRPC_UNKNOWN;
	return &m->rpc[kind][refused ? 1 : 0];
}

counter *te_metrics_counter_auth(te_metrics *m)
{
	return &m->auth_refused;
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
		d->shards = shards_new(sizeof(dshard));
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

/* ------------------------------------------------------------- reading */

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

static uint64_t gauge(uint64_t raw)
{
	return (int64_t)raw < 0 ? 0 : raw;
}

static uint64_t diff(uint64_t a, uint64_t b)
{
	return a > b ? a - b : 0;
}

static void read_block(const te_mblock *b, tp_snap *out)
{
	memset(out, 0, sizeof *out);
	out->transport = b->transport;
	for (unsigned op = 0; op < 2; op++) {
		op_snap *o = &out->op[op];
		uint64_t req_bytes = 0, unmoved = 0;
		for (unsigned s = 0; s < SHARDS; s++) {
			const mop *x = &b->shards[s].op[op];
			o->requests += get(&x->requests);
			req_bytes += get(&x->req_bytes);
			o->bytes += get(&x->bytes);
			unmoved += get(&x->unmoved);
			o->completed += get(&x->completed);
			o->failed += get(&x->failed);
			o->canceled += get(&x->canceled);
			o->lat_sum_ns += get(&x->lat_sum);
			for (unsigned k = 0; k < LAT_BUCKETS; k++)
				o->lat[k] += get(&x->lat[k]);
		}
		o->lat_sum_ns = (uint64_t)((double)o->lat_sum_ns * te_mclock_ns_per_tick);
		o->in_flight = diff(o->requests, o->completed + o->failed + o->canceled);
		o->in_flight_bytes = diff(req_bytes, o->bytes + unmoved);
	}
	out->retries = get(&b->retries);
	out->failovers = get(&b->failovers);
	out->errors = get(&b->errors);
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
static void peer_raw(te_mpeer *p, uint64_t raw[3][2])
{
	te_pshard *w = atomic_load_explicit(&p->wide, memory_order_acquire);

	for (unsigned op = 0; op < 2; op++) {
		raw[0][op] = get(&p->narrow.bytes[op]);
		raw[1][op] = get(&p->narrow.requests[op]);
		raw[2][op] = get(&p->narrow.failed[op]);
		for (unsigned s = 0; w != NULL && s < SHARDS; s++) {
			raw[0][op] += get(&w[s].bytes[op]);
			raw[1][op] += get(&w[s].requests[op]);
			raw[2][op] += get(&w[s].failed[op]);
		}
	}
}

static void peer_advance(te_metrics *m, te_mpeer *p)
{
	uint64_t raw[3][2];

	peer_raw(p, raw);
	for (unsigned f = 0; f < 3; f++)
		for (unsigned op = 0; op < 2; op++) {
			uint64_t d = diff(raw[f][op], p->seen[f][op]);
			p->seen[f][op] += d;
			if (p->is_shown)
				p->shown[f][op] += d;
			else
				m->other[f][op] += d;
		}
	p->rank_bytes = p->seen[0][0] + p->seen[0][1];
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
			peer_show(m, v[i]);
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

static void peer_snap_of(const char *name, const uint64_t v[3][2], peer_snap *out)
{
	out->name = (char *)name;
	for (unsigned op = 0; op < 2; op++) {
		out->bytes[op] = v[0][op];
		out->requests[op] = v[1][op];
		out->failed[op] = v[2][op];
	}
}

/* Under m->lock: advances the device's average with the bytes since the
 * last reading, weighted dt / (τ + dt), τ = 1 s. */
static void read_dev(te_metric_dev *d, uint64_t now, dev_snap *out)
{
	memset(out, 0, sizeof *out);
	out->transport = d->transport;
	out->name = d->name;
	for (unsigned s = 0; s < SHARDS; s++) {
		out->bytes += get(&d->shards[s].bytes);
		out->inflight_bytes += get(&d->shards[s].inflight_bytes);
		out->retries += get(&d->shards[s].retries);
		out->failovers += get(&d->shards[s].failovers);
		out->errors += get(&d->shards[s].errors);
	}
	out->inflight_bytes = gauge(out->inflight_bytes);
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
static void snap_take(te_metrics *m, snap *sn)
{
	uint64_t now = mono_ns();

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
	sn->notify_sent = get(&m->notify_sent);
	sn->notify_received = get(&m->notify_received);
	sn->reg_bytes = gauge(get(&m->reg_bytes));
	sn->reg_regions = gauge(get(&m->reg_regions));
	sn->auth_refused = get(&m->auth_refused);
	for (unsigned k = 0; k < TE_MRPC_KINDS; k++)
		for (unsigned r = 0; r < 2; r++)
			sn->rpc[k][r] = get(&m->rpc[k][r]);
}

static void snap_clear(snap *sn)
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

	g_mutex_lock(&m->lock);
	snap_take(m, &sn);
	for (guint i = 0; i < sn.tps->len; i++) {
		const tp_snap *t = &g_array_index(sn.tps, tp_snap, i);
		for (unsigned op = 0; op < 2; op++) {
			st.requests[op] += t->op[op].requests;
			st.bytes[op] += t->op[op].bytes;
			st.completed[op] += t->op[op].completed;
			st.failed[op] += t->op[op].failed;
			st.canceled[op] += t->op[op].canceled;
			st.in_flight += t->op[op].in_flight;
			st.in_flight_bytes += t->op[op].in_flight_bytes;
		}
		st.retries += t->retries;
		st.failovers += t->failovers;
	}
	for (guint i = 0; i < sn.devs->len; i++) {
		st.retries += g_array_index(sn.devs, dev_snap, i).retries;
		st.failovers += g_array_index(sn.devs, dev_snap, i).failovers;
	}
	st.notifies_sent = sn.notify_sent;
	st.notifies_received = sn.notify_received;
	st.registered_bytes = sn.reg_bytes;
	st.registered_regions = sn.reg_regions;
	for (unsigned k = 0; k < TE_MRPC_KINDS; k++) {
		st.rpc_served += sn.rpc[k][0];
		st.rpc_refused += sn.rpc[k][1];
	}
	st.auth_refused = sn.auth_refused;
	snap_clear(&sn);
	g_mutex_unlock(&m->lock);

	/* Whole fields only, up to what the caller's struct holds. */
	size_t n = out->size < sizeof st ? out->size : sizeof st;
	n -= n % sizeof(uint64_t);
	memcpy((char *)out + offsetof(te_stats, requests), (char *)&st + offsetof(te_stats, requests),
	       n - offsetof(te_stats, requests));
	return 0;
}

/* ----------------------------------------------------------------- JSON */

static const char *const op_names[2] = { "read", "write" };
static const char *const rpc_names[TE_MRPC_KINDS] = { "Connection", "Metadata", "Notify", "Probe",
						      "unknown" };

static void jint(JsonBuilder *b, const char *k, uint64_t v)
{
	json_builder_set_member_name(b, k);
	json_builder_add_int_value(b, (gint64)(v > INT64_MAX ? INT64_MAX : v));
}

static void jstr(JsonBuilder *b, const char *k, const char *v)
{
	json_builder_set_member_name(b, k);
	json_builder_add_string_value(b, v);
}

static void json_of(const snap *sn, JsonBuilder *b)
{
	json_builder_begin_object(b);
	jstr(b, "segment", sn->segment);
	json_builder_set_member_name(b, "transports");
	json_builder_begin_array(b);
	for (guint i = 0; i < sn->tps->len; i++) {
		const tp_snap *t = &g_array_index(sn->tps, tp_snap, i);
		for (unsigned op = 0; op < 2; op++) {
			const op_snap *o = &t->op[op];
			json_builder_begin_object(b);
			jstr(b, "transport", t->transport);
			jstr(b, "op", op_names[op]);
			jint(b, "requests", o->requests);
			jint(b, "bytes", o->bytes);
			jint(b, "completed", o->completed);
			jint(b, "failed", o->failed);
			jint(b, "canceled", o->canceled);
			jint(b, "in_flight", o->in_flight);
			jint(b, "in_flight_bytes", o->in_flight_bytes);
			json_builder_set_member_name(b, "latency");
			json_builder_begin_object(b);
			json_builder_set_member_name(b, "le_us");
			json_builder_begin_array(b);
			for (unsigned k = 0; k < LAT_BOUNDS; k++)
				json_builder_add_int_value(b, (gint64)1 << k);
			json_builder_end_array(b);
			json_builder_set_member_name(b, "counts");
			json_builder_begin_array(b);
			uint64_t count = 0;
			for (unsigned k = 0; k < LAT_BUCKETS; k++) {
				json_builder_add_int_value(b, (gint64)o->lat[k]);
				count += o->lat[k];
			}
			json_builder_end_array(b);
			jint(b, "sum_us", o->lat_sum_ns / 1000);
			jint(b, "count", count);
			json_builder_end_object(b);
			json_builder_end_object(b);
		}
	}
	json_builder_end_array(b);
	json_builder_set_member_name(b, "transport_events");
	json_builder_begin_array(b);
	for (guint i = 0; i < sn->tps->len; i++) {
		const tp_snap *t = &g_array_index(sn->tps, tp_snap, i);
		json_builder_begin_object(b);
		jstr(b, "transport", t->transport);
		jint(b, "retries", t->retries);
		jint(b, "failovers", t->failovers);
		jint(b, "errors", t->errors);
		json_builder_end_object(b);
	}
	json_builder_end_array(b);
	json_builder_set_member_name(b, "peers");
	json_builder_begin_array(b);
	for (guint i = 0; i < sn->peers->len; i++) {
		const peer_snap *p = &g_array_index(sn->peers, peer_snap, i);
		for (unsigned op = 0; op < 2; op++) {
			json_builder_begin_object(b);
			jstr(b, "peer", p->name ? p->name : "other");
			json_builder_set_member_name(b, "other");
			json_builder_add_boolean_value(b, p->name == NULL);
			jstr(b, "op", op_names[op]);
			jint(b, "bytes", p->bytes[op]);
			jint(b, "requests", p->requests[op]);
			jint(b, "failed", p->failed[op]);
			json_builder_end_object(b);
		}
	}
	json_builder_end_array(b);
	json_builder_set_member_name(b, "devices");
	json_builder_begin_array(b);
	for (guint i = 0; i < sn->devs->len; i++) {
		const dev_snap *d = &g_array_index(sn->devs, dev_snap, i);
		json_builder_begin_object(b);
		jstr(b, "transport", d->transport);
		jstr(b, "device", d->name);
		jint(b, "bytes", d->bytes);
		jint(b, "in_flight_bytes", d->inflight_bytes);
		json_builder_set_member_name(b, "bandwidth_bytes_per_second");
		json_builder_add_double_value(b, d->bw);
		jint(b, "retries", d->retries);
		jint(b, "failovers", d->failovers);
		jint(b, "errors", d->errors);
		json_builder_end_object(b);
	}
	json_builder_end_array(b);
	json_builder_set_member_name(b, "notifies");
	json_builder_begin_object(b);
	jint(b, "sent", sn->notify_sent);
	jint(b, "received", sn->notify_received);
	json_builder_end_object(b);
	json_builder_set_member_name(b, "memory");
	json_builder_begin_object(b);
	jint(b, "registered_bytes", sn->reg_bytes);
	jint(b, "registered_regions", sn->reg_regions);
	json_builder_end_object(b);
	json_builder_set_member_name(b, "rpc");
	json_builder_begin_array(b);
	for (unsigned k = 0; k < TE_MRPC_KINDS; k++) {
		json_builder_begin_object(b);
		jstr(b, "kind", rpc_names[k]);
		jint(b, "served", sn->rpc[k][0]);
		jint(b, "refused", sn->rpc[k][1]);
		json_builder_end_object(b);
	}
	json_builder_end_array(b);
	jint(b, "auth_refused", sn->auth_refused);
	json_builder_end_object(b);
}

/* GLib allocates with malloc(): what it returns te_free() can release. */
static char *as_malloced(char *g, size_t len)
{
	char *p = malloc(len + 1);

	if (p != NULL)
		memcpy(p, g, len + 1);
	g_free(g);
	return p;
}

int te_engine_stats_json(te_engine *e, char **json)
{
	if (e == NULL || json == NULL) {
		te_err("te_engine_stats_json: NULL engine or output");
		return -EINVAL;
	}
	*json = NULL;
	if (e->metrics == NULL)
		return -ENOTSUP;
	te_metrics *m = e->metrics;
	JsonBuilder *b = json_builder_new();
	snap sn;

	g_mutex_lock(&m->lock);
	snap_take(m, &sn);
	json_of(&sn, b);
	snap_clear(&sn);
	g_mutex_unlock(&m->lock);

	JsonNode *root = json_builder_get_root(b);
	JsonGenerator *g = json_generator_new();
	json_generator_set_root(g, root);
	gsize len = 0;
	char *text = json_generator_to_data(g, &len);
	g_object_unref(g);
	json_node_unref(root);
	g_object_unref(b);
	*json = as_malloced(text, len);
	return *json != NULL ? 0 : -ENOMEM;
}

/* ----------------------------------------------------------- exposition */

/* A label value as the text format wants it. */
static void put_label(GString *s, const char *name, const char *v)
{
	g_string_append_printf(s, "%s=\"", name);
	for (; *v; v++) {
		if (*v == '\\')
			g_string_append(s, "\\\\");
		else if (*v == '"')
			g_string_append(s, "\\\"");
		else if (*v == '\n')
			g_string_append(s, "\\n");
		else
			g_string_append_c(s, *v);
	}
	g_string_append_c(s, '"');
}

static void family(GString *s, const char *name, const char *type, const char *help)
{
	g_string_append_printf(s, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* The start of a sample: `name{segment="…"` (the caller adds labels and
 * closes with value_u64 or value_f). */
static void sample(GString *s, const char *name, const snap *sn)
{
	g_string_append_printf(s, "%s{", name);
	put_label(s, "segment", sn->segment);
}

static void label(GString *s, const char *name, const char *v)
{
	g_string_append_c(s, ',');
	put_label(s, name, v);
}

static void value_u64(GString *s, uint64_t v)
{
	g_string_append_printf(s, "} %llu\n", (unsigned long long)v);
}

static void value_f(GString *s, double v)
{
	g_string_append_printf(s, "} %.9g\n", v);
}

enum { F_TP_REQ, F_TP_BYTES, F_TP_DONE, F_TP_FAIL, F_TP_CANCEL };

static uint64_t tp_field(const op_snap *o, int f)
{
	switch (f) {
	case F_TP_REQ: return o->requests;
	case F_TP_BYTES: return o->bytes;
	case F_TP_DONE: return o->completed;
	case F_TP_FAIL: return o->failed;
	default: return o->canceled;
	}
}

static void text_of(GString *s, const snap *sns, size_t n)
{
	static const struct {
		const char *name, *help;
	} tpf[] = {
		{ "te_transfer_requests_total", "Transfer requests submitted, refused ones included." },
		{ "te_transfer_bytes_total", "Bytes moved by transfers that ended, partial moves included." },
		{ "te_transfer_completed_total", "Transfers that completed." },
		{ "te_transfer_failed_total", "Transfers that failed, timed out, or were refused at submit." },
		{ "te_transfer_canceled_total", "Transfers canceled." },
	};
	for (int f = 0; f < 5; f++) {
		family(s, tpf[f].name, "counter", tpf[f].help);
		for (size_t i = 0; i < n; i++)
			for (guint j = 0; j < sns[i].tps->len; j++) {
				const tp_snap *t = &g_array_index(sns[i].tps, tp_snap, j);
				for (unsigned op = 0; op < 2; op++) {
					sample(s, tpf[f].name, &sns[i]);
					label(s, "transport", t->transport);
					label(s, "op", op_names[op]);
					value_u64(s, tp_field(&t->op[op], f));
				}
			}
	}
	family(s, "te_transfer_in_flight", "gauge", "Transfers submitted and not ended.");
	for (size_t i = 0; i < n; i++)
		for (guint j = 0; j < sns[i].tps->len; j++) {
			const tp_snap *t = &g_array_index(sns[i].tps, tp_snap, j);
			sample(s, "te_transfer_in_flight", &sns[i]);
			label(s, "transport", t->transport);
			value_u64(s, t->op[0].in_flight + t->op[1].in_flight);
		}
	family(s, "te_transfer_in_flight_bytes", "gauge", "Bytes of the transfers submitted and not ended.");
	for (size_t i = 0; i < n; i++)
		for (guint j = 0; j < sns[i].tps->len; j++) {
			const tp_snap *t = &g_array_index(sns[i].tps, tp_snap, j);
			sample(s, "te_transfer_in_flight_bytes", &sns[i]);
			label(s, "transport", t->transport);
			value_u64(s, t->op[0].in_flight_bytes + t->op[1].in_flight_bytes);
		}
	family(s, "te_transfer_latency_seconds", "histogram",
	       "Time from submit to the end of a transfer (canceled ones left out).");
	for (size_t i = 0; i < n; i++)
		for (guint j = 0; j < sns[i].tps->len; j++) {
			const tp_snap *t = &g_array_index(sns[i].tps, tp_snap, j);
			for (unsigned op = 0; op < 2; op++) {
				const op_snap *o = &t->op[op];
				uint64_t cum = 0;
				for (unsigned k = 0; k < LAT_BUCKETS; k++) {
					char le[32];
					cum += o->lat[k];
					if (k < LAT_BOUNDS)
						g_snprintf(le, sizeof le, "%.6f", (double)(1u << k) / 1e6);
					else
						g_strlcpy(le, "+Inf", sizeof le);
					sample(s, "te_transfer_latency_seconds_bucket", &sns[i]);
					label(s, "transport", t->transport);
					label(s, "op", op_names[op]);
					label(s, "le", le);
					value_u64(s, cum);
				}
				sample(s, "te_transfer_latency_seconds_sum", &sns[i]);
				label(s, "transport", t->transport);
				label(s, "op", op_names[op]);
				value_f(s, (double)o->lat_sum_ns / 1e9);
				sample(s, "te_transfer_latency_seconds_count", &sns[i]);
				label(s, "transport", t->transport);
				label(s, "op", op_names[op]);
				value_u64(s, cum);
			}
		}

	static const struct {
		const char *name, *help;
	} pf[] = {
		{ "te_peer_bytes_total", "Bytes moved to or from a peer segment (\"other\": peers not shown one by one)." },
		{ "te_peer_requests_total", "Transfer requests to a peer segment." },
		{ "te_peer_failed_total", "Failed transfer requests to a peer segment." },
	};
	for (int f = 0; f < 3; f++) {
		family(s, pf[f].name, "counter", pf[f].help);
		for (size_t i = 0; i < n; i++)
			for (guint j = 0; j < sns[i].peers->len; j++) {
				const peer_snap *p = &g_array_index(sns[i].peers, peer_snap, j);
				for (unsigned op = 0; op < 2; op++) {
					sample(s, pf[f].name, &sns[i]);
					label(s, "peer", p->name ? p->name : "other");
					label(s, "op", op_names[op]);
					value_u64(s, f == 0 ? p->bytes[op] : f == 1 ? p->requests[op] : p->failed[op]);
				}
			}
	}

	static const struct {
		const char *name, *type, *help;
	} df[] = {
		{ "te_device_bytes_total", "counter", "Bytes a transport moved through a device." },
		{ "te_device_in_flight_bytes", "gauge", "Bytes posted to a device and not done." },
		{ "te_device_bandwidth_bytes_per_second", "gauge",
		  "The device's bandwidth, a moving average with a time constant of 1 s." },
		{ "te_device_retries_total", "counter", "Requests sent again on a device." },
		{ "te_device_failovers_total", "counter", "Requests moved off a device to another." },
		{ "te_device_errors_total", "counter", "Device errors: links lost, failed work completions." },
	};
	for (int f = 0; f < 6; f++) {
		family(s, df[f].name, df[f].type, df[f].help);
		for (size_t i = 0; i < n; i++)
			for (guint j = 0; j < sns[i].devs->len; j++) {
				const dev_snap *d = &g_array_index(sns[i].devs, dev_snap, j);
				sample(s, df[f].name, &sns[i]);
				label(s, "transport", d->transport);
				label(s, "device", d->name);
				if (f == 2)
					value_f(s, d->bw);
				else
					value_u64(s, f == 0 ? d->bytes : f == 1 ? d->inflight_bytes : f == 3 ? d->retries
										  : f == 4 ? d->failovers
											   : d->errors);
			}
	}

	static const struct {
		const char *name, *help;
	} tf[] = {
		{ "te_transport_retries_total", "Requests a transport sent again (its devices' included)." },
		{ "te_transport_failovers_total", "Requests a transport moved to another device or rail (its devices' included)." },
		{ "te_transport_errors_total", "Errors of a transport (its devices' included)." },
	};
	for (int f = 0; f < 3; f++) {
		family(s, tf[f].name, "counter", tf[f].help);
		for (size_t i = 0; i < n; i++)
			for (guint j = 0; j < sns[i].tps->len; j++) {
				const tp_snap *t = &g_array_index(sns[i].tps, tp_snap, j);
				uint64_t v = f == 0 ? t->retries : f == 1 ? t->failovers : t->errors;
				for (guint k = 0; k < sns[i].devs->len; k++) {
					const dev_snap *d = &g_array_index(sns[i].devs, dev_snap, k);
					if (strcmp(d->transport, t->transport) == 0)
						v += f == 0 ? d->retries : f == 1 ? d->failovers : d->errors;
				}
				sample(s, tf[f].name, &sns[i]);
				label(s, "transport", t->transport);
				value_u64(s, v);
			}
	}

	static const struct {
		const char *name, *type, *help;
	} ef[] = {
		{ "te_notify_sent_total", "counter", "Notifications sent to peers." },
		{ "te_notify_received_total", "counter", "Notifications received from peers." },
		{ "te_registered_memory_bytes", "gauge", "Memory registered with the engine now." },
		{ "te_registered_memory_regions", "gauge", "Regions registered with the engine now." },
		{ "te_auth_refused_total", "counter", "Peers refused by the cluster key." },
	};
	for (int f = 0; f < 5; f++) {
		family(s, ef[f].name, ef[f].type, ef[f].help);
		for (size_t i = 0; i < n; i++) {
			const snap *x = &sns[i];
			sample(s, ef[f].name, x);
			value_u64(s, f == 0 ? x->notify_sent : f == 1 ? x->notify_received : f == 2 ? x->reg_bytes
								: f == 3 ? x->reg_regions
									 : x->auth_refused);
		}
	}
	family(s, "te_rpc_frames_total", "counter", "RPC frames on the handshake port, by kind and result.");
	for (size_t i = 0; i < n; i++)
		for (unsigned k = 0; k < TE_MRPC_KINDS; k++)
			for (unsigned r = 0; r < 2; r++) {
				sample(s, "te_rpc_frames_total", &sns[i]);
				label(s, "kind", rpc_names[k]);
				label(s, "result", r ? "refused" : "served");
				value_u64(s, sns[i].rpc[k][r]);
			}
}

int te_metrics_text(te_engine *e, char **text, size_t *len)
{
	if (text == NULL) {
		te_err("te_metrics_text: NULL output");
		return -EINVAL;
	}
	*text = NULL;
	if (len != NULL)
		*len = 0;
	if (e != NULL && e->metrics == NULL)
		return -ENOTSUP;

	GString *s = g_string_sized_new(16384);
	GArray *sns = g_array_new(FALSE, FALSE, sizeof(snap));
	GPtrArray *held = g_ptr_array_new();

	/* The list's lock keeps every engine's counters alive while it is held;
	 * each engine's own lock keeps its tables still while read. */
	g_mutex_lock(&engines_lock);
	if (e != NULL) {
		g_ptr_array_add(held, e->metrics);
	} else if (engines != NULL) {
		for (guint i = 0; i < engines->len; i++)
			g_ptr_array_add(held, g_ptr_array_index(engines, i));
	}
	for (guint i = 0; i < held->len; i++) {
		te_metrics *m = g_ptr_array_index(held, i);
		snap sn;
		g_mutex_lock(&m->lock);
		snap_take(m, &sn);
		g_array_append_val(sns, sn);
	}
	if (held->len > 0)
		text_of(s, (const snap *)(void *)sns->data, sns->len);
	for (guint i = 0; i < held->len; i++) {
		te_metrics *m = g_ptr_array_index(held, i);
		snap_clear(&g_array_index(sns, snap, i));
		g_mutex_unlock(&m->lock);
	}
	g_mutex_unlock(&engines_lock);
	g_ptr_array_unref(held);
	g_array_unref(sns);

	size_t n = s->len;
	*text = as_malloced(g_string_free(s, FALSE), n);
	if (*text == NULL)
		return -ENOMEM;
	if (len != NULL)
		*len = n;
	return 0;
}

#else /* counting compiled out */

int te_engine_stats(te_engine *e, te_stats *out)
{
	(void)e;
	(void)out;
	return -ENOTSUP;
}

int te_engine_stats_json(te_engine *e, char **json)
{
	(void)e;
	if (json != NULL)
		*json = NULL;
	return -ENOTSUP;
}

int te_metrics_text(te_engine *e, char **text, size_t *len)
{
	(void)e;
	if (text != NULL)
		*text = NULL;
	if (len != NULL)
		*len = 0;
	return -ENOTSUP;
}

#endif
