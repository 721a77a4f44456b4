/* SPDX-License-Identifier: Apache-2.0 */
/* Memory registration: a buffer registered with every NIC (in parallel for
 * large ones) and the JSON it contributes to the segment descriptor. */
#include <string.h>

#include "rdma-internal.h"

/* ---------------------------------------------------------------- memory */

static void mr_free(rd_mr *m)
{
	rd_transport *tr = m->tr;

	for (int i = 0; i < tr->nctx; i++)
		if (m->mr[i] != NULL && tr->verbs->dereg_mr(m->mr[i]) != 0)
			RD_LOG(tr, TE_LOG_WARN, "%s: deregistering %p+%zu failed", tr->ctx[i]->name, m->addr,
			       m->length);
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
	int access;
	int dmabuf_fd; /* device memory through a dma-buf, else -1 */
	uint64_t dmabuf_off;
	int err;
} reg_job;

static gpointer reg_one(gpointer data)
{
	reg_job *j = data;
	rd_ctx *c = j->tr->ctx[j->dev];

	errno = 0;
	if (j->dmabuf_fd >= 0)
		j->m->mr[j->dev] = j->tr->verbs->reg_dmabuf_mr(c->pd, j->dmabuf_off, j->m->length,
							       (uintptr_t)j->m->addr, j->dmabuf_fd,
							       j->access);
	else
		j->m->mr[j->dev] = j->tr->verbs->reg_mr(c->pd, j->m->addr, j->m->length, j->access);
	j->err = j->m->mr[j->dev] ? 0 : (errno ? errno : EIO);
	return NULL;
}

/* Device memory: with every NIC through a dma-buf (the way GPUDirect RDMA
 * works on current kernels), else as plain memory (which works where the
 * GPU vendor's peer-memory module is loaded), else -ENOTSUP: the host then
 * stages it through host memory. Logged either way. */
static int reg_device(rd_transport *tr, rd_mr *m, int access, reg_job *jobs)
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
			jobs[i] = (reg_job){ tr, m, i, access, pass == 0 ? fd : -1, off, 0 };
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
			if (m->mr[i] != NULL) {
				tr->verbs->dereg_mr(m->mr[i]);
				m->mr[i] = NULL;
			}
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

char *rd_json_text(JsonNode *root)
{
	JsonGenerator *g = json_generator_new();
	gsize n = 0;
	json_generator_set_root(g, root);
	char *gt = json_generator_to_data(g, &n);
	g_object_unref(g);
	char *out = malloc(n + 1);
	if (out != NULL)
		memcpy(out, gt, n + 1);
	g_free(gt);
	return out;
}

int rd_mem_register(void *ctx, const te_mem_info *mem, char **json)
{
	rd_transport *tr = ctx;
	rd_mr *m;
	int access = IBV_ACCESS_LOCAL_WRITE;
	reg_job jobs[RD_MAX_DEV];
	int rc = 0;

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

	/* Pinning a large region takes long: register it with every NIC at once. */
	bool parallel = tr->nctx > 1 && (tr->cfg.parallel_reg == 1 ||
					 (tr->cfg.parallel_reg == -1 && mem->length >= tr->cfg.parallel_reg_min));
	GThread *th[RD_MAX_DEV] = { 0 };
	if (mem->size > offsetof(te_mem_info, device) && mem->device) {
		m->device = true;
		rc = reg_device(tr, m, access, jobs);
		if (rc < 0) {
			mr_free(m);
			return rc;
		}
		parallel = false;
	}
	for (int i = 0; !m->device && i < tr->nctx; i++) {
		jobs[i] = (reg_job){ tr, m, i, access, -1, 0, 0 };
		if (parallel)
			th[i] = g_thread_new("te-rdma-reg", reg_one, &jobs[i]);
		else
			reg_one(&jobs[i]);
	}
	for (int i = 0; i < tr->nctx; i++) {
		if (th[i] != NULL)
			g_thread_join(th[i]);
		if (jobs[i].err != 0 && rc == 0) {
			RD_LOG(tr, TE_LOG_ERROR, "registering %p+%zu with %s failed: %s", mem->addr, mem->length,
			       tr->ctx[i]->name, g_strerror(jobs[i].err));
			rc = -jobs[i].err;
		}
	}
	if (rc < 0) {
		mr_free(m);
		return rc;
	}
	for (int i = 0; i < tr->nctx; i++) {
		m->lkey[i] = m->mr[i]->lkey;
		m->rkey[i] = m->mr[i]->rkey;
	}

	g_rw_lock_writer_lock(&tr->mr_lock);
	guint pos = 0;
	while (pos < tr->mrs->len && (uintptr_t)((rd_mr *)g_ptr_array_index(tr->mrs, pos))->addr <
					     (uintptr_t)m->addr)
		pos++;
	g_ptr_array_insert(tr->mrs, (gint)pos, m);
	g_rw_lock_writer_unlock(&tr->mr_lock);

	JsonObject *o = json_object_new();
	JsonArray *lk = json_array_new(), *rk = json_array_new();
	for (int i = 0; i < tr->nctx; i++) {
		json_array_add_int_element(lk, m->lkey[i]);
		if (m->remote)
			json_array_add_int_element(rk, m->rkey[i]);
	}
	json_object_set_array_member(o, "lkey", lk);
	json_object_set_string_member(o, "name", m->location);
	json_object_set_array_member(o, "rkey", rk);
	JsonNode *root = json_node_new(JSON_NODE_OBJECT);
	json_node_take_object(root, o);
	*json = rd_json_text(root);
	json_node_unref(root);
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
