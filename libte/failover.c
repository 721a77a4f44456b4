/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fail-over across transports. A remote segment's version may have an
 * alternate: another installed network transport that accepts the same
 * descriptor (RDMA's peer also publishes TCP). A task whose transport
 * failed it on a path error (every path of that transport to the peer
 * gone: ports down, a handshake refused, no route) is moved, once, to the
 * alternate instead of failing; new tasks of the segment go to the
 * alternate for a while (100 ms, doubling up to 8 s while the transport
 * keeps failing), then one task probes the first transport again and,
 * when it completes, the segment is back on it.
 *
 * A task on device memory that its transport moved itself (GPUDirect)
 * goes to an alternate without that ability staged through host memory,
 * as tasks routed there are.
 *
 * Fencing across transports holds: a transport completes a task with an
 * error only once it can no longer move that task's bytes (an RDMA queue
 * pair in error has flushed its requests; a TCP connection was fenced), so
 * the copy sent over the alternate is the last to land.
 */
#include "internal.h"
#include "metrics.h"

#define FO_BACKOFF_MIN_MS 100
#define FO_BACKOFF_MAX_MS 8000

/* Errors that say the transport has no path to the peer, as opposed to
 * the request's own fault (a range refused, a cancel, a deadline). */
static bool path_error(int error)
{
	switch (error) {
	case -EIO:
	case -ETIMEDOUT:
	case -ENETDOWN:
	case -ENETUNREACH:
	case -EHOSTUNREACH:
	case -EHOSTDOWN:
	case -ECONNREFUSED:
	case -ECONNRESET:
	case -ECONNABORTED:
	case -ENOTCONN:
	case -EPIPE:
	case -ENODEV:
	case -ENOLINK:
	case -EPROTO:
		return true;
	default:
		return false;
	}
}

te_segver *te_segver_route(te_segver *sv)
{
	if (sv == NULL || sv->alt == NULL)
		return sv;
	int64_t until = atomic_load_explicit(&sv->fo_until, memory_order_relaxed);
	if (until == 0)
		return sv;
	int64_t now = te_now_ns();
	if (now < until)
		return sv->alt;
	/* Time to look again: this task probes the first transport, the
	 * others stay on the alternate until it answers or the next probe. */
	int64_t next = now + (int64_t)atomic_load(&sv->fo_backoff_ms) * 1000000;
	return atomic_compare_exchange_strong(&sv->fo_until, &until, next) ? sv : sv->alt;
}

/* A task on `sv` completed: its transport works again. */
void te_segver_recovered(te_segver *sv)
{
	int64_t until = atomic_exchange(&sv->fo_until, 0);
	if (until == 0)
		return;
	atomic_store(&sv->fo_backoff_ms, 0);
	te_info("segment %s: back on transport %s", sv->desc->name, sv->tp->hc.plugin->name);
}

