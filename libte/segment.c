/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Remote segments. A segment id names a te_segment; its current version
 * (te_segver) holds the decoded descriptor and the transport serving it.
 * Tasks reference the version they were submitted against, so a refresh or a
 * close never pulls a descriptor or a transport context from under a
 * transfer: the old version is released when its last task finishes.
 */
#include <json-glib/json-glib.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "metrics.h"

/* ---------------------------------------------------------- versions */

static void segver_release(te_segver *sv)
{
	te_segver_unref(sv->alt, false);
	if (atomic_load(&sv->peer_lost))
		atomic_fetch_sub(&sv->engine->lost, 1);
	if (sv->tp != NULL) {
		if (TE_HAS_OP(sv->tp->ops, segment_close))
			sv->tp->ops->segment_close(sv->tp->ctx, sv->seg_ctx);
		atomic_fetch_sub(&sv->tp->segvers, 1);
	}
	te_desc_free(sv->desc);
	g_free(sv->host);
	g_free(sv->infobufs);
	g_free(sv);
}

void te_segver_reap(gpointer data, gpointer user)
{
	(void)user;
	segver_release(data);
}

void te_segver_unref(te_segver *sv, bool from_completion)
{
	te_segver_unref_n(sv, 1, from_completion);
}

void te_segver_unref_n(te_segver *sv, int n, bool from_completion)
{
	if (sv == NULL || n <= 0 || atomic_fetch_sub_explicit(&sv->refs, n, memory_order_acq_rel) != n)
		return;
	/* Completions run on transport threads: closing the transport's segment
	 * context from there could re-enter it, so hand the release over. */
	if (from_completion)
		g_thread_pool_push(sv->engine->reaper, sv, NULL);
	else
		segver_release(sv);
}

/* Binds a decoded descriptor to a transport: the forced one, else the one the
 * descriptor names, else any installed one that accepts it. */
/* A version of `desc` bound to no transport yet, and what a transport's
 * segment_open() is shown of it. `gen` 0: a new one. */
static te_segver *segver_alloc(te_engine *e, te_desc *desc, const char *host, int rpc_port, uint64_t gen,
			       te_segment_info *info)
{
	static _Atomic uint64_t next_gen;
	te_segver *sv = g_new0(te_segver, 1);

	atomic_init(&sv->refs, 1);
	sv->gen = gen != 0 ? gen : atomic_fetch_add_explicit(&next_gen, 1, memory_order_relaxed) + 1;
	sv->engine = e;
	sv->desc = desc;
	sv->host = g_strdup(host);
	sv->rpc_port = rpc_port;
	sv->infobufs = g_new0(te_buffer_desc, desc->n_buffers ? desc->n_buffers : 1);
	for (size_t i = 0; i < desc->n_buffers; i++)
		sv->infobufs[i] = (te_buffer_desc){ desc->buffers[i].addr, desc->buffers[i].length,
						    desc->buffers[i].name };
	*info = (te_segment_info){
		.size = sizeof *info,
		.name = desc->name,
		.host = sv->host,
		.rpc_port = (uint16_t)rpc_port,
		.protocol = desc->protocol,
		.descriptor = desc->json,
		.buffers = sv->infobufs,
		.n_buffers = desc->n_buffers,
	};
	return sv;
}

