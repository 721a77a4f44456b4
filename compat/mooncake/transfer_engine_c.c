/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libtransfer_engine: Mooncake's C API (transfer_engine_c.h) as a thin layer
 * over libte's public API. Every call checks its arguments, turns Mooncake's
 * types into te.h's and libte's error codes into Mooncake's (one table,
 * below). The only state of its own is what te.h has no place for: the
 * batches an engine allocated (for capacity checks, finding the first refused
 * request of a submit, and waiting at a graceful shutdown) and the handles
 * installTransport() returns.
 */
#include "transfer_engine_c.h"

#include <te/te-json.h>
#include <te/te.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The library is built with hidden visibility; only the Mooncake API leaves
 * it (the linker version script says the same). */
#define MC_API __attribute__((visibility("default")))

/* ----------------------------------------------------------------- logging */

/* Through libte's log (its level and handler), under the domain "mooncake". */
static void mc_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void mc_log(int level, const char *fmt, ...)
{
	char line[512];
	va_list ap;

	if (level > te_get_log_level())
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	te_log_write(level, "mooncake", line);
}

#define mc_err(...) mc_log(TE_LOG_ERROR, __VA_ARGS__)
#define mc_warn(...) mc_log(TE_LOG_WARN, __VA_ARGS__)
#define mc_info(...) mc_log(TE_LOG_INFO, __VA_ARGS__)

/* ------------------------------------------------------------ error codes */

/*
 * libte's code -> Mooncake's negative error.h code and positive Status code.
 * Codes not listed map to invalid argument (and the caller logs libte's
 * name for them).
 */
static const struct mc_code_map {
	int te;
	int err;
	int status;
} code_map[] = {
	{ -EINVAL, ERR_INVALID_ARGUMENT, MC_STATUS_CODE_INVALID_ARGUMENT },
	{ TE_ERR_SEGMENT, ERR_INVALID_ARGUMENT, MC_STATUS_CODE_INVALID_ARGUMENT },
	{ TE_ERR_BATCH, ERR_INVALID_ARGUMENT, MC_STATUS_CODE_INVALID_ARGUMENT },
	{ -ENOENT, ERR_INVALID_ARGUMENT, MC_STATUS_CODE_INVALID_ARGUMENT },
	{ -EEXIST, ERR_INVALID_ARGUMENT, MC_STATUS_CODE_INVALID_ARGUMENT },
	{ -ENAMETOOLONG, ERR_INVALID_ARGUMENT, MC_STATUS_CODE_INVALID_ARGUMENT },
	{ -EMSGSIZE, ERR_INVALID_ARGUMENT, MC_STATUS_CODE_INVALID_ARGUMENT },
	{ -ERANGE, ERR_INVALID_ARGUMENT, MC_STATUS_CODE_INVALID_ARGUMENT },
	{ -EPROTONOSUPPORT, ERR_INVALID_ARGUMENT, MC_STATUS_CODE_INVALID_ARGUMENT },
	{ TE_ERR_BATCH_FULL, ERR_TOO_MANY_REQUESTS, MC_STATUS_CODE_TOO_MANY_REQUESTS },
	{ -ENOSPC, ERR_TOO_MANY_REQUESTS, MC_STATUS_CODE_TOO_MANY_REQUESTS },
	{ TE_ERR_ADDRESS, ERR_ADDRESS_NOT_REGISTERED, MC_STATUS_CODE_ADDRESS_NOT_REGISTERED },
	{ -EBUSY, ERR_BATCH_BUSY, MC_STATUS_CODE_BATCH_BUSY },
	/* error.h has no "not supported transport": a missing transport is a
	 * device not found there, as Mooncake's RDMA paths report it. */
	{ TE_ERR_NO_TRANSPORT, ERR_DEVICE_NOT_FOUND, MC_STATUS_CODE_NOT_SUPPORTED_TRANSPORT },
	{ TE_ERR_PLUGIN, ERR_DEVICE_NOT_FOUND, MC_STATUS_CODE_DEVICE_NOT_FOUND },
	{ TE_ERR_OVERLAP, ERR_ADDRESS_OVERLAPPED, MC_STATUS_CODE_ADDRESS_OVERLAPPED },
	{ -ECONNREFUSED, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -ECONNRESET, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -ECONNABORTED, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -EHOSTUNREACH, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -EHOSTDOWN, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -ENETUNREACH, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -ENETDOWN, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -ENOTCONN, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -EPIPE, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -ETIMEDOUT, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -EADDRINUSE, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -EADDRNOTAVAIL, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -EIO, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ TE_ERR_PROTOCOL, ERR_MALFORMED_JSON, MC_STATUS_CODE_MALFORMED_JSON },
	{ TE_ERR_REJECTED, ERR_REJECT_HANDSHAKE, MC_STATUS_CODE_REJECT_HANDSHAKE },
	{ TE_ERR_METADATA, ERR_METADATA, MC_STATUS_CODE_METADATA },
	/* the engine is going away or the work was called off */
	{ -ESHUTDOWN, ERR_CONTEXT, MC_STATUS_CODE_CONTEXT },
	{ -ECANCELED, ERR_CONTEXT, MC_STATUS_CODE_CONTEXT },
	{ -ENOMEM, ERR_MEMORY, MC_STATUS_CODE_MEMORY },
	{ -ENOTSUP, ERR_NOT_IMPLEMENTED, MC_STATUS_CODE_NOT_IMPLEMENTED },
};

static const struct mc_code_map *code_find(int te_rc)
{
	for (size_t i = 0; i < sizeof code_map / sizeof code_map[0]; i++)
		if (code_map[i].te == te_rc)
			return &code_map[i];
	return NULL;
}

/* libte error (< 0) -> Mooncake negative error; 0 and above pass through. */
static int to_err(const char *fn, int te_rc)
{
	const struct mc_code_map *m;

	if (te_rc >= 0)
		return te_rc;
	m = code_find(te_rc);
	if (m == NULL) {
		mc_err("%s: %s (libte error %d, reported as invalid argument)", fn,
		       te_strerror(te_rc), te_rc);
		return ERR_INVALID_ARGUMENT;
	}
	return m->err;
}

/* libte error (< 0) -> Mooncake positive Status code; 0 stays 0. */
static int to_status(const char *fn, int te_rc)
{
	const struct mc_code_map *m;

	if (te_rc >= 0)
		return MC_STATUS_CODE_OK;
	m = code_find(te_rc);
	if (m == NULL) {
		mc_err("%s: %s (libte error %d, reported as invalid argument)", fn,
		       te_strerror(te_rc), te_rc);
		return MC_STATUS_CODE_INVALID_ARGUMENT;
	}
	return m->status;
}

/* ----------------------------------------------------------------- engine */

#define MC_ENGINE_MAGIC 0x4d43454eu    /* "MCEN" */
#define MC_TRANSPORT_MAGIC 0x4d435452u /* "MCTR": a transport_t, never an engine */

