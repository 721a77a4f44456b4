/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Segment descriptors in Mooncake's JSON (docs/wire.md, "Segment
 * descriptors"): encoded compact with sorted keys from the engine's registry
 * and the fields each transport contributes; decoded with every field of the
 * envelope checked (name, protocol, auth, buffers), since the text comes
 * from a peer or a shared store. A transport's own fields are its to check,
 * in its segment_open: the host reads none of them.
 */
#include <json-glib/json-glib.h>
#include <string.h>

#include "internal.h"
#include "teu-search.h"

void te_desc_free(te_desc *d)
{
	if (d == NULL)
		return;
	for (size_t i = 0; i < d->n_buffers; i++)
		g_free(d->buffers[i].name);
	g_free(d->buffers);
	g_free(d->name);
	g_free(d->protocol);
	g_free(d->auth);
	g_free(d->json);
	g_free(d);
}

/* An unsigned member no larger than `max`; absent leaves *out as it is. */
static bool get_u64(JsonObject *o, const char *member, uint64_t max, uint64_t *out, bool *present)
{
	int rc = te_json_get_u64(o, member, max, out);

	*present = rc != -ENOENT;
	return rc == 0 || rc == -ENOENT;
}

static const char *get_str(JsonObject *o, const char *member)
{
	JsonNode *n = json_object_get_member(o, member);

	if (n == NULL || !JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_STRING)
		return NULL;
	return json_node_get_string(n);
}

static gint cmp_buf(gconstpointer a, gconstpointer b)
{
	const te_desc_buffer *x = a, *y = b;
	return x->addr < y->addr ? -1 : x->addr > y->addr;
}

#define BAD(...)                                                                 \
	do {                                                                         \
		te_warn_limited("segment descriptor rejected: " __VA_ARGS__);            \
		goto fail;                                                               \
	} while (0)

int te_desc_decode_dom(const char *json, size_t len, te_desc_files_fn files, te_desc **out)
{
	static const te_json_limits lim = TE_JSON_LIMITS_DESC;
	JsonNode *rootn = NULL;
	char why[160] = "empty";
	te_desc *d = NULL;
	JsonObject *root;
	JsonNode *bn;
	const char *s;
	bool present;

	*out = NULL;
	if (json == NULL || len == 0 || (rootn = te_json_load(json, len, &lim, why, sizeof why)) == NULL) {
		te_warn_limited("segment descriptor rejected: %s", why);
		return TE_ERR_METADATA;
	}
	d = g_new0(te_desc, 1);
	if (!JSON_NODE_HOLDS_OBJECT(rootn))
		BAD("not a JSON object");
	root = json_node_get_object(rootn);

	s = get_str(root, "name");
	if (s == NULL)
		s = get_str(root, "server_name");
	if (s == NULL || *s == '\0' || strlen(s) >= TE_MAX_NAME)
		BAD("missing or bad \"name\"");
	d->name = g_strdup(s);
	s = get_str(root, "protocol");
	if (s == NULL || *s == '\0' || strlen(s) > 64)
		BAD("missing or bad \"protocol\" in %s", d->name);
	d->protocol = g_strdup(s);
	d->file_segment = files(d->protocol);
	if (json_object_get_member(root, "auth") != NULL) {
		s = get_str(root, "auth");
		if (s == NULL || *s == '\0' || strlen(s) > 64)
			BAD("bad \"auth\" in %s", d->name);
		d->auth = g_strdup(s);
	}

	bn = json_object_get_member(root, "buffers");
	if (bn != NULL) {
		JsonArray *arr;
		if (!JSON_NODE_HOLDS_ARRAY(bn))
			BAD("\"buffers\" is not an array in %s", d->name);
		arr = json_node_get_array(bn);
		d->n_buffers = json_array_get_length(arr);
		d->buffers = g_new0(te_desc_buffer, d->n_buffers ? d->n_buffers : 1);
		for (guint i = 0; i < d->n_buffers; i++) {
			JsonNode *en = json_array_get_element(arr, i);
			JsonObject *b;
			te_desc_buffer *db = &d->buffers[i];

			if (!JSON_NODE_HOLDS_OBJECT(en))
				BAD("buffer %u is not an object in %s", i, d->name);
			b = json_node_get_object(en);
			if (!get_u64(b, "length", UINT64_MAX, &db->length, &present) || !present || db->length == 0)
				BAD("buffer %u of %s: missing or bad \"length\"", i, d->name);
			if (!get_u64(b, "addr", UINT64_MAX, &db->addr, &present))
				BAD("buffer %u of %s: bad \"addr\"", i, d->name);
			if (db->addr + db->length < db->addr)
				BAD("buffer %u of %s: addr + length overflows", i, d->name);
			s = get_str(b, "name");
			if (d->file_segment) {
				d->file_size += db->length;
				if (d->file_size < db->length)
					BAD("file segment %s: total length overflows", d->name);
				db->name = g_strdup(s ? s : "");
				continue;
			}
			if (!present || db->addr == 0)
				BAD("buffer %u of %s: missing or zero \"addr\"", i, d->name);
			if (s == NULL || *s == '\0')
				BAD("buffer %u of %s: missing \"name\"", i, d->name);
			db->name = g_strdup(s);
		}
		if (!d->file_segment && d->n_buffers > 1)
			qsort(d->buffers, d->n_buffers, sizeof *d->buffers,
			      (int (*)(const void *, const void *))cmp_buf);
	}
	d->json = g_strndup(json, len);
	json_node_unref(rootn);
	*out = d;
	return 0;
fail:
	json_node_unref(rootn);
	te_desc_free(d);
	return TE_ERR_METADATA;
}