static int segver_new(te_engine *e, te_desc *desc, const char *host, int rpc_port,
		      const char *forced, te_transport_inst *skip, te_segver **out)
{
	te_segment_info info;
	te_segver *sv = segver_alloc(e, desc, host, rpc_port, 0, &info);
	int rc = TE_ERR_NO_TRANSPORT, last = 0, named = 0;

	unsigned want = desc->file_segment ? TE_TRANSPORT_FILES : TE_TRANSPORT_MEMORY;

	/* Three passes: same-host transports (they serve a peer on this host
	 * better than any network one, and decline the rest), the transport the
	 * descriptor names, then the others. A forced transport is the only one
	 * tried. */
	for (int pass = 0; pass < 3 && rc < 0; pass++) {
		for (guint i = 0; i < e->transports->len && rc < 0; i++) {
			te_transport_inst *tp = g_ptr_array_index(e->transports, i);
			const char *tn = tp->hc.plugin->name;
			bool same_host = (tp->ops->flags & TE_TRANSPORT_SAME_HOST) != 0;
			bool named_tp = strcmp(tn, desc->protocol) == 0;
			if (tp == skip)
				continue;
			if (forced != NULL) {
				if (pass != 1 || strcmp(forced, tn) != 0)
					continue;
			} else if (pass == 0 ? !same_host || !(tp->ops->flags & want)
				   : pass == 1 ? !named_tp || same_host
					       : named_tp || same_host || !(tp->ops->flags & want)) {
				continue;
			}
			last = tp->ops->segment_open(tp->ctx, &info, &sv->seg_ctx);
			if (last == 0) {
				sv->tp = tp;
				atomic_fetch_add(&tp->segvers, 1);
				rc = 0;
			} else {
				if (pass == 1)
					named = last; /* the descriptor's own transport: its reason matters */
				te_dbg("transport %s declined segment %s: %s", tn, desc->name, te_strerror(last));
			}
		}
	}
	if (rc < 0) {
		if (forced) {
			te_err("segment %s: transport '%s' is not installed or cannot serve it%s%s", desc->name,
			       forced, last ? ": " : "", last ? te_strerror(last) : "");
		} else if (named != 0) {
			/* e.g. an unresolvable host: say so rather than "no transport" */
			te_err("segment %s: transport %s cannot reach it (%s), and no other installed transport "
			       "serves it", desc->name, desc->protocol, te_strerror(named));
			rc = named;
		} else {
			te_err("segment %s (protocol %s): no installed transport serves it", desc->name,
			       desc->protocol);
		}
		sv->desc = NULL; /* the caller still owns it */
		g_free(sv->host);
		g_free(sv->infobufs);
		g_free(sv);
		return rc;
	}
	*out = sv;
	return 0;
}

/* The alternate of a version (fail-over across transports): the first
 * other installed network transport that accepts the same descriptor,
 * bound to a copy of it. Not for same-host transports (a peer they serve
 * is reached no better by another) nor for a forced one. */
static void segver_add_alt(te_engine *e, te_segver *sv, const char *forced)
{
	if (forced != NULL || sv->tp == NULL || (sv->tp->ops->flags & TE_TRANSPORT_SAME_HOST))
		return;
	unsigned want = sv->desc->file_segment ? TE_TRANSPORT_FILES : TE_TRANSPORT_MEMORY;
	bool any = false;
	for (guint i = 0; i < e->transports->len && !any; i++) {
		te_transport_inst *tp = g_ptr_array_index(e->transports, i);
		any = tp != sv->tp && !(tp->ops->flags & TE_TRANSPORT_SAME_HOST) && (tp->ops->flags & want);
	}
	if (!any)
		return;
	te_desc *copy = NULL;
	if (te_desc_decode(sv->desc->json, strlen(sv->desc->json), &copy) < 0)
		return;
	te_segment_info info;
	te_segver *alt = segver_alloc(e, copy, sv->host, sv->rpc_port, sv->gen, &info);
	for (guint i = 0; i < e->transports->len && alt->tp == NULL; i++) {
		te_transport_inst *tp = g_ptr_array_index(e->transports, i);
		if (tp == sv->tp || (tp->ops->flags & TE_TRANSPORT_SAME_HOST) || !(tp->ops->flags & want))
			continue;
		if (tp->ops->segment_open(tp->ctx, &info, &alt->seg_ctx) == 0) {
			alt->tp = tp;
			atomic_fetch_add(&tp->segvers, 1);
		}
	}
	if (alt->tp == NULL) {
		segver_release(alt);
		return;
	}
	te_dbg("segment %s: %s, %s if it fails", copy->name, sv->tp->hc.plugin->name, alt->tp->hc.plugin->name);
	sv->alt = alt;
}

static void segver_set_id(te_segver *sv, te_segment_id id)
{
	sv->id = id;
	if (sv->alt != NULL)
		sv->alt->id = id;
}

/* --------------------------------------------------------- resolution */

