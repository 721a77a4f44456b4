/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The registry of local memory: a sorted array of regions behind a
 * reader/writer lock. Lookups (every submit, every remote request a transport
 * serves) take the read lock for a binary search; a remote request pins its
 * region so that unregistering waits for it instead of freeing under it.
 *
 * That wait is bounded (TE_UNREGISTER_TIMEOUT_MS): a peer that drips a
 * WRITE's bytes holds its pin as long as it likes. Past the bound the region
 * is revoked: its holders touch its bytes only between buffer_enter and
 * buffer_leave, which fail from then on, so once the unregister has seen
 * every stretch in progress end, nobody reads or writes the memory again and
 * it returns. The region's struct lives on until its last pin is released.
 */
#include <numa.h>
#include <numaif.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "teu-search.h"
#include "metrics.h"

static void region_free(te_region *r)
{
	if (r == NULL)
		return;
	if (r->fields)
		g_hash_table_unref(r->fields);
	if (r->direct)
		g_hash_table_unref(r->direct);
	g_free(r);
}

void te_memreg_init(te_memreg *m)
{
	g_rw_lock_init(&m->lock);
	g_mutex_init(&m->pin_lock);
	g_cond_init(&m->pin_cond);
	atomic_init(&m->retiring, 0);
	m->regions = g_ptr_array_new();
	m->unregister_ms = TE_UNREGISTER_TIMEOUT_DEFAULT_MS;
}

void te_memreg_clear(te_memreg *m)
{
	if (m->regions == NULL)
		return;
	for (guint i = 0; i < m->regions->len; i++)
		region_free(g_ptr_array_index(m->regions, i));
	g_ptr_array_unref(m->regions);
	m->regions = NULL;
	g_rw_lock_clear(&m->lock);
	g_mutex_clear(&m->pin_lock);
	g_cond_clear(&m->pin_cond);
}

static uint64_t region_start(const void *arr, size_t i)
{
	return (uint64_t)(uintptr_t)((te_region *const *)arr)[i]->addr;
}

/* Index of the last region starting at or below addr, or -1. */
static gssize floor_index(te_memreg *m, uint64_t addr)
{
	return (gssize)teu_count_at_or_below(m->regions->pdata, m->regions->len, region_start, addr) - 1;
}

te_region *te_memreg_find_locked(te_memreg *m, uint64_t addr, uint64_t len)
{
	gssize i = floor_index(m, addr);

	if (i < 0)
		return NULL;
	te_region *r = g_ptr_array_index(m->regions, i);
	return teu_span_within(addr, len, (uint64_t)(uintptr_t)r->addr, r->length) ? r : NULL;
}

/* Pins of buffer_acquire carry this bit in their priv. */
#define PIN_HARD ((uintptr_t)1)

te_region *te_pin_region(const te_buffer_pin *pin)
{
	return (te_region *)((uintptr_t)pin->priv & ~PIN_HARD);
}

/* The calling thread's slot in te_region.active, the same for its life. */
static unsigned access_shard(void)
{
	static atomic_uint next;
	static _Thread_local unsigned shard = UINT_MAX;

	if (shard == UINT_MAX)
		shard = atomic_fetch_add_explicit(&next, 1, memory_order_relaxed) % TE_ACCESS_SHARDS;
	return shard;
}

/* Sequentially consistent against region_revoke's store and sum: either this
 * sees the flag, or the revoking thread sees this count and waits for it. */
bool te_region_enter(te_region *r)
{
	atomic_int *n = &r->active[access_shard()].n;

	atomic_fetch_add(n, 1);
	if (atomic_load(&r->revoked)) {
		atomic_fetch_sub(n, 1);
		return false;
	}
	return true;
}

void te_region_leave(te_region *r)
{
	atomic_fetch_sub_explicit(&r->active[access_shard()].n, 1, memory_order_release);
}

static int active_sum(te_region *r)
{
	int sum = 0;

	for (int i = 0; i < TE_ACCESS_SHARDS; i++)
		sum += atomic_load(&r->active[i].n);
	return sum;
}

