/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the metadata plugins' ops share: the checks of their arguments, the
 * key list that list() hands back (an array of NUL-terminated copies, array
 * and keys freed by the caller with free()), and their ops table and entry.
 */
#ifndef TEU_STORE_H
#define TEU_STORE_H

#include <stdbool.h>
#include <stddef.h>

#include <te/te-plugin.h>

/* Whether `key` is unusable (NULL or empty), logged as "<store> <op>: ...". */
bool teu_store_bad_key(const te_host *h, const char *store, const char *op, const char *key);

/* The same for put(), which also refuses a NULL value of non-zero length. */
bool teu_store_bad_put(const te_host *h, const char *store, const char *key, const char *value, size_t len);

/* Hands back a value for get(): a NUL-terminated copy of its `n` bytes in
 * *value, its length in *len (when asked for). 0 or -ENOMEM. */
int teu_store_value(const void *data, size_t n, char **value, size_t *len);

/* Appends a NUL-terminated copy of the `n` bytes of key `k` to list()'s
 * `out` (which has room for it). 0 or -ENOMEM. */
int teu_store_key_add(char **out, size_t *got, const void *k, size_t n);

/* Ends a list(): with rc 0 hands the `got` keys of `out` to the caller,
 * otherwise frees them. Returns rc. */
int teu_store_keys_done(char **out, size_t got, int rc, char ***keys, size_t *n);

/* A store's ops table and plugin entry. Every store here fills each op,
 * named by one rule: store `p` serves the URL schemes of p_schemes through
 * p_open, p_close, p_get, p_put, p_remove and p_list. */
#define TEU_STORE_PLUGIN(p, description)                                                    \
	static const te_metadata_ops p##_ops = {                                            \
		.size = sizeof(te_metadata_ops),                                            \
		.schemes = p##_schemes,                                                     \
		.open = p##_open, .close = p##_close,                                       \
		.get = p##_get, .put = p##_put, .remove = p##_remove, .list = p##_list,     \
	};                                                                                  \
	TE_PLUGIN_DEFINE(TE_KIND_METADATA, #p, "1.0.0", description, "Apache-2.0", &p##_ops)

#endif
