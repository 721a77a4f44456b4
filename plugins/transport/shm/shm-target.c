/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The target side: the control block initiators map, a slot per
 * remote-accessible region (what they may touch), and the unix socket where
 * they make first contact and receive the memfds.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "shm.h"


#define HELLO_TIMEOUT_MS 2000
#define SHM_MAX_CLIENTS 4096

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int shm_target_start(shm_ctx *c)
{
	c->clients = g_hash_table_new(g_direct_hash, g_direct_equal);
	size_t size = SHM_CTL_HEADER + (size_t)c->cfg.max_regions * sizeof(shm_slot);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	unsigned char rnd[6];
	int rc;

	_Static_assert(sizeof(shm_slot) == 64, "slot layout");
	_Static_assert(sizeof(shm_ctl) <= SHM_CTL_HEADER, "control block header");
	c->ctl_fd = memfd_create("libte-shm-control", MFD_CLOEXEC);
	if (c->ctl_fd < 0 || ftruncate(c->ctl_fd, (off_t)size) < 0)
		return -errno;
	c->ctl = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, c->ctl_fd, 0);
	if (c->ctl == MAP_FAILED) {
		c->ctl = NULL;
		return -errno;
	}
	c->ctl_size = size;
	c->ctl->magic = SHM_MAGIC;
	c->ctl->version = SHM_VERSION;
	c->ctl->nslots = c->cfg.max_regions;
	c->ctl->pid = (uint64_t)getpid();
	snprintf(c->ctl->host, sizeof c->ctl->host, "%s", c->cfg.host);

	if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
		return -EIO;
	rc = snprintf(c->sock_path, sizeof c->sock_path, "%s/te-shm-%d-%02x%02x%02x%02x%02x%02x.sock", c->cfg.dir,
		      (int)getpid(), rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5]);
	if (rc < 0 || (size_t)rc >= sizeof sa.sun_path) {
		SLOG(c, TE_LOG_ERROR, "TE_SHM_DIR %s is too long for a unix socket path", c->cfg.dir);
		c->sock_path[0] = '\0';
		return -ENAMETOOLONG;
	}
	memcpy(sa.sun_path, c->sock_path, strlen(c->sock_path) + 1);
	c->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (c->listen_fd < 0)
		return -errno;
	if (bind(c->listen_fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		rc = -errno;
		SLOG(c, TE_LOG_ERROR, "cannot bind %s: %s", c->sock_path, strerror(-rc));
		c->sock_path[0] = '\0';
		return rc;
	}
	/* Others are refused at first contact anyway (peer credentials); this
	 * keeps them from connecting at all. */
	chmod(c->sock_path, 0600);
	if (listen(c->listen_fd, 128) < 0)
		return -errno;
	return 0;
}

void shm_target_stop(shm_ctx *c)
{
	if (c->listen_fd >= 0)
		close(c->listen_fd);
	c->listen_fd = -1;
	if (c->clients != NULL) {
		shm_target_drop_clients(c);
		g_hash_table_unref(c->clients);
		c->clients = NULL;
	}
	if (c->sock_path[0])
		unlink(c->sock_path);
	c->sock_path[0] = '\0';
	if (c->ctl != NULL) {
		/* Initiators keep their own mapping: tell them nothing is live. */
		shm_slot *sl = SHM_SLOTS(c->ctl);
		uint32_t high = atomic_load(&c->ctl->high);
		for (uint32_t i = 0; i < high; i++) {
			uint64_t st = atomic_load(&sl[i].state);
			if (slot_state(st) == SLOT_LIVE)
				atomic_store(&sl[i].state, (st & ~3ull) | SLOT_DYING);
		}
		munmap(c->ctl, c->ctl_size);
		c->ctl = NULL;
	}
	if (c->ctl_fd >= 0)
		close(c->ctl_fd);
	c->ctl_fd = -1;
	for (unsigned i = 0; i < c->nexports; i++)
		if (c->exports[i].fd >= 0)
			close(c->exports[i].fd);
	c->nexports = 0;
}

/* The export index of the shared allocation holding `mem`, adding it;
 * -1 when the memory is not from te_mem_alloc() or the table is full.
 * reg_lock held. */
static int export_of(shm_ctx *c, const te_mem_info *mem, uint64_t *off)
{
	int fd;
	uint64_t offset, size, base;

	if (c->host->shared_memory(c->host, (uintptr_t)mem->addr, mem->length, &fd, &offset, &size, &base) < 0)
		return -1;
	for (unsigned i = 0; i < c->nexports; i++) {
		if (c->exports[i].kind == EXPORT_HOST && c->exports[i].base == base &&
		    c->exports[i].size == size) {
			*off = offset;
			return (int)i;
		}
	}
	if (c->nexports == SHM_MAX_EXPORTS) {
		SLOG(c, TE_LOG_INFO, "shm: more than %d shared allocations registered; %p is served by "
				     "cross-memory attach", SHM_MAX_EXPORTS, mem->addr);
		return -1;
	}
	int mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (mine < 0)
		return -1;
	c->exports[c->nexports] = (shm_export){ .fd = mine, .base = base, .size = size, .kind = EXPORT_HOST };
	*off = offset;
	return (int)c->nexports++;
}