void te_memreg_pin_hard(te_buffer_pin *pin)
{
	te_region *r = te_pin_region(pin);

	atomic_fetch_add(&r->hard_pins, 1);
	pin->priv = (void *)((uintptr_t)r | PIN_HARD);
}

int te_memreg_acquire(te_memreg *m, uint64_t addr, uint64_t len, unsigned need, te_buffer_pin *pin)
{
	te_region *r;

	g_rw_lock_reader_lock(&m->lock);
	r = te_memreg_find_locked(m, addr, len);
	if (r == NULL || (r->flags & need) != need) {
		g_rw_lock_reader_unlock(&m->lock);
		return TE_ERR_ADDRESS;
	}
	atomic_fetch_add_explicit(&r->pins, 1, memory_order_acquire);
	g_rw_lock_reader_unlock(&m->lock);
	pin->addr = r->addr;
	pin->length = r->length;
	pin->location = r->location;
	pin->flags = r->flags;
	pin->priv = r;
	return 0;
}

void te_memreg_release(te_memreg *m, te_buffer_pin *pin)
{
	te_region *r = te_pin_region(pin);

	if (r == NULL)
		return;
	if ((uintptr_t)pin->priv & PIN_HARD)
		atomic_fetch_sub(&r->hard_pins, 1);
	pin->priv = NULL;
	/* Only an unregister in progress waits on this: wake it, and only then,
	 * as the wake is a system call and this runs once per remote request.
	 * Sequentially consistent against region_retire's increment and load;
	 * `r` may be gone once the count is down, so only `m` is read after,
	 * unless the unregister gave the region up: then the last pin frees it. */
	int left = atomic_fetch_sub(&r->pins, 1) - 1;
	if (left == TE_PINS_ABANDONED) {
		region_free(r);
		return;
	}
	if (left == 0 && atomic_load(&m->retiring) > 0) {
		g_mutex_lock(&m->pin_lock);
		g_cond_broadcast(&m->pin_cond);
		g_mutex_unlock(&m->pin_lock);
	}
}

static bool location_valid(const char *loc)
{
	const char *colon;
	uint64_t n;

	if (loc == NULL || *loc == '\0' || strlen(loc) > 64)
		return false;
	if (strcmp(loc, "*") == 0)
		return true;
	colon = strchr(loc, ':');
	if (colon == NULL || colon == loc)
		return false;
	for (const char *p = loc; p < colon; p++)
		if (!g_ascii_isalnum(*p) && *p != '_')
			return false;
	return te_parse_u64(colon + 1, &n) && n < 65536;
}

int te_resolve_location(void *addr, size_t len, const char *loc, char **out)
{
	(void)len;
	if (strcmp(loc, "*") != 0) {
		*out = g_strdup(loc);
		return 0;
	}
	if (numa_available() >= 0) {
		long page = sysconf(_SC_PAGESIZE);
		void *pg = (void *)((uintptr_t)addr & ~((uintptr_t)page - 1));
		int status = -1;
		if (move_pages(0, 1, &pg, NULL, &status, 0) == 0 && status >= 0) {
			*out = g_strdup_printf("cpu:%d", status);
			return 0;
		}
	}
	te_info("location '*': cannot tell the NUMA node of %p (memory not touched yet, or no "
		"NUMA support); using cpu:0", addr);
	*out = g_strdup("cpu:0");
	return 0;
}

/* ------------------------------------------------------- public functions */

static int check_region(const te_memory_region *r, size_t idx)
{
	if (r->addr == NULL) {
		te_err("register memory #%zu: NULL address", idx);
		return -EINVAL;
	}
	if (r->length == 0) {
		te_err("register memory #%zu at %p: zero length", idx, r->addr);
		return -EINVAL;
	}
	if ((uintptr_t)r->addr + r->length < (uintptr_t)r->addr) {
		te_err("register memory #%zu at %p: length %zu wraps the address space", idx, r->addr,
		       r->length);
		return -EINVAL;
	}
	if (!location_valid(r->location)) {
		te_err("register memory #%zu at %p: bad location '%s' (want cpu:N, cuda:N or *)", idx,
		       r->addr, r->location ? r->location : "(null)");
		return -EINVAL;
	}
	if (r->flags & ~(unsigned)TE_MEM_REMOTE_ACCESS) {
		te_err("register memory #%zu at %p: unknown flags 0x%x", idx, r->addr, r->flags);
		return -EINVAL;
	}
	return 0;
}

