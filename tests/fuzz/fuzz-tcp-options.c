/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The TCP transport's configuration and a peer's TCP descriptor fields
 * (tcp-plugin.c compiled in):
 *   <value> '\n' <descriptor JSON>
 * The value is given to every TE_TCP_* option at once (read_config(): each
 * result must land inside its documented range), and is parsed as a bind
 * address (parse_bind()) and as TE_TCP_RAILS (resolve_rails(), against this
 * host's interfaces). The descriptor goes to parse_descriptor(): the data
 * port, the protocol version and tcp_data_addresses, which a peer chooses.
 */
#include "../../plugins/transport/tcp/tcp-plugin.c"

#include "fuzz-host.h"

static const char *const option_names[] = {
	"TE_TCP_THREADS", "TE_TCP_CONNS_PER_PEER", "TE_TCP_SLICE_SIZE", "TE_TCP_QUEUE_DEPTH",
	"TE_TCP_WINDOW", "TE_TCP_TIMEOUT_MS", "TE_TCP_CONNECT_TIMEOUT_MS", "TE_TCP_SOCKBUF",
	"TE_TCP_MAX_INBOUND", "TE_TCP_MAX_PER_PEER", "TE_TCP_PORT", "TE_TCP_PROTO",
	"TE_TCP_BIND_ADDRESS", "TE_TCP_RAILS",
};

static void config(const char *v)
{
	tcp_config cfg;
	size_t i = 0;

	for (size_t k = 0; k < G_N_ELEMENTS(option_names); k++) {
		fuzz_config_table[i++] = option_names[k];
		fuzz_config_table[i++] = v;
	}
	fuzz_config_table[i] = NULL;
	memset(&cfg, 0, sizeof cfg);
	read_config(&fuzz_host, &cfg);
	FUZZ_CHECK(cfg.threads >= 1 && cfg.threads <= 64);
	FUZZ_CHECK(cfg.conns_per_peer >= 1 && cfg.conns_per_peer <= TCP_MAX_CONNS_PER_PEER);
	FUZZ_CHECK(cfg.depth >= 1 && cfg.depth <= 65536 && (cfg.depth & (cfg.depth - 1)) == 0);
	FUZZ_CHECK(cfg.slice >= 4096 && cfg.window >= 4096);
	FUZZ_CHECK(cfg.timeout_ms >= 100 && cfg.connect_timeout_ms >= 100);
	FUZZ_CHECK(cfg.port <= 65535 && (cfg.proto == 1 || cfg.proto == 2));
	FUZZ_CHECK(cfg.max_inbound >= 1 && cfg.max_per_peer >= 1);
	FUZZ_CHECK(memchr(cfg.bind, '\0', sizeof cfg.bind) != NULL);
	fuzz_config_table[0] = NULL;
}

static void bind_and_rails(tcp_ctx *c, const char *v)
{
	struct sockaddr_storage ss;
	socklen_t len = 0;

	if (parse_bind(v, &ss, &len, 15000) == 0)
		FUZZ_CHECK((ss.ss_family == AF_INET && len == sizeof(struct sockaddr_in)) ||
			   (ss.ss_family == AF_INET6 && len == sizeof(struct sockaddr_in6)));
	g_strlcpy(c->cfg.rails, v, sizeof c->cfg.rails);
	c->nrails = 0;
	int rc = resolve_rails(c);
	FUZZ_CHECK(rc <= 0 && c->nrails <= TCP_MAX_RAILS);
	for (unsigned i = 0; i < c->nrails; i++) {
		char again[64];
		FUZZ_CHECK(canon_addr(c->rails[i], again, sizeof again) && strcmp(again, c->rails[i]) == 0);
	}
}

static void descriptor(tcp_ctx *c, const char *json)
{
	te_segment_info seg = { .size = sizeof seg, .name = "10.0.0.2:15123", .host = "10.0.0.2",
				.rpc_port = 15123, .protocol = "tcp", .descriptor = json };
	char rails[TCP_MAX_RAILS][64];
	unsigned nrails = 99;
	int port = -1, version = -1;
	bool fence = true, sg = true;

	int rc = parse_descriptor(c, &seg, &port, &version, &fence, &sg, rails, &nrails);
	FUZZ_CHECK(rc <= 0 && (version == 1 || version == 2));
	FUZZ_CHECK(rc != -EINVAL || (!fence && !sg));
	FUZZ_CHECK(rc < 0 ? port == 0 : port > 0 && port <= 65535);
	if (rc != -EINVAL) {
		FUZZ_CHECK(nrails <= TCP_MAX_RAILS);
		for (unsigned i = 0; i < nrails; i++) {
			char again[64];
			FUZZ_CHECK(canon_addr(rails[i], again, sizeof again));
			for (unsigned k = 0; k < i; k++)
				FUZZ_CHECK(strcmp(rails[k], rails[i]) != 0);
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *rest;
	size_t rest_len;
	tcp_ctx c;

	memset(&c, 0, sizeof c);
	c.host = &fuzz_host;
	char *v = fuzz_split(data, size, '\n', &rest, &rest_len);
	char *json = fuzz_str(rest, rest_len);
	config(v);
	bind_and_rails(&c, v);
	descriptor(&c, json);
	free(json);
	free(v);
	return 0;
}
