/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The NVMe-oF transport plugin: moves bytes between registered local memory
 * and the files of NVMe-oF segments (files on NVMe devices, exported over
 * NVMe-oF and mounted here), through io_uring, O_DIRECT when a slice is
 * aligned. The request's `remote` is a byte offset into the segment's files
 * laid end to end.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "nvmeof.h"

static void read_config(nv_ctx *c)
{
	const te_host *h = c->host;

	c->depth = (uint32_t)te_host_config_u64(h, "TE_NVMEOF_QUEUE_DEPTH", NULL, NV_DEFAULT_DEPTH, 1,
						NV_MAX_DEPTH);
	c->slice = te_host_config_u64(h, "TE_NVMEOF_SLICE_SIZE", NULL, NV_DEFAULT_SLICE, NV_MIN_SLICE,
				      NV_MAX_SLICE);
	if (c->slice % NV_MIN_SLICE != 0) {
		/* Slices of an aligned request must stay aligned to go O_DIRECT. */
		h->log(h, TE_LOG_WARN, "TE_NVMEOF_SLICE_SIZE=%llu is not a multiple of %u; using %llu",
		       (unsigned long long)c->slice, NV_MIN_SLICE,
		       (unsigned long long)(c->slice - c->slice % NV_MIN_SLICE));
		c->slice -= c->slice % NV_MIN_SLICE;
	}
	/* Who puts requests into the ring: the submitting thread (no thread
	 * hand-off on the way in) or the worker. */
	const char *mode = h->config(h, "TE_NVMEOF_SUBMIT", NULL);
	c->caller_submit = true;
	if (mode != NULL && strcmp(mode, "worker") == 0)
		c->caller_submit = false;
	else if (mode != NULL && *mode != '\0' && strcmp(mode, "caller") != 0)
		h->log(h, TE_LOG_WARN, "TE_NVMEOF_SUBMIT=%s is neither \"caller\" nor \"worker\"; using caller",
		       mode);
	/* With caller submission one worker only reaps: a second ring would
	 * split each burst of completions over two threads to wake. With worker
	 * submission two workers share the wake-ups on machines with two cores
	 * or more. */
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned def_workers = !c->caller_submit && cpus > 1 ? NV_DEFAULT_WORKERS : 1;
	c->n_workers = (unsigned)te_host_config_u64(h, "TE_NVMEOF_WORKERS", NULL, def_workers, 1,
						    NV_MAX_WORKERS);
	c->use_direct = te_host_config_u64(h, "TE_NVMEOF_DIRECT", NULL, 1, 0, 1) != 0;
	c->dsync = te_host_config_u64(h, "TE_NVMEOF_DSYNC", NULL, 0, 0, 1) != 0;
	c->coalesce_ns = 1000 * te_host_config_u64(h, "TE_NVMEOF_COALESCE_US", NULL, NV_DEFAULT_COALESCE_US,
						   0, NV_MAX_COALESCE_US);
	c->reap_tick_ns = 1000000 * (int64_t)te_host_config_u64(h, "TE_NVMEOF_REAP_TICK_MS", NULL,
								NV_DEFAULT_REAP_TICK_MS, 1, NV_MAX_REAP_TICK_MS);
	c->n_fixed = (uint32_t)te_host_config_u64(h, "TE_NVMEOF_FIXED_FILES", NULL, NV_DEFAULT_FIXED_FILES, 0,
						  NV_MAX_FIXED_FILES);
	c->spin_ns = 1000 * (int64_t)te_host_config_u64(h, "TE_NVMEOF_SPIN_US", NULL, NV_DEFAULT_SPIN_US, 0,
							 NV_MAX_SPIN_US);
	/* Where segments' files may be. Unset: nowhere, since the paths come
	 * from the store and whoever writes it could otherwise name any file or
	 * disk this process can open. */
	const char *allow = h->config(h, "TE_NVMEOF_ALLOW", NULL);
	c->allow_text = allow != NULL && *allow != '\0' ? g_strdup(allow) : NULL;
	c->allow = nv_allow_parse(h, c->allow_text);
}

static void free_config(nv_ctx *c)
{
	g_strfreev(c->allow);
	g_free(c->allow_text);
}

static int nv_probe(const te_host *h, char *why, size_t why_len)
{
	(void)h;
	return nv_uring_probe(why, why_len);
}

