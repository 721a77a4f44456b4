/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One device context per selected HCA: protection domain, completion queues
 * and channels, the port's LID/GID/MTU, its worker threads and the thread
 * that reads its asynchronous events. A context whose port goes down or that
 * reports a fatal error is taken out of service (no new slices, its
 * endpoints flushed) and brought back once its port is active again; after
 * a fatal error, on verbs objects made anew (ctx_revive).
 */
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "rdma.h"

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

/* Frees the verbs objects of the context (which may be half built) and
 * closes its device context. */
static void ctx_teardown(rd_ctx *c)
{
	const rv_verbs *v = c->tr->verbs;

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
	c->cqs = NULL;
	c->chans = NULL;
	c->cq_out = NULL;
	c->ncq = c->nchan = 0;
	c->pd = NULL;
	c->vctx = NULL;
}

/* Builds the context's verbs objects on an opened device context `vctx`
 * (owned from here on, closed by ctx_teardown): the device's limits, the
 * port, the GID, the protection domain, the completion channels and
 * queues. The port's attributes in `pa`. */
static int ctx_build(rd_ctx *c, struct ibv_context *vctx, struct ibv_port_attr *pa, GString *err)
{
	rd_transport *tr = c->tr;
	const rv_verbs *v = tr->verbs;
	const rd_config *cfg = &tr->cfg;
	struct ibv_device_attr da;
	GString *why = g_string_new(NULL);
	int rc;

	c->vctx = vctx;
	rc = v->query_device(c->vctx, &da);
	if (rc != 0) {
		g_string_printf(err, "%s: cannot query the device: %s", c->name, g_strerror(rc));
		rc = -rc;
		goto out;
	}
	if (cfg->ib_port < 1 || cfg->ib_port > da.phys_port_cnt) {
		g_string_printf(err, "%s: port %u requested (TE_RDMA_IB_PORT/MC_IB_PORT) but the device "
				     "has %u",
				c->name, cfg->ib_port, da.phys_port_cnt);
		rc = -EINVAL;
		goto out;
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
	rc = v->query_port(c->vctx, c->port, pa);
	if (rc != 0) {
		g_string_printf(err, "%s: cannot query port %u: %s", c->name, c->port, g_strerror(rc));
		rc = -rc;
		goto out;
	}
	c->lid = pa->lid;
	c->link_layer = pa->link_layer;
	c->mtu = MIN(mtu_enum(cfg->mtu), pa->active_mtu ? pa->active_mtu : IBV_MTU_4096);
	uint8_t gid[16];
	int gid_index = -1;
	rc = rd_pick_gid(v, c->vctx, c->port, cfg->gid_index, &gid_index, gid, why);
	if (rc < 0) {
		g_string_printf(err, "%s: %s", c->name, why->str);
		goto out;
	}
	g_mutex_lock(&c->gid_lock);
	memcpy(c->gid, gid, 16);
	c->gid_index = gid_index;
	g_mutex_unlock(&c->gid_lock);
	char gs[48];
	rd_gid_format(gid, gs);
	RD_LOG(tr, TE_LOG_INFO, "%s port %u: %s: %s", c->name, c->port, why->str, gs);

	c->pd = v->alloc_pd(c->vctx);
	if (c->pd == NULL) {
		g_string_printf(err, "%s: cannot allocate a protection domain: %s", c->name, g_strerror(errno));
		rc = -ENOMEM;
		goto out;
	}
	int ncq = (int)MAX(cfg->num_cq_per_ctx, 1);
	int nchan = (int)MIN(MAX(cfg->num_comp_channels, 1), (unsigned)ncq);
	c->chans = g_new0(struct ibv_comp_channel *, nchan);
	c->cqs = g_new0(struct ibv_cq *, ncq);
	c->cq_out = g_new0(atomic_int, ncq);
	c->nchan = nchan;
	c->ncq = ncq;
	for (int i = 0; i < c->nchan; i++) {
		c->chans[i] = v->create_comp_channel(c->vctx);
		if (c->chans[i] == NULL || set_nonblock(c->chans[i]->fd) < 0) {
			g_string_printf(err, "%s: cannot create a completion channel: %s", c->name,
					g_strerror(errno));
			rc = -ENOMEM;
			goto out;
		}
	}
	for (int i = 0; i < c->ncq; i++) {
		int vec = c->vctx->num_comp_vectors > 0 ? i % c->vctx->num_comp_vectors : 0;
		c->cqs[i] = v->create_cq(c->vctx, (int)c->max_cqe, c, c->chans[i % c->nchan], vec);
		if (c->cqs[i] == NULL) {
			g_string_printf(err, "%s: cannot create a completion queue of %u entries: %s", c->name,
					c->max_cqe, g_strerror(errno));
			rc = -ENOMEM;
			goto out;
		}
	}
	if (set_nonblock(c->vctx->async_fd) < 0) {
		g_string_printf(err, "%s: cannot make the async event file non-blocking", c->name);
		rc = -EIO;
		goto out;
	}
	rc = 0;
out:
	g_string_free(why, TRUE);
	return rc;
}

int rd_ctx_open(rd_transport *tr, int index, struct ibv_device *dev, rd_ctx **out, GString *err)
{
	const rv_verbs *v = tr->verbs;
	rd_ctx *c = g_new0(rd_ctx, 1);
	struct ibv_port_attr pa;
	int rc;

	*out = NULL;
	c->tr = tr;
	c->index = index;
	g_strlcpy(c->name, v->get_device_name(dev), sizeof c->name);
	c->guid = v->get_device_guid(dev);
	if (tr->metrics)
		c->mdev = tr->host->metric_device(tr->host, c->name);
	snprintf(c->nic_path, sizeof c->nic_path, "%s@%s", tr->local_name, c->name);
	g_mutex_init(&c->qlock);
	g_mutex_init(&c->ep_lock);
	g_mutex_init(&c->live_lock);
	g_mutex_init(&c->gid_lock);
	g_rw_lock_init(&c->verbs_lock);
	c->eps = g_hash_table_new(g_str_hash, g_str_equal);
	c->async_wake = -1;

	struct ibv_context *vctx = v->open_device(dev);
	if (vctx == NULL) {
		g_string_printf(err, "%s: cannot open the device: %s", c->name, g_strerror(errno));
		rd_ctx_close(c);
		return -ENODEV;
	}
	rc = ctx_build(c, vctx, &pa, err);
	if (rc < 0) {
		rd_ctx_close(c);
		return rc;
	}
	atomic_store(&c->active, pa.state == IBV_PORT_ACTIVE);
	if (pa.state != IBV_PORT_ACTIVE) {
		c->down_since = rd_now_ms();
		RD_LOG(tr, TE_LOG_WARN, "%s port %u is not active: out of service until it is", c->name,
		       c->port);
	}
	*out = c;
	return 0;
}

void rd_ctx_close(rd_ctx *c)
{
	if (c == NULL)
		return;
	rd_ep_pool_clear(c);
	ctx_teardown(c);
	g_hash_table_unref(c->eps);
	g_mutex_clear(&c->qlock);
	g_mutex_clear(&c->ep_lock);
	g_mutex_clear(&c->live_lock);
	g_mutex_clear(&c->gid_lock);
	g_rw_lock_clear(&c->verbs_lock);
	g_free(c);
}

/* ------------------------------------------------------------- service */

/* The descriptor's device part (GID, LID) changed: the host publishes it
 * again, at once or, while it is busy, soon after on a thread of its own. */
static void republish(rd_transport *tr)
{
	int rc = tr->host->republish(tr->host);
	if (rc < 0)
		RD_LOG(tr, TE_LOG_WARN, "publishing the descriptor with the NICs' new addresses failed: %s",
		       rd_strerror(rc));
}

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
		republish(c->tr); /* the descriptor lists each NIC's GID */
	}
	g_string_free(why, TRUE);
	return true;
}

