/* SPDX-License-Identifier: Apache-2.0 */
/* A tcp-peer target in a process of its own, its log in a file, and the
 * check that a real initiator is still served by it: for tests that attack a
 * target and then prove it survived. */
#ifndef TE_TEST_PEER_TARGET_H
#define TE_TEST_PEER_TARGET_H

#include <stdbool.h>

#include "tcp-test.h"

#define TBYTES (4u << 20) /* the target's memory */
#define SEED 7u           /* its pattern */

typedef struct target {
	child c;
	char name[128];
	uint64_t addr;
	int data_port;
	int rpc_port;
} target;

/* Starts `peer_bin target` with `env` (NULL-terminated, may be NULL) added;
 * its stderr (the log) is appended to `log`. */
static inline void peer_target_start(target *t, const char *peer_bin, char *const env[],
				     const char *log)
{
	char env_port[48];
	char *full[16];
	size_t n = 0;

	t->data_port = te_test_free_port();
	REQUIRE(t->data_port > 0);
	snprintf(env_port, sizeof env_port, "TE_TCP_PORT=%d", t->data_port);
	full[n++] = env_port;
	for (size_t i = 0; env != NULL && env[i] != NULL && n < 15; i++)
		full[n++] = env[i];
	full[n] = NULL;
	char *av[] = { "/bin/sh", "-c", "exec \"$0\" target 127.0.0.1 \"$1\" \"$2\" 2>>\"$3\"", (char *)peer_bin,
		       "4194304", "7", (char *)log, NULL };
	REQUIRE(child_start(&t->c, av, full));
	const char *rest = child_expect(&t->c, "READY ", 20000);
	REQUIRE(rest != NULL);
	unsigned long long a;
	REQUIRE(sscanf(rest, "%127s %llu", t->name, &a) == 2);
	t->addr = a;
	const char *colon = strrchr(t->name, ':');
	REQUIRE(colon != NULL);
	t->rpc_port = atoi(colon + 1);
}

/* The file's first 64 KiB hold `needle`; says what they hold when not. */
static inline bool log_has(const char *path, const char *needle)
{
	static char buf[1 << 16];
	if (read_text(path, buf, sizeof buf) < 0)
		return false;
	bool r = strstr(buf, needle) != NULL;
	if (!r)
		fprintf(stderr, "  (%s lacks \"%s\"; it holds: %.600s)\n", path, needle, buf);
	return r;
}

/* Opens the target with `e`, writes a pattern, reads it back and the
 * target's own pattern; true when every byte is right. */
static inline bool peer_target_transfers(te_engine *e, const target *t, unsigned seed)
{
	te_segment_id seg = te_segment_open(e, t->name);
	if (seg < 0) {
		fprintf(stderr, "  open %s: %s\n", t->name, te_strerror(seg));
		return false;
	}
	enum { N = 65536 };
	unsigned char *buf = map_buf(4 * N);
	bool ok = te_register_memory(e, buf, 4 * N, "cpu:0", 0) == 0;
	te_task_status st = { 0 };
	unsigned char *want = malloc(TBYTES);
	REQUIRE(want != NULL);
	fill_pattern(want, TBYTES, SEED);
	ok = ok && run_one(e, TE_OP_READ, seg, buf, t->addr + TBYTES - N, N, &st) == TE_TASK_COMPLETED;
	ok = ok && memcmp(buf, want + TBYTES - N, N) == 0;
	fill_pattern(buf + N, N, seed);
	ok = ok && run_one(e, TE_OP_WRITE, seg, buf + N, t->addr + 4096, N, &st) == TE_TASK_COMPLETED;
	ok = ok && run_one(e, TE_OP_READ, seg, buf + 2 * N, t->addr + 4096, N, &st) == TE_TASK_COMPLETED;
	ok = ok && memcmp(buf + N, buf + 2 * N, N) == 0;
	if (!ok)
		fprintf(stderr, "  transfer failed: state %d, %s\n", st.state, te_strerror(st.error));
	te_unregister_memory(e, buf);
	te_segment_close(e, seg);
	munmap(buf, 4 * N);
	free(want);
	return ok;
}

#endif
