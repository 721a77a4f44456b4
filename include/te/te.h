/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libte: a zero-copy, batched, asynchronous transfer engine.
 *
 * This header is the whole public API. It includes only standard C headers and
 * promises a stable ABI within one major version: handles are opaque, the few
 * plain structs never change layout (new needs get new functions, or a struct
 * versioned by a leading `size` field), and every function returns 0 or a
 * positive value on success and a negative error code on failure.
 */
#ifndef TE_TE_H
#define TE_TE_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TE_API __attribute__((visibility("default")))
#else
#define TE_API
#endif

#define TE_ABI_MAJOR 1
#define TE_ABI_MINOR 6

/* ------------------------------------------------------------------ errors */

/*
 * Errors are negative numbers: -errno values (-EINVAL, -ENOMEM, -ENOENT,
 * -EBUSY, -ETIMEDOUT, -EEXIST, -ENOTSUP, -ECONNREFUSED, ...) or libte's own
 * codes below, which lie above errno's range. te_strerror() names both.
 */
enum {
	TE_ERR_BASE = 4096,
	TE_ERR_PLUGIN = -(TE_ERR_BASE + 1),      /* a plugin could not be loaded or failed */
	TE_ERR_NO_TRANSPORT = -(TE_ERR_BASE + 2), /* no installed transport reaches the segment */
	TE_ERR_METADATA = -(TE_ERR_BASE + 3),    /* the metadata store failed or holds bad data */
	TE_ERR_PROTOCOL = -(TE_ERR_BASE + 4),    /* a peer broke the wire protocol */
	TE_ERR_REJECTED = -(TE_ERR_BASE + 5),    /* a peer refused the request */
	TE_ERR_BATCH_FULL = -(TE_ERR_BASE + 6),  /* more requests than the batch's capacity */
	TE_ERR_ADDRESS = -(TE_ERR_BASE + 7),     /* memory not registered, or range outside a buffer */
	TE_ERR_OVERLAP = -(TE_ERR_BASE + 8),     /* registration overlaps an existing one */
	TE_ERR_SEGMENT = -(TE_ERR_BASE + 9),     /* unknown or closed segment id */
	TE_ERR_BATCH = -(TE_ERR_BASE + 10),      /* unknown or freed batch id */
	TE_ERR_AUTH = -(TE_ERR_BASE + 11),       /* peer authentication failed or keys differ */
};

/* Text for an error code (negative) or 0. Never NULL; static storage. */
TE_API const char *te_strerror(int err);

/* "1.2.0": the library's version; its major and minor are TE_ABI_MAJOR and
 * TE_ABI_MINOR of the library that runs (docs/abi.md). */
TE_API const char *te_version(void);

/* The text of the last error libte logged on the calling thread ("" when
 * none since the last te_last_error_clear() on this thread). Language
 * bindings clear it before a call and attach it to the error they raise, so
 * the message says what was wrong ("unknown segment id 7"), not only its
 * class. Thread-local storage, valid until the thread's next libte call.
 * Since 1.1. */
TE_API const char *te_last_error(void);
TE_API void te_last_error_clear(void);

/* ----------------------------------------------------------------- logging */

enum te_log_level {
	TE_LOG_ERROR = 0,
	TE_LOG_WARN = 1,
	TE_LOG_INFO = 2,
	TE_LOG_DEBUG = 3,
	TE_LOG_TRACE = 4,
};

/* Receives every log line at or below the current level. `domain` names the
 * part of libte or the plugin that logged ("te", "tcp", "etcd", ...). */
typedef void (*te_log_fn)(int level, const char *domain, const char *msg, void *user);

/*
 * NULL restores the default handler (stderr). Process-wide. The handler is
 * called outside every lock of libte, from whichever thread logs (several at
 * once), so it may call libte itself (a line it logs goes to stderr, not back
 * into it) and may take locks of its own, such as a language runtime's, that
 * other threads hold while calling libte. Called from outside a handler, this
 * returns once no thread is inside the handler it replaced any more (its
 * `user` may be freed then); it waits for them, so do not call it holding a
 * lock that handler takes (a binding releases its interpreter lock around
 * it). Called from inside a handler, it swaps and returns at once, without
 * that guarantee.
 */
TE_API void te_set_log_handler(te_log_fn fn, void *user);
/* The initial level is read from TE_LOG_LEVEL (or MC_LOG_LEVEL):
 * error|warn|warning|info|debug|trace or 0..4; default warn. */
