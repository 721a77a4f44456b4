/* SPDX-License-Identifier: Apache-2.0 */
/* Gather copy: many device-to-device pieces in one launch. Block (x, y)
 * copies bytes [y*chunk, (y+1)*chunk) of piece x. The layout of te_gather
 * is teu_gather's (teu-gather.h): change both together. */
struct te_piece {
	unsigned long long dst, src, len;
};
struct te_gather {
	unsigned long long n, chunk;
	te_piece p[128];
};

extern "C" __global__ void __launch_bounds__(256) te_gather_copy(const __grid_constant__ te_gather g)
{
	unsigned i = blockIdx.x;
	if (i >= g.n)
		return;
	unsigned long long len = g.p[i].len;
	unsigned long long beg = (unsigned long long)blockIdx.y * g.chunk;
	if (beg >= len)
		return;
	unsigned long long end = beg + g.chunk < len ? beg + g.chunk : len;
	char *d = (char *)g.p[i].dst;
	const char *s = (const char *)g.p[i].src;
	if (((g.p[i].dst | g.p[i].src) & 15) == 0) {
		unsigned long long nv = (end - beg) / 16;
		uint4 *dv = (uint4 *)(d + beg);
		const uint4 *sv = (const uint4 *)(s + beg);
		unsigned long long k = threadIdx.x;
		for (; k + 3 * blockDim.x < nv; k += 4 * blockDim.x) {
			uint4 a = sv[k], b = sv[k + blockDim.x], c = sv[k + 2 * blockDim.x],
			      e = sv[k + 3 * blockDim.x];
			dv[k] = a;
			dv[k + blockDim.x] = b;
			dv[k + 2 * blockDim.x] = c;
			dv[k + 3 * blockDim.x] = e;
		}
		for (; k < nv; k += blockDim.x)
			dv[k] = sv[k];
		beg += nv * 16;
	}
	for (unsigned long long k = beg + threadIdx.x; k < end; k += blockDim.x)
		d[k] = s[k];
}
