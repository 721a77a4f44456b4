/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fault handling, on two engines with two emulated NICs each and slowed-down
 * devices so batches are in flight when a link changes:
 *  - a local NIC taken down mid-batch: every task completes through the other
 *    one; the NIC is out of service, and back in service once its link is up;
 *  - a peer NIC taken down mid-batch: the paths to it fail, are paused, and
 *    the tasks complete through the peer's other NIC;
 *  - a device reporting a fatal error: out of service until it is reset, then
 *    opened anew (new queues, new keys) and back in service; one that dies
 *    mid-batch without flushing what it holds: taken back, every task
 *    completes; on the target's side its peers learn the new keys and use
 *    them;
 *  - all local NICs down: tasks FAIL at once with -ENETDOWN and a clear log;
 *  - all peer NICs down: tasks FAIL (peer unreachable, or handshakes refused
 *    by the peer for NICs it took out of service), bounded in time;
 *  - the peer engine gone altogether: tasks FAIL cleanly, bounded in time;
 *  - a peer NIC readdressed (its GID changes): the peer publishes the new
 *    GID, and transfers go on through that NIC;
 *  and after each fault, with the links back, transfers succeed again.
 */
#include <infiniband/verbs.h>

#include "rdma-util.h"
#include "../metrics/metric-util.h"

#define BUF (64u << 20)

static te_engine *A, *B;
static unsigned char *abuf, *bbuf;
static te_segment_id SEG;

static void setup(void)
{
	/* Short pauses so the recovery checks do not wait long. */
	const char *opts[] = { "TE_RDMA_PATH_PAUSE_MS", "300", NULL };
	A = soft_engine_v("two-socket", "{\"devices\": [\"mlx5_0\", \"mlx5_1\"]}", opts);
	B = soft_engine_v("two-socket", "{\"devices\": [\"mlx5_2\", \"mlx5_3\"]}", opts);
	SEG = pair_buffers(A, B, BUF, 0, &abuf, &bbuf);
}

/* Submits `n` WRITEs of `len` bytes; returns the batch. */
static te_batch_id start_batch(int n, size_t len, unsigned seed)
{
	te_request r[256];
	te_batch_id b;

	REQUIRE(n <= 256 && (size_t)n * len <= BUF);
	fill_pattern(abuf, (size_t)n * len, seed);
	memset(bbuf, 0, (size_t)n * len);
	for (int i = 0; i < n; i++)
		r[i] = (te_request){ TE_OP_WRITE, SEG, abuf + (size_t)i * len,
				     (uintptr_t)(bbuf + (size_t)i * len), len };
	REQUIRE(te_batch_alloc(A, (size_t)n, &b) == 0);
	CHECK_EQ(te_submit(A, b, r, (size_t)n), 0);
	return b;
}

/* Waits for the batch; counts tasks per final state; checks the data of
 * the completed ones. */
static void finish_batch(te_batch_id b, int n, size_t len, int *completed, int *failed, int *err)
{
	te_task_status st;

	CHECK_EQ(te_batch_wait(A, b, 60000), 0);
	*completed = *failed = 0;
	*err = 0;
	for (int i = 0; i < n; i++) {
		CHECK_EQ(te_get_status(A, b, (size_t)i, &st), 0);
		if (st.state == TE_TASK_COMPLETED) {
			(*completed)++;
			CHECK(memcmp(abuf + (size_t)i * len, bbuf + (size_t)i * len, len) == 0);
			CHECK_EQ(st.transferred, len);
		} else if (st.state == TE_TASK_FAILED) {
			(*failed)++;
			*err = st.error;
		}
	}
	CHECK_EQ(te_batch_free(A, b), 0);
}

/* Tasks of the batch still in flight: a fault injected once none is tested
 * nothing. */
static size_t in_flight(te_batch_id b)
{
	size_t n = 0;
	CHECK_EQ(te_batch_status(A, b, NULL, &n, NULL), 0);
	return n;
}

/* On a real device the peer engine learns of its port's state from the
 * device's events, a moment after the cable moved. */
static void settle_peer(const char *dev, int active)
{
	if (real_mode())
		CHECK(WAIT_FOR(device_active(B, dev) == active, 5000));
}

