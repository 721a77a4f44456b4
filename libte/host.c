/* SPDX-License-Identifier: Apache-2.0 */
/* The services table libte hands each plugin instance. */
#include <json-glib/json-glib.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "metrics.h"

static inline const te_host_ctx *ctx_of(const te_host *h)
{
	return (const te_host_ctx *)h->priv;
}

static void host_log(const te_host *h, int level, const char *fmt, ...)
{
	const te_host_ctx *hc = ctx_of(h);
	va_list ap;

	va_start(ap, fmt);
	te_logv(level, hc->plugin ? hc->plugin->name : "plugin", fmt, ap);
	va_end(ap);
}

static const char *host_config(const te_host *h, const char *te_name, const char *mc_name)
{
	const te_host_ctx *hc = ctx_of(h);
	const char *v = NULL;

	if (te_name == NULL)
		return NULL;
	if (hc->engine != NULL)
		v = te_engine_option(hc->engine, te_name);
	if (v == NULL && hc->engine != NULL && mc_name != NULL)
		v = te_engine_option(hc->engine, mc_name); /* Mooncake's name, as an option */
	if (v == NULL)
		v = te_env2(te_name, mc_name);
	return v;
}

static void host_complete(const te_host *h, te_transfer *t, uint64_t bytes, int error)
{
	(void)h;
	te_task_complete((te_task *)t, bytes, error);
}

static void host_complete_many(const te_host *h, te_transfer *const *ts, const uint64_t *bytes, const int *errors,
			       size_t n)
{
	(void)h;
	if (n > 0 && (ts == NULL || bytes == NULL)) {
		te_err("complete_many: %zu slices without their %s: transport bug", n,
		       ts == NULL ? "transfers" : "byte counts");
		return;
	}
	te_task_complete_many(ts, bytes, errors, n);
}

static int host_canceled(const te_host *h, const te_transfer *t)
{
	(void)h;
	const te_task *task = (const te_task *)t;
	/* An engine being destroyed cancels everything, batches already freed
	 * whose tasks a transport still holds (ended early) included: 2. */
	if (atomic_load_explicit(&task->batch->engine->closing, memory_order_relaxed))
		return 2;
	return atomic_load_explicit(&task->batch->canceled, memory_order_relaxed);
}

static int acquire(const te_host *h, uint64_t addr, uint64_t len, unsigned need, te_buffer_pin *pin,
		   bool revocable)
{
	const te_host_ctx *hc = ctx_of(h);

	if (hc->engine == NULL || pin == NULL)
		return -ENOTSUP;
	int rc = te_memreg_acquire(&hc->engine->mem, addr, len, need, pin);
	if (rc == 0 && te_pin_region(pin)->dev != NULL &&
	    (hc->plugin == NULL || hc->plugin->kind != TE_KIND_TRANSPORT ||
	     !(((const te_transport_ops *)hc->plugin->desc->ops)->flags &
	       (TE_TRANSPORT_DEVICE_MEMORY | TE_TRANSPORT_DEVICE_PINS)))) {
		/* A transport that cannot move device memory must not touch it.
		 * A peer's request can land here: rate-limited. */
		static te_ratelimit rl;
		unsigned held;
		if (te_log_enabled(TE_LOG_DEBUG) && te_ratelimit_allow(&rl, &held))
			te_dbg("%s: %#llx+%llu is device memory, which this transport does not serve (%u "
			       "similar lines held back)", hc->plugin ? hc->plugin->name : "?",
			       (unsigned long long)addr, (unsigned long long)len, held);
		te_memreg_release(&hc->engine->mem, pin);
		return TE_ERR_ADDRESS;
	}
	if (rc == 0 && !revocable)
		te_memreg_pin_hard(pin);
	return rc;
}

static int host_buffer_acquire(const te_host *h, uint64_t addr, uint64_t len, unsigned need,
			       te_buffer_pin *pin)
{
	return acquire(h, addr, len, need, pin, false);
}