/* A batch this engine allocated. Looked up under the engine's lock and kept
 * alive by `refs` while a call uses it, so freeBatchID() racing a submit on
 * another thread cannot free it under that submit. */
struct mc_batch {
	te_batch_id id;
	size_t capacity;
	size_t submitted;         /* tasks appended so far, under `submit_lock` */
	pthread_mutex_t submit_lock; /* serializes submits: the first refused task's
				      * id is known only if no other submit interleaves */
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
static struct mc_engine *engine_of(const char *fn, transfer_engine_t h)
{
	struct mc_engine *e = h;
	uint32_t magic;

	if (e == NULL) {
		mc_err("%s: NULL engine", fn);
		return NULL;
	}
	/* Both handle kinds start with a 32-bit magic: read it as bytes, not
	 * through an engine it may not be. */
	memcpy(&magic, h, sizeof magic);
	if (magic != MC_ENGINE_MAGIC) {
		mc_err("%s: %p is not an engine from createTransferEngine()", fn, h);
		return NULL;
	}
	return e;
}

/* Mixes the id so sequential or pointer-like ids spread over the buckets. */
static size_t batch_hash(te_batch_id id, size_t n_buckets)
{
	uint64_t z = id + 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return (size_t)((z ^ (z >> 31)) & (n_buckets - 1));
}

/* Doubles the table when it gets crowded; a failed allocation keeps the old
 * table (longer chains, still correct). Under the engine's lock. */
static void batches_grow(struct mc_engine *e)
{
	size_t n = e->n_buckets * 2;
	struct mc_batch **nb;

	if (e->n_batches <= e->n_buckets * 2)
		return;
	nb = calloc(n, sizeof *nb);
	if (nb == NULL)
		return;
	for (size_t i = 0; i < e->n_buckets; i++) {
		struct mc_batch *b = e->buckets[i], *next;
		for (; b != NULL; b = next) {
			size_t k = batch_hash(b->id, n);
			next = b->next;
			b->next = nb[k];
			nb[k] = b;
		}
	}
	free(e->buckets);
	e->buckets = nb;
	e->n_buckets = n;
}

/* Finds a live batch and takes a reference, or NULL. */
static struct mc_batch *batch_get(struct mc_engine *e, te_batch_id id)
{
	struct mc_batch *b;