/* Work requests the soft device `dev` has finished executing, whatever
 * their outcome. */
static uint64_t executed_on(const char *dev)
{
	te_rdma_soft_counters c;
	return soft_counters(dev, &c) == 0 ? c.wrs + c.errors + c.flushed : 0;
}

static bool works_again(void)
{
	int c, f, e;
	te_batch_id b = start_batch(16, 256 << 10, 99);
	finish_batch(b, 16, 256 << 10, &c, &f, &e);
	return c == 16;
}

static void test_local_nic_down(void)
{
	int c, f, e;

	CHECK_EQ(soft_set_latency(NULL, 1000), 0);
	uint64_t s0 = slices_on(A, "mlx5_0"), s1 = slices_on(A, "mlx5_1");
	/* The device counters (docs/metrics.md) before the fault, where the
	 * engine counts (not built with -Dmetrics=false, not TE_METRICS=0). */
	bool counts = engine_counts(A);
	const char *n0 = dev_name("mlx5_0"), *n1 = dev_name("mlx5_1");
	long long b0 = device_metric(A, "te_device_bytes_total", "rdma", n0);
	long long b1 = device_metric(A, "te_device_bytes_total", "rdma", n1);
	long long fo0 = device_metric(A, "te_device_failovers_total", "rdma", n0);
	long long tfo = transport_metric(A, "te_transport_failovers_total", "rdma");
	REQUIRE(!counts || (b0 >= 0 && b1 >= 0 && fo0 >= 0 && tfo >= 0));
	te_batch_id b = start_batch(128, 512 << 10, 1); /* 1024 slices, ~0.5 s */
	CHECK(WAIT_FOR(slices_on(A, "mlx5_0") > s0 + 32, 10000));
	cap_start();
	CHECK_EQ(soft_set_link("mlx5_0", 0), 0);
	uint64_t at_down = slices_on(A, "mlx5_1");
	size_t left = in_flight(b);
	fprintf(stderr, "  %zu of 128 tasks in flight when the link went down\n", left);
	CHECK(left > 0);
	finish_batch(b, 128, 512 << 10, &c, &f, &e);
	CHECK_EQ(c, 128); /* every task, through the other NIC */
	CHECK_EQ(f, 0);
	CHECK(cap_has_dev("mlx5_0: out of service: port")); /* by its event or a failed request */
	CHECK_EQ(device_active(A, "mlx5_0"), 0);
	CHECK(slices_on(A, "mlx5_1") > at_down + 64);
	CHECK(slices_on(A, "mlx5_0") > s0 && slices_on(A, "mlx5_1") > s1);
	/* Counted per NIC: both moved part of the batch, every byte once (a
	 * work request that failed on mlx5_0 counts where it was sent again);
	 * the slices moved off mlx5_0 are its fail-overs, and the transport's
	 * total includes them. Nothing is left in flight. */
	if (counts) {
		long long d_b0 = device_metric(A, "te_device_bytes_total", "rdma", n0) - b0;
		long long d_b1 = device_metric(A, "te_device_bytes_total", "rdma", n1) - b1;
		long long d_fo0 = device_metric(A, "te_device_failovers_total", "rdma", n0) - fo0;
		long long d_tfo = transport_metric(A, "te_transport_failovers_total", "rdma") - tfo;
		fprintf(stderr, "  bytes per NIC: %s %lld, %s %lld; fail-overs off %s: %lld (transport %lld)\n", n0,
			d_b0, n1, d_b1, n0, d_fo0, d_tfo);
		CHECK(d_b0 > 0 && d_b1 > 0);
		CHECK_EQ(d_b0 + d_b1, 128LL * (512 << 10));
		CHECK(d_fo0 >= 1);
		CHECK(d_tfo >= d_fo0);
		CHECK_EQ(device_metric(A, "te_device_failovers_total", "rdma", n1), 0); /* mlx5_1 never failed */
		CHECK_EQ(device_metric(A, "te_device_in_flight_bytes", "rdma", n0), 0);
		CHECK_EQ(device_metric(A, "te_device_in_flight_bytes", "rdma", n1), 0);
	}
	/* While down, everything goes through mlx5_1: its bytes, exactly. */
	uint64_t d0 = slices_on(A, "mlx5_0");
	b0 = device_metric(A, "te_device_bytes_total", "rdma", n0);
	b1 = device_metric(A, "te_device_bytes_total", "rdma", n1);
	CHECK(works_again());
	CHECK_EQ(slices_on(A, "mlx5_0"), d0);
	if (counts) {
		CHECK_EQ(device_metric(A, "te_device_bytes_total", "rdma", n0), b0);
		CHECK_EQ(device_metric(A, "te_device_bytes_total", "rdma", n1) - b1, 16LL * (256 << 10));
	}

	cap_start();
	CHECK_EQ(soft_set_link("mlx5_0", 1), 0);
	CHECK(WAIT_FOR(device_active(A, "mlx5_0") == 1, 5000));
	CHECK(cap_has_dev("mlx5_0: back in service"));
	CHECK(works_again());
	CHECK(slices_on(A, "mlx5_0") > d0); /* used again */
	CHECK_EQ(soft_set_latency(NULL, 0), 0);
}

