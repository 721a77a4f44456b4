/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The initiator of test-tcp-rails.sh, run inside a network namespace with two
 * links (rails) to a target whose descriptor publishes an address on each:
 *
 *   tcp-rails SEGMENT DEV1 DEV2
 *
 * SEGMENT's first 32 MiB hold fill_pattern(seed 3) (tcp-peer target ... 3)
 * and are only read; the next 32 MiB are written and read back. Each phase
 * prints one "OK ..." line with what it measured, or a reason and exit 1:
 *
 *   OK both MIB1 MIB2 MS     both rails carried bytes (MiB on each link per
 *                            96 MiB round; a round took MS)
 *   OK failover MS T         DEV1 went down mid-batch (T tasks in flight);
 *                            every task completed, every byte right, MS
 *                            after the link went down
 *   OK return MS             DEV1 up again: MS until it carried bytes again
 *   OK alldown MS F N T      both down mid-batch (T tasks in flight): every
 *                            task ended (F of N FAILED, none COMPLETED
 *                            wrongly) MS after
 *   OK alldown-new MS N      a batch submitted with both down: all N FAILED
 *   OK bothback MS           both up: MS until both carried bytes again
 *
 *   tcp-rails SEGMENT DEV1 DEV2 lost
 *
 * after "OK both MS" (a round went over both rails, and took neither down,
 * within MS): DEV2 goes down (the rail goes down on the link event), then
 * comes back while this process is stopped, and a child of it reads
 * the engine's rtnetlink socket empty: the engine never learns that the link
 * is back. Its probes must find the rail anyway:
 *
 *   OK lost MS N             N "carrier back" messages taken from the
 *                            engine; DEV2's rail was up again MS after the
 *                            link (then it carried bytes)
 *
 *   tcp-rails SEGMENT DEV1 DEV2 enobufs SPARE
 *
 * after "OK both MS": DEV2 goes down (seen); then, while this process is
 * stopped and the engine's rtnetlink socket holds 4 KiB at most, SPARE (an
 * interface of no rail) goes down and up until the socket overflows, DEV1
 * goes down and DEV2 up: the events of both are lost (ENOBUFS). The engine
 * must read the link state again and act on it: DEV1's rail down, DEV2's
 * probed at once:
 *
 *   OK enobufs MS            DEV2's rail was up again MS after this process
 *                            went on; a round went all over DEV2, none over
 *                            DEV1; then DEV1 is up again (an event seen)
 *                            and both carry
 *
 * The per-link byte counts come from /sys/class/net/DEV/statistics, which the
 * namespace's own sysfs shows (ip netns exec mounts it).
 *
 *   tcp-rails loopback
 *
 * needs no root: TE_TCP_RAILS is checked on engines of this process (the
 * list published, the listeners, refusals), then a target engine on
 * 127.0.0.1 is published by a fake RPC
 * server whose descriptor lists the rails 127.0.0.1 and 127.0.0.2 (among
 * entries that must be skipped). Nothing listens on 127.0.0.2 at first
 * (refused: the rail goes down, no task fails); then a byte-counting relay
 * there to the target's port brings the rail back; then the relay drops its
 * connections mid-batch (reset: the rail's requests go over the other).
 */
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tcp-test.h"
#include "../metrics/metric-util.h"

#define MIB (1u << 20)
#define RD_AREA (32u * MIB) /* pattern, read only */
#define WR_AREA (32u * MIB) /* written, then read back */
#define SEED 3

static te_engine *e;
static te_segment_id seg;
static uint64_t rbase;
static unsigned char *local, *ref, *src;
static const char *dev[2];

/* Bytes sent and received on a link so far. */
static unsigned long long link_bytes(const char *d)
{
	unsigned long long sum = 0;
	const char *which[] = { "rx_bytes", "tx_bytes" };
	for (int i = 0; i < 2; i++) {
		char path[256];
		unsigned long long v = 0;
		snprintf(path, sizeof path, "/sys/class/net/%s/statistics/%s", d, which[i]);
		FILE *f = fopen(path, "r");
		if (f == NULL || fscanf(f, "%llu", &v) != 1) {
			fprintf(stderr, "tcp-rails: cannot read %s\n", path);
			exit(1);
		}
		fclose(f);
		sum += v;
	}
	return sum;
}

/* What `ip link set dev D up|down` does, without starting a process: a
 * batch on a fast machine can be over before `ip` even runs. */
static void link_set(const char *d, const char *state)
{
	struct ifreq ifr;
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	memset(&ifr, 0, sizeof ifr);
	snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", d);
	if (fd < 0 || ioctl(fd, SIOCGIFFLAGS, &ifr) < 0) {
		fprintf(stderr, "tcp-rails: flags of %s: %s\n", d, strerror(errno));
		exit(1);
	}
	if (strcmp(state, "up") == 0)
		ifr.ifr_flags |= IFF_UP;
	else
		ifr.ifr_flags &= ~IFF_UP;
	if (ioctl(fd, SIOCSIFFLAGS, &ifr) < 0) {
		fprintf(stderr, "tcp-rails: setting %s %s: %s\n", d, state, strerror(errno));
		exit(1);
	}
	close(fd);
}

static void links_set(const char *state)
{
	link_set(dev[0], state);
	link_set(dev[1], state);
}

/* One batch: `nr` 1 MiB READs of the pattern into distinct local MiBs, `nw`
 * 1 MiB WRITEs of `src` (seeded with `wseed`) into distinct MiBs of the
 * write area. Submitted; the caller waits. */
static te_batch_id submit_mixed(int nr, int nw, unsigned wseed)
{
	static te_request r[96];
	te_batch_id b;
	int n = 0;

	REQUIRE(nr <= 64 && nw <= 32);
	fill_pattern(src, (size_t)nw * MIB, wseed);
	memset(local, 0, (size_t)nr * MIB);
	for (int i = 0; i < nr; i++)
		r[n++] = (te_request){ TE_OP_READ, seg, local + (size_t)i * MIB,
				       rbase + (uint64_t)((i * 7) % 32) * MIB, MIB };
	for (int i = 0; i < nw; i++)
		r[n++] = (te_request){ TE_OP_WRITE, seg, src + (size_t)i * MIB, rbase + RD_AREA + (uint64_t)i * MIB,
				       MIB };
	REQUIRE(te_batch_alloc(e, (size_t)n, &b) == 0);
	REQUIRE(te_submit(e, b, r, (size_t)n) == 0);
	return b;
}

/* Every READ of a finished batch brought the right bytes. */
static bool reads_right(int nr)
{
	for (int i = 0; i < nr; i++)
		if (memcmp(local + (size_t)i * MIB, ref + (size_t)((i * 7) % 32) * MIB, MIB) != 0) {
			fprintf(stderr, "tcp-rails: READ %d brought wrong bytes\n", i);
			return false;
		}
	return true;
}

/* The write area holds what the last `nw` WRITEs sent (read back in one
 * request, over whichever rail). */
static bool writes_right(int nw)
{
	unsigned char *back = local + 64u * MIB;
	te_task_status st = { 0 };
	memset(back, 0, (size_t)nw * MIB);
	if (run_one(e, TE_OP_READ, seg, back, rbase + RD_AREA, (uint64_t)nw * MIB, &st) != TE_TASK_COMPLETED) {
		fprintf(stderr, "tcp-rails: reading the writes back: state %d error %s\n", st.state,
			te_strerror(st.error));
		return false;
	}
	if (memcmp(back, src, (size_t)nw * MIB) != 0) {
		fprintf(stderr, "tcp-rails: the written bytes came back different\n");
		return false;
	}
	return true;
}

/* Waits for a batch; counts its tasks by state. */
static void settle(te_batch_id b, int n, int wait_ms, int *completed, int *failed, int *other)
{
	te_batch_wait(e, b, wait_ms);
	*completed = *failed = *other = 0;
	for (int i = 0; i < n; i++) {
		te_task_status st = { 0 };
		te_get_status(e, b, (size_t)i, &st);
		if (st.state == TE_TASK_COMPLETED)
			(*completed)++;
		else if (st.state == TE_TASK_FAILED)
			(*failed)++;
		else
			(*other)++;
	}
}

/* A verified round; the MiB each link carried meanwhile. */
static bool round_on_links(double mib[2])
{
	unsigned long long b0[2] = { link_bytes(dev[0]), link_bytes(dev[1]) };
	int c, f, o;
	te_batch_id b = submit_mixed(64, 32, 11);
	settle(b, 96, 20000, &c, &f, &o);
	te_batch_free(e, b);
	for (int i = 0; i < 2; i++)
		mib[i] = (double)(link_bytes(dev[i]) - b0[i]) / MIB;
	if (c != 96) {
		fprintf(stderr, "tcp-rails: round: %d completed, %d failed, %d other\n", c, f, o);
		return false;
	}
	return reads_right(64) && writes_right(32);
}

/* Verified rounds until every link in `which` carried at least 4 MiB of
 * one round; ms taken, or -1 after 15 s. */
static long long until_used(bool which[2])
{
	long long t0 = now_ms();
	while (now_ms() - t0 < 15000) {
		double mib[2];
		bool ok = round_on_links(mib);
		if (ok && (!which[0] || mib[0] >= 4) && (!which[1] || mib[1] >= 4))
			return now_ms() - t0;
		usleep(50000);
	}
	return -1;
}

/* ------------------------------------------- lost link events (netns) */

/* IFF_LOWER_UP: <linux/if.h> has it, but clashes with <net/if.h>. */
#define LOWER_UP 0x10000

/* The engine's rtnetlink socket: the one netlink socket of this process
 * that listens to the link group (the TCP transport's link events). */
static int engine_netlink_fd(void)
{
	for (int fd = 3; fd < 4096; fd++) {
		int dom = 0, proto = -1;
		socklen_t l = sizeof dom;
		if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &l) < 0 || dom != AF_NETLINK)
			continue;
		l = sizeof proto;
		struct sockaddr_nl sa;
		socklen_t sl = sizeof sa;
		if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &l) == 0 && proto == NETLINK_ROUTE &&
		    getsockname(fd, (struct sockaddr *)&sa, &sl) == 0 && (sa.nl_groups & RTMGRP_LINK))
			return fd;
	}
	return -1;
}