TE_API void te_set_log_level(int level);
TE_API int te_get_log_level(void);
/* Logs one line through libte's level and handler under `domain`, for the
 * layers built on te.h (language bindings, compatibility libraries), so their
 * lines land where libte's do. An error line also becomes the calling
 * thread's te_last_error(). Since 1.1. */
TE_API void te_log_write(int level, const char *domain, const char *msg);

/* ------------------------------------------------------------------ engine */

typedef struct te_engine te_engine;

/* A key/value option for te_engine_create(). Known keys:
 *   rpc_port         RPC/handshake port (default: the name's port, else a
 *                    free one in TE_MIN_RPC_PORT..TE_MAX_RPC_PORT, 15000..17000;
 *                    "0": a free one even when the name has a port)
 *   ip_or_host_name  the address peers use to reach this engine
 *                    (default: the host part of the local name)
 *   auto_discovery   "1": install the best transport found (RDMA when devices
 *                    exist, else TCP) at creation
 *   transports       comma list of transports to install at creation
 *   plugin_path      colon list of plugin directories searched before the
 *                    default ones (like TE_PLUGIN_PATH)
 *   TE_UNREGISTER_TIMEOUT_MS  how long te_unregister_memory() waits for
 *                    peers' requests before cutting them off (5000)
 *   TE_DRAIN_TIMEOUT_MS  how long te_engine_destroy() and
 *                    te_transport_uninstall() wait for tasks in flight (60000)
 * Unknown keys are kept and visible to plugins as configuration (a plugin
 * reading TE_TCP_CONNS_PER_PEER sees an option of that name first, then the
 * environment). */
typedef struct te_option {
	const char *key;
	const char *value;
} te_option;

/*
 * Creates an engine. `metadata` is a connection string: "P2PHANDSHAKE" (no
 * store: peers exchange descriptors directly), "etcd://h:p[,h:p...]" or a bare
 * "h:p", "redis://h:p", "http://h:p/path" (a metadata plugin must exist for the
 * scheme). `local_name` names this engine's segment; with P2PHANDSHAKE it is
 * "host" or "host:port" and becomes "host:<rpc port>". NULL means the machine's
 * hostname.
 */
TE_API int te_engine_create(const char *metadata, const char *local_name,
			    const te_option *options, size_t n_options, te_engine **out);
/*
 * Removes what the engine published, stops its threads, frees it. NULL is
 * accepted. Tasks still in flight are canceled and waited for, at most
 * TE_DRAIN_TIMEOUT_MS (an engine option or environment variable; 60000 by
 * default), which the transports' own timeouts (TE_TCP_TIMEOUT_MS) keep
 * them well inside. Should tasks outlive it (a transport that never ends
 * them), the engine is not freed under the threads that will still complete
 * them: it stays allocated (a deliberate leak, logged as an error), its RPC
 * port is closed, its descriptor removed and its registered memory taken
 * from peers as by te_unregister_memory(); the local buffers of those tasks
 * may still be written or read until their transport ends them, so keep
 * them allocated.
 */
TE_API void te_engine_destroy(te_engine *engine);
/* The engine's segment name (for P2PHANDSHAKE: "host:rpc_port"). */
TE_API const char *te_engine_name(const te_engine *engine);
/* The bound RPC port. */
TE_API int te_engine_rpc_port(const te_engine *engine);
/* The address peers reach this engine at (the `ip_or_host_name` it
 * publishes). Since 1.1. */
TE_API const char *te_engine_address(const te_engine *engine);

/* --------------------------------------------------------------- transports */

/* Installs the transport plugin `name` ("tcp", "rdma", "nvmeof", or a
 * third-party one) with optional JSON arguments (e.g. an RDMA NIC priority
 * matrix). Installing an installed transport again returns -EEXIST. */
TE_API int te_transport_install(te_engine *engine, const char *name, const char *json_args);
/* Waits for the tasks handed to the transport, at most TE_DRAIN_TIMEOUT_MS;
 * -EBUSY when they outlive that (the transport stays loaded, unused). */
TE_API int te_transport_uninstall(te_engine *engine, const char *name);
/* Installs the best transport available here: the network transport of
 * highest declared priority whose probe passes (of the shipped ones RDMA
 * when it finds devices, else TCP; see docs/plugins.md); and beside it the same-host transport (shm) when its plugin is
 * present, which then serves the segments of engines on this host. Returns 0
 * and writes the installed network transport's name (may be NULL). */
