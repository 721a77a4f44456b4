/* SPDX-License-Identifier: Apache-2.0 */
/* Private to the RDMA plugin: its structures and the functions its files share. */
#ifndef TE_RDMA_INTERNAL_H
#define TE_RDMA_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <glib.h>
#include <json-glib/json-glib.h>
#include <te/te-json.h> /* after json-glib: te_json_load() */
#include <te/te-plugin.h>

#include "rdma-verbs.h"
#include "teu-fifo.h"
#include "teu-json.h"
#include "teu-mon.h"

#define RD_MAX_DEV 32        /* devices per engine, local or remote */
#define RD_NAME_MAX 64       /* device names (IBV_SYSFS_NAME_MAX) */
#define RD_PATH_MAX 320      /* "<segment name>@<device>" */
#define RD_POLL_BATCH 32     /* completions taken per poll */
#define RD_POST_BATCH 64     /* work requests posted per ibv_post_send */

/* --------------------------------------------------------------- options */

typedef struct rd_config {
	unsigned num_cq_per_ctx;
	unsigned num_comp_channels;
	unsigned ib_port;
	int gid_index;            /* -1: choose */
	unsigned max_cqe;
	unsigned max_ep_per_ctx;
	unsigned num_qp_per_ep;
	unsigned max_sge;
	unsigned max_wr;
	unsigned max_inline;
	unsigned mtu;             /* bytes */
	unsigned workers_per_ctx;
	uint64_t slice_size;
	unsigned retry_cnt;
	unsigned fragment_ratio;
	unsigned handshake_timeout_ms;
	uint64_t ep_idle_ms;
	uint64_t reclaim_interval_ms;
	unsigned pair_fail_threshold;
	uint64_t pair_pause_ms;
	int parallel_reg;         /* -1 auto, 0 off, 1 on */
	uint64_t parallel_reg_min;
	bool fifo_store;          /* MC_ENDPOINT_STORE_TYPE=FIFO */
	unsigned max_slices;      /* slices in flight per engine */
	unsigned ready_grace_ms;  /* passive endpoints usable without ready_ack */
	int ib_tc;                /* GRH traffic class, -1: the device's default */
	bool relaxed_ordering;    /* register memory with PCIe relaxed ordering */
	bool dest_affinity;       /* prefer the remote NIC named like the local one */
} rd_config;

/* -------------------------------------------------------------- topology */

/* A location ("cpu:0", "cuda:1") and its NICs, as indices into a device list. */
typedef struct rd_loc {
	char *name;
	int npref, navail;
	int pref[RD_MAX_DEV];
	int avail[RD_MAX_DEV];
} rd_loc;

typedef struct rd_hca {
	char name[RD_NAME_MAX];
	char pci[64];   /* PCI bus id, "" when unknown */
	char *pci_path; /* sysfs path of the PCI function below <root>, or NULL */
	int numa;       /* -1 when unknown */
} rd_hca;

typedef struct rd_topo {
	rd_hca *hcas; /* canonical order: sorted by name */
	int nhca;
	rd_loc *locs;
	int nloc;
} rd_topo;

/* The first line of a (sysfs) file, without its newline; false when unreadable or empty. */
bool rd_read_line(const char *path, char *buf, size_t size);
void rd_topo_clear(rd_topo *t);
/* Reads the PCI path and NUMA node of each named HCA under <root>/sys, sorts
 * them, and builds the matrix: cpu:N prefers NICs on node N; cuda:N (NVIDIA
 * GPUs found in sysfs, numbered in PCI order) prefers the nearest NICs by PCI
 * path. Negative and a message in `err` on failure. */
int rd_topo_discover(const char *root, char *const *names, int n, rd_topo *out, GString *err);
/* A device a device plugin reports: its location ("cuda:0"), PCI bus id
 * ("" unknown) and NUMA node (-1 unknown). */
typedef struct rd_devloc {
	char location[32];
	char pci[32];
	int numa;
} rd_devloc;
/* As rd_topo_discover, with the device plugins' devices placed by what they
 * report (before the NVIDIA GPUs sysfs shows, for locations not reported). */
int rd_topo_discover_devices(const char *root, char *const *names, int n, const rd_devloc *devs,
			     int ndev, rd_topo *out, GString *err);
