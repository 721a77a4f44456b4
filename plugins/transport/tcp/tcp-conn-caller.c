/* SPDX-License-Identifier: Apache-2.0 */
/* A client connection driven by the thread that submits and waits (see below). */
#include <errno.h>
#include <stdio.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "tcp-conn.h"
#include "teu-dlist.h"

/* -------------------------------------------------------------- callers */

/*
 * One request, waited for, costs four thread hand-offs when the I/O threads
 * do everything: the submitter wakes the connection's I/O thread, which
 * sends; the reply wakes it again, and it wakes the waiter. A thread that
 * submits a small run of requests to a peer whose connection is idle sends
 * them itself instead (tcp_direct_submit), and when it then waits
 * (te_batch_wait, through tcp_progress) it receives the replies itself,
 * sleeping in poll() on the socket: the reply wakes the waiter directly. The
 * I/O thread keeps everything else: deep batches, busy connections, connects,
 * a request whose submitter does not wait for it (the reply raises its epoll
 * edge as always, and a caller that holds the connection then hands that over
 * when it lets go).
 *
 * A caller only ever tries to take a connection (never waits for it), holds
 * the peer's `kicking` count meanwhile so that the segment's close waits for
 * it, and lets go before it returns to the application.
 */

/* This thread's last submit that went out directly. The peer is only a name
 * until it is found in live_peers (it may have been freed since). */
static _Thread_local struct {
	tcp_ctx *c;
	tcp_peer *p;
	unsigned idx;
} tls_direct;

/* Lets go of a connection, handing to its I/O thread what it missed
 * meanwhile: mail, a timeout check, and readiness while requests are still
 * on the ring (the I/O thread finishes them). With nothing on the ring, a
 * missed readable or writable edge means nothing (an EOF also raises
 * MISS_HUP). */
static void caller_let_go(tcp_cconn *cc)
{
	const unsigned idle_noise = MISS_RD | MISS_WR;
	bool work = cc->head != cc->tail;
	unsigned m = atomic_load(&cc->missed);

	if ((m & MISS_SCAN) && cc->state == CS_UP) {
		/* The periodic check came while the application held it: done
		 * here (a caller may hold it turn after turn of its wait). */
		atomic_fetch_and(&cc->missed, ~(unsigned)MISS_SCAN);
		tcp_cconn_check_stall(cc, tcp_now_ms());
		work = cc->head != cc->tail;
	}
	if (!work)
		atomic_fetch_and(&cc->missed, ~idle_noise);
	atomic_store(&cc->drv, 0);
	m = atomic_load(&cc->missed);
	if (!work)
		m &= ~idle_noise;
	if (m != 0)
		tcp_kick(&cc->io, MAIL_WORK);
	else if (work)
		tcp_io_arm(cc->io.thr); /* its I/O thread may be asleep with no check due */
}

/* Sends what is pending, takes in what arrived, completes what finished.
 * 1: something moved, 0: nothing, -1: the connection failed (its requests
 * completed or moved). */
static int caller_turn(tcp_cconn *cc)
{
	int moved = tcp_cconn_step(cc, cc->snd < cc->head, cc->rcv < cc->head || cc->tail < cc->head);

	if (moved < 0)
		return -1;
	/* A transfer on it ended (deadline, cancel): the connection ends. */
	if (cc->gate_shut || (atomic_load_explicit(&cc->missed, memory_order_relaxed) & MISS_EXPIRE)) {
		atomic_fetch_and(&cc->missed, ~(unsigned)MISS_EXPIRE);
		if (tcp_cconn_expire(cc))
			return -1;
	}
	return moved;
}

