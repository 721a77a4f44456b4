/* SPDX-License-Identifier: Apache-2.0 */
/*
 * I/O threads. Each owns an epoll set (edge-triggered), the connections
 * registered in it and a mailbox other threads post to: a lock-free stack of
 * connections with request bits, plus an eventfd written only when the owner
 * is about to sleep, so a busy thread is kicked without a system call.
 *
 * A connection is touched by its owner thread only, except for its mailbox
 * fields. Connections closed during a loop iteration are finalized at the end
 * of it (freed, or counted out of their peer), so a pointer still sitting in
 * the iteration's epoll event array is never dangling.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tcp-conn.h"
#include "teu-dlist.h"
#include "teu-hostport.h"

#define SCAN_MS 100
#define EVENTS 64

int64_t tcp_now_ms(void)
{
	struct timespec ts;

	/* The coarse clock is a few ms coarse and costs no system call. */
	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void tcp_sockopts(tcp_ctx *c, int fd)
{
	int one = 1;

	/* Small requests and status frames must leave at once. */
	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
		TLOG(c, TE_LOG_DEBUG, "TCP_NODELAY: %s", g_strerror(errno));
	if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) < 0)
		TLOG(c, TE_LOG_DEBUG, "SO_KEEPALIVE: %s", g_strerror(errno));
	if (c->cfg.sockbuf > 0) {
		int v = c->cfg.sockbuf;
		if (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v) < 0 ||
		    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v) < 0)
			TLOG(c, TE_LOG_DEBUG, "socket buffer size %d: %s", v, g_strerror(errno));
	}
}

/* ------------------------------------------------------------- mailbox */

void tcp_kick(tcp_io *io, unsigned mail)
{
	tcp_thread *t = io->thr;

	atomic_fetch_or(&io->mail, mail);
	if (atomic_exchange(&io->queued, 1))
		return; /* queued already; the owner reads the bits after unqueueing */
	tcp_io *old = atomic_load(&t->mailbox);
	do {
		atomic_store_explicit(&io->mail_next, old, memory_order_relaxed);
	} while (!atomic_compare_exchange_weak(&t->mailbox, &old, io));
	/* Pairs with the owner's store of `sleeping` and load of the mailbox. */
	if (atomic_load(&t->sleeping)) {
		uint64_t one = 1;
		if (write(t->wake.fd, &one, sizeof one) < 0 && errno != EAGAIN)
			TLOG(t->ctx, TE_LOG_ERROR, "cannot wake I/O thread %u: %s", t->idx, g_strerror(errno));
	}
}

void tcp_io_ready(tcp_io *io)
{
	tcp_thread *t = io->thr;

	if (io->in_ready || io->fd < 0)
		return;
	io->in_ready = true;
	io->ready_next = t->ready;
	t->ready = io;
}

int tcp_io_register(tcp_io *io, uint32_t events)
{
	struct epoll_event ev = { .events = events, .data.ptr = io };

	if (epoll_ctl(io->thr->ep, EPOLL_CTL_ADD, io->fd, &ev) < 0)
		return -errno;
	return 0;
}

void tcp_io_list(tcp_thread *t, tcp_io *io)
{
	if (io->in_list)
		return;
	io->in_list = true;
	TEU_DLIST_PUSH(t->conns, io, prev, next);
	t->n_conns++;
}

void tcp_io_unlist(tcp_io *io)
{
	tcp_thread *t = io->thr;

	if (!io->in_list)
		return;
	TEU_DLIST_REMOVE(t->conns, io, prev, next);
	io->in_list = false;
	t->n_conns--;
	/* Drop it from the ready list too. */
	if (io->in_ready) {
		tcp_io **pp = &t->ready;
		while (*pp && *pp != io)
			pp = &(*pp)->ready_next;
		if (*pp)
			*pp = io->ready_next;
		io->in_ready = false;
	}
}

/* ------------------------------------------------------------ the loop */

/* Connections closed in this iteration, finalized at its end. */
static __thread GPtrArray *tls_grave;

static void finalize(tcp_io *io)
{
	if (io->kind == IO_SERVER)
		g_free(io);
	else if (io->kind == IO_CLIENT)
		tcp_peer_retire_conn(((tcp_cconn *)io)->peer);
}

void tcp_io_bury(tcp_io *io)
{
	tcp_io_unlist(io);
	if (tls_grave == NULL) {
		/* Not on an I/O thread's iteration (shutdown): nothing can still hold it. */
		finalize(io);
		return;
	}
	g_ptr_array_add(tls_grave, io);
}

