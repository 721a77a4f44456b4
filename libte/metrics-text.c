/* SPDX-License-Identifier: Apache-2.0 */
/* te_metrics_text(): the Prometheus text exposition of one engine's
 * snapshot or every counting engine's (docs/metrics.md). */
#include <string.h>

#include "metrics-internal.h"

#if TE_METRICS_BUILD

/* A label value as the text format wants it. */
static void put_label(GString *s, const char *name, const char *v)
{
	g_string_append_printf(s, "%s=\"", name);
	for (; *v; v++) {
		if (*v == '\\')
			g_string_append(s, "\\\\");
		else if (*v == '"')
			g_string_append(s, "\\\"");
		else if (*v == '\n')
			g_string_append(s, "\\n");
		else
			g_string_append_c(s, *v);
	}
	g_string_append_c(s, '"');
}

/* A metric family: its name, type and help line. */
typedef struct fam {
	const char *name, *type, *help;
} fam;

static void family(GString *s, const fam *f)
{
	g_string_append_printf(s, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name, f->type);
}

/* The start of a sample: `name{segment="…"` (the caller adds labels and
 * closes with value_u64 or value_f). */
static void sample(GString *s, const char *name, const snap *sn)
{
	g_string_append_printf(s, "%s{", name);
	put_label(s, "segment", sn->segment);
}

static void label(GString *s, const char *name, const char *v)
{
	g_string_append_c(s, ',');
	put_label(s, name, v);
}

static void value_u64(GString *s, uint64_t v)
{
	g_string_append_printf(s, "} %llu\n", (unsigned long long)v);
}

static void value_f(GString *s, double v)
{
	g_string_append_printf(s, "} %.9g\n", v);
}

/* The start of a sample of one operation of a transport. */
static void tp_sample(GString *s, const char *name, const snap *sn, const tp_snap *t, unsigned op)
{
	sample(s, name, sn);
	label(s, "transport", t->transport);
	label(s, "op", te_mop_names[op]);
}

enum { F_TP_REQ, F_TP_BYTES, F_TP_DONE, F_TP_FAIL, F_TP_CANCEL };

static uint64_t tp_field(const op_snap *o, int f)
{
	switch (f) {
	case F_TP_REQ: return o->requests;
	case F_TP_BYTES: return o->bytes;
	case F_TP_DONE: return o->completed;
	case F_TP_FAIL: return o->failed;
	default: return o->canceled;
	}
}

