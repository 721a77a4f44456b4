/* SPDX-License-Identifier: Apache-2.0 */
/* Private to libte: the structures shared by its modules. */
#ifndef TE_INTERNAL_H
#define TE_INTERNAL_H

#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>

#include <glib.h>

#include "te/te.h"
#include "te/te-plugin.h"

#include "teu-spin.h"

#include "options.h"
#include "publish.h"

#define TE_DOMAIN "te"
#define TE_RPC_DEFAULT_MAX_FRAME (1u << 20)
#define TE_RPC_HARD_MAX_FRAME (128u << 20)
#define TE_MAX_NAME 256

/* A pause inside a busy-wait loop (kinder to the sibling hyperthread). */
static inline void te_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#endif
}

typedef struct te_transport_inst te_transport_inst;
/* metrics.c (metrics.h): an engine's counters, a transport's, a peer's. */
typedef struct te_metrics te_metrics;
typedef struct te_mblock te_mblock;
typedef struct te_mpeer te_mpeer;

/* ---------------------------------------------------------------- log.c */
void te_log(int level, const char *domain, const char *fmt, ...) TE_PRINTF(3, 4);
void te_logv(int level, const char *domain, const char *fmt, va_list ap) TE_PRINTF(3, 0);
bool te_log_enabled(int level);
#define te_err(...) te_log(TE_LOG_ERROR, TE_DOMAIN, __VA_ARGS__)
#define te_warn(...) te_log(TE_LOG_WARN, TE_DOMAIN, __VA_ARGS__)
#define te_info(...) te_log(TE_LOG_INFO, TE_DOMAIN, __VA_ARGS__)
#define te_dbg(...) te_log(TE_LOG_DEBUG, TE_DOMAIN, __VA_ARGS__)
/* A warning a peer can trigger at will: rate-limited per call site
 * (te_ratelimit in te-plugin.h). */
#define te_warn_limited(fmt, ...)                                                    \
	do {                                                                         \
		static te_ratelimit te_rl_;                                          \
		unsigned te_held_;                                                   \
		if (te_ratelimit_allow(&te_rl_, &te_held_))                          \
			te_log(TE_LOG_WARN, TE_DOMAIN, fmt " (%u similar lines held back)", \
			       ##__VA_ARGS__, te_held_);                              \
	} while (0)

/* ------------------------------------------------------ JSON from outside */
/* Every JSON text libte reads from a peer, a store or a plugin goes through
 * te_json_check() (te-json.h) with one of these before it is parsed. */
#include "te/te-json.h"
/* Any RPC frame body, before it reaches a handler: no message of the
 * protocol has a string near 64 KiB (a notification's text is 4 KiB). */
#define TE_JSON_LIMITS_FRAME { TE_JSON_MAX_DEPTH, TE_JSON_MAX_ITEMS, TE_JSON_MAX_VALUES, 65536, \
			       TE_RPC_HARD_MAX_FRAME }
/* A segment descriptor: names, protocols and file paths are short. */
#define TE_JSON_LIMITS_DESC { TE_JSON_MAX_DEPTH, TE_JSON_MAX_ITEMS, TE_JSON_MAX_VALUES, 65536, \
			      TE_RPC_HARD_MAX_FRAME }
/* {"name": …, "notify_msg": …}: a message of TE_NOTIFY_MAX bytes written
 * with every byte escaped takes six times that. */
#define TE_JSON_LIMITS_NOTIFY { 4, 16, 64, 6 * TE_NOTIFY_MAX, 16 * TE_NOTIFY_MAX }
/* rpc_meta {"ip_or_host_name": …, "rpc_port": …}. */
#define TE_JSON_LIMITS_RPC_META { 4, 64, 256, 4096, 65536 }

/* --------------------------------------------------------------- util.c */
/* Splits "host", "host:port", "[v6]:port". port is -1 when absent. */
int te_split_host_port(const char *s, char **host, int *port);
/* Environment variable, ignored in setuid processes. */
const char *te_secure_getenv(const char *name);
/* TE_name, else MC_name. */
const char *te_env2(const char *te_name, const char *mc_name);
/* Parses a decimal/hex unsigned; false on junk or overflow. */
bool te_parse_u64(const char *s, uint64_t *out);
void te_timestamp(char *buf, size_t size);
/* Socket I/O until a deadline (te_now_ms() time), on blocking and
 * non-blocking sockets alike: 0, -ETIMEDOUT, -ECONNRESET at EOF, or -errno. */
