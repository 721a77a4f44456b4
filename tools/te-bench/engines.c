/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te-bench's engines and buffers: an engine started with the flags'
 * metadata store, options and transport; its buffer allocated (libte's
 * shared memory, anonymous memory or device memory) and registered; and
 * the error exit, which shuts the engines down first. libte's log is kept
 * here, not shown: its last warning explains a failure in that one line.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "te-bench.h"

/* Engines alive, shut down on every exit path: an engine removes what it
 * published in a metadata store when it goes. */
static te_engine *engines[2];

void drop_engines(void)
{
	for (int i = 1; i >= 0; i--) {
		te_engine_destroy(engines[i]);
		engines[i] = NULL;
	}
}

/* Errors are one line on stderr and an exit code: 1 bad use or failed run, 2
 * data mismatch. Called from the main thread only. */
void die(int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	teu_fmt_verror(PROG, fmt, ap);
	va_end(ap);
	fflush(stdout);
	drop_engines();
	exit(code);
}

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char last_log[512];

/* Without --verbose libte's log is kept, not shown: the last warning or
 * error explains a failure in the one line te-bench prints. */
void keep_log(int level, const char *domain, const char *msg, void *user)
{
	(void)user;
	/* Where the metrics are served: a scraper needs it, a port 0 in
	 * particular. */
	if (level == TE_LOG_INFO && strncmp(msg, "metrics at ", 11) == 0) {
		fprintf(stderr, PROG ": %s\n", msg);
		return;
	}
	if (level > TE_LOG_WARN)
		return;
	pthread_mutex_lock(&log_lock);
	snprintf(last_log, sizeof last_log, "%s: %s", domain ? domain : "te", msg);
	pthread_mutex_unlock(&log_lock);
}

const char *why(void)
{
	static char copy[520];
	pthread_mutex_lock(&log_lock);
	if (last_log[0])
		snprintf(copy, sizeof copy, " [%s]", last_log);
	else
		copy[0] = '\0';
	pthread_mutex_unlock(&log_lock);
	return copy;
}

static void *map_buffer(uint64_t size, bool vram)
{
	void *p;
	if (vram) {
		char loc[64];
		snprintf(loc, sizeof loc, "%s:%" PRIu64, F.vram_device, F.gpu_id);
		int rc = te_device_alloc(loc, size, &p);
		if (rc < 0)
			die(1, "cannot allocate %" PRIu64 " bytes of %s memory: %s%s", size, loc,
			    te_strerror(rc), why());
		return p;
	}
	if (strcmp(F.memory, "libte") == 0) {
		int rc = te_mem_alloc(size, &p);
		if (rc < 0)
			die(1, "cannot allocate a %" PRIu64 "-byte buffer: %s%s", size, te_strerror(rc), why());
		return p;
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		die(1, "cannot map a %" PRIu64 "-byte buffer: %s", size, strerror(errno));
	return p;
}

static char *read_file(const char *path)
{
	FILE *f = fopen(path, "r");
	if (f == NULL)
		die(1, "cannot read --nic_priority_matrix file %s: %s", path, strerror(errno));
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap);
	size_t r;
	while (buf && (r = fread(buf + len, 1, cap - len - 1, f)) > 0) {
		len += r;
		if (len + 1 == cap) {
			if (cap >= (1u << 24))
				die(1, "--nic_priority_matrix file %s is too large", path);
			cap *= 2;
			buf = realloc(buf, cap);
		}
	}
	fclose(f);
	if (buf == NULL)
		die(1, "out of memory");
	buf[len] = '\0';
	return buf;
}

/* The JSON arguments for a transport: RDMA takes a NIC priority matrix, made
 * from --device_name like Mooncake's bench does when no file is given. */