TE_API int te_transport_auto(te_engine *engine, const char **installed);
/* Writes up to `max` installed transport names; returns how many are installed. */
TE_API int te_transport_list(const te_engine *engine, const char **names, size_t max);

/* -------------------------------------------------------- memory registry */

enum te_mem_flags {
	TE_MEM_REMOTE_ACCESS = 1u << 0, /* peers may READ/WRITE this buffer */
};

/* Registers [addr, addr+length) with every installed transport (and the ones
 * installed later). `location` is "cpu:N", "cuda:N", or "*" (detect the NUMA
 * node with libnuma; unknown → "cpu:0" and a warning). Zero length, a NULL
 * address and overlap with a registered region are refused. */
TE_API int te_register_memory(te_engine *engine, void *addr, size_t length,
			      const char *location, unsigned flags);
/*
 * Unregisters the region starting at `addr`. Waits for the remote requests
 * reading or writing it to finish, at most TE_UNREGISTER_TIMEOUT_MS (an
 * engine option or environment variable; 5000 by default, 0: not at all):
 * then the requests still holding it (a peer that stalls mid-request) are
 * cut off, their connections closed and the peers' transfers failed, and it
 * returns 0 all the same (logged as a warning). Either way, once it has
 * returned no peer's request reads or writes the memory any more: it may be
 * freed or reused. The caller's own transfers from or into it are not waited
 * for; let them end first. Requests of a transport that pins memory the
 * way plugins did before plugin ABI 1.4 (buffer_acquire) are still waited
 * for without bound. -ENOENT when `addr` does not start a registered
 * region.
 */
TE_API int te_unregister_memory(te_engine *engine, void *addr);

/* Allocates `length` bytes (rounded up to pages) of page-aligned, zeroed
 * memory that other processes on this host can map (memfd-backed shared
 * memory). Use it like any memory; registered, it lets a same-host transport
 * (shm) serve peers through a shared mapping of exactly these allocations, one
 * copy and no system call per request. te_mem_free() once it is unregistered
 * from every engine. Since 1.1. */
TE_API int te_mem_alloc(size_t length, void **addr);
/* Frees what te_mem_alloc() returned (the address it returned, exactly). */
TE_API int te_mem_free(void *addr);

typedef struct te_memory_region {
	void *addr;
	size_t length;
	const char *location;
	unsigned flags;
} te_memory_region;

/* All or nothing: on failure nothing stays registered. Publishes once. */
TE_API int te_register_memory_batch(te_engine *engine, const te_memory_region *regions, size_t n);
/* As te_unregister_memory() for each, with one TE_UNREGISTER_TIMEOUT_MS for
 * the whole call; nothing is unregistered when an address is unknown. */
TE_API int te_unregister_memory_batch(te_engine *engine, void *const *addrs, size_t n);

/* ---------------------------------------------------------------- segments */

typedef int32_t te_segment_id; /* 0 is the engine's own segment */
#define TE_LOCAL_SEGMENT 0

/* Opens a segment by name; returns its id (>= 0) or a negative error. Opening
 * the engine's own name gives TE_LOCAL_SEGMENT. Opening a name twice returns
 * the same id (and needs two closes). */
TE_API te_segment_id te_segment_open(te_engine *engine, const char *name);
/* As te_segment_open(), but forces the transport used for this segment. */
TE_API te_segment_id te_segment_open_with(te_engine *engine, const char *name, const char *transport);
TE_API int te_segment_close(te_engine *engine, te_segment_id segment);
/* The name of the transport that serves an open segment ("shm", "tcp", ...;
 * "local" for TE_LOCAL_SEGMENT), or NULL for an unknown id. Static storage,
 * valid while the transport stays installed. Since 1.1. */
TE_API const char *te_segment_transport(te_engine *engine, te_segment_id segment);
/* Fetches the descriptor again. libte also does so by itself, at most once a
 * second per segment, when a request falls outside the cached descriptor or
 * the peer refuses a range the descriptor offered. */
TE_API int te_segment_refresh(te_engine *engine, te_segment_id segment);
/* The id of segment `name` if it is open (TE_LOCAL_SEGMENT for the engine's
 * own name), without network traffic and without taking a reference;
 * -ENOENT when it is not open. Since 1.1. */
TE_API te_segment_id te_segment_find(te_engine *engine, const char *name);
/* The segment descriptor (Mooncake's JSON, docs/wire.md "Segment
 * descriptors") of an open segment as last fetched, or for TE_LOCAL_SEGMENT
 * this engine's own as last published. NUL-terminated; release with te_free(). Since 1.1. */
