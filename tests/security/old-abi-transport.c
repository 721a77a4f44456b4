/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A transport that says it was built for plugin ABI 1.1, before peer
 * authentication: an engine with a cluster key must refuse to install it,
 * an engine without one installs it as before. It serves nothing.
 */
#include <te/te-plugin.h>

#include "../plugins/test-plugin.h"

static int oa_create(const te_host *h, const char *args, void **ctx)
{
	(void)h;
	(void)args;
	*ctx = (void *)1;
	return 0;
}

static void oa_destroy(void *ctx)
{
	(void)ctx;
}

static int oa_open(void *ctx, const te_segment_info *seg, void **seg_ctx)
{
	(void)ctx;
	(void)seg;
	(void)seg_ctx;
	return -ENOTSUP;
}

static int oa_submit(void *ctx, te_transfer *const *t, size_t n)
{
	(void)ctx;
	(void)t;
	(void)n;
	return -ENOTSUP;
}

static const te_transport_ops ops = {
	.size = offsetof(te_transport_ops, progress), /* as a 1.1 plugin was built */
	.flags = TE_TRANSPORT_MEMORY,
	.create = oa_create,
	.destroy = oa_destroy,
	.segment_open = oa_open,
	.submit = oa_submit,
};

TEST_PLUGIN_DEFINE_MINOR(1, TE_KIND_TRANSPORT, "oldabi", "1.0", "test: a transport from before peer authentication",
			 &ops)
