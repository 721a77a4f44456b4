/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The initiator's copies: pieces of transfers, all of one segment and
 * opcode, moved by the first path that applies: straight between our own
 * addresses (the target is this process), through our mapping of the
 * target's shared allocation (memcpy), or through cross-memory attach
 * (process_vm_readv/writev, up to SHM_CMA_IOV requests per call); the
 * target's device memory through the device plugin, at the address its
 * allocation was opened at here. Each copy runs inside a pinned slot of the
 * target's control block. Who calls it, and in which thread: shm-queue.c.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "shm.h"

/* ---------------------------------------------------------------- pins */

/* Pins the live slot holding [addr, addr+len), or NULL: the target never
 * registered that range, or is unregistering it. */
static shm_slot *pin(shm_seg *s, uint64_t addr, uint64_t len)
{
	shm_slot *sl = SHM_SLOTS(s->ctl);
	uint32_t high = atomic_load_explicit(&s->ctl->high, memory_order_acquire);
	uint32_t hint = atomic_load_explicit(&s->hint, memory_order_relaxed);

	if (high > s->ctl->nslots) /* the target's word: never past our mapping */
		high = s->ctl->nslots;
	for (uint32_t k = 0; k < high; k++) {
		uint32_t i = (hint + k) % high;
		uint64_t st = atomic_load_explicit(&sl[i].state, memory_order_acquire);
		if (slot_state(st) != SLOT_LIVE)
			continue;
		uint64_t a = atomic_load_explicit(&sl[i].addr, memory_order_relaxed);
		uint64_t l = atomic_load_explicit(&sl[i].length, memory_order_relaxed);
		if (addr < a || addr - a > l || len > l - (addr - a))
			continue;
		atomic_fetch_add(&sl[i].pins, 1);
		if (atomic_load(&sl[i].state) != st) { /* dying, or reused meanwhile */
			atomic_fetch_sub(&sl[i].pins, 1);
			return NULL;
		}
		if (i != hint)
			atomic_store_explicit(&s->hint, i, memory_order_relaxed);
		return &sl[i];
	}
	return NULL;
}

static void unpin(shm_slot *slot)
{
	atomic_fetch_sub_explicit(&slot->pins, 1, memory_order_release);
}

/* A pin a run keeps from one piece to the next while they fall in its
 * slot: the pin count is one cache line that every copying thread of every
 * initiator writes twice per piece otherwise (a KV cache's 4 KiB blocks all
 * lie in one slot). Checked against the slot's state each time, so a slot
 * the target began to unregister takes no new piece, as pin() would. */
typedef struct held_pin {
	shm_slot *slot;
	uint64_t state, addr, length;
} held_pin;

static void stream_fence(void);

static shm_slot *pin_held(shm_seg *s, held_pin *h, uint64_t addr, uint64_t len)
{
	if (h->slot != NULL) {
		if (addr >= h->addr && addr - h->addr <= h->length && len <= h->length - (addr - h->addr) &&
		    atomic_load_explicit(&h->slot->state, memory_order_acquire) == h->state)
			return h->slot;
		stream_fence(); /* the slot's streamed bytes land before it is let go */
		unpin(h->slot);
		h->slot = NULL;
	}
	shm_slot *sl = pin(s, addr, len);
	if (sl != NULL) {
		h->slot = sl;
		h->state = atomic_load_explicit(&sl->state, memory_order_relaxed);
		h->addr = atomic_load_explicit(&sl->addr, memory_order_relaxed);
		h->length = atomic_load_explicit(&sl->length, memory_order_relaxed);
	}
	return sl;
}

/* A pin of its own for a piece whose slot the run holds (a copy that ends
 * later, or elsewhere, drops it with unpin()). */
static void pin_more(shm_slot *slot)
{
	atomic_fetch_add_explicit(&slot->pins, 1, memory_order_relaxed);
}

