/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libte's TCP transport: Mooncake's TCP data protocol (docs/wire.md, "TCP
 * data protocol") over persistent, pipelined connections. This file holds
 * the plugin entry points, the configuration and the peers; tcp-io.c runs
 * the I/O threads, tcp-client*.c and tcp-server.c the two ends of a connection.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <json-glib/json-glib.h>
#include <te/te-json.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp-internal.h"
#include "teu-json.h"

#define DEFAULT_SLICE (1u << 20)
#define DEFAULT_DEPTH 256
#define DEFAULT_WINDOW (512u << 10)
#define DEFAULT_TIMEOUT_MS 30000
#define DEFAULT_CONNECT_TIMEOUT_MS 5000
#define DEFAULT_SUSPECT_MS 500
#define DEFAULT_IDLE_MS 120000
#define DEFAULT_MAX_INBOUND 1024
#define DEFAULT_MAX_PER_PEER 256 /* every engine of a host shares its address */
#define LISTEN_BACKLOG 1024

/* ----------------------------------------------------------------- config */

/* Threads spinning before they sleep, over every engine of the process. */
static atomic_int tcp_spinners;

static void read_config(const te_host *h, tcp_config *cfg)
{
	/* The CPUs this process may run on (its affinity), not the machine's:
	 * more I/O threads than that only take turns on the same cores. */
	cfg->cpus = teu_spin_usable_cpus();
	cfg->threads = (unsigned)te_host_config_u64(h, "TE_TCP_THREADS", NULL, MIN(cfg->cpus, 64), 1, 64);
	cfg->conns_per_peer = (unsigned)te_host_config_u64(h, "TE_TCP_CONNS_PER_PEER", "MC_TCP_LANES_PER_PEER",
							   MIN(cfg->cpus, TCP_MAX_CONNS_PER_PEER), 1,
							   TCP_MAX_CONNS_PER_PEER);
	cfg->slice = te_host_config_u64(h, "TE_TCP_SLICE_SIZE", NULL, DEFAULT_SLICE, 4096, 1u << 30);
	unsigned depth = (unsigned)te_host_config_u64(h, "TE_TCP_QUEUE_DEPTH", NULL, DEFAULT_DEPTH, 1, 65536);
	cfg->depth = 1;
	while (cfg->depth < depth)
		cfg->depth <<= 1;
	cfg->window = te_host_config_u64(h, "TE_TCP_WINDOW", NULL, DEFAULT_WINDOW, 4096, 1u << 30);
	/* Mooncake bounds the wait for a status frame in seconds; accept that
	 * name when ours is not set. */
	if (h->config(h, "TE_TCP_TIMEOUT_MS", NULL) == NULL &&
	    h->config(h, "MC_TCP_STATUS_TIMEOUT_SEC", NULL) != NULL)
		cfg->timeout_ms = (int64_t)te_host_config_u64(h, "MC_TCP_STATUS_TIMEOUT_SEC", NULL,
							      DEFAULT_TIMEOUT_MS / 1000, 1, 3600) * 1000;
	else
		cfg->timeout_ms = (int64_t)te_host_config_u64(h, "TE_TCP_TIMEOUT_MS", NULL, DEFAULT_TIMEOUT_MS,
							      100, 3600000);
	cfg->connect_timeout_ms = (int64_t)te_host_config_u64(h, "TE_TCP_CONNECT_TIMEOUT_MS", NULL,
								   DEFAULT_CONNECT_TIMEOUT_MS, 100, 600000);
	cfg->suspect_ms = (int64_t)te_host_config_u64(h, "TE_TCP_SUSPECT_MS", NULL, DEFAULT_SUSPECT_MS, 0, 3600000);
	cfg->probe_max_ms = (int64_t)te_host_config_u64(h, "TE_TCP_PROBE_MAX_MS", NULL, TCP_PROBE_MAX_MS, 100,
							 TCP_PROBE_CAP_MS);
	/* An idle outgoing connection is closed after this long (0: never), so
	 * that an engine's descriptors do not grow with every peer it ever
	 * talked to. */
	cfg->idle_ms = (int64_t)te_host_config_u64(h, "TE_TCP_IDLE_MS", NULL, DEFAULT_IDLE_MS, 0, 86400000);
	if (cfg->idle_ms > 0 && cfg->idle_ms < 100)
		cfg->idle_ms = 100;
	cfg->sockbuf = (int)te_host_config_u64(h, "TE_TCP_SOCKBUF", NULL, 0, 0, 1u << 30);
	cfg->max_inbound = (unsigned)te_host_config_u64(h, "TE_TCP_MAX_INBOUND", NULL, DEFAULT_MAX_INBOUND, 1,
							1u << 20);
	cfg->max_per_peer = (unsigned)te_host_config_u64(h, "TE_TCP_MAX_PER_PEER", NULL, DEFAULT_MAX_PER_PEER,
							 1, 1u << 20);
	cfg->port = (unsigned)te_host_config_u64(h, "TE_TCP_PORT", NULL, 0, 0, 65535);
	cfg->proto = (int)te_host_config_u64(h, "TE_TCP_PROTO", "MC_TCP_PROTO", 2, 1, 2);
	const char *b = h->config(h, "TE_TCP_BIND_ADDRESS", NULL);
	if (b == NULL)
		b = h->config(h, "TE_BIND_ADDRESS", NULL);
	g_strlcpy(cfg->bind, b ? b : "", sizeof cfg->bind);
	const char *r = h->config(h, "TE_TCP_RAILS", NULL);
	g_strlcpy(cfg->rails, r ? r : "", sizeof cfg->rails);
	cfg->direct = te_host_config_u64(h, "TE_TCP_DIRECT", NULL, 1, 0, 1) != 0;
	cfg->sg = te_host_config_u64(h, "TE_TCP_SG", NULL, 1, 0, 1) != 0;
	/* Unset: adaptive (util/teu-spin.h); set: exactly that, 0 never. */
	const char *sp = h->config(h, "TE_SPIN_US", NULL);
	int64_t spin_us = -1;
	if (sp != NULL && *sp != '\0')
		spin_us = (int64_t)te_host_config_u64(h, "TE_SPIN_US", NULL, 0, 0, TEU_SPIN_MAX_US);
	teu_spin_policy_init(&cfg->spin, spin_us, &tcp_spinners);
}

/* ------------------------------------------------------------------ rails */

/* Numeric IPv4 or IPv6 text (brackets allowed) to its canonical form. */
static bool canon_addr(const char *v, char *out, size_t size)
{
	char tmp[64];
	size_t n = strlen(v);
	unsigned char a[16];

	if (n >= 2 && n < sizeof tmp && v[0] == '[' && v[n - 1] == ']') {
		memcpy(tmp, v + 1, n - 2);
		tmp[n - 2] = '\0';
		v = tmp;
	}
	if (inet_pton(AF_INET, v, a) == 1)
		return inet_ntop(AF_INET, a, out, (socklen_t)size) != NULL;
	if (inet_pton(AF_INET6, v, a) == 1)
		return inet_ntop(AF_INET6, a, out, (socklen_t)size) != NULL;
	return false;
}

/* The canonical text of an interface address we can publish: IPv4, or IPv6
 * that is not link-local (that one needs a scope a peer cannot know). */
static bool ifa_text(const struct ifaddrs *ifa, char *out, size_t size)
{
	const struct sockaddr *sa = ifa->ifa_addr;

	if (sa == NULL)
		return false;
	if (sa->sa_family == AF_INET)
		return inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, out,
				 (socklen_t)size) != NULL;
	if (sa->sa_family == AF_INET6) {
		const struct in6_addr *a6 = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
		if (IN6_IS_ADDR_LINKLOCAL(a6))
			return false;
		return inet_ntop(AF_INET6, a6, out, (socklen_t)size) != NULL;
	}
	return false;
}

