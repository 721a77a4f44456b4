/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "teu-store.h"

/* Whether `key` is unusable (NULL or empty), logged as "<store> <op>: ...". */
bool teu_store_bad_key(const te_host *h, const char *store, const char *op, const char *key)
{
	if (key != NULL && *key != '\0')
		return false;
	h->log(h, TE_LOG_ERROR, "%s %s: empty key", store, op);
	return true;
}

/* The same for put(), which also refuses a NULL value of non-zero length. */
bool teu_store_bad_put(const te_host *h, const char *store, const char *key, const char *value, size_t len)
{
	if (key != NULL && *key != '\0' && (value != NULL || len == 0))
		return false;
	h->log(h, TE_LOG_ERROR, "%s put: empty key or NULL value", store);
	return true;
}

/* Hands back a value for get(): a NUL-terminated copy of its `n` bytes in
 * *value, its length in *len (when asked for). 0 or -ENOMEM. */
int teu_store_value(const void *data, size_t n, char **value, size_t *len)
{
	char *out = malloc(n + 1);

	if (out == NULL)
		return -ENOMEM;
	if (n > 0)
		memcpy(out, data, n);
	out[n] = '\0';
	*value = out;
	if (len)
		*len = n;
	return 0;
}

/* Appends a NUL-terminated copy of the `n` bytes of key `k` to list()'s
 * `out` (which has room for it). 0 or -ENOMEM. */
int teu_store_key_add(char **out, size_t *got, const void *k, size_t n)
{
	char *copy = malloc(n + 1);

	if (copy == NULL)
		return -ENOMEM;
	memcpy(copy, k, n);
	copy[n] = '\0';
	out[(*got)++] = copy;
	return 0;
}

/* Ends a list(): with rc 0 hands the `got` keys of `out` to the caller,
 * otherwise frees them. Returns rc. */
int teu_store_keys_done(char **out, size_t got, int rc, char ***keys, size_t *n)
{
	if (rc < 0) {
		for (size_t i = 0; i < got; i++)
			free(out[i]);
		free(out);
		return rc;
	}
	*keys = out;
	*n = got;
	return rc;
}
