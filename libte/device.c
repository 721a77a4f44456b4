/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device memory: the device plugins found by the loader, one instance each
 * per process (device runtimes are per process), created on first use. The
 * host asks them what an address is at registration (never per request),
 * and copies through them where a side of a copy is device memory.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

static GOnce devices_once = G_ONCE_INIT;
static GPtrArray *devices; /* te_device*, usable ones */
static GMutex alloc_lock;
static GHashTable *allocs; /* device pointer → te_device* that allocated it */

static gpointer devices_init(gpointer unused)
{
	(void)unused;
	GPtrArray *plugins = te_plugin_devices();

	devices = g_ptr_array_new();
	for (guint i = 0; i < plugins->len; i++) {
		const te_plugin *p = g_ptr_array_index(plugins, i);
		const te_device_ops *o = p->desc->ops;
		te_device *d = g_new0(te_device, 1);
		char why[256] = "";
		int rc;

		te_host_init(&d->hc, NULL, p);
		d->ops = o;
		rc = o->probe(&d->hc.host, why, sizeof why);
		if (rc == 0)
			rc = o->create(&d->hc.host, &d->ctx);
		if (rc != 0) {
			te_dbg("device plugin %s idle: %s", p->name, why[0] ? why : te_strerror(rc));
			g_free(d);
			continue;
		}
		te_dbg("device plugin %s serves '%s:N' memory", p->name, o->prefix);
		g_ptr_array_add(devices, d);
	}
	g_ptr_array_unref(plugins);
	allocs = g_hash_table_new(g_direct_hash, g_direct_equal);
	return NULL;
}

static GPtrArray *usable(void)
{
	te_plugins_init();
	g_once(&devices_once, devices_init, NULL);
	return devices;
}

bool te_devices_present(void)
{
	return usable()->len > 0;
}

int te_device_classify(const void *addr, size_t len, te_device **dev, int *index)
{
	GPtrArray *all = usable();

	for (guint i = 0; i < all->len; i++) {
		te_device *d = g_ptr_array_index(all, i);
		int idx = -1;
		int rc = d->ops->classify(d->ctx, addr, len, &idx);
		if (rc < 0) {
			te_warn("device plugin %s cannot classify %p+%zu: %s", d->hc.plugin->name, addr,
				len, te_strerror(rc));
			continue;
		}
		if (rc > 0) {
			*dev = d;
			*index = idx;
			return 1;
		}
	}
	*dev = NULL;
	*index = -1;
	return 0;
}

int te_device_copy_with(te_device *d, void *dst, const void *src, size_t len)
{
	int rc = d->ops->copy(d->ctx, dst, src, len);

	if (rc < 0)
		te_log(TE_LOG_ERROR, d->hc.plugin->name, "copy of %zu bytes %p -> %p failed: %s", len,
		       src, dst, te_strerror(rc));
	return rc;
}

/* n copies through one plugin: its batch op (queued together, waited for
 * once) where it has one, else one copy after the other. */
int te_device_copy_batch_with(te_device *d, const te_copy *v, size_t n, unsigned flags)
{
	if (n == 0)
		return 0;
	if (n == 1 || !TE_HAS_OP(d->ops, copy_batch)) {
		for (size_t i = 0; i < n; i++) {
			int rc = te_device_copy_with(d, v[i].dst, v[i].src, v[i].len);
			if (rc < 0)
				return rc;
		}
		return 0;
	}
	int rc = d->ops->copy_batch(d->ctx, v, n, flags);
	if (rc < 0)
		te_log(TE_LOG_ERROR, d->hc.plugin->name, "batch of %zu copies (%p -> %p first) failed: %s",
		       n, v[0].src, v[0].dst, te_strerror(rc));
	return rc;
}

