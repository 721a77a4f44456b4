/* SPDX-License-Identifier: Apache-2.0 */
/* Mooncake's local memory registration over te_register_memory*. */
#include "mc-internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

/* ------------------------------------------------------------ local memory */

MC_API int registerLocalMemory(transfer_engine_t engine, void *addr, size_t length,
			       const char *location, int remote_accessible)
{
	static const char fn[] = "registerLocalMemory";
	struct mc_engine *e = engine_checked(fn, engine, addr == NULL || length == 0,
					     addr == NULL ? "NULL address" : "zero length");
	int rc;

	if (e == NULL)
		return ERR_INVALID_ARGUMENT;
	rc = te_register_memory(e->te, addr, length, location != NULL ? location : "*",
				remote_accessible ? TE_MEM_REMOTE_ACCESS : 0);
	if (rc < 0)
		mc_err("%s: %p+%zu: %s", fn, addr, length, te_strerror(rc));
	return to_err(fn, rc);
}

/* Unregistering what is not registered is "not registered" in Mooncake;
 * libte says -ENOENT, which elsewhere means an unknown name. */
static int unregister_err(const char *fn, int rc)
{
	return rc == -ENOENT ? ERR_ADDRESS_NOT_REGISTERED : to_err(fn, rc);
}

MC_API int unregisterLocalMemory(transfer_engine_t engine, void *addr)
{
	static const char fn[] = "unregisterLocalMemory";
	struct mc_engine *e = engine_checked(fn, engine, addr == NULL, "NULL address");
	int rc;

	if (e == NULL)
		return ERR_INVALID_ARGUMENT;
	rc = te_unregister_memory(e->te, addr);
	if (rc < 0)
		mc_err("%s: %p: %s", fn, addr, te_strerror(rc));
	return unregister_err(fn, rc);
}

/* The engine of a batch call, in *e, and its list of `len` entries: 1 to
 * go on, 0 when the list is empty (nothing to do), ERR_INVALID_ARGUMENT
 * (logged) for a refused engine or entries promised with no list. */
static int engine_and_list(const char *fn, transfer_engine_t engine, const void *list, size_t len,
			   const char *what, struct mc_engine **e)
{
	*e = engine_of(fn, engine);
	if (*e == NULL)
		return ERR_INVALID_ARGUMENT;
	if (len == 0)
		return 0;
	if (list == NULL) {
		mc_err("%s: NULL %s list of %zu entries", fn, what, len);
		return ERR_INVALID_ARGUMENT;
	}
	return 1;
}

MC_API int registerLocalMemoryBatch(transfer_engine_t engine, buffer_entry_t *buffer_list,
				    size_t buffer_len, const char *location)
{
	static const char fn[] = "registerLocalMemoryBatch";
	struct mc_engine *e;
	te_memory_region *regs;
	int rc;

	rc = engine_and_list(fn, engine, buffer_list, buffer_len, "buffer", &e);
	if (rc <= 0)
		return rc;
	if (buffer_len > SIZE_MAX / sizeof *regs) {
		mc_err("%s: %zu entries is too many", fn, buffer_len);
		return ERR_INVALID_ARGUMENT;
	}
	regs = malloc(buffer_len * sizeof *regs);
	if (regs == NULL) {
		mc_err("%s: out of memory for %zu entries", fn, buffer_len);
		return ERR_MEMORY;
	}
	for (size_t i = 0; i < buffer_len; i++) {
		if (buffer_list[i].addr == NULL || buffer_list[i].length == 0) {
			mc_err("%s: entry %zu has a %s", fn, i,
			       buffer_list[i].addr == NULL ? "NULL address" : "zero length");
			free(regs);
			return ERR_INVALID_ARGUMENT;
		}
		regs[i] = (te_memory_region){ buffer_list[i].addr, buffer_list[i].length,
					      location != NULL ? location : "*",
					      TE_MEM_REMOTE_ACCESS };
	}
	rc = te_register_memory_batch(e->te, regs, buffer_len);
	free(regs);
	if (rc < 0)
		mc_err("%s: %zu entries: %s", fn, buffer_len, te_strerror(rc));
	return to_err(fn, rc);
}

MC_API int unregisterLocalMemoryBatch(transfer_engine_t engine, void **addr_list, size_t addr_len)
{
	static const char fn[] = "unregisterLocalMemoryBatch";
	struct mc_engine *e;
	int rc;

	rc = engine_and_list(fn, engine, addr_list, addr_len, "address", &e);
	if (rc <= 0)
		return rc;
	rc = te_unregister_memory_batch(e->te, (void *const *)addr_list, addr_len);
	if (rc < 0)
		mc_err("%s: %zu entries: %s", fn, addr_len, te_strerror(rc));
	return unregister_err(fn, rc);
}
