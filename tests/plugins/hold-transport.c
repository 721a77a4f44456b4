/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A test transport that holds every transfer until the test releases it, so
 * tests can observe tasks in flight (free-while-busy, cancel, wait timeouts).
 * Serves only segments of its own process. te_test_hold_* are looked up by
 * the tests with dlsym.
 *
 * It reports to the host's metrics (ABI 1.6) as one device, "hold0": bytes
 * in flight while held, bytes moved on release; a transfer released with an
 * error counts one device error, one fail-over off the device and one retry
 * of the transport itself, so tests know the exact counts to expect.
 *
 * Each buffer registered with it gets the field "hold_gen": 0 in the
 * descriptor; te_test_hold_fields() replaces an engine's fields through the
 * host (buffer_fields, ABI 1.8) and te_test_hold_stale() says a held
 * transfer's keys were refused (transfer_stale).
 *
 * Built a second time as "holddl" (HOLD_DEADLINES): a transport that
 * honours deadlines (ABI 1.11). It copies a released transfer's bytes only
 * inside transfer_enter/leave, and its expire() keeps the transfer held
 * (as a transport still waiting for its peer would) and calls a held WRITE
 * unsettled, so tests see an early end, the bytes that then never move,
 * and the settling at its release.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <te/te-plugin.h>

#include "pid-descriptor.h"

#ifndef HOLD_DEADLINES
#define HOLD_NAME "hold"
#define HOLD_FLAGS TE_TRANSPORT_MEMORY
#else
#define HOLD_NAME "holddl"
#define HOLD_FLAGS (TE_TRANSPORT_MEMORY | TE_TRANSPORT_DEADLINES)
#endif
#define MAX_HELD 4096

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static te_transfer *held[MAX_HELD];
static const te_host *held_host[MAX_HELD];
static te_metric_dev *held_dev[MAX_HELD];
static size_t n_held;

typedef struct hold_ctx {
	const te_host *host;
	te_metric_dev *dev; /* NULL when the host counts nothing */
} hold_ctx;

static void count(const te_host *h, te_metric_dev *dev, int what, int64_t delta)
{
	if (TE_HAS_OP(h, metric_add))
		h->metric_add(h, dev, what, delta);
}

__attribute__((visibility("default"))) size_t te_test_hold_count(void);
__attribute__((visibility("default"))) size_t te_test_hold_release(int error);
__attribute__((visibility("default"))) int te_test_hold_fields(const char *engine, const void *addr,
								const char *json);
__attribute__((visibility("default"))) int te_test_hold_stale(void);
__attribute__((visibility("default"))) size_t te_test_hold_expired(void);

static size_t n_expired; /* expire() calls, under lock */

size_t te_test_hold_expired(void)
{
	pthread_mutex_lock(&lock);
	size_t n = n_expired;
	pthread_mutex_unlock(&lock);
	return n;
}

/* The instances, by their engine's name, for te_test_hold_fields(). */
#define MAX_INST 16
static const te_host *inst[MAX_INST];