static int host_buffer_acquire_revocable(const te_host *h, uint64_t addr, uint64_t len, unsigned need,
					 te_buffer_pin *pin)
{
	return acquire(h, addr, len, need, pin, true);
}

static void host_buffer_release(const te_host *h, te_buffer_pin *pin)
{
	const te_host_ctx *hc = ctx_of(h);

	if (hc->engine != NULL && pin != NULL)
		te_memreg_release(&hc->engine->mem, pin);
}

static int host_buffer_enter(const te_host *h, const te_buffer_pin *pin)
{
	(void)h;
	return pin != NULL && pin->priv != NULL && te_region_enter(te_pin_region(pin));
}

static void host_buffer_leave(const te_host *h, const te_buffer_pin *pin)
{
	(void)h;
	if (pin != NULL && pin->priv != NULL)
		te_region_leave(te_pin_region(pin));
}

static int host_rpc_handle(const te_host *h, int type, te_rpc_handler fn, void *user)
{
	const te_host_ctx *hc = ctx_of(h);
	te_engine *e = hc->engine;

	if (e == NULL)
		return -ENOTSUP;
	if (type != TE_RPC_CONNECTION) {
		host_log(h, TE_LOG_ERROR, "rpc_handle: frame type %d is handled by the host", type);
		return -EINVAL;
	}
	g_rw_lock_writer_lock(&e->rpc_lock);
	if (fn != NULL && e->handlers[type].fn != NULL && e->handlers[type].user != user) {
		g_rw_lock_writer_unlock(&e->rpc_lock);
		host_log(h, TE_LOG_ERROR, "rpc_handle: frame type %d already has a handler", type);
		return -EBUSY;
	}
	e->handlers[type] = (te_rpc_handler_slot){ fn, fn ? user : NULL, fn ? hc : NULL };
	g_rw_lock_writer_unlock(&e->rpc_lock);
	return 0;
}

static int host_rpc_call(const te_host *h, const char *segment_name, int type, const char *body,
			 size_t len, char **reply, size_t *reply_len, int timeout_ms)
{
	const te_host_ctx *hc = ctx_of(h);
	char *host = NULL;
	int port = 0, rc;

	if (hc->engine == NULL)
		return -ENOTSUP;
	if (segment_name == NULL || body == NULL || reply == NULL || reply_len == NULL ||
	    type < 0 || type > TE_RPC_PROBE)
		return -EINVAL;
	rc = te_engine_resolve_rpc(hc->engine, segment_name, &host, &port);
	if (rc < 0)
		return rc;
	rc = te_rpc_call_addr(hc->engine->auth, host, port, type, body, len, reply, reply_len, timeout_ms);
	g_free(host);
	return rc;
}

static int host_republish(const te_host *h)
{
	const te_host_ctx *hc = ctx_of(h);

	if (hc->engine == NULL)
		return -ENOTSUP;
	/* A transport's own thread may ask while the engine's teardown, holding
	 * ctl, waits for that thread: never wait for ctl, publish soon instead. */
	if (!g_rec_mutex_trylock(&hc->engine->ctl)) {
		te_engine_publish_later(hc->engine);
		return 0;
	}
	int rc = te_engine_publish(hc->engine);
	g_rec_mutex_unlock(&hc->engine->ctl);
	return rc;
}

static const char *host_local_name(const te_host *h)
{
	const te_host_ctx *hc = ctx_of(h);
	return hc->engine ? hc->engine->name : NULL;
}

static const char *host_local_address(const te_host *h)
{
	const te_host_ctx *hc = ctx_of(h);
	return hc->engine ? hc->engine->address : NULL;
}

static int host_shared_memory(const te_host *h, uint64_t addr, uint64_t len, int *fd, uint64_t *offset,
			      uint64_t *size, uint64_t *base)
{
	(void)h;
	if (fd == NULL || offset == NULL || size == NULL || base == NULL)
		return -EINVAL;
	return te_shmem_lookup(addr, len, fd, offset, size, base);
}

