/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The plugin ABI of libte: what a transport or metadata plugin implements and
 * what the host offers it. A plugin is one shared object that exports one
 * symbol, te_plugin_entry(), returning a descriptor; TE_PLUGIN_DEFINE() writes
 * it. The plugin does not link against libte: everything it needs from the
 * host comes through the te_host table handed to it.
 *
 * Versioning: the host loads a plugin iff its magic matches, its ABI major
 * equals the host's and its ABI minor is not newer than the host's. Every ops
 * table and the host table begin with their size as built, so either side can
 * tell whether an optional member exists: use TE_HAS_OP(table, member).
 *
 * Memory: strings and buffers a plugin returns to the host (reply bodies,
 * JSON fragments, values) are allocated with malloc() and freed by the host
 * with free(), and the other way round for what the host returns.
 */
#ifndef TE_TE_PLUGIN_H
#define TE_TE_PLUGIN_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <errno.h>
#ifndef __cplusplus
#include <stdatomic.h> /* te_ratelimit; C++ has no _Atomic before C++23 */
#include <time.h>
#endif

#include <te/te.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TE_PLUGIN_MAGIC 0x4c505445u /* "ETPL" in memory order on LE */
#define TE_PLUGIN_ABI_MAJOR 1
#define TE_PLUGIN_ABI_MINOR 12
#define TE_PLUGIN_ENTRY_SYMBOL "te_plugin_entry"

/* True when `tbl` was built with `member` and it is set. */
#define TE_HAS_OP(tbl, member)                                                   \
	((tbl)->size >= offsetof(__typeof__(*(tbl)), member) + sizeof((tbl)->member) && \
	 (tbl)->member != NULL)

#if defined(__GNUC__)
#define TE_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TE_PRINTF(a, b)
#endif

/* RPC frame types of the handshake socket (docs/wire.md, "RPC frames"). */
enum te_rpc_type {
	TE_RPC_CONNECTION = 0,
	TE_RPC_METADATA = 1,
	TE_RPC_NOTIFY = 2,
	TE_RPC_PROBE = 3,
};

/* Channel kinds of peer authentication (auth_connect/auth_accept): a proof
 * made for one kind is refused on another. A plugin with connections of its
 * own kind uses a value from 16 to 255. */
enum te_auth_channel {
	TE_AUTH_RPC = 1, /* the host's RPC/handshake socket */
	TE_AUTH_TCP = 2, /* the tcp plugin's data connections */
};

/* --------------------------------------------------------- shared structs */

/* One request handed to a transport. The host owns it; it stays valid until
 * the plugin's last complete() call for it. */
typedef struct te_transfer {
	uint32_t opcode;            /* TE_OP_READ or TE_OP_WRITE */
	/* Number of complete() calls that finish this transfer. The host sets 1;
	 * a plugin that splits the transfer sets it before its first complete(). */
	uint32_t nr_slices;
	void *local;                /* registered local memory */
	uint64_t remote;            /* remote address, or file offset */
	uint64_t length;            /* never 0: the host completes empty requests */
	void *seg_ctx;              /* what segment_open() returned */
	const char *local_location; /* location of the local buffer, e.g. "cpu:0" */
	uintptr_t plugin_data[4];   /* free for the plugin */
} te_transfer;

/* A registered local buffer pinned against unregistration. */
typedef struct te_buffer_pin {
	void *addr;             /* the whole registered region */
	uint64_t length;
	const char *location;
	unsigned flags;         /* TE_MEM_* */
	void *priv;             /* host's */
} te_buffer_pin;

/* A buffer of a remote segment's descriptor. addr is 0 for file segments. */
typedef struct te_buffer_desc {
	uint64_t addr;
	uint64_t length;
	const char *name;
} te_buffer_desc;

/* A remote segment a transport is asked to serve. */
typedef struct te_segment_info {
	uint32_t size;
	const char *name;       /* segment name */
	const char *host;       /* peer's address (rpc_meta's ip_or_host_name, or the P2P name's host) */
	uint16_t rpc_port;
	const char *protocol;   /* the descriptor's "protocol" */
	const char *descriptor; /* the whole descriptor, JSON */
	const te_buffer_desc *buffers;
	size_t n_buffers;
} te_segment_info;

typedef struct te_mem_info {
	uint32_t size;
	void *addr;
	size_t length;
	const char *location;   /* resolved: "cpu:N", "cuda:N", ... never "*" */
	unsigned flags;         /* TE_MEM_* */
	/* Since ABI 1.2: 1 for device memory (a GPU's). Only transports with
	 * TE_TRANSPORT_DEVICE_MEMORY see such regions; their mem_register()
	 * returns -ENOTSUP when they cannot reach this memory themselves, and
	 * the host then stages it through host memory for them. */
	unsigned device;
} te_mem_info;

/* One device a device plugin drives, for te-info and topology. */
typedef struct te_device_info {
	uint32_t size;        /* sizeof(te_device_info) as the host built it */
	char location[32];    /* "cuda:0" */
	char name[96];        /* product name */
	uint64_t memory;      /* bytes of device memory, 0 when unknown */
	char pci_bus_id[32];  /* "0000:3b:00.0", "" when unknown */
	int numa_node;        /* -1 when unknown */
} te_device_info;

