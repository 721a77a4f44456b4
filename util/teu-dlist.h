/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Doubly linked lists threaded through the nodes' own links, as the
 * transports keep them (a node may sit on several lists at once, each with
 * its pair of link fields): the push and the unlink every such list repeats,
 * in the manner of <sys/queue.h> but on the fields the structures already
 * have.
 * Header only; the caller holds whatever lock guards the list. `head` and
 * `tail` are lvalues; `prev` and `next` name the node's link fields; `n` is
 * evaluated more than once (pass a variable).
 */
#ifndef TEU_DLIST_H
#define TEU_DLIST_H

#include <stddef.h>

/* Puts `n` first on the list that starts at `head`. */
#define TEU_DLIST_PUSH(head, n, prev, next)            \
	do {                                           \
		(n)->prev = NULL;                      \
		(n)->next = (head);                    \
		if ((head) != NULL)                    \
			(head)->prev = (n);            \
		(head) = (n);                          \
	} while (0)

/* The same for a list that also keeps its last node in `tail`. */
#define TEU_DLIST_PUSH_TAIL(head, tail, n, prev, next)      \
	do {                                                \
		TEU_DLIST_PUSH(head, n, prev, next);        \
		if ((tail) == NULL)                         \
			(tail) = (n);                       \
	} while (0)

/* Takes `n` off the list that starts at `head`; its links are cleared. */
#define TEU_DLIST_REMOVE(head, n, prev, next)          \
	do {                                           \
		if ((n)->prev != NULL)                 \
			(n)->prev->next = (n)->next;   \
		else                                   \
			(head) = (n)->next;            \
		if ((n)->next != NULL)                 \
			(n)->next->prev = (n)->prev;   \
		(n)->prev = (n)->next = NULL;          \
	} while (0)

/* The same for a list that also keeps its last node in `tail`. */
#define TEU_DLIST_REMOVE_TAIL(head, tail, n, prev, next)    \
	do {                                                \
		if ((n)->next == NULL)                      \
			(tail) = (n)->prev;                 \
		TEU_DLIST_REMOVE(head, n, prev, next);      \
	} while (0)

#endif