int te_fd_wait(int fd, short events, int64_t deadline);
int te_fd_read(int fd, void *buf, size_t n, int64_t deadline);
int te_fd_write(int fd, const void *buf, size_t n, int64_t deadline);
int64_t te_now_ms(void);

/* ---------------------------------------------------------------- auth.c */
typedef struct te_auth te_auth;
#define TE_AUTH_TIMEOUT_MS 3000 /* the whole exchange, at most */
/* The RPC reply a server with a key sends to a client that did not
 * authenticate, so that a key-less libte client fails with TE_ERR_AUTH. */
#define TE_AUTH_REQUIRED_REPLY "{\"error\":\"authentication required (TE_AUTH_KEY_FILE)\",\"status\":\"auth_required\"}"
/* Reads the cluster key (>= 16 bytes after trailing whitespace), and the
 * one of `path`.next when that exists. -EINVAL with a log line naming the
 * file (never the key) when unusable. Both files are read again when they
 * change. */
int te_auth_load(const char *path, te_auth **out);
void te_auth_free(te_auth *a);
/* The exchange as the side that connected; 0 at once when a is NULL. */
int te_auth_client(const te_auth *a, int fd, int channel, const char *peer, int timeout_ms);
/* As the side that accepted. TE_ERR_AUTH when refused; *plain set (and its
 * first 8 bytes in `first`) when the peer spoke without authenticating. */
int te_auth_server(const te_auth *a, int fd, int channel, const char *peer, int timeout_ms,
		   uint8_t first[8], bool *plain);

/* -------------------------------------------------------------- plugin.c */
typedef struct te_plugin {
	char *path;
	char *name;
	char *reason; /* why not loaded */
	void *handle;
	const te_plugin_desc *desc;
	unsigned abi_major, abi_minor;
	int kind;
	bool loaded;
} te_plugin;

void te_plugins_init(void);
/* First loaded plugin of that kind and name, or NULL. */
const te_plugin *te_plugin_find(int kind, const char *name);
/* The metadata plugin serving URL scheme `scheme`, or NULL. */
const te_plugin *te_plugin_find_scheme(const char *scheme);
/* Transport plugins, loaded ones, in discovery order. */
GPtrArray *te_plugin_transports(void);
/* Device plugins, loaded ones, in discovery order. */
GPtrArray *te_plugin_devices(void);
/* True when ops table `tbl` was built with `member` (set or not): for the
 * members that are not functions, which TE_HAS_OP cannot test. */
#define TE_OPS_COVERS(tbl, member) \
	((tbl)->size >= offsetof(__typeof__(*(tbl)), member) + sizeof((tbl)->member))

/* ---------------------------------------------------- engine.c, transports */
/* A transport plugin's rank in te_transport_auto(): its declared priority,
 * or, built before plugin ABI 1.12, the rank it had then by its name. */
uint32_t te_transport_priority(const te_plugin *p);
/* True when `protocol` names a loaded transport that serves files and not
 * memory (TE_TRANSPORT_FILES without TE_TRANSPORT_MEMORY): a descriptor
 * naming it lists files. */
bool te_transport_files_only(const char *protocol);

/* ---------------------------------------------------------------- host.c */
/* Every te_host handed to a plugin points at one of these. */
typedef struct te_host_ctx {
	te_host host;
	struct te_engine *engine; /* NULL for standalone uses (tools) */
	const te_plugin *plugin;
	te_mblock *mb; /* an installed transport's counters; NULL otherwise or when counting is off */
} te_host_ctx;

void te_host_init(te_host_ctx *hc, struct te_engine *engine, const te_plugin *plugin);

/* ------------------------------------------------------------ device.c */
typedef struct te_device {
	te_host_ctx hc;
	const te_device_ops *ops;
	void *ctx;
} te_device;

/* Whether any device plugin is usable in this process. */
bool te_devices_present(void);
/* 1 with the plugin and device index when [addr, addr+len) is device memory,
 * 0 when it is host memory. */
int te_device_classify(const void *addr, size_t len, te_device **dev, int *index);
/* The device plugin serving `location` ("cuda", "cuda:0") for a stream
 * call named `what`, and the N of "cuda:N" in *index (-1 without one);
 * -ENODEV (logged) when none, -EINVAL for NULL. */
int te_device_for_stream(const char *location, const char *what, te_device **out, int *index);
/* A copy through `d`, logged when it fails. */
int te_device_copy_with(te_device *d, void *dst, const void *src, size_t len);
int te_device_report(const te_plugin *p, char **text);
/* Device memory shared with other processes of this host (te_host's
 * device_ipc_* and device_copy): the plugin is the one of the address, or
 * of the location's prefix. */