/* The plugin of "prefix:N" (or of "prefix" alone when index is NULL). */
static te_device *by_prefix(const char *location, int *index)
{
	const char *colon = location ? strchr(location, ':') : NULL;
	uint64_t n = 0;
	GPtrArray *all = usable();

	if (location == NULL)
		return NULL;
	if (colon == NULL && index == NULL)
		colon = location + strlen(location);
	else if (colon == NULL || !te_parse_u64(colon + 1, &n) || n > INT32_MAX)
		return NULL;
	for (guint i = 0; i < all->len; i++) {
		te_device *d = g_ptr_array_index(all, i);
		if (strlen(d->ops->prefix) == (size_t)(colon - location) &&
		    strncmp(d->ops->prefix, location, (size_t)(colon - location)) == 0) {
			if (index != NULL)
				*index = (int)n;
			return d;
		}
	}
	return NULL;
}

/* ------------------------------------------- sharing with other processes */

static bool has_ipc(const te_device *d)
{
	return TE_HAS_OP(d->ops, ipc_export) && TE_HAS_OP(d->ops, ipc_open) &&
	       TE_HAS_OP(d->ops, ipc_close);
}

int te_device_ipc_export(const void *addr, size_t len, te_device_ipc *ipc, char *location,
			 size_t location_len)
{
	te_device *d;
	int index;

	if (te_device_classify(addr, len, &d, &index) <= 0)
		return -ENOENT;
	if (!has_ipc(d))
		return -ENOTSUP;
	if ((size_t)snprintf(location, location_len, "%s:%d", d->ops->prefix, index) >= location_len)
		return -ENOSPC;
	memset(ipc, 0, sizeof *ipc);
	ipc->size = sizeof *ipc;
	ipc->fd = -1;
	int rc = d->ops->ipc_export(d->ctx, addr, len, ipc);
	if (rc == 0 && ipc->handle_len > sizeof ipc->handle) {
		if (ipc->fd >= 0)
			close(ipc->fd);
		rc = -EPROTO;
	}
	if (rc < 0)
		te_log(TE_LOG_INFO, d->hc.plugin->name, "cannot share %p+%zu with other processes: %s",
		       addr, len, te_strerror(rc));
	return rc;
}

int te_device_ipc_open(const char *location, const te_device_ipc *ipc, void **base)
{
	int index;
	te_device *d = by_prefix(location, &index);

	if (d == NULL)
		return -ENODEV;
	if (!has_ipc(d))
		return -ENOTSUP;
	if (ipc->size < sizeof *ipc || ipc->handle_len > sizeof ipc->handle)
		return -EINVAL;
	int rc = d->ops->ipc_open(d->ctx, ipc, base);
	if (rc < 0)
		te_log(TE_LOG_INFO, d->hc.plugin->name,
		       "cannot open another process's %s allocation of %llu bytes: %s", location,
		       (unsigned long long)ipc->alloc_size, te_strerror(rc));
	return rc;
}

void te_device_ipc_close(const char *location, void *base)
{
	int index;
	te_device *d = by_prefix(location, &index);

	if (d != NULL && has_ipc(d))
		d->ops->ipc_close(d->ctx, base);
}

int te_device_copy_at(const char *location, void *dst, const void *src, size_t len)
{
	int index;
	te_device *d = by_prefix(location, &index);

	if (d == NULL)
		return -ENODEV;
	return te_device_copy_with(d, dst, src, len);
}

int te_device_copy_batch_at(const char *location, const te_copy *v, size_t n, unsigned flags)
{
	int index;
	te_device *d = by_prefix(location, &index);

	if (d == NULL)
		return -ENODEV;
	return te_device_copy_batch_with(d, v, n, flags);
}

/* Host buffers that device memory is copied through: page-locked by the
 * first plugin that offers it (a GPU's copy engine reaches only such memory
 * at full speed), else plain. The table says who frees each one. */
static GHashTable *host_bufs; /* pointer → te_device* (under alloc_lock) */

