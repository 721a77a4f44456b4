/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The software verbs layer: RDMA devices emulated in-process, faithful enough
 * that the plugin's verbs code runs unmodified on it. Linked only into the
 * tests' copy of the plugin (soft-provider.c picks it there); these machines
 * have no RDMA NIC and no kernel RDMA.
 *
 * What it emulates, and how a real HCA would behave:
 *  - Devices are the entries of <root>/sys/class/infiniband (a fixture tree);
 *    ports, LIDs, link layers and GID tables (with their types and network
 *    devices) are read from the same tree, as libibverbs reads sysfs.
 *  - RC queue pairs between any soft devices of the process: a QP moves
 *    RESET -> INIT -> RTR -> RTS with the attribute masks hardware demands;
 *    RDMA READ/WRITE are a memcpy between two memory regions, after the lkey,
 *    rkey, protection domain, bounds and access rights were checked the way a
 *    responder checks them. A bad key is an error completion, never a crash.
 *  - Errors move the QP to ERR; its outstanding and later work requests are
 *    flushed with IBV_WC_WR_FLUSH_ERR. A remote access error also moves the
 *    responder's QP to ERR. A request towards a down port, a missing or
 *    unconnected QP, or a GID the peer device does not own is lost like a
 *    packet and completes with IBV_WC_RETRY_EXC_ERR.
 *  - A fatal device error kills every context then open: their queued
 *    requests are flushed, every later verb but the tear-down ones fails
 *    with EIO, their keys and QPs answer no peer, and the device opens
 *    anew only once it is reset (its link set up again).
 *  - Each device has a thread that executes work requests one at a time per
 *    QP (round robin), so completions arrive asynchronously; completion
 *    channels and the async event queue are eventfds that poll() like the
 *    kernel's files, and honour O_NONBLOCK.
 *  - Injected latency stands for a peer that answers late: the request
 *    waits before it runs, and a QP moved to ERR meanwhile ends the wait
 *    and flushes the request without moving a byte, as a NIC drops the
 *    late answer of a request it flushed. A flush delay holds back each
 *    flush completion (a NIC slow to flush; nothing moves meanwhile).
 *
 * Tests steer link state, failures and latency through the te_rdma_soft_*
 * functions (rdma-test.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <glib.h>

#include "rdma.h"
#include "rdma-test.h"
#include "soft-verbs.h"

#define SOFT_EXPORT __attribute__((visibility("default")))
#define SOFT_MAX_PORTS 4
#define SOFT_MAX_GID 16
#define SOFT_MAX_SGE 4
#define SOFT_MAX_INLINE 256
#define SOFT_MAX_QP_WR 16384
#define SOFT_MAX_CQE (1 << 22)
/* READs in flight per QP: fewer than the 16 most NICs track, so a plugin
 * that ignores the announced limit is refused here as by such hardware. */
#define SOFT_MAX_RD_ATOM 8

typedef struct soft_port {
	bool up;
	uint16_t lid;
	uint8_t link_layer;
	int ngid;
	union ibv_gid gid[SOFT_MAX_GID];
	uint32_t gid_type[SOFT_MAX_GID];
	uint32_t gid_ndev[SOFT_MAX_GID]; /* 0: no network device */
} soft_port;

typedef struct soft_qp soft_qp;

typedef struct soft_dev {
	struct ibv_device ibdev;
	char *key; /* root|name, the name in the sysfs tree */
	/* The name it lists under: the sysfs one until te_rdma_soft_rename().
	 * An interned string, so readers need no lock. */
	const char *_Atomic shown;
	uint64_t guid; /* node GUID, host order */
	int nports;
	soft_port port[SOFT_MAX_PORTS];
	bool fatal;

	GMutex lock; /* port state, run queue, contexts */
	GCond cond;
	GThread *thread;
	bool stop;
	int nctx;
	GList *contexts;
	GQueue runq;       /* soft_qp* with work queued */
	soft_qp *busy;     /* the QP whose request is executing */
	soft_qp *aside;    /* a QP flushed while `busy` waits out its latency */
	atomic_uint latency_us;
	atomic_uint flush_delay_us; /* before each flush completion */
	int fail_next;
	int fail_status;

	atomic_ullong wrs, bytes, errors, flushed, rx_wrs;
	atomic_ullong mrs_relaxed;  /* MRs registered with relaxed ordering */
	atomic_int last_tc;         /* GRH traffic class of the last QP moved to RTR, -1 before */
	atomic_int last_retry_cnt;  /* retry_cnt of the last QP moved to RTS, -1 before */
} soft_dev;

typedef struct soft_ctx {
	struct ibv_context ctx;
	soft_dev *dev;
	GMutex lock;
	GQueue events; /* struct ibv_async_event* */
	atomic_int npd; /* read by close_device() without the lock, as nqp is */
	/* Opened before the device's last fatal error: like hardware's, it
	 * stays dead after the device is reset (only tearing down works), and
	 * the device serves only contexts opened anew. */
	atomic_bool dead;
	atomic_bool silent; /* dead without flushing: its requests never complete */
} soft_ctx;

static bool ctx_dead(struct ibv_context *ctx)
{
	return atomic_load(&((soft_ctx *)ctx)->dead);
}

/* For a call that makes an object on ctx: whether ctx is dead, with errno
 * set to EIO then (what such a call returns on a dead device). */
static bool ctx_refuses(struct ibv_context *ctx)
{
	if (!ctx_dead(ctx))
		return false;
	errno = EIO;
	return true;
}

typedef struct soft_pd {
	struct ibv_pd pd;
	atomic_int users; /* MRs and QPs */
} soft_pd;

typedef struct soft_mr {
	struct ibv_mr mr;
	int access;
	/* A dma-buf region: the "NIC" reaches its bytes through this mapping
	 * of the dma-buf (at `view`, `map_len` bytes from `map`), never through
	 * the registered addresses, which the CPU may not be able to touch. */
	void *map;
	size_t map_len;
	uint8_t *view;
} soft_mr;

/* Where the "NIC" reads and writes `addr` of region `mr`. */
static inline uint8_t *mr_bytes(const soft_mr *mr, uint64_t addr)
{
	if (mr->view != NULL)
		return mr->view + (addr - (uintptr_t)mr->mr.addr);
	return (uint8_t *)(uintptr_t)addr;
}

typedef struct soft_channel {
	struct ibv_comp_channel ch;
	GMutex lock;
	GQueue cqs; /* soft_cq* with an event pending */
	atomic_int ncq; /* read by destroy_comp_channel() without the lock */
} soft_channel;

typedef struct soft_cq {
	struct ibv_cq cq;
	GMutex lock;
	struct ibv_wc *ring;
	int cap, head, count;
	bool armed;
	atomic_uint events_got, events_acked;
	atomic_int nqp;
} soft_cq;

typedef struct soft_wr {
	uint64_t wr_id;
	int opcode;
	unsigned flags;
	int num_sge;
	struct ibv_sge sge[SOFT_MAX_SGE];
	uint64_t remote_addr;
	uint32_t rkey;
	uint32_t inline_len;
} soft_wr;

struct soft_qp {
	struct ibv_qp qp;
	soft_dev *dev;
	GMutex lock;
	enum ibv_qp_state state;
	soft_wr *sq;
	uint8_t *inline_buf; /* cap * max_inline bytes */
	int cap, head, count;
	uint32_t max_inline;
	uint32_t max_sge;
	int access;
	uint8_t port;
	uint32_t dest_qpn;
	bool is_global;
	union ibv_gid dgid;
	uint16_t dlid;
	uint8_t sgid_index;
	bool queued;
	bool destroyed;
	/* In the error state: ends a request's injected latency at once (the
	 * device signals d->cond when it is set). */
	atomic_bool in_error;
};

static GMutex soft_lock; /* the device list */
static GPtrArray *soft_devs;
static GRWLock tables; /* the key and QP number tables, read while copying */
static GHashTable *mr_by_key;
static GHashTable *qp_by_num;
static uint32_t next_key = 0x1100;
static uint32_t next_qpn = 0x140;

static void tables_init(void)
{
	static gsize once;
	if (g_once_init_enter(&once)) {
		mr_by_key = g_hash_table_new(g_direct_hash, g_direct_equal);
		qp_by_num = g_hash_table_new(g_direct_hash, g_direct_equal);
		soft_devs = g_ptr_array_new();
		g_once_init_leave(&once, 1);
	}
}

/* ------------------------------------------------------------- fixtures */

static bool read_linef(char *buf, size_t size, const char *fmt, ...) G_GNUC_PRINTF(3, 4);

static bool read_linef(char *buf, size_t size, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *path = g_strdup_vprintf(fmt, ap);
	va_end(ap);
	bool ok = rd_read_line(path, buf, size);
	g_free(path);
	return ok;
}

/* "fe80:0000:0000:0000:0202:c9ff:fe00:0001" (sysfs's format) */
static bool parse_gid(const char *s, union ibv_gid *gid)
{
	unsigned v[8];
	if (sscanf(s, "%4x:%4x:%4x:%4x:%4x:%4x:%4x:%4x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
		   &v[6], &v[7]) != 8)
		return false;
	for (int i = 0; i < 8; i++) {
		gid->raw[2 * i] = (uint8_t)(v[i] >> 8);
		gid->raw[2 * i + 1] = (uint8_t)v[i];
	}
	return true;
}

static void load_port(soft_dev *d, const char *dir, int p)
{
	soft_port *port = &d->port[p - 1];
	char line[256];

	port->up = true;
	port->link_layer = IBV_LINK_LAYER_ETHERNET;
	if (read_linef(line, sizeof line, "%s/ports/%d/state", dir, p))
		port->up = strstr(line, "ACTIVE") != NULL;
	if (read_linef(line, sizeof line, "%s/ports/%d/link_layer", dir, p) &&
	    strstr(line, "InfiniBand") != NULL)
		port->link_layer = IBV_LINK_LAYER_INFINIBAND;
	if (read_linef(line, sizeof line, "%s/ports/%d/lid", dir, p))
		port->lid = (uint16_t)strtoul(line, NULL, 0);
	for (int i = 0; i < SOFT_MAX_GID; i++) {
		if (!read_linef(line, sizeof line, "%s/ports/%d/gids/%d", dir, p, i) ||
		    !parse_gid(line, &port->gid[i]))
			break;
		port->ngid = i + 1;
		port->gid_type[i] = port->link_layer == IBV_LINK_LAYER_INFINIBAND ? IBV_GID_TYPE_IB
										    : IBV_GID_TYPE_ROCE_V1;
		if (read_linef(line, sizeof line, "%s/ports/%d/gid_attrs/types/%d", dir, p, i) &&
		    strstr(line, "v2") != NULL)
			port->gid_type[i] = IBV_GID_TYPE_ROCE_V2;
		if (read_linef(line, sizeof line, "%s/ports/%d/gid_attrs/ndevs/%d", dir, p, i) &&
		    line[0] != '\0')
			port->gid_ndev[i] = g_str_hash(line) % 1000 + 2; /* an ifindex */
	}
	if (port->ngid == 0) {
		/* No table in the fixture: one link-local GID derived from the name. */
		guint h = g_str_hash(d->ibdev.name) ^ (guint)p;
		port->ngid = 1;
		port->gid[0].raw[0] = 0xfe;
		port->gid[0].raw[1] = 0x80;
		memcpy(&port->gid[0].raw[12], &h, 4);
		port->gid_type[0] = port->link_layer == IBV_LINK_LAYER_INFINIBAND ? IBV_GID_TYPE_IB
										     : IBV_GID_TYPE_ROCE_V2;
		port->gid_ndev[0] = port->link_layer == IBV_LINK_LAYER_INFINIBAND ? 0 : 1;
	}
}

/* The fixture's node_guid ("xxxx:xxxx:xxxx:xxxx", as sysfs has it), or
 * one made from the device's key. */
static uint64_t read_guid(const char *dir, const char *key)
{
	char line[64];
	unsigned w[4];
	int n = 0;

	if (read_linef(line, sizeof line, "%s/node_guid", dir) &&
	    sscanf(line, "%4x:%4x:%4x:%4x%n", &w[0], &w[1], &w[2], &w[3], &n) == 4 && line[n] == '\0')
		return (uint64_t)w[0] << 48 | (uint64_t)w[1] << 32 | (uint64_t)w[2] << 16 | w[3];
	return 0x0002c90300000000ull | g_str_hash(key);
}

static soft_dev *dev_get(const char *root, const char *name)
{
	char *key = g_strdup_printf("%s|%s", root, name);
	char dir[PATH_MAX];
	soft_dev *d;

	for (guint i = 0; i < soft_devs->len; i++) {
		d = g_ptr_array_index(soft_devs, i);
		if (strcmp(d->key, key) == 0) {
			g_free(key);
			return d;
		}
	}
	d = g_new0(soft_dev, 1);
	d->key = key;
	d->ibdev.node_type = IBV_NODE_CA;
	d->ibdev.transport_type = IBV_TRANSPORT_IB;
	g_strlcpy(d->ibdev.name, name, sizeof d->ibdev.name);
	atomic_init(&d->shown, g_intern_string(name));
	g_strlcpy(d->ibdev.dev_name, name, sizeof d->ibdev.dev_name);
	snprintf(dir, sizeof dir, "%s/sys/class/infiniband/%s", root, name);
	g_strlcpy(d->ibdev.ibdev_path, dir, sizeof d->ibdev.ibdev_path);
	d->guid = read_guid(dir, key);
	g_mutex_init(&d->lock);
	g_cond_init(&d->cond);
	g_queue_init(&d->runq);
	d->nports = 0;
	atomic_init(&d->last_tc, -1);
	atomic_init(&d->last_retry_cnt, -1);
	for (int p = 1; p <= SOFT_MAX_PORTS; p++) {
		char *pd = g_strdup_printf("%s/ports/%d", dir, p);
		bool exists = g_file_test(pd, G_FILE_TEST_IS_DIR);
		g_free(pd);
		if (!exists && p > 1)
			break;
		load_port(d, dir, p);
		d->nports = p;
	}
	g_ptr_array_add(soft_devs, d);
	return d;
}

static soft_dev *dev_of(struct ibv_device *ibdev)
{
	return (soft_dev *)ibdev; /* ibdev is the first member */
}

/* ------------------------------------------------------------- devices */

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static struct ibv_device **sv_get_device_list(const char *root, int *num)
{
	char dir[PATH_MAX];
	GPtrArray *names = g_ptr_array_new_with_free_func(g_free);
	struct ibv_device **list;
	DIR *dp;
	struct dirent *ent;

	tables_init();
	if (root == NULL || *root == '\0')
		root = "/";
	snprintf(dir, sizeof dir, "%s/sys/class/infiniband", root);
	dp = opendir(dir);
	if (dp != NULL) {
		while ((ent = readdir(dp)) != NULL)
			if (ent->d_name[0] != '.' && strlen(ent->d_name) < IBV_SYSFS_NAME_MAX)
				g_ptr_array_add(names, g_strdup(ent->d_name));
		closedir(dp);
	}
	if (names->len > 1)
		qsort(names->pdata, names->len, sizeof(char *), cmp_name);
	list = calloc(names->len + 1, sizeof *list);
	if (list == NULL) {
		g_ptr_array_unref(names);
		errno = ENOMEM;
		return NULL;
	}
	g_mutex_lock(&soft_lock);
	for (guint i = 0; i < names->len; i++)
		list[i] = &dev_get(root, g_ptr_array_index(names, i))->ibdev;
	g_mutex_unlock(&soft_lock);
	if (num != NULL)
		*num = (int)names->len;
	g_ptr_array_unref(names);
	return list;
}

static void sv_free_device_list(struct ibv_device **list)
{
	free(list);
}

static const char *sv_get_device_name(struct ibv_device *dev)
{
	return dev ? atomic_load(&dev_of(dev)->shown) : NULL;
}

static uint64_t sv_get_device_guid(struct ibv_device *dev)
{
	return dev ? GUINT64_TO_BE(dev_of(dev)->guid) : 0;
}

static gpointer dev_thread(gpointer data);

static void push_event(soft_ctx *c, enum ibv_event_type type, void *element, int port)
{
	struct ibv_async_event *ev = g_new0(struct ibv_async_event, 1);
	uint64_t one = 1;

	ev->event_type = type;
	if (type == IBV_EVENT_PORT_ACTIVE || type == IBV_EVENT_PORT_ERR || type == IBV_EVENT_GID_CHANGE)
		ev->element.port_num = port;
	else if (type == IBV_EVENT_CQ_ERR)
		ev->element.cq = element;
	else if (type == IBV_EVENT_QP_FATAL)
		ev->element.qp = element;
	g_mutex_lock(&c->lock);
	g_queue_push_tail(&c->events, ev);
	g_mutex_unlock(&c->lock);
	if (write(c->ctx.async_fd, &one, sizeof one) < 0)
		g_warning("soft verbs: cannot signal an async event: %s", g_strerror(errno));
}

static struct ibv_context *sv_open_device(struct ibv_device *ibdev)
{
	soft_dev *d = dev_of(ibdev);
	soft_ctx *c;

	g_mutex_lock(&d->lock);
	bool fatal = d->fatal;
	g_mutex_unlock(&d->lock);
	if (fatal) { /* not reset yet */
		errno = EIO;
		return NULL;
	}
	c = g_new0(soft_ctx, 1);

	c->ctx.device = ibdev;
	c->ctx.cmd_fd = -1;
	c->ctx.num_comp_vectors = 4;
	/* Blocking like the kernel's file unless the user sets O_NONBLOCK. */
	c->ctx.async_fd = eventfd(0, EFD_SEMAPHORE | EFD_CLOEXEC);
	if (c->ctx.async_fd < 0) {
		g_free(c);
		return NULL;
	}
	c->dev = d;
	g_mutex_init(&c->lock);
	g_queue_init(&c->events);
	g_mutex_lock(&d->lock);
	d->contexts = g_list_prepend(d->contexts, c);
	if (d->nctx++ == 0) {
		d->stop = false;
		d->thread = g_thread_new("soft-hca", dev_thread, d);
	}
	g_mutex_unlock(&d->lock);
	return &c->ctx;
}

static int sv_close_device(struct ibv_context *ctx)
{
	soft_ctx *c = (soft_ctx *)ctx;
	soft_dev *d = c->dev;
	GThread *join = NULL;

	if (atomic_load(&c->npd) > 0)
		return EBUSY;
	g_mutex_lock(&d->lock);
	d->contexts = g_list_remove(d->contexts, c);
	if (--d->nctx == 0) {
		d->stop = true;
		g_cond_broadcast(&d->cond);
		join = d->thread;
		d->thread = NULL;
	}
	g_mutex_unlock(&d->lock);
	if (join != NULL)
		g_thread_join(join);
	close(c->ctx.async_fd);
	g_queue_clear_full(&c->events, g_free);
	g_mutex_clear(&c->lock);
	g_free(c);
	return 0;
}

static int sv_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr)
{
	soft_ctx *c = (soft_ctx *)ctx;

	if (ctx_dead(ctx))
		return EIO;
	memset(attr, 0, sizeof *attr);
	g_strlcpy(attr->fw_ver, "soft-1.0", sizeof attr->fw_ver);
	attr->max_mr_size = UINT64_MAX;
	attr->page_size_cap = 0xfffff000;
	attr->vendor_id = 0x02c9;
	attr->max_qp = 1 << 17;
	attr->max_qp_wr = SOFT_MAX_QP_WR;
	attr->max_sge = SOFT_MAX_SGE;
	attr->max_cq = 1 << 16;
	attr->max_cqe = SOFT_MAX_CQE;
	attr->max_mr = 1 << 20;
	attr->max_pd = 1 << 16;
	attr->max_qp_rd_atom = SOFT_MAX_RD_ATOM;
	attr->max_qp_init_rd_atom = SOFT_MAX_RD_ATOM;
	attr->phys_port_cnt = (uint8_t)c->dev->nports;
	return 0;
}

