/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The RDMA priority matrix, from the two places it comes from:
 *  - the transport's install arguments (rd_parse_args() of config.c, with
 *    rdma-plugin.c compiled in: a matrix object, a list of devices, or an object of
 *    options with the matrix inside, possibly as a JSON string), then
 *    rd_topo_from_matrix() against the two-socket sysfs fixture;
 *  - a peer's descriptor ("priority_matrix" against its "devices"):
 *    rd_matrix_parse() with a fixed device list.
 * Accepted matrices must hold only indices of known devices, each once per
 * location, and read back the same after rd_matrix_to_json().
 */
#include "../../plugins/transport/rdma/rdma-plugin.c"

#include "fuzz.h"

static char devs[4][RD_NAME_MAX] = { "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3" };

static void check_locs(const rd_loc *locs, int n, int ndev)
{
	for (int i = 0; i < n; i++) {
		const rd_loc *l = &locs[i];
		FUZZ_CHECK(l->npref >= 0 && l->navail >= 0 && l->npref + l->navail <= ndev);
		FUZZ_CHECK(i == 0 || strcmp(locs[i - 1].name, l->name) <= 0);
		for (int k = 0; k < l->npref + l->navail; k++) {
			int v = k < l->npref ? l->pref[k] : l->avail[k - l->npref];
			FUZZ_CHECK(v >= 0 && v < ndev);
			for (int j = 0; j < k; j++)
				FUZZ_CHECK(v != (j < l->npref ? l->pref[j] : l->avail[j - l->npref]));
		}
	}
}

/* Written out and parsed again, the matrix is the same. */
static void round_trip(const rd_loc *locs, int n, char (*names)[RD_NAME_MAX], int ndev)
{
	JsonNode *node = rd_matrix_to_json(locs, n, names);
	GString *err = g_string_new(NULL);
	rd_loc *again = NULL;
	int nagain = 0;

	FUZZ_CHECK(rd_matrix_parse(json_node_get_object(node), names, ndev, &again, &nagain, err) == 0);
	/* Duplicate location names collapse into one JSON member. */
	FUZZ_CHECK(nagain <= n);
	for (int i = 0; i < nagain; i++) {
		const rd_loc *a = rd_loc_find(locs, n, again[i].name);
		FUZZ_CHECK(a != NULL);
	}
	rd_locs_free(again, nagain);
	json_node_unref(node);
	g_string_free(err, TRUE);
}

static void from_descriptor(JsonObject *matrix)
{
	GString *err = g_string_new(NULL);
	rd_loc *locs = NULL;
	int n = 0;

	if (rd_matrix_parse(matrix, devs, 4, &locs, &n, err) == 0) {
		check_locs(locs, n, 4);
		round_trip(locs, n, devs, 4);
		rd_locs_free(locs, n);
	} else {
		FUZZ_CHECK(locs == NULL && n == 0 && err->len > 0);
	}
	g_string_free(err, TRUE);
}

static void from_arguments(const char *text)
{
	static char root[4096];
	GString *err = g_string_new(NULL);
	rd_args a;

	if (root[0] == '\0') {
		const char *fx = getenv("TE_FUZZ_RDMA_FIXTURES");
		snprintf(root, sizeof root, "%s/two-socket", fx ? fx : "tests/rdma/fixtures");
	}
	if (rd_parse_args(text, &a, err) == 0 && a.matrix != NULL) {
		rd_topo t;
		char *known[] = { devs[0], devs[1], devs[2], devs[3] };
		g_string_truncate(err, 0);
		if (rd_topo_from_matrix(root, a.matrix, known, 4, &t, err) == 0) {
			FUZZ_CHECK(t.nhca > 0 && t.nhca <= 4);
			for (int i = 1; i < t.nhca; i++)
				FUZZ_CHECK(strcmp(t.hcas[i - 1].name, t.hcas[i].name) != 0);
			check_locs(t.locs, t.nloc, t.nhca);
			rd_topo_clear(&t);
		} else {
			FUZZ_CHECK(err->len > 0);
		}
		from_descriptor(a.matrix);
	}
	rd_args_clear(&a);
	g_string_free(err, TRUE);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = fuzz_str(data, size);

	from_arguments(text);
	free(text);
	return 0;
}
