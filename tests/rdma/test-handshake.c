/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Connection handshake in Mooncake's format, both ways:
 *  - as responder: raw frames to an engine's RPC port get replies with the
 *    right fields (its NIC path, QP numbers, LID, GID), ready_ack is
 *    answered, a repeated handshake replaces the endpoint, an old-style frame
 *    (no type byte) is served; bad requests get reply_msg, malformed ones a
 *    closed connection and a log line;
 *  - as initiator, against a fake peer that serves a descriptor and records
 *    the Connection frames: the request's JSON, a rejection (reply_msg set)
 *    failing the task cleanly with -ENETUNREACH, an accepted handshake
 *    followed by ready_ack;
 *  - between two engines whose QP counts differ: the peer rejects, the task
 *    fails cleanly and in bounded time.
 */
#include <json-glib/json-glib.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>

#include "rdma-util.h"

static te_engine *B;

static JsonObject *parse(JsonParser *p, const char *text)
{
	if (text == NULL || !json_parser_load_from_data(p, text, -1, NULL) ||
	    !JSON_NODE_HOLDS_OBJECT(json_parser_get_root(p)))
		return NULL;
	return json_node_get_object(json_parser_get_root(p));
}

/* B's GID of `dev`, from its descriptor. */
static char *gid_of(te_engine *e, const char *dev)
{
	char *d = descriptor_of(e), *out = NULL;
	JsonParser *p = json_parser_new();
	JsonObject *o = parse(p, d);
	JsonArray *a = o ? json_object_get_array_member(o, "devices") : NULL;
	for (guint i = 0; a && i < json_array_get_length(a); i++) {
		JsonObject *x = json_array_get_object_element(a, i);
		if (strcmp(json_object_get_string_member(x, "name"), dev) == 0)
			out = g_strdup(json_object_get_string_member(x, "gid"));
	}
	g_object_unref(p);
	free(d);
	return out;
}

static char *request(const char *local, const char *peer, int nqp, bool ack)
{
	GString *s = g_string_new(NULL);
	g_string_printf(s, "{\"local_nic_path\":\"%s\",\"peer_nic_path\":\"%s\",\"local_lid\":0,"
			   "\"local_gid\":\"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01\",\"qp_num\":[",
			local, peer);
	for (int i = 0; i < nqp; i++)
		g_string_append_printf(s, "%s%d", i ? "," : "", 4001 + i);
	g_string_append_printf(s, "],\"ready_ack\":%s,\"reply_msg\":\"\",\"payload\":\"\"}",
			       ack ? "true" : "false");
	return g_string_free(s, FALSE);
}