int te_device_ipc_export(const void *addr, size_t len, te_device_ipc *ipc, char *location,
			 size_t location_len);
int te_device_ipc_open(const char *location, const te_device_ipc *ipc, void **base);
void te_device_ipc_close(const char *location, void *base);
int te_device_copy_at(const char *location, void *dst, const void *src, size_t len);
int te_device_copy_batch_with(te_device *d, const te_copy *v, size_t n, unsigned flags);
int te_device_copy_batch_at(const char *location, const te_copy *v, size_t n, unsigned flags);
/* Page-locked host memory where a device plugin offers it, else plain. */
int te_device_host_alloc(size_t len, void **ptr);
void te_device_host_free(void *ptr);
/* The devices of every usable device plugin (te_host.devices). */
int te_devices_list(te_device_info *out, size_t max, size_t *n);

/* ------------------------------------------------------------ memory.c */
#define TE_ACCESS_SHARDS 8
#define TE_PINS_ABANDONED (INT_MIN / 2)
#define TE_UNREGISTER_TIMEOUT_DEFAULT_MS 5000

typedef struct te_region {
	void *addr;
	size_t length;
	const char *location; /* interned */
	unsigned flags;
	te_device *dev;       /* device memory: its plugin; NULL for host memory */
	bool hidden;          /* libte's own (staging buffers): not in the descriptor */
	/* Device memory: the transports that registered it to move it
	 * themselves (GPUDirect); the others get it staged. NULL: none. */
	GHashTable *direct;
	/* Pins held. Once an unregister gave up waiting for them it adds
	 * TE_PINS_ABANDONED: whoever brings the sum down to exactly that
	 * value frees the region. */
	atomic_int pins;
	atomic_int hard_pins; /* of them, pins that cannot be revoked (buffer_acquire) */
	atomic_bool revoked;  /* unregistered under revocable pins: touch nothing */
	/* Threads between buffer_enter and buffer_leave, spread over cache
	 * lines so that I/O threads serving one region do not contend. */
	struct {
		atomic_int n;
		char pad[64 - sizeof(atomic_int)];
	} active[TE_ACCESS_SHARDS];
	bool dying;         /* left out of the descriptor, about to be removed */
	GHashTable *fields; /* te_transport_inst* → JSON text from mem_register */
} te_region;

typedef struct te_memreg {
	GRWLock lock;
	GPtrArray *regions; /* sorted by addr */
	GMutex pin_lock;
	GCond pin_cond;
	atomic_int retiring; /* unregisters waiting for pins to drop */
	int64_t unregister_ms; /* how long an unregister waits for pins (TE_UNREGISTER_TIMEOUT_MS) */
	/* Moves whenever `regions` changes (under the writer lock): prepared
	 * lists resolved against another value resolve again. */
	uint64_t epoch;
	/* Publishes the descriptor after a change (later: soon, on the
	 * engine's thread): the engine's, set when it is made, so that the
	 * registry calls no layer above it by name. */
	int (*publish)(struct te_engine *e, bool later);
} te_memreg;

void te_memreg_init(te_memreg *m);
void te_memreg_clear(te_memreg *m);
/* The region wholly containing [addr, addr+len) (caller holds lock). */
te_region *te_memreg_find_locked(te_memreg *m, uint64_t addr, uint64_t len);
/* A revocable pin (te_host's buffer_acquire_revocable): unregistering waits
 * for it at most unregister_ms. */
int te_memreg_acquire(te_memreg *m, uint64_t addr, uint64_t len, unsigned need, te_buffer_pin *pin);
/* Makes a pin just acquired one that unregistering waits for without bound
 * (te_host's buffer_acquire: a holder that knows nothing of revocation). */
void te_memreg_pin_hard(te_buffer_pin *pin);
void te_memreg_release(te_memreg *m, te_buffer_pin *pin);
/* The region of a pin; NULL for an empty one. */
te_region *te_pin_region(const te_buffer_pin *pin);
/* Brackets a touch of a pinned region's bytes: false once it was revoked. */
bool te_region_enter(te_region *r);
void te_region_leave(te_region *r);
/* Unregisters every region (engine destroy that must leave the engine
 * allocated): no peer reaches the memory afterwards. */
void te_memreg_revoke_all(struct te_engine *e);
int te_region_attach(struct te_engine *e, te_transport_inst *tp, te_region *r);
void te_region_detach(struct te_engine *e, te_transport_inst *tp, te_region *r);
/* te_host's buffer_fields: replaces `tp`'s fields of the region starting at
 * `addr` (-ENOENT: none) and has the descriptor published again soon. */
