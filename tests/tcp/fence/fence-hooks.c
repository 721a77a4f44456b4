/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The hooks of a test-only build of the TCP plugin (meson.build here:
 * plugins/transport/tcp's sources built with TCP_TEST_HOOKS and this file; never
 * installed). test-tcp-fence.c drives them through the te_test_fence_*
 * calls, which it finds with dlsym in the copy libte loaded:
 *
 * - arm(addr, mode): the next server thread about to write a WRITE body into
 *   `addr` is held there (mode 1: before it looks at the connection's fence;
 *   mode 2: after, inside the write, where a fence must wait for it) until
 *   release(); settled() then says when that connection applied the body or
 *   was closed;
 * - force_suspect(): the initiator's connection that carried the WRITE to
 *   `addr` fails over as a suspect one would, at once;
 * - live(): the server connections open that said HELLO, and which I/O
 *   threads serve them;
 * - counts(): HELLOs taken, FENCEs honoured, connections they ended.
 */
#include "tcp-conn.h"

#define EXPORT __attribute__((visibility("default")))

static GMutex mu;
static GCond cond;
static uint64_t armed;        /* the destination watched; 0: none */
static int mode;              /* 1: hold before the fence check, 2: inside the write */
static tcp_sconn *held;       /* the server connection held (mu) */
static bool holding, released, settled;
static tcp_cconn *carrier;    /* the initiator's connection that carried the WRITE (mu) */
static _Atomic(tcp_cconn *) force;
static atomic_uint hellos, fences, ended;
#define LIVE_MAX 16
static tcp_sconn *live[LIVE_MAX]; /* (mu) */
static unsigned nlive;

void tcp_hook_apply(tcp_sconn *sc, bool inside)
{
	if (!sc->in_body)
		return;
	g_mutex_lock(&mu);
	if (armed != 0 && held == NULL && (uintptr_t)sc->body == armed && inside == (mode == 2)) {
		held = sc;
		holding = true;
		g_cond_broadcast(&cond);
		/* Bounded, so that a broken run ends rather than hangs. */
		gint64 end = g_get_monotonic_time() + 20 * G_TIME_SPAN_SECOND;
		while (!released && g_cond_wait_until(&cond, &mu, end))
			;
		holding = false;
	}
	g_mutex_unlock(&mu);
}

/* (mu held) */
static void settle(tcp_sconn *sc)
{
	if (sc == held && released && !holding) {
		settled = true;
		held = (tcp_sconn *)&held; /* no later connection at that address counts */
		g_cond_broadcast(&cond);
	}
}

void tcp_hook_settled(tcp_sconn *sc)
{
	g_mutex_lock(&mu);
	settle(sc);
	g_mutex_unlock(&mu);
}

void tcp_hook_closed(tcp_sconn *sc)
{
	g_mutex_lock(&mu);
	settle(sc);
	for (unsigned i = 0; i < nlive; i++)
		if (live[i] == sc) {
			live[i] = live[--nlive];
			break;
		}
	g_mutex_unlock(&mu);
}

void tcp_hook_hello(tcp_sconn *sc)
{
	atomic_fetch_add(&hellos, 1);
	g_mutex_lock(&mu);
	if (nlive < LIVE_MAX)
		live[nlive++] = sc;
	g_mutex_unlock(&mu);
}

void tcp_hook_fence(tcp_sconn *sc, unsigned n)
{
	(void)sc;
	atomic_fetch_add(&fences, 1);
	atomic_fetch_add(&ended, n);
}

void tcp_hook_prep(tcp_cconn *cc, const tcp_slot *s)
{
	if (s->op != TE_OP_WRITE)
		return;
	g_mutex_lock(&mu);
	if (armed != 0 && carrier == NULL && s->t->remote + s->off == armed)
		carrier = cc;
	g_mutex_unlock(&mu);
}

bool tcp_hook_suspect(tcp_cconn *cc)
{
	tcp_cconn *want = cc;
	return atomic_load(&force) == cc && atomic_compare_exchange_strong(&force, &want, NULL);
}

/* 0 once *flag (under mu) is set, within `ms`; else -1. */
static int wait_for(const bool *flag, int ms)
{
	gint64 end = g_get_monotonic_time() + (gint64)ms * 1000;
	g_mutex_lock(&mu);
	while (!*flag && g_cond_wait_until(&cond, &mu, end))
		;
	int rc = *flag ? 0 : -1;
	g_mutex_unlock(&mu);
	return rc;
}

EXPORT void te_test_fence_arm(uint64_t addr, int how)
{
	g_mutex_lock(&mu);
	armed = addr;
	mode = how;
	held = NULL;
	carrier = NULL;
	holding = released = settled = false;
	g_mutex_unlock(&mu);
}

/* 0 once a server thread is held (within `ms`), else -1. */
EXPORT int te_test_fence_wait_held(int ms)
{
	return wait_for(&holding, ms);
}

/* Fails the carrying connection over (its I/O thread does it at once). */
EXPORT int te_test_fence_force_suspect(void)
{
	g_mutex_lock(&mu);
	tcp_cconn *cc = carrier;
	g_mutex_unlock(&mu);
	if (cc == NULL)
		return -1;
	atomic_store(&force, cc);
	tcp_kick(&cc->io, MAIL_WORK);
	return 0;
}

EXPORT void te_test_fence_release(void)
{
	g_mutex_lock(&mu);
	released = true;
	armed = 0;
	g_cond_broadcast(&cond);
	g_mutex_unlock(&mu);
}

/* 0 once the held connection applied its body or closed (within `ms`). */
EXPORT int te_test_fence_wait_settled(int ms)
{
	return wait_for(&settled, ms);
}

/* How many server connections that said HELLO are open; `threads`: a bit
 * for each I/O thread serving one. */
EXPORT unsigned te_test_fence_live(unsigned *threads)
{
	g_mutex_lock(&mu);
	unsigned n = nlive, mask = 0;
	for (unsigned i = 0; i < nlive; i++)
		mask |= 1u << (live[i]->io.thr->idx % 32);
	g_mutex_unlock(&mu);
	*threads = mask;
	return n;
}

EXPORT void te_test_fence_counts(unsigned *h, unsigned *f, unsigned *e)
{
	*h = atomic_load(&hellos);
	*f = atomic_load(&fences);
	*e = atomic_load(&ended);
}