static int host_auth_enabled(const te_host *h)
{
	const te_host_ctx *hc = ctx_of(h);
	return hc->engine != NULL && hc->engine->auth != NULL;
}

static int host_auth_connect(const te_host *h, int fd, int channel, const char *peer, int timeout_ms)
{
	const te_host_ctx *hc = ctx_of(h);
	if (hc->engine == NULL || hc->engine->auth == NULL)
		return 0;
	return te_auth_client(hc->engine->auth, fd, channel, peer, timeout_ms);
}

static int host_auth_accept(const te_host *h, int fd, int channel, const char *peer, int timeout_ms)
{
	const te_host_ctx *hc = ctx_of(h);
	if (hc->engine == NULL || hc->engine->auth == NULL)
		return 0;
	int rc = te_auth_server(hc->engine->auth, fd, channel, peer, timeout_ms, NULL, NULL);
	if (rc == TE_ERR_AUTH)
		te_metric_count_auth(hc->engine);
	return rc;
}

static int host_buffer_is_device(const te_host *h, const te_buffer_pin *pin)
{
	(void)h;
	return pin != NULL && pin->priv != NULL && te_pin_region(pin)->dev != NULL;
}

/* Pieces between host memory and pinned regions, with every region entered
 * for the whole batch: runs of consecutive pieces of one device plugin go
 * to it as one batch, host memory is copied here. */
static int host_buffer_copy_batch(const te_host *h, const te_buffer_pin *const *pins,
				  const te_copy *copies, size_t n)
{
	const te_host_ctx *hc = ctx_of(h);
	size_t entered = 0;
	int rc = 0;

	if (n > 0 && (pins == NULL || copies == NULL))
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (pins[i] == NULL || pins[i]->priv == NULL ||
		    ((copies[i].dst == NULL || copies[i].src == NULL) && copies[i].len > 0))
			return -EINVAL;
	for (; entered < n; entered++) {
		te_region *r = te_pin_region(pins[entered]);
		if (!te_region_enter(r)) {
			/* Unregistered under the request (TE_UNREGISTER_TIMEOUT_MS). */
			te_warn_limited("%s: %p+%zu was unregistered under a peer's request; not copied",
					hc->plugin ? hc->plugin->name : "?", r->addr, r->length);
			rc = TE_ERR_ADDRESS;
			break;
		}
	}
	for (size_t i = 0; rc == 0 && i < n;) {
		te_device *d = te_pin_region(pins[i])->dev;
		size_t j = i + 1;
		while (j < n && te_pin_region(pins[j])->dev == d)
			j++;
		if (d == NULL)
			for (size_t k = i; k < j; k++)
				memmove(copies[k].dst, copies[k].src, copies[k].len);
		else
			rc = te_device_copy_batch_with(d, copies + i, j - i, 0);
		i = j;
	}
	while (entered > 0)
		te_region_leave(te_pin_region(pins[--entered]));
	return rc;
}

static int host_buffer_copy(const te_host *h, const te_buffer_pin *pin, void *dst, const void *src,
			    size_t len)
{
	te_copy c = { dst, src, len };
	return host_buffer_copy_batch(h, &pin, &c, 1);
}

static int host_device_copy_batch(const te_host *h, const char *location, const te_copy *copies,
				  size_t n, unsigned flags)
{
	(void)h;
	if (location == NULL || (n > 0 && copies == NULL))
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if ((copies[i].dst == NULL || copies[i].src == NULL) && copies[i].len > 0)
			return -EINVAL;
	return te_device_copy_batch_at(location, copies, n, flags);
}

static int host_host_buffer_alloc(const te_host *h, size_t len, void **ptr)
{
	(void)h;
	return te_device_host_alloc(len, ptr);
}

static void host_host_buffer_free(const te_host *h, void *ptr)
{
	(void)h;
	te_device_host_free(ptr);
}

