/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Every metric libte exports, once (docs/metrics.md, "Adding a metric").
 * The counters' storage (metrics.h, metrics-internal.h), the snapshot that
 * sums their shards (metrics-snap.c), te_engine_stats(), the JSON form
 * (metrics-json.c) and the Prometheus exposition (metrics-text.c) are all
 * expanded from these lists; tests/metrics/test-metrics-table.c checks that
 * they cover te_stats byte for byte and everything the two forms print.
 *
 * A row: X(scope, id, kind, prom, json, stats, help)
 *   scope  where it is counted and how it is labelled (below); the lists
 *          are per scope, and TE_MTABLE() is them in the exposition's order
 *   id     the field in the shard and in the snapshot
 *   kind   COUNTER, GAUGE (kept as a signed sum, read clamped at zero) or
 *          HISTOGRAM: the Prometheus TYPE
 *   prom   the Prometheus family
 *   json   the key in the JSON form; "group.key" puts it in object "group"
 *   stats  TE_MS_(field): what it adds to te_stats' `field`; TE_MS_NONE:
 *          not in te_stats
 *   help   the HELP line
 *
 * Scopes:
 *   OP     per transport and operation, sharded (te_mop); te_stats: [op]
 *   OPG    per transport and operation, derived at reading from OP (in
 *          flight = requests - ended); Prometheus sums both operations
 *   LAT    the latency histogram of a transport and operation (te_mop.lat)
 *   PEER   per peer segment and operation, sharded (te_pshard)
 *   DEV    per device of a transport, sharded (dshard); DEVF: a double
 *          derived at reading (the bandwidth average)
 *   TP     per transport, rare events (te_mblock); Prometheus adds the
 *          same field of the transport's devices, te_stats that of every
 *          device, the JSON form the transport's own only. A TP row needs a
 *          DEV row of the same id.
 *   ENGINE per engine (te_metrics)
 *   RPC    per frame kind and result (te_metrics.rpc); the results are
 *          TE_MTABLE_RPC_RESULTS
 */
#ifndef TE_METRICS_TABLE_H
#define TE_METRICS_TABLE_H

#define TE_MTABLE_OP(X)                                                                                    \
	X(OP, requests, COUNTER, "te_transfer_requests_total", "requests", TE_MS_(requests),                \
	  "Transfer requests submitted, refused ones included.")                                            \
	X(OP, bytes, COUNTER, "te_transfer_bytes_total", "bytes", TE_MS_(bytes),                            \
	  "Bytes moved by transfers that ended, partial moves included.")                                   \
	X(OP, completed, COUNTER, "te_transfer_completed_total", "completed", TE_MS_(completed),            \
	  "Transfers that completed.")                                                                      \
	X(OP, failed, COUNTER, "te_transfer_failed_total", "failed", TE_MS_(failed),                        \
	  "Transfers that failed, timed out, or were refused at submit.")                                   \
	X(OP, canceled, COUNTER, "te_transfer_canceled_total", "canceled", TE_MS_(canceled),                \
	  "Transfers canceled.")

#define TE_MTABLE_OPG(X)                                                                                   \
	X(OPG, in_flight, GAUGE, "te_transfer_in_flight", "in_flight", TE_MS_(in_flight),                   \
	  "Transfers submitted and not ended.")                                                             \
	X(OPG, in_flight_bytes, GAUGE, "te_transfer_in_flight_bytes", "in_flight_bytes",                    \
	  TE_MS_(in_flight_bytes), "Bytes of the transfers submitted and not ended.")

#define TE_MTABLE_LAT(X)                                                                                   \
	X(LAT, lat, HISTOGRAM, "te_transfer_latency_seconds", "latency", TE_MS_NONE,                        \
	  "Time from submit to the end of a transfer (canceled ones left out).")

#define TE_MTABLE_PEER(X)                                                                                  \
	X(PEER, bytes, COUNTER, "te_peer_bytes_total", "bytes", TE_MS_NONE,                                 \
	  "Bytes moved to or from a peer segment (\"other\": peers not shown one by one).")                 \
	X(PEER, requests, COUNTER, "te_peer_requests_total", "requests", TE_MS_NONE,                        \
	  "Transfer requests to a peer segment.")                                                           \
	X(PEER, failed, COUNTER, "te_peer_failed_total", "failed", TE_MS_NONE,                              \
	  "Failed transfer requests to a peer segment.")

