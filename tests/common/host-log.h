/* SPDX-License-Identifier: Apache-2.0 */
/* The log and the options of a te_host of a test's own, for tests that call
 * a plugin's (or libteu's) functions directly, without libte. What they log
 * is kept: every line since host_log_clear() (the oldest dropped when the
 * text fills), the last line with its level, and counts. Plain C. */
#ifndef TE_TEST_HOST_LOG_H
#define TE_TEST_HOST_LOG_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <te/te-host.h>

static char host_log_text[1 << 16]; /* one line a line */
static size_t host_log_len;         /* of host_log_text */
static size_t host_log_bytes;       /* logged since the clear, none cut */
static unsigned host_log_lines;     /* logged ever */
static const char *host_log_last = ""; /* the last line, in host_log_text */
static int host_log_level = -1;     /* the last line's; -1 before any */
static const char *host_log_echo;   /* non-NULL: each line to stderr too, under this name */

static inline void host_log_clear(void)
{
	host_log_text[0] = '\0';
	host_log_len = 0;
	host_log_bytes = 0;
}

/* te_host.log */
static inline void host_log(const te_host *h, int level, const char *fmt, ...)
{
	va_list ap;
	(void)h;
	if (host_log_len > sizeof host_log_text - 1024)
		host_log_len = 0; /* the latest lines are the ones a test reads */
	char *line = host_log_text + host_log_len;
	size_t room = sizeof host_log_text - host_log_len - 1; /* and the newline */
	va_start(ap, fmt);
	int n = vsnprintf(line, room, fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	host_log_bytes += (size_t)n + 1;
	host_log_len += (size_t)n < room ? (size_t)n : room - 1;
	host_log_text[host_log_len++] = '\n';
	host_log_text[host_log_len] = '\0';
	host_log_lines++;
	host_log_last = line;
	host_log_level = level;
	if (host_log_echo != NULL)
		fprintf(stderr, "[%s %d] %.*s\n", host_log_echo, level, (int)(host_log_text + host_log_len - 1 - line),
			line);
}

/* Whether a line since the clear holds `s`; says what the log holds if not. */
static inline int host_logged(const char *s)
{
	int r = strstr(host_log_text, s) != NULL;
	if (!r)
		fprintf(stderr, "  (log lacks \"%s\"; it holds: %.600s)\n", s, host_log_text);
	return r;
}

/* te_host.config with no option set. */
static inline const char *host_config_none(const te_host *h, const char *te_name, const char *mc_name)
{
	(void)h;
	(void)te_name;
	(void)mc_name;
	return NULL;
}

/* te_host.config from the environment: the te name, else the mc one. */
static inline const char *host_config_env(const te_host *h, const char *te_name, const char *mc_name)
{
	(void)h;
	const char *v = te_name != NULL ? getenv(te_name) : NULL;
	return v != NULL ? v : mc_name != NULL ? getenv(mc_name) : NULL;
}

#endif
