/* SPDX-License-Identifier: Apache-2.0 */
/* For the tests' own plugins: te_plugin_entry() for a plugin that claims an
 * ABI (or a magic) other than the one of the header it is built with, which
 * TE_PLUGIN_DEFINE() cannot say. Everything else is as TE_PLUGIN_DEFINE()
 * writes it. */
#ifndef TE_TEST_PLUGIN_H
#define TE_TEST_PLUGIN_H

#include <te/te-plugin.h>

#define TEST_PLUGIN_DEFINE_ABI(magic_, major_, minor_, kind_, name_, version_, description_, ops_) \
	__attribute__((visibility("default"))) const te_plugin_desc *te_plugin_entry(void);      \
	const te_plugin_desc *te_plugin_entry(void)                                              \
	{                                                                                        \
		static const te_plugin_desc desc = {                                             \
			.magic = (magic_),                                                       \
			.abi_major = (major_),                                                   \
			.abi_minor = (minor_),                                                   \
			.size = sizeof(te_plugin_desc),                                          \
			.kind = (kind_),                                                         \
			.name = (name_),                                                         \
			.version = (version_),                                                   \
			.description = (description_),                                           \
			.license = "Apache-2.0",                                                 \
			.ops = (ops_),                                                           \
		};                                                                               \
		return &desc;                                                                    \
	}

/* The usual magic and ABI major, ABI minor `minor_`: a plugin built against
 * an older header, or one from the future. */
#define TEST_PLUGIN_DEFINE_MINOR(minor_, kind_, name_, version_, description_, ops_) \
	TEST_PLUGIN_DEFINE_ABI(TE_PLUGIN_MAGIC, TE_PLUGIN_ABI_MAJOR, minor_, kind_, name_, version_, \
			       description_, ops_)

#endif
