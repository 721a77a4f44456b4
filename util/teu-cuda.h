/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA driver API as far as libte uses it, declared here so that nothing
 * needs the CUDA toolkit to build: the types and constants, the table of
 * driver calls, and teu_cu_open() that fills the table from libcuda.so.1
 * with dlopen(). Plain C and libc (no libte header), so that tools
 * measuring the driver (tools/gpu-copy-bench) and the stand-in driver's test
 * make the very calls the CUDA plugin makes.
 */
#ifndef TEU_CUDA_H
#define TEU_CUDA_H

#include <stddef.h>

#include "teu-cuda-types.h"

typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUmodule;
typedef void *CUfunction;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_NOT_READY = 600,
	CU_EVENT_BLOCKING_SYNC = 1,
	CU_EVENT_DISABLE_TIMING = 2,
	CU_MEM_ALLOCATION_TYPE_PINNED = 1,
	CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
	CU_MEM_LOCATION_TYPE_DEVICE = 1,
	CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
	CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
	CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
	CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
	CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
	CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
	CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
	CU_MEMORYTYPE_HOST = 1,
	CU_MEMORYTYPE_DEVICE = 2,
	CU_MEMHOSTALLOC_PORTABLE = 1,
	CU_MEMHOSTALLOC_DEVICEMAP = 2,
	CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1,
	CU_STREAM_NON_BLOCKING = 1,
	CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1,
};


typedef struct teu_cu_driver {
	void *lib;
	CUresult (*Init)(unsigned);
	CUresult (*DeviceGetCount)(int *);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*DeviceGetName)(char *, int, CUdevice);
	CUresult (*DeviceTotalMem)(size_t *, CUdevice);
	CUresult (*DeviceGetPCIBusId)(char *, int, CUdevice);
	CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*DevicePrimaryCtxRelease)(CUdevice);
	CUresult (*CtxSetCurrent)(CUcontext);
	/* The caller's current context, kept across the plugin's calls. */
	CUresult (*CtxGetCurrent)(CUcontext *);
	CUresult (*CtxPushCurrent)(CUcontext);
	CUresult (*CtxPopCurrent)(CUcontext *);
	CUresult (*PointerGetAttribute)(void *, int, CUdeviceptr);
	CUresult (*Memcpy)(CUdeviceptr, CUdeviceptr, size_t);
	CUresult (*MemHostAlloc)(void **, size_t, unsigned);
	CUresult (*MemFreeHost)(void *);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemFree)(CUdeviceptr);
	CUresult (*GetErrorString)(CUresult, const char **);
	CUresult (*StreamSynchronize)(CUstream);
	/* Optional: without them copies are synchronous only. */
	CUresult (*StreamCreate)(CUstream *, unsigned);
	CUresult (*StreamDestroy)(CUstream);
	CUresult (*MemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
	/* Optional (CUDA 11.7 and later drivers). */
	CUresult (*MemGetHandleForAddressRange)(void *, CUdeviceptr, size_t, int, unsigned long long);
	/* Optional: sharing cuMemAlloc memory with other processes. */
	CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
	CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned);
	CUresult (*IpcCloseMemHandle)(CUdeviceptr);
	/* Optional: copies reported by events (without them, stream callbacks). */
	CUresult (*EventCreate)(CUevent *, unsigned);
	CUresult (*EventRecord)(CUevent, CUstream);
	CUresult (*EventSynchronize)(CUevent);
	CUresult (*EventQuery)(CUevent);
	CUresult (*EventDestroy)(CUevent);
	/* Optional: host work in a stream's order (te_submit_on_stream), in
	 * the stream's own context, the caller's put back after. */
	CUresult (*LaunchHostFunc)(CUstream, void (*)(void *), void *);
	CUresult (*StreamGetCtx)(CUstream, CUcontext *);
	CUresult (*CtxGetDevice)(CUdevice *);
	/* Optional: the gather-copy kernel for device-to-device batches. */
	CUresult (*ModuleLoadData)(CUmodule *, const void *);
	CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
	CUresult (*ModuleUnload)(CUmodule);
	CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
				 unsigned, CUstream, void **, void **);
	/* Optional: memory of the virtual memory API (cuMemCreate). */
	CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
	CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
			      unsigned long long);
	CUresult (*MemRelease)(CUmemGenericAllocationHandle);
	CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	CUresult (*MemAddressFree)(CUdeviceptr, size_t);
	CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
	CUresult (*MemUnmap)(CUdeviceptr, size_t);
	CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
	CUresult (*MemRetainAllocationHandle)(CUmemGenericAllocationHandle *, void *);
	CUresult (*MemExportToShareableHandle)(void *, CUmemGenericAllocationHandle, int,
					       unsigned long long);
	CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *, int);
	/* Optional: for messages only. */
	CUresult (*DriverGetVersion)(int *);
	/* Not used by the plugin: for tools and the stand-in driver's test. */
	CUresult (*MemHostRegister)(void *, size_t, unsigned);
	CUresult (*MemHostUnregister)(void *);
	CUresult (*StreamAddCallback)(CUstream, void (*)(CUstream, CUresult, void *), void *, unsigned);
	CUresult (*MemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
} teu_cu_driver;

/* Opens the driver library `path` into `d` (zeroed first): 0; -ENODEV when
 * the library is not there, -ENOTSUP when it lacks a required call (closed
 * again); `why` says which. */
int teu_cu_open_at(teu_cu_driver *d, const char *path, char *why, size_t why_len);

/* The driver as the plugin finds it: libcuda.so.1 on the loader's path. */
int teu_cu_open(teu_cu_driver *d, char *why, size_t why_len);

/* The driver's text for `r`, or "unknown CUDA error". */
const char *teu_cu_errstr(const teu_cu_driver *d, CUresult r);

#endif
