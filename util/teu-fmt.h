/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A byte count as the benchmarks print it: in the largest of GiB, MiB, KiB
 * that divides it exactly, else in bytes ("64 KiB", "1 GiB", "1000 B"), so a
 * size reads back as the size that was asked for. libc only;
 * shared by te-bench and gpu-copy-bench so their tables name sizes alike.
 */
#ifndef TEU_FMT_H
#define TEU_FMT_H

#include <stddef.h>
#include <stdint.h>

void teu_fmt_bytes(char *buf, size_t n, uint64_t v);

#endif
