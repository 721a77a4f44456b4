/* SPDX-License-Identifier: Apache-2.0 */
/*
 * transfer_engine_c.h: the C API of the Mooncake Transfer Engine, provided by
 * libtransfer_engine on top of libte (te.h).
 *
 * A program written for Mooncake's transfer_engine_c.h builds against this
 * header unchanged and links with `pkg-config --cflags --libs libte-mooncake`.
 * The types, macros and numbers below are Mooncake's; the behaviour is
 * libte's, and where the two differ the comment of the call says so. Only
 * the C standard library is included.
 *
 * Conventions (Mooncake's, kept exactly because programs test them):
 *  - No `char *` argument is used after the call returns; the caller may
 *    free it at once.
 *  - submitTransfer, submitTransferWithNotify, getTransferStatus and
 *    freeBatchID return a Mooncake status code: 0 on success and a POSITIVE
 *    MC_STATUS_CODE_* value on failure.
 *  - The other int functions return 0 (or an id) on success and a negative
 *    ERR_* value from Mooncake's error.h on failure.
 *  - Mooncake aborts or crashes on some bad input (a NULL engine, a NULL
 *    status pointer, a freed or made-up batch id); here such calls return
 *    the error their kind returns (ERR_INVALID_ARGUMENT, status 1, NULL or
 *    INVALID_BATCH) and write a line to stderr naming what was wrong (shown
 *    when TE_LOG_LEVEL is error or above, which it is by default).
 */
#ifndef LIBTE_MOONCAKE_TRANSFER_ENGINE_C_H
#define LIBTE_MOONCAKE_TRANSFER_ENGINE_C_H

#include <stdbool.h> /* Mooncake's header provides `bool` to its users too */
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Macros, not typedefs, as in Mooncake's header. */
#define segment_handle_t int32_t
#define segment_id_t int32_t
#define batch_id_t uint64_t
#define LOCAL_SEGMENT (0)
#define INVALID_BATCH UINT64_MAX

#define OPCODE_READ (0)  /* segment -> local memory */
#define OPCODE_WRITE (1) /* local memory -> segment */

/* One transfer. `source` is local registered memory; `target_offset` is an
 * address in the target process (a byte offset for an NVMe-oF segment).
 * This is the released layout: one development branch of Mooncake inserts a
 * `file_id` field after `target_id`, which is not supported here. */
struct transfer_request {
	int opcode;
	void *source;
	segment_id_t target_id;
	uint64_t target_offset;
	uint64_t length;
};
typedef struct transfer_request transfer_request_t;

struct notify_msg {
	char *name; /* sender name carried by the notification */
	char *msg;
};
typedef struct notify_msg notify_msg_t;

/* Task states (getTransferStatus). */
#define STATUS_WAITING (0)
#define STATUS_PENDING (1)
#define STATUS_INVALID (2)
#define STATUS_CANCELED (3)
#define STATUS_COMPLETED (4)
#define STATUS_TIMEOUT (5)
#define STATUS_FAILED (6)

struct transfer_status {
	int status;                 /* STATUS_* */
	uint64_t transferred_bytes; /* a lower bound while the task moves */
};
typedef struct transfer_status transfer_status_t;

/* Declared for source compatibility; no call here takes it. */
struct segment_desc {
	int type;
	union {
		struct {
			void *addr;
			uint64_t size;
			const char *location;
		} rdma;
		struct {
			const char *file_path;
			const char *subsystem_name;
			const char *proto;
			const char *ip;
			uint64_t port;
		} nvmeof;
	} desc_;
};
typedef struct segment_desc segment_desc_t;

struct buffer_entry {
	void *addr;
	size_t length;
};
typedef struct buffer_entry buffer_entry_t;

typedef void *transfer_engine_t;
typedef void *transport_t;

/*
 * Error codes of the int calls that do not return a status code. Mooncake
 * keeps them in its error.h, not in this header. They are defined here one by
 * one under #ifndef with exactly Mooncake's spelling, so a program that also
 * includes Mooncake's error.h compiles whichever comes first (C allows an
 * identical redefinition of a macro).
 */
