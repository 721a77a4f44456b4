/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The HIP device plugin: AMD GPU memory through the HIP runtime (ROCm).
 * libamdhip64.so is opened with dlopen() when the plugin is probed, so
 * neither the plugin nor libte needs ROCm to build or a GPU to run: without
 * the library or a device the plugin stays idle and says why. The few HIP
 * types, constants and prototypes it uses are declared here.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <te/te-plugin.h>

#include "teu-devmem.h"
#include "teu-pci.h"

/* ------------------------------------------------------- HIP API subset */

typedef int hipError_t; /* hipSuccess = 0 */
typedef int hipDevice_t;
typedef void *hipStream_t;
typedef void *hipEvent_t;
typedef struct hipIpcMemHandle {
	char reserved[64]; /* HIP_IPC_HANDLE_SIZE */
} hipIpcMemHandle_t;

enum {
	hipSuccess = 0,
	HIP_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
	HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
	HIP_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
	HIP_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
	/* hipMemoryType's device value: the enum was renumbered in ROCm 6
	 * (Unregistered 0, Host 1, Device 2, ...); ROCm 5 had Host 0, Device 1. */
	HIP_MEMORY_TYPE_DEVICE_V5 = 1,
	HIP_MEMORY_TYPE_DEVICE_V6 = 2,
	hipMemcpyDefault = 4,
	hipHostMallocPortable = 1,
	hipStreamNonBlocking = 1,
	hipEventDisableTiming = 2,
	hipIpcMemLazyEnablePeerAccess = 1,
	hipMemRangeHandleTypeDmaBufFd = 1,
};

/* hipRuntimeGetVersion: major * 10000000 + minor * 100000 + patch. */
#define HIP_VERSION_MAJOR_OF(v) ((v) / 10000000)

#define MAX_DEVICES 64

static const char *const LIBS[] = { "libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5" };

typedef struct runtime {
	void *lib;
	const char *name; /* which of LIBS opened */
	int major;        /* ROCm major version of the runtime */
	hipError_t (*Init)(unsigned);
	hipError_t (*RuntimeGetVersion)(int *);
	hipError_t (*GetDeviceCount)(int *);
	hipError_t (*GetDevice)(int *);
	hipError_t (*SetDevice)(int);
	hipError_t (*DeviceGet)(hipDevice_t *, int);
	hipError_t (*DeviceGetName)(char *, int, hipDevice_t);
	hipError_t (*DeviceTotalMem)(size_t *, hipDevice_t);
	hipError_t (*DeviceGetPCIBusId)(char *, int, int);
	hipError_t (*PointerGetAttribute)(void *, int, void *);
	hipError_t (*Memcpy)(void *, const void *, size_t, int);
	hipError_t (*HostMalloc)(void **, size_t, unsigned);
	hipError_t (*HostFree)(void *);
	hipError_t (*Malloc)(void **, size_t);
	hipError_t (*Free)(void *);
	const char *(*GetErrorString)(hipError_t);
	hipError_t (*StreamSynchronize)(hipStream_t);
	/* Optional: without them copies are synchronous only. */
	hipError_t (*StreamCreateWithFlags)(hipStream_t *, unsigned);
	hipError_t (*StreamDestroy)(hipStream_t);
	hipError_t (*MemcpyAsync)(void *, const void *, size_t, int, hipStream_t);
	hipError_t (*EventCreateWithFlags)(hipEvent_t *, unsigned);
	hipError_t (*EventRecord)(hipEvent_t, hipStream_t);
	hipError_t (*EventSynchronize)(hipEvent_t);
	hipError_t (*EventDestroy)(hipEvent_t);
	hipError_t (*EventQuery)(hipEvent_t); /* optional too: without it, no bursts */
	/* Optional: dma-buf export (newer runtimes). */
	hipError_t (*MemGetHandleForAddressRange)(void *, void *, size_t, int, unsigned long long);
	/* Optional: sharing hipMalloc memory with other processes. */
	hipError_t (*IpcGetMemHandle)(hipIpcMemHandle_t *, void *);
	hipError_t (*IpcOpenMemHandle)(void **, hipIpcMemHandle_t, unsigned);
	hipError_t (*IpcCloseMemHandle)(void *);
	/* Optional: host work in a stream's order (te_submit_on_stream), on
	 * the stream's own device (hipStreamGetDevice: ROCm 5.2 and later). */
	hipError_t (*LaunchHostFunc)(hipStream_t, void (*)(void *), void *);
	hipError_t (*StreamGetDevice)(hipStream_t, hipDevice_t *);
} runtime;

/* Asynchronous copies go round-robin to this many streams, so that copies
 * into and out of the devices can use both copy engines at once. */
#define STREAMS 2
/* Streams for copy_batch, taken one per batch; a batch waits for a free one. */
#define BATCH_STREAMS 4
/* Events kept for reuse: creating one per copy costs a runtime call. */
#define SPARE_EVENTS 256
/* The most copies the completer reports in one burst (as a CUDA lane group). */
#define BURST_MAX 64

