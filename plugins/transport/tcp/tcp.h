/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The TCP transport's private structures, save the client connection's
 * (tcp-conn.h) and the frames' (tcp-proto.h). The plugin runs a few I/O threads,
 * each with its own epoll set, owning connections of two kinds: client
 * connections (to a peer's data port, carrying this engine's requests) and
 * server connections (accepted on our data port, serving a peer's requests).
 *
 * Data path without locks or allocation per request: a submit appends the
 * transfers to the peer's backlog (an intrusive list threaded through the
 * te_transfer's plugin_data, one mutex acquisition per submit call) and kicks
 * the peer's connections; each connection's owning thread pulls slices from
 * the backlog into its preallocated ring, writes headers and payloads with one
 * sendmsg for many requests and reads the replies straight into the
 * registered buffers.
 */
#ifndef TE_TCP_H
#define TE_TCP_H

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#include <glib.h>

#include <te/te-plugin.h>

#include "teu-spin.h"

/* ------------------------------------------------------------------- wire */

#include "tcp-proto.h"

_Static_assert(TCP_OP_READ == TE_OP_READ && TCP_OP_WRITE == TE_OP_WRITE, "the wire's opcodes are libte's");

/* ----------------------------------------------------------------- config */

typedef struct tcp_config {
	unsigned threads;        /* I/O threads */
	unsigned conns_per_peer; /* client connections per peer */
	uint64_t slice;          /* requests above this are split into wire requests */
	unsigned depth;          /* wire requests in flight per connection (power of 2) */
	uint64_t window;         /* bytes in flight per connection */
	int64_t timeout_ms;      /* no progress for this long with work pending: fail */
	int64_t connect_timeout_ms;
	int64_t suspect_ms;      /* a rail stalled this long while another moved data: abandoned; 0: never */
	int64_t probe_max_ms;    /* a down rail is tried again at least this often */
	int64_t idle_ms;         /* an outgoing connection idle this long is closed; 0: never */
	int sockbuf;             /* SO_SNDBUF/SO_RCVBUF, 0: kernel autotuning */
	unsigned max_inbound;    /* accepted connections at once */
	unsigned max_per_peer;   /* accepted connections at once from one address */
	unsigned port;           /* data port wanted, 0: any */
	int proto;               /* protocol version we ask peers for and advertise */
	char bind[64];           /* listen on this address only; "": every interface */
	char rails[256];         /* TE_TCP_RAILS as given; "": the engine's address only */
	bool direct;             /* a submitting or waiting thread may drive an idle connection itself */
	bool sg;                 /* TE_TCP_SG: take and send scatter-gather frames */
	teu_spin_policy spin;     /* waiters and I/O threads look this long before sleeping (TE_SPIN_US) */
	unsigned cpus;           /* CPUs the process may run on (the threads' and connections' default) */
} tcp_config;

#define TCP_MAX_CONNS_PER_PEER 16
#define TCP_AUTH_THREADS 32  /* accepted connections authenticated at once (with a key) */
#define TCP_MAX_ADDRS 4
#define TCP_IOV_MAX 256      /* iovecs per sendmsg/readv (IOV_MAX is 1024) */
#define TCP_HBUF (64 * TCP_HDR_SIZE)
#define TCP_MAX_TRIES 3      /* sends of one slice (requeued after a peer's reject) */
#define TCP_LINGER_MS 2000   /* after a reject: wait this long for the peer to close */
#define TCP_MAX_RAILS 8      /* data addresses of one engine */
#define TCP_MAX_FAILOVERS 16 /* moves of one slice to another rail before it fails */
#define TCP_PROBE_MIN_MS 1000 /* a down rail is tried again after this long, */
#define TCP_PROBE_MAX_MS 4000 /* doubling up to this (TE_TCP_PROBE_MAX_MS) while it stays down */
#define TCP_PROBE_CAP_MS 5000 /* the most TE_TCP_PROBE_MAX_MS may be */
#define TCP_MIN_LANES 4096    /* lanes a target remembers (more with TE_TCP_MAX_INBOUND) */

typedef struct tcp_ctx tcp_ctx;
typedef struct tcp_thread tcp_thread;
typedef struct tcp_io tcp_io;
typedef struct tcp_peer tcp_peer;
typedef struct tcp_cconn tcp_cconn;
typedef struct tcp_sconn tcp_sconn;
typedef struct tcp_fence tcp_fence;
typedef struct tcp_lane tcp_lane;

/* ------------------------------------------------------------ I/O objects */

enum tcp_io_kind { IO_WAKE, IO_LISTEN, IO_CLIENT, IO_SERVER, IO_NETLINK };

/* Requests other threads post to a connection's owner (bits of `mail`). */
enum tcp_mail {
	MAIL_WORK = 1u << 0,  /* the peer's backlog grew */
	MAIL_CLOSE = 1u << 1, /* the peer is going away */
	MAIL_ADOPT = 1u << 2, /* a new accepted connection */
};

/* What every epoll-registered object starts with. */
struct tcp_io {
	int kind;
	int fd;
	tcp_thread *thr;
	/* mailbox (any thread) */
	_Atomic(tcp_io *) mail_next;
	atomic_int queued;
	atomic_uint mail;
	/* owner thread only */
	tcp_io *prev, *next;  /* the thread's list of connections */
	tcp_io *ready_next;   /* the thread's list to service without an event */
	bool in_ready;
	bool in_list;
	bool rd, wr;          /* readable / writable since the last EAGAIN */
	bool hup;
	int64_t last_progress;
	char name[80];        /* peer address for logs */
};

struct tcp_thread {
	tcp_ctx *ctx;
	unsigned idx;
	GThread *thread;
	int ep;
	tcp_io wake;                 /* eventfd */
	_Atomic(tcp_io *) mailbox;   /* Treiber stack of kicked connections */
	atomic_int sleeping;
	atomic_int armed;            /* a caller left work on a connection: check timeouts again */
	atomic_llong sleep_until;    /* ms: while `sleeping`, it wakes by then on its own (INT64_MAX: maybe never) */
	atomic_int stop;
	tcp_io *conns;               /* all connections owned */
	unsigned n_conns;
	tcp_io *ready;               /* to service again (fairness cap hit, backlog) */
	int64_t next_scan;           /* ms, the next check of timeouts; INT64_MAX: none due */
	unsigned rr;                 /* next thread for accepted connections (thread 0) */
	struct iovec iov[TCP_IOV_MAX + 2];
	char scratch[65536];         /* discarded bytes (lingering closes) */
};

/* ------------------------------------------------------------- server */

typedef struct tcp_resp {
	uint64_t status;      /* LE frame */
	char *data;
	uint64_t len;
	uint64_t tot, sent;
	bool has_status;
	bool pinned;
	bool dev;             /* device memory: sent through the connection's stage */
	te_buffer_pin pin;
} tcp_resp;

/* A server connection's host copies of device memory: READ data of device
 * memory is copied into the first TCP_DEV_REPLY_STAGE bytes and sent on
 * (the data of several replies at once, so that one sendmsg carries them:
 * with 2 MiB windows, 64 KiB READs of device memory measured 10-25 % faster
 * with 2 MiB here than with 1 MiB or 256 KiB, docs/benchmarks.md; a libte
 * peer keeps at most its window, 512 KiB by default, or two slices, 2 MiB
 * with the default 1 MiB slices, in flight on a connection, so the stage
 * holds all of it), a WRITE body for device memory arrives in the next
 * TCP_DEV_STAGE bytes and is copied on when they are full or the body is
 * complete (one copy of a GPU costs ~15 us however small: fewer, larger
 * ones). The stage is page-locked where a device plugin offers it
 * (host_buffer_alloc): a GPU copies pageable memory at a third of the
 * speed. */
#define TCP_DEV_REPLY_STAGE (2048u << 10)
#define TCP_DEV_STAGE (1024u << 10)
/* Most READ replies of device memory staged at once. */
#define TCP_STAGE_PIECES 64u
/* Most WRITE bodies for device memory waiting in the stage to be copied on
 * together (their acknowledgments wait with them). */
#define TCP_PEND_MAX 64u

/* A WRITE body complete in the stage, not yet copied to device memory. */
typedef struct tcp_pend {
	te_buffer_pin pin;
	char *dst;
	uint32_t off, len; /* in the body part of the stage */
	bool v2;
} tcp_pend;

/* Bytes [off, off + len) of reply number `resp`'s data, at `pos` in the
 * connection's stage. */
typedef struct tcp_piece {
	uint64_t resp, off;
	uint32_t len, pos;
} tcp_piece;

enum tcp_sstate { SS_OPEN, SS_FLUSH, SS_LINGER };

struct tcp_sconn {
	tcp_io io;
	int state;
	uint8_t hbuf[TCP_HBUF];
	unsigned hlen;
	bool bulk;            /* the last request was a READ: read headers in bulk */
	/* the WRITE body being received */
	bool in_body;
	bool body_v2;
	char *body;
	uint64_t body_len, body_got;
	uint32_t body_staged; /* of body_got, bytes in the stage not yet copied on */
	/* Device WRITE bodies that fit in the stage whole are received one
	 * after the other into it and copied on in one batch (one wait for the
	 * device instead of one each) before any other reply goes out or the
	 * connection waits for bytes; their acknowledgments follow the batch.
	 * body_base: where the body being received starts in the stage. */
	bool body_defer;
	uint32_t body_base, pend_bytes;
	unsigned pend_n;
	tcp_pend *pend; /* TCP_PEND_MAX, allocated with the stage */
	te_buffer_pin body_pin;
	bool body_dev;        /* the body goes to device memory, through `stage` */
	/* Device memory's bytes pass through here (allocated at the first such
	 * request): the first TCP_DEV_REPLY_STAGE bytes hold the pieces of
	 * device READ replies listed in stage_piece (in reply order), the next
	 * TCP_DEV_STAGE the piece of a WRITE body being received. */
	char *stage;
	struct tcp_piece *stage_piece; /* TCP_STAGE_PIECES, after the stage's bytes */
	unsigned stage_n;
	int64_t linger_deadline;
	char host[64];        /* the peer's address without the port: its per-peer count */
	/* Fencing (tcp-fence.c). `started`: a frame was parsed (a HELLO must
	 * come first). A connection that said HELLO is on its lane's list; a
	 * FENCE of its lane and generation sets `fenced` from another thread and
	 * waits while `applying` is set: the owner sets `applying` around every
	 * write into a WRITE's destination and writes nothing once `fenced` is
	 * set. */
	bool started, hello;
	uint64_t lane, gen;
	tcp_lane *lane_rec;
	tcp_sconn *lane_prev, *lane_next;
	atomic_int fenced;
	atomic_int applying;
	tcp_resp *ring;
	uint64_t head, snd;   /* free-running */
	struct tcp_sg_rx *sg; /* a scatter-gather frame being taken in (tcp-sg.c), from the first one on */
};

/* A lane: the connections one initiator's connection slot opened to us, one
 * after the other; `floor`: the highest generation fenced (every
 * connection of the lane up to it may write nothing). Kept after its
 * connections close, so that a connection still in the accept queue when its
 * fence came is refused at its HELLO; the least recently used lane without
 * connections is forgotten when the table is full. */
struct tcp_lane {
	uint64_t id, floor;
	tcp_sconn *conns;
	tcp_lane *lru_prev, *lru_next;
};

/* A slice of a transfer the host ended, waiting to be completed. */
struct tcp_dead {
	te_transfer *t;
	bool counted;
	int64_t at; /* ns, when it was added */
};

/* ------------------------------------------------------------ the context */

struct tcp_ctx {
	const te_host *host;
	te_complete_many_fn complete_many; /* the host's, or NULL */
	tcp_config cfg;
	int listen_fd;
	int port;
	tcp_io listen_io;
	tcp_io listen_extra[TCP_MAX_RAILS]; /* rail addresses besides the bind address */
	unsigned nlisten_extra;
	char rails[TCP_MAX_RAILS][64];      /* TE_TCP_RAILS resolved to numeric addresses */
	unsigned nrails;
	tcp_io netlink_io;         /* rtnetlink link and address events (I/O thread 0), fd -1: none */
	/* Reading the link state again after events were lost (thread 0). */
	uint32_t link_pid;         /* the socket's netlink port id */
	uint32_t link_seq;         /* sequence number of the last dump asked for */
	bool link_dumping;         /* a dump is under way */
	bool link_dump_again;      /* events were lost during it, or it was cut short: another after it */
	bool link_dump_due;        /* asking for one failed or was refused: asked again at thread 0's next check */
	int64_t link_dump_at;      /* ms, when the one under way was asked for */
	tcp_thread *threads;
	unsigned nthreads;
	atomic_uint next_thread;   /* round robin for new peers */
	GMutex lock;               /* peers table */
	GHashTable *peers;         /* key → tcp_peer*, open ones */
	GPtrArray *all_peers;      /* every peer not yet freed */
	GHashTable *live_peers;    /* the same, as a set: a caller's remembered peer is checked in it */
	GMutex sleep_lock;         /* callers sleeping in progress() (see tcp-conn-caller.c) */
	struct tcp_sleeper *sleepers, *idle_sleepers;
	atomic_int inbound;        /* accepted connections open */
	GMutex inbound_lock;
	GHashTable *per_peer;      /* host → accepted connections open (inbound_lock) */
	bool auth;                 /* the engine has a key: authenticate every connection */
	bool metrics;              /* the host counts for its transports (ABI 1.6) */
	bool deadlines;            /* the host ends transfers early (ABI 1.11: transfer_enter and co.) */
	/* Slices of transfers the host ended, completed by I/O thread 0 a
	 * little later (tcp_dead_add): a completion made before the host has
	 * published the early end would be taken for the transfer's own. */
	atomic_int expiring;       /* expire() calls under way */
	GMutex dead_lock;
	GArray *dead;              /* tcp_dead */
	atomic_int ndead;
	GThreadPool *auth_pool;    /* accepted connections being authenticated */
	GMutex lanes_lock;         /* the lanes of accepted connections (tcp-fence.c) */
	GHashTable *lanes;         /* lane id → tcp_lane */
	tcp_lane *lru_head, *lru_tail;
	unsigned nlanes, max_lanes;
	atomic_int stopping;
};

/* tcp-io.c */
int tcp_threads_start(tcp_ctx *c);
void tcp_threads_stop(tcp_ctx *c);
void tcp_kick(tcp_io *io, unsigned mail);
void tcp_io_ready(tcp_io *io);           /* owner thread: service again soon */
/* Any thread: work was left on a connection of `t` behind its back (a
 * caller's): its timeouts are checked again (an idle thread checks none). */
void tcp_io_arm(tcp_thread *t);
int tcp_io_register(tcp_io *io, uint32_t events);
void tcp_io_unlist(tcp_io *io);          /* owner thread: forget a connection */
void tcp_io_list(tcp_thread *t, tcp_io *io);
/* Owner thread: a connection closed for good; freed (server) or counted out
 * of its peer (client) at the end of the thread's loop iteration. */
void tcp_io_bury(tcp_io *io);
int64_t tcp_now_ms(void);
void tcp_sockopts(tcp_ctx *c, int fd);
/* An accepted connection of `host` ends: its per-peer and total counts. */
void tcp_inbound_done(tcp_ctx *c, const char *host);
/* The auth pool's function: authenticates one accepted connection. */
void tcp_auth_job(gpointer job, gpointer ctx);

/* tcp-io.c: link events */
int tcp_link_open(tcp_ctx *c);          /* the rtnetlink socket, registered with I/O thread 0 */
void tcp_link_close(tcp_ctx *c);
void tcp_link_event(tcp_ctx *c);        /* thread 0: the socket is readable */
/* Thread 0's checks: asks again for a dump that asking failed for, or that
 * did not come; true while one is due or under way. */
bool tcp_link_resync(tcp_ctx *c, int64_t now);
int tcp_link_ifindex(const struct sockaddr *local); /* the interface holding a local address, 0: none */
bool tcp_link_same_ip(const struct sockaddr *a, const struct sockaddr *b);

/* tcp-fence.c: lanes and fences of accepted connections */
void tcp_lanes_init(tcp_ctx *c);
void tcp_lanes_free(tcp_ctx *c);
/* A HELLO or FENCE frame (its header `f`) on `sc`, in its owner thread;
 * `first`: nothing came before it. 1: a FENCE honoured (answer it), 0: a
 * HELLO taken, -1: the connection ends (logged). */
int tcp_sconn_frame(tcp_sconn *sc, const tcp_hdr *f, bool first);
/* A connection that ends leaves its lane. */
void tcp_sconn_unlane(tcp_sconn *sc);

/* tcp-sg.c: scatter-gather frames, the target's side. A frame's header
 * (`f`) begins one: 0, or -1 when it is malformed (logged; the
 * connection ends). While one is busy, its bytes go to it: first what came
 * in the header buffer (tcp_sg_feed: how many it took), then the socket
 * (tcp_sg_receive: 1 progress, 0 would block or the reply ring is full, -1
 * closed); tcp_sg_resume answers what waited for room in the reply ring.
 * A piece outside registered memory fails alone (status REJECTED). */
int tcp_sg_begin(tcp_sconn *sc, const tcp_hdr *f);
size_t tcp_sg_feed(tcp_sconn *sc, const uint8_t *buf, size_t len);
int tcp_sg_receive(tcp_sconn *sc);
int tcp_sg_resume(tcp_sconn *sc);
bool tcp_sg_busy(const tcp_sconn *sc);
void tcp_sg_free(tcp_sconn *sc); /* the connection ends: its pins go */

/* tcp-server.c */
/* Its helpers for tcp-sg.c: pins, touches of pinned memory, writes into a
 * WRITE's destination (false: fenced), replies, the device stage. */
int tcp_sconn_pin(tcp_sconn *sc, uint64_t addr, uint64_t size, te_buffer_pin *pin);
bool tcp_sconn_pin_is_device(tcp_sconn *sc, const te_buffer_pin *pin);
bool tcp_sconn_touch_begin(tcp_sconn *sc, const te_buffer_pin *pin);
void tcp_sconn_touch_end(tcp_sconn *sc, const te_buffer_pin *pin);
bool tcp_sconn_apply_begin(tcp_sconn *sc);
void tcp_sconn_apply_end(tcp_sconn *sc);
void tcp_sconn_push(tcp_sconn *sc, uint32_t code, const char *data, uint64_t len, const te_buffer_pin *pin,
		    bool dev);
bool tcp_sconn_stage_ready(tcp_sconn *sc);
bool tcp_sconn_fenced_close(tcp_sconn *sc);
tcp_sconn *tcp_sconn_new(tcp_ctx *c, int fd, const char *name);
void tcp_sconn_event(tcp_sconn *sc, uint32_t events);
void tcp_sconn_drive(tcp_sconn *sc);
void tcp_sconn_check_timeout(tcp_sconn *sc, int64_t now);
void tcp_sconn_close(tcp_sconn *sc, const char *why);
bool tcp_sconn_busy(const tcp_sconn *sc);

/* Names errno values and libte's own codes (the plugin cannot call te_strerror). */
static inline const char *tcp_strerror(int err)
{
	switch (err) {
	case TE_ERR_PROTOCOL: return "the peer broke the protocol";
	case TE_ERR_REJECTED: return "the peer rejected a request";
	case TE_ERR_AUTH: return "authentication failed (TE_AUTH_KEY_FILE missing or different)";
	case -ESHUTDOWN: return "the transport is shutting down";
	case -ECANCELED: return "canceled";
	default: return g_strerror(-err);
	}
}

/* Deadlines (plugin ABI 1.11). Every touch of a transfer's local memory is
 * bracketed by tcp_enter() (true: go on) and tcp_leave(); tcp_gate_closed()
 * asks whether the host ended the transfer. Without the host's support all
 * three say "go on". */
/* CLOCK_MONOTONIC in ns, the clock of the host's deadlines (te_now_ns()). */
static inline int64_t tcp_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline bool tcp_enter(const tcp_ctx *c, te_transfer *t)
{
	return !c->deadlines || c->host->transfer_enter(c->host, t) != 0;
}

static inline void tcp_leave(const tcp_ctx *c, te_transfer *t)
{
	if (c->deadlines)
		c->host->transfer_leave(c->host, t);
}

static inline bool tcp_gate_closed(const tcp_ctx *c, te_transfer *t)
{
	if (!tcp_enter(c, t))
		return true;
	tcp_leave(c, t);
	return false;
}

/* A transfer's WRITE slices whose bytes left without an answer yet
 * (plugin_data[3]): expire() tells the host the transfer is unsettled while
 * any is. Changed only inside the transfer's gate or as a slice ends. */
static inline void tcp_unsettled_add(te_transfer *t, long d)
{
	__atomic_fetch_add(&t->plugin_data[3], (uintptr_t)d, __ATOMIC_SEQ_CST);
}

static inline uintptr_t tcp_unsettled(te_transfer *t)
{
	return __atomic_load_n(&t->plugin_data[3], __ATOMIC_SEQ_CST);
}

#define TLOG(c, lvl, ...) ((c)->host->log((c)->host, (lvl), __VA_ARGS__))

/* Points where a test-only build of the plugin (tests/tcp/fence/fence-hooks.c,
 * built with TCP_TEST_HOOKS; never installed) slows a server thread down or
 * forces a connection suspect. In this plugin they compile to nothing. */
#ifdef TCP_TEST_HOOKS
void tcp_hook_apply(tcp_sconn *sc, bool inside);  /* before / inside a write into a destination */
void tcp_hook_settled(tcp_sconn *sc);             /* a WRITE body applied */
void tcp_hook_closed(tcp_sconn *sc);              /* a server connection closed */
void tcp_hook_hello(tcp_sconn *sc);               /* a HELLO taken */
void tcp_hook_fence(tcp_sconn *sc, unsigned n);   /* a FENCE honoured, ending n connections */
#define TCP_HOOK(call) call
#define TCP_HOOK_TRUE(call) (call)
#else
#define TCP_HOOK(call) ((void)0)
#define TCP_HOOK_TRUE(call) false
#endif

#endif
