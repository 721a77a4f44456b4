/* SPDX-License-Identifier: Apache-2.0 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "teu-devmem.h"
#include "teu-gpu.h"
#include "teu-pci.h"

/* teu_gpu_calls's members, in the order of the vendors' name lists. */
static const size_t CALL_AT[TEU_GPU_NCALLS] = {
	offsetof(teu_gpu_calls, DeviceGet),	    offsetof(teu_gpu_calls, DeviceGetName),
	offsetof(teu_gpu_calls, DeviceTotalMem),    offsetof(teu_gpu_calls, DeviceGetPCIBusId),
	offsetof(teu_gpu_calls, StreamSynchronize), offsetof(teu_gpu_calls, LaunchHostFunc),
};

int teu_gpu_found(teu_gpu *g, void *lib, int err, int n, const char *const names[TEU_GPU_NCALLS], char *why,
		  size_t why_len)
{
	const teu_gpu_vendor *v = g->vendor;

	if (err != 0 || n <= 0) {
		if (err != 0)
			snprintf(why, why_len, "no %s device (%s)", v->name, v->errstr(g, err));
		else
			snprintf(why, why_len, "no %s device (the %s counts none)", v->name, v->library);
		dlclose(lib);
		return -ENODEV;
	}
	for (size_t i = 0; i < TEU_GPU_NCALLS; i++) {
		void *f = dlsym(lib, names[i]);
		/* Every call but the last (LaunchHostFunc) is one the vendor's
		 * own loader requires already. */
		if (f == NULL && i + 1 < TEU_GPU_NCALLS) {
			snprintf(why, why_len, "the %s library lacks %s", v->name, names[i]);
			dlclose(lib);
			return -ENOTSUP;
		}
		*(void **)((char *)&g->calls + CALL_AT[i]) = f;
	}
	g->lib = lib;
	return n > TEU_GPU_MAX_DEVICES ? TEU_GPU_MAX_DEVICES : n;
}

int teu_gpu_probe(const teu_gpu_vendor *v, char *why, size_t why_len)
{
	teu_gpu *g = calloc(1, v->size);

	if (g == NULL)
		return -ENOMEM;
	g->vendor = v;
	int n = v->open(g, why, why_len);
	teu_gpu_free(g);
	return n < 0 ? n : 0;
}

int teu_gpu_create(const teu_gpu_vendor *v, const te_host *h, void **out)
{
	teu_gpu *g = calloc(1, v->size);
	char why[256] = "";

	if (g == NULL)
		return -ENOMEM;
	g->host = h;
	g->vendor = v;
	g->ndev = v->open(g, why, sizeof why);
	if (g->ndev < 0) {
		int rc = g->ndev;
		h->log(h, TE_LOG_INFO, "idle: %s", why);
		teu_gpu_free(g);
		return rc;
	}
	v->start(g);
	*out = g;
	return 0;
}

void teu_gpu_free(teu_gpu *g)
{
	if (g->lib != NULL)
		dlclose(g->lib);
	free(g);
}

int teu_gpu_check(teu_gpu *g, int err, const char *what)
{
	if (err == 0)
		return 0;
	g->host->log(g->host, TE_LOG_ERROR, "%s: %s", what, g->vendor->errstr(g, err));
	return -EIO;
}

int teu_gpu_copied(teu_gpu *g, size_t len, const char *call, int err, int wait)
{
	if (err == 0 && wait == 0)
		return 0;
	g->host->log(g->host, TE_LOG_ERROR, "%s of %zu bytes: %s", err != 0 ? call : "copy", len,
		     g->vendor->errstr(g, err != 0 ? err : wait));
	return -EIO;
}

int teu_gpu_refused(teu_gpu *g, const char *what, const void *addr, int err, const char *more)
{
	g->host->log(g->host, TE_LOG_INFO, "no %s for %p: %s%s", what, addr, g->vendor->errstr(g, err), more);
	return -ENOTSUP;
}

int teu_gpu_dmabuf(teu_gpu *g, const void *addr, int err, int h, uint64_t off, int *fd, uint64_t *offset)
{
	if (err != 0 || h < 0)
		return teu_gpu_refused(g, "dma-buf", addr, err, "");
	*fd = h;
	*offset = off;
	return 0;
}

int teu_gpu_ipc_get(teu_gpu *g, te_device_ipc *ipc, size_t len,
		    int (*get)(void *ctx, int dev, uint64_t start, void *handle), int dev, uint64_t start,
		    uint64_t size)
{
	unsigned char h[sizeof ipc->handle];

	if (len > sizeof h)
		return -EINVAL; /* the plugins check their handle's size when built */
	int err = get(g, dev, start, h);
	if (err == 0)
		teu_ipc_fill(ipc, h, len, dev, -1, start, size);
	return err;
}

int teu_gpu_ipc_open(teu_gpu *g, const te_device_ipc *ipc, size_t len,
		     int (*open)(void *ctx, int dev, const void *handle, void **p), void **base)
{
	const teu_gpu_vendor *v = g->vendor;
	unsigned char h[sizeof ipc->handle];
	void *p = NULL;

	if (len > sizeof h || teu_ipc_handle(ipc, h, len) < 0)
		return -EINVAL;
	int err = open(g, teu_ipc_device(ipc, g->ndev), h, &p);
	if (err != 0) {
		g->host->log(g->host, TE_LOG_WARN, "%sIpcOpenMemHandle of another process's %s:%d memory: %s", v->api,
			     v->prefix, ipc->device, v->errstr(g, err));
		return -EIO;
	}
	*base = p;
	return 0;
}