/* What another process of this host needs to reach a device allocation
 * (since ABI 1.3): a CUDA IPC handle, a file descriptor, or both. Filled by
 * the exporting side's device plugin, read by the importing side's. */
#define TE_DEVICE_IPC_BYTES 128
typedef struct te_device_ipc {
	uint32_t size;        /* sizeof(te_device_ipc) as its writer built it */
	int32_t device;       /* the device's index in the exporting process */
	int32_t fd;           /* a descriptor standing for the allocation, or -1 */
	uint32_t handle_len;  /* bytes of `handle` in use */
	uint8_t handle[TE_DEVICE_IPC_BYTES]; /* opaque to all but the plugin */
	uint64_t alloc_base;  /* the allocation, in the exporter's address space */
	uint64_t alloc_size;
} te_device_ipc;

/* One copy of a batch (since ABI 1.5): `len` bytes from `src` to `dst`. */
typedef struct te_copy {
	void *dst;
	const void *src;
	size_t len;
} te_copy;

enum te_copy_flags {
	/* Every dst and src of the batch is device memory of the one plugin
	 * (an opened export counts): it may move them without a copy engine
	 * call per piece (a gather-copy kernel). A hint: never required. */
	TE_COPY_DEVICE_ONLY = 1u << 0,
};

/* Handles one received RPC frame of a registered type. `body` is the JSON
 * (NUL-terminated, `len` bytes), `peer` the remote address as text. Writes a
 * malloc()ed reply; returns 0, or a negative error to close the connection
 * without a reply. Runs on a host thread; may block briefly. */
typedef int (*te_rpc_handler)(void *user, const char *peer, const char *body, size_t len,
			      char **reply, size_t *reply_len);

/* ------------------------------------------------------------ host table */

typedef struct te_host te_host;
typedef struct te_metric_dev te_metric_dev; /* the host's */
struct te_host {
	uint32_t size;
	uint32_t abi_minor;
	void *priv; /* the host's; do not touch */

	/* Log a line under this plugin's name. */
	void (*log)(const te_host *h, int level, const char *fmt, ...) TE_PRINTF(3, 4);
	/* Configuration: the engine option `te_name`, else the environment variable
	 * `te_name`, else `mc_name` (may be NULL). NULL when unset. */
	const char *(*config)(const te_host *h, const char *te_name, const char *mc_name);

	/* ---- data path (transport plugins) ---- */
	/* Reports one slice of `t` done: `bytes` moved, `error` 0 or negative
	 * (-ETIMEDOUT ends the task as TIMEOUT, -ECANCELED as CANCELED, others
	 * FAILED). Call exactly t->nr_slices times. Thread-safe, never blocks. */
	void (*complete)(const te_host *h, te_transfer *t, uint64_t bytes, int error);
	/* Non-zero once the transfer's batch was canceled: stop at a slice boundary
	 * and complete the remaining slices with -ECANCELED. Since ABI 1.11, 2
	 * when its engine is being destroyed: complete at once what is kept
	 * only to learn whether it settles (the destroy waits for it). */
	int (*canceled)(const te_host *h, const te_transfer *t);
	/* Pins the registered local buffer that contains [addr, addr+len) whole and
	 * has every flag in `need` (e.g. TE_MEM_REMOTE_ACCESS). TE_ERR_ADDRESS when
	 * none does. Unregistering waits until the pin is released, without bound:
	 * a holder serving a peer takes buffer_acquire_revocable() (ABI 1.4)
	 * instead, so that a stalling peer cannot hold te_unregister_memory(). */
	int (*buffer_acquire)(const te_host *h, uint64_t addr, uint64_t len, unsigned need,
			      te_buffer_pin *pin);
	void (*buffer_release)(const te_host *h, te_buffer_pin *pin);

	/* ---- control plane ---- */
	/* Routes received frames of `type` (Connection) to `fn`. One handler per
	 * type; NULL removes it. Metadata and Probe belong to the host. */
	int (*rpc_handle)(const te_host *h, int type, te_rpc_handler fn, void *user);
	/* Sends one frame to the RPC port of segment `segment_name` and returns the
	 * reply body (malloc()ed, NUL-terminated). timeout_ms <= 0: the defaults. */
	int (*rpc_call)(const te_host *h, const char *segment_name, int type, const char *body,
			size_t len, char **reply, size_t *reply_len, int timeout_ms);
	/* The plugin's descriptor fields changed: publish the descriptor again,
	 * at once, or (since 1.8, when the engine is busy, e.g. tearing down
	 * while it waits for the caller's thread) soon after on a thread of
	 * the host's; any thread may call it. */
	int (*republish)(const te_host *h);
	/* This engine's segment name and the address peers reach it at. */
	const char *(*local_name)(const te_host *h);
	const char *(*local_address)(const te_host *h);

	/* ---- since ABI 1.1 (test with TE_HAS_OP) ---- */
	/* When [addr, addr+len) lies in memory from te_mem_alloc(): the
	 * allocation's memfd (the host's: dup() it to keep it), the range's
	 * offset in it, and the allocation's size and first address. -ENOENT
	 * otherwise. */
	int (*shared_memory)(const te_host *h, uint64_t addr, uint64_t len, int *fd, uint64_t *offset,
			     uint64_t *size, uint64_t *base);

