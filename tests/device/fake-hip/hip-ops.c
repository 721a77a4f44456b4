/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The HIP device plugin's ops called directly, on the stand-in runtime:
 * classify (device, pinned host and plain host memory, a range past its
 * allocation), copy_batch in every direction, copy_async in bulk and its
 * completions, mem_alloc on both devices, export_dmabuf without support,
 * and ipc_export (opening in the same process fails, as HIP's does).
 * Every byte is checked through copies only: the CPU cannot touch the
 * stand-in's device memory.
 * Usage: hip-ops PLUGIN.so   (prints "ok"/"FAIL" lines; exit 1 on a failure)
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <te/te-plugin.h>

#include "../../common/host-log.h"

static int failed;

static void check(int ok, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("%s ", ok ? "ok  " : "FAIL");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	if (!ok)
		failed = 1;
}

#define ASYNC 1000
static atomic_int dones, errors;

static void on_done(void *arg, int error)
{
	(void)arg;
	if (error != 0)
		atomic_fetch_add(&errors, 1);
	atomic_fetch_add(&dones, 1);
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 31 + seed);
}

int main(int argc, char **argv)
{
	host_log_echo = "hip";
	if (argc != 2) {
		fprintf(stderr, "usage: hip-ops PLUGIN.so\n");
		return 2;
	}
	void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	te_plugin_entry_fn entry = lib ? (te_plugin_entry_fn)(uintptr_t)dlsym(lib, TE_PLUGIN_ENTRY_SYMBOL) : NULL;
	if (entry == NULL) {
		fprintf(stderr, "hip-ops: %s\n", dlerror());
		return 1;
	}
	const te_device_ops *ops = entry()->ops;
	te_host host = { .size = sizeof host, .abi_minor = TE_PLUGIN_ABI_MINOR, .log = host_log, .config = host_config_env };
	char why[256] = "";
	int rc = ops->probe(&host, why, sizeof why);
	check(rc == 0, "probe: %d %s", rc, why);
	void *ctx = NULL;
	if (rc != 0 || ops->create(&host, &ctx) != 0)
		return 1;

	te_device_info info[4];
	size_t n = 0;
	memset(info, 0, sizeof info);
	for (int i = 0; i < 4; i++)
		info[i].size = sizeof info[i];
	ops->devices(ctx, info, 4, &n);
	check(n == 2 && strcmp(info[1].location, "hip:1") == 0 && strcmp(info[1].pci_bus_id, "0000:C2:00.0") == 0,
	      "devices: %zu, %s %s %s", n, info[1].location, info[1].name, info[1].pci_bus_id);

	const size_t len = 1 << 20;
	void *d0 = NULL, *d1 = NULL, *pinned = NULL;
	int dev = -1;
	check(ops->mem_alloc(ctx, 0, len, &d0) == 0 && ops->mem_alloc(ctx, 1, len, &d1) == 0,
	      "mem_alloc on hip:0 and hip:1");
	rc = ops->classify(ctx, d1, len, &dev);
	check(rc == 1 && dev == 1, "classify: hip:1 memory is device 1 (%d, device %d)", rc, dev);
	check(ops->classify(ctx, (char *)d0 + 4096, 4096, &dev) == 1 && dev == 0, "classify: inside hip:0 memory");
	check(ops->classify(ctx, (char *)d0 + 4096, len, &dev) == -EINVAL, "classify: past the allocation is an error");
	check(ops->host_alloc(ctx, len, &pinned) == 0 && ops->classify(ctx, pinned, len, &dev) == 0,
	      "classify: pinned host memory is not device memory");
	unsigned char *src = malloc(len), *back = malloc(len);
	if (src == NULL || back == NULL)
		return 1;
	check(ops->classify(ctx, src, len, &dev) == 0, "classify: malloc()ed memory is not device memory");

	/* copy_batch: host -> hip:0 in 16 pieces, hip:0 -> hip:1 in 4, hip:1 -> pinned -> host. */
	fill(src, len, 7);
	te_copy v[16];
	size_t piece = len / 16;
	for (int i = 0; i < 16; i++)
		v[i] = (te_copy){ (char *)d0 + i * piece, src + i * piece, piece };
	rc = ops->copy_batch(ctx, v, 16, 0);
	for (int i = 0; i < 4; i++)
		v[i] = (te_copy){ (char *)d1 + i * (len / 4), (char *)d0 + i * (len / 4), len / 4 };
	rc = rc ? rc : ops->copy_batch(ctx, v, 4, TE_COPY_DEVICE_ONLY);
	v[0] = (te_copy){ pinned, d1, len };
	rc = rc ? rc : ops->copy_batch(ctx, v, 1, 0);
	rc = rc ? rc : ops->copy(ctx, back, pinned, len);
	check(rc == 0 && memcmp(src, back, len) == 0, "copy_batch: host -> hip:0 -> hip:1 -> pinned, every byte (%d)", rc);
	check(ops->copy_batch(ctx, v, 0, 0) == 0, "copy_batch of nothing");

	/* copy_async: ASYNC copies of 1 KiB out of hip:1, each reported once. */
	memset(back, 0, len);
	size_t k = len / ASYNC;
	int started = 0;
	for (int i = 0; i < ASYNC; i++)
		if (ops->copy_async(ctx, back + i * k, (char *)d1 + i * k, k, on_done, NULL) == 0)
			started++;
	for (int spin = 0; atomic_load(&dones) < started && spin < 10000; spin++) {
		struct timespec ts = { 0, 1000000 };
		nanosleep(&ts, NULL);
	}
	check(started == ASYNC && atomic_load(&dones) == ASYNC && atomic_load(&errors) == 0 &&
		      memcmp(src, back, k * ASYNC) == 0,
	      "copy_async: %d started, %d reported, %d errors, bytes right", started, atomic_load(&dones),
	      atomic_load(&errors));

	int fd = -1;
	uint64_t off = 0;
	check(ops->export_dmabuf(ctx, d0, len, &fd, &off) == -ENOTSUP, "export_dmabuf without support: -ENOTSUP");
	te_device_ipc ipc = { .size = sizeof ipc };
	void *base = NULL;
	rc = ops->ipc_export(ctx, (char *)d1 + 100, 100, &ipc);
	check(rc == 0 && ipc.device == 1 && ipc.alloc_base == (uintptr_t)d1 && ipc.alloc_size == len &&
		      ipc.handle_len == 64,
	      "ipc_export of hip:1 memory names the allocation (%d)", rc);
	check(ops->ipc_open(ctx, &ipc, &base) == -EIO && strstr(host_log_last, "hipIpcOpenMemHandle") != NULL,
	      "ipc_open in the exporting process fails, logged");
	check(ops->stream_wait(ctx, NULL) == 0, "stream_wait on the null stream");

	ops->host_free(ctx, pinned);
	ops->mem_free(ctx, d0);
	ops->mem_free(ctx, d1);
	ops->destroy(ctx);
	free(src);
	free(back);
	dlclose(lib);
	return failed;
}
