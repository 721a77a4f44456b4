/* SPDX-License-Identifier: Apache-2.0 */
/* Exporter plugins the loader must refuse, one per build (-D): an ops table
 * smaller than create and destroy, a plugin built for an ABI before
 * exporters, an ops table without create. */
#include <errno.h>
#include <stddef.h>

#include <te/te-plugin.h>

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

__attribute__((visibility("default"))) const te_plugin_desc *te_plugin_entry(void);
const te_plugin_desc *te_plugin_entry(void)
{
	static const te_plugin_desc desc = {
		.magic = TE_PLUGIN_MAGIC,
		.abi_major = TE_PLUGIN_ABI_MAJOR,
#if defined(BAD_MINOR)
		.abi_minor = 5,
#else
		.abi_minor = TE_PLUGIN_ABI_MINOR,
#endif
		.size = sizeof(te_plugin_desc),
		.kind = TE_KIND_EXPORTER,
		.name = PLUGIN_NAME,
		.version = "0",
		.description = "an exporter the loader refuses",
		.license = "Apache-2.0",
		.ops = &ops,
	};
	return &desc;
}