/* A user matrix {"cpu:0": [["a"], ["b"]], ...}: its NICs become the device
 * set (each must be in `known`, n_known of them; NULL known = trust). */
int rd_topo_from_matrix(const char *root, JsonObject *matrix, char *const *known, int n_known,
			rd_topo *out, GString *err);
/* Parses a matrix object against a given device list (a peer's). */
int rd_matrix_parse(JsonObject *matrix, char (*devs)[RD_NAME_MAX], int ndev, rd_loc **locs,
		    int *nloc, GString *err);
void rd_locs_free(rd_loc *locs, int n);
const rd_loc *rd_loc_find(const rd_loc *locs, int n, const char *name);
/* The matrix as a JSON node: {"cpu:0": [[...], [...]], ...} */
JsonNode *rd_matrix_to_json(const rd_loc *locs, int n, char (*devs)[RD_NAME_MAX]);

/* ------------------------------------------------------------- handshake */

/* A Connection frame (docs/wire.md, "The RDMA Connection frame"). */
typedef struct rd_hs {
	char local_nic_path[RD_PATH_MAX];
	char peer_nic_path[RD_PATH_MAX];
	uint16_t local_lid;
	uint8_t local_gid[16];
	uint32_t qp_num[64];
	int nqp;
	bool ready_ack;
	char reply_msg[256];
} rd_hs;

/* Compact JSON in Mooncake's field set; malloc()ed. */
char *rd_hs_encode(const rd_hs *hs, size_t *len);
/* Every field checked; negative and a reason in `err` when malformed. */
int rd_hs_decode(const char *json, size_t len, rd_hs *hs, GString *err);
/* "fe:80:00:...": 16 bytes as %02x joined by ':' (47 chars + NUL). */
void rd_gid_format(const uint8_t gid[16], char out[48]);
bool rd_gid_parse(const char *s, uint8_t gid[16]);
/* Text for a negative errno or TE_ERR_* code. */
const char *rd_strerror(int err);
/* Splits "server@device"; false when either part is empty. */
bool rd_nic_path_split(const char *path, char *server, size_t ssize, char *dev, size_t dsize);

/* -------------------------------------------------------------- runtime */

typedef struct rd_transport rd_transport;
typedef struct rd_ctx rd_ctx;
typedef struct rd_ep rd_ep;
typedef struct rd_slice rd_slice;
typedef struct rd_seg rd_seg;

/* A local registered buffer: one MR per device. mr[i] changes only under
 * device i's verbs_lock; the keys are atomics as a device opened again
 * after a fatal error re-registers the buffer while others read them. */
typedef struct rd_mr {
	void *addr;
	size_t length;
	char *location;
	bool remote;
	bool device;     /* device memory (GPUDirect): the CPU must not touch it */
	bool listed;     /* (mr_lock) in the table: registered, not yet unregistered */
	int access;
	atomic_int refs; /* the table's, plus one per slice using it */
	rd_transport *tr;
	struct ibv_mr *mr[RD_MAX_DEV]; /* NULL: not registered with that device (out of service) */
	_Atomic uint32_t lkey[RD_MAX_DEV];
	_Atomic uint32_t rkey[RD_MAX_DEV];
} rd_mr;

/* A remote buffer from a peer's descriptor. */
typedef struct rd_rbuf {
	uint64_t addr, length;
	char *location;
	uint32_t *rkey; /* NULL: not remote-accessible */
} rd_rbuf;

typedef struct rd_rdev {
	char name[RD_NAME_MAX];
	uint16_t lid;
	uint8_t gid[16];
	char nic_path[RD_PATH_MAX];
} rd_rdev;

/* What segment_open() returns: the peer's descriptor, decoded once. */
struct rd_seg {
	rd_transport *tr;
	char *name;
	int ndev;
	rd_rdev *devs;
	char (*devnames)[RD_NAME_MAX];
	rd_loc *locs;
	int nloc;
	rd_rbuf *bufs; /* sorted by addr */
	size_t nbuf;
	atomic_uint *pair_fail;        /* [local dev * ndev + remote dev] */
	_Atomic int64_t *pause_until;  /* ms, same indexing */
};

enum rd_ep_state {
	EP_NEW,        /* in the pool, not connected; its owner is connecting */
	EP_WAIT_ACK,   /* passive: connected, waiting for the peer's ready_ack */
	EP_READY,
	EP_DEAD,       /* failed, evicted or replaced: out of the pool */
};

