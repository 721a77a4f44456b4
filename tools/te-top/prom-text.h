/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A bounded reader of Prometheus' text exposition format (0.0.4): every
 * line, every sample's labels and the number of samples have a limit that
 * is checked before anything is kept, so a hostile or broken endpoint costs
 * an error, never unbounded memory.
 */
#ifndef TE_PROM_TEXT_H
#define TE_PROM_TEXT_H

#include <stddef.h>

#include <glib.h>

#define PROM_MAX_LABELS_HARD 64

typedef struct prom_limits {
	size_t max_body;   /* bytes of the whole text */
	size_t max_line;   /* bytes of one line, its newline excluded */
	size_t max_labels; /* labels of one sample (at most PROM_MAX_LABELS_HARD) */
	size_t max_series; /* samples in the text */
} prom_limits;

/* What te-top uses: 16 MiB, 4 KiB lines, 16 labels, 200000 samples. */
extern const prom_limits prom_default_limits;

typedef struct prom_label {
	char *name;
	char *value;
} prom_label;

typedef struct prom_sample {
	char *name;
	size_t n_labels;
	prom_label *labels;
	double value;
} prom_sample;

/* Parses `text`; `*out` receives a GPtrArray of prom_sample* (freed with
 * g_ptr_array_unref). Returns 0, -E2BIG when a limit is exceeded, or
 * -EINVAL for text that is not the format; `why` says which and on what
 * line. Comments (# HELP, # TYPE) are checked for length and skipped. */
int prom_parse(const char *text, size_t len, const prom_limits *lim, GPtrArray **out, char *why,
	       size_t whylen);

/* The value of label `name` of `s`, or NULL. */
const char *prom_label_get(const prom_sample *s, const char *name);

#endif
