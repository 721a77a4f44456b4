/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA plugin's copies: synchronous ones, asynchronous ones through one
 * submitting thread and four lanes, batches (a stream of a pool, or the
 * gather kernel for device-to-device pieces), and the page-locked host
 * memory they run at full speed from.
 */
#include "cuda-internal.h"
#include "teu-fifo.h"
#include "teu-stats.h"

/* TE_CUDA_STATS=1: copy timings, printed when the plugin is unloaded (a
 * diagnostic for tuning on a GPU machine). */
static struct {
	atomic_ullong async_n, async_bytes, async_lat_ns, async_sync_ns;
	atomic_ullong batch_n, batch_pieces, batch_bytes, batch_ns, batch_wait_ns, batch_nostream;
	atomic_ullong launches, launch_pieces;
} cst;
TEU_STATS_SWITCH(cst, "TE_CUDA_STATS")
#define CST_ADD(field, v) TEU_STATS_ADD(cst_on, cst.field, v)
static void cst_print(void)
{
	unsigned long long a = atomic_load(&cst.async_n), b = atomic_load(&cst.batch_n);
	fprintf(stderr, "cuda-stats[%d]: async %llu, %.0f bytes, us avg: latency %.1f, in sync %.1f; "
		"batch %llu, %.1f pieces %.0f bytes, us avg: %.1f, wait %.1f; no stream %llu; "
		"gather launches %llu, %llu pieces\n", (int)getpid(),
		a, a ? (double)atomic_load(&cst.async_bytes) / a : 0,
		a ? atomic_load(&cst.async_lat_ns) / 1e3 / a : 0, a ? atomic_load(&cst.async_sync_ns) / 1e3 / a : 0,
		b, b ? (double)atomic_load(&cst.batch_pieces) / b : 0, b ? (double)atomic_load(&cst.batch_bytes) / b : 0,
		b ? atomic_load(&cst.batch_ns) / 1e3 / b : 0, b ? atomic_load(&cst.batch_wait_ns) / 1e3 / b : 0,
		(unsigned long long)atomic_load(&cst.batch_nostream), (unsigned long long)atomic_load(&cst.launches),
		(unsigned long long)atomic_load(&cst.launch_pieces));
}

static CUstream pool_get(cuda_ctx *c);
static void pool_put(cuda_ctx *c, CUstream s);
static CUresult stream_wait(cuda_ctx *c, CUstream s);
static bool gather_ready(cuda_ctx *c);
static bool kernel_piece(cuda_ctx *c, const te_copy *v, CUdeviceptr *dst, CUdeviceptr *src);
static CUresult pieces_queue(cuda_ctx *c, teu_gather *g, const te_copy *v, size_t n, CUstream s);

/* teu_gather_flush, counted for TE_CUDA_STATS. */
static CUresult launch(cuda_ctx *c, teu_gather *g, CUstream s)
{
	CST_ADD(launches, g->n > 0);
	return teu_gather_flush(&c->drv, c->gather_fn, g, s);
}

int cu_copy(void *ctx, void *dst, const void *src, size_t len)
{
	cuda_ctx *c = ctx;
	CUresult r;

	cu_make_current(c, 0);
	/* Queued on a stream of the plugin's and waited for on a blocking event,
	 * so that the wait sleeps (cuMemcpy would spin); and never cuMemcpy,
	 * which runs on the legacy default stream after its work and that of
	 * every blocking stream: a te_submit_on_stream() host function there
	 * would hold it, and the transfer would wait for itself. With
	 * TE_CUDA_WAIT=spin the wait spins. */
	CUstream s = pool_get(c);
	if (s == NULL) { /* a driver without the stream calls: nothing else */
		r = c->drv.Memcpy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, len);
		return teu_gpu_copied(&c->g, len, "cuMemcpy", r, CUDA_SUCCESS);
	}
	r = c->drv.MemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, len, s);
	CUresult w = r == CUDA_SUCCESS ? stream_wait(c, s) : CUDA_SUCCESS;
	pool_put(c, s);
	return teu_gpu_copied(&c->g, len, "cuMemcpyAsync", r, w);
}