struct rd_ep {
	rd_ctx *ctx;
	char *peer_nic_path;
	atomic_int state;
	bool passive;
	atomic_int refs;      /* the pool's, posted slices', users' */
	struct ibv_qp **qps;
	int nqp;
	atomic_int *depth;    /* outstanding requests per QP */
	atomic_uint rr;
	int cq;
	atomic_int visited;   /* SIEVE */
	_Atomic int64_t last_used;
	int64_t connected_at;
	rd_ep *prev, *next;   /* pool order, newest at head */
	rd_ep *lprev, *lnext; /* (ctx live_lock) every endpoint not yet destroyed */
	bool in_pool;
	/* Moved to ERR for a transfer that ended early: its flushed requests
	 * of other transfers are sent again without counting as a failure. */
	atomic_bool fenced;
	rd_slice *pending, *pending_tail; /* slices waiting for the handshake */
};

typedef struct rd_worker {
	rd_ctx *ctx;
	int index;
	GThread *thread;
	int wake_fd;
	atomic_int sleeping;
} rd_worker;

struct rd_ctx {
	rd_transport *tr;
	int index;
	/* The name it was opened under: its name in descriptors, paths, logs
	 * and counters for the engine's life, whatever name it comes back
	 * under after a reset (found again by `guid`). */
	char name[RD_NAME_MAX];
	uint64_t guid; /* node GUID (network order); 0: none, found by name only */
	char renamed[RD_NAME_MAX]; /* the other name it came back under, "" if none */
	/* The host's counters of this NIC (ABI 1.6); NULL: the transport's own,
	 * or counting is off. */
	te_metric_dev *mdev;
	char nic_path[RD_PATH_MAX];
	struct ibv_context *vctx;
	struct ibv_pd *pd;
	uint8_t port;
	uint16_t lid;
	GMutex gid_lock;  /* gid and gid_index change together (GID change events) */
	uint8_t gid[16];
	int gid_index;
	enum ibv_mtu mtu;
	uint8_t link_layer;
	unsigned max_wr, max_sge, max_inline, max_cqe;
	uint8_t max_rd_atomic;      /* READs in flight per QP, as initiator (device's cap) */
	uint8_t max_dest_rd_atomic; /* ... and as responder */

	int nchan, ncq;
	struct ibv_comp_channel **chans;
	struct ibv_cq **cqs;
	atomic_int *cq_out;    /* posted, not yet polled, per CQ */

	atomic_bool active;
	atomic_bool fatal;
	int64_t down_since;

	/* The verbs objects above (vctx, pd, chans, cqs) and every MR of this
	 * device: read-held by whoever makes or frees one, write-held while
	 * the device is opened again after a fatal error (ctx_revive). */
	GRWLock verbs_lock;
	atomic_bool halt;       /* workers stop now (the device is re-opened) */
	atomic_int nep_live;    /* endpoints not yet destroyed: their QPs */
	atomic_uint revivals;   /* times opened again after a fatal error */
	int64_t revive_note_ms; /* the last "waiting for ..." line */

	/* Slices waiting to be posted through this device. */
	GMutex qlock;
	rd_slice *qhead, *qtail;

	rd_worker *workers;
	int nworkers;
	GThread *async_thread;
	int async_wake;

	/* Every endpoint not yet destroyed, pooled or not: where expire()
	 * finds, by address, the endpoints that carry a transfer. */
	GMutex live_lock;
	rd_ep *live;

	/* The endpoint pool: peer NIC path -> endpoint, SIEVE order. */
	GMutex ep_lock;
	GHashTable *eps;
	rd_ep *head, *tail, *hand;
	unsigned nep;
	atomic_uint ep_seq;

	atomic_ullong slices_done;
};

/* Counts for NIC `c`: a relaxed add in the host, no lock. */
#define RD_COUNT(tr, c, what, delta)                                                           \
	do {                                                                                   \
		if ((tr)->metrics)                                                             \
			(tr)->host->metric_add((tr)->host, (c)->mdev, (what), (int64_t)(delta)); \
	} while (0)

