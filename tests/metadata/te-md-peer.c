/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A target engine in its own process, driven over stdin/stdout by the
 * metadata tests:
 *   te-md-peer CONN NAME SIZE SEED [TRANSPORT]
 * creates an engine on metadata store CONN named NAME (reached at
 * 127.0.0.1), installs TRANSPORT (default tcp), registers SIZE bytes filled
 * with pattern SEED for remote access, prints "READY <rpc port>" and obeys:
 *   check SEED         → "OK" when the first buffer holds pattern SEED, else "BAD <offset>"
 *   register SIZE SEED → registers a second buffer with that pattern, "REG"
 *   quit (or EOF)      → destroys the engine (removing its keys), "BYE", exit 0
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <te/te.h>

#include "../common/check.h"

static void out(const char *fmt, const char *a)
{
	printf(fmt, a);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	te_engine *e = NULL;
	te_option opts[2] = { { "ip_or_host_name", "127.0.0.1" }, { "transports", argc > 5 ? argv[5] : "tcp" } };
	char line[256];

	if (argc < 5) {
		fprintf(stderr, "usage: te-md-peer CONN NAME SIZE SEED [TRANSPORT]\n");
		return 2;
	}
	size_t size = strtoull(argv[3], NULL, 0);
	unsigned seed = (unsigned)strtoul(argv[4], NULL, 0);
	unsigned char *buf = NULL, *buf2 = NULL;
	if (size == 0 || posix_memalign((void **)&buf, 4096, size) != 0) {
		fprintf(stderr, "te-md-peer: bad size %s\n", argv[3]);
		return 2;
	}
	fill_pattern(buf, size, seed);
	int rc = te_engine_create(argv[1], argv[2], opts, 2, &e);
	if (rc != 0) {
		fprintf(stderr, "te-md-peer: engine on %s: %s\n", argv[1], te_strerror(rc));
		out("FAIL %s\n", te_strerror(rc));
		return 1;
	}
	rc = te_register_memory(e, buf, size, "cpu:0", TE_MEM_REMOTE_ACCESS);
	if (rc != 0) {
		fprintf(stderr, "te-md-peer: register: %s\n", te_strerror(rc));
		out("FAIL %s\n", te_strerror(rc));
		te_engine_destroy(e);
		return 1;
	}
	printf("READY %d\n", te_engine_rpc_port(e));
	fflush(stdout);

	while (fgets(line, sizeof line, stdin) != NULL) {
		unsigned long long a = 0, b = 0;
		if (sscanf(line, "check %llu", &a) == 1) {
			unsigned char *want = malloc(size);
			fill_pattern(want, size, (unsigned)a);
			size_t i = 0;
			while (i < size && want[i] == buf[i])
				i++;
			free(want);
			if (i == size) {
				out("OK%s\n", "");
			} else {
				char t[32];
				snprintf(t, sizeof t, "%zu", i);
				out("BAD %s\n", t);
			}
		} else if (sscanf(line, "register %llu %llu", &a, &b) == 2 && buf2 == NULL && a > 0) {
			if (posix_memalign((void **)&buf2, 4096, a) != 0) {
				out("FAIL %s\n", "memory");
				continue;
			}
			fill_pattern(buf2, a, (unsigned)b);
			rc = te_register_memory(e, buf2, a, "cpu:0", TE_MEM_REMOTE_ACCESS);
			out(rc == 0 ? "REG%s\n" : "FAIL %s\n", rc == 0 ? "" : te_strerror(rc));
		} else if (strncmp(line, "quit", 4) == 0) {
			break;
		} else {
			out("FAIL %s\n", "unknown command");
		}
	}
	te_engine_destroy(e);
	free(buf);
	free(buf2);
	out("BYE%s\n", "");
	return 0;
}
