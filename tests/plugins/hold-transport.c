/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A test transport that holds every transfer until the test releases it, so
 * tests can observe tasks in flight (free-while-busy, cancel, wait timeouts).
 * Serves only segments of its own process. te_test_hold_* are looked up by
 * the tests with dlsym.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <te/te-plugin.h>

#define MAX_HELD 4096

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static te_transfer *held[MAX_HELD];
static const te_host *held_host[MAX_HELD];
static size_t n_held;

__attribute__((visibility("default"))) size_t te_test_hold_count(void);
__attribute__((visibility("default"))) size_t te_test_hold_release(int error);

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
	te_transfer *t[MAX_HELD];
	const te_host *h[MAX_HELD];
	size_t n;

	pthread_mutex_lock(&lock);
	n = n_held;
	memcpy(t, held, n * sizeof *t);
	memcpy(h, held_host, n * sizeof *h);
	n_held = 0;
	pthread_mutex_unlock(&lock);
	for (size_t i = 0; i < n; i++) {
		if (error == 0 && h[i]->canceled(h[i], t[i])) {
			h[i]->complete(h[i], t[i], 0, -ECANCELED);
			continue;
		}
		if (error == 0) {
			void *remote = (void *)(uintptr_t)t[i]->remote;
			if (t[i]->opcode == TE_OP_READ)
				memcpy(t[i]->local, remote, t[i]->length);
			else
				memcpy(remote, t[i]->local, t[i]->length);
		}
		h[i]->complete(h[i], t[i], error ? 0 : t[i]->length, error);
	}
	return n;
}

static int hold_create(const te_host *h, const char *args, void **ctx)
{
	(void)args;
	*ctx = (void *)h;
	return 0;
}

static void hold_destroy(void *ctx)
{
	(void)ctx;
}

static int hold_describe(void *ctx, char **json)
{
	char buf[64];
	(void)ctx;
	snprintf(buf, sizeof buf, "{\"hold_pid\":%d}", (int)getpid());
	*json = strdup(buf);
	return *json ? 0 : -ENOMEM;
}

static int hold_segment_open(void *ctx, const te_segment_info *seg, void **seg_ctx)
{
	char want[64];
	(void)ctx;
	snprintf(want, sizeof want, "\"hold_pid\":%d", (int)getpid());
	if (strstr(seg->descriptor, want) == NULL)
		return -ENOTSUP;
	*seg_ctx = NULL;
	return 0;
}

static int hold_submit(void *ctx, te_transfer *const *ts, size_t n)
{
	const te_host *h = ctx;

	pthread_mutex_lock(&lock);
	if (n_held + n > MAX_HELD) {
		pthread_mutex_unlock(&lock);
		return -ENOSPC;
	}
	for (size_t i = 0; i < n; i++) {
		held[n_held] = ts[i];
		held_host[n_held++] = h;
	}
	pthread_mutex_unlock(&lock);
	return 0;
}

static const te_transport_ops hold_ops = {
	.size = sizeof(te_transport_ops),
	.flags = TE_TRANSPORT_MEMORY,
	.create = hold_create,
	.destroy = hold_destroy,
	.describe = hold_describe,
	.segment_open = hold_segment_open,
	.submit = hold_submit,
};

TE_PLUGIN_DEFINE(TE_KIND_TRANSPORT, "hold", "1.0.0", "test: holds transfers until released",
		 "Apache-2.0", &hold_ops)