/* ------------------------------------------------- after a fatal error */

static bool ctx_outstanding(rd_ctx *c)
{
	for (int q = 0; q < c->ncq; q++)
		if (atomic_load(&c->cq_out[q]) > 0)
			return true;
	return false;
}

/* Says, at most every 5 s, what a dead device waits for to be opened again. */
static void revive_note(rd_ctx *c, const char *what)
{
	int64_t now = rd_now_ms();

	if (now - c->revive_note_ms < 5000)
		return;
	c->revive_note_ms = now;
	RD_LOG(c->tr, TE_LOG_INFO, "%s: reset, opened again once %s", c->name, what);
}

/* The device, opened anew: NULL while it is not back from its reset. It is
 * looked for by node GUID (by name only when it has none): a reset may
 * re-probe it under another name (mlx5_1 back as mlx5_4), and another
 * adapter may take its old name meanwhile; the GUID is the adapter's. */
static struct ibv_context *open_again(rd_ctx *c)
{
	const rv_verbs *v = c->tr->verbs;
	struct ibv_context *nv = NULL;
	struct ibv_device *dev = NULL;
	int num = 0;
	struct ibv_device **list = v->get_device_list(c->tr->sysfs_root, &num);

	for (int k = 0; list != NULL && k < num && dev == NULL; k++)
		if (c->guid != 0 ? v->get_device_guid(list[k]) == c->guid
				 : strcmp(v->get_device_name(list[k]), c->name) == 0)
			dev = list[k];
	if (dev != NULL) {
		const char *now = v->get_device_name(dev);
		if (strcmp(now, c->name) == 0) {
			c->renamed[0] = '\0';
		} else if (strcmp(now, c->renamed) != 0) {
			g_strlcpy(c->renamed, now, sizeof c->renamed);
			RD_LOG(c->tr, TE_LOG_WARN, "%s: back as %s (node GUID 0x%016" PRIx64 "); it keeps the "
			       "name %s in this engine", c->name, c->renamed, GUINT64_FROM_BE(c->guid), c->name);
		}
		nv = v->open_device(dev);
	}
	if (list != NULL)
		v->free_device_list(list);
	struct ibv_port_attr pa;
	if (nv != NULL && (v->query_port(nv, c->port, &pa) != 0 || pa.state != IBV_PORT_ACTIVE)) {
		v->close_device(nv);
		nv = NULL;
	}
	return nv;
}