bool te_task_failover(te_task *t, int error)
{
	if (!path_error(error) || t->sv == NULL)
		return false;
	/* Past its deadline: it fails as it is (a transport that does not
	 * honour deadlines kept it). */
	if (t->deadline != 0 && te_now_ns() >= t->deadline)
		return false;
	unsigned cur = atomic_load(&t->gate);
	do {
		if (cur & (TE_GATE_CLOSED | TE_GATE_ENDED | TE_GATE_MOVED))
			return false;
	} while (!atomic_compare_exchange_weak(&t->gate, &cur, cur | TE_GATE_MOVED | TE_GATE_MOVING));

	te_engine *e = t->batch->engine;
	te_segver *old = t->sv, *alt;
	g_rw_lock_reader_lock(&e->data);
	alt = old->alt;
	if (alt != NULL)
		atomic_fetch_add(&alt->refs, 1);
	g_rw_lock_reader_unlock(&e->data);
	if (alt == NULL || atomic_load(&alt->tp->retired)) {
		atomic_fetch_and(&t->gate, ~TE_GATE_MOVING);
		te_segver_unref(alt, true);
		return false;
	}
	te_transport_inst *otp = t->tp, *ntp = alt->tp;
	/* Device memory its transport moved itself (GPUDirect) goes through
	 * host memory on one that cannot (staged); on another that can, the
	 * region may not be registered with it: not moved. */
	bool staged = t->dev != NULL;
	if (staged && (ntp->ops->flags & TE_TRANSPORT_DEVICE_MEMORY)) {
		atomic_fetch_and(&t->gate, ~TE_GATE_MOVING);
		te_segver_unref(alt, true);
		return false;
	}
	atomic_fetch_add(&ntp->inflight, 1);

	/* New tasks of the segment go to the alternate for a while. */
	int64_t now = te_now_ns();
	int backoff = atomic_load(&old->fo_backoff_ms);
	int64_t until = atomic_load(&old->fo_until);
	if (until == 0 || until <= now) {
		int next = backoff == 0 ? FO_BACKOFF_MIN_MS : backoff * 2 > FO_BACKOFF_MAX_MS ? FO_BACKOFF_MAX_MS : backoff * 2;
		atomic_store(&old->fo_backoff_ms, next);
		atomic_store(&old->fo_until, now + (int64_t)(backoff == 0 ? FO_BACKOFF_MIN_MS : backoff) * 1000000);
		te_warn("segment %s: transport %s failed (%s); its tasks go over %s, %s tried again in %d ms",
			old->desc->name, otp->hc.plugin->name, te_strerror(error), ntp->hc.plugin->name,
			otp->hc.plugin->name, backoff == 0 ? FO_BACKOFF_MIN_MS : backoff);
	}
	if (e->metrics != NULL)
		te_metrics_dev_add(e->metrics, otp->hc.mb, NULL, TE_METRIC_FAILOVERS, 1);

	/* Afresh on the alternate: its transport sees a new transfer. Counted
	 * as the first transport's still (t->mb), where it was submitted. */
	t->sv = alt;
	t->tp = ntp;
	t->xfer.seg_ctx = alt->seg_ctx;
	t->xfer.nr_slices = 1;
	for (size_t i = 0; i < sizeof t->xfer.plugin_data / sizeof t->xfer.plugin_data[0]; i++)
		t->xfer.plugin_data[i] = 0;
	atomic_store(&t->slices_done, 0);
	atomic_store(&t->error, 0);
	atomic_store(&t->transferred, 0);
	if (staged) {
		/* Staging copies do not pass the gate: no early end from here,
		 * as for any staged task. */
		atomic_fetch_and(&t->gate, ~(TE_GATE_MOVING | TE_GATE_HANDED));
		te_segver_unref(old, true);
		atomic_fetch_sub_explicit(&otp->inflight, 1, memory_order_release);
		g_rw_lock_reader_lock(&e->mem.lock);
		te_stage_submit(e, t);
		g_rw_lock_reader_unlock(&e->mem.lock);
		te_stage_flush(e);
		return true;
	}
	/* From here a deadline may end it on its new transport. */
	atomic_fetch_and(&t->gate, ~TE_GATE_MOVING);
	te_segver_unref(old, true);
	atomic_fetch_sub_explicit(&otp->inflight, 1, memory_order_release);

	/* Its deadline's timer may have fired while the first transport,
	 * which did not honour it, held the task: watch it again. */
	te_batch *b = t->batch;
	if (t->deadline != 0 && !(otp->ops->flags & TE_TRANSPORT_DEADLINES))
		te_deadline_arm(e, b->id, (size_t)(t - b->tasks), 1, t->deadline);
	/* The task may end inside submit and let go of the version; the
	 * transport's segment context must outlive the call, as a submit's
	 * does under the segment's own reference. */
	atomic_fetch_add(&alt->refs, 1);
	te_transfer *x = &t->xfer;
	int rc = ntp->ops->submit(ntp->ctx, &x, 1);
	if (rc < 0) {
		te_warn_limited("segment %s: transport %s refused a task moved to it: %s", alt->desc->name,
				ntp->hc.plugin->name, te_strerror(rc));
		te_task_complete(t, 0, rc);
	}
	te_segver_unref(alt, true);
	return true;
}
