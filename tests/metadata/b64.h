/* SPDX-License-Identifier: Apache-2.0 */
/* Base64 of a short text, for talking to etcd's JSON gateway by hand
 * (keys and values there are base64). malloc()ed. */
#ifndef TE_TEST_B64_H
#define TE_TEST_B64_H

#include <stdlib.h>
#include <string.h>

static inline char *b64(const char *s)
{
	static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t n = strlen(s), o = 0;
	char *out = malloc(4 * (n / 3 + 2));

	if (out == NULL)
		return NULL;
	for (size_t i = 0; i < n; i += 3) {
		unsigned v = (unsigned char)s[i] << 16 | (i + 1 < n ? (unsigned char)s[i + 1] << 8 : 0) |
			     (i + 2 < n ? (unsigned char)s[i + 2] : 0);
		out[o++] = t[v >> 18 & 63];
		out[o++] = t[v >> 12 & 63];
		out[o++] = i + 1 < n ? t[v >> 6 & 63] : '=';
		out[o++] = i + 2 < n ? t[v & 63] : '=';
	}
	out[o] = '\0';
	return out;
}

#endif
