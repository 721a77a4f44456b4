/* SPDX-License-Identifier: Apache-2.0 */
/* Memory registration: a buffer registered with every NIC (in parallel for
 * large ones) and the JSON it contributes to the segment descriptor. */
#include <string.h>

#include "rdma.h"

/* ---------------------------------------------------------------- memory */

void rd_mr_dereg_locked(rd_transport *tr, rd_mr *m, int dev)
{
	if (m->mr[dev] != NULL && tr->verbs->dereg_mr(m->mr[dev]) != 0)
		RD_LOG(tr, TE_LOG_WARN, "%s: deregistering %p+%zu failed", tr->ctx[dev]->name, m->addr,
		       m->length);
	m->mr[dev] = NULL;
	atomic_store(&m->lkey[dev], 0);
	atomic_store(&m->rkey[dev], 0);
}

static void mr_free(rd_mr *m)
{
	rd_transport *tr = m->tr;

	/* Deregistered before it leaves the live set: a device being opened
	 * again meanwhile finds it there, and takes its MR itself. */
	for (int i = 0; i < tr->nctx; i++) {
		g_rw_lock_reader_lock(&tr->ctx[i]->verbs_lock);
		rd_mr_dereg_locked(tr, m, i);
		g_rw_lock_reader_unlock(&tr->ctx[i]->verbs_lock);
	}
	g_mutex_lock(&tr->live_lock);
	g_hash_table_remove(tr->live, m);
	g_mutex_unlock(&tr->live_lock);
	g_free(m->location);
	g_free(m);
}

void rd_mr_unref(rd_mr *m)
{
	if (atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) == 1)
		mr_free(m);
}

typedef struct reg_job {
	rd_transport *tr;
	rd_mr *m;
	int dev;
	int dmabuf_fd; /* device memory through a dma-buf, else -1 */
	uint64_t dmabuf_off;
	int err;
	bool skipped;  /* the device is out of service (fatal): registered when it returns */
} reg_job;

static struct ibv_mr *reg_verbs(rd_transport *tr, rd_mr *m, int dev, int dmabuf_fd, uint64_t off)
{
	rd_ctx *c = tr->ctx[dev];

	errno = 0;
	if (dmabuf_fd >= 0)
		return tr->verbs->reg_dmabuf_mr(c->pd, off, m->length, (uintptr_t)m->addr, dmabuf_fd,
						m->access);
	return tr->verbs->reg_mr(c->pd, m->addr, m->length, m->access);
}

static void keys_set(rd_mr *m, int dev)
{
	atomic_store(&m->lkey[dev], m->mr[dev]->lkey);
	atomic_store(&m->rkey[dev], m->mr[dev]->rkey);
}

static gpointer reg_one(gpointer data)
{
	reg_job *j = data;
	rd_ctx *c = j->tr->ctx[j->dev];

	j->err = 0;
	j->skipped = false;
	g_rw_lock_reader_lock(&c->verbs_lock);
	if (j->m->mr[j->dev] == NULL && atomic_load(&c->fatal)) {
		j->skipped = true; /* its context is dead: nothing to register with */
	} else if (j->m->mr[j->dev] == NULL) {
		j->m->mr[j->dev] = reg_verbs(j->tr, j->m, j->dev, j->dmabuf_fd, j->dmabuf_off);
		if (j->m->mr[j->dev] != NULL)
			keys_set(j->m, j->dev);
		else if (atomic_load(&c->fatal))
			j->skipped = true; /* died under us */
		else
			j->err = errno ? errno : EIO;
	}
	g_rw_lock_reader_unlock(&c->verbs_lock);
	return NULL;
}

static void dereg_one(rd_transport *tr, rd_mr *m, int dev)
{
	g_rw_lock_reader_lock(&tr->ctx[dev]->verbs_lock);
	rd_mr_dereg_locked(tr, m, dev);
	g_rw_lock_reader_unlock(&tr->ctx[dev]->verbs_lock);
}

/* Device memory: with every NIC through a dma-buf (the way GPUDirect RDMA
 * works on current kernels), else as plain memory (which works where the
 * GPU vendor's peer-memory module is loaded), else -ENOTSUP: the host then
 * stages it through host memory. Logged either way. */
