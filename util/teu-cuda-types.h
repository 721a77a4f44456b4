/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA driver API's data types whose layout the driver fixes: plain
 * declarations with no handle types and no code, so that both the CUDA
 * plugin (teu-cuda.h) and the tests' stand-in driver, which has handle
 * types of its own, take the very same layouts.
 */
#ifndef TEU_CUDA_TYPES_H
#define TEU_CUDA_TYPES_H

typedef int CUresult; /* CUDA_SUCCESS = 0 */
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUipcMemHandle {
	char reserved[64]; /* CU_IPC_HANDLE_SIZE */
} CUipcMemHandle;
typedef struct CUmemLocation {
	int type;
	int id;
} CUmemLocation;
typedef struct CUmemAllocationProp {
	int type;
	int requestedHandleTypes;
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;
typedef struct CUmemAccessDesc {
	CUmemLocation location;
	int flags;
} CUmemAccessDesc;

#endif
