/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A byte count as the benchmarks print it: in the largest of GiB, MiB, KiB
 * that divides it exactly, else in bytes ("64 KiB", "1 GiB", "1000 B"), so a
 * size reads back as the size that was asked for; and their error lines.
 * libc only; shared by te-bench and gpu-copy-bench so their tables name
 * sizes alike and their errors read alike.
 */
#ifndef TEU_FMT_H
#define TEU_FMT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

void teu_fmt_bytes(char *buf, size_t n, uint64_t v);

/* One line on stderr: "<prog>: <the message>". */
void teu_fmt_verror(const char *prog, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

#endif
