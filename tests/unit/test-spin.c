/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The adaptive look before sleeping (util/teu-spin.h) that te_batch_wait,
 * the TCP transport's waiting callers and its I/O threads share: it grows
 * while work comes within it or soon after, backs off to nothing when work
 * stops coming, never passes its cap, never spins with one usable CPU or
 * with as many spinners as CPUs, and TE_SPIN_US fixes it (0: never).
 */
#include <sched.h>
#include <stdio.h>

#include "teu-spin.h"
#include "../common/check.h"

static atomic_int spinners;

static teu_spin_policy adaptive(unsigned cpus)
{
	teu_spin_policy p;

	teu_spin_policy_init(&p, -1, &spinners);
	p.cpus = cpus; /* as if the affinity mask held that many */
	return p;
}

/* One wait: begins, ends, learns; the look it was given. */
static int64_t wait_once(const teu_spin_policy *p, teu_spin_state *s, bool hit, int64_t waited)
{
	int64_t b = teu_spin_begin(p, s);
	teu_spin_end(p, b);
	teu_spin_learn(p, s, hit, waited);
	return b;
}

static void test_backs_off_and_comes_back(void)
{
	teu_spin_policy p = adaptive(4);
	teu_spin_state s = { 0 };

	/* The first wait is met with the whole cap. */
	CHECK(wait_once(&p, &s, false, 10 * 1000 * 1000) == TEU_SPIN_AUTO_CAP_NS);
	/* Work that comes far later than the cap: the look halves each time and
	 * is gone after a few waits (an engine whose work stopped sleeps). */
	int64_t last = TEU_SPIN_AUTO_CAP_NS;
	for (int i = 0; i < 5; i++) {
		int64_t b = wait_once(&p, &s, false, 10 * 1000 * 1000);
		CHECK(b < last);
		last = b;
	}
	for (int i = 0; i < 10; i++)
		wait_once(&p, &s, false, 10 * 1000 * 1000);
	CHECK(teu_spin_begin(&p, &s) == 0);
	CHECK(atomic_load(&spinners) == 0);
	/* Work that came soon after it went to sleep: a longer look would have
	 * caught it, so the look is back at once (at least that long). */
	teu_spin_learn(&p, &s, false, 30 * 1000);
	int64_t b = teu_spin_begin(&p, &s);
	CHECK(b >= 30 * 1000 && b <= TEU_SPIN_AUTO_CAP_NS);
	teu_spin_end(&p, b);
	/* Work caught while looking: it grows, never past the cap. */
	for (int i = 0; i < 20; i++)
		CHECK(wait_once(&p, &s, true, 5000) <= TEU_SPIN_AUTO_CAP_NS);
	CHECK(wait_once(&p, &s, true, 5000) == TEU_SPIN_AUTO_CAP_NS);
	/* Work that comes later than a look plus a wake-up could catch: the
	 * look halves. */
	CHECK(wait_once(&p, &s, false, 3 * TEU_SPIN_AUTO_CAP_NS) == TEU_SPIN_AUTO_CAP_NS);
	CHECK(wait_once(&p, &s, false, 3 * TEU_SPIN_AUTO_CAP_NS) == TEU_SPIN_AUTO_CAP_NS / 2);
}

static void test_cpus(void)
{
	teu_spin_state s = { 0 };

	/* One usable CPU: the thread with the work needs it; never spin. */
	teu_spin_policy one = adaptive(1);
	CHECK(teu_spin_begin(&one, &s) == 0);
	CHECK(atomic_load(&spinners) == 0);

	/* Two CPUs: two spinners at most; a third sleeps at once. */
	teu_spin_policy two = adaptive(2);
	teu_spin_state a = { 0 }, b = { 0 }, c = { 0 };
	int64_t ba = teu_spin_begin(&two, &a), bb = teu_spin_begin(&two, &b), bc = teu_spin_begin(&two, &c);
	CHECK(ba > 0 && bb > 0 && bc == 0);
	CHECK(atomic_load(&spinners) == 2);
	teu_spin_end(&two, ba);
	teu_spin_end(&two, bc); /* nothing to give back */
	CHECK(atomic_load(&spinners) == 1);
	int64_t bd = teu_spin_begin(&two, &c);
	CHECK(bd > 0);
	teu_spin_end(&two, bb);
	teu_spin_end(&two, bd);
	CHECK(atomic_load(&spinners) == 0);

	/* The count of usable CPUs is the affinity mask's. */
	cpu_set_t set;
	CPU_ZERO(&set);
	CHECK(sched_getaffinity(0, sizeof set, &set) == 0);
	CHECK(teu_spin_usable_cpus() == (unsigned)CPU_COUNT(&set));
}

static void test_fixed(void)
{
	teu_spin_policy p;
	teu_spin_state s = { 0 };

	/* TE_SPIN_US=0: never, whatever the waits say. */
	teu_spin_policy_init(&p, 0, &spinners);
	CHECK(!p.adaptive);
	for (int i = 0; i < 5; i++)
		CHECK(wait_once(&p, &s, true, 100) == 0);
	CHECK(wait_once(&p, &s, false, 1000) == 0);
	/* TE_SPIN_US=30: 30 us each time, not learned, not counted. */
	teu_spin_state t = { 0 };
	teu_spin_policy_init(&p, 30, &spinners);
	for (int i = 0; i < 5; i++)
		CHECK(wait_once(&p, &t, false, 1000 * 1000 * 1000) == 30 * 1000);
	p.cpus = 1; /* asked for: spins even so */
	int64_t b = teu_spin_begin(&p, &t);
	CHECK(b == 30 * 1000 && atomic_load(&spinners) == 0);
	teu_spin_end(&p, b);
	/* Bounded as documented. */
	teu_spin_policy_init(&p, 5000, &spinners);
	CHECK(p.cap_ns == TEU_SPIN_MAX_US * 1000);
}

int main(void)
{
	test_backs_off_and_comes_back();
	test_cpus();
	test_fixed();
	return check_done();
}
