/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Helpers of the RDMA tests: engines on the software verbs layer over a
 * sysfs fixture tree, the plugin's test controls (found with dlsym), raw
 * frames to an engine's RPC port, and polling with a deadline.
 *
 * Real-device mode. With TE_RDMA_TEST_DEVICES=d0,d1,d2,d3 the engines use
 * libibverbs and those devices instead: the fixture's mlx5_0..mlx5_3 stand
 * for d0..d3 wherever a test names them (arguments, statistics). A device's
 * link is pulled by taking down the interface at its place in
 * TE_RDMA_TEST_LINKS=if0,if1,... (the switch side of its cable). Checks
 * that need the software layer's own controls (injected errors, latency,
 * fatal events, its counters) are skipped there, each saying so. The
 * software layer's sysfs fixtures are not used.
 */
#ifndef TE_TEST_RDMA_UTIL_H
#define TE_TEST_RDMA_UTIL_H

#include <arpa/inet.h>
#include <dlfcn.h>
#include <endian.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "soft-verbs/rdma-test.h"
#include "../common/rpc-raw.h"
#include "../common/util.h"

static te_rdma_soft_set_link_fn soft_set_link;
static te_rdma_soft_fatal_fn soft_fatal;
static te_rdma_soft_fatal_silent_fn soft_fatal_silent;
static te_rdma_soft_replace_gid_fn soft_replace_gid;
static te_rdma_soft_rename_fn soft_rename;
static te_rdma_soft_fail_next_fn soft_fail_next;
static te_rdma_soft_set_latency_fn soft_set_latency;
static te_rdma_soft_get_counters_fn soft_counters;
static te_rdma_get_stats_fn rdma_stats;

/* ------------------------------------------------------ real-device mode */

#define REAL_MAX_DEV 8
static char real_dev[REAL_MAX_DEV][64];
static int real_ndev = -1; /* -1: not looked at yet */

/* How many real devices stand in for the fixture's; 0: software layer. */
static inline int real_mode(void)
{
	if (real_ndev < 0) {
		const char *s = getenv("TE_RDMA_TEST_DEVICES");
		real_ndev = 0;
		while (s != NULL && *s != '\0' && real_ndev < REAL_MAX_DEV) {
			size_t n = strcspn(s, ",");
			if (n > 0 && n < sizeof real_dev[0]) {
				memcpy(real_dev[real_ndev], s, n);
				real_dev[real_ndev++][n] = '\0';
			}
			s += n + (s[n] == ',');
		}
	}
	return real_ndev;
}

/* The device standing for the fixture name `name` ("mlx5_N"), or `name`. */
static inline const char *dev_name(const char *name)
{
	int i;
	if (real_mode() && sscanf(name, "mlx5_%d", &i) == 1 && i >= 0) {
		REQUIRE(i < real_ndev); /* the test needs more devices than given */
		return real_dev[i];
	}
	return name;
}

/* `text` with every fixture device name replaced (malloc()ed). */
static inline char *map_names(const char *text)
{
	size_t cap = strlen(text) * 4 + 64 * 8 + 1, o = 0;
	char *out = malloc(cap);
	REQUIRE(out != NULL);
	for (const char *p = text; *p != '\0';) {
		int i, used = 0;
		if (real_mode() && strncmp(p, "mlx5_", 5) == 0 && sscanf(p, "mlx5_%d%n", &i, &used) == 1) {
			char fx[16];
			snprintf(fx, sizeof fx, "mlx5_%d", i);
			const char *d = dev_name(fx);
			REQUIRE(o + strlen(d) < cap);
			memcpy(out + o, d, strlen(d));
			o += strlen(d);
			p += used;
		} else {
			REQUIRE(o + 1 < cap);
			out[o++] = *p++;
		}
	}
	out[o] = '\0';
	return out;
}