static int reg_device(rd_transport *tr, rd_mr *m, reg_job *jobs)
{
	const te_host *h = tr->host;
	int fd = -1;
	uint64_t off = 0;
	int rc = TE_HAS_OP(h, device_dmabuf) ? h->device_dmabuf(h, m->addr, m->length, &fd, &off)
					     : -ENOTSUP;
	const char *how = "dma-buf";

	for (int pass = rc == 0 ? 0 : 1; pass < 2; pass++) {
		int failed = 0;
		for (int i = 0; i < tr->nctx; i++) {
			jobs[i] = (reg_job){ tr, m, i, pass == 0 ? fd : -1, off, 0, false };
			reg_one(&jobs[i]);
			failed |= jobs[i].err != 0;
		}
		if (!failed) {
			if (fd >= 0)
				close(fd);
			RD_LOG(tr, TE_LOG_INFO, "%s memory at %p+%zu: GPUDirect RDMA (%s)", m->location,
			       m->addr, m->length, pass == 0 ? how : "peer memory");
			return 0;
		}
		for (int i = 0; i < tr->nctx; i++)
			dereg_one(tr, m, i);
		if (pass == 0)
			RD_LOG(tr, TE_LOG_INFO, "%s memory at %p: no dma-buf registration: %s",
			       m->location, m->addr, g_strerror(jobs[0].err ? jobs[0].err : EIO));
	}
	if (fd >= 0)
		close(fd);
	RD_LOG(tr, TE_LOG_INFO, "%s memory at %p+%zu: no GPUDirect RDMA here (%s); staged through "
	       "host memory", m->location, m->addr, m->length,
	       rc == 0 ? "the NICs refused it" : "the device offers no dma-buf, and plain "
						   "registration failed");
	return -ENOTSUP;
}

int rd_mr_reg_locked(rd_transport *tr, rd_mr *m, int dev)
{
	const te_host *h = tr->host;
	int fd = -1;
	uint64_t off = 0;

	if (m->mr[dev] != NULL)
		return 0;
	/* Device memory the way it was registered first: a dma-buf where the
	 * device plugin gives one, else plain. */
	if (m->device && TE_HAS_OP(h, device_dmabuf) &&
	    h->device_dmabuf(h, m->addr, m->length, &fd, &off) == 0) {
		m->mr[dev] = reg_verbs(tr, m, dev, fd, off);
		close(fd);
	}
	if (m->mr[dev] == NULL)
		m->mr[dev] = reg_verbs(tr, m, dev, -1, 0);
	if (m->mr[dev] == NULL)
		return -(errno ? errno : EIO);
	keys_set(m, dev);
	return 0;
}

char *rd_mr_json(rd_transport *tr, rd_mr *m)
{
	JsonObject *o = json_object_new();
	JsonArray *lk = json_array_new(), *rk = json_array_new();

	for (int i = 0; i < tr->nctx; i++) {
		json_array_add_int_element(lk, atomic_load(&m->lkey[i]));
		if (m->remote)
			json_array_add_int_element(rk, atomic_load(&m->rkey[i]));
	}
	json_object_set_array_member(o, "lkey", lk);
	json_object_set_string_member(o, "name", m->location);
	json_object_set_array_member(o, "rkey", rk);
	JsonNode *root = json_node_new(JSON_NODE_OBJECT);
	json_node_take_object(root, o);
	char *text = teu_json_text(root, NULL);
	json_node_unref(root);
	return text;
}

