/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A peer's side of the client connections (tcp-conn.h): the slices put back
 * for another connection, the FENCEs holding WRITEs until the peer answers,
 * the backlog failed as a whole, a peer freed with its last connection, and
 * the slices of transfers the host ended (expire()).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tcp-conn.h"

/* ----------------------------------------------------------- the backlog */

/* Puts slices back for another connection (p->lock held). */
void tcp_peer_retry_add(tcp_peer *p, const tcp_retry *r, size_t n)
{
	if (n == 0)
		return;
	if (p->nretry + n > p->cap_retry) {
		p->cap_retry = MAX(p->cap_retry * 2, p->nretry + n);
		p->retry = g_renew(tcp_retry, p->retry, p->cap_retry);
	}
	memcpy(p->retry + p->nretry, r, n * sizeof *r);
	p->nretry += n;
	for (size_t i = 0; i < n; i++)
		p->bl_bytes += r[i].len;
	atomic_store(&p->has_work, 1);
}

/* Completes a slice that leaves a fence or a ring unanswered. */
void tcp_slice_complete(const te_host *h, te_transfer *t, bool counted, uint64_t bytes, int err)
{
	if (counted)
		tcp_unsettled_add(t, -1);
	h->complete(h, t, bytes, err);
}

/* Whether `err` means the peer can apply nothing more of what it was sent:
 * the instance goes away (destroy), or nobody listens at its port. */
bool tcp_err_final(int err)
{
	return err == -ESHUTDOWN || err == -ECANCELED || err == -ECONNREFUSED;
}

/* A FENCE that will not be answered on its connection. The WRITEs it holds
 * fail with `err`, except those of transfers the host ended whose bytes
 * left: the peer may still apply them, so they wait for the FENCE to be
 * answered on another connection (unless `err` is final). Returns the
 * fence holding those, to send again, or NULL (freed). */
tcp_fence *tcp_fence_lost(tcp_ctx *c, tcp_fence *f, int err, size_t *nfailed)
{
	size_t k = 0;

	for (size_t i = 0; i < f->n; i++) {
		tcp_retry *r = &f->held[i];
		if (!tcp_err_final(err) && tcp_gate_closed(c, r->t)) {
			if (r->counted)
				f->held[k++] = *r;
			else
				tcp_dead_add(c, r->t, false);
			continue;
		}
		tcp_slice_complete(c->host, r->t, r->counted, 0, err);
		++*nfailed;
	}
	f->n = k;
	if (k > 0)
		return f;
	g_free(f);
	return NULL;
}

/* Puts fences back on the peer's list (p->lock held). */
void tcp_peer_fences_requeue(tcp_peer *p, tcp_fence *list)
{
	while (list != NULL) {
		tcp_fence *f = list;
		list = f->next;
		f->next = p->fences;
		p->fences = f;
		atomic_store(&p->has_work, 1);
	}
}

void tcp_fence_done(tcp_peer *p, tcp_fence *f)
{
	tcp_ctx *c = p->ctx;
	tcp_retry *back = g_new(tcp_retry, f->n);
	size_t k = 0, nback = 0;

	/* The peer applies nothing more from the fenced connection: what
	 * the host ended is settled now, the rest goes out again. */
	for (size_t i = 0; i < f->n; i++) {
		tcp_retry r = f->held[i];
		if (tcp_gate_closed(c, r.t)) {
			f->held[k++] = r;
			continue;
		}
		if (r.counted)
			tcp_unsettled_add(r.t, -1);
		r.counted = false;
		back[nback++] = r;
	}
	if (nback > 0) {
		g_mutex_lock(&p->lock);
		tcp_peer_retry_add(p, back, nback);
		g_mutex_unlock(&p->lock);
	}
	g_free(back);
	for (size_t i = 0; i < k; i++)
		tcp_dead_add(c, f->held[i].t, f->held[i].counted);
	g_free(f);
	if (nback > 0)
		tcp_peer_kick_all(p);
}

/* Completes every slice still waiting in the peer's backlog and retry list,
 * and the WRITEs held by fences not yet sent (but those of transfers the host
 * ended, which wait for their FENCE's answer, see tcp_fence_lost). */