static bool overlaps(uintptr_t a, size_t al, uintptr_t b, size_t bl)
{
	return a < b + bl && b < a + al;
}

/* Hands a region to one transport; stores the buffer fields it returns. */
int te_region_attach(te_engine *e, te_transport_inst *tp, te_region *r)
{
	char *fields = NULL;
	te_mem_info mi = {
		.size = sizeof mi,
		.addr = r->addr,
		.length = r->length,
		.location = r->location,
		.flags = r->flags,
		.device = r->dev != NULL,
	};

	/* Device memory goes only to transports that may move it themselves;
	 * the others never see it (the host stages it for them). */
	if (!TE_HAS_OP(tp->ops, mem_register) ||
	    (r->dev != NULL &&
	     !(tp->ops->flags & (TE_TRANSPORT_DEVICE_MEMORY | TE_TRANSPORT_DEVICE_TARGET))))
		return 0;
	int rc = tp->ops->mem_register(tp->ctx, &mi, &fields);
	if (rc == -ENOTSUP && r->dev != NULL) {
		/* It cannot reach this device memory (no GPUDirect here): staged. */
		te_info("%s memory at %p+%zu: transport %s cannot reach it directly; staged through "
			"host memory", r->location, r->addr, r->length, tp->hc.plugin->name);
		free(fields);
		return 0;
	}
	if (rc == 0 && r->dev != NULL && (tp->ops->flags & TE_TRANSPORT_DEVICE_MEMORY)) {
		if (r->direct == NULL)
			r->direct = g_hash_table_new(g_direct_hash, g_direct_equal);
		g_hash_table_add(r->direct, tp);
		te_info("%s memory at %p+%zu: transport %s moves it directly", r->location, r->addr,
			r->length, tp->hc.plugin->name);
	}
	if (rc < 0) {
		te_err("transport %s refused to register %p+%zu: %s", tp->hc.plugin->name, r->addr,
		       r->length, te_strerror(rc));
		free(fields);
		return rc;
	}
	if (fields != NULL) {
		/* Fields the transport replaced meanwhile (buffer_fields, from
		 * its own threads) are newer than what registration returned. */
		g_rw_lock_writer_lock(&e->mem.lock);
		if (!g_hash_table_contains(r->fields, tp))
			g_hash_table_insert(r->fields, tp, g_strdup(fields));
		g_rw_lock_writer_unlock(&e->mem.lock);
		free(fields);
	}
	return 0;
}

int te_region_set_fields(te_engine *e, te_transport_inst *tp, const void *addr,
			 const char *json_object)
{
	int rc = -ENOENT;

	g_rw_lock_writer_lock(&e->mem.lock);
	for (guint i = 0; i < e->mem.regions->len; i++) {
		te_region *r = g_ptr_array_index(e->mem.regions, i);
		if (r->addr == addr && !r->dying) {
			g_hash_table_replace(r->fields, tp, g_strdup(json_object));
			rc = 0;
			break;
		}
	}
	g_rw_lock_writer_unlock(&e->mem.lock);
	if (rc < 0) {
		te_warn("transport %s changed the fields of buffer %p, which is not registered",
			tp->hc.plugin->name, addr);
		return rc;
	}
	e->mem.publish(e, true);
	return 0;
}

void te_region_detach(te_engine *e, te_transport_inst *tp, te_region *r)
{
	(void)e;
	/* Device memory was registered with a transport that moves it (and
	 * accepted it) or that only serves it to peers. */
	bool registered = r->dev == NULL || te_region_direct(r, tp) ||
			  (!(tp->ops->flags & TE_TRANSPORT_DEVICE_MEMORY) &&
			   (tp->ops->flags & TE_TRANSPORT_DEVICE_TARGET));
	if (TE_HAS_OP(tp->ops, mem_unregister) && registered)
		tp->ops->mem_unregister(tp->ctx, r->addr, r->length);
	g_hash_table_remove(r->fields, tp);
	if (r->direct != NULL)
		g_hash_table_remove(r->direct, tp);
}

