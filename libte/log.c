/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Process-wide logging: one level, one handler, both swappable at run time.
 *
 * The handler runs outside every lock of libte, so it may call libte itself
 * and may take locks of its own (a language runtime's) that other threads
 * hold while they call libte. It is counted while in use: replacing it waits
 * until no thread is still inside the old one, so that its `user` may be
 * freed then, except when the replacing call comes from inside a handler
 * (it would wait for itself). A line logged from inside the handler goes to
 * stderr rather than back into it: no recursion.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "internal.h"

static atomic_int log_level = -1; /* -1: not read from the environment yet */

typedef struct log_handler {
	te_log_fn fn;
	void *user;
	unsigned users; /* threads inside fn (log_lock) */
	bool waited;    /* its replacer waits for users to drop to 0, then frees it */
} log_handler;

/* Guards log_cur and the handlers' counts only; never held around a call. */
static GMutex log_lock;
static GCond log_cond;
static log_handler *log_cur; /* NULL: stderr */
static _Thread_local unsigned log_depth; /* handlers this thread is inside */

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
	log_handler *h = NULL, *old;

	if (fn != NULL) {
		h = g_new0(log_handler, 1);
		h->fn = fn;
		h->user = user;
	}
	g_mutex_lock(&log_lock);
	old = log_cur;
	log_cur = h;
	/* From inside a handler the caller counts among the users itself:
	 * the last user frees the old one instead. */
	if (old != NULL && old->users > 0 && log_depth == 0) {
		old->waited = true;
		while (old->users > 0)
			g_cond_wait(&log_cond, &log_lock);
	}
	bool free_old = old != NULL && old->users == 0;
	g_mutex_unlock(&log_lock);
	if (free_old)
		g_free(old);
}

static void log_stderr(int level, const char *domain, const char *msg)
{
	struct timespec ts;
	struct tm tm;

	clock_gettime(CLOCK_REALTIME, &ts);
	localtime_r(&ts.tv_sec, &tm);
	/* One call: stdio writes it whole, whatever other threads write. */
	fprintf(stderr, "%02d:%02d:%02d.%03ld %-5s [%s] %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
		ts.tv_nsec / 1000000, level_names[level], domain ? domain : "te", msg);
}

void te_logv(int level, const char *domain, const char *fmt, va_list ap)
{
	char msg[1024];
	log_handler *h = NULL;

	if (!te_log_enabled(level))
		return;
	vsnprintf(msg, sizeof msg, fmt, ap);
	if (level <= TE_LOG_ERROR) {
		g_strlcpy(last_error, msg, sizeof last_error);
		level = TE_LOG_ERROR;
	}
	if (level > TE_LOG_TRACE)
		level = TE_LOG_TRACE;

	if (log_depth == 0) {
		g_mutex_lock(&log_lock);
		h = log_cur;
		if (h != NULL)
			h->users++;
		g_mutex_unlock(&log_lock);
	}
	if (h == NULL) {
		log_stderr(level, domain, msg);
		return;
	}
	log_depth++;
	h->fn(level, domain, msg, h->user);
	log_depth--;
	bool free_it = false;
	g_mutex_lock(&log_lock);
	if (--h->users == 0 && h != log_cur) {
		if (h->waited)
			g_cond_broadcast(&log_cond);
		else
			free_it = true; /* replaced from inside a handler: nobody waits for it */
	}
	g_mutex_unlock(&log_lock);
	if (free_it)
		g_free(h);
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