bool tcp_direct_submit(tcp_peer *p)
{
	tcp_ctx *c = p->ctx;
	bool sent = false;

	atomic_fetch_add(&p->kicking, 1);
	for (unsigned k = 0; k < p->nconns && !atomic_load(&p->closing); k++) {
		tcp_cconn *cc = &p->conns[k];
		if (!tcp_cconn_take(cc))
			continue;
		/* Only an idle connection that is up and whose rail is up: the rest
		 * is the I/O thread's. */
		if (cc->state != CS_UP || cc->head != cc->tail || !tcp_rail_usable(cc) ||
		    (p->nrails > 1 && !atomic_load(&tcp_rail_of(cc)->up))) {
			caller_let_go(cc);
			continue;
		}
		tcp_cconn_pull(cc);
		if (cc->head != cc->tail && caller_turn(cc) >= 0 && cc->head != cc->tail) {
			tls_direct.c = c;
			tls_direct.p = p;
			tls_direct.idx = k;
		}
		if (cc->state == CS_UP)
			tcp_cconn_set_events(cc, false); /* a send that waits for room: the I/O thread's if need be */
		caller_let_go(cc);
		sent = true;
		break;
	}
	atomic_fetch_sub(&p->kicking, 1);
	return sent;
}

void tcp_direct_forget(void)
{
	tls_direct.c = NULL;
}

/* Callers asleep in tcp_progress(), each on an eventfd that tcp_wake()
 * rings. The eventfds are kept for reuse, per instance (not per thread: a
 * plugin cannot rely on a thread-exit hook after it is unloaded). */
typedef struct tcp_sleeper {
	int efd;
	struct tcp_sleeper *next, *prev;
} tcp_sleeper;

static tcp_sleeper *sleeper_get(tcp_ctx *c)
{
	g_mutex_lock(&c->sleep_lock);
	tcp_sleeper *s = c->idle_sleepers;
	if (s != NULL) {
		c->idle_sleepers = s->next;
	} else {
		int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (fd < 0) {
			g_mutex_unlock(&c->sleep_lock);
			return NULL;
		}
		s = g_new0(tcp_sleeper, 1);
		s->efd = fd;
	}
	TEU_DLIST_PUSH(c->sleepers, s, prev, next);
	g_mutex_unlock(&c->sleep_lock);
	uint64_t v;
	while (read(s->efd, &v, sizeof v) > 0) /* rung for an earlier sleep */
		;
	return s;
}

static void sleeper_put(tcp_ctx *c, tcp_sleeper *s)
{
	g_mutex_lock(&c->sleep_lock);
	TEU_DLIST_REMOVE(c->sleepers, s, prev, next);
	s->next = c->idle_sleepers;
	c->idle_sleepers = s;
	g_mutex_unlock(&c->sleep_lock);
}

void tcp_wake(void *ctx)
{
	tcp_ctx *c = ctx;
	uint64_t one = 1;

	g_mutex_lock(&c->sleep_lock);
	for (tcp_sleeper *s = c->sleepers; s != NULL; s = s->next)
		if (write(s->efd, &one, sizeof one) < 0 && errno != EAGAIN)
			TLOG(c, TE_LOG_ERROR, "cannot wake a waiting thread: %s", g_strerror(errno));
	g_mutex_unlock(&c->sleep_lock);
}

void tcp_sleepers_free(tcp_ctx *c)
{
	for (int i = 0; i < 2; i++) {
		tcp_sleeper *s = i ? c->idle_sleepers : c->sleepers;
		while (s != NULL) {
			tcp_sleeper *next = s->next;
			close(s->efd);
			g_free(s);
			s = next;
		}
	}
	c->sleepers = c->idle_sleepers = NULL;
}

/* Sleeps until the socket has something for the connection, tcp_wake()
 * rings, or `left_ns` passes. */
static void caller_sleep(tcp_cconn *cc, int (*done)(void *), void *arg, int64_t left_ns)
{
	tcp_ctx *c = cc->peer->ctx;
	tcp_sleeper *s = sleeper_get(c);
	struct pollfd pf[2] = {
		{ .fd = cc->io.fd, .events = (short)(POLLIN | (cc->snd < cc->head ? POLLOUT : 0)) },
		{ .fd = s != NULL ? s->efd : -1, .events = POLLIN },
	};
	/* Without an eventfd, a drain elsewhere is seen within a millisecond. */
	if (s == NULL && left_ns > 1000000)
		left_ns = 1000000;
	/* Registered first, then checked: a drain after the check rings (as
	 * does tcp_expire() after it marks the connection). */
	if (!done(arg) && !(atomic_load(&cc->missed) & MISS_EXPIRE)) {
		struct timespec ts = { .tv_sec = left_ns / 1000000000, .tv_nsec = left_ns % 1000000000 };
		if (ppoll(pf, 2, &ts, NULL) < 0 && errno != EINTR)
			TLOG(c, TE_LOG_DEBUG, "poll: %s", g_strerror(errno));
	}
	if (s != NULL)
		sleeper_put(c, s);
}

