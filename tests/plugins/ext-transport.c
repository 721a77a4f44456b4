/* SPDX-License-Identifier: Apache-2.0 */
/*
 * "ext": a transport built as a third party builds one, standing for any
 * transport the host does not know, to show it gets what the built-in ones
 * get (tests/integration/test-third-transport.c). Built three times:
 *
 * - ext      memory between engines of this process (memcpy), ranked 250 for
 *            automatic choice (between RDMA and TCP); its own descriptor
 *            field "ext_pid", published as 0 by every engine that has not
 *            installed it (default_fields), as TCP's data port is;
 * - extfile  (EXT_FILES) file segments only (TE_TRANSPORT_FILES): a READ
 *            gives byte (seed + offset) & 0xff, seed being its own
 *            descriptor field "extfile_seed";
 * - extold   (EXT_OLD) as ext, but as built against the plugin ABI 1.11
 *            header: its ops table ends before default_fields and priority,
 *            so the host ranks it as it ranked such plugins by name.
 *
 * With the option TE_EXT_MANY=1, ext reports each submit's transfers
 * through one complete_many() (transfer service 2) instead of complete()
 * each, and a transfer of 7 bytes fails with -EIO: what a transport that
 * finishes many slices together hands the host.
 *
 * Each checks its own field in segment_open: absent, it declines
 * (-ENOTSUP); present but not an integer in range, it refuses the segment
 * (-EINVAL) with a log line naming the field. Its probe passes only when
 * the option or variable TE_EXT_PROBE lists its name ("ext,extold"), so
 * that other tests' automatic choices never see it.
 */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <json-glib/json-glib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <te/te-json.h>
#include <te/te-plugin.h>

#include "test-plugin.h"

#if defined(EXT_FILES)
#define EXT_NAME "extfile"
#define EXT_FIELD "extfile_seed"
#define EXT_MAX 255
#elif defined(EXT_OLD)
#define EXT_NAME "extold"
#define EXT_FIELD "extold_pid"
#define EXT_MAX INT32_MAX
#else
#define EXT_NAME "ext"
#define EXT_FIELD "ext_pid"
#define EXT_MAX INT32_MAX
#endif

typedef struct ext_ctx {
	const te_host *host;
	te_complete_many_fn complete_many;
} ext_ctx;

typedef struct ext_seg {
	uint64_t seed;
} ext_seg;