TE_API int te_segment_descriptor(te_engine *engine, te_segment_id segment, char **json);
/* Refreshes every open segment. Returns how many were refreshed, or the
 * first error when one failed (the others are still tried). Since 1.1. */
TE_API int te_segment_refresh_all(te_engine *engine);
/* Asks the engine named `name` (open or not) whether it is there: a Probe
 * frame to its RPC port. 0 when it answered; timeout_ms <= 0 uses the RPC
 * defaults (5 s to connect, 60 s for the answer). Since 1.1. */
TE_API int te_segment_probe(te_engine *engine, const char *name, int timeout_ms);

/* A buffer of an open segment, as its descriptor lists it. For file
 * (NVMe-oF) segments `addr` is the buffer's first byte offset in the files
 * laid end to end. */
typedef struct te_segment_buffer {
	uint64_t addr;
	uint64_t length;
	char name[64]; /* location ("cpu:0") or segment name; cut to fit */
} te_segment_buffer;

/* Writes up to `max` buffers of `segment` (sorted by address) and returns
 * how many it has. For TE_LOCAL_SEGMENT: the registered regions. */
TE_API int te_segment_buffers(te_engine *engine, te_segment_id segment, te_segment_buffer *out,
			      size_t max);

/* ----------------------------------------------------------------- batches */

typedef uint64_t te_batch_id;
#define TE_INVALID_BATCH UINT64_MAX

enum te_opcode {
	TE_OP_READ = 0,  /* segment → local memory */
	TE_OP_WRITE = 1, /* local memory → segment */
};

/* One transfer. `remote` is an address in the target process for memory
 * segments, a byte offset for file (NVMe-oF) segments. Layout fixed. */
typedef struct te_request {
	uint32_t opcode;
	te_segment_id segment;
	void *local;
	uint64_t remote;
	uint64_t length;
} te_request;

/* Task states; the numbers equal Mooncake's. */
enum te_task_state {
	TE_TASK_WAITING = 0,   /* submitted, moving */
	TE_TASK_PENDING = 1,   /* accepted, not yet started */
	TE_TASK_INVALID = 2,   /* refused at submit: see `error` */
	TE_TASK_CANCELED = 3,
	TE_TASK_COMPLETED = 4,
	TE_TASK_TIMEOUT = 5,
	TE_TASK_FAILED = 6,
};

typedef struct te_task_status {
	int32_t state;        /* enum te_task_state */
	int32_t error;        /* 0, or the negative error that ended the task */
	uint64_t transferred; /* bytes moved so far (a lower bound while moving) */
} te_task_status;

/* Allocates a batch that holds up to `capacity` tasks over its lifetime. */
TE_API int te_batch_alloc(te_engine *engine, size_t capacity, te_batch_id *out);
/* Frees a batch; -EBUSY while any task is still in flight. Tasks ended
 * early (a deadline, a cancel) are not in flight: what their transport still
 * holds of them is freed when it lets go. */
TE_API int te_batch_free(te_engine *engine, te_batch_id batch);
/*
 * Appends `n` requests as tasks (task ids continue from earlier submits to the
 * same batch). A request with a bad opcode, unregistered local memory, an
 * unknown segment or a range outside the segment becomes an INVALID task; the
 * rest start. Returns the number of INVALID tasks (0: all started), or a
 * negative error when nothing was appended (unknown batch, capacity exceeded).
 */
TE_API int te_submit(te_engine *engine, te_batch_id batch, const te_request *reqs, size_t n);
TE_API int te_get_status(te_engine *engine, te_batch_id batch, size_t task, te_task_status *out);
/* Summary: number of tasks submitted, and how many are still in flight;
 * `*state` is COMPLETED when all tasks completed, FAILED/TIMEOUT/CANCELED/
 * INVALID when every task ended and one ended so (the worst wins), WAITING
 * otherwise. Any pointer may be NULL. */
TE_API int te_batch_status(te_engine *engine, te_batch_id batch, size_t *submitted,
			   size_t *in_flight, int32_t *state);
/* Blocks (no busy polling) until no task of the batch is in flight.
 * timeout_ms < 0 waits forever. 0 on success, -ETIMEDOUT. */
