/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The one narrow door between the RDMA plugin and a verbs provider: exactly
 * the verbs the plugin uses, as function pointers over libibverbs' own types.
 * The shipped plugin fills it with libibverbs (rdma-verbs-ibverbs.c) and
 * nothing else. The tests' own copy of the plugin (tests/rdma/soft-verbs/)
 * can also point it at a software verbs layer that creates the same public
 * ibv_* objects, so the plugin code above this table runs unmodified on
 * either.
 */
#ifndef TE_RDMA_VERBS_H
#define TE_RDMA_VERBS_H

#include <infiniband/verbs.h>

typedef struct rv_verbs {
	const char *name; /* "libibverbs", or the tests' "soft" */
	/* Why a device list may be empty, for the "no RDMA devices" line. */
	const char *none_found;

	/* Devices. `sysfs_root` is the sysfs tree the instance reads ("/" for
	 * libibverbs, which reads the kernel's own whatever it is given). */
	struct ibv_device **(*get_device_list)(const char *sysfs_root, int *num);
	void (*free_device_list)(struct ibv_device **list);
	const char *(*get_device_name)(struct ibv_device *dev);
	/* The node GUID, as libibverbs gives it (network order); 0 when the
	 * device has none. It outlives the name: a device reset may come back
	 * under another one. */
	uint64_t (*get_device_guid)(struct ibv_device *dev);
	struct ibv_context *(*open_device)(struct ibv_device *dev);
	int (*close_device)(struct ibv_context *ctx);
	int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
	int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
	int (*query_gid_ex)(struct ibv_context *ctx, uint32_t port, uint32_t index,
			    struct ibv_gid_entry *entry);

	/* Protection domains and memory regions. */
	struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
	int (*dealloc_pd)(struct ibv_pd *pd);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access);
	/* Device memory through a dma-buf (GPUDirect): `length` bytes at
	 * `offset` in the dma-buf `fd`, addressed as `iova` in work requests. */
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t length,
					uint64_t iova, int fd, int access);
	int (*dereg_mr)(struct ibv_mr *mr);

	/* Completion channels and queues. */
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *ctx);
	int (*destroy_comp_channel)(struct ibv_comp_channel *ch);
	struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_context,
				    struct ibv_comp_channel *ch, int comp_vector);
	int (*destroy_cq)(struct ibv_cq *cq);
	int (*req_notify_cq)(struct ibv_cq *cq, int solicited_only);
	int (*get_cq_event)(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context);
	void (*ack_cq_events)(struct ibv_cq *cq, unsigned int nevents);
	int (*poll_cq)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);

	/* Queue pairs. */
	struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
	int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
	int (*destroy_qp)(struct ibv_qp *qp);
	int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);

	/* Asynchronous events (port up/down, fatal errors). */
	int (*get_async_event)(struct ibv_context *ctx, struct ibv_async_event *event);
	void (*ack_async_event)(struct ibv_async_event *event);
} rv_verbs;

/* The production table: libibverbs. */
const rv_verbs *rv_verbs_ibverbs(void);

#endif
