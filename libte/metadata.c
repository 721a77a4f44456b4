/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The metadata front: picks the store by the connection string's scheme.
 * "P2PHANDSHAKE" is built in (no store: descriptors travel over the RPC
 * socket); every other scheme is served by a metadata plugin.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "teu-redact.h"

static GOnce prefix_once = G_ONCE_INIT;

static gpointer make_prefix(gpointer unused)
{
	(void)unused;
	const char *cluster = te_env2("TE_METADATA_CLUSTER_ID", "MC_METADATA_CLUSTER_ID");

	if (cluster == NULL)
		return g_strdup("mooncake/");
	/* A cluster id with slashes at either end would make empty key parts. */
	gchar *c = g_strdup(cluster);
	gchar *s = c;
	while (*s == '/')
		s++;
	size_t n = strlen(s);
	while (n > 0 && s[n - 1] == '/')
		s[--n] = '\0';
	gchar *out = *s ? g_strdup_printf("mooncake/%s/", s) : g_strdup("mooncake/");
	g_free(c);
	return out;
}

const char *te_metadata_prefix(void)
{
	return g_once(&prefix_once, make_prefix, NULL);
}

static int key_out(char *buf, size_t size, const char *a, const char *b)
{
	int n = snprintf(buf, size, "%s%s%s", te_metadata_prefix(), a, b);
	return n < 0 ? -EINVAL : n;
}

int te_metadata_segment_key(const char *name, char *buf, size_t size)
{
	if (name == NULL || *name == '\0' || (buf == NULL && size > 0)) {
		te_err("te_metadata_segment_key: empty name or NULL buffer");
		return -EINVAL;
	}
	return strchr(name, '/') ? key_out(buf, size, "", name) : key_out(buf, size, "ram/", name);
}

int te_metadata_rpc_key(const char *name, char *buf, size_t size)
{
	if (name == NULL || *name == '\0' || (buf == NULL && size > 0)) {
		te_err("te_metadata_rpc_key: empty name or NULL buffer");
		return -EINVAL;
	}
	return key_out(buf, size, "rpc_meta/", name);
}

/* The scheme of a connection string; a bare "host:port" means etcd. */
static char *conn_scheme(const char *conn)
{
	const char *sep = strstr(conn, "://");

	if (sep == NULL)
		return g_strdup("etcd");
	for (const char *p = conn; p < sep; p++)
		if (!g_ascii_isalnum(*p) && *p != '+' && *p != '-' && *p != '.')
			return NULL;
	return sep == conn ? NULL : g_ascii_strdown(conn, sep - conn);
}

int te_metadata_open_internal(const char *conn, te_engine *engine, te_metadata **out)
{
	te_metadata *md;
	const te_plugin *p;
	char *scheme;
	int rc;

	*out = NULL;
	if (conn == NULL || *conn == '\0') {
		te_err("metadata connection string is empty");
		return -EINVAL;
	}
	md = g_new0(te_metadata, 1);
	/* md->conn only names the store in logs: never with its password */
	md->conn = teu_redact(conn);
	if (strcmp(conn, "P2PHANDSHAKE") == 0) {
		md->p2p = true;
		*out = md;
		return 0;
	}
	scheme = conn_scheme(conn);
	if (scheme == NULL) {
		te_err("metadata connection string '%s' has a malformed scheme", md->conn);
		rc = -EINVAL;
		goto fail;
	}
	p = te_plugin_find_scheme(scheme);
	if (p == NULL) {
		te_err("no metadata plugin serves '%s://' (connection string '%s'); te-info lists the "
		       "plugins found", scheme, md->conn);
		g_free(scheme);
		rc = -EPROTONOSUPPORT;
		goto fail;
	}
	g_free(scheme);
	te_host_init(&md->hc, engine, p);
	md->ops = p->desc->ops;
	rc = md->ops->open(&md->hc.host, conn, &md->ctx);
	if (rc < 0) {
		te_err("metadata store '%s' (plugin %s) failed to open: %s", md->conn, p->name, te_strerror(rc));
		goto fail;
	}
	*out = md;
	return 0;
fail:
	g_free(md->conn);
	g_free(md);
	return rc;
}

int te_metadata_open(const char *conn, te_metadata **out)
{
	if (out == NULL) {
		te_err("te_metadata_open: NULL output pointer");
		return -EINVAL;
	}
	return te_metadata_open_internal(conn, NULL, out);
}

void te_metadata_close(te_metadata *md)
{
	if (md == NULL)
		return;
	if (md->ops != NULL)
		md->ops->close(md->ctx);
	g_free(md->conn);
	g_free(md);
}

static int check_key(te_metadata *md, const char *key, const char *what)
{
	if (md == NULL || key == NULL || *key == '\0') {
		te_err("%s: NULL store or empty key", what);
		return -EINVAL;
	}
	return 0;
}

int te_metadata_get(te_metadata *md, const char *key, char **value, size_t *len)
{
	int rc = check_key(md, key, "te_metadata_get");
	char *v = NULL;
	size_t l = 0;

	if (rc < 0)
		return rc;
	if (value == NULL) {
		te_err("te_metadata_get: NULL value pointer");
		return -EINVAL;
	}
	*value = NULL;
	if (md->p2p)
		return -ENOENT; /* no store: nothing is ever stored */
	rc = md->ops->get(md->ctx, key, &v, &l);
	if (rc < 0) {
		free(v);
		if (rc != -ENOENT)
			te_err("metadata get '%s' from %s failed: %s", key, md->conn, te_strerror(rc));
		return rc;
	}
	if (v == NULL) {
		te_err("metadata plugin for %s returned no value for '%s'", md->conn, key);
		return TE_ERR_METADATA;
	}
	*value = v;
	if (len)
		*len = l;
	return 0;
}

int te_metadata_put_flags(te_metadata *md, const char *key, const char *value, size_t len,
			  unsigned flags)
{
	int rc = check_key(md, key, "te_metadata_put");

	if (rc < 0)
		return rc;
	if (value == NULL) {
		te_err("te_metadata_put: NULL value for '%s'", key);
		return -EINVAL;
	}
	if (md->p2p)
		return 0;
	rc = md->ops->put(md->ctx, key, value, len, flags);
	if (rc < 0)
		te_err("metadata put '%s' to %s failed: %s", key, md->conn, te_strerror(rc));
	return rc;
}

int te_metadata_put(te_metadata *md, const char *key, const char *value, size_t len)
{
	return te_metadata_put_flags(md, key, value, len, 0);
}

int te_metadata_remove(te_metadata *md, const char *key)
{
	int rc = check_key(md, key, "te_metadata_remove");

	if (rc < 0)
		return rc;
	if (md->p2p)
		return 0;
	rc = md->ops->remove(md->ctx, key);
	if (rc < 0 && rc != -ENOENT)
		te_err("metadata remove '%s' from %s failed: %s", key, md->conn, te_strerror(rc));
	return rc == -ENOENT ? 0 : rc;
}
