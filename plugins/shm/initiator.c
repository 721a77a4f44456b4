/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The initiator side: first contact with a target on this host, and the data
 * path. A copy goes, by the first that applies: straight between our own
 * addresses (the target is this process), through our mapping of the
 * target's shared allocation (memcpy), or through cross-memory attach
 * (process_vm_readv/writev, up to SHM_CMA_IOV requests per call); the
 * target's device memory through the device plugin, at the address its
 * allocation was opened at here. Small
 * submits are copied by the submitting thread; larger ones are split into
 * slices in a queue that the copy workers and the callers waiting in
 * progress() both draw from (see "the queue").
 */
#include <errno.h>
#include <fcntl.h>
#include <json-glib/json-glib.h>
#include <te/te-json.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "shm-internal.h"


#define CONNECT_TIMEOUT_MS 2000

/* te_transfer.plugin_data while queued for the workers */
#define Q_NEXT 0  /* next transfer in the queue */
#define Q_CLAIM 1 /* bytes handed to workers so far */

/* ------------------------------------------------------- first contact */

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
	root = te_json_load(seg->descriptor, strlen(seg->descriptor), &lim, why, sizeof why);
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

/* ---------------------------------------------------------------- pins */

/* Pins the live slot holding [addr, addr+len), or NULL: the target never
 * registered that range, or is unregistering it. */
static shm_slot *pin(shm_seg *s, uint64_t addr, uint64_t len)
{
	shm_slot *sl = SHM_SLOTS(s->ctl);
	uint32_t high = atomic_load_explicit(&s->ctl->high, memory_order_acquire);
	uint32_t hint = atomic_load_explicit(&s->hint, memory_order_relaxed);

	if (high > s->ctl->nslots) /* the target's word: never past our mapping */
		high = s->ctl->nslots;
	for (uint32_t k = 0; k < high; k++) {
		uint32_t i = (hint + k) % high;
		uint64_t st = atomic_load_explicit(&sl[i].state, memory_order_acquire);
		if (slot_state(st) != SLOT_LIVE)
			continue;
		uint64_t a = atomic_load_explicit(&sl[i].addr, memory_order_relaxed);
		uint64_t l = atomic_load_explicit(&sl[i].length, memory_order_relaxed);
		if (addr < a || addr - a > l || len > l - (addr - a))
			continue;
		atomic_fetch_add(&sl[i].pins, 1);
		if (atomic_load(&sl[i].state) != st) { /* dying, or reused meanwhile */
			atomic_fetch_sub(&sl[i].pins, 1);
			return NULL;
		}
		if (i != hint)
			atomic_store_explicit(&s->hint, i, memory_order_relaxed);
		return &sl[i];
	}
	return NULL;
}

static void unpin(shm_slot *slot)
{
	atomic_fetch_sub_explicit(&slot->pins, 1, memory_order_release);
}

/* Our address for [addr, addr+len) of a pinned slot through a shared
 * allocation, or NULL. */
static char *mapped(shm_seg *s, shm_slot *slot, uint64_t addr, uint64_t len)
{
	int32_t idx = atomic_load_explicit(&slot->export_idx, memory_order_relaxed);
	uint64_t off = atomic_load_explicit(&slot->export_off, memory_order_relaxed);
	uint64_t a = atomic_load_explicit(&slot->addr, memory_order_relaxed);

	if (idx < 0 || (unsigned)idx >= s->nmaps || s->maps[idx].local == NULL || s->maps[idx].device)
		return NULL;
	off += addr - a;
	if (off < addr - a || off > s->maps[idx].size || len > s->maps[idx].size - off)
		return NULL;
	return s->maps[idx].local + off;
}

/* For [addr, addr+len) of a pinned device slot: where it lies in this
 * process (the target's own address when it is this process) and the
 * location whose device plugin copies it; NULL when the export is not
 * known here (registered after first contact: the descriptor is fetched
 * again) or could not be opened. */
