/* SPDX-License-Identifier: Apache-2.0 */
/* te_metrics_text(): the Prometheus text exposition of one engine's
 * snapshot or every counting engine's (docs/metrics.md). */
#include <stddef.h>
#include <stdlib.h>
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

/* A uint64_t at byte `off` of `base`: a row's field in a snapshot. */
static uint64_t at(const void *base, size_t off)
{
	uint64_t v;

	memcpy(&v, (const char *)base + off, sizeof v);
	return v;
}

/* One family per table row; `off` is the row's field in its snapshot
 * structure: a sample per transport and operation, or per transport with
 * both operations summed (`summed`). */
static void text_op(GString *s, const snap *sns, size_t n, const fam *f, size_t off, bool summed)
{
	family(s, f);
	for (size_t i = 0; i < n; i++)
		for (guint j = 0; j < sns[i].tps->len; j++) {
			const tp_snap *t = &g_array_index(sns[i].tps, tp_snap, j);
			if (summed) {
				sample(s, f->name, &sns[i]);
				label(s, "transport", t->transport);
				value_u64(s, at(&t->op[0], off) + at(&t->op[1], off));
				continue;
			}
			for (unsigned op = 0; op < 2; op++) {
				tp_sample(s, f->name, &sns[i], t, op);
				value_u64(s, at(&t->op[op], off));
			}
		}
}

static void text_lat(GString *s, const snap *sns, size_t n, const fam *f)
{
	char name[128];

	family(s, f);
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
					g_snprintf(name, sizeof name, "%s_bucket", f->name);
					tp_sample(s, name, &sns[i], t, op);
					label(s, "le", le);
					value_u64(s, cum);
				}
				g_snprintf(name, sizeof name, "%s_sum", f->name);
				tp_sample(s, name, &sns[i], t, op);
				value_f(s, (double)o->lat_sum_ns / 1e9);
				g_snprintf(name, sizeof name, "%s_count", f->name);
				tp_sample(s, name, &sns[i], t, op);
				value_u64(s, cum);
			}
		}
}

static void text_peer(GString *s, const snap *sns, size_t n, const fam *f, size_t off)
{
	family(s, f);
	for (size_t i = 0; i < n; i++)
		for (guint j = 0; j < sns[i].peers->len; j++) {
			const peer_snap *p = &g_array_index(sns[i].peers, peer_snap, j);
			for (unsigned op = 0; op < 2; op++) {
				sample(s, f->name, &sns[i]);
				label(s, "peer", p->name ? p->name : "other");
				label(s, "op", te_mop_names[op]);
				value_u64(s, at(p, off + op * sizeof(uint64_t)));
			}
		}
}

/* A device's row: a counter or, when `real`, a double. */
static void text_dev(GString *s, const snap *sns, size_t n, const fam *f, size_t off, bool real)
{
	family(s, f);
	for (size_t i = 0; i < n; i++)
		for (guint j = 0; j < sns[i].devs->len; j++) {
			const dev_snap *d = &g_array_index(sns[i].devs, dev_snap, j);
			sample(s, f->name, &sns[i]);
			label(s, "transport", d->transport);
			label(s, "device", d->name);
			if (real) {
				double v;
				memcpy(&v, (const char *)d + off, sizeof v);
				value_f(s, v);
			} else {
				value_u64(s, at(d, off));
			}
		}
}

/* A transport's own count and its devices'. */
static void text_tp(GString *s, const snap *sns, size_t n, const fam *f, size_t off, size_t dev_off)
{
	family(s, f);
	for (size_t i = 0; i < n; i++)
		for (guint j = 0; j < sns[i].tps->len; j++) {
			const tp_snap *t = &g_array_index(sns[i].tps, tp_snap, j);
			uint64_t v = at(t, off);
			for (guint k = 0; k < sns[i].devs->len; k++) {
				const dev_snap *d = &g_array_index(sns[i].devs, dev_snap, k);
				if (strcmp(d->transport, t->transport) == 0)
					v += at(d, dev_off);
			}
			sample(s, f->name, &sns[i]);
			label(s, "transport", t->transport);
			value_u64(s, v);
		}
}

static void text_engine(GString *s, const snap *sns, size_t n, const fam *f, size_t off)
{
	family(s, f);
	for (size_t i = 0; i < n; i++) {
		sample(s, f->name, &sns[i]);
		value_u64(s, at(&sns[i], off));
	}
}

static const char *const rpc_results[TE_MRPC_RESULTS] = {
#define RPC_RESULT_NAME(id, stats) #id,
	TE_MTABLE_RPC_RESULTS(RPC_RESULT_NAME)
};

static void text_rpc(GString *s, const snap *sns, size_t n, const fam *f)
{
	family(s, f);
	for (size_t i = 0; i < n; i++)
		for (unsigned k = 0; k < TE_MRPC_KINDS; k++)
			for (unsigned r = 0; r < TE_MRPC_RESULTS; r++) {
				sample(s, f->name, &sns[i]);
				label(s, "kind", te_mrpc_names[k]);
				label(s, "result", rpc_results[r]);
				value_u64(s, sns[i].rpc[k][r]);
			}
}

/* Every row, in the table's order. */
#define T(scope, id, kind, prom, json, stats, help)                                                        \
	{                                                                                                   \
		static const fam f_ = { prom, TE_MTYPE_##kind, help };                                      \
		T_##scope(id, &f_)                                                                          \
	}
#define T_OP(id, f) text_op(s, sns, n, f, offsetof(op_snap, id), false);
#define T_OPG(id, f) text_op(s, sns, n, f, offsetof(op_snap, id), true);
#define T_LAT(id, f) text_lat(s, sns, n, f);
#define T_PEER(id, f) text_peer(s, sns, n, f, offsetof(peer_snap, id));
#define T_DEV(id, f) text_dev(s, sns, n, f, offsetof(dev_snap, id), false);
#define T_DEVF(id, f)                                                                                      \
	_Static_assert(sizeof(((dev_snap *)0)->id) == sizeof(double), "a DEVF row is a double");           \
	text_dev(s, sns, n, f, offsetof(dev_snap, id), true);
#define T_TP(id, f) text_tp(s, sns, n, f, offsetof(tp_snap, id), offsetof(dev_snap, id));
#define T_ENGINE(id, f) text_engine(s, sns, n, f, offsetof(snap, id));
#define T_RPC(id, f) text_rpc(s, sns, n, f);

static void text_of(GString *s, const snap *sns, size_t n)
{
	TE_MTABLE(T)
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

	/* GLib's memory is not promised to be malloc()'s: te_free() must
	 * release what is returned. */
	size_t n = s->len;
	*text = malloc(n + 1);
	if (*text != NULL)
		memcpy(*text, s->str, n + 1);
	g_string_free(s, TRUE);
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