static int host_device_dmabuf(const te_host *h, const void *addr, size_t len, int *fd,
			      uint64_t *offset)
{
	te_device *d;
	int index;
	(void)h;

	if (fd == NULL || offset == NULL)
		return -EINVAL;
	if (te_device_classify(addr, len, &d, &index) <= 0)
		return -ENOENT;
	if (!TE_HAS_OP(d->ops, export_dmabuf))
		return -ENOTSUP;
	return d->ops->export_dmabuf(d->ctx, addr, len, fd, offset);
}

static int host_devices(const te_host *h, te_device_info *out, size_t max, size_t *n)
{
	(void)h;
	if (n == NULL || (out == NULL && max > 0))
		return -EINVAL;
	return te_devices_list(out, max, n);
}

static int host_device_ipc_export(const te_host *h, const void *addr, size_t len,
				  te_device_ipc *ipc, char *location, size_t location_len)
{
	(void)h;
	if (addr == NULL || ipc == NULL || location == NULL || location_len == 0)
		return -EINVAL;
	return te_device_ipc_export(addr, len, ipc, location, location_len);
}

static int host_device_ipc_open(const te_host *h, const char *location, const te_device_ipc *ipc,
				void **base)
{
	(void)h;
	if (location == NULL || ipc == NULL || base == NULL)
		return -EINVAL;
	return te_device_ipc_open(location, ipc, base);
}

static void host_device_ipc_close(const te_host *h, const char *location, void *base)
{
	(void)h;
	if (location != NULL && base != NULL)
		te_device_ipc_close(location, base);
}

static int host_device_copy(const te_host *h, const char *location, void *dst, const void *src,
			    size_t len)
{
	(void)h;
	if (location == NULL || ((dst == NULL || src == NULL) && len > 0))
		return -EINVAL;
	return len == 0 ? 0 : te_device_copy_at(location, dst, src, len);
}

/* Metrics (ABI 1.6): a transport's devices count into its engine's table;
 * plugins without an engine (tools, exporters) get no device and count
 * nothing. */
static te_metric_dev *host_metric_device(const te_host *h, const char *name)
{
	const te_host_ctx *hc = ctx_of(h);

	if (hc->engine == NULL || hc->engine->metrics == NULL)
		return NULL;
	return te_metrics_device(hc->engine->metrics, hc->plugin->name, name);
}

static void host_metric_add(const te_host *h, te_metric_dev *dev, int what, int64_t delta)
{
	const te_host_ctx *hc = ctx_of(h);

	if (hc->engine != NULL && hc->engine->metrics != NULL)
		te_metrics_dev_add(hc->engine->metrics, hc->mb, dev, what, delta);
}

static void host_device_done_burst(const te_host *h, int begin)
{
	(void)h;
	te_stage_burst(begin);
}

static int host_buffer_fields(const te_host *h, const void *addr, const char *json_object)
{
	const te_host_ctx *hc = ctx_of(h);
	static const te_json_limits lim = TE_JSON_LIMITS_DESC;
	char why[160] = "";

	if (hc->engine == NULL || hc->plugin == NULL || hc->plugin->kind != TE_KIND_TRANSPORT)
		return -ENOTSUP;
	if (addr == NULL || json_object == NULL) {
		te_err("buffer_fields from %s: %s is NULL", hc->plugin->name, addr ? "the text" : "addr");
		return -EINVAL;
	}
	JsonNode *root = te_json_load(json_object, strlen(json_object), &lim, why, sizeof why);
	bool object = root != NULL && JSON_NODE_HOLDS_OBJECT(root);
	if (root != NULL)
		json_node_unref(root);
	if (!object) {
		te_err("buffer_fields from %s for %p: not a JSON object (%s)", hc->plugin->name, addr,
		       root ? "another JSON value" : why);
		return -EINVAL;
	}
	/* Not under ctl: the engine's teardown joins transport threads with
	 * it held. A transport calls this only while installed (its own
	 * threads stop in its destroy), so the instance is the one in the
	 * table; hc is its first member. */
	return te_region_set_fields(hc->engine, (te_transport_inst *)(void *)hc, addr, json_object);
}