static char *device_at(shm_seg *s, shm_slot *slot, uint64_t addr, uint64_t len, const char **location)
{
	int32_t idx = atomic_load_explicit(&slot->export_idx, memory_order_relaxed);
	uint64_t off = atomic_load_explicit(&slot->export_off, memory_order_relaxed);
	uint64_t a = atomic_load_explicit(&slot->addr, memory_order_relaxed);

	if (idx < 0 || (unsigned)idx >= s->nmaps || !s->maps[idx].device)
		return NULL;
	*location = s->maps[idx].location;
	if (s->self)
		return (char *)(uintptr_t)addr;
	if (s->maps[idx].local == NULL)
		return NULL;
	off += addr - a;
	if (off < addr - a || off > s->maps[idx].size || len > s->maps[idx].size - off)
		return NULL;
	return s->maps[idx].local + off;
}

/* ---------------------------------------------------------- data path */

/* One piece of a transfer: [off, off+len) of it. */
typedef struct piece {
	te_transfer *t;
	uint64_t off, len;
} piece;

static void done(shm_ctx *c, const piece *p, int err)
{
	c->host->complete(c->host, p->t, err ? 0 : p->len, err);
}

/* Whether the local side of a transfer is device memory. The host hands
 * this transport its device memory as it is (TE_TRANSPORT_DEVICE_MEMORY:
 * every device region registers here), never staged. */
static bool local_is_device(const te_transfer *t)
{
	return t->local_location != NULL && strncmp(t->local_location, "cpu", 3) != 0;
}

/* Whether two locations are of the one device plugin ("cuda:0", "cuda:1"). */
static bool same_plugin(const char *a, const char *b)
{
	size_t la = strcspn(a, ":"), lb = strcspn(b, ":");
	return la == lb && strncmp(a, b, la) == 0;
}

/* Device copies of one run, gathered to go to the device plugin as one
 * batch (queued together, waited for once) instead of one waited copy per
 * piece: all of one location and kind. */
typedef struct dev_batch {
	const char *location;
	unsigned flags;
	unsigned n;
	te_copy copies[SHM_CMA_IOV];
	shm_slot *slots[SHM_CMA_IOV];
	unsigned idx[SHM_CMA_IOV];
} dev_batch;

static void dev_flush(shm_ctx *c, piece *ps, dev_batch *b)
{
	const te_host *h = c->host;
	int rc = 0;

	if (b->n == 0)
		return;
	if (b->n > 1 && TE_HAS_OP(h, device_copy_batch)) {
		rc = h->device_copy_batch(h, b->location, b->copies, b->n, b->flags);
	} else {
		for (unsigned k = 0; k < b->n && rc == 0; k++)
			rc = h->device_copy(h, b->location, b->copies[k].dst, b->copies[k].src, b->copies[k].len);
	}
	for (unsigned k = 0; k < b->n; k++) {
		unpin(b->slots[k]);
		done(c, &ps[b->idx[k]], rc);
	}
	b->n = 0;
}

static void dev_add(shm_ctx *c, piece *ps, dev_batch *b, const char *location, unsigned flags, void *dst,
		    const void *src, uint64_t len, shm_slot *slot, unsigned i)
{
	if (b->n > 0 && (b->flags != flags || strcmp(b->location, location) != 0))
		dev_flush(c, ps, b);
	b->location = location;
	b->flags = flags;
	b->copies[b->n] = (te_copy){ dst, src, len };
	b->slots[b->n] = slot;
	b->idx[b->n++] = i;
}

/* Our device memory and memory of the target's that only cross-memory
 * attach reaches: through a host buffer of this thread's, a slice at a
 * time. */
#define BOUNCE_BYTES (1u << 20)
static _Thread_local char *bounce_buf;
static pthread_key_t bounce_key;
static pthread_once_t bounce_once = PTHREAD_ONCE_INIT;

static void bounce_key_make(void)
{
	(void)pthread_key_create(&bounce_key, free);
}