static int parse_rpc_meta(const char *json, size_t len, char **host, int *port)
{
	static const te_json_limits lim = TE_JSON_LIMITS_RPC_META;
	char why[160] = "";
	JsonNode *root = te_json_load(json, len, &lim, why, sizeof why);
	JsonObject *o;
	const char *hs;
	uint64_t pv = 0;
	int rc = TE_ERR_METADATA;

	if (root == NULL) {
		te_warn_limited("rpc_meta rejected: %s", why);
		return rc;
	}
	if (!JSON_NODE_HOLDS_OBJECT(root)) {
		te_warn_limited("rpc_meta rejected: not a JSON object");
		goto out;
	}
	o = json_node_get_object(root);
	JsonNode *h = json_object_get_member(o, "ip_or_host_name");
	if (h == NULL || json_node_get_value_type(h) != G_TYPE_STRING ||
	    te_json_get_u64(o, "rpc_port", 65535, &pv) < 0 || pv == 0) {
		te_warn_limited("rpc_meta rejected: \"ip_or_host_name\" must be a string and "
				"\"rpc_port\" an integer from 1 to 65535");
		goto out;
	}
	hs = json_node_get_string(h);
	if (hs == NULL || *hs == '\0' || strlen(hs) >= TE_MAX_NAME) {
		te_warn_limited("rpc_meta rejected: empty or overlong \"ip_or_host_name\"");
		goto out;
	}
	*host = g_strdup(hs);
	*port = (int)pv;
	rc = 0;
out:
	json_node_unref(root);
	return rc;
}

int te_engine_resolve_rpc(te_engine *e, const char *name, char **host, int *port)
{
	char key[TE_MAX_NAME + 64];
	char *val = NULL;
	size_t len = 0;
	int rc;

	*host = NULL;
	if (e->md->p2p) {
		rc = te_split_host_port(name, host, port);
		if (rc < 0 || *port <= 0) {
			g_free(*host);
			*host = NULL;
			te_err("P2PHANDSHAKE: segment name '%s' is not host:port", name);
			return -EINVAL;
		}
		return 0;
	}
	rc = te_metadata_rpc_key(name, key, sizeof key);
	if (rc < 0 || (size_t)rc >= sizeof key)
		return -ENAMETOOLONG;
	rc = te_metadata_get(e->md, key, &val, &len);
	if (rc < 0) {
		if (rc == -ENOENT)
			te_err("segment %s: no RPC endpoint published under %s", name, key);
		return rc;
	}
	rc = parse_rpc_meta(val, len, host, port);
	if (rc < 0)
		te_err("segment %s: malformed value under %s in %s: %.200s", name, key, e->md->conn, val);
	free(val);
	return rc;
}

/* Engines of one cluster either all hold the key or none does: a mismatch
 * is found here, before any connection, rather than as refused transfers.
 * File segments are not engines and have no "auth". */
static int check_auth(te_engine *e, const te_desc *d, const char *name)
{
	if (d->file_segment)
		return 0;
	if (d->auth != NULL && strcmp(d->auth, "hmac-sha256") != 0) {
		te_err("segment %s asks for authentication by \"%.32s\", which this engine does not speak",
		       name, d->auth);
		return TE_ERR_AUTH;
	}
	if (d->auth != NULL && e->auth == NULL) {
		te_err("segment %s requires peer authentication and this engine has no key: set "
		       "TE_AUTH_KEY_FILE (or the engine option auth_key_file) to the cluster's key file", name);
		return TE_ERR_AUTH;
	}
	if (d->auth == NULL && e->auth != NULL) {
		te_err("segment %s does not authenticate its peers and this engine requires it "
		       "(TE_AUTH_KEY_FILE is set here, not there)", name);
		return TE_ERR_AUTH;
	}
	return 0;
}

