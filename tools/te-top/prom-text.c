/* SPDX-License-Identifier: Apache-2.0 */
/* The bounded text-format reader (prom-text.h). One pass, no recursion. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prom-text.h"

const prom_limits prom_default_limits = { 16u << 20, 4096, 16, 200000 };

static void sample_free(gpointer p)
{
	prom_sample *s = p;

	for (size_t i = 0; i < s->n_labels; i++) {
		g_free(s->labels[i].name);
		g_free(s->labels[i].value);
	}
	g_free(s->labels);
	g_free(s->name);
	g_free(s);
}

const char *prom_label_get(const prom_sample *s, const char *name)
{
	for (size_t i = 0; i < s->n_labels; i++)
		if (strcmp(s->labels[i].name, name) == 0)
			return s->labels[i].value;
	return NULL;
}

static bool name_start(char c, bool colon)
{
	return g_ascii_isalpha(c) || c == '_' || (colon && c == ':');
}

static bool name_char(char c, bool colon)
{
	return name_start(c, colon) || g_ascii_isdigit(c);
}

/* A name at p[*i..n): metric names may hold ':', label names may not. */
static char *take_name(const char *p, size_t n, size_t *i, bool colon)
{
	size_t a = *i;

	if (a >= n || !name_start(p[a], colon))
		return NULL;
	while (*i < n && name_char(p[*i], colon))
		(*i)++;
	return g_strndup(p + a, *i - a);
}

/* A quoted label value with the format's escapes (\\, \", \n). */
static char *take_value(const char *p, size_t n, size_t *i)
{
	if (*i >= n || p[*i] != '"')
		return NULL;
	(*i)++;
	GString *v = g_string_new(NULL);
	while (*i < n && p[*i] != '"') {
		char c = p[(*i)++];
		if (c == '\\') {
			if (*i >= n)
				break;
			c = p[(*i)++];
			if (c == 'n')
				c = '\n';
			else if (c != '\\' && c != '"') {
				g_string_free(v, TRUE);
				return NULL;
			}
		}
		g_string_append_c(v, c);
	}
	if (*i >= n) {
		g_string_free(v, TRUE);
		return NULL;
	}
	(*i)++; /* the closing quote */
	return g_string_free(v, FALSE);
}

static bool take_number(const char *p, size_t n, size_t *i, double *out)
{
	char buf[64];
	size_t a = *i;

	while (*i < n && p[*i] != ' ' && p[*i] != '\t')
		(*i)++;
	size_t l = *i - a;
	if (l == 0 || l >= sizeof buf)
		return false;
	memcpy(buf, p + a, l);
	buf[l] = '\0';
	if (strcmp(buf, "+Inf") == 0 || strcmp(buf, "Inf") == 0) {
		*out = INFINITY;
		return true;
	}
	if (strcmp(buf, "-Inf") == 0) {
		*out = -INFINITY;
		return true;
	}
	if (strcmp(buf, "NaN") == 0) {
		*out = NAN;
		return true;
	}
	char *end = NULL;
	*out = g_ascii_strtod(buf, &end);
	/* strtod would also take "inf", "nan", hex: the format has none of them */
	return end == buf + l && strpbrk(buf, "xXiInN") == NULL;
}

static void skip_blank(const char *p, size_t n, size_t *i)
{
	while (*i < n && (p[*i] == ' ' || p[*i] == '\t'))
		(*i)++;
}

