/* SPDX-License-Identifier: Apache-2.0 */
/* Plugins the loader must skip, one per BAD_* define. */
#include <te/te-plugin.h>

static int noop_create(const te_host *h, const char *a, void **c) { (void)h; (void)a; *c = 0; return 0; }
static void noop_destroy(void *c) { (void)c; }
static int noop_open(void *c, const te_segment_info *s, void **sc) { (void)c; (void)s; (void)sc; return -1; }
static int noop_submit(void *c, te_transfer *const *t, size_t n) { (void)c; (void)t; (void)n; return -1; }

static const te_transport_ops ops __attribute__((unused)) = {
	.size = sizeof(te_transport_ops),
	.create = noop_create,
	.destroy = noop_destroy,
	.segment_open = noop_open,
	.submit = noop_submit,
};

#if defined(BAD_MAJOR) || defined(BAD_MAGIC) || defined(BAD_MINOR)
__attribute__((visibility("default"))) const te_plugin_desc *te_plugin_entry(void);
const te_plugin_desc *te_plugin_entry(void)
{
	static const te_plugin_desc d = {
#ifdef BAD_MAGIC
		.magic = 0xdeadbeefu,
#else
		.magic = TE_PLUGIN_MAGIC,
#endif
#ifdef BAD_MAJOR
		.abi_major = TE_PLUGIN_ABI_MAJOR + 1,
#else
		.abi_major = TE_PLUGIN_ABI_MAJOR,
#endif
#ifdef BAD_MINOR
		.abi_minor = TE_PLUGIN_ABI_MINOR + 1,
#else
		.abi_minor = TE_PLUGIN_ABI_MINOR,
#endif
		.size = sizeof(te_plugin_desc),
		.kind = TE_KIND_TRANSPORT,
		.name = PLUGIN_NAME,
		.version = "0",
		.ops = &ops,
	};
	return &d;
}
#elif defined(BAD_OPS)
static const te_transport_ops thin = { .size = 8 };
TE_PLUGIN_DEFINE(TE_KIND_TRANSPORT, PLUGIN_NAME, "0", "ops table too small", "Apache-2.0", &thin)
#elif defined(BAD_NOENTRY)
int te_not_an_entry(void);
int te_not_an_entry(void) { return 0; }
#elif defined(GOOD_DUP)
/* A second "hold": must be shadowed by the first one found. */
TE_PLUGIN_DEFINE(TE_KIND_TRANSPORT, "hold", "9.9.9", "duplicate", "Apache-2.0", &ops)
#endif