static void test_peer_nic_down(void)
{
	int c, f, e;
	te_rdma_stats s0, s1;
	uint64_t r2a, r2b, r3a, r3b;

	REQUIRE(stats_of(A, &s0) == 0);
	CHECK_EQ(soft_set_latency(NULL, 1000), 0);
	te_batch_id b = start_batch(128, 512 << 10, 2);
	CHECK(WAIT_FOR(slices_on(A, "mlx5_0") + slices_on(A, "mlx5_1") >
			       s0.slices[0] + s0.slices[1] + 64,
		       10000));
	CHECK_EQ(soft_set_link("mlx5_2", 0), 0);
	size_t left = in_flight(b);
	uint64_t r2d = rx_count("mlx5_2");
	settle_peer("mlx5_2", 0);
	if (real_mode()) {
		usleep(50000); /* the device's counters are cached for 10 ms */
	} else {
		/* A request that passed the check of the peer's port just before the
		 * link went down still lands, and is counted once copied. Each of
		 * A's NICs executes one request at a time (a thread per device):
		 * once each has finished one more, every request begun before the
		 * link went down is over, and any later one finds the port down.
		 * A NIC that stays idle had nothing in flight. */
		uint64_t x0 = executed_on("mlx5_0"), x1 = executed_on("mlx5_1");
		if (!WAIT_FOR(executed_on("mlx5_0") > x0 && executed_on("mlx5_1") > x1, 5000))
			fprintf(stderr, "  one of A's NICs was idle after the link went down\n");
	}
	r2a = rx_count("mlx5_2");
	/* Work still to do once the link was down and settled: what the check
	 * below watches could have gone to the down NIC. */
	size_t later = in_flight(b);
	r3a = rx_count("mlx5_3");
	finish_batch(b, 128, 512 << 10, &c, &f, &e);
	CHECK_EQ(c, 128);
	CHECK_EQ(f, 0);
	r2b = rx_count("mlx5_2");
	r3b = rx_count("mlx5_3");
	REQUIRE(stats_of(A, &s1) == 0);
	fprintf(stderr, "  %zu of 128 tasks in flight when the link went down, %zu once settled (peer NIC 0 "
			"served %llu meanwhile); served after: peer NIC 0 %llu, peer NIC 1 %llu; %llu retries\n",
		left, later, (unsigned long long)(r2a - r2d), (unsigned long long)(r2b - r2a),
		(unsigned long long)(r3b - r3a),
		(unsigned long long)(s1.slice_retries - s0.slice_retries));
	CHECK(left > 0);
	CHECK(later > 0);
	CHECK_EQ(r2b, r2a); /* nothing reached the down NIC */
	CHECK(r3b > r3a + 64);
	CHECK(s1.slice_retries > s0.slice_retries);
	CHECK(s1.endpoints_failed > s0.endpoints_failed);
	/* Both of A's NICs stayed in service: the fault was the peer's. */
	CHECK_EQ(device_active(A, "mlx5_0"), 1);
	CHECK_EQ(device_active(A, "mlx5_1"), 1);
	CHECK_EQ(soft_set_link("mlx5_2", 1), 0);
	settle_peer("mlx5_2", 1);
	CHECK_EQ(soft_set_latency(NULL, 0), 0);
	usleep(400000); /* any paused path resumes */
	r2a = rx_count("mlx5_2");
	CHECK(works_again());
	r2b = rx_count("mlx5_2");
	CHECK(r2b > r2a); /* the peer's NIC serves again */
}

