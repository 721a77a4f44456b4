/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A byte count as the benchmarks print it: in the largest of GiB, MiB, KiB
 * that divides it exactly, else in bytes ("64 KiB", "1 GiB", "1000 B"), so a
 * size reads back as the size that was asked for. Header-only, libc only;
 * shared by te-bench and gpu-copy-bench so their tables name sizes alike.
 */
#ifndef TE_TOOLS_FMT_BYTES_H
#define TE_TOOLS_FMT_BYTES_H

#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

static inline void fmt_bytes(char *buf, size_t n, uint64_t v)
{
	if (v >= (1ull << 30) && v % (1ull << 30) == 0)
		snprintf(buf, n, "%" PRIu64 " GiB", v >> 30);
	else if (v >= (1ull << 20) && v % (1ull << 20) == 0)
		snprintf(buf, n, "%" PRIu64 " MiB", v >> 20);
	else if (v >= 1024 && v % 1024 == 0)
		snprintf(buf, n, "%" PRIu64 " KiB", v >> 10);
	else
		snprintf(buf, n, "%" PRIu64 " B", v);
}

#endif