static void finalize_all(GPtrArray *g)
{
	for (guint i = 0; i < g->len; i++)
		finalize(g_ptr_array_index(g, i));
	g_ptr_array_set_size(g, 0);
}

static void accept_all(tcp_thread *t, tcp_io *lio);

static void handle_mail(tcp_thread *t)
{
	tcp_io *io = atomic_exchange(&t->mailbox, NULL);

	while (io != NULL) {
		tcp_io *next = atomic_load_explicit(&io->mail_next, memory_order_relaxed);
		atomic_store(&io->queued, 0);
		unsigned mail = atomic_exchange(&io->mail, 0);
		if (io->kind == IO_CLIENT) {
			tcp_cconn_mail((tcp_cconn *)io, mail);
		} else if (io->kind == IO_SERVER && (mail & MAIL_ADOPT)) {
			tcp_sconn *sc = (tcp_sconn *)io;
			tcp_io_list(t, io);
			int rc = tcp_io_register(io, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET);
			if (rc < 0)
				tcp_sconn_close(sc, "cannot add it to the epoll set");
			else
				tcp_sconn_drive(sc);
		}
		io = next;
	}
}

/* Checks the timeouts of every connection; returns when the next check is
 * due: SCAN_MS on while any has work, connects or lingers, the earliest idle
 * close otherwise, and never (INT64_MAX) when all are idle for good. An idle
 * thread then sleeps until a socket, a kick or tcp_io_arm() wakes it. */
static int64_t scan(tcp_thread *t, int64_t now)
{
	int64_t next = INT64_MAX;

	for (tcp_io *io = t->conns, *nx; io != NULL; io = nx) {
		nx = io->next;
		int64_t due = INT64_MAX;
		if (io->kind == IO_CLIENT) {
			due = tcp_cconn_scan((tcp_cconn *)io, now);
			if (due == 0)
				due = now + SCAN_MS;
		} else if (io->kind == IO_SERVER) {
			tcp_sconn *sc = (tcp_sconn *)io;
			tcp_sconn_check_timeout(sc, now);
			/* (a connection it closed is buried, and is not busy) */
			if (io->fd >= 0 && tcp_sconn_busy(sc))
				due = now + SCAN_MS;
		}
		next = MIN(next, due);
	}
	/* The link state read again after lost events: asked for again when
	 * asking failed, watched until it has come. */
	if (t->idx == 0 && tcp_link_resync(t->ctx, now))
		next = MIN(next, now + SCAN_MS);
	/* Slices of transfers the host ended (tcp_dead_add). */
	if (t->idx == 0 && atomic_load(&t->ctx->ndead) > 0 && tcp_dead_flush(t->ctx, false))
		next = MIN(next, now + 2);
	/* Accepting paused (out of descriptors): tried again at the next check. */
	for (unsigned l = 0; t->idx == 0 && l <= t->ctx->nlisten_extra; l++) {
		tcp_io *lio = l == 0 ? &t->ctx->listen_io : &t->ctx->listen_extra[l - 1];
		if (!lio->hup)
			continue;
		struct epoll_event lev = { .events = EPOLLIN, .data.ptr = lio };
		if (epoll_ctl(t->ep, EPOLL_CTL_MOD, lio->fd, &lev) == 0)
			lio->hup = false;
		else
			next = MIN(next, now + SCAN_MS);
	}
	return MAX(next, now + 1);
}

void tcp_io_arm(tcp_thread *t)
{
	/* Pairs with the owner's store of `sleeping` and exchange of `armed`:
	 * it either sees this or is woken. A thread asleep with a check due
	 * within SCAN_MS sees it then: not woken (a caller sending request
	 * after request itself would otherwise wake it for every one). */
	if (atomic_exchange(&t->armed, 1))
		return;
	if (atomic_load(&t->sleeping) && atomic_load(&t->sleep_until) > tcp_now_ms() + SCAN_MS) {
		uint64_t one = 1;
		if (write(t->wake.fd, &one, sizeof one) < 0 && errno != EAGAIN)
			TLOG(t->ctx, TE_LOG_ERROR, "cannot wake I/O thread %u: %s", t->idx, g_strerror(errno));
	}
}

