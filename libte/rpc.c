/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The RPC/handshake socket (docs/wire.md, "RPC frames"). A frame is a native
 * u64 length (little-endian on every platform we run on, written as LE), a
 * type byte and a JSON body. The server reads one frame per connection,
 * answers with one frame of the same type, shuts its side down and waits for
 * the peer to close. Every read has a deadline and every length a bound, so a
 * stray HTTP or TLS probe, a slow or a hostile peer costs one closed
 * connection and a log line.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "internal.h"
#include "metrics.h"
#include "teu-hostport.h"

#define CONNECT_TIMEOUT_MS 5000
#define CLIENT_RECV_TIMEOUT_MS 60000
#define SERVER_FRAME_TIMEOUT_MS 10000
#define SERVER_LINGER_MS 5000
#define MAX_PENDING 1024   /* accepted, their first bytes not here yet */
#define MAX_PER_PEER 128   /* pending and served connections of one address
			     * (TE_RPC_MAX_PER_PEER): every engine of a host shares its
			     * address, and RDMA handshakes come in bursts */

/*
 * A connection costs a worker only once its first bytes arrive: until then
 * the accept thread watches it (at most MAX_PENDING, SERVER_FRAME_TIMEOUT_MS
 * each). So silent, half-open connections cannot take the workers from real
 * peers, and no address may hold more than max_per_peer connections.
 */
typedef struct pending {
	int fd;
	int64_t deadline;
	char peer[64];
	char host[48]; /* the address without the port: the per-peer key */
} pending;

struct te_rpc_server {
	te_engine *engine;
	int fd;
	int wake_fd;
	GThread *thread;
	GThreadPool *workers;
	GMutex lock;
	GHashTable *active; /* fd → fd, connections being served */
	GHashTable *per_peer; /* host → connections (pending and served) */
	int64_t last_full_warn;
	int max_per_peer;
	bool stopping;
};

static GOnce max_frame_once = G_ONCE_INIT;

static gpointer read_max_frame(gpointer unused)
{
	(void)unused;
	const char *s = te_env2("TE_RPC_MAX_FRAME", "MC_RPC_MAX_FRAME");
	uint64_t v = TE_RPC_DEFAULT_MAX_FRAME;

	if (s != NULL && (!te_parse_u64(s, &v) || v < 64 || v > TE_RPC_HARD_MAX_FRAME)) {
		te_warn("TE_RPC_MAX_FRAME=%s is outside [64, %u]; using %u", s, TE_RPC_HARD_MAX_FRAME,
			TE_RPC_DEFAULT_MAX_FRAME);
		v = TE_RPC_DEFAULT_MAX_FRAME;
	}
	return GSIZE_TO_POINTER((gsize)v);
}

size_t te_rpc_max_frame(void)
{
	return GPOINTER_TO_SIZE(g_once(&max_frame_once, read_max_frame, NULL));
}

/* Writes one frame. `type` < 0: an old-style frame without a type byte. */
static int write_frame(int fd, int type, const char *body, size_t len, int64_t deadline)
{
	unsigned char hdr[9];
	size_t hl = 8;
	uint64_t total = len + (type >= 0 ? 1 : 0);

	total = htole64(total);
	memcpy(hdr, &total, 8);
	if (type >= 0)
		hdr[hl++] = (unsigned char)type;
	int rc = te_fd_write(fd, hdr, hl, deadline);
	return rc < 0 ? rc : te_fd_write(fd, body, len, deadline);
}

/* Reads one frame; the body comes back NUL-terminated without the type byte.
 * *type is -1 for an old-style frame (treated as Connection by callers). */
