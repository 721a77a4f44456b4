/* SPDX-License-Identifier: Apache-2.0 */
/* A minimal checking kit for libte's test programs: CHECK() records a failure
 * with its location and goes on; a program exits non-zero if any failed. */
#ifndef TE_TEST_CHECK_H
#define TE_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Atomic: test programs check from several threads at once. */
static _Atomic int check_failures;
static _Atomic int check_count;

#define CHECK(cond)                                                                \
	do {                                                                           \
		check_count++;                                                             \
		if (!(cond)) {                                                             \
			check_failures++;                                                      \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
		}                                                                          \
	} while (0)

#define CHECK_EQ(a, b)                                                             \
	do {                                                                           \
		long long _a = (long long)(a), _b = (long long)(b);                        \
		check_count++;                                                             \
		if (_a != _b) {                                                            \
			check_failures++;                                                      \
			fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%lld != %lld)\n",      \
				__FILE__, __LINE__, #a, #b, _a, _b);                                   \
		}                                                                          \
	} while (0)

/* Fatal: the rest of the program cannot run without it. */
#define REQUIRE(cond)                                                              \
	do {                                                                           \
		check_count++;                                                             \
		if (!(cond)) {                                                             \
			fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
			exit(1);                                                               \
		}                                                                          \
	} while (0)

#define TEST_RUN(fn)                                                               \
	do {                                                                           \
		const char *_only = getenv("TE_TEST_ONLY"); /* run one test by name */    \
		if (_only != NULL && strcmp(_only, #fn) != 0)                              \
			break;                                                             \
		int _before = check_failures;                                              \
		fn();                                                                      \
		fprintf(stderr, "%s %s\n", check_failures == _before ? "ok  " : "FAIL", #fn); \
	} while (0)

static inline int check_done(void)
{
	fprintf(stderr, "%d checks, %d failed\n", check_count, check_failures);
	return check_failures ? 1 : 0;
}

/* Deterministic pattern so any misplaced byte is caught. */
static inline void fill_pattern(unsigned char *p, size_t n, unsigned seed)
{
	unsigned x = seed * 2654435761u + 1;
	for (size_t i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		p[i] = (unsigned char)(x >> 16);
	}
}

#endif