static void test_fatal(void)
{
	SOFT_ONLY("device fatal events");
	cap_start();
	CHECK_EQ(soft_fatal("mlx5_1"), 0);
	CHECK(WAIT_FOR(device_active(A, "mlx5_1") == 0, 5000));
	CHECK(cap_has("mlx5_1: out of service: device reported a fatal error"));
	uint64_t d1 = slices_on(A, "mlx5_1");
	CHECK(works_again());
	CHECK_EQ(slices_on(A, "mlx5_1"), d1);
	/* Still out after the port checks that ran meanwhile: a dead device
	 * answers no query until it is reset. */
	usleep(600000);
	CHECK_EQ(device_active(A, "mlx5_1"), 0);
	CHECK_EQ(device_revivals(A, "mlx5_1"), 0);
	/* Reset: the dead context stays dead, the device opens anew. */
	CHECK_EQ(soft_set_link("mlx5_1", 1), 0);
	CHECK(WAIT_FOR(device_active(A, "mlx5_1") == 1, 5000));
	CHECK_EQ(device_revivals(A, "mlx5_1"), 1);
	CHECK(cap_has("mlx5_1: opened again after its fatal error"));
	CHECK(works_again());
	CHECK(slices_on(A, "mlx5_1") > d1); /* new QPs, new MRs: it moves bytes */
}

/* A NIC comes back from its reset under another name (a re-probe names it
 * anew): it is found by its node GUID, opened anew, and keeps its first
 * name in the engine; a device that takes over the old name is not it. */
static void test_fatal_renamed(void)
{
	SOFT_ONLY("device fatal events");
	int r0 = device_revivals(A, "mlx5_1");
	cap_start();
	CHECK_EQ(soft_fatal("mlx5_1"), 0);
	CHECK(WAIT_FOR(device_active(A, "mlx5_1") == 0, 5000));
	CHECK_EQ(soft_rename("mlx5_1", "mlx5_9"), 0);
	CHECK_EQ(soft_rename("mlx5_9", "mlx5_0"), -EEXIST);
	CHECK_EQ(soft_rename("mlx5_1", "mlx5_8"), -ENOENT); /* no device has that name now */
	/* Another adapter under the old name is not taken for it (mlx5_0's
	 * port is active: opened by name, it would be in service at once). */
	CHECK_EQ(soft_rename("mlx5_0", "mlx5_1"), 0);
	usleep(1200000); /* two reclaimer passes */
	CHECK_EQ(device_active(A, "mlx5_1"), 0);
	CHECK_EQ(device_revivals(A, "mlx5_1"), r0);
	CHECK_EQ(soft_rename("mlx5_1", "mlx5_0"), 0);
	CHECK_EQ(soft_set_link("mlx5_9", 1), 0);
	CHECK(WAIT_FOR(device_active(A, "mlx5_1") == 1, 5000));
	CHECK_EQ(device_revivals(A, "mlx5_1"), r0 + 1);
	CHECK(cap_has("mlx5_1: back as mlx5_9 (node GUID 0x"));
	CHECK(cap_has("mlx5_1: opened again after its fatal error"));
	uint64_t d1 = slices_on(A, "mlx5_1");
	uint64_t w1 = 0;
	te_rdma_soft_counters sc;
	CHECK_EQ(soft_counters("mlx5_9", &sc), 0);
	w1 = sc.wrs;
	CHECK(works_again());
	CHECK(slices_on(A, "mlx5_1") > d1);
	CHECK_EQ(soft_counters("mlx5_9", &sc), 0);
	CHECK(sc.wrs > w1); /* the bytes went through the renamed device */
	CHECK_EQ(soft_rename("mlx5_9", "mlx5_1"), 0);
}

/* A NIC dies mid-batch without flushing what it holds (as user-space
 * queues of a dead mlx5 stay): after a grace period its requests are taken
 * back and sent by the other NIC, every task completes, and once reset the
 * NIC is opened anew and serves. */
