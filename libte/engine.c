/* SPDX-License-Identifier: Apache-2.0 */
/* Engine life cycle and transports. */
#include <arpa/inet.h>
#include <string.h>

#include "exporter.h"
#include "internal.h"
#include "metrics.h"

#define DRAIN_TIMEOUT_DEFAULT_MS 60000
#define TIMEOUT_MAX_MS 3600000 /* an hour: any bound above it is a mistake */

/* Waits, bounded, until *counter is 0. Polls: the counter's last decrement is
 * the last thing a completing thread does with the engine (see batch.c). */
static bool drain(atomic_long *counter, const char *what, int64_t ms)
{
	int64_t end = te_now_ms() + ms, warn = te_now_ms() + 5000;

	while (atomic_load(counter) > 0) {
		if (te_now_ms() > end) {
			te_err("%s: %ld tasks still in flight after %lld ms (TE_DRAIN_TIMEOUT_MS)", what,
			       atomic_load(counter), (long long)ms);
			return false;
		}
		if (te_now_ms() > warn) {
			te_warn("%s: waiting for %ld tasks in flight", what, atomic_load(counter));
			warn += 5000;
		}
		g_usleep(1000);
	}
	return true;
}

static bool drain_int(atomic_int *counter, const char *what, int64_t ms)
{
	int64_t end = te_now_ms() + ms;

	while (atomic_load(counter) > 0) {
		if (te_now_ms() > end) {
			te_err("%s: still busy (%d) after %lld ms (TE_DRAIN_TIMEOUT_MS)", what,
			       atomic_load(counter), (long long)ms);
			return false;
		}
		g_usleep(1000);
	}
	return true;
}

/* ------------------------------------------------------------ transports */

static te_transport_inst *find_transport(te_engine *e, const char *name)
{
	for (guint i = 0; i < e->transports->len; i++) {
		te_transport_inst *tp = g_ptr_array_index(e->transports, i);
		if (strcmp(tp->hc.plugin->name, name) == 0)
			return tp;
	}
	return NULL;
}

static void clear_handlers_of(te_engine *e, const te_host_ctx *hc)
{
	g_rw_lock_writer_lock(&e->rpc_lock);
	for (int i = 0; i < 4; i++)
		if (e->handlers[i].owner == hc)
			e->handlers[i] = (te_rpc_handler_slot){ 0 };
	g_rw_lock_writer_unlock(&e->rpc_lock);
}

