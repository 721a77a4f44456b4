/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Staging: a remote transfer whose local side is device memory, handed to a
 * transport that cannot move device memory itself (no
 * TE_TRANSPORT_DEVICE_MEMORY). The host cuts it into chunks that travel
 * through host buffers of its own: for a WRITE each chunk is copied out of
 * the device and then handed to the transport; for a READ the transport
 * fills the buffer and the chunk is then copied into the device. Each job
 * has STAGE_SLOTS buffers in rotation, so the device copy of one chunk
 * overlaps the transport's I/O of the others: never one blocking copy of
 * the whole transfer. Doing it here serves every transport at once.
 *
 * The buffers are one area per engine, page-locked by the device plugin when
 * it can, registered as libte's own memory (transports that need to know
 * their buffers, such as RDMA, register it; the descriptor leaves it out),
 * in lanes of STAGE_SLOTS chunks, one lane per staging thread.
 */
#include <string.h>

#include "internal.h"

#define STAGE_SLOTS 4
#define STAGE_THREADS 2
#define CHUNK_DEFAULT (1u << 20)
#define CHUNK_MIN (4u << 10)
#define CHUNK_MAX (64u << 20)

enum { SLOT_FREE, SLOT_BUSY, SLOT_DONE };

typedef struct te_stage {
	te_task *parent;
	GMutex lock;
	GCond cond;
	int state[STAGE_SLOTS];
	uint64_t off[STAGE_SLOTS];
	te_task subs[STAGE_SLOTS];
} te_stage;

struct te_stager {
	GThreadPool *pool;
	GMutex lock;
	void *area;
	size_t chunk;
	te_device *area_dev; /* the plugin that allocated the area, or NULL */
	bool lane_busy[STAGE_THREADS];
	int area_rc; /* 0 once the area is registered; negative when it failed */
};

/* -------------------------------------------------------------- the area */

static int area_setup(te_engine *e, te_stager *s, te_device *dev)
{
	size_t size = s->chunk * STAGE_SLOTS * STAGE_THREADS;
	void *p = NULL;
	int rc;

	if (s->area != NULL || s->area_rc < 0)
		return s->area_rc;
	if (TE_HAS_OP(dev->ops, host_alloc) && TE_HAS_OP(dev->ops, host_free) &&
	    dev->ops->host_alloc(dev->ctx, size, &p) == 0) {
		s->area_dev = dev;
	} else if (posix_memalign(&p, 4096, size) != 0) {
		p = NULL;
	}
	if (p == NULL) {
		te_err("staging: cannot allocate %zu bytes of host buffers", size);
		return s->area_rc = -ENOMEM;
	}
	rc = te_register_hidden(e, p, size);
	if (rc < 0) {
		te_err("staging: cannot register the %zu-byte staging area: %s", size, te_strerror(rc));
		if (s->area_dev != NULL)
			s->area_dev->ops->host_free(s->area_dev->ctx, p);
		else
			free(p);
		s->area_dev = NULL;
		return s->area_rc = rc;
	}
	s->area = p;
	te_dbg("staging: %zu bytes of %s host buffers, %zu-byte chunks", size,
	       s->area_dev ? "page-locked" : "ordinary", s->chunk);
	return 0;
}

static int lane_take(te_engine *e, te_stager *s, te_device *dev)
{
	int lane = -1;

	g_mutex_lock(&s->lock);
	int rc = area_setup(e, s, dev);
	for (int i = 0; rc == 0 && i < STAGE_THREADS; i++) {
		if (!s->lane_busy[i]) {
			s->lane_busy[i] = true;
			lane = i;
			break;
		}
	}
	g_mutex_unlock(&s->lock);
	/* The pool runs at most STAGE_THREADS jobs, so a lane is always free. */
	return rc < 0 ? rc : lane;
}

static void lane_give(te_stager *s, int lane)
{
	g_mutex_lock(&s->lock);
	s->lane_busy[lane] = false;
	g_mutex_unlock(&s->lock);
}

/* --------------------------------------------------------------- the job */

void te_stage_slice_done(te_task *sub, uint64_t bytes, int error)
{
	te_stage *job = sub->stage;

	if (bytes)
		atomic_fetch_add_explicit(&sub->transferred, bytes, memory_order_relaxed);
	if (error) {
		int expect = 0;
		atomic_compare_exchange_strong(&sub->error, &expect, error);
	}
	unsigned done = atomic_fetch_add_explicit(&sub->slices_done, 1, memory_order_acq_rel) + 1;
	if (done != sub->xfer.nr_slices)
		return;
	g_mutex_lock(&job->lock);
	job->state[sub - job->subs] = SLOT_DONE;
	g_cond_signal(&job->cond);
	g_mutex_unlock(&job->lock);
}

/* Starts chunk `off` in slot `i`; for a WRITE copies it out of the device
 * first. Called without the job's lock. */
