/* SPDX-License-Identifier: Apache-2.0 */
/* Private to the NVMe-oF transport plugin. */
#ifndef TE_NVMEOF_H
#define TE_NVMEOF_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include <glib.h>
#include <liburing.h>

#include <te/te-plugin.h>

#include "teu-mon.h"

#define NV_DEFAULT_DEPTH 128u
#define NV_MAX_DEPTH 4096u
#define NV_DEFAULT_SLICE (1u << 20)
#define NV_MIN_SLICE 4096u
#define NV_MAX_SLICE (1u << 30) /* well below the kernel's ~2 GiB per read/write */
#define NV_DEFAULT_WORKERS 2u
#define NV_MAX_WORKERS 64u
#define NV_DEFAULT_COALESCE_US 50u
#define NV_MAX_COALESCE_US 10000u
#define NV_DEFAULT_REAP_TICK_MS 100u
#define NV_DEFAULT_SPIN_US 50u
#define NV_MAX_SPIN_US 1000u
#define NV_MAX_REAP_TICK_MS 1000u
#define NV_DEFAULT_FIXED_FILES 1024u
#define NV_MAX_FIXED_FILES 32768u

/* Descriptors are JSON from the store: bounded before they are parsed. The
 * format nests 4 deep (object, buffers, buffer, local_path_map); the rest is
 * room for fields this plugin does not read. Files per segment and hosts per
 * file stay far below NV_DESC_MAX_ITEMS; a path is at most PATH_MAX bytes,
 * a few times that when written with escapes. */
#define NV_DESC_MAX_DEPTH 8u
#define NV_DESC_MAX_ITEMS 16384u
#define NV_DESC_MAX_VALUES 262144u
#define NV_DESC_MAX_STRING (4u * 4096u)
#define NV_DESC_MAX_TEXT (8u << 20)

/* Error lines per file: the first few, then one in NV_LOG_EVERY. A failing
 * device must not drown the log with one line per 4 KiB slice. */
#define NV_LOG_FIRST 16u
#define NV_LOG_EVERY 1024u

typedef struct nv_ctx nv_ctx;

/* One file of a segment: the buffer `index` of its descriptor. */
typedef struct nv_file {
	char *path;        /* resolved for this host */
	uint64_t start;    /* first byte of this file in the segment */
	uint64_t length;   /* as the descriptor declares */
	uint64_t size;     /* as found at open (0 when unavailable) */
	int fd;            /* buffered I/O; -1 when the file is unavailable */
	int dfd;           /* O_DIRECT; -1 when direct I/O is impossible */
	int fixed, dfixed; /* fd and dfd in the rings' file tables; -1: not there */
	int err;           /* why fd is -1: a negative errno */
	bool writable;
	bool blockdev;
	uint32_t mem_align; /* O_DIRECT alignment of memory, offset and length */
	uint32_t off_align;
	atomic_int direct;  /* cleared when the kernel refuses direct I/O at run time */
	atomic_uint errors; /* error lines logged, for rate limiting */
	/* The host's counters of this file (ABI 1.6, the path as the device);
	 * NULL: the transport's own, or counting is off. */
	te_metric_dev *mdev;
} nv_file;

typedef struct nv_segment {
	char *name;
	nv_file *files;
	size_t n_files;
	uint64_t total; /* sum of the declared lengths */
} nv_segment;

/* A finished slice waiting for its complete() call, made without the lock. */
typedef struct nv_done {
	te_transfer *t;
	uint64_t bytes;
	int err;
} nv_done;

/* The completions of one pass over the ring: queued in `done` (up to `cap`)
 * for complete() calls once the lock is released, else made at once. */
typedef struct nv_pass {
	nv_done *done;
	uint32_t n, cap;
	uint32_t completed; /* complete() calls made or queued */
} nv_pass;

/* Who collects completions from the ring (caller submission): nobody, an
 * application thread inside progress(), or the worker. */
enum { NV_ROLE_FREE = 0, NV_ROLE_APP = 1, NV_ROLE_WORKER = 2 };

/* One I/O in flight: a slice of a transfer within one file. */
typedef struct nv_slot {
	te_transfer *t;
	nv_file *f;
	char *buf;
	uint64_t off;   /* file offset of the slice's first byte */
	uint32_t len;
	uint32_t done;  /* bytes moved so far (short reads/writes resubmit the rest) */
	uint16_t retries;
	bool direct;
	bool write;
} nv_slot;

