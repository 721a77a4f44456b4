/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The plugin loader. Scans, once per process, the plugin directories in order:
 *   1. TE_PLUGIN_PATH (colon list; ignored in setuid processes),
 *   2. the build tree's plugin folders, only when this libte is the build
 *      tree's own copy (so uninstalled tools and tests find their plugins),
 *   3. "te-<major>" next to the loaded libte (relocated installs),
 *   4. the compiled-in ${libdir}/te-<major>.
 * Files named libte-<kind>-<name>.so are opened with RTLD_NOW|RTLD_LOCAL and
 * checked; one that fails is recorded with the reason and closed, never fatal.
 * The first plugin of a (kind, name) wins. TE_PLUGINS=a,b,^c allows or denies
 * names. Plugins stay loaded until the process exits: their function
 * pointers live in engines' tables.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"
#include "te-build-config.h"

static GOnce scan_once = G_ONCE_INIT;
static GPtrArray *plugins; /* te_plugin*, in discovery order */
static GPtrArray *dirs;    /* char*, searched directories */

static bool valid_name(const char *n)
{
	size_t len = 0;

	if (n == NULL)
		return false;
	for (; n[len] != '\0'; len++) {
		char c = n[len];
		if (!(g_ascii_islower(c) || g_ascii_isdigit(c) || c == '_' || c == '-'))
			return false;
		if (len >= 31)
			return false;
	}
	return len > 0;
}

/* TE_PLUGINS: "tcp,rdma" allows only those, "^nvmeof" denies one. */
static bool allowed(const char *name)
{
	const char *spec = te_secure_getenv("TE_PLUGINS");
	bool any_allow = false, listed = false;

	if (spec == NULL || *spec == '\0')
		return true;
	gchar **items = g_strsplit(spec, ",", -1);
	for (gchar **it = items; *it != NULL; it++) {
		const char *s = g_strstrip(*it);
		if (*s == '\0')
			continue;
		if (*s == '^') {
			if (strcmp(s + 1, name) == 0) {
				g_strfreev(items);
				return false;
			}
		} else {
			any_allow = true;
			if (strcmp(s, name) == 0)
				listed = true;
		}
	}
	g_strfreev(items);
	return !any_allow || listed;
}

/* Each kind's smallest ops table (up to its last required member) and the
 * ABI minor the kind came with. Every ops table starts with its size. */
#define OPS_END(type, member) (offsetof(type, member) + sizeof(((type *)0)->member))
static const struct {
	uint32_t kind;
	size_t min_size;
	unsigned min_minor;
} ops_floor[] = {
	{ TE_KIND_TRANSPORT, offsetof(te_transport_ops, report), 0 },
	{ TE_KIND_METADATA, offsetof(te_metadata_ops, list), 0 },
	{ TE_KIND_DEVICE, OPS_END(te_device_ops, devices), 2 },
	{ TE_KIND_EXPORTER, OPS_END(te_exporter_ops, destroy), 6 },
};

/* The required members `d`'s ops lack, as a phrase; NULL when none. */
static const char *ops_lack(const te_plugin_desc *d)
{
	switch (d->kind) {
	case TE_KIND_TRANSPORT: {
		const te_transport_ops *o = d->ops;
		return o->create && o->destroy && o->segment_open && o->submit
			       ? NULL
			       : "create, destroy, segment_open or submit";
	}
	case TE_KIND_DEVICE: {
		const te_device_ops *o = d->ops;
		return o->prefix && valid_name(o->prefix) && o->probe && o->create && o->destroy &&
				       o->classify && o->copy && o->devices
			       ? NULL
			       : "prefix, probe, create, destroy, classify, copy or devices";
	}
	case TE_KIND_EXPORTER: {
		const te_exporter_ops *o = d->ops;
		return o->create && o->destroy ? NULL : "create or destroy";
	}
	default: {
		const te_metadata_ops *o = d->ops;
		return o->schemes && o->schemes[0] && o->open && o->close && o->get && o->put && o->remove
			       ? NULL
			       : "schemes, open, close, get, put or remove";
	}
	}
}