static int sv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	soft_dev *d = ((soft_ctx *)ctx)->dev;

	if (port < 1 || port > d->nports)
		return EINVAL;
	memset(attr, 0, sizeof *attr);
	g_mutex_lock(&d->lock);
	/* A device that reported a fatal error answers no query until it is
	 * reset (here: its link set again), as mlx5 does; answering "active"
	 * let the plugin's port check put it back in service at once. A
	 * context opened before the error never answers again. */
	if (d->fatal || ctx_dead(ctx)) {
		g_mutex_unlock(&d->lock);
		return EIO;
	}
	soft_port *p = &d->port[port - 1];
	attr->state = p->up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
	attr->phys_state = p->up ? 5 : 3; /* LinkUp, Disabled */
	attr->lid = p->lid;
	attr->link_layer = p->link_layer;
	attr->gid_tbl_len = SOFT_MAX_GID;
	g_mutex_unlock(&d->lock);
	attr->max_mtu = IBV_MTU_4096;
	attr->active_mtu = IBV_MTU_4096;
	attr->max_msg_sz = 1u << 31;
	attr->pkey_tbl_len = 1;
	attr->active_width = 2;
	attr->active_speed = 32;
	return 0;
}

static int sv_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
			   struct ibv_gid_entry *entry)
{
	soft_dev *d = ((soft_ctx *)ctx)->dev;