static int read_frame(int fd, int *type, char **body, size_t *len, int64_t deadline,
		      const char *peer)
{
	uint64_t n;
	char *buf;
	int rc;

	*body = NULL;
	rc = te_fd_read(fd, &n, 8, deadline);
	if (rc < 0)
		return rc;
	n = le64toh(n);
	if (n == 0 || n > te_rpc_max_frame()) {
		te_warn_limited("rpc: frame from %s claims %llu bytes (allowed 1..%zu); closing", peer,
				(unsigned long long)n, te_rpc_max_frame());
		return TE_ERR_PROTOCOL;
	}
	buf = g_malloc(n + 1);
	rc = te_fd_read(fd, buf, n, deadline);
	if (rc < 0) {
		g_free(buf);
		return rc;
	}
	buf[n] = '\0';
	if ((unsigned char)buf[0] <= TE_RPC_PROBE) {
		*type = buf[0];
		memmove(buf, buf + 1, n); /* moves the NUL too */
		*len = n - 1;
	} else {
		*type = -1;
		*len = n;
	}
	*body = buf;
	return 0;
}

static const char *rpc_kind_name(int kind)
{
	switch (kind) {
	case TE_RPC_CONNECTION: return "Connection";
	case TE_RPC_METADATA: return "Metadata";
	case TE_RPC_NOTIFY: return "Notify";
	case TE_RPC_PROBE: return "Probe";
	default: return "unknown";
	}
}

/* ---------------------------------------------------------------- server */

typedef struct conn_job {
	int fd;
	char peer[64];
	char host[48];
} conn_job;

/* One connection of `host` more (+1) or less (-1); the count after. s->lock held. */
static int peer_count(te_rpc_server *s, const char *host, int delta)
{
	int n = GPOINTER_TO_INT(g_hash_table_lookup(s->per_peer, host)) + delta;
	if (n <= 0)
		g_hash_table_remove(s->per_peer, host);
	else
		g_hash_table_replace(s->per_peer, g_strdup(host), GINT_TO_POINTER(n));
	return n;
}

static int handle_builtin(te_engine *e, int type, const char *body, size_t len, char **reply,
			  size_t *reply_len, const char *peer)
{
	(void)body;
	(void)len;
	if (type == TE_RPC_PROBE) {
		*reply = strdup("{\"status\":\"success\"}");
	} else { /* Metadata: answer with our descriptor */
		/* The cached copy: encoding here would need the control lock, and two
		 * engines opening each other at once would wait on each other. */
		g_mutex_lock(&e->desc_lock);
		*reply = e->desc_cache ? strdup(e->desc_cache) : NULL;
		g_mutex_unlock(&e->desc_lock);
		te_dbg("rpc: sent descriptor to %s", peer);
	}
	if (*reply == NULL)
		return -ENOMEM;
	*reply_len = strlen(*reply);
	return 0;
}

/* Lets the peer read the reply before the close: waits for its own close
 * (reading what it still sends), bounded. */
static void linger_close(int fd)
{
	char sink[256];
	int64_t linger = te_now_ms() + SERVER_LINGER_MS;

	shutdown(fd, SHUT_WR);
	while (te_fd_wait(fd, POLLIN, linger) == 0 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0)
		;
}

/* A peer sent a plain frame to a server that requires authentication: it
 * gets one reply frame of its type saying so (a key-less libte client turns
 * it into TE_ERR_AUTH at once instead of waiting for a timeout), then the
 * connection closes. */
static void answer_plain(int fd, const uint8_t first[8], const char *peer)
{
	uint64_t n;
	unsigned char t = 0;
	int type = -1;

	memcpy(&n, first, 8);
	n = le64toh(n);
	if (n == 0 || n > te_rpc_max_frame())
		return; /* not a frame at all */
	if (te_fd_read(fd, &t, 1, te_now_ms() + 1000) == 0 && t <= TE_RPC_PROBE)
		type = t;
	if (write_frame(fd, type, TE_AUTH_REQUIRED_REPLY, strlen(TE_AUTH_REQUIRED_REPLY),
			te_now_ms() + 1000) == 0)
		linger_close(fd);
	te_dbg("rpc: told %s that authentication is required", peer);
}