/* The export index of the device allocation holding `mem` (the device
 * plugin's handle for other processes), adding it; -1 when the plugin
 * cannot share it or the table is full: initiators then leave the segment
 * to another transport. reg_lock held. */
static int export_device(shm_ctx *c, const te_mem_info *mem, uint64_t *off)
{
	shm_export e = { .kind = EXPORT_DEVICE };
	int rc = -ENOTSUP;

	if (TE_HAS_OP(c->host, device_ipc_export))
		rc = c->host->device_ipc_export(c->host, mem->addr, mem->length, &e.ipc, e.location,
						sizeof e.location);
	if (rc < 0) {
		SLOG(c, TE_LOG_INFO, "shm: %s memory at %p+%zu cannot be shared with other processes (%s); "
				     "they reach it through another transport",
		     mem->location, mem->addr, mem->length, strerror(-rc));
		return -1;
	}
	e.fd = e.ipc.fd;
	e.ipc.fd = -1; /* e.fd is the one copy; a number in this process means nothing elsewhere */
	e.base = e.ipc.alloc_base;
	e.size = e.ipc.alloc_size;
	if ((uintptr_t)mem->addr < e.base || (uintptr_t)mem->addr - e.base > e.size ||
	    mem->length > e.size - ((uintptr_t)mem->addr - e.base)) {
		SLOG(c, TE_LOG_ERROR, "shm: the device plugin exported %#llx+%llu for %p+%zu, which it does not hold",
		     (unsigned long long)e.base, (unsigned long long)e.size, mem->addr, mem->length);
		if (e.fd >= 0)
			close(e.fd);
		return -1;
	}
	*off = (uintptr_t)mem->addr - e.base;
	for (unsigned i = 0; i < c->nexports; i++) {
		const shm_export *x = &c->exports[i];
		/* The same handle too: memory freed and allocated again at the
		 * same address is another allocation (CUDA gives it another
		 * handle), which initiators must open anew. */
		if (x->kind == EXPORT_DEVICE && x->base == e.base && x->size == e.size &&
		    strcmp(x->location, e.location) == 0 && x->ipc.handle_len == e.ipc.handle_len &&
		    memcmp(x->ipc.handle, e.ipc.handle, e.ipc.handle_len) == 0) {
			if (e.fd >= 0)
				close(e.fd);
			return (int)i;
		}
	}
	if (c->nexports == SHM_MAX_EXPORTS) {
		SLOG(c, TE_LOG_INFO, "shm: more than %d allocations exported; %p is left to other transports",
		     SHM_MAX_EXPORTS, mem->addr);
		if (e.fd >= 0)
			close(e.fd);
		return -1;
	}
	c->exports[c->nexports] = e;
	return (int)c->nexports++;
}

int shm_target_register(shm_ctx *c, const te_mem_info *mem)
{
	shm_slot *sl = SHM_SLOTS(c->ctl);
	uint64_t off = 0;
	int idx;

	/* Memory peers may not touch gets no slot: nothing can reach it. */
	if (!(mem->flags & TE_MEM_REMOTE_ACCESS))
		return 0;
	pthread_mutex_lock(&c->reg_lock);
	uint32_t i, high = atomic_load(&c->ctl->high);
	for (i = 0; i < high && slot_state(atomic_load(&sl[i].state)) != SLOT_FREE; i++)
		;
	if (i == c->cfg.max_regions) {
		pthread_mutex_unlock(&c->reg_lock);
		SLOG(c, TE_LOG_ERROR, "shm: more than %u regions registered (TE_SHM_MAX_REGIONS)", c->cfg.max_regions);
		return -ENOSPC;
	}
	idx = mem->device ? export_device(c, mem, &off) : export_of(c, mem, &off);
	atomic_store_explicit(&sl[i].kind, mem->device ? SLOT_DEVICE : SLOT_HOST, memory_order_relaxed);
	atomic_store_explicit(&sl[i].addr, (uintptr_t)mem->addr, memory_order_relaxed);
	atomic_store_explicit(&sl[i].length, mem->length, memory_order_relaxed);
	atomic_store_explicit(&sl[i].export_idx, idx, memory_order_relaxed);
	atomic_store_explicit(&sl[i].export_off, off, memory_order_relaxed);
	atomic_store_explicit(&sl[i].pins, 0, memory_order_relaxed);
	uint64_t gen = (atomic_load(&sl[i].state) >> 2) + 1;
	atomic_store_explicit(&sl[i].state, gen << 2 | SLOT_LIVE, memory_order_release);
	if (i == high)
		atomic_store(&c->ctl->high, high + 1);
	pthread_mutex_unlock(&c->reg_lock);
	return 0;
}