/* cap_has() for a line that names fixture devices. */
static inline int cap_has_dev(const char *needle)
{
	char *m = map_names(needle);
	int r = cap_has(m);
	free(m);
	return r;
}

/* Takes the link of `dev` (a fixture name) down or up: the interface named
 * at the device's place in TE_RDMA_TEST_LINKS (say, the switch port its
 * cable ends in) loses IFF_UP. 0 on success. */
static inline int real_set_link(const char *dev, int up)
{
	const char *links = getenv("TE_RDMA_TEST_LINKS");
	const char *want = dev_name(dev);
	char ifname[IFNAMSIZ] = "";
	for (int i = 0; i < real_ndev && links != NULL; i++) {
		size_t n = strcspn(links, ",");
		if (strcmp(real_dev[i], want) == 0 && n > 0 && n < IFNAMSIZ) {
			memcpy(ifname, links, n);
			ifname[n] = '\0';
			break;
		}
		links += n + (links[n] == ',');
	}
	if (ifname[0] == '\0') {
		fprintf(stderr, "  TE_RDMA_TEST_LINKS names no interface for %s\n", want);
		return -ENOENT;
	}
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct ifreq ifr;
	memset(&ifr, 0, sizeof ifr);
	memcpy(ifr.ifr_name, ifname, strlen(ifname) + 1);
	int rc = fd >= 0 && ioctl(fd, SIOCGIFFLAGS, &ifr) == 0 ? 0 : -errno;
	if (rc == 0) {
		if (up)
			ifr.ifr_flags |= IFF_UP;
		else
			ifr.ifr_flags &= ~IFF_UP;
		rc = ioctl(fd, SIOCSIFFLAGS, &ifr) == 0 ? 0 : -errno;
	}
	if (fd >= 0)
		close(fd);
	if (rc < 0)
		fprintf(stderr, "  cannot set %s %s: %s\n", ifname, up ? "up" : "down", strerror(-rc));
	return rc;
}

static inline int real_set_latency(const char *dev, unsigned usec)
{
	(void)dev;
	(void)usec;
	return 0; /* an emulated link is slow enough to act mid-batch */
}

/* What a device served as the responder: work requests on the software
 * layer, packets received on a real device (its hw_counters in sysfs);
 * either way it grows only while the device takes part. */
static inline uint64_t rx_count(const char *dev)
{
	if (!real_mode()) {
		te_rdma_soft_counters c;
		return soft_counters(dev, &c) == 0 ? c.rx_wrs : 0;
	}
	char path[256], line[64];
	snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/1/hw_counters/rcvd_pkts", dev_name(dev));
	FILE *f = fopen(path, "r");
	uint64_t v = 0;
	if (f != NULL) {
		if (fgets(line, sizeof line, f) != NULL)
			v = strtoull(line, NULL, 10);
		fclose(f);
	}
	return v;
}

/* Skips the rest of a test that needs the software layer's controls. */
#define SOFT_ONLY(what)                                                                  \
	do {                                                                                 \
		if (real_mode()) {                                                               \
			fprintf(stderr, "  skipped on a real device: %s\n", what);                   \
			return;                                                                      \
		}                                                                                \
	} while (0)

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
	*(void **)&soft_fatal_silent = dlsym(h, "te_rdma_soft_fatal_silent");
	*(void **)&soft_fail_next = dlsym(h, "te_rdma_soft_fail_next");
	*(void **)&soft_set_latency = dlsym(h, "te_rdma_soft_set_latency");
	*(void **)&soft_counters = dlsym(h, "te_rdma_soft_get_counters");
	*(void **)&soft_replace_gid = dlsym(h, "te_rdma_soft_replace_gid");
	*(void **)&soft_rename = dlsym(h, "te_rdma_soft_rename");
	*(void **)&rdma_stats = dlsym(h, "te_rdma_get_stats");
	REQUIRE(soft_set_link && soft_fatal && soft_fail_next && soft_set_latency && soft_counters &&
		soft_replace_gid && soft_fatal_silent && soft_rename && rdma_stats);
	if (real_mode()) {
		fprintf(stderr, "real-device mode: %s\n", getenv("TE_RDMA_TEST_DEVICES"));
		soft_set_link = real_set_link;
		soft_set_latency = real_set_latency;
	}
}