static void shutdown_all(tcp_thread *t)
{
	/* Adopt what is still in the mailbox so that nothing is left behind. */
	tcp_io *io = atomic_exchange(&t->mailbox, NULL);
	while (io != NULL) {
		tcp_io *next = atomic_load_explicit(&io->mail_next, memory_order_relaxed);
		atomic_store(&io->queued, 0);
		atomic_store(&io->mail, 0);
		if (io->kind == IO_SERVER)
			tcp_io_list(t, io);
		io = next;
	}
	while (t->conns != NULL) {
		io = t->conns;
		if (io->kind == IO_CLIENT) {
			tcp_cconn_shutdown((tcp_cconn *)io, -ESHUTDOWN);
			tcp_io_unlist(io); /* freed with its peer by the plugin */
		} else {
			tcp_sconn_close((tcp_sconn *)io, NULL);
		}
	}
}

static gpointer thread_main(gpointer data)
{
	tcp_thread *t = data;
	struct epoll_event ev[EVENTS];
	GPtrArray *g = g_ptr_array_sized_new(64);
	const teu_spin_policy *sp = &t->ctx->cfg.spin;
	teu_spin_state learn = { 0 };
	/* After serving a peer's request the thread looks for the next one for
	 * a while (spin_ns, learned) before it sleeps: back-to-back requests
	 * then find it awake. busy_at: when it last served one; idle: it has
	 * found nothing to serve since (a wait the next request ends);
	 * for_request: it then waited for a new request, not for the peer to
	 * drain replies or send the rest of a body (a wait on bulk data, which
	 * on a small machine needs the very core a looking thread would hold). */
	int64_t busy_at = 0, spin_ns = 0;
	bool idle = false, slept = false, for_request = false;

	tls_grave = g;
	t->next_scan = INT64_MAX;
	for (;;) {
		/* Anything that happens on a connection may start work with a
		 * timeout: the checks run every SCAN_MS until scan() finds none. */
		bool active = atomic_load(&t->mailbox) != NULL || t->ready != NULL;
		handle_mail(t);
		/* Connections that stopped short of EAGAIN (fairness cap) or that
		 * have backlog to pull get another turn. */
		tcp_io *r = t->ready;
		t->ready = NULL;
		while (r != NULL) {
			tcp_io *next = r->ready_next;
			r->in_ready = false;
			/* (a client connection's fd is read once it is held) */
			if (r->kind == IO_CLIENT)
				tcp_cconn_ready((tcp_cconn *)r);
			else if (r->kind == IO_SERVER && r->fd >= 0)
				tcp_sconn_drive((tcp_sconn *)r);
			r = next;
		}
		finalize_all(g);
		if (atomic_load(&t->stop))
			break;

		/* While it looks, kickers need not ring it. */
		bool spin = spin_ns > 0 && tcp_now_ns() - busy_at < spin_ns;
		if (!spin && spin_ns > 0) {
			teu_spin_end(sp, spin_ns);
			spin_ns = 0;
		}
		if (!spin) {
			/* Maybe forever until the timeout is known: an arm that
			 * comes meanwhile wakes it. */
			atomic_store(&t->sleep_until, INT64_MAX);
			atomic_store(&t->sleeping, 1);
		}
		int64_t now = tcp_now_ms();
		if (active || atomic_exchange(&t->armed, 0))
			t->next_scan = MIN(t->next_scan, now + SCAN_MS);
		/* Sleeps until the next check is due; forever when none is. */
		int timeout = t->next_scan == INT64_MAX ? -1 : (int)MIN(MAX(t->next_scan - now, 0), 3600000);
		if (spin || t->ready != NULL || atomic_load(&t->mailbox) != NULL)
			timeout = 0;
		if (timeout >= 0)
			atomic_store(&t->sleep_until, now + timeout);
		int n = epoll_wait(t->ep, ev, EVENTS, timeout);
		atomic_store(&t->sleeping, 0);
		if (spin && n == 0)
			teu_spin_pause(); /* the core may be the one a thread with work for us waits for */
		if (timeout != 0)
			slept = true;
		int64_t woke = tcp_now_ns();
		bool served = false, bulk = false;
		if (n < 0 && errno != EINTR) {
			TLOG(t->ctx, TE_LOG_ERROR, "I/O thread %u: epoll_wait: %s", t->idx, g_strerror(errno));
			g_usleep(10000);
		}
		for (int i = 0; i < n; i++) {
			tcp_io *io = ev[i].data.ptr;
			switch (io->kind) {
			case IO_WAKE: {
				uint64_t v;
				while (read(io->fd, &v, sizeof v) > 0)
					;
				break;
			}
			case IO_LISTEN:
				accept_all(t, io);
				break;
			case IO_NETLINK:
				tcp_link_event(t->ctx);
				active = true;
				break;
			case IO_CLIENT:
				tcp_cconn_event((tcp_cconn *)io, ev[i].events);
				active = true;
				break;
			case IO_SERVER:
				if (io->fd >= 0)
					tcp_sconn_event((tcp_sconn *)io, ev[i].events);
				/* (one it closed is buried, and waits for nothing) */
				if (io->fd >= 0 && tcp_sconn_busy((tcp_sconn *)io))
					bulk = true;
				served = true;
				active = true;
				break;
			}
		}
		/* Only a thread serving peers' requests spins: on the initiating
		 * side the waiting caller does (a reply it collects itself still
		 * raises its connection's edge here). A request that ends a wait
		 * teaches the look: caught while looking, or how long after. */
		if (served) {
			if (idle && for_request)
				teu_spin_learn(sp, &learn, !slept, woke - busy_at);
			teu_spin_end(sp, spin_ns);
			busy_at = tcp_now_ns();
			for_request = !bulk;
			spin_ns = for_request ? teu_spin_begin(sp, &learn) : 0;
			idle = slept = false;
		} else {
			idle = true;
		}
		now = tcp_now_ms();
		if (active)
			t->next_scan = MIN(t->next_scan, now + SCAN_MS);
		if (now >= t->next_scan)
			t->next_scan = scan(t, now);
		finalize_all(g);
	}
	teu_spin_end(sp, spin_ns);
	shutdown_all(t);
	finalize_all(g);
	tls_grave = NULL;
	g_ptr_array_unref(g);
	return NULL;
}

