/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A small blocking HTTP client for the metadata plugins (etcd, http), built on
 * libsoup 3. A request runs on its caller's thread with libsoup's synchronous
 * API, so any number of threads may issue requests at once on one client
 * (its session shares connections between them), and every request is
 * bounded by its own timeout: the client's watchdog thread cancels it and
 * shuts its socket down, whatever phase it is in.
 */
#ifndef TEU_HTTP_H
#define TEU_HTTP_H

#include <stddef.h>

typedef struct teu_http teu_http;

typedef struct teu_http_opts {
	size_t max_reply;      /* largest reply body accepted (bytes) */
	unsigned max_conns;    /* connections per host kept by the session */
	const char *ca_file;   /* PEM file of trusted CAs for https, or NULL */
	const char *cert_file; /* PEM client certificate offered to https servers, or NULL */
	const char *key_file;  /* its private key (NULL: in cert_file) */
} teu_http_opts;

/* Starts the client. On failure returns NULL and writes why to `err`
 * (g_free()d by the caller). */
teu_http *teu_http_new(const teu_http_opts *opts, char **err);
/* Stops the watchdog and closes the connections. No request may be in
 * progress. */
void teu_http_free(teu_http *c);

typedef struct teu_http_reply {
	int status;   /* HTTP status */
	char *body;   /* g_malloc()ed, NUL-terminated (may hold NULs before) */
	size_t len;
} teu_http_reply;

/*
 * One request: `method` to `url` with an optional body and, when `auth` is
 * not NULL, that value in an Authorization header. Returns 0 when a
 * response arrived (any status; see reply->status), else a negative errno:
 * -ETIMEDOUT (the text names the phase: while connecting, during the TLS
 * handshake, waiting for the reply), -ECONNREFUSED, -EHOSTUNREACH (name did
 * not resolve), -EMSGSIZE (reply larger than max_reply), -EINVAL (bad URL),
 * -EPROTO (TLS or HTTP framing), -EIO (other). `*err` (may be NULL) receives a g_malloc()ed
 * description of a failure. reply->body is g_free()d by the caller.
 */
int teu_http_request(teu_http *c, const char *method, const char *url, const char *content_type,
		    const void *body, size_t len, const char *auth, int timeout_ms, teu_http_reply *reply,
		    char **err);

/* Reads a secret (a token, a password) from the first line of `path`:
 * surrounding white space dropped, at most 4096 bytes. NULL with `*err` set
 * when the file cannot be read or holds no secret. The caller frees it with
 * teu_http_secret_free(). */
char *teu_http_read_secret(const char *path, char **err);
/* Overwrites and frees a secret. */
void teu_http_secret_free(char *secret);

/* Frees reply->body and clears it. */
void teu_http_reply_clear(teu_http_reply *reply);

#endif