	pthread_mutex_lock(&e->lock);
	for (b = e->buckets[batch_hash(id, e->n_buckets)]; b != NULL; b = b->next)
		if (b->id == id && !b->freed) {
			b->refs++;
			break;
		}
	pthread_mutex_unlock(&e->lock);
	return b;
}

static void batch_put(struct mc_engine *e, struct mc_batch *b)
{
	int last;

	pthread_mutex_lock(&e->lock);
	last = --b->refs == 0 && b->freed;
	pthread_mutex_unlock(&e->lock);
	if (last) {
		pthread_mutex_destroy(&b->submit_lock);
		free(b);
	}
}

/* Takes a freed batch out of the table (its memory goes with the last
 * reference). Under the engine's lock. */
static void batch_unlink(struct mc_engine *e, struct mc_batch *b)
{
	struct mc_batch **p = &e->buckets[batch_hash(b->id, e->n_buckets)];

	while (*p != NULL && *p != b)
		p = &(*p)->next;
	if (*p == b) {
		*p = b->next;
		e->n_batches--;
	}
	b->freed = 1;
}

/* "h", "h:p", "[v6]", "[v6]:p" or a bare IPv6 address -> host only (brackets
 * kept for IPv6, which libte accepts). Writes "" when it does not fit. */
static void host_part(const char *name, char *out, size_t size)
{
	const char *colon = strrchr(name, ':');
	size_t n;

	if (name[0] == '[') {
		const char *close = strchr(name, ']');
		n = close != NULL ? (size_t)(close - name) + 1 : strlen(name);
	} else if (colon != NULL && strchr(name, ':') == colon) {
		n = (size_t)(colon - name);
	} else {
		n = strlen(name); /* no port, or a bare IPv6 address */
	}
	if (n >= size)
		n = 0;
	memcpy(out, name, n);
	out[n] = '\0';
}

/* ------------------------------------------------------------ MC_TE_METRIC */

#define MC_METRIC_DEFAULT_INTERVAL 5u /* seconds, as Mooncake */

/* Mooncake's reading of MC_TE_METRIC: 1, true, yes or on, in any case. */
static int metric_enabled(void)
{
	static const char *const on[] = { "1", "true", "yes", "on" };
	const char *v = getenv("MC_TE_METRIC");
	char low[8];
	size_t n;

	if (v == NULL || (n = strlen(v)) >= sizeof low)
		return 0;
	for (size_t i = 0; i <= n; i++)
		low[i] = (char)(v[i] >= 'A' && v[i] <= 'Z' ? v[i] - 'A' + 'a' : v[i]);
	for (size_t i = 0; i < sizeof on / sizeof on[0]; i++)
		if (strcmp(low, on[i]) == 0)
			return 1;
	return 0;
}

/*
 * MC_TE_METRIC_INTERVAL_SECONDS as Mooncake reads it (std::stoi): leading
 * white space and a sign, then digits, the rest of the text ignored ("7s" is
 * 7). No digits or a value beyond an int is a parse failure, zero or less an
 * invalid value; both keep the default with a warning.
 */
static unsigned metric_interval(void)
{
	const char *v = getenv("MC_TE_METRIC_INTERVAL_SECONDS");
	char *end;
	long n;

	if (v == NULL)
		return MC_METRIC_DEFAULT_INTERVAL;
	errno = 0;
	n = strtol(v, &end, 10);
	if (end == v || errno == ERANGE || n > INT_MAX || n < INT_MIN) {
		mc_warn("Failed to parse MC_TE_METRIC_INTERVAL_SECONDS: %s, using default: %u", v,
			MC_METRIC_DEFAULT_INTERVAL);
		return MC_METRIC_DEFAULT_INTERVAL;
	}
	if (n <= 0) {
		mc_warn("Invalid MC_TE_METRIC_INTERVAL_SECONDS value: %s, must be positive. "
			"Using default: %u", v, MC_METRIC_DEFAULT_INTERVAL);
		return MC_METRIC_DEFAULT_INTERVAL;
	}
	mc_info("Metrics reporting interval set to %ld seconds", n);
	return (unsigned)n;
}

static double mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#define MC_MB (1024.0 * 1024.0)

/* One line per interval in which something moved or ended, in the form of
 * Mooncake's ("[Metrics] Transfer Engine Stats (over last 5s): Throughput:
 * 12.34 MB/s"), with the operations and task counts after it. */
static void metric_report(struct mc_engine *e, const te_stats *a, const te_stats *b, double secs)
{
	uint64_t rd = b->bytes[TE_OP_READ] - a->bytes[TE_OP_READ];
	uint64_t wr = b->bytes[TE_OP_WRITE] - a->bytes[TE_OP_WRITE];
	uint64_t done = 0, failed = 0;

	for (int op = 0; op < 2; op++) {
		done += b->completed[op] - a->completed[op];
		failed += b->failed[op] + b->canceled[op] - a->failed[op] - a->canceled[op];
	}
	if (rd + wr == 0 && done + failed == 0)
		return;
	if (secs <= 0)
		secs = e->metric_interval_s;
	mc_info("[Metrics] Transfer Engine Stats (over last %us): Throughput: %.2f MB/s | "
		"read: %.0f B/s, write: %.0f B/s | tasks: %llu completed, %llu failed or canceled",
		e->metric_interval_s, (double)(rd + wr) / secs / MC_MB, (double)rd / secs,
		(double)wr / secs, (unsigned long long)done, (unsigned long long)failed);
}

static void *metric_main(void *arg)
{
	struct mc_engine *e = arg;
	te_stats prev = { .size = sizeof prev }, cur = { .size = sizeof cur };
	double t_prev = mono_s();
	int rc = te_engine_stats(e->te, &prev);

	if (rc < 0) {
		mc_warn("MC_TE_METRIC: the engine counts nothing (%s); no throughput lines",
			te_strerror(rc));
		return NULL;
	}
	pthread_mutex_lock(&e->metric_lock);
	while (!e->metric_stop) {
		struct timespec until;

		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_sec += (time_t)e->metric_interval_s;
		/* Woken early only to stop: destroy never waits an interval. */
		while (!e->metric_stop &&
		       pthread_cond_timedwait(&e->metric_wake, &e->metric_lock, &until) != ETIMEDOUT)
			;
		if (e->metric_stop)
			break;
		pthread_mutex_unlock(&e->metric_lock);
		rc = te_engine_stats(e->te, &cur);
		double t = mono_s();
		if (rc == 0) {
			metric_report(e, &prev, &cur, t - t_prev);
			prev = cur;
			t_prev = t;
		}
		pthread_mutex_lock(&e->metric_lock);
	}
	pthread_mutex_unlock(&e->metric_lock);
	return NULL;
}

static void metric_start(struct mc_engine *e)
{
	pthread_condattr_t ca;

	if (!metric_enabled())
		return;
	e->metric_interval_s = metric_interval();
	pthread_mutex_init(&e->metric_lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&e->metric_wake, &ca);
	pthread_condattr_destroy(&ca);
	e->metric_stop = 0;
	if (pthread_create(&e->metric_thread, NULL, metric_main, e) != 0) {
		mc_warn("MC_TE_METRIC: cannot start the reporting thread; no throughput lines");
		pthread_cond_destroy(&e->metric_wake);
		pthread_mutex_destroy(&e->metric_lock);
		return;
	}
	e->metric_started = 1;
	if (te_get_log_level() < TE_LOG_INFO)
		mc_warn("MC_TE_METRIC: the throughput lines are logged at level info, below the "
			"current level (TE_LOG_LEVEL=info shows them)");
}

static void metric_stop(struct mc_engine *e)
{
	if (!e->metric_started)
		return;
	pthread_mutex_lock(&e->metric_lock);
	e->metric_stop = 1;
	pthread_cond_signal(&e->metric_wake);
	pthread_mutex_unlock(&e->metric_lock);
	pthread_join(e->metric_thread, NULL);
	pthread_cond_destroy(&e->metric_wake);
	pthread_mutex_destroy(&e->metric_lock);
	e->metric_started = 0;
}

MC_API transfer_engine_t createTransferEngine(const char *metadata_conn_string,
					      const char *local_server_name,
					      const char *ip_or_host_name, uint64_t rpc_port,
					      int auto_discover)
{
	static const char fn[] = "createTransferEngine";
	te_option opts[3];
	size_t n_opts = 0;
	char host[256], port[24];
	const char *name = local_server_name;
	struct mc_engine *e;
	int rc;

	if (metadata_conn_string == NULL || *metadata_conn_string == '\0') {
		mc_err("%s: empty metadata connection string (\"P2PHANDSHAKE\" means none)", fn);
		return NULL;
	}
	if (name != NULL && *name == '\0')
		name = NULL;
	if (strcmp(metadata_conn_string, "P2PHANDSHAKE") == 0) {
		/* Mooncake keeps only the host and binds a free port, so that
		 * several engines made with the same arguments can coexist. */
		const char *src = name != NULL ? name : ip_or_host_name;
		if (src != NULL && *src != '\0') {
			host_part(src, host, sizeof host);
			if (host[0] == '\0') {
				mc_err("%s: local server name '%s' has no usable host part", fn, src);
				return NULL;
			}
			name = host;
		}
	} else {
		if (ip_or_host_name != NULL && *ip_or_host_name != '\0')
			opts[n_opts++] = (te_option){ "ip_or_host_name", ip_or_host_name };
		if (rpc_port != 0) {
			if (rpc_port > 65535) {
				mc_err("%s: rpc_port %llu is not a port number", fn,
				       (unsigned long long)rpc_port);
				return NULL;
			}
			snprintf(port, sizeof port, "%llu", (unsigned long long)rpc_port);
			opts[n_opts++] = (te_option){ "rpc_port", port };
		}
	}
	if (auto_discover)
		opts[n_opts++] = (te_option){ "auto_discovery", "1" };

	e = calloc(1, sizeof *e);
	if (e == NULL) {
		mc_err("%s: out of memory", fn);
		return NULL;
	}
	e->n_buckets = 64;
	e->buckets = calloc(e->n_buckets, sizeof *e->buckets);
	if (e->buckets == NULL) {
		free(e);
		mc_err("%s: out of memory", fn);
		return NULL;
	}
	rc = te_engine_create(metadata_conn_string, name, opts, n_opts, &e->te);
	if (rc < 0) {
		mc_err("%s: cannot create an engine for '%s' with %s: %s", fn,
		       name != NULL ? name : "(host name)", metadata_conn_string, te_strerror(rc));
		free(e->buckets);
		free(e);
		return NULL;
	}
	pthread_mutex_init(&e->lock, NULL);
	atomic_init(&e->graceful, 0);
	metric_start(e);
	e->magic = MC_ENGINE_MAGIC;
	return e;
}

MC_API void enableGracefulShutdown(transfer_engine_t engine)
{
	struct mc_engine *e = engine_of("enableGracefulShutdown", engine);

	if (e != NULL)
		atomic_store(&e->graceful, 1);
}

MC_API void destroyTransferEngine(transfer_engine_t engine)
{
	struct mc_engine *e;

	if (engine == NULL)
		return;
	e = engine_of("destroyTransferEngine", engine);
	if (e == NULL)
		return;
	if (atomic_load(&e->graceful)) {
		/* Nothing else may use the engine now, so the table is stable. */
		for (size_t i = 0; i < e->n_buckets; i++)
			for (struct mc_batch *b = e->buckets[i]; b != NULL; b = b->next) {
				int rc = te_batch_wait(e->te, b->id, -1);
				if (rc < 0)
					mc_warn("destroyTransferEngine: waiting for batch %llu: %s",
						(unsigned long long)b->id, te_strerror(rc));
			}
	}
	metric_stop(e);
	te_engine_destroy(e->te);
	for (size_t i = 0; i < e->n_buckets; i++) {
		struct mc_batch *b = e->buckets[i], *next;
		for (; b != NULL; b = next) {
			next = b->next;
			pthread_mutex_destroy(&b->submit_lock);
			free(b);
		}
	}
	free(e->buckets);
	for (struct mc_transport *t = e->transports, *next; t != NULL; t = next) {
		next = t->next;
		t->magic = 0;
		free(t);
	}
	pthread_mutex_destroy(&e->lock);
	e->magic = 0; /* a later call with this pointer is the caller's bug */
	free(e);
}

MC_API int getLocalIpAndPort(transfer_engine_t engine, char *buf_out, size_t buf_len)
{
	struct mc_engine *e = engine_of("getLocalIpAndPort", engine);
	const char *addr;

	if (e == NULL)
		return ERR_INVALID_ARGUMENT;
	if (buf_out == NULL || buf_len == 0) {
		mc_err("getLocalIpAndPort: NULL or empty output buffer");
		return ERR_INVALID_ARGUMENT;
	}
	addr = te_engine_address(e->te);
	if (addr == NULL)
		addr = "";
	/* brackets make an IPv6 address parse back as host:port */
	if (strchr(addr, ':') != NULL && addr[0] != '[')
		snprintf(buf_out, buf_len, "[%s]:%d", addr, te_engine_rpc_port(e->te));
	else
		snprintf(buf_out, buf_len, "%s:%d", addr, te_engine_rpc_port(e->te));
	return 0;
}

MC_API int discoverTopology(transfer_engine_t engine)
{
	return engine_of("discoverTopology", engine) != NULL ? 0 : ERR_INVALID_ARGUMENT;
}

MC_API int warmupEfaSegment(transfer_engine_t engine, const char *segment_name)
{
	(void)segment_name;
	return engine_of("warmupEfaSegment", engine) != NULL ? 0 : ERR_INVALID_ARGUMENT;
}

/* -------------------------------------------------------------- transports */

MC_API transport_t installTransport(transfer_engine_t engine, const char *proto, void **args)
{
	static const char fn[] = "installTransport";
	struct mc_engine *e = engine_of(fn, engine);
	const char *json = NULL;
	struct mc_transport *t;
	size_t len;
	int rc;

	if (e == NULL)
		return NULL;
	if (proto == NULL || *proto == '\0') {
		mc_err("%s: empty transport name", fn);
		return NULL;
	}
	if (args != NULL && args[0] != NULL) {
		if (strcmp(proto, "rdma") == 0)
			json = args[0]; /* the NIC priority matrix */
		else
			mc_info("%s: arguments for '%s' ignored (only rdma takes one)", fn, proto);
	}
	rc = te_transport_install(e->te, proto, json);
	if (rc < 0 && rc != -EEXIST) {
		mc_err("%s: cannot install '%s': %s", fn, proto, te_strerror(rc));
		return NULL;
	}
	if (rc == 0) {
		/* libte routes an open segment by the transports present when its
		 * descriptor was fetched; Mooncake picks the transport at submit
		 * time. Re-fetching makes segments left without a transport (by
		 * an uninstall) usable again, as they are in Mooncake. */
		int r = te_segment_refresh_all(e->te);
		if (r < 0)
			mc_warn("%s: '%s' installed, but refreshing open segments failed: %s", fn,
				proto, te_strerror(r));
	}
	pthread_mutex_lock(&e->lock);
	for (t = e->transports; t != NULL; t = t->next)
		if (strcmp(t->name, proto) == 0)
			break;
	if (t == NULL) {
		len = strlen(proto);
		t = malloc(sizeof *t + len + 1);
		if (t != NULL) {
			t->magic = MC_TRANSPORT_MAGIC;
			memcpy(t->name, proto, len + 1);
			t->next = e->transports;
			e->transports = t;
		}
	}
	pthread_mutex_unlock(&e->lock);
	if (t == NULL)
		mc_err("%s: out of memory for the handle of '%s' (it is installed)", fn, proto);
	return t;
}

MC_API int uninstallTransport(transfer_engine_t engine, const char *proto)
{
	static const char fn[] = "uninstallTransport";
	struct mc_engine *e = engine_of(fn, engine);
	const char *names[32];
	int n, rc;

	if (e == NULL)
		return ERR_INVALID_ARGUMENT;
	if (proto == NULL || *proto == '\0') {
		mc_err("%s: empty transport name", fn);
		return ERR_INVALID_ARGUMENT;
	}
	/* Not installed: nothing to do, and Mooncake answers 0 here. */
	n = te_transport_list(e->te, names, sizeof names / sizeof names[0]);
	for (int i = 0; i < n && i < (int)(sizeof names / sizeof names[0]); i++)
		if (strcmp(names[i], proto) == 0) {
			rc = te_transport_uninstall(e->te, proto);
			if (rc < 0)
				mc_err("%s: '%s': %s", fn, proto, te_strerror(rc));
			return rc == -ENOENT ? 0 : to_err(fn, rc);
		}
	mc_info("%s: '%s' is not installed", fn, proto);
	return 0;
}

/* JSON string literal of `s` appended at `*pos` in buf (snprintf-like: *pos
 * counts what would have been written). */
static void put_json_string(char *buf, size_t size, size_t *pos, const char *s)
{
	char tmp[8];

#define PUT(str)                                                                \
	do {                                                                        \
		size_t _l = strlen(str);                                                \
		if (*pos < size)                                                        \
			memcpy(buf + *pos, str, _l < size - *pos ? _l : size - *pos);       \
		*pos += _l;                                                             \
	} while (0)
	PUT("\"");
	for (; *s != '\0'; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\') {
			tmp[0] = '\\';
			tmp[1] = (char)c;
			tmp[2] = '\0';
		} else if (c == '\n') {
			strcpy(tmp, "\\n");
		} else if (c == '\t') {
			strcpy(tmp, "\\t");
		} else if (c < 0x20) {
			snprintf(tmp, sizeof tmp, "\\u%04x", c);
		} else {
			tmp[0] = (char)c;
			tmp[1] = '\0';
		}
		PUT(tmp);
	}
	PUT("\"");
}