/* ----------------------------------------------------------- accepting */

/* Refusals are rate-limited, with the count held back: a flood of
 * connections must not become a flood of log lines (nor block the accepting
 * thread on a full log pipe). */
static void refuse(tcp_ctx *c, const char *name, const char *why)
{
	TE_HOST_LOG_LIMITED(c->host, TE_LOG_WARN, "refusing connection from %s: %s", name, why);
}

/* Counts a new accepted connection of `host` in; false (nothing counted)
 * when that address has max_per_peer open already. */
static bool inbound_take(tcp_ctx *c, const char *host)
{
	g_mutex_lock(&c->inbound_lock);
	unsigned n = GPOINTER_TO_UINT(g_hash_table_lookup(c->per_peer, host));
	bool ok = n < c->cfg.max_per_peer;
	if (ok) {
		g_hash_table_replace(c->per_peer, g_strdup(host), GUINT_TO_POINTER(n + 1));
		atomic_fetch_add(&c->inbound, 1);
	}
	g_mutex_unlock(&c->inbound_lock);
	return ok;
}

void tcp_inbound_done(tcp_ctx *c, const char *host)
{
	g_mutex_lock(&c->inbound_lock);
	unsigned n = GPOINTER_TO_UINT(g_hash_table_lookup(c->per_peer, host));
	if (n <= 1)
		g_hash_table_remove(c->per_peer, host);
	else
		g_hash_table_replace(c->per_peer, g_strdup(host), GUINT_TO_POINTER(n - 1));
	atomic_fetch_sub(&c->inbound, 1);
	g_mutex_unlock(&c->inbound_lock);
}

/* Hands an accepted (and, with a key, authenticated) connection to an I/O
 * thread; any thread. */
static void adopt(tcp_ctx *c, int fd, const char *name, const char *host, unsigned rr)
{
	tcp_sockopts(c, fd);
	tcp_sconn *sc = tcp_sconn_new(c, fd, name);
	if (sc == NULL) {
		TE_HOST_LOG_LIMITED(c->host, TE_LOG_ERROR, "out of memory accepting %s", name);
		close(fd);
		tcp_inbound_done(c, host);
		return;
	}
	g_strlcpy(sc->host, host, sizeof sc->host);
	tcp_thread *owner = &c->threads[rr % c->nthreads];
	sc->io.thr = owner;
	TLOG(c, TE_LOG_DEBUG, "accepted %s on I/O thread %u", name, owner->idx);
	tcp_kick(&sc->io, MAIL_ADOPT);
}

typedef struct auth_job {
	int fd;
	char name[80];
	char host[64];
} auth_job;

void tcp_auth_job(gpointer data, gpointer user)
{
	auth_job *j = data;
	tcp_ctx *c = user;
	const te_host *h = c->host;

	/* Refusals are logged by the host (rate-limited); nothing else to do. */
	if (atomic_load(&c->stopping) ||
	    h->auth_accept(h, j->fd, TE_AUTH_TCP, j->name, (int)MIN(c->cfg.connect_timeout_ms, 3000)) < 0) {
		close(j->fd);
		tcp_inbound_done(c, j->host);
	} else {
		adopt(c, j->fd, j->name, j->host, (unsigned)j->fd);
	}
	g_free(j);
}