static uint64_t buffer_start(const void *arr, size_t i)
{
	return ((const te_desc_buffer *)arr)[i].addr;
}

size_t te_desc_slot(const te_desc *d, uint64_t addr, uint64_t len)
{
	if (addr + len < addr)
		return 0;
	if (d->file_segment) /* files laid end to end: one space */
		return addr <= d->file_size && len <= d->file_size - addr ? 1 : 0;
	/* the last buffer starting at or below addr */
	size_t n = teu_count_at_or_below(d->buffers, d->n_buffers, buffer_start, addr);
	if (n == 0)
		return 0;
	const te_desc_buffer *b = &d->buffers[n - 1];
	return teu_span_within(addr, len, b->addr, b->length) ? n : 0;
}

bool te_desc_contains(const te_desc *d, uint64_t addr, uint64_t len)
{
	return te_desc_slot(d, addr, len) != 0;
}

/* ------------------------------------------------------------ fast path */

/*
 * A descriptor lists every buffer its engine registered: a peer with 10,000
 * of them sends close to 1 MB, and a document tree of it costs an open tens
 * of milliseconds in allocations alone. Text without a backslash (what libte
 * and Mooncake write) is read here instead, in one pass with no allocation
 * but the result's, after te_json_check() has accepted it: so every token
 * below is well formed and within the limits, and keys are compared as they
 * are written. What it takes and refuses is what te_desc_decode_dom() takes
 * and refuses (the test internal compares them).
 */
typedef struct jcur {
	const char *p, *end;
} jcur;

/* The byte at the cursor, NUL at the end (the check let no NUL through). */
static inline char jch(const jcur *c)
{
	return c->p < c->end ? *c->p : '\0';
}

static void jws(jcur *c)
{
	while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
		c->p++;
}

/* A string token (no escapes here): its bytes. */
static void jstr(jcur *c, const char **s, size_t *n)
{
	const char *q = c->p + 1 < c->end ? memchr(c->p + 1, '"', (size_t)(c->end - c->p - 1)) : NULL;
	if (q == NULL) /* not after the check; kept from reading past the text all the same */
		q = c->end - 1;
	*s = c->p + 1;
	*n = q >= *s ? (size_t)(q - *s) : 0;
	c->p = q + 1;
}

static bool jkey(const char *s, size_t n, const char *want)
{
	return strlen(want) == n && memcmp(s, want, n) == 0;
}

/* Skips one value: a container by counting brackets outside strings (the
 * check matched them), a string by its closing quote, else up to the next
 * delimiter. */