TE_API int te_batch_wait(te_engine *engine, te_batch_id batch, int timeout_ms);
/* Cancels the batch: tasks not yet started become CANCELED, and so do the
 * ones in flight, within milliseconds, on every transport that honours
 * deadlines (all of libte's; since 1.6; see te_batch_set_deadline() for what
 * that promises about their memory); on another, running ones stop at their
 * next slice boundary. Returns at once; te_batch_wait() to see them end. */
TE_API int te_batch_cancel(te_engine *engine, te_batch_id batch);

/* --------------------------------------------------------------- deadlines */

/*
 * Deadlines (since 1.6). A deadline is a time of CLOCK_MONOTONIC in
 * nanoseconds, as te_now_ns() reads it. A task still in flight at its
 * deadline ends FAILED with -ETIMEDOUT within a few milliseconds, whatever
 * its transport still waits for (a peer that stopped answering, a connect, a
 * descriptor exchange at submit), and from the moment te_get_status() shows
 * it ended nothing reads or writes its local memory any more: bytes that
 * arrive later are dropped. A canceled batch's tasks end the same way.
 *
 * What cannot be recalled is a WRITE whose bytes already left (a TCP body
 * sent, an RDMA WRITE posted): the peer may still apply them. Such a task
 * carries TE_TASK_UNSETTLED (te_get_task_info()) until its transport knows
 * the peer cannot apply them any more (its answer came, the connection was
 * fenced, the peer went away), and te_batch_wait_settled() waits for that.
 * A READ, and a WRITE none of whose bytes left, is settled when it ends.
 * docs/reliability.md gives the rule per transport. A transport plugin that
 * does not honour deadlines (a third party's built for plugin ABI < 1.11)
 * ends its tasks when it ends them; the log says so once.
 */
TE_API int64_t te_now_ns(void);
/* Tasks submitted to `batch` from now on (te_submit, te_submit_prepared,
 * te_submit_on_stream) end by `deadline_ns`; 0 removes it (the default).
 * Tasks already submitted keep theirs. -EINVAL for a negative deadline. */
TE_API int te_batch_set_deadline(te_engine *engine, te_batch_id batch, int64_t deadline_ns);
/* As te_submit(), with `deadline_ns` for these tasks (0: the batch's). A
 * descriptor exchange this submit makes with a peer (after the peer was
 * lost, or to see memory it registered since) ends by the deadline too. */
TE_API int te_submit_by(te_engine *engine, te_batch_id batch, const te_request *reqs, size_t n,
			int64_t deadline_ns);

enum te_task_flags {
	/* Ended (by a deadline or a cancel) while a WRITE's bytes were on their
	 * way: the peer may still apply them. Cleared once it cannot. */
	TE_TASK_UNSETTLED = 1u << 0,
	/* Ended by the host at its deadline or at a cancel, before its
	 * transport finished it. */
	TE_TASK_ENDED_EARLY = 1u << 1,
};

/* A task's status with what te_task_status cannot carry. Set `size` to
 * sizeof(te_task_info) before the call; the host fills what both know. */
typedef struct te_task_info {
	uint32_t size;
	int32_t state;         /* enum te_task_state */
	int32_t error;         /* 0, or the negative error that ended the task */
	uint32_t flags;        /* te_task_flags */
	uint64_t transferred;  /* bytes moved so far */
	int64_t deadline_ns;   /* the task's deadline, 0: none */
} te_task_info;

TE_API int te_get_task_info(te_engine *engine, te_batch_id batch, size_t task, te_task_info *out);
/* As te_batch_wait(), then also until no task of the batch is
 * TE_TASK_UNSETTLED. 0, or -ETIMEDOUT. */
TE_API int te_batch_wait_settled(te_engine *engine, te_batch_id batch, int timeout_ms);
/* Sends `msg` to the owner of `segment` once no task of the batch is in
 * flight (at once if none is). */
TE_API int te_batch_notify(te_engine *engine, te_batch_id batch, te_segment_id segment,
			   const char *msg);

/* ------------------------------------------------------ prepared transfers */

/*
 * A request's pieces moved again and again between the same two pools (a
 * model's KV cache: layers x {K, V} x blocks scattered in a paged pool) cost
 * a range search, a segment look-up and a transport pick per piece when
 * submitted as te_request arrays. A prepared list does that work once: its
 * pieces are checked and resolved when it is made, and te_submit_prepared()
 * then pairs pieces of two lists by index, with no search, allocation or
 * lock per piece, merging pairs that continue one another on both sides into
 * one task. Since 1.5.
 */
typedef struct te_xfer_list te_xfer_list;

