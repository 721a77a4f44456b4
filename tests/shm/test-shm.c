/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The same-host transport with a target in another process (shm-peer):
 * reads and writes of many sizes with every byte checked, through shared
 * memory and through cross-memory attach; a peer of another host left to
 * TCP; the target's range checks; a target that dies mid-transfer; the kernel
 * refusing cross-memory attach; unregistering while copies run; bad first
 * contacts; and the choice of transport (auto, forced).
 *
 * argv[1]: the shm-peer program.
 */
#include <linux/capability.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>

#include <json-glib/json-glib.h>

#include "../common/child.h"
#include "../common/util.h"

#define REGION_SIZE (8u << 20)
#define LOCAL_SIZE (16u << 20)

static const char *peer_prog;

typedef struct peer {
	child c;
	char name[128];
	uint64_t r[3]; /* A, B, C */
} peer;

static bool peer_start(peer *p, const char *kind, char *const env[])
{
	char *argv[] = { (char *)peer_prog, (char *)kind, NULL };
	if (!child_start(&p->c, argv, env))
		return false;
	const char *l = child_expect(&p->c, "READY ", 10000);
	if (l == NULL)
		return false;
	unsigned long long a, b, c;
	if (sscanf(l, "%127s %llx %llx %llx", p->name, &a, &b, &c) != 4)
		return false;
	p->r[0] = a;
	p->r[1] = b;
	p->r[2] = c;
	return true;
}

/* A command, then the answer's line starting with `want`. */
static bool peer_cmd(peer *p, const char *cmd, const char *want)
{
	return child_cmd(&p->c, cmd, want);
}

static te_engine *engine(const char *transports)
{
	te_engine *e = NULL;
	te_option opt = { "transports", transports };
	int rc = te_engine_create("P2PHANDSHAKE", "127.0.0.1", &opt, transports ? 1 : 0, &e);
	if (rc < 0)
		fprintf(stderr, "engine: %s\n", te_strerror(rc));
	return e;
}

static int one(te_engine *e, uint32_t op, te_segment_id seg, void *local, uint64_t remote, uint64_t len,
	       te_task_status *st)
{
	te_batch_id b;
	te_request r = { op, seg, local, remote, len };
	if (te_batch_alloc(e, 1, &b) < 0)
		return -1;
	te_submit(e, b, &r, 1);
	te_batch_wait(e, b, 20000);
	te_get_status(e, b, 0, st);
	te_batch_free(e, b);
	return st->state;
}

/* Reads and writes of many sizes at unaligned offsets in region `ri`,
 * checked byte for byte on both sides. */
static void roundtrips(te_engine *e, te_segment_id seg, peer *p, int ri, unsigned char *local)
{
	static const uint64_t sizes[] = { 1, 7, 4095, 4096, 65536 + 3, 1u << 20, (5u << 20) + 1 };
	char cmd[128];
	te_task_status st;
	char r = (char)('A' + ri);
	for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
		uint64_t n = sizes[i], off = (i * 4099) % 4093;
		unsigned seed = 100 + (unsigned)i + 10u * (unsigned)ri;
		/* read: the peer's pattern lands in `local` */
		snprintf(cmd, sizeof cmd, "fill %c %u", r, seed);
		REQUIRE(peer_cmd(p, cmd, "FILLED"));
		memset(local, 0xee, LOCAL_SIZE);
		CHECK_EQ(one(e, TE_OP_READ, seg, local + 3, p->r[ri] + off, n, &st), TE_TASK_COMPLETED);
		CHECK_EQ(st.transferred, n);
		unsigned char *want = malloc(REGION_SIZE);
		fill_pattern(want, REGION_SIZE, seed);
		CHECK(memcmp(local + 3, want + off, n) == 0);
		CHECK(local[2] == 0xee && local[3 + n] == 0xee);
		/* write: our pattern lands there, nothing around it moves */
		fill_pattern(local, LOCAL_SIZE, seed + 1);
		CHECK_EQ(one(e, TE_OP_WRITE, seg, local + 5, p->r[ri] + off, n, &st), TE_TASK_COMPLETED);
		free(want);
		/* around the written range the peer still holds its pattern... */
		snprintf(cmd, sizeof cmd, "check %c %u %llu %llu", r, seed, 0ULL, (unsigned long long)off);
		CHECK(peer_cmd(p, cmd, "OK"));
		if (off + n < REGION_SIZE) {
			snprintf(cmd, sizeof cmd, "check %c %u %llu %llu", r, seed, (unsigned long long)(off + n),
				 (unsigned long long)(REGION_SIZE - off - n));
			CHECK(peer_cmd(p, cmd, "OK"));
		}
		/* ...and the written range holds our bytes, read back */
		memset(local + LOCAL_SIZE / 2, 0, n);
		CHECK_EQ(one(e, TE_OP_READ, seg, local + LOCAL_SIZE / 2, p->r[ri] + off, n, &st), TE_TASK_COMPLETED);
		CHECK(memcmp(local + LOCAL_SIZE / 2, local + 5, n) == 0);
	}
}