/* TE_TCP_RAILS: comma-separated numeric addresses of this host or interface
 * names (their first IPv4 address, else their first global IPv6 one),
 * resolved once here. 0, or -EINVAL with a log line naming the bad item. */
static int resolve_rails(tcp_ctx *c)
{
	struct ifaddrs *ifs = NULL;
	char **items;
	int rc = 0;

	if (c->cfg.rails[0] == '\0')
		return 0;
	if (getifaddrs(&ifs) < 0) {
		rc = -errno;
		TLOG(c, TE_LOG_ERROR, "TE_TCP_RAILS: cannot list the interfaces: %s", g_strerror(-rc));
		return rc;
	}
	items = g_strsplit(c->cfg.rails, ",", -1);
	for (char **it = items; *it != NULL && rc == 0; it++) {
		char *item = g_strstrip(*it), addr[64] = "";
		bool found = false;
		if (*item == '\0')
			continue;
		if (canon_addr(item, addr, sizeof addr)) {
			/* Only an address of this host: a peer would send our data
			 * to whoever holds it. */
			struct in_addr v4;
			for (struct ifaddrs *ifa = ifs; ifa != NULL && !found; ifa = ifa->ifa_next) {
				char a[64];
				found = ifa_text(ifa, a, sizeof a) && strcmp(a, addr) == 0;
			}
			/* 127.0.0.0/8 is all this host's, though lo lists one. */
			if (!found && inet_pton(AF_INET, addr, &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127)
				found = true;
			if (!found) {
				TLOG(c, TE_LOG_ERROR, "TE_TCP_RAILS: %s is not an address of this host", addr);
				rc = -EINVAL;
			}
		} else {
			for (int fam = AF_INET; !found && fam != -1; fam = fam == AF_INET ? AF_INET6 : -1)
				for (struct ifaddrs *ifa = ifs; ifa != NULL && !found; ifa = ifa->ifa_next)
					found = ifa->ifa_name != NULL && strcmp(ifa->ifa_name, item) == 0 &&
						ifa->ifa_addr != NULL && ifa->ifa_addr->sa_family == fam &&
						ifa_text(ifa, addr, sizeof addr);
			if (!found) {
				TLOG(c, TE_LOG_ERROR,
				     "TE_TCP_RAILS: '%.64s' is neither a numeric address nor an interface with an address",
				     item);
				rc = -EINVAL;
			}
		}
		if (rc < 0)
			break;
		bool dup = false;
		for (unsigned i = 0; i < c->nrails; i++)
			dup |= strcmp(c->rails[i], addr) == 0;
		if (dup)
			continue;
		if (c->nrails == TCP_MAX_RAILS) {
			TLOG(c, TE_LOG_ERROR, "TE_TCP_RAILS: more than %d addresses", TCP_MAX_RAILS);
			rc = -EINVAL;
			break;
		}
		g_strlcpy(c->rails[c->nrails++], addr, sizeof c->rails[0]);
	}
	g_strfreev(items);
	freeifaddrs(ifs);
	if (rc == 0 && c->nrails == 0) {
		TLOG(c, TE_LOG_ERROR, "TE_TCP_RAILS is set but names no address");
		rc = -EINVAL;
	}
	return rc;
}

/* --------------------------------------------------------------- listener */

/* The one address of TE_TCP_BIND_ADDRESS / TE_BIND_ADDRESS (numeric, IPv4 or
 * IPv6, brackets allowed): 0 and `ss` filled, or -EINVAL. */
static int parse_bind(const char *v, struct sockaddr_storage *ss, socklen_t *len, unsigned port)
{
	char tmp[64];
	size_t n = strlen(v);
	struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;

	memset(ss, 0, sizeof *ss);
	if (n >= 2 && n < sizeof tmp && v[0] == '[' && v[n - 1] == ']') {
		memcpy(tmp, v + 1, n - 2);
		tmp[n - 2] = '\0';
		v = tmp;
	}
	if (inet_pton(AF_INET, v, &a4->sin_addr) == 1) {
		a4->sin_family = AF_INET;
		a4->sin_port = htons((uint16_t)port);
		*len = sizeof *a4;
		return 0;
	}
	if (inet_pton(AF_INET6, v, &a6->sin6_addr) == 1) {
		a6->sin6_family = AF_INET6;
		a6->sin6_port = htons((uint16_t)port);
		*len = sizeof *a6;
		return 0;
	}
	return -EINVAL;
}

static int bind_addr(tcp_ctx *c, const char *addr, unsigned port);

/* A socket bound to the one address asked for: fd or -errno. */
static int bind_one(tcp_ctx *c)
{
	return bind_addr(c, c->cfg.bind, c->cfg.port);
}

/* A socket bound to `addr` and `port`: fd or -errno. */
static int bind_addr(tcp_ctx *c, const char *addr, unsigned port)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	int one = 1, fd, rc;

	if (parse_bind(addr, &ss, &sl, port) < 0) {
		TLOG(c, TE_LOG_ERROR,
		     "bind address '%s' (TE_TCP_BIND_ADDRESS / TE_BIND_ADDRESS) is not a numeric IPv4 or IPv6 address",
		     addr);
		return -EINVAL;
	}
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(fd, (struct sockaddr *)&ss, sl) < 0) {
		rc = -errno;
		close(fd);
		TLOG(c, TE_LOG_ERROR, "cannot bind the data port %u on %s: %s", port, addr, g_strerror(-rc));
		return rc;
	}
	return fd;
}