/* link_set for a child: false instead of exit. */
static bool link_flags(const char *d, bool up)
{
	struct ifreq ifr;
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	bool ok = fd >= 0;

	memset(&ifr, 0, sizeof ifr);
	snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", d);
	if (ok && ioctl(fd, SIOCGIFFLAGS, &ifr) == 0) {
		if (up)
			ifr.ifr_flags |= IFF_UP;
		else
			ifr.ifr_flags &= ~IFF_UP;
		ok = ioctl(fd, SIOCSIFFLAGS, &ifr) == 0;
	} else {
		ok = false;
	}
	if (fd >= 0)
		close(fd);
	return ok;
}

/* Waits (3 s at most) until the kernel reports DEV operationally up: the
 * carrier's event has been sent by then. */
static bool wait_oper_up(const char *d)
{
	char path[128];
	snprintf(path, sizeof path, "/sys/class/net/%s/operstate", d);
	for (int i = 0; i < 300; i++) {
		char st[16] = "";
		FILE *f = fopen(path, "r");
		if (f != NULL) {
			if (fgets(st, sizeof st, f) == NULL)
				st[0] = '\0';
			fclose(f);
		}
		if (strncmp(st, "up", 2) == 0) {
			usleep(100000); /* the event follows the state */
			return true;
		}
		usleep(10000);
	}
	return false;
}

