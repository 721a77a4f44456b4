/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Hostile JSON from the network, end to end:
 *
 *   test-hostile-json TCP_PEER TE_BENCH
 *
 * 1. A target engine in its own process gets frames of every kind (old-style,
 *    Connection, Metadata, Notify, Probe) whose bodies nest 300,000 levels
 *    (arrays, objects, and where a string member belongs), hold a 1M-element
 *    array, a 900 KiB string, a repeated key, a wrong type, a number out of
 *    range: each connection is closed without a reply, the refusals are in
 *    its log (rate-limited, with a count of the lines held back), and it still
 *    serves a real initiator, every byte checked.
 * 2. A peer whose Metadata reply (its descriptor) is any of the same: this
 *    engine's te_segment_open fails with TE_ERR_METADATA, and te-bench as an
 *    initiator ends with an error, not a signal.
 * 3. A te-bench target gets the frames of 1, then serves te-bench initiators
 *    with --check, reading and writing, and stops cleanly.
 */
#include <pthread.h>
#include <sys/stat.h>

#include <te/te-plugin.h> /* TE_RATELIMIT_BURST */

#include "../common/acceptor.h"
#include "../common/hostile.h"
#include "../tcp/peer-target.h"

static const char *peer_bin, *bench_bin;
static char dir[] = "/tmp/te-hostile-XXXXXX";
static char target_log[160];

/* ------------------------------------------------------------ payloads */

enum { NPAY = 10 };

/* The hostile bodies; `desc` makes them descriptor-shaped where it matters.
 * 1M elements only fit a frame of 4 MiB (the target allows one here, so
 * the JSON limit, not the frame limit, refuses them). */
static void payloads(char *p[NPAY], bool desc, size_t array_n)
{
	const char *pre = desc ? "{\"name\":\"x\",\"protocol\":\"tcp\",\"buffers\":" : "{\"name\":\"x\",\"notify_msg\":";
	p[0] = hostile_deep(300000, 0);
	p[1] = hostile_deep(100000, 1);
	p[2] = hostile_nest("{\"name\":", "[", 200000, "1", "]", ",\"notify_msg\":\"m\",\"protocol\":\"tcp\"}");
	p[3] = hostile_array(pre, array_n, "0", "}");
	p[4] = hostile_string("{\"name\":", 900 * 1024, ",\"notify_msg\":\"m\",\"protocol\":\"tcp\"}");
	p[5] = strdup("{\"name\":\"a\",\"notify_msg\":\"m\",\"protocol\":\"tcp\",\"name\":\"b\"}");
	p[6] = strdup(desc ? "{\"name\":5,\"protocol\":[\"tcp\"],\"buffers\":{}}"
			   : "{\"name\":5,\"notify_msg\":[]}");
	p[7] = strdup(desc ? "{\"name\":\"x\",\"protocol\":\"tcp\",\"buffers\":[{\"name\":\"b\",\"addr\":18446744073709551616,\"length\":4096}]}"
			   : "{\"name\":\"x\",\"notify_msg\":\"m\",\"n\":-18446744073709551617}");
	p[8] = strdup(desc ? "{\"name\":\"x\",\"protocol\":\"tcp\",\"buffers\":[{\"name\":\"b\",\"addr\":4096,\"length\":-4096}]}"
			   : "[\"name\",\"notify_msg\"]");
	p[9] = strdup(desc ? "{\"name\":\"x\",\"protocol\":\"tcp\",\"buffers\":[{\"name\":\"b\",\"addr\":4096,\"length\":1.5}]}"
			   : "{\"name\":\"x\",\"notify_msg\":NaN}");
}

static void payloads_free(char *p[NPAY])
{
	for (int i = 0; i < NPAY; i++)
		free(p[i]);
}

static bool alive(child *c)
{
	int st;
	return waitpid(c->pid, &st, WNOHANG) == 0;
}

/* Every payload in every frame kind to `port`: each must close without a
 * reply, but for members a kind does not read. The time it took, in ms. */
