/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te-top: a running engine's metrics, second by second. Scrapes the
 * endpoint (TE_METRICS_ADDR, docs/metrics.md) every interval and prints
 * what changed since the last scrape: throughput and requests per
 * transport and operation with p50/p99 estimated from the latency
 * histogram's new observations, per peer, failures, transfers in flight
 * and device bandwidth.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <glib.h>

#include "teu-http.h"
#include "teu-redact.h"
#include "prom-text.h"

#define PROG "te-top"
#define MAX_BUCKETS 64

/* One (transport, op), or one (peer, op), summed over the engines. */
typedef struct agg {
	double bytes, requests, failed;
	size_t n_le;
	double le[MAX_BUCKETS];
	double cum[MAX_BUCKETS]; /* cumulative counts, by le ascending */
} agg;

typedef struct scrape {
	GHashTable *tp;    /* "transport\top" → agg* */
	GHashTable *peers; /* "peer\top" → agg* */
	GHashTable *devbw; /* "transport\tdevice" → bytes/s (a gauge) */
	double in_flight, in_flight_bytes;
	double t; /* monotonic seconds */
} scrape;

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static agg *agg_of(GHashTable *t, const char *a, const char *b)
{
	char *k = g_strdup_printf("%s\t%s", a, b);
	agg *g = g_hash_table_lookup(t, k);

	if (g == NULL) {
		g = g_new0(agg, 1);
		g_hash_table_insert(t, k, g);
	} else {
		g_free(k);
	}
	return g;
}

static void agg_bucket(agg *g, double le, double v)
{
	size_t i = 0;

	while (i < g->n_le && g->le[i] < le)
		i++;
	if (i < g->n_le && g->le[i] == le) {
		g->cum[i] += v;
		return;
	}
	if (g->n_le >= MAX_BUCKETS)
		return; /* more bounds than any histogram of libte has: the rest are left out */
	memmove(g->le + i + 1, g->le + i, (g->n_le - i) * sizeof *g->le);
	memmove(g->cum + i + 1, g->cum + i, (g->n_le - i) * sizeof *g->cum);
	g->le[i] = le;
	g->cum[i] = v;
	g->n_le++;
}

static void scrape_init(scrape *s)
{
	s->tp = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
	s->peers = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
	s->devbw = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
	s->in_flight = s->in_flight_bytes = 0;
}

static void scrape_clear(scrape *s)
{
	if (s->tp == NULL)
		return;
	g_hash_table_unref(s->tp);
	g_hash_table_unref(s->peers);
	g_hash_table_unref(s->devbw);
	s->tp = s->peers = s->devbw = NULL;
}

static const char *lbl(const prom_sample *x, const char *name)
{
	const char *v = prom_label_get(x, name);
	return v ? v : "?";
}

/* The families of docs/metrics.md this view shows; the rest is ignored. */
static void take(scrape *s, GPtrArray *samples)
{
	for (guint i = 0; i < samples->len; i++) {
		const prom_sample *x = g_ptr_array_index(samples, i);
		const char *n = x->name;
		double v = isfinite(x->value) ? x->value : 0;
		if (strcmp(n, "te_transfer_bytes_total") == 0)
			agg_of(s->tp, lbl(x, "transport"), lbl(x, "op"))->bytes += v;
		else if (strcmp(n, "te_transfer_requests_total") == 0)
			agg_of(s->tp, lbl(x, "transport"), lbl(x, "op"))->requests += v;
		else if (strcmp(n, "te_transfer_failed_total") == 0)
			agg_of(s->tp, lbl(x, "transport"), lbl(x, "op"))->failed += v;
		else if (strcmp(n, "te_transfer_latency_seconds_bucket") == 0) {
			const char *le = prom_label_get(x, "le");
			char *end = NULL;
			double b = le == NULL ? NAN : strcmp(le, "+Inf") == 0 ? INFINITY : g_ascii_strtod(le, &end);
			if (!isnan(b) && (end == NULL || *end == '\0'))
				agg_bucket(agg_of(s->tp, lbl(x, "transport"), lbl(x, "op")), b, v);
		} else if (strcmp(n, "te_peer_bytes_total") == 0)
			agg_of(s->peers, lbl(x, "peer"), lbl(x, "op"))->bytes += v;
		else if (strcmp(n, "te_peer_requests_total") == 0)
			agg_of(s->peers, lbl(x, "peer"), lbl(x, "op"))->requests += v;
		else if (strcmp(n, "te_peer_failed_total") == 0)
			agg_of(s->peers, lbl(x, "peer"), lbl(x, "op"))->failed += v;
		else if (strcmp(n, "te_transfer_in_flight") == 0)
			s->in_flight += v;
		else if (strcmp(n, "te_transfer_in_flight_bytes") == 0)
			s->in_flight_bytes += v;
		else if (strcmp(n, "te_device_bandwidth_bytes_per_second") == 0) {
			char *k = g_strdup_printf("%s\t%s", lbl(x, "transport"), lbl(x, "device"));
			double *d = g_hash_table_lookup(s->devbw, k);
			if (d == NULL) {
				d = g_new0(double, 1);
				g_hash_table_insert(s->devbw, k, d);
			} else {
				g_free(k);
			}
			*d += v;
		}
	}
}