static void text_of(GString *s, const snap *sns, size_t n)
{
	static const fam tpf[] = {
		{ "te_transfer_requests_total", "counter", "Transfer requests submitted, refused ones included." },
		{ "te_transfer_bytes_total", "counter", "Bytes moved by transfers that ended, partial moves included." },
		{ "te_transfer_completed_total", "counter", "Transfers that completed." },
		{ "te_transfer_failed_total", "counter", "Transfers that failed, timed out, or were refused at submit." },
		{ "te_transfer_canceled_total", "counter", "Transfers canceled." },
	};
	for (int f = 0; f < 5; f++) {
		family(s, &tpf[f]);
		for (size_t i = 0; i < n; i++)
			for (guint j = 0; j < sns[i].tps->len; j++) {
				const tp_snap *t = &g_array_index(sns[i].tps, tp_snap, j);
				for (unsigned op = 0; op < 2; op++) {
					tp_sample(s, tpf[f].name, &sns[i], t, op);
					value_u64(s, tp_field(&t->op[op], f));
				}
			}
	}
	static const fam gf[] = {
		{ "te_transfer_in_flight", "gauge", "Transfers submitted and not ended." },
		{ "te_transfer_in_flight_bytes", "gauge", "Bytes of the transfers submitted and not ended." },
	};
	for (int f = 0; f < 2; f++) {
		family(s, &gf[f]);
		for (size_t i = 0; i < n; i++)
			for (guint j = 0; j < sns[i].tps->len; j++) {
				const tp_snap *t = &g_array_index(sns[i].tps, tp_snap, j);
				sample(s, gf[f].name, &sns[i]);
				label(s, "transport", t->transport);
				value_u64(s, f == 0 ? t->op[0].in_flight + t->op[1].in_flight
						    : t->op[0].in_flight_bytes + t->op[1].in_flight_bytes);
			}
	}
	static const fam lat = { "te_transfer_latency_seconds", "histogram",
				 "Time from submit to the end of a transfer (canceled ones left out)." };
	family(s, &lat);
	for (size_t i = 0; i < n; i++)
		for (guint j = 0; j < sns[i].tps->len; j++) {
			const tp_snap *t = &g_array_index(sns[i].tps, tp_snap, j);
			for (unsigned op = 0; op < 2; op++) {
				const op_snap *o = &t->op[op];
				uint64_t cum = 0;
				for (unsigned k = 0; k < LAT_BUCKETS; k++) {
					char le[32];
					cum += o->lat[k];
					if (k < LAT_BOUNDS)
						g_snprintf(le, sizeof le, "%.6f", (double)(1u << k) / 1e6);
					else
						g_strlcpy(le, "+Inf", sizeof le);
					tp_sample(s, "te_transfer_latency_seconds_bucket", &sns[i], t, op);
					label(s, "le", le);
					value_u64(s, cum);
				}
				tp_sample(s, "te_transfer_latency_seconds_sum", &sns[i], t, op);
				value_f(s, (double)o->lat_sum_ns / 1e9);
				tp_sample(s, "te_transfer_latency_seconds_count", &sns[i], t, op);
				value_u64(s, cum);
			}
		}

	static const fam pf[] = {
		{ "te_peer_bytes_total", "counter", "Bytes moved to or from a peer segment (\"other\": peers not shown one by one)." },
		{ "te_peer_requests_total", "counter", "Transfer requests to a peer segment." },
		{ "te_peer_failed_total", "counter", "Failed transfer requests to a peer segment." },
	};
	for (int f = 0; f < 3; f++) {
		family(s, &pf[f]);
		for (size_t i = 0; i < n; i++)
			for (guint j = 0; j < sns[i].peers->len; j++) {
				const peer_snap *p = &g_array_index(sns[i].peers, peer_snap, j);
				for (unsigned op = 0; op < 2; op++) {
					sample(s, pf[f].name, &sns[i]);
					label(s, "peer", p->name ? p->name : "other");
					label(s, "op", te_mop_names[op]);
					value_u64(s, f == 0 ? p->bytes[op] : f == 1 ? p->requests[op] : p->failed[op]);
				}
			}
	}

	static const fam df[] = {
		{ "te_device_bytes_total", "counter", "Bytes a transport moved through a device." },
		{ "te_device_in_flight_bytes", "gauge", "Bytes posted to a device and not done." },
		{ "te_device_bandwidth_bytes_per_second", "gauge",
		  "The device's bandwidth, a moving average with a time constant of 1 s." },
		{ "te_device_retries_total", "counter", "Requests sent again on a device." },
		{ "te_device_failovers_total", "counter", "Requests moved off a device to another." },
		{ "te_device_errors_total", "counter", "Device errors: links lost, failed work completions." },
	};
	for (int f = 0; f < 6; f++) {
		family(s, &df[f]);
		for (size_t i = 0; i < n; i++)
			for (guint j = 0; j < sns[i].devs->len; j++) {
				const dev_snap *d = &g_array_index(sns[i].devs, dev_snap, j);
				sample(s, df[f].name, &sns[i]);
				label(s, "transport", d->transport);
				label(s, "device", d->name);
				if (f == 2)
					value_f(s, d->bw);
				else
					value_u64(s, f == 0 ? d->bytes : f == 1 ? d->inflight_bytes : f == 3 ? d->retries
										  : f == 4 ? d->failovers
											   : d->errors);
			}
	}

	static const fam tf[] = {
		{ "te_transport_retries_total", "counter", "Requests a transport sent again (its devices' included)." },
		{ "te_transport_failovers_total", "counter", "Requests a transport moved to another device or rail (its devices' included)." },
		{ "te_transport_errors_total", "counter", "Errors of a transport (its devices' included)." },
	};
	for (int f = 0; f < 3; f++) {
		family(s, &tf[f]);
		for (size_t i = 0; i < n; i++)
			for (guint j = 0; j < sns[i].tps->len; j++) {
				const tp_snap *t = &g_array_index(sns[i].tps, tp_snap, j);
				uint64_t v = f == 0 ? t->retries : f == 1 ? t->failovers : t->errors;
				for (guint k = 0; k < sns[i].devs->len; k++) {
					const dev_snap *d = &g_array_index(sns[i].devs, dev_snap, k);
					if (strcmp(d->transport, t->transport) == 0)
						v += f == 0 ? d->retries : f == 1 ? d->failovers : d->errors;
				}
				sample(s, tf[f].name, &sns[i]);
				label(s, "transport", t->transport);
				value_u64(s, v);
			}
	}

	static const fam ef[] = {
		{ "te_notify_sent_total", "counter", "Notifications sent to peers." },
		{ "te_notify_received_total", "counter", "Notifications received from peers." },
		{ "te_registered_memory_bytes", "gauge", "Memory registered with the engine now." },
		{ "te_registered_memory_regions", "gauge", "Regions registered with the engine now." },
		{ "te_auth_refused_total", "counter", "Peers refused by the cluster key." },
	};
	for (int f = 0; f < 5; f++) {
		family(s, &ef[f]);
		for (size_t i = 0; i < n; i++) {
			const snap *x = &sns[i];
			sample(s, ef[f].name, x);
			value_u64(s, f == 0 ? x->notify_sent : f == 1 ? x->notify_received : f == 2 ? x->reg_bytes
								: f == 3 ? x->reg_regions
									 : x->auth_refused);
		}
	}
	static const fam rpc = { "te_rpc_frames_total", "counter", "RPC frames on the handshake port, by kind and result." };
	family(s, &rpc);
	for (size_t i = 0; i < n; i++)
		for (unsigned k = 0; k < TE_MRPC_KINDS; k++)
			for (unsigned r = 0; r < 2; r++) {
				sample(s, "te_rpc_frames_total", &sns[i]);
				label(s, "kind", te_mrpc_names[k]);
				label(s, "result", r ? "refused" : "served");
				value_u64(s, sns[i].rpc[k][r]);
			}
}