static gpointer async_thread(gpointer data);

/* Wakes and joins the context's threads; their wake-up files stay (other
 * threads may ring them meanwhile, rd_ctx_kick). With `halt` the workers
 * stop at once; without, they stop once the transport is stopping and
 * they have drained (rd_ctx_stop). */
static void threads_join(rd_ctx *c, bool halt)
{
	uint64_t one = 1, val;

	atomic_store(&c->halt, halt);
	if (c->async_thread != NULL) {
		if (write(c->async_wake, &one, sizeof one) < 0)
			RD_LOG(c->tr, TE_LOG_WARN, "%s: cannot wake the async thread", c->name);
		g_thread_join(c->async_thread);
		c->async_thread = NULL;
	}
	for (int i = 0; c->workers && i < c->nworkers; i++) {
		rd_worker *w = &c->workers[i];
		if (w->thread == NULL)
			continue;
		if (write(w->wake_fd, &one, sizeof one) < 0)
			RD_LOG(c->tr, TE_LOG_WARN, "%s: cannot wake a worker", c->name);
		g_thread_join(w->thread);
		w->thread = NULL;
	}
	atomic_store(&c->halt, false);
	while (c->async_wake >= 0 && read(c->async_wake, &val, sizeof val) > 0)
		; /* or the next async thread would stop at once */
}

/* Starts the threads not running (all of them at first, or after a halt). */
static void threads_resume(rd_ctx *c)
{
	for (int i = 0; i < c->nworkers; i++)
		if (c->workers[i].thread == NULL)
			c->workers[i].thread = g_thread_new("te-rdma-worker", rd_worker_thread, &c->workers[i]);
	if (c->async_thread == NULL)
		c->async_thread = g_thread_new("te-rdma-async", async_thread, c);
}

/* How long a dead device's in-flight requests may take to be flushed
 * before they are taken back: about the transport timeout of one request
 * (retry_cnt 6 of ~67 ms) with room to spare. */
#define FLUSH_GRACE_MS 2000

/* The requests a dead device holds and will never complete (its provider
 * does not flush them: mlx5 generates flush completions for the kernel's
 * consumers only): with the NIC's workers stopped, each of its posted
 * slices is taken back and sent again by another path. Returns how many. */
