/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te_json_check() against the parser behind it: whatever the check passes,
 * json-glib must parse into the same document. Its objects hold as many
 * members as the text wrote (a repeated key, however spelled, would be
 * merged into one), and none of its numbers is infinite or NaN. The input
 * is the JSON text itself, checked with the default limits.
 */
#include <json-glib/json-glib.h>
#include <math.h>
#include <te/te-json.h>

#include "fuzz.h"

/* Members written in a text the check passed: the colons outside strings. */
static size_t text_members(const char *s, size_t n)
{
	size_t members = 0;
	int in_string = 0;

	for (size_t i = 0; i < n; i++) {
		if (in_string) {
			if (s[i] == '\\')
				i++;
			else if (s[i] == '"')
				in_string = 0;
		} else if (s[i] == '"') {
			in_string = 1;
		} else if (s[i] == ':') {
			members++;
		}
	}
	return members;
}

/* Members of the parsed tree; its depth is the check's, at most 64. */
static size_t tree_members(JsonNode *node)
{
	size_t members = 0;

	switch (JSON_NODE_TYPE(node)) {
	case JSON_NODE_OBJECT: {
		JsonObject *o = json_node_get_object(node);
		GList *values = json_object_get_values(o);
		for (GList *l = values; l != NULL; l = l->next)
			members += 1 + tree_members(l->data);
		g_list_free(values);
		break;
	}
	case JSON_NODE_ARRAY: {
		JsonArray *a = json_node_get_array(node);
		for (guint i = 0; i < json_array_get_length(a); i++)
			members += tree_members(json_array_get_element(a, i));
		break;
	}
	case JSON_NODE_VALUE:
		if (json_node_get_value_type(node) == G_TYPE_DOUBLE)
			FUZZ_CHECK(isfinite(json_node_get_double(node)));
		break;
	case JSON_NODE_NULL:
		break;
	}
	return members;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = fuzz_str(data, size), why[160];
	int rc = te_json_check(text, size, NULL, why, sizeof why);

	FUZZ_CHECK(rc == 0 || rc == -EINVAL || rc == -E2BIG || rc == -ERANGE || rc == -EEXIST);
	FUZZ_CHECK(rc == 0 || why[0] != '\0');
	if (rc == 0) {
		JsonParser *p = json_parser_new_immutable();
		GError *err = NULL;
		gboolean ok = json_parser_load_from_data(p, text, (gssize)size, &err);
		if (!ok)
			fprintf(stderr, "passed the check, refused by json-glib: %s\n", err->message);
		FUZZ_CHECK(ok);
		JsonNode *root = json_parser_get_root(p);
		FUZZ_CHECK(root != NULL);
		FUZZ_CHECK(tree_members(root) == text_members(text, size));
		g_object_unref(p);
	}
	free(text);
	return 0;
}