static void accept_all(tcp_thread *t, tcp_io *lio)
{
	tcp_ctx *c = t->ctx;

	for (;;) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof ss;
		int fd = accept4(lio->fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return;
			/* A connection flood can run out of descriptors: limited. */
			TE_HOST_LOG_LIMITED(c->host, TE_LOG_WARN, "accept on data port %d: %s; pausing accepts for %d ms",
					    c->port, g_strerror(errno), SCAN_MS);
			/* Level-triggered: stop listening until the next scan, or spin. */
			struct epoll_event lev = { .events = 0, .data.ptr = lio };
			if (epoll_ctl(t->ep, EPOLL_CTL_MOD, lio->fd, &lev) == 0)
				lio->hup = true;
			t->next_scan = MIN(t->next_scan, tcp_now_ms() + SCAN_MS);
			return;
		}
		char name[80], host[64], why[96];
		teu_sockaddr_name((struct sockaddr *)&ss, name, sizeof name);
		teu_hostport_host(name, host, sizeof host);
		if ((unsigned)atomic_load(&c->inbound) >= c->cfg.max_inbound) {
			snprintf(why, sizeof why, "%u connections open (TE_TCP_MAX_INBOUND)", c->cfg.max_inbound);
			refuse(c, name, why);
			close(fd);
			continue;
		}
		if (!inbound_take(c, host)) {
			snprintf(why, sizeof why, "%u connections open from that address (TE_TCP_MAX_PER_PEER)",
				 c->cfg.max_per_peer);
			refuse(c, name, why);
			close(fd);
			continue;
		}
		if (c->auth) {
			auth_job *j = g_new(auth_job, 1);
			j->fd = fd;
			g_strlcpy(j->name, name, sizeof j->name);
			g_strlcpy(j->host, host, sizeof j->host);
			g_thread_pool_push(c->auth_pool, j, NULL);
			continue;
		}
		adopt(c, fd, name, host, t->rr++);
	}
}

/* --------------------------------------------------------- start, stop */

int tcp_threads_start(tcp_ctx *c)
{
	c->threads = g_new0(tcp_thread, c->nthreads);
	for (unsigned i = 0; i < c->nthreads; i++)
		c->threads[i].ep = c->threads[i].wake.fd = -1;
	for (unsigned i = 0; i < c->nthreads; i++) {
		tcp_thread *t = &c->threads[i];
		t->ctx = c;
		t->idx = i;
		t->ep = epoll_create1(EPOLL_CLOEXEC);
		t->wake.kind = IO_WAKE;
		t->wake.thr = t;
		t->wake.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (t->ep < 0 || t->wake.fd < 0)
			return -errno;
		int rc = tcp_io_register(&t->wake, EPOLLIN);
		if (rc < 0)
			return rc;
	}
	c->listen_io.kind = IO_LISTEN;
	c->listen_io.fd = c->listen_fd;
	c->listen_io.thr = &c->threads[0];
	int rc = tcp_io_register(&c->listen_io, EPOLLIN);
	if (rc < 0)
		return rc;
	for (unsigned i = 0; i < c->nlisten_extra; i++) {
		c->listen_extra[i].thr = &c->threads[0];
		rc = tcp_io_register(&c->listen_extra[i], EPOLLIN);
		if (rc < 0)
			return rc;
	}
	/* Without it (no rtnetlink, as in some sandboxes) a rail's link loss is
	 * still found by the stall checks. */
	rc = tcp_link_open(c);
	if (rc < 0)
		TLOG(c, TE_LOG_DEBUG, "no link events (rtnetlink: %s)", g_strerror(-rc));
	for (unsigned i = 0; i < c->nthreads; i++) {
		char name[24];
		snprintf(name, sizeof name, "te-tcp-%u", i);
		GError *err = NULL;
		c->threads[i].thread = g_thread_try_new(name, thread_main, &c->threads[i], &err);
		if (c->threads[i].thread == NULL) {
			TLOG(c, TE_LOG_ERROR, "cannot start I/O thread: %s", err ? err->message : "?");
			g_clear_error(&err);
			return -EAGAIN;
		}
	}
	return 0;
}