	if (port < 1 || port > (uint32_t)d->nports || index >= SOFT_MAX_GID)
		return EINVAL;
	soft_port *p = &d->port[port - 1];
	if ((int)index >= p->ngid)
		return ENODATA; /* an empty table entry, as rdma-core reports it */
	memset(entry, 0, sizeof *entry);
	g_mutex_lock(&d->lock);
	entry->gid = p->gid[index];
	g_mutex_unlock(&d->lock);
	entry->gid_index = index;
	entry->port_num = port;
	entry->gid_type = p->gid_type[index];
	entry->ndev_ifindex = p->gid_ndev[index];
	return 0;
}

/* -------------------------------------------------------------- PD / MR */

static struct ibv_pd *sv_alloc_pd(struct ibv_context *ctx)
{
	soft_ctx *c = (soft_ctx *)ctx;
	soft_pd *pd;

	if (ctx_refuses(ctx))
		return NULL;
	pd = g_new0(soft_pd, 1);
	pd->pd.context = ctx;
	atomic_fetch_add(&c->npd, 1);
	return &pd->pd;
}

static int sv_dealloc_pd(struct ibv_pd *ibpd)
{
	soft_pd *pd = (soft_pd *)ibpd;
	soft_ctx *c = (soft_ctx *)ibpd->context;

	if (atomic_load(&pd->users) > 0)
		return EBUSY;
	atomic_fetch_sub(&c->npd, 1);
	g_free(pd);
	return 0;
}

/* Pinning fails for memory the process cannot read (a GPU's memory without
 * the vendor's peer-memory module): tried on the first and last byte. */
static bool pinnable(void *addr, size_t length)
{
	uint8_t b;
	struct iovec here = { &b, 1 };
	struct iovec ends[2] = { { addr, 1 }, { (uint8_t *)addr + length - 1, 1 } };

	for (int i = 0; i < 2; i++)
		if (process_vm_readv(getpid(), &here, 1, &ends[i], 1, 0) != 1 && errno == EFAULT)
			return false;
	return true;
}

static struct ibv_mr *mr_new(struct ibv_pd *ibpd, void *addr, size_t length, int access)
{
	soft_mr *mr;

	if (ctx_refuses(ibpd->context))
		return NULL;
	if (addr == NULL || length == 0 ||
	    ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	     !(access & IBV_ACCESS_LOCAL_WRITE))) {
		errno = EINVAL; /* hardware demands local write with remote write */
		return NULL;
	}
	mr = g_new0(soft_mr, 1);
	mr->mr.context = ibpd->context;
	mr->mr.pd = ibpd;
	mr->mr.addr = addr;
	mr->mr.length = length;
	mr->access = access;
	if (access & IBV_ACCESS_RELAXED_ORDERING)
		atomic_fetch_add(&((soft_ctx *)ibpd->context)->dev->mrs_relaxed, 1);
	g_rw_lock_writer_lock(&tables);
	uint32_t key = next_key;
	next_key += 0x100; /* keys look like a real HCA's: index << 8 | variant */
	mr->mr.lkey = key;
	mr->mr.rkey = key;
	g_hash_table_insert(mr_by_key, GUINT_TO_POINTER(key), mr);
	g_rw_lock_writer_unlock(&tables);
	atomic_fetch_add(&((soft_pd *)ibpd)->users, 1);
	return &mr->mr;
}

static struct ibv_mr *sv_reg_mr(struct ibv_pd *ibpd, void *addr, size_t length, int access)
{
	if (addr != NULL && length > 0 && !pinnable(addr, length)) {
		errno = EFAULT;
		return NULL;
	}
	return mr_new(ibpd, addr, length, access);
}

