/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libtransfer_engine: Mooncake's C API (transfer_engine_c.h) as a thin layer
 * over libte's public API. Every call checks its arguments, turns Mooncake's
 * types into te.h's and libte's error codes into Mooncake's (one table,
 * errors.c). The only state of its own is what te.h has no place for: the
 * batches an engine allocated (for capacity checks, finding the first refused
 * request of a submit, and waiting at a graceful shutdown) and the handles
 * installTransport() returns.
 */
#include "mc-internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ----------------------------------------------------------------- engine */
/* A handle from the caller, checked: NULL, and a transport handle passed by
 * mistake (both are void * in Mooncake's API), are refused. */
struct mc_engine *engine_of(const char *fn, transfer_engine_t h)
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

/* engine_of(), then the call's own check of its arguments. */
struct mc_engine *engine_checked(const char *fn, transfer_engine_t h, int refused, const char *why)
{
	struct mc_engine *e = engine_of(fn, h);

	if (e == NULL)
		return NULL;
	if (refused) {
		mc_err("%s: %s", fn, why);
		return NULL;
	}
	return e;
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

/* MC_SLICE_TIMEOUT: seconds (1..65535, as Mooncake), the deadline of every
 * task submitted, counted from its submit; unset or out of range, off. */
static int slice_timeout_env(void)
{
	const char *v = getenv("MC_SLICE_TIMEOUT");
	char *end;
	long n;

	if (v == NULL || *v == '\0')
		return 0;
	errno = 0;
	n = strtol(v, &end, 10);
	if (errno != 0 || *end != '\0' || n <= 0 || n >= 65536) {
		mc_warn("ignoring MC_SLICE_TIMEOUT=%s: not a number of seconds in [1, 65535]", v);
		return 0;
	}
	return (int)n;
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
		/* With a metadata store Mooncake publishes MC_TCP_BIND_ADDRESS, when
		 * set, as the address peers reach this engine at. */
		const char *bind = getenv("MC_TCP_BIND_ADDRESS");
		if (bind != NULL && *bind != '\0')
			ip_or_host_name = bind;
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
	atomic_init(&e->notify_pending, 0);
	e->slice_timeout_s = slice_timeout_env();
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
				else {
					pthread_mutex_lock(&b->submit_lock);
					batch_notify_flush("destroyTransferEngine", e, b, 1);
					pthread_mutex_unlock(&b->submit_lock);
				}
			}
	}
	metric_stop(e);
	te_engine_destroy(e->te);
	for (size_t i = 0; i < e->n_buckets; i++) {
		struct mc_batch *b = e->buckets[i], *next;
		for (; b != NULL; b = next) {
			next = b->next;
			batch_destroy(b);
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
	struct mc_engine *e = engine_checked(fn, engine, proto == NULL || *proto == '\0',
					     "empty transport name");
	const char *json = NULL;
	struct mc_transport *t;
	size_t len;
	int rc;

	if (e == NULL)
		return NULL;
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
	struct mc_engine *e = engine_checked(fn, engine, proto == NULL || *proto == '\0',
					     "empty transport name");
	const char *names[32];
	int n, rc;

	if (e == NULL)
		return ERR_INVALID_ARGUMENT;
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

/* One field of showLinks' report: in JSON `key` then `value` as a string
 * literal, in text `label` then `value` as it is. */
static void put_field(char *buf, size_t size, size_t *pos, int json, const char *key, const char *label,
		      const char *value)
{
	put_text(buf, size, pos, json ? key : label);
	if (json)
		put_json_string(buf, size, pos, value);
	else
		put_text(buf, size, pos, value);
}

MC_API int showLinks(transfer_engine_t engine, char *buf_out, size_t buf_len, int json)
{
	static const char fn[] = "showLinks";
	struct mc_engine *e = engine_checked(fn, engine, buf_out == NULL || buf_len == 0,
					     "NULL or empty output buffer");
	const char *names[32];
	size_t pos = 0;
	char line[64];
	int n;

	if (e == NULL)
		return ERR_INVALID_ARGUMENT;
	n = te_transport_list(e->te, names, sizeof names / sizeof names[0]);
	if (n > (int)(sizeof names / sizeof names[0]))
		n = (int)(sizeof names / sizeof names[0]);
	put_field(buf_out, buf_len, &pos, json, "{\"segment\":", "segment ", te_engine_name(e->te));
	put_field(buf_out, buf_len, &pos, json, ",\"address\":", ", address ", te_engine_address(e->te));
	if (json)
		snprintf(line, sizeof line, ",\"rpc_port\":%d,\"transports\":[", te_engine_rpc_port(e->te));
	else
		snprintf(line, sizeof line, ", rpc port %d\n", te_engine_rpc_port(e->te));
	put_text(buf_out, buf_len, &pos, line);
	for (int i = 0; i < n; i++) {
		char *report = NULL;
		int rc = te_plugin_report(names[i], &report);
		const char *r = rc == 0 && report != NULL ? report : te_strerror(rc);
		put_field(buf_out, buf_len, &pos, json, i > 0 ? ",{\"name\":" : "{\"name\":", "transport ",
			  names[i]);
		put_field(buf_out, buf_len, &pos, json, ",\"report\":", ":\n", r);
		if (json)
			put_text(buf_out, buf_len, &pos, "}");
		else if (*r != '\0' && r[strlen(r) - 1] != '\n')
			put_text(buf_out, buf_len, &pos, "\n");
		te_free(report);
	}
	if (json)
		put_text(buf_out, buf_len, &pos, "]}");
	buf_out[pos < buf_len ? pos : buf_len - 1] = '\0';
	return 0;
}
