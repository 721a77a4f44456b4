/* SPDX-License-Identifier: Apache-2.0 */
/* The software verbs layer's table (soft-verbs.c), for soft-provider.c. */
#ifndef TE_RDMA_SOFT_VERBS_H
#define TE_RDMA_SOFT_VERBS_H

#include "rdma-verbs.h"

const rv_verbs *rv_verbs_soft(void);

#endif