/* Fetches and decodes the descriptor of `name`, with the peer's RPC address. */
static int fetch_descriptor(te_engine *e, const char *name, te_desc **desc, char **host, int *port)
{
	char *val = NULL;
	size_t len = 0;
	char key[TE_MAX_NAME + 64] = "";
	int rc;

	*desc = NULL;
	*host = NULL;
	*port = 0;
	if (e->md->p2p) {
		rc = te_engine_resolve_rpc(e, name, host, port);
		if (rc < 0)
			return rc;
		g_mutex_lock(&e->desc_lock);
		char *mine = g_strdup(e->desc_cache ? e->desc_cache : "{}");
		g_mutex_unlock(&e->desc_lock);
		rc = te_rpc_call_addr(e->auth, *host, *port, TE_RPC_METADATA, mine, strlen(mine), &val, &len, 0);
		g_free(mine);
		if (rc < 0) {
			te_err("segment %s: descriptor exchange failed: %s", name, te_strerror(rc));
			goto fail;
		}
	} else {
		rc = te_metadata_segment_key(name, key, sizeof key);
		if (rc < 0 || (size_t)rc >= sizeof key) {
			rc = -ENAMETOOLONG;
			goto fail;
		}
		rc = te_metadata_get(e->md, key, &val, &len);
		if (rc < 0) {
			if (rc == -ENOENT)
				te_err("segment %s: no descriptor under %s in %s", name, key, e->md->conn);
			goto fail;
		}
		if (strchr(name, '/') == NULL) { /* RAM segments have an RPC endpoint */
			rc = te_engine_resolve_rpc(e, name, host, port);
			if (rc < 0)
				goto fail;
		}
	}
	rc = te_desc_decode(val, len, desc);
	if (rc < 0 && e->md->p2p)
		te_err("segment %s: malformed descriptor from %s", name, *host);
	else if (rc < 0)
		te_err("segment %s: malformed descriptor under %s in %s: %.200s", name, key, e->md->conn, val);
	if (rc == 0 && (rc = check_auth(e, *desc, name)) < 0) {
		te_desc_free(*desc);
		*desc = NULL;
	}
fail:
	free(val);
	if (rc < 0) {
		g_free(*host);
		*host = NULL;
	}
	return rc;
}

/* ------------------------------------------------------------- public */

static bool check_name(const char *name, const char *what)
{
	if (name == NULL || *name == '\0' || strlen(name) >= TE_MAX_NAME) {
		te_err("%s: segment name is %s", what, name == NULL ? "NULL" : *name ? "too long" : "empty");
		return false;
	}
	return true;
}

/* An engine and a segment name fit to look up, else a log line naming fn. */
/* How a call on the segment named `name` starts: true when it ends there,
 * with *id -EINVAL (a NULL engine or a bad name, logged) or
 * TE_LOCAL_SEGMENT (the engine's own name). */
static bool decided_by_name(te_engine *e, const char *name, const char *fn, te_segment_id *id)
{
	if (e == NULL) {
		te_err("%s: NULL engine", fn);
		*id = -EINVAL;
	} else if (!check_name(name, fn)) {
		*id = -EINVAL;
	} else if (strcmp(name, e->name) == 0) {
		*id = TE_LOCAL_SEGMENT;
	} else {
		return false;
	}
	return true;
}

/* One more open of the open segment idp; the caller holds the control lock. */
static void reopen_locked(te_engine *e, gpointer idp)
{
	te_segment *s = g_hash_table_lookup(e->segments, idp);

	s->opens++;
}

te_segment_id te_segment_open_with(te_engine *e, const char *name, const char *transport)
{
	te_desc *desc = NULL;
	char *host = NULL;
	int port = 0, rc;
	te_segver *sv = NULL;
	te_segment_id early;

	if (decided_by_name(e, name, "te_segment_open", &early))
		return early;
	g_rec_mutex_lock(&e->ctl);
	gpointer idp = g_hash_table_lookup(e->seg_by_name, name);
	if (idp != NULL) {
		reopen_locked(e, idp);
		g_rec_mutex_unlock(&e->ctl);
		return GPOINTER_TO_INT(idp);
	}
	g_rec_mutex_unlock(&e->ctl);

	/* Network I/O without the control lock (see rpc.c on mutual opens). */
	rc = fetch_descriptor(e, name, &desc, &host, &port);
	if (rc < 0)
		return rc;

	g_rec_mutex_lock(&e->ctl);
	idp = g_hash_table_lookup(e->seg_by_name, name);
	if (idp != NULL) { /* opened meanwhile by another thread */
		reopen_locked(e, idp);
		g_rec_mutex_unlock(&e->ctl);
		te_desc_free(desc);
		g_free(host);
		return GPOINTER_TO_INT(idp);
	}
	rc = segver_new(e, desc, host, port, transport, NULL, &sv);
	g_free(host);
	if (rc < 0) {
		g_rec_mutex_unlock(&e->ctl);
		te_desc_free(desc);
		return rc;
	}
	segver_add_alt(e, sv, transport);
	if (e->next_segment >= INT32_MAX) {
		g_rec_mutex_unlock(&e->ctl);
		te_segver_unref(sv, false);
		return -ENOSPC;
	}
	te_segment *s = g_new0(te_segment, 1);
	s->name = g_strdup(name);
	s->forced = g_strdup(transport);
	s->opens = 1;
	s->cur = sv;
	s->mpeer = te_metrics_peer(e->metrics, name);
	int id = ++e->next_segment;
	segver_set_id(sv, id);
	g_rw_lock_writer_lock(&e->data);
	g_hash_table_insert(e->segments, GINT_TO_POINTER(id), s);
	g_hash_table_insert(e->seg_by_name, s->name, GINT_TO_POINTER(id));
	g_rw_lock_writer_unlock(&e->data);
	g_rec_mutex_unlock(&e->ctl);
	te_info("opened segment %s as id %d via %s", name, id, sv->tp->hc.plugin->name);
	return id;
}