static void serve_conn(gpointer data, gpointer user)
{
	conn_job *job = data;
	te_rpc_server *s = user;
	te_engine *e = s->engine;
	int64_t deadline = te_now_ms() + SERVER_FRAME_TIMEOUT_MS;
	char *body = NULL, *reply = NULL;
	size_t len = 0, reply_len = 0;
	int type = 0, rc;

	if (e->auth != NULL) {
		uint8_t first[8];
		bool plain = false;
		rc = te_auth_server(e->auth, job->fd, TE_AUTH_RPC, job->peer, SERVER_FRAME_TIMEOUT_MS, first,
				    &plain);
		if (rc == TE_ERR_AUTH) /* before the answer: the peer may read the count next */
			te_metric_count_auth(e);
		if (rc < 0 && plain)
			answer_plain(job->fd, first, job->peer);
		if (rc < 0)
			goto out;
	}
	rc = read_frame(job->fd, &type, &body, &len, deadline, job->peer);
	if (rc < 0) {
		if (rc != TE_ERR_PROTOCOL)
			te_dbg("rpc: reading a frame from %s: %s", job->peer, te_strerror(rc));
		else /* a length out of bounds: not a frame of any kind */
			te_metric_count_rpc(e, TE_MRPC_UNKNOWN, true);
		goto out;
	}
	int kind = type < 0 ? TE_RPC_CONNECTION : type;
	/* Every frame of this protocol is JSON: one bounded check here, before
	 * any handler (a transport's too) parses it. */
	static const te_json_limits frame_lim = TE_JSON_LIMITS_FRAME;
	char why[160];
	size_t lead = strspn(body, " \t\r\n");
	if (lead >= len || body[lead] != '{')
		snprintf(why, sizeof why, "the body is not a JSON object");
	if ((lead >= len || body[lead] != '{' ||
	     te_json_check(body, len, &frame_lim, why, sizeof why) < 0)) {
		te_warn_limited("rpc: %s frame from %s refused: %s; closing", rpc_kind_name(kind),
				job->peer, why);
		te_metric_count_rpc(e, kind, true);
		goto out;
	}
	if (kind == TE_RPC_PROBE || kind == TE_RPC_METADATA) {
		rc = handle_builtin(e, kind, body, len, &reply, &reply_len, job->peer);
	} else {
		g_rw_lock_reader_lock(&e->rpc_lock);
		te_rpc_handler_slot slot = e->handlers[kind];
		if (slot.fn == NULL) {
			g_rw_lock_reader_unlock(&e->rpc_lock);
			te_warn_limited("rpc: %s frame from %s but nothing handles it; closing",
					rpc_kind_name(kind), job->peer);
			te_metric_count_rpc(e, kind, true);
			goto out;
		}
		/* Held across the call: unregistering a handler waits for it. */
		rc = slot.fn(slot.user, job->peer, body, len, &reply, &reply_len);
		g_rw_lock_reader_unlock(&e->rpc_lock);
	}
	if (rc < 0 || reply == NULL) {
		te_warn_limited("rpc: %s request from %s refused: %s", rpc_kind_name(kind), job->peer,
				te_strerror(rc < 0 ? rc : -EINVAL));
		te_metric_count_rpc(e, kind, true);
		goto out;
	}
	te_metric_count_rpc(e, kind, false);
	rc = write_frame(job->fd, type, reply, reply_len, te_now_ms() + SERVER_FRAME_TIMEOUT_MS);
	if (rc < 0) {
		te_dbg("rpc: reply to %s failed: %s", job->peer, te_strerror(rc));
		goto out;
	}
	/* Wait for the peer's close so it surely read the reply. */
	linger_close(job->fd);
out:
	g_free(body);
	free(reply);
	g_mutex_lock(&s->lock);
	g_hash_table_remove(s->active, GINT_TO_POINTER(job->fd));
	peer_count(s, job->host, -1);
	g_mutex_unlock(&s->lock);
	close(job->fd);
	g_free(job);
}

/* A warning about refused connections at most once a second: a flood of
 * them must not become a flood of log lines. s->lock held. */
