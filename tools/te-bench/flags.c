/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te-bench's flags: the names and defaults of Mooncake's
 * transfer_engine_bench plus te-bench's own, their --help text, and their
 * parsing (--flag=value, --flag value, --noflag for booleans; sizes with K,
 * M, G suffixes). A bad flag ends the run with one line and exit status 1.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "te-bench.h"

flags F = {
	.mode = NULL, /* loopback, or initiator when --segment_id is given */
	.metadata_server = "P2PHANDSHAKE",
	.local_server_name = NULL,
	.segment_id = NULL,
	.protocol = "auto",
	.memory = "libte",
	.device_name = "",
	.nic_priority_matrix = "",
	.operation = NULL, /* read; write with --pattern=kv (a serving stack pushes its cache) */
	.batch_size = 128,
	.block_size = 65536,
	.buffer_size = 1ull << 30,
	.duration = 10,
	.threads = 1,
	.report_unit = "GB",
	.report_precision = 2,
	.vram_device = "cuda",
	.pattern = "block",
	.layers = 32,
	.kv_heads = 8,
	.head_dim = 128,
	.dtype_bytes = 2,
	.block_tokens = 16,
	.tp = 8,
	.tokens = 1024,
	.rounds = 1,
};

enum ftype { F_STR, F_U64, F_BOOL };

typedef struct flag_def {
	const char *name;
	int type;
	void *ptr;
	uint64_t min, max;
	const char *help;
} flag_def;

/* A flag is named as its field of F, so the two cannot differ, and the
 * field must have the flag's type (_Generic has no other case). */
#define FLAG_STR(name, help) { #name, F_STR, _Generic(F.name, const char *: &F.name), 0, 0, help }
#define FLAG_BOOL(name, help) { #name, F_BOOL, _Generic(F.name, bool: &F.name), 0, 0, help }
#define FLAG_U64(name, min, max, help) { #name, F_U64, _Generic(F.name, uint64_t: &F.name), min, max, help }

static const flag_def DEFS[] = {
	FLAG_STR(mode,
	  "loopback | target | initiator (default: loopback; initiator when --segment_id is set)"),
	FLAG_STR(metadata_server,
	  "P2PHANDSHAKE, etcd://h:p[,h:p], h:p (etcd), redis://h:p or http://h:p/path (default P2PHANDSHAKE)"),
	FLAG_STR(local_server_name,
	  "this engine's segment name (default: 127.0.0.1 in loopback mode, else the host name)"),
	FLAG_STR(segment_id,
	  "the target's segment name, e.g. 10.0.0.1:15123 or nvmeof/disk0 (initiator mode)"),
	FLAG_STR(protocol,
	  "transport to install: auto (the best network transport, and shm for engines on this host), "
	  "tcp, shm, rdma, nvmeof, ..., or a list (rdma,tcp: the first reaches peers, the others take over "
	  "when it fails) (default auto)"),
	FLAG_STR(memory,
	  "libte (te_mem_alloc: shared memory a same-host peer maps) or anonymous (mmap) (default libte)"),
	FLAG_STR(device_name, "RDMA devices, comma-separated (protocol rdma)"),
	FLAG_STR(nic_priority_matrix,
	  "file with an RDMA NIC priority matrix (JSON); overrides --device_name"),
	FLAG_STR(auth_key_file,
	  "the cluster key file: peers authenticate each connection (give it to target and initiator; "
	  "default: TE_AUTH_KEY_FILE, else none)"),
	FLAG_STR(metrics_addr,
	  "serve the engines' metrics at HOST:PORT while the run lasts (port 0 picks one; the URL is printed "
	  "on stderr); default: TE_METRICS_ADDR, else none"),
	FLAG_U64(metrics_linger, 0, 3600,
	  "seconds to keep the engines, and their metrics endpoint, after the run ends (default 0)"),
	FLAG_BOOL(auto_discovery, "the same as --protocol=auto"),
	FLAG_STR(operation, "read | write | mixed (reads and writes by turns) (default read; write with --pattern=kv)"),
	FLAG_U64(remote_offset, 0, 1ull << 40,
	  "start this many bytes into the target's buffer (initiators sharing a target) (default 0)"),
	FLAG_U64(batch_size, 1, 1u << 20, "requests per batch (default 128)"),
	FLAG_U64(block_size, 1, 1ull << 36, "bytes per request (default 65536)"),
	FLAG_U64(buffer_size, 1, 1ull << 40,
	  "bytes registered on each side (default 1 GiB, raised to block_size*batch_size*threads)"),
	FLAG_U64(duration, 1, 86400, "seconds to run (default 10)"),
	FLAG_U64(threads, 1, 1024, "submitting threads (default 1)"),
	FLAG_STR(report_unit, "GB | GiB | Gb | MB | MiB | Mb | KB | KiB | Kb (default GB)"),
	FLAG_U64(report_precision, 0, 9, "digits after the point (default 2)"),
	FLAG_BOOL(check, "write a pattern, read it back and compare every byte; fail loudly on a mismatch"),
	FLAG_STR(pattern,
	  "block (batches of --block_size blocks) or kv (a request's KV cache: layers x K,V x scattered blocks, "
	  "one batch per request, beside 1 MiB blocks of the same bytes) (default block)"),
	FLAG_U64(layers, 1, 1024, "kv: the model's layers (default 32)"),
	FLAG_U64(kv_heads, 1, 4096, "kv: KV heads (default 8)"),
	FLAG_U64(head_dim, 1, 65536, "kv: values per head (default 128)"),
	FLAG_U64(dtype_bytes, 1, 16, "kv: bytes per value (default 2)"),
	FLAG_U64(block_tokens, 1, 65536, "kv: tokens per cache block (default 16)"),
	FLAG_U64(tp, 1, 4096,
	  "kv: tensor-parallel degree, the KV heads split among ranks (default 8: 4 KiB per block and layer)"),
	FLAG_U64(tokens, 1, 1u << 24, "kv: tokens per request (default 1024)"),
	FLAG_U64(rounds, 1, 1000,
	  "kv: rounds, each --duration s of requests then --duration s of 1 MiB blocks (default 1)"),
	FLAG_BOOL(use_vram,
	  "buffers in device memory (GPU) on both sides, through a device plugin (te-info lists them)"),
	FLAG_U64(gpu_id, 0, 65535, "the device of --use_vram (default 0)"),
	FLAG_STR(vram_device,
	  "the device plugin's location prefix for --use_vram (default cuda: cuda:<gpu_id>)"),
	FLAG_BOOL(json, "print the result as one JSON object on stdout"),
	FLAG_BOOL(quiet, "no progress line on stderr every second"),
	FLAG_BOOL(verbose, "show libte's log (level info) on stderr"),
	FLAG_BOOL(help, "this text"),
};

