/* SPDX-License-Identifier: Apache-2.0 */
/*
 * expire(): the host ended a transfer before its slices completed (its
 * deadline passed, its batch was canceled). The NIC reads and writes the
 * transfer's memory outside any host gate, so this stops it there:
 *
 *  - Slices not yet posted are dropped: the transfer is marked, and the
 *    dispatcher, the NICs' queues and the retry path end its slices on
 *    sight; those parked on an endpoint being connected are taken here. No
 *    slice of it is posted any more: a post passes the host's gate first
 *    (rdma-worker.c), and the gate is closed before this runs.
 *  - Each endpoint that holds a posted slice of it is fenced: out of the
 *    pool, its QPs moved to ERR. The NIC flushes what they hold
 *    (IBV_WC_WR_FLUSH_ERR) and starts nothing more of it; the workers reap
 *    the flushes. Slices of other transfers flushed with it are sent again
 *    on a new endpoint, not counted as a failure of the path.
 *  - This waits, up to RD_EXPIRE_WAIT_MS, until no slice of the transfer is
 *    posted any more: then the NIC touches none of its memory. A NIC that
 *    has not flushed by then is logged; its slices end when it does.
 *
 * What a WRITE leaves behind: a WRITE slice that was posted and did not
 * complete successfully may have sent some of its bytes. Once its QP is in
 * ERR and the slice flushed, the local NIC sends nothing more of it, but
 * packets it sent before may still be on their way and land. So expire()
 * returns 1 for such a transfer (the host reports it TE_TASK_UNSETTLED), and
 * each of those slices is completed, with an error, only when its flush (or
 * other failed completion) is reaped: after that the NIC can emit nothing
 * more for it, and with the last of them the host clears the flag.
 */
#include "rdma.h"

#define RD_EXPIRE_WAIT_MS 50

void rd_expire_wake(rd_transport *tr)
{
	teu_mon_broadcast(&tr->expire);
}

/* Slices of `t` on a send queue now. */
static unsigned posted_of(rd_transport *tr, const te_transfer *t)
{
	unsigned n = 0;

	for (uint32_t i = 0; i < tr->nslices; i++)
		if (atomic_load_explicit(&tr->posted_t[i], memory_order_seq_cst) == (uintptr_t)t)
			n++;
	return n;
}

/* The endpoints (as numbers) holding posted slices of `t`, per local NIC;
 * how many slices. */
static unsigned posted_eps(rd_transport *tr, const te_transfer *t, GArray **keys)
{
	unsigned n = 0;

	for (uint32_t i = 0; i < tr->nslices; i++) {
		if (atomic_load_explicit(&tr->posted_t[i], memory_order_seq_cst) != (uintptr_t)t)
			continue;
		int on = atomic_load_explicit(&tr->posted_on[i], memory_order_relaxed) - 1;
		uintptr_t ep = atomic_load_explicit(&tr->posted_ep[i], memory_order_relaxed);
		n++;
		if (on < 0 || on >= tr->nctx)
			continue; /* completed meanwhile */
		GArray *k = keys[on];
		bool seen = false;
		for (guint j = 0; j < k->len && !seen; j++)
			seen = g_array_index(k, uintptr_t, j) == ep;
		if (!seen)
			g_array_append_val(k, ep);
	}
	return n;
}

int rd_expire(void *ctx, te_transfer *t)
{
	rd_transport *tr = ctx;
	GArray *keys[RD_MAX_DEV];
	bool write = t->opcode == TE_OP_WRITE;

	/* From here on its slices end wherever they are met. Sequentially
	 * consistent with the completions' clearing of posted_t (rdma-worker.c). */
	__atomic_fetch_or(&t->plugin_data[2], (uintptr_t)RD_T_EXPIRED, __ATOMIC_SEQ_CST);

	for (int i = 0; i < tr->nctx; i++) {
		rd_slice *s = rd_ep_take_parked(tr->ctx[i], t);
		while (s != NULL) {
			rd_slice *next = s->next;
			rd_slice_fail(tr, s, RD_ENDED_ERR, RD_ENDED_WHY);
			s = next;
		}
	}

	for (int i = 0; i < tr->nctx; i++)
		keys[i] = g_array_new(FALSE, FALSE, sizeof(uintptr_t));
	unsigned posted = posted_eps(tr, t, keys);
	for (int i = 0; i < tr->nctx; i++) {
		if (keys[i]->len > 0 &&
		    rd_ep_fence(tr->ctx[i], (const uintptr_t *)(void *)keys[i]->data, (int)keys[i]->len,
				"a transfer on it ended early (deadline or cancel)") > 0)
			rd_ctx_kick(tr->ctx[i]);
		g_array_unref(keys[i]);
	}
	if (posted == 0)
		return 0; /* none posted: none of its bytes can still land */

	/* A completion clears its slot, then wakes this under expire.lock:
	 * looked at under the lock, no wake-up is missed. */
	gint64 until = g_get_monotonic_time() + RD_EXPIRE_WAIT_MS * 1000;
	unsigned left;
	g_mutex_lock(&tr->expire.lock);
	while ((left = posted_of(tr, t)) > 0)
		if (!g_cond_wait_until(&tr->expire.cond, &tr->expire.lock, until)) {
			left = posted_of(tr, t);
			break;
		}
	g_mutex_unlock(&tr->expire.lock);
	if (left > 0)
		RD_LOG(tr, TE_LOG_WARN,
		       "a %s ended early still has %u request%s posted after %d ms: the NIC has not "
		       "flushed %s yet; %s end%s when it does",
		       write ? "WRITE" : "READ", left, left == 1 ? "" : "s", RD_EXPIRE_WAIT_MS,
		       left == 1 ? "it" : "them", left == 1 ? "it" : "they", left == 1 ? "s" : "");
	return write && (left > 0 || (rd_t_flags(t) & RD_T_WFAIL)) ? 1 : 0;
}