/* A socket bound on every interface: fd or -errno. */
static int bind_any(tcp_ctx *c)
{
	int one = 1, zero = 0, fd, rc;

	/* Dual stack first (IPv4 peers arrive as mapped addresses), IPv4 else. */
	fd = socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd >= 0) {
		struct sockaddr_in6 a = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)c->cfg.port),
					  .sin6_addr = IN6ADDR_ANY_INIT };
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) < 0 ||
		    bind(fd, (struct sockaddr *)&a, sizeof a) < 0) {
			close(fd);
			fd = -1;
		}
	}
	if (fd < 0) {
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)c->cfg.port),
					 .sin_addr.s_addr = htonl(INADDR_ANY) };
		fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -errno;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0) {
			rc = -errno;
			close(fd);
			TLOG(c, TE_LOG_ERROR, "cannot bind the data port %u: %s", c->cfg.port, g_strerror(-rc));
			return rc;
		}
	}
	return fd;
}

static bool is_wildcard(const char *addr)
{
	char a[64];

	return canon_addr(addr, a, sizeof a) && (strcmp(a, "0.0.0.0") == 0 || strcmp(a, "::") == 0);
}

/* Rails and a bind address: the data port listens on each rail address too
 * (same port), so peers reach it over every rail it publishes. Listening on
 * every interface covers them already. */
static int open_rail_listeners(tcp_ctx *c)
{
	char bound[64];

	if (c->cfg.bind[0] == '\0' || is_wildcard(c->cfg.bind))
		return 0;
	if (!canon_addr(c->cfg.bind, bound, sizeof bound))
		bound[0] = '\0';
	for (unsigned i = 0; i < c->nrails; i++) {
		if (strcmp(c->rails[i], bound) == 0)
			continue;
		int rc, fd = bind_addr(c, c->rails[i], (unsigned)c->port);
		if (fd < 0)
			return fd;
		if (listen(fd, LISTEN_BACKLOG) < 0) {
			rc = -errno;
			close(fd);
			TLOG(c, TE_LOG_ERROR, "listen on the data port at %s: %s", c->rails[i], g_strerror(-rc));
			return rc;
		}
		tcp_io *io = &c->listen_extra[c->nlisten_extra++];
		io->kind = IO_LISTEN;
		io->fd = fd;
	}
	return 0;
}

