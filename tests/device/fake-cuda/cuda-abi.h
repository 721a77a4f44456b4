/* SPDX-License-Identifier: Apache-2.0 */
/* What the stand-in driver (fake-cuda.c) and its test (test-fake-cuda.c)
 * share: the driver's data layouts, the very declarations the CUDA plugin
 * takes (util/teu-cuda-types.h), and the parameter of the one
 * kernel the stand-in runs. */
#ifndef TE_FAKE_CUDA_ABI_H
#define TE_FAKE_CUDA_ABI_H

#include "teu-cuda-types.h"

/* te_gather_copy's parameter (passed by value): up to 128 pieces. */
struct te_piece {
	unsigned long long dst, src, len;
};
struct te_gather {
	unsigned long long n, chunk;
	struct te_piece p[128];
};

#endif
