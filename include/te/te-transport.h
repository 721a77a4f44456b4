/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Transport plugins (TE_KIND_TRANSPORT): te_transport_ops and the types
 * it takes. Included by te-plugin.h.
 */
#ifndef TE_TE_TRANSPORT_H
#define TE_TE_TRANSPORT_H

#include <te/te-plugin.h>

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
}
#endif
#endif /* TE_TE_TRANSPORT_H */