static struct ibv_mr *sv_reg_dmabuf_mr(struct ibv_pd *ibpd, uint64_t offset, size_t length,
				       uint64_t iova, int fd, int access)
{
	long page = sysconf(_SC_PAGESIZE);
	uint64_t start = offset & ~(uint64_t)(page - 1);
	size_t map_len = (size_t)(offset - start) + length;

	if (fd < 0 || length == 0 || iova == 0) {
		errno = EINVAL;
		return NULL;
	}
	/* The device's memory as the NIC sees it: through the dma-buf. */
	void *map = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
	if (map == MAP_FAILED)
		return NULL;
	struct ibv_mr *ibmr = mr_new(ibpd, (void *)(uintptr_t)iova, length, access);
	if (ibmr == NULL) {
		int err = errno;
		munmap(map, map_len);
		errno = err;
		return NULL;
	}
	soft_mr *mr = (soft_mr *)ibmr;
	mr->map = map;
	mr->map_len = map_len;
	mr->view = (uint8_t *)map + (offset - start);
	return ibmr;
}

static int sv_dereg_mr(struct ibv_mr *ibmr)
{
	soft_mr *mr = (soft_mr *)ibmr;

	/* The writer lock waits for copies from or into it to finish. */
	g_rw_lock_writer_lock(&tables);
	g_hash_table_remove(mr_by_key, GUINT_TO_POINTER(ibmr->lkey));
	g_rw_lock_writer_unlock(&tables);
	atomic_fetch_sub(&((soft_pd *)ibmr->pd)->users, 1);
	if (mr->map != NULL)
		munmap(mr->map, mr->map_len);
	g_free(mr);
	return 0;
}

/* --------------------------------------------------------- channel / CQ */

static struct ibv_comp_channel *sv_create_comp_channel(struct ibv_context *ctx)
{
	soft_channel *ch;

	if (ctx_refuses(ctx))
		return NULL;
	ch = g_new0(soft_channel, 1);
	ch->ch.context = ctx;
	ch->ch.fd = eventfd(0, EFD_SEMAPHORE | EFD_CLOEXEC);
	if (ch->ch.fd < 0) {
		g_free(ch);
		return NULL;
	}
	g_mutex_init(&ch->lock);
	g_queue_init(&ch->cqs);
	return &ch->ch;
}

static int sv_destroy_comp_channel(struct ibv_comp_channel *ibch)
{
	soft_channel *ch = (soft_channel *)ibch;

	if (atomic_load(&ch->ncq) > 0)
		return EBUSY;
	close(ch->ch.fd);
	g_queue_clear(&ch->cqs);
	g_mutex_clear(&ch->lock);
	g_free(ch);
	return 0;
}

static struct ibv_cq *sv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
				   struct ibv_comp_channel *ibch, int comp_vector)
{
	soft_cq *cq;

	if (ctx_refuses(ctx))
		return NULL;
	if (cqe < 1 || cqe > SOFT_MAX_CQE || comp_vector < 0 || comp_vector >= ctx->num_comp_vectors) {
		errno = EINVAL;
		return NULL;
	}
	cq = g_new0(soft_cq, 1);
	cq->cq.context = ctx;
	cq->cq.channel = ibch;
	cq->cq.cq_context = cq_context;
	cq->cq.cqe = cqe;
	cq->cap = cqe;
	cq->ring = g_new0(struct ibv_wc, cqe);
	g_mutex_init(&cq->lock);
	if (ibch != NULL)
		atomic_fetch_add(&((soft_channel *)ibch)->ncq, 1);
	return &cq->cq;
}

static int sv_destroy_cq(struct ibv_cq *ibcq)
{
	soft_cq *cq = (soft_cq *)ibcq;

	if (atomic_load(&cq->nqp) > 0)
		return EBUSY;
	if (atomic_load(&cq->events_got) != atomic_load(&cq->events_acked))
		return EBUSY; /* every event must be acknowledged first */
	if (ibcq->channel != NULL) {
		soft_channel *ch = (soft_channel *)ibcq->channel;
		g_mutex_lock(&ch->lock);
		atomic_fetch_sub(&ch->ncq, 1);
		g_queue_remove_all(&ch->cqs, cq);
		g_mutex_unlock(&ch->lock);
	}
	g_mutex_clear(&cq->lock);
	g_free(cq->ring);
	g_free(cq);
	return 0;
}

static int sv_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	soft_cq *cq = (soft_cq *)ibcq;

	(void)solicited_only;
	if (ibcq->channel == NULL)
		return EINVAL;
	g_mutex_lock(&cq->lock);
	cq->armed = true;
	g_mutex_unlock(&cq->lock);
	return 0;
}

/* Waits for `fd` to be readable unless it is non-blocking; 0 or -1/errno. */
static int wait_readable(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl >= 0 && (fl & O_NONBLOCK)) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, 0) <= 0) {
			errno = EAGAIN;
			return -1;
		}
		return 0;
	}
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int rc = poll(&p, 1, -1);
		if (rc > 0)
			return 0;
		if (rc < 0 && errno != EINTR)
			return -1;
	}
}

static int sv_get_cq_event(struct ibv_comp_channel *ibch, struct ibv_cq **out, void **cq_context)
{
	soft_channel *ch = (soft_channel *)ibch;
	uint64_t v;

	for (;;) {
		if (wait_readable(ch->ch.fd) < 0)
			return -1;
		if (read(ch->ch.fd, &v, sizeof v) == (ssize_t)sizeof v)
			break;
		if (errno != EAGAIN && errno != EINTR)
			return -1;
		/* another thread took it: wait again (or report EAGAIN) */
		int fl = fcntl(ch->ch.fd, F_GETFL);
		if (fl >= 0 && (fl & O_NONBLOCK)) {
			errno = EAGAIN;
			return -1;
		}
	}
	g_mutex_lock(&ch->lock);
	soft_cq *cq = g_queue_pop_head(&ch->cqs);
	g_mutex_unlock(&ch->lock);
	if (cq == NULL) {
		errno = EAGAIN;
		return -1;
	}
	atomic_fetch_add(&cq->events_got, 1);
	*out = &cq->cq;
	*cq_context = cq->cq.cq_context;
	return 0;
}

static void sv_ack_cq_events(struct ibv_cq *ibcq, unsigned int n)
{
	atomic_fetch_add(&((soft_cq *)ibcq)->events_acked, n);
}

static int sv_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
	soft_cq *cq = (soft_cq *)ibcq;
	int got = 0;

	if (n < 0)
		return -1;
	g_mutex_lock(&cq->lock);
	while (got < n && cq->count > 0) {
		wc[got++] = cq->ring[cq->head];
		cq->head = (cq->head + 1) % cq->cap;
		cq->count--;
	}
	g_mutex_unlock(&cq->lock);
	return got;
}

static void cq_push(soft_cq *cq, const struct ibv_wc *wc)
{
	soft_channel *notify = NULL;
	bool overrun = false;

	g_mutex_lock(&cq->lock);
	if (cq->count == cq->cap) {
		overrun = true;
	} else {
		cq->ring[(cq->head + cq->count) % cq->cap] = *wc;
		cq->count++;
		if (cq->armed) {
			cq->armed = false;
			notify = (soft_channel *)cq->cq.channel;
		}
	}
	g_mutex_unlock(&cq->lock);
	if (overrun) {
		/* Hardware raises a CQ error on overrun; the entry is lost. */
		push_event((soft_ctx *)cq->cq.context, IBV_EVENT_CQ_ERR, &cq->cq, 0);
		return;
	}
	if (notify != NULL) {
		uint64_t one = 1;
		g_mutex_lock(&notify->lock);
		g_queue_push_tail(&notify->cqs, cq);
		g_mutex_unlock(&notify->lock);
		if (write(notify->ch.fd, &one, sizeof one) < 0)
			g_warning("soft verbs: cannot signal a completion: %s", g_strerror(errno));
	}
}

/* ------------------------------------------------------------------- QP */

static struct ibv_qp *sv_create_qp(struct ibv_pd *ibpd, struct ibv_qp_init_attr *attr)
{
	soft_qp *qp;