static unsigned char *local_buffer(te_engine *e)
{
	unsigned char *l = mmap(NULL, LOCAL_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	REQUIRE(l != MAP_FAILED);
	REQUIRE(te_register_memory(e, l, LOCAL_SIZE, "cpu:0", 0) == 0);
	return l;
}

/* Starts peer `p` (serving both kinds of memory) and an engine here with
 * `transports` and its local buffer; returns the peer's segment, which the
 * same-host transport serves. */
static te_segment_id shm_peer(peer *p, const char *transports, te_engine **e, unsigned char **local)
{
	REQUIRE(peer_start(p, "both", NULL));
	*e = engine(transports);
	REQUIRE(*e != NULL);
	*local = local_buffer(*e);
	te_segment_id seg = te_segment_open(*e, p->name);
	REQUIRE(seg > 0 && strcmp(te_segment_transport(*e, seg), "shm") == 0);
	return seg;
}

static void test_two_processes(void)
{
	peer p;
	REQUIRE(peer_start(&p, "both", NULL));
	te_engine *e = engine(NULL);
	REQUIRE(e != NULL);
	const char *tp = NULL;
	REQUIRE(te_transport_auto(e, &tp) == 0);
	CHECK(tp != NULL && strcmp(tp, "tcp") == 0); /* the network transport it chose */
	unsigned char *local = local_buffer(e);
	te_segment_id seg = te_segment_open(e, p.name);
	REQUIRE(seg > 0);
	CHECK(strcmp(te_segment_transport(e, seg), "shm") == 0);
	roundtrips(e, seg, &p, 0, local); /* anonymous memory: cross-memory attach */
	roundtrips(e, seg, &p, 1, local); /* te_mem_alloc memory: the shared mapping */

	/* one batch of 512 requests over both regions, both directions */
	enum { N = 512 };
	te_request reqs[N];
	te_batch_id b;
	fill_pattern(local, LOCAL_SIZE, 77);
	for (int i = 0; i < N; i++)
		reqs[i] = (te_request){ TE_OP_WRITE, seg, local + i * 8192, p.r[i % 2] + (uint64_t)(i / 2) * 8192, 8192 };
	REQUIRE(te_batch_alloc(e, 2 * N, &b) == 0);
	CHECK_EQ(te_submit(e, b, reqs, N), 0);
	CHECK_EQ(te_batch_wait(e, b, 20000), 0);
	for (int i = 0; i < N; i++)
		reqs[i] = (te_request){ TE_OP_READ, seg, local + LOCAL_SIZE / 2 + i * 8192,
					p.r[i % 2] + (uint64_t)(i / 2) * 8192, 8192 };
	CHECK_EQ(te_submit(e, b, reqs, N), 0);
	CHECK_EQ(te_batch_wait(e, b, 20000), 0);
	int32_t state;
	CHECK_EQ(te_batch_status(e, b, NULL, NULL, &state), 0);
	CHECK_EQ(state, TE_TASK_COMPLETED);
	CHECK(memcmp(local, local + LOCAL_SIZE / 2, (size_t)N * 8192) == 0);
	CHECK_EQ(te_batch_free(e, b), 0);

	/* forced: TCP serves the same peer */
	te_segment_close(e, seg);
	seg = te_segment_open_with(e, p.name, "tcp");
	REQUIRE(seg > 0);
	CHECK(strcmp(te_segment_transport(e, seg), "tcp") == 0);
	te_task_status st;
	CHECK_EQ(one(e, TE_OP_READ, seg, local, p.r[1], 4096, &st), TE_TASK_COMPLETED);
	te_segment_close(e, seg);
	te_engine_destroy(e);
	child_stop(&p.c, 0);
	munmap(local, LOCAL_SIZE);
}

/* The target's range checks: memory it did not make remote-accessible, past
 * its buffers, and a region it unregistered after the initiator read its
 * descriptor. */
static void test_ranges(void)
{
	peer p;
	te_task_status st;
	te_engine *e;
	unsigned char *local;
	te_segment_id seg = shm_peer(&p, "tcp,shm", &e, &local);
	/* C is registered but not remote-accessible: refused, not read */
	memset(local, 0, 4096);
	CHECK_EQ(one(e, TE_OP_READ, seg, local, p.r[2], 4096, &st), TE_TASK_FAILED);
	CHECK_EQ(st.error, TE_ERR_REJECTED);
	CHECK(local[0] == 0 && local[4095] == 0);
	CHECK_EQ(one(e, TE_OP_WRITE, seg, local, p.r[2], 16, &st), TE_TASK_FAILED);
	CHECK(peer_cmd(&p, "check C 3 0 16", "OK")); /* untouched */
	/* past A's end */
	CHECK_EQ(one(e, TE_OP_READ, seg, local, p.r[0] + REGION_SIZE - 8, 16, &st), TE_TASK_INVALID);
	CHECK_EQ(st.error, TE_ERR_ADDRESS);
	/* B unregistered (and freed) by the peer, the descriptor not yet fetched
	 * again: the copy is refused by the slot, not made into freed memory */
	CHECK(peer_cmd(&p, "unregister B", "UNREG 0"));
	CHECK_EQ(one(e, TE_OP_WRITE, seg, local, p.r[1], 4096, &st), TE_TASK_FAILED);
	CHECK_EQ(st.error, TE_ERR_REJECTED);
	/* libte fetches a refused segment's descriptor again by itself (at most
	 * once a second): soon the range is refused at submit */
	int state = TE_TASK_FAILED;
	for (long long end = now_ms() + 5000; state == TE_TASK_FAILED && now_ms() < end; usleep(100 * 1000))
		state = one(e, TE_OP_WRITE, seg, local, p.r[1], 4096, &st);
	CHECK_EQ(state, TE_TASK_INVALID);
	CHECK_EQ(one(e, TE_OP_READ, seg, local, p.r[0], 4096, &st), TE_TASK_COMPLETED); /* A still works */
	te_engine_destroy(e);
	child_stop(&p.c, 0);
	munmap(local, LOCAL_SIZE);
}

/* A peer whose host identity differs is left to TCP. */
static void test_other_host(void)
{
	peer p;
	te_task_status st;
	char *env[] = { "TE_SHM_HOST_ID=some-other-host", NULL };
	REQUIRE(peer_start(&p, "both", env));
	te_engine *e = engine("tcp,shm");
	unsigned char *local = local_buffer(e);
	te_segment_id seg = te_segment_open(e, p.name);
	REQUIRE(seg > 0);
	CHECK(strcmp(te_segment_transport(e, seg), "tcp") == 0);
	CHECK_EQ(one(e, TE_OP_READ, seg, local, p.r[0], 65536, &st), TE_TASK_COMPLETED);
	unsigned char *want = malloc(65536);
	fill_pattern(want, 65536, 1);
	CHECK(memcmp(local, want, 65536) == 0);
	free(want);
	te_engine_destroy(e);
	/* shm alone: the segment has no transport */
	e = engine("shm");
	CHECK(te_segment_open(e, p.name) < 0);
	te_engine_destroy(e);
	child_stop(&p.c, 0);
	munmap(local, LOCAL_SIZE);
}

/* The target dies while batches run: tasks end FAILED within a bound and
 * nothing hangs. */
static void test_target_dies(void)
{
	for (int kind = 0; kind < 2; kind++) { /* 0: attach (A), 1: shared mapping (B) */
		peer p;
		te_engine *e;
		unsigned char *local;
		te_segment_id seg = shm_peer(&p, "shm", &e, &local);
		long long killed = 0, failed_at = 0;
		int batches = 0;
		for (long long end = now_ms() + 10000; now_ms() < end && !failed_at; batches++) {
			te_batch_id b;
			te_request reqs[64];
			for (int i = 0; i < 64; i++)
				reqs[i] = (te_request){ TE_OP_READ, seg, local + i * 65536, p.r[kind] + (uint64_t)i * 65536, 65536 };
			REQUIRE(te_batch_alloc(e, 64, &b) == 0);
			te_submit(e, b, reqs, 64);
			CHECK_EQ(te_batch_wait(e, b, 5000), 0); /* never stuck */
			int32_t state;
			te_batch_status(e, b, NULL, NULL, &state);
			if (state != TE_TASK_COMPLETED)
				failed_at = now_ms();
			te_batch_free(e, b);
			if (batches == 20) {
				kill(p.c.pid, SIGKILL);
				killed = now_ms();
			}
		}
		CHECK(killed > 0 && failed_at > 0);
		CHECK(failed_at - killed < 2000);
		fprintf(stderr, "  target killed: first failed batch after %lld ms (%s)\n", failed_at - killed,
			kind ? "shared mapping" : "cross-memory attach");
		te_engine_destroy(e);
		child_stop(&p.c, 0);
		munmap(local, LOCAL_SIZE);
	}
}

/* Drops CAP_SYS_PTRACE from this process, so the kernel refuses to attach
 * to a non-dumpable process even as root. */
static bool drop_ptrace(void)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];
	if (syscall(SYS_capget, &h, d) != 0)
		return false;
	d[0].effective &= ~(1u << CAP_SYS_PTRACE);
	d[0].permitted &= ~(1u << CAP_SYS_PTRACE);
	return syscall(SYS_capset, &h, d) == 0;
}