int rd_mem_register(void *ctx, const te_mem_info *mem, char **json)
{
	rd_transport *tr = ctx;
	rd_mr *m;
	int access = IBV_ACCESS_LOCAL_WRITE;
	reg_job jobs[RD_MAX_DEV];
	bool late[RD_MAX_DEV] = { false };
	int rc = 0, skipped = 0;

	*json = NULL;
	if (mem == NULL || mem->addr == NULL || mem->length == 0) {
		RD_LOG(tr, TE_LOG_ERROR, "mem_register: empty region");
		return -EINVAL;
	}
	m = g_new0(rd_mr, 1);
	m->tr = tr;
	m->addr = mem->addr;
	m->length = mem->length;
	m->location = g_strdup(mem->location ? mem->location : "cpu:0");
	m->remote = (mem->flags & TE_MEM_REMOTE_ACCESS) != 0;
	atomic_init(&m->refs, 1);
	if (m->remote)
		access |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
	/* An optional flag: libibverbs drops it where the device lacks it. */
	if (tr->cfg.relaxed_ordering)
		access |= IBV_ACCESS_RELAXED_ORDERING;
	m->access = access;
	g_mutex_lock(&tr->live_lock);
	g_hash_table_add(tr->live, m);
	g_mutex_unlock(&tr->live_lock);

	/* Pinning a large region takes long: register it with every NIC at once. */
	bool parallel = tr->nctx > 1 && (tr->cfg.parallel_reg == 1 ||
					 (tr->cfg.parallel_reg == -1 && mem->length >= tr->cfg.parallel_reg_min));
	GThread *th[RD_MAX_DEV] = { 0 };
	if (mem->size > offsetof(te_mem_info, device) && mem->device) {
		m->device = true;
		rc = reg_device(tr, m, jobs);
		if (rc < 0) {
			mr_free(m);
			return rc;
		}
		parallel = false;
	}
	for (int i = 0; !m->device && i < tr->nctx; i++) {
		jobs[i] = (reg_job){ tr, m, i, -1, 0, 0, false };
		if (parallel)
			th[i] = g_thread_new("te-rdma-reg", reg_one, &jobs[i]);
		else
			reg_one(&jobs[i]);
	}
	for (int i = 0; i < tr->nctx; i++) {
		if (th[i] != NULL)
			g_thread_join(th[i]);
		skipped += jobs[i].skipped;
		if (jobs[i].err != 0 && rc == 0) {
			RD_LOG(tr, TE_LOG_ERROR, "registering %p+%zu with %s failed: %s", mem->addr, mem->length,
			       tr->ctx[i]->name, g_strerror(jobs[i].err));
			rc = -jobs[i].err;
		}
	}
	if (rc == 0 && skipped == tr->nctx) {
		RD_LOG(tr, TE_LOG_ERROR, "registering %p+%zu: every RDMA device is out of service after a "
		       "fatal error", mem->addr, mem->length);
		rc = -ENODEV;
	}
	if (rc < 0) {
		mr_free(m);
		return rc;
	}

	g_rw_lock_writer_lock(&tr->mr_lock);
	guint pos = 0;
	while (pos < tr->mrs->len && (uintptr_t)((rd_mr *)g_ptr_array_index(tr->mrs, pos))->addr <
					     (uintptr_t)m->addr)
		pos++;
	g_ptr_array_insert(tr->mrs, (gint)pos, m);
	m->listed = true;
	/* A device skipped above (dead of a fatal error) that came back before
	 * the buffer was listed did not see it: registered here. One that
	 * comes back later registers every listed buffer itself. */
	for (int i = 0; i < tr->nctx; i++)
		late[i] = jobs[i].skipped && !atomic_load(&tr->ctx[i]->fatal);
	g_rw_lock_writer_unlock(&tr->mr_lock);
	for (int i = 0; i < tr->nctx; i++) {
		if (!late[i])
			continue;
		rd_ctx *c = tr->ctx[i];
		g_rw_lock_reader_lock(&c->verbs_lock);
		int r = atomic_load(&c->fatal) ? 0 : rd_mr_reg_locked(tr, m, i);
		g_rw_lock_reader_unlock(&c->verbs_lock);
		if (r < 0)
			RD_LOG(tr, TE_LOG_WARN, "registering %p+%zu with %s, back in service, failed: %s",
			       mem->addr, mem->length, c->name, g_strerror(-r));
	}
	if (skipped > 0)
		RD_LOG(tr, TE_LOG_WARN, "%p+%zu registered without %d device(s) out of service after a "
		       "fatal error; registered with them when they come back", mem->addr, mem->length,
		       skipped);
	*json = rd_mr_json(tr, m);
	return *json ? 0 : -ENOMEM;
}

int rd_mem_unregister(void *ctx, void *addr, size_t length)
{
	rd_transport *tr = ctx;
	rd_mr *m = NULL;

	(void)length;
	g_rw_lock_writer_lock(&tr->mr_lock);
	for (guint i = 0; i < tr->mrs->len; i++) {
		rd_mr *x = g_ptr_array_index(tr->mrs, i);
		if (x->addr == addr) {
			m = x;
			m->listed = false;
			g_ptr_array_remove_index(tr->mrs, i);
			break;
		}
	}
	g_rw_lock_writer_unlock(&tr->mr_lock);
	if (m == NULL) {
		RD_LOG(tr, TE_LOG_WARN, "mem_unregister: %p is not registered with RDMA", addr);
		return -ENOENT;
	}
	rd_mr_unref(m); /* slices still using it keep it registered */
	return 0;
}
