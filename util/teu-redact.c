/* SPDX-License-Identifier: Apache-2.0 */
#include <string.h>

#include <glib.h>

#include "teu-redact.h"

char *teu_redact(const char *url)
{
	if (url == NULL)
		return g_strdup("(null)");
	const char *start = strstr(url, "://");
	start = start ? start + 3 : url;
	size_t n = strcspn(start, "/?#");
	const char *at = NULL;
	for (const char *p = start; p < start + n; p++)
		if (*p == '@')
			at = p; /* the last '@': a password may hold one */
	const char *colon = at ? memchr(start, ':', (size_t)(at - start)) : NULL;
	if (colon == NULL)
		return g_strdup(url); /* no user-info, or a user name alone: no secret */
	return g_strdup_printf("%.*s:***%s", (int)(colon - url), url, at);
}
