/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Test harness for the metadata stores: free loopback ports, a temporary
 * directory, child processes (etcd, redis-server, te-metadata-server, peer
 * engines) that die with the test (PR_SET_PDEATHSIG) and are killed at exit,
 * and raw HTTP / RESP exchanges to look at a store behind the plugins' back.
 */
#ifndef TE_MD_HARNESS_H
#define TE_MD_HARNESS_H

#include <arpa/inet.h>
#include <stdatomic.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/rpc-raw.h"
#include "../common/util.h"

/* ------------------------------------------------------------ processes */

#define MAX_CHILDREN 32
static pid_t children[MAX_CHILDREN];
static char tmp_root[256];

static void forget_child(pid_t pid)
{
	for (int i = 0; i < MAX_CHILDREN; i++)
		if (children[i] == pid)
			children[i] = 0;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

/* Set by main when the case passed: otherwise the servers' logs are shown
 * before the directory goes, and which child had died on its own. */
static bool harness_passed;

static int dump_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	size_t n = strlen(path);
	(void)ftw;
	if (flag != FTW_F || n < 4 || strcmp(path + n - 4, ".log") != 0)
		return 0;
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return 0;
	/* the last 4 KiB: the end is where a server says why it stopped */
	if (sb->st_size > 4096)
		fseek(f, sb->st_size - 4096, SEEK_SET);
	fprintf(stderr, "----- %s (last 4 KiB) -----\n", path);
	char buf[1024];
	size_t r;
	while ((r = fread(buf, 1, sizeof buf, f)) > 0)
		fwrite(buf, 1, r, stderr);
	fprintf(stderr, "----- end of %s -----\n", path);
	fclose(f);
	return 0;
}