static void jskip(jcur *c)
{
	jws(c);
	char ch = jch(c);
	const char *s;
	size_t n;
	if (ch == '"') {
		jstr(c, &s, &n);
	} else if (ch == '{' || ch == '[') {
		int depth = 0;
		while (c->p < c->end) {
			ch = *c->p;
			if (ch == '"') {
				jstr(c, &s, &n);
				continue;
			}
			c->p++;
			if (ch == '{' || ch == '[')
				depth++;
			else if ((ch == '}' || ch == ']') && --depth == 0)
				break;
		}
	} else {
		while (c->p < c->end && strchr(",]} \t\r\n", *c->p) == NULL)
			c->p++;
	}
}

/* A value as json-glib's int64 would hold it: 1 with it in *v when it is
 * an integer token that is not negative, 0 for any other value (skipped),
 * -1 for a negative integer. */
static int jint(jcur *c, uint64_t *v)
{
	jws(c);
	const char *s = c->p;
	bool neg = jch(c) == '-';
	if (!neg && (jch(c) < '0' || jch(c) > '9')) {
		jskip(c);
		return 0;
	}
	const char *q = s + neg;
	uint64_t x = 0;
	while (q < c->end && *q >= '0' && *q <= '9')
		x = x * 10 + (uint64_t)(*q++ - '0'); /* the check kept it within int64 */
	if (q < c->end && (*q == '.' || *q == 'e' || *q == 'E')) {
		jskip(c);
		return 0;
	}
	c->p = q;
	*v = x;
	return neg && x != 0 ? -1 : 1;
}

/* Past an element of an array or a member of an object: its comma, if any,
 * and the blanks around it. The text passed the check: no other byte can
 * stand there. */
static void jnext(jcur *c)
{
	jws(c);
	if (jch(c) == ',')
		c->p++;
	jws(c);
}

/* Past the bracket that closes an array or an object. */
static void jclose(jcur *c)
{
	if (c->p < c->end)
		c->p++;
}

/* The number of elements of an array value, or -1 (skipped) for another. */
static gssize jarray_len(jcur *c)
{
	jws(c);
	if (jch(c) != '[') {
		jskip(c);
		return -1;
	}
	gssize n = 0;
	c->p++;
	jws(c);
	while (c->p < c->end && *c->p != ']') {
		jskip(c);
		n++;
		jnext(c);
	}
	jclose(c);
	return n;
}

/* Walks the members of the object at c->p, calling fn for each with the
 * cursor at its value; fn consumes the value. Returns false when the value
 * at c->p is not an object (skipped). */
typedef bool (*jmember_fn)(jcur *c, const char *key, size_t klen, void *user);

static bool jobject(jcur *c, jmember_fn fn, void *user)
{
	jws(c);
	if (jch(c) != '{') {
		jskip(c);
		return false;
	}
	c->p++;
	jws(c);
	while (c->p < c->end && *c->p != '}') {
		const char *k;
		size_t kn;
		jstr(c, &k, &kn);
		jws(c);
		if (c->p < c->end)
			c->p++; /* ':' */
		jws(c);
		if (!fn(c, k, kn, user))
			return false;
		jnext(c);
	}
	jclose(c);
	return true;
}

/* A string value (0 with it), or -1 for another kind (skipped). */
static int jstring_value(jcur *c, const char **s, size_t *n)
{
	jws(c);
	if (jch(c) != '"') {
		jskip(c);
		return -1;
	}
	jstr(c, s, n);
	return 0;
}

typedef struct root_scan {
	const char *name, *server_name, *protocol, *auth;
	size_t name_n, server_name_n, protocol_n, auth_n;
	bool has_auth, auth_bad;
	const char *buffers; /* its value's first byte; NULL when absent */
} root_scan;

static bool root_member(jcur *c, const char *k, size_t kn, void *user)
{
	root_scan *r = user;
	if (jkey(k, kn, "name")) {
		if (jstring_value(c, &r->name, &r->name_n) < 0)
			r->name = NULL;
	} else if (jkey(k, kn, "server_name")) {
		if (jstring_value(c, &r->server_name, &r->server_name_n) < 0)
			r->server_name = NULL;
	} else if (jkey(k, kn, "protocol")) {
		if (jstring_value(c, &r->protocol, &r->protocol_n) < 0)
			r->protocol = NULL;
	} else if (jkey(k, kn, "auth")) {
		r->has_auth = true;
		r->auth_bad = jstring_value(c, &r->auth, &r->auth_n) < 0;
	} else if (jkey(k, kn, "buffers")) {
		jws(c);
		r->buffers = c->p;
		jskip(c);
	} else {
		jskip(c);
	}
	return true;
}

