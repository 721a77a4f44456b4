/* SPDX-License-Identifier: Apache-2.0 */
/* A program built against an installed libte with `pkg-config libte` only.
 * Two engines in this process exchange data through the "memcpy" transport
 * (the out-of-tree example plugin found on TE_PLUGIN_PATH). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <te/te.h>

static int fail(const char *what, int rc)
{
	fprintf(stderr, "consumer: %s: %s\n", what, te_strerror(rc));
	return 1;
}

static void show(const te_plugin_info *p, void *user)
{
	(void)user;
	printf("plugin %s %s %s\n", p->name ? p->name : "?", p->loaded ? "loaded" : "skipped", p->path);
}

int main(void)
{
	te_engine *a = NULL, *b = NULL;
	te_option opt = { "transports", "memcpy" };
	static unsigned char abuf[1 << 20], bbuf[1 << 20];
	te_batch_id batch;
	te_task_status st;
	int rc;

	te_plugin_foreach(show, NULL);
	if ((rc = te_engine_create("P2PHANDSHAKE", "127.0.0.1", &opt, 1, &a)) != 0)
		return fail("engine a", rc);
	if ((rc = te_engine_create("P2PHANDSHAKE", "127.0.0.1", &opt, 1, &b)) != 0)
		return fail("engine b", rc);
	if ((rc = te_register_memory(a, abuf, sizeof abuf, "cpu:0", 0)) != 0 ||
	    (rc = te_register_memory(b, bbuf, sizeof bbuf, "cpu:0", TE_MEM_REMOTE_ACCESS)) != 0)
		return fail("register", rc);
	te_segment_id seg = te_segment_open(a, te_engine_name(b));
	if (seg < 0)
		return fail("open", seg);
	for (size_t i = 0; i < sizeof abuf; i++)
		abuf[i] = (unsigned char)(i * 31 + 7);
	te_request r = { TE_OP_WRITE, seg, abuf, (uintptr_t)bbuf, sizeof abuf };
	if ((rc = te_batch_alloc(a, 1, &batch)) != 0 || (rc = te_submit(a, batch, &r, 1)) != 0 ||
	    (rc = te_batch_wait(a, batch, 10000)) != 0 || (rc = te_get_status(a, batch, 0, &st)) != 0)
		return fail("transfer", rc);
	if (st.state != TE_TASK_COMPLETED || st.transferred != sizeof abuf ||
	    memcmp(abuf, bbuf, sizeof abuf) != 0) {
		fprintf(stderr, "consumer: transfer state %d, %llu bytes, data %s\n", st.state,
			(unsigned long long)st.transferred, memcmp(abuf, bbuf, sizeof abuf) ? "differs" : "same");
		return 1;
	}
	te_batch_free(a, batch);
	te_segment_close(a, seg);
	te_engine_destroy(a);
	te_engine_destroy(b);
	printf("consumer: moved %zu bytes through memcpy, verified\n", sizeof abuf);
	return 0;
}
