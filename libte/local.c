/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Transfers within the engine's own segment: plain memory copies. Small ones
 * run inline in te_submit(); large ones are cut into chunks that the copy
 * workers take in parallel (one memcpy stream does not saturate memory
 * bandwidth on most machines).
 */
#include <string.h>

#include "internal.h"

#define SPLIT_DEFAULT (4u << 20)
#define CHUNK_MIN (1u << 20)

static int copy_range(te_task *t, uint64_t off, uint64_t len)
{
	char *local = (char *)t->xfer.local + off;
	char *remote = (char *)(uintptr_t)t->xfer.remote + off;
	char *dst = t->xfer.opcode == TE_OP_READ ? local : remote;
	const char *src = t->xfer.opcode == TE_OP_READ ? remote : local;

	/* A side in device memory: only its plugin can copy it. */
	if (t->dev != NULL)
		return te_device_copy_with(t->dev, dst, src, len);
	/* memmove: the two ranges may overlap inside one segment. */
	memmove(dst, src, len);
	return 0;
}

static void copy_chunk(gpointer data, gpointer user)
{
	te_task *t = data;
	(void)user;
	unsigned idx = atomic_fetch_add(&t->chunk_next, 1);
	uint64_t chunks = t->xfer.nr_slices;
	uint64_t per = t->xfer.length / chunks;
	uint64_t off = per * idx;
	uint64_t len = idx + 1 == chunks ? t->xfer.length - off : per;

	if (atomic_load_explicit(&t->batch->canceled, memory_order_relaxed)) {
		te_task_complete(t, 0, -ECANCELED);
		return;
	}
	/* Ended early (a deadline, a cancel): the caller owns the memory again. */
	if (!te_task_enter(t)) {
		te_task_complete(t, 0, -ETIMEDOUT);
		return;
	}
	int rc = copy_range(t, off, len);
	te_task_leave(t);
	te_task_complete(t, rc < 0 ? 0 : len, rc);
}

int te_local_init(te_engine *e)
{
	const char *v = te_engine_option(e, "TE_LOCAL_SPLIT_BYTES");
	uint64_t s;

	e->local_split = SPLIT_DEFAULT;
	if (v == NULL)
		v = te_env2("TE_LOCAL_SPLIT_BYTES", NULL);
	if (v != NULL) {
		if (te_parse_u64(v, &s) && s >= CHUNK_MIN)
			e->local_split = s;
		else
			te_warn("TE_LOCAL_SPLIT_BYTES=%s is not a number >= %u; using %u", v, CHUNK_MIN,
				SPLIT_DEFAULT);
	}
	e->copy_threads = g_get_num_processors();
	if (e->copy_threads < 2)
		e->copy_threads = 2;
	if (e->copy_threads > 16)
		e->copy_threads = 16;
	e->copy_pool = g_thread_pool_new(copy_chunk, NULL, (gint)e->copy_threads, FALSE, NULL);
	return e->copy_pool ? 0 : -ENOMEM;
}

void te_local_fini(te_engine *e)
{
	if (e->copy_pool != NULL)
		g_thread_pool_free(e->copy_pool, FALSE, TRUE);
	e->copy_pool = NULL;
}

void te_local_submit(te_engine *e, te_task *t)
{
	uint64_t len = t->xfer.length;

	if (len < e->local_split) {
		int rc = copy_range(t, 0, len);
		te_task_complete(t, rc < 0 ? 0 : len, rc);
		return;
	}
	uint64_t chunks = len / CHUNK_MIN;
	if (chunks > e->copy_threads)
		chunks = e->copy_threads;
	t->xfer.nr_slices = (uint32_t)chunks;
	te_task_handed(t); /* copied on other threads: a deadline may end it */
	for (uint64_t i = 0; i < chunks; i++)
		g_thread_pool_push(e->copy_pool, t, NULL);
}
