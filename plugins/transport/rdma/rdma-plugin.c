/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The RDMA transport plugin: create/destroy, the descriptor's device part,
 * probe/report and the ops table; rdma-config.c, rdma-slice.c, rdma-worker.c, rdma-dispatcher.c,
 * rdma-mr.c and rdma-segment.c hold the rest, one object each.
 *
 * Data path. submit() only computes each transfer's slice count and queues
 * it (no allocation, one lock per call). A dispatcher thread cuts transfers
 * into slices taken from a fixed pool and routes each slice to a
 * (local NIC, peer NIC) path chosen from the priority matrices of both
 * buffers' locations; the slices queue per local NIC. Each NIC's workers
 * resolve endpoints, post RDMA READ/WRITE work requests and poll the NIC's
 * completion queues, reporting each slice to the host. Idle workers sleep on
 * the completion channels, never spin.
 *
 * Faults. A failed slice is routed again, to a path it has not tried first;
 * untried paths are always tried, then up to TE_RDMA_RETRY_CNT attempts in
 * all. A NIC pair that fails repeatedly is paused; a NIC whose port is down
 * is out of service until it is up again. A slice fails only when no usable
 * path is left.
 *
 * Deadlines. The host may end a transfer early (its deadline, a cancel);
 * rdma-deadline.c's expire() then drops its slices not yet posted and fences the
 * endpoints holding its posted ones (docs/rdma.md, "Deadlines").
 */
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "rdma.h"

int64_t rd_now_ms(void)
{
	return g_get_monotonic_time() / 1000;
}
/* -------------------------------------------------------------- describe */

static int rd_describe(void *ctx, char **json)
{
	rd_transport *tr = ctx;
	JsonObject *o = json_object_new();
	JsonArray *devs = json_array_new();
	char (*names)[RD_NAME_MAX] = g_malloc0_n((gsize)(tr->nctx), RD_NAME_MAX);

	for (int i = 0; i < tr->nctx; i++) {
		rd_ctx *c = tr->ctx[i];
		JsonObject *d = json_object_new();
		char gid[48];
		uint8_t raw[16];
		int index;
		rd_ctx_gid(c, raw, &index);
		rd_gid_format(raw, gid);
		json_object_set_string_member(d, "gid", gid);
		json_object_set_int_member(d, "lid", c->lid);
		json_object_set_string_member(d, "name", c->name);
		json_array_add_object_element(devs, d);
		g_strlcpy(names[i], c->name, RD_NAME_MAX);
	}
	json_object_set_array_member(o, "devices", devs);
	json_object_set_member(o, "priority_matrix", rd_matrix_to_json(tr->topo.locs, tr->topo.nloc, names));
	g_free(names);
	JsonNode *root = json_node_new(JSON_NODE_OBJECT);
	json_node_take_object(root, o);
	*json = teu_json_text(root, NULL);
	json_node_unref(root);
	return *json ? 0 : -ENOMEM;
}

/* --------------------------------------------------------- create/destroy */

static void tr_free(rd_transport *tr)
{
	for (int i = 0; i < tr->nctx; i++)
		rd_ctx_close(tr->ctx[i]);
	if (tr->mrs)
		g_ptr_array_unref(tr->mrs);
	rd_topo_clear(&tr->topo);
	g_free(tr->slices);
	g_free((void *)tr->free_next);
	g_free((void *)tr->posted_on);
	g_free((void *)tr->posted_t);
	g_free((void *)tr->posted_ep);
	g_free(tr->sysfs_root);
	g_free(tr->local_name);
	teu_mon_clear(&tr->expire);
	teu_mon_clear(&tr->pend);
	teu_mon_clear(&tr->pool);
	teu_mon_clear(&tr->reclaim);
	g_rw_lock_clear(&tr->mr_lock);
	g_hash_table_unref(tr->live);
	g_mutex_clear(&tr->live_lock);
	g_mutex_clear(&tr->stats.lock);
	g_free(tr);
}

/* The topology, with the devices the device plugins report placed where
 * they say they are. */
static int discover(const te_host *h, const char *root, GPtrArray *names, rd_topo *topo,
		    GString *err)
{
	te_device_info info[RD_MAX_DEV * 2];
	rd_devloc devs[RD_MAX_DEV * 2];
	size_t n = 0;

	if (TE_HAS_OP(h, devices)) {
		for (size_t i = 0; i < G_N_ELEMENTS(info); i++)
			info[i] = (te_device_info){ .size = sizeof info[i], .numa_node = -1 };
		if (h->devices(h, info, G_N_ELEMENTS(info), &n) < 0)
			n = 0;
		n = MIN(n, G_N_ELEMENTS(info));
		for (size_t i = 0; i < n; i++) {
			g_strlcpy(devs[i].location, info[i].location, sizeof devs[i].location);
			g_strlcpy(devs[i].pci, info[i].pci_bus_id, sizeof devs[i].pci);
			devs[i].numa = info[i].numa_node;
		}
	}
	return rd_topo_discover_devices(root, (char *const *)names->pdata, (int)names->len, devs,
					(int)n, topo, err);
}

