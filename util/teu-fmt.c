/* SPDX-License-Identifier: Apache-2.0 */
#include <inttypes.h>
#include <stdio.h>

#include "teu-fmt.h"

void teu_fmt_bytes(char *buf, size_t n, uint64_t v)
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

void teu_fmt_verror(const char *prog, const char *fmt, va_list ap)
{
	fprintf(stderr, "%s: ", prog);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
}
