/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The HIP plugin's copies: synchronous ones, asynchronous ones on two
 * streams whose ends a completer thread reports, batches on a pool of
 * streams, and the page-locked host memory they run at full speed from.
 */
#include "hip-internal.h"
#include "teu-fifo.h"

/* On a non-blocking stream of the plugin's, never hipMemcpy: that runs on
 * the null stream, after its work and that of every blocking stream, which
 * a te_submit_on_stream() host function may hold while it waits for this
 * very copy. hipMemcpy only where the runtime has no stream calls. */
int hip_copy(void *ctx, void *dst, const void *src, size_t len)
{
	hip_ctx *c = ctx;
	hipStream_t s = copy_stream_take(c);
	hipError_t e;

	if (s == NULL) {
		/* Unified addressing: hipMemcpyDefault finds every direction. */
		e = c->rt.Memcpy(dst, src, len, hipMemcpyDefault);
		return teu_gpu_copied(&c->g, len, "hipMemcpy", e, hipSuccess);
	}
	e = c->rt.MemcpyAsync(dst, src, len, hipMemcpyDefault, s);
	hipError_t w = e == hipSuccess ? c->rt.StreamSynchronize(s) : hipSuccess;
	copy_stream_give(c, s);
	return teu_gpu_copied(&c->g, len, "hipMemcpyAsync", e, w);
}

/* ------------------------------------------------------ asynchronous copies */

/*
 * Each copy is followed by an event on its stream, and the completer thread
 * waits for the events in the order the copies were queued. Stream callbacks
 * would do the same work, but HIP runs a stream's callback as a blocking
 * step of that stream, so every copy would wait for the callback before it.
 * The copies queued after the one waited for that have ended too are
 * reported with it, as one burst for the host (device_done_burst): the
 * staged chunks they make ready go to their transport in one call.
 */

/* The next queued copy if its event has ended (without waiting), else NULL. */
static hip_pending *take_ended(hip_ctx *c)
{
	hip_pending *d = NULL;

	if (c->rt.EventQuery == NULL)
		return NULL;
	pthread_mutex_lock(&c->lock);
	d = c->head;
	pthread_mutex_unlock(&c->lock);
	/* Asked outside the lock, not to hold up the submitters; only this
	 * thread takes from the list, so d is still its head after. An error
	 * is left for EventSynchronize to report, on the next turn. */
	if (d == NULL || c->rt.EventQuery(d->ev) != hipSuccess)
		return NULL;
	pthread_mutex_lock(&c->lock);
	TEU_FIFO_TAKE(c->head, c->tail, d);
	pthread_mutex_unlock(&c->lock);
	return d;
}

/* Recycles the copy's event and tells its owner. */
static void report(hip_ctx *c, hip_pending *d, hipError_t e)
{
	if (e != hipSuccess)
		c->g.host->log(c->g.host, TE_LOG_ERROR, "asynchronous copy of %zu bytes: %s", d->len,
			       errstr(&c->rt, e));
	pthread_mutex_lock(&c->lock);
	/* An event that reported an error is not trusted again. */
	if (e == hipSuccess && c->nspare < SPARE_EVENTS)
		c->spare[c->nspare++] = d->ev;
	else
		c->rt.EventDestroy(d->ev);
	pthread_mutex_unlock(&c->lock);
	d->done(d->arg, e == hipSuccess ? 0 : -EIO);
	free(d);
}

static void *completer(void *arg)
{
	hip_ctx *c = arg;

	for (;;) {
		hip_pending *d;
		TEU_FIFO_NEXT(c->head, c->tail, d, &c->cond, &c->lock, c->quit);
		if (d == NULL)
			break; /* quit, and every queued copy reported */
		hipError_t e = c->rt.EventSynchronize(d->ev);
		hip_pending *more = take_ended(c);
		bool burst = more != NULL && TE_HAS_OP(c->g.host, device_done_burst);
		if (burst)
			c->g.host->device_done_burst(c->g.host, 1);
		report(c, d, e);
		for (int n = 1; more != NULL;) {
			d = more;
			more = ++n < BURST_MAX ? take_ended(c) : NULL;
			report(c, d, hipSuccess);
		}
		if (burst)
			c->g.host->device_done_burst(c->g.host, 0);
	}
	return NULL;
}

