/* SPDX-License-Identifier: Apache-2.0 */
/*
 * etcd metadata store: etcd's v3 JSON gateway (POST <api>/kv/range, put,
 * deleterange, lease/grant, lease/keepalive, lease/revoke; keys and values
 * base64), spoken through libsoup and json-glib.
 *
 * Endpoints: "etcd://h1:p1,h2:p2" or a bare "h:p"; "etcds://" speaks https to
 * every endpoint. A request goes to the endpoint that answered last; when it
 * cannot be reached, times out or answers 5xx (no leader, shutting down) the
 * next one is tried, each once.
 *
 * Authentication: with a user and password (user-info of the string, or
 * TE_ETCD_USERNAME / TE_ETCD_PASSWORD) the plugin asks <api>/auth/authenticate
 * for a token and sends it in the Authorization header. etcd's simple tokens
 * live on the member that issued them and expire when unused, so a token is
 * kept per endpoint and fetched again when an endpoint calls it invalid (the
 * call is then repeated once) and on fail-over. The password stays in memory
 * for that; logs name the store with "user:***@".
 *
 * Liveness: keys put with TE_META_OWNED are attached to one lease per store
 * handle, kept alive by a thread. If the lease is lost anyway (the store was
 * unreachable for longer than its TTL), the thread grants a new one and puts
 * the owned keys again, so a live engine never stays invisible. A crashed
 * engine stops the keep-alives and etcd deletes its keys after the TTL.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <string.h>

#include <glib.h>

#include "etcd.h"
#include "teu-hostport.h"
#include "teu-redact.h"
#include "teu-store.h"

#define DEFAULT_PORT 2379
#define MAX_ENDPOINTS 64

/* ----------------------------------------------------------- open/close */

/* "h:p", "[v6]:p" or "h" (port 2379); an http:// or https:// prefix chooses
 * the scheme of this endpoint, else `scheme`. */
static char *endpoint_url(const char *ep, const char *api, const char *scheme)
{
	const char *s = ep;
	char host[TEU_HOST_MAX];
	int port = DEFAULT_PORT, p;

	if (g_ascii_strncasecmp(s, "http://", 7) == 0) {
		s += 7;
		scheme = "http";
	} else if (g_ascii_strncasecmp(s, "https://", 8) == 0) {
		s += 8;
		scheme = "https";
	}
	size_t n = strlen(s);
	while (n > 0 && s[n - 1] == '/')
		n--;
	if (n == 0)
		return NULL;
	char *t = g_strndup(s, n);
	/* a bare IPv6 address without brackets is refused: its last group would
	 * pass for the port */
	if (teu_hostport_split(t, host, sizeof host, &p) < 0 || *host == '\0' || p == 0)
		goto bad;
	if (p > 0)
		port = p;
	for (const char *c = host; *c; c++)
		if (!(g_ascii_isalnum(*c) || strchr(".-_:", *c)))
			goto bad;
	char *url = g_strdup_printf(strchr(host, ':') ? "%s://[%s]:%d%s" : "%s://%s:%d%s", scheme, host, port, api);
	g_free(t);
	return url;
bad:
	g_free(t);
	return NULL;
}

static void etcd_close(void *ctx)
{
	etcd *s = ctx;

	if (s == NULL)
		return;
	teu_keeper_clear(&s->keeper);
	if (s->http != NULL) {
		g_mutex_lock(&s->lease_lock);
		etcd_lease_revoke(s);
		g_mutex_unlock(&s->lease_lock);
	}
	teu_http_free(s->http);
	for (int i = 0; s->tokens && i < s->n_urls; i++)
		teu_http_secret_free(s->tokens[i]);
	g_free(s->tokens);
	g_strfreev(s->urls);
	g_free(s->conn);
	g_free(s->user);
	teu_http_secret_free(s->password);
	g_mutex_clear(&s->token_lock);
	if (s->owned)
		g_hash_table_unref(s->owned);
	g_mutex_clear(&s->lease_lock);
	g_free(s);
}

/* Splits "user:password@" off the endpoint list (the last '@' ends it, so a
 * password may hold one); both percent-decoded. -EINVAL on a malformed
 * user-info, logged without it. */
