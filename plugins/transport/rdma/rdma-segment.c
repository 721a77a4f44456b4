/* SPDX-License-Identifier: Apache-2.0 */
/* Remote segments: a peer's descriptor, checked and parsed into its buffers,
 * devices and priority matrix. */
#include <stdio.h>
#include <string.h>

#include "rdma.h"

/* -------------------------------------------------------------- segments */

static void seg_free(rd_seg *seg)
{
	if (seg == NULL)
		return;
	for (size_t i = 0; i < seg->nbuf; i++) {
		g_free(seg->bufs[i].location);
		g_free(seg->bufs[i].rkey);
	}
	g_free(seg->bufs);
	g_free(seg->devs);
	g_free(seg->devnames);
	rd_locs_free(seg->locs, seg->nloc);
	g_free((void *)seg->pair_fail);
	g_free((void *)seg->pause_until);
	g_free(seg->name);
	g_free(seg);
}

static bool get_int(JsonObject *o, const char *name, int64_t lo, int64_t hi, int64_t *out)
{
	JsonNode *n = json_object_get_member(o, name);
	if (n == NULL || !JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_INT64)
		return false;
	int64_t v = json_node_get_int(n);
	if (v < lo || v > hi)
		return false;
	*out = v;
	return true;
}

static int cmp_rbuf(const void *a, const void *b)
{
	const rd_rbuf *x = a, *y = b;
	return x->addr < y->addr ? -1 : x->addr > y->addr;
}

#define SEG_BAD(...)                                                             \
	do {                                                                         \
		g_string_printf(err, __VA_ARGS__);                                       \
		rc = TE_ERR_METADATA;                                                    \
		goto out;                                                                \
	} while (0)

/* A peer's whole segment descriptor, every transport's fields in it. Its
 * own are objects of lists of objects at most (buffers and their keys, the
 * matrix's lists): depth 16 leaves the other transports room. Strings as
 * libte allows them in a descriptor (file paths); counts as its defaults (a
 * segment may hold many buffers). */
static const te_json_limits desc_limits = { 16, TE_JSON_MAX_ITEMS, TE_JSON_MAX_VALUES, 65536,
					    TE_JSON_MAX_TEXT };

