/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One device context per selected HCA: protection domain, completion queues
 * and channels, the port's LID/GID/MTU, its worker threads and the thread
 * that reads its asynchronous events. A context whose port goes down or that
 * reports a fatal error is taken out of service (no new slices, its
 * endpoints flushed) and brought back once its port is active again.
 */
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "rdma-internal.h"

static const char *gid_type_name(uint32_t t)
{
	switch (t) {
	case IBV_GID_TYPE_IB: return "IB";
	case IBV_GID_TYPE_ROCE_V1: return "RoCE v1";
	case IBV_GID_TYPE_ROCE_V2: return "RoCE v2";
	default: return "unknown";
	}
}

static bool gid_zero(const union ibv_gid *g)
{
	for (int i = 0; i < 16; i++)
		if (g->raw[i])
			return false;
	return true;
}

static bool gid_ipv4(const union ibv_gid *g)
{
	for (int i = 0; i < 10; i++)
		if (g->raw[i])
			return false;
	return g->raw[10] == 0xff && g->raw[11] == 0xff;
}

int rd_pick_gid(const rv_verbs *v, struct ibv_context *vctx, uint8_t port, int want, int *index,
		uint8_t gid[16], GString *why)
{
	struct ibv_port_attr pa;
	struct ibv_gid_entry e;
	int best = -1, best_score = 0, rc;
	struct ibv_gid_entry chosen = { 0 };

	rc = v->query_port(vctx, port, &pa);
	if (rc != 0) {
		g_string_printf(why, "cannot query port %u: %s", port, g_strerror(rc));
		return -rc;
	}
	if (want >= 0) {
		rc = v->query_gid_ex(vctx, port, (uint32_t)want, &e);
		if (rc != 0) {
			g_string_printf(why, "GID index %d (TE_RDMA_GID_INDEX/MC_GID_INDEX) is not usable: %s",
					want, g_strerror(rc));
			return -EINVAL;
		}
		*index = want;
		memcpy(gid, e.gid.raw, 16);
		g_string_printf(why, "GID index %d as configured (%s)", want, gid_type_name(e.gid_type));
		return 0;
	}
	/* Among GIDs that have a network device (RoCE), prefer RoCE v2 over an
	 * IPv4 address, then RoCE v2, then RoCE v1; on InfiniBand (no network
	 * devices) the first IB GID. */
	int n = pa.gid_tbl_len > 0 && pa.gid_tbl_len <= 1024 ? pa.gid_tbl_len : 256;
	for (int i = 0; i < n; i++) {
		int score = 0;
		if (v->query_gid_ex(vctx, port, (uint32_t)i, &e) != 0 || gid_zero(&e.gid))
			continue;
		if (e.gid_type == IBV_GID_TYPE_IB)
			score = 1;
		else if (e.ndev_ifindex == 0)
			continue; /* a RoCE GID without a network device cannot route */
		else if (e.gid_type == IBV_GID_TYPE_ROCE_V2)
			score = gid_ipv4(&e.gid) ? 4 : 3;
		else
			score = 2;
		if (score > best_score) {
			best_score = score;
			best = i;
			chosen = e;
		}
	}
	if (best < 0) {
		g_string_printf(why, "port %u has no GID with a network device (is the interface up and "
				     "addressed?); set TE_RDMA_GID_INDEX to force one",
				port);
		return -ENODEV;
	}
	*index = best;
	memcpy(gid, chosen.gid.raw, 16);
	g_string_printf(why, "GID index %d chosen automatically (%s%s, netdev ifindex %u)", best,
			gid_type_name(chosen.gid_type), gid_ipv4(&chosen.gid) ? ", IPv4" : "",
			chosen.ndev_ifindex);
	return 0;
}

static enum ibv_mtu mtu_enum(unsigned bytes)
{
	switch (bytes) {
	case 256: return IBV_MTU_256;
	case 512: return IBV_MTU_512;
	case 1024: return IBV_MTU_1024;
	case 2048: return IBV_MTU_2048;
	default: return IBV_MTU_4096;
	}
}

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

