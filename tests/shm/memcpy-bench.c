/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The ceiling for the same-host transport: memcpy of the blocks te-bench
 * moves (batches of BATCH blocks of BLOCK bytes, between two buffers of the
 * same size as te-bench's), by THREADS threads at once.
 *
 *   memcpy-bench BLOCK THREADS SECONDS [BATCH]
 *
 * Prints one JSON object: {"block_size", "threads", "throughput_bytes_per_s", "iops"}.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static size_t block, batch = 128;
static unsigned nthreads;
static unsigned char *src, *dst;
static atomic_bool stop;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct worker {
	pthread_t th;
	unsigned id;
	unsigned long long blocks;
} worker;

static void *run(void *arg)
{
	worker *w = arg;
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		/* te-bench's layout: thread t owns blocks t, t+threads, ... */
		for (size_t i = 0; i < batch; i++) {
			size_t off = block * (i * nthreads + w->id);
			memcpy(dst + off, src + off, block);
		}
		w->blocks += batch;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: memcpy-bench BLOCK THREADS SECONDS [BATCH]\n");
		return 1;
	}
	block = strtoull(argv[1], NULL, 0);
	nthreads = (unsigned)strtoul(argv[2], NULL, 0);
	double secs = strtod(argv[3], NULL);
	if (argc > 4)
		batch = strtoull(argv[4], NULL, 0);
	if (block == 0 || nthreads == 0 || nthreads > 64 || secs <= 0 || batch == 0)
		return 1;
	size_t span = block * batch * nthreads;
	src = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	dst = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (src == MAP_FAILED || dst == MAP_FAILED)
		return 1;
	memset(src, 1, span);
	memset(dst, 2, span);
	worker *ws = calloc(nthreads, sizeof *ws);
	double t0 = now();
	for (unsigned i = 0; i < nthreads; i++) {
		ws[i].id = i;
		pthread_create(&ws[i].th, NULL, run, &ws[i]);
	}
	while (now() - t0 < secs) {
		struct timespec ts = { 0, 20 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	atomic_store(&stop, true);
	unsigned long long blocks = 0;
	for (unsigned i = 0; i < nthreads; i++) {
		pthread_join(ws[i].th, NULL);
		blocks += ws[i].blocks;
	}
	double t = now() - t0;
	printf("{\"block_size\":%zu,\"threads\":%u,\"throughput_bytes_per_s\":%.0f,\"iops\":%.0f}\n", block, nthreads,
	       (double)blocks * (double)block / t, (double)blocks / t);
	return 0;
}