static int open_listener(tcp_ctx *c)
{
	int rc, fd = c->cfg.bind[0] != '\0' ? bind_one(c) : bind_any(c);

	if (fd < 0)
		return fd;
	if (listen(fd, LISTEN_BACKLOG) < 0) {
		rc = -errno;
		close(fd);
		TLOG(c, TE_LOG_ERROR, "listen on the data port: %s", g_strerror(-rc));
		return rc;
	}
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
		rc = -errno;
		close(fd);
		return rc;
	}
	c->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
						 : ((struct sockaddr_in *)&ss)->sin_port);
	c->listen_fd = fd;
	return open_rail_listeners(c);
}

/* ---------------------------------------------------------- create/destroy */

static void free_peer(tcp_peer *p)
{
	for (unsigned i = 0; i < p->nconns; i++) {
		if (p->conns[i].io.fd >= 0)
			close(p->conns[i].io.fd);
		g_free(p->conns[i].ring);
	}
	g_free(p->retry);
	g_mutex_clear(&p->lock);
	g_free(p->rails);
	g_free(p->key);
	g_free(p);
}

static void tcp_destroy(void *ctx)
{
	tcp_ctx *c = ctx;

	if (c == NULL)
		return;
	atomic_store(&c->stopping, 1);
	/* Connections being authenticated finish (bounded) and are closed. */
	if (c->auth_pool != NULL)
		g_thread_pool_free(c->auth_pool, FALSE, TRUE);
	c->auth_pool = NULL;
	/* The threads fail what their connections still carry and close them. */
	tcp_threads_stop(c);
	tcp_link_close(c);
	if (c->dead != NULL) {
		tcp_dead_flush(c, true);
		g_array_unref(c->dead);
	}
	g_mutex_clear(&c->dead_lock);
	if (c->listen_fd >= 0)
		close(c->listen_fd);
	for (unsigned i = 0; i < c->nlisten_extra; i++)
		close(c->listen_extra[i].fd);
	if (c->all_peers != NULL) {
		for (guint i = 0; i < c->all_peers->len; i++) {
			tcp_peer *p = g_ptr_array_index(c->all_peers, i);
			tcp_peer_fail_pending(p, -ESHUTDOWN);
			free_peer(p);
		}
		g_ptr_array_unref(c->all_peers);
	}
	if (c->peers != NULL)
		g_hash_table_unref(c->peers);
	if (c->live_peers != NULL)
		g_hash_table_unref(c->live_peers);
	tcp_sleepers_free(c);
	g_mutex_clear(&c->sleep_lock);
	if (c->per_peer != NULL)
		g_hash_table_unref(c->per_peer);
	g_mutex_clear(&c->inbound_lock);
	tcp_lanes_free(c);
	g_mutex_clear(&c->lock);
	g_free(c);
}

static int tcp_create(const te_host *h, const char *args, void **out)
{
	tcp_ctx *c = g_new0(tcp_ctx, 1);
	int rc;

	c->host = h;
	c->complete_many = te_host_complete_many_fn(h);
	c->metrics = TE_HAS_OP(h, metric_device) && TE_HAS_OP(h, metric_add);
	c->deadlines = TE_HAS_OP(h, transfer_enter) && TE_HAS_OP(h, transfer_leave) && TE_HAS_OP(h, transfer_deadline);
	c->listen_fd = -1;
	c->netlink_io.fd = -1;
	g_mutex_init(&c->lock);
	g_mutex_init(&c->dead_lock);
	c->dead = g_array_new(FALSE, FALSE, sizeof(struct tcp_dead));
	c->peers = g_hash_table_new(g_str_hash, g_str_equal);
	c->all_peers = g_ptr_array_new();
	c->live_peers = g_hash_table_new(g_direct_hash, g_direct_equal);
	g_mutex_init(&c->sleep_lock);
	g_mutex_init(&c->inbound_lock);
	c->per_peer = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
	/* ABI 1.2 hosts can hold a cluster key; then every data connection is
	 * authenticated before its first request. An accepted one is handed to
	 * threads of its own for that, so a peer that stalls the exchange holds
	 * neither the accepting thread nor an I/O thread; only one of these, for
	 * the handshake's 3 s at most. Idle ones go back to GLib's shared pool. */
	c->auth = TE_HAS_OP(h, auth_enabled) && TE_HAS_OP(h, auth_connect) && TE_HAS_OP(h, auth_accept) &&
		  h->auth_enabled(h);
	if (c->auth)
		c->auth_pool = g_thread_pool_new(tcp_auth_job, c, TCP_AUTH_THREADS, FALSE, NULL);
	if (args != NULL && *args != '\0' && strcmp(args, "{}") != 0 && strcmp(args, "null") != 0)
		TLOG(c, TE_LOG_WARN, "the tcp transport takes no arguments; ignoring '%.80s' (use TE_TCP_* "
			"variables)", args);
	read_config(h, &c->cfg);
	tcp_lanes_init(c);
	c->nthreads = c->cfg.threads;
	rc = resolve_rails(c);
	if (rc < 0)
		goto fail;
	rc = open_listener(c);
	if (rc < 0)
		goto fail;
	rc = tcp_threads_start(c);
	if (rc < 0) {
		TLOG(c, TE_LOG_ERROR, "cannot start the I/O threads: %s", g_strerror(-rc));
		goto fail;
	}
	TLOG(c, TE_LOG_INFO,
	     "data port %d, %u I/O threads, %u connections per peer, slices of %llu bytes, protocol v%d",
	     c->port, c->nthreads, c->cfg.conns_per_peer, (unsigned long long)c->cfg.slice, c->cfg.proto);
	if (c->nrails > 0) {
		GString *g = g_string_new(NULL);
		for (unsigned i = 0; i < c->nrails; i++)
			g_string_append_printf(g, "%s%s", i ? ", " : "", c->rails[i]);
		TLOG(c, TE_LOG_INFO, "data addresses (TE_TCP_RAILS): %s", g->str);
		g_string_free(g, TRUE);
	}
	*out = c;
	return 0;
fail:
	tcp_destroy(c);
	return rc;
}