static int bounce(shm_ctx *c, shm_seg *s, uint32_t op, char *local, const char *location, uint64_t remote,
		  uint64_t len)
{
	const te_host *h = c->host;

	if (bounce_buf == NULL) {
		pthread_once(&bounce_once, bounce_key_make);
		bounce_buf = malloc(BOUNCE_BYTES);
		if (bounce_buf == NULL)
			return -ENOMEM;
		pthread_setspecific(bounce_key, bounce_buf); /* freed when the thread ends */
	}
	for (uint64_t off = 0; off < len;) {
		size_t n = len - off < BOUNCE_BYTES ? (size_t)(len - off) : BOUNCE_BYTES;
		struct iovec lv = { bounce_buf, n }, rv = { (void *)(uintptr_t)(remote + off), n };
		int rc = 0;
		if (op == TE_OP_WRITE)
			rc = h->device_copy(h, location, bounce_buf, local + off, n);
		if (rc == 0) {
			ssize_t got = op == TE_OP_READ ? process_vm_readv(s->pid, &lv, 1, &rv, 1, 0)
						       : process_vm_writev(s->pid, &lv, 1, &rv, 1, 0);
			if (got < 0 && errno == ESRCH)
				atomic_store(&s->dead, true);
			rc = got < 0 ? (errno == ESRCH ? -ECONNRESET : -errno) : (size_t)got < n ? -EFAULT : 0;
		}
		if (rc == 0 && op == TE_OP_READ)
			rc = h->device_copy(h, location, local + off, bounce_buf, n);
		if (rc != 0)
			return rc;
		off += n;
	}
	return 0;
}

/* Copies pieces (all of one segment and opcode). */
static void run(shm_ctx *c, shm_seg *s, uint32_t op, piece *ps, unsigned n)
{
	struct iovec lv[SHM_CMA_IOV], rv[SHM_CMA_IOV];
	shm_slot *slots[SHM_CMA_IOV];
	unsigned idx[SHM_CMA_IOV], nv = 0;
	dev_batch db;

	db.n = 0;
	if (atomic_load_explicit(&s->dead, memory_order_relaxed)) {
		for (unsigned i = 0; i < n; i++)
			done(c, &ps[i], -ECONNRESET);
		return;
	}
	for (unsigned i = 0; i < n; i++) {
		piece *p = &ps[i];
		uint64_t remote = p->t->remote + p->off;
		char *local = (char *)p->t->local + p->off;
		bool ldev = local_is_device(p->t);
		if (c->host->canceled(c->host, p->t)) {
			done(c, p, -ECANCELED);
			continue;
		}
		shm_slot *slot = pin(s, remote, p->len);
		if (slot == NULL) {
			/* Not a live region of the target (unregistered since its
			 * descriptor was read): refused, as any transport refuses. */
			done(c, p, TE_ERR_REJECTED);
			continue;
		}
		if (atomic_load_explicit(&slot->kind, memory_order_relaxed) == SLOT_DEVICE) {
			/* The target's device memory, opened here: one device
			 * copy, device to device when ours is device memory too. */
			const char *loc = NULL;
			char *dev = device_at(s, slot, remote, p->len, &loc);
			if (dev == NULL || (ldev && !same_plugin(loc, p->t->local_location))) {
				if (dev != NULL)
					SLOG(c, TE_LOG_WARN, "shm: %s memory to %s memory: not one device plugin's",
					     p->t->local_location, loc);
				unpin(slot);
				done(c, p, TE_ERR_REJECTED);
				continue;
			}
			if (op == TE_OP_READ)
				dev_add(c, ps, &db, loc, ldev ? TE_COPY_DEVICE_ONLY : 0, local, dev, p->len, slot, i);
			else
				dev_add(c, ps, &db, loc, ldev ? TE_COPY_DEVICE_ONLY : 0, dev, local, p->len, slot, i);
			continue;
		}
		char *there = s->self ? (char *)(uintptr_t)remote : mapped(s, slot, remote, p->len);
		if (there != NULL && ldev) {
			if (op == TE_OP_READ)
				dev_add(c, ps, &db, p->t->local_location, 0, local, there, p->len, slot, i);
			else
				dev_add(c, ps, &db, p->t->local_location, 0, there, local, p->len, slot, i);
			continue;
		}
		if (there != NULL) {
			if (op == TE_OP_READ)
				memcpy(local, there, p->len);
			else
				memcpy(there, local, p->len);
			unpin(slot);
			done(c, p, 0);
			continue;
		}
		if (!s->cma) {
			unpin(slot);
			done(c, p, TE_ERR_REJECTED);
			continue;
		}
		if (ldev) {
			int rc = bounce(c, s, op, local, p->t->local_location, remote, p->len);
			unpin(slot);
			done(c, p, rc);
			continue;
		}
		lv[nv] = (struct iovec){ local, p->len };
		rv[nv] = (struct iovec){ (void *)(uintptr_t)remote, p->len };
		slots[nv] = slot;
		idx[nv++] = i;
	}
	dev_flush(c, ps, &db);
	if (nv == 0)
		return;
	ssize_t got = op == TE_OP_READ ? process_vm_readv(s->pid, lv, nv, rv, nv, 0)
				       : process_vm_writev(s->pid, lv, nv, rv, nv, 0);
	int err = got < 0 ? -errno : 0;
	uint64_t left = got < 0 ? 0 : (uint64_t)got;
	for (unsigned k = 0; k < nv; k++) {
		unpin(slots[k]);
		/* The kernel stops at the first page it cannot reach. */
		if (left >= lv[k].iov_len) {
			left -= lv[k].iov_len;
			done(c, &ps[idx[k]], 0);
		} else {
			left = 0;
			if (err == -ESRCH)
				atomic_store(&s->dead, true);
			done(c, &ps[idx[k]], err ? (err == -ESRCH ? -ECONNRESET : err) : -EFAULT);
		}
	}
}

