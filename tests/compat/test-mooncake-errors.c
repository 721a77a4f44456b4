/* SPDX-License-Identifier: Apache-2.0 */
/*
 * compat/mooncake/errors.c, built into this program: libte codes from the
 * start, the middle and the end of their class's list map to that class,
 * classes sharing an error.h code keep their own Status codes, and a code no
 * class lists reads as invalid argument.
 */
#include "mc-internal.h"

#include <errno.h>
#include <stdio.h>

static int failures;

static void expect(int line, int te_rc, int err, int status)
{
	int got_err = to_err("test-mooncake-errors", te_rc);
	int got_status = to_status("test-mooncake-errors", te_rc);

	if (got_err != err || got_status != status) {
		fprintf(stderr, "line %d: libte %d -> %d and status %d, want %d and status %d\n", line, te_rc,
			got_err, got_status, err, status);
		failures++;
	}
}

#define EXPECT(te_rc, err, status) expect(__LINE__, te_rc, err, status)

int main(void)
{
	EXPECT(0, 0, MC_STATUS_CODE_OK);
	EXPECT(3, 3, MC_STATUS_CODE_OK); /* a count passes through */
	EXPECT(TE_ERR_BATCH_FULL, ERR_TOO_MANY_REQUESTS, MC_STATUS_CODE_TOO_MANY_REQUESTS);
	EXPECT(-ENOSPC, ERR_TOO_MANY_REQUESTS, MC_STATUS_CODE_TOO_MANY_REQUESTS);
	EXPECT(-EHOSTDOWN, ERR_SOCKET, MC_STATUS_CODE_SOCKET);
	EXPECT(-EIO, ERR_SOCKET, MC_STATUS_CODE_SOCKET); /* the last of the longest list */
	EXPECT(TE_ERR_NO_TRANSPORT, ERR_DEVICE_NOT_FOUND, MC_STATUS_CODE_NOT_SUPPORTED_TRANSPORT);
	EXPECT(TE_ERR_PLUGIN, ERR_DEVICE_NOT_FOUND, MC_STATUS_CODE_DEVICE_NOT_FOUND);
	EXPECT(-ECANCELED, ERR_CONTEXT, MC_STATUS_CODE_CONTEXT);
	EXPECT(-EDOM, ERR_INVALID_ARGUMENT, MC_STATUS_CODE_INVALID_ARGUMENT); /* listed nowhere */
	if (failures == 0)
		printf("ok\n");
	return failures != 0;
}
