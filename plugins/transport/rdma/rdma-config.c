/* SPDX-License-Identifier: Apache-2.0 */
/* The transport's configuration: its options (TE_RDMA_* and Mooncake's MC_*),
 * the install arguments and the devices they select. */
#include <stdio.h>
#include <string.h>

#include "rdma.h"

/* --------------------------------------------------------------- options */

static unsigned cfg_u(const te_host *h, const char *te, const char *mc, unsigned def, unsigned lo,
		      unsigned hi)
{
	return (unsigned)te_host_config_u64(h, te, mc, def, lo, hi);
}

/* A switch: 1/true/yes/on or 0/false/no/off (any case); `def` when unset,
 * and with a warning when it is something else. */
static bool cfg_bool(const te_host *h, const char *te, const char *mc, bool def)
{
	const char *s = h->config(h, te, mc);
	static const char *const on[] = { "1", "true", "yes", "on" }, *const off[] = { "0", "false", "no", "off" };

	if (s == NULL || *s == '\0')
		return def;
	for (size_t i = 0; i < G_N_ELEMENTS(on); i++) {
		if (g_ascii_strcasecmp(s, on[i]) == 0)
			return true;
		if (g_ascii_strcasecmp(s, off[i]) == 0)
			return false;
	}
	h->log(h, TE_LOG_WARN, "%s=%s is not a switch (1/0, true/false, yes/no, on/off); using %d", te, s, def);
	return def;
}

