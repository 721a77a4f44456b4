/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The HTTP client of the metadata plugins (util/teu-http.h),
 * replaced: requests are answered from a queue of canned replies taken from
 * the fuzz input, so the plugin's handling of what a store answers runs
 * without a network. A reply is a status byte (an index into `statuses`)
 * and a body up to the next NUL byte. An empty queue is a refused connection.
 */
#ifndef TE_FUZZ_HTTP_H
#define TE_FUZZ_HTTP_H

#include <errno.h>
#include <glib.h>

#include "teu-http.h"
#include "fuzz.h"

static const int statuses[] = { 200, 404, 400, 500, 503, 401, 403, 200, 301, 204 };
static const uint8_t *replies;
static size_t replies_left;
static int requests; /* bounds the plugin's retries */

static void fuzz_http_queue(const uint8_t *data, size_t size)
{
	replies = data;
	replies_left = size;
	requests = 0;
}

teu_http *teu_http_new(const teu_http_opts *opts, char **err)
{
	(void)opts;
	(void)err;
	return (teu_http *)g_malloc(1);
}

void teu_http_free(teu_http *c)
{
	g_free(c);
}

int teu_http_request(teu_http *c, const char *method, const char *url, const char *content_type,
		    const void *body, size_t len, const char *auth, int timeout_ms, teu_http_reply *reply,
		    char **err)
{
	(void)c;
	(void)content_type;
	(void)auth;
	(void)timeout_ms;
	FUZZ_CHECK(method != NULL && url != NULL && (body != NULL || len == 0));
	memset(reply, 0, sizeof *reply);
	if (replies_left == 0 || ++requests > 64) {
		if (err)
			*err = g_strdup("connection refused (no more canned replies)");
		return -ECONNREFUSED;
	}
	reply->status = statuses[replies[0] % G_N_ELEMENTS(statuses)];
	replies++;
	replies_left--;
	const uint8_t *end = memchr(replies, 0, replies_left);
	size_t n = end ? (size_t)(end - replies) : replies_left;
	/* The real client hands back a NUL-terminated g_malloc()ed body. */
	reply->body = g_malloc(n + 1);
	memcpy(reply->body, replies, n);
	reply->body[n] = '\0';
	reply->len = n;
	replies += end ? n + 1 : n;
	replies_left -= end ? n + 1 : n;
	return 0;
}

void teu_http_reply_clear(teu_http_reply *reply)
{
	g_free(reply->body);
	reply->body = NULL;
	reply->len = 0;
}

char *teu_http_read_secret(const char *path, char **err)
{
	char *text = NULL;
	if (!g_file_get_contents(path, &text, NULL, NULL)) {
		if (err)
			*err = g_strdup("cannot read the file");
		return NULL;
	}
	return text;
}

void teu_http_secret_free(char *secret)
{
	g_free(secret);
}

#endif