/* A counter's increase; a counter that went down was reset (an engine
 * restarted): all of its value is new. */
static double delta(double now, double before)
{
	return now >= before ? now - before : now;
}

/* The q-quantile of the observations between two readings of a histogram,
 * interpolated linearly inside its bucket as Prometheus'
 * histogram_quantile() does. NAN when there were none. */
static double quantile(const agg *now, const agg *before, double q)
{
	double d[MAX_BUCKETS];
	size_t n = now->n_le;

	if (n == 0)
		return NAN;
	for (size_t i = 0; i < n; i++) {
		double b = 0;
		for (size_t k = 0; before != NULL && k < before->n_le; k++)
			if (before->le[k] == now->le[i])
				b = before->cum[k];
		d[i] = delta(now->cum[i], b);
	}
	double total = d[n - 1];
	if (total <= 0)
		return NAN;
	double rank = q * total;
	for (size_t i = 0; i < n; i++) {
		if (d[i] < rank)
			continue;
		if (isinf(now->le[i])) /* the top bucket has no upper bound: its lower one */
			return i > 0 ? now->le[i - 1] : NAN;
		double lo = i > 0 ? now->le[i - 1] : 0, below = i > 0 ? d[i - 1] : 0;
		double in = d[i] - below;
		return in > 0 ? lo + (now->le[i] - lo) * (rank - below) / in : now->le[i];
	}
	return now->le[n - 1];
}

static void fmt_secs(char *buf, size_t n, double s)
{
	if (isnan(s))
		snprintf(buf, n, "-");
	else if (s >= 1)
		snprintf(buf, n, "%.2f s", s);
	else if (s >= 1e-3)
		snprintf(buf, n, "%.2f ms", s * 1e3);
	else
		snprintf(buf, n, "%.1f us", s * 1e6);
}