/* A queued copy whose event the completer waits for. */
typedef struct hip_pending {
	struct hip_pending *next;
	hipEvent_t ev;
	te_device_done_fn done;
	void *arg;
	size_t len;
} hip_pending;

typedef struct hip_ctx {
	const te_host *host;
	runtime rt;
	int ndev;
	unsigned device_type; /* hipMemoryType's "device" in this runtime */

	/* Asynchronous copies (see hip_copy_async) */
	bool async;
	hipStream_t streams[STREAMS];
	atomic_uint next_stream;
	atomic_bool said_sync; /* the fall-back to waiting was logged */
	pthread_t completer;
	pthread_mutex_t lock; /* guards the pending list, the spare events and quit */
	pthread_cond_t cond;
	hip_pending *head, *tail;
	hipEvent_t spare[SPARE_EVENTS];
	unsigned nspare;
	bool quit;

	/* Batches (see hip_copy_batch) */
	pthread_mutex_t batch_lock;
	pthread_cond_t batch_cond;
	hipStream_t batch_streams[BATCH_STREAMS]; /* every one made, for destroy */
	hipStream_t batch_free[BATCH_STREAMS];    /* the idle ones */
	unsigned batch_made, batch_idle;
	atomic_bool said_no_stream_device; /* stream_device without hipStreamGetDevice */
} hip_ctx;

static const char *errstr(const runtime *r, hipError_t e)
{
	const char *s = r->GetErrorString != NULL ? r->GetErrorString(e) : NULL;
	return s != NULL ? s : "unknown HIP error";
}