	if (ctx_refuses(ibpd->context))
		return NULL;
	if (attr == NULL || attr->qp_type != IBV_QPT_RC || attr->send_cq == NULL ||
	    attr->recv_cq == NULL || attr->send_cq->context != ibpd->context ||
	    attr->recv_cq->context != ibpd->context || attr->srq != NULL ||
	    attr->cap.max_send_wr < 1 || attr->cap.max_send_wr > SOFT_MAX_QP_WR ||
	    attr->cap.max_recv_wr > SOFT_MAX_QP_WR || attr->cap.max_send_sge > SOFT_MAX_SGE ||
	    attr->cap.max_recv_sge > SOFT_MAX_SGE || attr->cap.max_inline_data > SOFT_MAX_INLINE) {
		errno = EINVAL;
		return NULL;
	}
	qp = g_new0(soft_qp, 1);
	qp->qp.context = ibpd->context;
	qp->qp.qp_context = attr->qp_context;
	qp->qp.pd = ibpd;
	qp->qp.send_cq = attr->send_cq;
	qp->qp.recv_cq = attr->recv_cq;
	qp->qp.qp_type = IBV_QPT_RC;
	qp->qp.state = IBV_QPS_RESET;
	qp->state = IBV_QPS_RESET;
	qp->dev = ((soft_ctx *)ibpd->context)->dev;
	qp->cap = (int)attr->cap.max_send_wr;
	qp->max_inline = attr->cap.max_inline_data;
	qp->max_sge = attr->cap.max_send_sge ? attr->cap.max_send_sge : 1;
	qp->sq = g_new0(soft_wr, qp->cap);
	if (qp->max_inline > 0)
		qp->inline_buf = g_malloc0((gsize)qp->cap * qp->max_inline);
	g_mutex_init(&qp->lock);
	atomic_fetch_add(&((soft_cq *)attr->send_cq)->nqp, 1);
	if (attr->recv_cq != attr->send_cq)
		atomic_fetch_add(&((soft_cq *)attr->recv_cq)->nqp, 1);
	atomic_fetch_add(&((soft_pd *)ibpd)->users, 1);
	g_rw_lock_writer_lock(&tables);
	qp->qp.qp_num = next_qpn++ & 0xffffff;
	g_hash_table_insert(qp_by_num, GUINT_TO_POINTER(qp->qp.qp_num), qp);
	g_rw_lock_writer_unlock(&tables);
	return &qp->qp;
}

static void runq_add(soft_qp *qp)
{
	soft_dev *d = qp->dev;

	g_mutex_lock(&d->lock);
	if (!qp->queued && !qp->destroyed) {
		qp->queued = true;
		g_queue_push_tail(&d->runq, qp);
		g_cond_signal(&d->cond);
	}
	g_mutex_unlock(&d->lock);
}

/* A request waiting out its latency on this QP's device looks again. */
static void qp_mark_error(soft_qp *qp, bool err)
{
	soft_dev *d = qp->dev;

	atomic_store(&qp->in_error, err);
	if (err) {
		g_mutex_lock(&d->lock);
		g_cond_broadcast(&d->cond);
		g_mutex_unlock(&d->lock);
	}
}

static void qp_set_error(soft_qp *qp)
{
	bool pending;

	g_mutex_lock(&qp->lock);
	qp->state = IBV_QPS_ERR;
	qp->qp.state = IBV_QPS_ERR;
	pending = qp->count > 0;
	g_mutex_unlock(&qp->lock);
	qp_mark_error(qp, true);
	if (pending)
		runq_add(qp); /* flushes them */
}

static int sv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask)
{
	soft_qp *qp = (soft_qp *)ibqp;
	soft_dev *d = qp->dev;
	int rc = 0;

	if (!(mask & IBV_QP_STATE))
		return EINVAL; /* the plugin only changes states */
	g_mutex_lock(&qp->lock);
	enum ibv_qp_state from = qp->state, to = attr->qp_state;
	const int init_need = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	const int rtr_need = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	const int rts_need = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
			     IBV_QP_MAX_QP_RD_ATOMIC;

	if (ctx_dead(ibqp->context) && to != IBV_QPS_ERR && to != IBV_QPS_RESET) {
		rc = EIO;
	} else if (to == IBV_QPS_RESET) {
		qp->count = 0; /* work requests vanish without completions */
		qp->head = 0;
	} else if (to == IBV_QPS_ERR) {
		/* flushed by the device thread below */
	} else if (to == IBV_QPS_INIT && (from == IBV_QPS_RESET || from == IBV_QPS_INIT)) {
		if (from == IBV_QPS_RESET && (mask & init_need) != init_need)
			rc = EINVAL;
		else if ((mask & IBV_QP_PORT) && (attr->port_num < 1 || attr->port_num > d->nports))
			rc = EINVAL;
		if (rc == 0) {
			if (mask & IBV_QP_PORT)
				qp->port = attr->port_num;
			if (mask & IBV_QP_ACCESS_FLAGS)
				qp->access = (int)attr->qp_access_flags;
		}
	} else if (to == IBV_QPS_RTR && from == IBV_QPS_INIT) {
		soft_port *p = &d->port[qp->port - 1];
		/* Hardware refuses more READs in flight than it announced. */
		if ((mask & rtr_need) != rtr_need || attr->path_mtu > IBV_MTU_4096 ||
		    ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr->max_dest_rd_atomic > SOFT_MAX_RD_ATOM) ||
		    attr->path_mtu < IBV_MTU_256 ||
		    (attr->ah_attr.is_global && attr->ah_attr.grh.sgid_index >= p->ngid) ||
		    (attr->ah_attr.port_num != 0 && attr->ah_attr.port_num != qp->port))
			rc = EINVAL;
		if (rc == 0) {
			qp->dest_qpn = attr->dest_qp_num & 0xffffff;
			qp->is_global = attr->ah_attr.is_global;
			qp->dgid = attr->ah_attr.grh.dgid;
			qp->dlid = attr->ah_attr.dlid;
			qp->sgid_index = attr->ah_attr.grh.sgid_index;
			atomic_store(&d->last_tc, attr->ah_attr.is_global ? attr->ah_attr.grh.traffic_class : -1);
		}
	} else if (to == IBV_QPS_RTS && (from == IBV_QPS_RTR || from == IBV_QPS_RTS)) {
		if (from == IBV_QPS_RTR && (mask & rts_need) != rts_need)
			rc = EINVAL;
		/* The fields' widths on the wire and in hardware: 5 and 3 bits. */
		else if (((mask & IBV_QP_TIMEOUT) && attr->timeout > 31) ||
			 ((mask & IBV_QP_RETRY_CNT) && attr->retry_cnt > 7) ||
			 ((mask & IBV_QP_RNR_RETRY) && attr->rnr_retry > 7) ||
			 ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr->max_rd_atomic > SOFT_MAX_RD_ATOM))
			rc = EINVAL;
		else if (mask & IBV_QP_RETRY_CNT)
			atomic_store(&d->last_retry_cnt, attr->retry_cnt);
	} else {
		rc = EINVAL;
	}
	if (rc == 0) {
		qp->state = to;
		qp->qp.state = to;
	}
	bool flush = rc == 0 && to == IBV_QPS_ERR && qp->count > 0;
	g_mutex_unlock(&qp->lock);
	if (rc == 0)
		qp_mark_error(qp, to == IBV_QPS_ERR);
	if (flush)
		runq_add(qp);
	return rc;
}

static int sv_destroy_qp(struct ibv_qp *ibqp)
{
	soft_qp *qp = (soft_qp *)ibqp;
	soft_dev *d = qp->dev;

	g_rw_lock_writer_lock(&tables);
	g_hash_table_remove(qp_by_num, GUINT_TO_POINTER(ibqp->qp_num));
	g_rw_lock_writer_unlock(&tables);
	g_mutex_lock(&d->lock);
	qp->destroyed = true;
	if (qp->queued)
		g_queue_remove(&d->runq, qp);
	g_cond_broadcast(&d->cond); /* a latency wait on it ends */
	while (d->busy == qp || d->aside == qp)
		g_cond_wait(&d->cond, &d->lock);
	g_mutex_unlock(&d->lock);
	atomic_fetch_sub(&((soft_cq *)ibqp->send_cq)->nqp, 1);
	if (ibqp->recv_cq != ibqp->send_cq)
		atomic_fetch_sub(&((soft_cq *)ibqp->recv_cq)->nqp, 1);
	atomic_fetch_sub(&((soft_pd *)ibqp->pd)->users, 1);
	g_mutex_clear(&qp->lock);
	g_free(qp->sq);
	g_free(qp->inline_buf);
	g_free(qp);
	return 0;
}

