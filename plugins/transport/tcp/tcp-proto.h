/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The TCP data protocol's frames (docs/wire.md, "TCP data protocol"): the
 * 24-byte header, the 8-byte status frame, libte's HELLO and FENCE frames
 * and the scatter-gather frame's table; encoded, decoded and checked here,
 * with no sockets, threads or host calls (tcp-proto.c; the fuzz harnesses
 * link it alone). The header and status codecs are inline: every request
 * passes through them.
 */
#ifndef TE_TCP_PROTO_H
#define TE_TCP_PROTO_H

#include <endian.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define TCP_HDR_SIZE 24
#define TCP_STATUS_SIZE 8
#define TCP_OP_MASK 0x7f
#define TCP_OP_V2 0x80
#define TCP_OP_READ 0  /* TE_OP_READ */
#define TCP_OP_WRITE 1 /* TE_OP_WRITE */
#define TCP_STATUS_MAGIC 0x4D435456u /* "MCTV" */
#define TCP_STATUS_OK 0u
#define TCP_STATUS_REJECTED 1u
/* libte's own frames, sent only to peers whose descriptor says `tcp_fence`
 * (docs/wire.md): a header whose `size` field is a lane, `addr` a
 * generation, opcode HELLO or FENCE with the v2 bit, the 7 bytes after it
 * zero. HELLO opens a connection and is not answered; FENCE is answered with
 * a status frame once every connection of that lane up to that generation
 * can write nothing more. */
#define TCP_OP_HELLO 2
#define TCP_OP_FENCE 3
#define TCP_FENCE_VERSION 1
/* Scatter-gather frames (libte's own, sent only to peers whose descriptor
 * says `tcp_sg`; docs/wire.md): many small pieces in one frame. A header
 * whose `size` is the pieces' bytes and `addr` their count, opcode SG_READ
 * or SG_WRITE with the v2 bit, the 7 bytes after it zero; then a table of
 * (addr u64 LE, len u64 LE) per piece; for SG_WRITE the pieces' bytes in
 * table order. Answered per piece in order: a status frame, and for SG_READ
 * the piece's bytes (zeros for a rejected piece). */
#define TCP_OP_SG_READ 0x10
#define TCP_OP_SG_WRITE 0x11
#define TCP_SG_VERSION 1
#define TCP_SG_MAX 256               /* pieces per frame */
#define TCP_SG_PIECE_MAX (64u << 10) /* bytes per piece (the size of a thread's scratch) */
#define TCP_SG_ENTRY 16              /* bytes per table entry */

/* A header as decoded. For READ and WRITE `size` and `addr` are the range;
 * for HELLO and FENCE the lane and the generation; for a scatter-gather
 * frame its bytes and its piece count. */
typedef struct tcp_hdr {
	uint64_t size;
	uint64_t addr;
	uint8_t opcode; /* as sent: the v2 bit and the operation */
	bool zero_pad;  /* the 7 bytes after the opcode are zero */
} tcp_hdr;

/* What a header opens, for a target (tcp_frame_kind). */
enum tcp_frame {
	TCP_FRAME_BAD,      /* an opcode this target does not take: the connection ends */
	TCP_FRAME_DATA,     /* READ or WRITE (v1 or v2) */
	TCP_FRAME_LANE,     /* HELLO or FENCE */
	TCP_FRAME_SG,       /* SG_READ or SG_WRITE */
};

/* Header: size u64 LE, addr u64 LE, opcode u8, 7 bytes of zeros. */
static inline void tcp_hdr_encode(uint8_t *h, uint64_t size, uint64_t addr, uint8_t opcode)
{
	uint64_t v = htole64(size);
	memcpy(h, &v, 8);
	v = htole64(addr);
	memcpy(h + 8, &v, 8);
	h[16] = opcode;
	memset(h + 17, 0, 7);
}

static inline void tcp_hdr_decode(const uint8_t *h, tcp_hdr *out)
{
	static const uint8_t zeros[7];
	uint64_t v;

	memcpy(&v, h, 8);
	out->size = le64toh(v);
	memcpy(&v, h + 8, 8);
	out->addr = le64toh(v);
	out->opcode = h[16];
	out->zero_pad = memcmp(h + 17, zeros, sizeof zeros) == 0;
}

static inline unsigned tcp_hdr_op(const tcp_hdr *h)
{
	return h->opcode & TCP_OP_MASK;
}

static inline bool tcp_hdr_v2(const tcp_hdr *h)
{
	return (h->opcode & TCP_OP_V2) != 0;
}

/* A status frame as sent (little-endian on the wire). */
static inline uint64_t tcp_status_frame(uint32_t code)
{
	return htole64(((uint64_t)TCP_STATUS_MAGIC << 32) | code);
}

/* A status frame as received (`frame` as it lay on the wire): its code, or
 * false when the magic is wrong. */
static inline bool tcp_status_decode(uint64_t frame, uint32_t *code)
{
	uint64_t f = le64toh(frame);

	*code = (uint32_t)f;
	return (uint32_t)(f >> 32) == TCP_STATUS_MAGIC;
}

static inline void tcp_sg_entry_encode(uint8_t *e, uint64_t addr, uint64_t len)
{
	uint64_t a = htole64(addr), l = htole64(len);

	memcpy(e, &a, 8);
	memcpy(e + 8, &l, 8);
}

static inline void tcp_sg_entry_decode(const uint8_t *e, uint64_t *addr, uint64_t *len)
{
	uint64_t a, l;

	memcpy(&a, e, 8);
	memcpy(&l, e + 8, 8);
	*addr = le64toh(a);
	*len = le64toh(l);
}

/* "READ", "WRITE", or "?" for another opcode. */
const char *tcp_op_name(unsigned op);
/* What `h` opens on a target that takes scatter-gather frames or not (`sg`). */
enum tcp_frame tcp_frame_kind(const tcp_hdr *h, bool sg);
/* Whether [addr, addr+size) is a range a target may look up: not empty, not
 * wrapping around; else NULL and `why` says which. */
bool tcp_range_check(uint64_t addr, uint64_t size, const char **why);
/* A HELLO or FENCE header on its own (its place in the stream is the
 * target's business): NULL when well-formed, else what is wrong. */
const char *tcp_lane_check(const tcp_hdr *h);
/* A scatter-gather frame's header: its piece count and bytes in bounds.
 * False with the reason in `why`. */
bool tcp_sg_hdr_check(const tcp_hdr *h, char *why, size_t whylen);
/* A scatter-gather frame's table of `n` entries for a frame of `total`
 * bytes: every piece 1 to TCP_SG_PIECE_MAX bytes, their sum `total`. False
 * with the reason in `why`. */
bool tcp_sg_table_check(const uint8_t *tab, uint32_t n, uint64_t total, char *why, size_t whylen);

#endif