	/* ---- since ABI 1.2 (test with TE_HAS_OP) ---- */
	/* 1 when the engine has a cluster key (TE_AUTH_KEY_FILE): then every
	 * connection a transport opens or accepts must pass auth_connect() or
	 * auth_accept() before anything else crosses it. 0 otherwise. */
	int (*auth_enabled)(const te_host *h);
	/* The mutual challenge-response on a freshly connected socket (blocking
	 * or not: it polls), as the side that connected / accepted. `channel` is
	 * a te_auth_channel; `peer` names the remote end in log lines. Takes at
	 * most `timeout_ms` (<= 0 or above 3000: 3000). 0 when both sides proved
	 * the key, or at once without I/O when the engine has no key.
	 * TE_ERR_AUTH when the peer was refused or refused us (logged; refusals
	 * of accepted peers rate-limited, te_ratelimit): close the socket. Nothing
	 * is allocated beyond the exchange. */
	int (*auth_connect)(const te_host *h, int fd, int channel, const char *peer, int timeout_ms);
	int (*auth_accept)(const te_host *h, int fd, int channel, const char *peer, int timeout_ms);
	/* 1 when a pinned buffer is device memory (a GPU's): the CPU may not
	 * touch it, so its bytes move only through buffer_copy(). 0 for host
	 * memory. Transports see device pins only with TE_TRANSPORT_DEVICE_PINS
	 * or TE_TRANSPORT_DEVICE_MEMORY. */
	int (*buffer_is_device)(const te_host *h, const te_buffer_pin *pin);
	/* Copies `len` bytes between host memory and the memory of a pinned
	 * buffer (either of `dst` and `src` lies in the pin), through the device
	 * plugin for device memory. 0, or negative (logged) when the copy
	 * failed. */
	int (*buffer_copy)(const te_host *h, const te_buffer_pin *pin, void *dst, const void *src,
			   size_t len);
	/* For a device region a TE_TRANSPORT_DEVICE_MEMORY transport registers:
	 * a dma-buf file descriptor of the device allocation holding
	 * [addr, addr+len) (the caller closes it) and the range's offset in it,
	 * for ibv_reg_dmabuf_mr(). -ENOTSUP when the device plugin or its driver
	 * offers none, -ENOENT when the range is not device memory. */
	int (*device_dmabuf)(const te_host *h, const void *addr, size_t len, int *fd,
			     uint64_t *offset);
	/* The devices of every usable device plugin: up to `max` into `out`
	 * (each out[i].size set by the caller), `*n` how many there are. For
	 * topology: where each device sits (PCI bus id, NUMA node). */
	int (*devices)(const te_host *h, te_device_info *out, size_t max, size_t *n);

	/* ---- since ABI 1.3 (test with TE_HAS_OP) ---- */
	/* For a device region a TE_TRANSPORT_DEVICE_TARGET transport registers:
	 * how another process of this host opens the allocation holding
	 * [addr, addr+len) (its fd, if any, is the caller's to close) and the
	 * region's location ("cuda:0") for device_ipc_open() there.
	 * -ENOTSUP when the device plugin cannot share its memory, -ENOENT when
	 * the range is not device memory. */
	int (*device_ipc_export)(const te_host *h, const void *addr, size_t len, te_device_ipc *ipc,
				 char *location, size_t location_len);
	/* Opens, in this process, an allocation another process exported: `*base`
	 * is where its first byte lies here. `location` is the exporter's (its
	 * prefix picks the device plugin). The fd in `ipc` stays the caller's. */
	int (*device_ipc_open)(const te_host *h, const char *location, const te_device_ipc *ipc,
			       void **base);
	void (*device_ipc_close)(const te_host *h, const char *location, void *base);
	/* Copies `len` bytes where either side is memory of the device plugin of
	 * `location` (an opened allocation included), the other host memory or
	 * the same plugin's. 0, or negative (logged). */
	int (*device_copy)(const te_host *h, const char *location, void *dst, const void *src,
			   size_t len);

	/* ---- since ABI 1.4 (test with TE_HAS_OP) ---- */
	/* As buffer_acquire(), but unregistering waits for this pin at most
	 * TE_UNREGISTER_TIMEOUT_MS and then revokes it, so the holder must
	 * touch the buffer's bytes (memcpy, readv into it, sendmsg from it)
	 * only between a buffer_enter() that returned 1 and its buffer_leave(),
	 * called on one thread, with nothing in between that blocks (the
	 * revoking unregister waits for that stretch). buffer_enter() returns
	 * 0 once the pin is revoked: fail the request without touching the
	 * memory again (close the connection) and release the pin as usual.
	 * buffer_copy() checks by itself and fails with TE_ERR_ADDRESS. Both
	 * are cheap (an atomic on a cache line of the calling thread's own)
	 * and take pins of buffer_acquire() too, which unregistering still
	 * waits for without bound. */
	int (*buffer_acquire_revocable)(const te_host *h, uint64_t addr, uint64_t len, unsigned need,
					te_buffer_pin *pin);
	int (*buffer_enter)(const te_host *h, const te_buffer_pin *pin);
	void (*buffer_leave)(const te_host *h, const te_buffer_pin *pin);