static int sv_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	soft_qp *qp = (soft_qp *)ibqp;
	int rc = 0;
	bool posted = false;

	g_mutex_lock(&qp->lock);
	for (; wr != NULL; wr = wr->next) {
		if (ctx_dead(ibqp->context)) {
			rc = EIO;
			break;
		}
		if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR) {
			rc = EINVAL;
			break;
		}
		if ((wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_READ) ||
		    wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->max_sge ||
		    (wr->num_sge > 0 && wr->sg_list == NULL)) {
			rc = EINVAL;
			break;
		}
		if (qp->count == qp->cap) {
			rc = ENOMEM; /* send queue full */
			break;
		}
		int slot = (qp->head + qp->count) % qp->cap;
		soft_wr *w = &qp->sq[slot];
		memset(w, 0, sizeof *w);
		w->wr_id = wr->wr_id;
		w->opcode = wr->opcode;
		w->flags = wr->send_flags;
		w->num_sge = wr->num_sge;
		w->remote_addr = wr->wr.rdma.remote_addr;
		w->rkey = wr->wr.rdma.rkey;
		uint64_t total = 0;
		for (int i = 0; i < wr->num_sge; i++) {
			w->sge[i] = wr->sg_list[i];
			total += wr->sg_list[i].length;
		}
		if (wr->send_flags & IBV_SEND_INLINE) {
			if (wr->opcode != IBV_WR_RDMA_WRITE || total > qp->max_inline) {
				rc = EINVAL;
				break;
			}
			/* Inline data is copied now: the buffer is free once posted. */
			uint8_t *dst = qp->inline_buf + (size_t)slot * qp->max_inline;
			for (int i = 0; i < wr->num_sge; i++) {
				memcpy(dst, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
				dst += wr->sg_list[i].length;
			}
			w->inline_len = (uint32_t)total;
		}
		qp->count++;
		posted = true;
	}
	g_mutex_unlock(&qp->lock);
	if (rc != 0 && bad_wr != NULL)
		*bad_wr = wr;
	if (posted)
		runq_add(qp);
	return rc;
}

/* --------------------------------------------------------- async events */

static int sv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *event)
{
	soft_ctx *c = (soft_ctx *)ctx;
	uint64_t v;

	for (;;) {
		if (wait_readable(ctx->async_fd) < 0)
			return -1;
		if (read(ctx->async_fd, &v, sizeof v) == (ssize_t)sizeof v)
			break;
		if (errno != EAGAIN && errno != EINTR)
			return -1;
	}
	g_mutex_lock(&c->lock);
	struct ibv_async_event *ev = g_queue_pop_head(&c->events);
	g_mutex_unlock(&c->lock);
	if (ev == NULL) {
		errno = EAGAIN;
		return -1;
	}
	*event = *ev;
	g_free(ev);
	return 0;
}

static void sv_ack_async_event(struct ibv_async_event *event)
{
	(void)event;
}

/* ------------------------------------------------------------ execution */

static bool dev_owns_gid(soft_dev *d, const union ibv_gid *gid)
{
	bool owns = false;
	g_mutex_lock(&d->lock); /* the table may be readdressed (te_rdma_soft_replace_gid) */
	for (int p = 0; p < d->nports && !owns; p++)
		for (int i = 0; i < d->port[p].ngid && !owns; i++)
			owns = memcmp(d->port[p].gid[i].raw, gid->raw, 16) == 0;
	g_mutex_unlock(&d->lock);
	return owns;
}

static bool port_up(soft_dev *d, uint8_t port)
{
	bool up;
	g_mutex_lock(&d->lock);
	up = port >= 1 && port <= d->nports && d->port[port - 1].up && !d->fatal;
	g_mutex_unlock(&d->lock);
	return up;
}

static bool mr_covers(const soft_mr *mr, uint64_t addr, uint64_t len)
{
	uint64_t start = (uintptr_t)mr->mr.addr;
	return addr >= start && addr + len >= addr && addr + len <= start + mr->mr.length;
}

/* What a request needs of its requester QP, read under its lock. */
typedef struct qp_view {
	uint8_t port;
	uint32_t qpn, dest_qpn;
	bool is_global;
	union ibv_gid dgid;
	uint16_t dlid;
	struct ibv_pd *pd;
} qp_view;

/* Executes one request as requester and responder would; the wc status. */
static enum ibv_wc_status execute(soft_qp *qp, const qp_view *me, soft_wr *w, uint64_t *moved,
				  soft_qp **peer_err)
{
	soft_dev *d = qp->dev;
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	bool is_read = w->opcode == IBV_WR_RDMA_READ;
	uint64_t total = 0;

	*moved = 0;
	*peer_err = NULL;
	for (int i = 0; i < w->num_sge; i++)
		total += w->sge[i].length;
	if (ctx_dead(qp->qp.context))
		return IBV_WC_WR_FLUSH_ERR; /* what a dead device had queued is flushed */
	if (!port_up(d, me->port))
		return IBV_WC_RETRY_EXC_ERR;

	g_rw_lock_reader_lock(&tables);
	soft_qp *peer = g_hash_table_lookup(qp_by_num, GUINT_TO_POINTER(me->dest_qpn));
	if (peer == NULL) {
		st = IBV_WC_RETRY_EXC_ERR; /* nobody answers */
		goto out;
	}
	g_mutex_lock(&peer->lock);
	bool peer_ok = (peer->state == IBV_QPS_RTR || peer->state == IBV_QPS_RTS) &&
		       peer->dest_qpn == me->qpn && !ctx_dead(peer->qp.context);
	int peer_access = peer->access;
	uint8_t peer_port = peer->port;
	g_mutex_unlock(&peer->lock);
	/* The packet must reach the peer's port: up, and owning the address. */
	if (!peer_ok || !port_up(peer->dev, peer_port) ||
	    (me->is_global ? !dev_owns_gid(peer->dev, &me->dgid)
			   : peer->dev->port[peer_port - 1].lid != me->dlid)) {
		st = IBV_WC_RETRY_EXC_ERR;
		goto out;
	}
	/* Local side: every SGE inside an MR of this PD (not for inline data). */
	if (w->inline_len == 0) {
		for (int i = 0; i < w->num_sge; i++) {
			soft_mr *lmr = g_hash_table_lookup(mr_by_key, GUINT_TO_POINTER(w->sge[i].lkey));
			if (lmr == NULL || lmr->mr.pd != me->pd ||
			    !mr_covers(lmr, w->sge[i].addr, w->sge[i].length) ||
			    (is_read && !(lmr->access & IBV_ACCESS_LOCAL_WRITE))) {
				st = IBV_WC_LOC_PROT_ERR;
				goto out;
			}
		}
	}
	/* Remote side: the responder checks the rkey, PD, bounds and rights. */
	int need = is_read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
	soft_mr *rmr = g_hash_table_lookup(mr_by_key, GUINT_TO_POINTER(w->rkey));
	if (rmr == NULL || rmr->mr.pd != peer->qp.pd || !mr_covers(rmr, w->remote_addr, total) ||
	    !(rmr->access & need) || !(peer_access & need)) {
		st = IBV_WC_REM_ACCESS_ERR;
		*peer_err = peer;
		goto out;
	}
	uint8_t *remote = mr_bytes(rmr, w->remote_addr);
	if (w->inline_len > 0) {
		size_t slot = (size_t)(w - qp->sq);
		memcpy(remote, qp->inline_buf + slot * qp->max_inline, w->inline_len);
	} else {
		for (int i = 0; i < w->num_sge; i++) {
			soft_mr *lmr = g_hash_table_lookup(mr_by_key, GUINT_TO_POINTER(w->sge[i].lkey));
			void *local = mr_bytes(lmr, w->sge[i].addr);
			if (is_read)
				memcpy(local, remote, w->sge[i].length);
			else
				memcpy(remote, local, w->sge[i].length);
			remote += w->sge[i].length;
		}
	}
	*moved = total;
	atomic_fetch_add(&peer->dev->rx_wrs, 1);
out:
	if (*peer_err != NULL)
		qp_set_error(*peer_err); /* under the reader lock: the peer stays alive */
	g_rw_lock_reader_unlock(&tables);
	return st;
}