static void region_remove_locked(te_memreg *m, te_region *r)
{
	g_ptr_array_remove(m->regions, r);
	m->epoch++;
}

static gint cmp_region(gconstpointer a, gconstpointer b)
{
	const te_region *x = *(te_region *const *)a, *y = *(te_region *const *)b;
	return (uintptr_t)x->addr < (uintptr_t)y->addr ? -1 : (uintptr_t)x->addr > (uintptr_t)y->addr;
}

/* Past the bound: no holder may touch the memory from here on. Waits for
 * the stretches between buffer_enter and buffer_leave in progress (a
 * non-blocking system call or a copy each), and for hard pins, whose holders
 * cannot be told (a transport built before ABI 1.4: as before, unbounded). */
static void region_revoke(te_region *r)
{
	int64_t warn = te_now_ms() + 5000;

	atomic_store(&r->revoked, true);
	while (active_sum(r) > 0)
		g_usleep(50);
	while (atomic_load(&r->hard_pins) > 0) {
		if (te_now_ms() > warn) {
			te_warn("unregister memory %p+%zu: still waiting for %d requests of a transport that "
				"cannot be cut off (built before plugin ABI 1.4)", r->addr, r->length,
				atomic_load(&r->hard_pins));
			warn += 5000;
		}
		g_usleep(1000);
	}
}

/* Waits until no remote request holds the region, at most until `deadline`
 * (g_get_monotonic_time), then lets transports go. Past the deadline the
 * requests holding it are cut off (region_revoke) and their last release
 * frees the region. True when some were. */
static bool region_retire(te_engine *e, te_region *r, gint64 deadline)
{
	bool in_time = true;

	g_mutex_lock(&e->mem.pin_lock);
	atomic_fetch_add(&e->mem.retiring, 1); /* before reading pins: see te_memreg_release */
	while (atomic_load(&r->pins) > 0 && in_time)
		in_time = g_cond_wait_until(&e->mem.pin_cond, &e->mem.pin_lock, deadline) ||
			  atomic_load(&r->pins) == 0;
	atomic_fetch_sub(&e->mem.retiring, 1);
	g_mutex_unlock(&e->mem.pin_lock);
	int held = atomic_load(&r->pins);
	if (held > 0) {
		te_warn_limited("unregister memory %p+%zu: %d remote requests still hold it after %lld ms "
				"(TE_UNREGISTER_TIMEOUT_MS); cutting them off", r->addr, r->length, held,
				(long long)e->mem.unregister_ms);
		region_revoke(r);
	}
	for (guint i = 0; i < e->transports->len; i++)
		te_region_detach(e, g_ptr_array_index(e->transports, i), r);
	/* Exactly one of this and the last release sees no pins left. */
	if (atomic_fetch_add(&r->pins, TE_PINS_ABANDONED) == 0)
		region_free(r);
	return held > 0;
}

static gint64 retire_deadline(te_engine *e)
{
	return g_get_monotonic_time() + e->mem.unregister_ms * 1000;
}

/* Retires registered regions already out of the registry, under one bound
 * for them all, and takes them off the memory metrics (hidden ones were
 * never on them). */
static void regions_unregistered(te_engine *e, GPtrArray *gone)
{
	gint64 deadline = retire_deadline(e);

	for (guint i = 0; i < gone->len; i++) {
		te_region *r = g_ptr_array_index(gone, i);
		if (!r->hidden)
			te_metric_count_memory(e, -(int64_t)r->length, -1);
		region_retire(e, r, deadline);
	}
}

static int register_regions(te_engine *e, const te_memory_region *regs, size_t n, bool hidden);

int te_register_memory_batch(te_engine *e, const te_memory_region *regs, size_t n)
{
	return register_regions(e, regs, n, false);
}

