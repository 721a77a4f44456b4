/* SPDX-License-Identifier: Apache-2.0 */
/* Hostile JSON texts for the tests of every reader of outside input: deep
 * nesting, huge arrays, huge strings. Plain C (malloc; free() or g_free()
 * releases them), so GLib-free tests use it too. */
#ifndef TE_TEST_HOSTILE_H
#define TE_TEST_HOSTILE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* pre + n × open + mid + n × close + post */
static inline char *hostile_nest(const char *pre, const char *open, size_t n, const char *mid,
				 const char *close, const char *post)
{
	size_t lp = strlen(pre), lo = strlen(open), lm = strlen(mid), lc = strlen(close), k = 0;
	char *s = malloc(lp + n * (lo + lc) + lm + strlen(post) + 1);
	if (s == NULL)
		abort();
	memcpy(s, pre, lp);
	k = lp;
	for (size_t i = 0; i < n; i++, k += lo)
		memcpy(s + k, open, lo);
	memcpy(s + k, mid, lm);
	k += lm;
	for (size_t i = 0; i < n; i++, k += lc)
		memcpy(s + k, close, lc);
	strcpy(s + k, post);
	return s;
}

/* `n` levels of arrays (or of {"a": …}) around a 1. */
static inline char *hostile_deep(size_t n, int objects)
{
	return hostile_nest("", objects ? "{\"a\":" : "[", n, "1", objects ? "}" : "]", "");
}

/* pre + an array of `n` copies of `elem` + post */
static inline char *hostile_array(const char *pre, size_t n, const char *elem, const char *post)
{
	size_t lp = strlen(pre), le = strlen(elem), k = 0;
	char *s = malloc(lp + n * (le + 1) + strlen(post) + 3);
	if (s == NULL)
		abort();
	memcpy(s, pre, lp);
	k = lp;
	s[k++] = '[';
	for (size_t i = 0; i < n; i++) {
		if (i)
			s[k++] = ',';
		memcpy(s + k, elem, le);
		k += le;
	}
	s[k++] = ']';
	strcpy(s + k, post);
	return s;
}

/* pre + a JSON string of `n` bytes + post */
static inline char *hostile_string(const char *pre, size_t n, const char *post)
{
	size_t lp = strlen(pre), k;
	char *s = malloc(lp + n + strlen(post) + 3);
	if (s == NULL)
		abort();
	memcpy(s, pre, lp);
	k = lp;
	s[k++] = '"';
	memset(s + k, 'x', n);
	k += n;
	s[k++] = '"';
	strcpy(s + k, post);
	return s;
}

#endif