int te_device_host_alloc(size_t len, void **ptr)
{
	GPtrArray *all = usable();

	if (len == 0 || ptr == NULL)
		return -EINVAL;
	for (guint i = 0; i < all->len; i++) {
		te_device *d = g_ptr_array_index(all, i);
		void *p = NULL;
		if (!TE_HAS_OP(d->ops, host_alloc) || !TE_HAS_OP(d->ops, host_free) ||
		    d->ops->host_alloc(d->ctx, len, &p) != 0 || p == NULL)
			continue;
		g_mutex_lock(&alloc_lock);
		if (host_bufs == NULL)
			host_bufs = g_hash_table_new(g_direct_hash, g_direct_equal);
		g_hash_table_insert(host_bufs, p, d);
		g_mutex_unlock(&alloc_lock);
		*ptr = p;
		return 0;
	}
	void *p = NULL;
	if (posix_memalign(&p, 4096, len) != 0)
		return -ENOMEM;
	*ptr = p;
	return 0;
}

void te_device_host_free(void *ptr)
{
	te_device *d = NULL;

	if (ptr == NULL)
		return;
	g_mutex_lock(&alloc_lock);
	if (host_bufs != NULL) {
		d = g_hash_table_lookup(host_bufs, ptr);
		if (d != NULL)
			g_hash_table_remove(host_bufs, ptr);
	}
	g_mutex_unlock(&alloc_lock);
	if (d != NULL)
		d->ops->host_free(d->ctx, ptr);
	else
		free(ptr);
}

/* ------------------------------------------------------- public functions */

int te_device_alloc(const char *location, size_t len, void **ptr)
{
	int index;
	te_device *d;
	int rc;

	if (location == NULL || ptr == NULL || len == 0) {
		te_err("te_device_alloc: %s", location == NULL ? "NULL location"
					     : ptr == NULL ? "NULL result pointer"
							   : "zero length");
		return -EINVAL;
	}
	*ptr = NULL;
	d = by_prefix(location, &index);
	if (d == NULL) {
		te_err("te_device_alloc: no usable device plugin serves '%s' (te-info lists them)",
		       location);
		return -ENODEV;
	}
	if (!TE_HAS_OP(d->ops, mem_alloc) || !TE_HAS_OP(d->ops, mem_free)) {
		te_err("te_device_alloc: device plugin %s cannot allocate", d->hc.plugin->name);
		return -ENOTSUP;
	}
	rc = d->ops->mem_alloc(d->ctx, index, len, ptr);
	if (rc < 0) {
		te_err("te_device_alloc: %zu bytes on %s: %s", len, location, te_strerror(rc));
		return rc;
	}
	g_mutex_lock(&alloc_lock);
	g_hash_table_insert(allocs, *ptr, d);
	g_mutex_unlock(&alloc_lock);
	return 0;
}

int te_device_free(void *ptr)
{
	te_device *d;

	if (ptr == NULL)
		return 0;
	usable();
	g_mutex_lock(&alloc_lock);
	d = g_hash_table_lookup(allocs, ptr);
	if (d != NULL)
		g_hash_table_remove(allocs, ptr);
	g_mutex_unlock(&alloc_lock);
	if (d == NULL) {
		te_err("te_device_free: %p was not allocated by te_device_alloc", ptr);
		return -EINVAL;
	}
	d->ops->mem_free(d->ctx, ptr);
	return 0;
}

int te_device_copy(void *dst, const void *src, size_t len)
{
	te_device *d = NULL;
	int index;

	if (len == 0)
		return 0;
	if (dst == NULL || src == NULL) {
		te_err("te_device_copy: NULL %s", dst == NULL ? "destination" : "source");
		return -EINVAL;
	}
	if (te_device_classify(dst, len, &d, &index) == 0)
		te_device_classify(src, len, &d, &index);
	if (d == NULL) {
		memmove(dst, src, len);
		return 0;
	}
	return te_device_copy_with(d, dst, src, len);
}

int te_device_for_stream(const char *location, const char *what, te_device **out, int *index)
{
	bool numbered = location != NULL && strchr(location, ':') != NULL;
	te_device *d = by_prefix(location, numbered ? index : NULL);

	if (!numbered)
		*index = -1;
	*out = d;
	if (d == NULL) {
		te_err("%s: no usable device plugin serves '%s'", what, location ? location : "(null)");
		return location ? -ENODEV : -EINVAL;
	}
	return 0;
}