/* ------------------------------------------------------ asynchronous copies */

/* Asynchronous copies go to one submitting thread per context, which
 * queues whatever has gathered since its last look on the next lane's stream
 * with one event after it; the lane's thread waits for the events in order
 * and reports each copy. Driver calls from many threads at once (every
 * transport thread finishing a staged chunk) contend inside the driver: on
 * an H100 the call and its event cost 20-80 us each from sixteen threads,
 * against ~4 us a queued 64 KiB copy from one. One thread also turns many
 * small copies into one wait. (A stream callback would hold the stream
 * until the host ran it: events instead.) */

/* Groups are cut at this many bytes or jobs, so that the first copies of a
 * burst are reported while later ones still run. */
#define GROUP_BYTES (4u << 20)
#define GROUP_JOBS 64

static bool has_events(const teu_cu_driver *d)
{
	return d->EventCreate != NULL && d->EventRecord != NULL && d->EventSynchronize != NULL &&
	       d->EventDestroy != NULL;
}

static CUevent event_get(cuda_ctx *c)
{
	CUevent ev = NULL;

	pthread_mutex_lock(&c->ev_lock);
	if (c->nevents > 0)
		ev = c->events[--c->nevents];
	pthread_mutex_unlock(&c->ev_lock);
	if (ev == NULL && c->drv.EventCreate != NULL &&
	    c->drv.EventCreate(&ev, CU_EVENT_DISABLE_TIMING | (c->wait_spin ? 0 : CU_EVENT_BLOCKING_SYNC)) !=
		    CUDA_SUCCESS)
		ev = NULL;
	return ev;
}

static void event_put(cuda_ctx *c, CUevent ev)
{
	pthread_mutex_lock(&c->ev_lock);
	if (c->nevents < EVENTS_KEPT) {
		c->events[c->nevents++] = ev;
		ev = NULL;
	}
	pthread_mutex_unlock(&c->ev_lock);
	if (ev != NULL)
		c->drv.EventDestroy(ev);
}

/* Waits for an event: polling first with TE_CUDA_WAIT=poll. */
static CUresult event_sync(cuda_ctx *c, CUevent ev)
{
	if (c->poll_us > 0 && c->drv.EventQuery != NULL) {
		struct timespec t0, t;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (;;) {
			CUresult r = c->drv.EventQuery(ev);
			if (r != CUDA_ERROR_NOT_READY)
				return r;
			clock_gettime(CLOCK_MONOTONIC, &t);
			if ((t.tv_sec - t0.tv_sec) * 1000000 + (t.tv_nsec - t0.tv_nsec) / 1000 >= (long)c->poll_us)
				break;
			sched_yield();
		}
	}
	return c->drv.EventSynchronize(ev);
}

/* Tells a job's owner how it ended; the job is gone afterwards. */
static void job_end(cu_job *j, int rc)
{
	j->done(j->arg, rc);
	free(j);
}

/* The lane's thread: waits for each group's event in the order they were
 * queued and reports its jobs, whose owners may start the next copies here. */
static void *lane_main(void *arg)
{
	lane *l = arg;
	cuda_ctx *c = l->owner;

	cu_make_current(c, 0);
	for (;;) {
		cu_group *g;
		TEU_FIFO_NEXT(l->head, l->tail, g, &l->cond, &l->lock, l->quit);
		if (g == NULL)
			break; /* quit, and every queued group reported */
		uint64_t ts = cst_now();
		CUresult r = g->ev != NULL ? event_sync(c, g->ev) : c->drv.StreamSynchronize(l->stream);
		uint64_t te = cst_now();
		if (r != CUDA_SUCCESS)
			c->g.host->log(c->g.host, TE_LOG_ERROR, "asynchronous copies of %zu bytes: %s", g->len,
				       teu_cu_errstr(&c->drv, r));
		if (g->ev != NULL)
			event_put(c, g->ev);
		CST_ADD(async_sync_ns, te - ts);
		/* A group's reports are one burst for the host: what they start
		 * (staged chunks for a transport) it hands over together. */
		bool burst = g->jobs != NULL && g->jobs->next != NULL && TE_HAS_OP(c->g.host, device_done_burst);
		if (burst)
			c->g.host->device_done_burst(c->g.host, 1);
		for (cu_job *j = g->jobs, *next; j != NULL; j = next) {
			next = j->next;
			CST_ADD(async_n, 1);
			CST_ADD(async_bytes, j->len);
			CST_ADD(async_lat_ns, te - j->t0);
			job_end(j, j->rc < 0 ? j->rc : r == CUDA_SUCCESS ? 0 : -EIO);
		}
		if (burst)
			c->g.host->device_done_burst(c->g.host, 0);
		free(g);
	}
	return NULL;
}

