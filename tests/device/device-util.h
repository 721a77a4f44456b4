/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers of the device memory tests: memory of the test device plugin
 * (tests/device/testdev.c), which only the plugin can read or write, and one
 * pair of engines checked in every direction. */
#ifndef TE_TEST_DEVICE_UTIL_H
#define TE_TEST_DEVICE_UTIL_H

#include <stdbool.h>
#include <stdlib.h>

#include "../common/util.h"

#define MiB (1u << 20)

/* Sizes every case moves: odd ones, and ones the staging splits. */
#define DEV_SIZES { 1, 4095, 4097, MiB + 3, 3 * MiB + 17, 9 * MiB + 1 }

static inline void *dev_alloc(const char *loc, size_t len)
{
	void *p = NULL;
	REQUIRE(te_device_alloc(loc, len, &p) == 0 && p != NULL);
	return p;
}

/* Puts a pattern into device memory, through the plugin. */
static inline void dev_fill(void *dev, size_t len, unsigned seed)
{
	unsigned char *h = malloc(len);
	fill_pattern(h, len, seed);
	CHECK_EQ(te_device_copy(dev, h, len), 0);
	free(h);
}

/* Compares device memory with the pattern, through the plugin. */
static inline int dev_equals(const void *dev, size_t len, unsigned seed)
{
	unsigned char *h = malloc(len), *want = malloc(len);
	fill_pattern(want, len, seed);
	int ok = te_device_copy(h, dev, len) == 0 && memcmp(h, want, len) == 0;
	free(h);
	free(want);
	return ok;
}

static inline int host_equals(const unsigned char *p, size_t len, unsigned seed)
{
	unsigned char *want = malloc(len);
	fill_pattern(want, len, seed);
	int ok = memcmp(p, want, len) == 0;
	free(want);
	return ok;
}

/* One side's memory: host memory, or device memory seen only through the
 * plugin. */
typedef struct side {
	unsigned char *p;
	bool dev;
} side;

static inline side side_new(bool dev, const char *loc, size_t len)
{
	side sd = { .dev = dev };
	sd.p = dev ? dev_alloc(loc, len) : malloc(len);
	REQUIRE(sd.p != NULL);
	return sd;
}

static inline void side_fill(side sd, size_t len, unsigned seed)
{
	if (sd.dev)
		dev_fill(sd.p, len, seed);
	else
		fill_pattern(sd.p, len, seed);
}

static inline int side_equals(side sd, size_t len, unsigned seed)
{
	return sd.dev ? dev_equals(sd.p, len, seed) : host_equals(sd.p, len, seed);
}

static inline void side_free(side sd)
{
	if (sd.dev)
		te_device_free(sd.p);
	else
		free(sd.p);
}

/* Runs `n` requests as one batch; its summary state. */
static inline int32_t run_batch(te_engine *e, const te_request *r, size_t n)
{
	te_batch_id b;
	int32_t state = -1;

	REQUIRE(te_batch_alloc(e, n, &b) == 0);
	CHECK_EQ(te_submit(e, b, r, n), 0);
	CHECK_EQ(te_batch_wait(e, b, 30000), 0);
	te_batch_status(e, b, NULL, NULL, &state);
	te_batch_free(e, b);
	return state;
}

/* Two engines over a transport: the initiator's memory (host or device)
 * against the target's (host or device), both directions, many sizes, a
 * batch of unaligned pieces, and, where the bytes pass through the device
 * plugin's copies (`copied`: staging, not GPUDirect), the plugin failing. */
static inline void remote_pair(const char *what, te_engine *target, te_engine *init, bool init_dev,
			       bool target_dev, bool copied)
{
	static const size_t sizes[] = DEV_SIZES;
	size_t max = 9 * MiB + 1;
	side t = side_new(target_dev, "testdev:0", max), l = side_new(init_dev, "testdev:1", max);
	unsigned seed = (init_dev ? 1000 : 0) + (target_dev ? 2000 : 0);

	fprintf(stderr, "  %s: %s -> %s\n", what, init_dev ? "device" : "host",
		target_dev ? "device" : "host");
	REQUIRE(target != NULL && init != NULL);
	CHECK_EQ(te_register_memory(target, t.p, max, "*", TE_MEM_REMOTE_ACCESS), 0);
	CHECK_EQ(te_register_memory(init, l.p, max, "*", 0), 0);
	te_segment_id seg = te_segment_open(init, te_engine_name(target));
	REQUIRE(seg >= 0);
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		size_t n = sizes[i];
		te_task_status st = { 0 };
		side_fill(l, n, seed + 300 + (unsigned)i);
		side_fill(t, n, 5);
		CHECK_EQ(run_one(init, TE_OP_WRITE, seg, l.p, (uintptr_t)t.p, n, &st), TE_TASK_COMPLETED);
		CHECK_EQ(st.transferred, n);
		CHECK(side_equals(t, n, seed + 300 + (unsigned)i));
		side_fill(t, n, seed + 400 + (unsigned)i);
		side_fill(l, n, 6);
		CHECK_EQ(run_one(init, TE_OP_READ, seg, l.p, (uintptr_t)t.p, n, &st), TE_TASK_COMPLETED);
		CHECK_EQ(st.transferred, n);
		CHECK(side_equals(l, n, seed + 400 + (unsigned)i));
	}
	/* Many tasks in one batch, at an unaligned offset, both directions. */
	for (int op = 0; op < 2; op++) {
		enum { N = 24 };
		size_t each = 256 * 1024 + 5, span = N * each + 3;
		te_request r[N];
		side src = op == 0 ? l : t, dst = op == 0 ? t : l;
		side_fill(src, span, seed + 77 + (unsigned)op);
		side_fill(dst, span, 8);
		for (int k = 0; k < N; k++)
			r[k] = (te_request){ op == 0 ? TE_OP_WRITE : TE_OP_READ, seg,
					     l.p + 3 + (size_t)k * each, (uintptr_t)t.p + 3 + (size_t)k * each,
					     each };
		CHECK_EQ(run_batch(init, r, N), TE_TASK_COMPLETED);
		/* bytes 3.. of dst hold bytes 3.. of the pattern */
		unsigned char *want = malloc(span), *got = malloc(span);
		fill_pattern(want, span, seed + 77 + (unsigned)op);
		CHECK_EQ(te_device_copy(got, dst.p, span), 0); /* host memory too */
		CHECK(memcmp(got + 3, want + 3, N * each) == 0);
		free(want);
		free(got);
	}
	/* The plugin failing: FAILED, never a crash or a hang; then working again. */
	te_task_status st;
	if (copied) {
		setenv("TE_TESTDEV_FAIL", "1", 1);
		CHECK_EQ(run_one(init, TE_OP_WRITE, seg, l.p, (uintptr_t)t.p, 3 * MiB, &st),
			 TE_TASK_FAILED);
		CHECK_EQ(run_one(init, TE_OP_READ, seg, l.p, (uintptr_t)t.p, 3 * MiB, &st),
			 TE_TASK_FAILED);
		unsetenv("TE_TESTDEV_FAIL");
	}
	side_fill(t, 3 * MiB, seed + 9);
	CHECK_EQ(run_one(init, TE_OP_READ, seg, l.p, (uintptr_t)t.p, 3 * MiB, &st), TE_TASK_COMPLETED);
	CHECK(side_equals(l, 3 * MiB, seed + 9));

	te_engine_destroy(init);
	te_engine_destroy(target);
	side_free(t);
	side_free(l);
}

#endif
