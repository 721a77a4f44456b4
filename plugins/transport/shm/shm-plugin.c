/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libte's same-host transport: the plugin's entry points, its configuration,
 * the host identity it publishes, and the control thread that answers first
 * contacts and notices targets going away. shm-target.c serves; on the
 * initiator's side shm-contact.c opens a target's segment, shm-copy.c moves the
 * data and shm-queue.c decides which thread copies it.
 */
#include <errno.h>
#include <fcntl.h>
#include <json-glib/json-glib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "shm.h"
#include "teu-json.h"

/* ----------------------------------------------------------- identity */

/* The kernel's boot id tells this host from others (a network namespace of
 * the same kernel shares it); the PID and mount namespaces tell processes
 * that can attach to each other and reach each other's socket from those
 * in other containers. */
static void host_identity(char *out, size_t n)
{
	char boot[64] = "unknown";
	struct stat pidns = { 0 }, mntns = { 0 };
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");

	if (f != NULL) {
		if (fgets(boot, sizeof boot, f) == NULL)
			snprintf(boot, sizeof boot, "unknown");
		fclose(f);
		boot[strcspn(boot, "\n")] = '\0';
	}
	stat("/proc/self/ns/pid", &pidns);
	stat("/proc/self/ns/mnt", &mntns);
	snprintf(out, n, "%s/pid:%llu/mnt:%llu", boot, (unsigned long long)pidns.st_ino,
		 (unsigned long long)mntns.st_ino);
}

static void read_config(const te_host *h, shm_config *cfg)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	const char *s;

	cfg->threads = (unsigned)te_host_config_u64(h, "TE_SHM_THREADS", NULL, cpus > 0 ? (uint64_t)cpus : 1, 1, 64);
	cfg->inline_bytes = te_host_config_u64(h, "TE_SHM_INLINE_BYTES", NULL, 512u << 10, 0, 1ull << 30);
	cfg->slice = te_host_config_u64(h, "TE_SHM_SLICE_SIZE", NULL, 4u << 20, 4096, 1ull << 30);
	/* Up to 4 MiB (source and destination in the cache) a waiting caller
	 * copying alone beats it sharing with woken workers; from 16 MiB
	 * sharing wins (docs/benchmarks.md). */
	cfg->caller_bytes = te_host_config_u64(h, "TE_SHM_CALLER_BYTES", NULL, 4u << 20, 0, 1ull << 40);
	/* Thousands of small pieces (a KV cache's blocks) leave the cache
	 * anyway: stored past it they move at about the large-copy rate,
	 * through it at half that (docs/benchmarks.md). Below 1 MiB a take
	 * stays in the cache, where the target may read it soon. */
	cfg->stream_bytes = te_host_config_u64(h, "TE_SHM_STREAM_BYTES", NULL, 1u << 20, 0, 1ull << 40);
	/* The engine-wide bounded busy-wait of a waiting caller (other
	 * transports read it too). */
	cfg->spin_ns = 1000 * (int64_t)te_host_config_u64(h, "TE_SPIN_US", NULL, 0, 0, 1000);
	cfg->max_regions = (unsigned)te_host_config_u64(h, "TE_SHM_MAX_REGIONS", NULL, 4096, 16, 1u << 20);
	cfg->unregister_timeout_ms =
		(int64_t)te_host_config_u64(h, "TE_SHM_UNREGISTER_TIMEOUT_MS", NULL, 10000, 10, 3600000);
	cfg->cma = te_host_config_u64(h, "TE_SHM_CMA", NULL, 1, 0, 1) != 0;
	cfg->grant_ptrace = te_host_config_u64(h, "TE_SHM_GRANT_PTRACE", NULL, 1, 0, 1) != 0;
	s = h->config(h, "TE_SHM_DIR", NULL);
	if (s == NULL || *s == '\0')
		s = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
	snprintf(cfg->dir, sizeof cfg->dir, "%s", s);
	s = h->config(h, "TE_SHM_HOST_ID", NULL);
	if (s != NULL && *s != '\0')
		snprintf(cfg->host, sizeof cfg->host, "%s", s);
	else
		host_identity(cfg->host, sizeof cfg->host);
}