/* Flushes every request of `qp`, in the error state (d->lock not held). */
static void flush_all(soft_qp *qp)
{
	soft_dev *d = qp->dev;

	for (;;) {
		g_mutex_lock(&qp->lock);
		if (qp->count == 0) {
			g_mutex_unlock(&qp->lock);
			return;
		}
		soft_wr w = qp->sq[qp->head];
		qp->head = (qp->head + 1) % qp->cap;
		qp->count--;
		g_mutex_unlock(&qp->lock);
		struct ibv_wc wc = { .wr_id = w.wr_id, .qp_num = qp->qp.qp_num,
				     .opcode = w.opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE,
				     .status = IBV_WC_WR_FLUSH_ERR };
		atomic_fetch_add(&d->flushed, 1);
		cq_push((soft_cq *)qp->qp.send_cq, &wc);
	}
}

/* A queued QP in the error state, taken off the run queue (d->lock held),
 * or NULL. */
static soft_qp *take_errored(soft_dev *d)
{
	for (GList *l = d->runq.head; l != NULL; l = l->next) {
		soft_qp *q = l->data;
		if (atomic_load(&q->in_error)) {
			g_queue_delete_link(&d->runq, l);
			q->queued = false;
			return q;
		}
	}
	return NULL;
}

/* Waits out `usec` of injected latency before a request of `qp` runs; false
 * when the QP went to ERR or was destroyed meanwhile (the request is
 * flushed instead). The latency set to 0 or the device stopping end it
 * early too. A NIC serves its queue pairs apart: while one waits for its
 * peer, another moved to the error state is flushed at once (unless a
 * flush delay is set, which stands for a NIC slow to flush). */
static bool latency_wait(soft_dev *d, soft_qp *qp, unsigned usec)
{
	gint64 until = g_get_monotonic_time() + usec;
	bool gone;

	g_mutex_lock(&d->lock);
	while (!d->stop && !qp->destroyed && !atomic_load(&qp->in_error) &&
	       atomic_load(&d->latency_us) != 0 && g_get_monotonic_time() < until) {
		soft_qp *e = atomic_load(&d->flush_delay_us) == 0 ? take_errored(d) : NULL;
		if (e != NULL) {
			d->aside = e;
			g_mutex_unlock(&d->lock);
			flush_all(e);
			g_mutex_lock(&d->lock);
			d->aside = NULL;
			g_cond_broadcast(&d->cond);
			continue;
		}
		g_cond_wait_until(&d->cond, &d->lock, until);
	}
	gone = qp->destroyed;
	g_mutex_unlock(&d->lock);
	return !gone && !atomic_load(&qp->in_error);
}

/* Holds back a flush completion by the device's flush delay. */
static void flush_wait(soft_dev *d, soft_qp *qp)
{
	unsigned usec = atomic_load(&d->flush_delay_us);
	gint64 until = g_get_monotonic_time() + usec;

	if (usec == 0)
		return;
	g_mutex_lock(&d->lock);
	while (!d->stop && !qp->destroyed && g_get_monotonic_time() < until)
		g_cond_wait_until(&d->cond, &d->lock, until);
	g_mutex_unlock(&d->lock);
}

static void run_one(soft_dev *d, soft_qp *qp)
{
	soft_wr w;
	enum ibv_qp_state state;
	struct ibv_wc wc = { 0 };
	bool more;

	g_mutex_lock(&qp->lock);
	if (qp->count == 0) {
		g_mutex_unlock(&qp->lock);
		return;
	}
	if (atomic_load(&((soft_ctx *)qp->qp.context)->silent)) {
		/* A device dead without flushing: the request vanishes. */
		qp->head = (qp->head + 1) % qp->cap;
		qp->count--;
		more = qp->count > 0;
		g_mutex_unlock(&qp->lock);
		if (more)
			runq_add(qp);
		return;
	}
	w = qp->sq[qp->head];
	state = qp->state;
	qp_view me = { .port = qp->port, .qpn = qp->qp.qp_num, .dest_qpn = qp->dest_qpn,
		       .is_global = qp->is_global, .dgid = qp->dgid, .dlid = qp->dlid,
		       .pd = qp->qp.pd };
	g_mutex_unlock(&qp->lock);

	wc.wr_id = w.wr_id;
	wc.qp_num = qp->qp.qp_num;
	wc.opcode = w.opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
	if (state != IBV_QPS_ERR) {
		unsigned lat = atomic_load(&d->latency_us);
		if (lat > 0 && !latency_wait(d, qp, lat))
			state = IBV_QPS_ERR;
	}
	if (state == IBV_QPS_ERR) {
		flush_wait(d, qp);
		wc.status = IBV_WC_WR_FLUSH_ERR;
		atomic_fetch_add(&d->flushed, 1);
	} else {
		int injected = -1;
		g_mutex_lock(&d->lock);
		if (d->fail_next > 0) {
			d->fail_next--;
			injected = d->fail_status;
		}
		g_mutex_unlock(&d->lock);
		uint64_t moved = 0;
		soft_qp *peer = NULL;
		/* `w` points into the ring for inline data: execute from the slot. */
		g_mutex_lock(&qp->lock);
		soft_wr *slot = &qp->sq[qp->head];
		g_mutex_unlock(&qp->lock);
		wc.status = injected >= 0 ? (enum ibv_wc_status)injected
					  : execute(qp, &me, slot, &moved, &peer);
		if (wc.status == IBV_WC_SUCCESS) {
			wc.byte_len = (uint32_t)moved;
			atomic_fetch_add(&d->wrs, 1);
			atomic_fetch_add(&d->bytes, moved);
		} else {
			atomic_fetch_add(&d->errors, 1);
			qp_set_error(qp);
		}
	}
	g_mutex_lock(&qp->lock);
	if (qp->count > 0) { /* a RESET meanwhile emptied it */
		qp->head = (qp->head + 1) % qp->cap;
		qp->count--;
	}
	more = qp->count > 0;
	g_mutex_unlock(&qp->lock);
	if (wc.status != IBV_WC_SUCCESS || (w.flags & IBV_SEND_SIGNALED))
		cq_push((soft_cq *)qp->qp.send_cq, &wc);
	if (more)
		runq_add(qp);
}

static gpointer dev_thread(gpointer data)
{
	soft_dev *d = data;

	g_mutex_lock(&d->lock);
	for (;;) {
		while (!d->stop && g_queue_is_empty(&d->runq))
			g_cond_wait(&d->cond, &d->lock);
		if (d->stop)
			break;
		soft_qp *qp = g_queue_pop_head(&d->runq);
		qp->queued = false;
		d->busy = qp;
		g_mutex_unlock(&d->lock);
		run_one(d, qp);
		g_mutex_lock(&d->lock);
		d->busy = NULL;
		g_cond_broadcast(&d->cond);
	}
	g_mutex_unlock(&d->lock);
	return NULL;
}

/* ----------------------------------------------------------------- table */

static const rv_verbs soft_table = {
	.name = "soft",
	.none_found = "the software verbs layer found none under <TE_RDMA_SYSFS_ROOT>/sys/class/infiniband",
	.get_device_list = sv_get_device_list,
	.free_device_list = sv_free_device_list,
	.get_device_name = sv_get_device_name,
	.get_device_guid = sv_get_device_guid,
	.open_device = sv_open_device,
	.close_device = sv_close_device,
	.query_device = sv_query_device,
	.query_port = sv_query_port,
	.query_gid_ex = sv_query_gid_ex,
	.alloc_pd = sv_alloc_pd,
	.dealloc_pd = sv_dealloc_pd,
	.reg_mr = sv_reg_mr,
	.reg_dmabuf_mr = sv_reg_dmabuf_mr,
	.dereg_mr = sv_dereg_mr,
	.create_comp_channel = sv_create_comp_channel,
	.destroy_comp_channel = sv_destroy_comp_channel,
	.create_cq = sv_create_cq,
	.destroy_cq = sv_destroy_cq,
	.req_notify_cq = sv_req_notify_cq,
	.get_cq_event = sv_get_cq_event,
	.ack_cq_events = sv_ack_cq_events,
	.poll_cq = sv_poll_cq,
	.create_qp = sv_create_qp,
	.modify_qp = sv_modify_qp,
	.destroy_qp = sv_destroy_qp,
	.post_send = sv_post_send,
	.get_async_event = sv_get_async_event,
	.ack_async_event = sv_ack_async_event,
};

const rv_verbs *rv_verbs_soft(void)
{
	tables_init();
	return &soft_table;
}

/* -------------------------------------------------------- test controls */