int rd_ctx_open(rd_transport *tr, int index, struct ibv_device *dev, rd_ctx **out, GString *err)
{
	const rv_verbs *v = tr->verbs;
	const rd_config *cfg = &tr->cfg;
	rd_ctx *c = g_new0(rd_ctx, 1);
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	GString *why = g_string_new(NULL);
	int rc;

	*out = NULL;
	c->tr = tr;
	c->index = index;
	g_strlcpy(c->name, v->get_device_name(dev), sizeof c->name);
	if (tr->metrics)
		c->mdev = tr->host->metric_device(tr->host, c->name);
	snprintf(c->nic_path, sizeof c->nic_path, "%s@%s", tr->local_name, c->name);
	g_mutex_init(&c->qlock);
	g_mutex_init(&c->ep_lock);
	g_mutex_init(&c->gid_lock);
	c->eps = g_hash_table_new(g_str_hash, g_str_equal);
	c->async_wake = -1;

	c->vctx = v->open_device(dev);
	if (c->vctx == NULL) {
		g_string_printf(err, "%s: cannot open the device: %s", c->name, g_strerror(errno));
		rc = -ENODEV;
		goto fail;
	}
	rc = v->query_device(c->vctx, &da);
	if (rc != 0) {
		g_string_printf(err, "%s: cannot query the device: %s", c->name, g_strerror(rc));
		rc = -rc;
		goto fail;
	}
	if (cfg->ib_port < 1 || cfg->ib_port > da.phys_port_cnt) {
		g_string_printf(err, "%s: port %u requested (TE_RDMA_IB_PORT/MC_IB_PORT) but the device "
				     "has %u",
				c->name, cfg->ib_port, da.phys_port_cnt);
		rc = -EINVAL;
		goto fail;
	}
	c->port = (uint8_t)cfg->ib_port;
	/* The platform's limits cap the configured values. */
	c->max_wr = MIN(cfg->max_wr, (unsigned)MAX(da.max_qp_wr, 1));
	c->max_sge = MIN(cfg->max_sge, (unsigned)MAX(da.max_sge, 1));
	c->max_cqe = MIN(cfg->max_cqe, (unsigned)MAX(da.max_cqe, 1));
	c->max_inline = cfg->max_inline;
	/* Devices refuse more outstanding READs than they can track (16 on
	 * most NICs, 128 on rdma_rxe, fewer on some); 16 is plenty. */
	c->max_rd_atomic = (uint8_t)MAX(MIN(16, da.max_qp_init_rd_atom), 1);
	c->max_dest_rd_atomic = (uint8_t)MAX(MIN(16, da.max_qp_rd_atom), 1);
	rc = v->query_port(c->vctx, c->port, &pa);
	if (rc != 0) {
		g_string_printf(err, "%s: cannot query port %u: %s", c->name, c->port, g_strerror(rc));
		rc = -rc;
		goto fail;
	}
	c->lid = pa.lid;
	c->link_layer = pa.link_layer;
	c->mtu = MIN(mtu_enum(cfg->mtu), pa.active_mtu ? pa.active_mtu : IBV_MTU_4096);
	rc = rd_pick_gid(v, c->vctx, c->port, cfg->gid_index, &c->gid_index, c->gid, why);
	if (rc < 0) {
		g_string_printf(err, "%s: %s", c->name, why->str);
		goto fail;
	}
	char gs[48];
	rd_gid_format(c->gid, gs);
	RD_LOG(tr, TE_LOG_INFO, "%s port %u: %s: %s", c->name, c->port, why->str, gs);

	c->pd = v->alloc_pd(c->vctx);
	if (c->pd == NULL) {
		g_string_printf(err, "%s: cannot allocate a protection domain: %s", c->name, g_strerror(errno));
		rc = -ENOMEM;
		goto fail;
	}
	c->ncq = (int)MAX(cfg->num_cq_per_ctx, 1);
	c->nchan = (int)MIN(MAX(cfg->num_comp_channels, 1), (unsigned)c->ncq);
	c->chans = g_new0(struct ibv_comp_channel *, c->nchan);
	c->cqs = g_new0(struct ibv_cq *, c->ncq);
	c->cq_out = g_new0(atomic_int, c->ncq);
	for (int i = 0; i < c->nchan; i++) {
		c->chans[i] = v->create_comp_channel(c->vctx);
		if (c->chans[i] == NULL || set_nonblock(c->chans[i]->fd) < 0) {
			g_string_printf(err, "%s: cannot create a completion channel: %s", c->name,
					g_strerror(errno));
			rc = -ENOMEM;
			goto fail;
		}
	}
	for (int i = 0; i < c->ncq; i++) {
		int vec = c->vctx->num_comp_vectors > 0 ? i % c->vctx->num_comp_vectors : 0;
		c->cqs[i] = v->create_cq(c->vctx, (int)c->max_cqe, c, c->chans[i % c->nchan], vec);
		if (c->cqs[i] == NULL) {
			g_string_printf(err, "%s: cannot create a completion queue of %u entries: %s", c->name,
					c->max_cqe, g_strerror(errno));
			rc = -ENOMEM;
			goto fail;
		}
	}
	if (set_nonblock(c->vctx->async_fd) < 0) {
		g_string_printf(err, "%s: cannot make the async event file non-blocking", c->name);
		rc = -EIO;
		goto fail;
	}
	atomic_store(&c->active, pa.state == IBV_PORT_ACTIVE);
	if (pa.state != IBV_PORT_ACTIVE) {
		c->down_since = rd_now_ms();
		RD_LOG(tr, TE_LOG_WARN, "%s port %u is not active: out of service until it is", c->name,
		       c->port);
	}
	g_string_free(why, TRUE);
	*out = c;
	return 0;
fail:
	g_string_free(why, TRUE);
	rd_ctx_close(c);
	return rc;
}

