/* SPDX-License-Identifier: Apache-2.0 */
/* plugin-layout: te-plugin.h's structs against the released layout in
 * plugin-layout.h. A plugin built against an older header reads and writes
 * these tables at the offsets it was compiled with, so a moved member breaks
 * every such plugin without a compiler noticing. Every difference is listed,
 * then the test fails. */
#include <stddef.h>
#include <stdio.h>

#include <te/te-plugin.h>

static int failures;

static void check(const char *what, size_t now, size_t released, int may_grow)
{
	if (now == released || (may_grow && now > released))
		return;
	printf("%s: %zu, released as %zu\n", what, now, released);
	failures++;
}

int main(void)
{
#if !defined(__x86_64__) || !defined(__LP64__)
	/* The table holds x86_64's layout; others would differ by design. */
	printf("skipped: the released layout is recorded for x86_64 only\n");
	return 77;
#else
	int rows = 0;
#define SIZE(type, n) (check("sizeof(" #type ")", sizeof(type), n, 0), rows++);
#define GROWS(type, n) (check("sizeof(" #type ")", sizeof(type), n, 1), rows++);
#define MEMBER(type, member, off) \
	(check("offsetof(" #type ", " #member ")", offsetof(type, member), off, 0), rows++);
#include "plugin-layout.h"
	if (failures) {
		printf("%d of %d layout facts changed: plugins built for plugin ABI %d.x would break\n"
		       "(if deliberate, a new plugin ABI major; see docs/abi.md)\n",
		       failures, rows, TE_PLUGIN_ABI_MAJOR);
		return 1;
	}
	printf("%d layout facts of te-plugin.h as released\n", rows);
	return 0;
#endif
}