static int rd_create(const te_host *h, const char *json_args, void **out)
{
	rd_transport *tr = g_new0(rd_transport, 1);
	GString *err = g_string_new(NULL);
	GPtrArray *names = g_ptr_array_new_with_free_func(g_free);
	struct ibv_device **list = NULL;
	int num = 0, rc;
	rd_provider prov;
	rd_args a;

	*out = NULL;
	tr->host = h;
	tr->metrics = TE_HAS_OP(h, metric_device) && TE_HAS_OP(h, metric_add);
	tr->deadlines = TE_HAS_OP(h, transfer_enter) && TE_HAS_OP(h, transfer_leave);
	teu_mon_init(&tr->expire);
	teu_mon_init(&tr->pend);
	teu_mon_init(&tr->pool);
	teu_mon_init(&tr->reclaim);
	g_rw_lock_init(&tr->mr_lock);
	g_mutex_init(&tr->live_lock);
	tr->live = g_hash_table_new(g_direct_hash, g_direct_equal);
	g_mutex_init(&tr->stats.lock);
	rd_read_config(h, &tr->cfg);
	rc = rd_parse_args(json_args, &a, err);
	if (rc < 0) {
		h->log(h, TE_LOG_ERROR, "invalid arguments %.200s%s: %s", json_args,
		       strlen(json_args) > 200 ? "..." : "", err->str);
		goto fail;
	}
	if (a.devices == NULL)
		a.devices = rd_env_devices(h);
	rd_provider_get(h, &prov);
	tr->verbs = prov.verbs;
	tr->sysfs_root = g_strdup(prov.sysfs_root);
	tr->local_name = g_strdup(h->local_name(h) ? h->local_name(h) : "localhost");

	rc = rd_select_devices(tr->verbs, tr->sysfs_root, a.devices, &list, &num, names, err);
	if (rc < 0) {
		h->log(h, TE_LOG_ERROR, "RDMA transport not installed: %s", err->str);
		goto fail;
	}
	if (a.matrix != NULL)
		rc = rd_topo_from_matrix(tr->sysfs_root, a.matrix, (char *const *)names->pdata,
					 (int)names->len, &tr->topo, err);
	else
		rc = discover(h, tr->sysfs_root, names, &tr->topo, err);
	if (rc < 0) {
		h->log(h, TE_LOG_ERROR, "RDMA transport not installed: %s", err->str);
		goto fail;
	}
	for (int i = 0; i < tr->topo.nhca; i++) {
		struct ibv_device *dev = NULL;
		for (int k = 0; k < num && dev == NULL; k++)
			if (strcmp(tr->verbs->get_device_name(list[k]), tr->topo.hcas[i].name) == 0)
				dev = list[k];
		g_string_truncate(err, 0);
		rc = dev ? rd_ctx_open(tr, i, dev, &tr->ctx[i], err) : -ENODEV;
		if (rc < 0) {
			h->log(h, TE_LOG_ERROR, "RDMA transport not installed: %s",
			       dev ? err->str : "a device vanished");
			goto fail;
		}
		tr->nctx = i + 1;
	}
	tr->verbs->free_device_list(list);
	list = NULL;

	tr->nslices = tr->cfg.max_slices;
	tr->slices = g_new0(rd_slice, tr->nslices);
	tr->free_next = g_new0(atomic_uint, tr->nslices);
	tr->posted_on = g_new0(atomic_int, tr->nslices);
	tr->posted_t = g_new0(_Atomic uintptr_t, tr->nslices);
	tr->posted_ep = g_new0(_Atomic uintptr_t, tr->nslices);
	for (uint32_t i = 0; i < tr->nslices; i++) {
		tr->slices[i].index = i;
		rd_pool_put(tr, &tr->slices[i]);
	}
	tr->mrs = g_ptr_array_new();
	rc = h->rpc_handle(h, TE_RPC_CONNECTION, rd_ep_handle, tr);
	if (rc < 0) {
		h->log(h, TE_LOG_ERROR, "RDMA transport not installed: cannot receive handshakes: %s",
		       rd_strerror(rc));
		goto fail;
	}
	for (int i = 0; i < tr->nctx; i++) {
		rc = rd_ctx_start(tr->ctx[i]);
		if (rc < 0) {
			h->log(h, TE_LOG_ERROR, "RDMA transport not installed: %s: cannot start its threads",
			       tr->ctx[i]->name);
			atomic_store(&tr->stopping, true);
			for (int k = 0; k <= i; k++)
				rd_ctx_stop(tr->ctx[k]);
			h->rpc_handle(h, TE_RPC_CONNECTION, NULL, NULL);
			goto fail;
		}
	}
	tr->dispatcher = g_thread_new("te-rdma-dispatch", rd_dispatcher_thread, tr);
	tr->reclaimer = g_thread_new("te-rdma-reclaim", rd_reclaimer_thread, tr);
	rd_provider_track(tr, true);

	GString *desc = g_string_new(NULL);
	for (int i = 0; i < tr->nctx; i++)
		g_string_append_printf(desc, "%s%s", i ? ", " : "", tr->ctx[i]->name);
	h->log(h, TE_LOG_INFO, "RDMA transport up on %s (verbs: %s, slice %llu bytes, %u QPs per "
			       "endpoint, %u workers per device)",
	       desc->str, tr->verbs->name, (unsigned long long)tr->cfg.slice_size, tr->cfg.num_qp_per_ep,
	       tr->cfg.workers_per_ctx);
	g_string_free(desc, TRUE);
	rd_args_clear(&a);
	g_ptr_array_unref(names);
	g_string_free(err, TRUE);
	*out = tr;
	return 0;
fail:
	if (list)
		tr->verbs->free_device_list(list);
	rd_args_clear(&a);
	g_ptr_array_unref(names);
	g_string_free(err, TRUE);
	tr_free(tr);
	return rc < 0 ? rc : -EINVAL;
}