/* Runs fn(arg) in a child while this process, the engine's threads with it,
 * is stopped: whatever the kernel tells the engine meanwhile waits in its
 * sockets, unread. Returns fn's result (0..125), or -1. */
static int while_stopped(int (*fn)(void *), void *arg)
{
	pid_t parent = getpid();
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		int rc = 126;
		if (kill(parent, SIGSTOP) == 0) {
			for (int i = 0; i < 500 && !proc_stopped(parent); i++)
				usleep(2000);
			rc = proc_stopped(parent) ? fn(arg) : 126;
		}
		kill(parent, SIGCONT);
		_exit(rc);
	}
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) && WEXITSTATUS(st) < 126 ? WEXITSTATUS(st) : -1;
}

/* Messages in a netlink datagram saying interface `ifindex` is up with its
 * carrier. */
static int up_messages(const char *buf, ssize_t n, int ifindex)
{
	int count = 0, len = (int)n;
	for (const struct nlmsghdr *nh = (const void *)buf; NLMSG_OK(nh, (unsigned)len); nh = NLMSG_NEXT(nh, len)) {
		const struct ifinfomsg *ifi = NLMSG_DATA(nh);
		if (nh->nlmsg_type == RTM_NEWLINK && nh->nlmsg_len >= NLMSG_LENGTH(sizeof *ifi) &&
		    ifi->ifi_index == ifindex && (ifi->ifi_flags & IFF_UP) && (ifi->ifi_flags & LOWER_UP))
			count++;
	}
	return count;
}

typedef struct steal {
	int nl;          /* the engine's rtnetlink socket */
	const char *dev; /* the link to bring back */
} steal;

/* Child, the engine stopped: DEV up, then every message the engine's
 * socket holds read away. Returns how many said DEV is back (0: failed). */
static int steal_up(void *arg)
{
	steal *st = arg;
	union { char b[65536]; struct nlmsghdr h; } buf;
	int ifindex = (int)if_nametoindex(st->dev), got = 0;

	if (ifindex <= 0 || !link_flags(st->dev, true) || !wait_oper_up(st->dev))
		return 0;
	for (;;) {
		ssize_t n = recv(st->nl, buf.b, sizeof buf.b, MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == ENOBUFS)
			return 0; /* events lost: not what this test is about */
		if (n <= 0)
			break;
		got += up_messages(buf.b, n, ifindex);
	}
	return got > 100 ? 100 : got;
}

typedef struct flood {
	const char *spare, *down, *up;
} flood;

/* Child, the engine stopped (its socket holding 4 KiB at most): SPARE
 * flaps until the socket must have overflowed, then DOWN goes down and UP
 * comes up, their events lost. 1: done, 0: failed. */
static int overflow(void *arg)
{
	flood *f = arg;
	for (int i = 0; i < 32; i++)
		if (!link_flags(f->spare, i % 2 == 1))
			return 0;
	if (!link_flags(f->down, false) || !link_flags(f->up, true) || !wait_oper_up(f->up))
		return 0;
	return 1;
}

/* Waits (15 s at most) for a log line holding `what`: ms since `t0`, or -1. */
static long long log_after(const char *what, long long t0)
{
	while (!cap_has_quiet(what)) {
		if (now_ms() - t0 > 15000)
			return cap_has(what) ? now_ms() - t0 : -1;
		usleep(5000);
	}
	return now_ms() - t0;
}

static bool log_within(const char *what)
{
	return log_after(what, now_ms()) >= 0;
}

/* Takes DEV2 down and waits until the engine says so: its rtnetlink
 * socket then, or -1 (said why). */
static int second_down(void)
{
	int nl = engine_netlink_fd();
	if (nl < 0) {
		fprintf(stderr, "tcp-rails: the engine has no rtnetlink socket\n");
		return -1;
	}
	char line[128];
	snprintf(line, sizeof line, "is down (local interface %s", dev[1]);
	link_set(dev[1], "down");
	return log_within(line) ? nl : -1;
}

