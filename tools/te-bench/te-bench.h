/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What te-bench's parts share: the flags (flags.c), the engines, buffers
 * and error exit (engines.c), the measured loop (initiator.c), the figures
 * and the closing report (report.c), and the modes (te-bench.c).
 */
#ifndef TE_BENCH_H
#define TE_BENCH_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include <te/te.h>

#include "teu-fmt.h"

#define PROG "te-bench"

typedef struct flags {
	const char *mode;
	const char *metadata_server;
	const char *local_server_name;
	const char *segment_id;
	const char *protocol;
	const char *memory;
	const char *device_name;
	const char *nic_priority_matrix;
	const char *auth_key_file;
	const char *metrics_addr;
	uint64_t metrics_linger;
	bool auto_discovery;
	const char *operation;
	uint64_t batch_size;
	uint64_t block_size;
	uint64_t remote_offset;
	uint64_t buffer_size;
	uint64_t duration;
	uint64_t threads;
	const char *report_unit;
	uint64_t report_precision;
	bool check;
	const char *pattern;
	uint64_t layers, kv_heads, head_dim, dtype_bytes, block_tokens, tp, tokens, rounds;
	bool use_vram;
	uint64_t gpu_id;
	const char *vram_device;
	bool json;
	bool quiet;
	bool verbose;
	bool help;
} flags;

/* flags.c: the flags, at their defaults until parse_flags() has run */
extern flags F;
void usage(FILE *out);
void parse_flags(int argc, char **argv);
uint64_t unit_bytes(const char *u); /* bytes in a --report_unit; 0: not one */

/* engines.c */
void die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
void drop_engines(void);
void keep_log(int level, const char *domain, const char *msg, void *user);
const char *why(void);
const char *store_for_log(void);
te_engine *make_engine(const char *name, bool loopback_alias);
void *register_buffer(te_engine *e, uint64_t size, uint64_t touch, bool remote, bool vram);

/* report.c */
/* Log-linear buckets: 64 per power of two, under 1.6 % error. */
#define SUB_BITS 6
#define SUB (1u << SUB_BITS)
#define NBUCKETS ((64 - SUB_BITS + 1) * SUB)

typedef struct hist {
	uint64_t n[NBUCKETS];
	uint64_t count, max;
} hist;

void hist_add(hist *h, uint64_t v, uint64_t times);
void hist_merge(hist *into, const hist *h);
double hist_pct(const hist *h, double p);
/* The rate of each second of the run (bytes/s), for the report's spread. */
void spread_add(double bytes_per_s);
/* The closing lines: text in the form of Mooncake's bench, or JSON. */
void report(const char *mode_name, const char *target, const char *transport, double duration,
	    uint64_t batches, const hist *h);

/* initiator.c */
int run_initiator(te_engine *e, const char *target, const char *mode_name);

/* kv.c: --pattern=kv, a request's KV cache as scattered blocks */
void kv_check_flags(void);
uint64_t kv_pool_bytes(void); /* bytes registered on each side */
int run_kv(te_engine *e, const char *target, const char *mode_name);

/* te-bench.c: set by SIGINT and SIGTERM */
extern volatile sig_atomic_t interrupted;

static inline uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
