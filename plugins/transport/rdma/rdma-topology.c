/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Topology: where each HCA sits (PCI path, NUMA node, read from sysfs below a
 * root that tests point at fixture trees) and the NIC priority matrix built
 * from it, parsed from a user's JSON, or parsed from a peer's descriptor.
 *
 * The matrix maps a memory location to two NIC lists, preferred and usable:
 *   cpu:N   NICs on NUMA node N first, the others second;
 *   cuda:N  the NICs nearest the GPU on the PCI tree first (the ones sharing
 *           its PCIe switch or root port), the others second.
 * Devices are kept sorted by name, the canonical order both ends index rkeys
 * and lkeys by.
 */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdma.h"

void rd_locs_free(rd_loc *locs, int n)
{
	for (int i = 0; i < n; i++)
		g_free(locs[i].name);
	g_free(locs);
}

void rd_topo_clear(rd_topo *t)
{
	for (int i = 0; i < t->nhca; i++)
		g_free(t->hcas[i].pci_path);
	g_free(t->hcas);
	rd_locs_free(t->locs, t->nloc);
	memset(t, 0, sizeof *t);
}

const rd_loc *rd_loc_find(const rd_loc *locs, int n, const char *name)
{
	if (name == NULL)
		return NULL;
	for (int i = 0; i < n; i++)
		if (strcmp(locs[i].name, name) == 0)
			return &locs[i];
	return NULL;
}

bool rd_read_line(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "re");
	bool ok;

	if (f == NULL)
		return false;
	ok = fgets(buf, (int)size, f) != NULL;
	fclose(f);
	if (ok)
		buf[strcspn(buf, "\r\n")] = '\0';
	return ok;
}

static int read_int(const char *path, int def)
{
	char buf[64], *end;
	long v;

	if (!rd_read_line(path, buf, sizeof buf))
		return def;
	v = strtol(buf, &end, 0);
	if (end == buf || v < INT32_MIN || v > INT32_MAX)
		return def;
	return (int)v;
}

/* Whether a sysfs folder name is a PCI function, "0000:04:00.0". */
static bool pci_name(const char *s)
{
	unsigned dom, bus, dev, fn;
	int end = 0;
	return sscanf(s, "%x:%x:%x.%x%n", &dom, &bus, &dev, &fn, &end) == 4 && s[end] == '\0';
}

/* A software device (rdma_rxe, siw) has no PCI function of its own: it
 * sends through a network device, whose PCI function (if any) is where its
 * traffic leaves. Writes that function's sysfs path to `real`. */
static bool netdev_pci(const char *root, const char *name, char *real)
{
	char path[PATH_MAX], ndev[64];

	for (int i = 0; i < 16; i++) {
		snprintf(path, sizeof path, "%s/sys/class/infiniband/%s/ports/1/gid_attrs/ndevs/%d", root, name,
			 i);
		if (!rd_read_line(path, ndev, sizeof ndev) || strchr(ndev, '/') != NULL)
			continue;
		snprintf(path, sizeof path, "%s/sys/class/net/%s/device", root, ndev);
		if (realpath(path, real) != NULL && pci_name(strrchr(real, '/') ? strrchr(real, '/') + 1 : real))
			return true;
	}
	return false;
}

/* The PCI function an IB device hangs off, found through its sysfs link. */
static void hca_locate(const char *root, rd_hca *h)
{
	char path[PATH_MAX], real[PATH_MAX];

	h->numa = -1;
	snprintf(path, sizeof path, "%s/sys/class/infiniband/%s/device", root, h->name);
	if (realpath(path, real) == NULL) {
		snprintf(path, sizeof path, "%s/sys/class/infiniband/%s/../..", root, h->name);
		if (realpath(path, real) == NULL)
			return;
	}
	/* Virtual devices resolve to /sys/devices/virtual: not a place. */
	const char *last = strrchr(real, '/');
	if (!pci_name(last ? last + 1 : real) && !netdev_pci(root, h->name, real))
		return;
	h->pci_path = g_strdup(real);
	char *base = strrchr(real, '/');
	g_strlcpy(h->pci, base ? base + 1 : real, sizeof h->pci);
	char *nn = g_strdup_printf("%s/numa_node", real);
	h->numa = read_int(nn, -1);
	g_free(nn);
}

