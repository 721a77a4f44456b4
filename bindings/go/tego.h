/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Small C shims for the Go package. Addresses cross the boundary as
 * uintptr_t: the memory they name is never Go's (see memory.go), and keeping
 * them integers on the Go side avoids uintptr-to-pointer conversions there.
 */
#ifndef TE_GO_SHIM_H
#define TE_GO_SHIM_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <te/te.h>

static inline int tego_register(te_engine *e, uintptr_t addr, size_t len, const char *loc,
				unsigned flags)
{
	return te_register_memory(e, (void *)addr, len, loc, flags);
}

static inline int tego_unregister(te_engine *e, uintptr_t addr)
{
	return te_unregister_memory(e, (void *)addr);
}

static inline int tego_mem_free(uintptr_t addr)
{
	return te_mem_free((void *)addr);
}

/* te_request with the local address as an integer; same fields, same order. */
typedef struct tego_request {
	uint32_t opcode;
	int32_t segment;
	uintptr_t local;
	uint64_t remote;
	uint64_t length;
} tego_request;

/* Copies the requests into te_request form (on the stack for small batches)
 * and submits them with `deadline_ns` (0: the batch's). */
static inline int tego_submit(te_engine *e, te_batch_id b, const tego_request *in, size_t n,
			      int64_t deadline_ns)
{
	te_request small[32];
	te_request *r = small;
	if (n > sizeof small / sizeof small[0]) {
		r = malloc(n * sizeof *r);
		if (r == NULL)
			return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		r[i].opcode = in[i].opcode;
		r[i].segment = in[i].segment;
		r[i].local = (void *)in[i].local;
		r[i].remote = in[i].remote;
		r[i].length = in[i].length;
	}
	int rc = te_submit_by(e, b, r, n, deadline_ns);
	if (r != small)
		free(r);
	return rc;
}

#endif