void rd_ctx_close(rd_ctx *c)
{
	const rv_verbs *v;

	if (c == NULL)
		return;
	v = c->tr->verbs;
	rd_ep_pool_clear(c);
	for (int i = 0; c->cqs && i < c->ncq; i++)
		if (c->cqs[i] && v->destroy_cq(c->cqs[i]) != 0)
			RD_LOG(c->tr, TE_LOG_WARN, "%s: destroying a completion queue failed", c->name);
	for (int i = 0; c->chans && i < c->nchan; i++)
		if (c->chans[i] && v->destroy_comp_channel(c->chans[i]) != 0)
			RD_LOG(c->tr, TE_LOG_WARN, "%s: destroying a completion channel failed", c->name);
	if (c->pd && v->dealloc_pd(c->pd) != 0)
		RD_LOG(c->tr, TE_LOG_WARN, "%s: freeing the protection domain failed (still in use)", c->name);
	if (c->vctx && v->close_device(c->vctx) != 0)
		RD_LOG(c->tr, TE_LOG_WARN, "%s: closing the device failed", c->name);
	g_free(c->cqs);
	g_free(c->chans);
	g_free(c->cq_out);
	g_hash_table_unref(c->eps);
	g_mutex_clear(&c->qlock);
	g_mutex_clear(&c->ep_lock);
	g_mutex_clear(&c->gid_lock);
	g_free(c);
}

/* ------------------------------------------------------------- service */

/* Drops every endpoint of the context: their slices go elsewhere now, and
 * the next transfer builds new ones. */
static void fail_all(rd_ctx *c, int error, const char *why)
{
	g_mutex_lock(&c->ep_lock);
	GPtrArray *all = g_ptr_array_new();
	for (rd_ep *ep = c->head; ep != NULL; ep = ep->next) {
		atomic_fetch_add(&ep->refs, 1);
		g_ptr_array_add(all, ep);
	}
	g_mutex_unlock(&c->ep_lock);
	for (guint i = 0; i < all->len; i++) {
		rd_ep_fail(g_ptr_array_index(all, i), error, why);
		rd_ep_unref(g_ptr_array_index(all, i));
	}
	g_ptr_array_unref(all);
}

void rd_ctx_set_active(rd_ctx *c, bool active, const char *why)
{
	bool was = atomic_exchange(&c->active, active);

	if (was == active)
		return;
	if (!active) {
		c->down_since = rd_now_ms();
		RD_LOG(c->tr, TE_LOG_WARN, "%s: out of service: %s; its endpoints are dropped and its slices "
					   "go to other NICs",
		       c->name, why);
		/* Flush what is in flight so it is retried elsewhere now, not
		 * after the transport timeout. */
		fail_all(c, -ENETDOWN, "device out of service");
		rd_reclaimer_kick(c->tr); /* its port is polled until it returns */
	} else {
		RD_LOG(c->tr, TE_LOG_WARN, "%s: back in service (%s) after %lld ms", c->name, why,
		       (long long)(rd_now_ms() - c->down_since));
	}
	rd_ctx_kick(c);
}