static void test_fatal_unflushed(void)
{
	int c, f, e;

	SOFT_ONLY("device fatal events");
	int r0 = device_revivals(A, "mlx5_1");
	CHECK_EQ(soft_set_latency(NULL, 1000), 0);
	uint64_t s1 = slices_on(A, "mlx5_1");
	te_batch_id b = start_batch(128, 512 << 10, 5); /* 1024 slices, ~0.5 s */
	CHECK(WAIT_FOR(slices_on(A, "mlx5_1") > s1 + 16, 10000));
	cap_start();
	CHECK_EQ(soft_fatal_silent("mlx5_1"), 0);
	size_t left = in_flight(b);
	fprintf(stderr, "  %zu of 128 tasks in flight when the NIC died\n", left);
	CHECK(left > 0);
	long long t0 = now_ms();
	finish_batch(b, 128, 512 << 10, &c, &f, &e);
	fprintf(stderr, "  the batch ended %lld ms after\n", now_ms() - t0);
	CHECK_EQ(c, 128); /* every byte checked */
	CHECK_EQ(f, 0);
	CHECK(cap_has("were never flushed; sent again by other paths"));
	CHECK_EQ(soft_set_latency(NULL, 0), 0);
	CHECK_EQ(soft_set_link("mlx5_1", 1), 0);
	CHECK(WAIT_FOR(device_active(A, "mlx5_1") == 1, 5000));
	CHECK_EQ(device_revivals(A, "mlx5_1"), r0 + 1);
	uint64_t d1 = slices_on(A, "mlx5_1");
	CHECK(works_again());
	CHECK(slices_on(A, "mlx5_1") > d1);
}

/* The target's NIC dies: B opens it anew with new keys for its buffers,
 * publishes them, and A, refused on that NIC with the old ones, fetches
 * B's descriptor again and moves bytes through it. A buffer B registers
 * while the NIC is dead is registered with it when it returns. */
static void test_fatal_target(void)
{
	SOFT_ONLY("device fatal events");
	const size_t len2 = 1 << 20;
	unsigned char *b2 = buf_new(len2);

	cap_start();
	CHECK_EQ(soft_fatal("mlx5_3"), 0);
	CHECK(WAIT_FOR(device_active(B, "mlx5_3") == 0, 5000));
	CHECK(works_again()); /* through mlx5_2 */
	CHECK_EQ(te_register_memory(B, b2, len2, "cpu:1", TE_MEM_REMOTE_ACCESS), 0);
	CHECK(cap_has("registered without 1 device(s) out of service after a fatal error"));
	CHECK_EQ(soft_set_link("mlx5_3", 1), 0);
	CHECK(WAIT_FOR(device_active(B, "mlx5_3") == 1, 5000));
	CHECK_EQ(device_revivals(B, "mlx5_3"), 1);
	CHECK(cap_has("mlx5_3: opened again after its fatal error"));
	/* A still has B's old keys for mlx5_3: refused there, its slices go by
	 * mlx5_2, and it fetches the descriptor B published. Bytes land
	 * through mlx5_3 again once it has. */
	uint64_t rx = rx_count("mlx5_3");
	int rounds = 0;
	while (rx_count("mlx5_3") == rx && rounds < 40) {
		CHECK(works_again());
		rounds++;
		usleep(100000);
	}
	fprintf(stderr, "  bytes through the re-opened mlx5_3 after %d batches\n", rounds);
	CHECK(rx_count("mlx5_3") > rx);
	/* The buffer registered while it was dead: reached through it too. */
	te_segment_id seg = te_segment_open(A, te_engine_name(B));
	CHECK(seg > 0);
	te_task_status st;
	fill_pattern(abuf, len2, 7);
	for (int i = 0; i < 8; i++) {
		memset(b2, 0, len2);
		CHECK_EQ(run_one(A, TE_OP_WRITE, seg, abuf, (uintptr_t)b2, len2, &st), TE_TASK_COMPLETED);
		CHECK(memcmp(abuf, b2, len2) == 0);
	}
	CHECK_EQ(te_segment_close(A, seg), 0);
	CHECK_EQ(te_unregister_memory(B, b2), 0);
	free(b2);
}