static void warn_full(te_rpc_server *s, const char *why, const char *peer)
{
	int64_t now = te_now_ms();
	if (now - s->last_full_warn < 1000)
		return;
	s->last_full_warn = now;
	te_warn("rpc: %s; closing connections (%s and maybe others)", why, peer);
}

/* Accepts what is waiting; each new connection becomes pending. */
static void accept_some(te_rpc_server *s, pending *pend, size_t *npend)
{
	for (int k = 0; k < 64; k++) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof ss;
		int fd = accept4(s->fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) {
			if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED)
				te_warn("rpc: accept failed: %s", g_strerror(errno));
			if (errno == EMFILE || errno == ENFILE)
				g_usleep(10000);
			return;
		}
		pending p = { .fd = fd, .deadline = te_now_ms() + SERVER_FRAME_TIMEOUT_MS };
		teu_sockaddr_name((const struct sockaddr *)&ss, p.peer, sizeof p.peer);
		teu_hostport_host(p.peer, p.host, sizeof p.host);
		g_mutex_lock(&s->lock);
		bool ok = !s->stopping && *npend < MAX_PENDING;
		if (!ok)
			warn_full(s, "too many connections waiting for their first frame", p.peer);
		else if (peer_count(s, p.host, +1) > s->max_per_peer) {
			peer_count(s, p.host, -1);
			warn_full(s, "too many connections from one address", p.peer);
			ok = false;
		}
		g_mutex_unlock(&s->lock);
		if (!ok) {
			close(fd);
			continue;
		}
		pend[(*npend)++] = p;
	}
}

static gpointer accept_loop(gpointer data)
{
	te_rpc_server *s = data;
	pending *pend = g_new(pending, MAX_PENDING);
	struct pollfd *pf = g_new(struct pollfd, MAX_PENDING + 2);
	size_t npend = 0;

	for (;;) {
		/* Asleep until a connection or the stop: only a pending connection's
		 * deadline needs a timer (an idle engine wakes for nothing). */
		int64_t now = te_now_ms(), next = INT64_MAX;
		pf[0] = (struct pollfd){ .fd = s->fd, .events = POLLIN };
		pf[1] = (struct pollfd){ .fd = s->wake_fd, .events = POLLIN };
		for (size_t i = 0; i < npend; i++) {
			pf[2 + i] = (struct pollfd){ .fd = pend[i].fd, .events = POLLIN };
			if (pend[i].deadline < next)
				next = pend[i].deadline;
		}
		int n = poll(pf, 2 + npend, next == INT64_MAX ? -1 : next > now ? (int)MIN(next - now, 60000) : 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			te_err("rpc: poll failed: %s", g_strerror(errno));
			break;
		}
		if (pf[1].revents)
			break;
		/* Pending connections that spoke go to a worker; silent ones time out. */
		now = te_now_ms();
		size_t keep = 0;
		for (size_t i = 0; i < npend; i++) {
			pending *p = &pend[i];
			if (pf[2 + i].revents) {
				conn_job *job = g_new0(conn_job, 1);
				job->fd = p->fd;
				memcpy(job->peer, p->peer, sizeof job->peer);
				memcpy(job->host, p->host, sizeof job->host);
				g_mutex_lock(&s->lock);
				g_hash_table_add(s->active, GINT_TO_POINTER(p->fd));
				g_mutex_unlock(&s->lock);
				g_thread_pool_push(s->workers, job, NULL);
			} else if (now >= p->deadline) {
				te_dbg("rpc: %s sent nothing for %d ms; closed", p->peer, SERVER_FRAME_TIMEOUT_MS);
				g_mutex_lock(&s->lock);
				peer_count(s, p->host, -1);
				g_mutex_unlock(&s->lock);
				close(p->fd);
			} else {
				pend[keep++] = *p;
			}
		}
		npend = keep;
		if (pf[0].revents & POLLIN)
			accept_some(s, pend, &npend);
	}
	for (size_t i = 0; i < npend; i++)
		close(pend[i].fd);
	g_free(pend);
	g_free(pf);
	return NULL;
}