static int nv_create(const te_host *h, const char *json_args, void **out)
{
	nv_ctx *c = g_new0(nv_ctx, 1);
	int rc;

	(void)json_args; /* Mooncake passes a NIC matrix here; files need none */
	c->host = h;
	c->metrics = TE_HAS_OP(h, metric_device) && TE_HAS_OP(h, metric_add);
	read_config(c);
	rc = nv_workers_start(c);
	if (rc < 0) {
		free_config(c);
		g_free(c);
		return rc;
	}
	h->log(h, TE_LOG_INFO,
	       "nvmeof: %s submission, %u worker(s), queue depth %u, slices of %llu bytes, %s%s, "
	       "%u registered files, %s%s",
	       c->caller_submit ? "caller" : "worker", c->n_workers, c->depth, (unsigned long long)c->slice,
	       c->use_direct ? "O_DIRECT when aligned" : "buffered I/O only", c->dsync ? ", O_DSYNC" : "",
	       c->n_fixed, c->allow_text ? "files allowed in TE_NVMEOF_ALLOW=" : "",
	       c->allow_text ? c->allow_text : "no file allowed (TE_NVMEOF_ALLOW unset)");
	*out = c;
	return 0;
}

static void nv_destroy(void *ctx)
{
	nv_ctx *c = ctx;

	nv_workers_stop(c);
	free_config(c);
	g_free(c);
}

static int nv_seg_open(void *ctx, const te_segment_info *seg, void **seg_ctx)
{
	nv_segment *s = NULL;
	int rc = nv_segment_open(ctx, seg, &s);

	if (rc < 0)
		return rc;
	*seg_ctx = s;
	return 0;
}

static void nv_seg_close(void *ctx, void *seg_ctx)
{
	nv_segment_close(ctx, seg_ctx);
}

/* Why transfer `t` cannot start, or 0. Sets the cursor fields when it can. */
static int check_transfer(nv_ctx *c, te_transfer *t)
{
	const te_host *h = c->host;
	nv_segment *s = t->seg_ctx;

	if (s == NULL) {
		h->log(h, TE_LOG_ERROR, "transfer without a segment");
		return -EINVAL;
	}
	if (t->length == 0 || t->remote >= s->total || t->length > s->total - t->remote) {
		h->log(h, TE_LOG_ERROR, "segment %s: range [%llu, +%llu) is outside its %llu bytes", s->name,
		       (unsigned long long)t->remote, (unsigned long long)t->length,
		       (unsigned long long)s->total);
		return TE_ERR_ADDRESS;
	}
	if (t->local_location != NULL && strncmp(t->local_location, "cuda", 4) == 0) {
		h->log(h, TE_LOG_ERROR,
		       "segment %s: local memory at %p is %s; GPU memory needs GPUDirect Storage, which "
		       "this transport does not drive",
		       s->name, t->local, t->local_location);
		return -ENOTSUP;
	}
	size_t first = nv_segment_find(s, t->remote);
	uint64_t end = t->remote + t->length;
	for (size_t i = first; i < s->n_files && s->files[i].start < end; i++) {
		nv_file *f = &s->files[i];
		if (f->fd < 0) {
			nv_file_log(c, f, TE_LOG_ERROR, "segment %s: %s of [%llu, +%llu) needs file %zu (%s), "
				    "which could not be opened: %s",
				    s->name, t->opcode == TE_OP_WRITE ? "write" : "read",
				    (unsigned long long)t->remote, (unsigned long long)t->length, i, f->path,
				    nv_strerror(f->err));
			return f->err;
		}
		if (t->opcode == TE_OP_WRITE && !f->writable) {
			nv_file_log(c, f, TE_LOG_ERROR, "segment %s: write of [%llu, +%llu) needs file %zu "
				    "(%s), which is read-only here",
				    s->name, (unsigned long long)t->remote, (unsigned long long)t->length, i,
				    f->path);
			return -EROFS;
		}
	}
	uint32_t n = nv_count_slices(s, first, t->remote, t->length, c->slice);
	if (n == UINT32_MAX) {
		h->log(h, TE_LOG_ERROR, "segment %s: a transfer of %llu bytes makes too many slices",
		       s->name, (unsigned long long)t->length);
		return -E2BIG;
	}
	t->nr_slices = n;
	t->plugin_data[NV_PD_CURSOR] = 0;
	t->plugin_data[NV_PD_FILE] = first;
	t->plugin_data[NV_PD_ERROR] = 0;
	return 0;
}

