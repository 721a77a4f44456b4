/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Waits on peers are bounded and nothing is freed while still in use
 * (architecture principle 6), against peers that stall on purpose:
 *
 *  - te_unregister_memory() under a peer that drips a WRITE's body byte by
 *    byte, or that requested a large READ and stopped reading: it returns
 *    after TE_UNREGISTER_TIMEOUT_MS, and from then on no byte of the memory
 *    is written or read (the buffer is overwritten and then freed: a stray
 *    write shows in the data or to AddressSanitizer);
 *  - te_engine_destroy() with tasks in flight to a peer that never answers:
 *    it returns after TE_DRAIN_TIMEOUT_MS and leaves the engine allocated,
 *    so that the transport failing those tasks later (TE_TCP_TIMEOUT_MS)
 *    touches no freed memory. Run in a child process, which ends with
 *    _exit() so that the deliberate leak is not reported.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "../tcp/tcp-test.h"

#define UNREG_MS 500

static atomic_int n_cut, n_closing, n_left, n_failed;

static void count_log(int level, const char *domain, const char *msg, void *user)
{
	(void)user;
	if (strstr(msg, "cutting them off"))
		atomic_fetch_add(&n_cut, 1);
	if (strstr(msg, "was unregistered"))
		atomic_fetch_add(&n_closing, 1);
	if (strstr(msg, "left allocated"))
		atomic_fetch_add(&n_left, 1);
	if (strstr(msg, "requests failed"))
		atomic_fetch_add(&n_failed, 1);
	if (getenv("TEST_VERBOSE"))
		fprintf(stderr, "  log[%d %s] %s\n", level, domain, msg);
}

/* A connection whose receive buffer is small from the start (set before
 * connect, so that the window stays small). */
static int connect_small(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0), small = 4096, one = 1;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	REQUIRE(fd >= 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	REQUIRE(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
	return fd;
}

/* Sends one byte every 10 ms until told to stop or the target closes. */
typedef struct dripper {
	int fd;
	unsigned char value;
	atomic_int stop;
	atomic_int closed; /* the target ended the connection */
	atomic_llong sent;
	pthread_t th;
} dripper;

static void *drip(void *arg)
{
	dripper *d = arg;
	while (!atomic_load(&d->stop)) {
		unsigned char v = d->value;
		if (send(d->fd, &v, 1, MSG_NOSIGNAL) != 1) {
			atomic_store(&d->closed, 1);
			break;
		}
		atomic_fetch_add(&d->sent, 1);
		struct pollfd pf = { .fd = d->fd, .events = POLLIN };
		if (poll(&pf, 1, 10) > 0) {
			char c;
			ssize_t r = recv(d->fd, &c, 1, MSG_DONTWAIT);
			if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
				atomic_store(&d->closed, 1);
				break;
			}
		}
	}
	return NULL;
}

static bool all_bytes(const unsigned char *p, size_t n, unsigned char v)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != v) {
			fprintf(stderr, "  byte %zu is 0x%02x, not 0x%02x\n", i, p[i], v);
			return false;
		}
	return true;
}

static te_engine *target(void)
{
	char ms[16];
	snprintf(ms, sizeof ms, "%d", UNREG_MS);
	te_option o[] = { { "TE_UNREGISTER_TIMEOUT_MS", ms } };
	te_engine *e = tcp_engine(o, 1);
	REQUIRE(e != NULL);
	return e;
}

