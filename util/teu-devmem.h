/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The steps the device plugins (CUDA, HIP) take alike when they hand device
 * memory to others: a dma-buf or an IPC handle covers a whole allocation, so
 * the range asked for is placed in the allocation holding it, and the handle
 * travels in a te_device_ipc (te-plugin.h) that the other process opens on
 * the device of the same index, or on device 0.
 */
#ifndef TEU_DEVMEM_H
#define TEU_DEVMEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <te/te-plugin.h>

/* Whether [addr, addr+len) lies within the allocation [start, start+size);
 * then *offset is where it starts in it. Without overflow for any values. */
bool teu_range_in(uintptr_t addr, size_t len, uintptr_t start, size_t size, uint64_t *offset);

/* classify's check of a range of device memory against the allocation
 * [start, start+size) the driver says holds `addr`: 0 when it lies within,
 * else -EINVAL and an error logged through `h` (the range runs past it). */
int teu_range_check(const te_host *h, const void *addr, size_t len, uintptr_t start, size_t size);

/* Fills `ipc` with the export of the allocation [start, start+size) of
 * device `dev`: the `len` bytes of `handle` (at most sizeof ipc->handle) and
 * the descriptor `fd` that goes with it (-1 for none). */
void teu_ipc_fill(te_device_ipc *ipc, const void *handle, size_t len, int dev, int fd, uint64_t start,
		  uint64_t size);

/* The handle of `ipc` copied to `out` (`len` bytes): 0, or -EINVAL when the
 * handle is not of that length (another vendor's, or damaged). */
int teu_ipc_handle(const te_device_ipc *ipc, void *out, size_t len);

/* The device to open `ipc` on, of the `ndev` here: the same index, or 0
 * when there is no such device. */
int teu_ipc_device(const te_device_ipc *ipc, int ndev);

#endif