typedef struct nv_worker {
	nv_ctx *ctx;
	unsigned index;
	GThread *thread;
	struct io_uring ring;
	int efd;              /* submitters wake a sleeping worker through it */
	uint64_t efd_val;
	_Atomic(te_transfer *) inbox; /* pushed by submit(), taken whole by the worker */
	atomic_int sleeping;  /* blocked in the kernel with free slots */
	atomic_uint queued;   /* slices pushed since the worker last took the inbox */
	atomic_uint want;     /* wake the sleeping worker once `queued` reaches this */
	uint32_t freed;       /* slots freed by the last completions reaped */
	atomic_int stop;
	/* Caller submission: the submission side (FIFO, free slots, SQ ring)
	 * under this lock, held only while slices become SQEs and are submitted
	 * and while completions are taken from the ring. */
	GMutex lock;
	/* Caller submission, collecting completions: one thread at a time holds
	 * the role (it alone reads the completion ring, and may sleep in the
	 * kernel for completions while holding it). Application threads waiting
	 * in progress() take it; others waiting meanwhile sleep on `cv`. The
	 * worker takes it only once application threads stopped collecting. */
	atomic_int role;
	atomic_int app_called;       /* progress() was called since the worker's last look */
	atomic_uint app_waiters;     /* threads inside a blocking progress() */
	atomic_uint secondaries;     /* threads waiting on cv */
	teu_mon cv;
	teu_mon lazy;                /* the worker's sleep while applications collect */
	bool lazy_kick;
	bool ext_arg;                /* the kernel takes a timeout with GETEVENTS */
	bool fixed_failed;           /* no registered file table for this ring */
	int64_t last_wait_ns;        /* the role holder's last wait (theirs alone) */
	nv_slot *slots;
	uint32_t *free_slots;
	uint32_t n_free;
	uint32_t depth;
	te_transfer *head, *tail; /* transfers with slices not yet issued */
	/* start-up handshake with create() */
	teu_mon start;
	int start_rc;
	bool started;
} nv_worker;

struct nv_ctx {
	const te_host *host;
	bool metrics; /* the host counts for its transports (ABI 1.6) */
	uint32_t depth;
	uint64_t slice;
	unsigned n_workers;
	bool use_direct;
	uint64_t coalesce_ns; /* longest wait to gather resubmissions into one batch */
	bool dsync;
	bool caller_submit; /* submit() puts SQEs into the ring itself */
	int64_t reap_tick_ns; /* the worker's look at whether applications still collect */
	int64_t spin_ns;      /* a waiting thread's look for completions before it sleeps */
	/* Registered files (caller submission): each ring has a table of this
	 * many entries, handed out to the segments' descriptors. */
	uint32_t n_fixed;
	GMutex fixed_lock;
	uint32_t *fixed_free;
	uint32_t n_fixed_free;
	atomic_uint next_worker;
	nv_worker *workers;
	/* TE_NVMEOF_ALLOW: absolute paths, NULL-terminated; allow_text as set
	 * (NULL when unset), for log lines */
	char **allow;
	char *allow_text;
};

/* transfer->plugin_data slots, owned by the plugin while a transfer is in it */
enum {
	NV_PD_NEXT = 0,   /* te_transfer* link in the inbox / the worker's FIFO */
	NV_PD_CURSOR = 1, /* bytes already handed to slots */
	NV_PD_FILE = 2,   /* file index of the cursor */
	NV_PD_ERROR = 3,  /* negative error to end the unissued slices with */
};

/* nvmeof-segment.c */
int nv_segment_open(nv_ctx *c, const te_segment_info *seg, nv_segment **out);
void nv_segment_close(nv_ctx *c, nv_segment *s);
/* Index of the file holding segment byte `pos` (pos < s->total). */
size_t nv_segment_find(const nv_segment *s, uint64_t pos);
/* Number of slices [pos, pos+len) splits into, starting in file `fi`. */
uint32_t nv_count_slices(const nv_segment *s, size_t fi, uint64_t pos, uint64_t len, uint64_t slice);
/* Logs an error about a file, rate limited per file. */
void nv_file_log(nv_ctx *c, nv_file *f, int level, const char *fmt, ...) TE_PRINTF(4, 5);