int te_transport_install(te_engine *e, const char *name, const char *args)
{
	const te_plugin *p;
	te_transport_inst *tp;
	int rc;

	if (e == NULL || name == NULL || *name == '\0') {
		te_err("te_transport_install: NULL engine or empty transport name");
		return -EINVAL;
	}
	/* The arguments reach a plugin's create(), a third party's too: bounded
	 * like every JSON from outside before any of them parses it. */
	if (args != NULL && *args != '\0') {
		static const te_json_limits lim = { TE_JSON_MAX_DEPTH, TE_JSON_MAX_ITEMS, TE_JSON_MAX_VALUES,
						     65536, 1u << 20 };
		char why[160];
		if (te_json_check(args, strlen(args), &lim, why, sizeof why) < 0) {
			te_err("te_transport_install: the arguments for %s are not acceptable JSON: %s", name,
			       why);
			return -EINVAL;
		}
	}
	g_rec_mutex_lock(&e->ctl);
	if (find_transport(e, name) != NULL) {
		g_rec_mutex_unlock(&e->ctl);
		te_err("transport %s is already installed", name);
		return -EEXIST;
	}
	p = te_plugin_find(TE_KIND_TRANSPORT, name);
	if (p == NULL) {
		g_rec_mutex_unlock(&e->ctl);
		te_err("no transport plugin named '%s' was found; te-info lists the plugin directories "
		       "searched and what they hold", name);
		return -ENOENT;
	}
	/* A transport built before ABI 1.2 cannot authenticate connections of
	 * its own: with a key it would serve anyone. */
	if (e->auth != NULL && p->abi_minor < 2) {
		g_rec_mutex_unlock(&e->ctl);
		te_err("transport %s was built for plugin ABI %u.%u, before peer authentication; it cannot "
		       "serve an engine with a cluster key (TE_AUTH_KEY_FILE)", name, p->abi_major, p->abi_minor);
		return -ENOTSUP;
	}
	tp = g_new0(te_transport_inst, 1);
	te_host_init(&tp->hc, e, p);
	tp->hc.mb = te_metrics_block(e->metrics, name);
	tp->ops = p->desc->ops;
	rc = tp->ops->create(&tp->hc.host, args, &tp->ctx);
	if (rc < 0) {
		g_rec_mutex_unlock(&e->ctl);
		clear_handlers_of(e, &tp->hc);
		te_err("transport %s failed to start: %s", name, te_strerror(rc));
		g_free(tp);
		return rc;
	}
	/* Memory registered before the transport came. */
	g_rw_lock_reader_lock(&e->mem.lock);
	GPtrArray *regions = g_ptr_array_copy(e->mem.regions, NULL, NULL);
	g_rw_lock_reader_unlock(&e->mem.lock);
	guint done = 0;
	for (; done < regions->len && rc == 0; done++)
		rc = te_region_attach(e, tp, g_ptr_array_index(regions, done));
	if (rc < 0) {
		for (guint i = 0; i + 1 < done; i++)
			te_region_detach(e, tp, g_ptr_array_index(regions, i));
		g_ptr_array_unref(regions);
		clear_handlers_of(e, &tp->hc);
		tp->ops->destroy(tp->ctx);
		g_rec_mutex_unlock(&e->ctl);
		g_free(tp);
		return rc;
	}
	g_ptr_array_unref(regions);
	g_ptr_array_add(e->transports, tp);
	rc = te_engine_publish(e);
	if (rc < 0)
		te_warn("transport %s installed, but publishing the descriptor failed: %s", name,
			te_strerror(rc));
	g_rec_mutex_unlock(&e->ctl);
	te_info("installed transport %s", name);
	return 0;
}

static int uninstall(te_engine *e, te_transport_inst *tp)
{
	const char *name = tp->hc.plugin->name;

	/* Before the drain below: a thread about to wait through this instance's
	 * progress() either is counted in its inflight or sees this flag. */
	atomic_store(&tp->retired, true);
	g_ptr_array_remove(e->transports, tp);
	te_segments_detach_transport(e, tp);
	if (!e->closing) {
		int rc = te_engine_publish(e);
		if (rc < 0)
			te_warn("publishing the descriptor without %s failed: %s", name, te_strerror(rc));
	}
	/* Transfers already handed over finish on their own (bounded by the
	 * transport's timeouts); versions of segments bound to it go with them. */
	if (!drain_int(&tp->inflight, name, e->drain_ms) || !drain_int(&tp->segvers, name, e->drain_ms)) {
		te_err("transport %s did not finish its transfers; leaving it loaded", name);
		return -EBUSY;
	}
	g_rw_lock_reader_lock(&e->mem.lock);
	for (guint i = 0; i < e->mem.regions->len; i++)
		te_region_detach(e, tp, g_ptr_array_index(e->mem.regions, i));
	g_rw_lock_reader_unlock(&e->mem.lock);
	tp->ops->destroy(tp->ctx);
	clear_handlers_of(e, &tp->hc);
	te_info("uninstalled transport %s", name);
	g_ptr_array_add(e->retired, tp); /* batches may still point at it */
	return 0;
}

