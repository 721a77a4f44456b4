/* SPDX-License-Identifier: Apache-2.0 */
/* Exporter plugins the loader must refuse, one per build (-D): an ops table
 * smaller than create and destroy, a plugin built for an ABI before
 * exporters, an ops table without create. */
#include <errno.h>
#include <stddef.h>

#include <te/te-plugin.h>

#include "../plugins/test-plugin.h"

#if !defined(BAD_NOCREATE)
static int x_create(const te_host *h, const char *addr, const char *json_args, void **ctx)
{
	(void)h;
	(void)addr;
	(void)json_args;
	(void)ctx;
	return -ENOTSUP;
}
#endif

static void x_destroy(void *ctx)
{
	(void)ctx;
}

static const te_exporter_ops ops = {
#if defined(BAD_SIZE)
	.size = offsetof(te_exporter_ops, destroy),
#else
	.size = sizeof(te_exporter_ops),
#endif
#if !defined(BAD_NOCREATE)
	.create = x_create,
#endif
	.destroy = x_destroy,
};

#if defined(BAD_MINOR)
TEST_PLUGIN_DEFINE_MINOR(5, TE_KIND_EXPORTER, PLUGIN_NAME, "0", "an exporter the loader refuses", &ops)
#else
TE_PLUGIN_DEFINE(TE_KIND_EXPORTER, PLUGIN_NAME, "0", "an exporter the loader refuses", "Apache-2.0", &ops)
#endif