int shm_target_unregister(shm_ctx *c, void *addr, size_t length)
{
	shm_slot *sl = SHM_SLOTS(c->ctl);
	int rc = 0;

	pthread_mutex_lock(&c->reg_lock);
	uint32_t high = atomic_load(&c->ctl->high);
	for (uint32_t i = 0; i < high; i++) {
		uint64_t st = atomic_load(&sl[i].state);
		if (slot_state(st) != SLOT_LIVE || atomic_load(&sl[i].addr) != (uintptr_t)addr ||
		    atomic_load(&sl[i].length) != length)
			continue;
		/* Dying first, then the pins: an initiator pins, then checks the
		 * state (both sequentially consistent), so either it sees dying and
		 * backs off, or this sees its pin and waits for the copy. */
		atomic_store(&sl[i].state, (st & ~3ull) | SLOT_DYING);
		int64_t end = now_ms() + c->cfg.unregister_timeout_ms;
		while (atomic_load(&sl[i].pins) > 0) {
			if (now_ms() > end) {
				TE_HOST_LOG_LIMITED(c->host, TE_LOG_WARN,
						    "shm: unregistering %p: %lld copies of peers still pinned after %lld ms "
						    "(a peer died mid-copy?); going ahead",
						    addr, (long long)atomic_load(&sl[i].pins),
						    (long long)c->cfg.unregister_timeout_ms);
				rc = 0;
				break;
			}
			usleep(50);
		}
		atomic_store(&sl[i].state, (st & ~3ull) | SLOT_FREE);
		break;
	}
	pthread_mutex_unlock(&c->reg_lock);
	return rc;
}

/* ------------------------------------------------------- first contact */

static int yama_scope(void)
{
	int scope = 0;
	FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
	if (f == NULL)
		return 0;
	if (fscanf(f, "%d", &scope) != 1)
		scope = 0;
	fclose(f);
	return scope;
}

void shm_target_accept(shm_ctx *c)
{
	for (;;) {
		int fd = accept4(c->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR)
				TE_HOST_LOG_LIMITED(c->host, TE_LOG_WARN, "shm: accept: %s", strerror(errno));
			return;
		}
		/* Its first message is answered when it arrives; one that does not
		 * arrive in time closes the connection (shm_target_sweep). */
		if (g_hash_table_size(c->clients) >= SHM_MAX_CLIENTS || shm_watch(c, fd, W_CLIENT) < 0) {
			TE_HOST_LOG_LIMITED(c->host, TE_LOG_WARN, "shm: too many connections (%d); one refused",
					    SHM_MAX_CLIENTS);
			close(fd);
			continue;
		}
		g_hash_table_insert(c->clients, GINT_TO_POINTER(fd), GINT_TO_POINTER((int)(now_ms() / 100 + HELLO_TIMEOUT_MS / 100)));
	}
}

static void drop_client(shm_ctx *c, int fd)
{
	epoll_ctl(c->ep, EPOLL_CTL_DEL, fd, NULL);
	close(fd);
	g_hash_table_remove(c->clients, GINT_TO_POINTER(fd));
}

void shm_target_client(shm_ctx *c, int fd)
{
	gpointer v;
	if (!g_hash_table_lookup_extended(c->clients, GINT_TO_POINTER(fd), NULL, &v))
		return;
	/* Attached connections say nothing more: an event is a hang-up (or junk). */
	if (GPOINTER_TO_INT(v) == 0 || shm_target_hello(c, fd) < 0)
		drop_client(c, fd);
	else
		g_hash_table_insert(c->clients, GINT_TO_POINTER(fd), GINT_TO_POINTER(0)); /* attached */
}

int shm_target_sweep(shm_ctx *c)
{
	GHashTableIter it;
	gpointer k, v;
	int now = (int)(now_ms() / 100), late[64], n = 0, waiting = 0;

	g_hash_table_iter_init(&it, c->clients);
	while (g_hash_table_iter_next(&it, &k, &v)) {
		if (GPOINTER_TO_INT(v) != 0 && GPOINTER_TO_INT(v) < now && n < 64)
			late[n++] = GPOINTER_TO_INT(k);
		else if (GPOINTER_TO_INT(v) != 0)
			waiting++;
	}
	for (int i = 0; i < n; i++) {
		TE_HOST_LOG_LIMITED(c->host, TE_LOG_INFO, "shm: a connection said nothing for %d ms; closed",
				    HELLO_TIMEOUT_MS);
		drop_client(c, late[i]);
	}
	return waiting;
}

