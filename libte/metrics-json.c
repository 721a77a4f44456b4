/* SPDX-License-Identifier: Apache-2.0 */
/* te_engine_stats_json(): one engine's snapshot as JSON (docs/metrics.md). */
#include <json-glib/json-glib.h>
#include <stdlib.h>

#include "metrics-internal.h"

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

static void json_of(const snap *sn, JsonBuilder *b)
{
	json_builder_begin_object(b);
	jstr(b, "segment", sn->segment);
	jarray(b, "transports");
	for (guint i = 0; i < sn->tps->len; i++) {
		const tp_snap *t = &g_array_index(sn->tps, tp_snap, i);
		for (unsigned op = 0; op < 2; op++) {
			const op_snap *o = &t->op[op];
			json_builder_begin_object(b);
			jstr(b, "transport", t->transport);
			jstr(b, "op", te_mop_names[op]);
			jint(b, "requests", o->requests);
			jint(b, "bytes", o->bytes);
			jint(b, "completed", o->completed);
			jint(b, "failed", o->failed);
			jint(b, "canceled", o->canceled);
			jint(b, "in_flight", o->in_flight);
			jint(b, "in_flight_bytes", o->in_flight_bytes);
			jobject(b, "latency");
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
		json_builder_begin_object(b);
		jstr(b, "transport", t->transport);
		jint(b, "retries", t->retries);
		jint(b, "failovers", t->failovers);
		jint(b, "errors", t->errors);
		json_builder_end_object(b);
	}
	json_builder_end_array(b);
	jarray(b, "peers");
	for (guint i = 0; i < sn->peers->len; i++) {
		const peer_snap *p = &g_array_index(sn->peers, peer_snap, i);
		for (unsigned op = 0; op < 2; op++) {
			json_builder_begin_object(b);
			jstr(b, "peer", p->name ? p->name : "other");
			json_builder_set_member_name(b, "other");
			json_builder_add_boolean_value(b, p->name == NULL);
			jstr(b, "op", te_mop_names[op]);
			jint(b, "bytes", p->bytes[op]);
			jint(b, "requests", p->requests[op]);
			jint(b, "failed", p->failed[op]);
			json_builder_end_object(b);
		}
	}
	json_builder_end_array(b);
	jarray(b, "devices");
	for (guint i = 0; i < sn->devs->len; i++) {
		const dev_snap *d = &g_array_index(sn->devs, dev_snap, i);
		json_builder_begin_object(b);
		jstr(b, "transport", d->transport);
		jstr(b, "device", d->name);
		jint(b, "bytes", d->bytes);
		jint(b, "in_flight_bytes", d->inflight_bytes);
		json_builder_set_member_name(b, "bandwidth_bytes_per_second");
		json_builder_add_double_value(b, d->bw);
		jint(b, "retries", d->retries);
		jint(b, "failovers", d->failovers);
		jint(b, "errors", d->errors);
		json_builder_end_object(b);
	}
	json_builder_end_array(b);
	jobject(b, "notifies");
	jint(b, "sent", sn->notify_sent);
	jint(b, "received", sn->notify_received);
	json_builder_end_object(b);
	jobject(b, "memory");
	jint(b, "registered_bytes", sn->reg_bytes);
	jint(b, "registered_regions", sn->reg_regions);
	json_builder_end_object(b);
	jarray(b, "rpc");
	for (unsigned k = 0; k < TE_MRPC_KINDS; k++) {
		json_builder_begin_object(b);
		jstr(b, "kind", te_mrpc_names[k]);
		jint(b, "served", sn->rpc[k][0]);
		jint(b, "refused", sn->rpc[k][1]);
		json_builder_end_object(b);
	}
	json_builder_end_array(b);
	jint(b, "auth_refused", sn->auth_refused);
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

	JsonNode *root = json_builder_get_root(b);
	JsonGenerator *g = json_generator_new();
	json_generator_set_root(g, root);
	gsize len = 0;
	char *text = json_generator_to_data(g, &len);
	g_object_unref(g);
	json_node_unref(root);
	g_object_unref(b);
	*json = te_mas_malloced(text, len);
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