/* ----------------------------------------------------- control thread */


static void *ctl_main(void *arg)
{
	shm_ctx *c = arg;
	struct epoll_event ev[32];

	int waiting = 0;

	while (!atomic_load(&c->stop)) {
		/* A timer only while a connection owes its first message: an idle
		 * engine's control thread sleeps until something happens. */
		int n = epoll_wait(c->ep, ev, 32, waiting > 0 ? 500 : -1);
		for (int i = 0; i < n; i++) {
			uint64_t tag = ev[i].data.u64 >> 62, val = ev[i].data.u64 & ((1ull << 62) - 1);
			if (tag == W_WAKE && val == (uint64_t)c->kick_fd) {
				uint64_t x;
				/* (EAGAIN: re-armed since it expired; it fires again) */
				if (read(c->kick_fd, &x, sizeof x) < 0 && errno != EAGAIN)
					SLOG(c, TE_LOG_DEBUG, "kick timer: %s", strerror(errno));
				shm_kick(c);
			} else if (tag == W_WAKE) {
				uint64_t x;
				if (read(c->wake_fd, &x, sizeof x) < 0 && errno != EAGAIN)
					SLOG(c, TE_LOG_DEBUG, "wake: %s", strerror(errno));
			} else if (tag == W_LISTEN) {
				shm_target_accept(c);
			} else if (tag == W_CLIENT) {
				shm_target_client(c, (int)val);
			} else {
				/* A target we use hung up: later requests to it fail at once. */
				pthread_mutex_lock(&c->seg_lock);
				for (shm_seg *s = c->segs; s != NULL; s = s->next) {
					if ((uint64_t)s->fd == val) {
						if (!atomic_exchange(&s->dead, true))
							/* Targets can come and go at will: limited. */
							TE_HOST_LOG_LIMITED(c->host, TE_LOG_WARN,
									    "segment %s: the target went away (pid %d)",
									    s->name, (int)s->pid);
						epoll_ctl(c->ep, EPOLL_CTL_DEL, s->fd, NULL);
					}
				}
				pthread_mutex_unlock(&c->seg_lock);
			}
		}
		waiting = shm_target_sweep(c); /* (after the accepts: their deadlines count) */
	}
	return NULL;
}