static void put_text(char *buf, size_t size, size_t *pos, const char *s)
{
	PUT(s);
#undef PUT
}

MC_API int showLinks(transfer_engine_t engine, char *buf_out, size_t buf_len, int json)
{
	static const char fn[] = "showLinks";
	struct mc_engine *e = engine_of(fn, engine);
	const char *names[32];
	size_t pos = 0;
	char line[64];
	int n;

	if (e == NULL)
		return ERR_INVALID_ARGUMENT;
	if (buf_out == NULL || buf_len == 0) {
		mc_err("%s: NULL or empty output buffer", fn);
		return ERR_INVALID_ARGUMENT;
	}
	n = te_transport_list(e->te, names, sizeof names / sizeof names[0]);
	if (n > (int)(sizeof names / sizeof names[0]))
		n = (int)(sizeof names / sizeof names[0]);
	if (json) {
		put_text(buf_out, buf_len, &pos, "{\"segment\":");
		put_json_string(buf_out, buf_len, &pos, te_engine_name(e->te));
		put_text(buf_out, buf_len, &pos, ",\"address\":");
		put_json_string(buf_out, buf_len, &pos, te_engine_address(e->te));
		snprintf(line, sizeof line, ",\"rpc_port\":%d,\"transports\":[", te_engine_rpc_port(e->te));
		put_text(buf_out, buf_len, &pos, line);
	} else {
		put_text(buf_out, buf_len, &pos, "segment ");
		put_text(buf_out, buf_len, &pos, te_engine_name(e->te));
		put_text(buf_out, buf_len, &pos, ", address ");
		put_text(buf_out, buf_len, &pos, te_engine_address(e->te));
		snprintf(line, sizeof line, ", rpc port %d\n", te_engine_rpc_port(e->te));
		put_text(buf_out, buf_len, &pos, line);
	}
	for (int i = 0; i < n; i++) {
		char *report = NULL;
		int rc = te_plugin_report(names[i], &report);
		const char *r = rc == 0 && report != NULL ? report : te_strerror(rc);
		if (json) {
			put_text(buf_out, buf_len, &pos, i > 0 ? ",{\"name\":" : "{\"name\":");
			put_json_string(buf_out, buf_len, &pos, names[i]);
			put_text(buf_out, buf_len, &pos, ",\"report\":");
			put_json_string(buf_out, buf_len, &pos, r);
			put_text(buf_out, buf_len, &pos, "}");
		} else {
			put_text(buf_out, buf_len, &pos, "transport ");
			put_text(buf_out, buf_len, &pos, names[i]);
			put_text(buf_out, buf_len, &pos, ":\n");
			put_text(buf_out, buf_len, &pos, r);
			if (*r != '\0' && r[strlen(r) - 1] != '\n')
				put_text(buf_out, buf_len, &pos, "\n");
		}
		te_free(report);
	}
	if (json)
		put_text(buf_out, buf_len, &pos, "]}");
	buf_out[pos < buf_len ? pos : buf_len - 1] = '\0';
	return 0;
}