static void test_responder(void)
{
	char in[65536], path[256], *req;
	te_rdma_stats st;
	int port = te_engine_rpc_port(B);
	JsonParser *p = json_parser_new();
	JsonObject *o;

	snprintf(path, sizeof path, "%s@mlx5_2", te_engine_name(B));
	req = request("10.9.9.9:4242@mlx5_0", path, 2, false);
	ssize_t r = raw_frame(port, 0, req, in, sizeof in);
	g_free(req);
	REQUIRE(r > 9);
	CHECK_EQ(in[8], 0); /* a Connection reply */
	uint64_t len;
	memcpy(&len, in, 8);
	CHECK_EQ(le64toh(len), (uint64_t)r - 8);
	/* compact, keys sorted, as Mooncake writes them */
	CHECK(strncmp(in + 9, "{\"local_gid\":\"", 14) == 0);
	const char *order[] = { "\"local_gid\"", "\"local_lid\"", "\"local_nic_path\"", "\"payload\"",
				"\"peer_nic_path\"", "\"qp_num\"", "\"ready_ack\"", "\"reply_msg\"" };
	const char *at = in + 9;
	for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
		const char *n = strstr(at, order[i]);
		CHECK(n != NULL);
		at = n ? n : at;
	}
	o = parse(p, in + 9);
	REQUIRE(o != NULL);
	CHECK(strcmp(json_object_get_string_member(o, "local_nic_path"), path) == 0);
	CHECK(strcmp(json_object_get_string_member(o, "peer_nic_path"), "10.9.9.9:4242@mlx5_0") == 0);
	CHECK(strcmp(json_object_get_string_member(o, "reply_msg"), "") == 0);
	CHECK(strcmp(json_object_get_string_member(o, "payload"), "") == 0);
	CHECK(!json_object_get_boolean_member(o, "ready_ack"));
	CHECK_EQ(json_object_get_int_member(o, "local_lid"), 0);
	char *gid = gid_of(B, "mlx5_2");
	CHECK(gid && strcmp(json_object_get_string_member(o, "local_gid"), gid) == 0);
	g_free(gid);
	JsonArray *q = json_object_get_array_member(o, "qp_num");
	CHECK_EQ(json_array_get_length(q), 2);
	CHECK(json_array_get_int_element(q, 0) > 0 && json_array_get_int_element(q, 0) < (1 << 24));
	CHECK(json_array_get_int_element(q, 0) != json_array_get_int_element(q, 1));
	REQUIRE(stats_of(B, &st) == 0);
	CHECK_EQ(st.endpoints[0], 1); /* mlx5_2 */
	CHECK_EQ(st.endpoints_created, 1);

	/* ready_ack: answered, the endpoint stays. */
	req = request("10.9.9.9:4242@mlx5_0", path, 2, true);
	r = raw_frame(port, 0, req, in, sizeof in);
	g_free(req);
	REQUIRE(r > 9);
	o = parse(p, in + 9);
	REQUIRE(o != NULL);
	CHECK(strcmp(json_object_get_string_member(o, "reply_msg"), "") == 0);

	/* The same peer NIC again (it rebuilt its side): replaced, not added. */
	req = request("10.9.9.9:4242@mlx5_0", path, 2, false);
	r = raw_frame(port, 0, req, in, sizeof in);
	REQUIRE(r > 9);
	/* ... also when sent old-style, without the type byte */
	ssize_t r2 = raw_frame(port, -1, req, in, sizeof in);
	g_free(req);
	REQUIRE(r2 > 8);
	CHECK(in[8] == '{'); /* answered the same way: no type byte */
	o = parse(p, in + 8);
	CHECK(o && strcmp(json_object_get_string_member(o, "reply_msg"), "") == 0);
	REQUIRE(stats_of(B, &st) == 0);
	CHECK_EQ(st.endpoints[0], 1);
	CHECK_EQ(st.endpoints_created, 3);

	/* Requests B cannot honour: answered with reply_msg. */
	struct {
		const char *peer;
		int nqp;
		bool ack;
		const char *msg;
	} rej[] = {
		{ "@mlx5_9", 2, false, "no RDMA device mlx5_9" },
		{ "10.1.1.1:1@mlx5_2", 2, false, "this is" },
		{ "@mlx5_2", 3, false, "QP count mismatch: 3 offered, 2 expected here" },
		{ "@mlx5_3", 2, true, "no endpoint for 10.9.9.9:4242@mlx5_0" },
	};
	for (size_t i = 0; i < sizeof rej / sizeof *rej; i++) {
		char peer[256];
		snprintf(peer, sizeof peer, "%s%s", rej[i].peer[0] == '@' ? te_engine_name(B) : "", rej[i].peer);
		req = request("10.9.9.9:4242@mlx5_0", peer, rej[i].nqp, rej[i].ack);
		cap_start();
		r = raw_frame(port, 0, req, in, sizeof in);
		g_free(req);
		REQUIRE(r > 9);
		o = parse(p, in + 9);
		REQUIRE(o != NULL);
		const char *msg = json_object_get_string_member(o, "reply_msg");
		CHECK(strstr(msg, rej[i].msg) != NULL);
		if (strstr(msg, rej[i].msg) == NULL)
			fprintf(stderr, "  reply_msg \"%s\", expected \"%s\"\n", msg, rej[i].msg);
		CHECK(cap_has("rejected"));
	}

	/* Not a handshake at all: closed without a reply, and logged. */
	const char *junk[] = { "not json", "[1,2,3]", "{\"local_nic_path\":5}",
			       "{\"local_nic_path\":\"a@b\",\"peer_nic_path\":\"c@d\",\"qp_num\":[1]}" };
	for (size_t i = 0; i < sizeof junk / sizeof *junk; i++) {
		cap_start();
		CHECK_EQ(raw_frame(port, 0, junk[i], in, sizeof in), 0);
		CHECK(cap_has("Connection frame from 127.0.0.1"));
	}
	REQUIRE(stats_of(B, &st) == 0);
	CHECK_EQ(st.endpoints_created, 3);
	g_object_unref(p);
}