/* Streams on device 0 (unified addressing: any direction, any device) and
 * the completer thread; false (copies stay synchronous) when the runtime
 * lacks the calls or refuses. */
bool async_start(hip_ctx *c)
{
	runtime *r = &c->rt;
	int made = 0;

	if (r->StreamCreateWithFlags == NULL || r->StreamDestroy == NULL || r->MemcpyAsync == NULL ||
	    r->EventCreateWithFlags == NULL || r->EventRecord == NULL || r->EventSynchronize == NULL ||
	    r->EventDestroy == NULL)
		return false;
	int old = device_enter(c, 0);
	for (; made < STREAMS; made++) {
		hipError_t e = r->StreamCreateWithFlags(&c->streams[made], hipStreamNonBlocking);
		if (e != hipSuccess) {
			c->g.host->log(c->g.host, TE_LOG_INFO, "no stream for asynchronous copies: %s", errstr(r, e));
			break;
		}
	}
	device_leave(c, 0, old);
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	if (made == STREAMS && pthread_create(&c->completer, NULL, completer, c) == 0)
		return true;
	while (made > 0)
		r->StreamDestroy(c->streams[--made]);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	return false;
}

/* Every copy started has been reported to its owner when this returns. The
 * host destroys device plugins after every engine, so no done() starts a
 * copy here any more. */
void async_stop(hip_ctx *c)
{
	if (!c->async)
		return;
	for (int i = 0; i < STREAMS; i++)
		c->rt.StreamSynchronize(c->streams[i]);
	teu_fifo_stop(&c->lock, &c->cond, &c->quit, c->completer);
	for (int i = 0; i < STREAMS; i++)
		c->rt.StreamDestroy(c->streams[i]);
	while (c->nspare > 0)
		c->rt.EventDestroy(c->spare[--c->nspare]);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	c->async = false;
}

static hipError_t take_event(hip_ctx *c, hipEvent_t *ev)
{
	pthread_mutex_lock(&c->lock);
	bool have = c->nspare > 0;
	if (have)
		*ev = c->spare[--c->nspare];
	pthread_mutex_unlock(&c->lock);
	if (have)
		return hipSuccess;
	int old = device_enter(c, 0); /* an event belongs to its streams' device */
	hipError_t e = c->rt.EventCreateWithFlags(ev, hipEventDisableTiming);
	device_leave(c, 0, old);
	return e;
}

/* hipMemcpyAsync on the next stream, then an event the completer waits for:
 * the caller's thread never waits for the copy. */
int hip_copy_async(void *ctx, void *dst, const void *src, size_t len, te_device_done_fn done,
		   void *arg)
{
	hip_ctx *c = ctx;
	hipEvent_t ev = NULL;

	if (!c->async)
		return -ENOTSUP;
	hip_pending *d = malloc(sizeof *d);
	if (d == NULL)
		return -ENOMEM;
	hipError_t e = take_event(c, &ev);
	if (e != hipSuccess) {
		/* Nothing queued yet: let the host copy this one synchronously. */
		TE_HOST_LOG_LIMITED(c->g.host, TE_LOG_WARN, "hipEventCreateWithFlags: %s", errstr(&c->rt, e));
		free(d);
		return -ENOTSUP;
	}
	*d = (hip_pending){ .ev = ev, .done = done, .arg = arg, .len = len };
	hipStream_t s = c->streams[atomic_fetch_add_explicit(&c->next_stream, 1, memory_order_relaxed) % STREAMS];
	e = c->rt.MemcpyAsync(dst, src, len, hipMemcpyDefault, s);
	if (e != hipSuccess) {
		c->g.host->log(c->g.host, TE_LOG_ERROR, "hipMemcpyAsync of %zu bytes: %s", len, errstr(&c->rt, e));
		c->rt.EventDestroy(ev);
		free(d);
		return -EIO;
	}
	e = c->rt.EventRecord(ev, s);
	if (e != hipSuccess) {
		/* The copy is queued and nothing would report its end: wait for
		 * it here (done runs before copy_async returns). */
		if (!atomic_exchange(&c->said_sync, true))
			c->g.host->log(c->g.host, TE_LOG_WARN,
				       "hipEventRecord: %s; waiting for copies instead (said once)",
				       errstr(&c->rt, e));
		c->rt.EventDestroy(ev);
		free(d);
		e = c->rt.StreamSynchronize(s);
		if (e != hipSuccess)
			c->g.host->log(c->g.host, TE_LOG_ERROR, "copy of %zu bytes: %s", len, errstr(&c->rt, e));
		done(arg, e == hipSuccess ? 0 : -EIO);
		return 0;
	}
	pthread_mutex_lock(&c->lock);
	TEU_FIFO_PUSH(c->head, c->tail, d);
	pthread_cond_signal(&c->cond);
	pthread_mutex_unlock(&c->lock);
	return 0;
}

