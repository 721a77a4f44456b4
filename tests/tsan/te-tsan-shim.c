/* GLib's threading primitives in a form ThreadSanitizer can see; test-only,
 * never installed (docs/reliability.md, "ThreadSanitizer").
 *
 * On Linux GLib builds GMutex and GCond on raw futexes, which TSan does not
 * know, and its queue hand-offs (GAsyncQueue under GThreadPool, GMainContext)
 * happen inside GLib where the runtime cannot look. This library is put in
 * front of GLib with LD_PRELOAD: every call that goes through the PLT (all
 * of libte, the plugins, the tests, json-glib, gio, libsoup) lands here
 * instead, and everything here synchronises with pthreads, which TSan
 * intercepts. GLib's calls to itself are bound inside the library
 * (-Bsymbolic-functions) and keep GLib's own objects on GLib's own code, so
 * the two implementations never share an object.
 *
 *  - GMutex, GRecMutex, GRWLock, GCond: pthread objects allocated on first
 *    use and kept in the GLib struct's pointer, as GLib's non-futex build
 *    does.
 *  - GThreadPool: a small pthread pool with the whole public API.
 *  - Hand-offs that stay inside GLib get TSan annotations that state exactly
 *    the ordering GLib guarantees: a source attached before its idle or
 *    timeout callback runs, g_once_init_leave before a g_once_init_enter
 *    that sees the value, every g_atomic_ref_count_dec before the one that
 *    drops the last reference.
 *
 * The library itself is not instrumented and does not link GLib or the TSan
 * runtime: preloaded into a shell, python or a server it only defines
 * symbols nobody calls. GLib functions are looked up with dlsym, the TSan
 * annotations are weak and do nothing where the runtime is absent. */
#define GLIB_DISABLE_DEPRECATION_WARNINGS
#include <glib.h>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#define SHIM __attribute__((visibility("default")))

/* The TSan runtime's annotation entry points (absent: not under TSan). */
extern void __tsan_acquire(void *addr) __attribute__((weak));
extern void __tsan_release(void *addr) __attribute__((weak));

static inline void hb_acquire(const volatile void *addr)
{
	if (__tsan_acquire)
		__tsan_acquire((void *)addr);
}

static inline void hb_release(const volatile void *addr)
{
	if (__tsan_release)
		__tsan_release((void *)addr);
}

/* GLib's own definition of a symbol this library replaces or wraps. */
static void *real(const char *name)
{
	void *f = dlsym(RTLD_NEXT, name);
	if (f == NULL)
		abort();
	return f;
}
#define REAL(type, name) ((type)real_cached(&real_##name, #name))
static void *real_cached(void *volatile *slot, const char *name)
{
	void *f = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
	if (f == NULL) {
		f = real(name);
		__atomic_store_n(slot, f, __ATOMIC_RELEASE);
	}
	return f;
}

/* ---- lazily allocated pthread objects ---------------------------------- */

/* Publishes *slot once: the release before the exchange orders the object's
 * initialisation before every thread that later acquires the slot. */
static void *publish(gpointer *slot, void *fresh, void (*discard)(void *))
{
	void *expected = NULL;
	hb_release(slot);
	if (!__atomic_compare_exchange_n(slot, &expected, fresh, FALSE, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE)) {
		/* Another thread published first: order its initialisation too. */
		discard(fresh);
		hb_acquire(slot);
		return expected;
	}
	return fresh;
}

static void *load_slot(gpointer *slot)
{
	void *p = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
	if (p != NULL)
		hb_acquire(slot);
	return p;
}

static void *mutex_new(int type)
{
	pthread_mutexattr_t a;
	pthread_mutex_t *m = malloc(sizeof *m);
	if (m == NULL)
		abort();
	pthread_mutexattr_init(&a);
	pthread_mutexattr_settype(&a, type);
	if (pthread_mutex_init(m, &a) != 0)
		abort();
	pthread_mutexattr_destroy(&a);
	return m;
}

static void mutex_free(void *p)
{
	pthread_mutex_destroy(p);
	free(p);
}

static void *cond_new(void)
{
	pthread_condattr_t a;
	pthread_cond_t *c = malloc(sizeof *c);
	if (c == NULL)
		abort();
	/* g_cond_wait_until takes g_get_monotonic_time() deadlines. */
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	if (pthread_cond_init(c, &a) != 0)
		abort();
	pthread_condattr_destroy(&a);
	return c;
}

static void cond_free(void *p)
{
	pthread_cond_destroy(p);
	free(p);
}

static void *rwlock_new(void)
{
	pthread_rwlock_t *l = malloc(sizeof *l);
	if (l == NULL || pthread_rwlock_init(l, NULL) != 0)
		abort();
	return l;
}

static void rwlock_free(void *p)
{
	pthread_rwlock_destroy(p);
	free(p);
}

