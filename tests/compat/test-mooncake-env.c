/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Mooncake's environment variables, as a program written for its C API sees
 * them (docs/mooncake-compat.md):
 *
 *  - MC_MIN_RPC_PORT / MC_MAX_RPC_PORT bound the RPC port; the older,
 *    misspelt MC_MIN_PRC_PORT / MC_MAX_PRC_PORT count only when those are
 *    unset;
 *  - MC_TCP_BIND_ADDRESS is the address an engine on a metadata store
 *    publishes (argument: te-metadata-server; without it that part is
 *    skipped), and peers reach the engine there.
 */
#define _POSIX_C_SOURCE 200809L
#include <transfer_engine_c.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/clock.h"

static int failures;

#define CHECK(cond)                                                              \
	do {                                                                         \
		if (!(cond)) {                                                           \
			failures++;                                                          \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
		}                                                                        \
	} while (0)

#define REQUIRE(cond)                                                            \
	do {                                                                         \
		if (!(cond)) {                                                           \
			fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
			exit(1);                                                             \
		}                                                                        \
	} while (0)

/* A port nobody listens on now, from a range of its own (below the
 * ephemeral ports, so the kernel hands it to no one else meanwhile). */
static int free_port(int avoid)
{
	for (int tries = 0; tries < 200; tries++) {
		int p = 20000 + (int)(((unsigned)getpid() * 7919u + (unsigned)tries * 104729u) % 10000u);
		if (p == avoid)
			continue;
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		REQUIRE(fd >= 0);
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)p) };
		a.sin_addr.s_addr = htonl(INADDR_ANY);
		int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
		close(fd);
		if (ok)
			return p;
	}
	REQUIRE(!"no free port");
	return -1;
}

/* The port of "host:port" as getLocalIpAndPort() writes it. */
static int engine_port(transfer_engine_t e)
{
	char buf[128];
	REQUIRE(getLocalIpAndPort(e, buf, sizeof buf) == 0);
	const char *c = strrchr(buf, ':');
	REQUIRE(c != NULL);
	return atoi(c + 1);
}

static void port_variables(void)
{
	int p = free_port(0), q = free_port(p);
	char ps[16], qs[16];
	snprintf(ps, sizeof ps, "%d", p);
	snprintf(qs, sizeof qs, "%d", q);

	/* both spellings set: the correct one wins */
	setenv("MC_MIN_PRC_PORT", qs, 1);
	setenv("MC_MAX_PRC_PORT", qs, 1);
	setenv("MC_MIN_RPC_PORT", ps, 1);
	setenv("MC_MAX_RPC_PORT", ps, 1);
	transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 0);
	REQUIRE(e != NULL);
	CHECK(engine_port(e) == p);
	destroyTransferEngine(e);

	/* only the misspelt ones: they still work */
	unsetenv("MC_MIN_RPC_PORT");
	unsetenv("MC_MAX_RPC_PORT");
	e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 0);
	REQUIRE(e != NULL);
	CHECK(engine_port(e) == q);
	destroyTransferEngine(e);
	unsetenv("MC_MIN_PRC_PORT");
	unsetenv("MC_MAX_PRC_PORT");
	fprintf(stderr, "ok   port variables (%d, %d)\n", p, q);
}

static pid_t start_store(const char *exe, int *port)
{
	char pf[64];
	snprintf(pf, sizeof pf, "/tmp/te-mc-env-%d.port", (int)getpid());
	unlink(pf);
	pid_t pid = fork();
	REQUIRE(pid >= 0);
	if (pid == 0) {
		execl(exe, exe, "--listen", "127.0.0.1:0", "--port-file", pf, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 500; i++) {
		FILE *f = fopen(pf, "r");
		if (f != NULL) {
			int ok = fscanf(f, "%d", port) == 1;
			fclose(f);
			if (ok) {
				unlink(pf);
				return pid;
			}
		}
		sleep_ms(20);
	}
	kill(pid, SIGKILL);
	REQUIRE(!"te-metadata-server did not start");
	return -1;
}

static void bind_address(const char *store_exe)
{
	int store_port;
	pid_t store = start_store(store_exe, &store_port);
	char conn[96], where[128];
	snprintf(conn, sizeof conn, "http://127.0.0.1:%d/metadata", store_port);

	/* A publishes 127.0.0.2 (and listens there), not the 127.0.0.1 it was given */
	setenv("MC_TCP_BIND_ADDRESS", "127.0.0.2", 1);
	transfer_engine_t a = createTransferEngine(conn, "mc-env-a", "127.0.0.1", 0, 0);
	unsetenv("MC_TCP_BIND_ADDRESS");
	transfer_engine_t b = createTransferEngine(conn, "mc-env-b", "127.0.0.1", 0, 0);
	REQUIRE(a != NULL && b != NULL);
	REQUIRE(getLocalIpAndPort(a, where, sizeof where) == 0);
	CHECK(strncmp(where, "127.0.0.2:", 10) == 0);
	REQUIRE(getLocalIpAndPort(b, where, sizeof where) == 0);
	CHECK(strncmp(where, "127.0.0.1:", 10) == 0);
	REQUIRE(installTransport(a, "tcp", NULL) != NULL);
	REQUIRE(installTransport(b, "tcp", NULL) != NULL);

	/* B finds A through the store and writes to it at the published address */
	enum { N = 64 * 1024 };
	unsigned char *src = malloc(N), *dst = calloc(1, N);
	REQUIRE(src != NULL && dst != NULL);
	for (size_t i = 0; i < N; i++)
		src[i] = (unsigned char)(i * 131u + 7u);
	CHECK(registerLocalMemory(a, dst, N, "cpu:0", 1) == 0);
	CHECK(registerLocalMemory(b, src, N, "cpu:0", 1) == 0);
	segment_id_t seg = openSegment(b, "mc-env-a");
	CHECK(seg >= 0);
	batch_id_t bid = allocateBatchID(b, 1);
	CHECK(bid != INVALID_BATCH);
	struct transfer_request r = { .opcode = OPCODE_WRITE, .source = src, .target_id = seg,
				      .target_offset = (uint64_t)(uintptr_t)dst, .length = N };
	CHECK(submitTransfer(b, bid, &r, 1) == 0);
	struct transfer_status st = { 0 };
	for (int i = 0; i < 1000; i++) {
		if (getTransferStatus(b, bid, 0, &st) != 0 || st.status == STATUS_COMPLETED ||
		    st.status == STATUS_FAILED)
			break;
		sleep_ms(10);
	}
	CHECK(st.status == STATUS_COMPLETED);
	CHECK(memcmp(src, dst, N) == 0);
	freeBatchID(b, bid);
	closeSegment(b, seg);
	unregisterLocalMemory(b, src);
	unregisterLocalMemory(a, dst);
	destroyTransferEngine(b);
	destroyTransferEngine(a);
	free(src);
	free(dst);
	kill(store, SIGTERM);
	waitpid(store, NULL, 0);
	fprintf(stderr, "ok   MC_TCP_BIND_ADDRESS\n");
}

int main(int argc, char **argv)
{
	unsetenv("TE_MIN_RPC_PORT");
	unsetenv("TE_MAX_RPC_PORT");
	unsetenv("TE_BIND_ADDRESS");
	port_variables();
	if (argc > 1)
		bind_address(argv[1]);
	else
		fprintf(stderr, "skip MC_TCP_BIND_ADDRESS: no te-metadata-server\n");
	if (failures != 0) {
		fprintf(stderr, "%d check(s) failed\n", failures);
		return 1;
	}
	return 0;
}
