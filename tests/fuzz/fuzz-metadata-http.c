/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The etcd and HTTP metadata plugins (etcd-plugin.c or http-plugin.c compiled in, chosen
 * by FUZZ_STORE_ETCD / FUZZ_STORE_HTTP), fed from one input:
 *   <connection string> '\n' <op byte> <canned replies (fuzz-http.h)>
 * The connection string goes to the plugin's open() (its URL and endpoint
 * parsing); when it is refused a known-good one is used, so the replies are
 * exercised either way. Then one operation (get, list, put, remove) runs
 * against the replies: etcd's JSON answers (base64 keys and values, counts,
 * error objects) or the HTTP store's statuses and key lists. Whatever the
 * replies, an operation returns 0 or a negative code, and what it hands back
 * is well formed.
 */
#include "fuzz-host.h"
#include "fuzz-http.h"

#if defined(FUZZ_STORE_ETCD)
#include "../../plugins/metadata/etcd/etcd-plugin.c"
#define OPS etcd_ops
#define GOOD_CONN "etcd://127.0.0.1:2379,[::1]:2380"
#elif defined(FUZZ_STORE_HTTP)
#include "../../plugins/metadata/http/http-plugin.c"
#define OPS http_ops
#define GOOD_CONN "http://127.0.0.1:8080/metadata?cluster=a"
#else
#error "define FUZZ_STORE_ETCD or FUZZ_STORE_HTTP"
#endif

static void setup(void)
{
	static bool done;
	if (done)
		return;
	done = true;
	/* Short timeouts: the store's retries must not stall the fuzzer. */
	int i = 0;
	fuzz_config_table[i++] = "TE_ETCD_TIMEOUT_MS";
	fuzz_config_table[i++] = "10";
	fuzz_config_table[i++] = "TE_HTTP_TIMEOUT_MS";
	fuzz_config_table[i++] = "10";
	fuzz_config_table[i] = NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *rest;
	size_t rest_len;
	void *ctx = NULL;

	setup();
	char *conn = fuzz_split(data, size, '\n', &rest, &rest_len);
	fuzz_http_queue(NULL, 0); /* open() must not need the network */
	if (OPS.open(&fuzz_host, conn, &ctx) < 0) {
		FUZZ_CHECK(ctx == NULL);
		FUZZ_CHECK(OPS.open(&fuzz_host, GOOD_CONN, &ctx) == 0);
	}
	FUZZ_CHECK(ctx != NULL);
	uint8_t op = rest_len > 0 ? rest[0] : 0;
	fuzz_http_queue(rest_len > 0 ? rest + 1 : rest, rest_len > 0 ? rest_len - 1 : 0);

	const char *key = "mooncake/ram/10.0.0.1:15123";
	int rc;
	switch (op % 4) {
	case 0: {
		char *value = (char *)1;
		size_t len = 12345;
		rc = OPS.get(ctx, key, &value, &len);
		fuzz_check_value(rc, value, len);
		break;
	}
	case 1: {
		char **keys = (char **)1;
		size_t n = 12345;
		rc = OPS.list(ctx, "mooncake/", &keys, &n);
		if (rc == 0) {
			FUZZ_CHECK(n == 0 || keys != NULL);
			for (size_t i = 0; i < n; i++) {
				FUZZ_CHECK(keys[i] != NULL && g_str_has_prefix(keys[i], "mooncake/"));
				free(keys[i]);
			}
			free(keys);
		}
		break;
	}
	case 2:
		rc = OPS.put(ctx, key, "{\"name\":\"x\"}", 12, 0);
		break;
	default:
		rc = OPS.remove(ctx, key);
		break;
	}
	FUZZ_CHECK(rc <= 0);
	fuzz_http_queue(NULL, 0);
	OPS.close(ctx);
	free(conn);
	return 0;
}