/* nvmeof-allow.c */
/* The entries of a TE_NVMEOF_ALLOW value (NULL: none), NULL-terminated;
 * relative ones are dropped with a warning. g_strfreev() frees them. */
char **nv_allow_parse(const te_host *h, const char *text);
/* Whether the store may make this host open `path`: 0 with its canonical
 * form in *resolved (free()) and its lstat() in *st when TE_NVMEOF_ALLOW
 * allows it and it is a regular file or a block device named in the list;
 * TE_ERR_REJECTED when not; -errno when it cannot be looked at (-ENOENT,
 * -EISDIR, ...). `why` says which, for a log line. */
int nv_path_check(nv_ctx *c, const char *path, char **resolved, struct stat *st, char *why, size_t whylen);
/* Opens a path nv_path_check() passed without following any symlink, and
 * only if it is still the inode `want` describes. The fd or -errno. */
int nv_open_resolved(const char *rp, int flags, const struct stat *want);
/* Text for a file's open error (g_strerror(), and the plugin's own). */
const char *nv_strerror(int err);

/* nvmeof-worker.c */
int nv_workers_start(nv_ctx *c);
void nv_workers_stop(nv_ctx *c);
/* nvmeof-io.c */
/* Queues a chain of transfers (linked newest first through NV_PD_NEXT,
 * `oldest` last) holding `slices` slices on a worker, and wakes it if it
 * sleeps and waits for no more. */
void nv_worker_push(nv_worker *w, te_transfer *newest, te_transfer *oldest, uint32_t slices);
/* nvmeof-caller.c */
/* The same with caller submission: queues the chain (may be empty) and
 * submits what fits into free slots from the calling thread; transfers of
 * `failed` (linked the same way, error in NV_PD_ERROR) end through the ring. */
void nv_worker_submit(nv_worker *w, te_transfer *newest, te_transfer *oldest, te_transfer *failed);
/* The transport's progress and wake ops (see te-plugin.h). */
int nv_progress(nv_ctx *c, int (*done)(void *arg), void *arg, int64_t timeout_ns);
void nv_wake(nv_ctx *c);
/* nvmeof-worker.c */
/* Registers `fd` in every ring's file table; its index, or -1 (the table
 * is full or absent: requests then name the descriptor itself). */
int nv_fixed_add(nv_ctx *c, int fd);
void nv_fixed_remove(nv_ctx *c, int idx);
/* Whether an io_uring can be created here; fills `why` when not. */
int nv_uring_probe(char *why, size_t why_len);

/* The rings' internals, shared by nvmeof-io.c (slices and their completions),
 * nvmeof-worker.c (the threads, worker submission) and nvmeof-caller.c (caller
 * submission). */
#define NV_WAKE_TAG (UINT64_MAX - 2) /* a no-op posted to wake the collector */
#define NV_PASS_CQES 32u /* completions taken from the ring per lock hold */
#define NV_PASS_DONE (2 * NV_PASS_CQES)

static inline te_transfer *pd_next(const te_transfer *t)
{
	return (te_transfer *)t->plugin_data[NV_PD_NEXT];
}

/* nvmeof-io.c */
/* Writes the worker's eventfd, which wakes it where it waits for one. */
void nv_efd_wake(nv_worker *w);
/* Moves everything pushed so far to the end of the worker's FIFO, oldest first. */
void nv_take_inbox(nv_worker *w);
/* A free submission entry of the ring, or NULL. */
struct io_uring_sqe *nv_get_sqe(nv_worker *w);
/* Polls the worker's eventfd through the ring (NV_POLL_TAG). */
void nv_arm_wake(nv_worker *w);
/* Makes the complete() calls a pass queued. */
void nv_pass_flush(const te_host *h, nv_pass *p);
/* Caller submission: ends `count` slices of `t` with `err` through the ring. */
void nv_fail_via_ring(nv_worker *w, te_transfer *t, uint32_t count, int err, nv_pass *p);
/* Hands slices of the queued transfers to free slots. */
void nv_issue(nv_worker *w, nv_pass *p);
/* Handles up to `max` completions from the ring; returns how many. */
unsigned nv_reap(nv_worker *w, nv_pass *p, unsigned max);

/* nvmeof-caller.c */
/* Wakes the worker wherever it sleeps (the ring, or between its looks). */
void nv_kick_worker(nv_worker *w);
/* The worker's loop under caller submission. */
void nv_caller_loop(nv_worker *w);

#endif
