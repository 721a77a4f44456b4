/* SPDX-License-Identifier: Apache-2.0 */
#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "teu-cuda.h"

/* Where each call of the table is found. A field named twice takes the
 * first name the driver has (newer entry points first). */
static const struct cu_symbol {
	const char *name;
	size_t offset;
	bool required; /* by the plugin; a tool may require more */
} cu_symbols[] = {
#define CU_SYM(field, name, required) { name, offsetof(teu_cu_driver, field), required }
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
int teu_cu_open_at(teu_cu_driver *d, const char *path, char *why, size_t why_len)
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
int teu_cu_open(teu_cu_driver *d, char *why, size_t why_len)
{
	return teu_cu_open_at(d, "libcuda.so.1", why, why_len);
}

const char *teu_cu_errstr(const teu_cu_driver *d, CUresult r)
{
	const char *s = NULL;
	if (d->GetErrorString == NULL || d->GetErrorString(r, &s) != CUDA_SUCCESS || s == NULL)
		return "unknown CUDA error";
	return s;
}