/* Queues a group's copies on the next lane's stream and hands it to that
 * lane's thread. With TE_CUDA_GATHER=host the pieces the kernel reaches go
 * in launches of it (a staged chunk's copy between device memory and a
 * staging buffer is one such piece), the others in a copy call each. */
static void group_issue(cuda_ctx *c, cu_job *jobs)
{
	lane *l = &c->lanes[c->next_lane++ % LANES];
	cu_group *g = malloc(sizeof *g);
	teu_gather *gp = NULL;

	if (g == NULL) {
		for (cu_job *j = jobs, *next; j != NULL; j = next) {
			next = j->next;
			job_end(j, -ENOMEM);
		}
		return;
	}
	*g = (cu_group){ .jobs = jobs };
	if (c->gather_mode == GATHER_HOST && jobs->next != NULL && gather_ready(c)) {
		gp = &c->sub_gather;
		gp->n = 0;
	}
	for (cu_job *j = jobs; j != NULL; j = j->next) {
		/* A launch may hold pieces of earlier jobs too: one that fails
		 * fails them all. */
		CUresult r = pieces_queue(c, gp, j->v, j->n, l->stream);
		for (cu_job *k = gp != NULL ? jobs : j; r != CUDA_SUCCESS && k != j->next; k = k->next)
			if (k->rc == 0)
				k->rc = -EIO;
		g->len += j->len;
	}
	CUresult lr = gp != NULL ? launch(c, gp, l->stream) : CUDA_SUCCESS;
	if (lr != CUDA_SUCCESS) {
		c->g.host->log(c->g.host, TE_LOG_ERROR, "gather kernel over a group of copies: %s", teu_cu_errstr(&c->drv, lr));
		for (cu_job *k = jobs; k != NULL; k = k->next)
			if (k->rc == 0)
				k->rc = -EIO;
	}
	g->ev = event_get(c);
	if (g->ev != NULL && c->drv.EventRecord(g->ev, l->stream) != CUDA_SUCCESS) {
		event_put(c, g->ev);
		g->ev = NULL;
	}
	pthread_mutex_lock(&l->lock);
	TEU_FIFO_PUSH(l->head, l->tail, g);
	pthread_cond_signal(&l->cond);
	pthread_mutex_unlock(&l->lock);
}

/* The submitting thread: takes what gathered in the queue, in groups. */
static void *submit_main(void *arg)
{
	cuda_ctx *c = arg;

	cu_make_current(c, 0);
	pthread_mutex_lock(&c->sub_lock);
	for (;;) {
		TEU_FIFO_WAIT(c->sub_head, &c->sub_cond, &c->sub_lock, c->sub_quit);
		cu_job *jobs = c->sub_head; /* all of them */
		if (jobs == NULL)
			break; /* quit, and every job queued */
		c->sub_head = c->sub_tail = NULL;
		pthread_mutex_unlock(&c->sub_lock);
		while (jobs != NULL) {
			cu_job *first = jobs, *last = jobs;
			size_t bytes = jobs->len;
			unsigned n = 1;
			while (last->next != NULL && n < GROUP_JOBS && bytes < GROUP_BYTES) {
				last = last->next;
				bytes += last->len;
				n++;
			}
			jobs = last->next;
			last->next = NULL;
			group_issue(c, first);
		}
		pthread_mutex_lock(&c->sub_lock);
	}
	pthread_mutex_unlock(&c->sub_lock);
	return NULL;
}

