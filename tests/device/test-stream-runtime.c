/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te_submit_on_stream() through a device plugin on its runtime's streams:
 * the CUDA plugin on the stand-in driver (cuLaunchHostFunc), or the HIP
 * plugin on the stand-in runtime (hipLaunchHostFunc). The runtime is the
 * one on LD_LIBRARY_PATH; the stream is made here with its own calls. A
 * WRITE and a READ between device memory of two engines over TCP start only
 * after the test's own work queued on the stream before them, and work
 * queued after them runs only once they have ended, every byte checked.
 * On a machine with one GPU (tools/gpu-check.sh runs it on the real
 * driver) both engines use device 0. With `legacy` the stream is CUDA's
 * legacy default stream (0, Mooncake's default stream_ptr), whose work a
 * synchronous cuMemcpy waits for: the transfer, the target's device copies
 * included, must not wait for the host function that waits for it.
 * Usage: test-stream-runtime cuda|hip [legacy]
 */
#include <dlfcn.h>
#include <stdlib.h>

#include "device-util.h"
#include "stream-util.h"

static int (*create_stream)(void **stream);
static int (*destroy_stream)(void *stream);
static int (*sync_stream)(void *stream);
static stream_launch_fn launch;

static int cu_create(void **s)
{
	static int (*fn)(void **, unsigned);
	if (fn == NULL)
		*(void **)&fn = dlsym(RTLD_DEFAULT, "cuStreamCreate");
	return fn != NULL ? fn(s, 0) : -1;
}

static int hip_create(void **s)
{
	static int (*fn)(void **, unsigned);
	if (fn == NULL)
		*(void **)&fn = dlsym(RTLD_DEFAULT, "hipStreamCreateWithFlags");
	return fn != NULL ? fn(s, 0) : -1;
}

int main(int argc, char **argv)
{
	REQUIRE(argc == 2 || argc == 3);
	bool cuda = strcmp(argv[1], "cuda") == 0;
	bool legacy = argc == 3 && strcmp(argv[2], "legacy") == 0;
	const char *lib = cuda ? "libcuda.so.1" : "libamdhip64.so";
	void *rt = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
	REQUIRE(rt != NULL);
	create_stream = cuda ? cu_create : hip_create;
	*(void **)&launch = dlsym(rt, cuda ? "cuLaunchHostFunc" : "hipLaunchHostFunc");
	*(void **)&sync_stream = dlsym(rt, cuda ? "cuStreamSynchronize" : "hipStreamSynchronize");
	*(void **)&destroy_stream = dlsym(rt, cuda ? "cuStreamDestroy_v2" : "hipStreamDestroy");
	REQUIRE(launch && sync_stream && destroy_stream);

	const size_t len = 1 << 20;
	char loc0[16], loc1[16];
	snprintf(loc0, sizeof loc0, "%s:0", argv[1]);
	snprintf(loc1, sizeof loc1, "%s:1", argv[1]);
	te_engine *target = p2p_engine("tcp"), *init = p2p_engine("tcp");
	REQUIRE(target != NULL && init != NULL);
	void *t = dev_alloc(loc0, 2 * len), *l = NULL;
	if (te_device_alloc(loc1, 2 * len, &l) != 0)
		l = dev_alloc(loc0, 2 * len);
	/* After the plugin's first calls: the driver is initialised and the
	 * device's context current on this thread, as a real driver wants. */
	void *S = NULL;
	if (!legacy)
		REQUIRE(create_stream(&S) == 0 && S != NULL);
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
	if (!cuda) {
		/* HIP's null stream is refused: the plugin's own copies run there. */
		CHECK_EQ(te_submit_on_stream(init, b, r, 2, argv[1], NULL), -EINVAL);
		CHECK_EQ(te_batch_wait(init, b, 5000), 0);
		CHECK_EQ(te_batch_free(init, b), 0);
		CHECK_EQ(te_batch_alloc(init, 4, &b), 0);
	}

	gate g;
	gate_close(&g, launch, S);
	CHECK_EQ(te_submit_on_stream(init, b, r, 2, argv[1], S), 0);
	probe p = { .e = init, .b = b, .first = 0, .n = 2 };
	REQUIRE(launch(S, probe_fn, &p) == 0);
	usleep(100000);
	size_t infl = 0;
	CHECK_EQ(te_batch_status(init, b, NULL, &infl, NULL), 0);
	CHECK_EQ(infl, 2); /* waiting for the test's work before them */
	CHECK(dev_equals(t, len, 0));
	gate_open(&g);
	CHECK_EQ(sync_stream(S), 0);
	CHECK(atomic_load(&p.ran));
	CHECK_EQ(atomic_load(&p.ended), 2);
	te_task_status st;
	for (size_t i = 0; i < 2; i++) {
		CHECK_EQ(te_get_status(init, b, i, &st), 0);
		CHECK_EQ(st.state, TE_TASK_COMPLETED);
	}
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