/* ---------------------------------------------------------------- NIC load */

/*
 * A walk over the "devices" of te_engine_stats_json(). The text is libte's,
 * and te_json_check() has accepted it, so it is well-formed within bounded
 * depth; the walk still stops at the terminating NUL whatever it finds.
 */
static const char *js_ws(const char *p)
{
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
		p++;
	return p;
}

/* Copies the string at `p` (its opening quote) into `out`, cut to fit;
 * escapes other than \" \\ \/ become '?' (device names are plain ASCII).
 * Returns what follows the closing quote. */
static const char *js_string(const char *p, char *out, size_t size)
{
	size_t n = 0;

	for (p++; *p != '\0' && *p != '"'; p++) {
		char c = *p;
		if (c == '\\' && p[1] != '\0') {
			c = *++p;
			if (c != '"' && c != '\\' && c != '/')
				c = '?';
			if (*p == 'u')
				for (int i = 0; i < 4 && p[1] != '\0'; i++)
					p++;
		}
		if (n + 1 < size)
			out[n++] = c;
	}
	if (size > 0)
		out[n] = '\0';
	return *p == '"' ? p + 1 : p;
}

/* Skips one value of any kind. */
static const char *js_skip(const char *p)
{
	size_t depth = 0;

	p = js_ws(p);
	do {
		if (*p == '\0')
			break;
		if (*p == '"') {
			p = js_string(p, NULL, 0);
		} else if (*p == '{' || *p == '[') {
			depth++;
			p++;
		} else if (*p == '}' || *p == ']') {
			if (depth == 0)
				break; /* the end of the container holding the value */
			depth--;
			p++;
		} else if (depth == 0) {
			while (*p != '\0' && strchr(",}] \t\r\n", *p) == NULL)
				p++;
		} else {
			p++;
		}
	} while (depth > 0);
	return p;
}

/* A JSON number, read without strtod() so the program's LC_NUMERIC cannot
 * change what "1.5" means. */
static const char *js_number(const char *p, double *out)
{
	double v = 0, scale = 1;
	int neg = *p == '-', ex = 0, ex_neg = 0;

	if (neg)
		p++;
	for (; *p >= '0' && *p <= '9'; p++)
		v = v * 10 + (*p - '0');
	if (*p == '.')
		for (p++; *p >= '0' && *p <= '9'; p++) {
			scale /= 10;
			v += (*p - '0') * scale;
		}
	if (*p == 'e' || *p == 'E') {
		p++;
		if (*p == '+' || *p == '-')
			ex_neg = *p++ == '-';
		for (; *p >= '0' && *p <= '9'; p++)
			if (ex < 400)
				ex = ex * 10 + (*p - '0');
		for (; ex > 0; ex--)
			v = ex_neg ? v / 10 : v * 10;
	}
	*out = neg ? -v : v;
	return p;
}

static uint64_t to_u64(double v)
{
	if (!(v > 0))
		return 0;
	return v >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)v;
}

/* Reads one device object at `p` (its '{') into `out`. */
static const char *js_device(const char *p, nic_load_stat_t *out)
{
	memset(out, 0, sizeof *out);
	for (p = js_ws(p + 1); *p == '"'; p = js_ws(p)) {
		char key[32];
		double v;

		p = js_ws(js_string(p, key, sizeof key));
		if (*p == ':')
			p = js_ws(p + 1);
		if (strcmp(key, "device") == 0 && *p == '"') {
			p = js_string(p, out->device_name, sizeof out->device_name);
		} else if (strcmp(key, "in_flight_bytes") == 0 && (*p == '-' || (*p >= '0' && *p <= '9'))) {
			p = js_number(p, &v);
			out->inflight_bytes = to_u64(v);
		} else if (strcmp(key, "bandwidth_bytes_per_second") == 0 &&
			   (*p == '-' || (*p >= '0' && *p <= '9'))) {
			p = js_number(p, &v);
			out->ewma_bandwidth_bps = v > 0 ? v : 0;
		} else {
			p = js_skip(p);
		}
		p = js_ws(p);
		if (*p == ',')
			p = js_ws(p + 1);
	}
	return *p == '}' ? p + 1 : p;
}

/* Fills up to `cap` entries from the "devices" array; returns how many
 * devices it lists. */