/* In a child process (it drops a capability): a peer the kernel will not let
 * us attach to is served through its shared memory when all of it is shared,
 * and left to TCP when not. */
static void test_attach_refused(void)
{
	pid_t pid = fork();
	REQUIRE(pid >= 0);
	if (pid == 0) {
		te_task_status st;
		peer mixed, shared;
		if (!drop_ptrace() || !peer_start(&mixed, "both", NULL) || !peer_start(&shared, "shared", NULL) ||
		    !peer_cmd(&mixed, "nondumpable", "NONDUMPABLE") || !peer_cmd(&shared, "nondumpable", "NONDUMPABLE"))
			_exit(10);
		te_engine *e = engine("tcp,shm");
		unsigned char *local = local_buffer(e);
		te_segment_id s1 = te_segment_open(e, mixed.name), s2 = te_segment_open(e, shared.name);
		int bad = 0;
		bad |= s1 <= 0 || strcmp(te_segment_transport(e, s1), "tcp") != 0;
		bad |= (s2 <= 0 || strcmp(te_segment_transport(e, s2), "shm") != 0) << 1;
		bad |= (one(e, TE_OP_READ, s1, local, mixed.r[0], 65536, &st) != TE_TASK_COMPLETED) << 2;
		bad |= (one(e, TE_OP_READ, s2, local + 65536, shared.r[1], 65536, &st) != TE_TASK_COMPLETED) << 3;
		unsigned char *want = malloc(65536);
		fill_pattern(want, 65536, 1);
		bad |= (memcmp(local, want, 65536) != 0) << 4;
		fill_pattern(want, 65536, 2);
		bad |= (memcmp(local + 65536, want, 65536) != 0) << 5;
		te_engine_destroy(e);
		child_stop(&mixed.c, 0);
		child_stop(&shared.c, 0);
		_exit(bad);
	}
	int st = 0;
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st));
	CHECK_EQ(WEXITSTATUS(st), 0);
}