/* Clearing: the object may have been made by another thread. */
static void *take_slot(gpointer *slot)
{
	void *p = load_slot(slot);
	*slot = NULL;
	return p;
}

/*
 * A GLib type whose member `p` holds a pthread object of type `ptype`, made
 * by `new_` and dropped by `free_`: prefix_impl() finds the object, making
 * it at first use (GLib lets statics go without init), and g_prefix_init()
 * and g_prefix_clear(). GMutex, GRecMutex, GRWLock and GCond differ in
 * nothing else here.
 */
#define SHIM_OBJECT(prefix, gtype, ptype, new_, free_)                    \
	static ptype *prefix##_impl(gtype *o)                              \
	{                                                                  \
		ptype *p = load_slot(&o->p);                               \
		return p ? p : publish(&o->p, new_, free_);                \
	}                                                                  \
	SHIM void g_##prefix##_init(gtype *o)                              \
	{                                                                  \
		o->p = new_;                                               \
		hb_release(&o->p);                                         \
	}                                                                  \
	SHIM void g_##prefix##_clear(gtype *o)                             \
	{                                                                  \
		void *p = take_slot(&o->p);                                \
		if (p)                                                     \
			free_(p);                                          \
	}

/* Lock, trylock and unlock of a GLib type through `ptype`'s calls `lock_`,
 * `trylock_` and `unlock_`, on prefix_impl()'s object; a lock that fails
 * aborts, as GLib's do. */
#define SHIM_LOCK(name, gtype, impl, lock_, trylock_, unlock_)            \
	SHIM void name##_lock(gtype *o)                                    \
	{                                                                  \
		if (lock_(impl(o)) != 0)                                   \
			abort();                                           \
	}                                                                  \
	SHIM gboolean name##_trylock(gtype *o)                             \
	{                                                                  \
		return trylock_(impl(o)) == 0;                             \
	}                                                                  \
	SHIM void name##_unlock(gtype *o)                                  \
	{                                                                  \
		unlock_(impl(o));                                          \
	}

/* GMutex's unlock aborts on an error, as GLib's does. */
static int mutex_unlock_checked(pthread_mutex_t *m)
{
	if (pthread_mutex_unlock(m) != 0)
		abort();
	return 0;
}

/* ---- GMutex ------------------------------------------------------------- */

SHIM_OBJECT(mutex, GMutex, pthread_mutex_t, mutex_new(PTHREAD_MUTEX_NORMAL), mutex_free)
SHIM_LOCK(g_mutex, GMutex, mutex_impl, pthread_mutex_lock, pthread_mutex_trylock, mutex_unlock_checked)

SHIM GMutex *g_mutex_new(void)
{
	GMutex *m = calloc(1, sizeof *m);
	if (m == NULL)
		abort();
	g_mutex_init(m);
	return m;
}

SHIM void g_mutex_free(GMutex *m)
{
	g_mutex_clear(m);
	free(m);
}

/* ---- GRecMutex ---------------------------------------------------------- */

SHIM_OBJECT(rec_mutex, GRecMutex, pthread_mutex_t, mutex_new(PTHREAD_MUTEX_RECURSIVE), mutex_free)
SHIM_LOCK(g_rec_mutex, GRecMutex, rec_mutex_impl, pthread_mutex_lock, pthread_mutex_trylock, mutex_unlock_checked)

/* ---- GRWLock ------------------------------------------------------------ */

SHIM_OBJECT(rw_lock, GRWLock, pthread_rwlock_t, rwlock_new(), rwlock_free)
SHIM_LOCK(g_rw_lock_writer, GRWLock, rw_lock_impl, pthread_rwlock_wrlock, pthread_rwlock_trywrlock,
	  pthread_rwlock_unlock)
SHIM_LOCK(g_rw_lock_reader, GRWLock, rw_lock_impl, pthread_rwlock_rdlock, pthread_rwlock_tryrdlock,
	  pthread_rwlock_unlock)

/* ---- GCond -------------------------------------------------------------- */

SHIM_OBJECT(cond, GCond, pthread_cond_t, cond_new(), cond_free)

SHIM void g_cond_wait(GCond *c, GMutex *m)
{
	pthread_cond_t *cv = cond_impl(c);
	if (pthread_cond_wait(cv, mutex_impl(m)) != 0)
		abort();
}

SHIM void g_cond_signal(GCond *c)
{
	pthread_cond_signal(cond_impl(c));
}

SHIM void g_cond_broadcast(GCond *c)
{
	pthread_cond_broadcast(cond_impl(c));
}