int te_test_hold_fields(const char *engine, const void *addr, const char *json)
{
	int rc = -ENOENT;
	pthread_mutex_lock(&lock);
	for (int i = 0; i < MAX_INST; i++) {
		const te_host *h = inst[i];
		const char *name = h ? h->local_name(h) : NULL;
		if (name != NULL && strcmp(name, engine) == 0) {
			rc = TE_HAS_OP(h, buffer_fields) ? h->buffer_fields(h, addr, json) : -ENOTSUP;
			break;
		}
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

/* The first held transfer's peer refused its keys; -ENOENT when none is held. */
int te_test_hold_stale(void)
{
	int rc = -ENOENT;
	pthread_mutex_lock(&lock);
	if (n_held > 0) {
		const te_host *h = held_host[0];
		rc = TE_HAS_OP(h, transfer_stale) ? 0 : -ENOTSUP;
		if (rc == 0)
			h->transfer_stale(h, held[0]);
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

size_t te_test_hold_count(void)
{
	pthread_mutex_lock(&lock);
	size_t n = n_held;
	pthread_mutex_unlock(&lock);
	return n;
}

/* Completes every held transfer: moved (error 0) unless the batch was
 * canceled, or failed with `error`. */
size_t te_test_hold_release(int error)
{
	static te_transfer *t[MAX_HELD];
	static const te_host *h[MAX_HELD];
	static te_metric_dev *d[MAX_HELD];
	static pthread_mutex_t release_lock = PTHREAD_MUTEX_INITIALIZER;
	size_t n;

	pthread_mutex_lock(&release_lock); /* the copies above are static: one release at a time */
	pthread_mutex_lock(&lock);
	n = n_held;
	memcpy(t, held, n * sizeof *t);
	memcpy(h, held_host, n * sizeof *h);
	memcpy(d, held_dev, n * sizeof *d);
	n_held = 0;
	pthread_mutex_unlock(&lock);
	for (size_t i = 0; i < n; i++) {
		count(h[i], d[i], TE_METRIC_INFLIGHT_BYTES, -(int64_t)t[i]->length);
		if (error != 0) {
			count(h[i], d[i], TE_METRIC_ERRORS, 1);
			count(h[i], d[i], TE_METRIC_FAILOVERS, 1);
			count(h[i], NULL, TE_METRIC_RETRIES, 1);
		}
		if (error == 0 && h[i]->canceled(h[i], t[i])) {
			h[i]->complete(h[i], t[i], 0, -ECANCELED);
			continue;
		}
		int err = error;
		if (err == 0) {
			void *remote = (void *)(uintptr_t)t[i]->remote;
#ifdef HOLD_DEADLINES
			/* Ended early: the caller owns the memory again. */
			if (!h[i]->transfer_enter(h[i], t[i])) {
				h[i]->complete(h[i], t[i], 0, -ECONNABORTED);
				continue;
			}
#endif
			if (t[i]->opcode == TE_OP_READ)
				memcpy(t[i]->local, remote, t[i]->length);
			else
				memcpy(remote, t[i]->local, t[i]->length);
#ifdef HOLD_DEADLINES
			h[i]->transfer_leave(h[i], t[i]);
#endif
			count(h[i], d[i], TE_METRIC_BYTES, (int64_t)t[i]->length);
		}
		h[i]->complete(h[i], t[i], err ? 0 : t[i]->length, err);
	}
	pthread_mutex_unlock(&release_lock);
	return n;
}

static int hold_create(const te_host *h, const char *args, void **ctx)
{
	hold_ctx *c = calloc(1, sizeof *c);
	(void)args;
	if (c == NULL)
		return -ENOMEM;
	c->host = h;
	if (TE_HAS_OP(h, metric_device))
		c->dev = h->metric_device(h, "hold0");
	pthread_mutex_lock(&lock);
	for (int i = 0; i < MAX_INST; i++)
		if (inst[i] == NULL) {
			inst[i] = h;
			break;
		}
	pthread_mutex_unlock(&lock);
	*ctx = c;
	return 0;
}

static void hold_destroy(void *ctx)
{
	hold_ctx *c = ctx;
	pthread_mutex_lock(&lock);
	for (int i = 0; i < MAX_INST; i++)
		if (inst[i] == c->host)
			inst[i] = NULL;
	pthread_mutex_unlock(&lock);
	free(ctx);
}

static int hold_mem_register(void *ctx, const te_mem_info *mem, char **json)
{
	(void)ctx;
	(void)mem;
	*json = strdup("{\"hold_gen\":0}");
	return *json ? 0 : -ENOMEM;
}

static int hold_mem_unregister(void *ctx, void *addr, size_t length)
{
	(void)ctx;
	(void)addr;
	(void)length;
	return 0;
}

PID_DESCRIPTOR_OPS(hold)

static int hold_submit(void *ctx, te_transfer *const *ts, size_t n)
{
	const hold_ctx *c = ctx;

	pthread_mutex_lock(&lock);
	if (n_held + n > MAX_HELD) {
		pthread_mutex_unlock(&lock);
		return -ENOSPC;
	}
	for (size_t i = 0; i < n; i++) {
		/* Counted before the transfer can be released by another thread. */
		count(c->host, c->dev, TE_METRIC_INFLIGHT_BYTES, (int64_t)ts[i]->length);
		held[n_held] = ts[i];
		held_dev[n_held] = c->dev;
		held_host[n_held++] = c->host;
	}
	pthread_mutex_unlock(&lock);
	return 0;
}

#ifdef HOLD_DEADLINES
/* Keeps the transfer: it completes at its release, as one whose peer has
 * not answered yet. A held WRITE may have left. */
static int hold_expire(void *ctx, te_transfer *t)
{
	int rc = 0;
	(void)ctx;
	pthread_mutex_lock(&lock);
	n_expired++;
	for (size_t i = 0; i < n_held; i++)
		if (held[i] == t)
			rc = t->opcode == TE_OP_WRITE;
	pthread_mutex_unlock(&lock);
	return rc;
}
#endif

static const te_transport_ops hold_ops = {
	.size = sizeof(te_transport_ops),
	.flags = HOLD_FLAGS,
#ifdef HOLD_DEADLINES
	.expire = hold_expire,
#endif
	.create = hold_create,
	.destroy = hold_destroy,
	.describe = hold_describe,
	.mem_register = hold_mem_register,
	.mem_unregister = hold_mem_unregister,
	.segment_open = hold_segment_open,
	.submit = hold_submit,
};

TE_PLUGIN_DEFINE(TE_KIND_TRANSPORT, HOLD_NAME, "1.0.0", "test: holds transfers until released",
		 "Apache-2.0", &hold_ops)
