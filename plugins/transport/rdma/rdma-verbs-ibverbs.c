/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The production verbs table: libibverbs (rdma-core). Several verbs are
 * static inline functions or macros in verbs.h (ibv_post_send, ibv_poll_cq,
 * ibv_req_notify_cq, ibv_query_port, ibv_query_gid_ex), so each entry is a
 * small real function.
 */
#include "rdma-verbs.h"

static struct ibv_device **iv_get_device_list(const char *sysfs_root, int *num)
{
	(void)sysfs_root; /* libibverbs reads the kernel's sysfs itself */
	return ibv_get_device_list(num);
}

static void iv_free_device_list(struct ibv_device **list)
{
	ibv_free_device_list(list);
}

static const char *iv_get_device_name(struct ibv_device *dev)
{
	return ibv_get_device_name(dev);
}

static uint64_t iv_get_device_guid(struct ibv_device *dev)
{
	return (uint64_t)ibv_get_device_guid(dev);
}

static struct ibv_context *iv_open_device(struct ibv_device *dev)
{
	return ibv_open_device(dev);
}

static int iv_close_device(struct ibv_context *ctx)
{
	return ibv_close_device(ctx);
}

static int iv_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr)
{
	return ibv_query_device(ctx, attr);
}

static int iv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	return ibv_query_port(ctx, port, attr);
}

static int iv_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
			   struct ibv_gid_entry *entry)
{
	return ibv_query_gid_ex(ctx, port, index, entry, 0);
}

static struct ibv_pd *iv_alloc_pd(struct ibv_context *ctx)
{
	return ibv_alloc_pd(ctx);
}

static int iv_dealloc_pd(struct ibv_pd *pd)
{
	return ibv_dealloc_pd(pd);
}

static struct ibv_mr *iv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return ibv_reg_mr(pd, addr, length, access);
}

static struct ibv_mr *iv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
				       uint64_t iova, int fd, int access)
{
	return ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access);
}

static int iv_dereg_mr(struct ibv_mr *mr)
{
	return ibv_dereg_mr(mr);
}

static struct ibv_comp_channel *iv_create_comp_channel(struct ibv_context *ctx)
{
	return ibv_create_comp_channel(ctx);
}

static int iv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	return ibv_destroy_comp_channel(ch);
}

static struct ibv_cq *iv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
				   struct ibv_comp_channel *ch, int comp_vector)
{
	return ibv_create_cq(ctx, cqe, cq_context, ch, comp_vector);
}

static int iv_destroy_cq(struct ibv_cq *cq)
{
	return ibv_destroy_cq(cq);
}

static int iv_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return ibv_req_notify_cq(cq, solicited_only);
}

static int iv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context)
{
	return ibv_get_cq_event(ch, cq, cq_context);
}

static void iv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	ibv_ack_cq_events(cq, nevents);
}

static int iv_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, num_entries, wc);
}

static struct ibv_qp *iv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	return ibv_create_qp(pd, attr);
}

static int iv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
	return ibv_modify_qp(qp, attr, attr_mask);
}

static int iv_destroy_qp(struct ibv_qp *qp)
{
	return ibv_destroy_qp(qp);
}

static int iv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	return ibv_post_send(qp, wr, bad_wr);
}

static int iv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *event)
{
	return ibv_get_async_event(ctx, event);
}

static void iv_ack_async_event(struct ibv_async_event *event)
{
	ibv_ack_async_event(event);
}

static const rv_verbs ibverbs_table = {
	.name = "libibverbs",
	.none_found = "libibverbs lists none: there is no RDMA NIC here, or its kernel driver "
		      "(mlx5_ib, irdma, rxe, ...) is not loaded",
	.get_device_list = iv_get_device_list,
	.free_device_list = iv_free_device_list,
	.get_device_name = iv_get_device_name,
	.get_device_guid = iv_get_device_guid,
	.open_device = iv_open_device,
	.close_device = iv_close_device,
	.query_device = iv_query_device,
	.query_port = iv_query_port,
	.query_gid_ex = iv_query_gid_ex,
	.alloc_pd = iv_alloc_pd,
	.dealloc_pd = iv_dealloc_pd,
	.reg_mr = iv_reg_mr,
	.reg_dmabuf_mr = iv_reg_dmabuf_mr,
	.dereg_mr = iv_dereg_mr,
	.create_comp_channel = iv_create_comp_channel,
	.destroy_comp_channel = iv_destroy_comp_channel,
	.create_cq = iv_create_cq,
	.destroy_cq = iv_destroy_cq,
	.req_notify_cq = iv_req_notify_cq,
	.get_cq_event = iv_get_cq_event,
	.ack_cq_events = iv_ack_cq_events,
	.poll_cq = iv_poll_cq,
	.create_qp = iv_create_qp,
	.modify_qp = iv_modify_qp,
	.destroy_qp = iv_destroy_qp,
	.post_send = iv_post_send,
	.get_async_event = iv_get_async_event,
	.ack_async_event = iv_ack_async_event,
};

const rv_verbs *rv_verbs_ibverbs(void)
{
	return &ibverbs_table;
}
