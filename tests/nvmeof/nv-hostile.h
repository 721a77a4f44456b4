/* SPDX-License-Identifier: Apache-2.0 */
/* Hostile descriptors that every reader of NVMe-oF descriptors refuses (the
 * plugin's segment open, te-nvmeof-register), each with the words its
 * refusal must hold. */
#ifndef TE_NV_HOSTILE_H
#define TE_NV_HOSTILE_H

#include <stdbool.h>

#include <glib.h>

#include "../common/hostile.h"

/* A valid descriptor whose buffer object carries `field` ("name":value) in
 * place of its own member of that name. */
static inline char *nv_buffer_with(const char *field)
{
	bool path = strncmp(field, "\"file_path\"", 11) == 0, len = strncmp(field, "\"length\"", 8) == 0;
	return g_strdup_printf("{\"buffers\":[{%s%s%s}],\"protocol\":\"nvmeof\",\"server_name\":\"s\"}",
			       path ? "" : "\"file_path\":\"/f\",", len ? "" : "\"length\":4096,", field);
}

/* The i-th hostile descriptor (free() or g_free()), its name in *what and the reason a
 * refusal gives in *why; NULL past the last. */
static inline char *nv_hostile(size_t i, const char **what, const char **why)
{
	/* pre + n × open + mid + n × close + post, as hostile_nest() */
	static const struct {
		const char *what, *pre, *open;
		size_t n;
		const char *mid, *close, *post;
	} deep[] = {
		{ "deep arrays", "{\"buffers\":", "[", 100000, "", "]", ",\"protocol\":\"nvmeof\"}" },
		{ "deep objects", "{\"protocol\":\"nvmeof\",\"x\":", "{\"a\":", 100000, "1", "}", "}" },
		/* where a string belongs: the path, a map entry, the server name */
		{ "deep path", "{\"buffers\":[{\"length\":4096,\"file_path\":", "[", 100000, "\"/f\"", "]",
		  "}],\"protocol\":\"nvmeof\"}" },
		{ "deep map entry", "{\"buffers\":[{\"length\":4096,\"file_path\":\"/f\",\"local_path_map\":{\"nodeA\":",
		  "{\"a\":", 100000, "\"/f\"", "}", "}}],\"protocol\":\"nvmeof\"}" },
		{ "deep server name", "{\"protocol\":\"nvmeof\",\"server_name\":", "{\"a\":", 100000, "\"s\"", "}", "}" },
		/* just past the limit: 9 levels */
		{ "nine levels", "{\"protocol\":\"nvmeof\",\"x\":", "[", 8, "1", "]", "}" },
	};
	const size_t ndeep = sizeof deep / sizeof deep[0];

	if (i < ndeep) {
		*what = deep[i].what;
		*why = "nested deeper than 8 levels";
		return hostile_nest(deep[i].pre, deep[i].open, deep[i].n, deep[i].mid, deep[i].close,
				    deep[i].post);
	}
	switch (i - ndeep) {
	case 0:
		*what = "million elements";
		*why = "array with more than 16384 elements";
		return hostile_array("{\"protocol\":\"nvmeof\",\"buffers\":", 1000000, "0", "}");
	case 1: {
		/* a path of 1 MiB less one byte */
		char *field = hostile_nest("\"file_path\":\"/", "a", (1u << 20) - 1, "", "", "\"");
		char *t = nv_buffer_with(field);
		free(field);
		*what = "huge path";
		*why = "string at byte 39 longer than 16384 bytes";
		return t;
	}
	case 2:
		/* 9 MiB of blanks inside the object */
		*what = "huge text";
		*why = "text of 9437204 bytes over the limit of 8388608";
		return hostile_nest("{\"protocol\":\"nvmeof\"", " ", (9u << 20) - 1, "", "", "}");
	default:
		return NULL;
	}
}

#endif
