/* SPDX-License-Identifier: Apache-2.0 */
/* Mooncake's notifications over te_notify_*. */
#include "mc-internal.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ----------------------------------------------------------- notifications */

MC_API notify_msg_t *getNotifsFromEngine(transfer_engine_t engine, int *size)
{
	static const char fn[] = "getNotifsFromEngine";
	struct mc_engine *e;
	te_notification *list = NULL;
	notify_msg_t *out;
	size_t fetched = 0, count;
	int rc;

	if (size == NULL) {
		mc_err("%s: NULL size pointer", fn);
		return NULL;
	}
	*size = 0;
	e = engine_of(fn, engine);
	if (e == NULL)
		return NULL;
	rc = te_notify_fetch(e->te, &list, &fetched);
	if (rc < 0) {
		mc_err("%s: %s", fn, te_strerror(rc));
		return NULL;
	}
	if (fetched == 0) {
		te_notifications_free(list, fetched);
		return NULL;
	}
	count = fetched;
	if (count > INT_MAX) {
		mc_err("%s: %zu notifications, only %d returned, the rest dropped", fn, count,
		       INT_MAX);
		count = INT_MAX; /* the tail is released below with the whole list */
	}
	out = calloc(count, sizeof *out);
	for (size_t i = 0; out != NULL && i < count; i++) {
		out[i].name = strdup(list[i].name != NULL ? list[i].name : "");
		out[i].msg = strdup(list[i].msg != NULL ? list[i].msg : "");
		if (out[i].name == NULL || out[i].msg == NULL) {
			freeNotifsMsgBuf(out, (int)i + 1);
			out = NULL;
		}
	}
	te_notifications_free(list, fetched);
	if (out == NULL) {
		mc_err("%s: out of memory: %zu notifications dropped", fn, count);
		return NULL;
	}
	*size = (int)count;
	return out;
}

MC_API int freeNotifsMsgBuf(notify_msg_t *msg, int size)
{
	if (msg == NULL)
		return 0;
	if (size < 0) {
		mc_err("freeNotifsMsgBuf: negative size %d (nothing freed)", size);
		return ERR_INVALID_ARGUMENT;
	}
	for (int i = 0; i < size; i++) {
		free(msg[i].name);
		free(msg[i].msg);
	}
	free(msg);
	return 0;
}

MC_API int genNotifyInEngine(transfer_engine_t engine, uint64_t target_id, notify_msg_t notify_msg)
{
	static const char fn[] = "genNotifyInEngine";
	struct mc_engine *e = engine_of(fn, engine);
	int rc;

	if (e == NULL)
		return ERR_INVALID_ARGUMENT;
	if (target_id > INT32_MAX) {
		mc_err("%s: segment id %llu out of range", fn, (unsigned long long)target_id);
		return ERR_INVALID_ARGUMENT;
	}
	if (notify_msg.msg == NULL) {
		mc_err("%s: NULL msg", fn);
		return ERR_INVALID_ARGUMENT;
	}
	rc = te_notify_send_as(e->te, (te_segment_id)target_id, notify_msg.name, notify_msg.msg);
	if (rc < 0)
		mc_err("%s: to segment %llu: %s", fn, (unsigned long long)target_id, te_strerror(rc));
	return to_err(fn, rc);
}