static gboolean wait_until_mono(pthread_cond_t *cv, pthread_mutex_t *m, gint64 end_us)
{
	struct timespec ts;
	if (end_us < 0)
		end_us = 0;
	ts.tv_sec = end_us / G_USEC_PER_SEC;
	ts.tv_nsec = (end_us % G_USEC_PER_SEC) * 1000;
	int rc = pthread_cond_timedwait(cv, m, &ts);
	if (rc != 0 && rc != ETIMEDOUT)
		abort();
	return rc == 0;
}

static gint64 mono_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (gint64)ts.tv_sec * G_USEC_PER_SEC + ts.tv_nsec / 1000;
}

SHIM gboolean g_cond_wait_until(GCond *c, GMutex *m, gint64 end_time)
{
	pthread_cond_t *cv = cond_impl(c);
	return wait_until_mono(cv, mutex_impl(m), end_time);
}

/* Deprecated, but GLib's copy would hand our mutex to its futex condition. */
SHIM gboolean g_cond_timed_wait(GCond *c, GMutex *m, GTimeVal *abs_time)
{
	if (abs_time == NULL) {
		g_cond_wait(c, m);
		return TRUE;
	}
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	gint64 left = ((gint64)abs_time->tv_sec - now.tv_sec) * G_USEC_PER_SEC +
		      ((gint64)abs_time->tv_usec - now.tv_nsec / 1000);
	pthread_cond_t *cv = cond_impl(c);
	return wait_until_mono(cv, mutex_impl(m), mono_us() + (left > 0 ? left : 0));
}

SHIM GCond *g_cond_new(void)
{
	GCond *c = calloc(1, sizeof *c);
	if (c == NULL)
		abort();
	g_cond_init(c);
	return c;
}

SHIM void g_cond_free(GCond *c)
{
	g_cond_clear(c);
	free(c);
}

/* ---- GThreadPool -------------------------------------------------------- */

/* What callers rely on (libte, the plugins, GTask in gio): tasks run on up
 * to max_threads threads in the order pushed (or by the sort function);
 * free(immediate = FALSE, wait = TRUE) returns after every queued task has
 * run and every thread has left the pool's code; free(wait = FALSE) lets the
 * threads finish the queue and the last one frees the pool. Threads of a
 * non-exclusive pool leave after idling for a while, as GLib's do. */

typedef struct shim_item {
	struct shim_item *next;
	gpointer data;
} shim_item;

typedef struct {
	GThreadPool pub; /* first: GLib's public fields (func, user_data, exclusive) */
	GDestroyNotify item_free;
	pthread_mutex_t lock;
	pthread_cond_t work; /* a task was queued, or the pool is stopping */
	pthread_cond_t gone; /* a thread left */
	shim_item *head, *tail;
	guint queued;
	gint max_threads; /* -1: no limit */
	guint threads, idle;
	gboolean running, detached;
	GCompareDataFunc sort;
	gpointer sort_data;
} shim_pool;

static guint pool_idle_ms = 2000;
static gint pool_max_unused = 2;

static void pool_destroy(shim_pool *p)
{
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->work);
	pthread_cond_destroy(&p->gone);
	free(p);
}

static void *pool_thread(void *arg)
{
	shim_pool *p = arg;
	gboolean destroy = FALSE;

	pthread_mutex_lock(&p->lock);
	for (;;) {
		while (p->head == NULL && p->running) {
			p->idle++;
			gboolean woke = TRUE;
			if (p->pub.exclusive) {
				pthread_cond_wait(&p->work, &p->lock);
			} else {
				gint64 end = mono_us() + (gint64)pool_idle_ms * 1000;
				woke = wait_until_mono(&p->work, &p->lock, end);
			}
			p->idle--;
			if (!woke && p->head == NULL)
				goto leave;
		}
		if (p->head == NULL)
			break; /* stopping, queue done */
		if (p->max_threads >= 0 && p->threads > (guint)p->max_threads && !p->pub.exclusive)
			break; /* the limit was lowered */
		shim_item *it = p->head;
		p->head = it->next;
		if (p->head == NULL)
			p->tail = NULL;
		p->queued--;
		pthread_mutex_unlock(&p->lock);
		p->pub.func(it->data, p->pub.user_data);
		free(it);
		pthread_mutex_lock(&p->lock);
	}
leave:
	p->threads--;
	if (p->threads == 0 && !p->running && p->detached)
		destroy = TRUE;
	pthread_cond_broadcast(&p->gone);
	pthread_mutex_unlock(&p->lock);
	if (destroy)
		pool_destroy(p);
	return NULL;
}

/* Called with the lock held. */
static gboolean pool_spawn(shim_pool *p)
{
	pthread_t t;
	pthread_attr_t a;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	int rc = pthread_create(&t, &a, pool_thread, p);
	pthread_attr_destroy(&a);
	if (rc != 0)
		return FALSE;
	p->threads++;
	return TRUE;
}

static void pool_fill(shim_pool *p)
{
	while (p->running && p->queued > p->idle &&
	       (p->max_threads < 0 || p->threads < (guint)p->max_threads))
		if (!pool_spawn(p))
			break;
}

