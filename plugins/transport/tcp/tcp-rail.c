/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A peer's rails: its data addresses (its descriptor's tcp_data_addresses),
 * each up or down. A rail goes down when its connections fail or the local
 * interface they leave by goes away, and is probed, with a growing backoff
 * (at most TE_TCP_PROBE_MAX_MS), until a connection over it comes up again,
 * whatever the link events say; meanwhile its work goes to the other rails.
 */
#include "tcp-conn.h"

/* Whether `cc` may carry requests: its rail is up, or none is (then every
 * connection tries, as for a single-rail peer, so that work fails or goes
 * through rather than waiting for a probe). */
bool tcp_rail_usable(tcp_cconn *cc)
{
	tcp_peer *p = cc->peer;

	return p->nrails == 1 || atomic_load(&tcp_rail_of(cc)->up) || atomic_load(&p->rails_up) == 0;
}

/* Kicks every connection of the peer from an I/O thread. Rails change state
 * at any time, even while the segment closes: a kick that reached a
 * connection after its close would bring it back to life in its thread's
 * lists after the peer is freed. tcp_segment_close sets `closing` and waits
 * for `kicking` to drop before it sends the closes, so every kick is either
 * ahead of them or not sent. */
void tcp_peer_kick_all(tcp_peer *p)
{
	atomic_fetch_add(&p->kicking, 1);
	if (!atomic_load(&p->closing))
		for (unsigned i = 0; i < p->nconns; i++)
			tcp_kick(&p->conns[i].io, MAIL_WORK);
	atomic_fetch_sub(&p->kicking, 1);
}

/* Marks rail `r` of `p` down (once). Every connection of the peer is kicked:
 * the rail's own ones close and hand their requests over, the others pull
 * them. The rail's first connection probes it from now on. */
static void rail_down_r(tcp_peer *p, tcp_rail *r, const char *why)
{
	int one = 1;

	if (p->nrails == 1 || !atomic_compare_exchange_strong(&r->up, &one, 0))
		return;
	int left = atomic_fetch_sub(&p->rails_up, 1) - 1;
	int64_t now = tcp_now_ms();
	/* A rail whose link is known to be gone is first tried after the
	 * longest wait (its link event, when it comes, probes it at once): a
	 * connect into a dead link leaves the kernel's neighbour entry
	 * unresolved, which delays the first connect after the link returns
	 * by up to a second. */
	int64_t first = atomic_load(&r->link_down) ? p->ctx->cfg.probe_max_ms
						   : MIN(TCP_PROBE_MIN_MS, p->ctx->cfg.probe_max_ms);
	atomic_store(&r->down_at, now);
	atomic_store(&r->reprobe, 0);
	atomic_store(&r->backoff, first);
	atomic_store(&r->next_probe, now + first);
	/* A peer can close its connections at will: every line it can cause
	 * this way is rate-limited. */
	TE_HOST_LOG_LIMITED(p->ctx->host, TE_LOG_WARN, "rail %s of %s is down (%s) after %llu bytes; %d of %u rails left%s",
			    r->name, p->name, why, (unsigned long long)atomic_load(&r->bytes), left, p->nrails,
			    left > 0 ? ", probing it" : "");
	tcp_peer_kick_all(p);
}

void tcp_rail_down(tcp_cconn *cc, const char *why)
{
	rail_down_r(cc->peer, tcp_rail_of(cc), why);
}

/* A rail of `p` other than `r` that is up and shows the peer alive: it
 * answered within the last `ms` (it carries on), or it has nothing in flight
 * and answered until at most `ms` before `since` (it finished its share and
 * waits, like the application, for what is stuck elsewhere; a peer that
 * stopped right after answering it looks the same, and costs one needless
 * fail-over; a rail abandoned since its last answer does not count). A rail with requests in flight and no answer for as long says
 * the peer is slow. */
tcp_rail *tcp_other_rail_alive(tcp_peer *p, const tcp_rail *r, int64_t now, int64_t since, int64_t ms)
{
	for (unsigned i = 0; i < p->nrails; i++) {
		tcp_rail *o = &p->rails[i];
		if (o == r || !atomic_load(&o->up))
			continue;
		int64_t rx = atomic_load_explicit(&o->last_rx, memory_order_relaxed);
		/* A rail that went down after its last answer had its work taken
		 * away, not finished: its idleness says nothing of the peer. */
		bool finished = atomic_load(&o->inflight) == 0 && atomic_load(&o->down_at) < rx;
		if (now - rx <= ms || (rx + ms >= since && finished))
			return o;
	}
	return NULL;
}

