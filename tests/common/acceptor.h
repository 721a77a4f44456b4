/* SPDX-License-Identifier: Apache-2.0 */
/* A thread that accepts connections on a listening socket of the test's and
 * hands each to the test's `serve`, until acceptor_stop(): the fake peers
 * and relays of several suites. It looks at its stop flag every 100 ms, so
 * that stopping takes no connection. */
#ifndef TE_TEST_ACCEPTOR_H
#define TE_TEST_ACCEPTOR_H

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/socket.h>

#include "check.h"

typedef struct acceptor acceptor;
struct acceptor {
	int lfd;
	/* Serves the accepted `fd`, on the acceptor's thread; it owns fd. */
	void (*serve)(acceptor *a, int fd);
	void *arg; /* the test's, for serve */
	atomic_bool stop;
	pthread_t th;
};

static inline void *acceptor_loop(void *arg)
{
	acceptor *a = arg;
	while (!atomic_load(&a->stop)) {
		struct pollfd p = { a->lfd, POLLIN, 0 };
		if (poll(&p, 1, 100) <= 0)
			continue;
		int fd = accept4(a->lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd >= 0)
			a->serve(a, fd);
	}
	return NULL;
}

/* Starts accepting on `lfd` (listening already). */
static inline void acceptor_start(acceptor *a, int lfd, void (*serve)(acceptor *, int), void *arg)
{
	REQUIRE(lfd >= 0);
	a->lfd = lfd;
	a->serve = serve;
	a->arg = arg;
	atomic_store(&a->stop, false);
	REQUIRE(pthread_create(&a->th, NULL, acceptor_loop, a) == 0);
}

/* Stops the thread and waits for it; the socket stays the test's. */
static inline void acceptor_stop(acceptor *a)
{
	atomic_store(&a->stop, true);
	pthread_join(a->th, NULL);
}

#endif
