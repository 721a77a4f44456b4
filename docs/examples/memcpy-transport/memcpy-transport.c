/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An example third-party transport for libte: moves bytes with memcpy between
 * engines living in the same process. It shows the whole plugin contract in
 * a page: the descriptor, create/destroy, a descriptor field of its own
 * ("memcpy_pid", so it only serves segments of its own process), segment
 * open/close and submit with per-transfer completion, through the host's
 * transfer services (te-host.h, TE_SERVICE_TRANSFER).
 *
 * Build it against an installed libte with nothing but pkg-config:
 *   cc -shared -fPIC -fvisibility=hidden -o libte-transport-memcpy.so \
 *      memcpy-transport.c $(pkg-config --cflags --libs libte-plugin)
 * and drop it into a directory on TE_PLUGIN_PATH.
 */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <te/te-transport.h> /* brings te-plugin.h and te-host.h */

typedef struct mc_ctx {
	const te_host *host;
	const te_transfer_service *xfer; /* complete(), canceled() */
} mc_ctx;

static int mc_create(const te_host *h, const char *args, void **ctx)
{
	mc_ctx *c = calloc(1, sizeof *c);

	(void)args;
	if (c == NULL)
		return -ENOMEM;
	c->host = h;
	c->xfer = te_host_service(h, TE_SERVICE_TRANSFER, 1);
	if (c->xfer == NULL) {
		h->log(h, TE_LOG_ERROR, "memcpy transport: the host offers no transfer services");
		free(c);
		return -ENOTSUP;
	}
	*ctx = c;
	h->log(h, TE_LOG_INFO, "memcpy transport ready in process %d", (int)getpid());
	return 0;
}

static void mc_destroy(void *ctx)
{
	free(ctx);
}

static int mc_describe(void *ctx, char **json)
{
	char buf[64];

	(void)ctx;
	snprintf(buf, sizeof buf, "{\"memcpy_pid\":%d}", (int)getpid());
	*json = strdup(buf);
	return *json ? 0 : -ENOMEM;
}

static int mc_segment_open(void *ctx, const te_segment_info *seg, void **seg_ctx)
{
	mc_ctx *c = ctx;
	char want[64];

	/* Only a segment of this very process can be reached by memcpy. */
	snprintf(want, sizeof want, "\"memcpy_pid\":%d", (int)getpid());
	if (seg->descriptor == NULL || strstr(seg->descriptor, want) == NULL) {
		c->host->log(c->host, TE_LOG_DEBUG, "segment %s is not in this process", seg->name);
		return -ENOTSUP;
	}
	*seg_ctx = NULL;
	return 0;
}

static void mc_segment_close(void *ctx, void *seg_ctx)
{
	(void)ctx;
	(void)seg_ctx;
}

static int mc_submit(void *ctx, te_transfer *const *ts, size_t n)
{
	mc_ctx *c = ctx;

	for (size_t i = 0; i < n; i++) {
		te_transfer *t = ts[i];
		void *remote = (void *)(uintptr_t)t->remote;
		if (c->xfer->canceled(c->host, t)) {
			c->xfer->complete(c->host, t, 0, -ECANCELED);
			continue;
		}
		if (t->opcode == TE_OP_READ)
			memcpy(t->local, remote, t->length);
		else
			memcpy(remote, t->local, t->length);
		c->xfer->complete(c->host, t, t->length, 0);
	}
	return 0;
}

static const te_transport_ops mc_ops = {
	.size = sizeof(te_transport_ops),
	.flags = TE_TRANSPORT_MEMORY,
	.create = mc_create,
	.destroy = mc_destroy,
	.describe = mc_describe,
	.segment_open = mc_segment_open,
	.segment_close = mc_segment_close,
	.submit = mc_submit,
};

TE_PLUGIN_DEFINE(TE_KIND_TRANSPORT, "memcpy", "1.0.0",
		 "example: memcpy between engines of one process", "Apache-2.0", &mc_ops)