/* Whether engine `e`'s own descriptor, as it publishes it, holds `s`. */
static bool local_desc_has(te_engine *e, const char *s)
{
	char *json = NULL;
	bool has = te_segment_descriptor(e, TE_LOCAL_SEGMENT, &json) == 0 && strstr(json, s) != NULL;
	free(json);
	return has;
}

static void test_gid_change(void)
{
	SOFT_ONLY("GID changes");
	/* mlx5_3's address in the fixture, and a new one */
	const char *old = "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:04";
	const char *neu = "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:24";
	char *json = NULL;

	CHECK(local_desc_has(B, old));
	CHECK(!local_desc_has(B, neu));
	CHECK_EQ(soft_replace_gid("mlx5_3", "00:11", neu), -EINVAL);
	CHECK_EQ(soft_replace_gid("mlx5_3", neu, old), -ENOENT);
	cap_start();
	CHECK_EQ(soft_replace_gid("mlx5_3", old, neu), 0);
	CHECK(WAIT_FOR(cap_has_quiet("mlx5_3 port 1: the GID changed"), 5000));
	CHECK(WAIT_FOR(local_desc_has(B, neu), 5000)); /* published again */
	CHECK(!local_desc_has(B, old));
	CHECK_EQ(te_segment_refresh(A, SEG), 0);
	CHECK_EQ(te_segment_descriptor(A, SEG, &json), 0);
	CHECK(json != NULL && strstr(json, neu) != NULL);
	free(json);
	/* Paths to the old address were paused: bytes reach mlx5_3 again. */
	uint64_t rx = rx_count("mlx5_3");
	for (int i = 0; i < 40 && rx_count("mlx5_3") == rx; i++) {
		CHECK(works_again());
		usleep(100000);
	}
	CHECK(rx_count("mlx5_3") > rx);
	CHECK_EQ(soft_replace_gid("mlx5_3", neu, old), 0);
	CHECK(WAIT_FOR(local_desc_has(B, old), 5000));
	usleep(400000); /* past the pauses */
	CHECK(works_again());
}

static void test_all_local_down(void)
{
	int c, f, e;

	CHECK_EQ(soft_set_link("mlx5_0", 0), 0);
	CHECK_EQ(soft_set_link("mlx5_1", 0), 0);
	CHECK(WAIT_FOR(device_active(A, "mlx5_0") == 0 && device_active(A, "mlx5_1") == 0, 5000));
	cap_start();
	long long t0 = now_ms();
	te_batch_id b = start_batch(32, 256 << 10, 3);
	finish_batch(b, 32, 256 << 10, &c, &f, &e);
	CHECK_EQ(f, 32);
	CHECK_EQ(e, -ENETDOWN);
	CHECK(now_ms() - t0 < 2000);
	CHECK(cap_has("every local RDMA device is out of service"));
	CHECK(bbuf[0] == 0);
	CHECK_EQ(soft_set_link("mlx5_0", 1), 0);
	CHECK_EQ(soft_set_link("mlx5_1", 1), 0);
	CHECK(WAIT_FOR(device_active(A, "mlx5_0") == 1 && device_active(A, "mlx5_1") == 1, 5000));
	CHECK(works_again());
}

static void test_all_peer_down(void)
{
	int c, f, e;
	te_rdma_stats s0, s1;

	REQUIRE(stats_of(A, &s0) == 0);
	CHECK_EQ(soft_set_link("mlx5_2", 0), 0);
	CHECK_EQ(soft_set_link("mlx5_3", 0), 0);
	usleep(1100000); /* failure lines are rate-limited per second */
	cap_start();
	long long t0 = now_ms();
	te_batch_id b = start_batch(32, 256 << 10, 4);
	finish_batch(b, 32, 256 << 10, &c, &f, &e);
	long long took = now_ms() - t0;
	fprintf(stderr, "  all peer NICs down: %d failed in %lld ms\n", f, took);
	CHECK_EQ(f, 32);
	/* The last attempt either found the peer unreachable, or the peer
	 * refused a new handshake on a NIC it has taken out of service. */
	CHECK(e == -EHOSTUNREACH || e == -ENETUNREACH);
	if (e != -EHOSTUNREACH && e != -ENETUNREACH)
		fprintf(stderr, "  the last error: %d (%s)\n", e, te_strerror(e));
	CHECK(took < 10000);
	CHECK(cap_has("every path failed, is paused, or retries are exhausted"));
	REQUIRE(stats_of(A, &s1) == 0);
	CHECK(s1.pair_pauses > s0.pair_pauses);
	/* A's own NICs are fine. */
	CHECK_EQ(device_active(A, "mlx5_0"), 1);
	CHECK_EQ(soft_set_link("mlx5_2", 1), 0);
	CHECK_EQ(soft_set_link("mlx5_3", 1), 0);
	settle_peer("mlx5_2", 1);
	settle_peer("mlx5_3", 1);
	usleep(400000); /* past the pause */
	CHECK(works_again());
}