void rd_ctx_gid(rd_ctx *c, uint8_t gid[16], int *index)
{
	g_mutex_lock(&c->gid_lock);
	memcpy(gid, c->gid, 16);
	*index = c->gid_index;
	g_mutex_unlock(&c->gid_lock);
}

bool rd_ctx_refresh_gid(rd_ctx *c)
{
	GString *why = g_string_new(NULL);
	uint8_t gid[16], old[16];
	int index = -1, old_index;
	char gs[48], os[48];

	/* The address behind a RoCE GID may go (the interface readdressed,
	 * a DHCP lease changed): the index chosen at start then names another
	 * GID, or none, and peers would be told an address that is gone. */
	int rc = rd_pick_gid(c->tr->verbs, c->vctx, c->port, c->tr->cfg.gid_index, &index, gid, why);
	rd_ctx_gid(c, old, &old_index);
	if (rc < 0) {
		RD_LOG(c->tr, TE_LOG_WARN, "%s: no usable GID any more: %s", c->name, why->str);
		g_string_free(why, TRUE);
		rd_ctx_set_active(c, false, "no usable GID");
		return false;
	}
	if (index != old_index || memcmp(gid, old, 16) != 0) {
		g_mutex_lock(&c->gid_lock);
		memcpy(c->gid, gid, 16);
		c->gid_index = index;
		g_mutex_unlock(&c->gid_lock);
		rd_gid_format(old, os);
		rd_gid_format(gid, gs);
		RD_LOG(c->tr, TE_LOG_WARN, "%s port %u: the GID changed: %s (was index %d, %s); endpoints rebuilt",
		       c->name, c->port, why->str, old_index, os);
		fail_all(c, -ENETDOWN, "the device's GID changed");
	}
	g_string_free(why, TRUE);
	return true;
}

void rd_ctx_check_port(rd_ctx *c)
{
	struct ibv_port_attr pa;

	if (atomic_load(&c->active))
		return;
	if (c->tr->verbs->query_port(c->vctx, c->port, &pa) == 0 && pa.state == IBV_PORT_ACTIVE &&
	    rd_ctx_refresh_gid(c)) {
		atomic_store(&c->fatal, false);
		rd_ctx_set_active(c, true, "port active");
	}
}

static const char *event_name(enum ibv_event_type t)
{
	switch (t) {
	case IBV_EVENT_CQ_ERR: return "CQ error";
	case IBV_EVENT_QP_FATAL: return "QP fatal error";
	case IBV_EVENT_QP_REQ_ERR: return "QP request error";
	case IBV_EVENT_QP_ACCESS_ERR: return "QP access error";
	case IBV_EVENT_PORT_ACTIVE: return "port active";
	case IBV_EVENT_PORT_ERR: return "port error";
	case IBV_EVENT_DEVICE_FATAL: return "device fatal error";
	case IBV_EVENT_LID_CHANGE: return "LID change";
	case IBV_EVENT_GID_CHANGE: return "GID change";
	default: return "event";
	}
}

static void handle_event(rd_ctx *c, struct ibv_async_event *ev)
{
	switch (ev->event_type) {
	case IBV_EVENT_PORT_ERR:
		if (ev->element.port_num == c->port)
			rd_ctx_set_active(c, false, "port went down");
		break;
	case IBV_EVENT_PORT_ACTIVE:
		if (ev->element.port_num == c->port)
			rd_ctx_check_port(c);
		break;
	case IBV_EVENT_DEVICE_FATAL:
		atomic_store(&c->fatal, true);
		rd_ctx_set_active(c, false, "device reported a fatal error");
		break;
	case IBV_EVENT_GID_CHANGE:
		if (ev->element.port_num == c->port)
			rd_ctx_refresh_gid(c);
		break;
	case IBV_EVENT_CQ_ERR:
		RD_LOG(c->tr, TE_LOG_ERROR, "%s: completion queue error (overrun)", c->name);
		rd_ctx_set_active(c, false, "completion queue error");
		break;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR: {
		/* Only an endpoint still in the pool is failed: one already out
		 * of it may be on its way to destruction. */
		if (ev->element.qp != NULL)
			rd_ep_fail_qp(c, ev->element.qp, event_name(ev->event_type));
		break;
	}
	default:
		RD_LOG(c->tr, TE_LOG_DEBUG, "%s: async %s", c->name, event_name(ev->event_type));
		break;
	}
}