int te_transport_uninstall(te_engine *e, const char *name)
{
	te_transport_inst *tp;
	int rc;

	if (e == NULL || name == NULL) {
		te_err("te_transport_uninstall: NULL engine or name");
		return -EINVAL;
	}
	g_rec_mutex_lock(&e->ctl);
	tp = find_transport(e, name);
	if (tp == NULL) {
		g_rec_mutex_unlock(&e->ctl);
		te_err("te_transport_uninstall: transport %s is not installed", name);
		return -ENOENT;
	}
	rc = uninstall(e, tp);
	g_rec_mutex_unlock(&e->ctl);
	return rc;
}

/* Installs every same-host transport found (they only ever serve engines on
 * this host, so they add to a network transport and never replace it). */
static void install_same_host(te_engine *e)
{
	GPtrArray *all = te_plugin_transports();

	for (guint i = 0; i < all->len; i++) {
		const te_plugin *p = g_ptr_array_index(all, i);
		const te_transport_ops *o = p->desc->ops;
		char why[256] = "";
		te_host_ctx hc;
		if (!(o->flags & TE_TRANSPORT_SAME_HOST))
			continue;
		te_host_init(&hc, e, p);
		int rc = TE_HAS_OP(o, probe) ? o->probe(&hc.host, why, sizeof why) : 0;
		if (rc == 0)
			rc = te_transport_install(e, p->name, NULL);
		if (rc < 0 && rc != -EEXIST)
			te_info("auto-discovery: same-host transport %s not installed: %s", p->name,
				*why ? why : te_strerror(rc));
	}
	g_ptr_array_unref(all);
}

static int transport_auto(te_engine *e, const char **installed);

int te_transport_auto(te_engine *e, const char **installed)
{
	int rc = transport_auto(e, installed);
	if (rc == 0)
		install_same_host(e);
	return rc;
}

/* Highest rank first; equal ranks by name, so the choice does not depend
 * on the order the plugin folders list their files in. */
static gint by_rank(gconstpointer a, gconstpointer b)
{
	const te_plugin *x = *(const te_plugin *const *)a, *y = *(const te_plugin *const *)b;
	uint32_t rx = te_transport_priority(x), ry = te_transport_priority(y);

	return rx > ry ? -1 : rx < ry ? 1 : strcmp(x->name, y->name);
}

/* The best network transport for memory that works here: the candidates
 * (TE_TRANSPORT_MEMORY, not same-host, a rank above 0) by rank, the first
 * whose probe passes and whose instance starts. Mooncake's MC_FORCE_TCP
 * and MC_FORCE_HCA narrow them to the transport they name. */