void rd_read_config(const te_host *h, rd_config *c)
{
	const char *s;

	c->num_cq_per_ctx = cfg_u(h, "TE_RDMA_NUM_CQ_PER_CTX", "MC_NUM_CQ_PER_CTX", 1, 1, 64);
	c->num_comp_channels =
		cfg_u(h, "TE_RDMA_NUM_COMP_CHANNELS_PER_CTX", "MC_NUM_COMP_CHANNELS_PER_CTX", 1, 1, 64);
	c->ib_port = cfg_u(h, "TE_RDMA_IB_PORT", "MC_IB_PORT", 1, 1, 255);
	c->gid_index = -1;
	s = h->config(h, "TE_RDMA_GID_INDEX", "MC_GID_INDEX");
	if (s != NULL && *s != '\0')
		c->gid_index = (int)te_host_config_u64(h, "TE_RDMA_GID_INDEX", "MC_GID_INDEX", 0, 0, 255);
	c->max_cqe = cfg_u(h, "TE_RDMA_MAX_CQE_PER_CTX", "MC_MAX_CQE_PER_CTX", 4096, 16, 1u << 22);
	c->max_ep_per_ctx = cfg_u(h, "TE_RDMA_MAX_EP_PER_CTX", "MC_MAX_EP_PER_CTX", 65536, 1, 65536);
	c->num_qp_per_ep = cfg_u(h, "TE_RDMA_NUM_QP_PER_EP", "MC_NUM_QP_PER_EP", 2, 1, 64);
	c->max_sge = cfg_u(h, "TE_RDMA_MAX_SGE", "MC_MAX_SGE", 4, 1, 64);
	c->max_wr = cfg_u(h, "TE_RDMA_MAX_WR", "MC_MAX_WR", 256, 1, 1u << 16);
	c->max_inline = cfg_u(h, "TE_RDMA_MAX_INLINE", "MC_MAX_INLINE", 64, 0, 4096);
	c->mtu = cfg_u(h, "TE_RDMA_MTU", "MC_MTU", 4096, 256, 4096);
	if (c->mtu != 256 && c->mtu != 512 && c->mtu != 1024 && c->mtu != 2048 && c->mtu != 4096) {
		h->log(h, TE_LOG_WARN, "TE_RDMA_MTU=%u is not 256, 512, 1024, 2048 or 4096; using 4096",
		       c->mtu);
		c->mtu = 4096;
	}
	c->workers_per_ctx = cfg_u(h, "TE_RDMA_WORKERS_PER_CTX", "MC_WORKERS_PER_CTX", 2, 1, 64);
	c->slice_size = te_host_config_u64(h, "TE_RDMA_SLICE_SIZE", "MC_SLICE_SIZE", 65536, 4096,
					   1u << 30);
	c->retry_cnt = cfg_u(h, "TE_RDMA_RETRY_CNT", "MC_RETRY_CNT", 9, 0, 1000);
	c->fragment_ratio = cfg_u(h, "TE_RDMA_FRAGMENT_RATIO", "MC_FRAGMENT_RATIO", 4, 1, 1u << 20);
	c->handshake_timeout_ms = cfg_u(h, "TE_RDMA_HANDSHAKE_TIMEOUT_MS", NULL, 10000, 100, 600000);
	c->ep_idle_ms = te_host_config_u64(h, "TE_RDMA_EP_IDLE_MS", NULL, 300000, 10, UINT32_MAX);
	c->reclaim_interval_ms = te_host_config_u64(h, "TE_RDMA_RECLAIM_INTERVAL_MS", NULL, 1000, 10,
						    600000);
	c->pair_fail_threshold = cfg_u(h, "TE_RDMA_PATH_FAIL_THRESHOLD", NULL, 3, 1, 1000);
	c->pair_pause_ms = te_host_config_u64(h, "TE_RDMA_PATH_PAUSE_MS", NULL, 2000, 0, 3600000);
	c->parallel_reg = -1;
	s = h->config(h, "TE_RDMA_PARALLEL_REG_MR", "MC_ENABLE_PARALLEL_REG_MR");
	if (s != NULL) {
		if (strcmp(s, "-1") == 0 || strcmp(s, "0") == 0 || strcmp(s, "1") == 0)
			c->parallel_reg = atoi(s);
		else
			h->log(h, TE_LOG_WARN, "TE_RDMA_PARALLEL_REG_MR=%s is not -1, 0 or 1; using -1", s);
	}
	c->parallel_reg_min = te_host_config_u64(h, "TE_RDMA_PARALLEL_REG_MIN", NULL, 256u << 20, 0,
						 UINT64_MAX);
	s = h->config(h, "TE_RDMA_ENDPOINT_STORE_TYPE", "MC_ENDPOINT_STORE_TYPE");
	c->fifo_store = false;
	if (s != NULL) {
		if (g_ascii_strcasecmp(s, "FIFO") == 0)
			c->fifo_store = true;
		else if (g_ascii_strcasecmp(s, "SIEVE") != 0)
			h->log(h, TE_LOG_WARN, "TE_RDMA_ENDPOINT_STORE_TYPE=%s is not SIEVE or FIFO; using SIEVE",
			       s);
	}
	c->max_slices = cfg_u(h, "TE_RDMA_MAX_SLICES", NULL, 16384, 64, 1u << 22);
	c->ready_grace_ms = cfg_u(h, "TE_RDMA_READY_GRACE_MS", NULL, 1000, 0, 600000);
	c->ib_tc = -1;
	s = h->config(h, "TE_RDMA_IB_TC", "MC_IB_TC");
	if (s != NULL && strcmp(s, "-1") != 0)
		c->ib_tc = (int)te_host_config_u64(h, "TE_RDMA_IB_TC", "MC_IB_TC", 0, 0, 255);
	c->relaxed_ordering = cfg_bool(h, "TE_RDMA_IB_PCI_RELAXED_ORDERING", "MC_IB_PCI_RELAXED_ORDERING", false);
	c->dest_affinity = cfg_bool(h, "TE_RDMA_DEST_DEVICE_AFFINITY", "MC_ENABLE_DEST_DEVICE_AFFINITY", false);
}


/* ------------------------------------------------------------ arguments */

