/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Logging that can neither deadlock nor flood:
 *
 *  - a handler that calls libte from inside itself (te_log_write,
 *    te_set_log_level, te_set_log_handler) and takes a lock that a thread
 *    logging holds around its libte calls (as a language runtime's
 *    interpreter lock), while two threads log and a third swaps handlers:
 *    everything ends within a bound, and once te_set_log_handler() has
 *    returned no thread is still inside the handler it replaced;
 *  - 10,000 malformed requests on the TCP data port give a bounded number of
 *    log lines, the lines held back are counted in the ones written (every
 *    request is accounted for), and the engine serves on.
 */
#include <pthread.h>
#include <stdatomic.h>

#include <te/te-plugin.h> /* TE_RATELIMIT_BURST */

#include "../tcp/tcp-test.h"

/* ------------------------------------------------------------- deadlock */

static pthread_mutex_t runtime_lock; /* recursive, like an interpreter lock */
static atomic_int inside_a, calls_a, calls_b, stop_logging, phase;

static void handler_a(int level, const char *domain, const char *msg, void *user)
{
	(void)level;
	(void)msg;
	(void)user;
	atomic_fetch_add(&inside_a, 1);
	pthread_mutex_lock(&runtime_lock);
	int n = atomic_fetch_add(&calls_a, 1);
	if (strcmp(domain, "nested") != 0 && n % 100000 == 0) {
		/* Back into libte: to stderr, not into this handler again. */
		te_log_write(TE_LOG_WARN, "nested", "a line logged from inside the handler");
		te_set_log_level(te_get_log_level());
	}
	pthread_mutex_unlock(&runtime_lock);
	atomic_fetch_sub(&inside_a, 1);
}

static void handler_b(int level, const char *domain, const char *msg, void *user);

static void handler_b(int level, const char *domain, const char *msg, void *user)
{
	(void)level;
	(void)domain;
	(void)msg;
	(void)user;
	int n = atomic_fetch_add(&calls_b, 1);
	/* Replacing the handler from inside one returns at once. */
	if (atomic_load(&phase) == 2 && n % 64 == 0)
		te_set_log_handler(n % 128 ? handler_b : handler_a, NULL);
}

static void *logger(void *arg)
{
	bool with_lock = arg != NULL;
	while (!atomic_load(&stop_logging)) {
		if (with_lock)
			pthread_mutex_lock(&runtime_lock);
		te_log_write(TE_LOG_WARN, "test", "a line");
		if (with_lock)
			pthread_mutex_unlock(&runtime_lock);
	}
	return NULL;
}

static atomic_int swaps, stale_inside, done;

static void *swapper(void *arg)
{
	(void)arg;
	long long end = now_ms() + 1500;
	atomic_store(&phase, 1);
	while (now_ms() < end) {
		te_set_log_handler(handler_a, NULL);
		usleep(200);
		te_set_log_handler(handler_b, NULL);
		/* Nobody may still be inside a handler once it was replaced. */
		if (atomic_load(&inside_a) != 0)
			atomic_fetch_add(&stale_inside, 1);
		atomic_fetch_add(&swaps, 1);
	}
	atomic_store(&phase, 2); /* the handlers replace themselves now */
	usleep(500000);
	atomic_store(&stop_logging, 1);
	return NULL;
}

static void *scenario(void *arg)
{
	(void)arg;
	pthread_t l1, l2, sw;
	pthread_create(&l1, NULL, logger, (void *)1);
	pthread_create(&l2, NULL, logger, NULL);
	pthread_create(&sw, NULL, swapper, NULL);
	pthread_join(sw, NULL);
	pthread_join(l1, NULL);
	pthread_join(l2, NULL);
	te_set_log_handler(NULL, NULL);
	atomic_store(&done, 1);
	return NULL;
}

static void test_handler_reentry_no_deadlock(void)
{
	pthread_mutexattr_t ma;
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
	pthread_mutex_init(&runtime_lock, &ma);
	int level = te_get_log_level();
	te_set_log_level(TE_LOG_WARN);

	pthread_t th;
	REQUIRE(pthread_create(&th, NULL, scenario, NULL) == 0);
	long long until = now_ms() + 30000;
	while (!atomic_load(&done) && now_ms() < until)
		usleep(10000);
	if (!atomic_load(&done)) {
		/* Joining would hang: a deadlock is the failure itself. */
		fprintf(stderr, "  deadlock: logging did not finish within 30 s (%d calls of a, %d of b)\n",
			atomic_load(&calls_a), atomic_load(&calls_b));
		fflush(stderr);
		_exit(1);
	}
	pthread_join(th, NULL);
	fprintf(stderr, "  %d swaps, %d calls of handler a, %d of b\n", atomic_load(&swaps),
		atomic_load(&calls_a), atomic_load(&calls_b));
	CHECK(atomic_load(&swaps) > 10);
	CHECK(atomic_load(&calls_a) > 0);
	CHECK(atomic_load(&calls_b) > 0);
	CHECK_EQ(atomic_load(&stale_inside), 0);
	te_set_log_level(level);
}

/* ---------------------------------------------------------------- flood */

static atomic_int lines_malformed, lines_rejected, lines_other;
static atomic_llong held_malformed, held_rejected;

