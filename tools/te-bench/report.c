/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te-bench's figures: the latency histogram each thread fills (log-linear
 * buckets, merged at the end) and the closing report, in the form of
 * Mooncake's transfer_engine_bench ("Test completed: ...") or, with --json,
 * one JSON object on stdout.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "te-bench.h"

static unsigned bucket_of(uint64_t v)
{
	if (v < SUB)
		return (unsigned)v;
	unsigned e = 63u - (unsigned)__builtin_clzll(v);
	return (e - SUB_BITS + 1) * SUB + (unsigned)((v >> (e - SUB_BITS)) & (SUB - 1));
}

static double bucket_mid(unsigned b)
{
	if (b < SUB)
		return b;
	unsigned e = b / SUB + SUB_BITS - 1, s = b % SUB;
	double lo = ldexp((double)(SUB + s), (int)e - SUB_BITS);
	return lo + ldexp(1.0, (int)e - SUB_BITS) / 2;
}

void hist_add(hist *h, uint64_t v, uint64_t times)
{
	h->n[bucket_of(v)] += times;
	h->count += times;
	if (v > h->max)
		h->max = v;
}

void hist_merge(hist *into, const hist *h)
{
	for (unsigned i = 0; i < NBUCKETS; i++)
		into->n[i] += h->n[i];
	into->count += h->count;
	if (h->max > into->max)
		into->max = h->max;
}

double hist_pct(const hist *h, double p)
{
	if (h->count == 0)
		return 0;
	uint64_t want = (uint64_t)ceil(p * (double)h->count);
	uint64_t acc = 0;
	if (want == 0)
		want = 1;
	for (unsigned i = 0; i < NBUCKETS; i++) {
		acc += h->n[i];
		if (acc >= want)
			return bucket_mid(i) > (double)h->max ? (double)h->max : bucket_mid(i);
	}
	return (double)h->max;
}

static void fmt_lat(char *buf, size_t n, double ns)
{
	if (ns >= 1e6)
		snprintf(buf, n, "%.2f ms", ns / 1e6);
	else
		snprintf(buf, n, "%.1f us", ns / 1e3);
}

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; s && *s; s++) {
		if (*s == '"' || *s == '\\')
			fprintf(f, "\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			fprintf(f, "\\u%04x", *s);
		else
			fputc(*s, f);
	}
	fputc('"', f);
}

/* The per-second rates of the run: how steady it was, beside its mean. */
#define SPREAD_MAX 3600
static double spread[SPREAD_MAX];
static unsigned nspread;

void spread_add(double bytes_per_s)
{
	if (nspread < SPREAD_MAX)
		spread[nspread++] = bytes_per_s;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* min, median, max of the per-second rates; false when there are none */
static bool spread_stats(double *min, double *med, double *max)
{
	if (nspread == 0)
		return false;
	qsort(spread, nspread, sizeof spread[0], cmp_double);
	*min = spread[0];
	*max = spread[nspread - 1];
	*med = nspread % 2 ? spread[nspread / 2] : (spread[nspread / 2 - 1] + spread[nspread / 2]) / 2;
	return true;
}

void report(const char *mode_name, const char *target, const char *transport, double duration,
	    uint64_t batches, const hist *h)
{
	uint64_t unit = unit_bytes(F.report_unit);

	double bytes = (double)batches * (double)F.batch_size * (double)F.block_size;
	double rate = bytes / duration;
	double iops = (double)batches * (double)F.batch_size / duration;
	double p50 = hist_pct(h, 0.50), p99 = hist_pct(h, 0.99), p999 = hist_pct(h, 0.999);
	double smin = 0, smed = 0, smax = 0;
	bool have_spread = spread_stats(&smin, &smed, &smax);
	if (F.json) {
		printf("{\"mode\":");
		json_str(stdout, mode_name);
		printf(",\"protocol\":");
		json_str(stdout, F.protocol);
		printf(",\"transport\":");
		json_str(stdout, transport);
		printf(",\"metadata_server\":");
		json_str(stdout, store_for_log());
		printf(",\"segment_id\":");
		json_str(stdout, target);
		printf(",\"operation\":\"%s\",\"block_size\":%" PRIu64 ",\"batch_size\":%" PRIu64
		       ",\"threads\":%" PRIu64 ",\"check\":%s,\"duration_s\":%.3f,\"batch_count\":%" PRIu64
		       ",\"requests\":%" PRIu64 ",\"bytes\":%.0f,\"throughput_bytes_per_s\":%.0f,\"throughput\":%.*f"
		       ",\"report_unit\":",
		       F.operation, F.block_size, F.batch_size, F.threads, F.check ? "true" : "false", duration,
		       batches, batches * F.batch_size, bytes, rate, (int)F.report_precision, rate / (double)unit);
		json_str(stdout, F.report_unit);
		printf(",\"iops\":%.0f,\"latency_us\":{\"p50\":%.1f,\"p99\":%.1f,\"p999\":%.1f,\"max\":%.1f}",
		       iops, p50 / 1e3, p99 / 1e3, p999 / 1e3, (double)h->max / 1e3);
		if (have_spread)
			printf(",\"per_second_bytes_per_s\":{\"seconds\":%u,\"min\":%.0f,\"median\":%.0f,\"max\":%.0f}",
			       nspread, smin, smed, smax);
		printf("}\n");
	} else {
		char a[32], b[32], c[32];
		fmt_lat(a, sizeof a, p50);
		fmt_lat(b, sizeof b, p99);
		fmt_lat(c, sizeof c, p999);
		printf("Test completed: duration %.2f, batch count %" PRIu64 ", throughput %.*f %s/s\n", duration,
		       batches, (int)F.report_precision, rate / (double)unit, F.report_unit);
		printf("IOPS %.0f requests/s; latency per request p50 %s, p99 %s, p99.9 %s (submit to batch "
		       "completion)%s\n",
		       iops, a, b, c, F.check ? "; every byte checked (figures include the check traffic)" : "");
		if (have_spread)
			printf("Per second (%u s): min %.*f, median %.*f, max %.*f %s/s\n", nspread,
			       (int)F.report_precision, smin / (double)unit, (int)F.report_precision, smed / (double)unit,
			       (int)F.report_precision, smax / (double)unit, F.report_unit);
	}
	fflush(stdout);
}