	/* ---- since ABI 1.5 (test with TE_HAS_OP) ---- */
	/* As buffer_copy() for n pieces, copies[i] between host memory and the
	 * pin pins[i], queued on the device together and waited for once: the
	 * way to move many pieces of device memory (one waited copy costs the
	 * copy engine's whole latency, ~15 us on a PCIe GPU). 0 when every
	 * piece moved, else negative (logged); any piece may then have moved. */
	int (*buffer_copy_batch)(const te_host *h, const te_buffer_pin *const *pins,
				 const te_copy *copies, size_t n);
	/* As device_copy() for n pieces (TE_COPY_* flags), queued together and
	 * waited for once. */
	int (*device_copy_batch)(const te_host *h, const char *location, const te_copy *copies,
				 size_t n, unsigned flags);
	/* Host memory for buffers that device memory is copied through:
	 * page-locked by a device plugin where one is usable (copies to and
	 * from a GPU run at its copy engine's speed only from such memory),
	 * else ordinary. Free it with host_buffer_free(). */
	int (*host_buffer_alloc)(const te_host *h, size_t len, void **ptr);
	void (*host_buffer_free)(const te_host *h, void *ptr);

	/* ---- since ABI 1.6 (test with TE_HAS_OP) ---- */
	/* Metrics of a transport's own (docs/metrics.md). A device of this
	 * plugin instance (a NIC "mlx5_0", a rail "eth1", an NVMe file), named
	 * as the `device` label shows it; the same name gives the same handle,
	 * valid until the instance is destroyed. NULL when counting is off or
	 * the engine's device table is full (TE_METRICS_DEVICES): metric_add()
	 * then counts for the transport alone. */
	te_metric_dev *(*metric_device)(const te_host *h, const char *name);
	/* Adds `delta` to counter `what` (enum te_metric_kind) of `dev`, or of
	 * the transport itself when `dev` is NULL. Any thread, never blocks,
	 * contention-free: call it on the data path. */
	void (*metric_add)(const te_host *h, te_metric_dev *dev, int what, int64_t delta);
	/* For exporter plugins: te_metrics_text(NULL), malloc()ed. */
	int (*metrics_text)(const te_host *h, char **text, size_t *len);

	/* ---- since ABI 1.7 (test with TE_HAS_OP) ---- */
	/* For device plugins: brackets the te_device_done_fn calls one thread
	 * makes together (the copies one wait found finished), begin = 1
	 * before the first and 0 after the last, with no other op of the
	 * plugin in between. What those done() calls start (staged chunks
	 * handed to their transport) the host then starts together at the
	 * end, in one call per transport instead of one per copy. done()
	 * calls outside a burst are handled at once, as before. */
	void (*device_done_burst)(const te_host *h, int begin);

	/* ---- since ABI 1.8 (test with TE_HAS_OP) ---- */
	/* For transports: the buffer fields this transport gave for the
	 * region registered at `addr` (mem_register's json_object) changed,
	 * e.g. its keys after a NIC was opened again: `json_object` replaces
	 * them, and the host publishes the descriptor again soon, on a thread
	 * of its own. -ENOENT when no region starts at `addr`, -EINVAL when
	 * the text is not a JSON object. */
	int (*buffer_fields)(const te_host *h, const void *addr, const char *json_object);
	/* For transports: a peer refused this transfer's keys or range on one
	 * path though it was moved by another (a peer's NIC opened again with
	 * new keys): the host fetches the peer's descriptor again, off the
	 * caller's thread, at most once per descriptor version, so later
	 * transfers use what the peer publishes now. */
	void (*transfer_stale)(const te_host *h, const te_transfer *t);

	/* ---- since ABI 1.11 (test with TE_HAS_OP) ---- */
	/* Deadlines (te.h, te_batch_set_deadline). A transport with
	 * TE_TRANSPORT_DEADLINES brackets every touch of a transfer's local
	 * memory (a copy into or out of it, a recv() into it, a send() from
	 * it) by transfer_enter() and transfer_leave(), on one thread with
	 * nothing that blocks in between (non-blocking socket calls are fine).
	 * transfer_enter() returns 1 to go on, 0 once the host ended the
	 * transfer (deadline, cancel): then touch nothing of it any more and
	 * end its slices as usual, with any error (the host keeps the task's
	 * first end). For a WRITE, a successful enter also tells the host that
	 * bytes may have left (see expire). Each costs an atomic on the task. */
	int (*transfer_enter)(const te_host *h, te_transfer *t);
	void (*transfer_leave)(const te_host *h, te_transfer *t);
	/* The transfer's deadline (CLOCK_MONOTONIC ns, te_now_ns()), 0 when it
	 * has none: bound the waits made for it (a connect, a handshake). */
	int64_t (*transfer_deadline)(const te_host *h, const te_transfer *t);
};

/* What metric_add() counts (since ABI 1.6). */
enum te_metric_kind {
	TE_METRIC_BYTES = 1,          /* bytes moved through the device; feeds its moving-average bandwidth */
	TE_METRIC_INFLIGHT_BYTES = 2, /* a gauge: +len when posted, -len when done */
	TE_METRIC_RETRIES = 3,        /* a request sent again */
	TE_METRIC_FAILOVERS = 4,      /* requests moved off this device (or transport) to another */
	TE_METRIC_ERRORS = 5,         /* device errors: a link lost, a failed work completion */
};

