/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA driver API's structs as the stand-in driver (fake-cuda.c) takes
 * them and its test (test-fake-cuda.c) passes them: the driver's layouts,
 * and the parameter of the one kernel the stand-in runs. */
#ifndef TE_FAKE_CUDA_ABI_H
#define TE_FAKE_CUDA_ABI_H

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;

typedef struct CUmemLocation {
	int type; /* CU_MEM_LOCATION_TYPE_DEVICE */
	int id;
} CUmemLocation;

typedef struct CUmemAllocationProp {
	int type; /* CU_MEM_ALLOCATION_TYPE_PINNED */
	int requestedHandleTypes;
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType, gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc {
	CUmemLocation location;
	int flags;
} CUmemAccessDesc;

typedef struct CUipcMemHandle {
	char reserved[64];
} CUipcMemHandle;

/* te_gather_copy's parameter (passed by value): up to 128 pieces. */
struct te_piece {
	unsigned long long dst, src, len;
};
struct te_gather {
	unsigned long long n, chunk;
	struct te_piece p[128];
};

#endif