static int take_back_posted(rd_ctx *c)
{
	rd_transport *tr = c->tr;
	int n = 0;

	for (uint32_t i = 0; i < tr->nslices; i++) {
		if (atomic_load_explicit(&tr->posted_on[i], memory_order_relaxed) != c->index + 1)
			continue;
		rd_slice *s = &tr->slices[i];
		rd_ep *ep = s->ep;
		te_transfer *t = s->t;
		if (s->opcode == TE_OP_WRITE) /* it may have left: as for a failed completion */
			__atomic_fetch_or(&t->plugin_data[2], (uintptr_t)RD_T_WFAIL, __ATOMIC_SEQ_CST);
		rd_posted_clear(tr, s);
		if (rd_t_expired(t))
			rd_expire_wake(tr);
		atomic_fetch_sub(&ep->depth[s->qp], 1);
		atomic_fetch_sub(&c->cq_out[ep->cq], 1);
		RD_COUNT(tr, c, TE_METRIC_INFLIGHT_BYTES, -(int64_t)s->length);
		RD_COUNT(tr, c, TE_METRIC_ERRORS, 1);
		rd_slice_retry(tr, s, -ENETDOWN, "its NIC died with the request in flight"); /* drops s->ep */
		n++;
	}
	/* Every posted request has its slice marked: nothing is left out. */
	for (int q = 0; q < c->ncq; q++)
		atomic_store(&c->cq_out[q], 0);
	return n;
}

typedef struct fields {
	void *addr;
	char *json;
} fields;

static void fields_free(gpointer p)
{
	fields *f = p;
	free(f->json);
	g_free(f);
}

/*
 * A device that reported a fatal error keeps its context dead for good: its
 * queues, QPs and memory registrations answer nothing, and only a context
 * opened after the device's reset works. So, once the device opens again
 * with its port up and nothing of the dead context is in use (its requests
 * flushed, its endpoints destroyed), every verbs object is made anew: the
 * workers and the event thread stop, every buffer's MR with it is dropped
 * and registered again (new keys), and the descriptor gets the new keys
 * (te_host's buffer_fields). Peers holding the old ones are refused on this
 * NIC, move those requests to another path, and fetch the descriptor again
 * (transfer_stale). Runs on the reclaimer's thread only.
 */
