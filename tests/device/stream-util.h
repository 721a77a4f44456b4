/* SPDX-License-Identifier: Apache-2.0 */
/* Work of a test's own queued on a device stream, around te_submit_on_stream():
 * a gate that holds the stream until opened, and a probe that records
 * what the submission's tasks were when the stream got to it. */
#ifndef TE_TEST_STREAM_UTIL_H
#define TE_TEST_STREAM_UTIL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "../common/util.h"

/* Queues fn(arg) on a stream: the test device's, or a runtime's
 * cuLaunchHostFunc / hipLaunchHostFunc (0 on success). */
typedef int (*stream_launch_fn)(void *stream, void (*fn)(void *), void *arg);

/* Work of the test's own on a stream that holds it until opened: what is
 * queued behind it waits, as behind a long kernel. */
typedef struct gate {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool entered, open;
} gate;

static inline void gate_fn(void *arg)
{
	gate *g = arg;
	pthread_mutex_lock(&g->lock);
	g->entered = true;
	pthread_cond_broadcast(&g->cond);
	while (!g->open)
		pthread_cond_wait(&g->cond, &g->lock);
	pthread_mutex_unlock(&g->lock);
}

static inline void gate_close(gate *g, stream_launch_fn launch, void *stream)
{
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->cond, NULL);
	g->entered = g->open = false;
	REQUIRE(launch(stream, gate_fn, g) == 0);
	pthread_mutex_lock(&g->lock);
	while (!g->entered)
		pthread_cond_wait(&g->cond, &g->lock);
	pthread_mutex_unlock(&g->lock);
}

static inline void gate_open(gate *g)
{
	pthread_mutex_lock(&g->lock);
	g->open = true;
	pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&g->lock);
}

/* Work queued on the stream after a submission: what it sees when it runs. */
typedef struct probe {
	te_engine *e;
	te_batch_id b;
	size_t first, n;
	atomic_int ran, ended; /* tasks it saw in an end state */
} probe;

static inline void probe_fn(void *arg)
{
	probe *p = arg;
	te_task_status st;
	int ended = 0;
	for (size_t i = p->first; i < p->first + p->n; i++)
		if (te_get_status(p->e, p->b, i, &st) == 0 && st.state != TE_TASK_WAITING &&
		    st.state != TE_TASK_PENDING)
			ended++;
	atomic_store(&p->ended, ended);
	atomic_store(&p->ran, 1);
}

static inline long long ms_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

#endif