te_segment_id te_segment_open(te_engine *e, const char *name)
{
	return te_segment_open_with(e, name, NULL);
}

te_segment_id te_segment_find(te_engine *e, const char *name)
{
	te_segment_id id;

	if (decided_by_name(e, name, "te_segment_find", &id))
		return id;
	g_rec_mutex_lock(&e->ctl);
	gpointer idp = g_hash_table_lookup(e->seg_by_name, name);
	g_rec_mutex_unlock(&e->ctl);
	/* Not an error worth a log line: callers ask to decide whether to open. */
	return idp != NULL ? GPOINTER_TO_INT(idp) : -ENOENT;
}

int te_segment_probe(te_engine *e, const char *name, int timeout_ms)
{
	char *host = NULL, *reply = NULL;
	size_t reply_len = 0;
	int port = 0, rc;

	if (e == NULL) {
		te_err("te_segment_probe: NULL engine");
		return -EINVAL;
	}
	if (!check_name(name, "te_segment_probe"))
		return -EINVAL;
	rc = te_engine_resolve_rpc(e, name, &host, &port);
	if (rc < 0)
		return rc;
	rc = te_rpc_call_addr(e->auth, host, port, TE_RPC_PROBE, "{}", 2, &reply, &reply_len, timeout_ms);
	if (rc == 0 && (reply == NULL || strstr(reply, "\"success\"") == NULL)) {
		te_err("te_segment_probe: %s (%s:%d) answered %.200s", name, host, port, reply ? reply : "nothing");
		rc = TE_ERR_PROTOCOL;
	} else if (rc < 0) {
		te_err("te_segment_probe: %s (%s:%d) did not answer: %s", name, host, port, te_strerror(rc));
	}
	free(reply);
	g_free(host);
	return rc;
}

static void segment_free(te_segment *s)
{
	g_free(s->name);
	g_free(s->forced);
	g_free(s);
}

/* How a call on segment `id` starts: -EINVAL (logged) for a NULL engine, 0
 * for the local segment (nothing to do), 1 to go on. */
static int segment_call(const te_engine *e, te_segment_id id, const char *call)
{
	if (e == NULL) {
		te_err("%s: NULL engine", call);
		return -EINVAL;
	}
	return id != TE_LOCAL_SEGMENT;
}

int te_segment_close(te_engine *e, te_segment_id id)
{
	te_segment *s;
	te_segver *old = NULL;
	int go = segment_call(e, id, "te_segment_close");

	if (go <= 0)
		return go;
	g_rec_mutex_lock(&e->ctl);
	s = g_hash_table_lookup(e->segments, GINT_TO_POINTER(id));
	if (s == NULL) {
		g_rec_mutex_unlock(&e->ctl);
		te_err("te_segment_close: unknown segment id %d", id);
		return TE_ERR_SEGMENT;
	}
	if (--s->opens > 0) {
		g_rec_mutex_unlock(&e->ctl);
		return 0;
	}
	g_rw_lock_writer_lock(&e->data);
	g_hash_table_remove(e->seg_by_name, s->name);
	g_hash_table_remove(e->segments, GINT_TO_POINTER(id));
	g_rw_lock_writer_unlock(&e->data);
	old = s->cur;
	segment_free(s);
	te_segver_unref(old, false);
	g_rec_mutex_unlock(&e->ctl);
	return 0;
}