/* Our address for [addr, addr+len) of a pinned slot through a shared
 * allocation, or NULL. */
static char *mapped(shm_seg *s, shm_slot *slot, uint64_t addr, uint64_t len)
{
	int32_t idx = atomic_load_explicit(&slot->export_idx, memory_order_relaxed);
	uint64_t off = atomic_load_explicit(&slot->export_off, memory_order_relaxed);
	uint64_t a = atomic_load_explicit(&slot->addr, memory_order_relaxed);

	if (idx < 0 || (unsigned)idx >= s->nmaps || s->maps[idx].local == NULL || s->maps[idx].device)
		return NULL;
	off += addr - a;
	if (off < addr - a || off > s->maps[idx].size || len > s->maps[idx].size - off)
		return NULL;
	return s->maps[idx].local + off;
}

/* For [addr, addr+len) of a pinned device slot: where it lies in this
 * process (the target's own address when it is this process) and the
 * location whose device plugin copies it; NULL when the export is not
 * known here (registered after first contact: the descriptor is fetched
 * again) or could not be opened. */
static char *device_at(shm_seg *s, shm_slot *slot, uint64_t addr, uint64_t len, const char **location)
{
	int32_t idx = atomic_load_explicit(&slot->export_idx, memory_order_relaxed);
	uint64_t off = atomic_load_explicit(&slot->export_off, memory_order_relaxed);
	uint64_t a = atomic_load_explicit(&slot->addr, memory_order_relaxed);

	if (idx < 0 || (unsigned)idx >= s->nmaps || !s->maps[idx].device)
		return NULL;
	*location = s->maps[idx].location;
	if (s->self)
		return (char *)(uintptr_t)addr;
	if (s->maps[idx].local == NULL)
		return NULL;
	off += addr - a;
	if (off < addr - a || off > s->maps[idx].size || len > s->maps[idx].size - off)
		return NULL;
	return s->maps[idx].local + off;
}

/* ---------------------------------------------------- streaming stores */

#if defined(__SSE2__)
#include <emmintrin.h>

bool shm_stream_supported(void)
{
	return true;
}

/* memcpy with non-temporal stores: the destination's lines go to memory
 * without being read into the cache first (half the memory traffic of a
 * cached store to memory not in the cache), for pieces whose destination
 * would leave the cache before anyone read it. Not ordered with later
 * stores: stream_fence() before the piece is let go (its gate left, its
 * slot unpinned, its completion). `next`: where the next piece's source
 * starts (or 0), fetched line by line meanwhile: pieces a page or two apart
 * each start the hardware's prefetcher cold. A prefetch never faults. */
