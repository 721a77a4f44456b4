/* SPDX-License-Identifier: Apache-2.0 */
/* Mooncake's batch calls: the engine's table of the batches it allocated,
 * allocateBatchID, freeBatchID, submitTransfer and getTransferStatus. */
#include "mc-internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ----------------------------------------------------------------- batches */
/* Mixes the id so sequential or pointer-like ids spread over the buckets. */
static size_t batch_hash(te_batch_id id, size_t n_buckets)
{
	uint64_t z = id + 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return (size_t)((z ^ (z >> 31)) & (n_buckets - 1));
}

/* Doubles the table when it gets crowded; a failed allocation keeps the old
 * table (longer chains, still correct). Under the engine's lock. */
static void batches_grow(struct mc_engine *e)
{
	size_t n = e->n_buckets * 2;
	struct mc_batch **nb;

	if (e->n_batches <= e->n_buckets * 2)
		return;
	nb = calloc(n, sizeof *nb);
	if (nb == NULL)
		return;
	for (size_t i = 0; i < e->n_buckets; i++) {
		struct mc_batch *b = e->buckets[i], *next;
		for (; b != NULL; b = next) {
			size_t k = batch_hash(b->id, n);
			next = b->next;
			b->next = nb[k];
			nb[k] = b;
		}
	}
	free(e->buckets);
	e->buckets = nb;
	e->n_buckets = n;
}

/* Finds a live batch and takes a reference; NULL, logged for `fn`, when
 * the id is unknown or freed. */
static struct mc_batch *batch_get(const char *fn, struct mc_engine *e, te_batch_id id)
{
	struct mc_batch *b;

	pthread_mutex_lock(&e->lock);
	for (b = e->buckets[batch_hash(id, e->n_buckets)]; b != NULL; b = b->next)
		if (b->id == id && !b->freed) {
			b->refs++;
			break;
		}
	pthread_mutex_unlock(&e->lock);
	if (b == NULL)
		mc_err("%s: unknown or freed batch id %llu", fn, (unsigned long long)id);
	return b;
}

static void notify_free(struct mc_notify *n)
{
	free(n->name);
	free(n->msg);
	free(n);
}

void batch_destroy(struct mc_batch *b)
{
	for (struct mc_notify *n = b->notify_head, *next; n != NULL; n = next) {
		next = n->next;
		notify_free(n);
	}
	pthread_mutex_destroy(&b->submit_lock);
	free(b);
}

static void batch_put(struct mc_engine *e, struct mc_batch *b)
{
	int last;

	pthread_mutex_lock(&e->lock);
	last = --b->refs == 0 && b->freed;
	pthread_mutex_unlock(&e->lock);
	if (last)
		batch_destroy(b);
}

/* Under b->submit_lock: held while sending, so that no other call on this
 * batch reports it done before the peer acknowledged its notifications. */
void batch_notify_flush(const char *fn, struct mc_engine *e, struct mc_batch *b, int force)
{
	size_t in_flight = 0;
	struct mc_notify *n;

	if (b->notify_head == NULL)
		return;
	if (!force) {
		int rc = te_batch_status(e->te, b->id, NULL, &in_flight, NULL);
		if (rc < 0 || in_flight > 0)
			return;
	}
	while ((n = b->notify_head) != NULL) {
		int rc = te_notify_send_as(e->te, n->segment, n->name, n->msg);
		if (rc < 0) /* the transfer stands; only its notice is lost */
			mc_err("%s: notification of batch %llu to segment %d: %s", fn,
			       (unsigned long long)b->id, (int)n->segment, te_strerror(rc));
		b->notify_head = n->next;
		notify_free(n);
	}
	b->notify_tail = &b->notify_head;
	atomic_fetch_sub(&e->notify_pending, 1);
}

/* Takes a freed batch out of the table (its memory goes with the last
 * reference). Under the engine's lock. */
static void batch_unlink(struct mc_engine *e, struct mc_batch *b)
{
	struct mc_batch **p = &e->buckets[batch_hash(b->id, e->n_buckets)];

	while (*p != NULL && *p != b)
		p = &(*p)->next;
	if (*p == b) {
		*p = b->next;
		e->n_batches--;
	}
	b->freed = 1;
}

