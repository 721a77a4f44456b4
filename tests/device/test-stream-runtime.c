/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te_submit_on_stream() through a device plugin on its runtime's streams:
 * the CUDA plugin on the stand-in driver (cuLaunchHostFunc), or the HIP
 * plugin on the stand-in runtime (hipLaunchHostFunc). The runtime is the
 * one on LD_LIBRARY_PATH; streams are made here with its own calls, and
 * device 0 made current first, as an application's runtime does. A WRITE and
 * a READ between device memory of two engines over TCP start only after the
 * test's own work queued on the stream before them, and work queued after
 * them runs only once they have ended, every byte checked.
 *
 * The stream is a blocking one (flags 0, as cudaStreamCreate and
 * hipStreamCreate make it), which waits for the default stream's work and
 * the default stream for its: the plugin's own copies, the target's in this
 * process included, must never run on the default stream, or the transfer
 * would wait for the host function that waits for it. With `legacy` the
 * stream is the default stream itself (CUDA's legacy stream 0, Mooncake's
 * default stream_ptr; HIP's null stream). With `device1` device 1 is the
 * one: the default stream and a stream made on device 1 while device 0 is
 * current (the transfer waits for device 1's work queued before, which
 * writes the bytes it sends; the caller's current device is the same after
 * the call; a location naming another device than the stream's is refused).
 * On a machine with one GPU (tools/gpu-check.sh runs it on the real driver)
 * both engines use device 0, and `device1` says it has nothing to do.
 * A transfer waiting for itself is caught by the test's own timer.
 * Usage: test-stream-runtime cuda|hip [legacy|device1]
 */
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>

#include "device-util.h"
#include "stream-util.h"

static bool cuda;
static stream_launch_fn launch;
static int (*sync_stream)(void *stream);
static int (*destroy_stream)(void *stream);
static int (*cu_stream_create)(void **, unsigned);
static int (*cu_retain)(void **, int);
static int (*cu_set_current)(void *);
static int (*cu_get_current)(void **);
static int (*cu_init)(unsigned);
static int (*cu_count)(int *);
static int (*cu_copy_async)(uintptr_t, uintptr_t, size_t, void *);
static int (*cu_host_alloc)(void **, size_t, unsigned);
static int (*cu_host_free)(void *);
static int (*hip_stream_create)(void **, unsigned);
static int (*hip_set_device)(int);
static int (*hip_get_device)(int *);
static int (*hip_count)(int *);
static int (*hip_copy_async)(void *, const void *, size_t, int, void *);
static int (*hip_host_alloc)(void **, size_t, unsigned);
static int (*hip_host_free)(void *);
static void *ctx[2]; /* CUDA: the devices' primary contexts */

static void *sym(void *rt, const char *name)
{
	void *p = dlsym(rt, name);
	if (p == NULL) {
		fprintf(stderr, "the runtime lacks %s\n", name);
		exit(1);
	}
	return p;
}

static void load(void *rt)
{
	*(void **)&launch = sym(rt, cuda ? "cuLaunchHostFunc" : "hipLaunchHostFunc");
	*(void **)&sync_stream = sym(rt, cuda ? "cuStreamSynchronize" : "hipStreamSynchronize");
	*(void **)&destroy_stream = sym(rt, cuda ? "cuStreamDestroy_v2" : "hipStreamDestroy");
	if (cuda) {
		*(void **)&cu_stream_create = sym(rt, "cuStreamCreate");
		*(void **)&cu_retain = sym(rt, "cuDevicePrimaryCtxRetain");
		*(void **)&cu_set_current = sym(rt, "cuCtxSetCurrent");
		*(void **)&cu_get_current = sym(rt, "cuCtxGetCurrent");
		*(void **)&cu_init = sym(rt, "cuInit");
		*(void **)&cu_count = sym(rt, "cuDeviceGetCount");
		*(void **)&cu_copy_async = sym(rt, "cuMemcpyAsync");
		*(void **)&cu_host_alloc = sym(rt, "cuMemHostAlloc");
		*(void **)&cu_host_free = sym(rt, "cuMemFreeHost");
	} else {
		*(void **)&hip_stream_create = sym(rt, "hipStreamCreateWithFlags");
		*(void **)&hip_set_device = sym(rt, "hipSetDevice");
		*(void **)&hip_get_device = sym(rt, "hipGetDevice");
		*(void **)&hip_count = sym(rt, "hipGetDeviceCount");
		*(void **)&hip_copy_async = sym(rt, "hipMemcpyAsync");
		*(void **)&hip_host_alloc = sym(rt, "hipHostMalloc");
		*(void **)&hip_host_free = sym(rt, "hipHostFree");
	}
}

/* The runtime's devices; device 0 current (cudaSetDevice(0) does that). */
static int devices(void)
{
	int n = 0;
	if (cuda) {
		REQUIRE(cu_init(0) == 0 && cu_count(&n) == 0 && n > 0);
		for (int i = 0; i < n && i < 2; i++)
			REQUIRE(cu_retain(&ctx[i], i) == 0);
	} else {
		REQUIRE(hip_count(&n) == 0 && n > 0);
	}
	return n;
}

static void set_device(int dev)
{
	REQUIRE(cuda ? cu_set_current(ctx[dev]) == 0 : hip_set_device(dev) == 0);
}

/* The calling thread's current device, -1 when none (or another context). */
static int current_device(void)
{
	if (cuda) {
		void *c = NULL;
		REQUIRE(cu_get_current(&c) == 0);
		return c != NULL && c == ctx[0] ? 0 : c != NULL && c == ctx[1] ? 1 : -1;
	}
	int d = -1;
	REQUIRE(hip_get_device(&d) == 0);
	return d;
}

/* A stream of the current device: blocking (flags 0) or not. */
static void *stream_new(bool blocking)
{
	void *s = NULL;
	unsigned flags = blocking ? 0 : 1; /* CU_STREAM_NON_BLOCKING, hipStreamNonBlocking */
	REQUIRE((cuda ? cu_stream_create(&s, flags) : hip_stream_create(&s, flags)) == 0 && s != NULL);
	return s;
}

/* Queues a copy on a stream: work of the test's own that writes device
 * memory, as a kernel would. */
static void copy_on(void *dst, const void *src, size_t len, void *stream)
{
	REQUIRE((cuda ? cu_copy_async((uintptr_t)dst, (uintptr_t)src, len, stream)
		      : hip_copy_async(dst, src, len, 4 /* hipMemcpyDefault */, stream)) == 0);
}

static void *pinned_alloc(size_t len)
{
	void *p = NULL;
	REQUIRE((cuda ? cu_host_alloc(&p, len, 0) : hip_host_alloc(&p, len, 0)) == 0 && p != NULL);
	return p;
}

static void pinned_free(void *p)
{
	REQUIRE((cuda ? cu_host_free(p) : hip_host_free(p)) == 0);
}

static void timed_out(int sig)
{
	static const char msg[] = "test-stream-runtime: not done after 30 s: a transfer waits for the stream "
				  "that waits for it\n";
	(void)sig;
	if (write(2, msg, sizeof msg - 1) < 0)
		_exit(2);
	_exit(1);
}

/* Tasks [first, first+n) of b, all ended COMPLETED. */
static void completed(te_engine *e, te_batch_id b, size_t first, size_t n)
{
	te_task_status st;
	CHECK_EQ(te_batch_wait(e, b, 10000), 0);
	for (size_t i = first; i < first + n; i++) {
		CHECK_EQ(te_get_status(e, b, i, &st), 0);
		CHECK_EQ(st.state, TE_TASK_COMPLETED);
	}
}

/* One WRITE from `l` (device 1's memory) to `t`, submitted on `stream`
 * with `where` while device `current` is current: it waits for `g`, held
 * on the stream, and for device 1's copy queued behind it, which puts
 * pattern `seed` into `l`; the caller's device is the same after. Device
 * 0's default stream is held meanwhile (device1()): a transfer queued there
 * instead would not end once `g` opens. */
static void device1_case(te_engine *init, te_segment_id seg, void *t, void *l, unsigned char *h, size_t len,
			 void *stream, const char *where, int current, unsigned seed)
{
	te_request r = { TE_OP_WRITE, seg, l, (uintptr_t)t, len };
	te_batch_id b;
	gate g;
	size_t infl = 0;

	dev_fill(t, len, 0);
	set_device(1);
	gate_close(&g, launch, stream);
	fill_pattern(h, len, seed);
	copy_on(l, h, len, stream);
	set_device(current);
	CHECK_EQ(te_batch_alloc(init, 1, &b), 0);
	CHECK_EQ(te_submit_on_stream(init, b, &r, 1, where, stream), 0);
	CHECK_EQ(current_device(), current);
	usleep(100000);
	CHECK_EQ(te_batch_status(init, b, NULL, &infl, NULL), 0);
	CHECK_EQ(infl, 1); /* device 1's work before it still held */
	CHECK(dev_equals(t, len, 0));
	gate_open(&g);
	completed(init, b, 0, 1);
	CHECK(dev_equals(t, len, seed)); /* what device 1's copy wrote, not what l held before */
	CHECK_EQ(current_device(), current);
	CHECK_EQ(te_batch_free(init, b), 0);
	set_device(1);
	CHECK_EQ(sync_stream(stream), 0);
	set_device(current);
}

static int device1(te_engine *init, te_engine *target, const char *rt, int ndev)
{
	const size_t len = 1 << 20;
	char loc0[16], loc1[16], loc9[16];

	if (ndev < 2) {
		printf("test-stream-runtime %s device1: one device here, nothing to do\n", rt);
		return 0;
	}
	snprintf(loc0, sizeof loc0, "%s:0", rt);
	snprintf(loc1, sizeof loc1, "%s:1", rt);
	snprintf(loc9, sizeof loc9, "%s:9", rt);
	void *t = dev_alloc(loc0, len), *l = dev_alloc(loc1, len);
	unsigned char *h = pinned_alloc(len);
	CHECK_EQ(te_register_memory(target, t, len, "*", TE_MEM_REMOTE_ACCESS), 0);
	CHECK_EQ(te_register_memory(init, l, len, "*", 0), 0);
	te_segment_id seg = te_segment_open(init, te_engine_name(target));
	REQUIRE(seg >= 0);
	/* A first transfer opens the connection and the staging buffers, so
	 * that the cases' transfers take no longer than the waits below. */
	te_request warm = { TE_OP_WRITE, seg, l, (uintptr_t)t, len };
	te_batch_id b;
	CHECK_EQ(te_batch_alloc(init, 1, &b), 0);
	CHECK_EQ(te_submit(init, b, &warm, 1), 0);
	completed(init, b, 0, 1);
	CHECK_EQ(te_batch_free(init, b), 0);
	gate g0;
	set_device(0);
	gate_close(&g0, launch, NULL);

	/* Device 1's default stream while device 0 is current: "rt:1" names it. */
	device1_case(init, seg, t, l, h, len, NULL, loc1, 0, 51);
	/* A stream made on device 1, device 0 current: its own device. */
	set_device(1);
	void *s1 = stream_new(false);
	device1_case(init, seg, t, l, h, len, s1, rt, 0, 52);
	/* Device 1 current: still so after, and the caller's next launch
	 * into its stream goes through. */
	device1_case(init, seg, t, l, h, len, s1, loc1, 1, 53);
	probe p = { 0 };
	set_device(1);
	CHECK_EQ(launch(s1, probe_fn, &p), 0);
	CHECK_EQ(sync_stream(s1), 0);
	CHECK(atomic_load(&p.ran));

	/* A location naming another device than the stream's, or none there:
	 * refused, the task appended ends FAILED. */
	te_request r = { TE_OP_WRITE, seg, l, (uintptr_t)t, len };
	te_task_status st;
	set_device(0);
	CHECK_EQ(te_batch_alloc(init, 2, &b), 0);
	CHECK_EQ(te_submit_on_stream(init, b, &r, 1, loc0, s1), -EINVAL);
	CHECK_EQ(te_submit_on_stream(init, b, &r, 1, loc9, NULL), -ENODEV);
	CHECK_EQ(current_device(), 0);
	CHECK_EQ(te_batch_wait(init, b, 5000), 0);
	CHECK_EQ(te_get_status(init, b, 0, &st), 0);
	CHECK_EQ(st.state, TE_TASK_FAILED);
	CHECK_EQ(te_batch_free(init, b), 0);
	gate_open(&g0);
	CHECK_EQ(sync_stream(NULL), 0);

	te_engine_destroy(init);
	te_engine_destroy(target);
	set_device(1);
	destroy_stream(s1);
	set_device(0);
	pinned_free(h);
	te_device_free(t);
	te_device_free(l);
	return check_done();
}

int main(int argc, char **argv)
{
	REQUIRE(argc == 2 || argc == 3);
	cuda = strcmp(argv[1], "cuda") == 0;
	const char *mode = argc == 3 ? argv[2] : "";
	bool legacy = strcmp(mode, "legacy") == 0;
	REQUIRE(cuda || strcmp(argv[1], "hip") == 0);
	REQUIRE(argc == 2 || legacy || strcmp(mode, "device1") == 0);
	void *rt = dlopen(cuda ? "libcuda.so.1" : "libamdhip64.so", RTLD_NOW | RTLD_GLOBAL);
	REQUIRE(rt != NULL);
	load(rt);
	signal(SIGALRM, timed_out);
	alarm(30);

	int ndev = devices();
	set_device(0);
	/* Made first: with FAKE_CUDA_MAX_STREAMS the stand-in driver refuses the
	 * plugin's pool of copy streams after its copy lanes' (test
	 * device-cuda-stream-blocking). */
	void *S = legacy || strcmp(mode, "device1") == 0 ? NULL : stream_new(true);
	te_engine *target = p2p_engine("tcp"), *init = p2p_engine("tcp");
	REQUIRE(target != NULL && init != NULL);
	if (strcmp(mode, "device1") == 0)
		return device1(init, target, argv[1], ndev);

	const size_t len = 1 << 20;
	char loc0[16], loc1[16];
	snprintf(loc0, sizeof loc0, "%s:0", argv[1]);
	snprintf(loc1, sizeof loc1, "%s:1", argv[1]);
	void *t = dev_alloc(loc0, 2 * len), *l = NULL;
	if (ndev < 2 || te_device_alloc(loc1, 2 * len, &l) != 0)
		l = dev_alloc(loc0, 2 * len);
	CHECK_EQ(current_device(), 0); /* the plugin's calls leave it */
	CHECK_EQ(te_register_memory(target, t, 2 * len, "*", TE_MEM_REMOTE_ACCESS), 0);
	CHECK_EQ(te_register_memory(init, l, 2 * len, "*", 0), 0);
	te_segment_id seg = te_segment_open(init, te_engine_name(target));
	REQUIRE(seg >= 0);
	dev_fill(l, len, 31);
	dev_fill((char *)t + len, len, 32);
	dev_fill(t, len, 0);
	te_request r[2] = {
		{ TE_OP_WRITE, seg, l, (uintptr_t)t, len },
		{ TE_OP_READ, seg, (char *)l + len, (uintptr_t)t + len, len },
	};
	te_batch_id b;
	CHECK_EQ(te_batch_alloc(init, 4, &b), 0);

	gate g;
	gate_close(&g, launch, S);
	CHECK_EQ(te_submit_on_stream(init, b, r, 2, argv[1], S), 0);
	probe p = { .e = init, .b = b, .first = 0, .n = 2 };
	REQUIRE(launch(S, probe_fn, &p) == 0);
	usleep(100000);
	size_t infl = 0;
	CHECK_EQ(te_batch_status(init, b, NULL, &infl, NULL), 0);
	CHECK_EQ(infl, 2); /* waiting for the test's work before them */
	CHECK(dev_equals(t, len, 0)); /* the plugin's copies wait for no stream of the caller's */
	gate_open(&g);
	CHECK_EQ(sync_stream(S), 0);
	CHECK(atomic_load(&p.ran));
	CHECK_EQ(atomic_load(&p.ended), 2);
	completed(init, b, 0, 2);
	CHECK(dev_equals(t, len, 31));
	CHECK(dev_equals((char *)l + len, len, 32));
	CHECK_EQ(te_batch_free(init, b), 0);

	te_engine_destroy(init);
	te_engine_destroy(target);
	if (S != NULL)
		destroy_stream(S);
	te_device_free(t);
	te_device_free(l);
	return check_done();
}