static gint cmp_keys(gconstpointer a, gconstpointer b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static GPtrArray *sorted_keys(GHashTable *t)
{
	GPtrArray *k = g_ptr_array_new();
	GHashTableIter it;
	gpointer key;

	g_hash_table_iter_init(&it, t);
	while (g_hash_table_iter_next(&it, &key, NULL))
		g_ptr_array_add(k, key);
	g_ptr_array_sort(k, cmp_keys);
	return k;
}

/* One key's movement between two scrapes; `before` is NULL for a key the
 * earlier scrape did not have (all of its counts are new). */
typedef struct change {
	const agg *now, *before;
	double bytes, reqs, failed;
} change;

/* False when the key moved nothing: a line of zeros says nothing. */
static bool changed(GHashTable *now, GHashTable *before, const char *k, change *c)
{
	static const agg zero = { 0 };

	c->now = g_hash_table_lookup(now, k);
	c->before = g_hash_table_lookup(before, k);
	const agg *b = c->before != NULL ? c->before : &zero;
	c->bytes = delta(c->now->bytes, b->bytes);
	c->reqs = delta(c->now->requests, b->requests);
	c->failed = delta(c->now->failed, b->failed);
	return c->reqs != 0 || c->bytes != 0 || c->failed != 0;
}

static void print_view(const char *url, const scrape *now, const scrape *before)
{
	double dt = now->t - before->t;
	char stamp[32];
	time_t wall = time(NULL);
	struct tm tm;

	if (dt <= 0)
		return;
	gmtime_r(&wall, &tm);
	strftime(stamp, sizeof stamp, "%H:%M:%S", &tm);
	printf("%s %s, %.2f s; in flight: %.0f transfers, %.0f bytes\n", stamp, url, dt, now->in_flight,
	       now->in_flight_bytes);
	printf("  %-12s %-5s %12s %12s %10s %10s %10s\n", "transport", "op", "MB/s", "requests/s", "p50", "p99",
	       "failed/s");
	GPtrArray *keys = sorted_keys(now->tp);
	for (guint i = 0; i < keys->len; i++) {
		const char *k = g_ptr_array_index(keys, i);
		change c;
		if (!changed(now->tp, before->tp, k, &c))
			continue;
		char p50[24], p99[24];
		fmt_secs(p50, sizeof p50, quantile(c.now, c.before, 0.50));
		fmt_secs(p99, sizeof p99, quantile(c.now, c.before, 0.99));
		const char *tab = strchr(k, '\t');
		printf("  %-12.*s %-5s %12.2f %12.0f %10s %10s %10.0f\n", (int)(tab - k), k, tab + 1,
		       c.bytes / dt / 1e6, c.reqs / dt, p50, p99, c.failed / dt);
	}
	g_ptr_array_unref(keys);
	keys = sorted_keys(now->peers);
	bool header = false;
	for (guint i = 0; i < keys->len; i++) {
		const char *k = g_ptr_array_index(keys, i);
		change c;
		if (!changed(now->peers, before->peers, k, &c))
			continue;
		if (!header) {
			printf("  %-30s %-5s %12s %12s %10s\n", "peer", "op", "MB/s", "requests/s", "failed/s");
			header = true;
		}
		const char *tab = strchr(k, '\t');
		printf("  %-30.*s %-5s %12.2f %12.0f %10.0f\n", (int)(tab - k), k, tab + 1, c.bytes / dt / 1e6,
		       c.reqs / dt, c.failed / dt);
	}
	g_ptr_array_unref(keys);
	keys = sorted_keys(now->devbw);
	header = false;
	for (guint i = 0; i < keys->len; i++) {
		const char *k = g_ptr_array_index(keys, i);
		const double *bw = g_hash_table_lookup(now->devbw, k);
		if (*bw <= 0)
			continue;
		if (!header) {
			printf("  %-12s %-17s %12s\n", "transport", "device", "MB/s");
			header = true;
		}
		const char *tab = strchr(k, '\t');
		printf("  %-12.*s %-17s %12.2f\n", (int)(tab - k), k, tab + 1, *bw / 1e6);
	}
	g_ptr_array_unref(keys);
	putchar('\n');
	fflush(stdout);
}

static double mono_s(void)
{
	return (double)g_get_monotonic_time() / 1e6;
}

/* One scrape into `s`; false with a line on stderr when it failed, naming
 * the URL as `log_url` (its password hidden). */
static bool scrape_once(teu_http *http, const char *url, const char *log_url, const char *auth, scrape *s)
{
	teu_http_reply r = { 0 };
	char *err = NULL, why[256];
	GPtrArray *samples = NULL;

	int rc = teu_http_request(http, "GET", url, NULL, NULL, 0, auth, 5000, &r, &err);
	if (rc < 0) {
		fprintf(stderr, PROG ": %s: %s\n", log_url, err ? err : g_strerror(-rc));
		g_free(err);
		return false;
	}
	if (r.status != 200) {
		fprintf(stderr, PROG ": %s answered %d%s\n", log_url, r.status,
			r.status == 401 ? " (a token is needed, or it was refused: --token_file)" : "");
		teu_http_reply_clear(&r);
		return false;
	}
	rc = prom_parse(r.body, r.len, &prom_default_limits, &samples, why, sizeof why);
	teu_http_reply_clear(&r);
	if (rc < 0) {
		fprintf(stderr, PROG ": %s: not a metrics text: %s\n", log_url, why);
		return false;
	}
	scrape_init(s);
	s->t = mono_s();
	take(s, samples);
	g_ptr_array_unref(samples);
	return true;
}

int main(int argc, char **argv)
{
	double interval = 1;
	gint64 count = 0;
	char *token_file = NULL, *ca_file = NULL, *auth = NULL, *err = NULL, *log_url = NULL;
	GError *gerr = NULL;
	GOptionEntry entries[] = {
		{ "interval", 'i', 0, G_OPTION_ARG_DOUBLE, &interval, "seconds between scrapes (default 1)", "S" },
		{ "count", 'n', 0, G_OPTION_ARG_INT64, &count, "stop after N views (default: until Ctrl-C)", "N" },
		{ "token_file", 0, 0, G_OPTION_ARG_FILENAME, &token_file,
		  "send 'Authorization: Bearer <token>', the token being FILE's first line (TE_METRICS_TOKEN_FILE)",
		  "FILE" },
		{ "ca_file", 0, 0, G_OPTION_ARG_FILENAME, &ca_file,
		  "for https: trust the CAs in this PEM file (a self-signed endpoint's certificate), not the "
		  "system's", "FILE" },
		{ NULL, 0, 0, 0, NULL, NULL, NULL },
	};
	GOptionContext *oc = g_option_context_new("URL - a running engine's metrics, second by second");
	g_option_context_add_main_entries(oc, entries, NULL);
	g_option_context_set_description(oc, "URL: the endpoint, e.g. http://127.0.0.1:9464/metrics "
					     "(TE_METRICS_ADDR of the engine's process)\n");
	bool parsed = g_option_context_parse(oc, &argc, &argv, &gerr);
	g_option_context_free(oc);
	teu_http *http = NULL;
	scrape before = { 0 }, now = { 0 };
	int rc = 2;
	if (!parsed) {
		fprintf(stderr, PROG ": %s\n", gerr->message);
		g_error_free(gerr);
		goto out;
	}
	if (argc != 2 || !(g_str_has_prefix(argv[1], "http://") || g_str_has_prefix(argv[1], "https://"))) {
		fprintf(stderr, PROG ": want one http:// URL (see --help)\n");
		goto out;
	}
	if (!(interval >= 0.05 && interval <= 3600) || count < 0) {
		fprintf(stderr, PROG ": --interval must lie in [0.05, 3600] and --count must not be negative\n");
		goto out;
	}
	if (token_file != NULL) {
		char *tok = teu_http_read_secret(token_file, &err);
		if (tok == NULL) {
			fprintf(stderr, PROG ": cannot use the token file: %s\n", err);
			g_free(err);
			goto out;
		}
		auth = g_strconcat("Bearer ", tok, NULL);
		teu_http_secret_free(tok);
	}
	teu_http_opts o = { .max_reply = prom_default_limits.max_body, .max_conns = 1, .ca_file = ca_file };
	http = teu_http_new(&o, &err);
	if (http == NULL) {
		fprintf(stderr, PROG ": %s\n", err ? err : "HTTP client failed to start");
		g_free(err);
		rc = 1;
		goto out;
	}
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);

	const char *url = argv[1];
	log_url = teu_redact(url);
	int failures = 0;
	gint64 shown = 0;
	rc = 0;
	bool have_before = scrape_once(http, url, log_url, auth, &before);
	if (!have_before && count > 0) {
		rc = 1; /* a bounded run against nothing: say so at once */
		goto out;
	}
	double next = mono_s() + interval;
	while (!stop && (count == 0 || shown < count)) {
		while (!stop && mono_s() < next)
			g_usleep((gulong)(fmin(0.05, next - mono_s() + 0.001) * 1e6));
		next += interval;
		if (stop)
			break;
		if (!scrape_once(http, url, log_url, auth, &now)) {
			/* Gone for now: the next view starts over from a new reading.
			 * A bounded run gives up after a few tries. */
			rc = 1;
			scrape_clear(&before);
			have_before = false;
			if (count > 0 && ++failures >= 5)
				break;
			continue;
		}
		failures = 0;
		if (have_before) {
			rc = 0;
			print_view(log_url, &now, &before);
			shown++;
		}
		scrape_clear(&before);
		before = now;
		have_before = true;
		now = (scrape){ 0 };
	}
out:
	scrape_clear(&before);
	scrape_clear(&now);
	if (http != NULL)
		teu_http_free(http);
	teu_http_secret_free(auth);
	g_free(log_url);
	g_free(token_file);
	g_free(ca_file);
	return rc;
}