static int transport_auto(te_engine *e, const char **installed)
{
	bool force_tcp = te_env2("TE_FORCE_TCP", "MC_FORCE_TCP") != NULL;
	bool force_hca = te_env2("TE_FORCE_HCA", "MC_FORCE_HCA") != NULL;
	const char *only = force_tcp ? "tcp" : force_hca ? "rdma" : NULL;
	char last_why[256] = "";
	const char *last = NULL;
	int rc = TE_ERR_NO_TRANSPORT;

	if (e == NULL) {
		te_err("te_transport_auto: NULL engine");
		return -EINVAL;
	}
	if (installed)
		*installed = NULL;
	GPtrArray *all = te_plugin_transports();
	GPtrArray *cand = g_ptr_array_new();
	for (guint i = 0; i < all->len; i++) {
		const te_plugin *p = g_ptr_array_index(all, i);
		unsigned f = ((const te_transport_ops *)p->desc->ops)->flags;
		if ((f & TE_TRANSPORT_MEMORY) && !(f & TE_TRANSPORT_SAME_HOST) && te_transport_priority(p) > 0 &&
		    (only == NULL || strcmp(p->name, only) == 0))
			g_ptr_array_add(cand, (gpointer)p);
	}
	g_ptr_array_unref(all);
	g_ptr_array_sort(cand, by_rank);
	for (guint i = 0; i < cand->len; i++) {
		const te_plugin *p = g_ptr_array_index(cand, i);
		const te_transport_ops *o = p->desc->ops;
		char why[256] = "";
		te_host_ctx hc;
		te_host_init(&hc, e, p);
		rc = TE_HAS_OP(o, probe) ? o->probe(&hc.host, why, sizeof why) : 0;
		if (rc == 0)
			rc = te_transport_install(e, p->name, NULL);
		if (rc == 0 || rc == -EEXIST) {
			if (installed)
				*installed = p->name;
			g_ptr_array_unref(cand);
			return 0;
		}
		last = p->name;
		g_strlcpy(last_why, *why ? why : te_strerror(rc), sizeof last_why);
		if (i + 1 < cand->len)
			te_info("auto-discovery: %s unusable (%s); trying %s", p->name, last_why,
				((const te_plugin *)g_ptr_array_index(cand, i + 1))->name);
	}
	g_ptr_array_unref(cand);
	if (only != NULL && last == NULL) {
		te_err("auto-discovery: %s is set but there is no %s plugin", force_tcp ? "TE_FORCE_TCP" : "TE_FORCE_HCA",
		       only);
		return TE_ERR_NO_TRANSPORT;
	}
	if (force_hca) {
		te_err("auto-discovery: TE_FORCE_HCA is set but RDMA is unusable: %s", last_why);
		return TE_ERR_NO_TRANSPORT;
	}
	if (last == NULL) {
		te_err("auto-discovery: no transport plugin for memory is ranked for automatic choice");
		return TE_ERR_NO_TRANSPORT;
	}
	te_err("auto-discovery: no transport works here; the last tried, %s: %s", last, last_why);
	return rc < 0 ? rc : TE_ERR_NO_TRANSPORT;
}

int te_transport_list(const te_engine *e, const char **names, size_t max)
{
	te_engine *me = (te_engine *)e;
	int n;

	if (e == NULL || (names == NULL && max > 0)) {
		te_err("te_transport_list: NULL engine or name array");
		return -EINVAL;
	}
	g_rec_mutex_lock(&me->ctl);
	n = (int)me->transports->len;
	for (guint i = 0; i < me->transports->len && i < max; i++)
		names[i] = ((te_transport_inst *)g_ptr_array_index(me->transports, i))->hc.plugin->name;
	g_rec_mutex_unlock(&me->ctl);
	return n;
}

/* -------------------------------------------------------------- create */

static bool is_any_address(const char *v)
{
	return strcmp(v, "*") == 0 || strcmp(v, "0.0.0.0") == 0 || strcmp(v, "::") == 0 ||
	       strcmp(v, "[::]") == 0;
}

/* Least exposure: the RPC socket and the TCP data port listen on the address
 * the engine publishes when that is a numeric address, rather than on every
 * interface. The choice becomes the engine option TE_BIND_ADDRESS, which the
 * RPC server and the transports read ("": every interface). A host name
 * keeps every interface (it may stand for several addresses); so does
 * TE_BIND_ADDRESS=* (or 0.0.0.0, ::), and TE_TCP_RAILS (data on several
 * addresses). */
static void choose_bind_address(te_engine *e, const char *published)
{
	const char *v = te_engine_option(e, "TE_BIND_ADDRESS");
	char addr[INET6_ADDRSTRLEN + 2];
	unsigned char tmp[sizeof(struct in6_addr)];

	if (v == NULL)
		v = te_env2("TE_BIND_ADDRESS", NULL);
	if (v != NULL) {
		if (is_any_address(v))
			g_hash_table_replace(e->options, g_strdup("TE_BIND_ADDRESS"), g_strdup(""));
		return;
	}
	if (te_engine_option(e, "TE_TCP_RAILS") != NULL || te_env2("TE_TCP_RAILS", NULL) != NULL)
		return;
	size_t n = strlen(published);
	if (n >= 2 && n < sizeof addr && published[0] == '[' && published[n - 1] == ']')
		g_strlcpy(addr, published + 1, n - 1);
	else
		g_strlcpy(addr, published, sizeof addr);
	if (inet_pton(AF_INET, addr, tmp) != 1 && inet_pton(AF_INET6, addr, tmp) != 1)
		return;
	g_hash_table_replace(e->options, g_strdup("TE_BIND_ADDRESS"), g_strdup(addr));
	te_dbg("listening on %s, the published address, only (TE_BIND_ADDRESS=* for every interface)", addr);
}