int te_region_set_fields(struct te_engine *e, te_transport_inst *tp, const void *addr,
			 const char *json_object);
int te_resolve_location(void *addr, size_t len, const char *loc, char **out);
/* Registers libte's own local-only memory (staging buffers): every transport
 * sees it, the descriptor does not. */
int te_register_hidden(struct te_engine *e, void *addr, size_t len);
/* Whether transport `tp` moves the device memory of region `r` itself. */
static inline bool te_region_direct(const te_region *r, const te_transport_inst *tp)
{
	return r->direct != NULL && g_hash_table_contains(r->direct, tp);
}

/* ------------------------------------------------------------ shmem.c */
/* The te_mem_alloc() allocation holding [addr, addr+len): its memfd, the
 * range's offset, its size and first address. -ENOENT when none does. */
int te_shmem_lookup(uint64_t addr, uint64_t len, int *fd, uint64_t *offset, uint64_t *size, uint64_t *base);

/* --------------------------------------------------------- descriptor.c */
typedef struct te_desc_buffer {
	uint64_t addr;
	uint64_t length;
	char *name;
} te_desc_buffer;

/* The envelope of a descriptor: what the host itself reads. Transports'
 * own fields stay in `json` for their segment_open. */
typedef struct te_desc {
	char *name;
	char *protocol;
	char *auth; /* "auth": how peers must authenticate, NULL when not at all */
	te_desc_buffer *buffers; /* sorted by addr when addressed */
	size_t n_buffers;
	bool file_segment;  /* buffers without addresses, laid end to end */
	uint64_t file_size; /* sum of lengths for file segments */
	char *json;         /* the text it was decoded from */
} te_desc;

/* Whether a descriptor naming transport `protocol` lists files (buffers
 * without addresses, laid end to end) rather than memory. */
typedef bool (*te_desc_files_fn)(const char *protocol);
/* Decodes with te_transport_files_only() as the judge of file segments. */
int te_desc_decode(const char *json, size_t len, te_desc **out);
int te_desc_decode_with(const char *json, size_t len, te_desc_files_fn files, te_desc **out);
/* The same through json-glib's document tree (text with escapes goes
 * there; the test internal holds the two to the same answers). */
int te_desc_decode_dom(const char *json, size_t len, te_desc_files_fn files, te_desc **out);
void te_desc_free(te_desc *d);
/* True when [addr, addr+len) lies in one buffer (or inside a file segment). */
/* The buffer holding [addr, addr+len): 1 + its index (1 for a file
 * segment's one space), or 0 when none holds all of it. */
size_t te_desc_slot(const te_desc *d, uint64_t addr, uint64_t len);
bool te_desc_contains(const te_desc *d, uint64_t addr, uint64_t len);
char *te_engine_encode_descriptor(struct te_engine *e);

/* ----------------------------------------------------------- metadata.c */
struct te_metadata {
	bool p2p;
	te_host_ctx hc;
	const te_metadata_ops *ops;
	void *ctx;
	char *conn;
};
/* The key prefix: "mooncake/" or "mooncake/<cluster>/". */
const char *te_metadata_prefix(void);
int te_metadata_open_internal(const char *conn, struct te_engine *engine, te_metadata **out);
int te_metadata_put_flags(te_metadata *md, const char *key, const char *value, size_t len,
			  unsigned flags);

/* ------------------------------------------------------------------ rpc.c */
typedef struct te_rpc_server te_rpc_server;
typedef struct te_rpc_handler_slot {
	te_rpc_handler fn;
	void *user;
	const void *owner; /* the te_host_ctx that registered it */
} te_rpc_handler_slot;

int te_rpc_server_start(struct te_engine *e, int port_wanted, int *port_out, te_rpc_server **out);
void te_rpc_server_stop(te_rpc_server *s);
/* One exchange: connect, send, receive the reply of the same type. */
int te_rpc_call_addr(const te_auth *auth, const char *host, int port, int type, const char *body,
		     size_t len, char **reply, size_t *reply_len, int timeout_ms);
size_t te_rpc_max_frame(void);

/* ---------------------------------------------------------- transport */
struct te_transport_inst {
	te_host_ctx hc;
	const te_transport_ops *ops;
	void *ctx;
	atomic_int inflight; /* tasks handed to it and not finished */
	atomic_int segvers;  /* segment versions bound to it */
	/* Uninstalled: its instance stays allocated until the engine goes, so a
	 * waiting thread holding a stale pointer can still read this flag. */
	atomic_bool retired;
	atomic_bool warned_deadlines; /* said once that it cannot end tasks early */
};