void tcp_threads_stop(tcp_ctx *c)
{
	if (c->threads == NULL)
		return;
	for (unsigned i = 0; i < c->nthreads; i++) {
		tcp_thread *t = &c->threads[i];
		atomic_store(&t->stop, 1);
		if (t->wake.fd >= 0) {
			uint64_t one = 1;
			if (write(t->wake.fd, &one, sizeof one) < 0 && errno != EAGAIN)
				TLOG(c, TE_LOG_ERROR, "cannot wake I/O thread %u: %s", i, g_strerror(errno));
		}
	}
	for (unsigned i = 0; i < c->nthreads; i++)
		if (c->threads[i].thread)
			g_thread_join(c->threads[i].thread);
	for (unsigned i = 0; i < c->nthreads; i++) {
		tcp_thread *t = &c->threads[i];
		/* Thread 0 may have handed a just-accepted connection to a thread
		 * that had already stopped: close what is left in the mailboxes. */
		if (t->thread)
			shutdown_all(t);
		if (t->ep >= 0)
			close(t->ep);
		if (t->wake.fd >= 0)
			close(t->wake.fd);
	}
	g_free(c->threads);
	c->threads = NULL;
}

/* ---------------------------------------------------------- link events */

/*
 * Local link state from rtnetlink. A rail whose local interface loses its
 * carrier (or is set down, or loses the address its connections leave from)
 * cannot carry anything until it comes back, and TCP alone would only find
 * out through retransmissions and the stall timeout: the kernel tells us at
 * once instead, with no polling. The socket is one more descriptor in I/O
 * thread 0's epoll set.
 */
/* <linux/if.h> has it, but clashes with <net/if.h>. */
#ifndef IFF_LOWER_UP
#define IFF_LOWER_UP 0x10000
#endif

int tcp_link_open(tcp_ctx *c)
{
	c->netlink_io.kind = IO_NETLINK;
	c->netlink_io.fd = -1;
	int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_ROUTE);
	if (fd < 0)
		return -errno;
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK,
				  .nl_groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR };
	if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		int err = -errno;
		close(fd);
		return err;
	}
	socklen_t sl = sizeof sa;
	if (getsockname(fd, (struct sockaddr *)&sa, &sl) < 0) {
		int err = -errno;
		close(fd);
		return err;
	}
	c->link_pid = sa.nl_pid;
	c->netlink_io.fd = fd;
	c->netlink_io.thr = &c->threads[0];
	int rc = tcp_io_register(&c->netlink_io, EPOLLIN);
	if (rc < 0) {
		close(fd);
		c->netlink_io.fd = -1;
	}
	return rc;
}

void tcp_link_close(tcp_ctx *c)
{
	if (c->netlink_io.fd >= 0)
		close(c->netlink_io.fd);
	c->netlink_io.fd = -1;
}

static void if_label(int ifindex, char *buf, size_t size)
{
	char name[IF_NAMESIZE];

	if (if_indextoname((unsigned)ifindex, name) != NULL)
		snprintf(buf, size, "%s", name);
	else
		snprintf(buf, size, "#%d", ifindex);
}

static void on_link(tcp_ctx *c, const struct nlmsghdr *nh)
{
	const struct ifinfomsg *ifi = NLMSG_DATA(nh);
	char name[IF_NAMESIZE + 8], why[96];

	if (nh->nlmsg_len < NLMSG_LENGTH(sizeof *ifi))
		return;
	/* The name from the message: a deleted interface has none to look up. */
	name[0] = '\0';
	int len = (int)IFLA_PAYLOAD(nh);
	for (const struct rtattr *a = IFLA_RTA(ifi); RTA_OK(a, len); a = RTA_NEXT(a, len))
		if (a->rta_type == IFLA_IFNAME)
			snprintf(name, sizeof name, "%.*s", (int)RTA_PAYLOAD(a), (const char *)RTA_DATA(a));
	if (name[0] == '\0')
		if_label(ifi->ifi_index, name, sizeof name);
	bool admin = ifi->ifi_flags & IFF_UP;
	bool carrier = ifi->ifi_flags & IFF_LOWER_UP;
	if (nh->nlmsg_type == RTM_DELLINK)
		snprintf(why, sizeof why, "local interface %s was removed", name);
	else if (!admin)
		snprintf(why, sizeof why, "local interface %s is down", name);
	else if (!carrier)
		snprintf(why, sizeof why, "local interface %s lost its carrier", name);
	else
		snprintf(why, sizeof why, "local interface %s has its carrier again", name);
	tcp_rails_link_event(c, ifi->ifi_index, NULL, nh->nlmsg_type == RTM_NEWLINK && admin && carrier, why);
}