static int install_from_options(te_engine *e)
{
	const char *list = te_engine_option(e, "transports");
	const char *autod = te_engine_option(e, "auto_discovery");
	int rc = 0;

	if (list != NULL) {
		gchar **names = g_strsplit(list, ",", -1);
		for (gchar **n = names; *n != NULL && rc == 0; n++) {
			const char *s = g_strstrip(*n);
			if (*s != '\0')
				rc = te_transport_install(e, s, NULL);
		}
		g_strfreev(names);
	}
	if (rc == 0 && autod != NULL && strcmp(autod, "0") != 0 && g_ascii_strcasecmp(autod, "false") != 0)
		rc = te_transport_auto(e, NULL);
	return rc;
}

int te_engine_create(const char *metadata, const char *local_name, const te_option *options,
		     size_t n_options, te_engine **out)
{
	te_engine *e;
	char *host = NULL;
	int name_port = -1, port_wanted = 0, rc;

	if (out == NULL) {
		te_err("te_engine_create: NULL output pointer");
		return -EINVAL;
	}
	*out = NULL;
	if (metadata == NULL || *metadata == '\0') {
		te_err("te_engine_create: empty metadata connection string (use \"P2PHANDSHAKE\" for none)");
		return -EINVAL;
	}
	if (n_options > 0 && options == NULL) {
		te_err("te_engine_create: %zu options but a NULL array", n_options);
		return -EINVAL;
	}
	for (size_t i = 0; i < n_options; i++)
		if (options[i].key == NULL || *options[i].key == '\0' || options[i].value == NULL) {
			te_err("te_engine_create: option %zu has an empty key or a NULL value", i);
			return -EINVAL;
		}
	if (local_name == NULL)
		local_name = g_get_host_name();
	if (*local_name == '\0' || strlen(local_name) >= TE_MAX_NAME - 8) {
		te_err("te_engine_create: local name is empty or too long");
		return -EINVAL;
	}
	/* Names with '/' would be stored as NVMe-oF keys. */
	if (strchr(local_name, '/') != NULL) {
		te_err("te_engine_create: local name '%s' must not contain '/'", local_name);
		return -EINVAL;
	}
	rc = te_split_host_port(local_name, &host, &name_port);
	if (rc < 0) {
		te_err("te_engine_create: local name '%s' is not host or host:port", local_name);
		return -EINVAL;
	}

	te_plugins_init();
	e = g_new0(te_engine, 1);
	g_rec_mutex_init(&e->ctl);
	g_rw_lock_init(&e->data);
	g_rw_lock_init(&e->rpc_lock);
	g_mutex_init(&e->desc_lock);
	g_mutex_init(&e->notify_lock);
	g_queue_init(&e->notifications);
	te_memreg_init(&e->mem);
	e->mem.publish = te_engine_publish_mem; /* registration publishes through it */
	e->transports = g_ptr_array_new();
	e->retired = g_ptr_array_new_with_free_func(g_free);
	e->segments = g_hash_table_new(g_direct_hash, g_direct_equal);
	e->seg_by_name = g_hash_table_new(g_str_hash, g_str_equal);
	e->options = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
	te_batches_init(e);
	for (size_t i = 0; i < n_options; i++)
		g_hash_table_replace(e->options, g_strdup(options[i].key), g_strdup(options[i].value));
	e->drain_ms = (int64_t)te_engine_option_u64(e, "TE_DRAIN_TIMEOUT_MS", DRAIN_TIMEOUT_DEFAULT_MS, 0,
						    TIMEOUT_MAX_MS);
	e->mem.unregister_ms = (int64_t)te_engine_option_u64(e, "TE_UNREGISTER_TIMEOUT_MS",
							     TE_UNREGISTER_TIMEOUT_DEFAULT_MS, 0,
							     TIMEOUT_MAX_MS);
	/* Unset: a look learned from the waits (util/teu-spin.h); set:
	 * exactly that long, 0 never. */
	const char *spin = te_engine_option(e, "TE_SPIN_US");
	if (spin == NULL)
		spin = te_env2("TE_SPIN_US", NULL);
	teu_spin_policy_init(&e->spin,
			    spin != NULL && *spin != '\0'
				    ? (int64_t)te_engine_option_u64(e, "TE_SPIN_US", 0, 0, TEU_SPIN_MAX_US)
				    : -1,
			    &te_batch_spinners);
	e->metrics = te_metrics_new(e);
	e->reaper = g_thread_pool_new(te_segver_reap, NULL, 1, FALSE, NULL);
	e->notify_pool = te_notify_pool_new();
	e->stream_pool = te_stream_pool_new();
	e->refresh_pool = g_thread_pool_new(te_segver_refresh_job, NULL, 1, FALSE, NULL);
	e->publish_pool = te_publish_pool_new(e);
	rc = te_local_init(e);
	if (rc == 0)
		rc = te_stage_init(e);
	if (rc < 0)
		goto fail;

	rc = te_metadata_open_internal(metadata, e, &e->md);
	if (rc < 0)
		goto fail;

	const char *opt = te_engine_option(e, "rpc_port");
	if (opt != NULL) {
		uint64_t v;
		if (!te_parse_u64(opt, &v) || v > 65535) {
			te_err("te_engine_create: option rpc_port=%s is not a port number", opt);
			rc = -EINVAL;
			goto fail;
		}
		port_wanted = (int)v; /* 0: a free one, whatever the name says */
	} else if (name_port > 0) {
		port_wanted = name_port;
	}
	opt = te_engine_option(e, "auth_key_file");
	if (opt == NULL)
		opt = te_engine_option(e, "TE_AUTH_KEY_FILE");
	if (opt == NULL)
		opt = te_env2("TE_AUTH_KEY_FILE", NULL);
	if (opt != NULL && *opt != '\0') {
		rc = te_auth_load(opt, &e->auth);
		if (rc < 0)
			goto fail;
	}
	opt = te_engine_option(e, "ip_or_host_name");
	e->address = g_strdup(opt ? opt : host);
	choose_bind_address(e, e->address);
	rc = te_rpc_server_start(e, port_wanted, &e->rpc_port, &e->rpc);
	if (rc < 0)
		goto fail;
	if (e->md->p2p) {
		/* The name is how peers reach us: host:rpc_port. */
		e->name = strchr(host, ':') ? g_strdup_printf("[%s]:%d", host, e->rpc_port)
					    : g_strdup_printf("%s:%d", host, e->rpc_port);
	} else {
		e->name = g_strdup(local_name);
	}
	te_metrics_named(e->metrics, e->name);
	e->handlers[TE_RPC_NOTIFY] = (te_rpc_handler_slot){ te_notify_rpc, e, e };

	te_publish_defer(e);
	rc = install_from_options(e);
	te_publish_defer(NULL);
	if (rc < 0)
		goto fail;
	g_rec_mutex_lock(&e->ctl);
	rc = te_engine_publish(e);
	g_rec_mutex_unlock(&e->ctl);
	if (rc < 0) {
		te_err("te_engine_create: publishing to %s failed: %s", e->md->conn, te_strerror(rc));
		goto fail;
	}
	rc = te_exporter_acquire(e);
	if (rc < 0)
		goto fail;
	te_info("engine %s up: rpc port %d, metadata %s", e->name, e->rpc_port, e->md->conn);
	g_free(host);
	*out = e;
	return 0;
fail:
	g_free(host);
	te_engine_destroy(e);
	return rc;
}