void rd_args_clear(rd_args *a)
{
	if (a->devices)
		g_ptr_array_unref(a->devices);
	if (a->root)
		json_node_unref(a->root);
	if (a->mroot)
		json_node_unref(a->mroot);
	memset(a, 0, sizeof *a);
}

static int add_device_names(GPtrArray *out, JsonNode *n, GString *err)
{
	if (JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == G_TYPE_STRING) {
		gchar **parts = g_strsplit(json_node_get_string(n), ",", -1);
		for (gchar **p = parts; *p; p++) {
			char *s = g_strstrip(*p);
			if (*s)
				g_ptr_array_add(out, g_strdup(s));
		}
		g_strfreev(parts);
		return 0;
	}
	if (!JSON_NODE_HOLDS_ARRAY(n)) {
		g_string_assign(err, "\"devices\" is neither a list of names nor a comma-separated string");
		return -EINVAL;
	}
	JsonArray *a = json_node_get_array(n);
	for (guint i = 0; i < json_array_get_length(a); i++) {
		JsonNode *e = json_array_get_element(a, i);
		if (!JSON_NODE_HOLDS_VALUE(e) || json_node_get_value_type(e) != G_TYPE_STRING ||
		    *json_node_get_string(e) == '\0' || strlen(json_node_get_string(e)) >= RD_NAME_MAX) {
			g_string_printf(err, "\"devices\" entry %u is not a device name", i);
			return -EINVAL;
		}
		g_ptr_array_add(out, g_strdup(json_node_get_string(e)));
	}
	return 0;
}

/* The arguments: {"priority_matrix": {"loc": [[...], [...]]}} is the
 * deepest form. Devices are at most RD_MAX_DEV, but a matrix may list many
 * locations; a string may be a whole matrix. */
static const te_json_limits args_limits = { 4, 1024, 16384, 65536, 1024 * 1024 };
/* A matrix given as a JSON string: {"loc": [[names], [names]]}; location
 * and NIC names are at most 64 bytes (escapes allowed for). */
static const te_json_limits matrix_limits = { 3, 1024, 16384, 512, 65536 };

/* json_args: NULL; a priority matrix {"cpu:0": [[...], [...]], ...}; a list
 * of device names; or {"devices": [...] | "a,b", "priority_matrix": {...}}. */
int rd_parse_args(const char *text, rd_args *a, GString *err)
{
	JsonNode *root;
	static const char *const keys[] = { "devices", "device_name", "priority_matrix",
					    "nic_priority_matrix" };

	memset(a, 0, sizeof *a);
	if (text == NULL || *text == '\0')
		return 0;
	a->root = root = rd_json_load(text, strlen(text), &args_limits, "arguments", err);
	if (root == NULL)
		return -EINVAL;
	if (JSON_NODE_HOLDS_ARRAY(root)) {
		a->devices = g_ptr_array_new_with_free_func(g_free);
		return add_device_names(a->devices, root, err);
	}
	if (!JSON_NODE_HOLDS_OBJECT(root)) {
		g_string_assign(err, "arguments are neither a JSON object nor a list of device names");
		return -EINVAL;
	}
	JsonObject *o = json_node_get_object(root);
	bool options = false;
	for (size_t i = 0; i < G_N_ELEMENTS(keys); i++)
		options |= json_object_has_member(o, keys[i]);
	if (!options) {
		a->matrix = o; /* the seeds' form: the object is the matrix */
		return 0;
	}
	JsonObjectIter it;
	const gchar *k;
	JsonNode *v;
	json_object_iter_init(&it, o);
	while (json_object_iter_next(&it, &k, &v)) {
		if (strcmp(k, "devices") == 0 || strcmp(k, "device_name") == 0) {
			if (a->devices == NULL)
				a->devices = g_ptr_array_new_with_free_func(g_free);
			if (add_device_names(a->devices, v, err) < 0)
				return -EINVAL;
		} else if (strcmp(k, "priority_matrix") == 0 || strcmp(k, "nic_priority_matrix") == 0) {
			if (JSON_NODE_HOLDS_VALUE(v) && json_node_get_value_type(v) == G_TYPE_STRING) {
				/* a matrix passed as a JSON string */
				const char *mt = json_node_get_string(v);
				GString *why = g_string_new(NULL);
				JsonNode *mr = rd_json_load(mt, strlen(mt), &matrix_limits, k, why);
				if (mr == NULL || !JSON_NODE_HOLDS_OBJECT(mr)) {
					if (mr == NULL)
						g_string_printf(err, "\"%s\" is not a JSON object (%s)", k, why->str);
					else
						g_string_printf(err, "\"%s\" is not a JSON object", k);
					g_string_free(why, TRUE);
					if (mr != NULL)
						json_node_unref(mr);
					return -EINVAL;
				}
				g_string_free(why, TRUE);
				if (a->mroot)
					json_node_unref(a->mroot);
				a->mroot = mr;
				a->matrix = json_node_get_object(mr);
				continue;
			}
			if (!JSON_NODE_HOLDS_OBJECT(v)) {
				g_string_printf(err, "\"%s\" is not an object", k);
				return -EINVAL;
			}
			a->matrix = json_node_get_object(v);
		} else {
			g_string_printf(err, "unknown argument \"%s\" (known: devices, priority_matrix)", k);
			return -EINVAL;
		}
	}
	return 0;
}