static int open_runtime(runtime *r, char *why, size_t why_len)
{
	char err[200] = "";

	memset(r, 0, sizeof *r);
	for (size_t i = 0; i < sizeof LIBS / sizeof LIBS[0] && r->lib == NULL; i++) {
		/* Never unloaded: once initialised the runtime has threads of
		 * its own and thread-local state, which unloading would pull
		 * from under them (probe and create both open it). */
		r->lib = dlopen(LIBS[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
		if (r->lib != NULL) {
			r->name = LIBS[i];
		} else if (i == 0) {
			/* The first name's reason is the telling one; the next
			 * dlopen() may reuse dlerror()'s buffer. */
			const char *e = dlerror();
			snprintf(err, sizeof err, "%s", e != NULL ? e : "");
		}
	}
	if (r->lib == NULL) {
		snprintf(why, why_len, "the HIP runtime library libamdhip64.so is not installed (%s)", err);
		return -ENODEV;
	}
#define SYM(field, sym, required)                                                          \
	do {                                                                               \
		*(void **)&r->field = dlsym(r->lib, sym);                                  \
		if (r->field == NULL && (required)) {                                      \
			snprintf(why, why_len, "%s lacks %s", r->name, sym);               \
			dlclose(r->lib);                                                   \
			r->lib = NULL;                                                     \
			return -ENOTSUP;                                                   \
		}                                                                          \
	} while (0)
	SYM(Init, "hipInit", 0);
	SYM(RuntimeGetVersion, "hipRuntimeGetVersion", 1);
	SYM(GetDeviceCount, "hipGetDeviceCount", 1);
	SYM(GetDevice, "hipGetDevice", 1);
	SYM(SetDevice, "hipSetDevice", 1);
	SYM(DeviceGet, "hipDeviceGet", 1);
	SYM(DeviceGetName, "hipDeviceGetName", 1);
	SYM(DeviceTotalMem, "hipDeviceTotalMem", 1);
	SYM(DeviceGetPCIBusId, "hipDeviceGetPCIBusId", 1);
	SYM(PointerGetAttribute, "hipPointerGetAttribute", 1);
	SYM(Memcpy, "hipMemcpy", 1);
	SYM(HostMalloc, "hipHostMalloc", 1);
	SYM(HostFree, "hipHostFree", 1);
	SYM(Malloc, "hipMalloc", 1);
	SYM(Free, "hipFree", 1);
	SYM(GetErrorString, "hipGetErrorString", 0);
	SYM(StreamSynchronize, "hipStreamSynchronize", 1);
	SYM(StreamCreateWithFlags, "hipStreamCreateWithFlags", 0);
	SYM(StreamDestroy, "hipStreamDestroy", 0);
	SYM(MemcpyAsync, "hipMemcpyAsync", 0);
	SYM(EventCreateWithFlags, "hipEventCreateWithFlags", 0);
	SYM(EventRecord, "hipEventRecord", 0);
	SYM(EventSynchronize, "hipEventSynchronize", 0);
	SYM(EventDestroy, "hipEventDestroy", 0);
	SYM(EventQuery, "hipEventQuery", 0);
	SYM(MemGetHandleForAddressRange, "hipMemGetHandleForAddressRange", 0);
	SYM(IpcGetMemHandle, "hipIpcGetMemHandle", 0);
	SYM(IpcOpenMemHandle, "hipIpcOpenMemHandle", 0);
	SYM(IpcCloseMemHandle, "hipIpcCloseMemHandle", 0);
	SYM(LaunchHostFunc, "hipLaunchHostFunc", 0);
	SYM(StreamGetDevice, "hipStreamGetDevice", 0);
#undef SYM
	hipError_t e = r->Init != NULL ? r->Init(0) : hipSuccess;
	int n = 0, version = 0;
	if (e == hipSuccess)
		e = r->GetDeviceCount(&n);
	if (e != hipSuccess || n <= 0) {
		snprintf(why, why_len, "no HIP device (%s)",
			 e != hipSuccess ? errstr(r, e) : "the runtime counts none");
		dlclose(r->lib);
		r->lib = NULL;
		return -ENODEV;
	}
	/* The memory type's numbering depends on the runtime's major version. */
	e = r->RuntimeGetVersion(&version);
	if (e != hipSuccess || version <= 0) {
		snprintf(why, why_len, "%s does not say its version (%s)", r->name,
			 e != hipSuccess ? errstr(r, e) : "none");
		dlclose(r->lib);
		r->lib = NULL;
		return -ENOTSUP;
	}
	r->major = HIP_VERSION_MAJOR_OF(version);
	return n > MAX_DEVICES ? MAX_DEVICES : n;
}

static int hip_probe(const te_host *h, char *why, size_t why_len)
{
	runtime r;
	(void)h;
	int n = open_runtime(&r, why, why_len);
	if (n < 0)
		return n;
	dlclose(r.lib);
	return 0;
}

/* HIP's current device is per thread, and the calling thread is usually the
 * application's: calls that depend on it set it and put the old one back. */
static int device_enter(hip_ctx *c, int dev)
{
	int old = 0;
	if (c->rt.GetDevice(&old) != hipSuccess)
		old = -1;
	if (old != dev)
		c->rt.SetDevice(dev);
	return old;
}

static void device_leave(hip_ctx *c, int dev, int old)
{
	if (old >= 0 && old != dev)
		c->rt.SetDevice(old);
}

static bool async_start(hip_ctx *c);
static void async_stop(hip_ctx *c);

static int hip_create(const te_host *h, void **out)
{
	hip_ctx *c = calloc(1, sizeof *c);
	char why[256] = "";

	if (c == NULL)
		return -ENOMEM;
	c->host = h;
	c->ndev = open_runtime(&c->rt, why, sizeof why);
	if (c->ndev < 0) {
		int rc = c->ndev;
		h->log(h, TE_LOG_INFO, "idle: %s", why);
		free(c);
		return rc;
	}
	c->device_type = c->rt.major >= 6 ? HIP_MEMORY_TYPE_DEVICE_V6 : HIP_MEMORY_TYPE_DEVICE_V5;
	pthread_mutex_init(&c->batch_lock, NULL);
	pthread_cond_init(&c->batch_cond, NULL);
	c->async = async_start(c);
	*out = c;
	return 0;
}

static void hip_destroy(void *ctx)
{
	hip_ctx *c = ctx;

	async_stop(c);
	for (unsigned i = 0; i < c->batch_made; i++)
		c->rt.StreamDestroy(c->batch_streams[i]);
	pthread_mutex_destroy(&c->batch_lock);
	pthread_cond_destroy(&c->batch_cond);
	dlclose(c->rt.lib);
	free(c);
}

static bool range_of(hip_ctx *c, void *p, uintptr_t *start, size_t *size)
{
	void *s = NULL;
	*size = 0;
	if (c->rt.PointerGetAttribute(&s, HIP_POINTER_ATTRIBUTE_RANGE_START_ADDR, p) != hipSuccess ||
	    c->rt.PointerGetAttribute(size, HIP_POINTER_ATTRIBUTE_RANGE_SIZE, p) != hipSuccess)
		return false;
	*start = (uintptr_t)s;
	return true;
}

static int hip_classify(void *ctx, const void *addr, size_t len, int *device)
{
	hip_ctx *c = ctx;
	unsigned type = 0;
	int ordinal = -1;
	void *p = (void *)(uintptr_t)addr;
	uintptr_t start = 0;
	size_t size = 0;

	/* Host memory, even page-locked host memory, is not device memory. */
	if (c->rt.PointerGetAttribute(&type, HIP_POINTER_ATTRIBUTE_MEMORY_TYPE, p) != hipSuccess ||
	    type != c->device_type)
		return 0;
	if (c->rt.PointerGetAttribute(&ordinal, HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) != hipSuccess ||
	    !range_of(c, p, &start, &size))
		return -EIO;
	if ((uintptr_t)addr < start || len > size || (uintptr_t)addr - start > size - len) {
		c->host->log(c->host, TE_LOG_ERROR,
			     "%p+%zu runs past its device allocation (%zu bytes at %#lx)", addr, len, size,
			     (unsigned long)start);
		return -EINVAL;
	}
	*device = ordinal;
	return 1;
}

static hipStream_t copy_stream_take(hip_ctx *c);
static void copy_stream_give(hip_ctx *c, hipStream_t s);

/* On a non-blocking stream of the plugin's, never hipMemcpy: that runs on
 * the null stream, after its work and that of every blocking stream, which
 * a te_submit_on_stream() host function may hold while it waits for this
 * very copy. hipMemcpy only where the runtime has no stream calls. */
static int hip_copy(void *ctx, void *dst, const void *src, size_t len)
{
	hip_ctx *c = ctx;
	hipStream_t s = copy_stream_take(c);
	hipError_t e;

	if (s == NULL) {
		/* Unified addressing: hipMemcpyDefault finds every direction. */
		e = c->rt.Memcpy(dst, src, len, hipMemcpyDefault);
		if (e != hipSuccess) {
			c->host->log(c->host, TE_LOG_ERROR, "hipMemcpy of %zu bytes: %s", len, errstr(&c->rt, e));
			return -EIO;
		}
		return 0;
	}
	e = c->rt.MemcpyAsync(dst, src, len, hipMemcpyDefault, s);
	hipError_t w = e == hipSuccess ? c->rt.StreamSynchronize(s) : hipSuccess;
	copy_stream_give(c, s);
	if (e != hipSuccess || w != hipSuccess) {
		c->host->log(c->host, TE_LOG_ERROR, "%s of %zu bytes: %s", e != hipSuccess ? "hipMemcpyAsync" : "copy",
			     len, errstr(&c->rt, e != hipSuccess ? e : w));
		return -EIO;
	}
	return 0;
}

/* ------------------------------------------------------ asynchronous copies */

/*
 * Each copy is followed by an event on its stream, and the completer thread
 * waits for the events in the order the copies were queued. Stream callbacks
 * would do the same work, but HIP runs a stream's callback as a blocking
 * step of that stream, so every copy would wait for the callback before it.
 * The copies queued after the one waited for that have ended too are
 * reported with it, as one burst for the host (device_done_burst): the
 * staged chunks they make ready go to their transport in one call.
 */

/* The next queued copy if its event has ended (without waiting), else NULL. */
static hip_pending *take_ended(hip_ctx *c)
{
	hip_pending *d = NULL;

	if (c->rt.EventQuery == NULL)
		return NULL;
	pthread_mutex_lock(&c->lock);
	d = c->head;
	pthread_mutex_unlock(&c->lock);
	/* Asked outside the lock, not to hold up the submitters; only this
	 * thread takes from the list, so d is still its head after. An error
	 * is left for EventSynchronize to report, on the next turn. */
	if (d == NULL || c->rt.EventQuery(d->ev) != hipSuccess)
		return NULL;
	pthread_mutex_lock(&c->lock);
	c->head = d->next;
	if (c->head == NULL)
		c->tail = NULL;
	pthread_mutex_unlock(&c->lock);
	return d;
}

/* Recycles the copy's event and tells its owner. */
static void report(hip_ctx *c, hip_pending *d, hipError_t e)
{
	if (e != hipSuccess)
		c->host->log(c->host, TE_LOG_ERROR, "asynchronous copy of %zu bytes: %s", d->len,
			     errstr(&c->rt, e));
	pthread_mutex_lock(&c->lock);
	/* An event that reported an error is not trusted again. */
	if (e == hipSuccess && c->nspare < SPARE_EVENTS)
		c->spare[c->nspare++] = d->ev;
	else
		c->rt.EventDestroy(d->ev);
	pthread_mutex_unlock(&c->lock);
	d->done(d->arg, e == hipSuccess ? 0 : -EIO);
	free(d);
}

static void *completer(void *arg)
{
	hip_ctx *c = arg;

	pthread_mutex_lock(&c->lock);
	for (;;) {
		while (c->head == NULL && !c->quit)
			pthread_cond_wait(&c->cond, &c->lock);
		hip_pending *d = c->head;
		if (d == NULL)
			break; /* quit, and every queued copy reported */
		c->head = d->next;
		if (c->head == NULL)
			c->tail = NULL;
		pthread_mutex_unlock(&c->lock);
		hipError_t e = c->rt.EventSynchronize(d->ev);
		hip_pending *more = take_ended(c);
		bool burst = more != NULL && TE_HAS_OP(c->host, device_done_burst);
		if (burst)
			c->host->device_done_burst(c->host, 1);
		report(c, d, e);
		for (int n = 1; more != NULL;) {
			d = more;
			more = ++n < BURST_MAX ? take_ended(c) : NULL;
			report(c, d, hipSuccess);
		}
		if (burst)
			c->host->device_done_burst(c->host, 0);
		pthread_mutex_lock(&c->lock);
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

/* Streams on device 0 (unified addressing: any direction, any device) and
 * the completer thread; false (copies stay synchronous) when the runtime
 * lacks the calls or refuses. */
static bool async_start(hip_ctx *c)
{
	runtime *r = &c->rt;
	int made = 0;

	if (r->StreamCreateWithFlags == NULL || r->StreamDestroy == NULL || r->MemcpyAsync == NULL ||
	    r->EventCreateWithFlags == NULL || r->EventRecord == NULL || r->EventSynchronize == NULL ||
	    r->EventDestroy == NULL)
		return false;
	int old = device_enter(c, 0);
	for (; made < STREAMS; made++) {
		hipError_t e = r->StreamCreateWithFlags(&c->streams[made], hipStreamNonBlocking);
		if (e != hipSuccess) {
			c->host->log(c->host, TE_LOG_INFO, "no stream for asynchronous copies: %s", errstr(r, e));
			break;
		}
	}
	device_leave(c, 0, old);
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	if (made == STREAMS && pthread_create(&c->completer, NULL, completer, c) == 0)
		return true;
	while (made > 0)
		r->StreamDestroy(c->streams[--made]);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	return false;
}

/* Every copy started has been reported to its owner when this returns. The
 * host destroys device plugins after every engine, so no done() starts a
 * copy here any more. */
static void async_stop(hip_ctx *c)
{
	if (!c->async)
		return;
	for (int i = 0; i < STREAMS; i++)
		c->rt.StreamSynchronize(c->streams[i]);
	pthread_mutex_lock(&c->lock);
	c->quit = true;
	pthread_cond_signal(&c->cond);
	pthread_mutex_unlock(&c->lock);
	pthread_join(c->completer, NULL);
	for (int i = 0; i < STREAMS; i++)
		c->rt.StreamDestroy(c->streams[i]);
	while (c->nspare > 0)
		c->rt.EventDestroy(c->spare[--c->nspare]);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	c->async = false;
}

static hipError_t take_event(hip_ctx *c, hipEvent_t *ev)
{
	pthread_mutex_lock(&c->lock);
	bool have = c->nspare > 0;
	if (have)
		*ev = c->spare[--c->nspare];
	pthread_mutex_unlock(&c->lock);
	if (have)
		return hipSuccess;
	int old = device_enter(c, 0); /* an event belongs to its streams' device */
	hipError_t e = c->rt.EventCreateWithFlags(ev, hipEventDisableTiming);
	device_leave(c, 0, old);
	return e;
}

/* hipMemcpyAsync on the next stream, then an event the completer waits for:
 * the caller's thread never waits for the copy. */
static int hip_copy_async(void *ctx, void *dst, const void *src, size_t len, te_device_done_fn done,
			  void *arg)
{
	hip_ctx *c = ctx;
	hipEvent_t ev = NULL;

	if (!c->async)
		return -ENOTSUP;
	hip_pending *d = malloc(sizeof *d);
	if (d == NULL)
		return -ENOMEM;
	hipError_t e = take_event(c, &ev);
	if (e != hipSuccess) {
		/* Nothing queued yet: let the host copy this one synchronously. */
		TE_HOST_LOG_LIMITED(c->host, TE_LOG_WARN, "hipEventCreateWithFlags: %s", errstr(&c->rt, e));
		free(d);
		return -ENOTSUP;
	}
	*d = (hip_pending){ .ev = ev, .done = done, .arg = arg, .len = len };
	hipStream_t s = c->streams[atomic_fetch_add_explicit(&c->next_stream, 1, memory_order_relaxed) % STREAMS];
	e = c->rt.MemcpyAsync(dst, src, len, hipMemcpyDefault, s);
	if (e != hipSuccess) {
		c->host->log(c->host, TE_LOG_ERROR, "hipMemcpyAsync of %zu bytes: %s", len, errstr(&c->rt, e));
		c->rt.EventDestroy(ev);
		free(d);
		return -EIO;
	}
	e = c->rt.EventRecord(ev, s);
	if (e != hipSuccess) {
		/* The copy is queued and nothing would report its end: wait for
		 * it here (done runs before copy_async returns). */
		if (!atomic_exchange(&c->said_sync, true))
			c->host->log(c->host, TE_LOG_WARN,
				     "hipEventRecord: %s; waiting for copies instead (said once)",
				     errstr(&c->rt, e));
		c->rt.EventDestroy(ev);
		free(d);
		e = c->rt.StreamSynchronize(s);
		if (e != hipSuccess)
			c->host->log(c->host, TE_LOG_ERROR, "copy of %zu bytes: %s", len, errstr(&c->rt, e));
		done(arg, e == hipSuccess ? 0 : -EIO);
		return 0;
	}
	pthread_mutex_lock(&c->lock);
	if (c->tail)
		c->tail->next = d;
	else
		c->head = d;
	c->tail = d;
	pthread_cond_signal(&c->cond);
	pthread_mutex_unlock(&c->lock);
	return 0;
}

/* ------------------------------------------------------------------ batches */

/* A stream of the batch pool, made on first need; NULL when none can be made. */
static hipStream_t batch_stream_take(hip_ctx *c)
{
	hipStream_t s = NULL;

	pthread_mutex_lock(&c->batch_lock);
	for (;;) {
		if (c->batch_idle > 0) {
			s = c->batch_free[--c->batch_idle];
			break;
		}
		if (c->batch_made < BATCH_STREAMS) {
			int old = device_enter(c, 0);
			hipError_t e = c->rt.StreamCreateWithFlags(&s, hipStreamNonBlocking);
			device_leave(c, 0, old);
			if (e == hipSuccess) {
				c->batch_streams[c->batch_made++] = s;
				break;
			}
			TE_HOST_LOG_LIMITED(c->host, TE_LOG_WARN, "no stream for a batch: %s",
					    errstr(&c->rt, e));
			s = NULL;
			if (c->batch_made == 0)
				break; /* none will come back: copy synchronously */
		}
		pthread_cond_wait(&c->batch_cond, &c->batch_lock);
	}
	pthread_mutex_unlock(&c->batch_lock);
	return s;
}

static void batch_stream_give(hip_ctx *c, hipStream_t s)
{
	pthread_mutex_lock(&c->batch_lock);
	c->batch_free[c->batch_idle++] = s;
	pthread_cond_signal(&c->batch_cond);
	pthread_mutex_unlock(&c->batch_lock);
}

/* A stream for a synchronous copy or a batch: one of the batch pool, or
 * where the runtime makes none, one of the asynchronous copies' streams,
 * shared; NULL only without the stream calls. */
static hipStream_t copy_stream_take(hip_ctx *c)
{
	hipStream_t s = NULL;

	if (c->rt.MemcpyAsync != NULL && c->rt.StreamCreateWithFlags != NULL && c->rt.StreamDestroy != NULL)
		s = batch_stream_take(c);
	if (s == NULL && c->async)
		s = c->streams[0];
	return s;
}

static void copy_stream_give(hip_ctx *c, hipStream_t s)
{
	if (!c->async || s != c->streams[0])
		batch_stream_give(c, s);
}

/* The pieces queued together on one stream and waited for once: one copy
 * engine latency for the batch instead of one per piece. */
static int hip_copy_batch(void *ctx, const te_copy *v, size_t n, unsigned flags)
{
	hip_ctx *c = ctx;
	hipStream_t s = NULL;
	(void)flags; /* no gather kernel here: every piece is a copy engine call */

	if (n == 0)
		return 0;
	s = copy_stream_take(c);
	if (s == NULL) { /* no stream calls in the runtime */
		for (size_t i = 0; i < n; i++) {
			int rc = hip_copy(c, v[i].dst, v[i].src, v[i].len);
			if (rc < 0)
				return rc;
		}
		return 0;
	}
	int rc = 0;
	for (size_t i = 0; i < n; i++) {
		hipError_t e = c->rt.MemcpyAsync(v[i].dst, v[i].src, v[i].len, hipMemcpyDefault, s);
		if (e != hipSuccess) {
			c->host->log(c->host, TE_LOG_ERROR, "hipMemcpyAsync of piece %zu of %zu (%zu bytes): %s",
				     i, n, v[i].len, errstr(&c->rt, e));
			rc = -EIO;
			break; /* what was queued is still waited for */
		}
	}
	hipError_t e = c->rt.StreamSynchronize(s);
	if (e != hipSuccess) {
		c->host->log(c->host, TE_LOG_ERROR, "batch of %zu copies: %s", n, errstr(&c->rt, e));
		rc = -EIO;
	}
	copy_stream_give(c, s);
	return rc;
}

/* -------------------------------------------------------------- memory */

static int hip_host_alloc(void *ctx, size_t len, void **ptr)
{
	hip_ctx *c = ctx;

	return c->rt.HostMalloc(ptr, len, hipHostMallocPortable) == hipSuccess ? 0 : -ENOMEM;
}

static void hip_host_free(void *ctx, void *ptr)
{
	hip_ctx *c = ctx;
	c->rt.HostFree(ptr);
}

static int hip_mem_alloc(void *ctx, int device, size_t len, void **ptr)
{
	hip_ctx *c = ctx;
	void *p = NULL;

	if (device < 0 || device >= c->ndev)
		return -ENODEV;
	int old = device_enter(c, device);
	hipError_t e = c->rt.Malloc(&p, len);
	device_leave(c, device, old);
	if (e != hipSuccess) {
		c->host->log(c->host, TE_LOG_ERROR, "hipMalloc of %zu bytes on device %d: %s", len, device,
			     errstr(&c->rt, e));
		return -ENOMEM;
	}
	*ptr = p;
	return 0;
}

static void hip_mem_free(void *ctx, void *ptr)
{
	hip_ctx *c = ctx;
	int dev = 0;

	if (c->rt.PointerGetAttribute(&dev, HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) != hipSuccess)
		dev = 0;
	int old = device_enter(c, dev);
	hipError_t e = c->rt.Free(ptr);
	device_leave(c, dev, old);
	if (e != hipSuccess)
		c->host->log(c->host, TE_LOG_WARN, "hipFree(%p): %s", ptr, errstr(&c->rt, e));
}

static int hip_export_dmabuf(void *ctx, const void *addr, size_t len, int *fd, uint64_t *offset)
{
	hip_ctx *c = ctx;
	void *p = (void *)(uintptr_t)addr;
	uintptr_t start = 0;
	size_t size = 0;
	uint64_t off = 0;
	int h = -1;

	if (c->rt.MemGetHandleForAddressRange == NULL)
		return -ENOTSUP;
	/* Export the whole allocation, and say where the range starts in it. */
	if (!range_of(c, p, &start, &size) || !teu_range_in((uintptr_t)addr, len, start, size, &off))
		return -EINVAL;
	hipError_t e = c->rt.MemGetHandleForAddressRange(&h, (void *)start, size,
							 hipMemRangeHandleTypeDmaBufFd, 0);
	if (e != hipSuccess || h < 0) {
		c->host->log(c->host, TE_LOG_INFO, "no dma-buf for %p: %s", addr, errstr(&c->rt, e));
		return -ENOTSUP;
	}
	*fd = h;
	*offset = off;
	return 0;
}

/* ------------------------------------------------- other processes (IPC) */

static bool has_ipc(const hip_ctx *c)
{
	return c->rt.IpcGetMemHandle != NULL && c->rt.IpcOpenMemHandle != NULL &&
	       c->rt.IpcCloseMemHandle != NULL;
}

/* HIP IPC handles name whole hipMalloc allocations: export the allocation
 * holding the range. */
static int hip_ipc_export(void *ctx, const void *addr, size_t len, te_device_ipc *ipc)
{
	hip_ctx *c = ctx;
	uintptr_t start = 0;
	size_t size = 0;
	int dev = -1;
	hipIpcMemHandle_t h;

	if (!has_ipc(c))
		return -ENOTSUP;
	if (hip_classify(c, addr, len, &dev) != 1 || !range_of(c, (void *)(uintptr_t)addr, &start, &size))
		return -EINVAL;
	int old = device_enter(c, dev);
	hipError_t e = c->rt.IpcGetMemHandle(&h, (void *)start);
	device_leave(c, dev, old);
	if (e != hipSuccess) {
		c->host->log(c->host, TE_LOG_INFO, "no IPC handle for %p: %s", addr, errstr(&c->rt, e));
		return -ENOTSUP;
	}
	_Static_assert(sizeof h <= sizeof ipc->handle, "IPC handle size");
	teu_ipc_fill(ipc, &h, sizeof h, dev, -1, start, size);
	return 0;
}

static int hip_ipc_open(void *ctx, const te_device_ipc *ipc, void **base)
{
	hip_ctx *c = ctx;
	hipIpcMemHandle_t h;
	void *p = NULL;

	if (!has_ipc(c))
		return -ENOTSUP;
	if (teu_ipc_handle(ipc, &h, sizeof h) < 0)
		return -EINVAL;
	/* Opened on the device of the same index here, or on device 0; lazy
	 * peer access lets a copy reach it from any device. */
	int dev = teu_ipc_device(ipc, c->ndev);
	int old = device_enter(c, dev);
	hipError_t e = c->rt.IpcOpenMemHandle(&p, h, hipIpcMemLazyEnablePeerAccess);
	device_leave(c, dev, old);
	if (e != hipSuccess) {
		c->host->log(c->host, TE_LOG_WARN, "hipIpcOpenMemHandle of another process's hip:%d memory: %s",
			     ipc->device, errstr(&c->rt, e));
		return -EIO;
	}
	*base = p;
	return 0;
}

static void hip_ipc_close(void *ctx, void *base)
{
	hip_ctx *c = ctx;

	hipError_t e = c->rt.IpcCloseMemHandle(base);
	if (e != hipSuccess)
		c->host->log(c->host, TE_LOG_WARN, "hipIpcCloseMemHandle(%p): %s", base, errstr(&c->rt, e));
}

/* The device whose stream `stream` is: the runtime says (hipStreamGetDevice),
 * and for the null stream `device`, or with -1 the calling thread's
 * current one. -EINVAL (logged) when the stream is not `device`'s. */
static int stream_device(hip_ctx *c, int device, hipStream_t stream, const char *what, int *dev)
{
	int cur = 0;

	if (device >= c->ndev) {
		c->host->log(c->host, TE_LOG_ERROR, "%s: no device hip:%d here", what, device);
		return -ENODEV;
	}
	if (c->rt.GetDevice(&cur) != hipSuccess)
		cur = 0;
	*dev = device >= 0 ? device : cur;
	if (stream == NULL)
		return 0;
	if (c->rt.StreamGetDevice == NULL) {
		if (!atomic_exchange(&c->said_no_stream_device, true))
			c->host->log(c->host, TE_LOG_WARN,
				     "this HIP runtime has no hipStreamGetDevice: a stream is taken for the device of "
				     "its location, or else the calling thread's current one (said once)");
		return 0;
	}
	hipDevice_t sd = -1;
	hipError_t e = c->rt.StreamGetDevice(stream, &sd);
	if (e != hipSuccess) {
		c->host->log(c->host, TE_LOG_ERROR, "%s: hipStreamGetDevice of stream %p: %s", what, stream,
			     errstr(&c->rt, e));
		return -EINVAL;
	}
	if (device >= 0 && sd != device) {
		c->host->log(c->host, TE_LOG_ERROR, "%s: stream %p is hip:%d's, not hip:%d's", what, stream, sd,
			     device);
		return -EINVAL;
	}
	*dev = sd;
	return 0;
}

/* The function runs on the runtime's thread for host functions, which must
 * not call the runtime; libte's (stream.c) only hands work over and waits.
 * On the stream's own device, the caller's current one put back after. The
 * plugin's copies never wait for the null stream (hip_copy), so that a
 * blocking stream or the null stream held by the function does not hold the
 * transfer it waits for; a runtime that leaves the plugin no stream of its
 * own is refused. */
static int hip_stream_launch_on(void *ctx, int device, void *stream, void (*fn)(void *), void *arg)
{
	hip_ctx *c = ctx;
	int dev;

	if (c->rt.LaunchHostFunc == NULL) {
		c->host->log(c->host, TE_LOG_ERROR, "this HIP runtime has no hipLaunchHostFunc");
		return -ENOTSUP;
	}
	hipStream_t own = copy_stream_take(c);
	if (own == NULL) {
		c->host->log(c->host, TE_LOG_ERROR,
			     "no stream of the plugin's own: its copies would wait for the stream's host function");
		return -ENOTSUP;
	}
	copy_stream_give(c, own);
	int rc = stream_device(c, device, stream, "hipLaunchHostFunc", &dev);
	if (rc < 0)
		return rc;
	int old = device_enter(c, dev);
	hipError_t e = c->rt.LaunchHostFunc(stream, fn, arg);
	device_leave(c, dev, old);
	if (e != hipSuccess) {
		c->host->log(c->host, TE_LOG_ERROR, "hipLaunchHostFunc: %s", errstr(&c->rt, e));
		return -EIO;
	}
	return 0;
}

static int hip_stream_launch(void *ctx, void *stream, void (*fn)(void *), void *arg)
{
	return hip_stream_launch_on(ctx, -1, stream, fn, arg);
}

static int hip_stream_wait_on(void *ctx, int device, void *stream)
{
	hip_ctx *c = ctx;
	int dev;
	int rc = stream_device(c, device, stream, "hipStreamSynchronize", &dev);

	if (rc < 0)
		return rc;
	int old = device_enter(c, dev);
	hipError_t e = c->rt.StreamSynchronize(stream);
	device_leave(c, dev, old);
	if (e != hipSuccess) {
		c->host->log(c->host, TE_LOG_ERROR, "hipStreamSynchronize: %s", errstr(&c->rt, e));
		return -EIO;
	}
	return 0;
}

static int hip_stream_wait(void *ctx, void *stream)
{
	return hip_stream_wait_on(ctx, -1, stream);
}

static int hip_devices(void *ctx, te_device_info *out, size_t max, size_t *n)
{
	hip_ctx *c = ctx;

	*n = (size_t)c->ndev;
	for (int i = 0; i < c->ndev && (size_t)i < max; i++) {
		te_device_info *d = &out[i];
		hipDevice_t dev;
		size_t mem = 0;

		snprintf(d->location, sizeof d->location, "hip:%d", i);
		if (c->rt.DeviceGet(&dev, i) != hipSuccess)
			continue;
		if (c->rt.DeviceGetName(d->name, (int)sizeof d->name, dev) != hipSuccess)
			snprintf(d->name, sizeof d->name, "?");
		d->name[sizeof d->name - 1] = '\0';
		if (c->rt.DeviceTotalMem(&mem, dev) == hipSuccess)
			d->memory = mem;
		if (c->rt.DeviceGetPCIBusId(d->pci_bus_id, (int)sizeof d->pci_bus_id, i) == hipSuccess) {
			d->pci_bus_id[sizeof d->pci_bus_id - 1] = '\0';
			d->numa_node = teu_pci_numa_node(d->pci_bus_id);
		} else {
			d->pci_bus_id[0] = '\0';
		}
	}
	return 0;
}

static const te_device_ops ops = {
	.size = sizeof(te_device_ops),
	.prefix = "hip",
	.probe = hip_probe,
	.create = hip_create,
	.destroy = hip_destroy,
	.classify = hip_classify,
	.copy = hip_copy,
	.copy_async = hip_copy_async,
	.host_alloc = hip_host_alloc,
	.host_free = hip_host_free,
	.mem_alloc = hip_mem_alloc,
	.mem_free = hip_mem_free,
	.export_dmabuf = hip_export_dmabuf,
	.devices = hip_devices,
	.stream_wait = hip_stream_wait,
	.stream_launch = hip_stream_launch,
	.stream_launch_on = hip_stream_launch_on,
	.stream_wait_on = hip_stream_wait_on,
	.ipc_export = hip_ipc_export,
	.ipc_open = hip_ipc_open,
	.ipc_close = hip_ipc_close,
	.copy_batch = hip_copy_batch,
};

TE_PLUGIN_DEFINE(TE_KIND_DEVICE, "hip", "1.0", "AMD GPU memory through the HIP runtime",
		 "Apache-2.0", &ops)
