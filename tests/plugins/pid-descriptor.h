/* SPDX-License-Identifier: Apache-2.0 */
/* For the tests' transports that reach only engines of their own process:
 * the descriptor member `member` holds this process's id; a peer's
 * descriptor that holds the same is one they can serve. */
#ifndef TE_TEST_PID_DESCRIPTOR_H
#define TE_TEST_PID_DESCRIPTOR_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <te/te-plugin.h>

static inline int pid_describe(const char *member, char **json)
{
	char buf[96];
	snprintf(buf, sizeof buf, "{\"%s\":%d}", member, (int)getpid());
	*json = strdup(buf);
	return *json ? 0 : -ENOMEM;
}

/* A segment of this process opens with no context of its own; any other
 * is -ENOTSUP (another transport may serve it). */
static inline int pid_segment_open(const char *member, const te_segment_info *seg, void **seg_ctx)
{
	char want[96];
	snprintf(want, sizeof want, "\"%s\":%d", member, (int)getpid());
	if (seg->descriptor == NULL || strstr(seg->descriptor, want) == NULL)
		return -ENOTSUP;
	*seg_ctx = NULL;
	return 0;
}

/* The transport ops NAME_describe and NAME_segment_open over the member
 * "NAME_pid". */
#define PID_DESCRIPTOR_OPS(name)                                                              \
	static int name##_describe(void *ctx, char **json)                                    \
	{                                                                                     \
		(void)ctx;                                                                    \
		return pid_describe(#name "_pid", json);                                      \
	}                                                                                     \
	static int name##_segment_open(void *ctx, const te_segment_info *seg, void **seg_ctx) \
	{                                                                                     \
		(void)ctx;                                                                    \
		return pid_segment_open(#name "_pid", seg, seg_ctx);                          \
	}

#endif