static char *transport_args(const char *proto)
{
	if (strcmp(proto, "rdma") != 0)
		return NULL;
	if (F.nic_priority_matrix[0])
		return read_file(F.nic_priority_matrix);
	if (F.device_name[0] == '\0')
		return NULL; /* the plugin builds the matrix from the topology */
	size_t cap = strlen(F.device_name) * 3 + 16;
	char *list = malloc(cap), *out = malloc(cap * 4 + 128);
	if (list == NULL || out == NULL)
		die(1, "out of memory");
	size_t l = 0;
	const char *p = F.device_name;
	while (*p) {
		size_t n = strcspn(p, ",");
		if (n > 0)
			l += (size_t)snprintf(list + l, cap - l, "%s\"%.*s\"", l ? "," : "", (int)n, p);
		p += n + (p[n] == ',');
	}
	snprintf(out, cap * 4 + 128, "{\"cpu:0\":[[%s],[]],\"cpu:1\":[[%s],[]],\"cuda:0\":[[%s],[]]}", list,
		 list, list);
	free(list);
	return out;
}

/* --metadata_server for output: a password in its user-info
 * ("etcd://user:pw@host") shown as "***". */
const char *store_for_log(void)
{
	static char buf[1024];
	const char *c = F.metadata_server;
	const char *start = strstr(c, "://");
	start = start ? start + 3 : c;
	size_t n = strcspn(start, "/?#");
	const char *at = NULL, *colon = NULL;
	for (const char *p = start; p < start + n; p++)
		if (*p == '@')
			at = p;
	if (at != NULL)
		colon = memchr(start, ':', (size_t)(at - start));
	if (colon == NULL)
		return c;
	snprintf(buf, sizeof buf, "%.*s:***%s", (int)(colon - c), c, at);
	return buf;
}

te_engine *make_engine(const char *name, bool loopback_alias)
{
	te_engine *e = NULL;
	te_option opt[3];
	size_t n = 0;

	if (F.auth_key_file != NULL && *F.auth_key_file != '\0')
		opt[n++] = (te_option){ "auth_key_file", F.auth_key_file };
	if (F.metrics_addr != NULL && *F.metrics_addr != '\0')
		opt[n++] = (te_option){ "metrics_addr", F.metrics_addr };
	/* Outside P2PHANDSHAKE two loopback engines need distinct names that
	 * still say where to reach them. */
	if (loopback_alias)
		opt[n++] = (te_option){ "ip_or_host_name", "127.0.0.1" };
	int rc = te_engine_create(F.metadata_server, name, opt, n, &e);
	if (rc < 0)
		die(1, "cannot start an engine with metadata '%s' as '%s': %s%s", store_for_log(),
		    name ? name : "(host name)", te_strerror(rc), why());
	engines[engines[0] ? 1 : 0] = e;
	if (F.auto_discovery || strcmp(F.protocol, "auto") == 0) {
		const char *got = NULL;
		rc = te_transport_auto(e, &got);
		if (rc < 0)
			die(1, "auto-discovery installed no transport: %s%s", te_strerror(rc), why());
	} else {
		/* A list ("rdma,tcp") installs each in turn: the first is the one
		 * peers are reached by, the others take over when it fails
		 * (fail-over across transports). */
		for (const char *p = F.protocol; *p != '\0';) {
			size_t len = strcspn(p, ",");
			char name[64];
			if (len == 0 || len >= sizeof name)
				die(1, "--protocol=%s: an empty or too long transport name in the list", F.protocol);
			memcpy(name, p, len);
			name[len] = '\0';
			char *args = transport_args(name);
			rc = te_transport_install(e, name, args);
			free(args);
			if (rc < 0)
				die(1, "cannot install transport '%s': %s%s", name, te_strerror(rc), why());
			p += len + (p[len] == ',');
		}
	}
	return e;
}

void *register_buffer(te_engine *e, uint64_t size, uint64_t touch, bool remote, bool vram)
{
	void *p = map_buffer(size, vram);
	/* Fault in the part in use, so that page faults do not show in the
	 * figures (device memory is the device plugin's: "*" finds its device). */
	if (!vram)
		memset(p, 0, touch);
	int rc = te_register_memory(e, p, size, vram ? "*" : "cpu:0",
				    remote ? TE_MEM_REMOTE_ACCESS : 0);
	if (rc < 0)
		die(1, "cannot register %" PRIu64 " bytes: %s%s", size, te_strerror(rc), why());
	return p;
}
