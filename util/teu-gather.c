/* SPDX-License-Identifier: Apache-2.0 */
#include "teu-gather.h"

#include "teu-gather-ptx.h"

/* Adds a piece (addresses as the kernel reaches them); true when the block
 * is full and must be launched before the next. */
bool teu_gather_add(teu_gather *g, CUdeviceptr dst, CUdeviceptr src, size_t len)
{
	g->p[g->n].dst = dst;
	g->p[g->n].src = src;
	g->p[g->n].len = len;
	return ++g->n == TEU_GATHER_MAX;
}

/* Launches the pieces `g` holds on `s`, if any, and empties it. Block (x, y)
 * copies bytes [y*chunk, (y+1)*chunk) of piece x: blocks of 16 KiB or more,
 * at most 4096 per piece, 256 threads each. */
CUresult teu_gather_flush(const teu_cu_driver *d, CUfunction fn, teu_gather *g, CUstream s)
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