int te_register_hidden(te_engine *e, void *addr, size_t len)
{
	te_memory_region r = { .addr = addr, .length = len, .location = "*", .flags = 0 };
	return register_regions(e, &r, 1, true);
}

/* The check the calls on a list of n regions start with: -EINVAL (logged)
 * for a NULL engine or a NULL list of some, else 0. */
static int list_args(const te_engine *e, const void *list, size_t n, const char *call, const char *what)
{
	if (e == NULL || (list == NULL && n > 0)) {
		te_err("%s: NULL %s", call, e == NULL ? "engine" : what);
		return -EINVAL;
	}
	return 0;
}

static int register_regions(te_engine *e, const te_memory_region *regs, size_t n, bool hidden)
{
	GPtrArray *added;
	int rc = list_args(e, regs, n, "te_register_memory", "regions");

	if (rc < 0 || n == 0)
		return rc;
	for (size_t i = 0; i < n; i++) {
		if ((rc = check_region(&regs[i], i)) < 0)
			return rc;
		for (size_t j = 0; j < i; j++)
			if (overlaps((uintptr_t)regs[i].addr, regs[i].length, (uintptr_t)regs[j].addr,
				     regs[j].length)) {
				te_err("register memory: %p+%zu overlaps %p+%zu in the same call",
				       regs[i].addr, regs[i].length, regs[j].addr, regs[j].length);
				return TE_ERR_OVERLAP;
			}
	}

	/* What kind of memory each region is, asked of the device plugins once
	 * here so that no request has to. */
	te_device **devs = g_new0(te_device *, n);
	int *dev_index = g_new0(int, n);
	if (te_devices_present()) {
		for (size_t i = 0; i < n; i++) {
			te_device_classify(regs[i].addr, regs[i].length, &devs[i], &dev_index[i]);
			if (devs[i] != NULL)
				te_dbg("register memory #%zu at %p: device memory of %s:%d", i,
				       regs[i].addr, devs[i]->ops->prefix, dev_index[i]);
		}
	}

	g_rec_mutex_lock(&e->ctl);
	added = g_ptr_array_new();
	g_rw_lock_writer_lock(&e->mem.lock);
	for (size_t i = 0; i < n; i++) {
		for (guint k = 0; k < e->mem.regions->len; k++) {
			te_region *o = g_ptr_array_index(e->mem.regions, k);
			if (overlaps((uintptr_t)regs[i].addr, regs[i].length, (uintptr_t)o->addr,
				     o->length)) {
				te_err("register memory: %p+%zu overlaps registered %p+%zu", regs[i].addr,
				       regs[i].length, o->addr, o->length);
				rc = TE_ERR_OVERLAP;
				break;
			}
		}
		if (rc < 0)
			break;
	}
	if (rc == 0) {
		for (size_t i = 0; i < n; i++) {
			te_region *r = g_new0(te_region, 1);
			r->addr = regs[i].addr;
			r->length = regs[i].length;
			r->flags = regs[i].flags;
			r->fields = g_hash_table_new_full(g_direct_hash, g_direct_equal, NULL, g_free);
			char *loc = NULL;
			r->dev = devs[i];
			r->hidden = hidden;
			if (r->dev != NULL && strcmp(regs[i].location, "*") == 0)
				loc = g_strdup_printf("%s:%d", r->dev->ops->prefix, dev_index[i]);
			else
				te_resolve_location(r->addr, r->length, regs[i].location, &loc);
			/* Interned: transfers in flight keep pointing at it after an
			 * unregister (te_transfer.local_location). */
			r->location = g_intern_string(loc);
			g_free(loc);
			g_ptr_array_add(e->mem.regions, r);
			g_ptr_array_add(added, r);
		}
		g_ptr_array_sort(e->mem.regions, cmp_region);
		e->mem.epoch++;
	}
	g_rw_lock_writer_unlock(&e->mem.lock);

	/* Transports register outside the registry lock: RDMA pins pages, slow. */
	for (guint i = 0; rc == 0 && i < added->len; i++) {
		te_region *r = g_ptr_array_index(added, i);
		for (guint t = 0; rc == 0 && t < e->transports->len; t++)
			rc = te_region_attach(e, g_ptr_array_index(e->transports, t), r);
	}
	if (rc < 0) {
		g_rw_lock_writer_lock(&e->mem.lock);
		for (guint i = 0; i < added->len; i++)
			region_remove_locked(&e->mem, g_ptr_array_index(added, i));
		g_rw_lock_writer_unlock(&e->mem.lock);
		gint64 deadline = retire_deadline(e);
		for (guint i = 0; i < added->len; i++)
			region_retire(e, g_ptr_array_index(added, i), deadline);
	} else {
		for (guint i = 0; i < added->len; i++) {
			te_region *r = g_ptr_array_index(added, i);
			te_dbg("registered %p+%zu at %s%s", r->addr, r->length, r->location,
			       (r->flags & TE_MEM_REMOTE_ACCESS) ? " (remote access)" : "");
			if (!r->hidden) /* libte's own staging is not the application's */
				te_metric_count_memory(e, (int64_t)r->length, 1);
		}
		int prc = e->mem.publish(e, false);
		if (prc < 0)
			te_warn("memory registered, but publishing the descriptor failed: %s",
				te_strerror(prc));
	}
	g_ptr_array_unref(added);
	g_rec_mutex_unlock(&e->ctl);
	g_free(devs);
	g_free(dev_index);
	return rc;
}