SHIM GThreadPool *g_thread_pool_new_full(GFunc func, gpointer user_data, GDestroyNotify item_free_func,
					 gint max_threads, gboolean exclusive, GError **error)
{
	(void)error;
	if (func == NULL || max_threads < -1 || (exclusive && max_threads < 0))
		return NULL;
	shim_pool *p = calloc(1, sizeof *p);
	if (p == NULL)
		abort();
	p->pub.func = func;
	p->pub.user_data = user_data;
	p->pub.exclusive = exclusive;
	p->item_free = item_free_func;
	p->max_threads = max_threads;
	p->running = TRUE;
	pthread_mutex_init(&p->lock, NULL);
	pthread_condattr_t a;
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&p->work, &a);
	pthread_cond_init(&p->gone, &a);
	pthread_condattr_destroy(&a);
	if (exclusive) {
		pthread_mutex_lock(&p->lock);
		while (p->threads < (guint)max_threads && pool_spawn(p))
			;
		pthread_mutex_unlock(&p->lock);
	}
	return &p->pub;
}

SHIM GThreadPool *g_thread_pool_new(GFunc func, gpointer user_data, gint max_threads, gboolean exclusive,
				    GError **error)
{
	return g_thread_pool_new_full(func, user_data, NULL, max_threads, exclusive, error);
}

SHIM gboolean g_thread_pool_push(GThreadPool *pool, gpointer data, GError **error)
{
	shim_pool *p = (shim_pool *)pool;
	(void)error;
	shim_item *it = malloc(sizeof *it);
	if (it == NULL)
		abort();
	it->data = data;
	it->next = NULL;
	pthread_mutex_lock(&p->lock);
	if (!p->running) {
		pthread_mutex_unlock(&p->lock);
		free(it);
		return FALSE;
	}
	if (p->sort == NULL || p->tail == NULL) {
		if (p->tail)
			p->tail->next = it;
		else
			p->head = it;
		p->tail = it;
	} else {
		/* After every task that does not sort after it (stable). */
		shim_item **at = &p->head;
		while (*at != NULL && p->sort((*at)->data, data, p->sort_data) <= 0)
			at = &(*at)->next;
		it->next = *at;
		*at = it;
		if (it->next == NULL)
			p->tail = it;
	}
	p->queued++;
	pthread_cond_signal(&p->work);
	pool_fill(p);
	pthread_mutex_unlock(&p->lock);
	return TRUE;
}

SHIM void g_thread_pool_free(GThreadPool *pool, gboolean immediate, gboolean wait_)
{
	shim_pool *p = (shim_pool *)pool;
	shim_item *dropped = NULL;

	pthread_mutex_lock(&p->lock);
	p->running = FALSE;
	if (immediate) {
		dropped = p->head;
		p->head = p->tail = NULL;
		p->queued = 0;
	}
	pthread_cond_broadcast(&p->work);
	gboolean destroy = FALSE;
	if (wait_) {
		while (p->threads > 0)
			pthread_cond_wait(&p->gone, &p->lock);
		destroy = TRUE;
	} else if (p->threads == 0) {
		destroy = TRUE;
	} else {
		p->detached = TRUE;
	}
	pthread_mutex_unlock(&p->lock);
	while (dropped != NULL) {
		shim_item *next = dropped->next;
		if (p->item_free)
			p->item_free(dropped->data);
		free(dropped);
		dropped = next;
	}
	if (destroy)
		pool_destroy(p);
}

SHIM guint g_thread_pool_unprocessed(GThreadPool *pool)
{
	shim_pool *p = (shim_pool *)pool;
	pthread_mutex_lock(&p->lock);
	guint n = p->queued;
	pthread_mutex_unlock(&p->lock);
	return n;
}

SHIM void g_thread_pool_set_sort_function(GThreadPool *pool, GCompareDataFunc func, gpointer user_data)
{
	shim_pool *p = (shim_pool *)pool;
	pthread_mutex_lock(&p->lock);
	p->sort = func;
	p->sort_data = user_data;
	if (func != NULL && p->head != NULL) {
		/* Re-queue what is waiting in the new order (insertion sort). */
		shim_item *list = p->head, *sorted = NULL;
		while (list != NULL) {
			shim_item *it = list, **at = &sorted;
			list = list->next;
			while (*at != NULL && func((*at)->data, it->data, user_data) <= 0)
				at = &(*at)->next;
			it->next = *at;
			*at = it;
		}
		p->head = sorted;
		for (p->tail = sorted; p->tail->next != NULL; p->tail = p->tail->next)
			;
	}
	pthread_mutex_unlock(&p->lock);
}

