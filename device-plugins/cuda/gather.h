/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The gather kernel's parameter block (gather.cu's te_gather) and how a
 * launch is shaped, shared by the plugin (copy.c) and tools/gpu-copy-bench,
 * so that the benchmark measures the launches the plugin makes. Include
 * after cuda-driver.h.
 */
#ifndef TE_CUDA_GATHER_H
#define TE_CUDA_GATHER_H

#include <stdbool.h>
#include <stddef.h>

/* Pieces per launch: the size of the parameter block. */
#define GATHER_MAX 128

typedef struct gather_params {
	unsigned long long n, chunk;
	struct {
		unsigned long long dst, src, len;
	} p[GATHER_MAX];
} gather_params;
_Static_assert(sizeof(gather_params) == 3088, "gather.cu's te_gather layout");

/* Adds a piece (addresses as the kernel reaches them); true when the block
 * is full and must be launched before the next. */
static inline bool gather_add(gather_params *g, CUdeviceptr dst, CUdeviceptr src, size_t len)
{
	g->p[g->n].dst = dst;
	g->p[g->n].src = src;
	g->p[g->n].len = len;
	return ++g->n == GATHER_MAX;
}

/* Launches the pieces `g` holds on `s`, if any, and empties it. Block (x, y)
 * copies bytes [y*chunk, (y+1)*chunk) of piece x: blocks of 16 KiB or more,
 * at most 4096 per piece, 256 threads each. */
static inline CUresult gather_flush(const driver *d, CUfunction fn, gather_params *g, CUstream s)
{
	unsigned long long maxlen = 0;

	if (g->n == 0)
		return CUDA_SUCCESS;
	for (unsigned long long i = 0; i < g->n; i++)
		if (g->p[i].len > maxlen)
			maxlen = g->p[i].len;
	unsigned long long chunk = (maxlen + 4095) / 4096;
	chunk = chunk < 16384 ? 16384 : (chunk + 15) & ~15ull;
	g->chunk = chunk;
	void *args[] = { g };
	CUresult r = d->LaunchKernel(fn, (unsigned)g->n, (unsigned)((maxlen + chunk - 1) / chunk), 1, 256, 1, 1, 0,
				     s, args, NULL);
	g->n = 0;
	return r;
}

#endif
