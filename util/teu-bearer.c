/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "teu-bearer.h"
#include "teu-secret-file.h"

static void teu_bearer__sha256(const char *data, size_t len, guint8 out[32])
{
	GChecksum *c = g_checksum_new(G_CHECKSUM_SHA256);
	gsize n = 32;

	g_checksum_update(c, (const guchar *)data, (gssize)len);
	g_checksum_get_digest(c, out, &n);
	g_checksum_free(c);
}

/* Requires `token` (len bytes) from now on. */
void teu_bearer_set(teu_bearer *b, const char *token, size_t len)
{
	teu_bearer__sha256(token, len, b->sum);
	b->on = true;
}

/* Reads the token in `path` into `b`: 0 (and *weak when it is shorter than
 * TEU_BEARER_WEAK), -EIO when the file cannot be read, -EPERM when it is
 * refused (someone else could have written it), -EINVAL when its first line
 * is no token. On an error `why` says why (never the token). */
int teu_bearer_load(teu_bearer *b, const char *path, bool *weak, char *why, size_t whylen)
{
	char *data = NULL;
	size_t n = 0;
	struct stat st;

	*weak = false;
	int fd = teu_secret_open(path, &st, why, whylen);
	if (fd < 0) {
		char *w = g_strdup(why);
		if (fd == -EPERM)
			g_snprintf(why, whylen, "refused the token file %s: %s", path, w);
		else
			g_snprintf(why, whylen, "cannot read the token file: %s", w);
		g_free(w);
		return fd == -EPERM ? -EPERM : -EIO;
	}
	data = g_malloc(TEU_BEARER_FILE_READ);
	int rc = teu_secret_read(fd, data, TEU_BEARER_FILE_READ, &n);
	close(fd);
	if (rc < 0) {
		memset(data, 0, TEU_BEARER_FILE_READ);
		g_free(data);
		g_snprintf(why, whylen, "cannot read the token file %s: %s", path, g_strerror(-rc));
		return -EIO;
	}
	char *nl = memchr(data, '\n', n);
	if (nl == NULL && n == TEU_BEARER_FILE_READ) {
		memset(data, 0, n);
		g_free(data);
		g_snprintf(why, whylen, "%s: the first line is longer than %d bytes", path, TEU_BEARER_FILE_READ);
		return -EINVAL;
	}
	char *tok = g_strstrip(g_strndup(data, nl ? (gsize)(nl - data) : n));
	size_t tl = strlen(tok);
	bool ok = tl > 0 && tl <= TEU_BEARER_MAX &&
		  strspn(tok, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/=") == tl;
	if (ok) {
		teu_bearer_set(b, tok, tl);
		*weak = tl < TEU_BEARER_WEAK;
	} else {
		g_snprintf(why, whylen, "%s: the first line must be a token of letters, digits and -._~+/= (at most %d)",
			   path, TEU_BEARER_MAX);
	}
	memset(data, 0, n);
	memset(tok, 0, tl);
	g_free(data);
	g_free(tok);
	return ok ? 0 : -EINVAL;
}

/* NULL when a request with this Authorization header (NULL: none) may go
 * on, else why not (for the log, never the token). The header's token is
 * compared through its SHA-256 with every byte looked at, so neither the
 * time taken nor an early exit tells a client how much of a guess was
 * right, nor the token's length. */
const char *teu_bearer_refuse(const teu_bearer *b, const char *authorization)
{
	if (!b->on)
		return NULL;
	if (authorization == NULL)
		return "no Authorization header";
	if (g_ascii_strncasecmp(authorization, "Bearer ", 7) != 0)
		return "not a Bearer token";
	const char *t = authorization + 7;
	while (*t == ' ')
		t++;
	guint8 sum[32];
	unsigned diff = 0;
	teu_bearer__sha256(t, strlen(t), sum);
	for (int i = 0; i < 32; i++)
		diff |= (unsigned)(sum[i] ^ b->sum[i]);
	return diff == 0 ? NULL : "wrong token";
}

void teu_bearer_clear(teu_bearer *b)
{
	explicit_bzero(b->sum, sizeof b->sum);
	b->on = false;
}