SHIM gboolean g_thread_pool_move_to_front(GThreadPool *pool, gpointer data)
{
	shim_pool *p = (shim_pool *)pool;
	gboolean found = FALSE;
	pthread_mutex_lock(&p->lock);
	for (shim_item **at = &p->head, *prev = NULL; *at != NULL; prev = *at, at = &(*at)->next) {
		if ((*at)->data != data)
			continue;
		shim_item *it = *at;
		*at = it->next;
		if (p->tail == it)
			p->tail = prev;
		it->next = p->head;
		p->head = it;
		if (p->tail == NULL)
			p->tail = it;
		found = TRUE;
		break;
	}
	pthread_mutex_unlock(&p->lock);
	return found;
}

SHIM gboolean g_thread_pool_set_max_threads(GThreadPool *pool, gint max_threads, GError **error)
{
	shim_pool *p = (shim_pool *)pool;
	(void)error;
	if (max_threads < -1 || (p->pub.exclusive && max_threads < 0))
		return FALSE;
	pthread_mutex_lock(&p->lock);
	p->max_threads = max_threads;
	if (p->pub.exclusive) {
		while (p->threads < (guint)max_threads && pool_spawn(p))
			;
	}
	pool_fill(p);
	pthread_cond_broadcast(&p->work); /* threads over a lowered limit leave */
	pthread_mutex_unlock(&p->lock);
	return TRUE;
}

SHIM gint g_thread_pool_get_max_threads(GThreadPool *pool)
{
	shim_pool *p = (shim_pool *)pool;
	pthread_mutex_lock(&p->lock);
	gint n = p->max_threads;
	pthread_mutex_unlock(&p->lock);
	return n;
}

SHIM guint g_thread_pool_get_num_threads(GThreadPool *pool)
{
	shim_pool *p = (shim_pool *)pool;
	pthread_mutex_lock(&p->lock);
	guint n = p->threads;
	pthread_mutex_unlock(&p->lock);
	return n;
}

/* Process-wide knobs of GLib's shared idle threads; this pool keeps none
 * beyond the idle time, so they only remember their value. */
SHIM void g_thread_pool_set_max_unused_threads(gint max_threads)
{
	__atomic_store_n(&pool_max_unused, max_threads, __ATOMIC_RELAXED);
}

SHIM gint g_thread_pool_get_max_unused_threads(void)
{
	return __atomic_load_n(&pool_max_unused, __ATOMIC_RELAXED);
}

SHIM guint g_thread_pool_get_num_unused_threads(void)
{
	return 0;
}

SHIM void g_thread_pool_stop_unused_threads(void)
{
}

SHIM void g_thread_pool_set_max_idle_time(guint interval)
{
	__atomic_store_n(&pool_idle_ms, interval ? interval : 2000, __ATOMIC_RELAXED);
}

SHIM guint g_thread_pool_get_max_idle_time(void)
{
	return __atomic_load_n(&pool_idle_ms, __ATOMIC_RELAXED);
}

/* ---- hand-offs inside GLib, annotated ----------------------------------- */

static void *real_g_once_init_enter, *real_g_once_init_leave, *real_g_atomic_ref_count_dec;
static void *real_g_source_set_callback, *real_g_source_attach, *real_g_idle_source_new,
	*real_g_timeout_source_new, *real_g_timeout_source_new_seconds, *real_g_source_set_priority,
	*real_g_source_unref, *real_g_idle_funcs, *real_g_timeout_funcs;

/* g_once_init_enter's fast path is an atomic load in the caller's
 * (instrumented) code; the store it reads is made inside GLib. */
SHIM gboolean(g_once_init_enter)(volatile void *location)
{
	gboolean first = REAL(gboolean (*)(volatile void *), g_once_init_enter)(location);
	if (!first)
		hb_acquire(location);
	return first;
}

SHIM void(g_once_init_leave)(volatile void *location, gsize result)
{
	hb_release(location);
	REAL(void (*)(volatile void *, gsize), g_once_init_leave)(location, result);
}

/* The thread that drops the last reference frees what the others used. */
SHIM gboolean(g_atomic_ref_count_dec)(gatomicrefcount *arc)
{
	hb_release(arc);
	gboolean last = REAL(gboolean (*)(gatomicrefcount *), g_atomic_ref_count_dec)(arc);
	if (last)
		hb_acquire(arc);
	return last;
}

/* An idle or timeout callback runs on the context's thread after the source
 * was attached (GMainContext's lock, inside GLib). Only these two kinds are
 * wrapped: their dispatch calls a plain GSourceFunc with the data. */
typedef struct {
	GSourceFunc func;
	gpointer data;
	GDestroyNotify notify;
	GSource *source;
} shim_cb;

static gboolean shim_cb_run(gpointer arg)
{
	shim_cb *c = arg;
	hb_acquire(c);
	hb_acquire(c->source);
	return c->func(c->data);
}