#ifndef ERR_INVALID_ARGUMENT
#define ERR_INVALID_ARGUMENT (-1)
#endif
#ifndef ERR_TOO_MANY_REQUESTS
#define ERR_TOO_MANY_REQUESTS (-2)
#endif
#ifndef ERR_ADDRESS_NOT_REGISTERED
#define ERR_ADDRESS_NOT_REGISTERED (-3)
#endif
#ifndef ERR_BATCH_BUSY
#define ERR_BATCH_BUSY (-4)
#endif
#ifndef ERR_DEVICE_NOT_FOUND
#define ERR_DEVICE_NOT_FOUND (-6)
#endif
#ifndef ERR_ADDRESS_OVERLAPPED
#define ERR_ADDRESS_OVERLAPPED (-7)
#endif
#ifndef ERR_NOT_LOCAL_SEGMENT_OR_SHM
#define ERR_NOT_LOCAL_SEGMENT_OR_SHM (-8)
#endif
#ifndef ERR_DNS
#define ERR_DNS (-101)
#endif
#ifndef ERR_SOCKET
#define ERR_SOCKET (-102)
#endif
#ifndef ERR_MALFORMED_JSON
#define ERR_MALFORMED_JSON (-103)
#endif
#ifndef ERR_REJECT_HANDSHAKE
#define ERR_REJECT_HANDSHAKE (-104)
#endif
#ifndef ERR_METADATA
#define ERR_METADATA (-200)
#endif
#ifndef ERR_ENDPOINT
#define ERR_ENDPOINT (-201)
#endif
#ifndef ERR_CONTEXT
#define ERR_CONTEXT (-202)
#endif
#ifndef ERR_NUMA
#define ERR_NUMA (-300)
#endif
#ifndef ERR_CLOCK
#define ERR_CLOCK (-301)
#endif
#ifndef ERR_MEMORY
#define ERR_MEMORY (-302)
#endif
#ifndef ERR_NOT_IMPLEMENTED
#define ERR_NOT_IMPLEMENTED (-303)
#endif

/*
 * Status codes of submitTransfer, submitTransferWithNotify, getTransferStatus
 * and freeBatchID: the numbers of Mooncake's Status::Code. Mooncake has no C
 * names for them; these names are this library's own.
 */
#define MC_STATUS_CODE_OK 0
#define MC_STATUS_CODE_INVALID_ARGUMENT 1
#define MC_STATUS_CODE_TOO_MANY_REQUESTS 2
#define MC_STATUS_CODE_ADDRESS_NOT_REGISTERED 3
#define MC_STATUS_CODE_BATCH_BUSY 4
#define MC_STATUS_CODE_DEVICE_NOT_FOUND 6
#define MC_STATUS_CODE_ADDRESS_OVERLAPPED 7
#define MC_STATUS_CODE_NOT_SUPPORTED_TRANSPORT 8
#define MC_STATUS_CODE_DNS 101
#define MC_STATUS_CODE_SOCKET 102
#define MC_STATUS_CODE_MALFORMED_JSON 103
#define MC_STATUS_CODE_REJECT_HANDSHAKE 104
#define MC_STATUS_CODE_METADATA 200
#define MC_STATUS_CODE_ENDPOINT 201
#define MC_STATUS_CODE_CONTEXT 202
#define MC_STATUS_CODE_NUMA 300
#define MC_STATUS_CODE_CLOCK 301
#define MC_STATUS_CODE_MEMORY 302
#define MC_STATUS_CODE_NOT_IMPLEMENTED 999

/* ------------------------------------------------------------------ engine */

/*
 * Creates an engine (one libte engine); NULL on failure.
 *
 * metadata_conn_string: "P2PHANDSHAKE" (no store) or a store's connection
 *   string ("etcd://h:p", a bare "h:p" for etcd, "redis://h:p",
 *   "http://h:p/path"); the store's metadata plugin must be installed.
 * With P2PHANDSHAKE, as in Mooncake, only the host part of local_server_name
 *   is used (ip_or_host_name when local_server_name is NULL or empty), the
 *   RPC port is a free one, rpc_port is ignored, and the segment name
 *   becomes "host:port" (getLocalIpAndPort() tells it).
 * With a store, local_server_name is the segment name; ip_or_host_name (when
 *   not NULL or empty) is the address published for peers, else the host part
 *   of the name; rpc_port (when not 0) is the RPC port to bind, else the
 *   name's port or a free one. Current Mooncake releases ignore both and pick
 *   the first LAN address and a random port; pass NULL and 0 to leave the
 *   choice to libte.
 * auto_discover != 0 installs the best transport found at once (RDMA when it
 *   finds devices, else TCP); with 0 nothing is installed until
 *   installTransport().
 */