/* Runs pieces grouped by (segment, opcode) in runs of up to SHM_CMA_IOV. */
static void run_all(shm_ctx *c, piece *ps, unsigned n)
{
	unsigned i = 0;
	while (i < n) {
		shm_seg *s = ps[i].t->seg_ctx;
		uint32_t op = ps[i].t->opcode;
		unsigned j = i + 1;
		while (j < n && j - i < SHM_CMA_IOV && ps[j].t->seg_ctx == s && ps[j].t->opcode == op)
			j++;
		run(c, s, op, ps + i, j - i);
		i = j;
	}
}

/* ------------------------------------------------------------ the queue */

/* Submits too large to copy in the submitting thread wait in one queue. The
 * copy workers draw from it, and so does a thread waiting for its batch in
 * progress() (te_batch_wait()): it copies queued pieces itself instead of
 * sleeping until a worker did, and completes them in its own thread, so
 * that no hand-off stands between the copy and the caller. Workers still
 * take whatever nobody waits for (submits of callers that poll, or never
 * wait). */

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Takes work from the queue (q_lock held): one slice of the head transfer,
 * or several small whole transfers of one segment and opcode (one
 * cross-memory attach call, or one device batch, for all) up to a slice's
 * bytes, so that a batch of 1 MiB requests spreads over the copying threads
 * rather than filling one. */
static unsigned take(shm_ctx *c, piece *ps)
{
	uint64_t bytes = 0;
	unsigned n = 0;

	while (c->q_head != NULL && n < SHM_CMA_IOV) {
		te_transfer *t = c->q_head;
		uint64_t claim = t->plugin_data[Q_CLAIM];
		uint64_t len = t->length - claim < c->cfg.slice ? t->length - claim : c->cfg.slice;
		if (n > 0 && (claim != 0 || len != t->length || t->seg_ctx != ps[0].t->seg_ctx ||
			      t->opcode != ps[0].t->opcode || bytes + len > c->cfg.slice))
			break;
		bytes += len;
		ps[n++] = (piece){ t, claim, len };
		t->plugin_data[Q_CLAIM] = claim + len;
		if (claim + len == t->length) {
			c->q_head = (te_transfer *)t->plugin_data[Q_NEXT];
			if (c->q_head == NULL)
				c->q_tail = NULL;
		}
		if (len != t->length)
			break; /* a slice of a large transfer: alone */
	}
	if (c->q_head == NULL) {
		atomic_store_explicit(&c->q_any, false, memory_order_relaxed);
		atomic_store_explicit(&c->q_lazy, false, memory_order_relaxed);
	}
	if (n > 0)
		atomic_fetch_add_explicit(&c->copiers, 1, memory_order_relaxed);
	return n;
}