/* ------------------------------------------------------------ a fake peer */

typedef struct fake {
	int fd, port;
	pthread_t th;
	int stop_fd, stop_wr;
	atomic_bool accept; /* answer handshakes with QPs instead of rejecting */
	pthread_mutex_t lock;
	GPtrArray *frames; /* Connection bodies received */
	char gid[48];      /* the GID it claims */
} fake;

static bool read_n(int fd, void *buf, size_t n)
{
	char *p = buf;
	while (n > 0) {
		ssize_t r = recv(fd, p, n, 0);
		if (r <= 0)
			return false;
		p += r;
		n -= (size_t)r;
	}
	return true;
}

static void send_frame(int fd, int type, const char *body)
{
	size_t n = strlen(body);
	uint64_t len = htole64(n + 1);
	unsigned char t = (unsigned char)type;
	if (send(fd, &len, 8, MSG_NOSIGNAL) != 8 || send(fd, &t, 1, MSG_NOSIGNAL) != 1 ||
	    send(fd, body, n, MSG_NOSIGNAL) != (ssize_t)n)
		fprintf(stderr, "fake peer: send failed\n");
}

static void serve(fake *f, int c)
{
	uint64_t len;
	char name[64], *body;
	struct timeval tv = { .tv_sec = 5 };

	setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	if (!read_n(c, &len, 8))
		return;
	len = le64toh(len);
	if (len == 0 || len > (1 << 20))
		return;
	body = calloc(1, len + 1);
	if (!read_n(c, body, len)) {
		free(body);
		return;
	}
	snprintf(name, sizeof name, "127.0.0.1:%d", f->port);
	if (body[0] == 1) { /* Metadata: our descriptor, one device, one buffer */
		char d[2048];
		snprintf(d, sizeof d,
			 "{\"buffers\":[{\"addr\":4096,\"length\":1048576,\"lkey\":[4660],\"name\":\"cpu:0\","
			 "\"rkey\":[4660]}],\"devices\":[{\"gid\":\"%s\",\"lid\":0,\"name\":\"mlx5_9\"}],"
			 "\"name\":\"%s\",\"priority_matrix\":{\"cpu:0\":[[\"mlx5_9\"],[]]},"
			 "\"protocol\":\"rdma\",\"tcp_data_port\":0,\"tcp_proto_version\":2,"
			 "\"timestamp\":\"2026-01-01 00:00:00.000000\"}",
			 f->gid, name);
		send_frame(c, 1, d);
	} else if (body[0] == 0) {
		JsonParser *p = json_parser_new();
		JsonObject *o = parse(p, body + 1);
		pthread_mutex_lock(&f->lock);
		g_ptr_array_add(f->frames, g_strdup(body + 1));
		pthread_mutex_unlock(&f->lock);
		char reply[1024];
		const char *from = o ? json_object_get_string_member(o, "local_nic_path") : "";
		snprintf(reply, sizeof reply,
			 "{\"local_gid\":\"%s\",\"local_lid\":0,\"local_nic_path\":\"%s@mlx5_9\","
			 "\"payload\":\"\",\"peer_nic_path\":\"%s\",\"qp_num\":%s,\"ready_ack\":false,"
			 "\"reply_msg\":\"%s\"}",
			 f->gid, name, from, atomic_load(&f->accept) ? "[16777000,16777001]" : "[]",
			 atomic_load(&f->accept) ? "" : "not today");
		send_frame(c, 0, reply);
		g_object_unref(p);
	}
	free(body);
	shutdown(c, SHUT_WR);
	char sink[64];
	while (recv(c, sink, sizeof sink, 0) > 0)
		;
}