int te_metrics_text(te_engine *e, char **text, size_t *len)
{
	if (text == NULL) {
		te_err("te_metrics_text: NULL output");
		return -EINVAL;
	}
	*text = NULL;
	if (len != NULL)
		*len = 0;
	if (e != NULL && e->metrics == NULL)
		return -ENOTSUP;

	GString *s = g_string_sized_new(16384);
	GArray *sns = g_array_new(FALSE, FALSE, sizeof(snap));
	GPtrArray *held = g_ptr_array_new();

	/* The list's lock keeps every engine's counters alive while it is held;
	 * each engine's own lock keeps its tables still while read. */
	g_mutex_lock(&te_mengines_lock);
	if (e != NULL) {
		g_ptr_array_add(held, e->metrics);
	} else if (te_mengines != NULL) {
		for (guint i = 0; i < te_mengines->len; i++)
			g_ptr_array_add(held, g_ptr_array_index(te_mengines, i));
	}
	for (guint i = 0; i < held->len; i++) {
		te_metrics *m = g_ptr_array_index(held, i);
		snap sn;
		g_mutex_lock(&m->lock);
		te_msnap_take(m, &sn);
		g_array_append_val(sns, sn);
	}
	if (held->len > 0)
		text_of(s, (const snap *)(void *)sns->data, sns->len);
	for (guint i = 0; i < held->len; i++) {
		te_metrics *m = g_ptr_array_index(held, i);
		te_msnap_clear(&g_array_index(sns, snap, i));
		g_mutex_unlock(&m->lock);
	}
	g_mutex_unlock(&te_mengines_lock);
	g_ptr_array_unref(held);
	g_array_unref(sns);

	size_t n = s->len;
	*text = te_mas_malloced(g_string_free(s, FALSE), n);
	if (*text == NULL)
		return -ENOMEM;
	if (len != NULL)
		*len = n;
	return 0;
}
#else /* counting compiled out */

int te_metrics_text(te_engine *e, char **text, size_t *len)
{
	(void)e;
	if (text != NULL)
		*text = NULL;
	if (len != NULL)
		*len = 0;
	return -ENOTSUP;
}

#endif