static void shim_cb_free(gpointer arg)
{
	shim_cb *c = arg;
	hb_acquire(c);
	if (c->notify)
		c->notify(c->data);
	free(c);
}

SHIM void g_source_set_callback(GSource *source, GSourceFunc func, gpointer data, GDestroyNotify notify)
{
	typedef void (*set_cb_fn)(GSource *, GSourceFunc, gpointer, GDestroyNotify);
	if (source != NULL && func != NULL &&
	    (source->source_funcs == real_cached(&real_g_idle_funcs, "g_idle_funcs") ||
	     source->source_funcs == real_cached(&real_g_timeout_funcs, "g_timeout_funcs"))) {
		shim_cb *c = malloc(sizeof *c);
		if (c == NULL)
			abort();
		c->func = func;
		c->data = data;
		c->notify = notify;
		c->source = source;
		hb_release(c);
		REAL(set_cb_fn, g_source_set_callback)(source, shim_cb_run, c, shim_cb_free);
		return;
	}
	REAL(set_cb_fn, g_source_set_callback)(source, func, data, notify);
}

SHIM guint g_source_attach(GSource *source, GMainContext *context)
{
	hb_release(source);
	return REAL(guint (*)(GSource *, GMainContext *), g_source_attach)(source, context);
}

/* GLib's g_idle_add and g_timeout_add set the callback inside GLib. */
static guint add_source(GSource *s, gint priority, GSourceFunc func, gpointer data, GDestroyNotify notify)
{
	REAL(void (*)(GSource *, gint), g_source_set_priority)(s, priority);
	g_source_set_callback(s, func, data, notify);
	guint id = g_source_attach(s, NULL);
	REAL(void (*)(GSource *), g_source_unref)(s);
	return id;
}

SHIM guint g_idle_add_full(gint priority, GSourceFunc func, gpointer data, GDestroyNotify notify)
{
	GSource *s = REAL(GSource * (*)(void), g_idle_source_new)();
	return add_source(s, priority, func, data, notify);
}

SHIM guint g_idle_add(GSourceFunc func, gpointer data)
{
	return g_idle_add_full(G_PRIORITY_DEFAULT_IDLE, func, data, NULL);
}

SHIM guint g_timeout_add_full(gint priority, guint interval, GSourceFunc func, gpointer data,
			      GDestroyNotify notify)
{
	GSource *s = REAL(GSource * (*)(guint), g_timeout_source_new)(interval);
	return add_source(s, priority, func, data, notify);
}

SHIM guint g_timeout_add(guint interval, GSourceFunc func, gpointer data)
{
	return g_timeout_add_full(G_PRIORITY_DEFAULT, interval, func, data, NULL);
}

SHIM guint g_timeout_add_seconds_full(gint priority, guint interval, GSourceFunc func, gpointer data,
				      GDestroyNotify notify)
{
	GSource *s = REAL(GSource * (*)(guint), g_timeout_source_new_seconds)(interval);
	return add_source(s, priority, func, data, notify);
}

SHIM guint g_timeout_add_seconds(guint interval, GSourceFunc func, gpointer data)
{
	return g_timeout_add_seconds_full(G_PRIORITY_DEFAULT, interval, func, data, NULL);
}

/* g_strerror caches each message in a table under a lock inside GLib: the
 * thread that first asks for a message allocates the string another thread
 * then prints. Every call takes that lock; here it is a lock TSan sees. */
static void *real_g_strerror;
static pthread_mutex_t strerror_lock = PTHREAD_MUTEX_INITIALIZER;

SHIM const gchar *g_strerror(gint errnum)
{
	pthread_mutex_lock(&strerror_lock);
	const gchar *s = REAL(const gchar *(*)(gint), g_strerror)(errnum);
	pthread_mutex_unlock(&strerror_lock);
	return s;
}

/* ---- sockets and pipes ---------------------------------------------------
 * Bytes written to a socket or a pipe and read by another thread order what
 * the writer did before over what the reader does after, also when the
 * path goes through another process (a test's child initialises its memory,
 * says "ready" on a pipe, and the parent's requests then reach that memory
 * through the child's server thread). TSan models this only in part: a
 * socket counts as connected only when connect() returns 0, while libte,
 * the plugins and gio all connect without blocking (EINPROGRESS), and it
 * cannot see across processes. Here every write to a socket or a pipe is a
 * release, and every read of bytes from one an acquire, of one object: the
 * model TSan itself applies to all connected sockets, extended to pipes and
 * to sockets whatever connect() returned.
 *
 * The send calls mark the bytes as read before the release (TSan's own
 * wrappers mark them after the call, so a receiver could be ordered after
 * the release but not after the reads); TSAN_OPTIONS has intercept_send=0
 * so they are not marked twice. */
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>

extern void __tsan_read_range(void *addr, unsigned long size) __attribute__((weak));

