/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One sample of an engine's Prometheus exposition, for the transport tests
 * that check device counters after known transfers (docs/metrics.md); the
 * te_stats counts of one direction, for the metrics tests.
 */
#ifndef TE_TEST_METRIC_UTIL_H
#define TE_TEST_METRIC_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <te/te.h>

#include "../common/check.h"

/* Whether e counts (not built with -Dmetrics=false, not TE_METRICS=0):
 * the transport tests check their device counters only then. */
static inline int engine_counts(te_engine *e)
{
	char *t = NULL;
	size_t len = 0;
	int rc = te_metrics_text(e, &t, &len);

	te_free(t);
	return rc == 0;
}

/* The value of `family{segment="<e's name>",<labels>}` in e's exposition;
 * -1 when the series is absent, -2 when the text cannot be read. */
static inline long long engine_metric(te_engine *e, const char *family, const char *labels)
{
	char *t = NULL, prefix[1024];
	size_t len = 0;
	long long v = -1;

	if (te_metrics_text(e, &t, &len) != 0 || t == NULL)
		return -2;
	snprintf(prefix, sizeof prefix, "%s{segment=\"%s\"%s%s}", family, te_engine_name(e),
		 labels[0] ? "," : "", labels);
	size_t n = strlen(prefix);
	for (const char *l = t; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : "")
		if (strncmp(l, prefix, n) == 0 && l[n] == ' ') {
			v = atoll(l + n + 1);
			break;
		}
	te_free(t);
	return v;
}

/* A device series: `family{…,transport="tp",device="dev"}`; an absent
 * series reads 0 (a device not used yet has none). */
static inline long long device_metric(te_engine *e, const char *family, const char *tp, const char *dev)
{
	char labels[512];

	snprintf(labels, sizeof labels, "transport=\"%s\",device=\"%s\"", tp, dev);
	long long v = engine_metric(e, family, labels);
	return v == -1 ? 0 : v;
}

static inline long long transport_metric(te_engine *e, const char *family, const char *tp)
{
	char labels[256];

	snprintf(labels, sizeof labels, "transport=\"%s\"", tp);
	long long v = engine_metric(e, family, labels);
	return v == -1 ? 0 : v;
}

/* The sum of every `family` series of transport `tp` in e's exposition
 * (all its devices); -2 when the text cannot be read. */
static inline long long transport_sum(te_engine *e, const char *family, const char *tp)
{
	char *t = NULL, prefix[1024], tl[256];
	size_t len = 0;
	long long sum = 0;

	if (te_metrics_text(e, &t, &len) != 0 || t == NULL)
		return -2;
	snprintf(prefix, sizeof prefix, "%s{segment=\"%s\",", family, te_engine_name(e));
	snprintf(tl, sizeof tl, "transport=\"%s\"", tp);
	size_t n = strlen(prefix);
	for (const char *l = t; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : "") {
		const char *end = strchr(l, '}');
		const char *lab = strstr(l, tl);
		if (strncmp(l, prefix, n) == 0 && end != NULL && lab != NULL && lab < end && end[1] == ' ')
			sum += atoll(end + 2);
	}
	te_free(t);
	return sum;
}

/* The counts of `op` (TE_OP_READ or TE_OP_WRITE) in `s`: requests,
 * completed, failed, bytes; `what` names `s` in the line of a mismatch. */
static inline void check_op_counts(const char *what, const te_stats *s, int op, uint64_t requests,
				   uint64_t completed, uint64_t failed, uint64_t bytes)
{
	static const char *const names[4] = { "requests", "completed", "failed", "bytes" };
	const uint64_t got[4] = { s->requests[op], s->completed[op], s->failed[op], s->bytes[op] };
	const uint64_t want[4] = { requests, completed, failed, bytes };

	for (int i = 0; i < 4; i++) {
		if (got[i] != want[i])
			fprintf(stderr, "  %s: %s[%s] is %llu, not %llu\n", what, names[i],
				op == TE_OP_READ ? "READ" : "WRITE", (unsigned long long)got[i],
				(unsigned long long)want[i]);
		CHECK_EQ(got[i], want[i]);
	}
}

#endif
