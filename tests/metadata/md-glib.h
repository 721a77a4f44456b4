/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The one GLib helper of the metadata tests, apart from md-harness.h so the
 * tests that do not link GLib need not find its headers.
 */
#ifndef TE_MD_GLIB_H
#define TE_MD_GLIB_H

#include <glib.h>
#include <stdatomic.h>

#include "md-harness.h"

/* Holds GLib's default main context, as an application's main loop thread
 * would, until `*state` (an atomic_int set to 1 once held) leaves 1. A TLS
 * handshake that handed a question to that context would wait for ever. */
static inline void *md_hold_default_context(void *arg)
{
	atomic_int *state = arg;
	REQUIRE(g_main_context_acquire(NULL));
	atomic_store(state, 1);
	while (atomic_load(state) == 1)
		sleep_ms(5);
	g_main_context_release(NULL);
	return NULL;
}

#endif