/* "lost": DEV2's return is never told to the engine; its probes find it. */
static int lost_main(void)
{
	int nl = second_down();
	if (nl < 0)
		return 1;
	char line[128];
	steal st = { nl, dev[1] };
	int got = while_stopped(steal_up, &st);
	long long t0 = now_ms();
	if (got <= 0) {
		fprintf(stderr, "tcp-rails: no message saying %s is back was taken from the engine (%d)\n", dev[1], got);
		return 1;
	}
	/* The rail is back once a probe connects (the time a round takes
	 * under a sanitizer on a loaded machine is not the plugin's). */
	long long back = log_after("is up again", t0);
	snprintf(line, sizeof line, "local interface %s has its carrier again", dev[1]);
	if (cap_has_quiet(line)) {
		fprintf(stderr, "tcp-rails: the engine saw %s come back: nothing tested\n", dev[1]);
		return 1;
	}
	if (back < 0 || until_used((bool[2]){ false, true }) < 0) {
		fprintf(stderr, "tcp-rails: %s up again but unused after 15 s\n", dev[1]);
		return 1;
	}
	printf("OK lost %lld %d\n", back, got);
	return 0;
}

/* "enobufs": events lost in an overflow; the link state read again. */
static int enobufs_main(const char *spare)
{
	int nl = second_down();
	if (nl < 0)
		return 1;
	char line[128];
	/* A small buffer overflows after a few events (the kernel doubles
	 * the value and keeps a minimum of its own). */
	int rcvbuf = 0, small = 2048;
	socklen_t l = sizeof rcvbuf;
	REQUIRE(getsockopt(nl, SOL_SOCKET, SO_RCVBUF, &rcvbuf, &l) == 0);
	REQUIRE(setsockopt(nl, SOL_SOCKET, SO_RCVBUF, &small, sizeof small) == 0);
	flood f = { spare, dev[0], dev[1] };
	int rc = while_stopped(overflow, &f);
	long long t0 = now_ms();
	rcvbuf /= 2;
	REQUIRE(setsockopt(nl, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf) == 0);
	if (rc != 1) {
		fprintf(stderr, "tcp-rails: flooding the link events failed\n");
		return 1;
	}
	if (!log_within("link events lost"))
		return 1;
	/* Both states come from the state read again: the events were lost. */
	snprintf(line, sizeof line, "local interface %s has its carrier again", dev[1]);
	if (!log_within(line))
		return 1;
	snprintf(line, sizeof line, "local interface %s is down", dev[0]);
	long long back = log_after("is up again", t0);
	if (!log_within(line) || back < 0)
		return 1;
	/* DEV2 carries it all, DEV1 (down) nothing: its rail went down too. */
	double mib[2];
	unsigned long long b1 = link_bytes(dev[0]);
	if (!round_on_links(mib))
		return 1;
	if (link_bytes(dev[0]) != b1 || mib[1] < 64) {
		fprintf(stderr, "tcp-rails: %s down and %s back: %.1f MiB over %s, %llu bytes over %s\n", dev[0], dev[1],
			mib[1], dev[1], link_bytes(dev[0]) - b1, dev[0]);
		return 1;
	}
	link_set(dev[0], "up");
	if (until_used((bool[2]){ true, true }) < 0) {
		fprintf(stderr, "tcp-rails: both links up again, not both used after 15 s\n");
		return 1;
	}
	printf("OK enobufs %lld\n", back);
	return 0;
}

/* ------------------------------------------------------ loopback mode */

/* Listens on 127.0.0.2:port and relays each connection to 127.0.0.1:port,
 * counting the bytes; `drop` closes every relayed connection at once. */
#define RELAY_MAX 16
typedef struct relay {
	int lfd, port;
	pthread_t th;
	atomic_int stop, drop;
	atomic_ullong bytes;
	atomic_int conns;
} relay;

static void *relay_main(void *arg)
{
	relay *r = arg;
	int a[RELAY_MAX], b[RELAY_MAX], n = 0;
	static char buf[1 << 16];

	while (!atomic_load(&r->stop)) {
		if (atomic_exchange(&r->drop, 0)) {
			for (int i = 0; i < n; i++) {
				/* A reset, as a broken path would give. */
				struct linger lg = { 1, 0 };
				setsockopt(a[i], SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
				close(a[i]);
				close(b[i]);
			}
			n = 0;
		}
		struct pollfd pf[1 + 2 * RELAY_MAX];
		pf[0] = (struct pollfd){ .fd = r->lfd, .events = POLLIN };
		for (int i = 0; i < n; i++) {
			pf[1 + 2 * i] = (struct pollfd){ .fd = a[i], .events = POLLIN };
			pf[2 + 2 * i] = (struct pollfd){ .fd = b[i], .events = POLLIN };
		}
		if (poll(pf, (nfds_t)(1 + 2 * n), 50) <= 0)
			continue;
		if ((pf[0].revents & POLLIN) && n < RELAY_MAX) {
			int c = accept(r->lfd, NULL, NULL);
			int d = socket(AF_INET, SOCK_STREAM, 0);
			struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons((uint16_t)r->port) };
			to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
			if (c >= 0 && d >= 0 && connect(d, (struct sockaddr *)&to, sizeof to) == 0) {
				a[n] = c;
				b[n++] = d;
				atomic_fetch_add(&r->conns, 1);
			} else {
				if (c >= 0)
					close(c);
				if (d >= 0)
					close(d);
			}
		}
		int live = 0;
		for (int i = 0; i < n; i++) {
			bool dead = false;
			for (int k = 0; k < 2 && !dead; k++) {
				struct pollfd *p = &pf[1 + 2 * i + k];
				if (!(p->revents & (POLLIN | POLLHUP | POLLERR)))
					continue;
				ssize_t got = recv(p->fd, buf, sizeof buf, MSG_DONTWAIT);
				if (got < 0 && (errno == EAGAIN || errno == EINTR))
					continue;
				/* Blocking writes: the other side reads all the time. */
				dead = got <= 0 || !send_all(k == 0 ? b[i] : a[i], buf, (size_t)got);
				if (!dead)
					atomic_fetch_add(&r->bytes, (unsigned long long)got);
			}
			if (dead) {
				close(a[i]);
				close(b[i]);
			} else {
				a[live] = a[i];
				b[live++] = b[i];
			}
		}
		n = live;
	}
	for (int i = 0; i < n; i++) {
		close(a[i]);
		close(b[i]);
	}
	return NULL;
}