static bool check_ops(const te_plugin_desc *d, char **why)
{
	uint32_t size;
	const char *kind = te_plugin_kind_name((int)d->kind);

	memcpy(&size, d->ops, sizeof size); /* the first member of every kind's table */
	for (size_t i = 0; i < G_N_ELEMENTS(ops_floor); i++) {
		if (ops_floor[i].kind == d->kind &&
		    (size < ops_floor[i].min_size || d->abi_minor < ops_floor[i].min_minor)) {
			*why = g_strdup_printf("%s ops table too small (%u bytes, ABI minor %u)", kind, size,
					       d->abi_minor);
			return false;
		}
	}
	const char *lack = ops_lack(d);
	if (lack != NULL) {
		*why = g_strdup_printf("%s ops lack %s", kind, lack);
		return false;
	}
	return true;
}

static te_plugin *find_loaded(int kind, const char *name)
{
	for (guint i = 0; i < plugins->len; i++) {
		te_plugin *p = g_ptr_array_index(plugins, i);
		if (p->loaded && p->kind == kind && strcmp(p->name, name) == 0)
			return p;
	}
	return NULL;
}

static void load_file(const char *path)
{
	te_plugin *p = g_new0(te_plugin, 1);
	te_plugin_entry_fn entry;
	const te_plugin_desc *d;

	p->path = g_strdup(path);
	g_ptr_array_add(plugins, p);

	p->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (p->handle == NULL) {
		p->reason = g_strdup_printf("dlopen failed: %s", dlerror());
		goto fail;
	}
	*(void **)&entry = dlsym(p->handle, TE_PLUGIN_ENTRY_SYMBOL);
	if (entry == NULL) {
		p->reason = g_strdup("no te_plugin_entry symbol");
		goto fail;
	}
	d = entry();
	if (d == NULL) {
		p->reason = g_strdup("te_plugin_entry returned NULL");
		goto fail;
	}
	if (d->magic != TE_PLUGIN_MAGIC) {
		p->reason = g_strdup_printf("bad magic 0x%08x (expected 0x%08x)", d->magic, TE_PLUGIN_MAGIC);
		goto fail;
	}
	p->abi_major = d->abi_major;
	p->abi_minor = d->abi_minor;
	if (d->abi_major != TE_PLUGIN_ABI_MAJOR || d->abi_minor > TE_PLUGIN_ABI_MINOR) {
		p->reason = g_strdup_printf("plugin ABI %u.%u, host ABI %u.%u (need major %u, minor <= %u)",
					    d->abi_major, d->abi_minor, TE_PLUGIN_ABI_MAJOR,
					    TE_PLUGIN_ABI_MINOR, TE_PLUGIN_ABI_MAJOR, TE_PLUGIN_ABI_MINOR);
		goto fail;
	}
	if (d->size < offsetof(te_plugin_desc, reserved)) {
		p->reason = g_strdup_printf("descriptor too small (%u bytes)", d->size);
		goto fail;
	}
	if (d->kind != TE_KIND_TRANSPORT && d->kind != TE_KIND_METADATA &&
	    d->kind != TE_KIND_DEVICE && d->kind != TE_KIND_EXPORTER) {
		p->reason = g_strdup_printf("unknown plugin kind %u", d->kind);
		goto fail;
	}
	p->kind = (int)d->kind;
	if (!valid_name(d->name)) {
		p->reason = g_strdup("invalid plugin name (want [a-z0-9_-]{1,31})");
		goto fail;
	}
	p->name = g_strdup(d->name);
	if (d->ops == NULL) {
		p->reason = g_strdup("no ops table");
		goto fail;
	}
	if (!check_ops(d, &p->reason))
		goto fail;
	if (!allowed(p->name)) {
		p->reason = g_strdup("disabled by TE_PLUGINS");
		goto fail;
	}
	te_plugin *first = find_loaded(p->kind, p->name);
	if (first != NULL) {
		p->reason = g_strdup_printf("shadowed by %s", first->path);
		goto fail_quiet;
	}
	p->desc = d;
	p->loaded = true;
	te_dbg("loaded %s plugin %s %s from %s", te_plugin_kind_name(p->kind), p->name,
	       d->version ? d->version : "?", path);
	return;
fail:
	te_warn("skipping plugin %s: %s", path, p->reason);
fail_quiet:
	if (p->handle != NULL)
		dlclose(p->handle);
	p->handle = NULL;
}

