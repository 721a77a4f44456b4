/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private to the client connection's files: tcp-client.c (the backlog,
 * failures, connecting), tcp-client-wire.c (requests out, replies in),
 * tcp-client-drive.c (the I/O thread's turns and timeouts) and
 * tcp-client-caller.c (callers that drive a connection themselves).
 */
#ifndef TE_TCP_CLIENT_H
#define TE_TCP_CLIENT_H

#include "tcp-internal.h"

/* FAIL_RAIL: the connection's rail failed while another rail is up: what it
 * carried goes to the other rails (a READ at once; a WRITE it sent only
 * after a FENCE, tcp_cconn_fail). */
/* FAIL_EXPIRE: the host ended a transfer on the connection (deadline,
 * cancel): its slices end, the others go back to the peer as with FAIL_RAIL
 * (the rail stays up, nothing counts as an error). */
enum { FAIL_PEER = 0, FAIL_REJECT = 1, FAIL_QUIET = 2, FAIL_RAIL = 3, FAIL_EXPIRE = 4 };

static inline tcp_slot *slot_at(tcp_cconn *cc, uint64_t i)
{
	return &cc->ring[i & (cc->peer->ctx->cfg.depth - 1)];
}

static inline const te_host *host_of(tcp_cconn *cc)
{
	return cc->peer->ctx->host;
}

/* Counts for the device (local address) of a connection: a relaxed add in
 * the host, no lock. */
static inline void count(tcp_cconn *cc, int what, int64_t delta)
{
	const tcp_ctx *c = cc->peer->ctx;

	if (c->metrics && delta != 0)
		c->host->metric_add(c->host, cc->mdev, what, delta);
}

/* What a failed receive leaves for tcp_cconn_fail(). */
typedef struct tcp_rx_result {
	int err;
	int mode;
	uint64_t at;
	char why[160];
} tcp_rx_result;

/* tcp-client.c. Takes slices from the peer's retry list and backlog into
 * the ring, while the depth and the window allow. */
void tcp_cconn_pull(tcp_cconn *cc);
/* Closes the socket (no request is touched). */
void tcp_cconn_go_down(tcp_cconn *cc);
/* Ends the connection; its requests fail, or go back to the peer (mode). */
void tcp_cconn_fail(tcp_cconn *cc, int err, int mode, uint64_t at, const char *why);
/* A connect failed: the next address, the rail down, or the backlog failed. */
void tcp_cconn_connect_failed(tcp_cconn *cc, int err, const char *what);
void tcp_cconn_start_connect(tcp_cconn *cc);
void tcp_cconn_become_up(tcp_cconn *cc);
/* The cluster key's exchange and the HELLO. False: failed and handled. */
bool tcp_cconn_preamble(tcp_cconn *cc);
/* The peer answered FENCE `f`: its WRITEs go out again, those of transfers
 * the host ended complete (any thread). */
void tcp_fence_done(tcp_peer *p, tcp_fence *f);
/* True when a slice on the ring belongs to a transfer the host ended. */
bool tcp_cconn_has_expired(tcp_cconn *cc);
/* Ends the connection when it carries a transfer the host ended (its
 * owner, on MISS_EXPIRE or `gate_shut`). True: it did. */
bool tcp_cconn_expire(tcp_cconn *cc);
/* The earliest deadline of the transfers waiting in the peer's backlog and
 * retries (te_now_ns() time), 0: none has one. */
int64_t tcp_peer_waiting_deadline(tcp_peer *p);

/* tcp-sg.c. Puts the requests from ring index `first` on into one
 * scatter-gather frame when the peer takes them and at least two small
 * ones of one opcode follow one another there: how many it took (0: none,
 * `first` goes in its usual frame). */
unsigned tcp_sg_prep(tcp_cconn *cc, uint64_t first);

/* tcp-client-wire.c. 1: bytes moved, 0: nothing to do or would block, <0:
 * failed (a receive's details in `res`). */
int tcp_cconn_send(tcp_cconn *cc);
int tcp_cconn_recv(tcp_cconn *cc, tcp_rx_result *res);
/* Completes finished requests, in order. */
void tcp_cconn_reap(tcp_cconn *cc);

/* tcp-client-drive.c. What the owner's epoll set watches (`muted`: a caller
 * waits on the socket itself). */
void tcp_cconn_set_events(tcp_cconn *cc, bool muted);
/* A suspect path, or no progress for TE_TCP_TIMEOUT_MS: the connection fails. */
void tcp_cconn_check_stall(tcp_cconn *cc, int64_t now);
bool tcp_cconn_fence_canceled(tcp_cconn *cc);

#endif