static int cmp_hca(const void *a, const void *b)
{
	return strcmp(((const rd_hca *)a)->name, ((const rd_hca *)b)->name);
}

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return x < y ? -1 : x > y;
}

/* NUMA nodes listed under <root>/sys/devices/system/node. */
static GArray *numa_nodes(const char *root)
{
	char path[PATH_MAX];
	GArray *nodes = g_array_new(FALSE, FALSE, sizeof(int));
	DIR *d;
	struct dirent *ent;

	snprintf(path, sizeof path, "%s/sys/devices/system/node", root);
	d = opendir(path);
	if (d != NULL) {
		while ((ent = readdir(d)) != NULL) {
			char *end;
			if (strncmp(ent->d_name, "node", 4) != 0 || !g_ascii_isdigit(ent->d_name[4]))
				continue;
			long v = strtol(ent->d_name + 4, &end, 10);
			if (*end == '\0' && v >= 0 && v < 4096) {
				int n = (int)v;
				g_array_append_val(nodes, n);
			}
		}
		closedir(d);
	}
	if (nodes->len == 0) {
		int zero = 0;
		g_array_append_val(nodes, zero);
	}
	g_array_sort(nodes, (GCompareFunc)cmp_int);
	return nodes;
}

typedef struct gpu {
	char bus[64];
	char *path;
	int numa;
} gpu;

static int cmp_gpu(const void *a, const void *b)
{
	return strcmp(((const gpu *)a)->bus, ((const gpu *)b)->bus);
}

/* NVIDIA display/3D controllers under <root>/sys/bus/pci/devices, in PCI
 * order (CUDA_DEVICE_ORDER=PCI_BUS_ID numbering). */
static GArray *gpus(const char *root)
{
	char path[PATH_MAX], real[PATH_MAX], buf[64];
	GArray *out = g_array_new(FALSE, TRUE, sizeof(gpu));
	DIR *d;
	struct dirent *ent;

	snprintf(path, sizeof path, "%s/sys/bus/pci/devices", root);
	d = opendir(path);
	if (d == NULL)
		return out;
	while ((ent = readdir(d)) != NULL) {
		if (ent->d_name[0] == '.')
			continue;
		snprintf(path, sizeof path, "%s/sys/bus/pci/devices/%s/vendor", root, ent->d_name);
		if (!rd_read_line(path, buf, sizeof buf) || g_ascii_strcasecmp(buf, "0x10de") != 0)
			continue;
		snprintf(path, sizeof path, "%s/sys/bus/pci/devices/%s/class", root, ent->d_name);
		if (!rd_read_line(path, buf, sizeof buf))
			continue;
		unsigned long cls = strtoul(buf, NULL, 16);
		if ((cls >> 8) != 0x0300 && (cls >> 8) != 0x0302)
			continue;
		snprintf(path, sizeof path, "%s/sys/bus/pci/devices/%s", root, ent->d_name);
		if (realpath(path, real) == NULL)
			continue;
		gpu g = { .path = g_strdup(real) };
		g_strlcpy(g.bus, ent->d_name, sizeof g.bus);
		char *nn = g_strdup_printf("%s/numa_node", real);
		g.numa = read_int(nn, -1);
		g_free(nn);
		g_array_append_val(out, g);
	}
	closedir(d);
	g_array_sort(out, (GCompareFunc)cmp_gpu);
	return out;
}

/* Hops between two sysfs PCI paths through their deepest common ancestor,
 * and whether they share a PCI root (a "pciDDDD:BB" component). */
static int pci_distance(const char *a, const char *b, bool *same_root)
{
	gchar **pa = g_strsplit(a, "/", -1), **pb = g_strsplit(b, "/", -1);
	int na = (int)g_strv_length(pa), nb = (int)g_strv_length(pb), common = 0;

	while (common < na && common < nb && strcmp(pa[common], pb[common]) == 0)
		common++;
	*same_root = false;
	for (int i = 0; i < common; i++)
		if (strncmp(pa[i], "pci", 3) == 0 && strchr(pa[i], ':') != NULL)
			*same_root = true;
	g_strfreev(pa);
	g_strfreev(pb);
	return (na - common) + (nb - common);
}

