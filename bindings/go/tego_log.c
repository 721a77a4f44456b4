/* SPDX-License-Identifier: Apache-2.0 */
/* The C side of SetLogHandler: libte's log callback, forwarded to Go. */
#include "_cgo_export.h"

void tego_log_trampoline(int level, const char *domain, const char *msg, void *user)
{
	(void)user;
	tegoLog(level, (char *)domain, (char *)msg);
}
