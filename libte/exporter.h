/* SPDX-License-Identifier: Apache-2.0 */
/* Private to libte: the process's metrics endpoint (exporter.c). */
#ifndef TE_EXPORTER_H
#define TE_EXPORTER_H

#include "internal.h"

/* Takes a hold on the endpoint for `e` when it asks for one
 * (TE_METRICS_ADDR), starting it for the first; 0 when it does not ask.
 * A negative error, logged, when the endpoint cannot start. */
int te_exporter_acquire(struct te_engine *e);
/* Lets go of `e`'s hold (none: nothing); the last one stops the endpoint. */
void te_exporter_release(struct te_engine *e);

#endif
