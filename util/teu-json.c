/* SPDX-License-Identifier: Apache-2.0 */
#include <stdlib.h>
#include <string.h>

#include "teu-json.h"

char *teu_json_text(JsonNode *root, size_t *len)
{
	JsonGenerator *g = json_generator_new();
	gsize n = 0;

	json_generator_set_root(g, root);
	char *gtext = json_generator_to_data(g, &n);
	g_object_unref(g);
	/* GLib's memory is not promised to be malloc()'s: copy. */
	char *text = malloc(n + 1);
	if (text != NULL) {
		memcpy(text, gtext, n + 1);
		if (len != NULL)
			*len = n;
	}
	g_free(gtext);
	return text;
}

char *teu_json_finish(JsonBuilder *b, size_t *len)
{
	JsonNode *root = json_builder_get_root(b);
	char *text = root != NULL ? teu_json_text(root, len) : NULL;

	if (root != NULL)
		json_node_unref(root);
	g_object_unref(b);
	return text;
}