/* Where the RPC socket listens: every interface, or the one address of
 * TE_BIND_ADDRESS (engine option or environment). */
typedef struct bind_addr {
	int family; /* 0: every interface, dual stack where possible */
	struct in_addr v4;
	struct in6_addr v6;
} bind_addr;

static int bind_port(int fd, const bind_addr *ba, int family, int port)
{
	int rc;

	if (family == AF_INET6) {
		struct sockaddr_in6 a = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port),
					  .sin6_addr = IN6ADDR_ANY_INIT };
		if (ba->family == AF_INET6)
			a.sin6_addr = ba->v6;
		rc = bind(fd, (struct sockaddr *)&a, sizeof a);
	} else {
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
		a.sin_addr.s_addr = ba->family == AF_INET ? ba->v4.s_addr : htonl(INADDR_ANY);
		rc = bind(fd, (struct sockaddr *)&a, sizeof a);
	}
	return rc == 0 ? 0 : -errno;
}

/* A listening socket for both IPv6 and IPv4 peers (these arrive as mapped
 * addresses), or IPv4 only where the kernel has no IPv6; or one of the bind
 * address's family. */
static int listen_socket(const bind_addr *ba, int *family)
{
	int one = 1, zero = 0, fd;

	if (ba->family != 0) {
		*family = ba->family;
		fd = socket(ba->family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	} else {
		*family = AF_INET6;
		fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd >= 0 && setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) < 0) {
			close(fd);
			fd = -1;
		}
		if (fd < 0) {
			*family = AF_INET;
			fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		}
	}
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	return fd;
}

/* TE_BIND_ADDRESS: a numeric IPv4 or IPv6 address, or unset / empty for every
 * interface. */
static int parse_bind_address(te_engine *e, bind_addr *ba)
{
	const char *v = te_engine_option(e, "TE_BIND_ADDRESS");

	memset(ba, 0, sizeof *ba);
	if (v == NULL)
		v = te_env2("TE_BIND_ADDRESS", NULL);
	if (v == NULL || *v == '\0')
		return 0;
	if (inet_pton(AF_INET, v, &ba->v4) == 1) {
		ba->family = AF_INET;
		return 0;
	}
	char tmp[INET6_ADDRSTRLEN + 2];
	size_t n = strlen(v);
	if (n >= 2 && n < sizeof tmp && v[0] == '[' && v[n - 1] == ']') { /* [v6] */
		memcpy(tmp, v + 1, n - 2);
		tmp[n - 2] = '\0';
		v = tmp;
	}
	if (inet_pton(AF_INET6, v, &ba->v6) == 1) {
		ba->family = AF_INET6;
		return 0;
	}
	te_err("TE_BIND_ADDRESS '%s' is not a numeric IPv4 or IPv6 address", v);
	return -EINVAL;
}

static const char *rpc_port_env(const char *te_name, const char *mc_name, const char *mc_old)
{
	const char *v = te_env2(te_name, mc_name);

	return v != NULL ? v : te_env2(NULL, mc_old);
}

