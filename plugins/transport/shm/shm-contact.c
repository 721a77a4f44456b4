/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The initiator's first contact with a target on this host: reading the
 * "libte_shm" field of its descriptor, connecting to its unix socket and
 * checking who holds it, receiving its control block and shared
 * allocations (memfds, device exports) and mapping or opening them, and
 * deciding whether this transport can reach the whole segment (cross-memory
 * attach, or shared allocations only). shm_seg is what it leaves behind;
 * shm-copy.c moves the data through it.
 */
#include <errno.h>
#include <json-glib/json-glib.h>
#include <te/te-json.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "shm.h"

#define CONNECT_TIMEOUT_MS 2000

typedef struct peer_desc {
	char host[SHM_HOST_MAX];
	char socket[108];
	int64_t pid, uid;
} peer_desc;

/* The descriptor's "libte_shm" object; -ENOENT when it has none. */
static int parse_desc(shm_ctx *c, const te_segment_info *seg, peer_desc *pd)
{
	static const te_json_limits lim = TE_JSON_LIMITS_DEFAULT;
	char why[160] = "";
	JsonNode *root = NULL;
	uint64_t version = 0, pid = 0, uid = 0;
	int rc = -ENOENT;

	if (seg->descriptor == NULL)
		return rc;
	/* Only our member: the descriptor lists every buffer of the peer. */
	static const char *const fields[] = { SHM_FIELD, NULL };
	root = te_json_load_members(seg->descriptor, strlen(seg->descriptor), &lim, fields, why, sizeof why);
	if (root == NULL) {
		SLOG(c, TE_LOG_WARN, "shm: segment %s: descriptor refused: %s", seg->name, why);
		return -EPROTO;
	}
	if (!JSON_NODE_HOLDS_OBJECT(root))
		goto out;
	JsonNode *n = json_object_get_member(json_node_get_object(root), SHM_FIELD);
	if (n == NULL || !JSON_NODE_HOLDS_OBJECT(n))
		goto out;
	JsonObject *o = json_node_get_object(n);
	rc = -EPROTO;
	if (te_json_get_u64(o, "version", UINT32_MAX, &version) < 0 || version != SHM_VERSION) {
		SLOG(c, TE_LOG_INFO, "shm: segment %s speaks another version of this transport", seg->name);
		goto out;
	}
	JsonNode *hn = json_object_get_member(o, "host"), *sn = json_object_get_member(o, "socket");
	const char *host = hn && json_node_get_value_type(hn) == G_TYPE_STRING ? json_node_get_string(hn) : NULL;
	const char *sock = sn && json_node_get_value_type(sn) == G_TYPE_STRING ? json_node_get_string(sn) : NULL;
	if (host == NULL || sock == NULL || strlen(host) >= sizeof pd->host || strlen(sock) >= sizeof pd->socket ||
	    te_json_get_u64(o, "pid", INT32_MAX, &pid) < 0 || te_json_get_u64(o, "uid", UINT32_MAX, &uid) < 0) {
		SLOG(c, TE_LOG_WARN, "shm: segment %s: bad \"%s\" fields (host, socket, pid, uid)", seg->name,
		     SHM_FIELD);
		goto out;
	}
	snprintf(pd->host, sizeof pd->host, "%s", host);
	snprintf(pd->socket, sizeof pd->socket, "%s", sock);
	pd->pid = (int64_t)pid;
	pd->uid = (int64_t)uid;
	rc = pd->pid > 0 ? 0 : -EPROTO;
out:
	json_node_unref(root);
	return rc;
}

static int connect_unix(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	struct timeval tv = { .tv_sec = CONNECT_TIMEOUT_MS / 1000, .tv_usec = 0 };

	if (fd < 0)
		return -errno;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		int rc = -errno;
		close(fd);
		return rc;
	}
	return fd;
}

