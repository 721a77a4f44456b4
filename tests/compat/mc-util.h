/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers of the programs written against Mooncake's C API
 * (transfer_engine_c.h): that header and standard C only, so that they build
 * against an installed copy too. */
#ifndef TE_TEST_MC_UTIL_H
#define TE_TEST_MC_UTIL_H

#include <transfer_engine_c.h>

#include "../common/check.h"
#include "../common/clock.h"

/* Polls the batch's first n tasks until none is WAITING or PENDING (Mooncake
 * programs poll the same way). Returns STATUS_COMPLETED when all completed,
 * else the first other final state; -1 on a status error or after 20 s. */
static inline int wait_tasks(transfer_engine_t e, batch_id_t b, size_t n)
{
	long long end = now_ms() + 20000;
	int result = STATUS_COMPLETED;

	for (size_t i = 0; i < n; i++) {
		transfer_status_t st;
		for (;;) {
			if (getTransferStatus(e, b, i, &st) != 0)
				return -1;
			if (st.status != STATUS_WAITING && st.status != STATUS_PENDING)
				break;
			if (now_ms() > end)
				return -1;
			sleep_ms(1);
		}
		if (st.status != STATUS_COMPLETED && result == STATUS_COMPLETED)
			result = st.status;
	}
	return result;
}

/* The end of an engine of a test: the buffer it registered unregistered
 * (checked), then the engine destroyed. */
static inline void mc_engine_down(transfer_engine_t e, void *buf)
{
	CHECK_EQ(unregisterLocalMemory(e, buf), 0);
	destroyTransferEngine(e);
}

#endif