static void on_addr(tcp_ctx *c, const struct nlmsghdr *nh)
{
	const struct ifaddrmsg *ifa = NLMSG_DATA(nh);
	struct sockaddr_storage ss = { 0 };
	bool have = false;

	if (nh->nlmsg_len < NLMSG_LENGTH(sizeof *ifa))
		return;
	int len = (int)IFA_PAYLOAD(nh);
	for (const struct rtattr *a = IFA_RTA(ifa); RTA_OK(a, len); a = RTA_NEXT(a, len)) {
		/* IFA_LOCAL is the address itself on point-to-point links, where
		 * IFA_ADDRESS is the far end's; elsewhere they are the same. */
		if (a->rta_type != IFA_LOCAL && !(a->rta_type == IFA_ADDRESS && !have))
			continue;
		if (ifa->ifa_family == AF_INET && RTA_PAYLOAD(a) == 4) {
			struct sockaddr_in *s = (struct sockaddr_in *)&ss;
			s->sin_family = AF_INET;
			memcpy(&s->sin_addr, RTA_DATA(a), 4);
			have = true;
		} else if (ifa->ifa_family == AF_INET6 && RTA_PAYLOAD(a) == 16) {
			struct sockaddr_in6 *s = (struct sockaddr_in6 *)&ss;
			s->sin6_family = AF_INET6;
			memcpy(&s->sin6_addr, RTA_DATA(a), 16);
			have = true;
		}
	}
	if (!have)
		return;
	char name[IF_NAMESIZE + 8], addr[80], why[160];
	if_label((int)ifa->ifa_index, name, sizeof name);
	char name_port[TEU_SOCKADDR_NAME_MAX];
	teu_sockaddr_name((struct sockaddr *)&ss, name_port, sizeof name_port);
	teu_hostport_host(name_port, addr, sizeof addr); /* no port here */
	bool up = nh->nlmsg_type == RTM_NEWADDR;
	snprintf(why, sizeof why, "local address %s %s interface %s", addr, up ? "is back on" : "was removed from",
		 name);
	tcp_rails_link_event(c, (int)ifa->ifa_index, (struct sockaddr *)&ss, up, why);
}

/* Asks the kernel for every link's state (an RTM_GETLINK dump), after
 * events were lost; its answers arrive on the event socket and go through
 * on_link like events. False when it could not be asked (retried at thread
 * 0's next check). One dump at a time: the kernel refuses a second while one
 * is under way on the socket. */
static bool link_dump(tcp_ctx *c)
{
	struct {
		struct nlmsghdr nh;
		struct ifinfomsg ifi;
	} req;
	struct sockaddr_nl to = { .nl_family = AF_NETLINK };

	memset(&req, 0, sizeof req);
	req.nh.nlmsg_len = NLMSG_LENGTH(sizeof req.ifi);
	req.nh.nlmsg_type = RTM_GETLINK;
	req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
	req.nh.nlmsg_seq = ++c->link_seq;
	req.nh.nlmsg_pid = c->link_pid;
	req.ifi.ifi_family = AF_UNSPEC;
	c->link_dump_due = false;
	if (sendto(c->netlink_io.fd, &req, req.nh.nlmsg_len, MSG_DONTWAIT, (struct sockaddr *)&to, sizeof to) < 0) {
		TE_HOST_LOG_LIMITED(c->host, TE_LOG_WARN, "rtnetlink: cannot ask for the link state: %s",
				    g_strerror(errno));
		c->link_dump_due = true;
		return false;
	}
	c->link_dumping = true;
	c->link_dump_again = false;
	c->link_dump_at = tcp_now_ms();
	return true;
}

/* Events were lost: the link state is read again, now or after the dump
 * under way (which may have passed a link before its lost event). */
static void link_lost(tcp_ctx *c)
{
	TE_HOST_LOG_LIMITED(c->host, TE_LOG_INFO, "rtnetlink: link events lost (%s); reading the link state again",
			    g_strerror(ENOBUFS));
	if (c->link_dumping)
		c->link_dump_again = true;
	else
		link_dump(c);
}

/* The end of our dump (NLMSG_DONE, or NLMSG_ERROR: refused). */
static void link_dump_end(tcp_ctx *c, const struct nlmsghdr *nh)
{
	c->link_dumping = false;
	if (nh->nlmsg_type == NLMSG_ERROR) {
		const struct nlmsgerr *e = NLMSG_DATA(nh);
		int err = nh->nlmsg_len >= NLMSG_LENGTH(sizeof *e) ? -e->error : EPROTO;
		TE_HOST_LOG_LIMITED(c->host, TE_LOG_WARN, "rtnetlink: the link state was not sent: %s",
				    g_strerror(err));
		/* Asked again at the next check, not at once: a refusal
		 * (EBUSY: a dump still under way) would repeat in a loop. */
		c->link_dump_due = true;
		return;
	}
	if (c->link_dump_again)
		link_dump(c);
}

