/* SPDX-License-Identifier: Apache-2.0 */
/* The "hold" test transport (hold-transport.c) as a test reaches it: libte
 * loads it from TEST_PLUGIN_DIR, and the test calls libte's copy of it. */
#ifndef TE_TEST_HOLD_H
#define TE_TEST_HOLD_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include <te/te.h>

#include "../common/check.h"

/* How many transfers it holds; completes them all (with `error`, or moved
 * when 0) and says how many. Set by hold_find(). */
static size_t (*hold_count)(void);
static size_t (*hold_release)(int error);
/* Through engine `engine`'s instance: replaces the fields of the buffer at
 * `addr` (te_host's buffer_fields); says the first held transfer's keys were
 * refused (transfer_stale). */
static int (*hold_fields)(const char *engine, const void *addr, const char *json);
static int (*hold_stale)(void);
static size_t (*hold_expired)(void); /* holddl only: its expire() calls */

/* Looks both calls up in the copy libte loaded (dlopen with RTLD_NOLOAD: a
 * second copy would hold nothing). */
static inline void hold_find_named(const char *name)
{
	char path[4096];
	const char *dir = getenv("TEST_PLUGIN_DIR");
	REQUIRE(dir != NULL);
	te_plugin_foreach(NULL, NULL); /* makes libte load the plugins */
	snprintf(path, sizeof path, "%s/libte-transport-%s.so", dir, name);
	void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
	REQUIRE(h != NULL);
	*(void **)&hold_count = dlsym(h, "te_test_hold_count");
	*(void **)&hold_release = dlsym(h, "te_test_hold_release");
	*(void **)&hold_fields = dlsym(h, "te_test_hold_fields");
	*(void **)&hold_stale = dlsym(h, "te_test_hold_stale");
	*(void **)&hold_expired = dlsym(h, "te_test_hold_expired");
	REQUIRE(hold_count && hold_release && hold_fields && hold_stale && hold_expired);
}

static inline void hold_find(void)
{
	hold_find_named("hold");
}

#endif