int shm_watch(shm_ctx *c, int fd, int kind)
{
	struct epoll_event ev = { .events = kind == W_LISTEN ? EPOLLIN : (EPOLLIN | EPOLLRDHUP | EPOLLHUP),
				  .data.u64 = ((uint64_t)kind << 62) | (uint64_t)(unsigned)fd };
	return epoll_ctl(c->ep, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

/* ----------------------------------------------------------------- ops */

static void shm_destroy(void *ctx);

/* Takes down what shm_create() set up once its threads are gone (or were
 * never started): the target socket, the descriptors, the locks. */
static void shm_ctx_free(shm_ctx *c)
{
	shm_target_stop(c);
	if (c->ep >= 0)
		close(c->ep);
	if (c->wake_fd >= 0)
		close(c->wake_fd);
	if (c->kick_fd >= 0)
		close(c->kick_fd);
	pthread_mutex_destroy(&c->reg_lock);
	pthread_mutex_destroy(&c->seg_lock);
	pthread_mutex_destroy(&c->q_lock);
	pthread_cond_destroy(&c->q_cond);
	pthread_cond_destroy(&c->p_cond);
	pthread_key_delete(c->waiter_key);
	pthread_key_delete(c->streak_key);
	free(c);
}

static int shm_create(const te_host *h, const char *json_args, void **out)
{
	shm_ctx *c;
	int rc;

	(void)json_args;
	if (!TE_HAS_OP(h, shared_memory)) {
		h->log(h, TE_LOG_ERROR, "this libte is too old for the shm transport (plugin ABI 1.1 needed)");
		return TE_ERR_PLUGIN;
	}
	c = calloc(1, sizeof *c);
	if (c == NULL)
		return -ENOMEM;
	c->host = h;
	c->complete_many = te_host_complete_many_fn(h);
	c->ctl_fd = c->listen_fd = c->ep = c->wake_fd = c->kick_fd = -1;
	read_config(h, &c->cfg);
	pthread_mutex_init(&c->reg_lock, NULL);
	pthread_mutex_init(&c->seg_lock, NULL);
	pthread_mutex_init(&c->q_lock, NULL);
	pthread_cond_init(&c->q_cond, NULL);
	/* progress() deadlines are CLOCK_MONOTONIC, like the host's */
	pthread_condattr_t ca;
	rc = pthread_condattr_init(&ca);
	if (rc == 0) {
		rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		if (rc == 0)
			rc = pthread_cond_init(&c->p_cond, &ca);
		pthread_condattr_destroy(&ca);
	}
	if (rc == 0) {
		rc = pthread_key_create(&c->waiter_key, NULL);
		if (rc == 0 && (rc = pthread_key_create(&c->streak_key, NULL)) != 0)
			pthread_key_delete(c->waiter_key);
		if (rc != 0)
			pthread_cond_destroy(&c->p_cond);
	}
	if (rc != 0) {
		h->log(h, TE_LOG_ERROR, "shm transport not started: %s", strerror(rc));
		pthread_mutex_destroy(&c->reg_lock);
		pthread_mutex_destroy(&c->seg_lock);
		pthread_mutex_destroy(&c->q_lock);
		pthread_cond_destroy(&c->q_cond);
		free(c);
		return -rc;
	}
	c->ep = epoll_create1(EPOLL_CLOEXEC);
	c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	c->kick_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	if (c->ep < 0 || c->wake_fd < 0 || c->kick_fd < 0) {
		rc = -errno;
		goto fail;
	}
	if ((rc = shm_watch(c, c->wake_fd, W_WAKE)) < 0 || (rc = shm_watch(c, c->kick_fd, W_WAKE)) < 0 ||
	    (rc = shm_target_start(c)) < 0 ||
	    (rc = shm_watch(c, c->listen_fd, W_LISTEN)) < 0 || (rc = shm_workers_start(c)) < 0)
		goto fail;
	if (pthread_create(&c->ctl_thread, NULL, ctl_main, c) != 0) {
		rc = -EAGAIN;
		shm_workers_stop(c);
		goto fail;
	}
	SLOG(c, TE_LOG_INFO, "shm: host %s, socket %s, %u copy threads, cross-memory attach %s", c->cfg.host,
	     c->sock_path, c->cfg.threads, c->cfg.cma ? "on" : "off");
	*out = c;
	return 0;
fail:
	SLOG(c, TE_LOG_ERROR, "shm transport not started: %s", strerror(-rc));
	shm_ctx_free(c);
	return rc;
}

static void shm_destroy(void *ctx)
{
	shm_ctx *c = ctx;
	uint64_t one = 1;

	shm_workers_stop(c); /* completes whatever they still held */
	atomic_store(&c->stop, true);
	if (write(c->wake_fd, &one, sizeof one) < 0)
		SLOG(c, TE_LOG_DEBUG, "wake: %s", strerror(errno));
	pthread_join(c->ctl_thread, NULL);
	shm_ctx_free(c);
}

static int shm_describe(void *ctx, char **json)
{
	shm_ctx *c = ctx;
	JsonBuilder *b = json_builder_new();

	json_builder_begin_object(b);
	json_builder_set_member_name(b, SHM_FIELD);
	json_builder_begin_object(b);
	json_builder_set_member_name(b, "version");
	json_builder_add_int_value(b, SHM_VERSION);
	json_builder_set_member_name(b, "host");
	json_builder_add_string_value(b, c->cfg.host);
	json_builder_set_member_name(b, "pid");
	json_builder_add_int_value(b, getpid());
	json_builder_set_member_name(b, "uid");
	json_builder_add_int_value(b, getuid());
	json_builder_set_member_name(b, "socket");
	json_builder_add_string_value(b, c->sock_path);
	json_builder_end_object(b);
	json_builder_end_object(b);
	*json = teu_json_finish(b, NULL);
	return *json ? 0 : -ENOMEM;
}

static int shm_mem_register(void *ctx, const te_mem_info *mem, char **json)
{
	*json = NULL;
	return shm_target_register(ctx, mem);
}

static int shm_mem_unregister(void *ctx, void *addr, size_t length)
{
	return shm_target_unregister(ctx, addr, length);
}

static int shm_seg_open(void *ctx, const te_segment_info *seg, void **seg_ctx)
{
	return shm_segment_open(ctx, seg, (shm_seg **)seg_ctx);
}

static void shm_seg_close(void *ctx, void *seg_ctx)
{
	shm_segment_close(ctx, seg_ctx);
}

static int shm_submit_op(void *ctx, te_transfer *const *t, size_t n)
{
	return shm_submit(ctx, t, n);
}

static int shm_progress_op(void *ctx, int (*done)(void *arg), void *arg, int64_t timeout_ns)
{
	return shm_progress(ctx, done, arg, timeout_ns);
}

static void shm_wake_op(void *ctx)
{
	shm_wake(ctx);
}

static int shm_report(const te_host *h, char **text)
{
	shm_config cfg;
	int scope = -1;
	FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");

	if (f != NULL) {
		if (fscanf(f, "%d", &scope) != 1)
			scope = -1;
		fclose(f);
	}
	read_config(h, &cfg);
	char *s = g_strdup_printf("Same-host transport: shared te_mem_alloc() memory and cross-memory attach\n"
				  "  host identity          %s (TE_SHM_HOST_ID)\n"
				  "  copy threads           %u (TE_SHM_THREADS)\n"
				  "  copied by the caller   up to %llu bytes per submit (TE_SHM_INLINE_BYTES)\n"
				  "  waiting caller alone   up to %llu bytes per submit (TE_SHM_CALLER_BYTES); spins %llu us "
				  "(TE_SPIN_US)\n"
				  "  streaming stores       pieces under %u KiB of takes from %llu bytes (TE_SHM_STREAM_BYTES%s)\n"
				  "  cross-memory attach    %s (TE_SHM_CMA); Yama ptrace_scope %s%s\n"
				  "  socket folder          %s (TE_SHM_DIR)\n",
				  cfg.host, cfg.threads, (unsigned long long)cfg.inline_bytes,
				  (unsigned long long)cfg.caller_bytes, (unsigned long long)(cfg.spin_ns / 1000),
				  SHM_STREAM_PIECE_MAX >> 10, (unsigned long long)cfg.stream_bytes,
				  shm_stream_supported() ? (cfg.stream_bytes ? "" : ": off") : ": not on this CPU",
				  cfg.cma ? "on" : "off", scope < 0 ? "absent" : scope == 0 ? "0" : scope == 1 ? "1" : "2+",
				  scope == 1 ? (cfg.grant_ptrace ? " (targets grant their initiators: TE_SHM_GRANT_PTRACE)"
								 : " (no grant: TE_SHM_GRANT_PTRACE=0)")
				  : scope >= 2 ? " (attach refused: shared memory only)" : "",
				  cfg.dir);
	*text = strdup(s);
	g_free(s);
	return *text ? 0 : -ENOMEM;
}

/* Every copy is made inside the host's gate and by this process itself, so
 * once the host closed it nothing more lands at the target: settled. The
 * pieces still queued find the gate closed and end at once. */
static int shm_expire_op(void *ctx, te_transfer *t)
{
	(void)ctx;
	(void)t;
	return 0;
}

static const te_transport_ops shm_ops = {
	.size = sizeof(te_transport_ops),
	.flags = TE_TRANSPORT_MEMORY | TE_TRANSPORT_SAME_HOST | TE_TRANSPORT_DEVICE_TARGET | TE_TRANSPORT_DEADLINES |
		 TE_TRANSPORT_DEVICE_MEMORY,
	.create = shm_create,
	.destroy = shm_destroy,
	.describe = shm_describe,
	.mem_register = shm_mem_register,
	.mem_unregister = shm_mem_unregister,
	.segment_open = shm_seg_open,
	.segment_close = shm_seg_close,
	.submit = shm_submit_op,
	.report = shm_report,
	.progress = shm_progress_op,
	.wake = shm_wake_op,
	.expire = shm_expire_op,
};

TE_PLUGIN_DEFINE(TE_KIND_TRANSPORT, "shm", "1.0.0",
		 "Same-host transport: one copy through shared memory or cross-memory attach", "Apache-2.0",
		 &shm_ops)
