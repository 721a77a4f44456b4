/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Exporter plugins (TE_KIND_EXPORTER): te_exporter_ops. Included by
 * te-plugin.h.
 */
#ifndef TE_TE_EXPORTER_H
#define TE_TE_EXPORTER_H

#include <te/te-plugin.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Exporters (since ABI 1.6): serve the process's metrics somewhere
 * (TE_METRICS_ADDR). One instance per process, created when the first engine
 * that asks for one starts and destroyed with the last; it gets the text
 * through metrics_text() of the host's TE_SERVICE_METRICS table (te-host.h)
 * whenever it is asked.
 */
typedef struct te_exporter_ops {
	uint32_t size;
	uint32_t reserved;
	/* Required. Starts serving at `addr` ("host:port"; port 0 picks one).
	 * `json_args`: {"token_file": PATH} or NULL. Returns at once, serving
	 * from a thread of its own. */
	int (*create)(const te_host *h, const char *addr, const char *json_args, void **ctx);
	void (*destroy)(void *ctx);
	/* Optional. Where it serves ("http://127.0.0.1:9464/metrics") into `buf`. */
	int (*url)(void *ctx, char *buf, size_t size);
} te_exporter_ops;

#ifdef __cplusplus
}
#endif
#endif /* TE_TE_EXPORTER_H */
