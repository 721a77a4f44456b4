/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Adaptive busy-polling: how long a thread that expects work soon (one that
 * waits for its own request, an I/O thread that has just served a peer's
 * request) keeps looking before it sleeps. A sleep and wake-up costs tens of
 * microseconds on a VM, more than a loopback round trip, so looking for a
 * while pays when the work comes within that while and costs a core when it
 * does not.
 *
 * Each waiting thread keeps a budget (teu_spin_state) that it learns from
 * its waits: it doubles when the work came while the thread looked, or
 * soon enough after it went to sleep that a longer look would have caught
 * it (twice the cap: the measured wait includes the thread's own wake-up);
 * it halves when the work came later than that, down to nothing; it never
 * exceeds the cap. So back-to-back requests are met by a thread that is
 * still looking, and an engine whose work stops spins at most the cap once
 * and then sleeps.
 *
 * A thread spins only while the process may run it beside the thread that
 * does the work: never with one usable CPU (sched_getaffinity), and never
 * when as many threads as there are usable CPUs spin already (a count per
 * user of this header, teu_spin_policy.spinners). A spinning thread yields
 * the CPU at every look (teu_spin_pause), so a thread with work for it that
 * waits for that very CPU runs first.
 *
 * TE_SPIN_US set fixes the look (0: never spin) and turns the learning and
 * the CPU checks off: the user asked for exactly that.
 */
#ifndef TEU_SPIN_H
#define TEU_SPIN_H

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* The most an adaptive look lasts, and the most TE_SPIN_US may be. */
#define TEU_SPIN_AUTO_CAP_NS 50000
#define TEU_SPIN_MAX_US 1000

typedef struct teu_spin_policy {
	int64_t cap_ns;       /* the longest look; 0: never spin */
	bool adaptive;        /* learn the look; false: always cap_ns (TE_SPIN_US set) */
	unsigned cpus;        /* CPUs this process may run on */
	atomic_int *spinners; /* threads of this user looking right now */
} teu_spin_policy;

typedef struct teu_spin_state {
	int64_t budget_ns; /* the next look */
	bool init;
} teu_spin_state;

/* CPUs the calling thread may run on (its affinity mask, not the machine's
 * count: a container or taskset gives fewer). */
static inline unsigned teu_spin_usable_cpus(void)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	if (sched_getaffinity(0, sizeof set, &set) != 0)
		return 1;
	int n = CPU_COUNT(&set);
	return n < 1 ? 1 : (unsigned)n;
}

/* us_set: TE_SPIN_US as given, or a negative number when it is not set. */
static inline void teu_spin_policy_init(teu_spin_policy *p, int64_t us_set, atomic_int *spinners)
{
	p->adaptive = us_set < 0;
	p->cap_ns = us_set < 0 ? TEU_SPIN_AUTO_CAP_NS
				: 1000 * (us_set > TEU_SPIN_MAX_US ? TEU_SPIN_MAX_US : us_set);
	p->cpus = teu_spin_usable_cpus();
	p->spinners = spinners;
}

/* The look to take now, in ns; when it is above 0 the caller counts as a
 * spinner and calls teu_spin_end() once it stops looking. */
static inline int64_t teu_spin_begin(const teu_spin_policy *p, teu_spin_state *s)
{
	if (!s->init) {
		s->budget_ns = p->cap_ns; /* start hopeful: the first requests are met */
		s->init = true;
	}
	int64_t b = p->adaptive ? s->budget_ns : p->cap_ns;
	if (b <= 0)
		return 0;
	if (!p->adaptive)
		return b;
	if (p->cpus < 2)
		return 0;
	if ((unsigned)atomic_fetch_add(p->spinners, 1) >= p->cpus) {
		atomic_fetch_sub(p->spinners, 1);
		return 0;
	}
	return b;
}

static inline void teu_spin_end(const teu_spin_policy *p, int64_t begun)
{
	if (begun > 0 && p->adaptive)
		atomic_fetch_sub(p->spinners, 1);
}

/* What a wait taught: `waited_ns` from its start until the work came, and
 * whether the thread was still looking then. */
static inline void teu_spin_learn(const teu_spin_policy *p, teu_spin_state *s, bool hit, int64_t waited_ns)
{
	if (!p->adaptive || !s->init)
		return;
	int64_t b = s->budget_ns;
	if (hit || waited_ns <= 2 * p->cap_ns) {
		int64_t want = 2 * b + 1000;
		if (!hit && want < waited_ns)
			want = waited_ns;
		b = want > p->cap_ns ? p->cap_ns : want;
	} else {
		b /= 2;
		if (b < 1000)
			b = 0;
	}
	s->budget_ns = b;
}

/* One look's pause: the CPU goes to whoever else may run on it. */
static inline void teu_spin_pause(void)
{
	sched_yield();
}

#endif
