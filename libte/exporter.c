/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The metrics endpoint (docs/metrics.md). An exporter plugin serves the
 * process's metrics; libte itself has no HTTP server. When an engine starts
 * with TE_METRICS_ADDR (engine option `metrics_addr` or the environment),
 * the first such engine loads the exporter TE_METRICS_EXPORTER
 * ("prometheus") and creates the one instance of the process; later
 * engines share it and the last of them to go destroys it. An endpoint
 * that was asked for and cannot start fails te_engine_create(): whoever
 * set the address must learn that the metrics are absent.
 */
#include <json-glib/json-glib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exporter.h"
#include "teu-json.h"

#define ADDR_MAX 300

static GMutex lock;
static GHashTable *holders; /* te_engine* that hold the instance */
static const te_plugin *plugin;
static const te_exporter_ops *ops;
static void *instance;
static char *serving; /* the address asked for */
static te_host_ctx hctx; /* the exporter's host table: no engine, it outlives them */

/* An engine option under either name, else the environment variable. */
static const char *setting(const te_engine *e, const char *opt, const char *env)
{
	const char *v = te_engine_option(e, opt);

	if (v == NULL)
		v = te_engine_option(e, env);
	if (v == NULL)
		v = te_env2(env, NULL);
	return v != NULL && *v != '\0' ? v : NULL;
}

/* "host:port", "[v6]:port", ":port" or "port": the plugin resolves it;
 * here only its shape, so that a typo is named before any plugin is
 * looked for. */
static bool addr_shape_ok(const char *a)
{
	const char *colon = strrchr(a, ':');
	const char *port = colon ? colon + 1 : a;
	guint64 n;

	return strlen(a) < ADDR_MAX && *port != '\0' &&
	       g_ascii_string_to_unsigned(port, 10, 0, 65535, &n, NULL);
}

static int start(te_engine *e, const char *addr)
{
	const char *name = setting(e, "metrics_exporter", "TE_METRICS_EXPORTER");
	const char *token = setting(e, "metrics_token_file", "TE_METRICS_TOKEN_FILE");
	const char *cert = setting(e, "metrics_tls_cert", "TE_METRICS_TLS_CERT");
	const char *key = setting(e, "metrics_tls_key", "TE_METRICS_TLS_KEY");
	char *args = NULL;
	int rc;

	if (name == NULL)
		name = "prometheus";
	if (!addr_shape_ok(addr)) {
		te_err("metrics endpoint: TE_METRICS_ADDR=%s is not HOST:PORT (port 0 picks a free one)", addr);
		return -EINVAL;
	}
	plugin = te_plugin_find(TE_KIND_EXPORTER, name);
	if (plugin == NULL) {
		te_err("metrics endpoint: TE_METRICS_ADDR is set but no exporter plugin named '%s' was found "
		       "(TE_METRICS_EXPORTER; te-info lists the plugins and the directories searched)", name);
		return -ENOENT;
	}
	if (token != NULL || cert != NULL || key != NULL) {
		/* {"token_file": ..., "tls_cert": ..., "tls_key": ...}, the ones set
		 * (JSON's escapes: a path may hold any byte but NUL) */
		const char *names[] = { "token_file", "tls_cert", "tls_key" };
		const char *values[] = { token, cert, key };
		JsonBuilder *b = json_builder_new();
		json_builder_begin_object(b);
		for (size_t i = 0; i < G_N_ELEMENTS(names); i++) {
			if (values[i] == NULL)
				continue;
			json_builder_set_member_name(b, names[i]);
			json_builder_add_string_value(b, values[i]);
		}
		json_builder_end_object(b);
		args = teu_json_finish(b, NULL);
		if (args == NULL) {
			plugin = NULL;
			return -ENOMEM;
		}
	}
	/* The exporter serves every engine of the process and outlives the
	 * one that started it: its host has no engine, and its metrics_text()
	 * covers them all. */
	te_host_init(&hctx, NULL, plugin);
	ops = plugin->desc->ops;
	rc = ops->create(&hctx.host, addr, args, &instance);
	free(args);
	if (rc < 0) {
		te_err("metrics endpoint: exporter %s could not serve at %s: %s", name, addr, te_strerror(rc));
		instance = NULL;
		plugin = NULL;
		return rc;
	}
	serving = g_strdup(addr);
	char url[512] = "";
	if (TE_HAS_OP(ops, url) && ops->url(instance, url, sizeof url) == 0)
		te_info("metrics at %s", url);
	else
		te_info("metrics served by exporter %s at %s", name, addr);
	return 0;
}

int te_exporter_acquire(te_engine *e)
{
	const char *addr = setting(e, "metrics_addr", "TE_METRICS_ADDR");
	int rc = 0;

	if (addr == NULL)
		return 0;
	g_mutex_lock(&lock);
	if (holders == NULL)
		holders = g_hash_table_new(g_direct_hash, g_direct_equal);
	if (instance == NULL)
		rc = start(e, addr);
	else if (strcmp(addr, serving) != 0)
		te_warn("metrics endpoint: this engine asks for %s, but the process already serves its metrics "
			"at %s (one endpoint per process); sharing it", addr, serving);
	if (rc == 0)
		g_hash_table_add(holders, e);
	g_mutex_unlock(&lock);
	return rc;
}

void te_exporter_release(te_engine *e)
{
	g_mutex_lock(&lock);
	if (holders != NULL && g_hash_table_remove(holders, e) && g_hash_table_size(holders) == 0) {
		/* Under the lock: an engine starting now waits, then starts anew
		 * on a port that is free again. */
		ops->destroy(instance);
		te_info("metrics endpoint at %s stopped", serving);
		instance = NULL;
		plugin = NULL;
		g_free(serving);
		serving = NULL;
	}
	g_mutex_unlock(&lock);
}