static unsigned held_of(const char *msg)
{
	const char *p = strstr(msg, " similar lines held back)");
	if (p == NULL)
		return 0;
	while (p > msg && p[-1] >= '0' && p[-1] <= '9')
		p--;
	return (unsigned)strtoul(p, NULL, 10);
}

static void count_lines(int level, const char *domain, const char *msg, void *user)
{
	(void)level;
	(void)user;
	if (strstr(msg, "malformed request from")) {
		atomic_fetch_add(&lines_malformed, 1);
		atomic_fetch_add(&held_malformed, held_of(msg));
	} else if (strstr(msg, "rejected READ")) {
		atomic_fetch_add(&lines_rejected, 1);
		atomic_fetch_add(&held_rejected, held_of(msg));
	} else {
		atomic_fetch_add(&lines_other, 1);
	}
	if (getenv("TEST_VERBOSE"))
		fprintf(stderr, "  log[%d %s] %s\n", level, domain, msg);
}

#define FLOOD_THREADS 4
#define FLOOD_PER_THREAD 2500

static int flood_port;

/* One bad header (an unknown opcode, or a READ outside every buffer) per
 * connection: the target ends the connection at each. */
static bool bad_request(bool malformed)
{
	int fd = tcp_connect_port(flood_port);
	if (fd < 0)
		return false;
	unsigned char h[W_HDR], junk[64];
	put_hdr(h, 16, 0x1000, malformed ? 0x7e : 0x80);
	bool ok = send_all(fd, h, sizeof h);
	/* Until the target closes: the request was read and dealt with. */
	while (ok && recv_exact(fd, junk, sizeof junk, 5000, NULL) > 0)
		;
	close(fd);
	return ok;
}

static atomic_int sent_bad;

static void *flooder(void *arg)
{
	(void)arg;
	for (int i = 0; i < FLOOD_PER_THREAD; i++)
		if (bad_request(i % 2 == 0))
			atomic_fetch_add(&sent_bad, 1);
	return NULL;
}

static void test_flood_is_rate_limited(void)
{
	te_engine *e = tcp_engine(NULL, 0);
	REQUIRE(e != NULL);
	flood_port = data_port_of(e);
	REQUIRE(flood_port > 0);
	const size_t len = 4096;
	unsigned char *buf = malloc(len);
	REQUIRE(buf != NULL);
	memset(buf, 0x42, len);
	REQUIRE(te_register_memory(e, buf, len, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
	usleep(1100000); /* a fresh second for the limiters */
	te_set_log_handler(count_lines, NULL);

	long long t0 = now_ms();
	pthread_t th[FLOOD_THREADS];
	for (int i = 0; i < FLOOD_THREADS; i++)
		REQUIRE(pthread_create(&th[i], NULL, flooder, NULL) == 0);
	for (int i = 0; i < FLOOD_THREADS; i++)
		pthread_join(th[i], NULL);
	long long secs = (now_ms() - t0) / 1000 + 1;
	/* One of each after a quiet second: they report what was held back. */
	usleep(1100000);
	REQUIRE(bad_request(true));
	REQUIRE(bad_request(false));
	usleep(200000);
	te_set_log_handler(NULL, NULL);

	int total = FLOOD_THREADS * FLOOD_PER_THREAD;
	int lm = atomic_load(&lines_malformed), lr = atomic_load(&lines_rejected);
	long long hm = atomic_load(&held_malformed), hr = atomic_load(&held_rejected);
	fprintf(stderr, "  %d bad requests in about %lld s: %d + %d lines written, %lld + %lld held back, %d other lines\n",
		atomic_load(&sent_bad), secs, lm, lr, hm, hr, atomic_load(&lines_other));
	CHECK_EQ(atomic_load(&sent_bad), total);
	/* At most a burst per kind per second (TE_RATELIMIT_BURST), and every
	 * request either written or counted as held back. */
	CHECK(lm <= TE_RATELIMIT_BURST * (secs + 2));
	CHECK(lr <= TE_RATELIMIT_BURST * (secs + 2));
	CHECK_EQ(lm + hm, total / 2 + 1);
	CHECK_EQ(lr + hr, total / 2 + 1);
	CHECK(hm > 0 && hr > 0);
	CHECK(atomic_load(&lines_other) <= 4 * TE_RATELIMIT_BURST * (secs + 2));

	/* It serves on. */
	int fd = tcp_connect_port(flood_port);
	unsigned char h[W_HDR], in[8 + 32];
	put_hdr(h, 32, (uintptr_t)buf, 0x80);
	CHECK(send_all(fd, h, sizeof h));
	CHECK_EQ(recv_exact(fd, in, sizeof in, 3000, NULL), (ssize_t)sizeof in);
	CHECK(get_le64(in) == W_STATUS_OK);
	CHECK(in[8] == 0x42 && in[39] == 0x42);
	close(fd);
	CHECK_EQ(te_unregister_memory(e, buf), 0);
	free(buf);
	te_engine_destroy(e);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	TEST_RUN(test_handler_reentry_no_deadlock);
	TEST_RUN(test_flood_is_rate_limited);
	return check_done();
}