static void job_queue(cuda_ctx *c, cu_job *j)
{
	pthread_mutex_lock(&c->sub_lock);
	TEU_FIFO_PUSH(c->sub_head, c->sub_tail, j);
	if (c->sub_head == j)
		pthread_cond_signal(&c->sub_cond); /* it sleeps only on an empty queue */
	pthread_mutex_unlock(&c->sub_lock);
}

static void lane_stop(cuda_ctx *c, lane *l)
{
	if (l->started)
		teu_fifo_stop(&l->lock, &l->cond, &l->quit, l->thread);
	if (l->stream != NULL) {
		c->drv.StreamSynchronize(l->stream);
		c->drv.StreamDestroy(l->stream);
	}
	pthread_mutex_destroy(&l->lock);
	pthread_cond_destroy(&l->cond);
	memset(l, 0, sizeof *l);
}

static void submitter_stop(cuda_ctx *c)
{
	if (c->sub_started) {
		teu_fifo_stop(&c->sub_lock, &c->sub_cond, &c->sub_quit, c->sub_thread);
		c->sub_started = false;
	}
	pthread_mutex_destroy(&c->sub_lock);
	pthread_cond_destroy(&c->sub_cond);
}

/* Streams on device 0's context (unified addressing: any direction, any
 * device), their threads and the submitter; false (copies stay synchronous)
 * when the driver lacks the calls or refuses. */
bool cu_async_start(cuda_ctx *c)
{
	teu_cu_driver *d = &c->drv;
	int made = 0;

	if (d->StreamCreate == NULL || d->StreamDestroy == NULL || d->MemcpyAsync == NULL ||
	    !has_events(d) || c->ctx[0] == NULL)
		return false;
	cu_make_current(c, 0);
	pthread_mutex_init(&c->sub_lock, NULL);
	pthread_cond_init(&c->sub_cond, NULL);
	for (; made < LANES; made++) {
		lane *l = &c->lanes[made];
		l->owner = c;
		pthread_mutex_init(&l->lock, NULL);
		pthread_cond_init(&l->cond, NULL);
		CUresult r = d->StreamCreate(&l->stream, CU_STREAM_NON_BLOCKING);
		if (r != CUDA_SUCCESS) {
			c->g.host->log(c->g.host, TE_LOG_INFO, "no stream for asynchronous copies: %s", teu_cu_errstr(d, r));
			l->stream = NULL;
			made++;
			break;
		}
		if (pthread_create(&l->thread, NULL, lane_main, l) != 0) {
			made++;
			break;
		}
		l->started = true;
	}
	if (made == LANES && c->lanes[LANES - 1].started &&
	    pthread_create(&c->sub_thread, NULL, submit_main, c) == 0) {
		c->sub_started = true;
		return true;
	}
	submitter_stop(c);
	while (made > 0)
		lane_stop(c, &c->lanes[--made]);
	return false;
}

/* Every copy started has been reported to its owner when this returns. The
 * host destroys device plugins after every engine, so no done() starts a
 * copy here any more. */
void cu_async_stop(cuda_ctx *c)
{
	if (!c->async)
		return;
	cu_make_current(c, 0);
	submitter_stop(c); /* every job handed to a lane */
	for (int i = 0; i < LANES; i++)
		lane_stop(c, &c->lanes[i]);
	c->async = false;
}

/* Queued for the submitter: the caller's thread never waits for the copy
 * nor calls the driver, and the copy engine never waits for us. */
int cu_copy_async(void *ctx, void *dst, const void *src, size_t len, te_device_done_fn done,
			 void *arg)
{
	cuda_ctx *c = ctx;

	if (!c->async)
		return -ENOTSUP;
	cu_job *j = malloc(sizeof *j);
	if (j == NULL)
		return -ENOMEM;
	*j = (cu_job){ .one = { dst, src, len }, .n = 1, .done = done, .arg = arg, .len = len, .t0 = cst_now() };
	j->v = &j->one;
	job_queue(c, j);
	return 0;
}