struct rd_slice {
	rd_slice *next;
	te_transfer *t;
	rd_mr *mr;
	rd_seg *seg;
	uint64_t local_addr, remote_addr;
	uint32_t length;
	uint32_t opcode;
	const uint32_t *rkey; /* the remote buffer's, per remote device */
	const rd_loc *lloc, *rloc;
	uint32_t seq;         /* rotation of the path choice */
	uint16_t attempts;
	int16_t ldev, rdev;
	uint64_t tried;       /* bit (ldev * nrdev + rdev) % 64 */
	int last_error;
	bool parked;          /* waited on an endpoint being connected */
	rd_ep *ep;
	int qp;
	uint32_t index;       /* in the pool */
};

/* Test-visible counters. */
typedef struct rd_counters {
	atomic_ullong created, evicted, reclaimed, failed, retries, pauses, rejected;
	GMutex lock;
	unsigned n_evicted;
	char evicted_paths[64][128];
} rd_counters;

struct rd_transport {
	const te_host *host;
	bool metrics; /* the host counts for its transports (ABI 1.6) */
	const rv_verbs *verbs;
	rd_config cfg;
	char *sysfs_root;
	char *local_name;
	rd_topo topo;
	int nctx;
	rd_ctx *ctx[RD_MAX_DEV];

	/* Local registrations, sorted by address. */
	GRWLock mr_lock;
	GPtrArray *mrs;
	/* Every rd_mr not yet freed, unregistered ones in use included: what
	 * a device opened again must deregister from its dead context. */
	GMutex live_lock;
	GHashTable *live;

	/* Transfers submitted and not yet cut into slices. */
	teu_mon pend;
	te_transfer *pend_head, *pend_tail;
	GThread *dispatcher;
	atomic_bool stopping;

	/* The slice pool: a lock-free stack of indices with an ABA tag. */
	rd_slice *slices;
	atomic_uint *free_next; /* the free list's links, by slice index */
	/* By slice index: 1 + the index of the NIC whose send queue holds it,
	 * 0 when none. Written only by that NIC's workers, so with them
	 * stopped the NIC's posted slices are known (a dead device that never
	 * flushes them). Apart from the slices: a pool get clears those. */
	atomic_int *posted_on;
	/* By slice index, while it is posted: its transfer and endpoint, as
	 * numbers (expire() compares them, never follows them). */
	_Atomic uintptr_t *posted_t, *posted_ep;
	unsigned nslices;
	_Atomic uint64_t free_top;
	teu_mon pool;
	atomic_int pool_waiters;
	atomic_uint route_seq;

	GThread *reclaimer;
	teu_mon reclaim;
	bool reclaim_kick; /* (reclaim.lock) an endpoint came: the reclaimer plans again */

	/* Deadlines (ABI 1.11): the host brackets posts with transfer_enter/
	 * leave; expire() waits on `expire` for a transfer's posted slices. */
	bool deadlines;
	teu_mon expire;

	rd_counters stats;
	int64_t fail_log_sec; /* under stats.lock */
	unsigned fail_log_count, fail_log_suppressed;
};

/* --------------------------------------------------------------- helpers */

/* A transfer's plugin_data: [0] the pending list's link until it is cut,
 * [1] its failure was logged, [2] the flags below (atomic). */
enum {
	RD_T_EXPIRED = 1u << 0, /* ended by the host: its slices are dropped on sight */
	RD_T_WFAIL = 1u << 1,   /* a WRITE slice of it completed with an error */
};

/* What the slices of a transfer the host ended complete with. Not
 * -ETIMEDOUT: to the host that says the transport gave up waiting, which
 * would leave a WRITE unsettled for good; these slices are done with. */
#define RD_ENDED_ERR (-ECANCELED)
#define RD_ENDED_WHY "ended by its deadline or a cancel"

static inline uintptr_t rd_t_flags(const te_transfer *t)
{
	return __atomic_load_n(&t->plugin_data[2], __ATOMIC_SEQ_CST);
}

static inline bool rd_t_expired(const te_transfer *t)
{
	return (rd_t_flags(t) & RD_T_EXPIRED) != 0;
}

/* Slice `s` is on NIC `c`'s send queue from now on (before the post: its
 * completion may come at once), or no longer. */