/* One piece of a prepared list: an address in the list's segment (local
 * memory for TE_LOCAL_SEGMENT) and a length. Layout fixed. */
typedef struct te_piece {
	uint64_t addr;
	uint64_t length;
} te_piece;

#define TE_XFER_LIST_MAX (1u << 24) /* pieces of one list, at most */

/*
 * Makes a list of `n` pieces of `segment`: of this engine's registered
 * memory for TE_LOCAL_SEGMENT (each piece inside one registered region),
 * else of an open segment (each piece inside one buffer of its descriptor,
 * fetched again once when one is not). The same list serves as the local
 * side of a transfer, or as the remote side (TE_LOCAL_SEGMENT: a copy
 * within this engine). `flags` must be 0. The list keeps the pieces and what
 * they resolved to; it holds no registration and no segment open:
 *  - registering or unregistering memory of this engine makes the next
 *    te_submit_prepared() resolve a TE_LOCAL_SEGMENT list's pieces again
 *    (once, not per post): a piece whose memory was unregistered becomes
 *    an INVALID task (TE_ERR_ADDRESS), and works again once registered;
 *  - a fetched descriptor of the segment (a refresh) likewise has its
 *    pieces checked again against the new one (memory the peer
 *    unregistered is refused by the peer, FAILED, until then; such a
 *    failure has the descriptor fetched again);
 *  - once the segment is closed (its last te_segment_close()), posting the
 *    list fails with TE_ERR_SEGMENT, even when the name is opened again
 *    (a new segment id): prepare the list again.
 * -EINVAL: bad arguments or a zero-length piece; TE_ERR_ADDRESS: a piece
 * outside the memory (the log line names it); TE_ERR_SEGMENT: unknown
 * segment; TE_ERR_NO_TRANSPORT: no transport serves it.
 */
TE_API int te_xfer_list_prepare(te_engine *engine, te_segment_id segment, const te_piece *pieces,
				size_t n, unsigned flags, te_xfer_list **out);
/* Frees a list (NULL accepted). Tasks already posted from it do not need
 * it, and it touches no engine (it may come after te_engine_destroy()). Not
 * while another thread posts it. */
TE_API void te_xfer_list_free(te_xfer_list *list);
/* The number of pieces of a list, or -EINVAL for NULL. */
TE_API int64_t te_xfer_list_count(const te_xfer_list *list);

/*
 * Appends transfers to `batch`: for k in [0, n), piece local_idx[k] of
 * `local` (a TE_LOCAL_SEGMENT list) with piece remote_idx[k] of `remote`
 * (its segment is the transfer's), both of the same length, in direction
 * `opcode`. A NULL index array means 0, 1, ..., n-1. Consecutive pairs k,
 * k+1 whose pieces follow one another on both sides (in one region and one
 * buffer) become one task, so the batch gains between 1 and n tasks:
 * `*first_task` and `*n_tasks` (either may be NULL) say which. Both lists
 * must be this engine's; several threads may post the same lists at once.
 * Returns the number of tasks that ended INVALID
 * (0: all started; a piece whose memory went away, see above), or a
 * negative error, nothing appended: -EINVAL (bad opcode, a list of another
 * engine or side, an index out of range, pieces of different lengths; the
 * log line names the pair), TE_ERR_SEGMENT (the remote list's segment was
 * closed), TE_ERR_NO_TRANSPORT (no transport serves it now), TE_ERR_BATCH,
 * TE_ERR_BATCH_FULL (the tasks, after merging, count against the batch's
 * capacity).
 */
TE_API int te_submit_prepared(te_engine *engine, te_batch_id batch, uint32_t opcode,
			      const te_xfer_list *local, const uint32_t *local_idx,
			      const te_xfer_list *remote, const uint32_t *remote_idx, size_t n,
			      size_t *first_task, size_t *n_tasks);

/* ----------------------------------------------------------- notifications */

#define TE_NOTIFY_MAX 4096 /* bytes of a notification's text, NUL excluded */

/* Sends a short text to the owner of `segment` (the Notify frame). Blocks
 * until the peer acknowledged it. */
TE_API int te_notify_send(te_engine *engine, te_segment_id segment, const char *msg);
/* As te_notify_send() and te_batch_notify(), but the notification carries
 * `sender` as its name instead of this engine's segment name (Mooncake's API
 * lets the caller choose it; NULL means this engine's name). At most
 * TE_NOTIFY_MAX bytes each. Since 1.1. */
TE_API int te_notify_send_as(te_engine *engine, te_segment_id segment, const char *sender,
			     const char *msg);
