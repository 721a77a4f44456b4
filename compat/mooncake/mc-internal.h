/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the files of libtransfer_engine share: the engine and batch records,
 * the log and error-code helpers. Internal: the library is built with hidden
 * visibility and the version script exports only Mooncake's API.
 */
#ifndef MC_INTERNAL_H
#define MC_INTERNAL_H

#include "transfer_engine_c.h"

#include <te/te.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* The library is built with hidden visibility; only the Mooncake API leaves
 * it (the linker version script says the same). */
#define MC_API __attribute__((visibility("default")))

/* Through libte's log (its level and handler), under the domain "mooncake". */
void mc_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define mc_err(...) mc_log(TE_LOG_ERROR, __VA_ARGS__)
#define mc_warn(...) mc_log(TE_LOG_WARN, __VA_ARGS__)
#define mc_info(...) mc_log(TE_LOG_INFO, __VA_ARGS__)

/* libte error (< 0) -> Mooncake negative error; 0 and above pass through. */
int to_err(const char *fn, int te_rc);
/* libte error (< 0) -> Mooncake positive Status code; 0 stays 0. */
int to_status(const char *fn, int te_rc);

#define MC_ENGINE_MAGIC 0x4d43454eu    /* "MCEN" */
#define MC_TRANSPORT_MAGIC 0x4d435452u /* "MCTR": a transport_t, never an engine */

/* A notification submitTransferWithNotify() left for the end of its batch. */
struct mc_notify {
	struct mc_notify *next;
	te_segment_id segment;
	char *name; /* NULL: the engine's own segment name */
	char *msg;
};

/* A batch this engine allocated. Looked up under the engine's lock and kept
 * alive by `refs` while a call uses it, so freeBatchID() racing a submit on
 * another thread cannot free it under that submit. */
struct mc_batch {
	te_batch_id id;
	size_t capacity;
	size_t submitted;         /* tasks appended so far, under `submit_lock` */
	pthread_mutex_t submit_lock; /* serializes submits: the first refused task's
				      * id is known only if no other submit interleaves */
	/* Notifications to send once no task is in flight, oldest first, under
	 * `submit_lock`. The call that sees the batch end sends them before it
	 * returns, as Mooncake does, so that a caller told a transfer is done
	 * knows the peer has its notification (and the peer gets successive
	 * notifications in order). */
	struct mc_notify *notify_head, **notify_tail;
	unsigned refs;            /* under the engine's lock */
	int freed;                /* under the engine's lock */
	struct mc_batch *next;
};

struct mc_transport {
	uint32_t magic;
	struct mc_transport *next;
	char name[]; /* the proto it was installed for */
};

struct mc_engine {
	uint32_t magic;
	te_engine *te;
	pthread_mutex_t lock; /* batches and transports lists */
	struct mc_batch **buckets;
	size_t n_buckets, n_batches;
	struct mc_transport *transports;
	atomic_int graceful;
	int slice_timeout_s;  /* MC_SLICE_TIMEOUT at creation, the deadline of the
			       * tasks submitted, from their submit; 0: off */
	atomic_int notify_pending; /* batches with notifications left: status polls look only then */
	/* MC_TE_METRIC's reporter: started with the engine when asked for,
	 * stopped and joined before the engine goes. */
	pthread_t metric_thread;
	int metric_started;
	unsigned metric_interval_s;
	pthread_mutex_t metric_lock;
	pthread_cond_t metric_wake; /* on CLOCK_MONOTONIC */
	int metric_stop;            /* under metric_lock */
};

/* A handle from the caller, checked: NULL, and a transport handle passed by
 * mistake (both are void * in Mooncake's API), are refused. */
struct mc_engine *engine_of(const char *fn, transfer_engine_t h);
/* engine_of() for a call whose own argument check is `refused` (non-zero:
 * refused, logged as `fn: why`): NULL when either is refused. */
struct mc_engine *engine_checked(const char *fn, transfer_engine_t h, int refused, const char *why);

/* Sends a batch's pending notifications when no task of it is in flight
 * (`force`: without asking libte, the caller knows), under its submit_lock. */
void batch_notify_flush(const char *fn, struct mc_engine *e, struct mc_batch *b, int force);
/* Frees a batch record and the notifications it still holds. */
void batch_destroy(struct mc_batch *b);

/* MC_TE_METRIC's reporter (metrics.c): started by createTransferEngine when
 * the variable asks for it, stopped before the engine goes. */
void metric_start(struct mc_engine *e);
void metric_stop(struct mc_engine *e);

#endif
