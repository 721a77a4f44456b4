/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te-bench's measured loop: opens the target's segment, starts --threads
 * threads that each submit batches of --batch_size blocks and wait for them
 * (with --check: a known pattern moved and compared byte for byte), prints
 * a progress line each second, and at the end hands the merged latency
 * histogram to report(). The first failure stops every thread; the main
 * thread then exits with its message.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "te-bench.h"

#define WAIT_MS 120000 /* a batch that takes longer than this is reported as hung */

static void pattern_fill(unsigned char *p, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(p + i, &x, 8);
	}
	for (; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (unsigned char)x;
	}
}

typedef struct run {
	te_engine *e;
	bool mixed;
	const char *transport;
	te_segment_id seg;
	uint32_t op;
	unsigned char *local;  /* initiator buffer */
	unsigned char *verify; /* --check: expected data */
	uint64_t remote_base[64];
	uint64_t remote_len[64];
	unsigned nremote;
	atomic_bool stop;
	atomic_uint_fast64_t batches;
	atomic_int failed;
	char error[600];
	pthread_mutex_t error_lock;
} run;

static run R;

typedef struct worker {
	pthread_t th;
	unsigned id;
	hist h;
	uint64_t batches;
	unsigned char *scratch; /* --check with --use_vram: a host copy of one block */
} worker;

static void fail_run(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* --check touches the initiator's buffer only through these: with --use_vram
 * it is device memory, which only the device plugin may read or write. */
static void local_set(worker *w, unsigned char *dst, int byte, uint64_t n)
{
	if (!F.use_vram) {
		memset(dst, byte, n);
		return;
	}
	memset(w->scratch, byte, n);
	if (te_device_copy(dst, w->scratch, n) < 0)
		fail_run(1, "device copy failed%s", why());
}

static void local_put(unsigned char *dst, const unsigned char *src, uint64_t n)
{
	if (!F.use_vram)
		memcpy(dst, src, n);
	else if (te_device_copy(dst, src, n) < 0)
		fail_run(1, "device copy failed%s", why());
}

static const unsigned char *local_get(worker *w, const unsigned char *src, uint64_t n)
{
	if (!F.use_vram)
		return src;
	if (te_device_copy(w->scratch, src, n) < 0) {
		fail_run(1, "device copy failed%s", why());
		memset(w->scratch, 0, n);
	}
	return w->scratch;
}

static void fail_run(int code, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&R.error_lock);
	if (!atomic_load(&R.failed)) {
		va_start(ap, fmt);
		vsnprintf(R.error, sizeof R.error, fmt, ap);
		va_end(ap);
		atomic_store(&R.failed, code);
	}
	pthread_mutex_unlock(&R.error_lock);
	atomic_store(&R.stop, true);
}

static const char *state_name(int s)
{
	static const char *n[] = { "WAITING", "PENDING", "INVALID", "CANCELED", "COMPLETED", "TIMEOUT", "FAILED" };
	return s >= 0 && s <= 6 ? n[s] : "?";
}

/* One batch of `op` over this thread's blocks; false after recording a failure. */
static bool one_batch(worker *w, te_request *reqs, uint32_t op, unsigned char *local_base)
{
	te_batch_id b;
	int rc = te_batch_alloc(R.e, F.batch_size, &b);

	if (rc < 0) {
		fail_run(1, "te_batch_alloc: %s", te_strerror(rc));
		return false;
	}
	for (uint64_t i = 0; i < F.batch_size; i++) {
		uint64_t off = F.block_size * (i * F.threads + w->id);
		reqs[i].opcode = op;
		reqs[i].local = local_base + off;
	}
	rc = te_submit(R.e, b, reqs, F.batch_size);
	if (rc < 0) {
		te_batch_free(R.e, b);
		fail_run(1, "te_submit: %s%s", te_strerror(rc), why());
		return false;
	}
	rc = te_batch_wait(R.e, b, WAIT_MS);
	if (rc < 0) {
		fail_run(1, "a batch did not finish within %d s: %s", WAIT_MS / 1000, te_strerror(rc));
		return false; /* the batch stays allocated: its tasks are still running */
	}
	int32_t state = 0;
	te_batch_status(R.e, b, NULL, NULL, &state);
	if (state != TE_TASK_COMPLETED) {
		for (uint64_t i = 0; i < F.batch_size; i++) {
			te_task_status st;
			if (te_get_status(R.e, b, i, &st) == 0 && st.state != TE_TASK_COMPLETED) {
				fail_run(1, "%s of %" PRIu64 " bytes at remote 0x%" PRIx64 " ended %s: %s%s",
					 op == TE_OP_READ ? "READ" : "WRITE", F.block_size, reqs[i].remote,
					 state_name(st.state), te_strerror(st.error), why());
				break;
			}
		}
		te_batch_free(R.e, b);
		return false;
	}
	te_batch_free(R.e, b);
	return true;
}

