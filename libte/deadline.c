/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Deadlines and early ends. A task handed to a transport that honours
 * deadlines (TE_TRANSPORT_DEADLINES) may be ended before its transport
 * finished it: at its deadline, or when its batch is canceled. What makes
 * that safe is the task's gate: the transport touches the task's memory
 * only between transfer_enter() and transfer_leave(); ending early closes
 * the gate, waits for the open touches to leave, and asks the transport to
 * drop the task (expire), so once the caller sees the task ended nothing
 * reads or writes its memory. The task's storage stays until its
 * transport's last completion, which is then absorbed.
 *
 * Deadlines are kept in one min-heap per engine, an entry per submit call
 * (not per task), served by a thread started at the first deadline: an
 * engine that never sets one starts no thread. An entry names its batch
 * by id, so a batch freed before its deadline costs a failed lookup.
 */
#include <sched.h>
#include <time.h>

#include "internal.h"
#include "teu-keeper.h"

_Thread_local int64_t te_call_deadline;

typedef struct dl_entry {
	int64_t when;
	te_batch_id batch;
	size_t base, n;
} dl_entry;

struct te_deadlines {
	teu_keeper timer; /* the timer thread; its lock guards `heap` */
	GArray *heap;     /* dl_entry, a binary min-heap on `when` */
	te_engine *e;
};

int64_t te_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void heap_push(GArray *h, dl_entry x)
{
	g_array_append_val(h, x);
	dl_entry *a = (dl_entry *)(void *)h->data;
	for (size_t i = h->len - 1; i > 0;) {
		size_t p = (i - 1) / 2;
		if (a[p].when <= a[i].when)
			break;
		dl_entry t = a[p];
		a[p] = a[i];
		a[i] = t;
		i = p;
	}
}

static dl_entry heap_pop(GArray *h)
{
	dl_entry *a = (dl_entry *)(void *)h->data;
	dl_entry top = a[0];
	a[0] = a[h->len - 1];
	g_array_set_size(h, h->len - 1);
	a = (dl_entry *)(void *)h->data;
	for (size_t i = 0, n = h->len;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		if (l < n && a[l].when < a[m].when)
			m = l;
		if (r < n && a[r].when < a[m].when)
			m = r;
		if (m == i)
			break;
		dl_entry t = a[m];
		a[m] = a[i];
		a[i] = t;
		i = m;
	}
	return top;
}

static gpointer timer_main(gpointer data)
{
	te_deadlines *d = data;

	g_mutex_lock(&d->timer.lock);
	while (!d->timer.stopping) {
		if (d->heap->len == 0) {
			g_cond_wait(&d->timer.cond, &d->timer.lock);
			continue;
		}
		int64_t when = ((dl_entry *)(void *)d->heap->data)[0].when;
		int64_t now = te_now_ns();
		if (when > now) {
			/* GLib's monotonic clock is CLOCK_MONOTONIC in microseconds;
			 * rounded up so the wake-up is never early. */
			g_cond_wait_until(&d->timer.cond, &d->timer.lock, g_get_monotonic_time() + (when - now + 999) / 1000);
			continue;
		}
		dl_entry x = heap_pop(d->heap);
		g_mutex_unlock(&d->timer.lock);
		te_batch_expire_range(d->e, x.batch, x.base, x.n);
		g_mutex_lock(&d->timer.lock);
	}
	g_mutex_unlock(&d->timer.lock);
	return NULL;
}

/* Engines are created and destroyed under the caller's control, but
 * submits race: the timer is made once under this lock. */
static GMutex make_lock;

void te_deadline_arm(te_engine *e, te_batch_id id, size_t base, size_t n, int64_t when)
{
	te_deadlines *d = atomic_load_explicit((te_deadlines *_Atomic *)&e->deadlines, memory_order_acquire);

	if (d == NULL) {
		g_mutex_lock(&make_lock);
		d = e->deadlines;
		if (d == NULL) {
			d = g_new0(te_deadlines, 1);
			teu_keeper_init(&d->timer);
			d->heap = g_array_new(FALSE, FALSE, sizeof(dl_entry));
			d->e = e;
			/* As g_thread_new(): without its timer no deadline is kept. */
			if (!teu_keeper_start(&d->timer, "te-deadline", timer_main, d))
				g_error("cannot start the deadline timer thread");
			atomic_store_explicit((te_deadlines *_Atomic *)&e->deadlines, d, memory_order_release);
		}
		g_mutex_unlock(&make_lock);
	}
	g_mutex_lock(&d->timer.lock);
	bool first = d->heap->len == 0 || when < ((dl_entry *)(void *)d->heap->data)[0].when;
	heap_push(d->heap, (dl_entry){ when, id, base, n });
	if (first)
		g_cond_signal(&d->timer.cond);
	g_mutex_unlock(&d->timer.lock);
}