static int cmp_str(gconstpointer a, gconstpointer b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void scan_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *ent;
	GPtrArray *files;

	if (d == NULL)
		return;
	files = g_ptr_array_new_with_free_func(g_free);
	while ((ent = readdir(d)) != NULL) {
		if (g_str_has_prefix(ent->d_name, "libte-") && g_str_has_suffix(ent->d_name, ".so"))
			g_ptr_array_add(files, g_build_filename(dir, ent->d_name, NULL));
	}
	closedir(d);
	g_ptr_array_sort(files, cmp_str); /* deterministic order within a directory */
	for (guint i = 0; i < files->len; i++)
		load_file(g_ptr_array_index(files, i));
	g_ptr_array_unref(files);
}

static void add_dir(const char *dir)
{
	char real[PATH_MAX];
	const char *key = realpath(dir, real) ? real : dir;

	for (guint i = 0; i < dirs->len; i++) {
		const char *d = g_ptr_array_index(dirs, i);
		char r2[PATH_MAX];
		if (strcmp(d, dir) == 0 || (realpath(d, r2) && strcmp(r2, key) == 0))
			return;
	}
	g_ptr_array_add(dirs, g_strdup(dir));
}

/* The directory holding this libte, via dladdr on one of its functions. */
static char *libte_dir(char **libpath)
{
	Dl_info info;

	*libpath = NULL;
	if (dladdr((void *)te_version, &info) == 0 || info.dli_fname == NULL)
		return NULL;
	char real[PATH_MAX];
	if (realpath(info.dli_fname, real) == NULL)
		return NULL;
	*libpath = g_strdup(real);
	return g_path_get_dirname(real);
}

static gpointer scan(gpointer unused)
{
	(void)unused;
	const char *env = te_secure_getenv("TE_PLUGIN_PATH");
	char *libpath = NULL;
	char *here = libte_dir(&libpath);

	plugins = g_ptr_array_new();
	dirs = g_ptr_array_new();
	if (env != NULL) {
		gchar **parts = g_strsplit(env, ":", -1);
		for (gchar **it = parts; *it != NULL; it++)
			if (**it != '\0')
				add_dir(*it);
		g_strfreev(parts);
	}
	/* Running from the build tree: the plugins are in their build folders. */
	if (libpath != NULL && strcmp(libpath, TE_BUILD_LIBRARY) == 0) {
		gchar **parts = g_strsplit(TE_BUILD_PLUGIN_DIRS, ":", -1);
		for (gchar **it = parts; *it != NULL; it++)
			if (**it != '\0')
				add_dir(*it);
		g_strfreev(parts);
	}
	if (here != NULL) {
		char *d = g_build_filename(here, "te-" G_STRINGIFY(TE_ABI_MAJOR), NULL);
		add_dir(d);
		g_free(d);
	}
	add_dir(TE_PLUGINDIR);
	g_free(here);
	g_free(libpath);

	for (guint i = 0; i < dirs->len; i++)
		scan_dir(g_ptr_array_index(dirs, i));
	return NULL;
}

void te_plugins_init(void)
{
	g_once(&scan_once, scan, NULL);
}

const te_plugin *te_plugin_find(int kind, const char *name)
{
	te_plugins_init();
	return name ? find_loaded(kind, name) : NULL;
}

const te_plugin *te_plugin_find_scheme(const char *scheme)
{
	te_plugins_init();
	for (guint i = 0; i < plugins->len; i++) {
		te_plugin *p = g_ptr_array_index(plugins, i);
		if (!p->loaded || p->kind != TE_KIND_METADATA)
			continue;
		const te_metadata_ops *o = p->desc->ops;
		for (const char *const *s = o->schemes; *s != NULL; s++)
			if (g_ascii_strcasecmp(*s, scheme) == 0)
				return p;
	}
	return NULL;
}

