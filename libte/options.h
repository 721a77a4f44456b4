/* SPDX-License-Identifier: Apache-2.0 */
/* The engine's options (te_engine_create's te_option list, else the
 * environment) and its identity: what every layer may read (options.c). */
#ifndef TE_OPTIONS_H
#define TE_OPTIONS_H

#include <stdint.h>

struct te_engine;

const char *te_engine_option(const struct te_engine *e, const char *key);
/* A number option: the engine option `name`, else the environment variable;
 * `def` when unset, and with a warning when not a number in [min, max]. */
uint64_t te_engine_option_u64(const struct te_engine *e, const char *name, uint64_t def, uint64_t min,
			      uint64_t max);

#endif
