/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The one bounded check for JSON that comes from outside (a peer, a store, a
 * file, a caller): te_json_check() walks the text once, without recursion and
 * without allocating for anything but object keys, and refuses it unless it is
 * strict RFC 8259 JSON within the limits below. Only text that passes is handed
 * to a real parser, so no parser ever recurses deeper than max_depth, builds
 * more than max_values nodes, or copies a string longer than max_string.
 *
 * What it refuses, each with a line in `why`:
 *   - -EINVAL: not JSON (bad token, trailing bytes, a bad escape in a
 *     string, NaN/Infinity, comments, single quotes), or a string that is not
 *     UTF-8 or holds a NUL, written or escaped, or a lone surrogate (raw
 *     control characters other than NUL pass, as json-glib reads and writes
 *     them);
 *   - -E2BIG:  a limit broken (depth, members or elements of one container,
 *     values in the document, bytes of one string or number, bytes of the
 *     text);
 *   - -ERANGE: an integer outside [-2^63, 2^63 - 1] (parsers keep integers
 *     as int64 and wrap larger ones; no user-space or device address on
 *     Linux reaches 2^63), or a number that rounds to no finite double
 *     (1.8e308; json-glib would read infinity, which JSON cannot write
 *     back); one too small for a double rounds to 0 or a denormal, as in
 *     any parser, and passes;
 *   - -EEXIST: a key twice in one object, compared as parsers compare them,
 *     decoded to code points ("a" and "\u0061", "\u00e9" and a raw "é",
 *     "\/" and "/", a surrogate pair and the raw 4-byte character match):
 *     parsers disagree on which one wins, so neither does. Finding repeats
 *     costs O(n log n) comparisons per object of n keys whatever the keys.
 *
 * The header needs only the C standard library, so plugins use it without
 * GLib. Code that includes <json-glib/json-glib.h> first also gets
 * te_json_load(), the check followed by json-glib's parse.
 */
#ifndef TE_TE_JSON_H
#define TE_TE_JSON_H

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Defaults: deep and large enough for every real descriptor, handshake and
 * store reply; callers tighten them where a format allows less. */
#define TE_JSON_MAX_DEPTH 64
#define TE_JSON_DEPTH_CAP 256            /* no caller may ask for more */
#define TE_JSON_MAX_ITEMS 65536          /* members of one object, elements of one array */
#define TE_JSON_MAX_VALUES 262144        /* values in one document, containers included */
#define TE_JSON_MAX_STRING (1024 * 1024) /* bytes of one string as written */
#define TE_JSON_MAX_TEXT (16 * 1024 * 1024)

typedef struct te_json_limits {
	unsigned max_depth;  /* 1: only scalars or empty-free flat containers */
	size_t max_items;
	size_t max_values;
	size_t max_string;
	size_t max_text;
} te_json_limits;

#define TE_JSON_LIMITS_DEFAULT                                                    \
	{ TE_JSON_MAX_DEPTH, TE_JSON_MAX_ITEMS, TE_JSON_MAX_VALUES, TE_JSON_MAX_STRING, \
	  TE_JSON_MAX_TEXT }

/* ------------------------------------------------------------ internals */

#if defined(__GNUC__)
#define TE_JSON__FMT(a, b) __attribute__((format(printf, a, b)))
#define TE_JSON__UNUSED __attribute__((unused))
#else
#define TE_JSON__FMT(a, b)
#define TE_JSON__UNUSED
#endif

/* One key of an open object: its decoded bytes, either in the text itself
 * (a key without escapes is its own decoding) or in the scratch buffer. */
typedef struct te_json__key {
	size_t pos;  /* the opening quote in the text */
	size_t off;  /* the decoded bytes: text + off, or scratch + off */
	size_t len;
	int copied;  /* in the scratch buffer */
} te_json__key;

