/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA driver API as far as libte uses it, declared here so that nothing
 * needs the CUDA toolkit to build: the types and constants, the table of
 * driver calls, and cu_driver_open() that fills the table from libcuda.so.1
 * with dlopen(). Header-only, plain C and libc (no libte header), so that
 * tools measuring the driver (tools/gpu-copy-bench) make the very calls the
 * plugin makes.
 */
#ifndef TE_CUDA_DRIVER_H
#define TE_CUDA_DRIVER_H

#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cuda-types.h"

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


typedef struct driver {
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
} driver;

/* Where each call of the table is found. A field named twice takes the
 * first name the driver has (newer entry points first). */
static const struct cu_symbol {
	const char *name;
	size_t offset;
	bool required; /* by the plugin; a tool may require more */
} cu_symbols[] = {
#define CU_SYM(field, name, required) { name, offsetof(driver, field), required }
	CU_SYM(Init, "cuInit", true),
	CU_SYM(DeviceGetCount, "cuDeviceGetCount", true),
	CU_SYM(DeviceGet, "cuDeviceGet", true),
	CU_SYM(DeviceGetName, "cuDeviceGetName", true),
	CU_SYM(DeviceTotalMem, "cuDeviceTotalMem_v2", true),
	CU_SYM(DeviceGetPCIBusId, "cuDeviceGetPCIBusId", true),
	CU_SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", true),
	CU_SYM(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", true),
	CU_SYM(CtxSetCurrent, "cuCtxSetCurrent", true),
	CU_SYM(PointerGetAttribute, "cuPointerGetAttribute", true),
	CU_SYM(Memcpy, "cuMemcpy", true),
	CU_SYM(MemHostAlloc, "cuMemHostAlloc", true),
	CU_SYM(MemFreeHost, "cuMemFreeHost", true),
	CU_SYM(MemAlloc, "cuMemAlloc_v2", true),
	CU_SYM(MemFree, "cuMemFree_v2", true),
	CU_SYM(GetErrorString, "cuGetErrorString", false),
	CU_SYM(StreamSynchronize, "cuStreamSynchronize", true),
	CU_SYM(StreamCreate, "cuStreamCreate", false),
	CU_SYM(StreamDestroy, "cuStreamDestroy_v2", false),
	CU_SYM(MemcpyAsync, "cuMemcpyAsync", false),
	CU_SYM(MemGetHandleForAddressRange, "cuMemGetHandleForAddressRange", false),
	CU_SYM(IpcGetMemHandle, "cuIpcGetMemHandle", false),
	CU_SYM(IpcOpenMemHandle, "cuIpcOpenMemHandle_v2", false),
	CU_SYM(IpcOpenMemHandle, "cuIpcOpenMemHandle", false),
	CU_SYM(IpcCloseMemHandle, "cuIpcCloseMemHandle", false),
	CU_SYM(EventCreate, "cuEventCreate", false),
	CU_SYM(EventRecord, "cuEventRecord", false),
	CU_SYM(EventSynchronize, "cuEventSynchronize", false),
	CU_SYM(EventQuery, "cuEventQuery", false),
	CU_SYM(EventDestroy, "cuEventDestroy_v2", false),
	CU_SYM(LaunchHostFunc, "cuLaunchHostFunc", false),
	CU_SYM(StreamGetCtx, "cuStreamGetCtx", false),
	CU_SYM(CtxGetCurrent, "cuCtxGetCurrent", true),
	CU_SYM(CtxGetDevice, "cuCtxGetDevice", false),
	CU_SYM(CtxPushCurrent, "cuCtxPushCurrent_v2", true),
	CU_SYM(CtxPopCurrent, "cuCtxPopCurrent_v2", true),
	CU_SYM(ModuleLoadData, "cuModuleLoadData", false),
	CU_SYM(ModuleGetFunction, "cuModuleGetFunction", false),
	CU_SYM(ModuleUnload, "cuModuleUnload", false),
	CU_SYM(LaunchKernel, "cuLaunchKernel", false),
	CU_SYM(MemGetAllocationGranularity, "cuMemGetAllocationGranularity", false),
	CU_SYM(MemCreate, "cuMemCreate", false),
	CU_SYM(MemRelease, "cuMemRelease", false),
	CU_SYM(MemAddressReserve, "cuMemAddressReserve", false),
	CU_SYM(MemAddressFree, "cuMemAddressFree", false),
	CU_SYM(MemMap, "cuMemMap", false),
	CU_SYM(MemUnmap, "cuMemUnmap", false),
	CU_SYM(MemSetAccess, "cuMemSetAccess", false),
	CU_SYM(MemRetainAllocationHandle, "cuMemRetainAllocationHandle", false),
	CU_SYM(MemExportToShareableHandle, "cuMemExportToShareableHandle", false),
	CU_SYM(MemImportFromShareableHandle, "cuMemImportFromShareableHandle", false),
	CU_SYM(DriverGetVersion, "cuDriverGetVersion", false),
	CU_SYM(MemHostRegister, "cuMemHostRegister_v2", false),
	CU_SYM(MemHostUnregister, "cuMemHostUnregister", false),
	CU_SYM(StreamAddCallback, "cuStreamAddCallback", false),
	CU_SYM(MemGetAddressRange, "cuMemGetAddressRange_v2", false),
#undef CU_SYM
};

/* Opens the driver library `path` into `d` (zeroed first): 0; -ENODEV when
 * the library is not there, -ENOTSUP when it lacks a required call (closed
 * again); `why` says which. */
static inline int cu_driver_open_at(driver *d, const char *path, char *why, size_t why_len)
{
	memset(d, 0, sizeof *d);
	/* Never unloaded: once cuInit() ran the driver has threads and
	 * thread-local state of its own, which unloading would pull from under
	 * them (and LeakSanitizer's scan of the threads read the freed TLS). */
	d->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (d->lib == NULL) {
		snprintf(why, why_len, "the CUDA driver library %s is not installed (%s)", path, dlerror());
		return -ENODEV;
	}
	for (size_t i = 0; i < sizeof cu_symbols / sizeof cu_symbols[0]; i++) {
		const struct cu_symbol *s = &cu_symbols[i];
		void **slot = (void **)((char *)d + s->offset);
		if (*slot == NULL)
			*slot = dlsym(d->lib, s->name);
		if (*slot == NULL && s->required) {
			snprintf(why, why_len, "%s lacks %s", path, s->name);
			dlclose(d->lib);
			d->lib = NULL;
			return -ENOTSUP;
		}
	}
	return 0;
}

/* The driver as the plugin finds it: libcuda.so.1 on the loader's path. */
static inline int cu_driver_open(driver *d, char *why, size_t why_len)
{
	return cu_driver_open_at(d, "libcuda.so.1", why, why_len);
}

static inline const char *cu_errstr(const driver *d, CUresult r)
{
	const char *s = NULL;
	if (d->GetErrorString == NULL || d->GetErrorString(r, &s) != CUDA_SUCCESS || s == NULL)
		return "unknown CUDA error";
	return s;
}

#endif