/* ------------------------------------------------------------------ batches */

/* A new stream of the batch pool (teu_gpu_pool_take, which holds its lock). */
static int batch_stream_make(void *ctx, void **s)
{
	hip_ctx *c = ctx;
	int old = device_enter(c, 0);
	hipError_t e = c->rt.StreamCreateWithFlags((hipStream_t *)s, hipStreamNonBlocking);

	device_leave(c, 0, old);
	if (e != hipSuccess)
		TE_HOST_LOG_LIMITED(c->g.host, TE_LOG_WARN, "no stream for a batch: %s", errstr(&c->rt, e));
	return e;
}

/* A stream for a synchronous copy or a batch: one of the batch pool, or
 * where the runtime makes none, one of the asynchronous copies' streams,
 * shared; NULL only without the stream calls. */
hipStream_t copy_stream_take(hip_ctx *c)
{
	hipStream_t s = NULL;

	if (c->rt.MemcpyAsync != NULL && c->rt.StreamCreateWithFlags != NULL && c->rt.StreamDestroy != NULL)
		s = teu_gpu_pool_take(&c->batch, batch_stream_make, c);
	if (s == NULL && c->async)
		s = c->streams[0];
	return s;
}

void copy_stream_give(hip_ctx *c, hipStream_t s)
{
	teu_gpu_pool_give(&c->batch, s); /* an asynchronous copies' stream is not the pool's */
}

/* The pieces queued together on one stream and waited for once: one copy
 * engine latency for the batch instead of one per piece. */
int hip_copy_batch(void *ctx, const te_copy *v, size_t n, unsigned flags)
{
	hip_ctx *c = ctx;
	hipStream_t s = NULL;
	(void)flags; /* no gather kernel here: every piece is a copy engine call */

	if (n == 0)
		return 0;
	s = copy_stream_take(c);
	if (s == NULL) /* no stream calls in the runtime */
		return teu_gpu_copy_each(hip_copy, c, v, n);
	int rc = 0;
	for (size_t i = 0; i < n; i++) {
		hipError_t e = c->rt.MemcpyAsync(v[i].dst, v[i].src, v[i].len, hipMemcpyDefault, s);
		if (e != hipSuccess) {
			c->g.host->log(c->g.host, TE_LOG_ERROR, "hipMemcpyAsync of piece %zu of %zu (%zu bytes): %s",
				       i, n, v[i].len, errstr(&c->rt, e));
			rc = -EIO;
			break; /* what was queued is still waited for */
		}
	}
	hipError_t e = c->rt.StreamSynchronize(s);
	if (e != hipSuccess) {
		c->g.host->log(c->g.host, TE_LOG_ERROR, "batch of %zu copies: %s", n, errstr(&c->rt, e));
		rc = -EIO;
	}
	copy_stream_give(c, s);
	return rc;
}

/* -------------------------------------------------------------- memory */

int hip_host_alloc(void *ctx, size_t len, void **ptr)
{
	hip_ctx *c = ctx;

	return c->rt.HostMalloc(ptr, len, hipHostMallocPortable) == hipSuccess ? 0 : -ENOMEM;
}

void hip_host_free(void *ctx, void *ptr)
{
	hip_ctx *c = ctx;
	c->rt.HostFree(ptr);
}
