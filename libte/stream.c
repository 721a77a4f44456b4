/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Transfers in a device stream's order (te_submit_on_stream): the tasks are
 * appended to their batch at once, WAITING, and a host function queued on
 * the stream starts them when the stream's earlier work has finished, then
 * holds the stream until each has ended. The function runs on a thread of
 * the device runtime, which must not call the runtime; starting a transfer
 * may (staging copies, local device copies), so it hands the start to the
 * engine's stream pool and only waits.
 *
 * A submission is owned twice: by its host function (which the runtime
 * calls once, whenever the stream gets there, perhaps after the engine is
 * gone) and by its tasks until the last ends. Whichever lets go last frees
 * it. An engine being destroyed cancels the submissions no stream has
 * reached; their functions then return at once without touching it.
 */
#include "internal.h"

enum { OP_QUEUED, OP_STARTED, OP_ORPHANED };

struct te_stream_op {
	te_engine *e;     /* while QUEUED or STARTED */
	te_batch *b;
	size_t base, n;
	te_request *reqs;
	void *stream;
	int state;        /* under op_lock */
	atomic_size_t left; /* tasks not ended, plus one while it is being started */
	GCond ended;      /* left reached 0 */
	atomic_int refs;  /* the host function's and the tasks' */
};

/* One lock for every submission: they are few at a time, and it guards the
 * engines' lists of queued ones too. */
static GMutex op_lock;

static void op_unref(te_stream_op *op)
{
	if (atomic_fetch_sub(&op->refs, 1) != 1)
		return;
	g_cond_clear(&op->ended);
	g_free(op->reqs);
	g_free(op);
}

/* Lock-free but for the last: a batch of many tasks ends on many threads. */
void te_stream_task_done(te_stream_op *op)
{
	if (atomic_fetch_sub(&op->left, 1) != 1)
		return;
	/* The waiter tests `left` under the lock: this wake-up is not lost. */
	g_mutex_lock(&op_lock);
	g_cond_broadcast(&op->ended);
	g_mutex_unlock(&op_lock);
	op_unref(op);
}

/* The stream pool: starts a submission its stream reached. */
static void op_start(gpointer data, gpointer user)
{
	te_stream_op *op = data;
	(void)user;

	int invalid = te_batch_start_held(op->e, op->b, op->base, op->reqs, op->n, op);
	if (invalid > 0)
		te_dbg("te_submit_on_stream: %d of %zu requests INVALID once stream %p reached them", invalid,
		       op->n, op->stream);
	te_stream_task_done(op); /* the start's own share of `left` */
}

/* On the runtime's thread, once the stream's earlier work has finished. */
static void on_stream(void *arg)
{
	te_stream_op *op = arg;

	g_mutex_lock(&op_lock);
	if (op->state == OP_QUEUED) {
		op->state = OP_STARTED;
		op->e->stream_ops = g_list_remove(op->e->stream_ops, op);
		g_thread_pool_push(op->e->stream_pool, op, NULL);
		while (atomic_load(&op->left) > 0)
			g_cond_wait(&op->ended, &op_lock);
	}
	g_mutex_unlock(&op_lock);
	op_unref(op);
}

int te_submit_on_stream(te_engine *e, te_batch_id batch, const te_request *reqs, size_t n,
			const char *location, void *stream)
{
	te_device *d;
	int index;

	if (e == NULL || (n > 0 && reqs == NULL)) {
		te_err("te_submit_on_stream: NULL %s", e == NULL ? "engine" : "request array");
		return -EINVAL;
	}
	int rc = te_device_for_stream(location, "te_submit_on_stream", &d, &index);
	if (rc < 0)
		return rc;
	bool on = TE_HAS_OP(d->ops, stream_launch_on);
	if (!on && !TE_HAS_OP(d->ops, stream_launch)) {
		te_err("te_submit_on_stream: device plugin %s cannot queue work on its streams",
		       d->hc.plugin->name);
		return -ENOTSUP;
	}
	if (!on && index >= 0) {
		/* A plugin of ABI 1.9 knows no device of a stream: it would queue
		 * on whichever device it makes current. */
		te_err("te_submit_on_stream: device plugin %s cannot tell a stream's device; give '%s' "
		       "without ':%d'", d->hc.plugin->name, d->ops->prefix, index);
		return -ENOTSUP;
	}
	if (n == 0)
		return 0;
	te_stream_op *op = g_new0(te_stream_op, 1);
	op->e = e;
	op->n = n;
	atomic_init(&op->left, n + 1);
	op->stream = stream;
	op->reqs = g_memdup2(reqs, n * sizeof *reqs);
	g_cond_init(&op->ended);
	atomic_init(&op->refs, 2);

	rc = te_batch_hold(e, batch, reqs, n, op, &op->b, &op->base);
	if (rc < 0) {
		g_cond_clear(&op->ended);
		g_free(op->reqs);
		g_free(op);
		return rc;
	}
	g_mutex_lock(&op_lock);
	op->state = OP_QUEUED;
	e->stream_ops = g_list_prepend(e->stream_ops, op);
	g_mutex_unlock(&op_lock);

	/* From here the host function may run at any moment, on another thread. */
	rc = on ? d->ops->stream_launch_on(d->ctx, index, stream, on_stream, op)
		: d->ops->stream_launch(d->ctx, stream, on_stream, op);
	if (rc == 0)
		return 0;
	te_log(TE_LOG_ERROR, d->hc.plugin->name, "te_submit_on_stream: queuing on stream %p failed: %s",
	       stream, te_strerror(rc));
	g_mutex_lock(&op_lock);
	op->state = OP_ORPHANED;
	e->stream_ops = g_list_remove(e->stream_ops, op);
	g_mutex_unlock(&op_lock);
	/* Appended already, so they end: FAILED, with the reason. */
	te_batch_end_held(op->b, op->base, n, TE_TASK_FAILED, rc);
	te_stream_task_done(op); /* the start that never comes */
	op_unref(op);            /* the host function that never runs */
	return rc;
}

GThreadPool *te_stream_pool_new(void)
{
	return g_thread_pool_new(op_start, NULL, 4, FALSE, NULL);
}

void te_stream_orphan_all(te_engine *e)
{
	g_mutex_lock(&op_lock);
	GList *ops = e->stream_ops;
	e->stream_ops = NULL;
	for (GList *l = ops; l != NULL; l = l->next)
		((te_stream_op *)l->data)->state = OP_ORPHANED;
	g_mutex_unlock(&op_lock);
	for (GList *l = ops; l != NULL; l = l->next) {
		te_stream_op *op = l->data;
		te_warn("engine %s: %zu requests queued on stream %p, not reached yet, canceled", e->name,
			op->n, op->stream);
		te_batch_end_held(op->b, op->base, op->n, TE_TASK_CANCELED, -ECANCELED);
		te_stream_task_done(op); /* the start that never comes */
	}
	g_list_free(ops);
}