#define IO_FDS 65536
static unsigned char fd_kind[IO_FDS]; /* 0 not known yet, 1 socket or pipe, 2 other */
static int io_sync;
static void *real_connect, *real_accept, *real_accept4, *real_close, *real_dup2, *real_dup3,
	*real_send, *real_sendto, *real_sendmsg, *real_write, *real_writev, *real_recv,
	*real_recvfrom, *real_recvmsg, *real_read, *real_readv;

static void fd_forget(int fd)
{
	if (fd >= 0 && fd < IO_FDS)
		__atomic_store_n(&fd_kind[fd], 0, __ATOMIC_RELAXED);
}

static int is_stream(int fd)
{
	if (fd < 0 || fd >= IO_FDS || !__tsan_acquire)
		return 0;
	unsigned char k = __atomic_load_n(&fd_kind[fd], __ATOMIC_RELAXED);
	if (k == 0) {
		struct stat st;
		k = fstat(fd, &st) == 0 && (S_ISSOCK(st.st_mode) || S_ISFIFO(st.st_mode)) ? 1 : 2;
		__atomic_store_n(&fd_kind[fd], k, __ATOMIC_RELAXED);
	}
	return k == 1;
}

static void io_out(int fd)
{
	if (is_stream(fd))
		hb_release(&io_sync);
}

static ssize_t io_in(int fd, ssize_t r)
{
	if (r > 0 && is_stream(fd))
		hb_acquire(&io_sync);
	return r;
}

static void mark_read(const void *p, size_t n)
{
	if (__tsan_read_range && n > 0)
		__tsan_read_range((void *)p, n);
}

SHIM int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	fd_forget(fd);
	return REAL(int (*)(int, const struct sockaddr *, socklen_t), connect)(fd, addr, len);
}

SHIM int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
	int s = REAL(int (*)(int, struct sockaddr *, socklen_t *), accept)(fd, addr, len);
	fd_forget(s);
	return s;
}

SHIM int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
	int s = REAL(int (*)(int, struct sockaddr *, socklen_t *, int), accept4)(fd, addr, len, flags);
	fd_forget(s);
	return s;
}

SHIM int close(int fd)
{
	fd_forget(fd);
	return REAL(int (*)(int), close)(fd);
}

/* stdio closes its descriptor from inside the C library. */
static void *real_fclose;

SHIM int fclose(FILE *f)
{
	if (f != NULL)
		fd_forget(fileno(f));
	return REAL(int (*)(FILE *), fclose)(f);
}

SHIM int dup2(int fd, int to)
{
	fd_forget(to);
	return REAL(int (*)(int, int), dup2)(fd, to);
}

SHIM int dup3(int fd, int to, int flags)
{
	fd_forget(to);
	return REAL(int (*)(int, int, int), dup3)(fd, to, flags);
}

SHIM ssize_t send(int fd, const void *buf, size_t n, int flags)
{
	mark_read(buf, n);
	io_out(fd);
	return REAL(ssize_t (*)(int, const void *, size_t, int), send)(fd, buf, n, flags);
}

SHIM ssize_t sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *addr,
		    socklen_t len)
{
	mark_read(buf, n);
	io_out(fd);
	return REAL(ssize_t (*)(int, const void *, size_t, int, const struct sockaddr *, socklen_t),
		    sendto)(fd, buf, n, flags, addr, len);
}

SHIM ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	if (msg != NULL)
		for (size_t i = 0; i < msg->msg_iovlen; i++)
			mark_read(msg->msg_iov[i].iov_base, msg->msg_iov[i].iov_len);
	io_out(fd);
	return REAL(ssize_t (*)(int, const struct msghdr *, int), sendmsg)(fd, msg, flags);
}

SHIM ssize_t write(int fd, const void *buf, size_t n)
{
	io_out(fd);
	return REAL(ssize_t (*)(int, const void *, size_t), write)(fd, buf, n);
}

SHIM ssize_t writev(int fd, const struct iovec *iov, int n)
{
	io_out(fd);
	return REAL(ssize_t (*)(int, const struct iovec *, int), writev)(fd, iov, n);
}

SHIM ssize_t recv(int fd, void *buf, size_t n, int flags)
{
	return io_in(fd, REAL(ssize_t (*)(int, void *, size_t, int), recv)(fd, buf, n, flags));
}

SHIM ssize_t recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *addr, socklen_t *len)
{
	return io_in(fd, REAL(ssize_t (*)(int, void *, size_t, int, struct sockaddr *, socklen_t *),
			      recvfrom)(fd, buf, n, flags, addr, len));
}

SHIM ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
	return io_in(fd, REAL(ssize_t (*)(int, struct msghdr *, int), recvmsg)(fd, msg, flags));
}

