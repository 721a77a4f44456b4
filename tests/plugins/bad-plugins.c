/* SPDX-License-Identifier: Apache-2.0 */
/* Plugins the loader must skip, one per BAD_* define. */
#include <te/te-plugin.h>

#include "test-plugin.h"

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

#if defined(BAD_MAGIC)
TEST_PLUGIN_DEFINE_ABI(0xdeadbeefu, TE_PLUGIN_ABI_MAJOR, TE_PLUGIN_ABI_MINOR, TE_KIND_TRANSPORT, PLUGIN_NAME, "0",
		       "wrong magic", &ops)
#elif defined(BAD_MAJOR)
TEST_PLUGIN_DEFINE_ABI(TE_PLUGIN_MAGIC, TE_PLUGIN_ABI_MAJOR + 1, TE_PLUGIN_ABI_MINOR, TE_KIND_TRANSPORT, PLUGIN_NAME,
		       "0", "ABI major from the future", &ops)
#elif defined(BAD_MINOR)
TEST_PLUGIN_DEFINE_MINOR(TE_PLUGIN_ABI_MINOR + 1, TE_KIND_TRANSPORT, PLUGIN_NAME, "0", "ABI minor from the future",
			 &ops)
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