/* ----------------------------------------------------------------- batches */

/* A new stream of the pool (teu_gpu_pool_take, which holds its lock). */
static int pool_make(void *ctx, void **s)
{
	cuda_ctx *c = ctx;

	cu_make_current(c, 0);
	CUresult r = c->drv.StreamCreate((CUstream *)s, CU_STREAM_NON_BLOCKING);
	if (r != CUDA_SUCCESS && !atomic_exchange(&c->said_no_pool, true))
		c->g.host->log(c->g.host, TE_LOG_WARN, "no stream for copies (%s): %s (said once)",
			       teu_cu_errstr(&c->drv, r),
			       c->pool.made > 0 ? "waiting for one in use" : "sharing the copy lanes'");
	return r;
}

/* A stream for a synchronous copy or a batch: one of the pool (up to
 * POOL_MAX); where the driver makes none, a lane's stream, shared. Never the
 * legacy stream (cuMemcpy), which a te_submit_on_stream() host function may
 * hold. NULL only when the driver has no stream calls. */
static CUstream pool_get(cuda_ctx *c)
{
	if (!c->streams)
		return NULL;
	CUstream s = teu_gpu_pool_take(&c->pool, pool_make, c);
	if (s == NULL && c->async)
		s = c->lanes[0].stream;
	return s;
}

/* A lane's stream is not the pool's: left alone. */
static void pool_put(cuda_ctx *c, CUstream s)
{
	teu_gpu_pool_give(&c->pool, s);
}

bool cuda_own_stream(void *ctx)
{
	cuda_ctx *c = ctx;
	CUstream s = pool_get(c);
	if (s != NULL)
		pool_put(c, s);
	return s != NULL;
}

/* Loads the gather kernel at the first batch that wants it; after that a
 * lock-free look (batches ask each time). */
static bool gather_ready(cuda_ctx *c)
{
	int state = atomic_load_explicit(&c->gather_state, memory_order_acquire);
	if (state != 0)
		return state == 1;
	pthread_mutex_lock(&c->gather_lock);
	state = atomic_load_explicit(&c->gather_state, memory_order_relaxed);
	if (state == 0) {
		state = -1;
		if (c->gather_mode == GATHER_OFF || c->drv.ModuleLoadData == NULL || c->drv.ModuleGetFunction == NULL ||
		    c->drv.ModuleUnload == NULL || c->drv.LaunchKernel == NULL) {
			c->g.host->log(c->g.host, TE_LOG_INFO, "device-to-device batches: a copy call per piece (%s)",
				       c->gather_mode == GATHER_OFF ? "TE_CUDA_GATHER=0" : "the driver has no kernel launches");
		} else {
			cu_make_current(c, 0);
			CUresult r = c->drv.ModuleLoadData(&c->gather_mod, teu_gather_ptx);
			if (r == CUDA_SUCCESS) {
				r = c->drv.ModuleGetFunction(&c->gather_fn, c->gather_mod, "te_gather_copy");
				if (r != CUDA_SUCCESS)
					c->drv.ModuleUnload(c->gather_mod);
			}
			if (r == CUDA_SUCCESS)
				state = 1;
			else
				c->g.host->log(c->g.host, TE_LOG_INFO,
					       "no gather kernel (%s): device-to-device batches take a copy call per piece",
					       teu_cu_errstr(&c->drv, r));
		}
		/* Published after the module and function it covers. */
		atomic_store_explicit(&c->gather_state, state, memory_order_release);
	}
	pthread_mutex_unlock(&c->gather_lock);
	return state == 1;
}

/* The device of a pointer, or -1 when it is not device memory. */
static int ordinal_of(cuda_ctx *c, const void *p)
{
	unsigned type = 0;
	int ordinal = -1;
	CUdeviceptr dp = (CUdeviceptr)(uintptr_t)p;

	if (c->drv.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dp) != CUDA_SUCCESS ||
	    type != CU_MEMORYTYPE_DEVICE ||
	    c->drv.PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dp) != CUDA_SUCCESS)
		return -1;
	return ordinal;
}

