/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A target engine in a process of its own, for the same-host transport's
 * tests, steered through stdin:
 *
 *   shm-peer [KIND [MIB]]  KIND: "both" (default): region A (anonymous
 *                      memory, reached by cross-memory attach), region B
 *                      (shared, from te_mem_alloc) and region C (not remote-
 *                      accessible); "shared": region B only. MIB: each
 *                      region's size (default 8).
 *
 * Prints "READY <segment name> <A> <B> <C>" (addresses in hex, 0 when
 * absent), each region filled with fill_pattern(1, 2, 3).
 * Commands, one per line:
 *   fill R SEED            fills region R (A, B, C) with fill_pattern(SEED)
 *   check R SEED OFF LEN   "OK", or "BAD <offset>" where the region differs
 *                          from fill_pattern(SEED) in [OFF, OFF+LEN)
 *   unregister R           unregisters R, then unmaps it: "UNREG"
 *   nondumpable            prctl(PR_SET_DUMPABLE, 0): "NONDUMPABLE"
 * Transports: "tcp,shm" unless TE_PEER_TRANSPORTS says otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>

#include "../common/child.h"

static size_t region_size = 8u << 20;

static unsigned char *region[3];
static bool shared[3];

int main(int argc, char **argv)
{
	const char *kind = argc > 1 ? argv[1] : "both";
	if (argc > 2) {
		unsigned long mib = strtoul(argv[2], NULL, 10);
		if (mib == 0 || mib > 4096) {
			printf("FAIL size\n");
			return 1;
		}
		region_size = (size_t)mib << 20;
	}
	te_engine *e = peer_engine("tcp,shm");
	char line[256];
	int rc;

	if (e == NULL)
		return 1;
	for (int i = 0; i < 3; i++) {
		if (strcmp(kind, "shared") == 0 && i != 1)
			continue;
		void *p;
		if (i == 1) {
			rc = te_mem_alloc(region_size, &p);
			shared[i] = true;
		} else {
			p = mmap(NULL, region_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			rc = p == MAP_FAILED ? -1 : 0;
		}
		if (rc < 0) {
			printf("FAIL memory\n");
			return 1;
		}
		region[i] = p;
		fill_pattern(region[i], region_size, (unsigned)i + 1);
		rc = te_register_memory(e, p, region_size, "cpu:0", i == 2 ? 0 : TE_MEM_REMOTE_ACCESS);
		if (rc < 0) {
			printf("FAIL register: %s\n", te_strerror(rc));
			return 1;
		}
	}
	printf("READY %s %llx %llx %llx\n", te_engine_name(e), (unsigned long long)(uintptr_t)region[0],
	       (unsigned long long)(uintptr_t)region[1], (unsigned long long)(uintptr_t)region[2]);
	while (fgets(line, sizeof line, stdin) != NULL) {
		char r = 0;
		unsigned seed = 0;
		unsigned long long off = 0, len = 0;
		int idx = -1;
		if (sscanf(line, "%*s %c", &r) == 1 && r >= 'A' && r <= 'C')
			idx = r - 'A';
		if (strncmp(line, "fill ", 5) == 0 && idx >= 0 && region[idx] &&
		    sscanf(line, "fill %c %u", &r, &seed) == 2) {
			fill_pattern(region[idx], region_size, seed);
			printf("FILLED\n");
		} else if (strncmp(line, "check ", 6) == 0 && idx >= 0 && region[idx] &&
			   sscanf(line, "check %c %u %llu %llu", &r, &seed, &off, &len) == 4 && off + len <= region_size) {
			unsigned char *want = malloc(region_size);
			fill_pattern(want, region_size, seed);
			unsigned long long bad = off;
			while (bad < off + len && want[bad] == region[idx][bad])
				bad++;
			if (bad == off + len)
				printf("OK\n");
			else
				printf("BAD %llu\n", bad);
			free(want);
		} else if (strncmp(line, "unregister ", 11) == 0 && idx >= 0 && region[idx]) {
			rc = te_unregister_memory(e, region[idx]);
			/* Gone for good: a copy that still touched it would fault. */
			if (shared[idx])
				te_mem_free(region[idx]);
			else
				munmap(region[idx], region_size);
			region[idx] = NULL;
			printf("UNREG %d\n", rc);
		} else if (strncmp(line, "nondumpable", 11) == 0) {
			prctl(PR_SET_DUMPABLE, 0);
			printf("NONDUMPABLE\n");
		} else {
			printf("? %s", line);
		}
	}
	te_engine_destroy(e);
	return 0;
}
