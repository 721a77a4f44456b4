/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Prepared transfers (te_xfer_list_prepare, te_submit_prepared). A list
 * resolves each piece once: to its registered region (this engine's memory)
 * or to the buffer of the segment's descriptor that holds it. What a piece
 * resolved to is only used while the thing it was resolved against is the
 * current one: the registry's epoch, or the segment's version (te_segver.gen).
 * A post finds them current under the registry and data locks (readers),
 * which the submit path holds anyway; when one is not, the list is resolved
 * again first, once for every post after it. A post holds its lists' own
 * reader lock from start to end, so that the pairs merged when counting the
 * tasks are the ones merged when making them; resolving takes the writer
 * side. So a list holds no registration and no segment, and a post does no
 * range search, allocation or lock per piece.
 */
#include <string.h>

#include "internal.h"
#include "metrics.h"

#define PREP_CHUNK 512 /* transfers handed to a transport per call */

/* A piece and what it resolved to, side by side: a post reads them at
 * random indices, one cache line each. */
typedef struct lpiece {
	uint64_t addr;
	uint64_t length;
	/* The te_region (TE_LOCAL_SEGMENT) or 1 + the index of the descriptor
	 * buffer holding it; NULL when it lies outside the memory as last
	 * resolved (against the list's key). A region is only looked at while
	 * the registry's epoch is the key. */
	const void *ref;
} lpiece;

struct te_xfer_list {
	te_engine *engine;
	te_segment_id segment;
	size_t n;
	lpiece *pieces;
	uint64_t key;
	GRWLock lock; /* posts read ref and key under it; resolving writes them */
};

/* Resolves every piece against the registry (its reader lock held) or the
 * segment version `sv`; returns the first piece left unresolved, or n. */
static size_t resolve(te_xfer_list *l, te_segver *sv)
{
	te_engine *e = l->engine;
	size_t bad = l->n;

	for (size_t i = 0; i < l->n; i++) {
		const lpiece *p = &l->pieces[i];
		const void *r = sv == NULL ? (const void *)te_memreg_find_locked(&e->mem, p->addr, p->length)
					   : (const void *)te_desc_slot(sv->desc, p->addr, p->length);
		l->pieces[i].ref = r;
		if (r == NULL && bad == l->n)
			bad = i;
	}
	return bad;
}

int te_xfer_list_prepare(te_engine *e, te_segment_id segment, const te_piece *pieces, size_t n, unsigned flags,
			 te_xfer_list **out)
{
	if (out != NULL)
		*out = NULL;
	if (e == NULL || out == NULL || (pieces == NULL && n > 0)) {
		te_err("te_xfer_list_prepare: NULL %s", e == NULL ? "engine" : out == NULL ? "output pointer" : "pieces");
		return -EINVAL;
	}
	if (n == 0 || n > TE_XFER_LIST_MAX) {
		te_err("te_xfer_list_prepare: %zu pieces outside [1, %u]", n, TE_XFER_LIST_MAX);
		return -EINVAL;
	}
	if (flags != 0) {
		te_err("te_xfer_list_prepare: unknown flags 0x%x", flags);
		return -EINVAL;
	}
	if (segment < 0) {
		te_err("te_xfer_list_prepare: segment id %d", segment);
		return TE_ERR_SEGMENT;
	}
	for (size_t i = 0; i < n; i++) {
		if (pieces[i].length == 0 || pieces[i].addr + pieces[i].length < pieces[i].addr ||
		    (segment == TE_LOCAL_SEGMENT && pieces[i].addr == 0)) {
			te_err("te_xfer_list_prepare: piece %zu (0x%llx+%llu) is %s", i,
			       (unsigned long long)pieces[i].addr, (unsigned long long)pieces[i].length,
			       pieces[i].length == 0 ? "empty" : pieces[i].addr == 0 ? "at NULL" : "past the address space");
			return -EINVAL;
		}
	}
	te_xfer_list *l = g_try_malloc0(sizeof *l);
	lpiece *copy = g_try_malloc(n * sizeof *copy);
	if (l == NULL || copy == NULL) {
		g_free(l);
		g_free(copy);
		te_err("te_xfer_list_prepare: no memory for %zu pieces", n);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		copy[i] = (lpiece){ pieces[i].addr, pieces[i].length, NULL };
	l->engine = e;
	l->segment = segment;
	l->n = n;
	l->pieces = copy;
	g_rw_lock_init(&l->lock);

	int rc = 0;
	size_t bad = n;
	for (int attempt = 0; attempt < 2; attempt++) {
		g_rw_lock_reader_lock(&e->data);
		g_rw_lock_reader_lock(&e->mem.lock);
		te_segver *sv = NULL;
		if (segment != TE_LOCAL_SEGMENT) {
			te_segment *s = g_hash_table_lookup(e->segments, GINT_TO_POINTER(segment));
			sv = s != NULL ? s->cur : NULL;
			rc = s == NULL ? TE_ERR_SEGMENT : sv == NULL ? TE_ERR_NO_TRANSPORT : 0;
		}
		if (rc == 0) {
			bad = resolve(l, sv);
			l->key = sv != NULL ? sv->gen : e->mem.epoch;
		}
		g_rw_lock_reader_unlock(&e->mem.lock);
		g_rw_lock_reader_unlock(&e->data);
		/* The peer may have registered memory since its descriptor was
		 * fetched: fetch it once more before refusing. */
		if (rc < 0 || bad == n || segment == TE_LOCAL_SEGMENT || attempt > 0 ||
		    te_segment_refresh(e, segment) < 0)
			break;
	}
	if (rc == TE_ERR_SEGMENT)
		te_err("te_xfer_list_prepare: unknown segment id %d", segment);
	else if (rc == TE_ERR_NO_TRANSPORT)
		te_err("te_xfer_list_prepare: segment %d has no transport", segment);
	else if (rc == 0 && bad < n) {
		te_err("te_xfer_list_prepare: piece %zu (0x%llx+%llu) is outside %s", bad,
		       (unsigned long long)pieces[bad].addr, (unsigned long long)pieces[bad].length,
		       segment == TE_LOCAL_SEGMENT ? "every registered region" : "the segment's buffers");
		rc = TE_ERR_ADDRESS;
	}
	if (rc < 0) {
		te_xfer_list_free(l);
		return rc;
	}
	*out = l;
	return 0;
}

void te_xfer_list_free(te_xfer_list *l)
{
	if (l == NULL)
		return;
	g_rw_lock_clear(&l->lock);
	g_free(l->pieces);
	g_free(l);
}

int64_t te_xfer_list_count(const te_xfer_list *l)
{
	if (l == NULL) {
		te_err("te_xfer_list_count: NULL list");
		return -EINVAL;
	}
	return (int64_t)l->n;
}

/* ----------------------------------------------------------------- post */

/* Whether pair (i, j) continues the run that ends at (lend, rend) in the
 * same region and buffer; the rule both passes of a post apply alike. */
static inline bool continues(const te_xfer_list *L, const te_xfer_list *R, uint32_t i, uint32_t j, uint64_t lend,
			     uint64_t rend, const void *lref, const void *rref)
{
	return L->pieces[i].addr == lend && R->pieces[j].addr == rend && L->pieces[i].ref == lref && R->pieces[j].ref == rref &&
	       lref != NULL && rref != NULL;
}

#define IDX(a, k) ((a) != NULL ? (a)[k] : (uint32_t)(k))

/* Checks what needs no lock: every index inside its list, equal lengths. */
static int check_pairs(const te_xfer_list *L, const uint32_t *li, const te_xfer_list *R, const uint32_t *ri,
		       size_t n)
{
	for (size_t k = 0; k < n; k++) {
		uint32_t i = IDX(li, k), j = IDX(ri, k);
		if (i >= L->n || j >= R->n) {
			te_err("te_submit_prepared: pair %zu: %s index %u outside the list's %zu pieces", k,
			       i >= L->n ? "local" : "remote", i >= L->n ? i : j, i >= L->n ? L->n : R->n);
			return -EINVAL;
		}
		if (L->pieces[i].length != R->pieces[j].length) {
			te_err("te_submit_prepared: pair %zu: local piece %u has %llu bytes, remote piece %u %llu", k, i,
			       (unsigned long long)L->pieces[i].length, j, (unsigned long long)R->pieces[j].length);
			return -EINVAL;
		}
	}
	return 0;
}

typedef struct pdispatch {
	te_transport_inst *tp;
	te_transfer *pend[PREP_CHUNK];
	size_t n;
} pdispatch;

/* Hands the queued transfers over; the registry lock is not held (a
 * transport's submit may look up buffers). */
static void pflush(pdispatch *d)
{
	te_transport_hand_over(d->tp, d->pend, d->n);
	d->n = 0;
}

/* The current version of a remote list's segment (data lock held), or a
 * negative error, logged. */
static int current_sv(te_engine *e, const te_xfer_list *R, te_segment **s, te_segver **sv)
{
	*s = g_hash_table_lookup(e->segments, GINT_TO_POINTER(R->segment));
	*sv = *s != NULL ? (*s)->cur : NULL;
	if (*sv != NULL)
		return 0;
	if (*s == NULL)
		te_err("te_submit_prepared: segment %d of the remote list was closed; prepare it again", R->segment);
	else
		te_err("te_submit_prepared: segment %d has no transport", R->segment);
	return *s == NULL ? TE_ERR_SEGMENT : TE_ERR_NO_TRANSPORT;
}

/* Resolves `l` against what is current, if it is not: its writer lock is
 * taken with no other lock held (a post holding its reader lock takes the
 * registry lock again after handing transfers on). */
static int resolve_again(te_engine *e, te_xfer_list *l)
{
	te_segment *s = NULL;
	te_segver *sv = NULL;
	int rc = 0;

	g_rw_lock_writer_lock(&l->lock);
	g_rw_lock_reader_lock(&e->data);
	g_rw_lock_reader_lock(&e->mem.lock);
	if (l->segment != TE_LOCAL_SEGMENT)
		rc = current_sv(e, l, &s, &sv);
	uint64_t key = sv != NULL ? sv->gen : e->mem.epoch;
	if (rc == 0 && l->key != key) {
		size_t bad = resolve(l, sv);
		if (bad < l->n)
			te_warn("prepared list of segment %d: piece %zu (0x%llx+%llu) is no longer inside %s; "
				"its transfers become INVALID",
				l->segment, bad, (unsigned long long)l->pieces[bad].addr,
				(unsigned long long)l->pieces[bad].length,
				sv == NULL ? "registered memory" : "the segment's buffers");
		l->key = key;
	}
	g_rw_lock_reader_unlock(&e->mem.lock);
	g_rw_lock_reader_unlock(&e->data);
	g_rw_lock_writer_unlock(&l->lock);
	return rc;
}

static void unlock_lists(te_xfer_list *L, te_xfer_list *R)
{
	if (R != L)
		g_rw_lock_reader_unlock(&R->lock);
	g_rw_lock_reader_unlock(&L->lock);
}

#define MAX_RESOLVE_ROUNDS 64

int te_submit_prepared(te_engine *e, te_batch_id id, uint32_t opcode, const te_xfer_list *Lc, const uint32_t *li,
		       const te_xfer_list *Rc, const uint32_t *ri, size_t n, size_t *first_task, size_t *n_tasks)
{
	/* Posting changes nothing of a list but what its lock guards. */
	te_xfer_list *L = (te_xfer_list *)Lc, *R = (te_xfer_list *)Rc;

	if (first_task != NULL)
		*first_task = 0;
	if (n_tasks != NULL)
		*n_tasks = 0;
	if (e == NULL || L == NULL || R == NULL) {
		te_err("te_submit_prepared: NULL %s", e == NULL ? "engine" : L == NULL ? "local list" : "remote list");
		return -EINVAL;
	}
	if (L->engine != e || R->engine != e) {
		te_err("te_submit_prepared: the %s list was prepared on another engine", L->engine != e ? "local" : "remote");
		return -EINVAL;
	}
	if (L->segment != TE_LOCAL_SEGMENT) {
		te_err("te_submit_prepared: the local list is of segment %d, not of local memory", L->segment);
		return -EINVAL;
	}
	if (opcode != TE_OP_READ && opcode != TE_OP_WRITE) {
		te_err("te_submit_prepared: unknown opcode %u", opcode);
		return -EINVAL;
	}
	if (n == 0)
		return 0;
	if (n > UINT32_MAX) {
		te_err("te_submit_prepared: %zu pairs", n);
		return -EINVAL;
	}
	int rc = check_pairs(L, li, R, ri, n);
	if (rc < 0)
		return rc;
	bool remote = R->segment != TE_LOCAL_SEGMENT;
	if (remote && atomic_load_explicit(&e->lost, memory_order_relaxed) > 0)
		te_segment_refresh_lost(e, R->segment);

	/* Both lists resolved against what is current, under their reader
	 * locks and the submit path's. */
	te_segment *s = NULL;
	te_segver *sv = NULL;
	for (int round = 0;; round++) {
		g_rw_lock_reader_lock(&L->lock);
		if (R != L)
			g_rw_lock_reader_lock(&R->lock);
		g_rw_lock_reader_lock(&e->data);
		g_rw_lock_reader_lock(&e->mem.lock);
		te_xfer_list *stale = NULL;
		rc = remote ? current_sv(e, R, &s, &sv) : 0;
		if (rc == 0 && L->key != e->mem.epoch)
			stale = L;
		else if (rc == 0 && R->key != (remote ? sv->gen : e->mem.epoch))
			stale = R;
		if (rc == 0 && stale == NULL)
			break;
		g_rw_lock_reader_unlock(&e->mem.lock);
		g_rw_lock_reader_unlock(&e->data);
		unlock_lists(L, R);
		if (rc == 0 && round == MAX_RESOLVE_ROUNDS) {
			te_err("te_submit_prepared: the registry or the segment changed %d times while resolving", round);
			rc = -EAGAIN;
		}
		if (rc < 0 || (rc = resolve_again(e, stale)) < 0)
			return rc;
	}

	/* Pass 1: how many tasks the pairs make. */
	size_t m = 0;
	uint64_t lend = 0, rend = 0;
	const void *lref = NULL, *rref = NULL;
	for (size_t k = 0; k < n; k++) {
		uint32_t i = IDX(li, k), j = IDX(ri, k);
		if (k == 0 || !continues(L, R, i, j, lend, rend, lref, rref)) {
			m++;
			lref = L->pieces[i].ref;
			rref = R->pieces[j].ref;
			lend = L->pieces[i].addr;
			rend = R->pieces[j].addr;
		}
		lend += L->pieces[i].length;
		rend += R->pieces[j].length;
	}

	te_batch *b = NULL;
	size_t base = 0;
	rc = te_batch_reserve(e, id, m, "te_submit_prepared", &b, &base);
	if (rc < 0) {
		g_rw_lock_reader_unlock(&e->mem.lock);
		g_rw_lock_reader_unlock(&e->data);
		unlock_lists(L, R);
		return rc;
	}
	if (first_task != NULL)
		*first_task = base;
	if (n_tasks != NULL)
		*n_tasks = m;

	/* Pass 2: the tasks, each as route() in batch.c makes one, minus the
	 * searches, handed on in chunks. The remote ones hold the segment
	 * version and the transport: counted for all before any is handed on,
	 * the surplus given back at the end. */
	bool canceled = atomic_load(&b->canceled);
	int64_t deadline = atomic_load_explicit(&b->deadline, memory_order_relaxed);
	uint64_t t0 = e->metrics != NULL ? te_metrics_now() : 0;
	te_mlate late;
	te_msubmit ms = { 0 };
	if (e->metrics != NULL)
		te_metrics_late_begin(e->metrics, t0, &late);
	te_transport_inst *tp = remote ? sv->tp : NULL;
	te_mblock *mb = remote ? tp->hc.mb : NULL;
	te_mpeer *peer = remote ? s->mpeer : NULL;
	if (remote) {
		atomic_fetch_add_explicit(&sv->refs, (int)m, memory_order_relaxed);
		atomic_fetch_add_explicit(&tp->inflight, (int)m, memory_order_relaxed);
	}
	/* The regions the refs point at are valid while the epoch stays; when
	 * it moved while a chunk was handed on, the rest look theirs up. */
	uint64_t epoch = e->mem.epoch;
	bool search = false;
	pdispatch d = { .tp = tp };
	size_t routed = 0, invalid = 0, k = 0;
	for (size_t ti = 0; ti < m; ti++) {
		uint32_t i = IDX(li, k), j = IDX(ri, k);
		const void *lref1 = L->pieces[i].ref, *rref1 = R->pieces[j].ref;
		uint64_t len = L->pieces[i].length;
		for (k++; k < n; k++) {
			uint32_t i2 = IDX(li, k), j2 = IDX(ri, k);
			if (!continues(L, R, i2, j2, L->pieces[i].addr + len, R->pieces[j].addr + len, lref1, rref1))
				break;
			len += L->pieces[i2].length;
		}
		te_task *t = &b->tasks[base + ti];
		te_task_init(t, b, opcode, (void *)(uintptr_t)L->pieces[i].addr, R->pieces[j].addr, len, NULL, t0);
		t->deadline = deadline;
		if (canceled) { /* counted as te_submit() counts it: before routing */
			te_batch_task_end(t, TE_TASK_CANCELED, -ECANCELED);
			continue;
		}
		t->mb = mb;
		t->mpeer = peer;
		const te_region *lr = lref1, *rr = remote ? NULL : rref1;
		if (search && lr != NULL && rref1 != NULL) {
			lr = te_memreg_find_locked(&e->mem, L->pieces[i].addr, len);
			if (!remote)
				rr = te_memreg_find_locked(&e->mem, R->pieces[j].addr, len);
		}
		if (lr == NULL || rref1 == NULL || (!remote && rr == NULL)) {
			bool lbad = lr == NULL;
			te_warn_limited("te_submit_prepared: task %zu: %s piece %u is no longer inside %s", base + ti,
					lbad ? "local" : "remote", lbad ? i : j,
					lbad || !remote ? "registered memory" : "the segment's buffers");
			te_batch_task_end(t, TE_TASK_INVALID, TE_ERR_ADDRESS);
			invalid++;
			continue;
		}
		t->xfer.local_location = lr->location;
		t->dev = lr->dev;
		if (!remote) {
			if (t->dev == NULL)
				t->dev = rr->dev;
			if (e->metrics != NULL)
				te_metrics_submit_one(e->metrics, &ms, t);
			te_local_submit(e, t);
			continue;
		}
		t->sv = sv;
		t->xfer.seg_ctx = sv->seg_ctx;
		t->tp = tp;
		if (routed++ == 0)
			te_batch_note_transport(b, tp);
		if (e->metrics != NULL)
			te_metrics_submit_one(e->metrics, &ms, t);
		if (t->dev != NULL && !te_region_direct(lr, tp)) {
			te_stage_submit(e, t);
			continue;
		}
		te_task_handed(t);
		d.pend[d.n++] = &t->xfer;
		if (d.n == PREP_CHUNK) {
			g_rw_lock_reader_unlock(&e->mem.lock);
			pflush(&d);
			g_rw_lock_reader_lock(&e->mem.lock);
			search |= e->mem.epoch != epoch;
		}
	}
	if (remote && routed < m) {
		/* The segment's own reference stays while the data lock is held. */
		atomic_fetch_sub_explicit(&sv->refs, (int)(m - routed), memory_order_relaxed);
		atomic_fetch_sub_explicit(&tp->inflight, (int)(m - routed), memory_order_release);
	}
	g_rw_lock_reader_unlock(&e->mem.lock);
	pflush(&d);
	te_stage_flush(e);
	g_rw_lock_reader_unlock(&e->data);
	unlock_lists(L, R);
	if (e->metrics != NULL)
		te_metrics_late_end(&late);
	te_metrics_submit_flush(&ms);
	if (deadline != 0)
		te_deadline_arm(e, id, base, m, deadline);
	return (int)(invalid > INT32_MAX ? INT32_MAX : invalid);
}
