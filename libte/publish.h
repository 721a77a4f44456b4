/* SPDX-License-Identifier: Apache-2.0 */
/* Publishing the engine's descriptor (publish.c). */
#ifndef TE_PUBLISH_H
#define TE_PUBLISH_H

#include <glib.h>
#include <stdbool.h>

struct te_engine;

/* Encodes the descriptor and puts it to the store (with the RPC address
 * the first time). Called with ctl held. */
int te_engine_publish(struct te_engine *e);
/* Publishes the descriptor again on the engine's own thread, soon (calls
 * that come before it ran share it). */
void te_engine_publish_later(struct te_engine *e);
/* The registry's hook: te_engine_publish() (later false) or
 * te_engine_publish_later(). */
int te_engine_publish_mem(struct te_engine *e, bool later);
/* The engine's one thread that publishes for te_engine_publish_later(). */
GThreadPool *te_publish_pool_new(struct te_engine *e);
/* Removes the engine's keys from the store. */
void te_engine_unpublish(struct te_engine *e);
/* While `e` (not NULL) installs its transports on this thread, their
 * publications wait for the one that follows; NULL ends it. */
void te_publish_defer(struct te_engine *e);

#endif