static GPtrArray *loaded_of(int kind)
{
	GPtrArray *out = g_ptr_array_new();

	te_plugins_init();
	for (guint i = 0; i < plugins->len; i++) {
		te_plugin *p = g_ptr_array_index(plugins, i);
		if (p->loaded && p->kind == kind)
			g_ptr_array_add(out, p);
	}
	return out;
}

GPtrArray *te_plugin_transports(void)
{
	return loaded_of(TE_KIND_TRANSPORT);
}

GPtrArray *te_plugin_devices(void)
{
	return loaded_of(TE_KIND_DEVICE);
}

int te_plugin_foreach(te_plugin_info_fn fn, void *user)
{
	int usable = 0;

	te_plugins_init();
	for (guint i = 0; i < plugins->len; i++) {
		te_plugin *p = g_ptr_array_index(plugins, i);
		te_plugin_info info = {
			.size = sizeof info,
			.path = p->path,
			.name = p->name,
			.version = p->desc ? p->desc->version : NULL,
			.description = p->desc ? p->desc->description : NULL,
			.kind = p->kind,
			.abi_major = p->abi_major,
			.abi_minor = p->abi_minor,
			.loaded = p->loaded,
			.reason = p->reason,
		};
		if (p->loaded)
			usable++;
		if (fn != NULL)
			fn(&info, user);
	}
	return usable;
}

int te_plugin_dirs(te_plugin_dir_fn fn, void *user)
{
	te_plugins_init();
	if (fn == NULL) {
		te_warn("te_plugin_dirs: NULL callback");
		return -EINVAL;
	}
	for (guint i = 0; i < dirs->len; i++) {
		const char *d = g_ptr_array_index(dirs, i);
		struct stat st;
		fn(d, stat(d, &st) == 0 && S_ISDIR(st.st_mode), user);
	}
	return (int)dirs->len;
}

int te_plugin_report(const char *name, char **text)
{
	const te_plugin *p;
	const te_transport_ops *o;
	te_host_ctx hc;

	if (name == NULL || text == NULL) {
		te_warn("te_plugin_report: NULL %s", name == NULL ? "name" : "text");
		return -EINVAL;
	}
	*text = NULL;
	p = te_plugin_find(TE_KIND_TRANSPORT, name);
	if (p == NULL && (p = te_plugin_find(TE_KIND_DEVICE, name)) != NULL)
		return te_device_report(p, text);
	if (p == NULL) {
		te_warn("te_plugin_report: no transport or device plugin named '%s'", name);
		return -ENOENT;
	}
	o = p->desc->ops;
	te_host_init(&hc, NULL, p);
	if (TE_HAS_OP(o, report))
		return o->report(&hc.host, text);
	if (TE_HAS_OP(o, probe)) {
		char why[256] = "";
		int rc = o->probe(&hc.host, why, sizeof why);
		*text = strdup(rc == 0 ? "usable on this machine" : why);
		return *text ? 0 : -ENOMEM;
	}
	*text = strdup("no report");
	return *text ? 0 : -ENOMEM;
}

/* ------------------------------------------------- transport facts */

uint32_t te_transport_priority(const te_plugin *p)
{
	const te_transport_ops *o = p->desc->ops;

	if (TE_OPS_COVERS(o, priority))
		return o->priority;
	/* Built before the plugins said it: the order hosts chose by name. */
	if (strcmp(p->name, "rdma") == 0)
		return TE_TRANSPORT_PRIORITY_RDMA;
	if (strcmp(p->name, "tcp") == 0)
		return TE_TRANSPORT_PRIORITY_TCP;
	return TE_TRANSPORT_PRIORITY_OTHER;
}

bool te_transport_files_only(const char *protocol)
{
	const te_plugin *p = te_plugin_find(TE_KIND_TRANSPORT, protocol);
	unsigned f = p != NULL ? ((const te_transport_ops *)p->desc->ops)->flags : 0;

	return (f & TE_TRANSPORT_FILES) && !(f & TE_TRANSPORT_MEMORY);
}
