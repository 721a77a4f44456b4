/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The shipped plugin's provider: libibverbs over the kernel's own sysfs,
 * always. No variable, option or argument selects anything else here; the
 * tests' copy of the plugin replaces this file (rdma.h).
 */
#include "rdma.h"

void rd_provider_get(const te_host *h, rd_provider *out)
{
	(void)h;
	out->verbs = rv_verbs_ibverbs();
	out->sysfs_root = "/";
}

void rd_provider_track(rd_transport *tr, bool up)
{
	(void)tr;
	(void)up;
}