int teu_gpu_copy_each(int (*copy)(void *ctx, void *dst, const void *src, size_t len), void *ctx,
		      const te_copy *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		int rc = copy(ctx, v[i].dst, v[i].src, v[i].len);
		if (rc < 0)
			return rc;
	}
	return 0;
}

void teu_gpu_pool_init(teu_gpu_pool *p, unsigned max)
{
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	p->max = max < TEU_GPU_POOL_MAX ? max : TEU_GPU_POOL_MAX;
	p->free = p->made = 0;
}

void teu_gpu_pool_fini(teu_gpu_pool *p)
{
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->cond);
}

void *teu_gpu_pool_take(teu_gpu_pool *p, int (*make)(void *ctx, void **s), void *ctx)
{
	void *s = NULL;

	pthread_mutex_lock(&p->lock);
	for (;;) {
		if (p->free > 0) {
			s = p->s[--p->free];
			break;
		}
		if (p->made < p->max) {
			if (make(ctx, &s) == 0) {
				/* Made streams sit at [free, made) while in use. */
				p->s[p->made++] = s;
				break;
			}
			s = NULL;
		}
		if (p->made == 0)
			break; /* none will come back */
		pthread_cond_wait(&p->cond, &p->lock);
	}
	pthread_mutex_unlock(&p->lock);
	return s;
}

void teu_gpu_pool_give(teu_gpu_pool *p, void *s)
{
	pthread_mutex_lock(&p->lock);
	/* Every made stream stays in s[0, made): s swapped to s[free]. */
	for (unsigned i = p->free; i < p->made; i++)
		if (p->s[i] == s) {
			p->s[i] = p->s[p->free];
			p->s[p->free++] = s;
			pthread_cond_signal(&p->cond);
			break;
		}
	pthread_mutex_unlock(&p->lock);
}

int teu_gpu_devices(void *ctx, te_device_info *out, size_t max, size_t *n)
{
	teu_gpu *g = ctx;
	const teu_gpu_calls *k = &g->calls;

	*n = (size_t)g->ndev;
	for (int i = 0; i < g->ndev && (size_t)i < max; i++) {
		te_device_info *d = &out[i];
		int dev;
		size_t mem = 0;

		snprintf(d->location, sizeof d->location, "%s:%d", g->vendor->prefix, i);
		if (k->DeviceGet(&dev, i) != 0)
			continue;
		if (k->DeviceGetName(d->name, (int)sizeof d->name, dev) != 0)
			snprintf(d->name, sizeof d->name, "?");
		d->name[sizeof d->name - 1] = '\0';
		if (k->DeviceTotalMem(&mem, dev) == 0)
			d->memory = mem;
		teu_pci_info(d, k->DeviceGetPCIBusId(d->pci_bus_id, (int)sizeof d->pci_bus_id, dev) == 0);
	}
	return 0;
}

int teu_gpu_stream_wait_on(void *ctx, int device, void *stream)
{
	teu_gpu *g = ctx;
	char what[48];
	int saved;

	snprintf(what, sizeof what, "%sStreamSynchronize", g->vendor->api);
	int rc = g->vendor->stream_enter(ctx, device, stream, what, &saved);
	if (rc < 0)
		return rc;
	int err = g->calls.StreamSynchronize(stream);
	g->vendor->stream_leave(ctx, saved);
	return teu_gpu_check(g, err, what);
}

int teu_gpu_stream_wait(void *ctx, void *stream)
{
	return teu_gpu_stream_wait_on(ctx, -1, stream);
}

/* The function runs on the vendor's thread for host functions, which must
 * not call the vendor's library; libte's (stream.c) only hands work over and
 * waits. The plugins' copies never wait for the default stream, so that a
 * blocking stream, or the default stream itself, held by the function does
 * not hold the transfer it waits for; a library that leaves the plugin no
 * stream of its own is refused. */
int teu_gpu_stream_launch_on(void *ctx, int device, void *stream, void (*fn)(void *), void *arg)
{
	teu_gpu *g = ctx;
	const teu_gpu_vendor *v = g->vendor;
	char what[48];
	int saved;

	snprintf(what, sizeof what, "%sLaunchHostFunc", v->api);
	if (g->calls.LaunchHostFunc == NULL) {
		g->host->log(g->host, TE_LOG_ERROR, "this %s %s has no %s", v->name, v->library, what);
		return -ENOTSUP;
	}
	if (!v->own_stream(ctx)) {
		g->host->log(g->host, TE_LOG_ERROR,
			     "no stream of the plugin's own: its copies would wait for the stream's host function");
		return -ENOTSUP;
	}
	int rc = v->stream_enter(ctx, device, stream, what, &saved);
	if (rc < 0)
		return rc;
	int err = g->calls.LaunchHostFunc(stream, fn, arg);
	v->stream_leave(ctx, saved);
	return teu_gpu_check(g, err, what);
}

int teu_gpu_stream_launch(void *ctx, void *stream, void (*fn)(void *), void *arg)
{
	return teu_gpu_stream_launch_on(ctx, -1, stream, fn, arg);
}