/* Two engines in this process: unregistering memory while slices of a large
 * read copy from it. Unregister must wait for the copies in progress: the
 * memory is unmapped the moment it returns, so a late copy would fault. */
typedef struct unreg_job {
	te_engine *t;
	void *mem;
	size_t len;
	long long at;
} unreg_job;

static void *unreg_thread(void *arg)
{
	unreg_job *j = arg;
	usleep(2000);
	CHECK_EQ(te_unregister_memory(j->t, j->mem), 0);
	j->at = now_ms();
	munmap(j->mem, j->len);
	return NULL;
}

static void test_unregister_during_copies(void)
{
	const size_t len = 256u << 20;
	te_option small_slices[] = { { "transports", "shm" }, { "TE_SHM_SLICE_SIZE", "262144" } };
	for (int round = 0; round < 3; round++) {
		te_engine *t = engine("shm"), *i = NULL;
		REQUIRE(te_engine_create("P2PHANDSHAKE", "127.0.0.1", small_slices, 2, &i) == 0);
		void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		void *dst = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		REQUIRE(mem != MAP_FAILED && dst != MAP_FAILED);
		memset(mem, 0x5a, len);
		REQUIRE(te_register_memory(t, mem, len, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
		REQUIRE(te_register_memory(i, dst, len, "cpu:0", 0) == 0);
		te_segment_id seg = te_segment_open(i, te_engine_name(t));
		REQUIRE(seg > 0 && strcmp(te_segment_transport(i, seg), "shm") == 0);
		te_batch_id b;
		te_request r = { TE_OP_READ, seg, dst, (uintptr_t)mem, len };
		REQUIRE(te_batch_alloc(i, 1, &b) == 0);
		unreg_job j = { t, mem, len, 0 };
		pthread_t th;
		CHECK_EQ(te_submit(i, b, &r, 1), 0);
		pthread_create(&th, NULL, unreg_thread, &j);
		CHECK_EQ(te_batch_wait(i, b, 30000), 0);
		pthread_join(th, NULL);
		te_task_status st;
		te_get_status(i, b, 0, &st);
		/* some slices may have moved before, none after */
		CHECK(st.state == TE_TASK_COMPLETED || (st.state == TE_TASK_FAILED && st.error == TE_ERR_REJECTED));
		CHECK(st.transferred <= len && st.transferred % 262144 == 0);
		te_batch_free(i, b);
		te_engine_destroy(i);
		te_engine_destroy(t);
		munmap(dst, len);
	}
}

/* First contacts that are not what they claim: refused, and the target goes
 * on serving real initiators. */
static void test_bad_contacts(void)
{
	te_engine *t = engine("shm"), *i = engine("shm");
	REQUIRE(t && i);
	void *mem;
	REQUIRE(te_mem_alloc(65536, &mem) == 0);
	REQUIRE(te_register_memory(t, mem, 65536, "cpu:0", TE_MEM_REMOTE_ACCESS) == 0);
	char *desc = NULL;
	REQUIRE(te_segment_descriptor(t, TE_LOCAL_SEGMENT, &desc) == 0);
	JsonParser *jp = json_parser_new();
	REQUIRE(json_parser_load_from_data(jp, desc, -1, NULL));
	JsonObject *o = json_object_get_object_member(json_node_get_object(json_parser_get_root(jp)), "libte_shm");
	REQUIRE(o != NULL);
	const char *path = json_object_get_string_member(o, "socket");
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	for (int k = 0; k < 4; k++) {
		int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
		REQUIRE(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
		unsigned char junk[400];
		memset(junk, k, sizeof junk);
		if (k == 1) { /* the right size, a wrong magic */
			CHECK(send(fd, junk, 176, 0) == 176);
		} else if (k == 2) { /* a well-formed hello from another host */
			struct {
				uint32_t magic, version;
				uint64_t pid;
				char host[160];
			} h = { 0x4d485354u, 2, (uint64_t)getpid(), "elsewhere" }; /* protocol version 2 */
			CHECK(send(fd, &h, sizeof h, 0) == (ssize_t)sizeof h);
			unsigned char reply[8192];
			ssize_t r = recv(fd, reply, sizeof reply, 0);
			/* an answer saying no: status EHOSTUNREACH, no memfds */
			CHECK(r >= 200);
			uint32_t status;
			memcpy(&status, reply + 8 + 8 + 160 + 8 + 8 + 4, 4);
			CHECK_EQ(status, EHOSTUNREACH);
		} else if (k == 3) {
			/* nothing at all: the target gives up after its timeout */
		} else {
			CHECK(send(fd, junk, 17, 0) == 17);
		}
		if (k != 2) {
			unsigned char reply[64];
			struct timeval tv = { 5, 0 };
			setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
			CHECK(recv(fd, reply, sizeof reply, 0) == 0); /* closed, nothing said */
		}
		close(fd);
	}
	te_segment_id seg = te_segment_open(i, te_engine_name(t));
	REQUIRE(seg > 0 && strcmp(te_segment_transport(i, seg), "shm") == 0);
	unsigned char buf[64] = { 0 };
	REQUIRE(te_register_memory(i, buf, sizeof buf, "cpu:0", 0) == 0);
	memcpy(mem, "still serving", 14);
	te_task_status st;
	CHECK_EQ(one(i, TE_OP_READ, seg, buf, (uintptr_t)mem, 14, &st), TE_TASK_COMPLETED);
	CHECK(memcmp(buf, "still serving", 14) == 0);
	g_object_unref(jp);
	te_free(desc);
	te_engine_destroy(i);
	te_engine_destroy(t);
	te_mem_free(mem);
}

/* One batch of many small scattered pieces (a KV cache's blocks): the
 * pieces go in copy runs of up to SHM_RUN_MAX, and still each lands where
 * its own request says, nothing between them moves, a piece the target
 * refuses fails alone, and READs and WRITEs mixed in one batch each go by
 * their own opcode. */
static int batch(te_engine *e, te_request *r, size_t n, te_batch_id *b)
{
	REQUIRE(te_batch_alloc(e, n, b) == 0);
	CHECK_EQ(te_submit(e, *b, r, n), 0);
	return te_batch_wait(e, *b, 20000);
}

static void test_copy_runs(void)
{
	enum { N = 1000, STRIDE = 8192 };
	static te_request r[N];
	peer p;
	te_batch_id b;
	te_task_status st;
	te_engine *e;
	unsigned char *local;
	te_segment_id seg = shm_peer(&p, "tcp,shm", &e, &local);
	unsigned char *back = local + LOCAL_SIZE / 2, *want = malloc(LOCAL_SIZE / 2);
	REQUIRE(want != NULL);

	fill_pattern(local, LOCAL_SIZE / 2, 41);
	for (int i = 0; i < N; i++)
		r[i] = (te_request){ TE_OP_WRITE, seg, local + (size_t)i * STRIDE, p.r[0] + (uint64_t)i * STRIDE,
				     4096 - (uint64_t)(i % 3) };
	r[N / 2].remote = p.r[2]; /* C: registered, not remote-accessible */
	r[N / 2].length = 64;
	CHECK_EQ(batch(e, r, N, &b), 0);
	for (int i = 0; i < N; i++) {
		CHECK_EQ(te_get_status(e, b, (size_t)i, &st), 0);
		CHECK_EQ(st.state, i == N / 2 ? TE_TASK_FAILED : TE_TASK_COMPLETED);
		if (i == N / 2)
			CHECK_EQ(st.error, TE_ERR_REJECTED);
	}
	te_batch_free(e, b);
	CHECK(peer_cmd(&p, "check C 3 0 4096", "OK")); /* untouched */
	/* the gaps between the pieces hold the peer's own pattern still */
	char cmd[96];
	for (int i = 0; i < N; i += 333) {
		snprintf(cmd, sizeof cmd, "check A 1 %llu %llu", (unsigned long long)((uint64_t)i * STRIDE + 4096),
			 (unsigned long long)(STRIDE - 4096));
		CHECK(peer_cmd(&p, cmd, "OK"));
	}
	r[N / 2].remote = p.r[0] + (uint64_t)(N / 2) * STRIDE;
	r[N / 2].length = 4096;
	/* Mixed: runs of 100 WRITEs of a new pattern and 100 READs by turns. */
	memcpy(want, local, LOCAL_SIZE / 2);
	fill_pattern(local, LOCAL_SIZE / 2, 42);
	memset(back, 0, LOCAL_SIZE / 2);
	for (int i = 0; i < N; i++)
		if ((i / 100) % 2) {
			r[i].opcode = TE_OP_READ;
			r[i].local = back + (size_t)i * STRIDE;
		} else {
			r[i].opcode = TE_OP_WRITE;
			memcpy(want + (size_t)i * STRIDE, local + (size_t)i * STRIDE, r[i].length);
		}
	/* the piece refused before holds no bytes of ours yet: written now */
	r[N / 2].opcode = TE_OP_WRITE;
	r[N / 2].local = local + (size_t)(N / 2) * STRIDE;
	memcpy(want + (size_t)(N / 2) * STRIDE, r[N / 2].local, 4096);
	CHECK_EQ(batch(e, r, N, &b), 0);
	int32_t state = 0;
	te_batch_status(e, b, NULL, NULL, &state);
	CHECK_EQ(state, TE_TASK_COMPLETED);
	te_batch_free(e, b);
	for (int i = 0; i < N; i++)
		if ((i / 100) % 2 && i != N / 2 && memcmp(back + (size_t)i * STRIDE, want + (size_t)i * STRIDE, r[i].length) != 0) {
			fprintf(stderr, "  READ %d differs\n", i);
			CHECK(false);
			break;
		}
	/* everything read back: what each piece's last WRITE put there */
	memset(back, 0, LOCAL_SIZE / 2);
	for (int i = 0; i < N; i++) {
		r[i].opcode = TE_OP_READ;
		r[i].local = back + (size_t)i * STRIDE;
	}
	CHECK_EQ(batch(e, r, N, &b), 0);
	te_batch_free(e, b);
	for (int i = 0; i < N; i++)
		if (memcmp(back + (size_t)i * STRIDE, want + (size_t)i * STRIDE, r[i].length) != 0) {
			fprintf(stderr, "  piece %d differs\n", i);
			CHECK(false);
			break;
		}
	free(want);
	te_engine_destroy(e);
	child_stop(&p.c, 0);
	munmap(local, LOCAL_SIZE);
}

/* Every copy through the shared mapping made with streaming stores
 * (TE_SHM_STREAM_BYTES=1): sizes and offsets at every alignment, single
 * requests and a batch of scattered odd-sized pieces both ways, checked
 * byte for byte with the bytes around them. */
static void test_streaming_stores(void)
{
	enum { N = 600, STRIDE = 8192 };
	static te_request r[N];
	peer p;
	te_batch_id b;

	REQUIRE(peer_start(&p, "both", NULL));
	setenv("TE_SHM_STREAM_BYTES", "1", 1);
	te_engine *e = engine("tcp,shm");
	unsetenv("TE_SHM_STREAM_BYTES");
	REQUIRE(e != NULL);
	unsigned char *local = local_buffer(e);
	te_segment_id seg = te_segment_open(e, p.name);
	REQUIRE(seg > 0 && strcmp(te_segment_transport(e, seg), "shm") == 0);
	roundtrips(e, seg, &p, 1, local); /* te_mem_alloc memory: the shared mapping */

	unsigned char *back = local + LOCAL_SIZE / 2;
	REQUIRE(peer_cmd(&p, "fill B 55", "FILLED"));
	fill_pattern(local, LOCAL_SIZE / 2, 56);
	for (int i = 0; i < N; i++) /* 1 to 5000 bytes, at offsets 0 to 14 both sides */
		r[i] = (te_request){ TE_OP_WRITE, seg, local + (size_t)i * STRIDE + (size_t)(i % 15),
				     p.r[1] + (uint64_t)i * STRIDE + (uint64_t)(i % 13), 1 + (uint64_t)(i * 4999 % 5000) };
	CHECK_EQ(batch(e, r, N, &b), 0);
	int32_t state = 0;
	te_batch_status(e, b, NULL, NULL, &state);
	CHECK_EQ(state, TE_TASK_COMPLETED);
	te_batch_free(e, b);
	/* read back, each piece with a guard byte either side */
	memset(back, 0xee, LOCAL_SIZE / 2);
	for (int i = 0; i < N; i++) {
		r[i].opcode = TE_OP_READ;
		r[i].local = back + (size_t)i * STRIDE + 1 + (size_t)(i % 7);
	}
	CHECK_EQ(batch(e, r, N, &b), 0);
	te_batch_free(e, b);
	int bad = -1;
	for (int i = 0; i < N && bad < 0; i++) {
		const unsigned char *got = r[i].local;
		if (memcmp(got, local + (size_t)i * STRIDE + (size_t)(i % 15), r[i].length) != 0 || got[-1] != 0xee ||
		    got[r[i].length] != 0xee)
			bad = i;
	}
	if (bad >= 0)
		fprintf(stderr, "  piece %d (%llu bytes) differs\n", bad, (unsigned long long)r[bad].length);
	CHECK_EQ(bad, -1);
	/* the peer's pattern holds between the pieces */
	char cmd[96];
	for (int i = 0; i < N; i += 97) {
		uint64_t end = (uint64_t)i * STRIDE + (uint64_t)(i % 13) + r[i].length;
		snprintf(cmd, sizeof cmd, "check B 55 %llu %llu", (unsigned long long)end,
			 (unsigned long long)((uint64_t)(i + 1) * STRIDE - end));
		CHECK(peer_cmd(&p, cmd, "OK"));
	}
	te_engine_destroy(e);
	child_stop(&p.c, 0);
	munmap(local, LOCAL_SIZE);
}

/* A target stopped with SIGSTOP: the initiator copies by itself (its
 * mapping of the target's memory, cross-memory attach), so a batch with a
 * 200 ms deadline completes well inside it; a cancel and a deadline already
 * past end what is left at once; after SIGCONT nothing more lands. */
static void test_stopped_target(void)
{
	peer p;
	te_engine *e;
	unsigned char *local;
	te_segment_id seg = shm_peer(&p, "shm", &e, &local);
	REQUIRE(kill(p.c.pid, SIGSTOP) == 0);
	enum { N = 64, LEN = 64 << 10 };
	te_request reqs[N];
	for (int i = 0; i < N; i++)
		reqs[i] = (te_request){ i % 2 ? TE_OP_READ : TE_OP_WRITE, seg, local + (size_t)i * LEN,
					p.r[i % 2] + (uint64_t)(i / 2) * LEN, LEN };
	te_batch_id b;
	REQUIRE(te_batch_alloc(e, 2 * N, &b) == 0);
	int64_t t0 = te_now_ns();
	CHECK_EQ(te_submit_by(e, b, reqs, N, t0 + 200 * 1000000LL), 0);
	CHECK_EQ(te_batch_wait(e, b, 5000), 0);
	int64_t took = (te_now_ns() - t0) / 1000000;
	int32_t state;
	CHECK_EQ(te_batch_status(e, b, NULL, NULL, &state), 0);
	CHECK_EQ(state, TE_TASK_COMPLETED);
	CHECK(took < 200);
	/* A deadline already past: what had not been copied ends at once. */
	t0 = te_now_ns();
	CHECK_EQ(te_submit_by(e, b, reqs, N, 1), 0);
	CHECK_EQ(te_batch_wait(e, b, 5000), 0);
	CHECK((te_now_ns() - t0) / 1000000 < 200);
	unsigned char snap[4096];
	memcpy(snap, local + LEN, sizeof snap); /* a READ's buffer */
	REQUIRE(kill(p.c.pid, SIGCONT) == 0);
	usleep(100 * 1000);
	CHECK(memcmp(snap, local + LEN, sizeof snap) == 0);
	CHECK_EQ(te_batch_free(e, b), 0);
	te_segment_close(e, seg);
	te_engine_destroy(e);
	child_stop(&p.c, 0);
	munmap(local, LOCAL_SIZE);
}

int main(int argc, char **argv)
{
	REQUIRE(argc == 2);
	peer_prog = argv[1];
	signal(SIGPIPE, SIG_IGN);
	TEST_RUN(test_two_processes);
	TEST_RUN(test_ranges);
	TEST_RUN(test_copy_runs);
	TEST_RUN(test_streaming_stores);
	TEST_RUN(test_other_host);
	TEST_RUN(test_target_dies);
	TEST_RUN(test_attach_refused);
	TEST_RUN(test_unregister_during_copies);
	TEST_RUN(test_bad_contacts);
	TEST_RUN(test_stopped_target);
	return check_done();
}