/* The page-locked host memory of cu_host_alloc holding [p, p+len): the
 * address the device reaches p at, or 0. */
static CUdeviceptr host_dev_addr(cuda_ctx *c, const void *p, size_t len)
{
	uintptr_t a = (uintptr_t)p;
	CUdeviceptr d = 0;

	pthread_mutex_lock(&c->host_lock);
	for (host_map *m = c->hosts; m != NULL; m = m->next)
		if (a >= m->start && a - m->start < m->size) {
			if (len <= m->size - (a - m->start))
				d = m->dev + (a - m->start);
			break;
		}
	pthread_mutex_unlock(&c->host_lock);
	return d;
}

/* Whether the gather kernel (on device 0) can move piece `v`, and at which
 * addresses: device memory of device 0 on both sides or, with
 * TE_CUDA_GATHER=host, on one side and this plugin's page-locked memory on
 * the other. Nothing else: a kernel touching memory the device cannot
 * reach would fault and poison the context. */
static bool kernel_piece(cuda_ctx *c, const te_copy *v, CUdeviceptr *dst, CUdeviceptr *src)
{
	*dst = (uintptr_t)v->dst;
	*src = (uintptr_t)v->src;
	if (c->gather_mode == GATHER_HOST) {
		/* The plugin's own page-locked memory first: no driver call. */
		CUdeviceptr h = host_dev_addr(c, v->dst, v->len);
		if (h != 0) {
			*dst = h;
			return ordinal_of(c, v->src) == 0;
		}
		h = host_dev_addr(c, v->src, v->len);
		if (h != 0) {
			*src = h;
			return ordinal_of(c, v->dst) == 0;
		}
	}
	return ordinal_of(c, v->dst) == 0 && ordinal_of(c, v->src) == 0;
}

/* Queues pieces on `s`: those the kernel can move into `g` (launched when
 * full; the caller launches the rest), the others with a copy call each.
 * Without `g`, a copy call each. */
static CUresult pieces_queue(cuda_ctx *c, teu_gather *g, const te_copy *v, size_t n, CUstream s)
{
	CUresult r = CUDA_SUCCESS;

	for (size_t i = 0; i < n && r == CUDA_SUCCESS; i++) {
		CUdeviceptr dst, src;
		if (v[i].len == 0)
			continue;
		if (g != NULL && kernel_piece(c, &v[i], &dst, &src)) {
			CST_ADD(launch_pieces, 1);
			if (teu_gather_add(g, dst, src, v[i].len)) {
				r = launch(c, g, s);
				if (r != CUDA_SUCCESS)
					c->g.host->log(c->g.host, TE_LOG_ERROR, "gather kernel over %d pieces: %s",
						       TEU_GATHER_MAX, teu_cu_errstr(&c->drv, r));
			}
			continue;
		}
		r = c->drv.MemcpyAsync((CUdeviceptr)(uintptr_t)v[i].dst, (CUdeviceptr)(uintptr_t)v[i].src, v[i].len,
				       s);
		if (r != CUDA_SUCCESS)
			c->g.host->log(c->g.host, TE_LOG_ERROR, "cuMemcpyAsync of %zu bytes: %s", v[i].len,
				       teu_cu_errstr(&c->drv, r));
	}
	return r;
}

/* Waits for what is queued on `s`: on a blocking event (the thread
 * sleeps), or spinning in cuStreamSynchronize with TE_CUDA_WAIT=spin. */
static CUresult stream_wait(cuda_ctx *c, CUstream s)
{
	CUevent ev = c->wait_spin ? NULL : event_get(c);

	if (ev == NULL)
		return c->drv.StreamSynchronize(s);
	CUresult r = c->drv.EventRecord(ev, s);
	r = r == CUDA_SUCCESS ? event_sync(c, ev) : c->drv.StreamSynchronize(s);
	event_put(c, ev);
	return r;
}