/* One sample line (no newline); the sample or NULL with `why`. */
static prom_sample *parse_line(const char *p, size_t n, const prom_limits *lim, int *rc, char *why,
			       size_t whylen)
{
	prom_sample *s = g_new0(prom_sample, 1);
	size_t i = 0;

	*rc = -EINVAL;
	s->name = take_name(p, n, &i, true);
	if (s->name == NULL) {
		g_snprintf(why, whylen, "no metric name");
		goto bad;
	}
	if (i < n && p[i] == '{') {
		size_t cap = lim->max_labels < PROM_MAX_LABELS_HARD ? lim->max_labels : PROM_MAX_LABELS_HARD;
		s->labels = g_new0(prom_label, cap > 0 ? cap : 1);
		i++;
		skip_blank(p, n, &i);
		while (i < n && p[i] != '}') {
			if (s->n_labels >= cap) {
				*rc = -E2BIG;
				g_snprintf(why, whylen, "more than %zu labels", cap);
				goto bad;
			}
			prom_label *l = &s->labels[s->n_labels];
			l->name = take_name(p, n, &i, false);
			if (l->name == NULL) {
				g_snprintf(why, whylen, "bad label name");
				goto bad;
			}
			s->n_labels++;
			skip_blank(p, n, &i);
			if (i >= n || p[i] != '=') {
				g_snprintf(why, whylen, "no '=' after label %s", l->name);
				goto bad;
			}
			i++;
			skip_blank(p, n, &i);
			l->value = take_value(p, n, &i);
			if (l->value == NULL) {
				g_snprintf(why, whylen, "bad value of label %s", l->name);
				goto bad;
			}
			for (size_t k = 0; k + 1 < s->n_labels; k++)
				if (strcmp(s->labels[k].name, l->name) == 0) {
					g_snprintf(why, whylen, "label %s repeated", l->name);
					goto bad;
				}
			skip_blank(p, n, &i);
			if (i < n && p[i] == ',') {
				i++;
				skip_blank(p, n, &i);
			} else if (i < n && p[i] != '}') {
				g_snprintf(why, whylen, "expected ',' or '}'");
				goto bad;
			}
		}
		if (i >= n) {
			g_snprintf(why, whylen, "labels not closed");
			goto bad;
		}
		i++; /* '}' */
	}
	if (i >= n || (p[i] != ' ' && p[i] != '\t')) {
		g_snprintf(why, whylen, "no value after %s", s->name);
		goto bad;
	}
	skip_blank(p, n, &i);
	if (!take_number(p, n, &i, &s->value)) {
		g_snprintf(why, whylen, "bad value of %s", s->name);
		goto bad;
	}
	skip_blank(p, n, &i);
	if (i < n) { /* an optional timestamp: an integer of milliseconds */
		size_t a = i;
		if (p[i] == '-')
			i++;
		while (i < n && g_ascii_isdigit(p[i]))
			i++;
		skip_blank(p, n, &i);
		if (i != n || i == a) {
			g_snprintf(why, whylen, "trailing text after the value of %s", s->name);
			goto bad;
		}
	}
	*rc = 0;
	return s;
bad:
	sample_free(s);
	return NULL;
}

int prom_parse(const char *text, size_t len, const prom_limits *lim, GPtrArray **out, char *why,
	       size_t whylen)
{
	size_t lineno = 0, pos = 0;
	char what[160];

	*out = NULL;
	if (text == NULL && len > 0)
		return -EINVAL;
	if (len > lim->max_body) {
		g_snprintf(why, whylen, "the text has %zu bytes, more than %zu", len, lim->max_body);
		return -E2BIG;
	}
	GPtrArray *a = g_ptr_array_new_with_free_func(sample_free);
	while (pos < len) {
		const char *nl = memchr(text + pos, '\n', len - pos);
		size_t n = nl ? (size_t)(nl - (text + pos)) : len - pos;
		const char *p = text + pos;
		lineno++;
		pos += n + (nl != NULL);
		if (n > lim->max_line) {
			g_snprintf(why, whylen, "line %zu has %zu bytes, more than %zu", lineno, n, lim->max_line);
			g_ptr_array_unref(a);
			return -E2BIG;
		}
		if (n > 0 && p[n - 1] == '\r')
			n--;
		size_t i = 0;
		skip_blank(p, n, &i);
		if (i == n || p[i] == '#')
			continue;
		if (memchr(p, '\0', n) != NULL) {
			g_snprintf(why, whylen, "line %zu holds a NUL byte", lineno);
			g_ptr_array_unref(a);
			return -EINVAL;
		}
		if (a->len >= lim->max_series) {
			g_snprintf(why, whylen, "more than %zu samples (line %zu)", lim->max_series, lineno);
			g_ptr_array_unref(a);
			return -E2BIG;
		}
		int rc;
		prom_sample *s = parse_line(p + i, n - i, lim, &rc, what, sizeof what);
		if (s == NULL) {
			g_snprintf(why, whylen, "line %zu: %s", lineno, what);
			g_ptr_array_unref(a);
			return rc;
		}
		g_ptr_array_add(a, s);
	}
	*out = a;
	return 0;
}