/* A WRITE whose body arrives a byte every 10 ms holds its pin forever. */
static void test_unregister_under_dripping_write(void)
{
	const size_t len = 1u << 20;
	te_engine *e = target();
	int port = data_port_of(e);
	REQUIRE(port > 0);
	unsigned char *buf = malloc(len); /* heap: AddressSanitizer watches it once freed */
	REQUIRE(buf != NULL);
	memset(buf, 0x11, len);
	REQUIRE(te_register_memory(e, buf, len, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
	atomic_store(&n_cut, 0);
	atomic_store(&n_closing, 0);
	te_set_log_handler(count_log, NULL);

	dripper d = { .fd = tcp_connect_port(port), .value = 0xc3 };
	REQUIRE(d.fd >= 0);
	unsigned char h[W_HDR];
	put_hdr(h, len, (uintptr_t)buf, 0x81);
	REQUIRE(send_all(d.fd, h, sizeof h));
	REQUIRE(pthread_create(&d.th, NULL, drip, &d) == 0);
	long long until = now_ms() + 3000;
	while (atomic_load(&d.sent) < 5 && now_ms() < until)
		usleep(5000);
	usleep(100000); /* the body is going in: the request holds its pin */

	long long t0 = now_ms();
	CHECK_EQ(te_unregister_memory(e, buf), 0);
	long long dt = now_ms() - t0;
	/* Read only now: before the return the target was writing it. */
	CHECK(buf[0] == 0xc3 && buf[4] == 0xc3);
	fprintf(stderr, "  unregister under a dripping WRITE returned after %lld ms\n", dt);
	CHECK(dt >= UNREG_MS - 50);
	CHECK(dt < UNREG_MS + 2500);
	CHECK(atomic_load(&n_cut) >= 1);

	/* From here the memory is the caller's again: nothing may land in it. */
	memset(buf, 0x5a, len);
	until = now_ms() + 3000;
	while (!atomic_load(&d.closed) && now_ms() < until)
		usleep(5000);
	CHECK(atomic_load(&d.closed)); /* the target cut the connection at the next byte */
	usleep(100000);
	CHECK(all_bytes(buf, len, 0x5a));
	free(buf);
	usleep(100000); /* a write now would be a use after free */
	atomic_store(&d.stop, 1);
	pthread_join(d.th, NULL);
	close(d.fd);
	CHECK(atomic_load(&n_closing) >= 1);

	/* The engine goes on serving: the same range registered again. */
	buf = malloc(len);
	REQUIRE(buf != NULL);
	memset(buf, 0x22, len);
	REQUIRE(te_register_memory(e, buf, len, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
	int fd = tcp_connect_port(port);
	unsigned char in[8 + 16];
	put_hdr(h, 16, (uintptr_t)buf + 100, 0x80);
	CHECK(send_all(fd, h, sizeof h));
	CHECK_EQ(recv_exact(fd, in, sizeof in, 3000, NULL), (ssize_t)sizeof in);
	CHECK(get_le64(in) == W_STATUS_OK);
	CHECK(all_bytes(in + 8, 16, 0x22));
	close(fd);
	CHECK_EQ(te_unregister_memory(e, buf), 0);
	free(buf);
	te_set_log_handler(NULL, NULL);
	te_engine_destroy(e);
}

/* A READ whose reader stopped reading holds its pin while the reply waits
 * for room in the socket. */
static void test_unregister_under_stalled_read(void)
{
	const size_t len = 32u << 20;
	te_engine *e = target();
	int port = data_port_of(e);
	REQUIRE(port > 0);
	unsigned char *buf = malloc(len);
	REQUIRE(buf != NULL);
	memset(buf, 0x11, len);
	REQUIRE(te_register_memory(e, buf, len, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
	atomic_store(&n_cut, 0);
	te_set_log_handler(count_log, NULL);

	int fd = connect_small(port);
	unsigned char h[W_HDR];
	put_hdr(h, len, (uintptr_t)buf, 0x80);
	REQUIRE(send_all(fd, h, sizeof h));
	usleep(300000); /* the reply fills the socket and waits */

	long long t0 = now_ms();
	CHECK_EQ(te_unregister_memory(e, buf), 0);
	long long dt = now_ms() - t0;
	fprintf(stderr, "  unregister under a stalled READ returned after %lld ms\n", dt);
	CHECK(dt >= UNREG_MS - 50);
	CHECK(dt < UNREG_MS + 2500);
	CHECK(atomic_load(&n_cut) >= 1);

	/* A secret written after the return must never reach the peer. */
	memset(buf, 0xee, len);
	size_t total = 0, secret = 0;
	bool eof = false;
	unsigned char *chunk = malloc(1u << 16);
	REQUIRE(chunk != NULL);
	long long until = now_ms() + 10000;
	while (now_ms() < until) {
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		if (poll(&pf, 1, 200) <= 0)
			continue;
		ssize_t r = recv(fd, chunk, 1u << 16, 0);
		if (r <= 0) {
			eof = true;
			break;
		}
		for (ssize_t i = 0; i < r; i++)
			secret += (total + (size_t)i >= 8 && chunk[i] == 0xee);
		total += (size_t)r;
	}
	fprintf(stderr, "  the stalled reader got %zu of %zu bytes before the end\n", total, len + 8);
	CHECK(eof);
	CHECK(total < len + 8);
	CHECK_EQ(secret, 0);
	free(chunk);
	free(buf);
	close(fd);
	te_set_log_handler(NULL, NULL);
	te_engine_destroy(e);
}

/* ---------------------------------------------- destroy with tasks stuck */

/* The child: tasks to a peer whose data port accepts (in the kernel's
 * backlog) and never answers. */
static int destroy_child(void)
{
	fake f;
	fake_tcp_start(&f, 2, NULL);

	te_set_log_handler(count_log, NULL);
	te_option o[] = { { "TE_DRAIN_TIMEOUT_MS", "300" },
			  { "TE_TCP_TIMEOUT_MS", "2000" },
			  { "TE_TCP_CONNS_PER_PEER", "1" } };
	te_engine *e = tcp_engine(o, 3);
	REQUIRE(e != NULL);
	const size_t len = 1u << 20;
	unsigned char *local = malloc(len), *shared = malloc(4096);
	REQUIRE(local && shared);
	memset(shared, 0x33, 4096);
	REQUIRE(te_register_memory(e, local, len, "cpu:0", 0) == 0);
	REQUIRE(te_register_memory(e, shared, 4096, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
	int my_data = data_port_of(e), my_rpc = te_engine_rpc_port(e);
	REQUIRE(my_data > 0);
	te_segment_id seg = te_segment_open(e, f.name);
	REQUIRE(seg > 0);
	te_batch_id b;
	REQUIRE(te_batch_alloc(e, 8, &b) == 0);
	te_request r[8];
	for (int i = 0; i < 8; i++)
		r[i] = (te_request){ i % 2 ? TE_OP_WRITE : TE_OP_READ, seg, local + i * 65536,
				     FAKE_BASE + (uint64_t)i * 65536, 65536 };
	CHECK_EQ(te_submit(e, b, r, 8), 0);
	usleep(200000);
	size_t in_flight = 0;
	CHECK_EQ(te_batch_status(e, b, NULL, &in_flight, NULL), 0);
	CHECK_EQ(in_flight, 8);

	long long t0 = now_ms();
	te_engine_destroy(e);
	long long dt = now_ms() - t0;
	fprintf(stderr, "  destroy with 8 tasks stuck returned after %lld ms\n", dt);
	CHECK(dt < 1800); /* the drain's bound, not the transport's timeout */
	CHECK(atomic_load(&n_left) >= 1);

	/* The transport gives up on the tasks now, completing them into what
	 * destroy left allocated (a use after free if it had freed it). */
	usleep(3500000);
	CHECK(atomic_load(&n_failed) >= 1);
	/* What it could end, it ended: no RPC port, no access to the memory. */
	CHECK(tcp_connect_port(my_rpc) < 0);
	int fd = tcp_connect_port(my_data);
	if (fd >= 0) {
		unsigned char h[W_HDR], st[8];
		put_hdr(h, 16, (uintptr_t)shared, 0x80);
		CHECK(send_all(fd, h, sizeof h));
		ssize_t n = recv_exact(fd, st, 8, 3000, NULL);
		CHECK(n <= 0 || get_le64(st) == W_STATUS_REJECTED);
		close(fd);
	}
	fake_stop(&f);
	fflush(stderr);
	_exit(check_done()); /* no leak report: the engine is left allocated on purpose */
}

static const char *self;

static void test_destroy_with_tasks_stuck(void)
{
	pid_t pid = fork();
	REQUIRE(pid >= 0);
	if (pid == 0) {
		execl(self, self, "destroy-child", (char *)NULL);
		_exit(127);
	}
	int status = 0;
	long long until = now_ms() + 60000;
	pid_t w;
	while ((w = waitpid(pid, &status, WNOHANG)) == 0 && now_ms() < until)
		usleep(20000);
	if (w == 0) {
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		fprintf(stderr, "  the child hung\n");
		CHECK(0);
		return;
	}
	if (WIFSIGNALED(status))
		fprintf(stderr, "  the child died of signal %d\n", WTERMSIG(status));
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	if (argc > 1 && strcmp(argv[1], "destroy-child") == 0)
		return destroy_child();
	self = argv[0];
	TEST_RUN(test_unregister_under_dripping_write);
	TEST_RUN(test_unregister_under_stalled_read);
	TEST_RUN(test_destroy_with_tasks_stuck);
	return check_done();
}