/* Receives the welcome and its memfds. */
static int recv_welcome(int fd, shm_welcome *w, int *fds, unsigned *nfds)
{
	union {
		char buf[CMSG_SPACE((1 + SHM_MAX_EXPORTS) * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = { w, sizeof *w };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf };
	ssize_t r = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);

	*nfds = 0;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); r >= 0 && cm != NULL; cm = CMSG_NXTHDR(&m, cm)) {
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
			unsigned k = (unsigned)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			for (unsigned i = 0; i < k; i++) {
				int f;
				memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof f);
				if (*nfds < 1 + SHM_MAX_EXPORTS)
					fds[(*nfds)++] = f;
				else
					close(f);
			}
		}
	}
	if (r < 0)
		return -errno;
	if ((m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || (size_t)r < offsetof(shm_welcome, exports) ||
	    w->magic != SHM_MAGIC || w->version != SHM_VERSION || w->nexports > SHM_MAX_EXPORTS ||
	    (size_t)r != offsetof(shm_welcome, exports) + w->nexports * sizeof w->exports[0])
		return -EPROTO;
	w->host[sizeof w->host - 1] = '\0';
	for (unsigned i = 0; i < w->nexports; i++) {
		shm_export_wire *x = &w->exports[i];
		if (x->kind > EXPORT_DEVICE || x->has_fd > 1 || (x->kind == EXPORT_HOST && !x->has_fd) ||
		    (x->kind == EXPORT_DEVICE && (memchr(x->location, '\0', sizeof x->location) == NULL ||
						  x->ipc.size != sizeof x->ipc ||
						  x->ipc.handle_len > sizeof x->ipc.handle)))
			return -EPROTO;
	}
	return 0;
}

/* The descriptors the welcome's exports have, the control block's first. */
static unsigned welcome_fds(const shm_welcome *w)
{
	unsigned n = 1;
	for (unsigned i = 0; i < w->nexports; i++)
		n += w->exports[i].has_fd;
	return n;
}

static void seg_free(shm_seg *s)
{
	const te_host *h = s->ctx->host;

	for (unsigned i = 0; i < s->nmaps; i++) {
		if (s->maps[i].local == NULL)
			continue;
		if (!s->maps[i].device)
			munmap(s->maps[i].local, s->maps[i].size);
		else if (!s->self)
			h->device_ipc_close(h, s->maps[i].location, s->maps[i].local);
	}
	if (s->ctl != NULL)
		munmap(s->ctl, s->ctl_size);
	if (s->fd >= 0)
		close(s->fd);
	free(s);
}

/* Whether a descriptor buffer can be reached without cross-memory attach:
 * it lies in one of the target's shared allocations. */
static bool shared_covers(const shm_seg *s, uint64_t addr, uint64_t len)
{
	for (unsigned i = 0; i < s->nmaps; i++)
		if (s->maps[i].local != NULL && addr >= s->maps[i].base && addr - s->maps[i].base <= s->maps[i].size &&
		    len <= s->maps[i].size - (addr - s->maps[i].base))
			return true;
	return false;
}

/* Whether a buffer of the descriptor lies in the target's device memory
 * that this process cannot reach: the target's device plugin could not
 * export it, or ours could not open the export. Then another transport
 * (TCP, staging on the target's side) serves the segment. */
static bool device_unreachable(shm_seg *s, const te_segment_info *seg)
{
	const shm_slot *sl = SHM_SLOTS(s->ctl);
	uint32_t high = atomic_load(&s->ctl->high);

	if (high > s->ctl->nslots)
		high = s->ctl->nslots;
	for (size_t b = 0; b < seg->n_buffers; b++) {
		uint64_t addr = seg->buffers[b].addr, len = seg->buffers[b].length;
		for (uint32_t i = 0; i < high; i++) {
			if (slot_state(atomic_load(&sl[i].state)) != SLOT_LIVE ||
			    atomic_load(&sl[i].kind) != SLOT_DEVICE)
				continue;
			uint64_t a = atomic_load(&sl[i].addr), l = atomic_load(&sl[i].length);
			if (addr + len <= a || a + l <= addr)
				continue;
			int32_t idx = atomic_load(&sl[i].export_idx);
			if (idx < 0 || (unsigned)idx >= s->nmaps || !s->maps[idx].device ||
			    (!s->self && s->maps[idx].local == NULL)) {
				SLOG(s->ctx, TE_LOG_INFO, "shm: segment %s: its device memory at 0x%llx+%llu cannot be "
							  "reached from this process; leaving the segment to another transport",
				     seg->name, (unsigned long long)a, (unsigned long long)l);
				return true;
			}
		}
	}
	return false;
}