static void host_transfer_stale(const te_host *h, const te_transfer *t)
{
	(void)h;
	if (t != NULL)
		te_task_stale((te_task *)(void *)t);
}

static int host_transfer_enter(const te_host *h, te_transfer *t)
{
	(void)h;
	return te_task_enter((te_task *)(void *)t);
}

static void host_transfer_leave(const te_host *h, te_transfer *t)
{
	(void)h;
	te_task_leave((te_task *)(void *)t);
}

static int64_t host_transfer_deadline(const te_host *h, const te_transfer *t)
{
	(void)h;
	return ((const te_task *)(const void *)t)->deadline;
}

static int host_metrics_text(const te_host *h, char **text, size_t *len)
{
	(void)h;
	return te_metrics_text(NULL, text, len);
}

/* The services by topic (ABI 1.13): the same functions as the flat table,
 * so either way a plugin reaches them, it gets one behaviour. Constant and
 * shared: each function finds its instance through `h`. */
static const te_log_service log_service = {
	.size = sizeof(te_log_service),
	.version = TE_SERVICE_LOG_VERSION,
	.log = host_log,
	.config = host_config,
};

static const te_transfer_service transfer_service = {
	.size = sizeof(te_transfer_service),
	.version = TE_SERVICE_TRANSFER_VERSION,
	.complete = host_complete,
	.canceled = host_canceled,
	.transfer_enter = host_transfer_enter,
	.transfer_leave = host_transfer_leave,
	.transfer_deadline = host_transfer_deadline,
	.transfer_stale = host_transfer_stale,
	.buffer_acquire = host_buffer_acquire,
	.buffer_release = host_buffer_release,
	.buffer_acquire_revocable = host_buffer_acquire_revocable,
	.buffer_enter = host_buffer_enter,
	.buffer_leave = host_buffer_leave,
	.buffer_is_device = host_buffer_is_device,
	.buffer_copy = host_buffer_copy,
	.buffer_copy_batch = host_buffer_copy_batch,
	.shared_memory = host_shared_memory,
	.complete_many = host_complete_many,
};

static const te_control_service control_service = {
	.size = sizeof(te_control_service),
	.version = TE_SERVICE_CONTROL_VERSION,
	.rpc_handle = host_rpc_handle,
	.rpc_call = host_rpc_call,
	.republish = host_republish,
	.buffer_fields = host_buffer_fields,
	.local_name = host_local_name,
	.local_address = host_local_address,
};

static const te_auth_service auth_service = {
	.size = sizeof(te_auth_service),
	.version = TE_SERVICE_AUTH_VERSION,
	.auth_enabled = host_auth_enabled,
	.auth_connect = host_auth_connect,
	.auth_accept = host_auth_accept,
};

static const te_device_service device_service = {
	.size = sizeof(te_device_service),
	.version = TE_SERVICE_DEVICE_VERSION,
	.devices = host_devices,
	.device_dmabuf = host_device_dmabuf,
	.device_ipc_export = host_device_ipc_export,
	.device_ipc_open = host_device_ipc_open,
	.device_ipc_close = host_device_ipc_close,
	.device_copy = host_device_copy,
	.device_copy_batch = host_device_copy_batch,
	.host_buffer_alloc = host_host_buffer_alloc,
	.host_buffer_free = host_host_buffer_free,
	.device_done_burst = host_device_done_burst,
};

static const te_metrics_service metrics_service = {
	.size = sizeof(te_metrics_service),
	.version = TE_SERVICE_METRICS_VERSION,
#if TE_METRICS_BUILD
	.metric_device = host_metric_device,
	.metric_add = host_metric_add,
#endif
	.metrics_text = host_metrics_text,
};