void tcp_peer_fail_pending(tcp_peer *p, int err)
{
	tcp_ctx *c = p->ctx;
	const te_host *h = c->host;
	uint64_t slice = c->cfg.slice;
	te_transfer *t;
	tcp_retry *retry;
	tcp_fence *fences, *kept = NULL;
	size_t nretry;

	g_mutex_lock(&p->lock);
	t = p->bl_head;
	/* Out of the backlog for expire(): no bytes left in plugin_data[1],
	 * the slices left in plugin_data[2] (no longer a link). */
	for (te_transfer *u = t; u != NULL; u = (te_transfer *)u->plugin_data[0]) {
		uint64_t left = u->plugin_data[1];
		u->plugin_data[2] = (uintptr_t)((left + slice - 1) / slice);
		u->plugin_data[1] = 0;
	}
	p->bl_head = p->bl_tail = NULL;
	retry = p->retry;
	nretry = p->nretry;
	p->retry = NULL;
	p->nretry = p->cap_retry = 0;
	p->bl_bytes = 0;
	fences = p->fences;
	p->fences = NULL;
	atomic_store(&p->has_work, 0);
	g_mutex_unlock(&p->lock);

	size_t n = 0;
	for (size_t i = 0; i < nretry; i++, n++)
		h->complete(h, retry[i].t, 0, err);
	g_free(retry);
	while (fences != NULL) {
		tcp_fence *next = fences->next, *f = tcp_fence_lost(c, fences, err, &n);
		if (f != NULL) {
			f->next = kept;
			kept = f;
		}
		fences = next;
	}
	while (t != NULL) {
		te_transfer *next = (te_transfer *)t->plugin_data[0];
		uint64_t slices = t->plugin_data[2];
		/* `t` may be reused once its last slice completes: read first. */
		for (uint64_t i = 0; i < slices; i++, n++)
			h->complete(h, t, 0, err);
		t = next;
	}
	if (kept != NULL) {
		g_mutex_lock(&p->lock);
		tcp_peer_fences_requeue(p, kept);
		g_mutex_unlock(&p->lock);
	}
	if (n > 0)
		TE_HOST_LOG_LIMITED(p->ctx->host, TE_LOG_WARN, "%zu queued requests to %s failed: %s", n, p->name,
				    tcp_strerror(err));
}

/* The earliest deadline among the transfers waiting for a connection. */
int64_t tcp_peer_waiting_deadline(tcp_peer *p)
{
	const tcp_ctx *c = p->ctx;
	const te_host *h = c->host;
	int64_t dl = 0;

	if (!c->deadlines)
		return 0;
	g_mutex_lock(&p->lock);
	for (te_transfer *t = p->bl_head; t != NULL; t = (te_transfer *)t->plugin_data[0]) {
		int64_t d = h->transfer_deadline(h, t);
		if (d > 0 && (dl == 0 || d < dl))
			dl = d;
	}
	for (size_t i = 0; i < p->nretry; i++) {
		int64_t d = h->transfer_deadline(h, p->retry[i].t);
		if (d > 0 && (dl == 0 || d < dl))
			dl = d;
	}
	g_mutex_unlock(&p->lock);
	return dl;
}

bool tcp_peer_hold(tcp_ctx *c, tcp_peer *p)
{
	g_mutex_lock(&c->lock);
	bool live = g_hash_table_contains(c->live_peers, p);
	if (live)
		atomic_fetch_add(&p->kicking, 1);
	g_mutex_unlock(&c->lock);
	return live;
}

/* Called once per connection at the end of the loop iteration that retired
 * it; the last one frees the peer. */
void tcp_peer_retire_conn(tcp_peer *p)
{
	if (atomic_fetch_sub(&p->live_conns, 1) != 1)
		return;
	tcp_ctx *c = p->ctx;
	for (unsigned r = 0; p->nrails > 1 && r < p->nrails; r++)
		TLOG(c, TE_LOG_DEBUG, "rail %s of %s carried %llu bytes", p->rails[r].name, p->name,
		     (unsigned long long)atomic_load(&p->rails[r].bytes));
	g_mutex_lock(&c->lock);
	g_ptr_array_remove_fast(c->all_peers, p);
	g_hash_table_remove(c->live_peers, p);
	g_mutex_unlock(&c->lock);
	/* A caller that found it live just before is done with it in moments
	 * (it sees `closing` and lets go). */
	while (atomic_load(&p->kicking) > 0)
		g_thread_yield();
	tcp_peer_fail_pending(p, -ECANCELED); /* nothing should be left; safe if so */
	g_mutex_clear(&p->lock);
	g_free(p->rails);
	g_free(p->key);
	g_free(p);
}

/* ------------------------------------------------------------- expire */

/* How long a slice of an ended transfer waits before it completes: the host
 * publishes the early end right after expire() returns (a few instructions),
 * and a completion that came first would be taken for the transfer's own
 * end. Nothing waits for these completions but the task's storage and, for
 * a WRITE held by a FENCE, its settling. */
#define DEAD_GRACE_NS 2000000

