/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The plugin loader: from a directory holding good plugins and broken ones,
 * the good are loaded and each broken one is skipped with a reason naming the
 * fault. With an argument "deny-memcpy" the process runs under
 * TE_PLUGINS=^memcpy and checks the deny list instead.
 */
#include <stdlib.h>

#include "../common/util.h"
#include <te/te-plugin.h>

typedef struct seen {
	char name[64];
	char reason[512];
	int loaded;
	unsigned abi_major, abi_minor;
} seen;

static seen found[64];
static int n_found;

static void collect(const te_plugin_info *p, void *user)
{
	(void)user;
	CHECK(p->size >= sizeof(te_plugin_info));
	if (n_found >= 64)
		return;
	seen *s = &found[n_found++];
	const char *base = strrchr(p->path, '/');
	snprintf(s->name, sizeof s->name, "%s", base ? base + 1 : p->path);
	snprintf(s->reason, sizeof s->reason, "%s", p->reason ? p->reason : "");
	s->loaded = p->loaded;
	s->abi_major = p->abi_major;
	s->abi_minor = p->abi_minor;
}

static seen *by_file(const char *file)
{
	for (int i = 0; i < n_found; i++)
		if (strcmp(found[i].name, file) == 0)
			return &found[i];
	fprintf(stderr, "  plugin file %s was not reported\n", file);
	return NULL;
}

static void expect_skipped(const char *file, const char *why)
{
	seen *s = by_file(file);
	CHECK(s != NULL);
	if (s == NULL)
		return;
	CHECK(!s->loaded);
	if (strstr(s->reason, why) == NULL) {
		fprintf(stderr, "  %s: reason \"%s\" lacks \"%s\"\n", file, s->reason, why);
		CHECK(0);
	}
}

static void dir_cb(const char *dir, int exists, void *user)
{
	int *n = user;
	(*n)++;
	if (*n == 1)
		CHECK(strcmp(dir, getenv("TEST_PLUGIN_DIR")) == 0); /* TE_PLUGIN_PATH first */
	(void)exists;
}

/* A transport the loader skipped cannot be installed. */
static void not_installable(const char *name)
{
	te_engine *e = p2p_engine(NULL);
	REQUIRE(e != NULL);
	CHECK_EQ(te_transport_install(e, name, NULL), -ENOENT);
	te_engine_destroy(e);
}

/* TE_PLUGINS (set by meson.build for this run) let `on` load and disabled
 * `off`. */
static void only_listed(const char *off, const char *on)
{
	te_plugin_foreach(collect, NULL);
	expect_skipped(off, "disabled by TE_PLUGINS");
	seen *s = by_file(on);
	CHECK(s && s->loaded);
}

static void test_scan(void)
{
	cap_start();
	int usable = te_plugin_foreach(collect, NULL);
	CHECK(usable >= 2);
	seen *hold = by_file("libte-transport-hold.so");
	seen *mc = by_file("libte-transport-memcpy.so");
	CHECK(hold && hold->loaded && hold->abi_major == 1);
	CHECK(mc && mc->loaded);
	char want[96];
	snprintf(want, sizeof want, "plugin ABI %d.%d, host ABI %d.%d", TE_PLUGIN_ABI_MAJOR + 1, TE_PLUGIN_ABI_MINOR,
		 TE_PLUGIN_ABI_MAJOR, TE_PLUGIN_ABI_MINOR);
	expect_skipped("libte-transport-badmajor.so", want);
	snprintf(want, sizeof want, "plugin ABI %d.%d, host ABI %d.%d", TE_PLUGIN_ABI_MAJOR, TE_PLUGIN_ABI_MINOR + 1,
		 TE_PLUGIN_ABI_MAJOR, TE_PLUGIN_ABI_MINOR);
	expect_skipped("libte-transport-badminor.so", want);
	expect_skipped("libte-transport-badmagic.so", "bad magic 0xdeadbeef");
	expect_skipped("libte-transport-badops.so", "ops table too small");
	expect_skipped("libte-transport-noentry.so", "no te_plugin_entry symbol");
	expect_skipped("libte-transport-notelf.so", "dlopen failed");
	expect_skipped("libte-transport-zdup.so", "shadowed by");
	/* each skip was also logged once, naming the file */
	CHECK(cap_has("skipping plugin"));
	CHECK(cap_has("libte-transport-badmajor.so"));
	CHECK(!cap_has_quiet("libte-transport-zdup.so"));

	/* a second call reports the same without loading again */
	int before = n_found;
	n_found = 0;
	CHECK_EQ(te_plugin_foreach(collect, NULL), usable);
	CHECK_EQ(n_found, before);

	int dirs = 0;
	CHECK(te_plugin_dirs(dir_cb, &dirs) >= 2);
	CHECK(dirs >= 2);

	/* the shadowed duplicate does not replace the first "hold" */
	te_engine *e = p2p_engine("hold");
	CHECK(e != NULL);
	te_engine_destroy(e);
	/* skipped plugins cannot be installed */
	not_installable("badmajor");
}

static void test_deny(void)
{
	only_listed("libte-transport-memcpy.so", "libte-transport-hold.so");
	not_installable("memcpy");
}

static void test_allow(void)
{
	only_listed("libte-transport-hold.so", "libte-transport-memcpy.so");
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "deny-memcpy") == 0)
		TEST_RUN(test_deny);
	else if (argc > 1 && strcmp(argv[1], "allow-memcpy") == 0)
		TEST_RUN(test_allow);
	else
		TEST_RUN(test_scan);
	return check_done();
}