static int tcp_describe(void *ctx, char **json)
{
	tcp_ctx *c = ctx;
	JsonBuilder *b = json_builder_new();
	const char *self = c->host->local_address(c->host);
	char own[64] = "";

	json_builder_begin_object(b);
	json_builder_set_member_name(b, "tcp_data_port");
	json_builder_add_int_value(b, c->port);
	json_builder_set_member_name(b, "tcp_proto_version");
	json_builder_add_int_value(b, c->cfg.proto);
	/* We honour HELLO and FENCE (v2 only: a FENCE is answered). A field of
	 * its own rather than a higher tcp_proto_version, which Mooncake reads
	 * to choose its framing. */
	if (c->cfg.proto >= 2) {
		json_builder_set_member_name(b, "tcp_fence");
		json_builder_add_int_value(b, TCP_FENCE_VERSION);
	}
	/* We take scatter-gather frames (v2: answered with status frames). */
	if (c->cfg.proto >= 2 && c->cfg.sg) {
		json_builder_set_member_name(b, "tcp_sg");
		json_builder_add_int_value(b, TCP_SG_VERSION);
	}
	/* Every address the data port is reached at, for peers that spread over
	 * them; Mooncake reads the fields above only. Without TE_TCP_RAILS, only
	 * the address the engine publishes anyway: others may be on networks the
	 * operator keeps data off. A host name is left out: peers take only
	 * numeric addresses there, and reach that name as before. */
	if (c->nrails == 0 && self != NULL && !canon_addr(self, own, sizeof own))
		own[0] = '\0';
	if (c->nrails > 0 || own[0] != '\0') {
		json_builder_set_member_name(b, "tcp_data_addresses");
		json_builder_begin_array(b);
		if (c->nrails == 0)
			json_builder_add_string_value(b, own);
		for (unsigned i = 0; i < c->nrails; i++)
			json_builder_add_string_value(b, c->rails[i]);
		json_builder_end_array(b);
	}
	json_builder_end_object(b);
	*json = teu_json_finish(b, NULL);
	return *json ? 0 : -ENOMEM;
}

/* tcp_data_addresses of a peer's descriptor: the numeric ones, canonical,
 * without repeats, at most TCP_MAX_RAILS. Anything else is skipped with a
 * warning (a peer's input: never trusted). */
static unsigned parse_rails(tcp_ctx *c, const te_segment_info *seg, JsonObject *o, char rails[][64])
{
	JsonNode *n = json_object_get_member(o, "tcp_data_addresses");
	unsigned nr = 0;

	if (n == NULL)
		return 0;
	if (!JSON_NODE_HOLDS_ARRAY(n)) {
		TLOG(c, TE_LOG_WARN, "segment %s: tcp_data_addresses is not an array; ignored", seg->name);
		return 0;
	}
	JsonArray *a = json_node_get_array(n);
	for (guint i = 0; i < json_array_get_length(a); i++) {
		JsonNode *e = json_array_get_element(a, i);
		char addr[64];
		if (!JSON_NODE_HOLDS_VALUE(e) || json_node_get_value_type(e) != G_TYPE_STRING ||
		    !canon_addr(json_node_get_string(e), addr, sizeof addr)) {
			TLOG(c, TE_LOG_WARN, "segment %s: tcp_data_addresses[%u] is not a numeric address; skipped",
			     seg->name, i);
			continue;
		}
		bool dup = false;
		for (unsigned k = 0; k < nr; k++)
			dup |= strcmp(rails[k], addr) == 0;
		if (dup)
			continue;
		if (nr == TCP_MAX_RAILS) {
			TLOG(c, TE_LOG_WARN, "segment %s: more than %d tcp_data_addresses; using the first %d",
			     seg->name, TCP_MAX_RAILS, TCP_MAX_RAILS);
			break;
		}
		g_strlcpy(rails[nr++], addr, 64);
	}
	return nr;
}

/* ---------------------------------------------------------------- segments */

/* The descriptor's TCP fields: data port (required), protocol version (a
 * missing field means 1), whether the peer fences. The host reads none of
 * them: a port or version that is not an integer in range refuses the
 * segment here (-EINVAL, the field named), whatever else serves it. */
