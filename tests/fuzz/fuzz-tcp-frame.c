/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The TCP data protocol's frame codec alone (plugins/transport/tcp/tcp-proto.c, the
 * only source linked):
 *   <flags> <24-byte header> <status frame, 8 bytes> <table entries...>
 * Bit 0 of flags: the target takes scatter-gather frames. The header is
 * decoded and encoded again (the same bytes when its padding is zero),
 * classified (tcp_frame_kind()), and checked as a HELLO or FENCE
 * (tcp_lane_check()), as a range (tcp_range_check()) and as a
 * scatter-gather frame (tcp_sg_hdr_check()); the entries that follow, as
 * many as the header's piece count asks for and the input holds, go to
 * tcp_sg_table_check(). Every answer is compared with one computed here
 * from docs/wire.md with wider arithmetic.
 */
#include "../../plugins/transport/tcp/tcp-proto.h"

#include "fuzz.h"

static enum tcp_frame expected_kind(uint8_t opcode, bool sg)
{
	unsigned op = opcode & 0x7f;

	if (op == 0 || op == 1)
		return TCP_FRAME_DATA;
	if (!(opcode & 0x80))
		return TCP_FRAME_BAD;
	if (op == 2 || op == 3)
		return TCP_FRAME_LANE;
	if (sg && (op == 0x10 || op == 0x11))
		return TCP_FRAME_SG;
	return TCP_FRAME_BAD;
}

static void header(const uint8_t *h, bool sg, const uint8_t *tab, size_t tab_len)
{
	static const uint8_t zeros[7];
	bool pad = memcmp(h + 17, zeros, sizeof zeros) == 0;
	uint64_t size = 0, addr = 0;
	tcp_hdr d, again;
	uint8_t enc[TCP_HDR_SIZE];
	char why[128];

	for (int i = 7; i >= 0; i--) {
		size = size << 8 | h[i];
		addr = addr << 8 | h[8 + i];
	}
	tcp_hdr_decode(h, &d);
	FUZZ_CHECK(d.size == size && d.addr == addr && d.opcode == h[16] && d.zero_pad == pad);
	tcp_hdr_encode(enc, d.size, d.addr, d.opcode);
	FUZZ_CHECK((memcmp(enc, h, TCP_HDR_SIZE) == 0) == pad);
	tcp_hdr_decode(enc, &again);
	FUZZ_CHECK(again.size == size && again.addr == addr && again.opcode == h[16] && again.zero_pad);

	FUZZ_CHECK(tcp_frame_kind(&d, sg) == expected_kind(h[16], sg));
	FUZZ_CHECK((tcp_lane_check(&d) == NULL) == (pad && size != 0 && addr != 0));

	const char *bad = NULL;
	bool range = (unsigned __int128)addr + size <= UINT64_MAX && size != 0;
	FUZZ_CHECK(tcp_range_check(addr, size, &bad) == range);
	FUZZ_CHECK(range == (bad == NULL));

	/* size is the frame's bytes, addr its pieces */
	bool sg_ok = pad && addr >= 1 && addr <= TCP_SG_MAX && size >= addr &&
		     (unsigned __int128)size <= (unsigned __int128)addr * TCP_SG_PIECE_MAX;
	why[0] = '\0';
	FUZZ_CHECK(tcp_sg_hdr_check(&d, why, sizeof why) == sg_ok);
	FUZZ_CHECK(sg_ok || why[0] != '\0');
	if (!sg_ok)
		return;

	uint32_t n = (uint32_t)addr;
	if (tab_len / TCP_SG_ENTRY < n)
		n = (uint32_t)(tab_len / TCP_SG_ENTRY);
	unsigned __int128 sum = 0;
	bool pieces_ok = true;
	for (uint32_t i = 0; i < n; i++) {
		uint64_t a = 0, l = 0, a2, l2;
		for (int k = 7; k >= 0; k--) {
			a = a << 8 | tab[(size_t)i * TCP_SG_ENTRY + k];
			l = l << 8 | tab[(size_t)i * TCP_SG_ENTRY + 8 + k];
		}
		tcp_sg_entry_decode(tab + (size_t)i * TCP_SG_ENTRY, &a2, &l2);
		FUZZ_CHECK(a2 == a && l2 == l);
		uint8_t e[TCP_SG_ENTRY];
		tcp_sg_entry_encode(e, a, l);
		FUZZ_CHECK(memcmp(e, tab + (size_t)i * TCP_SG_ENTRY, TCP_SG_ENTRY) == 0);
		if (l == 0 || l > TCP_SG_PIECE_MAX)
			pieces_ok = false;
		sum += l;
	}
	why[0] = '\0';
	bool table_ok = pieces_ok && sum == size;
	FUZZ_CHECK(tcp_sg_table_check(tab, n, size, why, sizeof why) == table_ok);
	FUZZ_CHECK(table_ok || why[0] != '\0');
}

static void status(const uint8_t *f)
{
	uint64_t wire, v = 0;
	uint32_t code;

	memcpy(&wire, f, 8);
	for (int i = 7; i >= 0; i--)
		v = v << 8 | f[i];
	bool framed = tcp_status_decode(wire, &code);
	FUZZ_CHECK(framed == (v >> 32 == TCP_STATUS_MAGIC));
	FUZZ_CHECK(code == (uint32_t)v);
	if (framed)
		FUZZ_CHECK(tcp_status_frame(code) == wire);
	FUZZ_CHECK(tcp_status_decode(tcp_status_frame(code), &code) && code == (uint32_t)v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 + TCP_HDR_SIZE)
		return 0;
	bool sg = data[0] & 1;
	const uint8_t *h = data + 1;
	const uint8_t *rest = h + TCP_HDR_SIZE;
	size_t rest_len = size - 1 - TCP_HDR_SIZE;
	if (rest_len >= TCP_STATUS_SIZE) {
		status(rest);
		rest += TCP_STATUS_SIZE;
		rest_len -= TCP_STATUS_SIZE;
	}
	header(h, sg, rest, rest_len);
	FUZZ_CHECK(strcmp(tcp_op_name(h[16] & TCP_OP_MASK), (h[16] & 0x7f) == 0 ? "READ"
							     : (h[16] & 0x7f) == 1 ? "WRITE" : "?") == 0);
	return 0;
}
