/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A target engine in a process of its own whose memory is the test device's
 * (testdev:0), for the same-host transport's device memory tests, steered
 * through stdin:
 *
 * Prints "READY <segment name> <A>": region A, REGION bytes of device memory,
 * registered with "*" and remote access, filled with fill_pattern(1).
 * Commands, one per line (R: A, or B once registered):
 *   register B             allocates and registers region B: "REGISTERED <B>"
 *   fill R SEED            fills R with fill_pattern(SEED): "FILLED"
 *   check R SEED OFF LEN   "OK", or "BAD <offset>" where R differs from
 *                          fill_pattern(SEED) in [OFF, OFF+LEN)
 * Its bytes are read and written through the device plugin only.
 * Transports: "shm" unless TE_PEER_TRANSPORTS says otherwise.
 * TE_PEER_MEMORY=host makes its regions host memory (malloc: the same-host
 * transport reaches it by cross-memory attach), =shared host memory from
 * te_mem_alloc() (reached through a shared mapping).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/child.h"

#define REGION (12u << 20)

static void *region[2];

static void *new_region(te_engine *e, unsigned seed)
{
	void *p = NULL;
	unsigned char *h = malloc(REGION);
	const char *mem = getenv("TE_PEER_MEMORY");
	int rc = h == NULL ? -ENOMEM
	       : mem == NULL ? te_device_alloc("testdev:0", REGION, &p)
	       : strcmp(mem, "shared") == 0 ? te_mem_alloc(REGION, &p)
	       : (p = malloc(REGION)) == NULL ? -ENOMEM : 0;
	if (rc == 0) {
		fill_pattern(h, REGION, seed);
		rc = te_device_copy(p, h, REGION);
	}
	if (rc == 0)
		rc = te_register_memory(e, p, REGION, "*", TE_MEM_REMOTE_ACCESS);
	free(h);
	if (rc < 0) {
		printf("FAIL region: %s\n", te_strerror(rc));
		return NULL;
	}
	return p;
}

/* The first offset in [off, off+len) where R differs from the pattern, or
 * off+len. */
static unsigned long long first_bad(const void *r, unsigned seed, unsigned long long off,
				    unsigned long long len)
{
	unsigned char *got = malloc(REGION), *want = malloc(REGION);
	unsigned long long bad = off;

	if (got == NULL || want == NULL || te_device_copy(got, r, REGION) != 0) {
		bad = off + len + 1;
	} else {
		fill_pattern(want, REGION, seed);
		while (bad < off + len && want[bad] == got[bad])
			bad++;
	}
	free(got);
	free(want);
	return bad;
}

int main(void)
{
	te_engine *e = peer_engine("shm");
	char line[256];
	int rc;

	if (e == NULL)
		return 1;
	region[0] = new_region(e, 1);
	if (region[0] == NULL)
		return 1;
	printf("READY %s %llx\n", te_engine_name(e), (unsigned long long)(uintptr_t)region[0]);
	while (fgets(line, sizeof line, stdin) != NULL) {
		char r = 0;
		unsigned seed = 0;
		unsigned long long off = 0, len = 0;
		int idx = -1;
		if (sscanf(line, "%*s %c", &r) == 1 && (r == 'A' || r == 'B'))
			idx = r - 'A';
		if (strncmp(line, "register B", 10) == 0 && region[1] == NULL) {
			region[1] = new_region(e, 2);
			printf("REGISTERED %llx\n", (unsigned long long)(uintptr_t)region[1]);
		} else if (strncmp(line, "fill ", 5) == 0 && idx >= 0 && region[idx] &&
			   sscanf(line, "fill %c %u", &r, &seed) == 2) {
			unsigned char *h = malloc(REGION);
			fill_pattern(h, REGION, seed);
			rc = te_device_copy(region[idx], h, REGION);
			free(h);
			printf(rc == 0 ? "FILLED\n" : "FAIL fill\n");
		} else if (strncmp(line, "check ", 6) == 0 && idx >= 0 && region[idx] &&
			   sscanf(line, "check %c %u %llu %llu", &r, &seed, &off, &len) == 4 &&
			   off <= REGION && len <= REGION - off) {
			unsigned long long bad = first_bad(region[idx], seed, off, len);
			if (bad == off + len)
				printf("OK\n");
			else
				printf("BAD %llu\n", bad);
		} else {
			printf("? %s", line);
		}
	}
	te_engine_destroy(e);
	return 0;
}