/* After a mismatch: the block read once more, into a buffer filled with
 * another byte. Tells a read-back that missed the bytes from a target that
 * holds others (they did not land, or older ones landed over them). */
static const char *read_again(worker *w, const te_request *req, uint64_t off)
{
	te_request r = *req;
	te_task_status st = { 0 };
	te_batch_id b;

	r.opcode = TE_OP_READ;
	r.local = R.local + off;
	local_set(w, R.local + off, 0x5a, F.block_size);
	if (te_batch_alloc(R.e, 1, &b) < 0)
		return "";
	int rc = te_submit(R.e, b, &r, 1);
	if (rc == 0 && te_batch_wait(R.e, b, WAIT_MS) < 0)
		return "; read again: no answer"; /* the batch stays: its task runs */
	if (rc == 0)
		rc = te_get_status(R.e, b, 0, &st);
	te_batch_free(R.e, b);
	if (rc < 0 || st.state != TE_TASK_COMPLETED)
		return "; read again: the read failed";
	return memcmp(local_get(w, R.local + off, F.block_size), R.verify + off, F.block_size) == 0
		       ? "; read again: as expected (the first read missed the bytes)"
		       : "; read again: still different (the target holds other bytes)";
}

static bool compare(worker *w, uint64_t iter, const te_request *reqs, uint32_t op)
{
	for (uint64_t i = 0; i < F.batch_size; i++) {
		uint64_t off = F.block_size * (i * F.threads + w->id);
		const unsigned char *got = local_get(w, R.local + off, F.block_size), *want = R.verify + off;
		if (memcmp(got, want, F.block_size) == 0)
			continue;
		uint64_t k = 0;
		while (got[k] == want[k])
			k++;
		unsigned g = got[k], x = want[k];
		fail_run(2, "DATA MISMATCH after %s: thread %u, batch %" PRIu64 ", block %" PRIu64
			 " (remote 0x%" PRIx64 "), byte %" PRIu64 ": got 0x%02x, want 0x%02x%s",
			 op == TE_OP_READ ? "READ" : "WRITE", w->id, iter, i, reqs[i].remote, k, g, x,
			 read_again(w, &reqs[i], off));
		return false;
	}
	return true;
}

static void *worker_main(void *arg)
{
	worker *w = arg;
	te_request *reqs = calloc(F.batch_size, sizeof *reqs);
	uint64_t base = R.remote_base[w->id % R.nremote] + F.remote_offset;

	if (reqs == NULL) {
		fail_run(1, "out of memory");
		return NULL;
	}
	for (uint64_t i = 0; i < F.batch_size; i++) {
		reqs[i].segment = R.seg;
		reqs[i].remote = base + F.block_size * (i * F.threads + w->id);
		reqs[i].length = F.block_size;
	}
	for (uint64_t iter = 0; !atomic_load_explicit(&R.stop, memory_order_relaxed); iter++) {
		/* --operation=mixed: reads and writes by turns */
		uint32_t op = R.mixed ? (iter % 2 ? TE_OP_WRITE : TE_OP_READ) : R.op;
		if (F.check) {
			/* Expected bytes in `verify`; the measured operation moves them
			 * through the remote side into `local`. */
			for (uint64_t i = 0; i < F.batch_size; i++) {
				uint64_t off = F.block_size * (i * F.threads + w->id);
				pattern_fill(R.verify + off, F.block_size, (iter << 20) ^ (i << 8) ^ w->id ^ 0x5eed);
				if (op == TE_OP_READ)
					local_set(w, R.local + off, 0xa5, F.block_size);
				else
					local_put(R.local + off, R.verify + off, F.block_size);
			}
			if (op == TE_OP_READ && !one_batch(w, reqs, TE_OP_WRITE, R.verify))
				break;
		}
		uint64_t t0 = now_ns();
		if (!one_batch(w, reqs, op, R.local))
			break;
		uint64_t dt = now_ns() - t0;
		if (F.check) {
			if (op == TE_OP_WRITE) {
				/* Read back what was written, into `local` over the source. */
				for (uint64_t i = 0; i < F.batch_size; i++)
					local_set(w, R.local + F.block_size * (i * F.threads + w->id), 0xa5,
						  F.block_size);
				if (!one_batch(w, reqs, TE_OP_READ, R.local))
					break;
			}
			if (!compare(w, iter, reqs, op))
				break;
		}
		/* Every request of the batch saw the batch's completion time. */
		hist_add(&w->h, dt, F.batch_size);
		w->batches++;
		atomic_fetch_add_explicit(&R.batches, 1, memory_order_relaxed);
	}
	free(reqs);
	return NULL;
}