transfer_engine_t createTransferEngine(const char *metadata_conn_string,
				       const char *local_server_name,
				       const char *ip_or_host_name, uint64_t rpc_port,
				       int auto_discover);

/* Writes "ip:port" (the published address and the RPC port; an IPv6
 * address in brackets) like snprintf, truncated to buf_len. 0, or
 * ERR_INVALID_ARGUMENT for a NULL engine or buffer or a zero length. */
int getLocalIpAndPort(transfer_engine_t engine, char *buf_out, size_t buf_len);

/*
 * Installs transport `proto` ("tcp", "rdma", "nvmeof", or any transport
 * plugin libte finds). `args` is NULL or a NULL-terminated array; for "rdma",
 * args[0] may be a NIC priority matrix as a JSON string (char *). For other
 * transports args are ignored. Returns an opaque non-NULL handle, the same one
 * again when `proto` is already installed (as Mooncake returns the installed
 * transport), or NULL on failure. The handle is valid until
 * destroyTransferEngine() and is good for nothing but a NULL test.
 */
transport_t installTransport(transfer_engine_t engine, const char *proto, void **args);

/* Uninstalls transport `proto`; requests to segments only it reached fail
 * from then on. 0 also when `proto` is not installed (Mooncake's call
 * always returns 0 and does nothing; here it does remove the transport). */
int uninstallTransport(transfer_engine_t engine, const char *proto);

/*
 * Makes destroyTransferEngine() wait until every task of every batch still
 * allocated has ended before it tears the engine down (without it, tasks in
 * flight are failed at once). Mooncake's version also installs SIGINT and
 * SIGTERM handlers that shut engines down; this library installs no signal
 * handlers (a program that wants that calls destroyTransferEngine() from its
 * own handling).
 */
void enableGracefulShutdown(transfer_engine_t engine);

/* Destroys the engine: removes what it published, closes its segments,
 * frees its batches. NULL is accepted. Nothing may use the engine during or
 * after the call. */
void destroyTransferEngine(transfer_engine_t engine);

/* Accepted without effect: 0. libte discovers the topology when a
 * transport that needs it (RDMA) is installed. ERR_INVALID_ARGUMENT for a
 * NULL engine. */
int discoverTopology(transfer_engine_t engine);

/* Accepted without effect: 0. There is no EFA transport here.
 * ERR_INVALID_ARGUMENT for a NULL engine. */
int warmupEfaSegment(transfer_engine_t engine, const char *segment_name);

/*
 * Writes a report like snprintf (truncated to buf_len): the engine's segment
 * name and address, its installed transports and each transport plugin's
 * report of what it found on this machine (devices, NICs, topology). With
 * json != 0 it is one JSON object {"segment":..., "address":...,
 * "transports":[{"name":..., "report":...}]}. Mooncake lists per-NIC link
 * details of its RDMA devices; libte has no per-link view, so the plugin's
 * report stands in for it. ERR_INVALID_ARGUMENT (-1) for a NULL engine, a
 * NULL buffer or a zero length, else 0.
 */
int showLinks(transfer_engine_t engine, char *buf_out, size_t buf_len, int json);

/* ------------------------------------------------------------ NIC load */

struct nic_load_stat {
	char device_name[64];
	uint64_t inflight_bytes;
	double ewma_bandwidth_bps; /* bytes per second, a moving average */
};

typedef struct nic_load_stat nic_load_stat_t;