static TE_JSON__UNUSED TE_JSON__FMT(4, 5) int te_json__fail(char *why, size_t whylen, int rc,
							     const char *fmt, ...)
{
	if (why != NULL && whylen > 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(why, whylen, fmt, ap);
		va_end(ap);
	}
	return rc;
}

static inline int te_json__hex(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* The value of four hex digits at s[k], or -1. */
static inline long te_json__u16(const char *s, size_t n, size_t k)
{
	long v = 0;

	if (k + 3 >= n)
		return -1;
	for (size_t j = k; j < k + 4; j++) {
		int h = te_json__hex(s[j]);
		if (h < 0)
			return -1;
		v = v << 4 | h;
	}
	return v;
}

/* The length of the UTF-8 sequence at s[k] (a byte >= 0x80), or 0 when it is
 * not one: overlong forms, surrogates and values past U+10FFFF are not. */
static inline size_t te_json__utf8(const char *s, size_t n, size_t k)
{
	const unsigned char *u = (const unsigned char *)s + k;
	unsigned char lo = 0x80, hi = 0xBF;
	size_t need;

	if (u[0] >= 0xC2 && u[0] <= 0xDF)
		need = 2;
	else if (u[0] >= 0xE0 && u[0] <= 0xEF)
		need = 3;
	else if (u[0] >= 0xF0 && u[0] <= 0xF4)
		need = 4;
	else
		return 0;
	if (u[0] == 0xE0)
		lo = 0xA0;
	else if (u[0] == 0xED)
		hi = 0x9F;
	else if (u[0] == 0xF0)
		lo = 0x90;
	else if (u[0] == 0xF4)
		hi = 0x8F;
	if (k + need > n || u[1] < lo || u[1] > hi)
		return 0;
	for (size_t j = 2; j < need; j++)
		if (u[j] < 0x80 || u[j] > 0xBF)
			return 0;
	return need;
}

/* A string at s[*i] == '"'; moves *i past its closing quote and sets
 * *escaped when it holds a backslash. */
static inline int te_json__string(const char *s, size_t n, size_t *i, size_t max, int *escaped,
				  char *why, size_t whylen)
{
	size_t start = *i, k = *i + 1;

	*escaped = 0;

	for (;;) {
		if (k >= n)
			return te_json__fail(why, whylen, -EINVAL, "unterminated string at byte %zu", start);
		if (k - start - 1 > max)
			return te_json__fail(why, whylen, -E2BIG,
					     "string at byte %zu longer than %zu bytes", start, max);
		unsigned char c = (unsigned char)s[k];
		if (c == '"')
			break;
		/* Raw control characters are not JSON, but json-glib reads them
		 * and its generator writes 0x1f unescaped: refusing them would
		 * refuse what libte itself wrote. A NUL still ends C strings. */
		if (c == 0)
			return te_json__fail(why, whylen, -EINVAL, "NUL in a string at byte %zu", k);
		if (c == '\\') {
			*escaped = 1;
			if (k + 1 >= n)
				return te_json__fail(why, whylen, -EINVAL, "unterminated string at byte %zu",
						     start);
			switch (s[k + 1]) {
			case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
				k += 2;
				continue;
			case 'u': {
				long u = te_json__u16(s, n, k + 2);
				if (u < 0)
					break;
				/* Parsers turn a lone surrogate into bytes that are not
				 * UTF-8, and \u0000 into a NUL that cuts C strings
				 * short: neither names anything real. */
				if (u == 0)
					return te_json__fail(why, whylen, -EINVAL,
							     "\\u0000 in a string at byte %zu", k);
				if (u >= 0xDC00 && u <= 0xDFFF)
					break;
				if (u >= 0xD800 && u <= 0xDBFF) {
					long lo = k + 11 < n && s[k + 6] == '\\' && s[k + 7] == 'u'
							  ? te_json__u16(s, n, k + 8)
							  : -1;
					if (lo < 0xDC00 || lo > 0xDFFF)
						break;
					k += 12;
					continue;
				}
				k += 6;
				continue;
			}
			default:
				break;
			}
			return te_json__fail(why, whylen, -EINVAL, "bad escape in a string at byte %zu", k);
		}
		if (c >= 0x80) {
			size_t need = te_json__utf8(s, n, k);
			if (need == 0)
				return te_json__fail(why, whylen, -EINVAL, "not UTF-8 at byte %zu", k);
			k += need;
			continue;
		}
		k++;
	}
	*i = k + 1;
	return 0;
}

/* Saturates a count at 2^60: digit counts cannot reach it (no text is that
 * long), so an exponent beyond it decides a number's magnitude alone. */
#define TE_JSON__SAT ((uint64_t)1 << 60)

/*
 * A number at s[*i]; moves *i past it. Integers (no fraction, no exponent)
 * must fit int64; other numbers must round to a finite double, as strtod()
 * rounds them. Underflow is no fault: 1e-400 reads as 0, a finite double.
 * The test is exact and costs one pass plus at most 309 digits: the number
 * is 0.d1d2d3... x 10^e with d1 its first non-zero digit; every number
 * below 10^308 rounds to a finite double, none from 10^309 up does, and
 * between them the digits decide against the smallest that rounds to infinity,
 * 2^1024 - 2^970 (halfway between DBL_MAX and 2^1024; a tie rounds to the
 * even 2^1024).
 */
static inline int te_json__number(const char *s, size_t n, size_t *i, size_t max, char *why,
				  size_t whylen)
{
	static const char limit[] = "17976931348623158079372897140530341507993413271003782693617377"
				    "89804449682927647509466490179775872070963302864166928879109465"
				    "55547851940402630657488671505820681908902000708383676273854845"
				    "81771153176447573027006985557136695962284291481986083493647529"
				    "2719074168444365510704342711559699508093042880177904174497792";
	size_t k = *i, start = *i, first = 0, mant_end;
	int neg = 0, frac = 0, eneg = 0, over = 0, nonzero = 0;
	uint64_t mag = 0, idigits = 0, fzeros = 0, exp = 0;

	if (s[k] == '-') {
		neg = 1;
		k++;
	}
	if (k >= n || s[k] < '0' || s[k] > '9')
		return te_json__fail(why, whylen, -EINVAL, "bad number at byte %zu", start);
	if (s[k] == '0') {
		k++;
	} else {
		first = k;
		nonzero = 1;
		while (k < n && s[k] >= '0' && s[k] <= '9') {
			unsigned d = (unsigned)(s[k] - '0');
			if (mag > (UINT64_MAX - d) / 10)
				over = 1;
			else
				mag = mag * 10 + d;
			if (idigits < TE_JSON__SAT)
				idigits++;
			k++;
		}
	}
	if (k < n && s[k] == '.') {
		frac = 1;
		k++;
		if (k >= n || s[k] < '0' || s[k] > '9')
			return te_json__fail(why, whylen, -EINVAL, "bad number at byte %zu", start);
		while (k < n && s[k] >= '0' && s[k] <= '9') {
			if (!nonzero && s[k] != '0') {
				first = k;
				nonzero = 1;
			} else if (!nonzero && fzeros < TE_JSON__SAT) {
				fzeros++;
			}
			k++;
		}
	}
	mant_end = k;
	if (k < n && (s[k] == 'e' || s[k] == 'E')) {
		frac = 1;
		k++;
		if (k < n && (s[k] == '+' || s[k] == '-'))
			eneg = s[k++] == '-';
		if (k >= n || s[k] < '0' || s[k] > '9')
			return te_json__fail(why, whylen, -EINVAL, "bad number at byte %zu", start);
		while (k < n && s[k] >= '0' && s[k] <= '9') {
			exp = exp * 10 + (uint64_t)(s[k] - '0'); /* leading zeros keep it 0 */
			if (exp > TE_JSON__SAT)
				exp = TE_JSON__SAT;
			k++;
		}
	}
	if (k - start > max)
		return te_json__fail(why, whylen, -E2BIG, "number at byte %zu longer than %zu bytes",
				     start, max);
	if (!frac && (over || mag > (uint64_t)INT64_MAX + (uint64_t)neg))
		return te_json__fail(why, whylen, -ERANGE,
				     "integer at byte %zu outside [-2^63, 2^63-1]", start);
	if (frac && nonzero) {
		/* e: digits before the point, or minus the zeros after it, plus
		 * the exponent; every term is below 2^61. */
		int64_t e = idigits ? (int64_t)idigits : -(int64_t)fzeros;
		e += eneg ? -(int64_t)exp : (int64_t)exp;
		int cmp = e > 309 ? 1 : -1; /* against 2^1024 - 2^970 */
		if (e == 309) {
			cmp = 0;
			for (size_t j = 0, p = first; j < sizeof limit - 1 && cmp == 0; j++, p++) {
				if (p < mant_end && s[p] == '.')
					p++;
				char d = p < mant_end ? s[p] : '0';
				cmp = d == limit[j] ? 0 : d > limit[j] ? 1 : -1;
			}
		}
		if (cmp >= 0)
			return te_json__fail(why, whylen, -ERANGE,
					     "number at byte %zu out of range (no finite double)", start);
	}
	*i = k;
	return 0;
}

/* Writes code point `c` as UTF-8 at o; returns the bytes written. */
static inline size_t te_json__put(char *o, uint32_t c)
{
	unsigned char *u = (unsigned char *)o;

	if (c < 0x80) {
		u[0] = (unsigned char)c;
		return 1;
	}
	if (c < 0x800) {
		u[0] = (unsigned char)(0xC0 | c >> 6);
		u[1] = (unsigned char)(0x80 | (c & 0x3F));
		return 2;
	}
	if (c < 0x10000) {
		u[0] = (unsigned char)(0xE0 | c >> 12);
		u[1] = (unsigned char)(0x80 | (c >> 6 & 0x3F));
		u[2] = (unsigned char)(0x80 | (c & 0x3F));
		return 3;
	}
	u[0] = (unsigned char)(0xF0 | c >> 18);
	u[1] = (unsigned char)(0x80 | (c >> 12 & 0x3F));
	u[2] = (unsigned char)(0x80 | (c >> 6 & 0x3F));
	u[3] = (unsigned char)(0x80 | (c & 0x3F));
	return 4;
}

/* Decodes the string at s[k] == '"', already checked by te_json__string(),
 * into o as the UTF-8 a parser makes of it: escapes and surrogate pairs
 * become the code points they name, raw UTF-8 stays as it is. Never longer
 * than the string as written. Returns the bytes written. */
static inline size_t te_json__decode(const char *s, size_t n, size_t k, char *o)
{
	size_t w = 0;

	for (k++; s[k] != '"';) {
		if (s[k] != '\\') {
			o[w++] = s[k++];
			continue;
		}
		char c = s[k + 1];
		k += 2;
		switch (c) {
		case 'b': o[w++] = '\b'; break;
		case 'f': o[w++] = '\f'; break;
		case 'n': o[w++] = '\n'; break;
		case 'r': o[w++] = '\r'; break;
		case 't': o[w++] = '\t'; break;
		case 'u': {
			uint32_t u = (uint32_t)te_json__u16(s, n, k);
			k += 4;
			if (u >= 0xD800 && u <= 0xDBFF) { /* a pair: the check saw its low half */
				u = 0x10000 + ((u - 0xD800) << 10) + ((uint32_t)te_json__u16(s, n, k + 2) - 0xDC00);
				k += 6;
			}
			w += te_json__put(o + w, u);
			break;
		}
		default: o[w++] = c; break; /* " \ / */
		}
	}
	return w;
}

/* Orders keys by length, then bytes: any total order puts equal keys side
 * by side, and this one rarely reads the bytes. */
static inline int te_json__key_cmp(const char *s, const char *scratch, const te_json__key *a,
				   const te_json__key *b)
{
	if (a->len != b->len)
		return a->len < b->len ? -1 : 1;
	return memcmp((a->copied ? scratch : s) + a->off, (b->copied ? scratch : s) + b->off, a->len);
}

/* Checks the keys of one object, keys[0..n), for a repeat, sorting them
 * with `tmp` (room for n) as the other half of a merge sort: at most
 * n log2 n comparisons whatever the keys (qsort() promises no bound; a hash
 * would let chosen keys collide), each reading at most one key's bytes, and
 * neighbours in the text first. */
static inline int te_json__dup(const char *s, const char *scratch, te_json__key *keys,
			       te_json__key *tmp, size_t n, size_t *at)
{
	te_json__key *src = keys, *dst = tmp, *t;

	/* Runs of 8 by insertion, then merges of runs twice as long. */
	for (size_t lo = 0; lo < n; lo += 8) {
		size_t hi = n - lo < 8 ? n : lo + 8;
		for (size_t i = lo + 1; i < hi; i++) {
			te_json__key k = keys[i];
			size_t j = i;
			for (; j > lo && te_json__key_cmp(s, scratch, &k, &keys[j - 1]) < 0; j--)
				keys[j] = keys[j - 1];
			keys[j] = k;
		}
	}
	for (size_t w = 8; w < n; w *= 2) {
		for (size_t lo = 0; lo < n; lo += 2 * w) {
			size_t mid = n - lo < w ? n : lo + w, hi = n - lo < 2 * w ? n : lo + 2 * w;
			size_t i = lo, j = mid, o = lo;
			while (i < mid && j < hi)
				dst[o++] = te_json__key_cmp(s, scratch, &src[j], &src[i]) < 0 ? src[j++]
											: src[i++];
			while (i < mid)
				dst[o++] = src[i++];
			while (j < hi)
				dst[o++] = src[j++];
		}
		t = src;
		src = dst;
		dst = t;
	}
	for (size_t i = 0; i + 1 < n; i++)
		if (te_json__key_cmp(s, scratch, &src[i], &src[i + 1]) == 0) {
			*at = src[i].pos > src[i + 1].pos ? src[i].pos : src[i + 1].pos;
			return 1;
		}
	return 0;
}

/* ------------------------------------------------------------ the check */

/*
 * Checks `text` (`len` bytes; the text need not end in NUL) against `lim`
 * (NULL: the defaults). Returns 0 or a negative errno as listed above, with a
 * line naming the fault and its byte offset in `why` (may be NULL).
 */
static inline int te_json_check(const char *text, size_t len, const te_json_limits *lim,
				char *why, size_t whylen)
{
	static const te_json_limits defaults = TE_JSON_LIMITS_DEFAULT;
	unsigned char kind[TE_JSON_DEPTH_CAP] = { 0 }; /* '[' or '{' per open container */
	size_t items[TE_JSON_DEPTH_CAP] = { 0 };
	size_t key_base[TE_JSON_DEPTH_CAP] = { 0 };     /* its first key in keys[] */
	size_t scratch_base[TE_JSON_DEPTH_CAP] = { 0 }; /* its first byte in scratch */
	te_json__key *keys = NULL, *tmp = NULL; /* tmp: room to sort one object's keys */
	char *scratch = NULL; /* decoded keys that hold escapes, of every open object */
	size_t nkeys = 0, capkeys = 0, captmp = 0, nscratch = 0, capscratch = 0, values = 0, i = 0, at = 0;
	unsigned depth = 0, max_depth;
	int rc = 0, want_value = 1, done = 0, escaped = 0;
	char c;

	if (why != NULL && whylen > 0)
		why[0] = '\0';
	if (lim == NULL)
		lim = &defaults;
	max_depth = lim->max_depth < TE_JSON_DEPTH_CAP ? lim->max_depth : TE_JSON_DEPTH_CAP;
	if (text == NULL)
		return te_json__fail(why, whylen, -EINVAL, "no text");
	if (len > lim->max_text)
		return te_json__fail(why, whylen, -E2BIG, "text of %zu bytes over the limit of %zu", len,
				     lim->max_text);

	/* want_value: a value must come next (after '[', ':', ',' in an array,
	 * or at the start); otherwise a ',' or a closing bracket must. */
	for (;;) {
		while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r'))
			i++;
		if (done) {
			if (i < len)
				rc = te_json__fail(why, whylen, -EINVAL, "bytes after the value at byte %zu", i);
			break;
		}
		if (i >= len) {
			rc = te_json__fail(why, whylen, -EINVAL, "text ends inside a value (%zu bytes)", len);
			break;
		}
		c = text[i];
		if (want_value) {
			if (c == ']' && depth > 0 && kind[depth - 1] == '[' && items[depth - 1] == 0) {
				want_value = 0; /* an empty array closes below */
				continue;
			}
			if (++values > lim->max_values) {
				rc = te_json__fail(why, whylen, -E2BIG, "more than %zu values (byte %zu)",
						   lim->max_values, i);
				break;
			}
			if (c == '[' || c == '{') {
				if (depth >= max_depth) {
					rc = te_json__fail(why, whylen, -E2BIG,
							   "nested deeper than %u levels at byte %zu", max_depth, i);
					break;
				}
				kind[depth] = (unsigned char)c;
				items[depth] = 0;
				key_base[depth] = nkeys;
				scratch_base[depth] = nscratch;
				depth++;
				i++;
				if (c == '{') {
					want_value = 0; /* a key or '}' comes next */
					goto object_member;
				}
				continue;
			}
			if (c == '"') {
				rc = te_json__string(text, len, &i, lim->max_string, &escaped, why, whylen);
			} else if (c == '-' || (c >= '0' && c <= '9')) {
				rc = te_json__number(text, len, &i, lim->max_string, why, whylen);
			} else if (len - i >= 4 && memcmp(text + i, "true", 4) == 0) {
				i += 4;
			} else if (len - i >= 5 && memcmp(text + i, "false", 5) == 0) {
				i += 5;
			} else if (len - i >= 4 && memcmp(text + i, "null", 4) == 0) {
				i += 4;
			} else {
				rc = te_json__fail(why, whylen, -EINVAL, "unexpected '%c' at byte %zu",
						   c >= 0x20 && c < 0x7f ? c : '?', i);
			}
			if (rc < 0)
				break;
			want_value = 0;
			if (depth == 0)
				done = 1;
			continue;
		}

		/* After a value: ',' or the close of the innermost container. */
		if (depth == 0) {
			done = 1;
			continue;
		}
		if (c == ',' || c == (kind[depth - 1] == '[' ? ']' : '}')) {
			i++;
			if (c != ',' || kind[depth - 1] == '[') {
				if (c == ',') {
					if (++items[depth - 1] >= lim->max_items) {
						rc = te_json__fail(why, whylen, -E2BIG,
								   "array with more than %zu elements at byte %zu",
								   lim->max_items, i);
						break;
					}
					want_value = 1;
					continue;
				}
			} else {
				goto object_member;
			}
			/* A container closes. */
			if (kind[depth - 1] == '{') {
				size_t nk = nkeys - key_base[depth - 1];
				if (nk > captmp) {
					te_json__key *nt = (te_json__key *)realloc(tmp, nk * sizeof(*tmp));
					if (nt == NULL) {
						rc = te_json__fail(why, whylen, -ENOMEM, "out of memory");
						break;
					}
					tmp = nt;
					captmp = nk;
				}
				if (te_json__dup(text, scratch, keys + key_base[depth - 1], tmp, nk, &at)) {
					rc = te_json__fail(why, whylen, -EEXIST, "key repeated at byte %zu", at);
					break;
				}
				nkeys = key_base[depth - 1];
				nscratch = scratch_base[depth - 1];
			}
			depth--;
			if (depth == 0)
				done = 1;
			continue;
		}
		rc = te_json__fail(why, whylen, -EINVAL, "expected ',' or '%c' at byte %zu",
				   kind[depth - 1] == '[' ? ']' : '}', i);
		break;

	object_member:
		/* After '{' or a ',' inside an object: a key, or '}' right after '{'. */
		while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r'))
			i++;
		if (i < len && text[i] == '}' && nkeys == key_base[depth - 1]) {
			i++;
			depth--;
			want_value = 0;
			if (depth == 0)
				done = 1;
			continue;
		}
		if (i >= len || text[i] != '"') {
			rc = te_json__fail(why, whylen, -EINVAL, "expected a key at byte %zu", i);
			break;
		}
		if (nkeys - key_base[depth - 1] >= lim->max_items) {
			rc = te_json__fail(why, whylen, -E2BIG, "object with more than %zu members at byte %zu",
					   lim->max_items, i);
			break;
		}
		if (nkeys == capkeys) {
			size_t cap = capkeys ? capkeys * 2 : 16;
			te_json__key *nk = (te_json__key *)realloc(keys, cap * sizeof(*keys));
			if (nk == NULL) {
				rc = te_json__fail(why, whylen, -ENOMEM, "out of memory");
				break;
			}
			keys = nk;
			capkeys = cap;
		}
		keys[nkeys].pos = i;
		rc = te_json__string(text, len, &i, lim->max_string, &escaped, why, whylen);
		if (rc < 0)
			break;
		/* Parsers compare keys decoded: "\u00e9" is "é", "\/" is "/". */
		keys[nkeys].copied = escaped;
		if (!escaped) {
			keys[nkeys].off = keys[nkeys].pos + 1;
			keys[nkeys].len = i - keys[nkeys].pos - 2;
		} else {
			size_t need = i - keys[nkeys].pos; /* the decoding is no longer */
			if (capscratch - nscratch < need) {
				size_t cap = capscratch ? capscratch : 256;
				while (cap - nscratch < need)
					cap *= 2; /* nscratch + need <= len: no overflow */
				char *ns = (char *)realloc(scratch, cap);
				if (ns == NULL) {
					rc = te_json__fail(why, whylen, -ENOMEM, "out of memory");
					break;
				}
				scratch = ns;
				capscratch = cap;
			}
			keys[nkeys].off = nscratch;
			keys[nkeys].len = te_json__decode(text, len, keys[nkeys].pos, scratch + nscratch);
			nscratch += keys[nkeys].len;
		}
		nkeys++;
		items[depth - 1]++;
		while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r'))
			i++;
		if (i >= len || text[i] != ':') {
			rc = te_json__fail(why, whylen, -EINVAL, "expected ':' at byte %zu", i);
			break;
		}
		i++;
		want_value = 1;
	}
	free(keys);
	free(tmp);
	free(scratch);
	return rc;
}

#ifdef JSON_TYPE_PARSER
/*
 * With json-glib: te_json_check(), then the parse. Returns the root (the
 * caller unrefs it) or NULL with `why` filled.
 */
static inline JsonNode *te_json_load(const char *text, size_t len, const te_json_limits *lim,
				     char *why, size_t whylen)
{
	JsonParser *p;
	JsonNode *root = NULL;
	GError *err = NULL;

	if (te_json_check(text, len, lim, why, whylen) < 0)
		return NULL;
	if (len > (size_t)G_MAXSSIZE) {
		te_json__fail(why, whylen, -E2BIG, "text too long");
		return NULL;
	}
	p = json_parser_new_immutable();
	if (!json_parser_load_from_data(p, text, (gssize)len, &err))
		te_json__fail(why, whylen, -EINVAL, "%s", err ? err->message : "not JSON");
	else if ((root = json_parser_steal_root(p)) == NULL)
		te_json__fail(why, whylen, -EINVAL, "empty");
	if (err != NULL)
		g_error_free(err);
	g_object_unref(p);
	return root;
}

/* Past the JSON value at text[i] of text that passed te_json_check(): no
 * recursion, strings skipped with their escapes. */
static inline size_t te_json__skip_value(const char *text, size_t len, size_t i)
{
	size_t depth = 0;

	for (; i < len; i++) {
		char c = text[i];
		if (c == '"') {
			for (i++; i < len && text[i] != '"'; i++)
				if (text[i] == '\\')
					i++;
		} else if (c == '{' || c == '[') {
			depth++;
		} else if (c == '}' || c == ']') {
			if (depth == 0)
				return i; /* the end of a scalar before its container's close */
			if (--depth == 0)
				return i + 1;
		} else if (depth == 0 && (c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r')) {
			return i;
		}
	}
	return i;
}

/*
 * As te_json_load(), but of a top-level object only the members named in
 * `names` (a NULL-terminated list) are parsed: the rest are skipped
 * without building nodes. For a plugin that reads a few fields of a peer's
 * descriptor, which lists every buffer the peer registered (640 KB for
 * 10,000 of them: json-glib's tree of it costs ~150 ms, the check ~1 ms).
 * The whole text is checked first, so what is skipped is bounded as well.
 * A member is found by its key as written: a key spelled with escapes
 * matches no name. A root that is not an object comes back whole.
 */
static inline JsonNode *te_json_load_members(const char *text, size_t len, const te_json_limits *lim,
					     const char *const *names, char *why, size_t whylen)
{
	size_t i = 0, cap, n = 1;
	char *sub;
	JsonNode *root;

	if (te_json_check(text, len, lim, why, whylen) < 0)
		return NULL;
	while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r'))
		i++;
	if (i >= len || text[i] != '{')
		return te_json_load(text, len, lim, why, whylen);
	/* Members are copied as written: never longer than the text. */
	cap = len + 2;
	sub = (char *)malloc(cap);
	if (sub == NULL) {
		te_json__fail(why, whylen, -ENOMEM, "out of memory");
		return NULL;
	}
	sub[0] = '{';
	i++;
	for (;;) {
		while (i < len && text[i] != '"' && text[i] != '}')
			i++; /* whitespace and the ',' between members */
		if (i >= len || text[i] == '}')
			break;
		size_t key = i, klen;
		for (i++; i < len && text[i] != '"'; i++)
			if (text[i] == '\\')
				i++;
		klen = i - key - 1;
		i++;
		while (i < len && text[i] != ':')
			i++;
		i++;
		while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r'))
			i++;
		size_t val = i;
		i = te_json__skip_value(text, len, i);
		for (size_t k = 0; names[k] != NULL; k++) {
			if (strlen(names[k]) != klen || memcmp(text + key + 1, names[k], klen) != 0)
				continue;
			if (n > 1)
				sub[n++] = ',';
			memcpy(sub + n, text + key, klen + 2);
			n += klen + 2;
			sub[n++] = ':';
			memcpy(sub + n, text + val, i - val);
			n += i - val;
			break;
		}
	}
	sub[n++] = '}';
	root = te_json_load(sub, n, lim, why, whylen);
	free(sub);
	return root;
}

/*
 * An unsigned integer member of `o` no larger than `max`: 0, -ENOENT when
 * absent, -EINVAL when not an integer (a string, 1.5, 1e3 and null are not),
 * -ERANGE when negative or over `max`. (te_json_check() has refused integers
 * of 2^63 and more, which json-glib would wrap to negative ones.)
 */
static inline int te_json_get_u64(JsonObject *o, const char *member, uint64_t max, uint64_t *out)
{
	JsonNode *n = json_object_get_member(o, member);

	if (n == NULL)
		return -ENOENT;
	if (!JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_INT64)
		return -EINVAL;
	gint64 v = json_node_get_int(n);
	if (v < 0 || (uint64_t)v > max)
		return -ERANGE;
	*out = (uint64_t)v;
	return 0;
}
#endif

#ifdef __cplusplus
}
#endif
#endif /* TE_TE_JSON_H */