SHIM ssize_t read(int fd, void *buf, size_t n)
{
	return io_in(fd, REAL(ssize_t (*)(int, void *, size_t), read)(fd, buf, n));
}

SHIM ssize_t readv(int fd, const struct iovec *iov, int n)
{
	return io_in(fd, REAL(ssize_t (*)(int, const struct iovec *, int), readv)(fd, iov, n));
}

/* stdio reads and writes its descriptors from inside the C library, past
 * the functions above: a flush is where buffered bytes leave (the test
 * programs' peers flush each line they print), a read where they arrive. */
static void *real_fflush, *real_fgets, *real_fread, *real_getline, *real_getdelim, *real_fgetc,
	*real_getc;

static void file_in(FILE *f, int got)
{
	if (got && is_stream(fileno(f)))
		hb_acquire(&io_sync);
}

static void file_out(FILE *f)
{
	if (f == NULL || is_stream(fileno(f)))
		hb_release(&io_sync);
}

SHIM int fflush(FILE *f)
{
	file_out(f);
	return REAL(int (*)(FILE *), fflush)(f);
}

/* A line-buffered stream writes from inside these. */
static void *real_vfprintf, *real_fputs, *real_puts, *real_fwrite, *real_fputc, *real_putchar;

SHIM int vfprintf(FILE *f, const char *fmt, va_list ap)
{
	file_out(f);
	return REAL(int (*)(FILE *, const char *, va_list), vfprintf)(f, fmt, ap);
}

SHIM int vprintf(const char *fmt, va_list ap)
{
	return vfprintf(stdout, fmt, ap);
}

SHIM int fprintf(FILE *f, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int r = vfprintf(f, fmt, ap);
	va_end(ap);
	return r;
}

SHIM int printf(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int r = vfprintf(stdout, fmt, ap);
	va_end(ap);
	return r;
}

SHIM int fputs(const char *str, FILE *f)
{
	file_out(f);
	return REAL(int (*)(const char *, FILE *), fputs)(str, f);
}

SHIM int puts(const char *str)
{
	file_out(stdout);
	return REAL(int (*)(const char *), puts)(str);
}

SHIM size_t fwrite(const void *p, size_t size, size_t n, FILE *f)
{
	file_out(f);
	return REAL(size_t (*)(const void *, size_t, size_t, FILE *), fwrite)(p, size, n, f);
}

SHIM int fputc(int c, FILE *f)
{
	file_out(f);
	return REAL(int (*)(int, FILE *), fputc)(c, f);
}

SHIM int putchar(int c)
{
	file_out(stdout);
	return REAL(int (*)(int), putchar)(c);
}

SHIM char *fgets(char *s, int n, FILE *f)
{
	char *r = REAL(char *(*)(char *, int, FILE *), fgets)(s, n, f);
	file_in(f, r != NULL);
	return r;
}

SHIM size_t fread(void *p, size_t size, size_t n, FILE *f)
{
	size_t r = REAL(size_t (*)(void *, size_t, size_t, FILE *), fread)(p, size, n, f);
	file_in(f, r > 0);
	return r;
}

SHIM ssize_t getdelim(char **line, size_t *n, int delim, FILE *f)
{
	ssize_t r = REAL(ssize_t (*)(char **, size_t *, int, FILE *), getdelim)(line, n, delim, f);
	file_in(f, r > 0);
	return r;
}

SHIM ssize_t getline(char **line, size_t *n, FILE *f)
{
	ssize_t r = REAL(ssize_t (*)(char **, size_t *, FILE *), getline)(line, n, f);
	file_in(f, r > 0);
	return r;
}

SHIM int fgetc(FILE *f)
{
	int c = REAL(int (*)(FILE *), fgetc)(f);
	file_in(f, c != EOF);
	return c;
}

SHIM int getc(FILE *f)
{
	int c = REAL(int (*)(FILE *), getc)(f);
	file_in(f, c != EOF);
	return c;
}

/* GLib's reference counts are atomic read-modify-writes inside the library:
 * a full barrier, so the thread that drops the last reference (and frees)
 * comes after everything every other holder did before dropping its own.
 * Each unref through the PLT is that release and acquire on the object. */
static void *real_g_main_context_unref, *real_g_bytes_unref, *real_g_object_unref;

static void unref_order(const void *obj)
{
	if (obj != NULL) {
		hb_release(obj);
		hb_acquire(obj);
	}
}

SHIM void g_main_context_unref(GMainContext *ctx)
{
	unref_order(ctx);
	REAL(void (*)(GMainContext *), g_main_context_unref)(ctx);
}

SHIM void g_bytes_unref(GBytes *b)
{
	unref_order(b);
	REAL(void (*)(GBytes *), g_bytes_unref)(b);
}

SHIM void g_object_unref(gpointer obj)
{
	unref_order(obj);
	REAL(void (*)(gpointer), g_object_unref)(obj);
}
