/* SPDX-License-Identifier: Apache-2.0 */
/* Small random edits of a valid text (JSON from a peer or a store), for
 * tests that feed decoders what a broken or hostile peer could send. */
#ifndef TE_TEST_MUTATE_H
#define TE_TEST_MUTATE_H

#include <string.h>

#include <glib.h>

/* Applies 1 to 5 edits (replace a byte with a JSON-ish one, delete a byte,
 * truncate) to the NUL-terminated text `m` of `len` bytes, in place; returns
 * the new length. */
static inline size_t mutate_text(GRand *rnd, char *m, size_t len)
{
	static const char alphabet[] = "{}[]\":,0123456789-.eE \\abnrtu@";
	int edits = g_rand_int_range(rnd, 1, 6);

	for (int k = 0; k < edits && len > 0; k++) {
		size_t pos = (size_t)g_rand_int_range(rnd, 0, (gint32)len);
		switch (g_rand_int_range(rnd, 0, 3)) {
		case 0:
			m[pos] = alphabet[g_rand_int_range(rnd, 0, (gint32)sizeof alphabet - 1)];
			break;
		case 1:
			memmove(m + pos, m + pos + 1, len - pos);
			len--;
			break;
		default:
			m[pos] = '\0';
			len = pos;
			break;
		}
	}
	return len;
}

/* A g_malloc()ed copy of `seed` with mutate_text() applied; its length in
 * *len. */
static inline char *mutated_copy(GRand *rnd, const char *seed, size_t *len)
{
	size_t n = strlen(seed);
	char *m = g_malloc(n + 1);

	memcpy(m, seed, n + 1);
	*len = mutate_text(rnd, m, n);
	return m;
}

#endif
