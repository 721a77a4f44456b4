/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The same-host transport's private structures.
 *
 * A target publishes, in its descriptor, who it is (host identity, pid, uid)
 * and a unix socket. An initiator on the same host connects there once per
 * segment version: the target answers with a memfd of its control block and
 * the memfds of its shared allocations (te_mem_alloc memory), which the
 * initiator maps. Data then moves with one copy and no help from the target:
 * memcpy through the mapped allocations, or cross-memory attach
 * (process_vm_readv/writev, many requests per call) for other memory.
 *
 * Device memory (a GPU's) is exported by the device plugin instead
 * (te_host.device_ipc_export: a CUDA IPC handle, or a file descriptor), the
 * initiator opens it in its own process (device_ipc_open) and copies with
 * the device plugin (device_copy): between the target's device and the
 * initiator's host memory, the host staging the initiator's device memory.
 *
 * The control block, shared by the target and its initiators, holds one slot
 * per remote-accessible registered region. An initiator pins a slot (an atomic
 * counter in it) around each copy and checks the slot is still live; the
 * target marks a slot dying and waits for its pins before an unregister
 * returns. The target's range checks are thus the slots: a request outside a
 * live slot is refused.
 */
#ifndef TE_SHM_INTERNAL_H
#define TE_SHM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <glib.h>

#include <te/te-plugin.h>

#define SHM_MAGIC 0x4d485354u /* "TSHM" */
#define SHM_VERSION 2 /* 2: device memory exports */
#define SHM_HOST_MAX 160
#define SHM_CTL_HEADER 512
#define SHM_MAX_EXPORTS 240 /* memfds handed over in one answer (SCM_MAX_FD is 253) */
#define SHM_CMA_IOV 64      /* requests per process_vm_readv/writev call */
/* Small whole requests one copying thread takes from the queue at once (up
 * to a slice's bytes): a KV cache's thousands of 4 KiB blocks go in runs of
 * a thousand, one take of the queue's lock and one hand-off each. */
#define SHM_RUN_MAX 1024
/* Pieces below this size of a take of at least TE_SHM_STREAM_BYTES are
 * copied with streaming (non-temporal) stores; larger ones by memcpy, whose
 * own large-copy path does as well. */
#define SHM_STREAM_PIECE_MAX (256u << 10)
#define SHM_FIELD "libte_shm" /* the descriptor field (Mooncake decoders ignore it) */

enum { SLOT_FREE = 0, SLOT_LIVE = 1, SLOT_DYING = 2 };
enum { SLOT_HOST = 0, SLOT_DEVICE = 1 }; /* a slot's memory */
enum { EXPORT_HOST = 0, EXPORT_DEVICE = 1 }; /* an export's kind */

/* One registered, remote-accessible region of the target. 64 bytes. */
typedef struct shm_slot {
	_Atomic uint64_t state; /* generation << 2 | SLOT_* */
	_Atomic uint64_t addr;  /* in the target's address space */
	_Atomic uint64_t length;
	_Atomic int64_t pins;   /* initiators' copies in progress */
	_Atomic int32_t export_idx; /* shared allocation holding it, -1: none */
	_Atomic uint32_t kind;      /* SLOT_HOST, SLOT_DEVICE (reachable only through its export) */
	_Atomic uint64_t export_off; /* addr's offset in that allocation */
	uint64_t pad[2];
} shm_slot;

typedef struct shm_ctl {
	uint32_t magic, version;
	uint32_t nslots;
	_Atomic uint32_t high; /* slots at or above this were never used */
	uint64_t pid;
	char host[SHM_HOST_MAX];
} shm_ctl;

#define SHM_SLOTS(ctl) ((shm_slot *)((char *)(ctl) + SHM_CTL_HEADER))

static inline uint64_t slot_state(uint64_t s)
{
	return s & 3;
}

/* First contact: initiator -> target. */
typedef struct shm_hello {
	uint32_t magic, version;
	uint64_t pid;
	char host[SHM_HOST_MAX];
} shm_hello;

/* One export in the answer. */
typedef struct shm_export_wire {
	uint64_t base, size; /* the allocation in the target's address space */
	uint32_t kind;       /* EXPORT_* */
	uint32_t has_fd;     /* it has a descriptor in the SCM_RIGHTS array */
	char location[32];   /* device: the target's location of it ("cuda:0") */
	te_device_ipc ipc;   /* device: the plugin's handle (fd: see has_fd) */
} shm_export_wire;

/* The answer, with SCM_RIGHTS: the control block's memfd, then the
 * descriptor of each export that has one, in order. */
typedef struct shm_welcome {
	uint32_t magic, version;
	uint64_t pid;
	char host[SHM_HOST_MAX];
	uint64_t ctl_addr; /* where the target maps its control block: a CMA probe reads there */
	uint64_t ctl_size;
	uint32_t nexports;
	uint32_t status;   /* 0, or an errno for a refused hello */
	shm_export_wire exports[SHM_MAX_EXPORTS];
} shm_welcome;

/* --------------------------------------------------------------- config */

typedef struct shm_config {
	unsigned threads;        /* copy workers */
	uint64_t inline_bytes;   /* submits up to this many bytes are copied by the caller */
	uint64_t slice;          /* larger requests are split for the workers */
	uint64_t caller_bytes;   /* a waiting caller copies queued submits up to this alone */
	uint64_t stream_bytes;   /* a take of at least this many bytes streams its small pieces; 0: never */
	int64_t spin_ns;         /* TE_SPIN_US: a waiting caller's look for its completions before it sleeps */
	unsigned max_regions;    /* slots in the control block */
	int64_t unregister_timeout_ms;
	bool cma;                /* use cross-memory attach */
	bool grant_ptrace;       /* let initiators attach where Yama asks for consent */
	char dir[256];           /* where the socket lives */
	char host[SHM_HOST_MAX]; /* this host's identity */
} shm_config;

/* ---------------------------------------------------------------- types */

typedef struct shm_ctx shm_ctx;

/* A shared allocation (or device allocation) the target hands to
 * initiators. */
typedef struct shm_export {
	int fd; /* ours (a dup of the host's, or the device plugin's); -1: none */
	uint64_t base, size;
	uint32_t kind; /* EXPORT_* */
	char location[32]; /* device: its location, and how other processes open it */
	te_device_ipc ipc; /* (its fd is -1: `fd` above holds it) */
} shm_export;

/* An initiator's view of one target (one segment version). */
typedef struct shm_seg {
	shm_ctx *ctx;
	int fd;        /* the connection; its hang-up means the target went away */
	pid_t pid;
	bool self;     /* the target is this process: its addresses are ours */
	bool cma;      /* process_vm_readv/writev allowed */
	atomic_bool dead;
	shm_ctl *ctl;
	size_t ctl_size;
	struct {
		uint64_t base, size;
		char *local; /* our mapping, or where the device allocation opened here */
		bool device;
		char location[32];
	} maps[SHM_MAX_EXPORTS];
	unsigned nmaps;
	atomic_uint hint; /* the slot last used */
	char name[128];
	struct shm_seg *next; /* the context's list of segments, for the watcher */
} shm_seg;

struct shm_ctx {
	const te_host *host;
	te_complete_many_fn complete_many; /* the host's, or NULL */
	shm_config cfg;

	/* target side */
	int ctl_fd;
	shm_ctl *ctl;
	size_t ctl_size;
	pthread_mutex_t reg_lock; /* slots' allocation, exports */
	shm_export exports[SHM_MAX_EXPORTS];
	unsigned nexports;
	int listen_fd;
	char sock_path[512];
	bool granted; /* PR_SET_PTRACER done */
	GHashTable *clients; /* control thread's: fd -> first-contact deadline (0: attached) */

	/* the control thread: accepts first contacts, watches connections */
	pthread_t ctl_thread;
	int ep;
	int wake_fd;
	atomic_bool stop;
	pthread_mutex_t seg_lock; /* segments list and the watcher's use of them */
	shm_seg *segs;

	/* copy workers, and the callers waiting in progress(): both draw from
	 * the queue (q_lock) */
	pthread_t *workers;
	unsigned nworkers;
	pthread_mutex_t q_lock;
	pthread_cond_t q_cond;     /* workers sleep here */
	pthread_cond_t p_cond;     /* callers in progress() sleep here (CLOCK_MONOTONIC) */
	te_transfer *q_head, *q_tail;
	atomic_bool q_any;         /* q_head != NULL, for looks without the lock */
	atomic_bool q_lazy;        /* queued work no worker was told of */
	bool kick_armed;           /* q_lock: the kick timer runs */
	int kick_fd;               /* timerfd: workers are told of lazy work after SHM_KICK_NS */
	atomic_uint p_sleepers;    /* callers asleep on p_cond or about to be */
	atomic_uint copiers;       /* threads copying queued work (workers, waiting callers) */
	/* Set for a thread that waited in progress() since its last queued
	 * submit. A key, not _Thread_local: a dlopen()ed module's TLS trips
	 * LeakSanitizer's scan of threads (and a key is per instance). */
	pthread_key_t waiter_key;
	/* The bytes a thread copied in its submits lately (see inline_ok()):
	 * a value, not a pointer, so that nothing is left behind per thread. */
	pthread_key_t streak_key;
	bool q_stop;
};

/* How long queued work waits for the caller that was expected to copy it
 * (it waited for its previous submit) before the workers are told of it. */
#define SHM_KICK_NS 1000000

#define SLOG(c, lvl, ...) (c)->host->log((c)->host, (lvl), __VA_ARGS__)

/* What a control-thread epoll event stands for (the top two bits of its
 * data; the rest is a file descriptor). */
enum { W_WAKE, W_LISTEN, W_CLIENT, W_SEG };

/* shm-plugin.c */
int shm_watch(shm_ctx *c, int fd, int kind);

/* shm-target.c */
int shm_target_start(shm_ctx *c);
void shm_target_stop(shm_ctx *c);
int shm_target_register(shm_ctx *c, const te_mem_info *mem);
int shm_target_unregister(shm_ctx *c, void *addr, size_t length);
void shm_target_accept(shm_ctx *c);
int shm_target_hello(shm_ctx *c, int fd);
void shm_target_client(shm_ctx *c, int fd);
/* Closes connections silent past their first-contact deadline; returns how
 * many still wait for their first message (0: no deadline to watch). */
int shm_target_sweep(shm_ctx *c);
void shm_target_drop_clients(shm_ctx *c);

/* shm-contact.c */
int shm_segment_open(shm_ctx *c, const te_segment_info *seg, shm_seg **out);
void shm_segment_close(shm_ctx *c, shm_seg *s);

/* shm-copy.c: one piece of a transfer, [off, off+len) of it; shm_run_all()
 * copies pieces and completes them, grouped by (segment, opcode) in runs
 * of up to SHM_CMA_IOV. */
typedef struct shm_piece {
	te_transfer *t;
	uint64_t off, len;
} shm_piece;
void shm_run_all(shm_ctx *c, shm_piece *ps, unsigned n);
bool shm_stream_supported(void);

/* shm-queue.c */
int shm_submit(shm_ctx *c, te_transfer *const *t, size_t n);
int shm_progress(shm_ctx *c, int (*done)(void *), void *arg, int64_t timeout_ns);
void shm_wake(shm_ctx *c);
void shm_kick(shm_ctx *c);
int shm_workers_start(shm_ctx *c);
void shm_workers_stop(shm_ctx *c);

#endif