MC_API batch_id_t allocateBatchID(transfer_engine_t engine, size_t batch_size)
{
	static const char fn[] = "allocateBatchID";
	struct mc_engine *e = engine_checked(fn, engine, batch_size == 0, "zero batch size");
	struct mc_batch *b;
	te_batch_id id;
	int rc;

	if (e == NULL)
		return INVALID_BATCH;
	b = calloc(1, sizeof *b);
	if (b == NULL) {
		mc_err("%s: out of memory", fn);
		return INVALID_BATCH;
	}
	rc = te_batch_alloc(e->te, batch_size, &id);
	if (rc < 0) {
		mc_err("%s: %zu tasks: %s", fn, batch_size, te_strerror(rc));
		free(b);
		return INVALID_BATCH;
	}
	b->id = id;
	b->capacity = batch_size;
	pthread_mutex_init(&b->submit_lock, NULL);
	b->notify_tail = &b->notify_head;
	pthread_mutex_lock(&e->lock);
	size_t k = batch_hash(id, e->n_buckets);
	b->next = e->buckets[k];
	e->buckets[k] = b;
	e->n_batches++;
	batches_grow(e);
	pthread_mutex_unlock(&e->lock);
	return id;
}

MC_API int freeBatchID(transfer_engine_t engine, batch_id_t batch_id)
{
	static const char fn[] = "freeBatchID";
	struct mc_engine *e = engine_of(fn, engine);
	struct mc_batch *b;
	int rc;

	if (e == NULL)
		return MC_STATUS_CODE_INVALID_ARGUMENT;
	b = batch_get(fn, e, batch_id);
	if (b == NULL)
		return MC_STATUS_CODE_INVALID_ARGUMENT;
	/* Waits for a submit in progress on another thread, so a batch is not
	 * freed between that submit's libte call and its status checks. */
	pthread_mutex_lock(&b->submit_lock);
	rc = te_batch_free(e->te, batch_id);
	if (rc == 0) {
		/* nothing in flight: notifications no status call sent go now */
		batch_notify_flush(fn, e, b, 1);
		pthread_mutex_lock(&e->lock);
		batch_unlink(e, b);
		pthread_mutex_unlock(&e->lock);
	}
	pthread_mutex_unlock(&b->submit_lock);
	batch_put(e, b);
	if (rc < 0 && rc != -EBUSY)
		mc_err("%s: batch %llu: %s", fn, (unsigned long long)batch_id, te_strerror(rc));
	return to_status(fn, rc);
}

/* Requests converted on the stack up to this many, else on the heap. */
#define MC_STACK_REQS 32

static int submit(const char *fn, transfer_engine_t engine, batch_id_t batch_id,
		  const struct transfer_request *entries, size_t count, const notify_msg_t *notify)
{
	struct mc_engine *e = engine_of(fn, engine);
	te_request stack_reqs[MC_STACK_REQS], *reqs = stack_reqs;
	struct mc_batch *b;
	size_t first;
	int status = MC_STATUS_CODE_OK, rc;

	if (e == NULL)
		return MC_STATUS_CODE_INVALID_ARGUMENT;
	if (entries == NULL && count > 0) {
		mc_err("%s: NULL entries for %zu requests", fn, count);
		return MC_STATUS_CODE_INVALID_ARGUMENT;
	}
	if (notify != NULL && (count == 0 || notify->msg == NULL)) {
		mc_err("%s: %s", fn, count == 0 ? "no request to notify about" : "NULL notify msg");
		return MC_STATUS_CODE_INVALID_ARGUMENT;
	}
	b = batch_get(fn, e, batch_id);
	if (b == NULL)
		return MC_STATUS_CODE_INVALID_ARGUMENT;
	pthread_mutex_lock(&b->submit_lock);
	if (count > b->capacity - b->submitted) {
		mc_err("%s: batch %llu holds %zu tasks, %zu submitted, %zu more refused", fn,
		       (unsigned long long)batch_id, b->capacity, b->submitted, count);
		status = MC_STATUS_CODE_TOO_MANY_REQUESTS;
		goto out;
	}
	if (count == 0)
		goto out;
	if (count > MC_STACK_REQS) {
		reqs = malloc(count * sizeof *reqs); /* count <= capacity: no overflow */
		if (reqs == NULL) {
			mc_err("%s: out of memory for %zu requests", fn, count);
			status = MC_STATUS_CODE_MEMORY;
			goto out;
		}
	}
	for (size_t i = 0; i < count; i++) {
		/* A negative opcode becomes a huge one, which libte refuses. */
		reqs[i] = (te_request){ (uint32_t)entries[i].opcode, entries[i].target_id,
					entries[i].source, entries[i].target_offset,
					entries[i].length };
	}
	/* MC_SLICE_TIMEOUT is the tasks' deadline: libte ends a task still
	 * in flight then (FAILED, -ETIMEDOUT) on every transport that honours
	 * deadlines, and nothing touches its memory afterwards. */
	rc = te_submit_by(e->te, batch_id, reqs, count,
			  e->slice_timeout_s > 0 ? te_now_ns() + (int64_t)e->slice_timeout_s * 1000000000 : 0);
	if (rc < 0) {
		mc_err("%s: batch %llu: %s", fn, (unsigned long long)batch_id, te_strerror(rc));
		status = to_status(fn, rc);
		goto out;
	}
	first = b->submitted;
	b->submitted += count;
	if (rc > 0) {
		/* Report the first refused request; the others run. */
		for (size_t i = 0; i < count; i++) {
			te_task_status st;
			if (te_get_status(e->te, batch_id, first + i, &st) == 0 &&
			    st.state == TE_TASK_INVALID) {
				mc_err("%s: request %zu of %zu refused: %s", fn, i, count,
				       te_strerror(st.error));
				status = to_status(fn, st.error < 0 ? st.error : -EINVAL);
				break;
			}
		}
		if (status == MC_STATUS_CODE_OK) /* libte said some were refused */
			status = MC_STATUS_CODE_INVALID_ARGUMENT;
		goto out;
	}
	if (notify != NULL) {
		/* Sent by the call that sees the batch end (batch_notify_flush). */
		struct mc_notify *n = calloc(1, sizeof *n);
		if (n != NULL) {
			n->segment = entries[0].target_id;
			n->msg = strdup(notify->msg);
			n->name = notify->name != NULL ? strdup(notify->name) : NULL;
		}
		if (n == NULL || n->msg == NULL || (notify->name != NULL && n->name == NULL)) {
			if (n != NULL)
				notify_free(n);
			mc_err("%s: out of memory for the notification of batch %llu", fn,
			       (unsigned long long)batch_id);
			status = MC_STATUS_CODE_MEMORY;
			goto out;
		}
		if (b->notify_head == NULL)
			atomic_fetch_add(&e->notify_pending, 1);
		*b->notify_tail = n;
		b->notify_tail = &n->next;
	}
out:
	pthread_mutex_unlock(&b->submit_lock);
	batch_put(e, b);
	if (reqs != stack_reqs)
		free(reqs);
	return status;
}