static int ext_probe(const te_host *h, char *why, size_t why_len)
{
	const char *list = h->config(h, "TE_EXT_PROBE", NULL);
	size_t n = strlen(EXT_NAME);

	for (const char *p = list; p != NULL && *p != '\0'; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
		if (strncmp(p, EXT_NAME, n) == 0 && (p[n] == ',' || p[n] == '\0'))
			return 0;
	snprintf(why, why_len, "TE_EXT_PROBE does not list %s", EXT_NAME);
	return -ENODEV;
}

static int ext_create(const te_host *h, const char *args, void **ctx)
{
	ext_ctx *c = calloc(1, sizeof *c);

	(void)args;
	if (c == NULL)
		return -ENOMEM;
	c->host = h;
	const char *many = h->config(h, "TE_EXT_MANY", NULL);
	if (many != NULL && strcmp(many, "1") == 0) {
		c->complete_many = te_host_complete_many_fn(h);
		if (c->complete_many == NULL) {
			h->log(h, TE_LOG_ERROR, EXT_NAME ": TE_EXT_MANY=1 but the host has no complete_many()");
			free(c);
			return -ENOTSUP;
		}
	}
	*ctx = c;
	return 0;
}

static void ext_destroy(void *ctx)
{
	free(ctx);
}

#ifndef EXT_FILES
static int ext_describe(void *ctx, char **json)
{
	char buf[64];

	(void)ctx;
	snprintf(buf, sizeof buf, "{\"" EXT_FIELD "\":%d}", (int)getpid());
	*json = strdup(buf);
	return *json ? 0 : -ENOMEM;
}
#endif

static int ext_segment_open(void *ctx, const te_segment_info *seg, void **seg_ctx)
{
	static const te_json_limits lim = TE_JSON_LIMITS_DEFAULT;
	ext_ctx *c = ctx;
	char why[160] = "no descriptor";
	JsonNode *root = NULL;
	uint64_t v = 0;

	if (seg->descriptor == NULL ||
	    (root = te_json_load(seg->descriptor, strlen(seg->descriptor), &lim, why, sizeof why)) == NULL ||
	    !JSON_NODE_HOLDS_OBJECT(root)) {
		c->host->log(c->host, TE_LOG_ERROR, "segment %s: descriptor is not a JSON object (%s)", seg->name,
			     root ? "another JSON value" : why);
		if (root != NULL)
			json_node_unref(root);
		return -EINVAL;
	}
	int rc = te_json_get_u64(json_node_get_object(root), EXT_FIELD, EXT_MAX, &v);
	json_node_unref(root);
	if (rc == -ENOENT)
		return -ENOTSUP; /* not a segment of ours */
	if (rc < 0) {
		TE_HOST_LOG_LIMITED(c->host, TE_LOG_ERROR,
				    "segment %.200s: descriptor rejected: \"" EXT_FIELD "\" is not an integer from 0 to %d",
				    seg->name, EXT_MAX);
		return -EINVAL;
	}
#ifdef EXT_FILES
	/* The host hands a file segment's buffers without addresses. */
	for (size_t i = 0; i < seg->n_buffers; i++)
		if (seg->buffers[i].addr != 0)
			return -EINVAL;
	ext_seg *s = calloc(1, sizeof *s);
	if (s == NULL)
		return -ENOMEM;
	s->seed = v;
	*seg_ctx = s;
#else
	if (v != (uint64_t)getpid())
		return -ENOTSUP; /* 0: the engine has not installed us; else another process */
	*seg_ctx = NULL;
#endif
	return 0;
}

static void ext_segment_close(void *ctx, void *seg_ctx)
{
	(void)ctx;
	free(seg_ctx);
}

/* Moves one transfer: 0 or a negative error. */
static int ext_move(te_transfer *t)
{
#ifdef EXT_FILES
	const ext_seg *s = t->seg_ctx;
	if (t->opcode == TE_OP_READ)
		for (uint64_t k = 0; k < t->length; k++)
			((unsigned char *)t->local)[k] = (unsigned char)(s->seed + t->remote + k);
#else
	void *remote = (void *)(uintptr_t)t->remote;
	if (t->opcode == TE_OP_READ)
		memcpy(t->local, remote, t->length);
	else
		memcpy(remote, t->local, t->length);
#endif
	return 0;
}

static int ext_submit(void *ctx, te_transfer *const *ts, size_t n)
{
	ext_ctx *c = ctx;

	if (c->complete_many != NULL) {
		uint64_t *bytes = calloc(n ? n : 1, sizeof *bytes);
		int *errs = calloc(n ? n : 1, sizeof *errs);
		if (bytes == NULL || errs == NULL) {
			free(bytes);
			free(errs);
			return -ENOMEM;
		}
		for (size_t i = 0; i < n; i++) {
			errs[i] = c->host->canceled(c->host, ts[i]) ? -ECANCELED
				  : ts[i]->length == 7			? -EIO
									: ext_move(ts[i]);
			bytes[i] = errs[i] ? 0 : ts[i]->length;
		}
		c->complete_many(c->host, ts, bytes, errs, n);
		free(bytes);
		free(errs);
		return 0;
	}
	for (size_t i = 0; i < n; i++) {
		te_transfer *t = ts[i];
		if (c->host->canceled(c->host, t)) {
			c->host->complete(c->host, t, 0, -ECANCELED);
			continue;
		}
		int rc = ext_move(t);
		c->host->complete(c->host, t, rc ? 0 : t->length, rc);
	}
	return 0;
}

static const te_transport_ops ext_ops = {
#ifdef EXT_OLD
	/* The table a plugin built against the 1.11 header has. */
	.size = offsetof(te_transport_ops, default_fields),
#else
	.size = sizeof(te_transport_ops),
#endif
#ifdef EXT_FILES
	.flags = TE_TRANSPORT_FILES,
#else
	.flags = TE_TRANSPORT_MEMORY,
	.describe = ext_describe,
#endif
	.probe = ext_probe,
	.create = ext_create,
	.destroy = ext_destroy,
	.segment_open = ext_segment_open,
	.segment_close = ext_segment_close,
	.submit = ext_submit,
#if !defined(EXT_OLD) && !defined(EXT_FILES)
	.default_fields = "{\"" EXT_FIELD "\":0}",
	.priority = 250,
#endif
};

#ifdef EXT_OLD
TEST_PLUGIN_DEFINE_MINOR(11, TE_KIND_TRANSPORT, EXT_NAME, "1.0.0", "test: a transport of plugin ABI 1.11", &ext_ops)
#else
TE_PLUGIN_DEFINE(TE_KIND_TRANSPORT, EXT_NAME, "1.0.0", "test: a transport the host does not know", "Apache-2.0",
		 &ext_ops)
#endif