/* ------------------------------------------------------------- devices */

/* The devices to use: every device found, or the allow-list (each entry must
 * exist). Names are g_strdup()ed into `names`. */
int rd_select_devices(const rv_verbs *v, const char *root, GPtrArray *allow,
			  struct ibv_device ***list_out, int *num_out, GPtrArray *names, GString *err)
{
	int num = 0;
	struct ibv_device **list = v->get_device_list(root, &num);

	if (list == NULL)
		num = 0;
	if (allow != NULL && allow->len > 0) {
		for (guint i = 0; i < allow->len; i++) {
			const char *want = g_ptr_array_index(allow, i);
			bool found = false, dup = false;
			for (int k = 0; k < num && !found; k++)
				found = strcmp(v->get_device_name(list[k]), want) == 0;
			for (guint k = 0; k < names->len && !dup; k++)
				dup = strcmp(g_ptr_array_index(names, k), want) == 0;
			if (!found) {
				GString *have = g_string_new(NULL);
				for (int k = 0; k < num; k++)
					g_string_append_printf(have, "%s%s", k ? ", " : "",
							       v->get_device_name(list[k]));
				g_string_printf(err, "RDMA device %s was requested but not found (found: %s)", want,
						num ? have->str : "none");
				g_string_free(have, TRUE);
				if (list)
					v->free_device_list(list);
				return -ENODEV;
			}
			if (!dup)
				g_ptr_array_add(names, g_strdup(want));
		}
	} else {
		for (int k = 0; k < num; k++)
			g_ptr_array_add(names, g_strdup(v->get_device_name(list[k])));
	}
	if (names->len == 0) {
		g_string_printf(err, "no RDMA devices were found (%s)", v->none_found);
		if (list)
			v->free_device_list(list);
		return -ENODEV;
	}
	*list_out = list;
	*num_out = num;
	return 0;
}

GPtrArray *rd_env_devices(const te_host *h)
{
	const char *s = h->config(h, "TE_RDMA_DEVICES", NULL);
	GPtrArray *out;

	if (s == NULL || *s == '\0')
		return NULL;
	out = g_ptr_array_new_with_free_func(g_free);
	gchar **parts = g_strsplit(s, ",", -1);
	for (gchar **p = parts; *p; p++) {
		char *x = g_strstrip(*p);
		if (*x)
			g_ptr_array_add(out, g_strdup(x));
	}
	g_strfreev(parts);
	return out;
}