/*
 * The load of every device the engine's transports report (RDMA NICs, TCP
 * rails, NVMe-oF files; docs/metrics.md): its name, the bytes of requests
 * posted on it and not yet done, and its moving-average bandwidth. Copies
 * up to *count entries into `stats` and sets *count to how many devices
 * there are (call again with more room when it grew). 0 on success; -1 for
 * a NULL engine, `stats` or `count`, as in Mooncake; MC_STATUS_CODE_NOT_IMPLEMENTED
 * (999) when the engine counts nothing (TE_METRICS=0). A transport that
 * reports no devices (same host, memcpy) adds none. Since libte 1.3.
 *
 * MC_TE_METRIC=1 (or true, yes, on, any case) in the environment when the
 * engine is created makes it log a line at level info every
 * MC_TE_METRIC_INTERVAL_SECONDS (default 5; a value that is no positive
 * integer is logged and replaced by the default) with the throughput since
 * the line before, in total and per operation, and the tasks that ended.
 * An interval in which nothing moved logs nothing.
 */
int getNicLoadStats(transfer_engine_t engine, nic_load_stat_t *stats, size_t *count);

/* ---------------------------------------------------------------- segments */

/*
 * Opens the segment `segment_name` (leading '/' characters are dropped, as
 * Mooncake does) and returns its id (LOCAL_SEGMENT for the engine's own
 * name). The descriptor is fetched once and cached; opening an open name
 * again returns the same id without network traffic. ERR_INVALID_ARGUMENT
 * (-1) on any failure (empty name, unknown or unreachable segment), as in
 * Mooncake; the logged line says which.
 */
segment_id_t openSegment(transfer_engine_t engine, const char *segment_name);

/* As openSegment(), but when the segment is open already its descriptor is
 * fetched again first, so memory the peer registered or unregistered since
 * is seen. A failed fetch returns the mapped negative error. */
segment_id_t openSegmentNoCache(transfer_engine_t engine, const char *segment_name);

/* Accepted without effect: 0, as in Mooncake, where a segment id stays valid
 * for the engine's life (programs use ids after closing them). libte closes
 * every segment at destroyTransferEngine(). ERR_INVALID_ARGUMENT for a NULL
 * engine or a negative id. */
int closeSegment(transfer_engine_t engine, segment_id_t segment_id);

/* Drops the cached descriptor of `segment_name` (leading '/' dropped): the
 * segment is closed, its old id becomes invalid, and a later openSegment()
 * fetches the descriptor anew and returns a new id. 0 whether or not the name
 * was open (the engine's own name is left alone); ERR_INVALID_ARGUMENT for an
 * empty name. */
int removeLocalSegment(transfer_engine_t engine, const char *segment_name);

/* Fetches the descriptor of every open segment again. 0, or the mapped
 * negative error of the first fetch that failed (the others are still
 * tried). */
int syncSegmentCache(transfer_engine_t engine);

/* ---------------------------------------------------------- local memory */

/*
 * Registers [addr, addr+length) with every installed transport (and those
 * installed later). `location` is "cpu:N", "cuda:N" or "*" (detect); NULL
 * means "*". remote_accessible != 0 lets peers read and write it. Returns 0,
 * ERR_ADDRESS_OVERLAPPED when it overlaps a registered region, or
 * ERR_INVALID_ARGUMENT (NULL address, zero length).
 */
int registerLocalMemory(transfer_engine_t engine, void *addr, size_t length,
			const char *location, int remote_accessible);

/* Unregisters the region starting at `addr`; waits for peers' requests that
 * are reading or writing it. ERR_ADDRESS_NOT_REGISTERED when no region starts
 * there. On the initiator side nothing is pinned: a buffer must stay
 * registered until every task using it has ended. */
int unregisterLocalMemory(transfer_engine_t engine, void *addr);

/* Registers every buffer (remote-accessible, at `location`) all or nothing:
 * on failure none stays registered. ERR_ADDRESS_OVERLAPPED when two buffers,
 * or a buffer and a registered region, overlap. buffer_len 0 is a no-op. */
int registerLocalMemoryBatch(transfer_engine_t engine, buffer_entry_t *buffer_list,
			     size_t buffer_len, const char *location);

/* Unregisters every region listed (each by its start address), all or
 * nothing: ERR_ADDRESS_NOT_REGISTERED, and nothing unregistered, when one is
 * not the start of a registered region. addr_len 0 is a no-op. */