/* Tasks outlived the drain: their transport threads will still complete
 * them into the batches, the engine's counters and pools, and may still
 * call the host. Freeing any of it would be a use after free, so all of it
 * stays allocated; what can end without touching them does: the RPC
 * server, the published descriptor, and peers' access to the registered
 * memory (their requests in progress cut off as by te_unregister_memory). */
static void abandon(te_engine *e, long inflight)
{
	te_err("engine %s: %ld tasks still in flight after %lld ms (TE_DRAIN_TIMEOUT_MS): the engine is left "
	       "allocated rather than freed under them (their transport completes them later)",
	       e->name ? e->name : "?", inflight, (long long)e->drain_ms);
	te_rpc_server_stop(e->rpc);
	e->rpc = NULL;
	te_engine_unpublish(e);
	te_memreg_revoke_all(e);
}

void te_engine_destroy(te_engine *e)
{
	if (e == NULL)
		return;
	te_exporter_release(e);
	e->closing = true;
	te_batches_cancel_all(e);
	te_stream_orphan_all(e);
	if (!drain(&e->inflight, "engine shutdown", e->drain_ms)) {
		abandon(e, atomic_load(&e->inflight));
		return;
	}
	/* Nothing left for it to end; it calls into the transports. */
	te_deadlines_stop(e);
	/* Started submissions' jobs: their tasks have ended, so they return. */
	if (e->stream_pool != NULL)
		g_thread_pool_free(e->stream_pool, FALSE, TRUE);
	e->stream_pool = NULL;
	te_stage_quiesce(e);
	/* Its jobs fetch descriptors and release segment versions: before the
	 * RPC client, the segments and the transports go. */
	g_thread_pool_free(e->refresh_pool, FALSE, TRUE);
	e->refresh_pool = NULL;
	te_rpc_server_stop(e->rpc);
	e->rpc = NULL;
	te_engine_unpublish(e);
	te_segments_clear(e);
	g_thread_pool_free(e->reaper, FALSE, TRUE);
	g_thread_pool_free(e->notify_pool, FALSE, TRUE);
	g_rec_mutex_lock(&e->ctl);
	bool stuck = false;
	while (e->transports->len > 0) {
		te_transport_inst *tp = g_ptr_array_index(e->transports, e->transports->len - 1);
		if (uninstall(e, tp) < 0) {
			g_ptr_array_remove(e->transports, tp); /* leaked on purpose, see uninstall */
			stuck = true;
		}
	}
	g_rec_mutex_unlock(&e->ctl);
	if (stuck) {
		/* A transport still running calls into the host with this engine,
		 * pins and releases its memory: none of that may be freed. */
		te_err("engine %s: a transport did not stop; the engine is left allocated", e->name);
		te_memreg_revoke_all(e);
		return;
	}
	/* The transports, which ask for its jobs, are gone; a job queued
	 * sees `closing` and publishes nothing. */
	g_thread_pool_free(e->publish_pool, FALSE, TRUE);
	e->publish_pool = NULL;
	te_local_fini(e);
	te_metadata_close(e->md);
	te_notify_clear(e);
	te_batches_clear(e);
	te_memreg_clear(&e->mem);
	te_stage_fini(e);
	g_ptr_array_unref(e->transports);
	g_ptr_array_unref(e->retired);
	g_hash_table_unref(e->segments);
	g_hash_table_unref(e->seg_by_name);
	g_hash_table_unref(e->options);
	g_free(e->desc_cache);
	te_auth_free(e->auth);
	g_free(e->name);
	g_free(e->address);
	g_rec_mutex_clear(&e->ctl);
	g_rw_lock_clear(&e->data);
	g_rw_lock_clear(&e->rpc_lock);
	g_mutex_clear(&e->desc_lock);
	g_mutex_clear(&e->notify_lock);
	te_metrics_free(e->metrics);
	g_free(e);
}