int te_segment_refresh(te_engine *e, te_segment_id id)
{
	te_segment *s;
	te_desc *desc = NULL;
	te_segver *sv = NULL, *old;
	char *name, *host = NULL;
	int port = 0, rc = segment_call(e, id, "te_segment_refresh");

	if (rc <= 0)
		return rc;
	g_rec_mutex_lock(&e->ctl);
	s = g_hash_table_lookup(e->segments, GINT_TO_POINTER(id));
	name = s ? g_strdup(s->name) : NULL;
	g_rec_mutex_unlock(&e->ctl);
	if (name == NULL) {
		te_err("te_segment_refresh: unknown segment id %d", id);
		return TE_ERR_SEGMENT;
	}
	rc = fetch_descriptor(e, name, &desc, &host, &port);
	g_free(name);
	if (rc < 0)
		return rc;

	g_rec_mutex_lock(&e->ctl);
	s = g_hash_table_lookup(e->segments, GINT_TO_POINTER(id));
	if (s == NULL) {
		rc = TE_ERR_SEGMENT;
	} else {
		rc = segver_new(e, desc, host, port, s->forced, NULL, &sv);
		if (rc == 0) {
			segver_add_alt(e, sv, s->forced);
			segver_set_id(sv, id);
			g_rw_lock_writer_lock(&e->data);
			old = s->cur;
			s->cur = sv;
			g_rw_lock_writer_unlock(&e->data);
			te_segver_unref(old, false);
		}
	}
	g_rec_mutex_unlock(&e->ctl);
	if (rc < 0)
		te_desc_free(desc);
	g_free(host);
	return rc;
}

int te_segment_descriptor(te_engine *e, te_segment_id id, char **json)
{
	char *copy = NULL;

	if (e == NULL || json == NULL) {
		te_err("te_segment_descriptor: NULL %s", e == NULL ? "engine" : "output pointer");
		return -EINVAL;
	}
	*json = NULL;
	if (id == TE_LOCAL_SEGMENT) {
		g_mutex_lock(&e->desc_lock);
		copy = e->desc_cache ? strdup(e->desc_cache) : NULL;
		g_mutex_unlock(&e->desc_lock);
	} else {
		g_rw_lock_reader_lock(&e->data);
		te_segment *s = g_hash_table_lookup(e->segments, GINT_TO_POINTER(id));
		bool known = s != NULL && s->cur != NULL;
		if (known)
			copy = strdup(s->cur->desc->json);
		g_rw_lock_reader_unlock(&e->data);
		if (!known) {
			te_err("te_segment_descriptor: unknown segment id %d", id);
			return TE_ERR_SEGMENT;
		}
	}
	if (copy == NULL)
		return -ENOMEM;
	*json = copy;
	return 0;
}

int te_segment_refresh_all(te_engine *e)
{
	GArray *ids;
	GHashTableIter it;
	gpointer k, v;
	int first = 0, done = 0;

	if (e == NULL) {
		te_err("te_segment_refresh_all: NULL engine");
		return -EINVAL;
	}
	/* A snapshot: refreshing fetches, which must not hold the control lock. */
	g_rec_mutex_lock(&e->ctl);
	ids = g_array_sized_new(FALSE, FALSE, sizeof(te_segment_id), g_hash_table_size(e->segments));
	g_hash_table_iter_init(&it, e->segments);
	while (g_hash_table_iter_next(&it, &k, &v)) {
		te_segment_id id = GPOINTER_TO_INT(k);
		g_array_append_val(ids, id);
	}
	g_rec_mutex_unlock(&e->ctl);
	for (guint i = 0; i < ids->len; i++) {
		int rc = te_segment_refresh(e, g_array_index(ids, te_segment_id, i));
		if (rc == 0)
			done++;
		else if (rc != TE_ERR_SEGMENT && first == 0) /* closed meanwhile: not a failure */
			first = rc;
	}
	g_array_unref(ids);
	return first < 0 ? first : done;
}