static int seg_parse(rd_transport *tr, const te_segment_info *info, rd_seg **out, GString *err)
{
	JsonNode *rootn = NULL;
	JsonObject *root;
	JsonNode *n;
	rd_seg *seg = g_new0(rd_seg, 1);
	bool bad = false;
	int rc = 0;

	*out = NULL;
	seg->tr = tr;
	seg->name = g_strdup(info->name);
	if (info->descriptor == NULL)
		SEG_BAD("no descriptor");
	rootn = rd_json_load(info->descriptor, strlen(info->descriptor), &desc_limits, "descriptor", err);
	if (rootn == NULL) {
		rc = TE_ERR_METADATA;
		goto out;
	}
	if (!JSON_NODE_HOLDS_OBJECT(rootn))
		SEG_BAD("descriptor is not a JSON object");
	root = json_node_get_object(rootn);
	n = json_object_get_member(root, "devices");
	if (n != NULL && !JSON_NODE_HOLDS_ARRAY(n))
		SEG_BAD("\"devices\" is not an array");
	if (n == NULL || json_array_get_length(json_node_get_array(n)) == 0) {
		g_string_assign(err, "it lists no RDMA devices");
		rc = -ENOTSUP;
		goto out;
	}
	JsonArray *da = json_node_get_array(n);
	seg->ndev = (int)json_array_get_length(da);
	if (seg->ndev > RD_MAX_DEV)
		SEG_BAD("%d RDMA devices (at most %d)", seg->ndev, RD_MAX_DEV);
	seg->devs = g_new0(rd_rdev, seg->ndev);
	seg->devnames = g_malloc0_n((gsize)(seg->ndev), RD_NAME_MAX);
	for (int i = 0; i < seg->ndev; i++) {
		JsonNode *e = json_array_get_element(da, (guint)i);
		int64_t lid = 0;
		if (!JSON_NODE_HOLDS_OBJECT(e))
			SEG_BAD("device %d is not an object", i);
		JsonObject *d = json_node_get_object(e);
		const char *nm = rd_json_str(d, "name", &bad);
		const char *gid = rd_json_str(d, "gid", &bad);
		if (nm == NULL || *nm == '\0' || strlen(nm) >= RD_NAME_MAX || strchr(nm, '@'))
			SEG_BAD("device %d has no valid \"name\"", i);
		if (!get_int(d, "lid", 0, 0xffff, &lid))
			SEG_BAD("device %s has no valid \"lid\"", nm);
		if (gid == NULL || !rd_gid_parse(gid, seg->devs[i].gid))
			SEG_BAD("device %s has no valid \"gid\"", nm);
		for (int k = 0; k < i; k++)
			if (strcmp(seg->devs[k].name, nm) == 0)
				SEG_BAD("device %s is listed twice", nm);
		g_strlcpy(seg->devs[i].name, nm, RD_NAME_MAX);
		g_strlcpy(seg->devnames[i], nm, RD_NAME_MAX);
		seg->devs[i].lid = (uint16_t)lid;
		if ((size_t)snprintf(seg->devs[i].nic_path, RD_PATH_MAX, "%s@%s", info->name, nm) >= RD_PATH_MAX)
			SEG_BAD("segment name too long");
	}
	n = json_object_get_member(root, "priority_matrix");
	if (n != NULL) {
		if (!JSON_NODE_HOLDS_OBJECT(n))
			SEG_BAD("\"priority_matrix\" is not an object");
		if (rd_matrix_parse(json_node_get_object(n), seg->devnames, seg->ndev, &seg->locs,
				    &seg->nloc, err) < 0) {
			rc = TE_ERR_METADATA;
			goto out;
		}
	}
	n = json_object_get_member(root, "buffers");
	if (n != NULL && !JSON_NODE_HOLDS_ARRAY(n))
		SEG_BAD("\"buffers\" is not an array");
	if (n != NULL) {
		JsonArray *ba = json_node_get_array(n);
		seg->nbuf = json_array_get_length(ba);
		seg->bufs = g_new0(rd_rbuf, seg->nbuf ? seg->nbuf : 1);
		for (size_t i = 0; i < seg->nbuf; i++) {
			JsonNode *e = json_array_get_element(ba, (guint)i);
			rd_rbuf *b = &seg->bufs[i];
			int64_t addr, len;
			if (!JSON_NODE_HOLDS_OBJECT(e))
				SEG_BAD("buffer %zu is not an object", i);
			JsonObject *bo = json_node_get_object(e);
			if (!get_int(bo, "addr", 1, INT64_MAX, &addr) || !get_int(bo, "length", 1, INT64_MAX, &len))
				SEG_BAD("buffer %zu has no valid addr/length", i);
			b->addr = (uint64_t)addr;
			b->length = (uint64_t)len;
			bool nbad = false;
			const char *loc = rd_json_str(bo, "name", &nbad);
			if (nbad)
				SEG_BAD("buffer %zu: \"name\" is not a string", i);
			b->location = g_strdup(loc ? loc : "");
			/* One key per device, in the order of "devices" (Mooncake's
			 * rule): lkeys are the peer's own, but a count that differs
			 * says its keys and devices disagree. */
			JsonNode *lk = json_object_get_member(bo, "lkey");
			if (lk != NULL && !JSON_NODE_HOLDS_ARRAY(lk))
				SEG_BAD("buffer %zu: \"lkey\" is not an array", i);
			if (lk != NULL && (int)json_array_get_length(json_node_get_array(lk)) != seg->ndev)
				SEG_BAD("buffer %zu has %u lkeys for %d devices", i,
					json_array_get_length(json_node_get_array(lk)), seg->ndev);
			JsonNode *rk = json_object_get_member(bo, "rkey");
			if (rk == NULL)
				continue; /* a buffer of another transport only */
			if (!JSON_NODE_HOLDS_ARRAY(rk))
				SEG_BAD("buffer %zu: \"rkey\" is not an array", i);
			JsonArray *ra = json_node_get_array(rk);
			guint nr = json_array_get_length(ra);
			if (nr == 0)
				continue; /* not remote-accessible */
			if ((int)nr != seg->ndev)
				SEG_BAD("buffer %zu has %u rkeys for %d devices", i, nr, seg->ndev);
			b->rkey = g_new0(uint32_t, nr);
			for (guint k = 0; k < nr; k++) {
				JsonNode *kv = json_array_get_element(ra, k);
				if (!JSON_NODE_HOLDS_VALUE(kv) || json_node_get_value_type(kv) != G_TYPE_INT64 ||
				    json_node_get_int(kv) < 0 || json_node_get_int(kv) > UINT32_MAX)
					SEG_BAD("buffer %zu: rkey %u is not a 32-bit key", i, k);
				b->rkey[k] = (uint32_t)json_node_get_int(kv);
			}
		}
		qsort(seg->bufs, seg->nbuf, sizeof *seg->bufs, cmp_rbuf);
	}
	size_t pairs = (size_t)tr->nctx * (size_t)seg->ndev;
	seg->pair_fail = g_new0(atomic_uint, pairs);
	seg->pause_until = g_new0(_Atomic int64_t, pairs);
out:
	if (rootn != NULL)
		json_node_unref(rootn);
	if (rc < 0) {
		seg_free(seg);
		return rc;
	}
	*out = seg;
	return 0;
}

int rd_segment_open(void *ctx, const te_segment_info *info, void **seg_ctx)
{
	rd_transport *tr = ctx;
	GString *err = g_string_new(NULL);
	rd_seg *seg = NULL;
	int rc = seg_parse(tr, info, &seg, err);

	if (rc == -ENOTSUP)
		RD_LOG(tr, TE_LOG_DEBUG, "segment %s: %s; not served by RDMA", info->name, err->str);
	else if (rc < 0) /* the peer's text: a flood of these is held back */
		TE_HOST_LOG_LIMITED(tr->host, TE_LOG_ERROR, "segment %.200s: descriptor rejected: %s",
				    info->name, err->str);
	g_string_free(err, TRUE);
	*seg_ctx = seg;
	return rc;
}

void rd_segment_close(void *ctx, void *seg_ctx)
{
	(void)ctx;
	seg_free(seg_ctx);
}