/* After a worker's completions: wake the callers asleep in progress() so
 * that they look at their batches again (the host wakes them only for a
 * batch that drained; this covers the plugin's own completions, as the ABI
 * asks). The fence pairs with the one in progress(): either the sleeper saw
 * the completion before it slept, or we see its count here. */
static void wake_sleepers(shm_ctx *c)
{
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&c->p_sleepers, memory_order_relaxed) == 0)
		return;
	pthread_mutex_lock(&c->q_lock);
	pthread_cond_broadcast(&c->p_cond);
	pthread_mutex_unlock(&c->q_lock);
}

void shm_wake(shm_ctx *c)
{
	wake_sleepers(c);
}

/* Queued work no worker was told of: tell them now (the kick timer, or a
 * status poll: the caller expected to copy it did not come). */
void shm_kick(shm_ctx *c)
{
	pthread_mutex_lock(&c->q_lock);
	c->kick_armed = false;
	atomic_store_explicit(&c->q_lazy, false, memory_order_relaxed);
	if (c->q_head != NULL)
		pthread_cond_signal(&c->q_cond); /* a worker wakes the next if there is more */
	pthread_mutex_unlock(&c->q_lock);
}

/* Sleeps on p_cond until the queue holds work, done(arg), or `end` (ns,
 * CLOCK_MONOTONIC; INT64_MAX: no limit): 1, 0 or -ETIMEDOUT. */
/* Whether a waiting caller copies queued work now (q_lock held, or a
 * look without it): work left for waiting callers is theirs; other work
 * only while fewer threads than there are workers copy, since a copier
 * more than there are CPUs for them slows every copy. */
static bool may_take(shm_ctx *c)
{
	return c->q_head != NULL && (atomic_load_explicit(&c->q_lazy, memory_order_relaxed) ||
				     atomic_load_explicit(&c->copiers, memory_order_relaxed) < c->nworkers);
}

/* The same without the lock (q_any stands for q_head). */
static bool may_take_look(shm_ctx *c)
{
	return atomic_load_explicit(&c->q_any, memory_order_relaxed) &&
	       (atomic_load_explicit(&c->q_lazy, memory_order_relaxed) ||
		atomic_load_explicit(&c->copiers, memory_order_relaxed) < c->nworkers);
}

static int sleep_until(shm_ctx *c, int (*done)(void *), void *arg, int64_t end)
{
	int rc = 1;

	pthread_mutex_lock(&c->q_lock);
	atomic_fetch_add_explicit(&c->p_sleepers, 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_seq_cst); /* the count before the look at done() */
	while (!may_take(c)) {
		if (done(arg)) {
			rc = 0;
			break;
		}
		if (end == INT64_MAX) {
			pthread_cond_wait(&c->p_cond, &c->q_lock);
			continue;
		}
		if (now_ns() >= end) {
			rc = -ETIMEDOUT;
			break;
		}
		struct timespec ts = { .tv_sec = end / 1000000000, .tv_nsec = end % 1000000000 };
		int err = pthread_cond_timedwait(&c->p_cond, &c->q_lock, &ts);
		if (err != 0 && err != ETIMEDOUT && err != EINTR) {
			rc = -err; /* the host then waits its usual way */
			break;
		}
	}
	atomic_fetch_sub_explicit(&c->p_sleepers, 1, memory_order_relaxed);
	pthread_mutex_unlock(&c->q_lock);
	return rc;
}

