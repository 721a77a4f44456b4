/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te_mem_alloc(): memory other processes on this host can map. Each
 * allocation is a memfd mapped shared; libte keeps the memfd so that a
 * same-host transport can hand it to a peer, which then maps exactly that
 * allocation (and nothing else of this process) and copies with memcpy.
 */
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

typedef struct shm_alloc {
	void *addr;
	size_t size;
	int fd;
} shm_alloc;

static GMutex allocs_lock;
static GArray *allocs; /* shm_alloc, in no order: allocations are few */

int te_mem_alloc(size_t length, void **addr)
{
	long page = sysconf(_SC_PAGESIZE);
	shm_alloc a;

	if (addr == NULL) {
		te_err("te_mem_alloc: NULL output pointer");
		return -EINVAL;
	}
	*addr = NULL;
	if (length == 0 || length > SIZE_MAX - (size_t)page) {
		te_err("te_mem_alloc: length %zu is 0 or too large", length);
		return -EINVAL;
	}
	a.size = (length + (size_t)page - 1) / (size_t)page * (size_t)page;
	a.fd = memfd_create("libte", MFD_CLOEXEC);
	if (a.fd < 0) {
		int rc = -errno;
		te_err("te_mem_alloc: memfd_create: %s", g_strerror(errno));
		return rc;
	}
	if (ftruncate(a.fd, (off_t)a.size) < 0) {
		int rc = -errno;
		te_err("te_mem_alloc: cannot size a %zu-byte memfd: %s", a.size, g_strerror(errno));
		close(a.fd);
		return rc;
	}
	a.addr = mmap(NULL, a.size, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, 0);
	if (a.addr == MAP_FAILED) {
		int rc = -errno;
		te_err("te_mem_alloc: cannot map %zu bytes: %s", a.size, g_strerror(errno));
		close(a.fd);
		return rc;
	}
	g_mutex_lock(&allocs_lock);
	if (allocs == NULL)
		allocs = g_array_new(FALSE, FALSE, sizeof(shm_alloc));
	g_array_append_val(allocs, a);
	g_mutex_unlock(&allocs_lock);
	*addr = a.addr;
	return 0;
}

int te_mem_free(void *addr)
{
	shm_alloc a = { 0 };
	bool found = false;

	if (addr == NULL)
		return 0;
	g_mutex_lock(&allocs_lock);
	for (guint i = 0; allocs != NULL && i < allocs->len; i++) {
		if (g_array_index(allocs, shm_alloc, i).addr == addr) {
			a = g_array_index(allocs, shm_alloc, i);
			g_array_remove_index_fast(allocs, i);
			found = true;
			break;
		}
	}
	g_mutex_unlock(&allocs_lock);
	if (!found) {
		te_err("te_mem_free: %p is not an address te_mem_alloc() returned", addr);
		return -EINVAL;
	}
	munmap(a.addr, a.size);
	close(a.fd);
	return 0;
}

int te_shmem_lookup(uint64_t addr, uint64_t len, int *fd, uint64_t *offset, uint64_t *size, uint64_t *base)
{
	int rc = -ENOENT;

	g_mutex_lock(&allocs_lock);
	for (guint i = 0; allocs != NULL && i < allocs->len; i++) {
		const shm_alloc *a = &g_array_index(allocs, shm_alloc, i);
		uint64_t b = (uintptr_t)a->addr;
		if (addr >= b && addr - b <= a->size && len <= a->size - (addr - b)) {
			*fd = a->fd;
			*offset = addr - b;
			*size = a->size;
			*base = b;
			rc = 0;
			break;
		}
	}
	g_mutex_unlock(&allocs_lock);
	return rc;
}