static long long flood(int port)
{
	static char in[1 << 16];
	char *p[NPAY];
	payloads(p, false, 1000000);
	const int kinds[] = { -1, 0, 1, 2, 3 };
	int closed = 0, sent = 0;
	long long t0 = now_ms();
	for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++)
		for (int i = 0; i < NPAY; i++) {
			/* An old-style frame starts with its JSON: a body that
			 * opens with '[' is still one, '{' too. */
			ssize_t r = raw_frame(port, kinds[k], p[i], in, sizeof in);
			/* Metadata and Probe read no member of their body: well-formed
			 * members of the wrong type are answered as usual. */
			bool answered = i == 6 && (kinds[k] == 1 || kinds[k] == 3);
			sent++;
			if (answered ? r > 9 : r == 0)
				closed++;
			else
				fprintf(stderr, "  kind %d payload %d: %zd bytes came back: %.100s\n", kinds[k],
					i, r, r > 9 ? in + 9 : "");
		}
	long long dt = now_ms() - t0;
	fprintf(stderr, "  %d hostile frames, %d treated as they must be, in %lld ms\n", sent, closed, dt);
	CHECK_EQ(closed, sent);
	payloads_free(p);
	return dt;
}

/* ------------------------------------------------------- 1: the frames */

static void test_frames_refused(void)
{
	char env_frame[] = "TE_RPC_MAX_FRAME=4194304";
	char *env[] = { env_frame, NULL };
	target t;
	peer_target_start(&t, peer_bin, env, target_log);

	long long dt = flood(t.rpc_port);
	CHECK(alive(&t.c));

	/* Still serving: a Probe, and a real initiator with every byte checked. */
	char *reply = rpc_exchange(t.rpc_port, 3, "{}");
	CHECK(reply != NULL && strstr(reply, "success") != NULL);
	free(reply);
	te_engine *e = tcp_engine(NULL, 0);
	REQUIRE(e != NULL);
	CHECK(peer_target_transfers(e, &t, 11));
	te_engine_destroy(e);

	/* Refused with a reason, and not a line per frame: per kind at most
	 * TE_RATELIMIT_BURST a second, the rest counted. */
	CHECK(log_has(target_log, "refused: nested deeper than 64 levels"));
	CHECK(log_has(target_log, "similar lines held back"));
	FILE *f = fopen(target_log, "r");
	REQUIRE(f != NULL);
	char line[4096];
	int lines = 0;
	while (fgets(line, sizeof line, f) != NULL)
		lines += strstr(line, "refused") != NULL;
	fclose(f);
	long long bound = 3 * TE_RATELIMIT_BURST * (dt / 1000 + 2);
	fprintf(stderr, "  %d refusal lines logged for %d frames (bound %lld)\n", lines, 5 * NPAY, bound);
	CHECK(lines >= 1);
	CHECK(lines <= bound);
	CHECK(lines < 5 * NPAY);

	child_say(&t.c, "EXIT");
	CHECK_EQ(child_stop(&t.c, 0), 0);
}

/* ------------------------------------- 2: a peer with a hostile descriptor */

typedef struct evil_peer {
	acceptor acc;
	int lfd, port;
	const char *reply; /* the Metadata reply's body */
	atomic_int served;
} evil_peer;

static void evil_serve(acceptor *a, int fd)
{
	evil_peer *ev = a->arg;
	unsigned char hdr[9];
	size_t got = 0;
	uint64_t n;

	if (recv_exact(fd, hdr, 9, 5000, &got) == 9) {
		memcpy(&n, hdr, 8);
		n = le64toh(n);
		/* Drain the request body, then answer with our own frame. */
		char *sink = malloc(n);
		if (sink != NULL && n > 1 && recv_exact(fd, sink, n - 1, 5000, &got) < 0)
			n = 0;
		free(sink);
		size_t bl = strlen(ev->reply);
		unsigned char *out = malloc(9 + bl);
		uint64_t len = htole64(bl + 1);
		memcpy(out, &len, 8);
		out[8] = hdr[8];
		memcpy(out + 9, ev->reply, bl);
		atomic_fetch_add(&ev->served, 1); /* before the client can return */
		send_all(fd, out, 9 + bl);
		free(out);
	}
	shutdown(fd, SHUT_WR);
	closed_quietly(fd, 2000);
	close(fd);
}

static void evil_start(evil_peer *ev, const char *reply)
{
	memset(ev, 0, sizeof *ev);
	ev->reply = reply;
	ev->lfd = listen_any(&ev->port);
	acceptor_start(&ev->acc, ev->lfd, evil_serve, ev);
}

static void evil_stop(evil_peer *ev)
{
	acceptor_stop(&ev->acc);
	close(ev->lfd);
}

/* te-bench with `argv` (NULL-terminated after the program), its stdout
 * dropped: its exit status, or -signal when a signal ended it. */