static int nv_submit(void *ctx, te_transfer *const *ts, size_t n)
{
	nv_ctx *c = ctx;
	te_transfer *newest = NULL, *oldest = NULL, *failed = NULL;
	uint64_t slices = 0;

	if (n == 0)
		return 0;
	if (ts == NULL) {
		c->host->log(c->host, TE_LOG_ERROR, "submit: %zu transfers but a NULL array", n);
		return -EINVAL;
	}
	for (size_t i = 0; i < n; i++) {
		te_transfer *t = ts[i];
		int err = check_transfer(c, t);
		if (err < 0) {
			t->nr_slices = 1;
			if (!c->caller_submit) {
				c->host->complete(c->host, t, 0, err);
				continue;
			}
			/* Through the ring like every completion, so that a thread
			 * waiting in progress() is woken by it. */
			t->plugin_data[NV_PD_ERROR] = (uintptr_t)(intptr_t)err;
			t->plugin_data[NV_PD_NEXT] = (uintptr_t)failed;
			failed = t;
			continue;
		}
		t->plugin_data[NV_PD_NEXT] = (uintptr_t)newest;
		newest = t;
		slices += t->nr_slices;
		if (oldest == NULL)
			oldest = t;
	}
	if (newest == NULL && failed == NULL)
		return 0;
	unsigned wi = atomic_fetch_add_explicit(&c->next_worker, 1, memory_order_relaxed);
	nv_worker *w = &c->workers[wi % c->n_workers];
	if (c->caller_submit)
		nv_worker_submit(w, newest, oldest, failed);
	else
		nv_worker_push(w, newest, oldest, slices > UINT32_MAX ? UINT32_MAX : (uint32_t)slices);
	return 0;
}

static int nv_progress_op(void *ctx, int (*done)(void *arg), void *arg, int64_t timeout_ns)
{
	return nv_progress(ctx, done, arg, timeout_ns);
}

static void nv_wake_op(void *ctx)
{
	nv_wake(ctx);
}

static int nv_report(const te_host *h, char **text)
{
	char why[256] = "";
	int rc = nv_uring_probe(why, sizeof why);
	GString *s = g_string_new(NULL);
	nv_ctx c = { .host = h };

	if (rc == 0)
		g_string_append(s, "  io_uring: available\n");
	else
		g_string_append_printf(s, "  %s\n", why);
	read_config(&c);
	g_string_append_printf(s,
			       "  TE_NVMEOF_QUEUE_DEPTH=%u  TE_NVMEOF_SLICE_SIZE=%llu  TE_NVMEOF_WORKERS=%u\n"
			       "  TE_NVMEOF_SUBMIT=%s  TE_NVMEOF_DIRECT=%d  TE_NVMEOF_DSYNC=%d  TE_NVMEOF_COALESCE_US=%llu\n"
			       "  TE_NVMEOF_REAP_TICK_MS=%llu  TE_NVMEOF_FIXED_FILES=%u  TE_NVMEOF_SPIN_US=%llu\n",
			       c.depth, (unsigned long long)c.slice, c.n_workers, c.caller_submit ? "caller" : "worker",
			       c.use_direct, c.dsync, (unsigned long long)(c.coalesce_ns / 1000),
			       (unsigned long long)(c.reap_tick_ns / 1000000), c.caller_submit ? c.n_fixed : 0,
			       (unsigned long long)(c.spin_ns / 1000));
	g_string_append_printf(s, "  TE_NVMEOF_ALLOW=%s\n",
			       c.allow_text ? c.allow_text : "(unset: no file or device is served)");
	free_config(&c);
	*text = strdup(s->str);
	g_string_free(s, TRUE);
	return *text ? 0 : -ENOMEM;
}

static const te_transport_ops nv_ops = {
	.size = sizeof(te_transport_ops),
	.flags = TE_TRANSPORT_FILES,
	.probe = nv_probe,
	.create = nv_create,
	.destroy = nv_destroy,
	.segment_open = nv_seg_open,
	.segment_close = nv_seg_close,
	.submit = nv_submit,
	.report = nv_report,
	.progress = nv_progress_op,
	.wake = nv_wake_op,
};

TE_PLUGIN_DEFINE(TE_KIND_TRANSPORT, "nvmeof", "1.0.0",
		 "NVMe-oF file segments through io_uring (O_DIRECT when aligned)", "Apache-2.0", &nv_ops)