void usage(FILE *out)
{
	fprintf(out,
		"Usage: " PROG " [--flag=value ...]\n"
		"Moves blocks between two libte engines and reports throughput, IOPS and latency.\n"
		"With no flags: both engines in this process, TCP over 127.0.0.1, P2PHANDSHAKE, 10 s.\n"
		"Two machines: '" PROG " --mode=target' on one (it prints its segment name), then\n"
		"'" PROG " --segment_id=<that name>' on the other.\n\nFlags (also --flag value; booleans take "
		"--flag, --noflag or --flag=true|false):\n");
	for (size_t i = 0; i < sizeof DEFS / sizeof *DEFS; i++)
		fprintf(out, "  --%-20s %s\n", DEFS[i].name, DEFS[i].help);
	fprintf(out, "\nEnvironment: TE_LOG_LEVEL shows libte's log; TE_TCP_* tune the TCP transport, "
		     "TE_PLUGIN_PATH adds plugin folders.\n");
}

static bool parse_bool(const char *v, bool *out)
{
	if (!strcmp(v, "true") || !strcmp(v, "1") || !strcmp(v, "yes")) {
		*out = true;
		return true;
	}
	if (!strcmp(v, "false") || !strcmp(v, "0") || !strcmp(v, "no")) {
		*out = false;
		return true;
	}
	return false;
}

/* "64K", "1M", "1G" and plain numbers. */
static bool parse_size(const char *v, uint64_t *out)
{
	char *end = NULL;
	unsigned long long n;

	if (*v == '\0' || *v == '-' || *v == '+' || *v == ' ')
		return false;
	errno = 0;
	n = strtoull(v, &end, 10);
	if (errno != 0 || end == v)
		return false;
	unsigned shift = 0;
	switch (*end) {
	case '\0': break;
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	default: return false;
	}
	if (*end == 'i' || *end == 'B')
		end++;
	if (*end == 'B')
		end++;
	if (*end != '\0' || (shift && n > (UINT64_MAX >> shift)))
		return false;
	*out = (uint64_t)n << shift;
	return true;
}

void parse_flags(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (a[0] != '-')
			die(1, "unexpected argument '%s' (flags look like --name=value; see --help)", a);
		a += a[1] == '-' ? 2 : 1;
		const char *eq = strchr(a, '=');
		size_t nl = eq ? (size_t)(eq - a) : strlen(a);
		const flag_def *d = NULL;
		bool negated = false;
		for (size_t k = 0; k < sizeof DEFS / sizeof *DEFS && !d; k++) {
			if (strlen(DEFS[k].name) == nl && !strncmp(DEFS[k].name, a, nl))
				d = &DEFS[k];
			else if (DEFS[k].type == F_BOOL && !eq && nl == strlen(DEFS[k].name) + 2 &&
				 !strncmp(a, "no", 2) && !strncmp(a + 2, DEFS[k].name, nl - 2)) {
				d = &DEFS[k];
				negated = true;
			}
		}
		if (d == NULL) {
			if (!strcmp(a, "h"))
				d = &DEFS[sizeof DEFS / sizeof *DEFS - 1];
			else
				die(1, "unknown flag '%s' (see --help)", argv[i]);
		}
		const char *v = eq ? eq + 1 : NULL;
		if (d->type == F_BOOL) {
			bool b = !negated;
			if (v != NULL && !parse_bool(v, &b))
				die(1, "--%s wants true or false, not '%s'", d->name, v);
			*(bool *)d->ptr = b;
			continue;
		}
		if (v == NULL) {
			if (i + 1 >= argc)
				die(1, "--%s needs a value", d->name);
			v = argv[++i];
		}
		if (d->type == F_STR) {
			*(const char **)d->ptr = v;
		} else {
			uint64_t n;
			if (!parse_size(v, &n) || n < d->min || n > d->max)
				die(1, "--%s=%s is not a number in [%" PRIu64 ", %" PRIu64 "]", d->name, v, d->min,
				    d->max);
			*(uint64_t *)d->ptr = n;
		}
	}
}

uint64_t unit_bytes(const char *u)
{
	static const struct { const char *n; uint64_t v; } units[] = {
		{ "GB", 1000000000ull }, { "GiB", 1ull << 30 }, { "Gb", 1000000000ull / 8 },
		{ "MB", 1000000ull },    { "MiB", 1ull << 20 }, { "Mb", 1000000ull / 8 },
		{ "KB", 1000ull },       { "KiB", 1ull << 10 }, { "Kb", 1000ull / 8 },
	};
	for (size_t i = 0; i < sizeof units / sizeof *units; i++)
		if (!strcmp(u, units[i].n))
			return units[i].v;
	return 0;
}