static int parse_descriptor(tcp_ctx *c, const te_segment_info *seg, int *port, int *version, bool *fence,
			    bool *sg, char rails[][64], unsigned *nrails)
{
	static const te_json_limits lim = TE_JSON_LIMITS_DEFAULT;
	/* Only these: the descriptor lists every buffer of the peer. */
	static const char *const fields[] = { "tcp_data_port", "tcp_proto_version", "tcp_fence", "tcp_sg",
					      "tcp_data_addresses", NULL };
	char why[160] = "no descriptor";
	JsonNode *root = NULL;
	uint64_t v = 0;
	int rc = -ENOTSUP;

	*port = 0;
	*version = 1;
	*fence = false;
	*sg = false;
	if (seg->descriptor == NULL ||
	    (root = te_json_load_members(seg->descriptor, strlen(seg->descriptor), &lim, fields, why, sizeof why)) ==
		    NULL ||
	    !JSON_NODE_HOLDS_OBJECT(root)) {
		TLOG(c, TE_LOG_WARN, "segment %s: descriptor is not a JSON object (%s)", seg->name,
		     root ? "another JSON value" : why);
		if (root != NULL)
			json_node_unref(root);
		return -EINVAL;
	}
	JsonObject *o = json_node_get_object(root);
	int prc = te_json_get_u64(o, "tcp_data_port", 65535, &v);
	if (prc == 0 && v > 0) {
		*port = (int)v;
		rc = 0;
	}
	int vrc = te_json_get_u64(o, "tcp_proto_version", 255, &v);
	if (vrc == 0 && v >= 2)
		*version = 2;
	if ((prc < 0 && prc != -ENOENT) || (vrc < 0 && vrc != -ENOENT)) {
		/* the peer's text: a flood of these is held back */
		TE_HOST_LOG_LIMITED(c->host, TE_LOG_ERROR,
				    "segment %.200s: descriptor rejected: \"%s\" is not an integer from 0 to %d",
				    seg->name, prc < 0 && prc != -ENOENT ? "tcp_data_port" : "tcp_proto_version",
				    prc < 0 && prc != -ENOENT ? 65535 : 255);
		json_node_unref(root);
		*port = 0; /* a refused descriptor names no port, even a valid one */
		return -EINVAL;
	}
	if (te_json_get_u64(o, "tcp_fence", 255, &v) == 0 && v >= TCP_FENCE_VERSION)
		*fence = true;
	if (te_json_get_u64(o, "tcp_sg", 255, &v) == 0 && v >= TCP_SG_VERSION)
		*sg = true;
	*nrails = parse_rails(c, seg, o, rails);
	json_node_unref(root);
	if (rc < 0)
		TLOG(c, TE_LOG_DEBUG, "segment %s has no TCP data port", seg->name);
	return rc;
}

/* A peer reached at `host` (resolved to `res`), or over `nrails` (>= 2) rails:
 * TE_TCP_CONNS_PER_PEER connections each, connection i over rail i % nrails
 * so that the connections of every rail take turns. */
