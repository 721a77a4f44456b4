/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvmeof-bench: throughput of READ or WRITE requests against an NVMe-oF file
 * segment, driven like fio drives a file: a fixed number of requests always
 * in flight (the queue depth), each one block, random or sequential offsets.
 * Each in-flight slot is a batch of its own. A thread refills every slot whose
 * request is done and then waits for its oldest request (te_batch_wait), or,
 * with --poll 1, checks its slots again without sleeping, the way Mooncake's
 * transfer_engine_bench polls task status.
 *
 *   nvmeof-bench -m CONN (--segment nvmeof/NAME | --file PATH) [options]
 *     --op read|write   (read)      --bs BYTES       (4096)
 *     --qd N            (32)        --pattern rand|seq (rand)
 *     --threads N       (1)         --poll 0|1       (0)
 *     --hugepages 0|1   (0)         --runtime SEC    (10)
 *     --name LOCAL      (this engine's name, "bench")
 * --file registers a one-file segment for PATH (a regular file or a block
 * device, whose size the device reports) in the store first and removes it
 * afterwards, and allows that file alone (TE_NVMEOF_ALLOW); with --segment the
 * environment's TE_NVMEOF_ALLOW must list the segment's files. Prints one line:
 *   RESULT <op> <bs> <qd> <pattern> <MiB/s> <IOPS> <seconds> <requests>
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <te/te.h>

#define SLOT_TASKS 256 /* tasks per slot batch before it is replaced (small: stays in cache) */

typedef struct slot {
	te_batch_id batch;
	size_t used;      /* tasks submitted to the batch */
	bool busy;        /* its last request is in flight */
	uint64_t seq;     /* submission order, to find the oldest */
	unsigned char *buf;
} slot;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t rnd_next(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ull;
}

static int die(const char *what, int rc)
{
	fprintf(stderr, "nvmeof-bench: %s: %s\n", what, te_strerror(rc));
	return 1;
}

static int usage(void)
{
	fprintf(stderr, "usage: nvmeof-bench -m CONN (--segment nvmeof/NAME | --file PATH) [--op read|write]\n"
			"       [--bs BYTES] [--qd N] [--threads N] [--poll 0|1] [--hugepages 0|1]\n"
			"       [--pattern rand|seq] [--runtime SEC] [--name LOCAL]\n");
	return 2;
}

/* Bytes a regular file or a block device holds (a block device's st_size
 * is 0: ask the device); <= 0 after a message when it cannot serve. */
static long long file_size(const char *path)
{
	struct stat st;
	uint64_t bytes = 0;

	if (stat(path, &st) != 0) {
		fprintf(stderr, "nvmeof-bench: %s: %s\n", path, strerror(errno));
		return -1;
	}
	if (S_ISREG(st.st_mode)) {
		if (st.st_size <= 0)
			fprintf(stderr, "nvmeof-bench: %s: empty\n", path);
		return st.st_size;
	}
	if (!S_ISBLK(st.st_mode)) {
		fprintf(stderr, "nvmeof-bench: %s: neither a regular file nor a block device\n", path);
		return -1;
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || ioctl(fd, BLKGETSIZE64, &bytes) != 0) {
		fprintf(stderr, "nvmeof-bench: %s: cannot read the device's size: %s\n", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	if (bytes == 0 || bytes > (uint64_t)INT64_MAX) {
		fprintf(stderr, "nvmeof-bench: %s: the device holds %llu bytes\n", path, (unsigned long long)bytes);
		return -1;
	}
	return (long long)bytes;
}

static atomic_uint_fast64_t shared_next; /* the sequential stream's next block */

typedef struct runner {
	te_engine *e;
	te_segment_id seg;
	slot *slots;
	unsigned first, step, qd;
	uint64_t bs, blocks;
	bool write, seq, poll;
	double end;
	uint64_t rs;
	uint64_t ios, failed;
	int rc;
} runner;

/* Starts the next request in slot `s`. */
static int refill(runner *r, slot *s, uint64_t seq)
{
	int rc;

	if (s->used == SLOT_TASKS) {
		te_batch_free(r->e, s->batch);
		if ((rc = te_batch_alloc(r->e, SLOT_TASKS, &s->batch)) < 0)
			return rc;
		s->used = 0;
	}
	uint64_t blk = r->seq ? atomic_fetch_add(&shared_next, 1) % r->blocks : rnd_next(&r->rs) % r->blocks;
	te_request q = { r->write ? TE_OP_WRITE : TE_OP_READ, r->seg, s->buf, blk * r->bs, r->bs };
	rc = te_submit(r->e, s->batch, &q, 1);
	if (rc != 0)
		return rc < 0 ? rc : -EINVAL;
	s->used++;
	s->busy = true;
	s->seq = seq;
	return 0;
}

/* Keeps this thread's slots busy until the end time, then drains them. Like
 * fio reaping whatever completed, each sweep over the slots refills every one
 * whose request is done (te_batch_status, no sleeping); a sweep that finds
 * none done waits for the oldest request in flight (te_batch_wait), or, with
 * --poll 1, sweeps again at once. */
static void *run(void *arg)
{
	runner *r = arg;
	uint64_t seq = 0;

	for (;;) {
		bool stopping = now_s() >= r->end;
		unsigned done = 0, busy = 0;
		slot *oldest = NULL;
		for (unsigned i = r->first; i < r->qd; i += r->step) {
			slot *s = &r->slots[i];
			if (s->busy) {
				size_t in_flight = 1;
				te_task_status st;
				if ((r->rc = te_batch_status(r->e, s->batch, NULL, &in_flight, NULL)) < 0)
					return NULL;
				if (in_flight > 0) {
					busy++;
					if (oldest == NULL || s->seq < oldest->seq)
						oldest = s;
					continue;
				}
				s->busy = false;
				done++;
				te_get_status(r->e, s->batch, s->used - 1, &st);
				if (st.state == TE_TASK_COMPLETED)
					r->ios++;
				else if (r->failed++ == 0)
					fprintf(stderr, "nvmeof-bench: a request failed: %s\n", te_strerror(st.error));
			}
			if (!stopping && (r->rc = refill(r, s, seq++)) < 0)
				return NULL;
		}
		if (busy == 0 && stopping)
			break;
		if (done > 0 || busy == 0)
			continue;
		if (r->poll && !stopping)
			sched_yield(); /* let the transport's threads run on a busy machine */
		else if ((r->rc = te_batch_wait(r->e, oldest->batch, 60000)) < 0)
			return NULL;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	const char *conn = NULL, *segname = NULL, *file = NULL, *name = "bench";
	const char *op = "read", *pattern = "rand";
	uint64_t bs = 4096;
	unsigned qd = 32, threads = 1;
	bool poll = false, hugepages = false;
	double runtime = 10;
	char own_seg[128] = "", key[512];
	te_metadata *md = NULL;
	int rc;

	/* the options whose value is kept as text */
	const struct {
		const char *flag, **value;
	} texts[] = {
		{ "-m", &conn },     { "--metadata", &conn }, { "--segment", &segname }, { "--file", &file },
		{ "--name", &name }, { "--op", &op },         { "--pattern", &pattern },
	};

	/* every option takes a value: --name value */
	for (int i = 1; i < argc; i += 2) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		size_t t = 0;
		if (v == NULL)
			return usage();
		while (t < sizeof texts / sizeof *texts && strcmp(a, texts[t].flag) != 0)
			t++;
		if (t < sizeof texts / sizeof *texts)
			*texts[t].value = v;
		else if (!strcmp(a, "--bs"))
			bs = strtoull(v, NULL, 0);
		else if (!strcmp(a, "--qd"))
			qd = (unsigned)strtoul(v, NULL, 0);
		else if (!strcmp(a, "--hugepages"))
			hugepages = strcmp(v, "0") != 0;
		else if (!strcmp(a, "--poll"))
			poll = strcmp(v, "0") != 0;
		else if (!strcmp(a, "--threads"))
			threads = (unsigned)strtoul(v, NULL, 0);
		else if (!strcmp(a, "--runtime"))
			runtime = strtod(v, NULL);
		else
			return usage();
	}
	bool write = !strcmp(op, "write"), seq = !strcmp(pattern, "seq");
	if (conn == NULL || (segname == NULL) == (file == NULL) || bs == 0 || qd == 0 || qd > 4096 ||
	    runtime <= 0 || (!write && strcmp(op, "read")) || (!seq && strcmp(pattern, "rand")))
		return usage();

	if (file != NULL) {
		char json[8192];
		long long fsize = file_size(file);
		if (fsize <= 0)
			return 1;
		snprintf(own_seg, sizeof own_seg, "nvmeof/bench-%d", (int)getpid());
		snprintf(json, sizeof json,
			 "{\"buffers\":[{\"file_path\":\"%s\",\"length\":%lld,\"local_path_map\":{}}],"
			 "\"protocol\":\"nvmeof\",\"server_name\":\"bench\"}",
			 file, fsize);
		if ((rc = te_metadata_open(conn, &md)) < 0)
			return die("metadata store", rc);
		if (te_metadata_segment_key(own_seg, key, sizeof key) < 0 ||
		    (rc = te_metadata_put(md, key, json, strlen(json))) < 0)
			return die("storing the descriptor", -EINVAL);
		segname = own_seg;
	}

	/* --file: the file named here is the one to serve, so it is the one
	 * allowed; --segment: TE_NVMEOF_ALLOW from the environment decides. */
	char *allow = file != NULL ? realpath(file, NULL) : NULL;
	te_option opt[] = { { "transports", "nvmeof" }, { "TE_NVMEOF_ALLOW", allow } };
	te_engine *e = NULL;
	rc = te_engine_create(conn, name, opt, allow != NULL ? 2 : 1, &e);
	free(allow);
	if (rc < 0)
		return die("engine", rc);
	te_segment_id seg = te_segment_open(e, segname);
	if (seg < 0)
		return die(segname, seg);
	te_segment_buffer sb[256];
	int nb = te_segment_buffers(e, seg, sb, 256);
	if (nb <= 0 || nb > 256)
		return die("segment buffers", nb < 0 ? nb : -E2BIG);
	uint64_t size = sb[nb - 1].addr + sb[nb - 1].length, blocks = size / bs;
	if (blocks == 0) {
		fprintf(stderr, "nvmeof-bench: segment %s (%llu bytes) is smaller than one block\n", segname,
			(unsigned long long)size);
		return 1;
	}

	/* Huge pages (like fio --iomem=shmhuge) keep a large block in one piece of
	 * physical memory: with 4 KiB pages a 1 MiB block is 256 segments, more
	 * than some devices take in one request, and the split then depends on
	 * where the kernel happened to place the pages. */
	size_t memlen = hugepages ? ((size_t)qd * bs + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1)
				  : ((size_t)qd * bs + 4095) & ~(size_t)4095;
	unsigned char *mem = hugepages ? mmap(NULL, memlen, PROT_READ | PROT_WRITE,
					      MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0)
				       : aligned_alloc(4096, memlen);
	if (mem == NULL || mem == MAP_FAILED) {
		fprintf(stderr, "nvmeof-bench: cannot allocate %zu bytes%s\n", memlen,
			hugepages ? " of huge pages (vm.nr_hugepages)" : "");
		return 1;
	}
	/* Random bytes, as fio writes: a compressing device (zram) then does the
	 * same work for both. */
	uint64_t fill = 0x9E3779B97F4A7C15ull;
	for (size_t i = 0; i + 8 <= (size_t)qd * bs; i += 8) {
		uint64_t v = rnd_next(&fill);
		memcpy(mem + i, &v, 8);
	}
	if ((rc = te_register_memory(e, mem, qd * bs, "*", 0)) < 0)
		return die("register memory", rc);

	slot *slots = calloc(qd, sizeof *slots);
	for (unsigned i = 0; i < qd; i++) {
		slots[i].buf = mem + (size_t)i * bs;
		if ((rc = te_batch_alloc(e, SLOT_TASKS, &slots[i].batch)) < 0)
			return die("batch", rc);
	}
	if (threads == 0 || threads > qd)
		threads = qd;
	runner *rn = calloc(threads, sizeof *rn);
	pthread_t *th = calloc(threads, sizeof *th);
	double t0 = now_s();
	atomic_init(&shared_next, 0);
	for (unsigned t = 0; t < threads; t++) {
		/* thread t drives slots t, t + threads, ... */
		rn[t] = (runner){ .e = e, .seg = seg, .slots = slots, .first = t, .step = threads, .qd = qd,
				  .bs = bs, .blocks = blocks, .write = write, .seq = seq, .poll = poll, .end = t0 + runtime,
				  .rs = 0x2545F4914F6CDD1Dull + t };
		if (pthread_create(&th[t], NULL, run, &rn[t]) != 0)
			return die("thread", -EAGAIN);
	}
	uint64_t ios = 0, bytes = 0, failed = 0;
	for (unsigned t = 0; t < threads; t++) {
		pthread_join(th[t], NULL);
		ios += rn[t].ios;
		failed += rn[t].failed;
		if (rn[t].rc < 0)
			return die("transfer", rn[t].rc);
	}
	bytes = ios * bs;
	double t1 = now_s();
	free(rn);
	free(th);
	double secs = t1 - t0;
	printf("RESULT %s %llu %u %s %.1f %.0f %.2f %llu\n", op, (unsigned long long)bs, qd, pattern,
	       (double)bytes / secs / (1 << 20), (double)ios / secs, secs, (unsigned long long)ios);
	if (failed)
		fprintf(stderr, "nvmeof-bench: %llu requests failed\n", (unsigned long long)failed);

	for (unsigned i = 0; i < qd; i++)
		te_batch_free(e, slots[i].batch);
	te_segment_close(e, seg);
	te_unregister_memory(e, mem);
	te_engine_destroy(e);
	if (md != NULL) {
		te_metadata_remove(md, key);
		te_metadata_close(md);
	}
	free(slots);
	if (hugepages)
		munmap(mem, memlen);
	else
		free(mem);
	return failed ? 1 : 0;
}