static rd_loc *locs_add(GArray *locs, const char *name)
{
	rd_loc l = { .name = g_strdup(name) };
	g_array_append_val(locs, l);
	return &g_array_index(locs, rd_loc, locs->len - 1);
}

static void topo_take_locs(rd_topo *t, GArray *locs)
{
	t->nloc = (int)locs->len;
	t->locs = (rd_loc *)g_array_free(locs, FALSE);
}

/* Location `label` (a GPU at sysfs PCI path `path`, or NULL, on NUMA node
 * `numa`): the NICs nearest it on the PCI tree first; with no NIC under its
 * root complex (or no known path), the NICs of its NUMA node. */
static void add_device_loc(rd_topo *out, GArray *locs, const char *label, const char *path, int numa)
{
	int n = out->nhca, dist[RD_MAX_DEV], best = INT_MAX;
	bool any_root = false;

	for (int i = 0; i < n; i++) {
		bool same = false;
		dist[i] = path && out->hcas[i].pci_path ? pci_distance(path, out->hcas[i].pci_path, &same)
							: INT_MAX;
		if (!same)
			dist[i] = INT_MAX;
		else
			any_root = true;
		if (dist[i] < best)
			best = dist[i];
	}
	rd_loc *l = locs_add(locs, label);
	for (int i = 0; i < n; i++) {
		bool pref = any_root ? dist[i] == best : (numa >= 0 && out->hcas[i].numa == numa);
		if (pref)
			l->pref[l->npref++] = i;
		else
			l->avail[l->navail++] = i;
	}
}

static bool has_loc(GArray *locs, const char *label)
{
	for (guint i = 0; i < locs->len; i++)
		if (strcmp(g_array_index(locs, rd_loc, i).name, label) == 0)
			return true;
	return false;
}

int rd_topo_discover(const char *root, char *const *names, int n, rd_topo *out, GString *err)
{
	return rd_topo_discover_devices(root, names, n, NULL, 0, out, err);
}

int rd_topo_discover_devices(const char *root, char *const *names, int n, const rd_devloc *devs,
			     int ndev, rd_topo *out, GString *err)
{
	GArray *locs, *nodes, *gs;
	char label[32];

	memset(out, 0, sizeof *out);
	if (n <= 0) {
		g_string_assign(err, "no RDMA devices to build a topology from");
		return -ENODEV;
	}
	if (n > RD_MAX_DEV) {
		g_string_printf(err, "%d RDMA devices; at most %d are supported", n, RD_MAX_DEV);
		return -E2BIG;
	}
	out->hcas = g_new0(rd_hca, n);
	out->nhca = n;
	for (int i = 0; i < n; i++) {
		g_strlcpy(out->hcas[i].name, names[i], RD_NAME_MAX);
		hca_locate(root, &out->hcas[i]);
	}
	qsort(out->hcas, (size_t)n, sizeof *out->hcas, cmp_hca);

	locs = g_array_new(FALSE, TRUE, sizeof(rd_loc));
	nodes = numa_nodes(root);
	for (guint k = 0; k < nodes->len; k++) {
		int node = g_array_index(nodes, int, k);
		snprintf(label, sizeof label, "cpu:%d", node);
		rd_loc *l = locs_add(locs, label);
		for (int i = 0; i < n; i++) {
			if (out->hcas[i].numa == node)
				l->pref[l->npref++] = i;
			else
				l->avail[l->navail++] = i;
		}
	}
	g_array_unref(nodes);

	/* The devices the device plugins report, where they say where they
	 * are; then NVIDIA GPUs found in sysfs as cuda:N in PCI order, for the
	 * numbers no plugin reported. */
	for (int k = 0; k < ndev; k++) {
		char path[PATH_MAX], real[PATH_MAX], lower[32];
		const char *p = NULL;
		if (has_loc(locs, devs[k].location))
			continue;
		if (devs[k].pci[0] != '\0') {
			g_strlcpy(lower, devs[k].pci, sizeof lower);
			for (char *c = lower; *c; c++)
				*c = g_ascii_tolower(*c);
			snprintf(path, sizeof path, "%s/sys/bus/pci/devices/%s", root, lower);
			p = realpath(path, real);
		}
		add_device_loc(out, locs, devs[k].location, p, devs[k].numa);
	}
	gs = gpus(root);
	for (guint k = 0; k < gs->len; k++) {
		gpu *g = &g_array_index(gs, gpu, k);
		snprintf(label, sizeof label, "cuda:%u", k);
		if (!has_loc(locs, label))
			add_device_loc(out, locs, label, g->path, g->numa);
		g_free(g->path);
	}
	g_array_unref(gs);
	topo_take_locs(out, locs);
	return 0;
}

