/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fencing, the target's side (docs/tcp.md, "Fencing"). An initiator that
 * fails a connection over to another rail may have left WRITEs in that
 * connection's socket, which a server thread that lags behind would still
 * apply later, over bytes written since through the other rail. So the
 * initiator names each connection (HELLO: its lane and generation) and,
 * before it sends such WRITEs again, asks us on another connection to end
 * that one (FENCE); we answer only once it can write nothing more.
 *
 * The answer's guarantee rests on two flags of the connection fenced: the
 * fencing thread sets `fenced`, then waits while `applying` is set; the
 * owner sets `applying` around every write into a WRITE's destination and
 * looks at `fenced` after setting it (tcp-server.c, apply_begin). Both are
 * sequentially consistent, so either the owner sees the fence and writes
 * nothing, or the fence sees the write and waits for its end: no lock and no
 * allocation on the data path. A connection not seen yet (still in the
 * accept queue, or its HELLO still unread) meets the lane's `floor` at its
 * HELLO and is refused before its first request.
 */
#include <sched.h>
#include <stdio.h>

#include "tcp.h"
#include "teu-dlist.h"

void tcp_lanes_init(tcp_ctx *c)
{
	g_mutex_init(&c->lanes_lock);
	c->lanes = g_hash_table_new(g_int64_hash, g_int64_equal);
	/* Lanes with connections are at most the accepted connections open at
	 * once, so a full table always has one without to forget. */
	c->max_lanes = MAX(TCP_MIN_LANES, 2 * c->cfg.max_inbound);
}

void tcp_lanes_free(tcp_ctx *c)
{
	if (c->lanes == NULL)
		return;
	for (tcp_lane *l = c->lru_head, *nx; l != NULL; l = nx) {
		nx = l->lru_next;
		g_free(l);
	}
	g_hash_table_unref(c->lanes);
	c->lanes = NULL;
	c->lru_head = c->lru_tail = NULL;
	c->nlanes = 0;
	g_mutex_clear(&c->lanes_lock);
}

static void lru_unlink(tcp_ctx *c, tcp_lane *l)
{
	TEU_DLIST_REMOVE_TAIL(c->lru_head, c->lru_tail, l, lru_prev, lru_next);
}

static void lru_front(tcp_ctx *c, tcp_lane *l)
{
	TEU_DLIST_PUSH_TAIL(c->lru_head, c->lru_tail, l, lru_prev, lru_next);
}

/* Lane `id`, made if need be (lanes_lock held). NULL when the table is full
 * of lanes with connections (cannot happen, see tcp_lanes_init). */
static tcp_lane *lane_get(tcp_ctx *c, uint64_t id)
{
	tcp_lane *l = g_hash_table_lookup(c->lanes, &id);

	if (l != NULL) {
		lru_unlink(c, l);
		lru_front(c, l);
		return l;
	}
	if (c->nlanes >= c->max_lanes) {
		tcp_lane *old = c->lru_tail;
		while (old != NULL && old->conns != NULL)
			old = old->lru_prev;
		if (old == NULL)
			return NULL;
		lru_unlink(c, old);
		g_hash_table_remove(c->lanes, &old->id);
		c->nlanes--;
		g_free(old);
	}
	l = g_new0(tcp_lane, 1);
	l->id = id;
	g_hash_table_insert(c->lanes, &l->id, l);
	lru_front(c, l);
	c->nlanes++;
	return l;
}

void tcp_sconn_unlane(tcp_sconn *sc)
{
	tcp_ctx *c = sc->io.thr->ctx;
	tcp_lane *l = sc->lane_rec;

	if (l == NULL)
		return;
	g_mutex_lock(&c->lanes_lock);
	TEU_DLIST_REMOVE(l->conns, sc, lane_prev, lane_next);
	g_mutex_unlock(&c->lanes_lock);
	sc->lane_rec = NULL;
}

/* Waits until connection `x`, fenced, is out of the write into a
 * destination it may be in: one readv or device copy. */
static void wait_applied(tcp_sconn *x)
{
	for (unsigned spins = 0; atomic_load(&x->applying); spins++) {
		if (spins < 64)
			sched_yield();
		else
			g_usleep(50);
	}
}

static int malformed(tcp_sconn *sc, const char *what, const char *why)
{
	TE_HOST_LOG_LIMITED(sc->io.thr->ctx->host, TE_LOG_WARN,
			    "malformed %s from %s: %s; closing the connection", what, sc->io.name, why);
	return -1;
}

int tcp_sconn_frame(tcp_sconn *sc, const tcp_hdr *f, bool first)
{
	tcp_ctx *c = sc->io.thr->ctx;
	bool hello = tcp_hdr_op(f) == TCP_OP_HELLO;
	const char *what = hello ? "HELLO" : "FENCE";
	uint64_t lane = f->size, gen = f->addr;
	const char *bad = tcp_lane_check(f);

	if (bad != NULL)
		return malformed(sc, what, bad);
	if (hello && (!first || sc->hello))
		return malformed(sc, what, "not the connection's first frame");
	if (!hello && !sc->hello)
		return malformed(sc, what, "no HELLO on this connection first");
	if (!hello && lane == sc->lane && gen >= sc->gen)
		return malformed(sc, what, "it names the connection it came on, or a later one");

	g_mutex_lock(&c->lanes_lock);
	tcp_lane *l = lane_get(c, lane);
	if (l == NULL) {
		g_mutex_unlock(&c->lanes_lock);
		TE_HOST_LOG_LIMITED(c->host, TE_LOG_WARN, "%s from %s: %u lanes in use; closing the connection",
				    what, sc->io.name, c->max_lanes);
		return -1;
	}
	if (hello) {
		if (gen <= l->floor) {
			g_mutex_unlock(&c->lanes_lock);
			/* Fenced before we read it: it must write nothing. */
			atomic_store(&sc->fenced, 1);
			TLOG(c, TE_LOG_DEBUG, "connection from %s (lane %016llx #%llu) was fenced before its first "
			     "request; closing it", sc->io.name, (unsigned long long)lane, (unsigned long long)gen);
			return -1;
		}
		sc->hello = true;
		sc->lane = lane;
		sc->gen = gen;
		sc->lane_rec = l;
		TEU_DLIST_PUSH(l->conns, sc, lane_prev, lane_next);
		g_mutex_unlock(&c->lanes_lock);
		TCP_HOOK(tcp_hook_hello(sc));
		return 0;
	}
	if (gen > l->floor)
		l->floor = gen;
	unsigned n = 0;
	for (tcp_sconn *x = l->conns; x != NULL; x = x->lane_next)
		if (x->gen <= l->floor) {
			atomic_store(&x->fenced, 1);
			n++;
		}
	/* Under the lock, which a connection takes to leave its lane before it
	 * is freed; its owner never waits for the lock while it writes. */
	for (tcp_sconn *x = l->conns; x != NULL; x = x->lane_next)
		if (x->gen <= l->floor)
			wait_applied(x);
	g_mutex_unlock(&c->lanes_lock);
	TLOG(c, TE_LOG_DEBUG, "FENCE from %s: lane %016llx up to #%llu, %u connections ended", sc->io.name,
	     (unsigned long long)lane, (unsigned long long)gen, n);
	TCP_HOOK(tcp_hook_fence(sc, n));
	return 1;
}
