/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A JSON document as text, the one way the plugins and tools that build JSON
 * with json-glib write it out: compact, in memory from malloc(), so that a
 * plugin can hand it to the host, which frees what it gets with free().
 */
#ifndef TEU_JSON_H
#define TEU_JSON_H

#include <stddef.h>

#include <json-glib/json-glib.h>

/* The text of `root` (which stays the caller's), its length in *len when
 * len is not NULL; NULL when out of memory. free() frees it. */
char *teu_json_text(JsonNode *root, size_t *len);

/* The same for the document `b` has built; `b` is released. NULL also when
 * `b` holds no complete document. */
char *teu_json_finish(JsonBuilder *b, size_t *len);

#endif