/* ------------------------------------------------------ transport plugins */

enum te_transport_flags {
	/* Serves memory segments: may be the descriptor's "protocol". */
	TE_TRANSPORT_MEMORY = 1u << 0,
	/* Serves file segments (buffers without addresses). */
	TE_TRANSPORT_FILES = 1u << 1,
	/* Moves device memory itself (GPUDirect): mem_register() gets device
	 * regions too, and for each one it accepts, the host hands it requests
	 * on that memory as they are instead of staging them through host
	 * memory; buffer_acquire() pins device memory for it (check
	 * buffer_is_device()). Since ABI 1.2. */
	TE_TRANSPORT_DEVICE_MEMORY = 1u << 3,
	/* Serves peers' requests on device memory by copying through
	 * host->buffer_copy() (its target side stages; its initiator side is
	 * staged by the host). Since ABI 1.2. */
	TE_TRANSPORT_DEVICE_PINS = 1u << 4,
	/* submit() may be called from inside this transport's own complete()
	 * calls: it holds none of its locks around them. The host then starts a
	 * staged chunk from the completion that freed its buffer rather than
	 * through a thread hand-off. Hosts that do not know it ignore it. */
	TE_TRANSPORT_NESTED_SUBMIT = 1u << 5,
	/* Serves peers' requests on device memory by other means than
	 * buffer_copy() (the same-host transport: through device_ipc_*):
	 * mem_register() gets device regions too, as for host memory, while
	 * this engine's own requests on device memory are staged for it through
	 * host memory as for any transport without TE_TRANSPORT_DEVICE_MEMORY.
	 * Since ABI 1.3. */
	TE_TRANSPORT_DEVICE_TARGET = 1u << 6,
	/* Serves only engines on this host, better than any network transport:
	 * offered every segment first (before the one its descriptor names) and
	 * declines the others. Since ABI 1.1. */
	TE_TRANSPORT_SAME_HOST = 1u << 2,
	/* Honours deadlines and cancels at once (since ABI 1.11): it touches a
	 * transfer's local memory only inside host->transfer_enter/leave (or
	 * its hardware does, and expire() below waits for that to stop), so
	 * the host may end a transfer before its slices completed. Without
	 * it the host waits for the transport to end each transfer. */
	TE_TRANSPORT_DEADLINES = 1u << 7,
};