#define STALE_REFRESH_MS 1000
/* Often enough that a peer back under its name is reached again within
 * a 100 ms bound; a dead peer costs a refused connect per period. */
#define LOST_REFRESH_MS 50

/* Whether a refresh last made at *last (0: never) is due `every` ms on,
 * stamping `now` when it is. Under the control lock. */
static bool refresh_due(int64_t *last, int64_t now, int64_t every)
{
	if (*last != 0 && now - *last < every)
		return false;
	*last = now;
	return true;
}

/* Refreshes segment `id` (no lock held), its outcome logged at `level`. */
static void refresh_logged(te_engine *e, te_segment_id id, int level, const char *why)
{
	int rc = te_segment_refresh(e, id);

	te_log(level, TE_DOMAIN, "segment %d: %s: %s", id, why, te_strerror(rc));
}

bool te_segment_refresh_stale(te_engine *e, te_segment_id id)
{
	int64_t now = te_now_ms();
	bool go;

	g_rec_mutex_lock(&e->ctl);
	te_segment *s = g_hash_table_lookup(e->segments, GINT_TO_POINTER(id));
	/* A peer back from a restart registers its memory after it answers:
	 * for a second after a fetch that followed its loss, a range it does
	 * not list yet is looked for as often as a lost peer is. */
	int64_t every = s != NULL && s->last_lost_refresh != 0 && now - s->last_lost_refresh < STALE_REFRESH_MS
				? LOST_REFRESH_MS
				: STALE_REFRESH_MS;
	go = s != NULL && refresh_due(&s->last_auto_refresh, now, every);
	g_rec_mutex_unlock(&e->ctl);
	if (go)
		refresh_logged(e, id, TE_LOG_DEBUG, "refreshed as it looked stale");
	return go;
}

void te_segment_refresh_lost(te_engine *e, te_segment_id id)
{
	int64_t now = te_now_ms();
	bool go;

	g_rec_mutex_lock(&e->ctl);
	te_segment *s = g_hash_table_lookup(e->segments, GINT_TO_POINTER(id));
	/* A task moved to the alternate transport marks that version. */
	go = s != NULL && s->cur != NULL &&
	     (atomic_load(&s->cur->peer_lost) || (s->cur->alt != NULL && atomic_load(&s->cur->alt->peer_lost))) &&
	     refresh_due(&s->last_lost_refresh, now, LOST_REFRESH_MS);
	g_rec_mutex_unlock(&e->ctl);
	if (go)
		refresh_logged(e, id, TE_LOG_INFO, "fetched again after its peer went away");
}

void te_segver_refresh_job(gpointer data, gpointer user)
{
	te_segver *sv = data;
	te_engine *e = sv->engine;

	(void)user;
	if (!e->closing && !te_segment_refresh_stale(e, sv->id))
		atomic_store(&sv->refresh_asked, false); /* skipped: the next failure may ask again */
	te_segver_unref(sv, false);
}

/* Called with ctl held when `tp` is being uninstalled: rebinds its segments
 * to another transport where one accepts them. */
void te_segments_detach_transport(te_engine *e, te_transport_inst *tp)
{
	GHashTableIter it;
	gpointer k, v;

	g_hash_table_iter_init(&it, e->segments);
	while (g_hash_table_iter_next(&it, &k, &v)) {
		te_segment *s = v;
		te_segver *old = s->cur, *nsv = NULL;
		if (old != NULL && old->alt != NULL && old->alt->tp == tp) {
			/* Its fail-over transport goes: no alternate from now on
			 * (tasks moved to it hold their own reference). */
			te_segver *alt = old->alt;
			g_rw_lock_writer_lock(&e->data);
			old->alt = NULL;
			g_rw_lock_writer_unlock(&e->data);
			te_segver_unref(alt, false);
		}
		if (old == NULL || old->tp != tp)
			continue;
		te_desc *copy = NULL;
		if (s->forced == NULL && te_desc_decode(old->desc->json, strlen(old->desc->json), &copy) == 0 &&
		    segver_new(e, copy, old->host, old->rpc_port, NULL, tp, &nsv) < 0) {
			te_desc_free(copy);
			nsv = NULL;
		}
		if (nsv != NULL) {
			segver_add_alt(e, nsv, s->forced);
			segver_set_id(nsv, GPOINTER_TO_INT(k));
		}
		g_rw_lock_writer_lock(&e->data);
		s->cur = nsv;
		g_rw_lock_writer_unlock(&e->data);
		if (nsv == NULL)
			te_warn("segment %s has no transport left; te_segment_refresh() after installing one",
				s->name);
		te_segver_unref(old, false);
	}
}