int te_device_stream_wait(const char *location, void *stream)
{
	te_device *d;
	int index;
	int rc = te_device_for_stream(location, "te_device_stream_wait", &d, &index);

	if (rc < 0)
		return rc;
	if (TE_HAS_OP(d->ops, stream_wait_on)) {
		rc = d->ops->stream_wait_on(d->ctx, index, stream);
	} else if (!TE_HAS_OP(d->ops, stream_wait)) {
		te_err("te_device_stream_wait: device plugin %s has no streams", d->hc.plugin->name);
		return -ENOTSUP;
	} else if (index >= 0) {
		/* A plugin of ABI 1.9 knows no device of a stream: it would wait
		 * on whichever device it makes current. */
		te_err("te_device_stream_wait: device plugin %s cannot tell a stream's device; give '%s' "
		       "without ':%d'", d->hc.plugin->name, d->ops->prefix, index);
		return -ENOTSUP;
	} else {
		rc = d->ops->stream_wait(d->ctx, stream);
	}
	if (rc < 0)
		te_log(TE_LOG_ERROR, d->hc.plugin->name, "waiting for stream %p of %s failed: %s", stream,
		       location, te_strerror(rc));
	return rc;
}

int te_device_locate(const void *addr, size_t len, char *buf, size_t size)
{
	te_device *d;
	int index;

	if (addr == NULL || buf == NULL || size == 0) {
		te_err("te_device_locate: NULL %s", addr == NULL ? "address" : "buffer");
		return -EINVAL;
	}
	if (te_device_classify(addr, len ? len : 1, &d, &index) == 0)
		return -ENOENT;
	if ((size_t)snprintf(buf, size, "%s:%d", d->ops->prefix, index) >= size)
		return -ENOSPC;
	return 0;
}

int te_devices_list(te_device_info *out, size_t max, size_t *n)
{
	GPtrArray *all = usable();
	size_t total = 0;

	for (guint i = 0; i < all->len; i++) {
		te_device *d = g_ptr_array_index(all, i);
		size_t got = 0;
		te_device_info *slot = total < max ? out + total : NULL;
		int rc = d->ops->devices(d->ctx, slot, slot ? max - total : 0, &got);
		if (rc < 0)
			continue;
		total += got;
	}
	*n = total;
	return 0;
}

int te_device_report(const te_plugin *p, char **text)
{
	const te_device_ops *o = p->desc->ops;
	GPtrArray *all = usable();
	GString *s;

	for (guint i = 0; i < all->len; i++) {
		te_device *d = g_ptr_array_index(all, i);
		te_device_info info[16];
		size_t n = 0;

		if (d->hc.plugin != p)
			continue;
		for (size_t k = 0; k < G_N_ELEMENTS(info); k++)
			info[k] = (te_device_info){ .size = sizeof info[k], .numa_node = -1 };
		int rc = o->devices(d->ctx, info, G_N_ELEMENTS(info), &n);
		if (rc < 0) {
			*text = g_strdup_printf("cannot list devices: %s", te_strerror(rc));
			return 0;
		}
		s = g_string_new(NULL);
		g_string_append_printf(s, "%zu device(s), memory of locations '%s:N'\n", n, o->prefix);
		for (size_t k = 0; k < n && k < G_N_ELEMENTS(info); k++)
			g_string_append_printf(s, "%s: %s, %.1f GiB, PCI %s, NUMA node %d\n",
					       info[k].location, info[k].name,
					       (double)info[k].memory / (1u << 30),
					       info[k].pci_bus_id[0] ? info[k].pci_bus_id : "?",
					       info[k].numa_node);
		*text = g_string_free(s, FALSE);
		return 0;
	}
	te_host_ctx hc;
	char why[256] = "";
	te_host_init(&hc, NULL, p);
	int rc = o->probe(&hc.host, why, sizeof why);
	*text = g_strdup_printf("idle: %s", rc == 0 ? "could not start" : why);
	return 0;
}
