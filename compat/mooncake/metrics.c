/* SPDX-License-Identifier: Apache-2.0 */
/* MC_TE_METRIC's throughput line and getNicLoadStats(), both from libte's
 * counters. */
#include "mc-internal.h"

#include <te/te-json.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

void metric_start(struct mc_engine *e)
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

void metric_stop(struct mc_engine *e)
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
	struct mc_engine *e = engine_checked(fn, engine, stats == NULL || count == NULL,
					     stats == NULL ? "NULL stats array" : "NULL count");
	te_json_limits lim = TE_JSON_LIMITS_DEFAULT;
	char *json = NULL;
	char why[160];
	int rc;

	if (e == NULL)
		return -1;
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