static void rd_destroy(void *ctx)
{
	rd_transport *tr = ctx;

	rd_provider_track(tr, false);
	/* Waits for a handshake being served, and refuses new ones. */
	tr->host->rpc_handle(tr->host, TE_RPC_CONNECTION, NULL, NULL);
	atomic_store(&tr->stopping, true);
	teu_mon_broadcast(&tr->pend);
	teu_mon_broadcast(&tr->pool);
	teu_mon_broadcast(&tr->reclaim);
	g_thread_join(tr->dispatcher);
	g_thread_join(tr->reclaimer);
	/* Flush whatever is posted so the workers see it come back. */
	for (int i = 0; i < tr->nctx; i++)
		rd_ep_pool_flush(tr->ctx[i]);
	for (int i = 0; i < tr->nctx; i++)
		rd_ctx_kick(tr->ctx[i]);
	for (int i = 0; i < tr->nctx; i++)
		rd_ctx_stop(tr->ctx[i]);
	/* Requests the hardware never completed: end them here. */
	for (uint32_t i = 0; i < tr->nslices; i++) {
		rd_slice *s = &tr->slices[i];
		if (s->t != NULL && s->ep != NULL) {
			RD_LOG(tr, TE_LOG_WARN, "a slice posted on %s never completed; failing it",
			       s->ep->peer_nic_path);
			rd_ep *ep = s->ep;
			s->ep = NULL;
			rd_posted_clear(tr, s);
			rd_slice_fail(tr, s, -ECANCELED, "transport shutting down");
			rd_ep_unref(ep);
		}
	}
	/* Registrations the host did not remove. */
	for (guint i = 0; i < tr->mrs->len; i++)
		rd_mr_unref(g_ptr_array_index(tr->mrs, i));
	g_ptr_array_set_size(tr->mrs, 0);
	tr_free(tr);
}

/* ------------------------------------------------------------ probe/report */

static int rd_probe(const te_host *h, char *why, size_t why_len)
{
	rd_provider prov;
	rd_provider_get(h, &prov);
	const rv_verbs *v = prov.verbs;
	GPtrArray *names = g_ptr_array_new_with_free_func(g_free);
	GPtrArray *allow = rd_env_devices(h);
	GString *err = g_string_new(NULL);
	struct ibv_device **list = NULL;
	int num = 0;
	int rc = rd_select_devices(v, prov.sysfs_root, allow, &list, &num, names, err);

	if (rc < 0)
		snprintf(why, why_len, "%s", err->str);
	else
		v->free_device_list(list);
	if (allow)
		g_ptr_array_unref(allow);
	g_ptr_array_unref(names);
	g_string_free(err, TRUE);
	return rc;
}

static const char *port_state_name(enum ibv_port_state s)
{
	switch (s) {
	case IBV_PORT_DOWN: return "DOWN";
	case IBV_PORT_INIT: return "INIT";
	case IBV_PORT_ARMED: return "ARMED";
	case IBV_PORT_ACTIVE: return "ACTIVE";
	default: return "?";
	}
}

