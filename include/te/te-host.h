/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the host offers every plugin: the te_host table handed to each
 * instance, the same services grouped by topic in tables of their own
 * (te_host_service(), since ABI 1.13), and helpers built on them. Included
 * by te-plugin.h.
 */
#ifndef TE_TE_HOST_H
#define TE_TE_HOST_H

#include <errno.h>
#include <stdlib.h>
#ifndef __cplusplus
#include <stdatomic.h> /* te_ratelimit; C++ has no _Atomic before C++23 */
#include <time.h>
#endif

#include <te/te-plugin.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ host table */

typedef struct te_metric_dev te_metric_dev; /* the host's */
/*
 * The host's services, one table handed to each plugin instance. Since ABI
 * 1.13 each service is also in the table of its topic below (te_log_service,
 * te_transfer_service, ...), reached through service(): the contracts are
 * written there. The members here stay where they are for plugins built
 * before; new services are added to a topic's table only.
 */
struct te_host {
	uint32_t size;
	uint32_t abi_minor;
	void *priv; /* the host's; do not touch */

	/* te_log_service */
	void (*log)(const te_host *h, int level, const char *fmt, ...) TE_PRINTF(3, 4);
	const char *(*config)(const te_host *h, const char *te_name, const char *mc_name);

	/* ---- data path (transport plugins) ---- */
	/* te_transfer_service */
	void (*complete)(const te_host *h, te_transfer *t, uint64_t bytes, int error);
	int (*canceled)(const te_host *h, const te_transfer *t);
	int (*buffer_acquire)(const te_host *h, uint64_t addr, uint64_t len, unsigned need,
			      te_buffer_pin *pin);
	void (*buffer_release)(const te_host *h, te_buffer_pin *pin);

	/* ---- control plane ---- */
	/* te_control_service */
	int (*rpc_handle)(const te_host *h, int type, te_rpc_handler fn, void *user);
	int (*rpc_call)(const te_host *h, const char *segment_name, int type, const char *body,
			size_t len, char **reply, size_t *reply_len, int timeout_ms);
	int (*republish)(const te_host *h);
	const char *(*local_name)(const te_host *h);
	const char *(*local_address)(const te_host *h);

	/* ---- since ABI 1.1 (test with TE_HAS_OP) ---- */
	/* te_transfer_service */
	int (*shared_memory)(const te_host *h, uint64_t addr, uint64_t len, int *fd, uint64_t *offset,
			     uint64_t *size, uint64_t *base);

	/* ---- since ABI 1.2 (test with TE_HAS_OP) ---- */
	/* te_auth_service, te_transfer_service, te_device_service */
	int (*auth_enabled)(const te_host *h);
	int (*auth_connect)(const te_host *h, int fd, int channel, const char *peer, int timeout_ms);
	int (*auth_accept)(const te_host *h, int fd, int channel, const char *peer, int timeout_ms);
	int (*buffer_is_device)(const te_host *h, const te_buffer_pin *pin);
	int (*buffer_copy)(const te_host *h, const te_buffer_pin *pin, void *dst, const void *src,
			   size_t len);
	int (*device_dmabuf)(const te_host *h, const void *addr, size_t len, int *fd,
			     uint64_t *offset);
	int (*devices)(const te_host *h, te_device_info *out, size_t max, size_t *n);

	/* ---- since ABI 1.3 (test with TE_HAS_OP) ---- */
	/* te_device_service */
	int (*device_ipc_export)(const te_host *h, const void *addr, size_t len, te_device_ipc *ipc,
				 char *location, size_t location_len);
	int (*device_ipc_open)(const te_host *h, const char *location, const te_device_ipc *ipc,
			       void **base);
	void (*device_ipc_close)(const te_host *h, const char *location, void *base);
	int (*device_copy)(const te_host *h, const char *location, void *dst, const void *src,
			   size_t len);

	/* ---- since ABI 1.4 (test with TE_HAS_OP) ---- */
	/* te_transfer_service */
	int (*buffer_acquire_revocable)(const te_host *h, uint64_t addr, uint64_t len, unsigned need,
					te_buffer_pin *pin);
	int (*buffer_enter)(const te_host *h, const te_buffer_pin *pin);
	void (*buffer_leave)(const te_host *h, const te_buffer_pin *pin);