static size_t devices_from_json(const char *json, nic_load_stat_t *stats, size_t cap)
{
	const char *p = js_ws(json);
	size_t n = 0;

	if (*p != '{')
		return 0;
	for (p = js_ws(p + 1); *p == '"'; p = js_ws(p)) {
		char key[32];

		p = js_ws(js_string(p, key, sizeof key));
		if (*p == ':')
			p = js_ws(p + 1);
		if (strcmp(key, "devices") == 0 && *p == '[') {
			for (p = js_ws(p + 1); *p == '{'; p = js_ws(p)) {
				nic_load_stat_t d;
				p = js_device(p, &d);
				if (n < cap)
					stats[n] = d;
				n++;
				p = js_ws(p);
				if (*p == ',')
					p = js_ws(p + 1);
			}
			return n;
		}
		p = js_ws(js_skip(p));
		if (*p == ',')
			p = js_ws(p + 1);
	}
	return n;
}

MC_API int getNicLoadStats(transfer_engine_t engine, nic_load_stat_t *stats, size_t *count)
{
	static const char fn[] = "getNicLoadStats";
	struct mc_engine *e = engine_of(fn, engine);
	te_json_limits lim = TE_JSON_LIMITS_DEFAULT;
	char *json = NULL;
	char why[160];
	int rc;

	if (e == NULL)
		return -1;
	if (stats == NULL || count == NULL) {
		mc_err("%s: NULL %s", fn, stats == NULL ? "stats array" : "count");
		return -1;
	}
	rc = te_engine_stats_json(e->te, &json);
	if (rc < 0) {
		mc_err("%s: %s", fn, te_strerror(rc));
		return to_status(fn, rc);
	}
	rc = te_json_check(json, strlen(json), &lim, why, sizeof why);
	if (rc < 0) {
		mc_err("%s: libte's statistics are not JSON this library reads: %s", fn, why);
		te_free(json);
		return MC_STATUS_CODE_MALFORMED_JSON;
	}
	*count = devices_from_json(json, stats, *count);
	te_free(json);
	return 0;
}

/* ---------------------------------------------------------------- segments */

/* Mooncake drops leading '/' from segment names; NULL when nothing is left. */
static const char *trim_name(const char *fn, const char *name)
{
	if (name == NULL) {
		mc_err("%s: NULL segment name", fn);
		return NULL;
	}
	while (*name == '/')
		name++;
	if (*name == '\0') {
		mc_err("%s: empty segment name", fn);
		return NULL;
	}
	return name;
}

static segment_id_t open_segment(const char *fn, transfer_engine_t engine,
				 const char *segment_name, int refresh)
{
	struct mc_engine *e = engine_of(fn, engine);
	const char *name;
	te_segment_id id;
	int rc;

	if (e == NULL)
		return ERR_INVALID_ARGUMENT;
	name = trim_name(fn, segment_name);
	if (name == NULL)
		return ERR_INVALID_ARGUMENT;
	/* An open name keeps its id and takes no further reference: Mooncake
	 * programs open a name again and again and never close it. */
	id = te_segment_find(e->te, name);
	if (id >= 0) {
		if (refresh && id != TE_LOCAL_SEGMENT) {
			rc = te_segment_refresh(e->te, id);
			if (rc < 0) {
				mc_err("%s: fetching the descriptor of '%s' again: %s", fn, name,
				       te_strerror(rc));
				return to_err(fn, rc);
			}
		}
		return id;
	}
	id = te_segment_open(e->te, name);
	if (id < 0) {
		mc_err("%s: cannot open segment '%s': %s", fn, name, te_strerror(id));
		return ERR_INVALID_ARGUMENT;
	}
	return id;
}

MC_API segment_id_t openSegment(transfer_engine_t engine, const char *segment_name)
{
	return open_segment("openSegment", engine, segment_name, 0);
}

MC_API segment_id_t openSegmentNoCache(transfer_engine_t engine, const char *segment_name)
{
	return open_segment("openSegmentNoCache", engine, segment_name, 1);
}

MC_API int closeSegment(transfer_engine_t engine, segment_id_t segment_id)
{
	if (engine_of("closeSegment", engine) == NULL)
		return ERR_INVALID_ARGUMENT;
	if (segment_id < 0) {
		mc_err("closeSegment: negative segment id %d", (int)segment_id);
		return ERR_INVALID_ARGUMENT;
	}
	return 0;
}

MC_API int removeLocalSegment(transfer_engine_t engine, const char *segment_name)
{
	static const char fn[] = "removeLocalSegment";
	struct mc_engine *e = engine_of(fn, engine);
	const char *name;
	te_segment_id id;

	if (e == NULL)
		return ERR_INVALID_ARGUMENT;
	name = trim_name(fn, segment_name);
	if (name == NULL)
		return ERR_INVALID_ARGUMENT;
	/* Close until libte forgets the name: each open of it (including a
	 * racing openSegment on another thread) holds one reference. Bounded so
	 * that a libte refusing to close cannot loop us forever. */
	for (int i = 0; i < 1 << 20; i++) {
		int rc;
		id = te_segment_find(e->te, name);
		if (id < 0 || id == TE_LOCAL_SEGMENT)
			return 0;
		rc = te_segment_close(e->te, id);
		if (rc < 0) {
			mc_err("%s: closing '%s' (id %d): %s", fn, name, (int)id, te_strerror(rc));
			return to_err(fn, rc);
		}
	}
	mc_err("%s: '%s' is still open after many closes", fn, name);
	return ERR_CONTEXT;
}

MC_API int syncSegmentCache(transfer_engine_t engine)
{
	struct mc_engine *e = engine_of("syncSegmentCache", engine);
	int rc;

	if (e == NULL)
		return ERR_INVALID_ARGUMENT;
	rc = te_segment_refresh_all(e->te);
	if (rc < 0) {
		mc_err("syncSegmentCache: %s", te_strerror(rc));
		return to_err("syncSegmentCache", rc);
	}
	return 0;
}

/* ------------------------------------------------------------ local memory */

MC_API int registerLocalMemory(transfer_engine_t engine, void *addr, size_t length,
			       const char *location, int remote_accessible)
{
	static const char fn[] = "registerLocalMemory";
	struct mc_engine *e = engine_of(fn, engine);
	int rc;

	if (e == NULL)
		return ERR_INVALID_ARGUMENT;
	if (addr == NULL || length == 0) {
		mc_err("%s: %s", fn, addr == NULL ? "NULL address" : "zero length");
		return ERR_INVALID_ARGUMENT;
	}
	rc = te_register_memory(e->te, addr, length, location != NULL ? location : "*",
				remote_accessible ? TE_MEM_REMOTE_ACCESS : 0);
	if (rc < 0)
		mc_err("%s: %p+%zu: %s", fn, addr, length, te_strerror(rc));
	return to_err(fn, rc);
}

/* Unregistering what is not registered is "not registered" in Mooncake;
 * libte says -ENOENT, which elsewhere means an unknown name. */
static int unregister_err(const char *fn, int rc)
{
	return rc == -ENOENT ? ERR_ADDRESS_NOT_REGISTERED : to_err(fn, rc);
}