#define TE_MTABLE_DEV(X)                                                                                   \
	X(DEV, bytes, COUNTER, "te_device_bytes_total", "bytes", TE_MS_NONE,                                \
	  "Bytes a transport moved through a device.")                                                      \
	X(DEV, inflight_bytes, GAUGE, "te_device_in_flight_bytes", "in_flight_bytes", TE_MS_NONE,           \
	  "Bytes posted to a device and not done.")                                                         \
	X(DEVF, bw, GAUGE, "te_device_bandwidth_bytes_per_second", "bandwidth_bytes_per_second", TE_MS_NONE, \
	  "The device's bandwidth, a moving average with a time constant of 1 s.")                          \
	X(DEV, retries, COUNTER, "te_device_retries_total", "retries", TE_MS_NONE,                          \
	  "Requests sent again on a device.")                                                               \
	X(DEV, failovers, COUNTER, "te_device_failovers_total", "failovers", TE_MS_NONE,                    \
	  "Requests moved off a device to another.")                                                        \
	X(DEV, errors, COUNTER, "te_device_errors_total", "errors", TE_MS_NONE,                             \
	  "Device errors: links lost, failed work completions.")

#define TE_MTABLE_TP(X)                                                                                    \
	X(TP, retries, COUNTER, "te_transport_retries_total", "retries", TE_MS_(retries),                   \
	  "Requests a transport sent again (its devices' included).")                                       \
	X(TP, failovers, COUNTER, "te_transport_failovers_total", "failovers", TE_MS_(failovers),           \
	  "Requests a transport moved to another device or rail (its devices' included).")                  \
	X(TP, errors, COUNTER, "te_transport_errors_total", "errors", TE_MS_NONE,                           \
	  "Errors of a transport (its devices' included).")

#define TE_MTABLE_ENGINE(X)                                                                                \
	X(ENGINE, notify_sent, COUNTER, "te_notify_sent_total", "notifies.sent", TE_MS_(notifies_sent),     \
	  "Notifications sent to peers.")                                                                   \
	X(ENGINE, notify_received, COUNTER, "te_notify_received_total", "notifies.received",                \
	  TE_MS_(notifies_received), "Notifications received from peers.")                                  \
	X(ENGINE, reg_bytes, GAUGE, "te_registered_memory_bytes", "memory.registered_bytes",                \
	  TE_MS_(registered_bytes), "Memory registered with the engine now.")                               \
	X(ENGINE, reg_regions, GAUGE, "te_registered_memory_regions", "memory.registered_regions",          \
	  TE_MS_(registered_regions), "Regions registered with the engine now.")                            \
	X(ENGINE, auth_refused, COUNTER, "te_auth_refused_total", "auth_refused", TE_MS_(auth_refused),     \
	  "Peers refused by the cluster key.")

#define TE_MTABLE_RPC(X)                                                                                   \
	X(RPC, rpc, COUNTER, "te_rpc_frames_total", "rpc", TE_MS_NONE,                                      \
	  "RPC frames on the handshake port, by kind and result.")

/* The `result` label of RPC: R(id, stats), its index the order here. */
#define TE_MTABLE_RPC_RESULTS(R)                                                                           \
	R(served, TE_MS_(rpc_served))                                                                       \
	R(refused, TE_MS_(rpc_refused))

/* Every row, in the order of the exposition. */
#define TE_MTABLE(X)                                                                                       \
	TE_MTABLE_OP(X)                                                                                     \
	TE_MTABLE_OPG(X)                                                                                    \
	TE_MTABLE_LAT(X)                                                                                    \
	TE_MTABLE_PEER(X)                                                                                   \
	TE_MTABLE_DEV(X)                                                                                    \
	TE_MTABLE_TP(X)                                                                                     \
	TE_MTABLE_ENGINE(X)                                                                                 \
	TE_MTABLE_RPC(X)

/* Expanders shared by the files that use the table. */
#define TE_MCAT_(a, b) a##b
#define TE_MCAT(a, b) TE_MCAT_(a, b)
/* The Prometheus TYPE of a kind. */
#define TE_MTYPE_COUNTER "counter"
#define TE_MTYPE_GAUGE "gauge"
#define TE_MTYPE_HISTOGRAM "histogram"

enum te_mrpc_result {
#define TE_MRPC_RESULT_ENUM(id, stats) TE_MRPC_##id,
	TE_MTABLE_RPC_RESULTS(TE_MRPC_RESULT_ENUM)
#undef TE_MRPC_RESULT_ENUM
	TE_MRPC_RESULTS
};

/* Indices of the ENGINE rows: te_metric_count(engine, TE_MENGINE_id, n)
 * (metrics.h) counts into one. */
enum te_mengine_row {
#define TE_MENGINE_ENUM(scope, id, kind, prom, json, stats, help) TE_MENGINE_##id,
	TE_MTABLE_ENGINE(TE_MENGINE_ENUM)
#undef TE_MENGINE_ENUM
	TE_MENGINE_ROWS
};

/* Indices of the PEER rows (a peer's readings are kept as arrays). */
enum te_mpeer_field {
#define TE_MPEER_ENUM(scope, id, kind, prom, json, stats, help) TE_MPEER_##id,
	TE_MTABLE_PEER(TE_MPEER_ENUM)
#undef TE_MPEER_ENUM
	TE_MPEER_FIELDS
};

#endif
