/* SPDX-License-Identifier: Apache-2.0 */
/* te_engine_stats_json(): one engine's snapshot as JSON (docs/metrics.md). */
#include <json-glib/json-glib.h>
#include <stdlib.h>
#include <string.h>

#include "metrics-internal.h"
#include "teu-json.h"

#if TE_METRICS_BUILD

static void jint(JsonBuilder *b, const char *k, uint64_t v)
{
	json_builder_set_member_name(b, k);
	json_builder_add_int_value(b, (gint64)(v > INT64_MAX ? INT64_MAX : v));
}

static void jstr(JsonBuilder *b, const char *k, const char *v)
{
	json_builder_set_member_name(b, k);
	json_builder_add_string_value(b, v);
}

/* A member holding an array or an object, opened: the caller fills and
 * closes it. */
static void jarray(JsonBuilder *b, const char *k)
{
	json_builder_set_member_name(b, k);
	json_builder_begin_array(b);
}

static void jobject(JsonBuilder *b, const char *k)
{
	json_builder_set_member_name(b, k);
	json_builder_begin_object(b);
}

/* An array's row, opened: an object whose first member `k` names it. */
static void jrow(JsonBuilder *b, const char *k, const char *v)
{
	json_builder_begin_object(b);
	jstr(b, k, v);
}

/* A member at `path`, "group.key" or "key": a group opens an object that
 * stays open while the following members name it too; *open is the one
 * open (NULL: none), closed by a member outside it or by path NULL. */
static void jpath(JsonBuilder *b, const char **open, size_t *open_len, const char *path, uint64_t v)
{
	const char *dot = path != NULL ? strchr(path, '.') : NULL;
	size_t glen = dot != NULL ? (size_t)(dot - path) : 0;

	if (*open != NULL && (dot == NULL || glen != *open_len || strncmp(path, *open, glen) != 0)) {
		json_builder_end_object(b);
		*open = NULL;
	}
	if (path == NULL)
		return;
	if (dot != NULL && *open == NULL) {
		char *g = g_strndup(path, glen);
		jobject(b, g);
		g_free(g);
		*open = path;
		*open_len = glen;
	}
	jint(b, dot != NULL ? dot + 1 : path, v);
}

/* A row's member in the JSON form, by its scope. */
#define J(scope, id, kind, prom, json, stats, help) J_##scope(id, json)
#define J_OP(id, json) jint(b, json, o->id);
#define J_OPG(id, json) jint(b, json, o->id);
#define J_PEER(id, json) jint(b, json, p->id[op]);
#define J_DEV(id, json) jint(b, json, d->id);
#define J_DEVF(id, json)                                                                                   \
	json_builder_set_member_name(b, json);                                                              \
	json_builder_add_double_value(b, d->id);
#define J_TP(id, json) jint(b, json, t->id);
#define J_ENGINE(id, json) jpath(b, &open, &open_len, json, sn->id);
#define J_NAME(scope, id, kind, prom, json, stats, help) json
#define J_RPC(id, stats) jint(b, #id, sn->rpc[k][TE_MRPC_##id]);

static void json_of(const snap *sn, JsonBuilder *b)
{
	const char *open = NULL;
	size_t open_len = 0;

	json_builder_begin_object(b);
	jstr(b, "segment", sn->segment);
	jarray(b, "transports");
	for (guint i = 0; i < sn->tps->len; i++) {
		const tp_snap *t = &g_array_index(sn->tps, tp_snap, i);
		for (unsigned op = 0; op < 2; op++) {
			const op_snap *o = &t->op[op];
			jrow(b, "transport", t->transport);
			jstr(b, "op", te_mop_names[op]);
			TE_MTABLE_OP(J)
			TE_MTABLE_OPG(J)
			jobject(b, TE_MTABLE_LAT(J_NAME));
			jarray(b, "le_us");
			for (unsigned k = 0; k < LAT_BOUNDS; k++)
				json_builder_add_int_value(b, (gint64)1 << k);
			json_builder_end_array(b);
			jarray(b, "counts");
			uint64_t count = 0;
			for (unsigned k = 0; k < LAT_BUCKETS; k++) {
				json_builder_add_int_value(b, (gint64)o->lat[k]);
				count += o->lat[k];
			}
			json_builder_end_array(b);
			jint(b, "sum_us", o->lat_sum_ns / 1000);
			jint(b, "count", count);
			json_builder_end_object(b);
			json_builder_end_object(b);
		}
	}
	json_builder_end_array(b);
	jarray(b, "transport_events");
	for (guint i = 0; i < sn->tps->len; i++) {
		const tp_snap *t = &g_array_index(sn->tps, tp_snap, i);
		jrow(b, "transport", t->transport);
		TE_MTABLE_TP(J)
		json_builder_end_object(b);
	}
	json_builder_end_array(b);
	jarray(b, "peers");
	for (guint i = 0; i < sn->peers->len; i++) {
		const peer_snap *p = &g_array_index(sn->peers, peer_snap, i);
		for (unsigned op = 0; op < 2; op++) {
			jrow(b, "peer", p->name ? p->name : "other");
			json_builder_set_member_name(b, "other");
			json_builder_add_boolean_value(b, p->name == NULL);
			jstr(b, "op", te_mop_names[op]);
			TE_MTABLE_PEER(J)
			json_builder_end_object(b);
		}
	}
	json_builder_end_array(b);
	jarray(b, "devices");
	for (guint i = 0; i < sn->devs->len; i++) {
		const dev_snap *d = &g_array_index(sn->devs, dev_snap, i);
		jrow(b, "transport", d->transport);
		jstr(b, "device", d->name);
		TE_MTABLE_DEV(J)
		json_builder_end_object(b);
	}
	json_builder_end_array(b);
	TE_MTABLE_ENGINE(J)
	jpath(b, &open, &open_len, NULL, 0);
	jarray(b, TE_MTABLE_RPC(J_NAME));
	for (unsigned k = 0; k < TE_MRPC_KINDS; k++) {
		jrow(b, "kind", te_mrpc_names[k]);
		TE_MTABLE_RPC_RESULTS(J_RPC)
		json_builder_end_object(b);
	}
	json_builder_end_array(b);
	json_builder_end_object(b);
}
int te_engine_stats_json(te_engine *e, char **json)
{
	if (e == NULL || json == NULL) {
		te_err("te_engine_stats_json: NULL engine or output");
		return -EINVAL;
	}
	*json = NULL;
	if (e->metrics == NULL)
		return -ENOTSUP;
	te_metrics *m = e->metrics;
	JsonBuilder *b = json_builder_new();
	snap sn;

	g_mutex_lock(&m->lock);
	te_msnap_take(m, &sn);
	json_of(&sn, b);
	te_msnap_clear(&sn);
	g_mutex_unlock(&m->lock);

	*json = teu_json_finish(b, NULL); /* malloc()ed: te_free() releases it */
	return *json != NULL ? 0 : -ENOMEM;
}

#else /* counting compiled out */

int te_engine_stats_json(te_engine *e, char **json)
{
	(void)e;
	if (json != NULL)
		*json = NULL;
	return -ENOTSUP;
}

#endif
