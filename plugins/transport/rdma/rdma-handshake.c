/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Connection frame's JSON (docs/wire.md, "The RDMA Connection frame"), in
 * Mooncake's field set: compact, keys sorted, GIDs as 16 bytes "%02x" joined
 * by ':'.
 *   {"local_gid":"fe:80:...","local_lid":0,"local_nic_path":"h:p@mlx5_0",
 *    "payload":"","peer_nic_path":"h2:p2@mlx5_1","qp_num":[1234,1235],
 *    "ready_ack":false,"reply_msg":""}
 * Decoding trusts nothing: the text passes te_json_check() with the limits
 * of this small format before json-glib sees it, then every field's type and
 * range is checked.
 */
#include <stdio.h>
#include <string.h>

#include "rdma.h"

void rd_gid_format(const uint8_t gid[16], char out[48])
{
	for (int i = 0; i < 16; i++)
		snprintf(out + i * 3, 4, i < 15 ? "%02x:" : "%02x", gid[i]);
}

bool rd_gid_parse(const char *s, uint8_t gid[16])
{
	if (s == NULL || strlen(s) != 47)
		return false;
	for (int i = 0; i < 16; i++) {
		const char *p = s + i * 3;
		if (!g_ascii_isxdigit(p[0]) || !g_ascii_isxdigit(p[1]) || (i < 15 && p[2] != ':'))
			return false;
		gid[i] = (uint8_t)(g_ascii_xdigit_value(p[0]) << 4 | g_ascii_xdigit_value(p[1]));
	}
	return true;
}

/* No control characters: NIC paths and messages are names and text, and
 * json-glib writes some control characters back unescaped (0x1f) and the
 * others six bytes long, past what a handshake may hold. */