typedef void (*dev_fn)(soft_dev *d, void *arg);

static int for_devices(const char *name, dev_fn fn, void *arg)
{
	int n = 0;

	tables_init();
	g_mutex_lock(&soft_lock);
	for (guint i = 0; i < soft_devs->len; i++) {
		soft_dev *d = g_ptr_array_index(soft_devs, i);
		if (name == NULL || strcmp(atomic_load(&d->shown), name) == 0) {
			fn(d, arg);
			n++;
		}
	}
	g_mutex_unlock(&soft_lock);
	return n > 0 ? 0 : -ENOENT;
}

static void set_link(soft_dev *d, void *arg)
{
	bool up = *(int *)arg != 0;

	g_mutex_lock(&d->lock);
	bool was = d->port[0].up && !d->fatal;
	for (int p = 0; p < d->nports; p++)
		d->port[p].up = up;
	if (up)
		d->fatal = false;
	GList *ctxs = g_list_copy(d->contexts);
	g_mutex_unlock(&d->lock);
	if (was != up)
		for (GList *l = ctxs; l != NULL; l = l->next)
			for (int p = 1; p <= d->nports; p++)
				push_event(l->data, up ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR, NULL, p);
	g_list_free(ctxs);
}

static void set_fatal(soft_dev *d, void *arg)
{
	bool silent = arg != NULL && *(int *)arg != 0;
	g_mutex_lock(&d->lock);
	d->fatal = true;
	for (GList *l = d->contexts; l != NULL; l = l->next) {
		atomic_store(&((soft_ctx *)l->data)->silent, silent);
		atomic_store(&((soft_ctx *)l->data)->dead, true);
	}
	GList *ctxs = g_list_copy(d->contexts);
	g_mutex_unlock(&d->lock);
	for (GList *l = ctxs; l != NULL; l = l->next)
		push_event(l->data, IBV_EVENT_DEVICE_FATAL, NULL, 0);
	g_list_free(ctxs);
}

typedef struct gid_arg {
	union ibv_gid from, to;
	int found;
} gid_arg;

/* The interface behind a GID readdressed: the entry equal to `from` becomes
 * `to`, and every open context hears IBV_EVENT_GID_CHANGE on its port. */
static void replace_gid(soft_dev *d, void *arg)
{
	gid_arg *g = arg;
	bool changed[SOFT_MAX_PORTS] = { false };

	g_mutex_lock(&d->lock);
	for (int p = 0; p < d->nports; p++)
		for (int i = 0; i < d->port[p].ngid; i++)
			if (memcmp(d->port[p].gid[i].raw, g->from.raw, 16) == 0) {
				d->port[p].gid[i] = g->to;
				changed[p] = true;
				g->found++;
			}
	GList *ctxs = g_list_copy(d->contexts);
	g_mutex_unlock(&d->lock);
	for (GList *l = ctxs; l != NULL; l = l->next)
		for (int p = 0; p < d->nports; p++)
			if (changed[p])
				push_event(l->data, IBV_EVENT_GID_CHANGE, NULL, p + 1);
	g_list_free(ctxs);
}

/* "xx:xx:...:xx", 16 bytes. */
static bool gid_text(const char *s, union ibv_gid *out)
{
	for (int i = 0; i < 16; i++) {
		unsigned v;
		int n = 0;
		if (sscanf(s, "%2x%n", &v, &n) != 1 || n != 2)
			return false;
		out->raw[i] = (uint8_t)v;
		s += 2;
		if (i < 15 && *s++ != ':')
			return false;
	}
	return *s == '\0';
}

typedef struct fail_arg {
	unsigned n;
	int status;
} fail_arg;

static void set_fail(soft_dev *d, void *arg)
{
	fail_arg *f = arg;
	g_mutex_lock(&d->lock);
	d->fail_next = (int)f->n;
	d->fail_status = f->status;
	g_mutex_unlock(&d->lock);
}

static void set_latency(soft_dev *d, void *arg)
{
	atomic_store(&d->latency_us, *(unsigned *)arg);
	g_mutex_lock(&d->lock);
	g_cond_broadcast(&d->cond); /* waits under the old latency end if it is 0 now */
	g_mutex_unlock(&d->lock);
}

static void set_flush_delay(soft_dev *d, void *arg)
{
	atomic_store(&d->flush_delay_us, *(unsigned *)arg);
}

static void add_counters(soft_dev *d, void *arg)
{
	te_rdma_soft_counters *c = arg;
	c->wrs += atomic_load(&d->wrs);
	c->bytes += atomic_load(&d->bytes);
	c->errors += atomic_load(&d->errors);
	c->flushed += atomic_load(&d->flushed);
	c->rx_wrs += atomic_load(&d->rx_wrs);
	c->mrs_relaxed += atomic_load(&d->mrs_relaxed);
	if (atomic_load(&d->last_tc) > c->last_tc)
		c->last_tc = atomic_load(&d->last_tc);
	if (atomic_load(&d->last_retry_cnt) > c->last_retry_cnt)
		c->last_retry_cnt = atomic_load(&d->last_retry_cnt);
}

SOFT_EXPORT int te_rdma_soft_set_link(const char *dev, int up);
SOFT_EXPORT int te_rdma_soft_fatal(const char *dev);
SOFT_EXPORT int te_rdma_soft_fail_next(const char *dev, unsigned n, int wc_status);
SOFT_EXPORT int te_rdma_soft_set_latency(const char *dev, unsigned usec);
SOFT_EXPORT int te_rdma_soft_set_flush_delay(const char *dev, unsigned usec);
SOFT_EXPORT int te_rdma_soft_get_counters(const char *dev, te_rdma_soft_counters *out);
SOFT_EXPORT int te_rdma_soft_replace_gid(const char *dev, const char *from, const char *to);
SOFT_EXPORT int te_rdma_soft_fatal_silent(const char *dev);
SOFT_EXPORT int te_rdma_soft_rename(const char *dev, const char *to);

static void rename_dev(soft_dev *d, void *arg)
{
	atomic_store(&d->shown, g_intern_string(arg));
}

static void no_op(soft_dev *d, void *arg)
{
	(void)d;
	(void)arg;
}

int te_rdma_soft_rename(const char *dev, const char *to)
{
	if (dev == NULL || to == NULL || *to == '\0' || strlen(to) >= IBV_SYSFS_NAME_MAX)
		return -EINVAL;
	if (for_devices(to, no_op, NULL) == 0)
		return -EEXIST;
	return for_devices(dev, rename_dev, (void *)to);
}

int te_rdma_soft_fatal_silent(const char *dev)
{
	int silent = 1;
	if (dev == NULL)
		return -EINVAL;
	return for_devices(dev, set_fatal, &silent);
}

int te_rdma_soft_replace_gid(const char *dev, const char *from, const char *to)
{
	gid_arg g = { .found = 0 };

	if (dev == NULL || from == NULL || to == NULL || !gid_text(from, &g.from) ||
	    !gid_text(to, &g.to))
		return -EINVAL;
	int rc = for_devices(dev, replace_gid, &g);
	return rc < 0 ? rc : g.found > 0 ? 0 : -ENOENT;
}

int te_rdma_soft_set_link(const char *dev, int up)
{
	if (dev == NULL)
		return -EINVAL;
	return for_devices(dev, set_link, &up);
}

int te_rdma_soft_fatal(const char *dev)
{
	if (dev == NULL)
		return -EINVAL;
	return for_devices(dev, set_fatal, NULL);
}

int te_rdma_soft_fail_next(const char *dev, unsigned n, int wc_status)
{
	fail_arg f = { n, wc_status };
	if (dev == NULL || wc_status <= IBV_WC_SUCCESS || wc_status > IBV_WC_TM_RNDV_INCOMPLETE)
		return -EINVAL;
	return for_devices(dev, set_fail, &f);
}

int te_rdma_soft_set_latency(const char *dev, unsigned usec)
{
	return for_devices(dev, set_latency, &usec);
}

int te_rdma_soft_set_flush_delay(const char *dev, unsigned usec)
{
	return for_devices(dev, set_flush_delay, &usec);
}

int te_rdma_soft_get_counters(const char *dev, te_rdma_soft_counters *out)
{
	if (out == NULL)
		return -EINVAL;
	memset(out, 0, sizeof *out);
	out->last_tc = -1;
	out->last_retry_cnt = -1;
	return for_devices(dev, add_counters, out);
}