void te_segments_clear(te_engine *e)
{
	GHashTableIter it;
	gpointer k, v;

	g_rw_lock_writer_lock(&e->data);
	g_hash_table_iter_init(&it, e->segments);
	while (g_hash_table_iter_next(&it, &k, &v)) {
		te_segment *s = v;
		te_segver *sv = s->cur;
		g_hash_table_iter_remove(&it);
		segment_free(s);
		te_segver_unref(sv, false);
	}
	g_hash_table_remove_all(e->seg_by_name);
	g_rw_lock_writer_unlock(&e->data);
}

char *te_segment_name(te_engine *e, te_segment_id id)
{
	char *name = NULL;

	if (id == TE_LOCAL_SEGMENT)
		return g_strdup(e->name);
	g_rec_mutex_lock(&e->ctl);
	te_segment *s = g_hash_table_lookup(e->segments, GINT_TO_POINTER(id));
	if (s != NULL)
		name = g_strdup(s->name);
	g_rec_mutex_unlock(&e->ctl);
	return name;
}

const char *te_segment_transport(te_engine *e, te_segment_id id)
{
	const char *name = NULL;

	if (e == NULL) {
		te_err("te_segment_transport: NULL engine");
		return NULL;
	}
	if (id == TE_LOCAL_SEGMENT)
		return "local";
	g_rw_lock_reader_lock(&e->data);
	te_segment *s = g_hash_table_lookup(e->segments, GINT_TO_POINTER(id));
	if (s != NULL && s->cur != NULL)
		name = s->cur->tp->hc.plugin->name; /* the plugin's static name */
	g_rw_lock_reader_unlock(&e->data);
	if (name == NULL)
		te_err("te_segment_transport: unknown segment id %d", id);
	return name;
}

int te_segment_buffers(te_engine *e, te_segment_id id, te_segment_buffer *out, size_t max)
{
	int n = 0;

	if (e == NULL || (out == NULL && max > 0)) {
		te_err("te_segment_buffers: NULL engine or output array");
		return -EINVAL;
	}
	if (id == TE_LOCAL_SEGMENT) {
		g_rw_lock_reader_lock(&e->mem.lock);
		n = (int)e->mem.regions->len;
		for (guint i = 0; i < e->mem.regions->len && i < max; i++) {
			te_region *r = g_ptr_array_index(e->mem.regions, i);
			out[i].addr = (uintptr_t)r->addr;
			out[i].length = r->length;
			g_strlcpy(out[i].name, r->location, sizeof out[i].name);
		}
		g_rw_lock_reader_unlock(&e->mem.lock);
		return n;
	}
	if (atomic_load(&e->lost) > 0)
		te_segment_refresh_lost(e, id); /* the peer may be back, its buffers elsewhere */
	g_rw_lock_reader_lock(&e->data);
	te_segment *s = g_hash_table_lookup(e->segments, GINT_TO_POINTER(id));
	if (s == NULL || s->cur == NULL) {
		g_rw_lock_reader_unlock(&e->data);
		te_err("te_segment_buffers: unknown segment id %d", id);
		return TE_ERR_SEGMENT;
	}
	const te_desc *d = s->cur->desc;
	uint64_t off = 0;
	n = (int)d->n_buffers;
	for (size_t i = 0; i < d->n_buffers; i++) {
		if (i < max) {
			out[i].addr = d->file_segment ? off : d->buffers[i].addr;
			out[i].length = d->buffers[i].length;
			g_strlcpy(out[i].name, d->buffers[i].name ? d->buffers[i].name : "", sizeof out[i].name);
		}
		off += d->buffers[i].length;
	}
	g_rw_lock_reader_unlock(&e->data);
	return n;
}