static int run_bench(char *const argv[])
{
	pid_t pid = fork();
	REQUIRE(pid >= 0);
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);
		if (null >= 0)
			dup2(null, 1);
		execv(bench_bin, argv);
		_exit(127);
	}
	int st = 0;
	REQUIRE(waitpid(pid, &st, 0) == pid);
	return WIFSIGNALED(st) ? -WTERMSIG(st) : WEXITSTATUS(st);
}

/* te-bench as an initiator against `seg`. */
static int bench_against(const char *seg)
{
	char arg[160];
	snprintf(arg, sizeof arg, "--segment_id=%s", seg);
	char *av[] = { (char *)bench_bin, "--mode=initiator", arg, "--protocol=tcp", "--duration=1",
		       "--buffer_size=1048576", "--quiet", NULL };
	return run_bench(av);
}

static void test_descriptor_refused(void)
{
	char *p[NPAY];
	/* The reply is read with the default 1 MiB frame limit: 100,000 elements
	 * (200 KB) break the element limit instead. */
	payloads(p, true, 100000);
	te_engine *e = tcp_engine(NULL, 0);
	REQUIRE(e != NULL);
	for (int i = 0; i < NPAY; i++) {
		evil_peer ev;
		char seg[64];
		evil_start(&ev, p[i]);
		snprintf(seg, sizeof seg, "127.0.0.1:%d", ev.port);
		int rc = te_segment_open(e, seg);
		if (rc != TE_ERR_METADATA)
			fprintf(stderr, "  descriptor %d: te_segment_open gave %d (%s)\n", i, rc,
				te_strerror(rc));
		CHECK_EQ(rc, TE_ERR_METADATA);
		CHECK(atomic_load(&ev.served) >= 1);
		/* Three of them also against te-bench, as a user would meet them. */
		if (i == 0 || i == 2 || i == 4) {
			int st = bench_against(seg);
			fprintf(stderr, "  descriptor %d: te-bench exited with %d\n", i, st);
			CHECK(st > 0 && st != 127);
		}
		evil_stop(&ev);
	}
	/* The engine is fine: a well-formed peer opens. */
	target t;
	peer_target_start(&t, peer_bin, NULL, target_log);
	CHECK(peer_target_transfers(e, &t, 13));
	child_say(&t.c, "EXIT");
	CHECK_EQ(child_stop(&t.c, 0), 0);
	te_engine_destroy(e);
	payloads_free(p);
}

/* ------------------------------------------ 3: a te-bench target, as users run it */

static void test_bench_target(void)
{
	char log[200], *env[] = { "TE_RPC_MAX_FRAME=4194304", NULL };
	snprintf(log, sizeof log, "%s/bench-target.log", dir);
	char *av[] = { "/bin/sh", "-c",
		       "exec \"$0\" --mode=target --protocol=tcp --local_server_name=127.0.0.1 "
		       "--buffer_size=16777216 2>>\"$1\"",
		       (char *)bench_bin, log, NULL };
	child c;
	REQUIRE(child_start(&c, av, env));
	const char *rest = child_expect(&c, "te-bench: target ready, segment name ", 30000);
	REQUIRE(rest != NULL);
	char name[128];
	REQUIRE(sscanf(rest, "%127s", name) == 1);
	const char *colon = strrchr(name, ':');
	REQUIRE(colon != NULL);
	flood(atoi(colon + 1));
	CHECK(alive(&c));

	/* A real initiator with every byte checked, reads and writes. */
	char arg[160];
	snprintf(arg, sizeof arg, "--segment_id=%s", name);
	for (int w = 0; w < 2; w++) {
		char *iav[] = { (char *)bench_bin, arg, "--protocol=tcp", "--check", "--duration=1",
				w ? "--operation=write" : "--operation=read", "--buffer_size=16777216",
				"--quiet", NULL };
		int st = run_bench(iav);
		if (st != 0)
			fprintf(stderr, "  te-bench --check (%s) ended with status %d\n", w ? "write" : "read", st);
		CHECK_EQ(st, 0);
	}
	CHECK(log_has(log, "refused"));
	int st = child_stop(&c, SIGTERM);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	unlink(log);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s TCP_PEER TE_BENCH\n", argv[0]);
		return 2;
	}
	peer_bin = argv[1];
	bench_bin = argv[2];
	signal(SIGPIPE, SIG_IGN);
	REQUIRE(mkdtemp(dir) != NULL);
	snprintf(target_log, sizeof target_log, "%s/target.log", dir);
	TEST_RUN(test_frames_refused);
	TEST_RUN(test_descriptor_refused);
	TEST_RUN(test_bench_target);
	unlink(target_log);
	rmdir(dir);
	return check_done();
}