/* A dump that has not ended within this long is given up and asked for
 * again (its end may have been lost to an error of the socket). */
#define LINK_DUMP_MS 2000

bool tcp_link_resync(tcp_ctx *c, int64_t now)
{
	if (c->netlink_io.fd < 0)
		return false;
	if (c->link_dumping && now - c->link_dump_at > LINK_DUMP_MS) {
		TE_HOST_LOG_LIMITED(c->host, TE_LOG_WARN, "rtnetlink: the link state did not come within %d ms; asking again",
				    LINK_DUMP_MS);
		c->link_dumping = false;
		c->link_dump_due = true;
	}
	if (c->link_dump_due && !c->link_dumping)
		link_dump(c);
	return c->link_dumping || c->link_dump_due;
}

/* Messages read per call: a flood of events (or a long dump) is taken in
 * turns with the thread's connections (the socket is level-triggered). */
#define LINK_READS 64

void tcp_link_event(tcp_ctx *c)
{
	/* Aligned for the nlmsghdr casts. */
	union { char b[16384]; struct nlmsghdr h; } buf;

	for (int reads = 0; reads < LINK_READS; reads++) {
		struct sockaddr_nl from;
		struct iovec iov = { buf.b, sizeof buf.b };
		struct msghdr mh = { .msg_name = &from, .msg_namelen = sizeof from, .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t n = recvmsg(c->netlink_io.fd, &mh, MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			/* ENOBUFS: the socket's buffer overflowed and events were
			 * dropped (the socket itself goes on). */
			if (errno == ENOBUFS) {
				link_lost(c);
				continue;
			}
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				TLOG(c, TE_LOG_DEBUG, "rtnetlink: %s", g_strerror(errno));
			return;
		}
		/* Only the kernel speaks for the links; a datagram cut short is
		 * not parsed (nothing this socket receives should be: 16 KiB is
		 * more than a link's message). */
		if (mh.msg_namelen != sizeof from || from.nl_pid != 0 || (mh.msg_flags & MSG_TRUNC)) {
			if (mh.msg_flags & MSG_TRUNC)
				TE_HOST_LOG_LIMITED(c->host, TE_LOG_WARN, "rtnetlink: a message longer than %zu bytes skipped",
						    sizeof buf.b);
			continue;
		}
		int len = (int)n;
		for (const struct nlmsghdr *nh = &buf.h; NLMSG_OK(nh, (unsigned)len); nh = NLMSG_NEXT(nh, len)) {
			bool ours = c->link_dumping && nh->nlmsg_seq == c->link_seq && nh->nlmsg_pid == c->link_pid;
			/* A dump that links changed under (the kernel says so) may
			 * hold a stale state: read once more after it. */
			if (ours && (nh->nlmsg_flags & NLM_F_DUMP_INTR))
				c->link_dump_again = true;
			switch (nh->nlmsg_type) {
			case RTM_NEWLINK:
			case RTM_DELLINK:
				on_link(c, nh);
				break;
			case RTM_NEWADDR:
			case RTM_DELADDR:
				on_addr(c, nh);
				break;
			case NLMSG_DONE:
			case NLMSG_ERROR:
				if (ours)
					link_dump_end(c, nh);
				break;
			default:
				break;
			}
		}
	}
}

static bool same_ip(const struct sockaddr *a, const struct sockaddr *b)
{
	if (a->sa_family != b->sa_family)
		return false;
	if (a->sa_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	if (a->sa_family == AF_INET6)
		return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
			      16) == 0;
	return false;
}

int tcp_link_ifindex(const struct sockaddr *local)
{
	struct ifaddrs *ifs;
	int idx = 0;

	if (getifaddrs(&ifs) < 0)
		return 0;
	for (struct ifaddrs *i = ifs; i != NULL && idx == 0; i = i->ifa_next)
		if (i->ifa_addr != NULL && same_ip(i->ifa_addr, local))
			idx = (int)if_nametoindex(i->ifa_name);
	freeifaddrs(ifs);
	return idx;
}

bool tcp_link_same_ip(const struct sockaddr *a, const struct sockaddr *b)
{
	return same_ip(a, b);
}