int run_initiator(te_engine *e, const char *target, const char *mode_name)
{
	te_segment_buffer bufs[64];
	uint64_t span = F.block_size * F.batch_size * F.threads;
	uint64_t unit = unit_bytes(F.report_unit);

	R.e = e;
	R.op = strcmp(F.operation, "write") == 0 ? TE_OP_WRITE : TE_OP_READ;
	R.mixed = strcmp(F.operation, "mixed") == 0;
	pthread_mutex_init(&R.error_lock, NULL);
	R.seg = te_segment_open(e, target);
	if (R.seg < 0)
		die(1, "cannot open segment '%s': %s%s", target, te_strerror(R.seg), why());
	R.transport = te_segment_transport(e, R.seg); /* what serves it: shm for this host */
	if (R.transport == NULL)
		R.transport = "?";
	int nb = te_segment_buffers(e, R.seg, bufs, 64);
	if (nb <= 0)
		die(1, "segment '%s' has no buffers to %s%s", target, F.operation, nb < 0 ? why() : "");
	R.nremote = (unsigned)(nb > 64 ? 64 : nb);
	for (unsigned i = 0; i < R.nremote; i++) {
		R.remote_base[i] = bufs[i].addr;
		R.remote_len[i] = bufs[i].length;
		if ((bufs[i].length < span || bufs[i].length - span < F.remote_offset) && i < F.threads)
			die(1, "segment '%s' buffer %u holds %" PRIu64 " bytes; remote_offset + block_size*batch_size*threads = %"
			       PRIu64, target, i, bufs[i].length, F.remote_offset + span);
	}
	R.local = register_buffer(e, F.buffer_size, span, false, F.use_vram);
	if (F.check) /* the expected bytes stay in host memory */
		R.verify = register_buffer(e, F.buffer_size, span, false, false);

	char bs[32];
	teu_fmt_bytes(bs, sizeof bs, F.block_size);
	if (!F.json)
		printf("%s: %s %s over %s, %" PRIu64 " x %s per batch, %" PRIu64 " thread%s, %" PRIu64 " s%s%s\n",
		       PROG, mode_name, F.operation, R.transport,
		       F.batch_size, bs, F.threads, F.threads > 1 ? "s" : "", F.duration,
		       F.check ? ", checking every byte" : "", F.use_vram ? ", device memory" : "");
	fflush(stdout);

	worker *ws = calloc(F.threads, sizeof *ws);
	if (ws == NULL)
		die(1, "out of memory");
	uint64_t start = now_ns();
	for (unsigned i = 0; i < F.threads; i++) {
		ws[i].id = i;
		if (F.use_vram && F.check && (ws[i].scratch = malloc(F.block_size)) == NULL)
			die(1, "out of memory");
		if (pthread_create(&ws[i].th, NULL, worker_main, &ws[i]) != 0)
			die(1, "cannot start thread %u", i);
	}
	uint64_t last_b = 0, last_t = start;
	for (uint64_t sec = 1; !atomic_load(&R.stop); sec++) {
		uint64_t until = start + sec * 1000000000ull;
		while (now_ns() < until && !atomic_load(&R.stop) && !interrupted)
			usleep(20000);
		if (interrupted || sec >= F.duration)
			atomic_store(&R.stop, true);
		if (!atomic_load(&R.failed)) {
			uint64_t b = atomic_load(&R.batches), t = now_ns();
			double dt = (double)(t - last_t) / 1e9;
			double reqs = (double)(b - last_b) * (double)F.batch_size;
			spread_add(reqs * (double)F.block_size / dt);
			if (!F.quiet)
				fprintf(stderr, "[%3" PRIu64 " s] %.*f %s/s, %.0f requests/s\n", sec,
					(int)F.report_precision, reqs * (double)F.block_size / dt / (double)unit,
					F.report_unit, reqs / dt);
			last_b = b;
			last_t = t;
		}
	}
	for (unsigned i = 0; i < F.threads; i++)
		pthread_join(ws[i].th, NULL);
	double duration = (double)(now_ns() - start) / 1e9;
	if (atomic_load(&R.failed))
		die(atomic_load(&R.failed), "%s", R.error);

	hist h = { 0 };
	uint64_t batches = 0;
	for (unsigned i = 0; i < F.threads; i++) {
		hist_merge(&h, &ws[i].h);
		batches += ws[i].batches;
	}
	for (unsigned i = 0; i < F.threads; i++)
		free(ws[i].scratch);
	free(ws);
	report(mode_name, target, R.transport, duration, batches, &h);
	fflush(stdout);
	te_segment_close(e, R.seg);
	return 0;
}
