/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te-metadata-server's request handling: raw HTTP/1.1 requests (several may
 * be pipelined) through a socketpair into the server's own handlers,
 * registered on an in-process SoupServer the way its main() registers them
 * (te-metadata-server.c compiled in, its main() renamed). The store has a
 * bearer token for writes ("secret") and public reads, small limits, and no
 * persistence file. libsoup parses the request line and headers; the
 * handlers check the path, the key, the token, the body size and the key
 * count. The server must answer and close once the client's side ends.
 */
#include <sys/socket.h>

#define main te_metadata_server_main
#include "../../tools/te-metadata-server/te-metadata-server.c"
#undef main

#include "fuzz.h"

static server store;
static SoupServer *srv;
static GSocketAddress *local_addr, *remote_addr;

static void setup(void)
{
	if (srv != NULL)
		return;
	store.kv = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, (GDestroyNotify)g_bytes_unref);
	store.expiry = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
	store.path = g_strdup("/metadata");
	store.max_body = 4096;
	store.max_keys = 16;
	store.max_key_len = 256;
	store.public_reads = TRUE;
	teu_bearer_set(&store.token, "secret", 6);
	srv = soup_server_new("server-header", "te-metadata-server", NULL);
	soup_server_add_early_handler(srv, store.path, early_handler, &store, NULL);
	soup_server_add_handler(srv, store.path, store_handler, &store, NULL);
	soup_server_add_handler(srv, "/health", health_handler, &store, NULL);
	soup_server_add_handler(srv, NULL, default_handler, &store, NULL);
	local_addr = g_inet_socket_address_new_from_string("127.0.0.1", 8080);
	remote_addr = g_inet_socket_address_new_from_string("127.0.0.2", 40000);
}

typedef struct client {
	int fd;
	gboolean closed;
	gsize got;
	char first[8]; /* the reply's first bytes */
} client;

static gboolean on_reply(gint fd, GIOCondition cond, gpointer data)
{
	client *c = data;
	char buf[16384];
	ssize_t r;

	(void)cond;
	while ((r = recv(fd, buf, sizeof buf, MSG_DONTWAIT)) > 0) {
		for (ssize_t i = 0; i < r && c->got + (gsize)i < sizeof c->first; i++)
			c->first[c->got + (gsize)i] = buf[i];
		c->got += (gsize)r;
	}
	if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
		c->closed = TRUE;
		return G_SOURCE_REMOVE;
	}
	return G_SOURCE_CONTINUE;
}

static gboolean on_timeout(gpointer data)
{
	*(gboolean *)data = TRUE;
	return G_SOURCE_REMOVE;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int sv[2];

	if (size > 65536)
		return 0;
	setup();
	FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	int big = 1 << 20;
	setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
	setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
	FUZZ_CHECK(size == 0 || send(sv[1], data, size, MSG_NOSIGNAL) == (ssize_t)size);
	shutdown(sv[1], SHUT_WR);

	GSocket *gs = g_socket_new_from_fd(sv[0], NULL);
	FUZZ_CHECK(gs != NULL);
	GSocketConnection *conn = g_socket_connection_factory_create_connection(gs);
	GError *err = NULL;
	FUZZ_CHECK(soup_server_accept_iostream(srv, G_IO_STREAM(conn), local_addr, remote_addr, &err));

	client c = { .fd = sv[1] };
	gboolean late = FALSE;
	guint watch = g_unix_fd_add(sv[1], G_IO_IN | G_IO_HUP | G_IO_ERR, on_reply, &c);
	guint timer = g_timeout_add(5000, on_timeout, &late);
	while (!c.closed && !late)
		g_main_context_iteration(NULL, TRUE);
	if (!c.closed)
		g_source_remove(watch);
	if (!late)
		g_source_remove(timer);
	/* Once the client's side ended, the server must have closed: a stuck
	 * connection would hold a slot forever. */
	FUZZ_CHECK(!late);
	/* What came back, if anything, is an HTTP response. */
	FUZZ_CHECK(c.got == 0 || (c.got >= 7 && memcmp(c.first, "HTTP/1.", 7) == 0));
	/* A complete request for the health check is always answered. */
	if (size >= 24 && memcmp(data, "GET /health HTTP/1.1\r\n\r\n", 24) == 0)
		FUZZ_CHECK(c.got > 0);
	while (g_main_context_iteration(NULL, FALSE))
		;
	g_object_unref(conn);
	g_object_unref(gs);
	close(sv[1]);
	/* The store's limits hold whatever was put. */
	FUZZ_CHECK(g_hash_table_size(store.kv) <= store.max_keys);
	/* Every key with a TTL is a key of the store. */
	FUZZ_CHECK(g_hash_table_size(store.expiry) <= g_hash_table_size(store.kv));
	if (g_hash_table_size(store.kv) >= store.max_keys) {
		g_hash_table_remove_all(store.kv);
		g_hash_table_remove_all(store.expiry);
	}
	return 0;
}