int shm_progress(shm_ctx *c, int (*done)(void *), void *arg, int64_t timeout_ns)
{
	piece ps[SHM_CMA_IOV];

	/* A status read: the workers copy what nobody waits for, so a look
	 * stays a look (a copy here would make a poll cost a slice's copy). A
	 * poller is no waiter: what was left for it goes to the workers. */
	if (timeout_ns == 0 || done == NULL) {
		if (atomic_load_explicit(&c->q_lazy, memory_order_relaxed))
			shm_kick(c);
		return done == NULL || done(arg) ? 0 : -ETIMEDOUT;
	}
	if (pthread_getspecific(c->waiter_key) == NULL)
		(void)pthread_setspecific(c->waiter_key, c); /* (ENOMEM: treated as no waiter) */
	int64_t t0 = now_ns();
	int64_t end = timeout_ns < 0 || timeout_ns >= INT64_MAX - t0 ? INT64_MAX : t0 + timeout_ns;
	for (;;) {
		if (done(arg))
			return 0;
		/* Queued work, ours or not: copy it here rather than wait for a
		 * worker to (may_take() says when). Pieces are at most a slice,
		 * so done() and the deadline are looked at again soon. */
		if (may_take_look(c)) {
			pthread_mutex_lock(&c->q_lock);
			unsigned n = may_take(c) ? take(c, ps) : 0;
			pthread_mutex_unlock(&c->q_lock);
			if (n > 0) {
				run_all(c, ps, n);
				atomic_fetch_sub_explicit(&c->copiers, 1, memory_order_relaxed);
				/* Pieces of other callers' batches too: they may be
				 * asleep here, and the host wakes nobody for
				 * completions made inside this transport's progress(). */
				wake_sleepers(c);
				if (end != INT64_MAX && now_ns() >= end)
					return done(arg) ? 0 : -ETIMEDOUT;
				continue;
			}
		}
		/* Nothing queued: a worker copies what is left of the batch (or
		 * another transport does). Look for it a while before sleeping
		 * (TE_SPIN_US): a futex wake-up costs more than a short copy. */
		if (c->cfg.spin_ns > 0) {
			int64_t t1 = now_ns(), stop = t1 + c->cfg.spin_ns < end ? t1 + c->cfg.spin_ns : end;
			bool again = false;
			for (int64_t t = t1; t < stop; t = now_ns()) {
				if (done(arg))
					return 0;
				if (may_take_look(c)) {
					again = true;
					break;
				}
				/* Yield, not just pause: the worker copying our
				 * piece may be waiting for this very core. */
				sched_yield();
			}
			if (again)
				continue;
		}
		int rc = sleep_until(c, done, arg, end);
		if (rc != 1)
			return rc;
	}
}

/* -------------------------------------------------------------- workers */

static void *worker_main(void *arg)
{
	shm_ctx *c = arg;
	piece ps[SHM_CMA_IOV];

	for (;;) {
		pthread_mutex_lock(&c->q_lock);
		while (c->q_head == NULL && !c->q_stop)
			pthread_cond_wait(&c->q_cond, &c->q_lock);
		if (c->q_head == NULL) {
			pthread_mutex_unlock(&c->q_lock);
			return NULL;
		}
		unsigned n = take(c, ps);
		/* More for another worker, unless as many threads as there are
		 * workers copy already (a waiting caller counts): more would
		 * only share the CPUs. */
		if (c->q_head != NULL && atomic_load_explicit(&c->copiers, memory_order_relaxed) < c->nworkers)
			pthread_cond_signal(&c->q_cond);
		pthread_mutex_unlock(&c->q_lock);
		run_all(c, ps, n);
		atomic_fetch_sub_explicit(&c->copiers, 1, memory_order_relaxed);
		wake_sleepers(c);
	}
}

int shm_workers_start(shm_ctx *c)
{
	c->workers = calloc(c->cfg.threads, sizeof *c->workers);
	if (c->workers == NULL)
		return -ENOMEM;
	for (unsigned i = 0; i < c->cfg.threads; i++) {
		if (pthread_create(&c->workers[i], NULL, worker_main, c) != 0) {
			shm_workers_stop(c);
			return -EAGAIN;
		}
		c->nworkers++;
	}
	return 0;
}