/* ------------------------------------------------------------ segment.c */
typedef struct te_segver {
	atomic_int refs;
	struct te_engine *engine;
	te_desc *desc;
	char *host; /* peer address */
	int rpc_port;
	te_transport_inst *tp;
	void *seg_ctx;
	te_buffer_desc *infobufs;
	te_segment_id id;          /* the segment this version belongs to */
	uint64_t gen;              /* unique per version: what prepared lists were checked against */
	atomic_bool refresh_asked; /* a failed transfer asked for a refresh */
	/* A transfer failed as if the peer went away (connection refused or
	 * reset, process gone): the descriptor is fetched again before the
	 * segment is used next, as the peer may be back under the same name. */
	atomic_bool peer_lost;
	/* Fail-over across transports: another installed network transport
	 * that accepts the same descriptor (NULL: none), holding a reference;
	 * changed only under the engine's data lock. While te_now_ns() is
	 * before fo_until, new tasks go to it; a task whose transport failed
	 * on a path error is moved to it once (failover.c). */
	struct te_segver *alt;
	_Atomic int64_t fo_until;
	atomic_int fo_backoff_ms;
} te_segver;

typedef struct te_segment {
	char *name;
	char *forced; /* forced transport name or NULL */
	int opens;
	te_segver *cur; /* NULL when no transport serves it now */
	int64_t last_auto_refresh; /* te_now_ms() of the last refresh on a stale range */
	int64_t last_lost_refresh; /* te_now_ms() of the last refresh after a lost peer */
	te_mpeer *mpeer; /* the peer counters it counts into; NULL when counting is off */
} te_segment;

void te_segver_unref(te_segver *sv, bool from_completion);
/* Drops `n` references at once (tasks that ended together). */
void te_segver_unref_n(te_segver *sv, int n, bool from_completion);
/* failover.c: the version new tasks of a segment go to now: `sv`, or its
 * alternate while `sv`'s transport is failed over (data lock held). */
te_segver *te_segver_route(te_segver *sv);
void te_segver_reap(gpointer sv, gpointer unused); /* the reaper pool's function */
/* Resolves a segment name to the peer's RPC address. */
int te_engine_resolve_rpc(struct te_engine *e, const char *name, char **host, int *port);
void te_segments_clear(struct te_engine *e);
/* Refreshes a segment whose descriptor a request fell outside of, at most
 * once a second per segment; false when the rate limit skipped it. Not with
 * locks held: it fetches. */
bool te_segment_refresh_stale(struct te_engine *e, te_segment_id id);
/* Refreshes segment `id` if its current version lost its peer (at most
 * every LOST_REFRESH_MS while the peer stays away). Not with locks held. */
void te_segment_refresh_lost(struct te_engine *e, te_segment_id id);
/* The refresh pool's function: refreshes the segment of a version (a
 * reference the job owns) that a peer's rejection made look stale. */
void te_segver_refresh_job(gpointer sv, gpointer unused);
/* The name of an open segment (own name for 0), g_free()d by the caller. */
char *te_segment_name(struct te_engine *e, te_segment_id id);
void te_segments_detach_transport(struct te_engine *e, te_transport_inst *tp);

/* -------------------------------------------------------------- batch.c */
typedef struct te_stream_op te_stream_op;

typedef struct te_task {
	te_transfer xfer; /* first: plugins hold &xfer */
	struct te_batch *batch;
	te_stream_op *sop; /* te_submit_on_stream(): its submission, else NULL */
	te_segver *sv;
	te_transport_inst *tp;
	atomic_uint slices_done;
	atomic_int state;
	atomic_int error;
	_Atomic uint64_t transferred;
	atomic_uint chunk_next; /* local copies: next chunk to take */
	/* Device memory on a side: local copies go through its plugin; a
	 * remote task is staged through host memory (stage.c). */
	te_device *dev;
	struct te_stager *stage; /* a staging sub-transfer: its stager */
	/* Metrics: where it counts (set once routing knows) and when it was
	 * submitted. Its request is counted as routing hands it on, or as it
	 * is refused (task_reject). */
	te_mblock *mb;
	te_mpeer *mpeer;
	uint64_t t0; /* te_metrics_now() */
	uint64_t stage_t0; /* TE_STAGE_STATS: when it was queued for buffers */
	int64_t deadline; /* te_now_ns() time, 0: none */
	atomic_uint gate; /* TE_GATE_*: who may touch its memory, who ended it */
} te_task;