/* Every piece queued on one stream of the pool, then one wait. The gather
 * kernel takes the pieces it reaches (kernel_piece) when the batch says it
 * is device memory only (TE_COPY_DEVICE_ONLY) or with TE_CUDA_GATHER=host:
 * one launch for up to TEU_GATHER_MAX of them, as a copy call per piece costs
 * ~10 us whatever its size; the others take a copy call each. */
int cu_copy_batch(void *ctx, const te_copy *v, size_t n, unsigned flags)
{
	cuda_ctx *c = ctx;
	bool kernel = n > 1 && c->async && ((flags & TE_COPY_DEVICE_ONLY) || c->gather_mode == GATHER_HOST) &&
		      gather_ready(c);
	uint64_t t0 = cst_now();

	CST_ADD(batch_n, 1);
	CST_ADD(batch_pieces, n);
	for (size_t i = 0; cst_on && i < n; i++)
		CST_ADD(batch_bytes, v[i].len);
	CUstream s = pool_get(c);

	if (s == NULL) { /* no stream calls in the driver: one copy after the other */
		CST_ADD(batch_nostream, 1);
		return teu_gpu_copy_each(cu_copy, c, v, n);
	}
	cu_make_current(c, 0);
	teu_gather g = { .n = 0 };
	CUresult r = pieces_queue(c, kernel ? &g : NULL, v, n, s);
	if (r == CUDA_SUCCESS) {
		r = launch(c, &g, s);
		if (r != CUDA_SUCCESS)
			c->g.host->log(c->g.host, TE_LOG_ERROR, "gather kernel over a batch's pieces: %s",
				       teu_cu_errstr(&c->drv, r));
	}
	/* Wait even after a failure: nothing of this batch may still run when
	 * the caller reuses its buffers. */
	uint64_t tw = cst_now();
	CUresult w = stream_wait(c, s);
	CST_ADD(batch_wait_ns, cst_now() - tw);
	CST_ADD(batch_ns, cst_now() - t0);
	if (w != CUDA_SUCCESS)
		c->g.host->log(c->g.host, TE_LOG_ERROR, "batch of %zu copies: %s", n, teu_cu_errstr(&c->drv, w));
	pool_put(c, s);
	return r == CUDA_SUCCESS && w == CUDA_SUCCESS ? 0 : -EIO;
}

/* Page-locked, and mapped for the devices (with unified addressing every
 * such allocation is; the flag says so where it is not implied). Its device
 * address is kept for the gather kernel. */
int cu_host_alloc(void *ctx, size_t len, void **ptr)
{
	cuda_ctx *c = ctx;

	cu_make_current(c, 0);
	if (c->drv.MemHostAlloc(ptr, len, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP) != CUDA_SUCCESS &&
	    c->drv.MemHostAlloc(ptr, len, CU_MEMHOSTALLOC_PORTABLE) != CUDA_SUCCESS)
		return -ENOMEM;
	CUdeviceptr dev = 0;
	host_map *m = NULL;
	if (c->gather_mode == GATHER_HOST &&
	    c->drv.PointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, (uintptr_t)*ptr) == CUDA_SUCCESS &&
	    dev != 0 && (m = malloc(sizeof *m)) != NULL) {
		*m = (host_map){ .start = (uintptr_t)*ptr, .size = len, .dev = dev };
		pthread_mutex_lock(&c->host_lock);
		m->next = c->hosts;
		c->hosts = m;
		pthread_mutex_unlock(&c->host_lock);
	}
	return 0;
}

void cu_host_free(void *ctx, void *ptr)
{
	cuda_ctx *c = ctx;
	host_map *gone = NULL;

	/* Out of the kernel's reach before it is freed. */
	pthread_mutex_lock(&c->host_lock);
	for (host_map **pp = &c->hosts; *pp != NULL; pp = &(*pp)->next)
		if ((*pp)->start == (uintptr_t)ptr) {
			gone = *pp;
			*pp = gone->next;
			break;
		}
	pthread_mutex_unlock(&c->host_lock);
	free(gone);
	cu_make_current(c, 0);
	c->drv.MemFreeHost(ptr);
}