MC_API int submitTransfer(transfer_engine_t engine, batch_id_t batch_id,
			  struct transfer_request *entries, size_t count)
{
	return submit("submitTransfer", engine, batch_id, entries, count, NULL);
}

MC_API int submitTransferWithNotify(transfer_engine_t engine, batch_id_t batch_id,
				    struct transfer_request *entries, size_t count,
				    notify_msg_t notify_msg)
{
	return submit("submitTransferWithNotify", engine, batch_id, entries, count, &notify_msg);
}

MC_API int getTransferStatus(transfer_engine_t engine, batch_id_t batch_id, size_t task_id,
			     struct transfer_status *status)
{
	static const char fn[] = "getTransferStatus";
	struct mc_engine *e = engine_checked(fn, engine, status == NULL, "NULL status pointer");
	int rc;

	if (e == NULL)
		return MC_STATUS_CODE_INVALID_ARGUMENT;
	te_task_info ti = { .size = sizeof ti };
	rc = te_get_task_info(e->te, batch_id, task_id, &ti);
	if (rc < 0) {
		mc_err("%s: batch %llu task %zu: %s", fn, (unsigned long long)batch_id, task_id,
		       te_strerror(rc));
		return to_status(fn, rc);
	}
	if (ti.state != TE_TASK_WAITING && ti.state != TE_TASK_PENDING &&
	    atomic_load(&e->notify_pending) > 0) {
		/* This task ended: if the whole batch did, its notifications go
		 * before the caller hears so. */
		struct mc_batch *b = batch_get(fn, e, batch_id);
		if (b != NULL) {
			pthread_mutex_lock(&b->submit_lock);
			batch_notify_flush(fn, e, b, 0);
			pthread_mutex_unlock(&b->submit_lock);
			batch_put(e, b);
		}
	}
	/* libte's task states carry Mooncake's numbers. A task libte ended at
	 * its deadline reads FAILED, an end a caller waiting for COMPLETED or
	 * FAILED sees. One still in flight past it (a transport that does not
	 * honour deadlines) reads TIMEOUT, as Mooncake reports a task whose
	 * slice has been in flight longer than MC_SLICE_TIMEOUT. */
	status->status = ti.state;
	if (ti.deadline_ns != 0 && (ti.state == TE_TASK_WAITING || ti.state == TE_TASK_PENDING) &&
	    te_now_ns() > ti.deadline_ns)
		status->status = STATUS_TIMEOUT;
	status->transferred_bytes = ti.transferred;
	return MC_STATUS_CODE_OK;
}