MC_API int unregisterLocalMemory(transfer_engine_t engine, void *addr)
{
	static const char fn[] = "unregisterLocalMemory";
	struct mc_engine *e = engine_of(fn, engine);
	int rc;

	if (e == NULL)
		return ERR_INVALID_ARGUMENT;
	if (addr == NULL) {
		mc_err("%s: NULL address", fn);
		return ERR_INVALID_ARGUMENT;
	}
	rc = te_unregister_memory(e->te, addr);
	if (rc < 0)
		mc_err("%s: %p: %s", fn, addr, te_strerror(rc));
	return unregister_err(fn, rc);
}

MC_API int registerLocalMemoryBatch(transfer_engine_t engine, buffer_entry_t *buffer_list,
				    size_t buffer_len, const char *location)
{
	static const char fn[] = "registerLocalMemoryBatch";
	struct mc_engine *e = engine_of(fn, engine);
	te_memory_region *regs;
	int rc;

	if (e == NULL)
		return ERR_INVALID_ARGUMENT;
	if (buffer_len == 0)
		return 0;
	if (buffer_list == NULL) {
		mc_err("%s: NULL buffer list of %zu entries", fn, buffer_len);
		return ERR_INVALID_ARGUMENT;
	}
	if (buffer_len > SIZE_MAX / sizeof *regs) {
		mc_err("%s: %zu entries is too many", fn, buffer_len);
		return ERR_INVALID_ARGUMENT;
	}
	regs = malloc(buffer_len * sizeof *regs);
	if (regs == NULL) {
		mc_err("%s: out of memory for %zu entries", fn, buffer_len);
		return ERR_MEMORY;
	}
	for (size_t i = 0; i < buffer_len; i++) {
		if (buffer_list[i].addr == NULL || buffer_list[i].length == 0) {
			mc_err("%s: entry %zu has a %s", fn, i,
			       buffer_list[i].addr == NULL ? "NULL address" : "zero length");
			free(regs);
			return ERR_INVALID_ARGUMENT;
		}
		regs[i] = (te_memory_region){ buffer_list[i].addr, buffer_list[i].length,
					      location != NULL ? location : "*",
					      TE_MEM_REMOTE_ACCESS };
	}
	rc = te_register_memory_batch(e->te, regs, buffer_len);
	free(regs);
	if (rc < 0)
		mc_err("%s: %zu entries: %s", fn, buffer_len, te_strerror(rc));
	return to_err(fn, rc);
}

MC_API int unregisterLocalMemoryBatch(transfer_engine_t engine, void **addr_list, size_t addr_len)
{
	static const char fn[] = "unregisterLocalMemoryBatch";
	struct mc_engine *e = engine_of(fn, engine);
	int rc;

	if (e == NULL)
		return ERR_INVALID_ARGUMENT;
	if (addr_len == 0)
		return 0;
	if (addr_list == NULL) {
		mc_err("%s: NULL address list of %zu entries", fn, addr_len);
		return ERR_INVALID_ARGUMENT;
	}
	rc = te_unregister_memory_batch(e->te, (void *const *)addr_list, addr_len);
	if (rc < 0)
		mc_err("%s: %zu entries: %s", fn, addr_len, te_strerror(rc));
	return unregister_err(fn, rc);
}

/* ----------------------------------------------------------------- batches */

MC_API batch_id_t allocateBatchID(transfer_engine_t engine, size_t batch_size)
{
	static const char fn[] = "allocateBatchID";
	struct mc_engine *e = engine_of(fn, engine);
	struct mc_batch *b;
	te_batch_id id;
	int rc;

	if (e == NULL)
		return INVALID_BATCH;
	if (batch_size == 0) {
		mc_err("%s: zero batch size", fn);
		return INVALID_BATCH;
	}
	b = calloc(1, sizeof *b);
	if (b == NULL) {
		mc_err("%s: out of memory", fn);
		return INVALID_BATCH;
	}
	rc = te_batch_alloc(e->te, batch_size, &id);
	if (rc < 0) {
		mc_err("%s: %zu tasks: %s", fn, batch_size, te_strerror(rc));
		free(b);
		return INVALID_BATCH;
	}
	b->id = id;
	b->capacity = batch_size;
	pthread_mutex_init(&b->submit_lock, NULL);
	pthread_mutex_lock(&e->lock);
	size_t k = batch_hash(id, e->n_buckets);
	b->next = e->buckets[k];
	e->buckets[k] = b;
	e->n_batches++;
	batches_grow(e);
	pthread_mutex_unlock(&e->lock);
	return id;
}

MC_API int freeBatchID(transfer_engine_t engine, batch_id_t batch_id)
{
	static const char fn[] = "freeBatchID";
	struct mc_engine *e = engine_of(fn, engine);
	struct mc_batch *b;
	int rc;

	if (e == NULL)
		return MC_STATUS_CODE_INVALID_ARGUMENT;
	b = batch_get(e, batch_id);
	if (b == NULL) {
		mc_err("%s: unknown or freed batch id %llu", fn, (unsigned long long)batch_id);
		return MC_STATUS_CODE_INVALID_ARGUMENT;
	}
	/* Waits for a submit in progress on another thread, so a batch is not
	 * freed between that submit's libte call and its status checks. */
	pthread_mutex_lock(&b->submit_lock);
	rc = te_batch_free(e->te, batch_id);
	if (rc == 0) {
		pthread_mutex_lock(&e->lock);
		batch_unlink(e, b);
		pthread_mutex_unlock(&e->lock);
	}
	pthread_mutex_unlock(&b->submit_lock);
	batch_put(e, b);
	if (rc < 0 && rc != -EBUSY)
		mc_err("%s: batch %llu: %s", fn, (unsigned long long)batch_id, te_strerror(rc));
	return to_status(fn, rc);
}

/* Requests converted on the stack up to this many, else on the heap. */
#define MC_STACK_REQS 32