typedef struct te_transport_ops {
	uint32_t size;
	uint32_t flags; /* te_transport_flags */
	/* Optional. Whether the transport can work on this machine (e.g. RDMA
	 * devices exist): 0, or negative with a reason written to `why`. */
	int (*probe)(const te_host *h, char *why, size_t why_len);
	/* Required. One instance per engine. */
	int (*create)(const te_host *h, const char *json_args, void **ctx);
	/* Required. Must complete every outstanding transfer (with an error if it
	 * has to) before returning. */
	void (*destroy)(void *ctx);
	/* Optional. A JSON object of top-level descriptor fields this transport
	 * contributes (TCP: tcp_data_port; RDMA: devices, priority_matrix). */
	int (*describe)(void *ctx, char **json_object);
	/* Optional. Called for each registration (and each existing one when the
	 * transport is installed later). May return a JSON object of fields merged
	 * into that buffer's descriptor entry (RDMA: rkey, lkey, name). */
	int (*mem_register)(void *ctx, const te_mem_info *mem, char **json_object);
	int (*mem_unregister)(void *ctx, void *addr, size_t length);
	/* Required. Accept (0) or decline (negative) serving a remote segment.
	 * The host has checked the descriptor's envelope only (name, protocol,
	 * auth, buffers): the transport checks its own fields here, and
	 * refuses a malformed one (-EINVAL) with a log line naming it. */
	int (*segment_open)(void *ctx, const te_segment_info *seg, void **seg_ctx);
	void (*segment_close)(void *ctx, void *seg_ctx);
	/* Required. Starts `n` transfers; completes each through host->complete(),
	 * possibly before returning. No allocation or blocking I/O is expected
	 * here: queue the work. */
	int (*submit)(void *ctx, te_transfer *const *transfers, size_t n);
	/* Optional. A human-readable report of what the plugin finds on this
	 * machine (devices, topology), for te-info. Needs no instance. */
	int (*report)(const te_host *h, char **text);

	/* ---- since ABI 1.1 (test with TE_HAS_OP) ---- */
	/* Optional, with wake. Collects completions of this transport's
	 * transfers in the calling thread (calling complete() for them), so that
	 * a thread waiting for its transfers is woken by the completions
	 * themselves rather than by the transport's own thread after it
	 * collected them. Returns 0 once done(arg) is true (checked after each
	 * collection and before sleeping; done NULL: after the first
	 * collection), -ETIMEDOUT once `timeout_ns` has passed (0: collect what
	 * is ready, never sleep; < 0: no limit). Any other negative value (e.g.
	 * -ENOTSUP when this instance's configuration cannot) makes the host
	 * wait its usual way. It may return early (0 or -ETIMEDOUT): the host
	 * looks and calls again. te_batch_wait() calls it when the batch's first
	 * remote task went to this transport; te_batch_status() and
	 * te_get_status() call it with a zero timeout before they read. When
	 * another thread of the plugin completes a transfer, the plugin wakes
	 * the threads sleeping here itself. */
	int (*progress)(void *ctx, int (*done)(void *arg), void *arg, int64_t timeout_ns);
	/* Optional, with progress: wake every thread sleeping in progress() so
	 * that it checks done() again. The host calls it when a batch that has
	 * such a sleeper drains outside this transport's progress() (a task of
	 * another transport, a local copy, a task ended at submit). */
	void (*wake)(void *ctx);

	/* ---- since ABI 1.11 (test with TE_HAS_OP) ---- */
	/* Optional, with TE_TRANSPORT_DEADLINES. The host ended `t` before
	 * its slices completed (its deadline passed, its batch was canceled)
	 * and has closed its gate: no transfer_enter() for it succeeds any
	 * more and none is open. Drop its outstanding work soon (close the
	 * connection that carries it, move a queue pair to error) so that
	 * its remaining complete() calls come; they may come from inside this
	 * call. Return only once nothing touches t's local memory any more:
	 * a transport whose hardware reads or writes it outside transfer_enter
	 * and transfer_leave (RDMA) waits here, briefly, for that to stop.
	 * Returns 1 when a WRITE of t may still change the peer's memory (its
	 * bytes left and neither an answer nor a failure that rules it out
	 * came), 0 otherwise. The host keeps t until its last complete() call
	 * and reports the task TE_TASK_UNSETTLED until then when this returned
	 * 1 (or, without this op, when a WRITE entered the gate): for such a
	 * WRITE make that call only once the peer can no longer apply the
	 * bytes (its answer came, the connection was fenced, the peer is
	 * gone) or when the instance is destroyed. Runs on a host thread with
	 * no host lock held, at most once per transfer. It may race with the
	 * transfer's last complete(): the memory of `t` stays valid during
	 * the call, but look it up in your own state (under your lock) before
	 * using what plugin_data points to, and do nothing when it is done. */
	int (*expire)(void *ctx, te_transfer *t);

	/* ---- since ABI 1.12 (the host reads them only when `size` covers
	 * them) ---- */
	/* Optional. A JSON object of top-level descriptor fields that every
	 * engine publishes while this plugin is loaded, whether or not the
	 * engine installed it (then describe() adds to and replaces them):
	 * fields peers read from any descriptor (TCP: "tcp_data_port": 0, as
	 * Mooncake writes it). Static text; NULL: none. */
	const char *default_fields;
	/* Rank in automatic selection (te_transport_auto()): among the
	 * installable transports with TE_TRANSPORT_MEMORY and without
	 * TE_TRANSPORT_SAME_HOST, the one with the highest value whose probe
	 * passes and whose instance starts is installed; 0: never chosen
	 * automatically. A plugin built before 1.12 ranks as the host did
	 * then: TE_TRANSPORT_PRIORITY_RDMA when named "rdma",
	 * TE_TRANSPORT_PRIORITY_TCP when named "tcp", else
	 * TE_TRANSPORT_PRIORITY_OTHER. */
	uint32_t priority;
} te_transport_ops;

/* The built-in network transports' ranks (RDMA first, TCP when it cannot
 * work), and that of a plugin built before ABI 1.12 under another name. */
#define TE_TRANSPORT_PRIORITY_RDMA 300u
#define TE_TRANSPORT_PRIORITY_TCP 200u
#define TE_TRANSPORT_PRIORITY_OTHER 100u

/* ------------------------------------------------------- metadata plugins */

enum te_metadata_put_flags {
	/* The key belongs to the calling engine: a store that can should tie it to
	 * the engine's liveness (an etcd lease), so it vanishes if the engine dies. */
	TE_META_OWNED = 1u << 0,
};

typedef struct te_metadata_ops {
	uint32_t size;
	uint32_t reserved;
	/* NULL-terminated list of URL schemes served ("etcd", "redis", ...). */
	const char *const *schemes;
	/* Required. `conn` is the whole connection string. */
	int (*open)(const te_host *h, const char *conn, void **ctx);
	void (*close)(void *ctx);
	/* Required. -ENOENT when the key does not exist. `*value` NUL-terminated. */
	int (*get)(void *ctx, const char *key, char **value, size_t *len);
	int (*put)(void *ctx, const char *key, const char *value, size_t len, unsigned flags);
	/* Deleting a missing key is not an error. */
	int (*remove)(void *ctx, const char *key);
	/* Optional. Keys under `prefix`: a malloc()ed array of malloc()ed strings. */
	int (*list)(void *ctx, const char *prefix, char ***keys, size_t *n);
} te_metadata_ops;

/* --------------------------------------------------------- device plugins */


typedef void (*te_device_done_fn)(void *arg, int error);

/*
 * Device memory (since ABI 1.2). One instance per process: device runtimes
 * are per process. Every op may be called from any thread.
 */
