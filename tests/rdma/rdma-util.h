/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Helpers of the RDMA tests: engines on the software verbs layer over a
 * sysfs fixture tree, the plugin's test controls (found with dlsym), raw
 * frames to an engine's RPC port, and polling with a deadline.
 */
#ifndef TE_TEST_RDMA_UTIL_H
#define TE_TEST_RDMA_UTIL_H

#include <arpa/inet.h>
#include <dlfcn.h>
#include <endian.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../plugins/rdma/rdma-test.h"
#include "../common/rpc-raw.h"
#include "../common/util.h"

static te_rdma_soft_set_link_fn soft_set_link;
static te_rdma_soft_fatal_fn soft_fatal;
static te_rdma_soft_fail_next_fn soft_fail_next;
static te_rdma_soft_set_latency_fn soft_set_latency;
static te_rdma_soft_get_counters_fn soft_counters;
static te_rdma_get_stats_fn rdma_stats;

/* The fixture tree `name` under TE_RDMA_FIXTURES. */
static inline const char *fixture(const char *name)
{
	static char path[4096];
	const char *dir = getenv("TE_RDMA_FIXTURES");
	REQUIRE(dir != NULL);
	snprintf(path, sizeof path, "%s/%s", dir, name);
	return path;
}

/* Loads the plugins through libte, then finds the controls in the rdma one. */
static inline void find_controls(void)
{
	const char *path = getenv("TE_RDMA_PLUGIN");
	REQUIRE(path != NULL);
	te_plugin_foreach(NULL, NULL);
	void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
	REQUIRE(h != NULL); /* libte loaded it already */
	*(void **)&soft_set_link = dlsym(h, "te_rdma_soft_set_link");
	*(void **)&soft_fatal = dlsym(h, "te_rdma_soft_fatal");
	*(void **)&soft_fail_next = dlsym(h, "te_rdma_soft_fail_next");
	*(void **)&soft_set_latency = dlsym(h, "te_rdma_soft_set_latency");
	*(void **)&soft_counters = dlsym(h, "te_rdma_soft_get_counters");
	*(void **)&rdma_stats = dlsym(h, "te_rdma_get_stats");
	REQUIRE(soft_set_link && soft_fatal && soft_fail_next && soft_set_latency && soft_counters &&
		rdma_stats);
}

/* A P2P engine on the software verbs layer over fixture `fx`, with extra
 * options (key, value pairs, NULL-terminated), and the rdma transport
 * installed with `args` unless args is NULL. */
static inline te_engine *soft_engine_v(const char *fx, const char *args, const char *const *extra)
{
	te_option opt[32];
	size_t n = 0;
	te_engine *e = NULL;
	char root[4096];

	snprintf(root, sizeof root, "%s", fixture(fx));
	opt[n++] = (te_option){ "TE_RDMA_SOFT", "1" };
	opt[n++] = (te_option){ "TE_RDMA_SYSFS_ROOT", root };
	for (size_t i = 0; extra && extra[i] && extra[i + 1] && n < 32; i += 2)
		opt[n++] = (te_option){ extra[i], extra[i + 1] };
	int rc = te_engine_create("P2PHANDSHAKE", "127.0.0.1", opt, n, &e);
	if (rc != 0) {
		fprintf(stderr, "engine create failed: %s\n", te_strerror(rc));
		return NULL;
	}
	if (args != NULL) {
		rc = te_transport_install(e, "rdma", args);
		if (rc != 0) {
			fprintf(stderr, "rdma install failed: %s\n", te_strerror(rc));
			te_engine_destroy(e);
			return NULL;
		}
	}
	return e;
}

static inline te_engine *soft_engine(const char *fx, const char *args)
{
	return soft_engine_v(fx, args, NULL);
}

static inline int stats_of(te_engine *e, te_rdma_stats *st)
{
	return rdma_stats(te_engine_name(e), st);
}

static inline uint64_t slices_on(te_engine *e, const char *dev)
{
	te_rdma_stats st;
	if (stats_of(e, &st) != 0)
		return 0;
	for (int i = 0; i < st.n_devices; i++)
		if (strcmp(st.device[i], dev) == 0)
			return st.slices[i];
	return 0;
}

static inline int device_active(te_engine *e, const char *dev)
{
	te_rdma_stats st;
	if (stats_of(e, &st) != 0)
		return -1;
	for (int i = 0; i < st.n_devices; i++)
		if (strcmp(st.device[i], dev) == 0)
			return st.active[i];
	return -1;
}

/* Waits up to `ms` for cond() to hold. */
#define WAIT_FOR(cond, ms)                                                       \
	({                                                                           \
		long long _end = now_ms() + (ms);                                        \
		while (!(cond) && now_ms() < _end)                                       \
			usleep(2000);                                                        \
		(cond);                                                                  \
	})

/* ------------------------------------------------------------- raw frames */

/* The engine's descriptor, through a Metadata frame (malloc()ed). */
static inline char *descriptor_of(te_engine *e)
{
	static char in[1 << 20];
	ssize_t r = raw_frame(te_engine_rpc_port(e), 1, "{}", in, sizeof in);
	if (r < 9 || in[8] != 1)
		return NULL;
	return strdup(in + 9);
}

/* Allocates a zeroed page-aligned buffer. */
static inline unsigned char *buf_new(size_t n)
{
	unsigned char *p = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
	REQUIRE(p != NULL);
	memset(p, 0, n);
	return p;
}

#endif