static int submit(const char *fn, transfer_engine_t engine, batch_id_t batch_id,
		  const struct transfer_request *entries, size_t count, const notify_msg_t *notify)
{
	struct mc_engine *e = engine_of(fn, engine);
	te_request stack_reqs[MC_STACK_REQS], *reqs = stack_reqs;
	struct mc_batch *b;
	size_t first;
	int status = MC_STATUS_CODE_OK, rc;

	if (e == NULL)
		return MC_STATUS_CODE_INVALID_ARGUMENT;
	if (entries == NULL && count > 0) {
		mc_err("%s: NULL entries for %zu requests", fn, count);
		return MC_STATUS_CODE_INVALID_ARGUMENT;
	}
	if (notify != NULL && (count == 0 || notify->msg == NULL)) {
		mc_err("%s: %s", fn, count == 0 ? "no request to notify about" : "NULL notify msg");
		return MC_STATUS_CODE_INVALID_ARGUMENT;
	}
	b = batch_get(e, batch_id);
	if (b == NULL) {
		mc_err("%s: unknown or freed batch id %llu", fn, (unsigned long long)batch_id);
		return MC_STATUS_CODE_INVALID_ARGUMENT;
	}
	pthread_mutex_lock(&b->submit_lock);
	if (count > b->capacity - b->submitted) {
		mc_err("%s: batch %llu holds %zu tasks, %zu submitted, %zu more refused", fn,
		       (unsigned long long)batch_id, b->capacity, b->submitted, count);
		status = MC_STATUS_CODE_TOO_MANY_REQUESTS;
		goto out;
	}
	if (count == 0)
		goto out;
	if (count > MC_STACK_REQS) {
		reqs = malloc(count * sizeof *reqs); /* count <= capacity: no overflow */
		if (reqs == NULL) {
			mc_err("%s: out of memory for %zu requests", fn, count);
			status = MC_STATUS_CODE_MEMORY;
			goto out;
		}
	}
	for (size_t i = 0; i < count; i++) {
		/* A negative opcode becomes a huge one, which libte refuses. */
		reqs[i] = (te_request){ (uint32_t)entries[i].opcode, entries[i].target_id,
					entries[i].source, entries[i].target_offset,
					entries[i].length };
	}
	rc = te_submit(e->te, batch_id, reqs, count);
	if (rc < 0) {
		mc_err("%s: batch %llu: %s", fn, (unsigned long long)batch_id, te_strerror(rc));
		status = to_status(fn, rc);
		goto out;
	}
	first = b->submitted;
	b->submitted += count;
	if (rc > 0) {
		/* Report the first refused request; the others run. */
		for (size_t i = 0; i < count; i++) {
			te_task_status st;
			if (te_get_status(e->te, batch_id, first + i, &st) == 0 &&
			    st.state == TE_TASK_INVALID) {
				mc_err("%s: request %zu of %zu refused: %s", fn, i, count,
				       te_strerror(st.error));
				status = to_status(fn, st.error < 0 ? st.error : -EINVAL);
				break;
			}
		}
		if (status == MC_STATUS_CODE_OK) /* libte said some were refused */
			status = MC_STATUS_CODE_INVALID_ARGUMENT;
		goto out;
	}
	if (notify != NULL) {
		rc = te_batch_notify_as(e->te, batch_id, entries[0].target_id, notify->name,
					notify->msg);
		if (rc < 0) {
			mc_err("%s: notification to segment %d: %s", fn, (int)entries[0].target_id,
			       te_strerror(rc));
			status = to_status(fn, rc);
		}
	}
out:
	pthread_mutex_unlock(&b->submit_lock);
	batch_put(e, b);
	if (reqs != stack_reqs)
		free(reqs);
	return status;
}

MC_API int submitTransfer(transfer_engine_t engine, batch_id_t batch_id,
			  struct transfer_request *entries, size_t count)
{
	return submit("submitTransfer", engine, batch_id, entries, count, NULL);
}

MC_API int submitTransferWithNotify(transfer_engine_t engine, batch_id_t batch_id,
				    struct transfer_request *entries, size_t count,
				    notify_msg_t notify_msg)
{
	return submit("submitTransferWithNotify", engine, batch_id, entries, count, &notify_msg);
}

MC_API int getTransferStatus(transfer_engine_t engine, batch_id_t batch_id, size_t task_id,
			     struct transfer_status *status)
{
	static const char fn[] = "getTransferStatus";
	struct mc_engine *e = engine_of(fn, engine);
	te_task_status st;
	int rc;

	if (e == NULL)
		return MC_STATUS_CODE_INVALID_ARGUMENT;
	if (status == NULL) {
		mc_err("%s: NULL status pointer", fn);
		return MC_STATUS_CODE_INVALID_ARGUMENT;
	}
	rc = te_get_status(e->te, batch_id, task_id, &st);
	if (rc < 0) {
		mc_err("%s: batch %llu task %zu: %s", fn, (unsigned long long)batch_id, task_id,
		       te_strerror(rc));
		return to_status(fn, rc);
	}
	/* libte's task states carry Mooncake's numbers */
	status->status = st.state;
	status->transferred_bytes = st.transferred;
	return MC_STATUS_CODE_OK;
}

/* ----------------------------------------------------------- notifications */

MC_API notify_msg_t *getNotifsFromEngine(transfer_engine_t engine, int *size)
{
	static const char fn[] = "getNotifsFromEngine";
	struct mc_engine *e;
	te_notification *list = NULL;
	notify_msg_t *out;
	size_t fetched = 0, count;
	int rc;

	if (size == NULL) {
		mc_err("%s: NULL size pointer", fn);
		return NULL;
	}
	*size = 0;
	e = engine_of(fn, engine);
	if (e == NULL)
		return NULL;
	rc = te_notify_fetch(e->te, &list, &fetched);
	if (rc < 0) {
		mc_err("%s: %s", fn, te_strerror(rc));
		return NULL;
	}
	if (fetched == 0) {
		te_notifications_free(list, fetched);
		return NULL;
	}
	count = fetched;
	if (count > INT_MAX) {
		mc_err("%s: %zu notifications, only %d returned, the rest dropped", fn, count,
		       INT_MAX);
		count = INT_MAX; /* the tail is released below with the whole list */
	}
	out = calloc(count, sizeof *out);
	for (size_t i = 0; out != NULL && i < count; i++) {
		out[i].name = strdup(list[i].name != NULL ? list[i].name : "");
		out[i].msg = strdup(list[i].msg != NULL ? list[i].msg : "");
		if (out[i].name == NULL || out[i].msg == NULL) {
			freeNotifsMsgBuf(out, (int)i + 1);
			out = NULL;
		}
	}
	te_notifications_free(list, fetched);
	if (out == NULL) {
		mc_err("%s: out of memory: %zu notifications dropped", fn, count);
		return NULL;
	}
	*size = (int)count;
	return out;
}

MC_API int freeNotifsMsgBuf(notify_msg_t *msg, int size)
{
	if (msg == NULL)
		return 0;
	if (size < 0) {
		mc_err("freeNotifsMsgBuf: negative size %d (nothing freed)", size);
		return ERR_INVALID_ARGUMENT;
	}
	for (int i = 0; i < size; i++) {
		free(msg[i].name);
		free(msg[i].msg);
	}
	free(msg);
	return 0;
}

MC_API int genNotifyInEngine(transfer_engine_t engine, uint64_t target_id, notify_msg_t notify_msg)
{
	static const char fn[] = "genNotifyInEngine";
	struct mc_engine *e = engine_of(fn, engine);
	int rc;

	if (e == NULL)
		return ERR_INVALID_ARGUMENT;
	if (target_id > INT32_MAX) {
		mc_err("%s: segment id %llu out of range", fn, (unsigned long long)target_id);
		return ERR_INVALID_ARGUMENT;
	}
	if (notify_msg.msg == NULL) {
		mc_err("%s: NULL msg", fn);
		return ERR_INVALID_ARGUMENT;
	}
	rc = te_notify_send_as(e->te, (te_segment_id)target_id, notify_msg.name, notify_msg.msg);
	if (rc < 0)
		mc_err("%s: to segment %llu: %s", fn, (unsigned long long)target_id, te_strerror(rc));
	return to_err(fn, rc);
}