/* A task's gate (deadline.c). The low bits count the transport's open
 * transfer_enter()s; CLOSED refuses new ones. HANDED: given to a
 * transport or the local copier, so it may be ended early. ENDED: its
 * state was published (by its last completion or early); FINAL: its last
 * completion came; EARLY: ended before that, the host keeps its memory
 * until it (and PUBDONE: the early end finished publishing, so whichever
 * of the two comes second lets go). ENDING: an early end is under way and
 * publishes, even if the last completion comes meanwhile (from inside
 * expire, say). ENTERED: a transfer_enter() passed.
 * UNSETTLED: ended early with a WRITE's bytes maybe still to land. */
#define TE_GATE_COUNT 0xffffu
#define TE_GATE_CLOSED (1u << 16)
#define TE_GATE_HANDED (1u << 17)
#define TE_GATE_ENDED (1u << 18)
#define TE_GATE_FINAL (1u << 19)
#define TE_GATE_EARLY (1u << 20)
#define TE_GATE_PUBDONE (1u << 21)
#define TE_GATE_ENTERED (1u << 22)
#define TE_GATE_UNSETTLED (1u << 23)
#define TE_GATE_GAVEUP (1u << 24) /* its last completion was -ETIMEDOUT */
#define TE_GATE_MOVED (1u << 25)  /* failed over to another transport once */
#define TE_GATE_MOVING (1u << 26) /* being moved: its transport is changing */
#define TE_GATE_ENDING (1u << 27) /* an early end is under way: it publishes */

typedef struct te_batch {
	te_batch_id id;
	struct te_engine *engine;
	size_t capacity;
	atomic_size_t count;
	atomic_size_t inflight;
	atomic_int canceled;
	atomic_int mem_refs; /* its table entry, and tasks ended early */
	_Atomic int64_t deadline; /* for tasks submitted from now on, 0: none */
	atomic_size_t unsettled; /* tasks with TE_GATE_UNSETTLED */
	GMutex lock;
	GCond cond;
	unsigned waiters;  /* threads in te_batch_wait, under lock */
	/* The transport the first remote task in flight went to (NULL before
	 * it), reset when the batch drains: a waiter lets its progress()
	 * collect completions in the waiting thread. */
	_Atomic(te_transport_inst *) wait_tp;
	atomic_uint sleepers; /* threads waiting inside wait_tp's progress() */
	char *notify_name; /* segment to notify when the batch drains */
	char *notify_sender; /* name the notification carries; NULL: the engine's */
	char *notify_msg;
	te_task tasks[];
} te_batch;

void te_task_complete(te_task *t, uint64_t bytes, int error);
/* te_task_complete() for n slices (the host's complete_many): what their
 * tasks share is let go once per run of one batch, version and transport. */
void te_task_complete_many(te_transfer *const *ts, const uint64_t *bytes, const int *errors, size_t n);
/* failover.c: moves a task whose last slice failed with `error` on its
 * transport to the alternate one; true when it did (the task goes on). */
bool te_task_failover(te_task *t, int error);
/* failover.c: a task on `sv` completed while it was failed over. */
void te_segver_recovered(te_segver *sv);
/* te_host's transfer_stale: the task's peer refused keys its descriptor
 * gave; fetch the descriptor again (once per version). */
void te_task_stale(te_task *t);
void te_batches_init(struct te_engine *e);
/* Threads of the process spinning in te_batch_wait (util/teu-spin.h). */
extern atomic_int te_batch_spinners;
void te_batches_clear(struct te_engine *e);
void te_batches_cancel_all(struct te_engine *e);
void te_batch_mem_unref(te_batch *b);

/* ------------------------------------------------------------ deadline.c */
typedef struct te_deadlines te_deadlines;
/* Ends tasks [base, base+n) of batch `id` still in flight at `when`
 * (te_now_ns() time). The timer thread starts at the first call. */
void te_deadline_arm(struct te_engine *e, te_batch_id id, size_t base, size_t n, int64_t when);
/* batch.c: ends what is still in flight of those tasks, if the batch is
 * still there. */
void te_batch_expire_range(struct te_engine *e, te_batch_id id, size_t base, size_t n);
/* Stops the timer thread (engine destroy, before transports go). */
void te_deadlines_stop(struct te_engine *e);
/* Ends task `t` of a live batch early with `state`/`error` if it is in
 * flight and its transport honours deadlines; returns true when it did. */
bool te_task_end_early(te_task *t, int state, int error);
/* The last completion of a task: publishes its end (state from `error`)
 * and lets go of it, or, ended early, lets go once the early end is
 * published. */