typedef struct buf_scan {
	int addr_rc, len_rc; /* 2: absent */
	uint64_t addr, length;
	const char *name;
	size_t name_n;
} buf_scan;

static bool buf_member(jcur *c, const char *k, size_t kn, void *user)
{
	buf_scan *b = user;
	if (jkey(k, kn, "addr")) {
		b->addr_rc = jint(c, &b->addr);
	} else if (jkey(k, kn, "length")) {
		b->len_rc = jint(c, &b->length);
	} else if (jkey(k, kn, "name")) {
		if (jstring_value(c, &b->name, &b->name_n) < 0)
			b->name = NULL;
	} else {
		jskip(c);
	}
	return true;
}

#define FBAD(...)                                                                \
	do {                                                                         \
		te_warn_limited("segment descriptor rejected: " __VA_ARGS__);            \
		goto fail;                                                               \
	} while (0)

static bool member_u64_ok(int rc, uint64_t v, uint64_t max)
{
	return rc == 2 || (rc == 1 && v <= max);
}

static int desc_decode_fast(const char *json, size_t len, te_desc_files_fn files, te_desc **out)
{
	root_scan r = { 0 };
	jcur c = { json, json + len };
	te_desc *d = g_new0(te_desc, 1);

	if (!jobject(&c, root_member, &r))
		FBAD("not a JSON object");
	const char *s = r.name != NULL ? r.name : r.server_name;
	size_t sn = r.name != NULL ? r.name_n : r.server_name_n;
	if (s == NULL || sn == 0 || sn >= TE_MAX_NAME)
		FBAD("missing or bad \"name\"");
	d->name = g_strndup(s, sn);
	if (r.protocol == NULL || r.protocol_n == 0 || r.protocol_n > 64)
		FBAD("missing or bad \"protocol\" in %s", d->name);
	d->protocol = g_strndup(r.protocol, r.protocol_n);
	d->file_segment = files(d->protocol);
	if (r.has_auth) {
		if (r.auth_bad || r.auth_n == 0 || r.auth_n > 64)
			FBAD("bad \"auth\" in %s", d->name);
		d->auth = g_strndup(r.auth, r.auth_n);
	}

	if (r.buffers != NULL) {
		jcur bc = { r.buffers, json + len };
		if (jch(&bc) != '[')
			FBAD("\"buffers\" is not an array in %s", d->name);
		jcur count = bc;
		d->n_buffers = (size_t)jarray_len(&count);
		d->buffers = g_new0(te_desc_buffer, d->n_buffers ? d->n_buffers : 1);
		bc.p++;
		for (size_t i = 0; i < d->n_buffers; i++) {
			buf_scan b = { .addr_rc = 2, .len_rc = 2 };
			te_desc_buffer *db = &d->buffers[i];
			if (!jobject(&bc, buf_member, &b))
				FBAD("buffer %zu is not an object in %s", i, d->name);
			jws(&bc);
			if (jch(&bc) == ',')
				bc.p++;
			if (b.len_rc != 1 || b.length == 0)
				FBAD("buffer %zu of %s: missing or bad \"length\"", i, d->name);
			db->length = b.length;
			if (!member_u64_ok(b.addr_rc, b.addr, UINT64_MAX))
				FBAD("buffer %zu of %s: bad \"addr\"", i, d->name);
			db->addr = b.addr_rc == 1 ? b.addr : 0;
			if (db->addr + db->length < db->addr)
				FBAD("buffer %zu of %s: addr + length overflows", i, d->name);
			if (d->file_segment) {
				d->file_size += db->length;
				if (d->file_size < db->length)
					FBAD("file segment %s: total length overflows", d->name);
				db->name = b.name ? g_strndup(b.name, b.name_n) : g_strdup("");
				continue;
			}
			if (b.addr_rc != 1 || db->addr == 0)
				FBAD("buffer %zu of %s: missing or zero \"addr\"", i, d->name);
			if (b.name == NULL || b.name_n == 0)
				FBAD("buffer %zu of %s: missing \"name\"", i, d->name);
			db->name = g_strndup(b.name, b.name_n);
		}
		if (!d->file_segment && d->n_buffers > 1)
			qsort(d->buffers, d->n_buffers, sizeof *d->buffers,
			      (int (*)(const void *, const void *))cmp_buf);
	}
	d->json = g_strndup(json, len);
	*out = d;
	return 0;
fail:
	te_desc_free(d);
	return TE_ERR_METADATA;
}

