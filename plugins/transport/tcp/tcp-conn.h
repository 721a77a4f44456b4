/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The client connection: one of our connections to a peer's data port, the
 * peer it belongs to (its backlog, retries, fences and rails), and what the
 * files of the connection share: tcp-conn.c (its state machine: connecting,
 * up, failed or down; the ring filled from the backlog; timeouts; the I/O
 * thread's turns), tcp-conn-wire.c (requests out, replies in),
 * tcp-conn-caller.c (callers that drive it themselves), tcp-peer.c (the
 * peer's backlog, fences and the slices of ended transfers) and tcp-rail.c.
 *
 * Who drives a connection: its I/O thread, or now and then the thread that
 * submitted and waits. Both take it with tcp_cconn_take(), move its bytes
 * with tcp_cconn_step() and let go; what one of them could not do while the
 * other held it waits in `missed` (MISS_*).
 */
#ifndef TE_TCP_CONN_H
#define TE_TCP_CONN_H

#include "tcp.h"

/* -------------------------------------------------------------- client */

/* One wire request in a client connection's ring: a slice of `t`, or a
 * FENCE (`fence` set, `t` NULL). */
typedef struct tcp_slot {
	te_transfer *t;
	tcp_fence *fence;
	uint64_t off, len;   /* the slice of t */
	uint64_t stot, sent; /* bytes to send: header (+ payload for WRITE) */
	uint64_t rtot, rcvd; /* bytes to receive: status (v2) (+ payload for READ) */
	uint64_t status;     /* the status frame as received (LE) */
	uint8_t hdr[TCP_HDR_SIZE];
	uint8_t op;
	uint8_t tries;
	/* A WRITE whose body bytes began to leave: counted in its transfer's
	 * unsettled slices (tcp_unsettled_add) until its answer or a failure
	 * that rules it out. */
	bool counted;
	/* In a scatter-gather frame: the first piece sends the header and the
	 * table (`hlen` bytes, `sgn` pieces), the others their bytes only;
	 * `err`: the peer rejected this piece alone. */
	bool sg;
	uint16_t sgn;
	uint32_t hlen;
	int err;
} tcp_slot;

enum tcp_cstate { CS_DOWN, CS_CONNECTING, CS_UP };

struct tcp_cconn {
	tcp_io io;
	tcp_peer *peer;
	unsigned idx;
	unsigned rail;       /* index into peer->rails */
	bool probing;        /* connecting over a rail that is down, to see if it is back */
	int state;
	int64_t connect_deadline;
	unsigned addr_next;  /* the peer address to try next */
	unsigned addr_tries; /* addresses tried since the last success */
	/* With a peer that fences: this connection's lane (random, for the
	 * peer's life) and generation (one more at each connect), sent in its
	 * HELLO, which a FENCE names to end it. */
	uint64_t lane, gen;
	tcp_slot *ring;
	uint8_t *sgtab; /* scatter-gather tables, TCP_SG_ENTRY bytes per ring position (allocated with the ring) */
	uint64_t head, snd, rcv, tail; /* free-running indices */
	uint64_t bytes; /* payload bytes in flight */
	int64_t last_rx; /* ms, the last byte received, or when work arrived on an idle connection */
	/* Who drives the connection: its I/O thread, or now and then a thread
	 * of the application that sends its own request on the connection while
	 * it is idle and collects the reply while it waits (tcp-conn-caller.c).
	 * 1 while one of them holds it; everything below `io`'s mailbox fields
	 * and above belongs to the holder. Never waited for:
	 * whoever finds it held leaves what it came for in `missed` (MISS_*),
	 * and the holder hands that to the I/O thread when it lets go. */
	atomic_int drv;
	atomic_uint missed;
	uint32_t ep_events; /* as registered in the owner's epoll set (tcp_cconn_set_events) */
	/* The host's counters of the local address it leaves by (ABI 1.6;
	 * NULL: the transport's own, or counting is off). Set when it comes up. */
	te_metric_dev *mdev;
	/* A send or receive found a transfer's gate closed (the host ended it):
	 * the connection ends (tcp_cconn_fail, FAIL_EXPIRE) after this turn. */
	bool gate_shut;
	/* connect_deadline is a transfer's deadline, not the connect timeout:
	 * reaching it ends this attempt without failing the peer's work. */
	bool soft_deadline;
};

/* What a connection's I/O thread could not do while a caller held it. */
enum tcp_miss {
	MISS_RD = 1u << 0,    /* readable (an EPOLLIN edge) */
	MISS_WR = 1u << 1,    /* writable */
	MISS_HUP = 1u << 2,   /* hang-up or error */
	MISS_WORK = 1u << 3,  /* mail: the backlog grew; or its turn on the ready list */
	MISS_SCAN = 1u << 4,  /* the periodic check of its timeouts */
	MISS_CLOSE = 1u << 5, /* mail: the peer is going away */
	MISS_CONN = 1u << 6,  /* an event while connecting */
	MISS_EXPIRE = 1u << 7, /* the host ended a transfer of the peer: look for its slices (tcp_expire) */
};
#define MISS_EVENTS (MISS_RD | MISS_WR | MISS_HUP)

/* A slice put back for another try (after a peer rejected an earlier request
 * on the same connection and closed it). */
typedef struct tcp_retry {
	te_transfer *t;
	uint64_t off, len;
	uint8_t tries;
	bool counted; /* held by a fence: its body bytes left (tcp_slot.counted) */
} tcp_retry;

/* WRITE slices that a connection failed over with after sending them (in
 * part or whole): the target may still apply them from that connection's
 * socket, so they are sent again only once the target answered a FENCE of
 * that connection's lane and generation (tcp-peer.c). */
struct tcp_fence {
	tcp_fence *next;   /* the peer's fences waiting for a connection */
	uint64_t lane, gen;
	size_t n;
	tcp_retry held[];
};

/* One of a peer's data addresses (its descriptor's tcp_data_addresses), or
 * the one host a single-rail peer is reached at. */
typedef struct tcp_rail {
	char name[80];             /* address:port for logs */
	struct sockaddr_storage addr[TCP_MAX_ADDRS];
	socklen_t addrlen[TCP_MAX_ADDRS];
	unsigned naddr;
	atomic_int up;             /* carries requests; else probed */
	atomic_llong down_at;      /* ms, when it went down */
	atomic_llong next_probe;   /* ms, the next connect attempt while down */
	atomic_llong backoff;      /* ms between connect attempts while down */
	atomic_ullong bytes;       /* payload bytes of the requests it completed */
	atomic_llong last_rx;      /* ms, when one of its connections last received a byte */
	atomic_llong inflight;     /* requests on its connections' rings */
	/* The local interface its connections leave by (learned at connect, 0:
	 * unknown) and whether rtnetlink said that interface lost its carrier or
	 * the local address (a rail kept up as the last one then goes down when
	 * another comes back). A down rail is probed whatever this says: the
	 * event saying the link is back can be lost, or name an interface
	 * created anew. */
	atomic_int ifindex;
	atomic_int link_down;
	atomic_int reprobe;        /* its link came back: a probe still connecting starts again */
	struct sockaddr_storage local; /* the local address of its last connection (peer lock) */
} tcp_rail;

struct tcp_peer {
	tcp_ctx *ctx;
	char *key;                 /* host|port|version|rails */
	char name[80];             /* host:port for logs */
	tcp_rail *rails;           /* nrails of them, allocated with the peer */
	unsigned nrails;           /* connection i runs over rails[i % nrails] */
	atomic_int rails_up;
	/* ms, when one of its connections last received bytes after more than
	 * TE_TCP_SUSPECT_MS without any while it had requests in flight: the
	 * peer was silent there too (stopped, or overloaded), so another
	 * connection's silence up to then says nothing about its path. */
	atomic_llong woke_at;
	atomic_int closing;        /* segment closed: I/O threads kick none of its connections */
	atomic_int kicking;        /* I/O threads kicking its connections right now */
	int version;               /* 1 or 2 */
	bool fence;                /* the peer honours HELLO and FENCE (descriptor tcp_fence, v2) */
	bool sg;                   /* the peer takes scatter-gather frames (descriptor tcp_sg, v2) */
	int refs;                  /* segment opens (ctx->lock) */
	atomic_int live_conns;     /* connections not yet retired by their thread */
	GMutex lock;               /* backlog and retries */
	/* The backlog: transfers linked through plugin_data[0] (next) and
	 * plugin_data[2] (previous), plugin_data[1] its bytes not yet taken;
	 * plugin_data[3] counts its unsettled WRITE slices (tcp_unsettled_add). */
	te_transfer *bl_head, *bl_tail;
	uint64_t bl_bytes;         /* bytes queued in the backlog and retries */
	tcp_retry *retry;
	size_t nretry, cap_retry;
	tcp_fence *fences;         /* FENCEs to send, each holding the WRITEs it releases */
	atomic_int has_work;
	atomic_int active;         /* connections connecting or up */
	unsigned nconns;
	tcp_cconn conns[];
};

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

/* ------------------------------------------ the connection (tcp-conn.c) */

/* The I/O thread's entries (each takes the connection, or leaves its
 * business in `missed` when a caller holds it). */
void tcp_cconn_mail(tcp_cconn *cc, unsigned mail);
void tcp_cconn_event(tcp_cconn *cc, uint32_t events);
void tcp_cconn_ready(tcp_cconn *cc);     /* its turn on the ready list */
/* Checks its timeouts; returns when it wants the next check: 0 at the usual
 * period, else a time in ms (INT64_MAX: not until something happens on it). */
int64_t tcp_cconn_scan(tcp_cconn *cc, int64_t now);
void tcp_cconn_shutdown(tcp_cconn *cc, int err); /* the threads stop: no caller is left */

/* The driver interface, for the I/O thread and callers alike. Takes the
 * connection without waiting: false when the other holds it. */
static inline bool tcp_cconn_take(tcp_cconn *cc)
{
	int free_ = 0;

	return atomic_compare_exchange_strong(&cc->drv, &free_, 1);
}
/* One step of its holder: sends (`send`), receives (`recv`), completes
 * what finished. 1: bytes moved, 0: none, -1: the connection failed (its
 * requests completed or moved). */
int tcp_cconn_step(tcp_cconn *cc, bool send, bool recv);
/* What the owner's epoll set watches (`muted`: a caller waits on the socket
 * itself). */
void tcp_cconn_set_events(tcp_cconn *cc, bool muted);
/* A suspect path, or no progress for TE_TCP_TIMEOUT_MS: the connection fails. */
void tcp_cconn_check_stall(tcp_cconn *cc, int64_t now);

/* The state machine. Takes slices from the peer's retry list and backlog
 * into the ring, while the depth and the window allow. */
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
/* True when a slice on the ring belongs to a transfer the host ended. */
bool tcp_cconn_has_expired(tcp_cconn *cc);
/* Ends the connection when it carries a transfer the host ended (its
 * owner, on MISS_EXPIRE or `gate_shut`). True: it did. */
bool tcp_cconn_expire(tcp_cconn *cc);
/* A FENCE on the ring waits for an engine that is closing. */
bool tcp_cconn_fence_canceled(tcp_cconn *cc);

/* ------------------------------------------- its bytes (tcp-conn-wire.c) */

/* 1: bytes moved, 0: nothing to do or would block, <0: failed (a
 * receive's details in `res`). */
int tcp_cconn_send(tcp_cconn *cc);
int tcp_cconn_recv(tcp_cconn *cc, tcp_rx_result *res);
/* Completes finished requests, in order. */
void tcp_cconn_reap(tcp_cconn *cc);

/* ------------------------------------------ callers (tcp-conn-caller.c) */

/* Sends a submit's run of transfers to `p` (already in its backlog) on an
 * idle connection from the submitting thread; false when none could be
 * taken (the I/O threads are kicked as before). */
bool tcp_direct_submit(tcp_peer *p);
void tcp_direct_forget(void);            /* this thread's last submit went the usual way */
int tcp_progress(void *ctx, int (*done)(void *arg), void *arg, int64_t timeout_ns);
void tcp_wake(void *ctx);
void tcp_sleepers_free(tcp_ctx *c);

/* ------------------------------------------------------ the peer (tcp-peer.c) */

void tcp_peer_fail_pending(tcp_peer *p, int err);
void tcp_peer_retire_conn(tcp_peer *p);
/* The earliest deadline of the transfers waiting in the peer's backlog and
 * retries (te_now_ns() time), 0: none has one. */
int64_t tcp_peer_waiting_deadline(tcp_peer *p);
/* Puts slices back for another connection (p->lock held). */
void tcp_peer_retry_add(tcp_peer *p, const tcp_retry *r, size_t n);
/* Fences to send again on the peer's next connection (p->lock held). */
void tcp_peer_fences_requeue(tcp_peer *p, tcp_fence *list);
/* The peer answered FENCE `f`: its WRITEs go out again, those of transfers
 * the host ended complete (any thread). */
void tcp_fence_done(tcp_peer *p, tcp_fence *f);
/* A FENCE that will not be answered on its connection: what it still holds
 * (to send again), or NULL (freed); `*nfailed` WRITEs failed with `err`. */
tcp_fence *tcp_fence_lost(tcp_ctx *c, tcp_fence *f, int err, size_t *nfailed);
/* Completes a slice that leaves a fence or a ring unanswered. */
void tcp_slice_complete(const te_host *h, te_transfer *t, bool counted, uint64_t bytes, int err);
/* Whether `err` means the peer can apply nothing more of what it was sent. */
bool tcp_err_final(int err);
int tcp_expire(void *ctx, te_transfer *t); /* the ops' expire (ABI 1.11) */
/* A slice of a transfer the host ended completes soon, on I/O thread 0,
 * once no expire() is under way and a moment has passed (any thread). */
void tcp_dead_add(tcp_ctx *c, te_transfer *t, bool counted);
/* Completes what is due (all: at destroy); true while some waits. */
bool tcp_dead_flush(tcp_ctx *c, bool all);

/* ------------------------------------------------------------ rails */

/* tcp-rail.c. A peer's rails. An interface's carrier or address went away
 * (up false) or came back: the rails of every peer leaving by it go down
 * (while another rail is up) or are probed at once. `addr` (may be NULL):
 * only rails whose local address it is. */
void tcp_rails_link_event(tcp_ctx *c, int ifindex, const struct sockaddr *addr, bool up, const char *why);
static inline tcp_rail *tcp_rail_of(tcp_cconn *cc)
{
	return &cc->peer->rails[cc->rail];
}
/* Whether `cc` may carry requests (its rail is up, or none is). */
bool tcp_rail_usable(tcp_cconn *cc);
/* Kicks every connection of the peer from an I/O thread (not after its close). */
void tcp_peer_kick_all(tcp_peer *p);
/* Holds `p` (its `kicking` count) when it is still in live_peers, else false:
 * a peer known only by a pointer may have been freed. p stays until the
 * caller drops the count. */
bool tcp_peer_hold(tcp_ctx *c, tcp_peer *p);
/* The connection's rail is down (once); its work goes to the other rails. */
void tcp_rail_down(tcp_cconn *cc, const char *why);
/* A rail of `p` other than `r` that shows the peer alive, or NULL. */
tcp_rail *tcp_other_rail_alive(tcp_peer *p, const tcp_rail *r, int64_t now, int64_t since, int64_t ms);
/* A connection over a down rail came up: the rail is back. */
void tcp_rail_up(tcp_cconn *cc);
/* A probing connect over a down rail failed: the next waits longer. */
void tcp_rail_probe_failed(tcp_cconn *cc);
/* A connection received bytes at `now` (before its last_rx is updated). */
void tcp_rail_heard(tcp_cconn *cc, int64_t now);
/* The first time a connection that has been silent since `since` may be
 * found suspect: after TE_TCP_SUSPECT_MS of silence that the peer did not
 * share. */
int64_t tcp_rail_silent_since(tcp_cconn *cc, int64_t since);

/* tcp-sg.c, the initiator's side. Puts the requests from ring index `first`
 * on into one scatter-gather frame when the peer takes them and at least two
 * small ones of one opcode follow one another there: how many it took (0:
 * none, `first` goes in its usual frame). */
unsigned tcp_sg_prep(tcp_cconn *cc, uint64_t first);

#ifdef TCP_TEST_HOOKS
void tcp_hook_prep(tcp_cconn *cc, const tcp_slot *s); /* a request put on a connection */
bool tcp_hook_suspect(tcp_cconn *cc);             /* true: fail it over as suspect now */
#endif

#endif