	/* ---- since ABI 1.5 (test with TE_HAS_OP) ---- */
	/* te_transfer_service, te_device_service */
	int (*buffer_copy_batch)(const te_host *h, const te_buffer_pin *const *pins,
				 const te_copy *copies, size_t n);
	int (*device_copy_batch)(const te_host *h, const char *location, const te_copy *copies,
				 size_t n, unsigned flags);
	int (*host_buffer_alloc)(const te_host *h, size_t len, void **ptr);
	void (*host_buffer_free)(const te_host *h, void *ptr);

	/* ---- since ABI 1.6 (test with TE_HAS_OP) ---- */
	/* te_metrics_service */
	te_metric_dev *(*metric_device)(const te_host *h, const char *name);
	void (*metric_add)(const te_host *h, te_metric_dev *dev, int what, int64_t delta);
	int (*metrics_text)(const te_host *h, char **text, size_t *len);

	/* ---- since ABI 1.7 (test with TE_HAS_OP) ---- */
	/* te_device_service */
	void (*device_done_burst)(const te_host *h, int begin);

	/* ---- since ABI 1.8 (test with TE_HAS_OP) ---- */
	/* te_control_service, te_transfer_service */
	int (*buffer_fields)(const te_host *h, const void *addr, const char *json_object);
	void (*transfer_stale)(const te_host *h, const te_transfer *t);

	/* ---- since ABI 1.11 (test with TE_HAS_OP) ---- */
	/* te_transfer_service */
	int (*transfer_enter)(const te_host *h, te_transfer *t);
	void (*transfer_leave)(const te_host *h, te_transfer *t);
	int64_t (*transfer_deadline)(const te_host *h, const te_transfer *t);

	/* ---- since ABI 1.13 (test with TE_HAS_OP, or call te_host_service()) ---- */
	/* The services of `topic` (a TE_SERVICE_* name): the host's table of
	 * that topic when its version is `min_version` or newer (0: any), else
	 * NULL (a topic this host does not know, or an older table). The table
	 * is constant and outlives every instance; members a topic gains after
	 * its version 1 are tested with TE_HAS_OP, as in any table. */
	const void *(*service)(const te_host *h, const char *topic, uint32_t min_version);
};

/* What metric_add() counts (since ABI 1.6). */
enum te_metric_kind {
	TE_METRIC_BYTES = 1,          /* bytes moved through the device; feeds its moving-average bandwidth */
	TE_METRIC_INFLIGHT_BYTES = 2, /* a gauge: +len when posted, -len when done */
	TE_METRIC_RETRIES = 3,        /* a request sent again */
	TE_METRIC_FAILOVERS = 4,      /* requests moved off this device (or transport) to another */
	TE_METRIC_ERRORS = 5,         /* device errors: a link lost, a failed work completion */
};

/* ------------------------------------------------- host services by topic */

/*
 * Each topic's table begins with its size and version as the host built it.
 * A topic's version moves when its table gains members at its end, without
 * the other topics or struct te_host changing; ask for the version whose
 * members you need, or for 1 and test newer members with TE_HAS_OP.
 */

#define TE_SERVICE_LOG "log"
#define TE_SERVICE_LOG_VERSION 1

/* Logging and configuration: every kind. */
typedef struct te_log_service {
	uint32_t size;
	uint32_t version; /* TE_SERVICE_LOG_VERSION as the host built it */
	/* Log a line under this plugin's name. */
	void (*log)(const te_host *h, int level, const char *fmt, ...) TE_PRINTF(3, 4);
	/* Configuration: the engine option `te_name`, else the environment variable
	 * `te_name`, else `mc_name` (may be NULL). NULL when unset. */
	const char *(*config)(const te_host *h, const char *te_name, const char *mc_name);
} te_log_service;

#define TE_SERVICE_TRANSFER "transfer"
#define TE_SERVICE_TRANSFER_VERSION 2 /* 2: complete_many */

/* The data path of transports: completions, the gate of a transfer (deadlines,
 * cancels) and pins of registered buffers. The two gates, transfer_enter/
 * transfer_leave and buffer_enter/buffer_leave, follow one rule: touch the
 * memory only between an enter that returned 1 and its leave, on one thread,
 * with nothing in between that blocks. */
