/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The RPC socket's frames (docs/wire.md, "RPC frames"), as a peer sends them.
 * rpc.c is compiled in, so its static reader and server are reachable:
 *  1. the bytes go through a socketpair into read_frame(), frame after frame,
 *     until the reader refuses or the stream ends;
 *  2. the same bytes go to serve_conn(), the server's handling of one
 *     connection, with the engine's Notify handler and a Connection handler
 *     registered; whatever it answers must itself be one well-formed frame of
 *     the request's type.
 *  3. the same bytes to serve_conn() of a server that requires peer
 *     authentication (a cluster key): its HELLO parsing, and the reply that
 *     tells a plain frame's sender a key is needed.
 * The writing end is shut after the input, so every read ends at once.
 */
#include "../../libte/rpc.c"

#include "fuzz.h"

static te_engine *engine;
static te_rpc_server server;
static te_auth *key;

/* Stands in for a transport's Connection handler: refuses a body starting
 * with '!', echoes the rest. */
static int connection_handler(void *user, const char *peer, const char *body, size_t len,
			      char **reply, size_t *reply_len)
{
	(void)user;
	(void)peer;
	FUZZ_CHECK(body[len] == '\0');
	if (len > 0 && body[0] == '!')
		return TE_ERR_PROTOCOL;
	*reply = malloc(len + 1);
	memcpy(*reply, body, len + 1);
	*reply_len = len;
	return 0;
}

static void setup(void)
{
	if (engine != NULL)
		return;
	te_set_log_handler(fuzz_quiet, NULL);
	te_set_log_level(TE_LOG_TRACE); /* every log line is formatted */
	engine = g_new0(te_engine, 1);
	engine->name = g_strdup("127.0.0.1:15000");
	g_mutex_init(&engine->desc_lock);
	g_mutex_init(&engine->notify_lock);
	g_queue_init(&engine->notifications);
	g_rw_lock_init(&engine->rpc_lock);
	engine->desc_cache = g_strdup("{\"buffers\":[],\"name\":\"127.0.0.1:15000\",\"protocol\":\"tcp\","
				      "\"tcp_data_port\":15001,\"tcp_proto_version\":2,"
				      "\"timestamp\":\"2026-01-01 00:00:00.000000\"}");
	engine->handlers[TE_RPC_CONNECTION] = (te_rpc_handler_slot){ connection_handler, NULL, NULL };
	engine->handlers[TE_RPC_NOTIFY] = (te_rpc_handler_slot){ te_notify_rpc, engine, engine };
	server.engine = engine;
	server.fd = server.wake_fd = -1;
	server.max_per_peer = MAX_PER_PEER;
	g_mutex_init(&server.lock);
	server.active = g_hash_table_new(NULL, NULL);
	server.per_peer = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);

	char *path = NULL;
	int fd = g_file_open_tmp("te-fuzz-key-XXXXXX", &path, NULL);
	FUZZ_CHECK(fd >= 0);
	FUZZ_CHECK(write(fd, "0123456789abcdef0123456789abcdef\n", 33) == 33);
	close(fd);
	FUZZ_CHECK(te_auth_load(path, &key) == 0);
	unlink(path);
	g_free(path);
}

/* A connected pair whose sv[0] end holds the input, then end of stream. */
static void feed(const uint8_t *data, size_t size, int sv[2])
{
	FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	/* Room for the whole input: a Unix socket's buffer is smaller than
	 * some inputs libFuzzer may try. */
	int big = 1 << 20;
	setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
	setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
	FUZZ_CHECK(te_fd_write(sv[1], data, size, te_now_ms() + 5000) == 0);
	shutdown(sv[1], SHUT_WR);
}

static void read_frames(const uint8_t *data, size_t size)
{
	int sv[2];

	feed(data, size, sv);
	for (int i = 0; i < 64; i++) {
		int type = -2;
		char *body = NULL;
		size_t len = 0;
		int rc = read_frame(sv[0], &type, &body, &len, te_now_ms() + 5000, "fuzz:1");
		if (rc < 0) {
			FUZZ_CHECK(body == NULL);
			break;
		}
		FUZZ_CHECK(type >= -1 && type <= TE_RPC_PROBE);
		FUZZ_CHECK(len <= te_rpc_max_frame() && body[len] == '\0');
		g_free(body);
	}
	close(sv[0]);
	close(sv[1]);
}

static void serve(const uint8_t *data, size_t size, bool authed)
{
	int sv[2];

	feed(data, size, sv);
	conn_job *job = g_new0(conn_job, 1);
	job->fd = sv[0];
	g_strlcpy(job->peer, "127.0.0.2:40000", sizeof job->peer);
	teu_hostport_host(job->peer, job->host, sizeof job->host);
	g_mutex_lock(&server.lock);
	g_hash_table_insert(server.active, GINT_TO_POINTER(job->fd), GINT_TO_POINTER(job->fd));
	peer_count(&server, job->host, +1);
	g_mutex_unlock(&server.lock);
	serve_conn(job, &server); /* closes sv[0] */
	FUZZ_CHECK(g_hash_table_size(server.active) == 0 && g_hash_table_size(server.per_peer) == 0);

	/* The reply, if any: exactly one frame, of the request's type. */
	uint64_t n;
	unsigned char first = 0;
	int req_type = -1;
	if (size >= 9) {
		memcpy(&n, data, 8);
		n = le64toh(n);
		first = data[8];
		req_type = first <= TE_RPC_PROBE ? first : -1;
	}
	int type = -2;
	char *body = NULL;
	size_t len = 0;
	if (authed && size >= 8 && memcmp(data, "TE-AUTH", 8) == 0) {
		/* A HELLO: the challenge follows, not a frame; the proof in
		 * the input cannot match a fresh nonce. */
	} else if (read_frame(sv[1], &type, &body, &len, te_now_ms() + 5000, "server") == 0) {
		FUZZ_CHECK(size >= 9 || (authed && size >= 8));
		FUZZ_CHECK(type == req_type || (authed && type == -1));
		if (authed) /* a plain frame only learns that a key is needed */
			FUZZ_CHECK(strcmp(body, TE_AUTH_REQUIRED_REPLY) == 0);
		char extra;
		FUZZ_CHECK(recv(sv[1], &extra, 1, MSG_DONTWAIT) == 0); /* nothing after it */
		g_free(body);
	}
	close(sv[1]);
	te_notify_clear(engine);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > (1u << 20))
		return 0;
	setup();
	read_frames(data, size);
	serve(data, size, false);
	engine->auth = key;
	serve(data, size, true);
	engine->auth = NULL;
	return 0;
}