static int split_userinfo(const te_host *h, const char *redacted, const char **list, char **user,
			  char **password)
{
	const char *at = strrchr(*list, '@');

	*user = *password = NULL;
	if (at == NULL)
		return 0;
	const char *colon = memchr(*list, ':', (size_t)(at - *list));
	char *u = g_strndup(*list, (gsize)((colon ? colon : at) - *list));
	char *pw = colon ? g_strndup(colon + 1, (gsize)(at - colon - 1)) : NULL;
	*user = g_uri_unescape_string(u, NULL);
	*password = pw ? g_uri_unescape_string(pw, NULL) : NULL;
	g_free(u);
	teu_http_secret_free(pw);
	if (*user == NULL || **user == '\0' || (pw != NULL && *password == NULL)) {
		h->log(h, TE_LOG_ERROR, "etcd: the user-info of '%s' is not user:password (percent-encode "
		       "special characters)", redacted);
		g_free(*user);
		teu_http_secret_free(*password);
		*user = *password = NULL;
		return -EINVAL;
	}
	*list = at + 1;
	return 0;
}

static int etcd_open(const te_host *h, const char *conn, void **ctx)
{
	etcd *s;
	const char *list = conn;
	const char *scheme = "http";
	char *err = NULL;
	int rc;

	*ctx = NULL;
	if (conn == NULL || *conn == '\0') {
		h->log(h, TE_LOG_ERROR, "etcd: empty connection string");
		return -EINVAL;
	}
	char *redacted = teu_redact(conn);
	if (g_ascii_strncasecmp(list, "etcd://", 7) == 0) {
		list += 7;
	} else if (g_ascii_strncasecmp(list, "etcds://", 8) == 0) {
		list += 8;
		scheme = "https";
	} else if (strstr(list, "://") != NULL) {
		h->log(h, TE_LOG_ERROR, "etcd: '%s' is not an etcd:// or etcds:// connection string", redacted);
		g_free(redacted);
		return -EINVAL;
	}

	s = g_new0(etcd, 1);
	s->h = h;
	s->conn = redacted;
	g_mutex_init(&s->lease_lock);
	g_mutex_init(&s->token_lock);
	teu_keeper_init(&s->keeper);
	s->owned = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, (GDestroyNotify)g_bytes_unref);

	rc = split_userinfo(h, s->conn, &list, &s->user, &s->password);
	if (rc < 0) {
		etcd_close(s);
		return rc;
	}
	/* As the redis plugin: the string's credentials win over the options. */
	if (s->user == NULL) {
		const char *v = h->config(h, "TE_ETCD_USERNAME", NULL);
		if (v && *v)
			s->user = g_strdup(v);
	}
	if (s->password == NULL && s->user != NULL) {
		const char *v = h->config(h, "TE_ETCD_PASSWORD", NULL);
		if (v && *v)
			s->password = g_strdup(v);
	}
	if (s->user != NULL && s->password == NULL) {
		h->log(h, TE_LOG_ERROR, "etcd %s: user '%s' given without a password (TE_ETCD_PASSWORD)", s->conn,
		       s->user);
		etcd_close(s);
		return -EINVAL;
	}
	if (s->user == NULL && h->config(h, "TE_ETCD_PASSWORD", NULL) != NULL)
		h->log(h, TE_LOG_WARN, "etcd %s: TE_ETCD_PASSWORD is set without a user (TE_ETCD_USERNAME); "
		       "requests go without authentication", s->conn);

	const char *api = h->config(h, "TE_ETCD_API_PREFIX", NULL);
	if (api == NULL || *api == '\0')
		api = "/v3";
	if (api[0] != '/' || strpbrk(api, "?#% ") != NULL) {
		h->log(h, TE_LOG_ERROR, "etcd: TE_ETCD_API_PREFIX=%s must be a path such as /v3", api);
		etcd_close(s);
		return -EINVAL;
	}
	gchar **eps = g_strsplit(list, ",", -1);
	GPtrArray *urls = g_ptr_array_new();
	bool bad = false, tls = false;
	for (gchar **e = eps; *e && !bad; e++) {
		const char *t = g_strstrip(*e);
		if (*t == '\0')
			continue;
		char *u = endpoint_url(t, api, scheme);
		if (u == NULL) {
			h->log(h, TE_LOG_ERROR, "etcd: endpoint '%s' of '%s' is not host:port", t, s->conn);
			bad = true;
		} else if (urls->len >= MAX_ENDPOINTS) {
			h->log(h, TE_LOG_ERROR, "etcd: more than %d endpoints in '%s'", MAX_ENDPOINTS, s->conn);
			g_free(u);
			bad = true;
		} else {
			tls = tls || g_str_has_prefix(u, "https:");
			g_ptr_array_add(urls, u);
		}
	}
	g_strfreev(eps);
	if (!bad && urls->len == 0) {
		h->log(h, TE_LOG_ERROR, "etcd: no endpoint in '%s'", s->conn);
		bad = true;
	}
	g_ptr_array_add(urls, NULL);
	s->urls = (char **)g_ptr_array_free(urls, FALSE);
	s->n_urls = (int)g_strv_length(s->urls);
	s->tokens = g_new0(char *, s->n_urls + 1);
	if (bad) {
		etcd_close(s);
		return -EINVAL;
	}

	s->timeout_ms = (int)te_host_config_u64(h, "TE_ETCD_TIMEOUT_MS", NULL, 5000, 10, 600000);
	s->ttl = (int64_t)te_host_config_u64(h, "TE_ETCD_LEASE_TTL", NULL, 10, 1, 86400);
	s->keepalive_ms = (int64_t)te_host_config_u64(h, "TE_ETCD_KEEPALIVE_MS", NULL, 0, 0, 3600000);
	s->lease_on = te_host_config_u64(h, "TE_ETCD_LEASE", NULL, 1, 0, 1) != 0;
	if (s->keepalive_ms > 0 && s->keepalive_ms >= s->ttl * 1000)
		h->log(h, TE_LOG_WARN, "etcd: TE_ETCD_KEEPALIVE_MS=%" PRId64 " is not below the lease TTL of "
		       "%" PRId64 " s; keys may expire between keep-alives", s->keepalive_ms, s->ttl);

	const char *ca = h->config(h, "TE_ETCD_CA_FILE", NULL);
	const char *cert = h->config(h, "TE_ETCD_CERT_FILE", NULL);
	const char *key = h->config(h, "TE_ETCD_KEY_FILE", NULL);
	if (ca && !*ca)
		ca = NULL;
	if (cert && !*cert)
		cert = NULL;
	if (key && !*key)
		key = NULL;
	if (key != NULL && cert == NULL) {
		h->log(h, TE_LOG_ERROR, "etcd %s: TE_ETCD_KEY_FILE needs TE_ETCD_CERT_FILE", s->conn);
		etcd_close(s);
		return -EINVAL;
	}
	if (!tls && (ca || cert))
		h->log(h, TE_LOG_WARN, "etcd %s: TE_ETCD_CA_FILE / TE_ETCD_CERT_FILE are set but no endpoint "
		       "is https (use etcds://); they are not used", s->conn);
	teu_http_opts o = {
		.max_reply = te_host_config_u64(h, "TE_ETCD_MAX_REPLY", NULL, 64u << 20, 4096, 1ull << 32),
		.max_conns = 8,
		.ca_file = tls ? ca : NULL,
		.cert_file = tls ? cert : NULL,
		.key_file = tls ? key : NULL,
	};
	s->http = teu_http_new(&o, &err);
	if (s->http == NULL) {
		h->log(h, TE_LOG_ERROR, "etcd %s: %s", s->conn, err ? err : "HTTP client failed to start");
		rc = err && (ca || cert) ? -EINVAL : -ENOMEM;
		g_free(err);
		etcd_close(s);
		return rc;
	}

	/* With credentials, authenticate now: a wrong password fails engine
	 * creation with its reason instead of the first lookup. */
	if (s->user != NULL) {
		rc = -EIO;
		for (int i = 0; i < s->n_urls && rc < 0 && rc != -EACCES; i++) {
			g_mutex_lock(&s->token_lock);
			rc = etcd_authenticate(s, i);
			g_mutex_unlock(&s->token_lock);
			if (rc == 0)
				s->cur = i;
		}
		if (rc < 0) {
			if (rc != -EACCES)
				h->log(h, TE_LOG_ERROR, "etcd %s: no endpoint answered the authentication: %s",
				       s->conn, strerror(rc == -EAGAIN ? EIO : -rc));
			rc = rc == -EAGAIN ? -EIO : rc;
			etcd_close(s);
			return rc;
		}
	}
	*ctx = s;
	return 0;
}

static const char *const etcd_schemes[] = { "etcd", "etcds", NULL };

TEU_STORE_PLUGIN(etcd, "etcd metadata store (v3 JSON gateway, leases tie keys to engine liveness)")
