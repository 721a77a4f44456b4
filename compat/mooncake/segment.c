/* SPDX-License-Identifier: Apache-2.0 */
/* Mooncake's segment calls over te_segment_*. */
#include "mc-internal.h"

#include <string.h>

/* ---------------------------------------------------------------- segments */

/* Mooncake drops leading '/' from segment names; NULL when nothing is left. */
static const char *trim_name(const char *fn, const char *name)
{
	if (name == NULL) {
		mc_err("%s: NULL segment name", fn);
		return NULL;
	}
	while (*name == '/')
		name++;
	if (*name == '\0') {
		mc_err("%s: empty segment name", fn);
		return NULL;
	}
	return name;
}

/* The engine of a call on a segment and, in *name, the segment's name
 * trimmed; NULL (logged) when either is refused. */
static struct mc_engine *engine_and_name(const char *fn, transfer_engine_t engine,
					 const char *segment_name, const char **name)
{
	struct mc_engine *e = engine_of(fn, engine);

	if (e == NULL)
		return NULL;
	*name = trim_name(fn, segment_name);
	return *name != NULL ? e : NULL;
}

static segment_id_t open_segment(const char *fn, transfer_engine_t engine,
				 const char *segment_name, int refresh)
{
	const char *name;
	struct mc_engine *e = engine_and_name(fn, engine, segment_name, &name);
	te_segment_id id;
	int rc;

	if (e == NULL)
		return ERR_INVALID_ARGUMENT;
	/* An open name keeps its id and takes no further reference: Mooncake
	 * programs open a name again and again and never close it. */
	id = te_segment_find(e->te, name);
	if (id >= 0) {
		if (refresh && id != TE_LOCAL_SEGMENT) {
			rc = te_segment_refresh(e->te, id);
			if (rc < 0) {
				mc_err("%s: fetching the descriptor of '%s' again: %s", fn, name,
				       te_strerror(rc));
				return to_err(fn, rc);
			}
		}
		return id;
	}
	id = te_segment_open(e->te, name);
	if (id < 0) {
		mc_err("%s: cannot open segment '%s': %s", fn, name, te_strerror(id));
		return ERR_INVALID_ARGUMENT;
	}
	return id;
}

MC_API segment_id_t openSegment(transfer_engine_t engine, const char *segment_name)
{
	return open_segment("openSegment", engine, segment_name, 0);
}

MC_API segment_id_t openSegmentNoCache(transfer_engine_t engine, const char *segment_name)
{
	return open_segment("openSegmentNoCache", engine, segment_name, 1);
}

MC_API int closeSegment(transfer_engine_t engine, segment_id_t segment_id)
{
	if (engine_of("closeSegment", engine) == NULL)
		return ERR_INVALID_ARGUMENT;
	if (segment_id < 0) {
		mc_err("closeSegment: negative segment id %d", (int)segment_id);
		return ERR_INVALID_ARGUMENT;
	}
	return 0;
}

MC_API int removeLocalSegment(transfer_engine_t engine, const char *segment_name)
{
	static const char fn[] = "removeLocalSegment";
	const char *name;
	struct mc_engine *e = engine_and_name(fn, engine, segment_name, &name);
	te_segment_id id;

	if (e == NULL)
		return ERR_INVALID_ARGUMENT;
	/* Close until libte forgets the name: each open of it (including a
	 * racing openSegment on another thread) holds one reference. Bounded so
	 * that a libte refusing to close cannot loop us forever. */
	for (int i = 0; i < 1 << 20; i++) {
		int rc;
		id = te_segment_find(e->te, name);
		if (id < 0 || id == TE_LOCAL_SEGMENT)
			return 0;
		rc = te_segment_close(e->te, id);
		if (rc < 0) {
			mc_err("%s: closing '%s' (id %d): %s", fn, name, (int)id, te_strerror(rc));
			return to_err(fn, rc);
		}
	}
	mc_err("%s: '%s' is still open after many closes", fn, name);
	return ERR_CONTEXT;
}

MC_API int syncSegmentCache(transfer_engine_t engine)
{
	struct mc_engine *e = engine_of("syncSegmentCache", engine);
	int rc;

	if (e == NULL)
		return ERR_INVALID_ARGUMENT;
	rc = te_segment_refresh_all(e->te);
	if (rc < 0) {
		mc_err("syncSegmentCache: %s", te_strerror(rc));
		return to_err("syncSegmentCache", rc);
	}
	return 0;
}