void tcp_dead_add(tcp_ctx *c, te_transfer *t, bool counted)
{
	struct tcp_dead d = { t, counted, tcp_now_ns() };

	g_mutex_lock(&c->dead_lock);
	g_array_append_val(c->dead, d);
	atomic_store(&c->ndead, (int)c->dead->len);
	g_mutex_unlock(&c->dead_lock);
	tcp_io_arm(&c->threads[0]);
}

bool tcp_dead_flush(tcp_ctx *c, bool all)
{
	const te_host *h = c->host;
	int64_t now = tcp_now_ns();
	GArray *due = NULL;
	bool left;

	g_mutex_lock(&c->dead_lock);
	if (all || atomic_load(&c->expiring) == 0) {
		guint k = 0;
		for (guint i = 0; i < c->dead->len; i++) {
			struct tcp_dead d = g_array_index(c->dead, struct tcp_dead, i);
			if (all || now - d.at >= DEAD_GRACE_NS) {
				if (due == NULL)
					due = g_array_new(FALSE, FALSE, sizeof d);
				g_array_append_val(due, d);
			} else {
				g_array_index(c->dead, struct tcp_dead, k++) = d;
			}
		}
		g_array_set_size(c->dead, k);
	}
	left = c->dead->len > 0;
	atomic_store(&c->ndead, (int)c->dead->len);
	g_mutex_unlock(&c->dead_lock);
	/* Completed with the lock dropped (complete() may submit); not with
	 * -ETIMEDOUT, which would tell the host it gave up on the peer. */
	for (guint i = 0; due != NULL && i < due->len; i++) {
		struct tcp_dead d = g_array_index(due, struct tcp_dead, i);
		tcp_slice_complete(h, d.t, d.counted, 0, -ECANCELED);
	}
	if (due != NULL)
		g_array_unref(due);
	return left;
}

/*
 * The host ended `t` (deadline, cancel) and closed its gate: nothing of
 * its memory is touched any more (every touch is inside its gate). Its
 * slices still waiting in the peer's backlog and retries complete here; the
 * connections carrying the others are told (MISS_EXPIRE) and end (their
 * other requests go again), completing them. Returns 1 while a WRITE slice
 * of `t` whose bytes left has neither its answer nor its FENCE's: those
 * complete once the peer answers the FENCE of their connection.
 */
int tcp_expire(void *ctx, te_transfer *t)
{
	tcp_ctx *c = ctx;
	tcp_peer *p = t->seg_ctx;
	uint64_t slice = c->cfg.slice, n = 0;

	atomic_fetch_add(&c->expiring, 1);
	/* `t` may have completed meanwhile and its peer gone with it. */
	if (!tcp_peer_hold(c, p)) {
		atomic_fetch_sub(&c->expiring, 1);
		return 0;
	}
	g_mutex_lock(&p->lock);
	/* Still in the backlog (slices not taken): out of it. */
	if (t->plugin_data[1] > 0) {
		te_transfer *next = (te_transfer *)t->plugin_data[0], *prev = (te_transfer *)t->plugin_data[2];
		uint64_t left = t->plugin_data[1];
		if (prev != NULL)
			prev->plugin_data[0] = (uintptr_t)next;
		else
			p->bl_head = next;
		if (next != NULL)
			next->plugin_data[2] = (uintptr_t)prev;
		else
			p->bl_tail = prev;
		p->bl_bytes -= left;
		n += (left + slice - 1) / slice;
		t->plugin_data[1] = 0;
	}
	for (size_t i = 0; i < p->nretry;) {
		if (p->retry[i].t != t) {
			i++;
			continue;
		}
		p->bl_bytes -= p->retry[i].len;
		p->retry[i] = p->retry[--p->nretry];
		n++;
	}
	atomic_store(&p->has_work, p->bl_head != NULL || p->nretry > 0 || p->fences != NULL);
	g_mutex_unlock(&p->lock);
	/* Read before any completion: the last one may release `t`. */
	int unsettled = t->opcode == TE_OP_WRITE && tcp_unsettled(t) > 0;
	/* Its slices on rings, sent or not: their connections end. Every
	 * connection is told (which carries them is its holder's to know:
	 * its I/O thread, or a caller waiting on it, woken below); one
	 * without them does nothing. */
	if (!atomic_load(&p->closing))
		for (unsigned k = 0; k < p->nconns; k++) {
			atomic_fetch_or(&p->conns[k].missed, MISS_EXPIRE);
			tcp_kick(&p->conns[k].io, MAIL_WORK);
		}
	atomic_fetch_sub(&p->kicking, 1);
	tcp_wake(c);
	for (uint64_t i = 0; i < n; i++)
		tcp_dead_add(c, t, false);
	atomic_fetch_sub(&c->expiring, 1);
	return unsettled;
}