void tcp_rails_link_event(tcp_ctx *c, int ifindex, const struct sockaddr *addr, bool up, const char *why)
{
	int64_t now = tcp_now_ms();

	g_mutex_lock(&c->lock); /* peers leave all_peers under it before they are freed */
	for (guint i = 0; i < c->all_peers->len; i++) {
		tcp_peer *p = g_ptr_array_index(c->all_peers, i);
		if (p->nrails < 2 || atomic_load(&p->closing))
			continue;
		for (unsigned k = 0; k < p->nrails; k++) {
			tcp_rail *r = &p->rails[k];
			if (ifindex <= 0 || atomic_load(&r->ifindex) != ifindex)
				continue;
			if (addr != NULL) {
				g_mutex_lock(&p->lock);
				bool mine = tcp_link_same_ip(addr, (struct sockaddr *)&r->local);
				g_mutex_unlock(&p->lock);
				if (!mine)
					continue;
			}
			if (!up) {
				atomic_store(&r->link_down, 1);
				if (!atomic_load(&r->up))
					continue;
				/* The last rail up stays: with nowhere else to go, its
				 * requests wait for the link (or the stall timeout). */
				if (atomic_load(&p->rails_up) <= 1) {
					TE_HOST_LOG_LIMITED(c->host, TE_LOG_WARN, "rail %s of %s: %s; no other rail is up",
							    r->name, p->name, why);
					continue;
				}
				rail_down_r(p, r, why);
			} else if (atomic_exchange(&r->link_down, 0) && !atomic_load(&r->up)) {
				/* Probed at the next check rather than after its backoff;
				 * a probe sent while the link was gone (its SYN lost,
				 * retransmitted seconds later) starts again. */
				atomic_store(&r->backoff, MIN(TCP_PROBE_MIN_MS, c->cfg.probe_max_ms));
				atomic_store(&r->next_probe, now);
				atomic_store(&r->reprobe, 1);
				TE_HOST_LOG_LIMITED(c->host, TE_LOG_INFO, "rail %s of %s: %s; probing it", r->name, p->name,
						    why);
			}
		}
	}
	g_mutex_unlock(&c->lock);
}

/* A connection over a down rail came up: the rail is back. */
void tcp_rail_up(tcp_cconn *cc)
{
	tcp_peer *p = cc->peer;
	tcp_rail *r = tcp_rail_of(cc);
	int zero = 0;

	if (p->nrails == 1 || !atomic_compare_exchange_strong(&r->up, &zero, 1))
		return;
	atomic_fetch_add(&p->rails_up, 1);
	TLOG(p->ctx, TE_LOG_INFO, "rail %s of %s is up again after %lld ms", r->name, p->name,
	     (long long)(tcp_now_ms() - atomic_load(&r->down_at)));
	/* A rail whose link went while it was the last one up was kept; now
	 * its work has somewhere else to go. */
	for (unsigned i = 0; i < p->nrails; i++)
		if (&p->rails[i] != r && atomic_load(&p->rails[i].link_down))
			rail_down_r(p, &p->rails[i], "its local interface is down");
	tcp_peer_kick_all(p); /* its other connections connect when there is work */
}

/* A failed connect over a down rail: the next try waits longer. Only the
 * rail's first connection, which probes it, sets the pace. */
void tcp_rail_probe_failed(tcp_cconn *cc)
{
	tcp_peer *p = cc->peer;
	tcp_rail *r = tcp_rail_of(cc);

	cc->probing = false;
	if (cc != &p->conns[cc->rail])
		return;
	long long b = MIN(atomic_load(&r->backoff) * 2, p->ctx->cfg.probe_max_ms);
	atomic_store(&r->backoff, b);
	atomic_store(&r->next_probe, tcp_now_ms() + b);
	TLOG(p->ctx, TE_LOG_DEBUG, "rail %s of %s still down; next try in %lld ms", r->name, p->name, b);
}

void tcp_rail_heard(tcp_cconn *cc, int64_t now)
{
	tcp_peer *p = cc->peer;
	int64_t ms = p->ctx->cfg.suspect_ms;

	/* last_rx is when work arrived on the idle connection or its last
	 * answer: a longer wait means the peer stopped answering here too. */
	if (p->nrails > 1 && ms > 0 && now - cc->last_rx > ms) {
		long long w = atomic_load(&p->woke_at);
		while (w < now && !atomic_compare_exchange_weak(&p->woke_at, &w, now))
			;
	}
	atomic_store_explicit(&tcp_rail_of(cc)->last_rx, now, memory_order_relaxed);
}

/* A peer that was silent on every rail (stopped, swapped out, overloaded)
 * answers again on one connection first: the others, whose requests it has
 * not read yet, are not suspect before it had TE_TCP_SUSPECT_MS to answer
 * them. */
int64_t tcp_rail_silent_since(tcp_cconn *cc, int64_t since)
{
	return MAX(since, (int64_t)atomic_load(&cc->peer->woke_at));
}