void shm_workers_stop(shm_ctx *c)
{
	/* Workers drain the queue before they leave: every transfer completes. */
	pthread_mutex_lock(&c->q_lock);
	c->q_stop = true;
	pthread_cond_broadcast(&c->q_cond);
	pthread_mutex_unlock(&c->q_lock);
	for (unsigned i = 0; i < c->nworkers; i++)
		pthread_join(c->workers[i], NULL);
	c->nworkers = 0;
	free(c->workers);
	c->workers = NULL;
	/* With no worker (none could start), fail what is left. Detached under
	 * the lock: the kick timer's thread still looks at the queue. */
	pthread_mutex_lock(&c->q_lock);
	te_transfer *left = c->q_head;
	c->q_head = c->q_tail = NULL;
	atomic_store_explicit(&c->q_any, false, memory_order_relaxed);
	pthread_mutex_unlock(&c->q_lock);
	for (te_transfer *t = left; t != NULL;) {
		te_transfer *next = (te_transfer *)t->plugin_data[Q_NEXT];
		uint64_t claim = t->plugin_data[Q_CLAIM];
		while (claim < t->length) {
			uint64_t len = t->length - claim < c->cfg.slice ? t->length - claim : c->cfg.slice;
			claim += len;
			c->host->complete(c->host, t, 0, -ECANCELED);
		}
		t = next;
	}
}

int shm_submit(shm_ctx *c, te_transfer *const *ts, size_t n)
{
	uint64_t total = 0;

	for (size_t i = 0; i < n; i++)
		total += ts[i]->length;
	if (total <= c->cfg.inline_bytes) {
		/* Small: copying here costs less than waking a worker. */
		piece ps[SHM_CMA_IOV];
		size_t i = 0;
		while (i < n) {
			unsigned k = 0;
			for (; i < n && k < SHM_CMA_IOV; i++)
				ps[k++] = (piece){ ts[i], 0, ts[i]->length };
			run_all(c, ps, k);
		}
		return 0;
	}
	/* A thread that waited for its last queued submit in progress() will
	 * most likely wait for this one too and copy it there: waking a worker
	 * for it would cost a futex wake-up, and on a busy machine the worker
	 * takes the caller's CPU or its copy. Up to caller_bytes that caller
	 * copies alone; should it not come, the kick timer tells the workers
	 * (and a status poll does at once). Larger submits are shared. */
	bool waiter = pthread_getspecific(c->waiter_key) != NULL;
	bool lazy = waiter && total <= c->cfg.caller_bytes;
	if (waiter)
		(void)pthread_setspecific(c->waiter_key, NULL);
	for (size_t i = 0; i < n; i++) {
		te_transfer *t = ts[i];
		t->nr_slices = (uint32_t)((t->length + c->cfg.slice - 1) / c->cfg.slice);
		t->plugin_data[Q_NEXT] = 0;
		t->plugin_data[Q_CLAIM] = 0;
	}
	pthread_mutex_lock(&c->q_lock);
	for (size_t i = 0; i < n; i++) {
		if (c->q_tail != NULL)
			c->q_tail->plugin_data[Q_NEXT] = (uintptr_t)ts[i];
		else
			c->q_head = ts[i];
		c->q_tail = ts[i];
	}
	atomic_store_explicit(&c->q_any, true, memory_order_relaxed);
	bool arm = false;
	if (!lazy) {
		pthread_cond_signal(&c->q_cond);
	} else {
		atomic_store_explicit(&c->q_lazy, true, memory_order_relaxed);
		arm = !c->kick_armed;
		c->kick_armed = true;
	}
	/* Callers asleep in progress() help with it. */
	if (atomic_load_explicit(&c->p_sleepers, memory_order_relaxed) > 0)
		pthread_cond_broadcast(&c->p_cond);
	pthread_mutex_unlock(&c->q_lock);
	if (arm) {
		struct itimerspec its = { .it_value = { 0, SHM_KICK_NS } };
		if (timerfd_settime(c->kick_fd, 0, &its, NULL) < 0) {
			SLOG(c, TE_LOG_DEBUG, "shm: kick timer: %s", strerror(errno));
			pthread_mutex_lock(&c->q_lock);
			c->kick_armed = false;
			pthread_cond_signal(&c->q_cond); /* no timer: tell them now */
			pthread_mutex_unlock(&c->q_lock);
		}
	}
	return 0;
}
