/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The strings a user hands libte: metadata connection strings
 * (te_metadata_open(): the scheme check, P2PHANDSHAKE; no plugin is loaded,
 * so every store scheme ends in "no plugin serves it"), segment names as
 * host:port (te_split_host_port()), metadata keys, numbers of options
 * (te_parse_u64()) and TE_BIND_ADDRESS (parse_bind_address() of rpc.c and
 * choose_bind_address() of engine.c, both compiled in, with the value as an
 * engine option). The input is cut at NUL bytes: the first part goes to
 * every parser, a second part is the engine's published address.
 */
#include "../../libte/engine.c"
#include "../../libte/metadata.c"
#include "../../libte/rpc.c"

#include "fuzz.h"

static void host_port(const char *s)
{
	char *host = (char *)1;
	int port = 0;

	if (te_split_host_port(s, &host, &port) < 0) {
		FUZZ_CHECK(host == NULL);
		return;
	}
	FUZZ_CHECK(host != NULL && (port == -1 || (port > 0 && port <= 65535)));
	if (port > 0 && *host != '\0') {
		/* Written back the way segment names are written, it reads the same. */
		char *again = strchr(host, ':') ? g_strdup_printf("[%s]:%d", host, port)
						 : g_strdup_printf("%s:%d", host, port);
		char *h2 = NULL;
		int p2 = 0;
		if (strchr(host, ']') == NULL && strchr(host, '[') == NULL) {
			FUZZ_CHECK(te_split_host_port(again, &h2, &p2) == 0);
			FUZZ_CHECK(strcmp(h2, host) == 0 && p2 == port);
		}
		g_free(h2);
		g_free(again);
	}
	g_free(host);
}

static void bind_address(const char *v, const char *published)
{
	te_engine e = { 0 };
	bind_addr ba;

	e.options = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
	g_hash_table_replace(e.options, g_strdup("TE_BIND_ADDRESS"), g_strdup(v));
	int rc = parse_bind_address(&e, &ba);
	FUZZ_CHECK(rc == 0 || rc == -EINVAL);
	if (rc == 0)
		FUZZ_CHECK(ba.family == 0 || ba.family == AF_INET || ba.family == AF_INET6);
	if (rc == 0 && ba.family == 0)
		FUZZ_CHECK(*v == '\0');
	choose_bind_address(&e, published);
	/* Without the option, the published address decides. */
	g_hash_table_remove(e.options, "TE_BIND_ADDRESS");
	choose_bind_address(&e, published);
	const char *chosen = te_engine_option(&e, "TE_BIND_ADDRESS");
	if (chosen != NULL) {
		g_hash_table_replace(e.options, g_strdup("TE_BIND_ADDRESS"), g_strdup(chosen));
		FUZZ_CHECK(parse_bind_address(&e, &ba) == 0); /* what it chose is usable */
	}
	g_hash_table_unref(e.options);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static bool once;
	const uint8_t *rest;
	size_t rest_len;

	if (!once) {
		/* No plugin may load: a store's open() would reach for the
		 * network (redis connects at once). An allow-list naming none
		 * keeps them all out. */
		setenv("TE_PLUGINS", "none", 1);
		te_set_log_handler(fuzz_quiet, NULL);
		te_set_log_level(TE_LOG_TRACE);
		once = true;
	}
	char *s = fuzz_split(data, size, 0, &rest, &rest_len);
	char *published = fuzz_split(rest, rest_len, 0, &rest, &rest_len);

	te_metadata *md = (te_metadata *)1;
	int rc = te_metadata_open(s, &md);
	if (rc == 0) {
		FUZZ_CHECK(strcmp(s, "P2PHANDSHAKE") == 0 && md != NULL);
		te_metadata_close(md);
	} else {
		FUZZ_CHECK(md == NULL && rc < 0);
	}
	host_port(s);
	uint64_t v;
	if (te_parse_u64(s, &v))
		FUZZ_CHECK(*s >= '0' && *s <= '9');
	char key[TE_MAX_NAME + 64];
	int n = te_metadata_segment_key(s, key, sizeof key);
	FUZZ_CHECK(n < 0 || (size_t)n >= sizeof key || strlen(key) == (size_t)n);
	n = te_metadata_rpc_key(s, NULL, 0);
	FUZZ_CHECK(n < 0 || *s != '\0');
	bind_address(s, published);
	free(published);
	free(s);
	return 0;
}