static bool name_ok(const char *s)
{
	size_t n = s ? strlen(s) : 0;
	if (n == 0 || n >= RD_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!g_ascii_isgraph(s[i]) || s[i] == '@' || s[i] == '"')
			return false;
	return true;
}

static bool location_ok(const char *s)
{
	size_t n = s ? strlen(s) : 0;
	return n > 0 && n <= 64;
}

/* Checks one matrix entry: its location name, and its value [[names...],
 * [names...]] (the second list may be missing, as in the seed's "cuda:0":
 * [["mlx1", "mlx0"]]). */
static int matrix_lists(const char *key, JsonNode *v, JsonArray **lists, GString *err)
{
	lists[0] = lists[1] = NULL;
	if (!location_ok(key)) {
		g_string_printf(err, "priority matrix: bad location name \"%.80s\"", key);
		return -EINVAL;
	}
	if (!JSON_NODE_HOLDS_ARRAY(v)) {
		g_string_printf(err, "priority matrix: \"%s\" is not [[preferred NICs], [other NICs]]", key);
		return -EINVAL;
	}
	JsonArray *a = json_node_get_array(v);
	guint len = json_array_get_length(a);
	if (len < 1 || len > 2) {
		g_string_printf(err, "priority matrix: \"%s\" holds %u lists; want 2 (preferred, other)",
				key, len);
		return -EINVAL;
	}
	for (guint i = 0; i < len; i++) {
		JsonNode *e = json_array_get_element(a, i);
		if (!JSON_NODE_HOLDS_ARRAY(e)) {
			g_string_printf(err, "priority matrix: \"%s\" list %u is not an array", key, i);
			return -EINVAL;
		}
		lists[i] = json_node_get_array(e);
		for (guint j = 0; j < json_array_get_length(lists[i]); j++) {
			JsonNode *nm = json_array_get_element(lists[i], j);
			if (!JSON_NODE_HOLDS_VALUE(nm) || json_node_get_value_type(nm) != G_TYPE_STRING ||
			    !name_ok(json_node_get_string(nm))) {
				g_string_printf(err, "priority matrix: \"%s\" list %u entry %u is not a NIC name",
						key, i, j);
				return -EINVAL;
			}
		}
	}
	return 0;
}

static int index_of(char (*devs)[RD_NAME_MAX], int ndev, const char *name)
{
	for (int i = 0; i < ndev; i++)
		if (strcmp(devs[i], name) == 0)
			return i;
	return -1;
}

static bool has(const int *list, int n, int v)
{
	for (int i = 0; i < n; i++)
		if (list[i] == v)
			return true;
	return false;
}

static gint cmp_loc(gconstpointer a, gconstpointer b)
{
	return strcmp(((const rd_loc *)a)->name, ((const rd_loc *)b)->name);
}

int rd_matrix_parse(JsonObject *matrix, char (*devs)[RD_NAME_MAX], int ndev, rd_loc **locs_out,
		    int *nloc_out, GString *err)
{
	GArray *locs = g_array_new(FALSE, TRUE, sizeof(rd_loc));
	JsonObjectIter it;
	const gchar *key;
	JsonNode *v;

	json_object_iter_init(&it, matrix);
	while (json_object_iter_next(&it, &key, &v)) {
		JsonArray *lists[2];
		if (matrix_lists(key, v, lists, err) < 0)
			goto fail;
		rd_loc *l = locs_add(locs, key);
		for (int li = 0; li < 2; li++) {
			if (lists[li] == NULL)
				continue;
			for (guint j = 0; j < json_array_get_length(lists[li]); j++) {
				int idx = index_of(devs, ndev, json_array_get_string_element(lists[li], j));
				/* A NIC the device list lacks is not usable: skip it. */
				if (idx < 0 || has(l->pref, l->npref, idx) || has(l->avail, l->navail, idx))
					continue;
				if (li == 0)
					l->pref[l->npref++] = idx;
				else
					l->avail[l->navail++] = idx;
			}
		}
	}
	/* Sorted by name, as Mooncake's map orders them (JSON objects have no
	 * order of their own). */
	g_array_sort(locs, cmp_loc);
	*nloc_out = (int)locs->len;
	*locs_out = (rd_loc *)g_array_free(locs, FALSE);
	return 0;
fail:
	rd_locs_free((rd_loc *)locs->data, (int)locs->len);
	g_array_free(locs, FALSE);
	*locs_out = NULL;
	*nloc_out = 0;
	return -EINVAL;
}

