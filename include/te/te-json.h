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
 *     values in the document, bytes of one string, bytes of the text);
 *   - -ERANGE: an integer outside [-2^63, 2^63 - 1] (parsers keep integers
 *     as int64 and wrap larger ones; no user-space or device address on
 *     Linux reaches 2^63), or a number whose exponent or length makes it no
 *     finite double;
 *   - -EEXIST: a key twice in one object (decoded, so "a" and "\u0061" match):
 *     parsers disagree on which one wins, so neither does.
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

typedef struct te_json__key {
	uint64_t hash;
	size_t off; /* offset of the opening quote */
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

/* The next code unit of a string already checked by te_json__string(): *i
 * points past the opening quote; returns 0 at the closing quote. Escapes
 * decode to their value (a \uXXXX to its 16-bit unit), so two spellings of
 * one key compare equal. */
static inline int te_json__unit(const char *s, size_t *i, uint32_t *u)
{
	char c = s[*i];

	if (c == '"')
		return 0;
	if (c != '\\') {
		*u = (unsigned char)c;
		(*i)++;
		return 1;
	}
	c = s[*i + 1];
	*i += 2;
	switch (c) {
	case 'b': *u = '\b'; break;
	case 'f': *u = '\f'; break;
	case 'n': *u = '\n'; break;
	case 'r': *u = '\r'; break;
	case 't': *u = '\t'; break;
	case 'u':
		*u = (uint32_t)(te_json__hex(s[*i]) << 12 | te_json__hex(s[*i + 1]) << 8 |
				te_json__hex(s[*i + 2]) << 4 | te_json__hex(s[*i + 3]));
		*i += 4;
		break;
	default: *u = (unsigned char)c; break; /* " \ / */
	}
	return 1;
}

static inline uint64_t te_json__hash(const char *s, size_t off)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	size_t i = off + 1;
	uint32_t u;

	while (te_json__unit(s, &i, &u)) {
		h ^= u;
		h *= 1099511628211ull;
	}
	return h;
}

static inline int te_json__key_eq(const char *s, size_t a, size_t b)
{
	size_t i = a + 1, j = b + 1;
	uint32_t u = 0, v = 0;

	for (;;) {
		int ra = te_json__unit(s, &i, &u), rb = te_json__unit(s, &j, &v);
		if (ra != rb || (ra && u != v))
			return 0;
		if (!ra)
			return 1;
	}
}

static inline int te_json__key_cmp(const void *a, const void *b)
{
	const te_json__key *x = (const te_json__key *)a, *y = (const te_json__key *)b;
	return x->hash < y->hash ? -1 : x->hash > y->hash;
}

/* Checks the keys of one object, keys[0..n), for a repeat. */
static inline int te_json__dup(const char *s, te_json__key *keys, size_t n, size_t *at)
{
	if (n < 2)
		return 0;
	qsort(keys, n, sizeof(*keys), te_json__key_cmp);
	for (size_t i = 0; i + 1 < n; i++)
		for (size_t j = i + 1; j < n && keys[j].hash == keys[i].hash; j++)
			if (te_json__key_eq(s, keys[i].off, keys[j].off)) {
				*at = keys[i].off > keys[j].off ? keys[i].off : keys[j].off;
				return 1;
			}
	return 0;
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

/* A string at s[*i] == '"'; moves *i past its closing quote. */
static inline int te_json__string(const char *s, size_t n, size_t *i, size_t max, char *why,
				  size_t whylen)
{
	size_t start = *i, k = *i + 1;

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

/* A number at s[*i]; moves *i past it. */
static inline int te_json__number(const char *s, size_t n, size_t *i, char *why, size_t whylen)
{
	size_t k = *i, start = *i;
	int neg = 0, frac = 0;
	long exp = 0;
	uint64_t mag = 0;
	int over = 0;

	if (s[k] == '-') {
		neg = 1;
		k++;
	}
	if (k >= n || s[k] < '0' || s[k] > '9')
		return te_json__fail(why, whylen, -EINVAL, "bad number at byte %zu", start);
	if (s[k] == '0') {
		k++;
	} else {
		while (k < n && s[k] >= '0' && s[k] <= '9') {
			unsigned d = (unsigned)(s[k] - '0');
			if (mag > (UINT64_MAX - d) / 10)
				over = 1;
			else
				mag = mag * 10 + d;
			k++;
		}
	}
	if (k < n && s[k] == '.') {
		frac = 1;
		k++;
		if (k >= n || s[k] < '0' || s[k] > '9')
			return te_json__fail(why, whylen, -EINVAL, "bad number at byte %zu", start);
		while (k < n && s[k] >= '0' && s[k] <= '9')
			k++;
	}
	if (k < n && (s[k] == 'e' || s[k] == 'E')) {
		int eneg = 0;
		frac = 1;
		k++;
		if (k < n && (s[k] == '+' || s[k] == '-'))
			eneg = s[k++] == '-';
		if (k >= n || s[k] < '0' || s[k] > '9')
			return te_json__fail(why, whylen, -EINVAL, "bad number at byte %zu", start);
		while (k < n && s[k] >= '0' && s[k] <= '9') {
			if (exp < 100000)
				exp = exp * 10 + (s[k] - '0');
			k++;
		}
		if (eneg)
			exp = -exp;
	}
	/* A double holds about 17 significant digits and exponents to 308: longer
	 * numbers or larger exponents are rounding or infinity in disguise. */
	if (k - start > 40 || exp > 300 || exp < -300)
		return te_json__fail(why, whylen, -ERANGE, "number at byte %zu out of range", start);
	if (!frac && (over || mag > (uint64_t)INT64_MAX + (uint64_t)neg))
		return te_json__fail(why, whylen, -ERANGE,
				     "integer at byte %zu outside [-2^63, 2^63-1]", start);
	*i = k;
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
	size_t key_base[TE_JSON_DEPTH_CAP] = { 0 };
	te_json__key *keys = NULL;
	size_t nkeys = 0, capkeys = 0, values = 0, i = 0, at = 0;
	unsigned depth = 0, max_depth;
	int rc = 0, want_value = 1, done = 0;
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
				depth++;
				i++;
				if (c == '{') {
					want_value = 0; /* a key or '}' comes next */
					goto object_member;
				}
				continue;
			}
			if (c == '"') {
				rc = te_json__string(text, len, &i, lim->max_string, why, whylen);
			} else if (c == '-' || (c >= '0' && c <= '9')) {
				rc = te_json__number(text, len, &i, why, whylen);
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
				if (te_json__dup(text, keys + key_base[depth - 1], nkeys - key_base[depth - 1],
						 &at)) {
					rc = te_json__fail(why, whylen, -EEXIST, "key repeated at byte %zu", at);
					break;
				}
				nkeys = key_base[depth - 1];
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
		keys[nkeys].off = i;
		rc = te_json__string(text, len, &i, lim->max_string, why, whylen);
		if (rc < 0)
			break;
		keys[nkeys].hash = te_json__hash(text, keys[nkeys].off);
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