static bool ctx_revive(rd_ctx *c)
{
	rd_transport *tr = c->tr;
	const te_host *h = tr->host;
	struct ibv_port_attr pa;
	GString *err;

	if (ctx_outstanding(c)) {
		if (rd_now_ms() - c->down_since < FLUSH_GRACE_MS)
			return false; /* its provider may still flush them */
		threads_join(c, true);
		int n = take_back_posted(c);
		if (c->vctx != NULL)
			threads_resume(c);
		RD_LOG(tr, TE_LOG_WARN, "%s: %d requests in flight when it died were never flushed; sent "
		       "again by other paths", c->name, n);
	}
	struct ibv_context *nv = open_again(c);
	if (nv == NULL)
		return false; /* not reset yet: its next pass looks again */
	threads_join(c, true);
	rd_ep_pool_clear(c);
	g_rw_lock_writer_lock(&c->verbs_lock);
	if (atomic_load(&c->nep_live) > 0 || ctx_outstanding(c)) {
		g_rw_lock_writer_unlock(&c->verbs_lock);
		tr->verbs->close_device(nv);
		if (c->vctx != NULL)
			threads_resume(c);
		revive_note(c, "its endpoints are gone");
		return false;
	}
	g_mutex_lock(&tr->live_lock);
	GHashTableIter it;
	gpointer key;
	g_hash_table_iter_init(&it, tr->live);
	while (g_hash_table_iter_next(&it, &key, NULL))
		rd_mr_dereg_locked(tr, key, c->index);
	g_mutex_unlock(&tr->live_lock);
	ctx_teardown(c);

	err = g_string_new(NULL);
	int rc = ctx_build(c, nv, &pa, err);
	if (rc < 0) {
		RD_LOG(tr, TE_LOG_ERROR, "%s: opening it again after its fatal error failed: %s", c->name,
		       err->str);
		g_string_free(err, TRUE);
		ctx_teardown(c); /* no threads until a later pass builds it */
		g_rw_lock_writer_unlock(&c->verbs_lock);
		return false;
	}
	g_string_free(err, TRUE);

	int nreg = 0, nfail = 0;
	GPtrArray *pub = g_ptr_array_new_with_free_func(fields_free);
	g_rw_lock_reader_lock(&tr->mr_lock);
	for (guint i = 0; i < tr->mrs->len; i++) {
		rd_mr *m = g_ptr_array_index(tr->mrs, i);
		int r = rd_mr_reg_locked(tr, m, c->index);
		if (r < 0) {
			nfail++;
			RD_LOG(tr, TE_LOG_ERROR, "%s: registering %p+%zu again failed: %s", c->name, m->addr,
			       m->length, g_strerror(-r));
		} else {
			nreg++;
		}
	}
	/* Under mr_lock: a buffer registered meanwhile either is in the table
	 * now (done above) or sees the device back when it is listed. */
	atomic_store(&c->fatal, false);
	for (guint i = 0; i < tr->mrs->len; i++) {
		rd_mr *m = g_ptr_array_index(tr->mrs, i);
		if (!m->remote)
			continue;
		fields *f = g_new0(fields, 1);
		f->addr = m->addr;
		f->json = rd_mr_json(tr, m);
		g_ptr_array_add(pub, f);
	}
	g_rw_lock_reader_unlock(&tr->mr_lock);
	g_rw_lock_writer_unlock(&c->verbs_lock);

	threads_resume(c);
	atomic_fetch_add(&c->revivals, 1);
	RD_LOG(tr, TE_LOG_WARN, "%s: opened again after its fatal error: %d buffers registered anew%s",
	       c->name, nreg, nfail ? " (some failed, see above)" : "");
	rd_ctx_set_active(c, true, "device opened again after a fatal error");
	/* The new keys go to the descriptor (published by the host soon). */
	bool told = TE_HAS_OP(h, buffer_fields);
	for (guint i = 0; told && i < pub->len; i++) {
		fields *f = g_ptr_array_index(pub, i);
		if (f->json == NULL || h->buffer_fields(h, f->addr, f->json) < 0)
			RD_LOG(tr, TE_LOG_DEBUG, "%s: new keys of %p not published (unregistered meanwhile?)",
			       c->name, f->addr);
	}
	if (!told && pub->len > 0)
		RD_LOG(tr, TE_LOG_WARN, "%s: this libte cannot publish the buffers' new keys (plugin ABI "
		       "< 1.8): peers reach them through the other NICs only", c->name);
	g_ptr_array_unref(pub);
	republish(tr); /* its GID and LID may be new too */
	return true;
}

void rd_ctx_check_port(rd_ctx *c)
{
	struct ibv_port_attr pa;

	if (atomic_load(&c->active))
		return;
	if (atomic_load(&c->fatal)) {
		ctx_revive(c);
		return;
	}
	if (c->tr->verbs->query_port(c->vctx, c->port, &pa) == 0 && pa.state == IBV_PORT_ACTIVE &&
	    rd_ctx_refresh_gid(c))
		rd_ctx_set_active(c, true, "port active");
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
		/* A dead context is opened again by the reclaimer, which stops
		 * this thread to do it. */
		if (atomic_load(&c->fatal))
			rd_reclaimer_kick(c->tr);
		else if (ev->element.port_num == c->port)
			rd_ctx_check_port(c);
		break;
	case IBV_EVENT_DEVICE_FATAL:
		atomic_store(&c->fatal, true);
		rd_ctx_set_active(c, false, "device reported a fatal error");
		break;
	case IBV_EVENT_GID_CHANGE:
		if (ev->element.port_num == c->port && !atomic_load(&c->fatal))
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
	threads_resume(c);
	return 0;
}

void rd_ctx_stop(rd_ctx *c)
{
	threads_join(c, false);
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
		TEU_FIFO_APPEND(c->qhead, c->qtail, head, tail);
	}
	g_mutex_unlock(&c->qlock);
	rd_ctx_kick(c);
}