static int start_chunk(te_task *t, te_stage *job, int i, char *buf, uint64_t off, uint64_t len)
{
	te_task *sub = &job->subs[i];
	int rc;

	if (t->xfer.opcode == TE_OP_WRITE) {
		rc = te_device_copy_with(t->dev, buf, (const char *)t->xfer.local + off, len);
		if (rc < 0)
			return rc;
	}
	sub->batch = t->batch;
	sub->stage = job;
	sub->xfer = (te_transfer){
		.opcode = t->xfer.opcode,
		.nr_slices = 1,
		.local = buf,
		.remote = t->xfer.remote + off,
		.length = len,
		.seg_ctx = t->xfer.seg_ctx,
		.local_location = t->xfer.local_location,
	};
	atomic_store(&sub->slices_done, 0);
	atomic_store(&sub->error, 0);
	atomic_store(&sub->transferred, 0);
	job->off[i] = off;
	job->state[i] = SLOT_BUSY; /* before the transport may complete it */
	te_transfer *x = &sub->xfer;
	rc = t->tp->ops->submit(t->tp->ctx, &x, 1);
	if (rc < 0) {
		te_err("staging: transport %s refused a chunk: %s", t->tp->hc.plugin->name,
		       te_strerror(rc));
		x->nr_slices = 1;
		atomic_store(&sub->slices_done, 0);
		te_stage_slice_done(sub, 0, rc);
	}
	return 0;
}

static void run(gpointer data, gpointer user)
{
	te_task *t = data;
	te_engine *e = user;
	te_stager *s = e->stager;
	te_stage job = { .parent = t };
	uint64_t next = 0, moved = 0;
	int error = 0, busy = 0;
	int lane = lane_take(e, s, t->dev);
	char *bufs[STAGE_SLOTS];

	if (lane < 0) {
		te_task_complete(t, 0, lane);
		return;
	}
	for (int i = 0; i < STAGE_SLOTS; i++)
		bufs[i] = (char *)s->area + ((size_t)lane * STAGE_SLOTS + (size_t)i) * s->chunk;
	g_mutex_init(&job.lock);
	g_cond_init(&job.cond);
	for (;;) {
		/* Fill every free slot while chunks remain and nothing failed. */
		for (int i = 0; i < STAGE_SLOTS && next < t->xfer.length && error == 0; i++) {
			if (job.state[i] != SLOT_FREE)
				continue;
			if (atomic_load_explicit(&t->batch->canceled, memory_order_relaxed)) {
				error = -ECANCELED;
				break;
			}
			uint64_t len = MIN(s->chunk, t->xfer.length - next);
			int rc = start_chunk(t, &job, i, bufs[i], next, len);
			if (rc < 0) {
				error = rc;
				break;
			}
			next += len;
			busy++;
		}
		if (busy == 0)
			break;
		g_mutex_lock(&job.lock);
		int ready = -1;
		while (ready < 0) {
			for (int i = 0; i < STAGE_SLOTS && ready < 0; i++)
				if (job.state[i] == SLOT_DONE)
					ready = i;
			if (ready < 0)
				g_cond_wait(&job.cond, &job.lock);
		}
		job.state[ready] = SLOT_FREE;
		g_mutex_unlock(&job.lock);
		busy--;
		te_task *sub = &job.subs[ready];
		int rc = atomic_load(&sub->error);
		uint64_t len = sub->xfer.length;
		if (rc == 0 && atomic_load(&sub->transferred) < len)
			rc = -EIO;
		if (rc == 0 && t->xfer.opcode == TE_OP_READ)
			rc = te_device_copy_with(t->dev, (char *)t->xfer.local + job.off[ready],
						 bufs[ready], len);
		if (rc < 0 && error == 0)
			error = rc;
		if (rc == 0)
			moved += len;
	}
	g_mutex_clear(&job.lock);
	g_cond_clear(&job.cond);
	lane_give(s, lane);
	te_task_complete(t, moved, error);
}

/* ---------------------------------------------------------------- engine */

int te_stage_init(te_engine *e)
{
	te_stager *s = g_new0(te_stager, 1);
	const char *v = te_engine_option(e, "TE_STAGE_CHUNK_BYTES");
	uint64_t n;

	if (v == NULL)
		v = te_env2("TE_STAGE_CHUNK_BYTES", NULL);
	s->chunk = CHUNK_DEFAULT;
	if (v != NULL) {
		if (te_parse_u64(v, &n) && n >= CHUNK_MIN && n <= CHUNK_MAX)
			s->chunk = (size_t)n & ~(size_t)(CHUNK_MIN - 1);
		else
			te_warn("TE_STAGE_CHUNK_BYTES=%s is not a number from %u to %u; using %u", v,
				CHUNK_MIN, CHUNK_MAX, CHUNK_DEFAULT);
	}
	g_mutex_init(&s->lock);
	s->pool = g_thread_pool_new(run, e, STAGE_THREADS, FALSE, NULL);
	if (s->pool == NULL) {
		g_free(s);
		return -ENOMEM;
	}
	e->stager = s;
	return 0;
}

/* After every task ended (the pool is idle) and the registry was cleared. */
void te_stage_fini(te_engine *e)
{
	te_stager *s = e->stager;

	if (s == NULL)
		return;
	g_thread_pool_free(s->pool, FALSE, TRUE);
	if (s->area != NULL) {
		if (s->area_dev != NULL)
			s->area_dev->ops->host_free(s->area_dev->ctx, s->area);
		else
			free(s->area);
	}
	g_mutex_clear(&s->lock);
	g_free(s);
	e->stager = NULL;
}

void te_stage_submit(te_engine *e, te_task *t)
{
	g_thread_pool_push(e->stager->pool, t, NULL);
}