TE_API int te_batch_notify_as(te_engine *engine, te_batch_id batch, te_segment_id segment,
			      const char *sender, const char *msg);

typedef struct te_notification {
	char *name; /* sender's segment name */
	char *msg;
} te_notification;

/* Takes every queued received notification: an array of `*count` entries
 * (NULL when none) to release with te_notifications_free(). */
TE_API int te_notify_fetch(te_engine *engine, te_notification **out, size_t *count);
TE_API void te_notifications_free(te_notification *list, size_t count);

/* ---------------------------------------------------------- metadata store */

/* Direct access to a metadata store through the same plugins an engine uses
 * (for tools that register NVMe-oF segments or inspect a cluster). Keys are
 * whole keys ("mooncake/ram/node1"). */
typedef struct te_metadata te_metadata;

TE_API int te_metadata_open(const char *conn, te_metadata **out);
TE_API void te_metadata_close(te_metadata *md);
/* -ENOENT when missing. `*value` is NUL-terminated; release with te_free(). */
TE_API int te_metadata_get(te_metadata *md, const char *key, char **value, size_t *len);
TE_API int te_metadata_put(te_metadata *md, const char *key, const char *value, size_t len);
TE_API int te_metadata_remove(te_metadata *md, const char *key);
/* The store key of a segment's descriptor: "mooncake/[<cluster>/]ram/<name>",
 * or "mooncake/[<cluster>/]<name>" when the name contains '/'. Returns the
 * length written (snprintf-like) or a negative error. */
TE_API int te_metadata_segment_key(const char *name, char *buf, size_t size);
/* "mooncake/[<cluster>/]rpc_meta/<name>" */
TE_API int te_metadata_rpc_key(const char *name, char *buf, size_t size);

/* Frees memory libte returned to the caller. */
TE_API void te_free(void *p);

/* ----------------------------------------------------------------- metrics */

/*
 * Every engine counts what it moves (docs/metrics.md): per transport and
 * operation, per peer segment (the busiest TE_METRICS_PEERS, 64 by default,
 * and one "other"), and per device a transport names (a NIC, a TCP rail, an
 * NVMe file). Counting is on by default and contention-free on the data
 * path; TE_METRICS=0 (environment or engine option) turns it off, and the
 * calls below then return -ENOTSUP. Since 1.3.
 */

/* Engine-wide totals. Versioned by `size`: set it to sizeof(te_stats)
 * before the call; fields that lie beyond it are left alone. Arrays are
 * indexed by enum te_opcode. */
typedef struct te_stats {
	uint32_t size;
	uint32_t reserved;
	uint64_t requests[2];   /* tasks submitted, refused ones included */
	uint64_t bytes[2];      /* bytes moved by tasks that ended, partial moves included */
	uint64_t completed[2];  /* tasks that ended COMPLETED */
	uint64_t failed[2];     /* ended FAILED, TIMEOUT, or INVALID (refused at submit) */
	uint64_t canceled[2];   /* ended CANCELED */
	uint64_t in_flight;     /* tasks submitted and not ended */
	uint64_t in_flight_bytes;
	uint64_t retries;       /* requests a transport sent again */
	uint64_t failovers;     /* requests a transport moved to another device or rail */
	uint64_t notifies_sent;
	uint64_t notifies_received;
	uint64_t registered_bytes;   /* memory registered now */
	uint64_t registered_regions;
	uint64_t rpc_served;    /* RPC frames answered on the handshake port */
	uint64_t rpc_refused;   /* frames refused: malformed, unknown, over a bound */
	uint64_t auth_refused;  /* peers refused by the cluster key (TE_AUTH_KEY_FILE) */
} te_stats;

/* Fills `out` (its `size` set by the caller). */
TE_API int te_engine_stats(te_engine *engine, te_stats *out);
/* Every counter of `engine` as one JSON object (its form: docs/metrics.md).
 * Release `*json` with te_free(). */
TE_API int te_engine_stats_json(te_engine *engine, char **json);
/* The Prometheus text exposition (format 0.0.4) of `engine`, or of every
 * engine of the process when `engine` is NULL. Release `*text` with
 * te_free(). */
TE_API int te_metrics_text(te_engine *engine, char **text, size_t *len);

/* ----------------------------------------------------------------- plugins */

