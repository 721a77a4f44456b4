/* SPDX-License-Identifier: Apache-2.0 */
/* The TCP data protocol's frames checked (tcp-proto.h). */
#include <stdio.h>

#include "tcp-proto.h"

const char *tcp_op_name(unsigned op)
{
	return op == TCP_OP_WRITE ? "WRITE" : op == TCP_OP_READ ? "READ" : "?";
}

enum tcp_frame tcp_frame_kind(const tcp_hdr *h, bool sg)
{
	unsigned op = tcp_hdr_op(h);

	/* READ and WRITE whatever the v2 bit says (it asks for status frames);
	 * libte's own frames only with it. */
	if (op == TCP_OP_READ || op == TCP_OP_WRITE)
		return TCP_FRAME_DATA;
	if (!tcp_hdr_v2(h))
		return TCP_FRAME_BAD;
	if (op == TCP_OP_HELLO || op == TCP_OP_FENCE)
		return TCP_FRAME_LANE;
	if (sg && (op == TCP_OP_SG_READ || op == TCP_OP_SG_WRITE))
		return TCP_FRAME_SG;
	return TCP_FRAME_BAD;
}

bool tcp_range_check(uint64_t addr, uint64_t size, const char **why)
{
	if (size == 0)
		*why = "zero length";
	else if (addr + size < addr)
		*why = "the range wraps around";
	else
		return true;
	return false;
}

const char *tcp_lane_check(const tcp_hdr *h)
{
	if (!h->zero_pad)
		return "reserved bytes are not zero";
	if (h->size == 0 || h->addr == 0)
		return "lane or generation 0";
	return NULL;
}

bool tcp_sg_hdr_check(const tcp_hdr *h, char *why, size_t whylen)
{
	uint64_t size = h->size, count = h->addr;

	if (!h->zero_pad) {
		snprintf(why, whylen, "reserved bytes are not zero");
		return false;
	}
	if (count == 0 || count > TCP_SG_MAX) {
		snprintf(why, whylen, "%llu pieces (1 to %u)", (unsigned long long)count, TCP_SG_MAX);
		return false;
	}
	/* count is bounded above, so the product cannot wrap */
	if (size < count || size > count * TCP_SG_PIECE_MAX) {
		snprintf(why, whylen, "%llu bytes in %llu pieces (each 1 to %u bytes)", (unsigned long long)size,
			 (unsigned long long)count, TCP_SG_PIECE_MAX);
		return false;
	}
	return true;
}

bool tcp_sg_table_check(const uint8_t *tab, uint32_t n, uint64_t total, char *why, size_t whylen)
{
	uint64_t sum = 0;

	for (uint32_t i = 0; i < n; i++) {
		uint64_t a, l;
		tcp_sg_entry_decode(tab + (size_t)i * TCP_SG_ENTRY, &a, &l);
		if (l == 0 || l > TCP_SG_PIECE_MAX) {
			snprintf(why, whylen, "piece %u of %u is %llu bytes (1 to %u)", i, n, (unsigned long long)l,
				 TCP_SG_PIECE_MAX);
			return false;
		}
		sum += l; /* at most TCP_SG_MAX pieces of TCP_SG_PIECE_MAX: no wrap */
	}
	if (sum != total) {
		snprintf(why, whylen, "the pieces hold %llu bytes, the header says %llu", (unsigned long long)sum,
			 (unsigned long long)total);
		return false;
	}
	return true;
}