typedef struct te_device_ops {
	uint32_t size;
	uint32_t reserved;
	/* Location prefix of this plugin's devices: "cuda" gives "cuda:N". */
	const char *prefix;
	/* Required. 0 when the plugin can work here, else negative with the
	 * reason in `why` (no driver library, no device): te-info shows it. */
	int (*probe)(const te_host *h, char *why, size_t why_len);
	/* Required. */
	int (*create)(const te_host *h, void **ctx);
	void (*destroy)(void *ctx);
	/* Required. 1 when [addr, addr+len) is device memory of this plugin
	 * (then `*device` is its index), 0 when it is not (host memory or
	 * another plugin's), negative on error. */
	int (*classify)(void *ctx, const void *addr, size_t len, int *device);
	/* Required. Copies `len` bytes, either side device memory or host memory. */
	int (*copy)(void *ctx, void *dst, const void *src, size_t len);
	/* Optional. As copy, returning at once; done(arg, error) runs once the
	 * bytes moved (possibly before it returns, in the caller's thread). A
	 * negative return: nothing was started and done() will not run;
	 * -ENOTSUP: use copy() for this one. done() must not call the plugin's
	 * ops. */
	int (*copy_async)(void *ctx, void *dst, const void *src, size_t len, te_device_done_fn done,
			  void *arg);
	/* Optional. Page-locked host memory for staging buffers. */
	int (*host_alloc)(void *ctx, size_t len, void **ptr);
	void (*host_free)(void *ctx, void *ptr);
	/* Optional. Device memory of device `device`. */
	int (*mem_alloc)(void *ctx, int device, size_t len, void **ptr);
	void (*mem_free)(void *ctx, void *ptr);
	/* Optional. A dma-buf file descriptor (the caller closes it) and the
	 * range's offset in it, for ibv_reg_dmabuf_mr. -ENOTSUP when the driver
	 * offers none. */
	int (*export_dmabuf)(void *ctx, const void *addr, size_t len, int *fd, uint64_t *offset);
	/* Required. Up to `max` devices into `out` (each `out[i].size` set by the
	 * caller); `*n` the number of devices there are. */
	int (*devices)(void *ctx, te_device_info *out, size_t max, size_t *n);
	/* Optional. Waits until the work queued on the runtime's stream (a
	 * CUDA stream: CUstream) before this call has finished. */
	int (*stream_wait)(void *ctx, void *stream);
	/* ---- since ABI 1.3: optional, all three or none ---- */
	/* Lets another process of this host reach the allocation holding
	 * [addr, addr+len): fills `ipc` (its fd, if any, the caller's to close).
	 * -ENOTSUP when the driver cannot share this memory. */
	int (*ipc_export)(void *ctx, const void *addr, size_t len, te_device_ipc *ipc);
	/* Opens an export of another process: `*base` is the allocation's first
	 * byte here; copy() and classify() then know the range. The fd in `ipc`
	 * stays the caller's. */
	int (*ipc_open)(void *ctx, const te_device_ipc *ipc, void **base);
	void (*ipc_close)(void *ctx, void *base);
	/* ---- since ABI 1.5: optional ---- */
	/* Copies n pieces (any directions, TE_COPY_* flags as hints), queued
	 * together and waited for once; returns when all moved. 0, or negative
	 * (logged): any piece may then have moved. Without it the host calls
	 * copy() n times. */
	int (*copy_batch)(void *ctx, const te_copy *copies, size_t n, unsigned flags);
	/* ---- since ABI 1.9: optional ---- */
	/* Queues `fn(arg)` on the runtime's stream (CUDA: cuLaunchHostFunc):
	 * it runs once the work queued before has finished, on a thread of the
	 * runtime, and the stream's later work waits until it returns. `fn`
	 * calls nothing of the runtime (it may block). 0, or negative (logged):
	 * then `fn` never runs. */
	int (*stream_launch)(void *ctx, void *stream, void (*fn)(void *arg), void *arg);
	/* ---- since ABI 1.10: optional, both or none ---- */
	/* stream_launch and stream_wait for a stream of device `device` (the N
	 * of the location "prefix:N"; -1 when the location names none). The
	 * plugin queues where the stream's own device (context) wants it: a
	 * stream the runtime made is its device's, whatever the calling
	 * thread's current device; a default stream (CUDA's 0, HIP's null
	 * stream) is `device`'s, or the calling thread's current device's when
	 * -1. -EINVAL when the stream is another device's than `device`. The
	 * calling thread's current device (CUDA: context) is as it was when
	 * they return. The host prefers them to the two above. */
	int (*stream_launch_on)(void *ctx, int device, void *stream, void (*fn)(void *arg), void *arg);
	int (*stream_wait_on)(void *ctx, int device, void *stream);
} te_device_ops;

/*
 * Exporters (since ABI 1.6): serve the process's metrics somewhere
 * (TE_METRICS_ADDR). One instance per process, created when the first engine
 * that asks for one starts and destroyed with the last; it gets the text
 * through host->metrics_text() whenever it is asked.
 */
typedef struct te_exporter_ops {
	uint32_t size;
	uint32_t reserved;
	/* Required. Starts serving at `addr` ("host:port"; port 0 picks one).
	 * `json_args`: {"token_file": PATH} or NULL. Returns at once, serving
	 * from a thread of its own. */
	int (*create)(const te_host *h, const char *addr, const char *json_args, void **ctx);
	void (*destroy)(void *ctx);
	/* Optional. Where it serves ("http://127.0.0.1:9464/metrics") into `buf`. */
	int (*url)(void *ctx, char *buf, size_t size);
} te_exporter_ops;

