/* SPDX-License-Identifier: Apache-2.0 */
/* Time for the C tests, standard C and POSIX only (the Mooncake API tests,
 * built against an installed copy, use it too). */
#ifndef TE_TEST_CLOCK_H
#define TE_TEST_CLOCK_H

#include <time.h>

/* Milliseconds on the monotonic clock: deadlines and durations. */
static inline long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

static inline void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

/* Waits up to `ms` for `cond` to hold, looking every 2 ms; its last value. */
#define WAIT_FOR(cond, ms)                                                       \
	({                                                                           \
		long long _end = now_ms() + (ms);                                        \
		while (!(cond) && now_ms() < _end)                                       \
			sleep_ms(2);                                                         \
		(cond);                                                                  \
	})

#endif
