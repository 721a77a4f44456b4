/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Metadata plugins (TE_KIND_METADATA): te_metadata_ops. Included by
 * te-plugin.h.
 */
#ifndef TE_TE_METADATA_H
#define TE_TE_METADATA_H

#include <te/te-plugin.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------- metadata plugins */

enum te_metadata_put_flags {
	/* The key belongs to the calling engine: a store that can should tie it to
	 * the engine's liveness (an etcd lease), so it vanishes if the engine dies. */
	TE_META_OWNED = 1u << 0,
};

typedef struct te_metadata_ops {
	uint32_t size;
	uint32_t reserved;
	/* NULL-terminated list of URL schemes served ("etcd", "redis", ...). */
	const char *const *schemes;
	/* Required. `conn` is the whole connection string. */
	int (*open)(const te_host *h, const char *conn, void **ctx);
	void (*close)(void *ctx);
	/* Required. -ENOENT when the key does not exist. `*value` NUL-terminated. */
	int (*get)(void *ctx, const char *key, char **value, size_t *len);
	int (*put)(void *ctx, const char *key, const char *value, size_t len, unsigned flags);
	/* Deleting a missing key is not an error. */
	int (*remove)(void *ctx, const char *key);
	/* Optional. Keys under `prefix`: a malloc()ed array of malloc()ed strings. */
	int (*list)(void *ctx, const char *prefix, char ***keys, size_t *n);
} te_metadata_ops;

#ifdef __cplusplus
}
#endif
#endif /* TE_TE_METADATA_H */