/* ------------------------------------------------------------- descriptor */

typedef struct te_plugin_desc {
	uint32_t magic;      /* TE_PLUGIN_MAGIC */
	uint16_t abi_major;  /* TE_PLUGIN_ABI_MAJOR */
	uint16_t abi_minor;  /* TE_PLUGIN_ABI_MINOR */
	uint32_t size;       /* sizeof(te_plugin_desc) as built */
	uint32_t kind;       /* TE_KIND_TRANSPORT, TE_KIND_METADATA or TE_KIND_DEVICE */
	const char *name;    /* [a-z0-9_-]{1,31}: "tcp", "etcd", ... */
	const char *version;
	const char *description;
	const char *license;
	const void *ops;     /* te_transport_ops, te_metadata_ops or te_device_ops */
	void *reserved[4];
} te_plugin_desc;

typedef const te_plugin_desc *(*te_plugin_entry_fn)(void);

#define TE_PLUGIN_DEFINE(kind_, name_, version_, description_, license_, ops_)   \
	__attribute__((visibility("default"))) const te_plugin_desc *te_plugin_entry(void); \
	const te_plugin_desc *te_plugin_entry(void)                                 \
	{                                                                           \
		static const te_plugin_desc desc = {                                    \
			.magic = TE_PLUGIN_MAGIC,                                           \
			.abi_major = TE_PLUGIN_ABI_MAJOR,                                   \
			.abi_minor = TE_PLUGIN_ABI_MINOR,                                   \
			.size = sizeof(te_plugin_desc),                                     \
			.kind = (kind_),                                                    \
			.name = (name_),                                                    \
			.version = (version_),                                              \
			.description = (description_),                                     \
			.license = (license_),                                              \
			.ops = (ops_),                                                      \
		};                                                                      \
		return &desc;                                                           \
	}

/* ---------------------------------------------------------------- helpers */

/* Reads an unsigned option through host->config() (TE_ name, then MC_ name).
 * Missing: `def`. Not a number or outside [min, max]: `def` and a warning. */
static inline uint64_t te_host_config_u64(const te_host *h, const char *te_name, const char *mc_name,
					  uint64_t def, uint64_t min, uint64_t max)
{
	const char *s = h->config(h, te_name, mc_name);
	char *end = NULL;
	unsigned long long v;

	if (s == NULL || *s == '\0')
		return def;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno != 0 || end == s || *end != '\0' || s[0] == '-' || v < min || v > max) {
		h->log(h, TE_LOG_WARN, "%s=%s is not a number in [%llu, %llu]; using %llu", te_name, s,
		       (unsigned long long)min, (unsigned long long)max, (unsigned long long)def);
		return def;
	}
	return (uint64_t)v;
}

#ifndef __cplusplus
/* --------------------------------------------------- rate-limited lines */

/*
 * Lines a peer can trigger at will (refusals, malformed frames, out-of-range
 * requests) go through a limiter, one per kind of line: at most
 * TE_RATELIMIT_BURST lines a second; the first line of the next second says
 * how many were held back. Lock-free, so a flood costs two atomics a line.
 */
#define TE_RATELIMIT_BURST 5
typedef struct te_ratelimit {
	_Atomic int64_t window_ms; /* start of the current second */
	_Atomic unsigned count;    /* lines let through in it */
	_Atomic unsigned held;     /* lines held back since the last report */
} te_ratelimit;

static inline int64_t te_ratelimit_now_ms_(void)
{
	struct timespec ts;
#ifdef CLOCK_MONOTONIC
	clock_gettime(CLOCK_MONOTONIC, &ts);
#else /* strict ISO C without POSIX: wall time is good enough here */
	timespec_get(&ts, TIME_UTC);
#endif
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* True when the line may be written; *held gets the number held back since
 * the last line written (report it with the line). */
static inline int te_ratelimit_allow(te_ratelimit *rl, unsigned *held)
{
	int64_t now = te_ratelimit_now_ms_(), w = atomic_load(&rl->window_ms);

	if (now - w >= 1000 && atomic_compare_exchange_strong(&rl->window_ms, &w, now))
		atomic_store(&rl->count, 0);
	if (atomic_fetch_add(&rl->count, 1) >= TE_RATELIMIT_BURST) {
		atomic_fetch_add(&rl->held, 1);
		return 0;
	}
	*held = atomic_exchange(&rl->held, 0);
	return 1;
}

/* A plugin's rate-limited line, one limiter per call site. */
#define TE_HOST_LOG_LIMITED(h, level, fmt, ...)                                      \
	do {                                                                         \
		static te_ratelimit te_rl_;                                          \
		unsigned te_held_;                                                   \
		if (te_ratelimit_allow(&te_rl_, &te_held_))                          \
			(h)->log((h), (level), fmt " (%u similar lines held back)",   \
				 ##__VA_ARGS__, te_held_);                            \
	} while (0)
#endif /* !__cplusplus */

#ifdef __cplusplus
}
#endif
#endif /* TE_TE_PLUGIN_H */
