/* SPDX-License-Identifier: Apache-2.0 */
/* Process-wide logging: one level, one handler, both swappable at run time. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "internal.h"

static atomic_int log_level = -1; /* -1: not read from the environment yet */
static GMutex log_lock;
static te_log_fn log_fn;
static void *log_user;

/* What te_last_error() returns: the calling thread's last error line. */
static _Thread_local char last_error[512];

const char *te_last_error(void)
{
	return last_error;
}

void te_last_error_clear(void)
{
	last_error[0] = '\0';
}

static const char *const level_names[] = { "error", "warn", "info", "debug", "trace" };

static int parse_level(const char *s)
{
	if (s == NULL || *s == '\0')
		return -1;
	if (s[0] >= '0' && s[0] <= '4' && s[1] == '\0')
		return s[0] - '0';
	for (int i = 0; i < 5; i++)
		if (g_ascii_strcasecmp(s, level_names[i]) == 0)
			return i;
	if (g_ascii_strcasecmp(s, "warning") == 0)
		return TE_LOG_WARN;
	if (g_ascii_strcasecmp(s, "fatal") == 0)
		return TE_LOG_ERROR;
	return -1;
}

static int current_level(void)
{
	int l = atomic_load_explicit(&log_level, memory_order_relaxed);

	if (l < 0) {
		const char *s = te_env2("TE_LOG_LEVEL", "MC_LOG_LEVEL");
		l = parse_level(s);
		if (l < 0)
			l = TE_LOG_WARN;
		int expect = -1;
		atomic_compare_exchange_strong(&log_level, &expect, l);
		l = atomic_load(&log_level);
	}
	return l;
}

void te_set_log_level(int level)
{
	if (level < TE_LOG_ERROR)
		level = TE_LOG_ERROR;
	if (level > TE_LOG_TRACE)
		level = TE_LOG_TRACE;
	atomic_store(&log_level, level);
}

int te_get_log_level(void)
{
	return current_level();
}

bool te_log_enabled(int level)
{
	return level <= current_level();
}

void te_set_log_handler(te_log_fn fn, void *user)
{
	g_mutex_lock(&log_lock);
	log_fn = fn;
	log_user = user;
	g_mutex_unlock(&log_lock);
}

void te_logv(int level, const char *domain, const char *fmt, va_list ap)
{
	char msg[1024];

	if (!te_log_enabled(level))
		return;
	vsnprintf(msg, sizeof msg, fmt, ap);
	if (level <= TE_LOG_ERROR) {
		g_strlcpy(last_error, msg, sizeof last_error);
		level = TE_LOG_ERROR;
	}
	if (level > TE_LOG_TRACE)
		level = TE_LOG_TRACE;

	g_mutex_lock(&log_lock);
	if (log_fn != NULL) {
		log_fn(level, domain, msg, log_user);
	} else {
		struct timespec ts;
		struct tm tm;
		clock_gettime(CLOCK_REALTIME, &ts);
		localtime_r(&ts.tv_sec, &tm);
		fprintf(stderr, "%02d:%02d:%02d.%03ld %-5s [%s] %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
			ts.tv_nsec / 1000000, level_names[level], domain ? domain : "te", msg);
	}
	g_mutex_unlock(&log_lock);
}

void te_log(int level, const char *domain, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	te_logv(level, domain, fmt, ap);
	va_end(ap);
}

void te_log_write(int level, const char *domain, const char *msg)
{
	if (msg != NULL)
		te_log(level, domain != NULL && *domain ? domain : "app", "%s", msg);
}