typedef struct te_transfer_service {
	uint32_t size;
	uint32_t version; /* TE_SERVICE_TRANSFER_VERSION as the host built it */
	/* Reports one slice of `t` done: `bytes` moved, `error` 0 or negative
	 * (-ETIMEDOUT ends the task as TIMEOUT, -ECANCELED as CANCELED, others
	 * FAILED). Call exactly t->nr_slices times. Thread-safe, never blocks. */
	void (*complete)(const te_host *h, te_transfer *t, uint64_t bytes, int error);
	/* Non-zero once the transfer's batch was canceled: stop at a slice boundary
	 * and complete the remaining slices with -ECANCELED. Since ABI 1.11, 2
	 * when its engine is being destroyed: complete at once what is kept
	 * only to learn whether it settles (the destroy waits for it). */
	int (*canceled)(const te_host *h, const te_transfer *t);
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
	/* For transports: a peer refused this transfer's keys or range on one
	 * path though it was moved by another (a peer's NIC opened again with
	 * new keys): the host fetches the peer's descriptor again, off the
	 * caller's thread, at most once per descriptor version, so later
	 * transfers use what the peer publishes now. */
	void (*transfer_stale)(const te_host *h, const te_transfer *t);
	/* Pins the registered local buffer that contains [addr, addr+len) whole and
	 * has every flag in `need` (e.g. TE_MEM_REMOTE_ACCESS). TE_ERR_ADDRESS when
	 * none does. Unregistering waits until the pin is released, without bound:
	 * a holder serving a peer takes buffer_acquire_revocable() (ABI 1.4)
	 * instead, so that a stalling peer cannot hold te_unregister_memory(). */
	int (*buffer_acquire)(const te_host *h, uint64_t addr, uint64_t len, unsigned need,
			      te_buffer_pin *pin);
	void (*buffer_release)(const te_host *h, te_buffer_pin *pin);
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
	/* As buffer_copy() for n pieces, copies[i] between host memory and the
	 * pin pins[i], queued on the device together and waited for once: the
	 * way to move many pieces of device memory (one waited copy costs the
	 * copy engine's whole latency, ~15 us on a PCIe GPU). 0 when every
	 * piece moved, else negative (logged); any piece may then have moved. */
	int (*buffer_copy_batch)(const te_host *h, const te_buffer_pin *const *pins,
				 const te_copy *copies, size_t n);
	/* When [addr, addr+len) lies in memory from te_mem_alloc(): the
	 * allocation's memfd (the host's: dup() it to keep it), the range's
	 * offset in it, and the allocation's size and first address. -ENOENT
	 * otherwise. */
	int (*shared_memory)(const te_host *h, uint64_t addr, uint64_t len, int *fd, uint64_t *offset,
			     uint64_t *size, uint64_t *base);

	/* ---- version 2 (test with TE_HAS_OP) ---- */
	/* complete() for `n` slices at once: ts[i] moved bytes[i] with
	 * errors[i] (errors NULL: all 0), in this order. For a transport that
	 * finishes many slices together (a run of copies, a scatter-gather
	 * frame, a poll of a completion queue): what the tasks share (their
	 * batch, their peer, the in-flight counts every completing thread
	 * writes) is updated once per run instead of once per slice. A slice
	 * held back to be reported so counts as in flight until then, and its
	 * transfer_leave() comes before this call. Thread-safe, never blocks. */
	void (*complete_many)(const te_host *h, te_transfer *const *ts, const uint64_t *bytes,
			      const int *errors, size_t n);
} te_transfer_service;

#define TE_SERVICE_CONTROL "control"
#define TE_SERVICE_CONTROL_VERSION 1

/* The control plane: RPC frames, this engine's names, its descriptor. */
typedef struct te_control_service {
	uint32_t size;
	uint32_t version; /* TE_SERVICE_CONTROL_VERSION as the host built it */
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
	/* For transports: the buffer fields this transport gave for the
	 * region registered at `addr` (mem_register's json_object) changed,
	 * e.g. its keys after a NIC was opened again: `json_object` replaces
	 * them, and the host publishes the descriptor again soon, on a thread
	 * of its own. -ENOENT when no region starts at `addr`, -EINVAL when
	 * the text is not a JSON object. */
	int (*buffer_fields)(const te_host *h, const void *addr, const char *json_object);
	/* This engine's segment name and the address peers reach it at. */
	const char *(*local_name)(const te_host *h);
	const char *(*local_address)(const te_host *h);
} te_control_service;