int te_rpc_server_start(te_engine *e, int port_wanted, int *port_out, te_rpc_server **out)
{
	te_rpc_server *s;
	int fd, family, rc = -EADDRINUSE;
	uint64_t lo = 15000, hi = 17000, backlog = 128;
	const char *v;

	bind_addr ba;

	*out = NULL;
	rc = parse_bind_address(e, &ba);
	if (rc < 0)
		return rc;
	rc = -EADDRINUSE;
	fd = listen_socket(&ba, &family);
	if (fd < 0)
		return fd;
	/* Mooncake reads MC_{MIN,MAX}_RPC_PORT and, only when unset, its older
	 * misspelt MC_{MIN,MAX}_PRC_PORT. */
	if ((v = rpc_port_env("TE_MIN_RPC_PORT", "MC_MIN_RPC_PORT", "MC_MIN_PRC_PORT")) &&
	    (!te_parse_u64(v, &lo) || lo > 65535))
		lo = 15000;
	if ((v = rpc_port_env("TE_MAX_RPC_PORT", "MC_MAX_RPC_PORT", "MC_MAX_PRC_PORT")) &&
	    (!te_parse_u64(v, &hi) || hi > 65535))
		hi = 17000;
	if (hi < lo)
		hi = lo;
	if ((v = te_env2("TE_HANDSHAKE_LISTEN_BACKLOG", "MC_HANDSHAKE_LISTEN_BACKLOG")) &&
	    (!te_parse_u64(v, &backlog) || backlog == 0 || backlog > 65535))
		backlog = 128;

	if (port_wanted > 0) {
		rc = bind_port(fd, &ba, family, port_wanted);
		if (rc == 0)
			*port_out = port_wanted;
	} else {
		uint64_t span = hi - lo + 1;
		uint64_t start = (uint64_t)g_random_int_range(0, (gint32)span);
		for (uint64_t i = 0; i < span && rc < 0; i++) {
			int p = (int)(lo + (start + i) % span);
			rc = bind_port(fd, &ba, family, p);
			if (rc == 0)
				*port_out = p;
			else if (rc != -EADDRINUSE)
				break;
		}
	}
	if (rc < 0) {
		te_err("rpc: cannot bind port %s%d: %s", port_wanted > 0 ? "" : "in range from ",
		       port_wanted > 0 ? port_wanted : (int)lo, te_strerror(rc));
		close(fd);
		return rc;
	}
	if (listen(fd, (int)backlog) < 0) {
		rc = -errno;
		close(fd);
		return rc;
	}
	s = g_new0(te_rpc_server, 1);
	s->engine = e;
	s->fd = fd;
	s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	g_mutex_init(&s->lock);
	s->active = g_hash_table_new(g_direct_hash, g_direct_equal);
	s->per_peer = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
	uint64_t cap = MAX_PER_PEER;
	if ((v = te_env2("TE_RPC_MAX_PER_PEER", NULL)) && (!te_parse_u64(v, &cap) || cap == 0 || cap > MAX_PENDING)) {
		te_warn("TE_RPC_MAX_PER_PEER=%s is outside [1, %d]; using %d", v, MAX_PENDING, MAX_PER_PEER);
		cap = MAX_PER_PEER;
	}
	s->max_per_peer = (int)cap;
	s->workers = g_thread_pool_new(serve_conn, s, 16, FALSE, NULL);
	s->thread = g_thread_new("te-rpc", accept_loop, s);
	*out = s;
	return 0;
}

static void shut_active(gpointer key, gpointer value, gpointer user)
{
	(void)value;
	(void)user;
	shutdown(GPOINTER_TO_INT(key), SHUT_RDWR);
}

void te_rpc_server_stop(te_rpc_server *s)
{
	uint64_t one = 1;

	if (s == NULL)
		return;
	g_mutex_lock(&s->lock);
	s->stopping = true;
	g_mutex_unlock(&s->lock);
	if (write(s->wake_fd, &one, sizeof one) < 0)
		te_warn("rpc: cannot wake the accept thread: %s", g_strerror(errno));
	g_thread_join(s->thread);
	close(s->fd);
	/* Connections in progress end quickly once their sockets are shut. */
	g_mutex_lock(&s->lock);
	g_hash_table_foreach(s->active, shut_active, NULL);
	g_mutex_unlock(&s->lock);
	g_thread_pool_free(s->workers, FALSE, TRUE);
	close(s->wake_fd);
	g_hash_table_unref(s->active);
	g_hash_table_unref(s->per_peer);
	g_mutex_clear(&s->lock);
	g_free(s);
}

/* ---------------------------------------------------------------- client */