static tcp_peer *peer_new(tcp_ctx *c, const char *key, const char *host, int port, int version, bool fence,
			  bool sg, const struct addrinfo *res, char rails[][64], unsigned nrails)
{
	unsigned nr = nrails >= 2 ? nrails : 1;
	unsigned nconns = c->cfg.conns_per_peer * nr;
	tcp_peer *p = g_malloc0(sizeof *p + nconns * sizeof(tcp_cconn));

	p->ctx = c;
	p->key = g_strdup(key);
	snprintf(p->name, sizeof p->name, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
	p->rails = g_new0(tcp_rail, nr); /* a single-rail peer costs one */
	p->nrails = nr;
	atomic_init(&p->rails_up, (int)nr);
	for (unsigned r = 0; r < nr; r++) {
		tcp_rail *rl = &p->rails[r];
		atomic_init(&rl->up, 1);
		if (nr == 1) {
			g_strlcpy(rl->name, p->name, sizeof rl->name);
			for (const struct addrinfo *ai = res; ai != NULL && rl->naddr < TCP_MAX_ADDRS; ai = ai->ai_next) {
				if (ai->ai_addrlen > sizeof rl->addr[0])
					continue;
				memcpy(&rl->addr[rl->naddr], ai->ai_addr, ai->ai_addrlen);
				rl->addrlen[rl->naddr++] = ai->ai_addrlen;
			}
		} else {
			snprintf(rl->name, sizeof rl->name, strchr(rails[r], ':') ? "[%s]:%d" : "%s:%d", rails[r], port);
			parse_bind(rails[r], &rl->addr[0], &rl->addrlen[0], (unsigned)port); /* numeric: checked */
			rl->naddr = 1;
		}
	}
	p->version = version;
	p->fence = fence;
	p->sg = sg;
	g_mutex_init(&p->lock);
	p->nconns = nconns;
	atomic_init(&p->live_conns, (int)nconns);
	unsigned base = atomic_fetch_add(&c->next_thread, 1);
	for (unsigned i = 0; i < nconns; i++) {
		tcp_cconn *cc = &p->conns[i];
		cc->io.kind = IO_CLIENT;
		cc->io.fd = -1;
		cc->io.thr = &c->threads[(base + i) % c->nthreads];
		g_strlcpy(cc->io.name, p->name, sizeof cc->io.name);
		cc->peer = p;
		cc->idx = i;
		cc->rail = i % nr;
		cc->state = CS_DOWN;
	}
	return p;
}

static int tcp_segment_open(void *ctx, const te_segment_info *seg, void **seg_ctx)
{
	tcp_ctx *c = ctx;
	int port, version, rc;
	bool fence, sg;
	char ps[16];
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res = NULL;
	char rails[TCP_MAX_RAILS][64];
	unsigned nrails = 0;

	rc = parse_descriptor(c, seg, &port, &version, &fence, &sg, rails, &nrails);
	if (rc < 0)
		return rc;
	if (seg->host == NULL || *seg->host == '\0') {
		TLOG(c, TE_LOG_ERROR, "segment %s: no host address to reach it at", seg->name);
		return -EINVAL;
	}
	if (version > c->cfg.proto)
		version = c->cfg.proto; /* TE_TCP_PROTO=1 forces the legacy framing */
	fence = fence && version >= 2;
	sg = sg && version >= 2 && c->cfg.sg; /* TE_TCP_SG=0: the usual frames only */
	snprintf(ps, sizeof ps, "%d", port);
	/* Resolved once, here on the control path: I/O threads never block on DNS. */
	rc = getaddrinfo(seg->host, ps, &hints, &res);
	if (rc != 0 || res == NULL) {
		TLOG(c, TE_LOG_ERROR, "segment %s: cannot resolve '%s': %s", seg->name, seg->host,
		     rc == EAI_SYSTEM ? g_strerror(errno) : gai_strerror(rc));
		if (res)
			freeaddrinfo(res);
		return -EHOSTUNREACH;
	}
	/* One address (the default: the engine's own) means the host above,
	 * where a single-rail peer has always been reached. */
	GString *k = g_string_new(NULL);
	g_string_printf(k, "%s|%d|%d|%d|%d|", seg->host, port, version, fence, sg);
	for (unsigned i = 0; nrails >= 2 && i < nrails; i++)
		g_string_append_printf(k, "%s%s", i ? "," : "", rails[i]);
	char *key = g_string_free(k, FALSE);
	g_mutex_lock(&c->lock);
	tcp_peer *p = g_hash_table_lookup(c->peers, key);
	if (p == NULL) {
		p = peer_new(c, key, seg->host, port, version, fence, sg, res, rails, nrails);
		g_hash_table_insert(c->peers, p->key, p);
		g_ptr_array_add(c->all_peers, p);
		g_hash_table_add(c->live_peers, p);
	}
	p->refs++;
	g_mutex_unlock(&c->lock);
	freeaddrinfo(res);
	g_free(key);
	TLOG(c, TE_LOG_DEBUG, "segment %s served over TCP at %s (protocol v%d%s%s, %u rails)", seg->name, p->name,
	     p->version, p->fence ? " with fences" : "", p->sg ? ", scatter-gather" : "", p->nrails);
	*seg_ctx = p;
	return 0;
}

static void tcp_segment_close(void *ctx, void *seg_ctx)
{
	tcp_ctx *c = ctx;
	tcp_peer *p = seg_ctx;
	bool last;

	if (p == NULL)
		return;
	g_mutex_lock(&c->lock);
	last = --p->refs == 0;
	if (last && g_hash_table_lookup(c->peers, p->key) == p)
		g_hash_table_remove(c->peers, p->key);
	g_mutex_unlock(&c->lock);
	if (!last)
		return;
	/* Every transfer to it has completed (the host releases a segment only
	 * then); the threads close its connections and the last to retire frees
	 * it. A kick still marks its connection queued after posting the close,
	 * which a thread may already be acting on, so this loop holds the peer as
	 * one more live connection and retires it last. */
	unsigned n = p->nconns;
	tcp_cconn *conns = p->conns;
	/* No I/O thread kicks a connection after its close (see tcp_peer_kick_all). */
	atomic_store(&p->closing, 1);
	while (atomic_load(&p->kicking) > 0)
		g_thread_yield();
	atomic_fetch_add(&p->live_conns, 1);
	for (unsigned i = 0; i < n; i++)
		tcp_kick(&conns[i].io, MAIL_CLOSE);
	tcp_peer_retire_conn(p);
}

/* ------------------------------------------------------------------ submit */

static int tcp_submit(void *ctx, te_transfer *const *ts, size_t n)
{
	tcp_ctx *c = ctx;
	const te_host *h = c->host;
	uint64_t slice = c->cfg.slice;
	size_t i = 0;

	if (atomic_load(&c->stopping))
		return -ESHUTDOWN;
	tcp_direct_forget();
	while (i < n) {
		tcp_peer *p = ts[i]->seg_ctx;
		te_transfer *first = NULL, *last = NULL;
		uint64_t bytes = 0;

		/* Runs of transfers to one peer are appended under one lock. */
		for (; i < n && ts[i]->seg_ctx == p; i++) {
			te_transfer *t = ts[i];
			uint64_t slices = t->length / slice + (t->length % slice != 0);
			if (slices > UINT32_MAX) {
				h->log(h, TE_LOG_ERROR, "a %llu-byte request needs more than 2^32 slices of %llu bytes",
				       (unsigned long long)t->length, (unsigned long long)slice);
				t->nr_slices = 1;
				h->complete(h, t, 0, -EINVAL);
				continue;
			}
			/* Before it becomes visible to the I/O threads. */
			t->nr_slices = (uint32_t)slices;
			/* plugin_data[1] (the bytes not yet taken, 0 as the host
			 * hands it over) is set under the lock: an expire() may
			 * come at any time and read it there; [3] is 0 likewise. */
			t->plugin_data[0] = 0;
			t->plugin_data[2] = (uintptr_t)last;
			if (last)
				last->plugin_data[0] = (uintptr_t)t;
			else
				first = t;
			last = t;
			bytes += t->length;
		}
		if (first == NULL)
			continue;
		g_mutex_lock(&p->lock);
		/* A small run to a peer with nothing queued may go out from this
		 * thread at once, on an idle connection (tcp-client-caller.c). */
		bool direct = c->cfg.direct && bytes <= slice && p->bl_head == NULL && p->nretry == 0;
		for (te_transfer *t = first; t != NULL; t = (te_transfer *)t->plugin_data[0])
			t->plugin_data[1] = t->length;
		first->plugin_data[2] = (uintptr_t)p->bl_tail;
		if (p->bl_tail)
			p->bl_tail->plugin_data[0] = (uintptr_t)first;
		else
			p->bl_head = first;
		p->bl_tail = last;
		p->bl_bytes += bytes;
		atomic_store_explicit(&p->has_work, 1, memory_order_release);
		g_mutex_unlock(&p->lock);
		if (direct && tcp_direct_submit(p) && !atomic_load(&p->has_work))
			continue;
		for (unsigned k = 0; k < p->nconns; k++)
			tcp_kick(&p->conns[k].io, MAIL_WORK);
	}
	return 0;
}

/* ------------------------------------------------------------------ report */

static int tcp_probe(const te_host *h, char *why, size_t why_len)
{
	(void)h;
	if (why_len > 0)
		why[0] = '\0';
	return 0; /* TCP works wherever sockets do */
}

static int tcp_report(const te_host *h, char **text)
{
	tcp_config cfg;
	char spin[64];

	read_config(h, &cfg);
	if (!cfg.spin.adaptive)
		snprintf(spin, sizeof spin, "%lld us", (long long)(cfg.spin.cap_ns / 1000));
	else if (cfg.spin.cpus < 2)
		snprintf(spin, sizeof spin, "never (one usable CPU)");
	else
		snprintf(spin, sizeof spin, "learned, up to %lld us", (long long)(cfg.spin.cap_ns / 1000));
	*text = g_strdup_printf(
		"TCP transport (Mooncake TCP data protocol v2, v1 for legacy peers)\n"
		"  I/O threads            %u (TE_TCP_THREADS)\n"
		"  connections per peer   %u (TE_TCP_CONNS_PER_PEER)\n"
		"  slice size             %llu bytes (TE_TCP_SLICE_SIZE)\n"
		"  requests in flight     %u per connection (TE_TCP_QUEUE_DEPTH)\n"
		"  bytes in flight        %llu per connection (TE_TCP_WINDOW)\n"
		"  stall timeout          %lld ms (TE_TCP_TIMEOUT_MS)\n"
		"  rail suspect after     %lld ms without progress (TE_TCP_SUSPECT_MS, 0: off)\n"
		"  down rails tried       every %lld ms at most (TE_TCP_PROBE_MAX_MS)\n"
		"  idle connections close %lld ms after their last use (TE_TCP_IDLE_MS, 0: never)\n"
		"  data port              %s (TE_TCP_PORT)\n"
		"  data addresses         %s (TE_TCP_RAILS)\n"
		"  callers send and wait  %s (TE_TCP_DIRECT)\n"
		"  small pieces batched   %s (TE_TCP_SG)\n"
		"  spin before sleeping   %s (TE_SPIN_US, 0: off)\n",
		cfg.threads, cfg.conns_per_peer, (unsigned long long)cfg.slice, cfg.depth,
		(unsigned long long)cfg.window, (long long)cfg.timeout_ms, (long long)cfg.suspect_ms,
		(long long)cfg.probe_max_ms, (long long)cfg.idle_ms, cfg.port ? "fixed" : "any free one",
		cfg.rails[0] ? cfg.rails : "the engine's address", cfg.direct ? "on an idle connection" : "never",
		cfg.sg ? "in scatter-gather frames, to peers that take them" : "never",
		spin);
	if (*text == NULL)
		return -ENOMEM;
	/* The host frees with free(): hand it a malloc()ed copy. */
	char *m = strdup(*text);
	g_free(*text);
	*text = m;
	return m ? 0 : -ENOMEM;
}

static const te_transport_ops tcp_ops = {
	.size = sizeof(te_transport_ops),
	/* Deadlines: every touch of a transfer's memory is inside its gate
	 * (tcp-client-wire.c), expire() drops its work (tcp-client.c). */
	.flags = TE_TRANSPORT_MEMORY | TE_TRANSPORT_DEVICE_PINS | TE_TRANSPORT_NESTED_SUBMIT | TE_TRANSPORT_DEADLINES,
	.probe = tcp_probe,
	.create = tcp_create,
	.destroy = tcp_destroy,
	.describe = tcp_describe,
	.segment_open = tcp_segment_open,
	.segment_close = tcp_segment_close,
	.submit = tcp_submit,
	.report = tcp_report,
	.progress = tcp_progress,
	.wake = tcp_wake,
	.expire = tcp_expire,
	/* What Mooncake writes into every descriptor, TCP or not: peers read
	 * the data port (0: none) and the protocol of an engine with no
	 * transport for memory from any descriptor. */
	.default_fields = "{\"protocol\":\"tcp\",\"tcp_data_port\":0,\"tcp_proto_version\":2}",
	.priority = TE_TRANSPORT_PRIORITY_TCP,
};

TE_PLUGIN_DEFINE(TE_KIND_TRANSPORT, "tcp", "1.0.0",
		 "TCP transport speaking Mooncake's TCP data protocol", "Apache-2.0", &tcp_ops)