int rd_topo_from_matrix(const char *root, JsonObject *matrix, char *const *known, int n_known,
			rd_topo *out, GString *err)
{
	GPtrArray *names = g_ptr_array_new();
	JsonObjectIter it;
	const gchar *key;
	JsonNode *v;
	int rc = -EINVAL;

	memset(out, 0, sizeof *out);
	if (json_object_get_size(matrix) == 0) {
		g_string_assign(err, "priority matrix is empty");
		goto out;
	}
	/* Pass 1: validate, and collect the NICs it names. */
	json_object_iter_init(&it, matrix);
	while (json_object_iter_next(&it, &key, &v)) {
		JsonArray *lists[2];
		if (matrix_lists(key, v, lists, err) < 0)
			goto out;
		for (int li = 0; li < 2; li++) {
			for (guint j = 0; lists[li] && j < json_array_get_length(lists[li]); j++) {
				const char *nm = json_array_get_string_element(lists[li], j);
				bool found = known == NULL;
				for (int k = 0; !found && k < n_known; k++)
					found = strcmp(known[k], nm) == 0;
				if (!found) {
					g_string_printf(err, "priority matrix names NIC \"%s\" (under \"%s\"), "
							     "which is not among the RDMA devices found",
							nm, key);
					goto out;
				}
				bool dup = false;
				for (guint k = 0; k < names->len && !dup; k++)
					dup = strcmp(g_ptr_array_index(names, k), nm) == 0;
				if (!dup)
					g_ptr_array_add(names, (gpointer)nm);
			}
		}
	}
	if (names->len == 0) {
		g_string_assign(err, "priority matrix names no NIC");
		goto out;
	}
	if (names->len > RD_MAX_DEV) {
		g_string_printf(err, "priority matrix names %u NICs; at most %d are supported", names->len,
				RD_MAX_DEV);
		goto out;
	}
	out->nhca = (int)names->len;
	out->hcas = g_new0(rd_hca, out->nhca);
	for (int i = 0; i < out->nhca; i++) {
		g_strlcpy(out->hcas[i].name, g_ptr_array_index(names, i), RD_NAME_MAX);
		hca_locate(root, &out->hcas[i]);
	}
	qsort(out->hcas, (size_t)out->nhca, sizeof *out->hcas, cmp_hca);
	/* Pass 2: indices in canonical order. */
	char (*devs)[RD_NAME_MAX] = g_malloc0_n((gsize)(out->nhca), RD_NAME_MAX);
	for (int i = 0; i < out->nhca; i++)
		memcpy(devs[i], out->hcas[i].name, RD_NAME_MAX);
	rc = rd_matrix_parse(matrix, devs, out->nhca, &out->locs, &out->nloc, err);
	g_free(devs);
out:
	g_ptr_array_unref(names);
	if (rc < 0)
		rd_topo_clear(out);
	return rc;
}

JsonNode *rd_matrix_to_json(const rd_loc *locs, int n, char (*devs)[RD_NAME_MAX])
{
	JsonObject *o = json_object_new();
	JsonNode *node = json_node_new(JSON_NODE_OBJECT);

	for (int i = 0; i < n; i++) {
		JsonArray *pair = json_array_new(), *p = json_array_new(), *a = json_array_new();
		for (int k = 0; k < locs[i].npref; k++)
			json_array_add_string_element(p, devs[locs[i].pref[k]]);
		for (int k = 0; k < locs[i].navail; k++)
			json_array_add_string_element(a, devs[locs[i].avail[k]]);
		json_array_add_array_element(pair, p);
		json_array_add_array_element(pair, a);
		json_object_set_array_member(o, locs[i].name, pair);
	}
	json_node_take_object(node, o);
	return node;
}