static gpointer async_thread(gpointer data)
{
	rd_ctx *c = data;
	const rv_verbs *v = c->tr->verbs;
	struct pollfd pf[2] = { { .fd = c->vctx->async_fd, .events = POLLIN },
				{ .fd = c->async_wake, .events = POLLIN } };

	for (;;) {
		if (poll(pf, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			RD_LOG(c->tr, TE_LOG_ERROR, "%s: polling async events failed: %s", c->name,
			       g_strerror(errno));
			break;
		}
		if (pf[1].revents)
			break;
		struct ibv_async_event ev;
		while (v->get_async_event(c->vctx, &ev) == 0) {
			handle_event(c, &ev);
			v->ack_async_event(&ev);
		}
	}
	return NULL;
}

int rd_ctx_start(rd_ctx *c)
{
	const rd_config *cfg = &c->tr->cfg;

	c->async_wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (c->async_wake < 0)
		return -errno;
	c->nworkers = (int)MAX(cfg->workers_per_ctx, 1);
	c->workers = g_new0(rd_worker, c->nworkers);
	for (int i = 0; i < c->nworkers; i++) {
		rd_worker *w = &c->workers[i];
		w->ctx = c;
		w->index = i;
		w->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (w->wake_fd < 0)
			return -errno;
	}
	for (int i = 0; i < c->nworkers; i++)
		c->workers[i].thread = g_thread_new("te-rdma-worker", rd_worker_thread, &c->workers[i]);
	c->async_thread = g_thread_new("te-rdma-async", async_thread, c);
	return 0;
}

void rd_ctx_stop(rd_ctx *c)
{
	uint64_t one = 1;

	if (c->async_thread != NULL) {
		if (write(c->async_wake, &one, sizeof one) < 0)
			RD_LOG(c->tr, TE_LOG_WARN, "%s: cannot wake the async thread", c->name);
		g_thread_join(c->async_thread);
		c->async_thread = NULL;
	}
	for (int i = 0; c->workers && i < c->nworkers; i++) {
		rd_worker *w = &c->workers[i];
		if (w->thread != NULL) {
			if (write(w->wake_fd, &one, sizeof one) < 0)
				RD_LOG(c->tr, TE_LOG_WARN, "%s: cannot wake a worker", c->name);
			g_thread_join(w->thread);
		}
	}
	for (int i = 0; c->workers && i < c->nworkers; i++)
		if (c->workers[i].wake_fd >= 0)
			close(c->workers[i].wake_fd);
	c->nworkers = 0;
	g_free(c->workers);
	c->workers = NULL;
	if (c->async_wake >= 0)
		close(c->async_wake);
	c->async_wake = -1;
}

void rd_ctx_kick(rd_ctx *c)
{
	uint64_t one = 1;

	for (int i = 0; i < c->nworkers; i++) {
		rd_worker *w = &c->workers[i];
		if (atomic_load(&w->sleeping) && write(w->wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
			RD_LOG(c->tr, TE_LOG_WARN, "%s: cannot wake a worker: %s", c->name, g_strerror(errno));
	}
}

void rd_ctx_enqueue(rd_ctx *c, rd_slice *head, rd_slice *tail, bool front)
{
	if (head == NULL)
		return;
	g_mutex_lock(&c->qlock);
	if (front) {
		tail->next = c->qhead;
		c->qhead = head;
		if (c->qtail == NULL)
			c->qtail = tail;
	} else {
		tail->next = NULL;
		if (c->qtail != NULL)
			c->qtail->next = head;
		else
			c->qhead = head;
		c->qtail = tail;
	}
	g_mutex_unlock(&c->qlock);
	rd_ctx_kick(c);
}