static void *fake_main(void *arg)
{
	fake *f = arg;
	struct pollfd pf[2] = { { .fd = f->fd, .events = POLLIN }, { .fd = f->stop_fd, .events = POLLIN } };
	for (;;) {
		if (poll(pf, 2, 1000) < 0)
			break;
		if (pf[1].revents)
			break;
		if (!(pf[0].revents & POLLIN))
			continue;
		int c = accept(f->fd, NULL, NULL);
		if (c < 0)
			continue;
		serve(f, c);
		close(c);
	}
	return NULL;
}

static void fake_start(fake *f, const char *gid)
{
	int pipefd[2];
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t al = sizeof a;

	memset(f, 0, sizeof *f);
	pthread_mutex_init(&f->lock, NULL);
	f->frames = g_ptr_array_new_with_free_func(g_free);
	g_strlcpy(f->gid, gid, sizeof f->gid);
	f->fd = socket(AF_INET, SOCK_STREAM, 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	REQUIRE(bind(f->fd, (struct sockaddr *)&a, sizeof a) == 0);
	REQUIRE(listen(f->fd, 16) == 0);
	REQUIRE(getsockname(f->fd, (struct sockaddr *)&a, &al) == 0);
	f->port = ntohs(a.sin_port);
	REQUIRE(pipe(pipefd) == 0);
	f->stop_fd = pipefd[0];
	f->stop_wr = pipefd[1];
	pthread_create(&f->th, NULL, fake_main, f);
}

static void fake_stop(fake *f)
{
	if (write(f->stop_wr, "x", 1) != 1)
		fprintf(stderr, "fake peer: cannot stop\n");
	pthread_join(f->th, NULL);
	close(f->fd);
	close(f->stop_fd);
	close(f->stop_wr);
	g_ptr_array_unref(f->frames);
	pthread_mutex_destroy(&f->lock);
}

static size_t frames_with(fake *f, const char *needle)
{
	size_t n = 0;
	pthread_mutex_lock(&f->lock);
	for (guint i = 0; i < f->frames->len; i++)
		n += strstr(g_ptr_array_index(f->frames, i), needle) != NULL;
	pthread_mutex_unlock(&f->lock);
	return n;
}

static void test_initiator(void)
{
	fake f;
	char name[64], want[512];
	te_task_status st;
	/* The fake claims mlx5_3's GID, so accepted QPs route to a real soft
	 * device, where no QP of those numbers exists. */
	fake_start(&f, "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:04");
	te_engine *a = soft_engine("two-socket", "{\"devices\": [\"mlx5_0\"]}");
	REQUIRE(a != NULL);
	unsigned char *buf = buf_new(65536);
	REQUIRE(te_register_memory(a, buf, 65536, "cpu:0", 0) == 0);
	snprintf(name, sizeof name, "127.0.0.1:%d", f.port);
	te_segment_id seg = te_segment_open(a, name);
	REQUIRE(seg > 0);

	/* Rejected: no path to the peer, the task fails with -ENETUNREACH (not
	 * TE_ERR_REJECTED, which would say the range was refused), the reason
	 * logged. */
	cap_start();
	long long t0 = now_ms();
	CHECK_EQ(run_one(a, TE_OP_WRITE, seg, buf, 4096, 4096, &st), TE_TASK_FAILED);
	CHECK_EQ(st.error, -ENETUNREACH);
	CHECK(now_ms() - t0 < 10000);
	CHECK(cap_has("rejected the handshake: not today"));
	REQUIRE(frames_with(&f, "") >= 1);
	pthread_mutex_lock(&f.lock);
	const char *first = g_ptr_array_index(f.frames, 0);
	char *gid = gid_of(a, "mlx5_0");
	snprintf(want, sizeof want,
		 "{\"local_gid\":\"%s\",\"local_lid\":0,\"local_nic_path\":\"%s@mlx5_0\",\"payload\":\"\","
		 "\"peer_nic_path\":\"%s@mlx5_9\",\"qp_num\":[",
		 gid, te_engine_name(a), name);
	CHECK(strncmp(first, want, strlen(want)) == 0);
	if (strncmp(first, want, strlen(want)) != 0)
		fprintf(stderr, "  sent %s\n  want %s...\n", first, want);
	CHECK(strstr(first, "],\"ready_ack\":false,\"reply_msg\":\"\"}") != NULL);
	g_free(gid);
	pthread_mutex_unlock(&f.lock);
	CHECK_EQ(frames_with(&f, "\"ready_ack\":true"), 0);
	te_rdma_stats s;
	REQUIRE(stats_of(a, &s) == 0);
	CHECK(s.handshakes_rejected >= 1);
	/* The rejected path is paused: a retry soon after fails at once. */
	usleep(2100000); /* past the pause, and the per-second log limit */

	/* Accepted: ready_ack follows; the QPs lead nowhere, so the request
	 * is lost and the task fails as unreachable. */
	atomic_store(&f.accept, true);
	cap_start();
	t0 = now_ms();
	CHECK_EQ(run_one(a, TE_OP_WRITE, seg, buf, 4096, 4096, &st), TE_TASK_FAILED);
	CHECK_EQ(st.error, -EHOSTUNREACH);
	CHECK(now_ms() - t0 < 10000);
	CHECK(frames_with(&f, "\"ready_ack\":true") >= 1);
	CHECK(frames_with(&f, "\"ready_ack\":true,\"reply_msg\":\"\"") >= 1);
	CHECK(cap_has("transport retry counter exceeded"));
	te_engine_destroy(a);
	free(buf);
	fake_stop(&f);
}

static void test_qp_mismatch(void)
{
	const char *three[] = { "TE_RDMA_NUM_QP_PER_EP", "3", NULL };
	te_engine *a = soft_engine_v("two-socket", "{\"devices\": [\"mlx5_0\", \"mlx5_1\"]}", three);
	te_task_status st;
	unsigned char *buf, *bb;
	te_segment_id seg = pair_buffers(a, B, 1 << 20, 0, &buf, &bb);
	cap_start();
	long long t0 = now_ms();
	CHECK_EQ(run_one(a, TE_OP_WRITE, seg, buf, (uintptr_t)bb, 1 << 20, &st), TE_TASK_FAILED);
	CHECK_EQ(st.error, -ENETUNREACH);
	CHECK(now_ms() - t0 < 10000);
	CHECK(cap_has("rejected the handshake: QP count mismatch: 3 offered, 2 expected here"));
	te_rdma_stats s;
	REQUIRE(stats_of(a, &s) == 0);
	CHECK(s.handshakes_rejected >= 4); /* every path was tried */
	CHECK_EQ(s.endpoints_created, 0);
	te_engine_destroy(a);
	CHECK_EQ(te_unregister_memory(B, bb), 0);
	free(buf);
	free(bb);
}

int main(void)
{
	find_controls();
	B = soft_engine("two-socket", "{\"devices\": [\"mlx5_2\", \"mlx5_3\"]}");
	REQUIRE(B != NULL);
	TEST_RUN(test_responder);
	TEST_RUN(test_initiator);
	TEST_RUN(test_qp_mismatch);
	te_engine_destroy(B);
	return check_done();
}