int te_desc_decode_with(const char *json, size_t len, te_desc_files_fn files, te_desc **out)
{
	static const te_json_limits lim = TE_JSON_LIMITS_DESC;
	char why[160] = "empty";

	*out = NULL;
	if (json == NULL || len == 0 || memchr(json, '\\', len) != NULL || memchr(json, '\0', len) != NULL)
		return te_desc_decode_dom(json, len, files, out);
	if (te_json_check(json, len, &lim, why, sizeof why) < 0) {
		te_warn_limited("segment descriptor rejected: %s", why);
		return TE_ERR_METADATA;
	}
	return desc_decode_fast(json, len, files, out);
}

int te_desc_decode(const char *json, size_t len, te_desc **out)
{
	return te_desc_decode_with(json, len, te_transport_files_only, out);
}

/* ---------------------------------------------------------------- encode */

/* Members collected in a sorted tree, so the object comes out with sorted keys. */
static gint cmp_key(gconstpointer a, gconstpointer b, gpointer unused)
{
	(void)unused;
	return strcmp(a, b);
}

static GTree *members_new(void)
{
	return g_tree_new_full(cmp_key, NULL, g_free, (GDestroyNotify)json_node_unref);
}

static void members_set(GTree *t, const char *key, JsonNode *n)
{
	g_tree_replace(t, g_strdup(key), n);
}

static gboolean add_member(gpointer key, gpointer value, gpointer data)
{
	json_object_set_member(data, key, json_node_ref(value));
	return FALSE;
}

static JsonNode *members_to_node(GTree *t)
{
	JsonObject *o = json_object_new();
	JsonNode *n = json_node_new(JSON_NODE_OBJECT);

	g_tree_foreach(t, add_member, o);
	json_node_take_object(n, o);
	g_tree_unref(t);
	return n;
}

static JsonNode *node_int(gint64 v)
{
	JsonNode *n = json_node_new(JSON_NODE_VALUE);
	json_node_set_int(n, v);
	return n;
}

static JsonNode *node_str(const char *s)
{
	JsonNode *n = json_node_new(JSON_NODE_VALUE);
	json_node_set_string(n, s);
	return n;
}

/* Sorts nested objects' keys too (plugin fragments may come unsorted). */
static JsonNode *sorted_copy(JsonNode *n)
{
	if (JSON_NODE_HOLDS_OBJECT(n)) {
		GTree *t = members_new();
		JsonObjectIter it;
		const gchar *k;
		JsonNode *v;
		json_object_iter_init(&it, json_node_get_object(n));
		while (json_object_iter_next(&it, &k, &v))
			members_set(t, k, sorted_copy(v));
		return members_to_node(t);
	}
	if (JSON_NODE_HOLDS_ARRAY(n)) {
		JsonArray *src = json_node_get_array(n), *dst = json_array_new();
		JsonNode *out = json_node_new(JSON_NODE_ARRAY);
		for (guint i = 0; i < json_array_get_length(src); i++)
			json_array_add_element(dst, sorted_copy(json_array_get_element(src, i)));
		json_node_take_array(out, dst);
		return out;
	}
	return json_node_copy(n);
}

