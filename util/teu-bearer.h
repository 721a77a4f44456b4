/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The server's side of a bearer token, for the HTTP servers libte ships: the
 * Prometheus exporter (TE_METRICS_TOKEN_FILE) and te-metadata-server
 * (--token-file). One rule for both, so a token file that one accepts the
 * other accepts too: the token is the file's first line, white space around
 * it dropped, 1 to TEU_BEARER_MAX characters of letters, digits and -._~+/=
 * (what may follow "Bearer " in an Authorization header, RFC 6750). Only its
 * SHA-256 is kept; the file's bytes are overwritten before they are freed.
 * The file is read only when no one but this user and root could have
 * written it (teu-secret-file.h): a token anyone could plant, anyone holds.
 * Needs GLib (GChecksum).
 */
#ifndef TEU_BEARER_H
#define TEU_BEARER_H

#include <glib.h>
#include <stdbool.h>
#include <stddef.h>

#define TEU_BEARER_MAX 4096
/* What is read of a token file: its first line must end within it. */
#define TEU_BEARER_FILE_READ 65536
/* Shorter tokens are taken, with a warning: they can be guessed. */
#define TEU_BEARER_WEAK 16

typedef struct teu_bearer {
	bool on;
	guint8 sum[32]; /* SHA-256 of the token */
} teu_bearer;

/* Requires `token` (len bytes) from now on. */
void teu_bearer_set(teu_bearer *b, const char *token, size_t len);

/* Reads the token in `path` into `b`: 0 (and *weak when it is shorter than
 * TEU_BEARER_WEAK), -EIO when the file cannot be read, -EPERM when it is
 * refused (someone else could have written it), -EINVAL when its first line
 * is no token. On an error `why` says why (never the token). */
int teu_bearer_load(teu_bearer *b, const char *path, bool *weak, char *why, size_t whylen);

/* NULL when a request with this Authorization header (NULL: none) may go
 * on, else why not (for the log, never the token). The header's token is
 * compared through its SHA-256 with every byte looked at, so neither the
 * time taken nor an early exit tells a client how much of a guess was
 * right, nor the token's length. */
const char *teu_bearer_refuse(const teu_bearer *b, const char *authorization);

void teu_bearer_clear(teu_bearer *b);

#endif