static void test_peer_gone(void)
{
	te_task_status st;
	te_engine *c = soft_engine("two-socket", "{\"devices\": [\"mlx5_3\"]}");
	REQUIRE(c != NULL);
	unsigned char *cb = buf_new(1 << 20);
	REQUIRE(te_register_memory(c, cb, 1 << 20, "cpu:1", TE_MEM_REMOTE_ACCESS) == 0);
	te_segment_id seg = te_segment_open(A, te_engine_name(c));
	REQUIRE(seg > 0);
	fill_pattern(abuf, 1 << 20, 31);
	CHECK_EQ(run_one(A, TE_OP_WRITE, seg, abuf, (uintptr_t)cb, 1 << 20, &st), TE_TASK_COMPLETED);
	CHECK(memcmp(abuf, cb, 1 << 20) == 0);
	/* The peer process ends: its QPs vanish, its RPC port closes. */
	int port = te_engine_rpc_port(c);
	te_engine_destroy(c);
	free(cb);
	/* Keep the port closed: engines of other test programs pick theirs from
	 * the same range at random, and one that took it would answer the
	 * handshake ("this is X, not Y") instead of refusing the connection. */
	int hold = te_test_hold_port(port);
	usleep(1100000); /* failure lines are rate-limited per second */
	cap_start();
	long long t0 = now_ms();
	/* The cached descriptor still lists the buffer: the request is routed. */
	te_segment_buffer sb;
	REQUIRE(te_segment_buffers(A, seg, &sb, 1) == 1);
	CHECK_EQ(run_one(A, TE_OP_WRITE, seg, abuf, sb.addr, 65536, &st), TE_TASK_FAILED);
	if (hold >= 0) {
		CHECK(st.error == -ECONNREFUSED || st.error == -EHOSTUNREACH);
	} else {
		fprintf(stderr, "  port %d was taken again before it could be held\n", port);
		/* Another engine there rejects the handshake, or accepts it and
		 * then refuses our key for a buffer it never had. */
		CHECK(st.error == -ECONNREFUSED || st.error == -EHOSTUNREACH ||
		      st.error == -ENETUNREACH || st.error == TE_ERR_ADDRESS);
	}
	if (st.error != -ECONNREFUSED && st.error != -EHOSTUNREACH)
		fprintf(stderr, "  the error: %d (%s)\n", st.error, te_strerror(st.error));
	CHECK(now_ms() - t0 < 10000);
	CHECK(cap_has("failed: slice at offset 0"));
	CHECK_EQ(device_active(A, "mlx5_0"), 1); /* not a local fault */
	CHECK_EQ(te_segment_close(A, seg), 0);
	if (hold >= 0)
		close(hold);
	usleep(400000); /* past the pauses */
	CHECK(works_again());
}

int main(void)
{
	find_controls();
	setup();
	TEST_RUN(test_local_nic_down);
	TEST_RUN(test_peer_nic_down);
	TEST_RUN(test_fatal);
	TEST_RUN(test_fatal_renamed);
	TEST_RUN(test_fatal_unflushed);
	TEST_RUN(test_fatal_target);
	TEST_RUN(test_gid_change);
	TEST_RUN(test_all_local_down);
	TEST_RUN(test_all_peer_down);
	TEST_RUN(test_peer_gone);
	te_segment_close(A, SEG);
	te_engine_destroy(A);
	te_engine_destroy(B);
	free(abuf);
	free(bbuf);
	return check_done();
}
