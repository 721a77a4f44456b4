/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A broken transport for testing te-bench --check: it moves bytes between
 * engines of one process with memcpy, and flips one bit in every third
 * transfer. te-bench must notice and fail.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <te/te-plugin.h>

#include "../plugins/pid-descriptor.h"

static atomic_uint counter;

static int flip_create(const te_host *h, const char *args, void **ctx)
{
	(void)args;
	*ctx = (void *)h;
	return 0;
}

static void flip_destroy(void *ctx)
{
	(void)ctx;
}

PID_DESCRIPTOR_OPS(flip)

static void flip_segment_close(void *ctx, void *seg_ctx)
{
	(void)ctx;
	(void)seg_ctx;
}

static int flip_submit(void *ctx, te_transfer *const *ts, size_t n)
{
	const te_host *h = ctx;
	for (size_t i = 0; i < n; i++) {
		te_transfer *t = ts[i];
		unsigned char *remote = (unsigned char *)(uintptr_t)t->remote, *local = t->local;
		unsigned char *dst = t->opcode == TE_OP_READ ? local : remote;
		memcpy(dst, t->opcode == TE_OP_READ ? remote : local, t->length);
		if (atomic_fetch_add(&counter, 1) % 3 == 2)
			dst[t->length / 2] ^= 0x10;
		h->complete(h, t, t->length, 0);
	}
	return 0;
}

static const te_transport_ops flip_ops = {
	.size = sizeof(te_transport_ops),
	.flags = TE_TRANSPORT_MEMORY,
	.create = flip_create,
	.destroy = flip_destroy,
	.describe = flip_describe,
	.segment_open = flip_segment_open,
	.segment_close = flip_segment_close,
	.submit = flip_submit,
};

TE_PLUGIN_DEFINE(TE_KIND_TRANSPORT, "flip", "1.0.0", "test: memcpy that corrupts one transfer in three",
		 "Apache-2.0", &flip_ops)
