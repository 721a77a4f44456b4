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

/*
 * Key i (i < 2^14) of a set whose keys all share one hash: FNV-1a over
 * decoded 16-bit units, as te_json_check() once sorted keys by before
 * comparing the ones that collided pair by pair. Each row holds two pieces
 * on which the hash ends in the same state from the state the rows before
 * leave, so any choice of one piece per row (bit r of i picks in row r)
 * gives the same hash. Found by Pollard's rho on the top 48 bits of the
 * state after eight ASCII characters; the ninth unit cancels the low 16.
 * Writes the key as JSON text (without quotes, at most 200 bytes) to `out`;
 * returns its length.
 */
#define HOSTILE_FNV_ROWS 14
static inline size_t hostile_fnv_key(size_t i, char *out)
{
	static const char *const pieces[HOSTILE_FNV_ROWS][2] = {
		{ "X{R*.`>%A", "sUr-Pp=!\\u09e8" }, { ")ycymrR%A", "4G',<6K%\\u40c9" },
		{ "Em`3NUp'A", "H$q[Vcn#\\ue3f2" }, { "h0o?'<p&A", "Q]4tx&p%\\ufb79" },
		{ "Ea**47j#A", "j5e#>eZ%\\ud62c" }, { "rN$m{7F!A", "v[D*.r6'\\u605b" },
		{ ":niLR$w&A", "U=Ye(z>&\\u4b0d" }, { "A&3E)@!!A", "-c>z/jW&\\u09a9" },
		{ "&T'Fiz9%A", "zUTfFl@%\\u4fad" }, { ":uEx:1!&A", "u9dd8u$&\\ue2e8" },
		{ "KpL]xh4$A", "MLwiU,n!\\u9330" }, { "kHcZJ&A$A", "a+[Xi[u$\\u6dc4" },
		{ "us(P[m[&A", "MEN*@Ha!\\u6f08" }, { "NFCaX&/#A", "Ir9LFbk$\\u5c18" },
	};
	size_t k = 0;

	for (size_t r = 0; r < HOSTILE_FNV_ROWS; r++) {
		const char *p = pieces[r][i >> r & 1];
		size_t l = strlen(p);
		memcpy(out + k, p, l);
		k += l;
	}
	out[k] = '\0';
	return k;
}

/* An object of `n` members: the first min(n, 2^14) keys from
 * hostile_fnv_key(), the rest of one length and sharing a 64-byte prefix,
 * so that comparing two reads far into both. Its length in *len. */
static inline char *hostile_keys(size_t n, size_t *len)
{
	char *s = malloc(n * 256 + 3), key[256];
	size_t k = 0;

	if (s == NULL)
		abort();
	s[k++] = '{';
	for (size_t i = 0; i < n; i++) {
		if (i < (size_t)1 << HOSTILE_FNV_ROWS)
			hostile_fnv_key(i, key);
		else
			snprintf(key, sizeof key, "%064d%08zx", 0, i);
		k += (size_t)snprintf(s + k, 256, "%s\"%s\":%zu", i ? "," : "", key, i & 7);
	}
	s[k++] = '}';
	s[k] = '\0';
	*len = k;
	return s;
}

#endif