static int connect_to(const char *host, int port, int64_t deadline, int *out)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res = NULL;
	char ps[16];
	int rc, last = -ECONNREFUSED;

	snprintf(ps, sizeof ps, "%d", port);
	rc = getaddrinfo(host, ps, &hints, &res);
	if (rc != 0) {
		te_warn("rpc: cannot resolve '%s': %s", host, gai_strerror(rc));
		return -EHOSTUNREACH;
	}
	for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
		if (fd < 0) {
			last = -errno;
			continue;
		}
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) {
			last = -errno;
			close(fd);
			continue;
		}
		rc = te_fd_wait(fd, POLLOUT, deadline);
		if (rc == 0) {
			int err = 0;
			socklen_t el = sizeof err;
			getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
			rc = err ? -err : 0;
		}
		if (rc == 0) {
			int one = 1;
			setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
			freeaddrinfo(res);
			*out = fd;
			return 0;
		}
		last = rc;
		close(fd);
	}
	freeaddrinfo(res);
	return last;
}

int te_rpc_call_addr(const te_auth *auth, const char *host, int port, int type, const char *body,
		     size_t len, char **reply, size_t *reply_len, int timeout_ms)
{
	int fd = -1, rtype = 0, rc;
	char peer[TE_MAX_NAME + 16];

	*reply = NULL;
	*reply_len = 0;
	if (host == NULL || port <= 0 || port > 65535 || type < 0 || type > TE_RPC_PROBE)
		return -EINVAL;
	if (len + 1 > te_rpc_max_frame()) {
		te_err("rpc: a %zu-byte request exceeds the frame limit %zu", len, te_rpc_max_frame());
		return -EMSGSIZE;
	}
	snprintf(peer, sizeof peer, "%s:%d", host, port);
	/* Inside a call with a deadline (te_submit_by), no wait outlasts it. */
	int64_t cap = te_call_deadline != 0 ? te_call_deadline / 1000000 : INT64_MAX; /* te_now_ms() time */
	int64_t cdl = te_now_ms() + CONNECT_TIMEOUT_MS;
	rc = connect_to(host, port, cdl < cap ? cdl : cap, &fd);
	if (rc < 0) {
		te_dbg("rpc: connect to %s failed: %s", peer, te_strerror(rc));
		return rc;
	}
	int64_t deadline = te_now_ms() + (timeout_ms > 0 ? timeout_ms : CLIENT_RECV_TIMEOUT_MS);
	if (deadline > cap) {
		deadline = cap;
		int64_t left = cap - te_now_ms();
		timeout_ms = left < 1 ? 1 : left > INT32_MAX ? INT32_MAX : (int)left;
	}
	if (auth != NULL) {
		rc = te_auth_client(auth, fd, TE_AUTH_RPC, peer, timeout_ms);
		if (rc < 0) {
			close(fd);
			return rc;
		}
	}
	rc = write_frame(fd, type, body, len, deadline);
	if (rc == 0) {
		char *r = NULL;
		size_t rl = 0;
		rc = read_frame(fd, &rtype, &r, &rl, deadline, peer);
		if (rc == 0 && strcmp(r, TE_AUTH_REQUIRED_REPLY) == 0) {
			te_err("rpc: %s requires peer authentication and this engine has no key: set "
			       "TE_AUTH_KEY_FILE (or the engine option auth_key_file) to the cluster's key file",
			       peer);
			g_free(r);
			rc = TE_ERR_AUTH;
		} else if (rc == 0 && rtype != type) {
			te_warn("rpc: %s answered a type %d frame with type %d", peer, type, rtype);
			g_free(r);
			rc = TE_ERR_PROTOCOL;
		} else if (rc == 0) {
			*reply = malloc(rl + 1);
			if (*reply == NULL) {
				rc = -ENOMEM;
			} else {
				memcpy(*reply, r, rl + 1);
				*reply_len = rl;
			}
			g_free(r);
		}
	}
	close(fd);
	if (rc < 0)
		te_dbg("rpc: exchange with %s failed: %s", peer, te_strerror(rc));
	return rc;
}
