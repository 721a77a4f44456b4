/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A plugin's diagnostic counters, switched on by an environment variable
 * (TE_CUDA_STATS=1, TE_TCP_STATS=1) read once when the plugin is loaded: when off, counting
 * is a branch not taken and no clock is read. Header-only.
 */
#ifndef TEU_STATS_H
#define TEU_STATS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* Whether the variable `var` asks for the counters (its value starts with 1). */
static inline bool teu_stats_wanted(const char *var)
{
	const char *v = getenv(var);
	return v != NULL && v[0] == '1';
}

/* CLOCK_MONOTONIC in ns when `on`, else 0. */
static inline uint64_t teu_stats_now(bool on)
{
	struct timespec ts;

	if (!on)
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A file's switch of counters `name`: `name_on`, set from the variable
 * `var` when the plugin is loaded; `name_now()`, the clock read that costs
 * a branch when off; and the call of the file's `name_print()` when the
 * plugin is unloaded with the counters on. */
#define TEU_STATS_SWITCH(name, var)                                \
	static bool name##_on;                                     \
	static void name##_print(void);                            \
	__attribute__((constructor)) static void name##_init(void) \
	{                                                          \
		name##_on = teu_stats_wanted(var);                 \
	}                                                          \
	__attribute__((destructor)) static void name##_fini(void)  \
	{                                                          \
		if (name##_on)                                     \
			name##_print();                            \
	}                                                          \
	static inline uint64_t name##_now(void)                    \
	{                                                          \
		return teu_stats_now(name##_on);                   \
	}

/* Adds `v` to the atomic counter `counter` when `on`. */
#define TEU_STATS_ADD(on, counter, v)                     \
	do {                                              \
		if (on)                                   \
			atomic_fetch_add(&(counter), (v)); \
	} while (0)

#endif
