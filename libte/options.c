/* SPDX-License-Identifier: Apache-2.0 */
/* The engine's options and identity, as every layer reads them
 * (options.h): below everything that takes a setting. */
#include "internal.h"

const char *te_engine_option(const te_engine *e, const char *key)
{
	return e && e->options ? g_hash_table_lookup(e->options, key) : NULL;
}

uint64_t te_engine_option_u64(const te_engine *e, const char *name, uint64_t def, uint64_t min,
			      uint64_t max)
{
	const char *v = te_engine_option(e, name);
	uint64_t n;

	if (v == NULL)
		v = te_env2(name, NULL);
	if (v == NULL)
		return def;
	if (te_parse_u64(v, &n) && n >= min && n <= max)
		return n;
	te_warn("%s=%s is not a number from %llu to %llu; using %llu", name, v, (unsigned long long)min,
		(unsigned long long)max, (unsigned long long)def);
	return def;
}

const char *te_engine_name(const te_engine *e)
{
	return e ? e->name : NULL;
}

int te_engine_rpc_port(const te_engine *e)
{
	return e ? e->rpc_port : -EINVAL;
}

const char *te_engine_address(const te_engine *e)
{
	return e ? e->address : NULL;
}