int shm_segment_open(shm_ctx *c, const te_segment_info *seg, shm_seg **out)
{
	peer_desc pd;
	shm_welcome *w = NULL;
	int fds[1 + SHM_MAX_EXPORTS];
	unsigned nfds = 0;
	shm_seg *s;
	int rc;

	if (seg->n_buffers > 0 && seg->buffers[0].addr == 0 && seg->buffers[0].length > 0)
		return -ENOTSUP; /* a file segment */
	rc = parse_desc(c, seg, &pd);
	if (rc < 0)
		return rc == -ENOENT ? -EHOSTUNREACH : rc;
	if (strcmp(pd.host, c->cfg.host) != 0) {
		SLOG(c, TE_LOG_DEBUG, "shm: segment %s is on another host (%s)", seg->name, pd.host);
		return -EHOSTUNREACH;
	}
	s = calloc(1, sizeof *s);
	if (s == NULL)
		return -ENOMEM;
	s->ctx = c;
	s->fd = -1;
	s->pid = (pid_t)pd.pid;
	s->self = pd.pid == getpid();
	snprintf(s->name, sizeof s->name, "%s", seg->name);

	s->fd = connect_unix(pd.socket);
	if (s->fd < 0) {
		rc = s->fd;
		s->fd = -1;
		SLOG(c, TE_LOG_INFO, "shm: segment %s: cannot reach %s: %s", seg->name, pd.socket, strerror(-rc));
		goto fail;
	}
	/* The socket must belong to the process the descriptor names. */
	struct ucred cred;
	socklen_t cl = sizeof cred;
	if (getsockopt(s->fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0 || cred.pid != s->pid ||
	    (int64_t)cred.uid != pd.uid) {
		SLOG(c, TE_LOG_WARN, "shm: segment %s: %s belongs to pid %d, not to pid %lld as published", seg->name,
		     pd.socket, (int)cred.pid, (long long)pd.pid);
		rc = -EHOSTUNREACH;
		goto fail;
	}
	shm_hello hello = { .magic = SHM_MAGIC, .version = SHM_VERSION, .pid = (uint64_t)getpid() };
	snprintf(hello.host, sizeof hello.host, "%s", c->cfg.host);
	if (send(s->fd, &hello, sizeof hello, MSG_NOSIGNAL) != (ssize_t)sizeof hello) {
		rc = -errno;
		goto fail;
	}
	w = calloc(1, sizeof *w);
	if (w == NULL) {
		rc = -ENOMEM;
		goto fail;
	}
	rc = recv_welcome(s->fd, w, fds, &nfds);
	if (rc == 0 && w->status != 0)
		rc = -(int)w->status;
	else if (rc == 0 && (strcmp(w->host, c->cfg.host) != 0 || w->pid != (uint64_t)s->pid || nfds != welcome_fds(w) ||
			     w->ctl_size < SHM_CTL_HEADER || w->ctl_size > (1ull << 31)))
		rc = -EPROTO;
	if (rc < 0) {
		SLOG(c, TE_LOG_INFO, "shm: segment %s: first contact failed: %s", seg->name, strerror(-rc));
		goto fail_fds;
	}
	s->ctl_size = w->ctl_size;
	s->ctl = mmap(NULL, s->ctl_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (s->ctl == MAP_FAILED) {
		s->ctl = NULL;
		rc = -errno;
		goto fail_fds;
	}
	if (s->ctl->magic != SHM_MAGIC || s->ctl->version != SHM_VERSION ||
	    s->ctl->nslots > (s->ctl_size - SHM_CTL_HEADER) / sizeof(shm_slot)) {
		rc = -EPROTO;
		goto fail_fds;
	}
	for (unsigned i = 0, f = 1; i < w->nexports; i++) {
		shm_export_wire *x = &w->exports[i];
		int xfd = x->has_fd ? fds[f++] : -1;
		s->maps[i].base = x->base;
		s->maps[i].size = x->size;
		s->maps[i].device = x->kind == EXPORT_DEVICE;
		s->nmaps = i + 1; /* seg_free undoes what is mapped so far */
		if (s->self)
			;                 /* its addresses are ours */
		else if (x->kind == EXPORT_HOST) {
			void *p = mmap(NULL, x->size, PROT_READ | PROT_WRITE, MAP_SHARED, xfd, 0);
			s->maps[i].local = p == MAP_FAILED ? NULL : p;
			if (p == MAP_FAILED)
				SLOG(c, TE_LOG_WARN, "shm: segment %s: cannot map a shared allocation of %llu bytes: %s",
				     seg->name, (unsigned long long)x->size, strerror(errno));
		} else if (TE_HAS_OP(c->host, device_ipc_open)) {
			void *base = NULL;
			x->ipc.fd = xfd;
			int orc = c->host->device_ipc_open(c->host, x->location, &x->ipc, &base);
			s->maps[i].local = orc == 0 ? base : NULL;
			if (orc < 0)
				SLOG(c, TE_LOG_INFO, "shm: segment %s: cannot open its %s allocation of %llu bytes here: %s",
				     seg->name, x->location, (unsigned long long)x->size, strerror(-orc));
		}
		if (x->kind == EXPORT_DEVICE)
			memcpy(s->maps[i].location, x->location, sizeof s->maps[i].location);
	}
	s->nmaps = w->nexports;
	/* Can we attach? Read the control block's magic through the kernel. */
	if (!s->self && c->cfg.cma) {
		uint32_t magic = 0;
		struct iovec l = { &magic, sizeof magic }, r = { (void *)(uintptr_t)w->ctl_addr, sizeof magic };
		ssize_t got = process_vm_readv(s->pid, &l, 1, &r, 1, 0);
		s->cma = got == (ssize_t)sizeof magic && magic == SHM_MAGIC;
		if (!s->cma)
			SLOG(c, TE_LOG_INFO, "shm: segment %s: cross-memory attach refused (%s); shared allocations only",
			     seg->name, got < 0 ? strerror(errno) : "wrong bytes");
	}
	/* Device memory is reachable only through its export. */
	if (device_unreachable(s, seg)) {
		rc = -EPERM;
		goto fail_fds;
	}
	/* Without attach, only memory in shared allocations is reachable: the
	 * segment is someone else's to serve unless all of it is. */
	if (!s->self && !s->cma) {
		for (size_t i = 0; i < seg->n_buffers; i++) {
			if (!shared_covers(s, seg->buffers[i].addr, seg->buffers[i].length)) {
				SLOG(c, TE_LOG_INFO, "shm: segment %s: buffer 0x%llx+%llu is neither shared nor reachable by "
						     "cross-memory attach; leaving the segment to another transport",
				     seg->name, (unsigned long long)seg->buffers[i].addr,
				     (unsigned long long)seg->buffers[i].length);
				rc = -EPERM;
				goto fail_fds;
			}
		}
	}
	for (unsigned i = 0; i < nfds; i++)
		close(fds[i]);
	free(w);
	pthread_mutex_lock(&c->seg_lock);
	s->next = c->segs;
	c->segs = s;
	rc = shm_watch(c, s->fd, W_SEG);
	pthread_mutex_unlock(&c->seg_lock);
	if (rc < 0)
		SLOG(c, TE_LOG_WARN, "shm: segment %s: cannot watch its connection: %s", seg->name, strerror(-rc));
	SLOG(c, TE_LOG_INFO, "shm: segment %s: pid %d%s, %u exported allocations, cross-memory attach %s", seg->name,
	     (int)s->pid, s->self ? " (this process)" : "", s->nmaps, s->self ? "not needed" : s->cma ? "on" : "off");
	*out = s;
	return 0;
fail_fds:
	for (unsigned i = 0; i < nfds; i++)
		close(fds[i]);
fail:
	free(w);
	seg_free(s);
	return rc;
}

void shm_segment_close(shm_ctx *c, shm_seg *s)
{
	pthread_mutex_lock(&c->seg_lock);
	for (shm_seg **pp = &c->segs; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	}
	epoll_ctl(c->ep, EPOLL_CTL_DEL, s->fd, NULL);
	pthread_mutex_unlock(&c->seg_lock);
	seg_free(s);
}