/* Merges a plugin's JSON object text into `t`. Bad text is logged, skipped. */
static void merge_fragment(GTree *t, const char *text, const char *who)
{
	static const te_json_limits lim = TE_JSON_LIMITS_DESC;
	char why[160] = "";
	JsonNode *root;
	JsonObjectIter it;
	const gchar *k;
	JsonNode *v;

	if (text == NULL || *text == '\0')
		return;
	root = te_json_load(text, strlen(text), &lim, why, sizeof why);
	if (root == NULL || !JSON_NODE_HOLDS_OBJECT(root)) {
		te_warn("transport %s contributed descriptor fields that are not a JSON object (%s); ignored",
			who, root ? "another JSON value" : why);
		if (root != NULL)
			json_node_unref(root);
		return;
	}
	json_object_iter_init(&it, json_node_get_object(root));
	while (json_object_iter_next(&it, &k, &v))
		members_set(t, k, sorted_copy(v));
	json_node_unref(root);
}

char *te_engine_encode_descriptor(te_engine *e)
{
	GTree *top = members_new();
	JsonArray *bufs = json_array_new();
	JsonNode *bufs_node = json_node_new(JSON_NODE_ARRAY);
	JsonGenerator *gen;
	const char *protocol = NULL;
	char ts[64];
	char *text;

	for (guint i = 0; i < e->transports->len; i++) {
		te_transport_inst *tp = g_ptr_array_index(e->transports, i);
		if (protocol == NULL && (tp->ops->flags & TE_TRANSPORT_MEMORY))
			protocol = tp->hc.plugin->name;
	}
	/* Every loaded transport's fields for all descriptors first (TCP's
	 * data port 0, which Mooncake peers read from any descriptor), so that
	 * the host's and the installed transports' own replace them. */
	GPtrArray *all = te_plugin_transports();
	for (guint i = 0; i < all->len; i++) {
		const te_plugin *p = g_ptr_array_index(all, i);
		const te_transport_ops *o = p->desc->ops;
		if (TE_OPS_COVERS(o, default_fields) && o->default_fields != NULL)
			merge_fragment(top, o->default_fields, p->name);
	}
	g_ptr_array_unref(all);
	te_timestamp(ts, sizeof ts);
	members_set(top, "name", node_str(e->name));
	if (e->auth != NULL) /* peers without the key fail at open, not at transfer */
		members_set(top, "auth", node_str("hmac-sha256"));
	/* Without a memory transport: what a default gave, else a name no
	 * transport has (peers need one to decode the rest). */
	if (protocol != NULL || !g_tree_lookup_extended(top, "protocol", NULL, NULL))
		members_set(top, "protocol", node_str(protocol ? protocol : "none"));
	members_set(top, "timestamp", node_str(ts));
	for (guint i = 0; i < e->transports->len; i++) {
		te_transport_inst *tp = g_ptr_array_index(e->transports, i);
		char *frag = NULL;
		if (TE_HAS_OP(tp->ops, describe) && tp->ops->describe(tp->ctx, &frag) == 0)
			merge_fragment(top, frag, tp->hc.plugin->name);
		free(frag);
	}

	g_rw_lock_reader_lock(&e->mem.lock);
	for (guint i = 0; i < e->mem.regions->len; i++) {
		te_region *r = g_ptr_array_index(e->mem.regions, i);
		if (r->dying || r->hidden)
			continue; /* being unregistered (peers must stop seeing it first), or libte's own */
		GTree *b = members_new();
		members_set(b, "addr", node_int((gint64)(uintptr_t)r->addr));
		members_set(b, "length", node_int((gint64)r->length));
		members_set(b, "name", node_str(e->name));
		for (guint t = 0; t < e->transports->len; t++) {
			te_transport_inst *tp = g_ptr_array_index(e->transports, t);
			merge_fragment(b, g_hash_table_lookup(r->fields, tp), tp->hc.plugin->name);
		}
		json_array_add_element(bufs, members_to_node(b));
	}
	g_rw_lock_reader_unlock(&e->mem.lock);
	json_node_take_array(bufs_node, bufs);
	members_set(top, "buffers", bufs_node);

	JsonNode *root = members_to_node(top);
	gen = json_generator_new();
	json_generator_set_root(gen, root);
	text = json_generator_to_data(gen, NULL);
	g_object_unref(gen);
	json_node_unref(root);
	return text;
}
