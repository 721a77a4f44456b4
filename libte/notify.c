/* SPDX-License-Identifier: Apache-2.0 */
/* Notifications: short texts sent to a segment's owner over the RPC socket
 * (Notify frame) and queued on arrival until the application fetches them. */
#include <json-glib/json-glib.h>
#include <string.h>
#include <stdlib.h>

#include "internal.h"
#include "metrics.h"
#include "teu-json.h"

#define QUEUE_MAX 65536

static void notification_free(te_notification *n)
{
	g_free(n->name);
	g_free(n->msg);
	g_free(n);
}

int te_notify_enqueue(te_engine *e, const char *name, const char *msg)
{
	te_notification *n = g_new0(te_notification, 1);

	n->name = g_strdup(name);
	n->msg = g_strdup(msg);
	g_mutex_lock(&e->notify_lock);
	if (g_queue_get_length(&e->notifications) >= QUEUE_MAX) {
		/* An application that never fetches must not grow us without end. */
		notification_free(g_queue_pop_head(&e->notifications));
		te_warn("notification queue full (%d): dropped the oldest", QUEUE_MAX);
	}
	g_queue_push_tail(&e->notifications, n);
	g_mutex_unlock(&e->notify_lock);
	te_metric_count_notify(e, true);
	return 0;
}

void te_notify_clear(te_engine *e)
{
	g_mutex_lock(&e->notify_lock);
	g_queue_clear_full(&e->notifications, (GDestroyNotify)notification_free);
	g_mutex_unlock(&e->notify_lock);
}

static char *notify_json(const char *name, const char *msg)
{
	JsonBuilder *b = json_builder_new();

	json_builder_begin_object(b);
	json_builder_set_member_name(b, "name");
	json_builder_add_string_value(b, name);
	json_builder_set_member_name(b, "notify_msg");
	json_builder_add_string_value(b, msg);
	json_builder_end_object(b);
	return teu_json_finish(b, NULL); /* malloc()ed: the RPC reply is freed with free() */
}

int te_notify_rpc(void *user, const char *peer, const char *body, size_t len, char **reply,
		  size_t *reply_len)
{
	static const te_json_limits lim = TE_JSON_LIMITS_NOTIFY;
	te_engine *e = user;
	char why[160] = "";
	JsonNode *root = te_json_load(body, len, &lim, why, sizeof why), *nn, *mn;
	int rc = TE_ERR_PROTOCOL;

	if (root == NULL || !JSON_NODE_HOLDS_OBJECT(root)) {
		te_warn_limited("notify from %s refused: %s", peer, root ? "not a JSON object" : why);
		goto out;
	}
	nn = json_object_get_member(json_node_get_object(root), "name");
	mn = json_object_get_member(json_node_get_object(root), "notify_msg");
	if (nn == NULL || mn == NULL || json_node_get_value_type(nn) != G_TYPE_STRING ||
	    json_node_get_value_type(mn) != G_TYPE_STRING) {
		te_warn_limited("notify from %s refused: \"name\" and \"notify_msg\" must be strings",
				peer);
		goto out;
	}
	const char *msg = json_node_get_string(mn), *name = json_node_get_string(nn);
	if (strlen(msg) > TE_NOTIFY_MAX || strlen(name) > TE_NOTIFY_MAX) {
		te_warn_limited("notify from %s refused: %s longer than %d bytes", peer,
				strlen(msg) > TE_NOTIFY_MAX ? "message" : "sender name", TE_NOTIFY_MAX);
		goto out;
	}
	te_notify_enqueue(e, name, msg);
	*reply = notify_json("", "success");
	*reply_len = *reply ? strlen(*reply) : 0;
	rc = *reply ? 0 : -ENOMEM;
out:
	if (root != NULL)
		json_node_unref(root);
	return rc;
}

int te_notify_send_name(te_engine *e, const char *segment_name, const char *sender, const char *msg)
{
	char *host = NULL, *body, *reply = NULL;
	size_t reply_len = 0;
	int port = 0, rc;

	rc = te_engine_resolve_rpc(e, segment_name, &host, &port);
	if (rc < 0)
		return rc;
	body = notify_json(sender ? sender : e->name, msg);
	if (body == NULL) {
		g_free(host);
		return -ENOMEM;
	}
	rc = te_rpc_call_addr(e->auth, host, port, TE_RPC_NOTIFY, body, strlen(body), &reply, &reply_len, 0);
	free(body);
	if (rc == 0 && (reply == NULL || strstr(reply, "\"success\"") == NULL)) {
		te_warn("notify to %s: peer answered %.200s", segment_name, reply ? reply : "nothing");
		rc = TE_ERR_REJECTED;
	} else if (rc < 0) {
		te_err("notify to %s (%s:%d) failed: %s", segment_name, host, port, te_strerror(rc));
	} else {
		te_metric_count_notify(e, false); /* delivered: the peer took it */
	}
	free(reply);
	g_free(host);
	return rc;
}

int te_notify_send_as(te_engine *e, te_segment_id seg, const char *sender, const char *msg)
{
	char *name;
	int rc;

	if (e == NULL || msg == NULL) {
		te_err("te_notify_send: NULL %s", e == NULL ? "engine" : "message");
		return -EINVAL;
	}
	if (strlen(msg) > TE_NOTIFY_MAX || (sender != NULL && strlen(sender) > TE_NOTIFY_MAX)) {
		te_err("te_notify_send: %s longer than %d bytes", strlen(msg) > TE_NOTIFY_MAX ? "message" : "sender name",
		       TE_NOTIFY_MAX);
		return -EMSGSIZE;
	}
	name = te_segment_name(e, seg);
	if (name == NULL) {
		te_err("te_notify_send: unknown segment id %d", seg);
		return TE_ERR_SEGMENT;
	}
	rc = te_notify_send_name(e, name, sender, msg);
	g_free(name);
	return rc;
}

int te_notify_send(te_engine *e, te_segment_id seg, const char *msg)
{
	return te_notify_send_as(e, seg, NULL, msg);
}

int te_notify_fetch(te_engine *e, te_notification **out, size_t *count)
{
	if (e == NULL || out == NULL || count == NULL) {
		te_err("te_notify_fetch: NULL argument");
		return -EINVAL;
	}
	*out = NULL;
	*count = 0;
	g_mutex_lock(&e->notify_lock);
	size_t n = g_queue_get_length(&e->notifications);
	if (n > 0) {
		te_notification *arr = calloc(n, sizeof *arr);
		if (arr == NULL) {
			g_mutex_unlock(&e->notify_lock);
			return -ENOMEM;
		}
		for (size_t i = 0; i < n; i++) {
			te_notification *q = g_queue_pop_head(&e->notifications);
			arr[i].name = strdup(q->name);
			arr[i].msg = strdup(q->msg);
			notification_free(q);
		}
		*out = arr;
		*count = n;
	}
	g_mutex_unlock(&e->notify_lock);
	return 0;
}

void te_notifications_free(te_notification *list, size_t count)
{
	if (list == NULL)
		return;
	for (size_t i = 0; i < count; i++) {
		free(list[i].name);
		free(list[i].msg);
	}
	free(list);
}