static void relay_start(relay *r, int port)
{
	int one = 1;
	struct sockaddr_in at = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	inet_pton(AF_INET, "127.0.0.2", &at.sin_addr);
	memset(r, 0, sizeof *r);
	r->port = port;
	r->lfd = socket(AF_INET, SOCK_STREAM, 0);
	REQUIRE(r->lfd >= 0);
	setsockopt(r->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	REQUIRE(bind(r->lfd, (struct sockaddr *)&at, sizeof at) == 0);
	REQUIRE(listen(r->lfd, 16) == 0);
	REQUIRE(pthread_create(&r->th, NULL, relay_main, r) == 0);
}

static void relay_stop(relay *r)
{
	atomic_store(&r->stop, 1);
	pthread_join(r->th, NULL);
	close(r->lfd);
}

/* 32 READs of 256 KiB of the target's pattern, checked: all completed with
 * the right bytes? With `drop`, that relay resets its connections once the
 * batch is submitted; `what` names the round in what is said. */
static bool lo_round(relay *drop, const char *what)
{
	static te_request r[32];
	te_batch_id b;
	int c, f, o;
	memset(local, 0, 8u * MIB);
	for (int i = 0; i < 32; i++)
		r[i] = (te_request){ TE_OP_READ, seg, local + (size_t)i * 256 * 1024,
				     rbase + (uint64_t)((i * 5) % 32) * 256 * 1024, 256 * 1024 };
	REQUIRE(te_batch_alloc(e, 32, &b) == 0);
	REQUIRE(te_submit(e, b, r, 32) == 0);
	if (drop != NULL)
		atomic_store(&drop->drop, 1);
	settle(b, 32, 20000, &c, &f, &o);
	te_batch_free(e, b);
	if (c != 32) {
		fprintf(stderr, "tcp-rails: %s: %d completed, %d failed, %d other\n", what, c, f, o);
		return false;
	}
	for (int i = 0; i < 32; i++)
		if (memcmp(local + (size_t)i * 256 * 1024, ref + (size_t)((i * 5) % 32) * 256 * 1024, 256 * 1024) != 0) {
			fprintf(stderr, "tcp-rails: %s: READ %d brought wrong bytes\n", what, i);
			return false;
		}
	return true;
}

/* The descriptor an engine publishes holds `want`. */
static bool publishes(te_engine *x, const char *want)
{
	char *d = rpc_exchange(te_engine_rpc_port(x), 1, "{}");
	bool ok = d != NULL && strstr(d, want) != NULL;
	if (!ok)
		fprintf(stderr, "tcp-rails: descriptor lacks %s: %.600s\n", want, d ? d : "(none)");
	free(d);
	return ok;
}

/* TE_TCP_RAILS: what is published, where the data port listens, and
 * refusals that name the bad item. */
static bool rails_option(void)
{
	char port[16];
	snprintf(port, sizeof port, "%d", free_port());
	/* lo stands for 127.0.0.1, listed once. */
	te_option o1[3] = { { "TE_TCP_RAILS", "127.0.0.3, lo,127.0.0.1" }, { "TE_TCP_BIND_ADDRESS", "127.0.0.1" },
			    { "TE_TCP_PORT", port } };
	te_engine *x = tcp_engine(o1, 3);
	if (x == NULL)
		return false;
	bool ok = publishes(x, "\"tcp_data_addresses\":[\"127.0.0.3\",\"127.0.0.1\"]");
	/* The bind address and each rail listen; another address does not. */
	ok = ok && try_connect("127.0.0.1", atoi(port)) == 0 && try_connect("127.0.0.3", atoi(port)) == 0 &&
	     try_connect("127.0.0.4", atoi(port)) == -ECONNREFUSED;
	te_engine_destroy(x);
	if (!ok) {
		fprintf(stderr, "tcp-rails: TE_TCP_RAILS with a bind address: wrong descriptor or listeners\n");
		return false;
	}
	struct {
		const char *v, *line;
	} bad[] = {
		{ "127.0.0.1,10.9.9.9", "10.9.9.9 is not an address of this host" },
		{ "nosuchif0", "'nosuchif0' is neither a numeric address nor an interface" },
		{ " , ", "TE_TCP_RAILS is set but names no address" },
		{ "127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4,127.0.0.5,127.0.0.6,127.0.0.7,127.0.0.8,127.0.0.9",
		  "TE_TCP_RAILS: more than 8 addresses" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		te_option ob[2] = { { "TE_TCP_RAILS", bad[i].v } };
		cap_start();
		x = NULL;
		te_option full[2] = { { "transports", "tcp" }, ob[0] };
		int rc = te_engine_create("P2PHANDSHAKE", "127.0.0.1", full, 2, &x);
		if (rc >= 0 || x != NULL) {
			fprintf(stderr, "tcp-rails: TE_TCP_RAILS='%s' accepted\n", bad[i].v);
			if (x)
				te_engine_destroy(x);
			return false;
		}
		if (!cap_has(bad[i].line))
			return false;
	}
	return true;
}

static int loopback_main(void)
{
	te_set_log_level(TE_LOG_INFO);
	cap_start();
	if (!rails_option())
		return 1;
	printf("OK option\n");
	cap_start();
	/* The target: 8 MiB of pattern, data port on 127.0.0.1 only. */
	/* Its port from below the ephemeral range: the relay binds it on
	 * 127.0.0.2 later, where a neighbour test's outgoing connection may
	 * hold any ephemeral port. */
	char port[16];
	snprintf(port, sizeof port, "%d", free_port());
	te_option topt[2] = { { "TE_TCP_BIND_ADDRESS", "127.0.0.1" }, { "TE_TCP_PORT", port } };
	te_engine *t = tcp_engine(topt, 2);
	REQUIRE(t != NULL);
	unsigned char *tbuf = map_buf(8u * MIB);
	fill_pattern(tbuf, 8u * MIB, SEED);
	REQUIRE(te_register_memory(t, tbuf, 8u * MIB, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
	int dport = data_port_of(t);
	REQUIRE(dport > 0);
	/* Without TE_TCP_RAILS: the engine's own address, and that alone. */
	if (!publishes(t, "\"tcp_data_addresses\":[\"127.0.0.1\"]"))
		return 1;
	ref = map_buf(8u * MIB);
	memcpy(ref, tbuf, 8u * MIB);

	/* Its descriptor as a peer would publish it with two rails, plus
	 * entries a careful reader skips. */
	fake f;
	fake_listen(&f, false);
	const char *name = f.name;
	snprintf(f.desc, sizeof f.desc,
		 "{\"buffers\":[{\"addr\":%llu,\"length\":%u,\"name\":\"%s\"}],\"name\":\"%s\","
		 "\"protocol\":\"tcp\",\"tcp_data_addresses\":[\"127.0.0.1\",7,\"not-an-address\",{},"
		 "\"127.0.0.2\",\"127.0.0.1\"],\"tcp_data_port\":%d,\"tcp_proto_version\":2,"
		 "\"timestamp\":\"2026-01-01 00:00:00.000000\"}",
		 (unsigned long long)(uintptr_t)tbuf, 8u * MIB, name, name, dport);
	fake_serve(&f);

	te_option iopt[3] = { { "TE_TCP_CONNS_PER_PEER", "2" }, { "TE_TCP_TIMEOUT_MS", "2000" },
			      { "TE_TCP_CONNECT_TIMEOUT_MS", "1000" } };
	e = tcp_engine(iopt, 3);
	REQUIRE(e != NULL);
	local = map_buf(8u * MIB);
	REQUIRE(te_register_memory(e, local, 8u * MIB, "cpu:0", 0) == 0);
	seg = te_segment_open(e, name);
	REQUIRE(seg > 0);
	rbase = (uintptr_t)tbuf;
	int rc = 1;

	/* Rail 127.0.0.2 refuses: it goes down, and no task fails for it. */
	for (int i = 0; i < 3; i++)
		if (!lo_round(NULL, "loopback round"))
			goto out;
	if (!cap_has("tcp_data_addresses[1] is not a numeric address") ||
	    !cap_has("tcp_data_addresses[2] is not a numeric address") ||
	    !cap_has("tcp_data_addresses[3] is not a numeric address"))
		goto out;
	char down[96];
	snprintf(down, sizeof down, "rail 127.0.0.2:%d of 127.0.0.1:%d is down", dport, dport);
	if (!cap_has(down))
		goto out;
	printf("OK refused\n");

	/* Something answers there now: the rail is tried again and carries. */
	relay r;
	relay_start(&r, dport);
	long long t0 = now_ms();
	while (atomic_load(&r.bytes) < 4u * MIB && now_ms() - t0 < 10000)
		if (!lo_round(NULL, "loopback round"))
			goto out_relay;
	if (atomic_load(&r.bytes) < 4u * MIB) {
		fprintf(stderr, "tcp-rails: the returned rail carried %llu bytes in 10 s\n",
			(unsigned long long)atomic_load(&r.bytes));
		goto out_relay;
	}
	char up[96];
	snprintf(up, sizeof up, "rail 127.0.0.2:%d of 127.0.0.1:%d is up again", dport, dport);
	if (!cap_has(up))
		goto out_relay;
	printf("OK back %lld\n", now_ms() - t0);

	/* Reset mid-batch on that rail: its requests go over the other. */
	cap_start();
	bool moved = false;
	/* The requests moved are counted as fail-overs (docs/metrics.md), of
	 * the rail's device and so of the transport. */
	bool counts = engine_counts(e);
	long long fo0 = counts ? transport_metric(e, "te_transport_failovers_total", "tcp") : 0;
	long long dfo0 = counts ? transport_sum(e, "te_device_failovers_total", "tcp") : 0;
	if (fo0 < 0 || dfo0 < 0) {
		fprintf(stderr, "tcp-rails: no fail-over counters\n");
		goto out_relay;
	}
	for (int tries = 0; tries < 20 && !moved; tries++) {
		if (!lo_round(&r, "relay reset"))
			goto out_relay;
		/* Only a reset that caught requests on the rail tests anything. */
		moved = cap_has_quiet("requests go to the other rails") &&
			(!counts || transport_metric(e, "te_transport_failovers_total", "tcp") > fo0);
		usleep(1100 * 1000); /* the rail's next try brings it back */
	}
	if (!moved) {
		fprintf(stderr, "tcp-rails: no reset caught requests on the relayed rail in 20 tries\n");
		goto out_relay;
	}
	long long fo = counts ? transport_metric(e, "te_transport_failovers_total", "tcp") - fo0 : 0;
	long long dfo = counts ? transport_sum(e, "te_device_failovers_total", "tcp") - dfo0 : 0;
	if (counts && (fo < 1 || dfo != fo)) {
		fprintf(stderr, "tcp-rails: %lld fail-overs counted, %lld of them on devices\n", fo, dfo);
		goto out_relay;
	}
	printf("OK reset %lld fail-overs\n", fo);
	rc = 0;
out_relay:
	relay_stop(&r);
out:
	te_segment_close(e, seg);
	te_engine_destroy(e);
	fake_stop(&f);
	te_engine_destroy(t);
	return rc;
}

int main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "loopback") == 0)
		return loopback_main();
	const char *mode = argc >= 5 ? argv[4] : "";
	if (!(argc == 4 || (argc == 5 && strcmp(mode, "lost") == 0) || (argc == 6 && strcmp(mode, "enobufs") == 0))) {
		fprintf(stderr, "usage: tcp-rails SEGMENT DEV1 DEV2 [lost | enobufs SPARE] | loopback\n");
		return 2;
	}
	dev[0] = argv[2];
	dev[1] = argv[3];
	te_option opt[3] = { { "transports", "tcp" }, { "TE_TCP_TIMEOUT_MS", "1000" },
			     { "TE_TCP_CONNECT_TIMEOUT_MS", "1000" } };
	const char *me = getenv("TCP_PEER_NAME");
	REQUIRE(te_engine_create("P2PHANDSHAKE", me ? me : "127.0.0.1", opt, 3, &e) == 0);
	/* 64 MiB for reads, 32 for write sources, 32 to read writes back. */
	local = map_buf(96u * MIB);
	src = map_buf(WR_AREA);
	ref = map_buf(RD_AREA);
	REQUIRE(te_register_memory(e, local, 96u * MIB, "cpu:0", 0) == 0);
	REQUIRE(te_register_memory(e, src, WR_AREA, "cpu:0", 0) == 0);
	seg = te_segment_open(e, argv[1]);
	if (seg < 0) {
		fprintf(stderr, "tcp-rails: cannot open %s: %s\n", argv[1], te_strerror(seg));
		return 1;
	}
	te_segment_buffer sb;
	REQUIRE(te_segment_buffers(e, seg, &sb, 1) >= 1);
	REQUIRE(sb.length >= RD_AREA + WR_AREA);
	rbase = sb.addr;
	/* The target filled its whole buffer from one seed: the first 32 MiB of
	 * that pattern is what reads must bring. */
	unsigned char *whole = map_buf(sb.length);
	fill_pattern(whole, sb.length, SEED);
	memcpy(ref, whole, RD_AREA);
	munmap(whole, sb.length);

	if (mode[0] != '\0') {
		/* Both rails carry (their interfaces are known) in a round that
		 * took none down (a loaded machine can stall one past the 1 s
		 * timeout), then the mode. */
		te_set_log_level(TE_LOG_INFO);
		long long t0 = now_ms(), ms = -1;
		while (ms < 0 && now_ms() - t0 < 30000) {
			double mib[2];
			cap_start();
			if (!round_on_links(mib))
				return 1;
			if (mib[0] >= 4 && mib[1] >= 4 && !cap_has_quiet("is down"))
				ms = now_ms() - t0;
		}
		if (ms < 0) {
			fprintf(stderr, "tcp-rails: no round over both rails without one going down in 30 s\n");
			return 1;
		}
		printf("OK both %lld\n", ms);
		fflush(stdout);
		cap_start();
		int rc = strcmp(mode, "lost") == 0 ? lost_main() : enobufs_main(argv[5]);
		if (rc != 0) {
			pthread_mutex_lock(&cap_lock);
			fprintf(stderr, "--- the engine's log:\n%s", cap_buf);
			pthread_mutex_unlock(&cap_lock);
		}
		te_segment_close(e, seg);
		te_engine_destroy(e);
		return rc;
	}

	/* (a) both rails up: both carry. */
	double mib[2], sum[2] = { 0, 0 };
	long long ta = now_ms();
	/* Up to three rounds, for a loaded machine where one rail's threads
	 * started late: each rail must have carried a sixth of it. */
	int rounds = 0;
	while (rounds < 3 && (rounds == 0 || sum[0] < 16 * rounds || sum[1] < 16 * rounds)) {
		if (!round_on_links(mib))
			return 1;
		sum[0] += mib[0];
		sum[1] += mib[1];
		rounds++;
	}
	ta = (now_ms() - ta) / rounds;
	if (sum[0] < 16 * rounds || sum[1] < 16 * rounds) {
		fprintf(stderr, "tcp-rails: %d MiB moved, %.1f MiB over %s and %.1f over %s: not spread\n", 96 * rounds,
			sum[0], dev[0], sum[1], dev[1]);
		return 1;
	}
	printf("OK both %.1f %.1f %lld\n", sum[0] / rounds, sum[1] / rounds, ta);
	fflush(stdout);

	/* (b) rail 1 down mid-batch: every task completes, every byte right. */
	te_batch_id b = submit_mixed(64, 32, 21);
	link_set(dev[0], "down");
	long long t0 = now_ms();
	size_t in_flight = 0;
	te_batch_status(e, b, NULL, &in_flight, NULL);
	int c, f, o;
	settle(b, 96, 20000, &c, &f, &o);
	long long dt = now_ms() - t0;
	te_batch_free(e, b);
	if (in_flight == 0) {
		fprintf(stderr, "tcp-rails: the batch was over before the link went down: nothing tested\n");
		return 1;
	}
	if (c != 96) {
		fprintf(stderr, "tcp-rails: after %s went down: %d completed, %d failed, %d other\n", dev[0], c, f, o);
		return 1;
	}
	if (!reads_right(64) || !writes_right(32))
		return 1;
	printf("OK failover %lld %zu\n", dt, in_flight);
	fflush(stdout);
	/* Still going on the other rail alone. */
	if (!round_on_links(mib) || mib[1] < 64) {
		fprintf(stderr, "tcp-rails: with %s down: %.1f MiB over %s\n", dev[0], mib[1], dev[1]);
		return 1;
	}

	/* (b') rail 1 back: used again once its probe answers. */
	link_set(dev[0], "up");
	long long back = until_used((bool[2]){ true, false });
	if (back < 0) {
		fprintf(stderr, "tcp-rails: %s up again but unused after 15 s\n", dev[0]);
		return 1;
	}
	printf("OK return %lld\n", back);
	fflush(stdout);

	/* (c) both down mid-batch: every task ends, none stuck. */
	b = submit_mixed(64, 32, 31);
	links_set("down");
	t0 = now_ms();
	te_batch_status(e, b, NULL, &in_flight, NULL);
	settle(b, 96, 20000, &c, &f, &o);
	dt = now_ms() - t0;
	/* A READ that ended COMPLETED (before the links went) must be right. */
	for (int i = 0; i < 64; i++) {
		te_task_status st = { 0 };
		te_get_status(e, b, (size_t)i, &st);
		if (st.state == TE_TASK_COMPLETED &&
		    memcmp(local + (size_t)i * MIB, ref + (size_t)((i * 7) % 32) * MIB, MIB) != 0) {
			fprintf(stderr, "tcp-rails: READ %d COMPLETED with wrong bytes\n", i);
			return 1;
		}
	}
	te_batch_free(e, b);
	/* A fast round can end before both links are down (it takes two
	 * `ip link` runs): then nothing was in flight to fail, every task
	 * completed and its bytes were checked above; the batch below still
	 * meets both links down. */
	if (o == 0 && f == 0 && c == 96 && in_flight == 0) {
		fprintf(stderr, "tcp-rails: the batch ended before both links were down (%lld ms)\n", dt);
	} else if (o != 0 || f == 0) {
		fprintf(stderr, "tcp-rails: both down: %d completed, %d failed, %d not ended after %lld ms (%zu in flight)\n",
			c, f, o, dt, in_flight);
		return 1;
	}
	printf("OK alldown %lld %d 96 %zu\n", dt, f, in_flight);
	fflush(stdout);
	/* And a batch submitted while both are down fails whole. */
	b = submit_mixed(16, 0, 41);
	t0 = now_ms();
	settle(b, 16, 20000, &c, &f, &o);
	dt = now_ms() - t0;
	te_batch_free(e, b);
	if (f != 16) {
		fprintf(stderr, "tcp-rails: new batch with both down: %d completed, %d failed, %d other\n", c, f, o);
		return 1;
	}
	printf("OK alldown-new %lld 16\n", dt);
	fflush(stdout);

	/* (d) both back: both used again. */
	links_set("up");
	back = until_used((bool[2]){ true, true });
	if (back < 0) {
		fprintf(stderr, "tcp-rails: both links up again, not both used after 15 s\n");
		return 1;
	}
	printf("OK bothback %lld\n", back);
	fflush(stdout);
	te_segment_close(e, seg);
	te_engine_destroy(e);
	return 0;
}