#define TE_SERVICE_AUTH "auth"
#define TE_SERVICE_AUTH_VERSION 1

/* Peer authentication on a transport's own connections. */
typedef struct te_auth_service {
	uint32_t size;
	uint32_t version; /* TE_SERVICE_AUTH_VERSION as the host built it */
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
} te_auth_service;

#define TE_SERVICE_DEVICE "device"
#define TE_SERVICE_DEVICE_VERSION 1

/* Device memory through the device plugins, for transports and device plugins. */
typedef struct te_device_service {
	uint32_t size;
	uint32_t version; /* TE_SERVICE_DEVICE_VERSION as the host built it */
	/* The devices of every usable device plugin: up to `max` into `out`
	 * (each out[i].size set by the caller), `*n` how many there are. For
	 * topology: where each device sits (PCI bus id, NUMA node). */
	int (*devices)(const te_host *h, te_device_info *out, size_t max, size_t *n);
	/* For a device region a TE_TRANSPORT_DEVICE_MEMORY transport registers:
	 * a dma-buf file descriptor of the device allocation holding
	 * [addr, addr+len) (the caller closes it) and the range's offset in it,
	 * for ibv_reg_dmabuf_mr(). -ENOTSUP when the device plugin or its driver
	 * offers none, -ENOENT when the range is not device memory. */
	int (*device_dmabuf)(const te_host *h, const void *addr, size_t len, int *fd,
			     uint64_t *offset);
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
	/* For device plugins: brackets the te_device_done_fn calls one thread
	 * makes together (the copies one wait found finished), begin = 1
	 * before the first and 0 after the last, with no other op of the
	 * plugin in between. What those done() calls start (staged chunks
	 * handed to their transport) the host then starts together at the
	 * end, in one call per transport instead of one per copy. done()
	 * calls outside a burst are handled at once, as before. */
	void (*device_done_burst)(const te_host *h, int begin);
} te_device_service;

#define TE_SERVICE_METRICS "metrics"
#define TE_SERVICE_METRICS_VERSION 1

/* Metrics (docs/metrics.md): a transport's counters, the exporters' text. */
typedef struct te_metrics_service {
	uint32_t size;
	uint32_t version; /* TE_SERVICE_METRICS_VERSION as the host built it */
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
} te_metrics_service;

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

/* The table of `topic` (TE_SERVICE_*) at `min_version` or newer, NULL when
 * the host has none: also from a host older than ABI 1.13. Cast it to the
 * topic's type: (const te_metrics_service *)te_host_service(h, ...). */
static inline const void *te_host_service(const te_host *h, const char *topic, uint32_t min_version)
{
	return TE_HAS_OP(h, service) ? h->service(h, topic, min_version) : NULL;
}

/* The host's complete_many() (transfer service 2), NULL from an older host:
 * looked up once, at create. */
typedef void (*te_complete_many_fn)(const te_host *h, te_transfer *const *ts, const uint64_t *bytes,
				    const int *errors, size_t n);

static inline te_complete_many_fn te_host_complete_many_fn(const te_host *h)
{
	const te_transfer_service *ts = (const te_transfer_service *)te_host_service(h, TE_SERVICE_TRANSFER, 2);
	return ts != NULL && TE_HAS_OP(ts, complete_many) ? ts->complete_many : NULL;
}

/* Reports n slices finished together: through `many` (te_host_complete_many_fn())
 * when the host has it, else complete() for each, in order. */
static inline void te_host_complete_slices(const te_host *h, te_complete_many_fn many, te_transfer *const *ts,
					   const uint64_t *bytes, const int *errors, size_t n)
{
	if (many != NULL && n > 1) {
		many(h, ts, bytes, errors, n);
		return;
	}
	for (size_t k = 0; k < n; k++)
		h->complete(h, ts[k], bytes[k], errors != NULL ? errors[k] : 0);
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
#endif /* TE_TE_HOST_H */
