/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a process holds, from /proc: its descriptors, the established TCP
 * connections among them, its resident memory. For te-idle-cost and the
 * scale harness (tests/scale), which measure engines the same way.
 */
#ifndef TEU_PROC_H
#define TEU_PROC_H

#include <stdbool.h>
#include <sys/types.h>

/* Whether socket inode `ino` is an established connection in a
 * /proc/PID/net/tcp{,6} table (the process's network namespace). */
bool teu_proc_established(pid_t pid, unsigned long ino);

/* Its open descriptors and, among them, established TCP connections. */
void teu_proc_fds(pid_t pid, int *fds, int *tcp);

/* Its resident set (VmRSS), KiB; 0 when unknown. */
long teu_proc_rss_kb(pid_t pid);

#endif