/* This thread's look before it sleeps, learned from its waits. */
static _Thread_local teu_spin_state tls_spin;

/* Drives the connection until done(arg), the time is up, or nothing of
 * ours can be on it any more (its ring is empty: -EAGAIN, the host waits
 * its usual way). Looks for the reply for a while first (TE_SPIN_US,
 * adaptive by default), then sleeps; a wait that ends in the reply teaches
 * the look how long it should be. */
static int caller_wait(tcp_cconn *cc, int (*done)(void *), void *arg, int64_t timeout_ns)
{
	const teu_spin_policy *sp = &cc->peer->ctx->cfg.spin;
	int64_t start = tcp_now_ns();
	int64_t end = timeout_ns < 0 ? INT64_MAX : start + timeout_ns;
	int64_t spin = teu_spin_begin(sp, &tls_spin), spin_end = start + spin;
	bool slept = false;
	int rc;

	/* The reply is ours to read: its edge must not wake the I/O thread
	 * (on a machine with few cores that wake-up takes the core the target
	 * or this thread needs). Muted while we look and while we sleep. */
	if (cc->state == CS_UP && cc->head != cc->tail)
		tcp_cconn_set_events(cc, true);
	for (;;) {
		if (cc->state != CS_UP || cc->head == cc->tail) {
			rc = done != NULL && done(arg) ? 0 : -EAGAIN;
			break;
		}
		int moved = caller_turn(cc);
		if (done == NULL || done(arg)) {
			if (done != NULL)
				teu_spin_learn(sp, &tls_spin, !slept, tcp_now_ns() - start);
			rc = 0;
			break;
		}
		if (moved != 0)
			continue;
		int64_t now = tcp_now_ns();
		if (now >= end) {
			rc = -ETIMEDOUT;
			break;
		}
		if (now < spin_end) {
			/* Yield, not just pause: a thread that has work for us (the
			 * target's, on a machine with few cores) may be waiting for
			 * this very core; a spinner that keeps it only adds its spin
			 * to the round trip. */
			teu_spin_pause();
			continue;
		}
		teu_spin_end(sp, spin);
		spin = 0;
		slept = true;
		tcp_cconn_set_events(cc, true); /* (POLLOUT may be wanted now) */
		caller_sleep(cc, done, arg, end - now);
	}
	teu_spin_end(sp, spin);
	return rc;
}

int tcp_progress(void *ctx, int (*done)(void *arg), void *arg, int64_t timeout_ns)
{
	tcp_ctx *c = ctx;
	tcp_peer *p = tls_direct.p;
	int rc = -EAGAIN;

	if (tls_direct.c != c)
		return -EAGAIN;
	if (!tcp_peer_hold(c, p)) {
		tls_direct.c = NULL;
		return -EAGAIN;
	}
	if (!atomic_load(&p->closing) && tls_direct.idx < p->nconns) {
		tcp_cconn *cc = &p->conns[tls_direct.idx];
		/* A connection whose I/O thread has business with it (mail, a
		 * check) is left to it: taken turn after turn of a long wait, it
		 * would never get its turn. */
		if ((atomic_load(&cc->missed) & ~(unsigned)MISS_EVENTS) == 0 && tcp_cconn_take(cc)) {
			rc = caller_wait(cc, done, arg, timeout_ns);
			if (rc == -EAGAIN && cc->head == cc->tail)
				tls_direct.c = NULL; /* nothing left there */
			/* Back to the I/O thread's watch, ring empty or not: bytes a
			 * peer sends on an idle connection (junk, a frame out of
			 * turn) must close it now, not fail the next request sent
			 * on it. With nothing readable the change raises no edge,
			 * so it costs a system call and no wake-up. */
			if (cc->state == CS_UP)
				tcp_cconn_set_events(cc, false);
			caller_let_go(cc);
		}
	}
	atomic_fetch_sub(&p->kicking, 1);
	return rc;
}
