/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A host table for plugin harnesses: logs are formatted (so a bad format
 * argument still shows) and dropped, configuration comes from a small table
 * the harness fills, and one registered region at a fixed address stands for
 * the engine's memory, so seed inputs can name addresses inside it.
 */
#ifndef TE_FUZZ_HOST_H
#define TE_FUZZ_HOST_H

#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>

#include <te/te-plugin.h>

#include "fuzz.h"

/* What a metadata plugin's get gave back: a NUL-terminated value of `len`
 * bytes when it returned 0 (freed here), none otherwise. */
static inline void fuzz_check_value(int rc, char *value, size_t len)
{
	if (rc == 0) {
		FUZZ_CHECK(value != NULL && value[len] == '\0');
		free(value);
	} else {
		FUZZ_CHECK(value == NULL);
	}
}

#define FUZZ_REGION_ADDR 0x20000000ul
#define FUZZ_REGION_SIZE 65536ul

static uint8_t *fuzz_region;
static int fuzz_pins; /* acquired and not yet released */

/* Configuration the plugin reads: name/value pairs, NULL-terminated. */
static const char *fuzz_config_table[32];

static void fuzz_log(const te_host *h, int level, const char *fmt, ...)
{
	char line[1024];
	va_list ap;

	(void)h;
	(void)level;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	if (getenv("FUZZ_VERBOSE"))
		fprintf(stderr, "log %d: %s\n", level, line);
}

static const char *fuzz_config(const te_host *h, const char *te_name, const char *mc_name)
{
	(void)h;
	(void)mc_name;
	for (int i = 0; fuzz_config_table[i] != NULL; i += 2)
		if (strcmp(fuzz_config_table[i], te_name) == 0)
			return fuzz_config_table[i + 1];
	return NULL;
}

static int fuzz_acquire(const te_host *h, uint64_t addr, uint64_t len, unsigned need, te_buffer_pin *pin)
{
	uint64_t base = (uint64_t)(uintptr_t)fuzz_region;

	(void)h;
	(void)need;
	if (addr < base || len > FUZZ_REGION_SIZE || addr - base > FUZZ_REGION_SIZE - len)
		return TE_ERR_ADDRESS;
	pin->addr = fuzz_region;
	pin->length = FUZZ_REGION_SIZE;
	pin->location = "cpu:0";
	pin->flags = TE_MEM_REMOTE_ACCESS;
	pin->priv = &fuzz_pins;
	fuzz_pins++;
	return 0;
}

static void fuzz_release(const te_host *h, te_buffer_pin *pin)
{
	(void)h;
	FUZZ_CHECK(pin->priv == &fuzz_pins && fuzz_pins > 0);
	fuzz_pins--;
}

static const char *fuzz_local_name(const te_host *h)
{
	(void)h;
	return "127.0.0.1:15000";
}

static te_host fuzz_host = {
	.size = sizeof(te_host),
	.abi_minor = TE_PLUGIN_ABI_MINOR,
	.log = fuzz_log,
	.config = fuzz_config,
	.buffer_acquire = fuzz_acquire,
	.buffer_release = fuzz_release,
	.local_name = fuzz_local_name,
	.local_address = fuzz_local_name,
};

/* The registered region, at FUZZ_REGION_ADDR when that is free (the seeds
 * name it), anywhere else otherwise. */
static inline void fuzz_region_init(void)
{
	if (fuzz_region != NULL)
		return;
	void *p = mmap((void *)FUZZ_REGION_ADDR, FUZZ_REGION_SIZE, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (p == MAP_FAILED)
		p = mmap(NULL, FUZZ_REGION_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	FUZZ_CHECK(p != MAP_FAILED);
	fuzz_region = p;
}

#endif