static void harness_cleanup(void)
{
	for (int i = 0; i < MAX_CHILDREN; i++)
		if (children[i] > 0) {
			int st;
			if (!harness_passed && waitpid(children[i], &st, WNOHANG) == children[i]) {
				fprintf(stderr, "child %d had ended by itself: %s %d\n", (int)children[i],
					WIFEXITED(st) ? "exit status" : "signal",
					WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
				children[i] = 0;
				continue;
			}
			kill(children[i], SIGKILL);
			waitpid(children[i], NULL, 0);
			children[i] = 0;
		}
	if (tmp_root[0] && !harness_passed)
		nftw(tmp_root, dump_one, 16, FTW_PHYS);
	if (tmp_root[0] && !getenv("TE_TEST_KEEP_TMP"))
		nftw(tmp_root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void harness_signal(int sig)
{
	harness_cleanup();
	signal(sig, SIG_DFL);
	raise(sig);
}

/* Creates the temporary directory; servers' data and logs go below it. */
static void harness_init(const char *name)
{
	snprintf(tmp_root, sizeof tmp_root, "/tmp/te-md-%s-XXXXXX", name);
	REQUIRE(mkdtemp(tmp_root) != NULL);
	atexit(harness_cleanup);
	signal(SIGTERM, harness_signal);
	signal(SIGINT, harness_signal);
	signal(SIGPIPE, SIG_IGN);
}

/* A path below the temporary directory (static storage, rotating). */
static const char *tmp_path(const char *fmt, ...)
{
	static char bufs[8][512];
	static int next;
	char *b = bufs[next++ % 8];
	char rel[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(rel, sizeof rel, fmt, ap);
	va_end(ap);
	snprintf(b, 512, "%s/%s", tmp_root, rel);
	return b;
}

/* Starts argv[0] with `env` ("K=V" strings, NULL-terminated, may be NULL)
 * added. stdout/stderr go to `log` when given; with `in`/`out` the child's
 * stdin/stdout are pipes returned there. */
static pid_t spawn(char *const argv[], char *const env[], const char *log, int *in, int *out)
{
	int pin[2] = { -1, -1 }, pout[2] = { -1, -1 };

	if (in)
		REQUIRE(pipe2(pin, O_CLOEXEC) == 0);
	if (out)
		REQUIRE(pipe2(pout, O_CLOEXEC) == 0);
	pid_t parent = getpid();
	pid_t pid = fork();
	REQUIRE(pid >= 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		setpgid(0, 0);
		if (log) {
			int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
			if (fd >= 0) {
				dup2(fd, 1);
				dup2(fd, 2);
				close(fd);
			}
		}
		if (in)
			dup2(pin[0], 0);
		if (out)
			dup2(pout[1], 1);
		for (int i = 0; env && env[i]; i++)
			putenv(env[i]);
		execvp(argv[0], argv);
		fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	if (in) {
		close(pin[0]);
		*in = pin[1];
	}
	if (out) {
		close(pout[1]);
		*out = pout[0];
	}
	for (int i = 0; i < MAX_CHILDREN; i++)
		if (children[i] == 0) {
			children[i] = pid;
			break;
		}
	return pid;
}

/* Sends `sig` and reaps, bounded; SIGKILL when it does not go. Returns the
 * wait status. */
static int stop_child(pid_t pid, int sig)
{
	int st = 0;

	if (pid <= 0)
		return -1;
	kill(pid, sig);
	for (int i = 0; i < 200; i++) {
		if (waitpid(pid, &st, WNOHANG) == pid) {
			forget_child(pid);
			return st;
		}
		usleep(50000);
	}
	fprintf(stderr, "  child %d ignored signal %d for 10 s; killing it\n", (int)pid, sig);
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	forget_child(pid);
	return st;
}

/* Waits, bounded, for a child to exit on its own. -1 on timeout. */
static int wait_child(pid_t pid, int timeout_ms)
{
	int st = 0;
	long long end = now_ms() + timeout_ms;

	while (now_ms() < end) {
		if (waitpid(pid, &st, WNOHANG) == pid) {
			forget_child(pid);
			return st;
		}
		usleep(20000);
	}
	return -1;
}

/* ------------------------------------------------------------- network */

/* A loopback TCP port nobody listens on right now. */
static int free_port(void)
{
	int port = te_test_free_port();
	REQUIRE(port > 0);
	return port;
}

static int connect_loopback(int port, int timeout_ms)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	struct timeval tv = { .tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000 };

	if (fd < 0)
		return -1;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Sends `req` and reads until the peer closes (or `stop` appears, or the
 * timeout). Returns bytes read or -1. */
static ssize_t exchange(int port, const void *req, size_t len, char *resp, size_t cap, const char *stop)
{
	return exchange_fd(connect_loopback(port, 5000), req, len, false, resp, cap, stop);
}

/* One HTTP/1.1 request with Connection: close. Returns the status (0 when
 * none came); the body is copied to `body` (may be NULL). */
static int http_raw(int port, const char *method, const char *target, const char *extra_headers,
		    const char *data, size_t dlen, char *body, size_t cap)
{
	size_t hcap = 1024 + strlen(target) + (extra_headers ? strlen(extra_headers) : 0);
	char *req = malloc(hcap + dlen);
	char *resp = malloc(1 << 20);
	int n = snprintf(req, hcap, "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n%s", method,
			 target, port, extra_headers ? extra_headers : "");
	if (data)
		n += snprintf(req + n, hcap - (size_t)n, "Content-Length: %zu\r\n", dlen);
	n += snprintf(req + n, hcap - (size_t)n, "\r\n");
	if (data && dlen)
		memcpy(req + n, data, dlen);
	ssize_t got = exchange(port, req, (size_t)n + (data ? dlen : 0), resp, 1 << 20, NULL);
	int status = 0;
	if (got > 12 && strncmp(resp, "HTTP/1.", 7) == 0)
		status = atoi(resp + 9);
	if (body && cap) {
		const char *b = got > 0 ? strstr(resp, "\r\n\r\n") : NULL;
		snprintf(body, cap, "%s", b ? b + 4 : "");
	}
	free(req);
	free(resp);
	return status;
}

/* One redis command, RESP-encoded; the raw reply in `resp`. */
static ssize_t redis_raw(int port, char *resp, size_t cap, int argc, ...)
{
	char req[4096];
	size_t n = (size_t)snprintf(req, sizeof req, "*%d\r\n", argc);
	va_list ap;
	va_start(ap, argc);
	for (int i = 0; i < argc; i++) {
		const char *a = va_arg(ap, const char *);
		n += (size_t)snprintf(req + n, sizeof req - n, "$%zu\r\n%s\r\n", strlen(a), a);
	}
	va_end(ap);
	REQUIRE(n < sizeof req);
	return exchange(port, req, n, resp, cap, "\r\n");
}

/* ------------------------------------------------------------- servers */

static bool wait_until(bool (*ready)(int), int port, int timeout_ms)
{
	long long end = now_ms() + timeout_ms;
	while (now_ms() < end) {
		if (ready(port))
			return true;
		usleep(50000);
	}
	return false;
}

static bool tcp_ready(int port);

/* One line a child process wrote on `fd` (its newline dropped), within
 * timeout_ms; false on timeout, end of file or a line longer than cap. */
static bool harness_read_line(int fd, char *buf, size_t cap, int timeout_ms)
{
	size_t n = 0;
	long long end = now_ms() + timeout_ms;

	buf[0] = '\0';
	while (n + 1 < cap) {
		struct pollfd p = { fd, POLLIN, 0 };
		long long left = end - now_ms();
		if (left <= 0 || poll(&p, 1, (int)left) <= 0)
			return false;
		if (read(fd, buf + n, 1) != 1)
			return false;
		if (buf[n] == '\n') {
			buf[n] = '\0';
			return true;
		}
		n++;
	}
	return false;
}

static bool etcd_ready(int port)
{
	char body[512];
	return http_raw(port, "GET", "/health", NULL, NULL, 0, body, sizeof body) == 200 &&
	       strstr(body, "true") != NULL;
}

typedef struct etcd_member {
	pid_t pid;
	int client_port, peer_port;
	char name[16];
} etcd_member;

/* Runs a command to its end (30 s at most); its output goes to `log`.
 * Returns its exit status, or -1. */
static int run_cmd(char *const argv[], char *const env[], const char *log)
{
	pid_t pid = spawn(argv, env, log, NULL, NULL);
	int st = wait_child(pid, 30000);
	if (st < 0) {
		stop_child(pid, SIGKILL);
		return -1;
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* In tmp_root: a CA (ca.pem), a server certificate for 127.0.0.1 (srv.pem,
 * srv.key) and a client certificate (cli.pem, cli.key) signed by it; with
 * `other_ca`, a second CA that signed nothing (other-ca.pem). */
static void make_certs(bool other_ca)
{
	char script[4096];
	snprintf(script, sizeof script,
		 "set -e; cd %s; EC='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes';"
		 "openssl req -x509 $EC -keyout ca.key -out ca.pem -days 2 -subj /CN=te-test-ca;%s"
		 "printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n' > srv.ext;"
		 "printf 'extendedKeyUsage=clientAuth\\n' > cli.ext;"
		 "openssl req $EC -keyout srv.key -out srv.csr -subj /CN=127.0.0.1;"
		 "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile srv.ext "
		 "-out srv.pem;"
		 "openssl req $EC -keyout cli.key -out cli.csr -subj /CN=te-client;"
		 "openssl x509 -req -in cli.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile cli.ext "
		 "-out cli.pem",
		 tmp_root,
		 other_ca ? "openssl req -x509 $EC -keyout other-ca.key -out other-ca.pem -days 2 -subj /CN=other-ca;"
			  : "");
	char *argv[] = { "sh", "-c", script, NULL };
	REQUIRE(run_cmd(argv, NULL, tmp_path("openssl.log")) == 0);
}

/* Starts `n` etcd members forming one cluster (n = 1: a single server);
 * `extra` arguments go to each; with `tls_args` (the server's certificate
 * options) clients speak https. */
static void etcd_start_ex(etcd_member *m, int n, const char *tag, const char *const *extra, bool tls);

static void etcd_start(etcd_member *m, int n, const char *tag)
{
	etcd_start_ex(m, n, tag, NULL, false);
}

/* An address of this host etcd's members listen on too (their clients'
 * port), beside 127.0.0.1: for clients in other network namespaces. */
static const char *etcd_also_listen;

static void etcd_start_ex(etcd_member *m, int n, const char *tag, const char *const *extra, bool tls)
{
	char cluster[1024] = "";
	size_t cl = 0;

	for (int i = 0; i < n; i++) {
		m[i].client_port = free_port();
		m[i].peer_port = free_port();
		snprintf(m[i].name, sizeof m[i].name, "m%d", i);
		cl += (size_t)snprintf(cluster + cl, sizeof cluster - cl, "%s%s=http://127.0.0.1:%d",
				       i ? "," : "", m[i].name, m[i].peer_port);
	}
	for (int i = 0; i < n; i++) {
		char curl[64], purl[64], dir[512], log[512];
		char lurl[160];
		snprintf(curl, sizeof curl, "%s://127.0.0.1:%d", tls ? "https" : "http", m[i].client_port);
		if (etcd_also_listen != NULL)
			snprintf(lurl, sizeof lurl, "%s,%s://%s:%d", curl, tls ? "https" : "http", etcd_also_listen,
				 m[i].client_port);
		else
			snprintf(lurl, sizeof lurl, "%s", curl);
		snprintf(purl, sizeof purl, "http://127.0.0.1:%d", m[i].peer_port);
		snprintf(dir, sizeof dir, "%s", tmp_path("%s-etcd-%d", tag, i));
		snprintf(log, sizeof log, "%s", tmp_path("%s-etcd-%d.log", tag, i));
		char *argv[48] = { "etcd", "--name", m[i].name, "--data-dir", dir,
				 "--listen-client-urls", lurl, "--advertise-client-urls", curl,
				 "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
				 "--initial-cluster", cluster, "--initial-cluster-state", "new",
				 "--initial-cluster-token", (char *)tag,
				 "--logger", "zap", "--log-level", "error" };
		int argc = 23;
		for (int j = 0; extra && extra[j] && argc < 47; j++)
			argv[argc++] = (char *)extra[j];
		argv[argc] = NULL;
		m[i].pid = spawn(argv, NULL, log, NULL, NULL);
	}
	for (int i = 0; i < n; i++)
		if (!wait_until(tls ? tcp_ready : etcd_ready, m[i].client_port, 30000)) {
			fprintf(stderr, "etcd member %d (port %d) did not become healthy; log in %s\n", i,
				m[i].client_port, tmp_path("%s-etcd-%d.log", tag, i));
			REQUIRE(!"etcd started");
		}
}

static bool redis_ready(int port)
{
	char r[256];
	return redis_raw(port, r, sizeof r, 1, "PING") > 0 && (strncmp(r, "+PONG", 5) == 0 ||
							       strncmp(r, "-NOAUTH", 7) == 0);
}

/* Starts redis-server on `port` with its data in `dir`; extra args follow. */
static pid_t redis_start(int port, const char *dir, const char *const *extra)
{
	char ports[16];
	char *argv[32] = { "redis-server", "--port", ports, "--bind", "127.0.0.1", "--dir", (char *)dir,
			   "--save", "", "--protected-mode", "no", "--daemonize", "no" };
	int argc = 13;
	snprintf(ports, sizeof ports, "%d", port);
	mkdir(dir, 0700);
	for (int i = 0; extra && extra[i] && argc < 31; i++)
		argv[argc++] = (char *)extra[i];
	argv[argc] = NULL;
	char log[600];
	snprintf(log, sizeof log, "%s.log", dir);
	pid_t pid = spawn(argv, NULL, log, NULL, NULL);
	if (!wait_until(redis_ready, port, 20000)) {
		fprintf(stderr, "redis-server on %d did not come up; log in %s\n", port, log);
		REQUIRE(!"redis started");
	}
	return pid;
}

static bool mds_ready(int port)
{
	return http_raw(port, "GET", "/health", NULL, NULL, 0, NULL, 0) == 200;
}

/* For a server speaking TLS: accepting connections is all we can see. */
static bool tcp_ready(int port)
{
	int fd = connect_loopback(port, 1000);
	if (fd >= 0)
		close(fd);
	return fd >= 0;
}

/* Starts te-metadata-server on `port`; extra args follow. */
static pid_t mds_start(int port, const char *const *extra)
{
	const char *bin = getenv("TE_METADATA_SERVER_BIN");
	char listen[64];
	char *argv[32] = { (char *)bin, "--listen", listen };
	int argc = 3;

	REQUIRE(bin != NULL);
	snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
	for (int i = 0; extra && extra[i] && argc < 31; i++)
		argv[argc++] = (char *)extra[i];
	argv[argc] = NULL;
	bool tls = false;
	for (int i = 0; i < argc; i++)
		tls = tls || strcmp(argv[i], "--tls-cert") == 0;
	/* Under ThreadSanitizer a TLS server runs glib-networking's handshake
	 * threads, whose hand-offs inside GLib (bit locks on futexes) TSan
	 * cannot see: that process alone gets tests/tsan/tls-server.txt. */
	static char tsan_opt[1024];
	char *env[2] = { NULL, NULL };
	const char *o = getenv("TSAN_OPTIONS"), *sup = o ? strstr(o, "suppressions=") : NULL;
	if (tls && sup != NULL) {
		sup += strlen("suppressions=");
		int dir = (int)(strrchr(sup, '/') ? strrchr(sup, '/') - sup : 0);
		int n = snprintf(tsan_opt, sizeof tsan_opt, "TSAN_OPTIONS=%s:suppressions=%.*s/tls-server.txt", o,
				 dir, sup);
		REQUIRE(n > 0 && (size_t)n < sizeof tsan_opt && dir > 0);
		env[0] = tsan_opt;
	}
	pid_t pid = spawn(argv, env, tmp_path("mds.log"), NULL, NULL);
	if (!wait_until(tls ? tcp_ready : mds_ready, port, 20000)) {
		fprintf(stderr, "te-metadata-server on %d did not come up; log in %s\n", port, tmp_path("mds.log"));
		REQUIRE(!"te-metadata-server started");
	}
	return pid;
}

/* A listener that accepts connections and never answers: a wedged store. */
static int blackhole_listen(int *port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t al = sizeof a;

	REQUIRE(fd >= 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	REQUIRE(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
	REQUIRE(listen(fd, 64) == 0); /* the kernel completes handshakes; nobody reads */
	REQUIRE(getsockname(fd, (struct sockaddr *)&a, &al) == 0);
	*port = ntohs(a.sin_port);
	return fd;
}

#endif