int te_register_memory(te_engine *e, void *addr, size_t length, const char *location, unsigned flags)
{
	te_memory_region r = { addr, length, location, flags };
	return te_register_memory_batch(e, &r, 1);
}

int te_unregister_memory_batch(te_engine *e, void *const *addrs, size_t n)
{
	GPtrArray *gone;
	int rc = list_args(e, addrs, n, "te_unregister_memory", "address list");

	if (rc < 0 || n == 0)
		return rc;
	g_rec_mutex_lock(&e->ctl);
	gone = g_ptr_array_new();
	g_rw_lock_writer_lock(&e->mem.lock);
	for (size_t i = 0; i < n; i++) {
		gssize k = addrs[i] ? floor_index(&e->mem, (uintptr_t)addrs[i]) : -1;
		te_region *r = k >= 0 ? g_ptr_array_index(e->mem.regions, k) : NULL;
		if (r == NULL || r->addr != addrs[i] || g_ptr_array_find(gone, r, NULL)) {
			te_err("unregister memory: %p is not the start of a registered region", addrs[i]);
			rc = -ENOENT;
			break;
		}
		g_ptr_array_add(gone, r);
	}
	for (guint i = 0; rc == 0 && i < gone->len; i++)
		((te_region *)g_ptr_array_index(gone, i))->dying = true;
	g_rw_lock_writer_unlock(&e->mem.lock);
	if (rc == 0) {
		/* The descriptor without the regions goes out before they leave the
		 * registry: a peer refused a range re-fetches the descriptor and
		 * must find it gone (ctl keeps other registry changes out). */
		int prc = e->mem.publish(e, false);
		if (prc < 0)
			te_warn("memory unregistered, but publishing the descriptor failed: %s",
				te_strerror(prc));
		g_rw_lock_writer_lock(&e->mem.lock);
		for (guint i = 0; i < gone->len; i++)
			region_remove_locked(&e->mem, g_ptr_array_index(gone, i));
		g_rw_lock_writer_unlock(&e->mem.lock);
		regions_unregistered(e, gone);
	}
	g_ptr_array_unref(gone);
	g_rec_mutex_unlock(&e->ctl);
	return rc;
}

void te_memreg_revoke_all(te_engine *e)
{
	g_rec_mutex_lock(&e->ctl);
	g_rw_lock_writer_lock(&e->mem.lock);
	GPtrArray *gone = e->mem.regions;
	e->mem.regions = g_ptr_array_new();
	e->mem.epoch++;
	g_rw_lock_writer_unlock(&e->mem.lock);
	regions_unregistered(e, gone);
	g_ptr_array_unref(gone);
	g_rec_mutex_unlock(&e->ctl);
}

int te_unregister_memory(te_engine *e, void *addr)
{
	return te_unregister_memory_batch(e, &addr, 1);
}
