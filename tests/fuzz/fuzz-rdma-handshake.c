/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The RDMA transport's Connection message (docs/wire.md, "The RDMA Connection
 * frame"), as the peer's request or reply carries it: rd_hs_decode(). What it
 * accepts must survive a round trip: encoded again and decoded, every field
 * the same. The NIC paths it accepted are split as the endpoint code splits
 * them.
 */
#include <string.h>

#include "rdma.h"

#include "fuzz.h"

static void same(const rd_hs *a, const rd_hs *b)
{
	FUZZ_CHECK(strcmp(a->local_nic_path, b->local_nic_path) == 0);
	FUZZ_CHECK(strcmp(a->peer_nic_path, b->peer_nic_path) == 0);
	FUZZ_CHECK(strcmp(a->reply_msg, b->reply_msg) == 0);
	FUZZ_CHECK(a->local_lid == b->local_lid && a->ready_ack == b->ready_ack && a->nqp == b->nqp);
	FUZZ_CHECK(memcmp(a->qp_num, b->qp_num, sizeof a->qp_num) == 0);
	FUZZ_CHECK(memcmp(a->local_gid, b->local_gid, sizeof a->local_gid) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	GString *err = g_string_new(NULL);
	char *text = fuzz_str(data, size);
	rd_hs hs, again;

	if (rd_hs_decode(text, size, &hs, err) == 0) {
		FUZZ_CHECK(hs.nqp >= 0 && hs.nqp <= (int)G_N_ELEMENTS(hs.qp_num));
		size_t len = 0;
		char *enc = rd_hs_encode(&hs, &len);
		FUZZ_CHECK(enc != NULL);
		g_string_truncate(err, 0);
		int rc = rd_hs_decode(enc, len, &again, err);
		/* A reply without a GID decodes; re-encoded it carries a zero
		 * GID, which decodes too: the round trip must never fail. */
		if (rc != 0)
			fprintf(stderr, "re-decoding %s failed: %s\n", enc, err->str);
		FUZZ_CHECK(rc == 0);
		same(&hs, &again);
		free(enc);

		char server[RD_PATH_MAX], dev[RD_NAME_MAX];
		if (rd_nic_path_split(hs.local_nic_path, server, sizeof server, dev, sizeof dev))
			FUZZ_CHECK(strlen(server) > 0 && strlen(dev) > 0 && strchr(dev, '@') == NULL);
		rd_nic_path_split(hs.peer_nic_path, server, sizeof server, dev, sizeof dev);
	} else {
		FUZZ_CHECK(err->len > 0); /* a refusal says why */
	}
	/* The GID text on its own, as devices in descriptors give it. */
	uint8_t gid[16];
	if (rd_gid_parse(text, gid)) {
		char out[48];
		rd_gid_format(gid, out);
		FUZZ_CHECK(g_ascii_strcasecmp(out, text) == 0);
	}
	free(text);
	g_string_free(err, TRUE);
	return 0;
}