static inline void rd_posted_set(rd_transport *tr, const rd_slice *s, int ctx_index)
{
	atomic_store_explicit(&tr->posted_on[s->index], ctx_index + 1, memory_order_relaxed);
	atomic_store_explicit(&tr->posted_ep[s->index], (uintptr_t)s->ep, memory_order_relaxed);
	atomic_store_explicit(&tr->posted_t[s->index], (uintptr_t)s->t, memory_order_seq_cst);
}

static inline void rd_posted_clear(rd_transport *tr, const rd_slice *s)
{
	atomic_store_explicit(&tr->posted_on[s->index], 0, memory_order_relaxed);
	atomic_store_explicit(&tr->posted_t[s->index], 0, memory_order_seq_cst);
}

int64_t rd_now_ms(void);
#define RD_LOG(tr, lvl, ...) ((tr)->host->log((tr)->host, (lvl), __VA_ARGS__))

/* rdma-context.c */
int rd_ctx_open(rd_transport *tr, int index, struct ibv_device *dev, rd_ctx **out, GString *err);
void rd_ctx_close(rd_ctx *c);
int rd_ctx_start(rd_ctx *c);
void rd_ctx_stop(rd_ctx *c);
/* Takes the context out of service (down) or back in. */
void rd_ctx_set_active(rd_ctx *c, bool active, const char *why);
/* Re-reads the port; brings the context back when it is active again. A
 * context dead of a fatal error is opened anew instead, once the device
 * was reset: only from the reclaimer's thread. */
void rd_ctx_check_port(rd_ctx *c);
/* A consistent copy of the context's GID and its index. */
void rd_ctx_gid(rd_ctx *c, uint8_t gid[16], int *index);
/* Chooses the GID again (the port's table changed); endpoints made with the
 * old one are dropped, to be rebuilt. false when no GID is usable now. */
bool rd_ctx_refresh_gid(rd_ctx *c);
void rd_ctx_kick(rd_ctx *c);
void rd_ctx_enqueue(rd_ctx *c, rd_slice *head, rd_slice *tail, bool front);
int rd_pick_gid(const rv_verbs *v, struct ibv_context *vctx, uint8_t port, int want, int *index,
		uint8_t gid[16], GString *why);

/* rdma-endpoint.c */
void rd_ep_unref(rd_ep *ep);
void rd_ep_fail(rd_ep *ep, int error, const char *why);
/* Resolves the endpoint of each slice (all on this context). Slices whose
 * endpoint is ready go to `ready` with a reference in s->ep; the others are
 * parked on their endpoint. Endpoints created here are returned in `connect`
 * (referenced, with a copy of the name of the segment the slice asking for
 * them was of, which the caller frees: the slice, and its segment, may be
 * gone by then) for the caller to connect outside any lock. Returns how many
 * are ready. */
int rd_ep_resolve(rd_ctx *c, rd_slice **in, int n, rd_slice **ready, rd_ep **connect, char **connect_name,
		  int *nconnect);
/* The handshake of a new endpoint with segment `seg_name`'s peer, on the
 * device its peer_nic_path names. */
int rd_ep_connect(rd_ep *ep, const char *seg_name);
int rd_ep_handle(void *user, const char *peer, const char *body, size_t len, char **reply,
		 size_t *reply_len);
void rd_ep_pool_clear(rd_ctx *c);
/* Fails the pooled endpoint owning `qp` (an async QP error event). */
void rd_ep_fail_qp(rd_ctx *c, struct ibv_qp *qp, const char *why);
/* Moves every endpoint's QPs to the error state (shutdown). */
void rd_ep_pool_flush(rd_ctx *c);
/* Fails the live endpoints of this context whose addresses are among
 * `keys` (n of them), as fenced: out of the pool, QPs in ERR. Returns how
 * many. */
int rd_ep_fence(rd_ctx *c, const uintptr_t *keys, int n, const char *why);
/* Takes the slices of `t` parked on this context's endpoints; returns them
 * as a list. */
rd_slice *rd_ep_take_parked(rd_ctx *c, const te_transfer *t);
/* Closes idle endpoints; returns when the next pass is due for this
 * context's endpoints (ms; INT64_MAX: none until an endpoint comes). */
int64_t rd_ep_reclaim(rd_ctx *c, int64_t now, int64_t interval);
/* An endpoint was added or a device went down: the reclaimer looks again. */
void rd_reclaimer_kick(rd_transport *tr);
unsigned rd_ep_count(rd_ctx *c);

/* ------------------------------------------------------------- provider */