void shm_target_drop_clients(shm_ctx *c)
{
	GHashTableIter it;
	gpointer k;

	g_hash_table_iter_init(&it, c->clients);
	while (g_hash_table_iter_next(&it, &k, NULL))
		close(GPOINTER_TO_INT(k));
	g_hash_table_remove_all(c->clients);
}

/* Answers the first message of connection `fd` (non-blocking: it has
 * arrived). 0 when the initiator is attached: the connection stays open so
 * that it sees this process go away; -1 to close it. */
int shm_target_hello(shm_ctx *c, int fd)
{
	struct ucred cred;
	socklen_t cl = sizeof cred;
	shm_hello hello;
	shm_welcome *w = NULL;
	int status = 0;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0)
		return -1;
	ssize_t r = recv(fd, &hello, sizeof hello, MSG_DONTWAIT | MSG_TRUNC);
	if (r != (ssize_t)sizeof hello || hello.magic != SHM_MAGIC || hello.version != SHM_VERSION) {
		if (r != 0)
			TE_HOST_LOG_LIMITED(c->host, TE_LOG_WARN,
					    "shm: pid %d sent a malformed first message (%zd bytes); closed",
					    (int)cred.pid, r);
		return -1;
	}
	hello.host[sizeof hello.host - 1] = '\0';
	/* Only the same user (or root) shares this process's memory. */
	if (cred.uid != getuid() && cred.uid != 0) {
		TE_HOST_LOG_LIMITED(c->host, TE_LOG_WARN, "shm: refused pid %d of uid %u (this engine runs as uid %u)",
				    (int)cred.pid, (unsigned)cred.uid, (unsigned)getuid());
		status = EPERM;
	} else if (strcmp(hello.host, c->cfg.host) != 0 || hello.pid != (uint64_t)cred.pid) {
		TE_HOST_LOG_LIMITED(c->host, TE_LOG_WARN, "shm: pid %d claims host %s, pid %llu; this is %s: refused",
				    (int)cred.pid, hello.host, (unsigned long long)hello.pid, c->cfg.host);
		status = EHOSTUNREACH;
	}
	w = calloc(1, sizeof *w);
	if (w == NULL)
		return -1;
	w->magic = SHM_MAGIC;
	w->version = SHM_VERSION;
	w->pid = (uint64_t)getpid();
	snprintf(w->host, sizeof w->host, "%s", c->cfg.host);
	w->ctl_addr = (uintptr_t)c->ctl;
	w->ctl_size = c->ctl_size;
	w->status = (uint32_t)status;

	int fds[1 + SHM_MAX_EXPORTS];
	unsigned nfds = 0;
	if (status == 0) {
		pthread_mutex_lock(&c->reg_lock);
		fds[nfds++] = c->ctl_fd;
		for (unsigned i = 0; i < c->nexports; i++) {
			const shm_export *x = &c->exports[i];
			shm_export_wire *xw = &w->exports[i];
			xw->base = x->base;
			xw->size = x->size;
			xw->kind = x->kind;
			xw->has_fd = x->fd >= 0;
			if (x->kind == EXPORT_DEVICE) {
				memcpy(xw->location, x->location, sizeof xw->location);
				xw->ipc = x->ipc;
			}
			if (x->fd >= 0)
				fds[nfds++] = x->fd;
		}
		w->nexports = c->nexports;
		/* Where Yama wants a process to consent to being attached to,
		 * consent for the initiators (same user) of this engine. */
		if (c->cfg.cma && c->cfg.grant_ptrace && !c->granted && yama_scope() == 1) {
			if (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) == 0)
				SLOG(c, TE_LOG_INFO, "shm: let same-user processes attach (Yama ptrace_scope 1)");
			c->granted = true;
		}
		pthread_mutex_unlock(&c->reg_lock);
	}
	size_t len = offsetof(shm_welcome, exports) + (size_t)w->nexports * sizeof w->exports[0];
	unsigned w_nexports = w->nexports;
	struct iovec iov = { w, len };
	union {
		char buf[CMSG_SPACE(sizeof fds)];
		struct cmsghdr align;
	} u;
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (nfds > 0) {
		m.msg_control = u.buf;
		m.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
	}
	ssize_t sent = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
	free(w);
	if (sent != (ssize_t)len || status != 0)
		return -1;
	SLOG(c, TE_LOG_DEBUG, "shm: pid %d attached (%u exported allocations)", (int)cred.pid, w_nexports);
	return 0;
}