static int rd_report(const te_host *h, char **text)
{
	rd_provider prov;
	rd_provider_get(h, &prov);
	const rv_verbs *v = prov.verbs;
	const char *root = prov.sysfs_root;
	GPtrArray *names = g_ptr_array_new_with_free_func(g_free);
	GPtrArray *allow = rd_env_devices(h);
	GString *out = g_string_new(NULL), *err = g_string_new(NULL);
	struct ibv_device **list = NULL;
	rd_topo topo = { 0 };
	rd_config cfg;
	int num = 0;

	rd_read_config(h, &cfg);
	g_string_append_printf(out, "  verbs: %s%s%s\n", v->name, strcmp(root, "/") ? ", sysfs root " : "",
			       strcmp(root, "/") ? root : "");
	if (rd_select_devices(v, root, allow, &list, &num, names, err) < 0) {
		g_string_append_printf(out, "  %s\n", err->str);
		goto done;
	}
	if (discover(h, root, names, &topo, err) < 0) {
		g_string_append_printf(out, "  topology: %s\n", err->str);
		goto done;
	}
	g_string_append(out, "  devices (canonical order):\n");
	for (int i = 0; i < topo.nhca; i++) {
		rd_hca *hc = &topo.hcas[i];
		struct ibv_device *dev = NULL;
		for (int k = 0; k < num && !dev; k++)
			if (strcmp(v->get_device_name(list[k]), hc->name) == 0)
				dev = list[k];
		g_string_append_printf(out, "    %-10s PCI %s, NUMA node %d\n", hc->name,
				       hc->pci[0] ? hc->pci : "?", hc->numa);
		struct ibv_context *vc = dev ? v->open_device(dev) : NULL;
		if (vc == NULL) {
			g_string_append_printf(out, "               cannot open: %s\n", g_strerror(errno));
			continue;
		}
		struct ibv_port_attr pa;
		if (v->query_port(vc, (uint8_t)cfg.ib_port, &pa) == 0) {
			static const int mtu_bytes[] = { 0, 256, 512, 1024, 2048, 4096 };
			int mtu = pa.active_mtu <= 5 ? mtu_bytes[pa.active_mtu] : 0;
			g_string_append_printf(out, "               port %u %s, %s, LID %u, MTU %d\n", cfg.ib_port,
					       port_state_name(pa.state),
					       pa.link_layer == IBV_LINK_LAYER_INFINIBAND ? "InfiniBand"
											  : "Ethernet",
					       pa.lid, mtu);
			GString *why = g_string_new(NULL);
			int gi = 0;
			uint8_t gid[16];
			char gs[48];
			if (rd_pick_gid(v, vc, (uint8_t)cfg.ib_port, cfg.gid_index, &gi, gid, why) == 0) {
				rd_gid_format(gid, gs);
				g_string_append_printf(out, "               %s: %s\n", why->str, gs);
			} else {
				g_string_append_printf(out, "               GID: %s\n", why->str);
			}
			g_string_free(why, TRUE);
		} else {
			g_string_append_printf(out, "               port %u cannot be queried\n", cfg.ib_port);
		}
		v->close_device(vc);
	}
	char (*devs)[RD_NAME_MAX] = g_malloc0_n((gsize)(topo.nhca), RD_NAME_MAX);
	for (int i = 0; i < topo.nhca; i++)
		g_strlcpy(devs[i], topo.hcas[i].name, RD_NAME_MAX);
	JsonNode *m = rd_matrix_to_json(topo.locs, topo.nloc, devs);
	char *mt = teu_json_text(m, NULL);
	json_node_unref(m);
	g_free(devs);
	g_string_append_printf(out, "  priority matrix: %s\n", mt ? mt : "?");
	free(mt);
done:
	if (list)
		v->free_device_list(list);
	rd_topo_clear(&topo);
	if (allow)
		g_ptr_array_unref(allow);
	g_ptr_array_unref(names);
	g_string_free(err, TRUE);
	*text = malloc(out->len + 1);
	if (*text != NULL)
		memcpy(*text, out->str, out->len + 1);
	g_string_free(out, TRUE);
	return *text ? 0 : -ENOMEM;
}

/* ------------------------------------------------------------------ ops */

static const te_transport_ops rd_ops = {
	.size = sizeof(te_transport_ops),
	.flags = TE_TRANSPORT_MEMORY | TE_TRANSPORT_DEVICE_MEMORY | TE_TRANSPORT_DEADLINES,
	.probe = rd_probe,
	.create = rd_create,
	.destroy = rd_destroy,
	.describe = rd_describe,
	.mem_register = rd_mem_register,
	.mem_unregister = rd_mem_unregister,
	.segment_open = rd_segment_open,
	.segment_close = rd_segment_close,
	.submit = rd_submit,
	.report = rd_report,
	.expire = rd_expire,
	.priority = TE_TRANSPORT_PRIORITY_RDMA, /* before TCP wherever a NIC works */
};

TE_PLUGIN_DEFINE(TE_KIND_TRANSPORT, "rdma", "1.0.0",
		 "RDMA (InfiniBand, RoCE) through libibverbs: topology-aware, multi-NIC, with failover",
		 "Apache-2.0", &rd_ops)