/*
 * Where an instance's verbs and sysfs come from: the one seam between the
 * shipped plugin and the tests' copy of it. The shipped plugin links
 * rdma-provider.c (libibverbs and the kernel's /sys, whatever the environment
 * says). The tests build a second, uninstalled copy from the same sources
 * with tests/rdma/soft-verbs/soft-provider.c in its place.
 */
typedef struct rd_provider {
	const rv_verbs *verbs;
	const char *sysfs_root; /* valid while the host's configuration is */
} rd_provider;

void rd_provider_get(const te_host *h, rd_provider *out);
/* An instance is up (true) or about to be destroyed (false). */
void rd_provider_track(rd_transport *tr, bool up);

/* rdma-handshake.c: JSON from outside, through te_json_load() with `lim`; NULL
 * and a line naming `what` and the fault in `err` when refused. */
JsonNode *rd_json_load(const char *text, size_t len, const te_json_limits *lim, const char *what,
		       GString *err);
/* Member `name` of `o` as a string; NULL when missing, NULL and *bad set
 * when it is there but not a string. */
const char *rd_json_str(JsonObject *o, const char *name, bool *bad);

/* rdma-config.c */
/* The install arguments (json_args), parsed. */
typedef struct rd_args {
	GPtrArray *devices;   /* allow-list, or NULL */
	JsonObject *matrix;   /* user priority matrix, or NULL */
	JsonNode *root;       /* owns the arguments */
	JsonNode *mroot;      /* owns a matrix given as a JSON string */
} rd_args;
void rd_read_config(const te_host *h, rd_config *c);
void rd_args_clear(rd_args *a);
int rd_parse_args(const char *text, rd_args *a, GString *err);
int rd_select_devices(const rv_verbs *v, const char *root, GPtrArray *allow,
		      struct ibv_device ***list_out, int *num_out, GPtrArray *names, GString *err);
GPtrArray *rd_env_devices(const te_host *h);

/* rdma-slice.c */
void rd_pool_put(rd_transport *tr, rd_slice *s);
rd_slice *rd_pool_try_get(rd_transport *tr);
bool rd_failure_log_allowed(rd_transport *tr, te_transfer *t, unsigned *suppressed);
void rd_slice_fail(rd_transport *tr, rd_slice *s, int error, const char *why);
void rd_slice_done(rd_transport *tr, rd_slice *s);
int rd_route(rd_transport *tr, rd_slice *s, bool allow_tried);
/* Routes a failed (or displaced) slice again, or fails it when no path is
 * left; drops its endpoint reference. */
void rd_slice_retry(rd_transport *tr, rd_slice *s, int error, const char *why);
/* As rd_slice_retry for a slice flushed from an endpoint fenced for another
 * transfer: not the path's failure, so no attempt is counted. */
void rd_slice_resend(rd_transport *tr, rd_slice *s, const char *why);

/* rdma-deadline.c */
int rd_expire(void *ctx, te_transfer *t);
/* A posted slice of an ended transfer came back: expire() looks again. */
void rd_expire_wake(rd_transport *tr);

/* rdma-worker.c */
gpointer rd_worker_thread(gpointer data);

/* rdma-dispatcher.c */
gpointer rd_dispatcher_thread(gpointer data);
gpointer rd_reclaimer_thread(gpointer data);
int rd_submit(void *ctx, te_transfer *const *ts, size_t n);

/* rdma-mr.c */
void rd_mr_unref(rd_mr *m);
/* Registers `m` with device `dev` where it is not; its verbs_lock held. */
int rd_mr_reg_locked(rd_transport *tr, rd_mr *m, int dev);
/* Drops `m`'s registration with device `dev`; its verbs_lock held. */
void rd_mr_dereg_locked(rd_transport *tr, rd_mr *m, int dev);
/* The buffer's fields for the descriptor: {"lkey": [...], "name", "rkey": [...]}. */
char *rd_mr_json(rd_transport *tr, rd_mr *m);
int rd_mem_register(void *ctx, const te_mem_info *mem, char **json);
int rd_mem_unregister(void *ctx, void *addr, size_t length);

/* rdma-segment.c */
int rd_segment_open(void *ctx, const te_segment_info *info, void **seg_ctx);
void rd_segment_close(void *ctx, void *seg_ctx);

#endif
