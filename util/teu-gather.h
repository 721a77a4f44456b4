/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The gather kernel's parameter block (teu-gather.cu's te_gather) and how a
 * launch is shaped, shared by the CUDA plugin (cuda-copy.c) and
 * tools/gpu-copy-bench, so that the benchmark measures the launches the
 * plugin makes.
 */
#ifndef TEU_GATHER_H
#define TEU_GATHER_H

#include <stdbool.h>
#include <stddef.h>

#include "teu-cuda.h"

/* Pieces per launch: the size of the parameter block. */
#define TEU_GATHER_MAX 128

typedef struct teu_gather {
	unsigned long long n, chunk;
	struct {
		unsigned long long dst, src, len;
	} p[TEU_GATHER_MAX];
} teu_gather;
_Static_assert(sizeof(teu_gather) == 3088, "gather.cu's te_gather layout");

/* Adds a piece (addresses as the kernel reaches them); true when the block
 * is full and must be launched before the next. */
bool teu_gather_add(teu_gather *g, CUdeviceptr dst, CUdeviceptr src, size_t len);

/* Launches the pieces `g` holds on `s`, if any, and empties it. Block (x, y)
 * copies bytes [y*chunk, (y+1)*chunk) of piece x: blocks of 16 KiB or more,
 * at most 4096 per piece, 256 threads each. */
CUresult teu_gather_flush(const teu_cu_driver *d, CUfunction fn, teu_gather *g, CUstream s);

/* The kernel (teu-gather.cu, te_gather_copy) as PTX, for cuModuleLoadData. */
extern const char teu_gather_ptx[];

#endif
