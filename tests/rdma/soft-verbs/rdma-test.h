/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Controls of the tests' copy of the RDMA plugin (this folder; never
 * installed), found by the tests with dlsym(). They steer the software verbs
 * layer (TE_RDMA_SOFT=1) and read the plugin's counters. The shipped plugin
 * has none of them.
 */
#ifndef TE_RDMA_TEST_H
#define TE_RDMA_TEST_H

#include <stdint.h>

/* Per soft device (all instances of that name, whatever sysfs root). */
typedef struct te_rdma_soft_counters {
	uint64_t wrs;        /* work requests executed successfully */
	uint64_t bytes;      /* bytes moved by them */
	uint64_t errors;     /* work requests completed with an error (flushes excluded) */
	uint64_t flushed;    /* work requests flushed from a QP in the error state */
	uint64_t rx_wrs;     /* work requests this device served as the responder */
	uint64_t mrs_relaxed; /* memory regions registered with IBV_ACCESS_RELAXED_ORDERING */
	int last_tc;         /* GRH traffic class of the last QP moved to RTR (-1: none yet) */
	int last_retry_cnt;  /* retry_cnt of the last QP moved to RTS (-1: none yet) */
} te_rdma_soft_counters;

/* Port link up (1) or down (0): raises IBV_EVENT_PORT_ACTIVE/PORT_ERR on
 * every open context, and work requests touching a down port fail with
 * IBV_WC_RETRY_EXC_ERR. Returns 0, or -ENOENT for an unknown device. */
typedef int (*te_rdma_soft_set_link_fn)(const char *dev, int up);
/* IBV_EVENT_DEVICE_FATAL on every context of the device. Those contexts are
 * dead for good (their requests flushed, EIO from every verb but the
 * tear-down ones); te_rdma_soft_set_link(dev, 1) resets the device, which
 * then opens anew. */
typedef int (*te_rdma_soft_fatal_fn)(const char *dev);
/* The same, but the dead contexts never complete what they hold, not even
 * with a flush (mlx5 flushes only for the kernel's own consumers). */
typedef int (*te_rdma_soft_fatal_silent_fn)(const char *dev);
/* The GID table entry `from` ("xx:xx:...", 16 bytes) becomes `to`, with
 * IBV_EVENT_GID_CHANGE on every open context; -ENOENT when no entry was
 * `from`, -EINVAL for bad text. */
/* The device lists under the name `to` from now on, as after a reset
 * that brought it back under another name; its node GUID stays. -EEXIST
 * when a device has that name already. */
typedef int (*te_rdma_soft_rename_fn)(const char *dev, const char *to);
typedef int (*te_rdma_soft_replace_gid_fn)(const char *dev, const char *from, const char *to);
/* The next `n` work requests executed by the device complete with
 * `wc_status` (an enum ibv_wc_status) instead of running. */
typedef int (*te_rdma_soft_fail_next_fn)(const char *dev, unsigned n, int wc_status);
/* Adds `usec` microseconds before each work request of the device (NULL:
 * every device), so tests can act while a batch is in flight. A request
 * waiting so ends at once, flushed, when its QP moves to ERR (a peer that
 * stopped answering); setting 0 lets the waiting ones run now. */
typedef int (*te_rdma_soft_set_latency_fn)(const char *dev, unsigned usec);
/* Holds back each flush completion of the device by `usec` (a NIC slow to
 * flush a QP moved to ERR); nothing is moved meanwhile. */
typedef int (*te_rdma_soft_set_flush_delay_fn)(const char *dev, unsigned usec);
typedef int (*te_rdma_soft_get_counters_fn)(const char *dev, te_rdma_soft_counters *out);

/* The plugin instance of the engine named `engine` (its segment name). */
#define TE_RDMA_STATS_MAX_DEV 8
#define TE_RDMA_STATS_EVICTIONS 64
typedef struct te_rdma_stats {
	int n_devices;
	char device[TE_RDMA_STATS_MAX_DEV][64];
	uint64_t slices[TE_RDMA_STATS_MAX_DEV]; /* slices completed per local device */
	int active[TE_RDMA_STATS_MAX_DEV];      /* 1 while the context is in service */
	unsigned endpoints[TE_RDMA_STATS_MAX_DEV]; /* endpoints in each device's pool */
	uint64_t endpoints_created;   /* handshakes completed, both directions */
	uint64_t endpoints_evicted;   /* by the pool's cap */
	uint64_t endpoints_reclaimed; /* idle */
	uint64_t endpoints_failed;    /* removed after an error */
	uint64_t slice_retries;
	uint64_t pair_pauses;
	uint64_t handshakes_rejected; /* as initiator: the peer set reply_msg */
	/* Peer NIC paths of evicted endpoints, oldest first (the last 64). */
	unsigned n_evicted;
	char evicted[TE_RDMA_STATS_EVICTIONS][128];
	/* Times each device was opened again after a fatal error. */
	unsigned revivals[TE_RDMA_STATS_MAX_DEV];
} te_rdma_stats;

typedef int (*te_rdma_get_stats_fn)(const char *engine, te_rdma_stats *out);

#endif