void te_deadlines_stop(te_engine *e)
{
	te_deadlines *d = e->deadlines;

	if (d == NULL)
		return;
	teu_keeper_clear(&d->timer);
	g_array_unref(d->heap);
	g_free(d);
	e->deadlines = NULL;
}

int te_task_enter(te_task *t)
{
	unsigned g = atomic_fetch_add(&t->gate, 1);

	if (g & TE_GATE_CLOSED) {
		atomic_fetch_sub(&t->gate, 1);
		return 0;
	}
	/* Only a WRITE's bytes can leave for the peer (see te_task_end_early). */
	if (!(g & TE_GATE_ENTERED) && t->xfer.opcode == TE_OP_WRITE)
		atomic_fetch_or(&t->gate, TE_GATE_ENTERED);
	return 1;
}

void te_task_leave(te_task *t)
{
	atomic_fetch_sub_explicit(&t->gate, 1, memory_order_release);
}

/* Logs once per transport instance that it cannot end tasks early. */
static void note_no_deadlines(te_transport_inst *tp)
{
	if (!atomic_exchange(&tp->warned_deadlines, true))
		te_warn("transport %s does not honour deadlines (plugin ABI < 1.11 or without "
			"TE_TRANSPORT_DEADLINES): its tasks end when it ends them",
			tp->hc.plugin->name);
}

bool te_task_end_early(te_task *t, int state, int error)
{
	te_batch *b = t->batch;
	unsigned g = atomic_load_explicit(&t->gate, memory_order_acquire);

	if (!(g & TE_GATE_HANDED) || (g & (TE_GATE_CLOSED | TE_GATE_ENDED)))
		return false;
	g = atomic_fetch_or(&t->gate, TE_GATE_CLOSED);
	if (!(g & TE_GATE_HANDED) || (g & (TE_GATE_CLOSED | TE_GATE_ENDED)))
		return false; /* someone else is at it, or it just ended */
	/* A closed gate stops fail-over; one under way changes the transport
	 * for a moment (failover.c). */
	while (atomic_load(&t->gate) & TE_GATE_MOVING)
		te_cpu_relax();
	if (!(atomic_load(&t->gate) & TE_GATE_HANDED)) { /* moved to staging meanwhile */
		atomic_fetch_and(&t->gate, ~TE_GATE_CLOSED);
		return false;
	}
	te_transport_inst *tp = t->tp;
	if (tp != NULL && !(tp->ops->flags & TE_TRANSPORT_DEADLINES)) {
		/* It never looks at the gate: open it again, so that the task
		 * may still fail over to a transport that does. */
		atomic_fetch_and(&t->gate, ~TE_GATE_CLOSED);
		if (state != TE_TASK_CANCELED) /* a cancel there keeps its old meaning */
			note_no_deadlines(tp);
		return false;
	}
	/* From here its last completion leaves the publishing to this. */
	atomic_fetch_or(&t->gate, TE_GATE_ENDING);
	/* Held for this call; it becomes the early end's hold if it ends it. */
	atomic_fetch_add(&b->mem_refs, 1);
	/* Open touches are a memcpy or a non-blocking socket call long. */
	for (unsigned i = 0; atomic_load(&t->gate) & TE_GATE_COUNT; i++) {
		if (i < 256)
			te_cpu_relax();
		else
			sched_yield();
	}
	bool unsettled = false;
	if (tp != NULL && TE_HAS_OP(tp->ops, expire))
		unsettled = tp->ops->expire(tp->ctx, &t->xfer) > 0;
	else if (tp != NULL)
		unsettled = (atomic_load(&t->gate) & TE_GATE_ENTERED) != 0;
	if (t->xfer.opcode != TE_OP_WRITE)
		unsettled = false;
	unsigned cur = atomic_load(&t->gate), want;
	do {
		if (cur & TE_GATE_ENDED) { /* its last completion came first */
			te_batch_mem_unref(b);
			return false;
		}
		want = cur | TE_GATE_ENDED | TE_GATE_EARLY | (unsettled ? TE_GATE_UNSETTLED : 0);
	} while (!atomic_compare_exchange_weak(&t->gate, &cur, want));
	if (unsettled)
		atomic_fetch_add(&b->unsettled, 1);
	atomic_store(&t->error, error);
	te_task_publish_early(t, state);
	unsigned prev = atomic_fetch_or(&t->gate, TE_GATE_PUBDONE);
	if (prev & TE_GATE_FINAL)
		te_task_release_early(t, false);
	return true;
}
