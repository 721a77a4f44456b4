/* SPDX-License-Identifier: Apache-2.0 */
/* Child processes for the tests: a program started with pipes on its stdin
 * and stdout, lines read back with a timeout, and a stop that never hangs. */
#ifndef TE_TEST_CHILD_H
#define TE_TEST_CHILD_H

#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util.h"

typedef struct child {
	pid_t pid;
	int out;    /* its stdout */
	int in;     /* its stdin: closing it asks it to stop */
	char buf[8192];
	size_t len; /* bytes in buf */
	char line[512];
} child;

/* Starts `argv` with pipes on stdin and stdout; extra environment in `env`
 * ("NAME=value", NULL-terminated, may be NULL). */
static inline bool child_start(child *c, char *const argv[], char *const env[])
{
	int in[2], out[2];
	memset(c, 0, sizeof *c);
	if (pipe(in) != 0 || pipe(out) != 0)
		return false;
	c->pid = fork();
	if (c->pid < 0)
		return false;
	if (c->pid == 0) {
		dup2(in[0], 0);
		dup2(out[1], 1);
		close(in[0]);
		close(in[1]);
		close(out[0]);
		close(out[1]);
		for (int i = 0; env && env[i]; i++)
			putenv(env[i]);
		execv(argv[0], argv);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	c->in = in[1];
	c->out = out[0];
	return true;
}

/* Reads lines until one starts with `prefix` (within timeout_ms). Reads the
 * pipe itself, not through stdio, so that poll() sees what is unread. */
static inline const char *child_expect(child *c, const char *prefix, int timeout_ms)
{
	long long end = now_ms() + timeout_ms;
	for (;;) {
		char *nl = memchr(c->buf, '\n', c->len);
		if (nl != NULL) {
			size_t n = (size_t)(nl - c->buf);
			size_t k = n < sizeof c->line - 1 ? n : sizeof c->line - 1;
			memcpy(c->line, c->buf, k);
			c->line[k] = '\0';
			memmove(c->buf, nl + 1, c->len - n - 1);
			c->len -= n + 1;
			if (strncmp(c->line, prefix, strlen(prefix)) == 0)
				return c->line + strlen(prefix);
			continue;
		}
		if (c->len == sizeof c->buf)
			c->len = 0; /* a line too long to matter */
		long long left = end - now_ms();
		struct pollfd pf = { .fd = c->out, .events = POLLIN };
		if (left <= 0 || poll(&pf, 1, (int)left) <= 0)
			return NULL;
		ssize_t r = read(c->out, c->buf + c->len, sizeof c->buf - c->len);
		if (r <= 0)
			return NULL;
		c->len += (size_t)r;
	}
}

/* Writes one line (a newline is added) to the child's stdin. */
static inline bool child_say(child *c, const char *line)
{
	size_t n = strlen(line);
	return write(c->in, line, n) == (ssize_t)n && write(c->in, "\n", 1) == 1;
}

/* A command, then the answer's line starting with `want` (logged when it
 * does not come). */
static inline bool child_cmd(child *c, const char *cmd, const char *want)
{
	if (!child_say(c, cmd))
		return false;
	const char *l = child_expect(c, want, 10000);
	if (l == NULL)
		fprintf(stderr, "  peer: '%s' got no '%s' (last line: %s)\n", cmd, want, c->line);
	return l != NULL;
}

/* A peer program's engine (P2PHANDSHAKE at 127.0.0.1), with the transports
 * of TE_PEER_TRANSPORTS, else `transports`; stdout line-buffered for the
 * test reading it. NULL after printing "FAIL engine: ...". */
static inline te_engine *peer_engine(const char *transports)
{
	const char *tp = getenv("TE_PEER_TRANSPORTS");
	te_option opt = { "transports", tp ? tp : transports };
	te_engine *e = NULL;

	setvbuf(stdout, NULL, _IOLBF, 0);
	int rc = te_engine_create("P2PHANDSHAKE", "127.0.0.1", &opt, 1, &e);
	if (rc < 0) {
		printf("FAIL engine: %s\n", te_strerror(rc));
		return NULL;
	}
	return e;
}

/* Stops the child: closes its stdin, then kills it if it lingers. */
static inline int child_stop(child *c, int sig)
{
	int st = 0;
	if (c->pid <= 0)
		return -1;
	if (sig)
		kill(c->pid, sig);
	if (c->in >= 0)
		close(c->in);
	c->in = -1;
	for (int i = 0; i < 100; i++) {
		if (waitpid(c->pid, &st, WNOHANG) == c->pid)
			goto done;
		usleep(50000);
	}
	kill(c->pid, SIGKILL);
	waitpid(c->pid, &st, 0);
done:
	if (c->out >= 0)
		close(c->out);
	c->out = -1;
	c->pid = -1;
	return st;
}

/* Whether process `pid` is stopped (its state in /proc/PID/stat is T). */
static inline bool proc_stopped(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	if (read_text(path, buf, sizeof buf) < 0)
		return false;
	const char *p = strrchr(buf, ')');
	return p != NULL && p[1] == ' ' && p[2] == 'T';
}

/* Stops `pid` with SIGSTOP and returns once the kernel reports it stopped,
 * 1 s at most: a peer answers in microseconds, so a test must not go on
 * before the stop has landed. */
static inline void child_sigstop(pid_t pid)
{
	REQUIRE(kill(pid, SIGSTOP) == 0);
	for (int i = 0; i < 2000; i++) {
		if (proc_stopped(pid))
			return;
		usleep(500);
	}
	fprintf(stderr, "  pid %d not reported stopped\n", (int)pid);
}

#endif
