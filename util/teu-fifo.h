/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The queues between threads (the CUDA and HIP plugins', the RDMA
 * transport's slices): a singly linked list kept as a head and a tail
 * pointer, of nodes of any type with a `next` member, guarded by a lock the
 * caller holds. Macros, as each
 * queue has its own node type; their arguments are plain lvalues, each
 * evaluated more than once.
 */
#ifndef TEU_FIFO_H
#define TEU_FIFO_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

/* Appends the chain `first`..`last` (linked through `next`) at the tail. */
#define TEU_FIFO_APPEND(head, tail, first, last)  \
	do {                                      \
		(last)->next = NULL;              \
		if ((tail) != NULL)               \
			(tail)->next = (first);   \
		else                              \
			(head) = (first);         \
		(tail) = (last);                  \
	} while (0)

/* Appends `node` at the tail. */
#define TEU_FIFO_PUSH(head, tail, node) TEU_FIFO_APPEND(head, tail, node, node)

/* Unlinks the node at the head into `node`: NULL when the queue is empty. */
#define TEU_FIFO_TAKE(head, tail, node)                  \
	do {                                             \
		(node) = (head);                         \
		if ((node) != NULL) {                    \
			(head) = (node)->next;           \
			if ((head) == NULL)              \
				(tail) = NULL;           \
		}                                        \
	} while (0)

/* A consumer thread's wait: on `cond` (with `lock`, held) while the queue
 * is empty and `quit` false. */
#define TEU_FIFO_WAIT(head, cond, lock, quit)                   \
	do {                                                    \
		while ((head) == NULL && !(quit))               \
			pthread_cond_wait((cond), (lock));      \
	} while (0)

/* A consumer thread's next node, taken with `lock` (not held before or
 * after): TEU_FIFO_WAIT, then TEU_FIFO_TAKE. `node` is NULL only when asked
 * to quit with nothing left queued. */
#define TEU_FIFO_NEXT(head, tail, node, cond, lock, quit)       \
	do {                                                    \
		pthread_mutex_lock(lock);                       \
		TEU_FIFO_WAIT(head, cond, lock, quit);          \
		TEU_FIFO_TAKE(head, tail, node);                \
		pthread_mutex_unlock(lock);                     \
	} while (0)

/* Tells the consumer `thread` to quit (*quit set under `lock`, `cond`
 * signalled) and joins it: it takes what is still queued first. */
static inline void teu_fifo_stop(pthread_mutex_t *lock, pthread_cond_t *cond, bool *quit, pthread_t thread)
{
	pthread_mutex_lock(lock);
	*quit = true;
	pthread_cond_signal(cond);
	pthread_mutex_unlock(lock);
	pthread_join(thread, NULL);
}

#endif