void te_task_last(te_task *t, int state, int error, bool from_completion);
/* batch.c, for deadline.c: an early end's publishing, and letting go of
 * the task once both it and the task's last completion happened. */
void te_task_publish_early(te_task *t, int state);
void te_task_release_early(te_task *t, bool from_completion);
/* host->transfer_enter/leave. */
int te_task_enter(te_task *t);
void te_task_leave(te_task *t);
/* The deadline of this thread's call (te_submit_by), 0: none; waits on a
 * peer made inside it (the RPC client) end by it. */
extern _Thread_local int64_t te_call_deadline;
GThreadPool *te_notify_pool_new(void);
/* te_submit_on_stream(): appends `n` tasks for `reqs` to the batch, in
 * flight and WAITING until started (*out: the batch, *base: the first
 * task); then starts them as te_submit() does, or ends them unstarted. */
int te_batch_hold(struct te_engine *e, te_batch_id id, const te_request *reqs, size_t n, te_stream_op *sop,
		  struct te_batch **out, size_t *base);
int te_batch_start_held(struct te_engine *e, struct te_batch *b, size_t base, const te_request *reqs,
			size_t n, te_stream_op *sop);
void te_batch_end_held(struct te_batch *b, size_t base, size_t n, int state, int error);
/* te_submit_prepared(): appends `n` tasks to batch `id` as te_submit()
 * does (*out: the batch, kept by the tasks in flight; *base: the first
 * task), without initialising them. Negative, nothing appended. */
int te_batch_reserve(struct te_engine *e, te_batch_id id, size_t n, const char *what, struct te_batch **out,
		     size_t *base);
/* Ends a task that was not handed on (as te_submit() ends a refused one). */
void te_batch_task_end(te_task *t, int state, int error);
/* Sets every field of a task about to be submitted (a batch's tasks are
 * not cleared when it is made). Inline: prepared posts call it per task. */
static inline void te_task_init(te_task *t, te_batch *b, uint32_t opcode, void *local, uint64_t remote, uint64_t length,
		  te_stream_op *sop, uint64_t t0)
{
	t->batch = b;
	t->sv = NULL;
	t->tp = NULL;
	t->sop = sop;
	t->xfer = (te_transfer){
		.opcode = opcode,
		.nr_slices = 1,
		.local = local,
		.remote = remote,
		.length = length,
	};
	atomic_store_explicit(&t->slices_done, 0, memory_order_relaxed);
	atomic_store_explicit(&t->error, 0, memory_order_relaxed);
	atomic_store_explicit(&t->transferred, 0, memory_order_relaxed);
	atomic_store_explicit(&t->chunk_next, 0, memory_order_relaxed);
	atomic_store_explicit(&t->state, TE_TASK_WAITING, memory_order_relaxed);
	t->dev = NULL;
	t->stage = NULL;
	t->mb = NULL;
	t->mpeer = NULL;
	t->t0 = t0;
	t->stage_t0 = 0;
	t->deadline = 0;
	atomic_store_explicit(&t->gate, 0, memory_order_relaxed);
}

/* Counts one slice of `t` as ended (a task's or a staging chunk's): adds
 * `bytes`, keeps the first error. True when it was the last slice. The
 * slice count is read before counting: once another slice makes the count
 * complete, the task may be freed or its slot given to the next chunk. */
static inline bool te_task_count_slice(te_task *t, uint64_t bytes, int error)
{
	if (bytes)
		atomic_fetch_add_explicit(&t->transferred, bytes, memory_order_relaxed);
	if (error) {
		int expect = 0;
		atomic_compare_exchange_strong(&t->error, &expect, error);
	}
	unsigned slices = t->xfer.nr_slices;
	unsigned done = atomic_fetch_add_explicit(&t->slices_done, 1, memory_order_acq_rel) + 1;
	if (done > slices)
		te_err("task completed %u times for %u slices: transport bug", done, slices);
	return done == slices;
}

/* The task goes to its transport or the local copier now: from here on a
 * deadline or a cancel may end it early (a plain store: nothing else
 * writes the gate before, and a cancel that raced ahead saw no HANDED). */
static inline void te_task_handed(te_task *t)
{
	atomic_store_explicit(&t->gate, TE_GATE_HANDED, memory_order_release);
}

/* Hands n transfers to their transport; if it refuses them, each ends with
 * the transport's code. */
void te_transport_hand_over(te_transport_inst *tp, te_transfer **pend, size_t n);

/* Records the transport of the batch's first remote task (waiting). */
void te_batch_note_transport(struct te_batch *b, te_transport_inst *tp);