int unregisterLocalMemoryBatch(transfer_engine_t engine, void **addr_list, size_t addr_len);

/* ----------------------------------------------------------------- batches */

/* Allocates a batch that holds `batch_size` tasks over its whole life (task
 * ids continue across submits). INVALID_BATCH on failure (zero size, NULL
 * engine, no memory). */
batch_id_t allocateBatchID(transfer_engine_t engine, size_t batch_size);

/*
 * Appends `count` requests to the batch as tasks and starts them. Returns a
 * status code:
 *  - 0: every request started;
 *  - MC_STATUS_CODE_TOO_MANY_REQUESTS (2): the batch has no room for `count`
 *    more tasks; nothing was appended;
 *  - MC_STATUS_CODE_INVALID_ARGUMENT (1): unknown, freed or made-up batch id
 *    (Mooncake crashes there), NULL engine or entries; nothing was appended;
 *  - otherwise some requests were refused (bad opcode, unregistered local
 *    memory, unknown segment, a range outside the segment's buffers): they
 *    became STATUS_INVALID tasks and the code is that of the first refused
 *    one (e.g. 3 for unregistered memory, 1 for an unknown segment). THE
 *    VALID REQUESTS OF THAT CALL STILL RUN; getTransferStatus() tells which
 *    is which (task ids continue in order).
 * Several threads may submit to one batch; their calls are serialized.
 */
int submitTransfer(transfer_engine_t engine, batch_id_t batch_id,
		   struct transfer_request *entries, size_t count);

/*
 * As submitTransfer(), and once every task of the batch has ended (completed
 * or not), sends `notify_msg` to the owner of entries[0].target_id, carrying
 * notify_msg.name as the sender's name (NULL: this engine's segment name).
 * As in Mooncake, the getTransferStatus() call that sees the batch end sends
 * it before it returns, so the peer has it when the caller learns the task
 * ended, and one sender's notifications arrive in order; freeBatchID() sends
 * one that no such call sent. The notification is kept only when every
 * request started (return 0), as Mooncake does. count 0 or a NULL msg is
 * refused (status 1); no memory to keep it, status 302 (the requests run).
 */
int submitTransferWithNotify(transfer_engine_t engine, batch_id_t batch_id,
			     struct transfer_request *entries, size_t count,
			     notify_msg_t notify_msg);

/* The state and bytes moved of task `task_id`. Status code: 0, or 1 for an
 * unknown batch, an unknown task id or a NULL status pointer. */
int getTransferStatus(transfer_engine_t engine, batch_id_t batch_id, size_t task_id,
		      struct transfer_status *status);

/* Frees the batch. Status code: 0, MC_STATUS_CODE_BATCH_BUSY (4) while a task
 * is still in flight (the batch stays allocated), 1 for an unknown, freed or
 * made-up id. */
int freeBatchID(transfer_engine_t engine, batch_id_t batch_id);

/* ----------------------------------------------------------- notifications */

/*
 * Takes every notification received so far: a malloc()ed array of *size
 * entries whose name and msg strings are malloc()ed too, released with
 * freeNotifsMsgBuf() (or free() on each part). NULL with *size 0 when none
 * arrived, or on failure (NULL engine: also logged).
 */
notify_msg_t *getNotifsFromEngine(transfer_engine_t engine, int *size);

/* Frees an array from getNotifsFromEngine(): the `size` entries' strings,
 * then the array. NULL is accepted. 0, or ERR_INVALID_ARGUMENT (and nothing
 * freed) for a negative size. */
int freeNotifsMsgBuf(notify_msg_t *msg, int size);

/* Sends notify_msg.msg to the owner of segment `target_id` now, carrying
 * notify_msg.name as the sender's name (NULL: this engine's segment name).
 * Returns when the peer acknowledged it: 0, or a negative error (an unknown
 * id gives ERR_INVALID_ARGUMENT where Mooncake gives ERR_METADATA). At most
 * 4096 bytes each for name and msg. */
int genNotifyInEngine(transfer_engine_t engine, uint64_t target_id, notify_msg_t notify_msg);

#ifdef __cplusplus
}
#endif
#endif /* LIBTE_MOONCAKE_TRANSFER_ENGINE_C_H */
