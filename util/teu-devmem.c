/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <string.h>

#include "teu-devmem.h"
#include "teu-search.h"

bool teu_range_in(uintptr_t addr, size_t len, uintptr_t start, size_t size, uint64_t *offset)
{
	if (!teu_span_within(addr, len, start, size))
		return false;
	*offset = (uint64_t)(addr - start);
	return true;
}

int teu_range_check(const te_host *h, const void *addr, size_t len, uintptr_t start, size_t size)
{
	uint64_t off;

	if (teu_range_in((uintptr_t)addr, len, start, size, &off))
		return 0;
	h->log(h, TE_LOG_ERROR, "%p+%zu runs past its device allocation (%zu bytes at %#lx)", addr, len, size,
	       (unsigned long)start);
	return -EINVAL;
}

void teu_ipc_fill(te_device_ipc *ipc, const void *handle, size_t len, int dev, int fd, uint64_t start,
		  uint64_t size)
{
	memcpy(ipc->handle, handle, len);
	ipc->handle_len = (uint32_t)len;
	ipc->device = dev;
	ipc->fd = fd;
	ipc->alloc_base = start;
	ipc->alloc_size = size;
}

int teu_ipc_handle(const te_device_ipc *ipc, void *out, size_t len)
{
	if (ipc->handle_len != len)
		return -EINVAL;
	memcpy(out, ipc->handle, len);
	return 0;
}

int teu_ipc_device(const te_device_ipc *ipc, int ndev)
{
	return ipc->device >= 0 && ipc->device < ndev ? ipc->device : 0;
}