static const struct {
	const char *topic;
	const void *table;
	uint32_t version; /* the table's own, kept here to read it without its type */
} services[] = {
	{ TE_SERVICE_LOG, &log_service, TE_SERVICE_LOG_VERSION },
	{ TE_SERVICE_TRANSFER, &transfer_service, TE_SERVICE_TRANSFER_VERSION },
	{ TE_SERVICE_CONTROL, &control_service, TE_SERVICE_CONTROL_VERSION },
	{ TE_SERVICE_AUTH, &auth_service, TE_SERVICE_AUTH_VERSION },
	{ TE_SERVICE_DEVICE, &device_service, TE_SERVICE_DEVICE_VERSION },
	{ TE_SERVICE_METRICS, &metrics_service, TE_SERVICE_METRICS_VERSION },
};

static const void *host_service(const te_host *h, const char *topic, uint32_t min_version)
{
	const te_host_ctx *hc = ctx_of(h);
	const char *who = hc->plugin ? hc->plugin->name : "plugin";

	if (topic == NULL) {
		te_err("service from %s: the topic is NULL", who);
		return NULL;
	}
	for (size_t i = 0; i < sizeof services / sizeof services[0]; i++) {
		if (strcmp(services[i].topic, topic) != 0)
			continue;
		if (services[i].version < min_version) {
			te_dbg("service from %s: topic '%s' is version %u here, %u asked for", who, topic,
			       services[i].version, min_version);
			return NULL;
		}
		return services[i].table;
	}
	/* A plugin may probe for a topic of a newer host: not an error. */
	te_dbg("service from %s: no topic '%s' here", who, topic);
	return NULL;
}

void te_host_init(te_host_ctx *hc, te_engine *engine, const te_plugin *plugin)
{
	memset(hc, 0, sizeof *hc);
	hc->engine = engine;
	hc->plugin = plugin;
	hc->host = (te_host){
		.size = sizeof(te_host),
		.abi_minor = TE_PLUGIN_ABI_MINOR,
		.priv = hc,
		.log = host_log,
		.config = host_config,
		.complete = host_complete,
		.canceled = host_canceled,
		.buffer_acquire = host_buffer_acquire,
		.buffer_release = host_buffer_release,
		.rpc_handle = host_rpc_handle,
		.rpc_call = host_rpc_call,
		.republish = host_republish,
		.local_name = host_local_name,
		.local_address = host_local_address,
		.shared_memory = host_shared_memory,
		.auth_enabled = host_auth_enabled,
		.auth_connect = host_auth_connect,
		.buffer_is_device = host_buffer_is_device,
		.buffer_copy = host_buffer_copy,
		.device_dmabuf = host_device_dmabuf,
		.devices = host_devices,
		.auth_accept = host_auth_accept,
		.device_ipc_export = host_device_ipc_export,
		.device_ipc_open = host_device_ipc_open,
		.device_ipc_close = host_device_ipc_close,
		.device_copy = host_device_copy,
		.buffer_acquire_revocable = host_buffer_acquire_revocable,
		.buffer_enter = host_buffer_enter,
		.buffer_leave = host_buffer_leave,
		.buffer_copy_batch = host_buffer_copy_batch,
		.device_copy_batch = host_device_copy_batch,
		.host_buffer_alloc = host_host_buffer_alloc,
		.host_buffer_free = host_host_buffer_free,
#if TE_METRICS_BUILD
		.metric_device = host_metric_device,
		.metric_add = host_metric_add,
#endif
		.metrics_text = host_metrics_text,
		.device_done_burst = host_device_done_burst,
		.buffer_fields = host_buffer_fields,
		.transfer_stale = host_transfer_stale,
		.transfer_enter = host_transfer_enter,
		.transfer_leave = host_transfer_leave,
		.transfer_deadline = host_transfer_deadline,
		.service = host_service,
	};
#if !TE_METRICS_BUILD
	/* Counting compiled out: plugins see no counters to call at all. */
	(void)host_metric_device;
	(void)host_metric_add;
#endif
}