enum te_plugin_kind_id {
	TE_KIND_TRANSPORT = 1,
	TE_KIND_METADATA = 2,
	TE_KIND_DEVICE = 3, /* since API 1.2, plugin ABI 1.2: device memory (GPUs) */
	TE_KIND_EXPORTER = 4, /* since API 1.3, plugin ABI 1.6: serves the metrics (TE_METRICS_ADDR) */
};

/* What the loader found. Versioned by `size`: read fields only when
 * `size > offsetof(te_plugin_info, field)`. */
typedef struct te_plugin_info {
	size_t size;
	const char *path;
	const char *name;        /* NULL when the file could not be read */
	const char *version;
	const char *description;
	int kind;                /* enum te_plugin_kind_id, 0 when unknown */
	unsigned abi_major, abi_minor;
	int loaded;              /* 1: usable; 0: skipped, see `reason` */
	const char *reason;
} te_plugin_info;

typedef void (*te_plugin_info_fn)(const te_plugin_info *info, void *user);
typedef void (*te_plugin_dir_fn)(const char *dir, int exists, void *user);

/* Scans the plugin directories (once per process; later calls report the
 * same result) and calls `fn` for every file found. Returns the number of
 * usable plugins. */
TE_API int te_plugin_foreach(te_plugin_info_fn fn, void *user);
/* Calls `fn` for each directory searched, in order. */
TE_API int te_plugin_dirs(te_plugin_dir_fn fn, void *user);
/* A transport or device plugin's report on this machine (devices, topology),
 * or why it cannot work here. Release `*text` with te_free(). */
TE_API int te_plugin_report(const char *name, char **text);

/* ----------------------------------------------------------- device memory */

/*
 * Device memory (GPUs) is served by device plugins (kind TE_KIND_DEVICE: the
 * CUDA one, or any other). Registering device memory with location "*" finds
 * its device ("cuda:3"); every transport then moves it (see docs/gpu.md).
 * These calls let an application or a tool work with such memory without
 * linking a vendor runtime. Since 1.2.
 */
/* Allocates `len` bytes of memory of device `location` ("cuda:0") through the
 * device plugin serving that prefix. -ENODEV when no usable plugin serves it. */
TE_API int te_device_alloc(const char *location, size_t len, void **ptr);
TE_API int te_device_free(void *ptr);
/* Copies `len` bytes; either side may be device memory of a device plugin. */
TE_API int te_device_copy(void *dst, const void *src, size_t len);
/* The device location of [addr, addr+len) ("cuda:3") into `buf`, or -ENOENT
 * when it is not device memory of any usable device plugin. */
TE_API int te_device_locate(const void *addr, size_t len, char *buf, size_t size);
/* Waits until the work queued on `stream` (a stream of the device runtime
 * of `location`: "cuda" or "cuda:0" for a CUstream) before this call has
 * finished, so that a transfer submitted next sees its results. A stream
 * the application made is taken in its own device's context whatever is
 * current; a default stream (CUDA's 0, HIP's null stream) is that of the
 * device "cuda:N" names, or with "cuda" of the calling thread's current
 * device; the calling thread's current device is the same after. -EINVAL
 * when "cuda:N" is not the stream's device; -ENOTSUP when that device
 * plugin has no streams, or cannot tell a stream's device and N is given. */
TE_API int te_device_stream_wait(const char *location, void *stream);
/*
 * Submits `n` requests into `batch` in the order of `stream` (a stream of
 * the device runtime of `location`, as above) without waiting for it: the
 * requests start once the work queued on the stream before this call has
 * finished, and the stream's later work waits until each of them has ended.
 * Returns at once: 0 once queued, the tasks appended to the batch and
 * WAITING until the stream reaches them (te_batch_wait() and te_batch_free()
 * see them as in flight); their statuses then say how each ended, as after
 * te_submit(), which checks them when the stream reaches them. A canceled
 * batch's tasks end CANCELED there; an engine destroyed before the stream
 * reaches them cancels them, and the stream then goes on. Negative, nothing
 * appended: bad arguments, an unknown batch, the capacity exceeded, or
 * -ENOTSUP when that device plugin cannot queue work on its streams (or,
 * of plugin ABI 1.9, cannot tell a stream's device and `location` names
 * one); when the plugin or the runtime refuses to queue (-EINVAL: the
 * stream is another device's than "cuda:N" names), the tasks appended end
 * FAILED and its error is returned. Since 1.4.
 */
TE_API int te_submit_on_stream(te_engine *engine, te_batch_id batch, const te_request *reqs, size_t n,
			       const char *location, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* TE_TE_H */