/* A P2P engine named `name` on the software verbs layer over fixture `fx`
 * (in real-device mode: on libibverbs), with extra options (key, value
 * pairs, NULL-terminated), and the rdma transport installed with `args`
 * unless args is NULL. */
static inline te_engine *soft_engine_at(const char *name, const char *fx, const char *args,
					const char *const *extra)
{
	te_option opt[32];
	size_t n = 0;
	te_engine *e = NULL;
	char root[4096];

	snprintf(root, sizeof root, "%s", real_mode() || fx == NULL ? "/" : fixture(fx));
	if (!real_mode()) {
		opt[n++] = (te_option){ "TE_RDMA_SOFT", "1" };
		opt[n++] = (te_option){ "TE_RDMA_SYSFS_ROOT", root };
	}
	for (size_t i = 0; extra && extra[i] && extra[i + 1] && n < 32; i += 2)
		opt[n++] = (te_option){ extra[i], extra[i + 1] };
	int rc = te_engine_create("P2PHANDSHAKE", name, opt, n, &e);
	if (rc != 0) {
		fprintf(stderr, "engine create failed: %s\n", te_strerror(rc));
		return NULL;
	}
	if (args != NULL) {
		char *mapped = map_names(args);
		rc = te_transport_install(e, "rdma", mapped);
		free(mapped);
		if (rc != 0) {
			fprintf(stderr, "rdma install failed: %s\n", te_strerror(rc));
			te_engine_destroy(e);
			return NULL;
		}
	}
	return e;
}

static inline te_engine *soft_engine_v(const char *fx, const char *args, const char *const *extra)
{
	return soft_engine_at("127.0.0.1", fx, args, extra);
}

static inline te_engine *soft_engine(const char *fx, const char *args)
{
	return soft_engine_v(fx, args, NULL);
}

static inline int stats_of(te_engine *e, te_rdma_stats *st)
{
	return rdma_stats(te_engine_name(e), st);
}

/* `e`'s statistics, and the index of `dev` in them; -1 when unknown. */
static inline int stats_dev(te_engine *e, const char *dev, te_rdma_stats *st)
{
	if (stats_of(e, st) != 0)
		return -1;
	for (int i = 0; i < st->n_devices; i++)
		if (strcmp(st->device[i], dev_name(dev)) == 0)
			return i;
	return -1;
}

static inline uint64_t slices_on(te_engine *e, const char *dev)
{
	te_rdma_stats st;
	int i = stats_dev(e, dev, &st);
	return i >= 0 ? st.slices[i] : 0;
}

/* Times `dev` of engine `e` was opened again after a fatal error; -1 when unknown. */
static inline int device_revivals(te_engine *e, const char *dev)
{
	te_rdma_stats st;
	int i = stats_dev(e, dev, &st);
	return i >= 0 ? (int)st.revivals[i] : -1;
}

static inline int device_active(te_engine *e, const char *dev)
{
	te_rdma_stats st;
	int i = stats_dev(e, dev, &st);
	return i >= 0 ? st.active[i] : -1;
}

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

/* New buffers of `len` bytes registered on initiator `a` (cpu:0, with
 * `aflags`) and target `b` (cpu:1, open to its peers); returns a's segment
 * of b. */
static inline te_segment_id pair_buffers(te_engine *a, te_engine *b, size_t len, uint32_t aflags,
					 unsigned char **abuf, unsigned char **bbuf)
{
	REQUIRE(a && b);
	*abuf = buf_new(len);
	*bbuf = buf_new(len);
	return pair_segment(a, *abuf, len, aflags, b, *bbuf, len, "cpu:1");
}

#endif
