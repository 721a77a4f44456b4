/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The redis metadata plugin (redis-plugin.c compiled in) against a scripted server:
 *   <connection string> '\n' <op byte> <RESP reply stream>
 * The connection string goes to redis_open() (its URL parsing; a refused one
 * is replaced by a known-good one with a user, a password and a database, so
 * AUTH, SELECT and PING run). redisConnectWithTimeout() is replaced: the
 * first connection is a socketpair whose other end already holds the reply
 * stream and then end of stream, later ones (reconnects) only the end of
 * stream. hiredis parses the stream (RESP) and the plugin checks the
 * replies' types, lengths and SCAN cursors.
 */
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz-host.h"

#include "../../plugins/metadata/redis/redis-plugin.c"

static const uint8_t *script;
static size_t script_len;
static int peer_ends[8];
static int npeer;

/* The plugin's connection: a socketpair, the server side scripted. */
redisContext *redisConnectWithTimeout(const char *ip, int port, const struct timeval tv)
{
	int sv[2];

	(void)ip;
	(void)port;
	(void)tv;
	if (npeer >= (int)G_N_ELEMENTS(peer_ends) ||
	    socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
		redisContext *c = redisConnectFd(-1);
		return c;
	}
	fuzz_send_all(sv[1], sv[0], script, script_len, 1 << 20);
	script_len = 0;
	/* End of stream after the script; the end stays open for the
	 * commands the plugin writes. */
	shutdown(sv[1], SHUT_WR);
	peer_ends[npeer++] = sv[1];
	return redisConnectFd(sv[0]);
}

/* TCP keep-alive has no meaning on a socketpair (hiredis would mark the
 * context failed): accepted without effect. */
int redisEnableKeepAlive(redisContext *c)
{
	(void)c;
	return REDIS_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *rest;
	size_t rest_len;
	void *ctx = NULL;

	if (size > (1u << 19))
		return 0;
	if (fuzz_config_table[0] == NULL) {
		fuzz_config_table[0] = "TE_REDIS_TIMEOUT_MS";
		fuzz_config_table[1] = "10";
	}
	char *conn = fuzz_split(data, size, '\n', &rest, &rest_len);
	uint8_t op = rest_len > 0 ? rest[0] : 0;
	script = rest_len > 0 ? rest + 1 : rest;
	script_len = rest_len > 0 ? rest_len - 1 : 0;
	npeer = 0;

	int rc = redis_open(&fuzz_host, conn, &ctx);
	if (rc < 0 && ctx == NULL && npeer == 0) /* refused before connecting */
		rc = redis_open(&fuzz_host, "redis://te:secret@127.0.0.1:6379/3", &ctx);
	if (rc == 0) {
		FUZZ_CHECK(ctx != NULL);
		const char *key = "mooncake/ram/10.0.0.1:15123";
		switch (op % 4) {
		case 0: {
			char *value = NULL;
			size_t len = 0;
			rc = redis_get(ctx, key, &value, &len);
			fuzz_check_value(rc, value, len);
			break;
		}
		case 1: {
			char **keys = NULL;
			size_t n = 0;
			rc = redis_list(ctx, "mooncake/", &keys, &n);
			/* Sorted, without duplicates, all under the prefix. */
			for (size_t i = 0; rc == 0 && i < n; i++) {
				FUZZ_CHECK(keys[i] != NULL && g_str_has_prefix(keys[i], "mooncake/"));
				FUZZ_CHECK(i == 0 || strcmp(keys[i - 1], keys[i]) < 0);
			}
			for (size_t i = 0; rc == 0 && i < n; i++)
				free(keys[i]);
			free(keys);
			break;
		}
		case 2:
			rc = redis_put(ctx, key, "{}", 2, 0);
			break;
		default:
			rc = redis_remove(ctx, key);
			break;
		}
		FUZZ_CHECK(rc <= 0);
		redis_close(ctx);
	} else {
		FUZZ_CHECK(ctx == NULL);
	}
	for (int i = 0; i < npeer; i++)
		close(peer_ends[i]);
	free(conn);
	return 0;
}