static bool printable(const char *s)
{
	for (; *s != '\0'; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return false;
	return true;
}

bool rd_nic_path_split(const char *path, char *server, size_t ssize, char *dev, size_t dsize)
{
	const char *at = path ? strrchr(path, '@') : NULL;

	if (at == NULL || at == path || at[1] == '\0')
		return false;
	if ((size_t)(at - path) >= ssize || strlen(at + 1) >= dsize)
		return false;
	memcpy(server, path, (size_t)(at - path));
	server[at - path] = '\0';
	g_strlcpy(dev, at + 1, dsize);
	return true;
}

char *rd_hs_encode(const rd_hs *hs, size_t *len)
{
	JsonBuilder *b = json_builder_new();
	char gid[48];

	rd_gid_format(hs->local_gid, gid);
	json_builder_begin_object(b);
	json_builder_set_member_name(b, "local_gid");
	json_builder_add_string_value(b, gid);
	json_builder_set_member_name(b, "local_lid");
	json_builder_add_int_value(b, hs->local_lid);
	json_builder_set_member_name(b, "local_nic_path");
	json_builder_add_string_value(b, hs->local_nic_path);
	json_builder_set_member_name(b, "payload");
	json_builder_add_string_value(b, "");
	json_builder_set_member_name(b, "peer_nic_path");
	json_builder_add_string_value(b, hs->peer_nic_path);
	json_builder_set_member_name(b, "qp_num");
	json_builder_begin_array(b);
	for (int i = 0; i < hs->nqp; i++)
		json_builder_add_int_value(b, hs->qp_num[i]);
	json_builder_end_array(b);
	json_builder_set_member_name(b, "ready_ack");
	json_builder_add_boolean_value(b, hs->ready_ack);
	json_builder_set_member_name(b, "reply_msg");
	json_builder_add_string_value(b, hs->reply_msg);
	json_builder_end_object(b);
	/* The host frees replies with free(): malloc()ed memory. */
	return teu_json_finish(b, len);
}

JsonNode *rd_json_load(const char *text, size_t len, const te_json_limits *lim, const char *what,
		       GString *err)
{
	char why[200];
	JsonNode *root;

	if (text == NULL) {
		g_string_printf(err, "%s: no text", what);
		return NULL;
	}
	root = te_json_load(text, len, lim, why, sizeof why);
	if (root == NULL)
		g_string_printf(err, "%s refused: %s", what, why);
	return root;
}

const char *rd_json_str(JsonObject *o, const char *name, bool *bad)
{
	JsonNode *n = json_object_get_member(o, name);
	if (n == NULL)
		return NULL;
	if (!JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_STRING) {
		*bad = true;
		return NULL;
	}
	return json_node_get_string(n);
}

/* The whole frame is one flat object of short strings, small numbers and the
 * QP numbers: Mooncake's frames are far inside these. */
static const te_json_limits hs_limits = {
	.max_depth = 2,                       /* the object and "qp_num" */
	.max_items = G_N_ELEMENTS(((rd_hs *)0)->qp_num), /* members; QP numbers */
	.max_values = 160,
	.max_string = 1024,                   /* NIC paths are < RD_PATH_MAX, replies short */
	.max_text = 16384,
};

/* Member `name` of a handshake, a NIC path (server@device, printable, shorter
 * than `size`), copied to `dst`. */
static bool nic_path(JsonObject *o, const char *name, char *dst, size_t size, GString *err)
{
	bool bad = false;
	const char *s = rd_json_str(o, name, &bad);

	if (s == NULL || strlen(s) >= size || strchr(s, '@') == NULL || !printable(s)) {
		g_string_printf(err, "handshake: missing or bad \"%s\" (want server@device)", name);
		return false;
	}
	g_strlcpy(dst, s, size);
	return true;
}

int rd_hs_decode(const char *json, size_t len, rd_hs *hs, GString *err)
{
	JsonNode *root = NULL;
	JsonObject *o;
	JsonNode *n;
	const char *s;
	bool bad = false;
	int rc = -EINVAL;

	memset(hs, 0, sizeof *hs);
	if (json == NULL || len == 0) {
		g_string_assign(err, "handshake is empty");
		goto out;
	}
	root = rd_json_load(json, len, &hs_limits, "handshake", err);
	if (root == NULL)
		goto out;
	if (!JSON_NODE_HOLDS_OBJECT(root)) {
		g_string_assign(err, "handshake is not a JSON object");
		goto out;
	}
	o = json_node_get_object(root);

	if (!nic_path(o, "local_nic_path", hs->local_nic_path, sizeof hs->local_nic_path, err) ||
	    !nic_path(o, "peer_nic_path", hs->peer_nic_path, sizeof hs->peer_nic_path, err))
		goto out;

	s = rd_json_str(o, "reply_msg", &bad);
	if (bad || (s != NULL && !printable(s))) {
		g_string_assign(err, "handshake: \"reply_msg\" is not a string of printable text");
		goto out;
	}
	g_strlcpy(hs->reply_msg, s ? s : "", sizeof hs->reply_msg);
	/* A long message is cut; cut at a character's start, so that it stays
	 * UTF-8 when it is written again. */
	const char *valid_end;
	if (!g_utf8_validate(hs->reply_msg, -1, &valid_end))
		hs->reply_msg[valid_end - hs->reply_msg] = '\0';

	n = json_object_get_member(o, "ready_ack");
	if (n != NULL) {
		if (!JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_BOOLEAN) {
			g_string_assign(err, "handshake: \"ready_ack\" is not a boolean");
			goto out;
		}
		hs->ready_ack = json_node_get_boolean(n);
	}
	n = json_object_get_member(o, "local_lid");
	if (n != NULL) {
		if (!JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_INT64 ||
		    json_node_get_int(n) < 0 || json_node_get_int(n) > 0xffff) {
			g_string_assign(err, "handshake: \"local_lid\" is not a 16-bit LID");
			goto out;
		}
		hs->local_lid = (uint16_t)json_node_get_int(n);
	}
	s = rd_json_str(o, "local_gid", &bad);
	if (bad || (s != NULL && *s != '\0' && !rd_gid_parse(s, hs->local_gid))) {
		g_string_assign(err, "handshake: \"local_gid\" is not 16 hex bytes joined by ':'");
		goto out;
	}
	if ((s == NULL || *s == '\0') && hs->reply_msg[0] == '\0' && !hs->ready_ack) {
		g_string_assign(err, "handshake: \"local_gid\" is missing");
		goto out;
	}
	rd_json_str(o, "payload", &bad);
	if (bad) {
		g_string_assign(err, "handshake: \"payload\" is not a string");
		goto out;
	}

	n = json_object_get_member(o, "qp_num");
	if (n != NULL) {
		if (!JSON_NODE_HOLDS_ARRAY(n)) {
			g_string_assign(err, "handshake: \"qp_num\" is not an array");
			goto out;
		}
		JsonArray *a = json_node_get_array(n);
		guint cnt = json_array_get_length(a);
		if (cnt > G_N_ELEMENTS(hs->qp_num)) {
			g_string_printf(err, "handshake: %u QP numbers (at most %zu)", cnt,
					G_N_ELEMENTS(hs->qp_num));
			goto out;
		}
		for (guint i = 0; i < cnt; i++) {
			JsonNode *e = json_array_get_element(a, i);
			if (!JSON_NODE_HOLDS_VALUE(e) || json_node_get_value_type(e) != G_TYPE_INT64 ||
			    json_node_get_int(e) < 0 || json_node_get_int(e) > 0xffffff) {
				g_string_printf(err, "handshake: qp_num[%u] is not a 24-bit QP number", i);
				goto out;
			}
			hs->qp_num[i] = (uint32_t)json_node_get_int(e);
		}
		hs->nqp = (int)cnt;
	}
	if (hs->nqp == 0 && hs->reply_msg[0] == '\0' && !hs->ready_ack) {
		g_string_assign(err, "handshake: no QP numbers");
		goto out;
	}
	rc = 0;
out:
	if (root != NULL)
		json_node_unref(root);
	return rc;
}

/* Plugins do not link libte: name its error codes here. */
const char *rd_strerror(int err)
{
	switch (err) {
	case 0: return "success";
	case TE_ERR_PLUGIN: return "plugin error";
	case TE_ERR_NO_TRANSPORT: return "no transport reaches the segment";
	case TE_ERR_METADATA: return "bad or unavailable metadata";
	case TE_ERR_PROTOCOL: return "protocol violation by the peer";
	case TE_ERR_REJECTED: return "rejected by the peer";
	case TE_ERR_ADDRESS: return "address not registered or outside a buffer";
	default: return err < 0 && err > -4096 ? g_strerror(-err) : "unknown error";
	}
}
