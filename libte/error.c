/* SPDX-License-Identifier: Apache-2.0 */
#include <string.h>

#include "internal.h"

const char *te_strerror(int err)
{
	switch (err) {
	case 0: return "success";
	case TE_ERR_PLUGIN: return "plugin could not be loaded or failed";
	case TE_ERR_NO_TRANSPORT: return "no installed transport serves the segment";
	case TE_ERR_METADATA: return "metadata store failed or holds malformed data";
	case TE_ERR_PROTOCOL: return "peer broke the wire protocol";
	case TE_ERR_REJECTED: return "peer rejected the request";
	case TE_ERR_BATCH_FULL: return "more requests than the batch's capacity";
	case TE_ERR_ADDRESS: return "memory not registered or range outside a registered buffer";
	case TE_ERR_OVERLAP: return "region overlaps a registered region";
	case TE_ERR_SEGMENT: return "unknown or closed segment";
	case TE_ERR_BATCH: return "unknown or freed batch";
	case TE_ERR_AUTH: return "peer authentication failed (TE_AUTH_KEY_FILE missing or different)";
	default: break;
	}
	if (err < 0 && err > -TE_ERR_BASE)
		return g_strerror(-err); /* GLib caches it: thread-safe, static lifetime */
	return "unknown error";
}

const char *te_version(void)
{
	return TE_VERSION;
}

void te_free(void *p)
{
	free(p);
}
