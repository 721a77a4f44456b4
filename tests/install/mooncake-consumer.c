/* SPDX-License-Identifier: Apache-2.0 */
/* A program written against Mooncake's C API, built with
 * `pkg-config libte-mooncake` only: it creates an engine on the installed
 * libtransfer_engine, installs the TCP transport from the installed plugins
 * and prints the address it serves on. */
#include <stdio.h>
#include <string.h>

#include <transfer_engine_c.h>

int main(void)
{
	char addr[128];
	transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", NULL, 0, 0);
	if (e == NULL) {
		fprintf(stderr, "mooncake-consumer: createTransferEngine failed\n");
		return 1;
	}
	if (installTransport(e, "tcp", NULL) == NULL) {
		fprintf(stderr, "mooncake-consumer: installTransport(tcp) failed\n");
		destroyTransferEngine(e);
		return 1;
	}
	if (getLocalIpAndPort(e, addr, sizeof addr) != 0 || strncmp(addr, "127.0.0.1:", 10) != 0) {
		fprintf(stderr, "mooncake-consumer: no local address\n");
		destroyTransferEngine(e);
		return 1;
	}
	printf("mooncake engine at %s\n", addr);
	destroyTransferEngine(e);
	return 0;
}