static void copy_stream(char *dst, const char *src, size_t n, uintptr_t next)
{
	size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
	size_t pf = next != 0 ? n : 0;

	for (size_t k = 0; k < pf && k < head; k += 64)
		__builtin_prefetch((const void *)(next + k));

	if (head > n)
		head = n;
	memcpy(dst, src, head);
	dst += head;
	src += head;
	n -= head;
	for (size_t k = 0; n >= 64; n -= 64, dst += 64, src += 64, k += 64) {
		if (head + k < pf)
			__builtin_prefetch((const void *)(next + head + k));
		__m128i a = _mm_loadu_si128((const __m128i *)(const void *)src);
		__m128i b = _mm_loadu_si128((const __m128i *)(const void *)(src + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(const void *)(src + 32));
		__m128i d = _mm_loadu_si128((const __m128i *)(const void *)(src + 48));
		_mm_stream_si128((__m128i *)(void *)dst, a);
		_mm_stream_si128((__m128i *)(void *)(dst + 16), b);
		_mm_stream_si128((__m128i *)(void *)(dst + 32), c);
		_mm_stream_si128((__m128i *)(void *)(dst + 48), d);
	}
	for (; n >= 16; n -= 16, dst += 16, src += 16)
		_mm_stream_si128((__m128i *)(void *)dst, _mm_loadu_si128((const __m128i *)(const void *)src));
	memcpy(dst, src, n);
}

static void stream_fence(void)
{
	_mm_sfence();
}
#else
bool shm_stream_supported(void)
{
	return false;
}

static void copy_stream(char *dst, const char *src, size_t n, uintptr_t next)
{
	(void)next;
	memcpy(dst, src, n);
}

static void stream_fence(void)
{
}
#endif

static void copy(char *dst, const char *src, size_t n, bool stream, uintptr_t next)
{
	if (stream && n < SHM_STREAM_PIECE_MAX)
		copy_stream(dst, src, n, next);
	else
		memcpy(dst, src, n);
}

/* Where piece i + 1 of a run reads from, to be fetched while piece i is
 * copied: our memory for a WRITE; for a READ the target's, when it lies in
 * the slot piece i is in (its address here follows from piece i's). 0 when
 * not known. */
static uintptr_t next_source(const shm_piece *ps, unsigned i, unsigned n, uint32_t op, const shm_slot *slot,
			     const char *there, uint64_t remote)
{
	if (i + 1 >= n)
		return 0;
	const shm_piece *q = &ps[i + 1];
	if (op == TE_OP_WRITE)
		return (uintptr_t)q->t->local + q->off;
	uint64_t r = q->t->remote + q->off;
	uint64_t a = atomic_load_explicit(&slot->addr, memory_order_relaxed);
	uint64_t l = atomic_load_explicit(&slot->length, memory_order_relaxed);
	if (r < a || r - a > l || q->len > l - (r - a))
		return 0;
	return (uintptr_t)there + (uintptr_t)(r - remote);
}

/* ---------------------------------------------------------- data path */

/* Deadlines (ABI 1.11): a piece touches its transfer's memory only between
 * gate_in() and its report, so that the host may end the transfer early
 * (the caller owns the memory again from then on). Every copy here is a
 * memcpy, a device copy or one process_vm_* call: short, never waiting on
 * the target process. */
static bool gate_in(shm_ctx *c, te_transfer *t)
{
	return !TE_HAS_OP(c->host, transfer_enter) || c->host->transfer_enter(c->host, t);
}

/* Pieces of a run copied but not yet reported: reported together, at the
 * latest every DONE_BYTES copied and at the run's end, after one fence for
 * their streaming stores, their gates left, through one complete_many().
 * A 4 KiB piece's own fence, gate and completion cost about as much as its
 * copy; the bound keeps a gate held for tens of microseconds at most. */
#define DONE_BYTES (256u << 10)
typedef struct done_list {
	held_pin *held; /* the run's pin: let go before any report */
	unsigned n;
	uint64_t bytes;
	te_transfer *ts[SHM_CMA_IOV];
	uint64_t len[SHM_CMA_IOV];
	int err[SHM_CMA_IOV];
	bool gated[SHM_CMA_IOV];
} done_list;

static void done_flush(shm_ctx *c, done_list *d)
{
	const te_host *h = c->host;

	if (d->n == 0)
		return;
	stream_fence();
	/* A reported transfer may be the last one on this segment: its caller
	 * may then close the segment and unmap the slots. The next piece pins
	 * again. */
	if (d->held != NULL && d->held->slot != NULL) {
		unpin(d->held->slot);
		d->held->slot = NULL;
	}
	if (TE_HAS_OP(h, transfer_leave))
		for (unsigned k = 0; k < d->n; k++)
			if (d->gated[k])
				h->transfer_leave(h, d->ts[k]);
	te_host_complete_slices(h, c->complete_many, d->ts, d->len, d->err, d->n);
	d->n = 0;
	d->bytes = 0;
}

/* Reports piece p (gated: inside its gate) with `err`. */
static void done_add(shm_ctx *c, done_list *d, const shm_piece *p, int err, bool gated)
{
	if (d->n == SHM_CMA_IOV)
		done_flush(c, d);
	d->ts[d->n] = p->t;
	d->len[d->n] = err ? 0 : p->len;
	d->err[d->n] = err;
	d->gated[d->n++] = gated;
	d->bytes += p->len;
	if (d->bytes >= DONE_BYTES)
		done_flush(c, d);
}

static void done(shm_ctx *c, done_list *d, const shm_piece *p, int err)
{
	done_add(c, d, p, err, false);
}

static void done_in(shm_ctx *c, done_list *d, const shm_piece *p, int err)
{
	done_add(c, d, p, err, true);
}

/* Whether the local side of a transfer is device memory. The host hands
 * this transport its device memory as it is (TE_TRANSPORT_DEVICE_MEMORY:
 * every device region registers here), never staged. */
static bool local_is_device(const te_transfer *t)
{
	return t->local_location != NULL && strncmp(t->local_location, "cpu", 3) != 0;
}

/* Whether two locations are of the one device plugin ("cuda:0", "cuda:1"). */
static bool same_plugin(const char *a, const char *b)
{
	size_t la = strcspn(a, ":"), lb = strcspn(b, ":");
	return la == lb && strncmp(a, b, la) == 0;
}

/* Device copies of one run, gathered to go to the device plugin as one
 * batch (queued together, waited for once) instead of one waited copy per
 * piece: all of one location and kind. */
typedef struct dev_batch {
	const char *location;
	unsigned flags;
	unsigned n;
	te_copy copies[SHM_CMA_IOV];
	shm_slot *slots[SHM_CMA_IOV];
	unsigned idx[SHM_CMA_IOV];
} dev_batch;

static void dev_flush(shm_ctx *c, done_list *d, shm_piece *ps, dev_batch *b)
{
	const te_host *h = c->host;
	int rc = 0;

	if (b->n == 0)
		return;
	if (b->n > 1 && TE_HAS_OP(h, device_copy_batch)) {
		rc = h->device_copy_batch(h, b->location, b->copies, b->n, b->flags);
	} else {
		for (unsigned k = 0; k < b->n && rc == 0; k++)
			rc = h->device_copy(h, b->location, b->copies[k].dst, b->copies[k].src, b->copies[k].len);
	}
	for (unsigned k = 0; k < b->n; k++) {
		unpin(b->slots[k]);
		done_in(c, d, &ps[b->idx[k]], rc);
	}
	b->n = 0;
}

static void dev_add(shm_ctx *c, done_list *d, shm_piece *ps, dev_batch *b, const char *location, unsigned flags, void *dst,
		    const void *src, uint64_t len, shm_slot *slot, unsigned i)
{
	if (b->n > 0 && (b->flags != flags || strcmp(b->location, location) != 0))
		dev_flush(c, d, ps, b);
	b->location = location;
	b->flags = flags;
	b->copies[b->n] = (te_copy){ dst, src, len };
	b->slots[b->n] = slot;
	b->idx[b->n++] = i;
}

/* Our device memory and memory of the target's that only cross-memory
 * attach reaches: through a host buffer of this thread's, a slice at a
 * time. */
#define BOUNCE_BYTES (1u << 20)
static pthread_key_t bounce_key; /* a key: see shm_ctx's waiter_key */
static pthread_once_t bounce_once = PTHREAD_ONCE_INIT;

static void bounce_key_make(void)
{
	(void)pthread_key_create(&bounce_key, free);
}

static int bounce(shm_ctx *c, shm_seg *s, uint32_t op, char *local, const char *location, uint64_t remote,
		  uint64_t len)
{
	const te_host *h = c->host;

	pthread_once(&bounce_once, bounce_key_make);
	char *bounce_buf = pthread_getspecific(bounce_key);
	if (bounce_buf == NULL) {
		bounce_buf = malloc(BOUNCE_BYTES);
		if (bounce_buf == NULL)
			return -ENOMEM;
		if (pthread_setspecific(bounce_key, bounce_buf) != 0) { /* freed when the thread ends */
			free(bounce_buf);
			return -ENOMEM;
		}
	}
	for (uint64_t off = 0; off < len;) {
		size_t n = len - off < BOUNCE_BYTES ? (size_t)(len - off) : BOUNCE_BYTES;
		struct iovec lv = { bounce_buf, n }, rv = { (void *)(uintptr_t)(remote + off), n };
		int rc = 0;
		if (op == TE_OP_WRITE)
			rc = h->device_copy(h, location, bounce_buf, local + off, n);
		if (rc == 0) {
			ssize_t got = op == TE_OP_READ ? process_vm_readv(s->pid, &lv, 1, &rv, 1, 0)
						       : process_vm_writev(s->pid, &lv, 1, &rv, 1, 0);
			if (got < 0 && errno == ESRCH)
				atomic_store(&s->dead, true);
			rc = got < 0 ? (errno == ESRCH ? -ECONNRESET : -errno) : (size_t)got < n ? -EFAULT : 0;
		}
		if (rc == 0 && op == TE_OP_READ)
			rc = h->device_copy(h, location, local + off, bounce_buf, n);
		if (rc != 0)
			return rc;
		off += n;
	}
	return 0;
}

/* Copies pieces (all of one segment and opcode); `stream`: small ones with
 * streaming stores. */
static void run(shm_ctx *c, shm_seg *s, uint32_t op, shm_piece *ps, unsigned n, bool stream)
{
	struct iovec lv[SHM_CMA_IOV], rv[SHM_CMA_IOV];
	shm_slot *slots[SHM_CMA_IOV];
	unsigned idx[SHM_CMA_IOV], nv = 0;
	dev_batch db;
	done_list dl;
	held_pin held = { 0 };

	db.n = 0;
	dl.held = &held;
	dl.n = 0;
	dl.bytes = 0;
	if (atomic_load_explicit(&s->dead, memory_order_relaxed)) {
		for (unsigned i = 0; i < n; i++)
			done(c, &dl, &ps[i], -ECONNRESET);
		done_flush(c, &dl);
		return;
	}
	for (unsigned i = 0; i < n; i++) {
		shm_piece *p = &ps[i];
		uint64_t remote = p->t->remote + p->off;
		char *local = (char *)p->t->local + p->off;
		bool ldev = local_is_device(p->t);
		if (c->host->canceled(c->host, p->t)) {
			done(c, &dl, p, -ECANCELED);
			continue;
		}
		if (!gate_in(c, p->t)) { /* ended early: not ours to touch */
			done(c, &dl, p, -ETIMEDOUT);
			continue;
		}
		shm_slot *slot = pin_held(s, &held, remote, p->len);
		if (slot == NULL) {
			/* Not a live region of the target (unregistered since its
			 * descriptor was read): refused, as any transport refuses. */
			done_in(c, &dl, p, TE_ERR_REJECTED);
			continue;
		}
		char *there = NULL;
		if (atomic_load_explicit(&slot->kind, memory_order_relaxed) == SLOT_HOST && !ldev &&
		    (there = s->self ? (char *)(uintptr_t)remote : mapped(s, slot, remote, p->len)) != NULL) {
			/* The common case: a copy through our mapping, under the
			 * run's pin. */
			uintptr_t next = stream ? next_source(ps, i, n, op, slot, there, remote) : 0;
			if (op == TE_OP_READ)
				copy(local, there, p->len, stream, next);
			else
				copy(there, local, p->len, stream, next);
			done_in(c, &dl, p, 0);
			continue;
		}
		pin_more(slot); /* what follows unpins it itself */
		if (atomic_load_explicit(&slot->kind, memory_order_relaxed) == SLOT_DEVICE) {
			/* The target's device memory, opened here: one device
			 * copy, device to device when ours is device memory too. */
			const char *loc = NULL;
			char *dev = device_at(s, slot, remote, p->len, &loc);
			if (dev == NULL || (ldev && !same_plugin(loc, p->t->local_location))) {
				if (dev != NULL)
					SLOG(c, TE_LOG_WARN, "shm: %s memory to %s memory: not one device plugin's",
					     p->t->local_location, loc);
				unpin(slot);
				done_in(c, &dl, p, TE_ERR_REJECTED);
				continue;
			}
			if (op == TE_OP_READ)
				dev_add(c, &dl, ps, &db, loc, ldev ? TE_COPY_DEVICE_ONLY : 0, local, dev, p->len, slot, i);
			else
				dev_add(c, &dl, ps, &db, loc, ldev ? TE_COPY_DEVICE_ONLY : 0, dev, local, p->len, slot, i);
			continue;
		}
		/* Host memory of the target: ours is device memory (through our
		 * mapping), or the target's is not mapped here (cross-memory
		 * attach). */
		there = ldev ? (s->self ? (char *)(uintptr_t)remote : mapped(s, slot, remote, p->len)) : NULL;
		if (there != NULL) {
			if (op == TE_OP_READ)
				dev_add(c, &dl, ps, &db, p->t->local_location, 0, local, there, p->len, slot, i);
			else
				dev_add(c, &dl, ps, &db, p->t->local_location, 0, there, local, p->len, slot, i);
			continue;
		}
		if (!s->cma) {
			unpin(slot);
			done_in(c, &dl, p, TE_ERR_REJECTED);
			continue;
		}
		if (ldev) {
			int rc = bounce(c, s, op, local, p->t->local_location, remote, p->len);
			unpin(slot);
			done_in(c, &dl, p, rc);
			continue;
		}
		lv[nv] = (struct iovec){ local, p->len };
		rv[nv] = (struct iovec){ (void *)(uintptr_t)remote, p->len };
		slots[nv] = slot;
		idx[nv++] = i;
	}
	if (held.slot != NULL) {
		stream_fence();
		unpin(held.slot);
	}
	dev_flush(c, &dl, ps, &db);
	if (nv == 0) {
		done_flush(c, &dl);
		return;
	}
	ssize_t got = op == TE_OP_READ ? process_vm_readv(s->pid, lv, nv, rv, nv, 0)
				       : process_vm_writev(s->pid, lv, nv, rv, nv, 0);
	int err = got < 0 ? -errno : 0;
	uint64_t left = got < 0 ? 0 : (uint64_t)got;
	for (unsigned k = 0; k < nv; k++) {
		unpin(slots[k]);
		/* The kernel stops at the first page it cannot reach. */
		if (left >= lv[k].iov_len) {
			left -= lv[k].iov_len;
			done_in(c, &dl, &ps[idx[k]], 0);
		} else {
			left = 0;
			if (err == -ESRCH)
				atomic_store(&s->dead, true);
			done_in(c, &dl, &ps[idx[k]], err ? (err == -ESRCH ? -ECONNRESET : err) : -EFAULT);
		}
	}
	done_flush(c, &dl);
}

/* Runs pieces grouped by (segment, opcode) in runs of up to SHM_CMA_IOV. */
void shm_run_all(shm_ctx *c, shm_piece *ps, unsigned n)
{
	uint64_t total = 0;
	unsigned i = 0;

	for (unsigned k = 0; k < n; k++)
		total += ps[k].len;
	bool stream = c->cfg.stream_bytes > 0 && total >= c->cfg.stream_bytes;
	while (i < n) {
		shm_seg *s = ps[i].t->seg_ctx;
		uint32_t op = ps[i].t->opcode;
		unsigned j = i + 1;
		while (j < n && j - i < SHM_CMA_IOV && ps[j].t->seg_ctx == s && ps[j].t->opcode == op)
			j++;
		run(c, s, op, ps + i, j - i, stream);
		i = j;
	}
}