/* ------------------------------------------------------------- stream.c */
/* A task of a stream submission ended. */
void te_stream_task_done(te_stream_op *op);
/* Engine destroy: submissions the streams have not reached yet are
 * canceled; their stream callbacks, when they come, touch no engine. */
void te_stream_orphan_all(struct te_engine *e);
GThreadPool *te_stream_pool_new(void);

/* -------------------------------------------------------------- local.c */
int te_local_init(struct te_engine *e);
void te_local_fini(struct te_engine *e);
void te_local_submit(struct te_engine *e, te_task *t);

/* -------------------------------------------------------------- stage.c */
typedef struct te_stager te_stager;
int te_stage_init(struct te_engine *e);
void te_stage_fini(struct te_engine *e);
/* Moves remote task `t` (device memory on its local side) through host
 * buffers; completes it once. */
void te_stage_submit(struct te_engine *e, te_task *t);
/* Starts what te_stage_submit queued; at the end of te_submit, without the
 * registry lock. */
void te_stage_flush(struct te_engine *e);
/* Waits for hand-overs to transports still returning (engine destroy). */
void te_stage_quiesce(struct te_engine *e);
/* A transport completed a slice of a staging sub-transfer. */
void te_stage_slice_done(te_task *sub, uint64_t bytes, int error);
/* A device plugin's burst of copy completions on this thread begins (1) or
 * ends (0): chunks they make ready wait for its end (te_host's
 * device_done_burst). */
void te_stage_burst(int begin);

/* ------------------------------------------------------------- notify.c */
int te_notify_enqueue(struct te_engine *e, const char *name, const char *msg);
int te_notify_send_name(struct te_engine *e, const char *segment_name, const char *sender, const char *msg);
int te_notify_rpc(void *user, const char *peer, const char *body, size_t len, char **reply,
		  size_t *reply_len);
void te_notify_clear(struct te_engine *e);

/* -------------------------------------------------------------- engine */
struct te_engine {
	char *name;
	char *address;
	int rpc_port;
	GHashTable *options;
	te_metadata *md;
	te_rpc_server *rpc;
	te_auth *auth; /* the cluster key, NULL without TE_AUTH_KEY_FILE */

	GRecMutex ctl; /* serialises control operations (install, register, open, publish) */
	GRWLock data;  /* segment table and transport bindings, read by submit */
	GPtrArray *transports; /* te_transport_inst* in install order */
	GPtrArray *retired;    /* uninstalled instances, freed with the engine */
	te_memreg mem;

	GHashTable *segments;    /* id → te_segment*; ids are never reused */
	GHashTable *seg_by_name; /* name → id */
	int next_segment;

	GRWLock batch_lock;
	GHashTable *batches; /* id → te_batch* */
	uint64_t next_batch;
	atomic_long inflight; /* tasks in flight engine-wide */
	atomic_int lost;      /* segment versions whose peer was lost: submits look for them */

	GRWLock rpc_lock; /* handlers; read while one runs */
	te_rpc_handler_slot handlers[4];

	GMutex desc_lock;
	char *desc_cache; /* the descriptor as last published */

	GMutex notify_lock;
	GQueue notifications;

	te_stager *stager; /* device memory through host buffers */
	GThreadPool *copy_pool;
	unsigned copy_threads;
	uint64_t local_split; /* local copies from this size run on the workers */
	GThreadPool *reaper;
	GThreadPool *notify_pool;
	/* te_submit_on_stream(): starts the submissions their streams reached
	 * (off the runtime's thread, which must not call the runtime); the
	 * ones not reached yet, under stream.c's lock. */
	GThreadPool *stream_pool;
	GList *stream_ops;
	GThreadPool *refresh_pool; /* refreshes asked for by failed transfers */
	/* Publications a transport asked for from its own threads
	 * (te_host's buffer_fields): never on the caller's thread, which
	 * the engine's teardown may be joining with ctl held. */
	GThreadPool *publish_pool;
	atomic_bool publish_queued; /* one queued publication covers every ask */

	bool published;
	atomic_bool closing; /* read by completion and pool threads */
	int64_t drain_ms;    /* how long destroy and uninstall wait for tasks (TE_DRAIN_TIMEOUT_MS) */
	teu_spin_policy spin; /* te_batch_wait looks this long before it sleeps (TE_SPIN_US) */
	te_metrics *metrics; /* NULL when counting is off (TE_METRICS=0) */
	te_deadlines *deadlines; /* the deadline timer, NULL until a deadline is set */
};


#endif
