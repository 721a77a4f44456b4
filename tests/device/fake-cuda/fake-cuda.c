/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A stand-in for the CUDA driver library (libcuda.so.1) for the tests: the
 * driver API calls the CUDA device plugin makes, on memory the CPU cannot
 * touch, so the real plugin's code runs end to end on a machine without a
 * GPU. Never installed; the tests put its folder on LD_LIBRARY_PATH.
 *
 * - Two devices, their memory and IPC handles as fake-gpu.h makes them (the
 *   core shared with the stand-in HIP runtime), as the test device plugin
 *   does.
 * - Streams are FIFO queues, each with a thread: an asynchronous copy, a
 *   stream callback, an event record and a kernel run there, in order, and
 *   a callback gets the status of the work before it. An event completes when
 *   the work queued before it on its stream has. Each device's legacy
 *   default stream (CUstream 0 or CU_STREAM_LEGACY, of the calling thread's
 *   current context) is one too, made when first used; a stream made with
 *   flags 0 is a blocking one, ordered against it (fake-gpu.h), and cuMemcpy
 *   waits for the work of both first, as a driver's does; a host function
 *   (cuLaunchHostFunc) holds its stream until it returns.
 * - Contexts: each device's primary context; the current context is the
 *   calling thread's (cuCtxSetCurrent, cuCtxPushCurrent, cuCtxPopCurrent),
 *   a stream is the context's that was current when it was made
 *   (cuStreamGetCtx), cuMemAlloc allocates on the current context's device,
 *   and a kernel or host function is refused on a stream of another context
 *   than the current one (CUDA_ERROR_INVALID_HANDLE). Calls that need a
 *   context fail without one (CUDA_ERROR_INVALID_CONTEXT).
 * - FAKE_CUDA_FAIL_ASYNC=1 makes cuMemcpyAsync refuse copies to or from
 *   pinned host memory (what transfers stage through; a program still
 *   fills its device memory); FAKE_CUDA_FAIL_STREAM=1
 *   makes queued copies fail (the callback sees the error);
 *   FAKE_CUDA_MAX_STREAMS=N makes cuStreamCreate refuse once N streams
 *   exist;
 *   FAKE_CUDA_NO_CALLBACK=1 makes cuStreamAddCallback and cuLaunchHostFunc refuse;
 *   FAKE_CUDA_NO_EVENTS=1 makes cuEventCreate refuse.
 *   FAKE_CUDA_STATS=FILE appends, at exit, one line of counts:
 *     sync N async N callbacks N ipc N launches N event_records N
 *     event_waits N stream_waits N h2d_bytes N d2h_bytes N d2d_bytes N
 *     vmm_imports N
 *   (synchronous and queued copies, callbacks run, other processes'
 *   allocations opened by IPC handle, kernel launches, cuEventRecord calls,
 *   cuEventSynchronize and cuStreamSynchronize calls, bytes copied per
 *   direction, allocations imported from a shareable handle).
 * - Virtual memory management (cuMemCreate and friends, what PyTorch's
 *   expandable segments use): each allocation is a memfd of its own, mapped
 *   by cuMemMap as the devices are (no-access view at the reserved address,
 *   read-write view for copies); cuMemExportToShareableHandle gives that
 *   memfd (POSIX file descriptor), which another process imports and maps
 *   the same way. Legacy IPC refuses this memory, as the driver does.
 * - cuMemHostAlloc and cuMemHostRegister memory is pinned; any other host
 *   memory is pageable (it matters to the cost model only).
 * - One kernel, "te_gather_copy" (cuModuleLoadData of PTX text holding
 *   ".entry te_gather_copy"): the copies of up to 128 pieces in one launch,
 *   each side device memory or pinned host memory (at the address
 *   cuPointerGetAttribute's CU_POINTER_ATTRIBUTE_DEVICE_POINTER gives, its
 *   own, as with unified addressing); a piece touching other memory fails
 *   the stream with CUDA_ERROR_ILLEGAL_ADDRESS, as a faulting kernel would.
 *
 * The cost model (docs/gpu-model.md). Without settings copies are free, as
 * they always were. Read at cuInit; times in microseconds, bandwidths in
 * GB/s (1e9 bytes/s; 0 means unlimited):
 *   FAKE_CUDA_COSTS=h100          a preset fitted to an H100 PCIe (below);
 *                                 the variables after it override its values
 *   FAKE_CUDA_CALL_US             CPU time of each copy or launch call, spent
 *                                 on the calling thread (h100: 2.7)
 *   FAKE_CUDA_COPY_LATENCY_US     fixed time of a host<->device copy on its
 *                                 copy engine (h100: 2.4)
 *   FAKE_CUDA_D2D_LATENCY_US      the same for device-to-device (h100: 9.3)
 *   FAKE_CUDA_SYNC_US             a wait for a stream, an event or
 *                                 cuMemcpy's own copy returns this long after
 *                                 the work is done (h100: 3.7)
 *   FAKE_CUDA_CALLBACK_US         a stream callback runs this long after the
 *                                 work before it, and the stream goes on only
 *                                 when it has returned (h100: 20)
 *   FAKE_CUDA_LAUNCH_US           fixed device time of a kernel (h100: 9.3)
 *   FAKE_CUDA_H2D_GBPS, FAKE_CUDA_D2H_GBPS           pinned host memory
 *                                 (h100: 52.7, 53.9)
 *   FAKE_CUDA_PAGEABLE_H2D_GBPS, FAKE_CUDA_PAGEABLE_D2H_GBPS   pageable host
 *                                 memory (h100: 18.6, 14.7); a queued copy of
 *                                 it returns only when it is done
 *   FAKE_CUDA_D2D_GBPS            device to device, copies and the kernel
 *                                 (h100: 1400)
 *   A kernel's piece to or from pinned host memory moves at that
 *   direction's pinned bandwidth; a launch's pieces follow each other on
 *   the kernel's own timeline (the copy engines' timelines do not see it).
 * The GPU's copy engines are timelines, one per direction (H2D, D2H, D2D)
 * shared by all streams: a copy ends at max(ready, engine free) + latency +
 * bytes / bandwidth, where ready is when the work before it on its stream
 * ended. A stream's thread sleeps to that end (an absolute deadline, so its
 * lateness does not add up over a queue of copies); the copy's bytes move
 * before it sleeps. Waiting callers, and idle stream threads, poll briefly
 * before they sleep: a wake-up here takes longer than most modelled times.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>

#include "../fake-gpu.h"
#include "cuda-abi.h"

typedef int CUdevice;
typedef void *CUcontext;
typedef struct fstream *CUstream;
typedef struct fevent *CUevent;
typedef struct fmodule *CUmodule;
typedef struct ffunction *CUfunction;
typedef void (*CUstreamCallback)(CUstream stream, CUresult status, void *user);

enum {
	ERR_INVALID_IMAGE = 200,
	ERR_INVALID_CONTEXT = 201,
	ERR_INVALID_HANDLE = 400,
	ERR_NOT_FOUND = 500,
	ERR_NOT_READY = 600,
	ERR_HOST_ALREADY_REGISTERED = 712,
	ERR_HOST_NOT_REGISTERED = 713,
	MEMORYTYPE_HOST = 1,
	MEMORYTYPE_DEVICE = 2,
	MEM_ALLOCATION_TYPE_PINNED = 1,
	MEM_LOCATION_TYPE_DEVICE = 1,
	MEM_HANDLE_TYPE_POSIX_FD = 1,
};

#define MAX_PINNED 65536
#define VMM_GRANULARITY (2u << 20) /* what the driver reports on an H100 */

/* A cuMemCreate allocation (or an imported one): a memfd of its own. */
struct vmm {
	vmm *next;
	int fd, dev, types;
	size_t size;
	unsigned refs; /* the handle's, each mapping's, each retain's */
	bool imported;
};

#define IPC_MAGIC 0x43504946u

/* The driver's own bookkeeping beside fake-gpu.h's g, under g.lock too. */
static struct {
	vmm *vmms;  /* live cuMemCreate / imported handles */
	struct { uintptr_t start; size_t size; } pinned[MAX_PINNED], reserved[MAX_ALLOCS];
	unsigned npinned, nreserved;
} cu;

static atomic_ulong sync_copies, async_copies, callbacks, ipc_opens, launches, event_records,
	event_waits, stream_waits, vmm_imports;
static atomic_ulong bytes_dir[3]; /* H2D, D2H, D2D */

/* ------------------------------------------------------------ cost model */

enum { H2D, D2H, D2D, H2H };

static struct {
	bool on;
	int64_t call, lat, d2d_lat, sync, callback, launch; /* ns */
	double bw[3], pageable_bw[2]; /* bytes per ns (= GB/s); 0: unlimited */
} cost;

static struct engine {
	pthread_mutex_t lock;
	int64_t busy_until;
} engines[3] = { { PTHREAD_MUTEX_INITIALIZER, 0 }, { PTHREAD_MUTEX_INITIALIZER, 0 },
		 { PTHREAD_MUTEX_INITIALIZER, 0 } };

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Waits until t (CLOCK_MONOTONIC ns). Waits shorter than spin_ns spin (a
 * sleep's wake-up takes longer than they do); longer ones sleep on the
 * absolute deadline. */
static void wait_until(int64_t t, int64_t spin_ns)
{
	int64_t left = t - now_ns();
	if (left <= 0)
		return;
	if (left > spin_ns) {
		struct timespec ts = { (time_t)(t / 1000000000), (long)(t % 1000000000) };
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
			;
		return;
	}
	while (now_ns() < t)
		__asm__ __volatile__("" ::: "memory");
}

/* The GPU side (a stream's thread) sleeps unless the wait is tiny; the
 * calling thread spins up to 50 µs, as the driver's default wait does when
 * there are more CPUs than GPU contexts. */
#define DEVICE_SPIN_NS 5000
#define CALLER_SPIN_NS 50000
#define DEVICE_POLL_NS 20000 /* how long an idle stream looks for work before it sleeps */

/* Spins (with costs) until *v reaches want, for at most CALLER_SPIN_NS:
 * whether it did. A thread woken by a condition variable on this box runs
 * tens of µs later, more than most of the waits modelled. */
static bool poll_until(_Atomic uint64_t *v, uint64_t want)
{
	if (!cost.on)
		return atomic_load(v) >= want;
	int64_t until = now_ns() + CALLER_SPIN_NS;
	while (atomic_load_explicit(v, memory_order_acquire) < want) {
		if (now_ns() > until)
			return false;
		sched_yield(); /* to the thread it waits for, where the CPUs are few */
	}
	return true;
}

/* CPU work of a call on the calling thread. */
static void spend(int64_t ns)
{
	if (ns > 0)
		wait_until(now_ns() + ns, CALLER_SPIN_NS);
}

static int64_t transfer_ns(size_t len, double bw)
{
	if (bw <= 0)
		return 0;
	double x = (double)len / bw;
	int64_t n = (int64_t)x;
	return n < x ? n + 1 : n;
}

/* Takes the engine of `dir` for `dur` ns from `ready` on: when it ends. */
static int64_t engine_run(int dir, int64_t ready, int64_t dur)
{
	struct engine *e = &engines[dir];
	pthread_mutex_lock(&e->lock);
	int64_t start = ready > e->busy_until ? ready : e->busy_until;
	e->busy_until = start + dur;
	pthread_mutex_unlock(&e->lock);
	return start + dur;
}

/* The number (0 to 1e9) the variable `name` holds, in *d: whether it holds
 * one; a line saying it is not `what` when it holds something else. */
static bool env_number(const char *name, const char *what, double *d)
{
	const char *v = getenv(name);
	char *end;
	if (v == NULL)
		return false;
	*d = strtod(v, &end);
	if (end == v || *end != '\0' || !(*d >= 0) || *d > 1e9) {
		fprintf(stderr, "fake-cuda: %s=%s is not %s; ignored\n", name, v, what);
		return false;
	}
	return true;
}

static void env_us(const char *name, int64_t *out)
{
	double d;
	if (env_number(name, "a number of microseconds", &d))
		*out = (int64_t)(d * 1000 + 0.5);
}

static void env_gbps(const char *name, double *out)
{
	double d;
	if (env_number(name, "a bandwidth in GB/s", &d))
		*out = d; /* GB/s = bytes per ns */
}

static void read_costs(void)
{
	const char *preset = getenv("FAKE_CUDA_COSTS");
	if (preset != NULL && strcmp(preset, "h100") == 0) {
		/* Fitted to an H100 80GB PCIe Gen5 host (docs/gpu-model.md). */
		cost.call = 2700;
		cost.lat = 2400;
		cost.d2d_lat = 9300;
		cost.sync = 3700;
		cost.callback = 20000;
		cost.launch = 9300;
		cost.bw[H2D] = 52.7;
		cost.bw[D2H] = 53.9;
		cost.bw[D2D] = 1400;
		cost.pageable_bw[H2D] = 18.6;
		cost.pageable_bw[D2H] = 14.7;
	} else if (preset != NULL && *preset != '\0' && strcmp(preset, "none") != 0) {
		fprintf(stderr, "fake-cuda: FAKE_CUDA_COSTS=%s: no such preset (h100, none); copies are free\n",
			preset);
	}
	env_us("FAKE_CUDA_CALL_US", &cost.call);
	env_us("FAKE_CUDA_COPY_LATENCY_US", &cost.lat);
	env_us("FAKE_CUDA_D2D_LATENCY_US", &cost.d2d_lat);
	env_us("FAKE_CUDA_SYNC_US", &cost.sync);
	env_us("FAKE_CUDA_CALLBACK_US", &cost.callback);
	env_us("FAKE_CUDA_LAUNCH_US", &cost.launch);
	env_gbps("FAKE_CUDA_H2D_GBPS", &cost.bw[H2D]);
	env_gbps("FAKE_CUDA_D2H_GBPS", &cost.bw[D2H]);
	env_gbps("FAKE_CUDA_D2D_GBPS", &cost.bw[D2D]);
	env_gbps("FAKE_CUDA_PAGEABLE_H2D_GBPS", &cost.pageable_bw[H2D]);
	env_gbps("FAKE_CUDA_PAGEABLE_D2H_GBPS", &cost.pageable_bw[D2H]);
	cost.on = cost.call || cost.lat || cost.d2d_lat || cost.sync || cost.callback || cost.launch ||
		  cost.bw[H2D] > 0 || cost.bw[D2H] > 0 || cost.bw[D2D] > 0 || cost.pageable_bw[H2D] > 0 ||
		  cost.pageable_bw[D2H] > 0;
}

/* ---------------------------------------------------------------- memory */

/* The pinned range (cuMemHostAlloc, cuMemHostRegister) holding p: its index, or -1. */
static int pinned_at(uintptr_t p)
{
	for (unsigned i = 0; i < cu.npinned; i++)
		if (p >= cu.pinned[i].start && p - cu.pinned[i].start < cu.pinned[i].size)
			return (int)i;
	return -1;
}

static bool pinned(const void *p, size_t len)
{
	uintptr_t a = (uintptr_t)p;
	pthread_mutex_lock(&g.lock);
	int i = pinned_at(a);
	bool r = i >= 0 && len <= cu.pinned[i].size - (a - cu.pinned[i].start);
	pthread_mutex_unlock(&g.lock);
	return r;
}

static CUresult add_pinned(void *p, size_t len)
{
	CUresult r = ERR_OUT_OF_MEMORY;
	pthread_mutex_lock(&g.lock);
	uintptr_t a = (uintptr_t)p;
	bool overlap = false;
	for (unsigned i = 0; i < cu.npinned && !overlap; i++)
		overlap = a < cu.pinned[i].start + cu.pinned[i].size && cu.pinned[i].start < a + len;
	if (overlap) {
		r = ERR_HOST_ALREADY_REGISTERED;
	} else if (cu.npinned < MAX_PINNED) {
		cu.pinned[cu.npinned].start = a;
		cu.pinned[cu.npinned++].size = len;
		r = OK;
	}
	pthread_mutex_unlock(&g.lock);
	return r;
}

static bool remove_pinned(void *p)
{
	bool found = false;
	pthread_mutex_lock(&g.lock);
	for (unsigned i = 0; i < cu.npinned && !found; i++)
		if (cu.pinned[i].start == (uintptr_t)p) {
			cu.pinned[i] = cu.pinned[--cu.npinned];
			found = true;
		}
	pthread_mutex_unlock(&g.lock);
	return found;
}

/* A copy's direction, and whether its host side is pageable. */
static int direction(const void *d, const void *s, size_t len, bool *pageable)
{
	bool dd = inside(d, 1), sd = inside(s, 1);
	int dir = dd ? (sd ? D2D : H2D) : (sd ? D2H : H2H);
	*pageable = false;
	if (cost.on && (dir == H2D || dir == D2H))
		*pageable = !pinned(dir == H2D ? s : d, len);
	return dir;
}

/* Moves the bytes; with costs, `*end` is when the copy engine is done with
 * a copy that could start at `ready`. */
static CUresult copy(CUdeviceptr dst, CUdeviceptr src, size_t len, int dir, bool pageable, int64_t ready,
		     int64_t *end)
{
	void *d = (void *)(uintptr_t)dst;
	const void *s = (const void *)(uintptr_t)src;
	*end = ready;
	if ((inside(d, 1) && !inside(d, len)) || (inside(s, 1) && !inside(s, len)))
		return ERR_ILLEGAL_ADDRESS;
	if (cost.on && dir != H2H) {
		double bw = pageable ? cost.pageable_bw[dir] : cost.bw[dir];
		*end = engine_run(dir, ready, (dir == D2D ? cost.d2d_lat : cost.lat) + transfer_ns(len, bw));
	}
	memmove(view(d), view(s), len);
	if (dir != H2H)
		atomic_fetch_add(&bytes_dir[dir], len);
	return OK;
}

static void write_stats(void)
{
	const char *path = getenv("FAKE_CUDA_STATS");
	FILE *f = path ? fopen(path, "a") : NULL;
	if (f == NULL)
		return;
	/* The first four fields keep their order: tests/device/cuda-fake.sh reads them. */
	fprintf(f,
		"sync %lu async %lu callbacks %lu ipc %lu launches %lu event_records %lu event_waits %lu "
		"stream_waits %lu h2d_bytes %lu d2h_bytes %lu d2d_bytes %lu vmm_imports %lu\n",
		atomic_load(&sync_copies), atomic_load(&async_copies), atomic_load(&callbacks),
		atomic_load(&ipc_opens), atomic_load(&launches), atomic_load(&event_records),
		atomic_load(&event_waits), atomic_load(&stream_waits), atomic_load(&bytes_dir[H2D]),
		atomic_load(&bytes_dir[D2H]), atomic_load(&bytes_dir[D2D]), atomic_load(&vmm_imports));
	fclose(f);
}

/* At dlclose and at exit, for an initialised instance: tied to this library
 * (an atexit() handler is not where ThreadSanitizer keeps it: it ran after
 * the library had been unloaded, and crashed). */
__attribute__((destructor)) static void fake_fini(void)
{
	if (g.ready)
		write_stats();
}

API CUresult cuInit(unsigned flags)
{
	(void)flags;
	pthread_mutex_lock(&g.lock);
	if (!g.ready && map_devices("fake-cuda"))
		read_costs();
	CUresult r = g.ready ? OK : ERR_OUT_OF_MEMORY;
	pthread_mutex_unlock(&g.lock);
	return r;
}

API CUresult cuDeviceGetCount(int *n)
{
	*n = g.ready ? NDEV : 0;
	return g.ready ? OK : ERR_NOT_INITIALIZED;
}

API CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
	return device_get(dev, ordinal);
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	snprintf(name, (size_t)len, "libte fake GPU %d", dev);
	return OK;
}

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	(void)dev;
	*bytes = DEV_SIZE;
	return OK;
}

API CUresult cuDeviceGetPCIBusId(char *id, int len, CUdevice dev)
{
	snprintf(id, (size_t)len, "0000:%02X:00.0", 0x3b + dev);
	return OK;
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
	*ctx = (CUcontext)(uintptr_t)(dev + 1);
	return OK;
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	(void)dev;
	return OK;
}

/* The calling thread's context stack: the current context on top. Kept
 * under a thread key, not in _Thread_local: this library is dlopen()ed, and
 * LeakSanitizer's scan of a dlopen()ed module's thread-local blocks read
 * stale ranges of threads (once in about sixty runs, "Tracer caught signal
 * 11"). */
#define CTX_STACK 16
typedef struct {
	CUcontext stack[CTX_STACK];
	int depth;
} ctx_tls;

static pthread_key_t ctx_key;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;

static void ctx_key_make(void)
{
	if (pthread_key_create(&ctx_key, free) != 0)
		abort();
}

/* The thread's stack, made at its first use; a thread without memory for it
 * cannot go on. */
static ctx_tls *ctx_here(void)
{
	pthread_once(&ctx_once, ctx_key_make);
	ctx_tls *t = pthread_getspecific(ctx_key);
	if (t == NULL) {
		t = calloc(1, sizeof *t);
		if (t == NULL || pthread_setspecific(ctx_key, t) != 0)
			abort();
	}
	return t;
}

#define ctx_stack (ctx_here()->stack)
#define ctx_depth (ctx_here()->depth)

/* The device of a primary context (cuDevicePrimaryCtxRetain's), or -1. */
static int ctx_dev(CUcontext c)
{
	uintptr_t v = (uintptr_t)c;
	return v >= 1 && v <= NDEV ? (int)v - 1 : -1;
}

/* The current context's device, or -1 when none is current. */
static int current_dev(void)
{
	return ctx_depth > 0 ? ctx_dev(ctx_stack[ctx_depth - 1]) : -1;
}

API CUresult cuCtxSetCurrent(CUcontext ctx)
{
	if (ctx == NULL) {
		if (ctx_depth > 0)
			ctx_depth--;
		return OK;
	}
	if (ctx_dev(ctx) < 0)
		return ERR_INVALID_CONTEXT;
	if (ctx_depth == 0)
		ctx_depth = 1;
	ctx_stack[ctx_depth - 1] = ctx;
	return OK;
}

API CUresult cuCtxGetCurrent(CUcontext *ctx)
{
	if (ctx == NULL)
		return ERR_INVALID_VALUE;
	*ctx = ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : NULL;
	return OK;
}

API CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	if (ctx_dev(ctx) < 0)
		return ERR_INVALID_CONTEXT;
	if (ctx_depth == CTX_STACK)
		return ERR_OUT_OF_MEMORY;
	ctx_stack[ctx_depth++] = ctx;
	return OK;
}

API CUresult cuCtxPopCurrent_v2(CUcontext *ctx)
{
	if (ctx_depth == 0)
		return ERR_INVALID_CONTEXT;
	ctx_depth--;
	if (ctx != NULL)
		*ctx = ctx_stack[ctx_depth];
	return OK;
}

API CUresult cuCtxGetDevice(CUdevice *dev)
{
	int d = current_dev();
	if (d < 0)
		return ERR_INVALID_CONTEXT;
	*dev = d;
	return OK;
}

API CUresult cuGetErrorString(CUresult r, const char **s)
{
	switch (r) {
	case OK: *s = "no error"; break;
	case ERR_INVALID_VALUE: *s = "invalid argument"; break;
	case ERR_OUT_OF_MEMORY: *s = "out of memory"; break;
	case ERR_INVALID_IMAGE: *s = "device kernel image is invalid"; break;
	case ERR_INVALID_CONTEXT: *s = "invalid device context"; break;
	case ERR_INVALID_HANDLE: *s = "invalid resource handle"; break;
	case ERR_NOT_FOUND: *s = "named symbol not found"; break;
	case ERR_NOT_READY: *s = "device not ready"; break;
	case ERR_ILLEGAL_ADDRESS: *s = "an illegal memory access was encountered"; break;
	case ERR_HOST_ALREADY_REGISTERED: *s = "part or all of the requested memory range is already mapped"; break;
	case ERR_HOST_NOT_REGISTERED: *s = "pointer does not correspond to a registered memory region"; break;
	default: *s = "fake CUDA error"; break;
	}
	return OK;
}

API CUresult cuPointerGetAttribute(void *out, int attr, CUdeviceptr p)
{
	alloc a;
	if (!find_alloc((uintptr_t)p, &a)) {
		/* Pinned host memory is known to the driver, as host memory. */
		uintptr_t start = 0;
		size_t size = 0;
		pthread_mutex_lock(&g.lock);
		int i = pinned_at((uintptr_t)p);
		if (i >= 0) {
			start = cu.pinned[i].start;
			size = cu.pinned[i].size;
		}
		pthread_mutex_unlock(&g.lock);
		if (i < 0)
			return ERR_INVALID_VALUE; /* what the driver says of memory it does not know */
		switch (attr) {
		case ATTR_MEMORY_TYPE: *(unsigned *)out = MEMORYTYPE_HOST; return OK;
		case ATTR_DEVICE_POINTER: *(CUdeviceptr *)out = p; return OK; /* unified addressing */
		case ATTR_RANGE_START_ADDR: *(CUdeviceptr *)out = start; return OK;
		case ATTR_RANGE_SIZE: *(size_t *)out = size; return OK;
		default: return ERR_INVALID_VALUE;
		}
	}
	switch (attr) {
	case ATTR_MEMORY_TYPE: *(unsigned *)out = MEMORYTYPE_DEVICE; return OK;
	case ATTR_DEVICE_ORDINAL: *(int *)out = a.dev; return OK;
	case ATTR_RANGE_START_ADDR: *(CUdeviceptr *)out = a.start; return OK;
	case ATTR_RANGE_SIZE: *(size_t *)out = a.size; return OK;
	default: return ERR_INVALID_VALUE;
	}
}

API CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
	alloc a;
	if (!find_alloc((uintptr_t)p, &a))
		return ERR_NOT_FOUND;
	if (base != NULL)
		*base = a.start;
	if (size != NULL)
		*size = a.size;
	return OK;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t len)
{
	int d = current_dev();
	uintptr_t start = 0;
	if (d < 0)
		return ERR_INVALID_CONTEXT;
	pthread_mutex_lock(&g.lock);
	CUresult r = alloc_device(d, len, &start);
	pthread_mutex_unlock(&g.lock);
	if (r == OK)
		*p = start;
	return r;
}

API CUresult cuMemFree_v2(CUdeviceptr p)
{
	return forget(p, A_MALLOC) ? OK : ERR_INVALID_VALUE;
}

API CUresult cuMemHostAlloc(void **p, size_t len, unsigned flags)
{
	(void)flags;
	if (posix_memalign(p, 4096, len ? len : 1) != 0)
		return ERR_OUT_OF_MEMORY;
	if (add_pinned(*p, len ? len : 1) != OK) {
		free(*p);
		return ERR_OUT_OF_MEMORY;
	}
	return OK;
}

API CUresult cuMemFreeHost(void *p)
{
	if (p != NULL && !remove_pinned(p))
		return ERR_INVALID_VALUE;
	free(p);
	return OK;
}

API CUresult cuMemHostRegister_v2(void *p, size_t len, unsigned flags)
{
	(void)flags;
	if (p == NULL || len == 0)
		return ERR_INVALID_VALUE;
	return add_pinned(p, len);
}

API CUresult cuMemHostUnregister(void *p)
{
	return remove_pinned(p) ? OK : ERR_HOST_NOT_REGISTERED;
}

API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t len)
{
	bool pageable;
	int64_t end;
	int dev = current_dev();
	if (dev < 0)
		return ERR_INVALID_CONTEXT;
	atomic_fetch_add(&sync_copies, 1);
	/* A copy on the legacy default stream: after its work and the blocking
	 * streams'. */
	null_drain(dev);
	spend(cost.call);
	int dir = direction((void *)(uintptr_t)dst, (void *)(uintptr_t)src, len, &pageable);
	CUresult r = copy(dst, src, len, dir, pageable, now_ns(), &end);
	if (cost.on && r == OK)
		wait_until(end + cost.sync, CALLER_SPIN_NS); /* the copy engine's end, then the wait's own cost */
	return r;
}

/* ---------------------------------------------------------------- streams */

enum { OP_COPY, OP_CALLBACK, OP_EVENT, OP_GATHER };

struct fevent {
	uint64_t recorded;            /* records made */
	_Atomic uint64_t completed;   /* records reached */
	int64_t done_at;              /* model time the last one was reached */
	CUresult status;              /* its stream's error then (a failed copy before it fails it) */
	unsigned refs;                /* the caller's and each pending record's */
};

static pthread_mutex_t ev_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ev_cond = PTHREAD_COND_INITIALIZER;

typedef struct op {
	qnode q; /* first: the stream queues ops as qnodes */
	int kind, dir;
	bool pageable;
	uint64_t seq;
	int64_t queued; /* when it was queued (ns) */
	CUdeviceptr dst, src;
	size_t len;
	CUstreamCallback cb;
	void (*hostfn)(void *); /* cuLaunchHostFunc's, instead of cb */
	void *user;
	CUevent ev;
	uint64_t gen;
	struct te_gather *k;
	unsigned long long pieces, cover; /* the pieces, and the bytes of each, that the grid covers */
} op;

struct fstream {
	worker w; /* first (stream_new); idle: an op finished; dev: its context's */
	CUresult status;      /* first error of the stream's work */
	_Atomic uint64_t queued; /* ops queued */
	_Atomic uint64_t done; /* ops finished (in order) */
	int64_t ready;        /* model time the last finished op ended */
};

static void event_unref(CUevent e)
{
	pthread_mutex_lock(&ev_lock);
	bool last = --e->refs == 0;
	pthread_mutex_unlock(&ev_lock);
	if (last)
		free(e);
}

/* Whether the kernel reaches [p, p+n): device memory, or pinned host memory. */
static bool kernel_reaches(const void *p, size_t n)
{
	return inside(p, n) || pinned(p, n);
}

/* The kernel: every piece's covered bytes, each side device memory or
 * pinned host memory, or an illegal address (nothing copied: the fake
 * checks first). */
static CUresult gather(const op *o, int64_t ready, int64_t *end)
{
	int64_t dur = cost.launch;
	*end = ready;
	for (unsigned long long i = 0; i < o->pieces; i++) {
		const struct te_piece *p = &o->k->p[i];
		unsigned long long n = p->len < o->cover ? p->len : o->cover;
		if (n == 0)
			continue;
		if (!kernel_reaches((void *)(uintptr_t)p->dst, (size_t)n) ||
		    !kernel_reaches((void *)(uintptr_t)p->src, (size_t)n))
			return ERR_ILLEGAL_ADDRESS;
	}
	for (unsigned long long i = 0; i < o->pieces; i++) {
		const struct te_piece *p = &o->k->p[i];
		unsigned long long n = p->len < o->cover ? p->len : o->cover;
		if (n == 0)
			continue;
		bool pageable;
		int dir = direction((void *)(uintptr_t)p->dst, (void *)(uintptr_t)p->src, (size_t)n, &pageable);
		memmove(view((void *)(uintptr_t)p->dst), view((void *)(uintptr_t)p->src), (size_t)n);
		if (dir != H2H) {
			atomic_fetch_add(&bytes_dir[dir], n);
			dur += transfer_ns((size_t)n, cost.bw[dir]);
		}
	}
	if (cost.on)
		*end = engine_run(D2D, ready, dur);
	return OK;
}

static void *stream_thread(void *arg)
{
	CUstream s = arg;

	/* This thread is the GPU: its sleeps end on the model's deadlines, not
	 * up to 50 µs after them (the default timer slack). */
	prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
	pthread_mutex_lock(&s->w.lock);
	for (;;) {
		if (s->w.head == NULL && !s->w.quit && cost.on) {
			/* A GPU starts queued work within a few µs; a thread woken
			 * by a condition variable here takes tens. */
			uint64_t seen = s->queued;
			pthread_mutex_unlock(&s->w.lock);
			int64_t until = now_ns() + DEVICE_POLL_NS;
			while (atomic_load_explicit(&s->queued, memory_order_acquire) == seen && now_ns() < until)
				sched_yield();
			pthread_mutex_lock(&s->w.lock);
		}
		op *o = (op *)worker_take(&s->w);
		if (o == NULL)
			break;
		if (o->q.ndeps > 0) { /* a blocking or legacy stream's turn comes after the other's */
			pthread_mutex_unlock(&s->w.lock);
			deps_wait(&o->q);
			pthread_mutex_lock(&s->w.lock);
		}
		CUresult status = s->status, r = OK;
		int64_t start = o->queued > s->ready ? o->queued : s->ready, end = start;
		pthread_mutex_unlock(&s->w.lock);
		switch (o->kind) {
		case OP_CALLBACK:
			atomic_fetch_add(&callbacks, 1);
			if (cost.on) {
				/* The GPU tells the host, the host runs the callback, and
				 * the stream waits for its return. */
				end = start + cost.callback;
				wait_until(end, DEVICE_SPIN_NS);
			}
			int64_t t = cost.on ? now_ns() : 0;
			if (o->hostfn != NULL)
				o->hostfn(o->user);
			else
				o->cb(s, status, o->user);
			if (cost.on)
				end += now_ns() - t; /* its own run time, not this thread's lateness */
			break;
		case OP_COPY:
			if (getenv("FAKE_CUDA_FAIL_STREAM"))
				r = ERR_ILLEGAL_ADDRESS;
			else
				r = copy(o->dst, o->src, o->len, o->dir, o->pageable, start, &end);
			atomic_fetch_add(&async_copies, 1);
			break;
		case OP_GATHER:
			r = gather(o, start, &end);
			free(o->k);
			break;
		case OP_EVENT:
			pthread_mutex_lock(&ev_lock);
			if (o->gen > o->ev->completed) {
				o->ev->completed = o->gen;
				o->ev->done_at = start;
				o->ev->status = status;
			}
			pthread_cond_broadcast(&ev_cond);
			pthread_mutex_unlock(&ev_lock);
			event_unref(o->ev);
			break;
		}
		if (cost.on && o->kind != OP_EVENT)
			wait_until(end, DEVICE_SPIN_NS);
		pthread_mutex_lock(&s->w.lock);
		if (s->status == OK)
			s->status = r;
		s->ready = end;
		s->done = o->seq;
		worker_done(&s->w);
		free(o);
	}
	pthread_mutex_unlock(&s->w.lock);
	return NULL;
}

static atomic_int nstreams; /* made by cuStreamCreate and not destroyed */

API CUresult cuStreamCreate(CUstream *out, unsigned flags)
{
	int dev = current_dev();
	const char *max = getenv("FAKE_CUDA_MAX_STREAMS");
	if (dev < 0)
		return ERR_INVALID_CONTEXT;
	if (max != NULL && atomic_fetch_add(&nstreams, 1) >= atoi(max)) {
		atomic_fetch_sub(&nstreams, 1);
		return ERR_OUT_OF_MEMORY;
	} else if (max == NULL) {
		atomic_fetch_add(&nstreams, 1);
	}
	/* Its worker first. CU_STREAM_NON_BLOCKING (1): not ordered against
	 * the legacy stream. */
	*out = stream_new(sizeof **out, stream_thread, dev, flags & 1 ? W_NONBLOCKING : W_BLOCKING);
	if (*out == NULL)
		atomic_fetch_sub(&nstreams, 1);
	return *out != NULL ? OK : ERR_OUT_OF_MEMORY;
}

/* Each device's legacy default stream (CUstream 0, CU_STREAM_LEGACY), made
 * when work is first queued there. It runs its work in order as any stream
 * does, after the blocking streams' work queued before (fake-gpu.h), and
 * cuMemcpy, a synchronous copy on it, waits for that work first: a host
 * function that holds it holds every cuMemcpy of the context, as on a
 * driver. */
static worker *legacy_make(int dev)
{
	return stream_new(sizeof(struct fstream), stream_thread, dev, W_NULL);
}

/* The stream a handle names: the legacy stream of the current context's
 * device for 0 and CU_STREAM_LEGACY (1), made now when `make`, else NULL
 * while it has had no work. */
static CUresult resolve(CUstream s, bool make, CUstream *out)
{
	*out = s;
	if ((uintptr_t)s > 2)
		return OK;
	if (s == (CUstream)2)
		return ERR_INVALID_HANDLE; /* CU_STREAM_PER_THREAD: not modelled */
	int dev = current_dev();
	if (dev < 0)
		return ERR_INVALID_CONTEXT;
	if (make) {
		*out = (CUstream)null_stream(dev, legacy_make);
		return *out != NULL ? OK : ERR_OUT_OF_MEMORY;
	}
	pthread_mutex_lock(&sync_.lock);
	*out = (CUstream)sync_.null_[dev];
	pthread_mutex_unlock(&sync_.lock);
	return OK;
}

/* Queues o on s (0 or CU_STREAM_LEGACY: the current context's legacy
 * stream); its sequence number in *seq. */
static CUresult push(CUstream s, op *o, uint64_t *seq)
{
	CUresult r = o != NULL ? resolve(s, true, &s) : ERR_OUT_OF_MEMORY;
	if (r != OK) {
		free(o);
		return r;
	}
	o->queued = cost.on ? now_ns() : 0;
	/* Ordered against the legacy stream: the deps and the queuing at once
	 * (fake-gpu.h). */
	bool ordered = s->w.kind != W_NONBLOCKING;
	if (ordered) {
		pthread_mutex_lock(&sync_.lock);
		deps_for(&s->w, &o->q);
	}
	pthread_mutex_lock(&s->w.lock);
	o->seq = ++s->queued;
	if (seq != NULL)
		*seq = o->seq;
	worker_push(&s->w, &o->q);
	pthread_mutex_unlock(&s->w.lock);
	if (ordered)
		pthread_mutex_unlock(&sync_.lock);
	return OK;
}

/* Whether s is (0 or CU_STREAM_LEGACY: names) a stream of the current
 * context: kernels and host functions are refused elsewhere. */
static CUresult in_current(CUstream s)
{
	int dev = current_dev();
	if (dev < 0)
		return ERR_INVALID_CONTEXT;
	if ((uintptr_t)s > 2 && s->w.dev != dev)
		return ERR_INVALID_HANDLE;
	return OK;
}

API CUresult cuStreamGetCtx(CUstream s, CUcontext *ctx)
{
	if (ctx == NULL)
		return ERR_INVALID_VALUE;
	int dev = (uintptr_t)s > 2 ? s->w.dev : current_dev();
	if (dev < 0)
		return ERR_INVALID_CONTEXT;
	*ctx = (CUcontext)(uintptr_t)(dev + 1);
	return OK;
}

/* Waits until the stream has finished op `seq`: the end of its work in
 * model time. */
static int64_t wait_done(CUstream s, uint64_t seq, CUresult *status)
{
	poll_until(&s->done, seq);
	pthread_mutex_lock(&s->w.lock);
	while (s->done < seq)
		pthread_cond_wait(&s->w.idle, &s->w.lock);
	int64_t ready = s->ready;
	if (status != NULL)
		*status = s->status;
	pthread_mutex_unlock(&s->w.lock);
	return ready;
}

API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t len, CUstream s)
{
	if (getenv("FAKE_CUDA_FAIL_ASYNC") != NULL &&
	    (pinned((void *)(uintptr_t)dst, 1) || pinned((void *)(uintptr_t)src, 1)))
		return ERR_INVALID_VALUE;
	CUresult r = resolve(s, true, &s);
	if (r != OK)
		return r;
	spend(cost.call);
	op *o = calloc(1, sizeof *o);
	if (o != NULL) {
		*o = (op){ .kind = OP_COPY, .dst = dst, .src = src, .len = len };
		o->dir = direction((void *)(uintptr_t)dst, (void *)(uintptr_t)src, len, &o->pageable);
	}
	bool sync = o != NULL && o->pageable;
	uint64_t seq;
	r = push(s, o, &seq);
	if (r == OK && sync)
		wait_done(s, seq, NULL); /* pageable memory: the driver returns once the copy is done */
	return r;
}

/* Queues a call of `cb` (cuStreamAddCallback()'s form) or of `fn`
 * (cuLaunchHostFunc()'s) on s. */
static CUresult push_callback(CUstream s, CUstreamCallback cb, void (*fn)(void *), void *user)
{
	if (getenv("FAKE_CUDA_NO_CALLBACK") != NULL)
		return ERR_INVALID_VALUE;
	CUresult r = in_current(s);
	if (r != OK)
		return r;
	op *o = calloc(1, sizeof *o);
	if (o != NULL)
		*o = (op){ .kind = OP_CALLBACK, .cb = cb, .hostfn = fn, .user = user };
	return push(s, o, NULL);
}

API CUresult cuStreamAddCallback(CUstream s, CUstreamCallback cb, void *user, unsigned flags)
{
	if (cb == NULL || flags != 0)
		return ERR_INVALID_VALUE;
	return push_callback(s, cb, NULL, user);
}

API CUresult cuLaunchHostFunc(CUstream s, void (*fn)(void *), void *user)
{
	if (fn == NULL)
		return ERR_INVALID_VALUE;
	return push_callback(s, NULL, fn, user);
}

API CUresult cuStreamSynchronize(CUstream s)
{
	atomic_fetch_add(&stream_waits, 1);
	bool legacy = (uintptr_t)s <= 2;
	CUresult r = resolve(s, false, &s);
	if (r != OK)
		return r;
	if (legacy) /* the legacy stream's work, and the blocking streams' before it */
		null_drain(current_dev());
	if (s == NULL)
		return OK; /* the legacy default stream, never used: nothing to wait for */
	int64_t t0 = cost.on ? now_ns() : 0;
	pthread_mutex_lock(&s->w.lock);
	uint64_t seq = s->queued;
	pthread_mutex_unlock(&s->w.lock);
	int64_t end = wait_done(s, seq, &r);
	if (cost.on)
		wait_until((end > t0 ? end : t0) + cost.sync, CALLER_SPIN_NS);
	return r;
}

API CUresult cuStreamDestroy_v2(CUstream s)
{
	if ((uintptr_t)s <= 2)
		return ERR_INVALID_VALUE;
	atomic_fetch_sub(&nstreams, 1);
	stream_free(&s->w);
	return OK;
}

/* ----------------------------------------------------------------- events */

API CUresult cuEventCreate(CUevent *out, unsigned flags)
{
	(void)flags;
	if (getenv("FAKE_CUDA_NO_EVENTS") != NULL)
		return ERR_NOT_SUPPORTED;
	CUevent e = calloc(1, sizeof *e);
	if (e == NULL)
		return ERR_OUT_OF_MEMORY;
	e->refs = 1;
	*out = e;
	return OK;
}

API CUresult cuEventRecord(CUevent e, CUstream s)
{
	if (e == NULL)
		return ERR_INVALID_HANDLE;
	CUresult r = resolve(s, false, &s);
	if (r != OK)
		return r;
	atomic_fetch_add(&event_records, 1);
	pthread_mutex_lock(&ev_lock);
	uint64_t gen = ++e->recorded;
	if (s == NULL) { /* the legacy stream, idle */
		e->completed = gen;
		e->done_at = now_ns();
		e->status = OK;
		pthread_mutex_unlock(&ev_lock);
		return OK;
	}
	e->refs++;
	pthread_mutex_unlock(&ev_lock);
	op *o = calloc(1, sizeof *o);
	if (o != NULL)
		*o = (op){ .kind = OP_EVENT, .ev = e, .gen = gen };
	r = push(s, o, NULL);
	if (r != OK) {
		pthread_mutex_lock(&ev_lock);
		e->completed = e->recorded; /* nothing to wait for */
		pthread_mutex_unlock(&ev_lock);
		event_unref(e);
	}
	return r;
}

API CUresult cuEventQuery(CUevent e)
{
	if (e == NULL)
		return ERR_INVALID_HANDLE;
	pthread_mutex_lock(&ev_lock);
	CUresult r = e->completed >= e->recorded ? e->status : ERR_NOT_READY;
	pthread_mutex_unlock(&ev_lock);
	return r;
}

API CUresult cuEventSynchronize(CUevent e)
{
	if (e == NULL)
		return ERR_INVALID_HANDLE;
	atomic_fetch_add(&event_waits, 1);
	int64_t t0 = cost.on ? now_ns() : 0;
	pthread_mutex_lock(&ev_lock);
	uint64_t want = e->recorded;
	pthread_mutex_unlock(&ev_lock);
	poll_until(&e->completed, want);
	pthread_mutex_lock(&ev_lock);
	while (e->completed < want)
		pthread_cond_wait(&ev_cond, &ev_lock);
	int64_t end = e->done_at;
	CUresult r = e->status;
	pthread_mutex_unlock(&ev_lock);
	if (cost.on)
		wait_until((end > t0 ? end : t0) + cost.sync, CALLER_SPIN_NS);
	return r;
}

API CUresult cuEventDestroy_v2(CUevent e)
{
	if (e == NULL)
		return ERR_INVALID_HANDLE;
	event_unref(e); /* a pending record keeps it until reached, as the driver does */
	return OK;
}

/* ---------------------------------------------------------------- kernels */

struct fmodule {
	uint32_t magic;
};
struct ffunction {
	uint32_t magic;
};
#define MODULE_MAGIC 0x4d4f4455u
static struct ffunction gather_fn = { 0x47415448u };

API CUresult cuModuleLoadData(CUmodule *out, const void *image)
{
	if (out == NULL || image == NULL)
		return ERR_INVALID_VALUE;
	if (strstr(image, ".entry te_gather_copy") == NULL)
		return ERR_INVALID_IMAGE; /* the only kernel this driver runs */
	CUmodule m = calloc(1, sizeof *m);
	if (m == NULL)
		return ERR_OUT_OF_MEMORY;
	m->magic = MODULE_MAGIC;
	*out = m;
	return OK;
}

API CUresult cuModuleGetFunction(CUfunction *out, CUmodule m, const char *name)
{
	if (out == NULL || m == NULL || m->magic != MODULE_MAGIC || name == NULL)
		return ERR_INVALID_VALUE;
	if (strcmp(name, "te_gather_copy") != 0)
		return ERR_NOT_FOUND;
	*out = &gather_fn;
	return OK;
}

API CUresult cuModuleUnload(CUmodule m)
{
	if (m == NULL || m->magic != MODULE_MAGIC)
		return ERR_INVALID_VALUE;
	m->magic = 0;
	free(m);
	return OK;
}

/* te_gather_copy: block (x, y) copies bytes [y*chunk, min((y+1)*chunk, len))
 * of piece x; so the pieces below min(gx, n) move, each its first gy chunks. */
API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
			    unsigned bz, unsigned shared, CUstream s, void **params, void **extra)
{
	(void)shared;
	(void)extra;
	if (f != &gather_fn || params == NULL || params[0] == NULL)
		return ERR_INVALID_VALUE;
	if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 || (uint64_t)bx * by * bz > 1024)
		return ERR_INVALID_VALUE;
	CUresult r = in_current(s);
	if (r != OK)
		return r;
	spend(cost.call);
	op *o = calloc(1, sizeof *o);
	struct te_gather *k = malloc(sizeof *k);
	if (o == NULL || k == NULL) {
		free(o);
		free(k);
		return ERR_OUT_OF_MEMORY;
	}
	memcpy(k, params[0], sizeof *k); /* by value: the caller may reuse it at once */
	unsigned long long n = k->n < 128 ? k->n : 128;
	unsigned long long cover = k->chunk > ~0ull / gy ? ~0ull : k->chunk * gy;
	*o = (op){ .kind = OP_GATHER, .k = k, .pieces = gx < n ? gx : n, .cover = cover };
	atomic_fetch_add(&launches, 1);
	return push(s, o, NULL);
}

/* ------------------------------------------------ virtual memory management */

static vmm *find_vmm(CUmemGenericAllocationHandle h)
{
	vmm *v = cu.vmms;
	while (v != NULL && (uintptr_t)v != h)
		v = v->next;
	return v;
}

/* Drops a reference; under g.lock. */
static void vmm_unref(vmm *v)
{
	if (--v->refs > 0)
		return;
	for (vmm **pp = &cu.vmms; *pp != NULL; pp = &(*pp)->next)
		if (*pp == v) {
			*pp = v->next;
			break;
		}
	close(v->fd);
	free(v);
}

static bool prop_ok(const CUmemAllocationProp *prop)
{
	return prop != NULL && prop->type == MEM_ALLOCATION_TYPE_PINNED &&
	       prop->location.type == MEM_LOCATION_TYPE_DEVICE && prop->location.id >= 0 &&
	       prop->location.id < NDEV;
}

API CUresult cuMemGetAllocationGranularity(size_t *gran, const CUmemAllocationProp *prop, int option)
{
	if (gran == NULL || !prop_ok(prop) || option < 0 || option > 1)
		return ERR_INVALID_VALUE;
	*gran = VMM_GRANULARITY;
	return OK;
}

static CUresult new_vmm(int fd, size_t size, int dev, int types, bool imported, CUmemGenericAllocationHandle *h)
{
	vmm *v = calloc(1, sizeof *v);
	if (v == NULL)
		return ERR_OUT_OF_MEMORY;
	*v = (vmm){ .fd = fd, .dev = dev, .types = types, .size = size, .refs = 1, .imported = imported };
	pthread_mutex_lock(&g.lock);
	v->next = cu.vmms;
	cu.vmms = v;
	pthread_mutex_unlock(&g.lock);
	*h = (uintptr_t)v;
	return OK;
}

API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
			 unsigned long long flags)
{
	if (!g.ready)
		return ERR_NOT_INITIALIZED;
	if (h == NULL || !prop_ok(prop) || flags != 0 || size == 0 || size % VMM_GRANULARITY != 0 ||
	    (prop->requestedHandleTypes & ~MEM_HANDLE_TYPE_POSIX_FD) != 0)
		return ERR_INVALID_VALUE;
	int fd = memfd_create("fake-cuda-vmm", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
		if (fd >= 0)
			close(fd);
		return ERR_OUT_OF_MEMORY;
	}
	CUresult r = new_vmm(fd, size, prop->location.id, prop->requestedHandleTypes, false, h);
	if (r != OK)
		close(fd);
	return r;
}

API CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
	pthread_mutex_lock(&g.lock);
	vmm *v = find_vmm(h);
	if (v != NULL)
		vmm_unref(v); /* the memory lives on while mapped */
	pthread_mutex_unlock(&g.lock);
	return v != NULL ? OK : ERR_INVALID_VALUE;
}

API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
				 unsigned long long flags)
{
	(void)addr; /* a hint */
	if (ptr == NULL || size == 0 || size % VMM_GRANULARITY != 0 || flags != 0 || (align & (align - 1)) != 0)
		return ERR_INVALID_VALUE;
	if (align < VMM_GRANULARITY)
		align = VMM_GRANULARITY;
	/* Inaccessible address space, aligned by trimming a larger reservation. */
	char *p = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return ERR_OUT_OF_MEMORY;
	uintptr_t a = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
	if (a > (uintptr_t)p)
		munmap(p, a - (uintptr_t)p);
	if ((uintptr_t)p + size + align > a + size)
		munmap((void *)(a + size), (uintptr_t)p + size + align - (a + size));
	pthread_mutex_lock(&g.lock);
	bool room = cu.nreserved < MAX_ALLOCS;
	if (room) {
		cu.reserved[cu.nreserved].start = a;
		cu.reserved[cu.nreserved++].size = size;
	}
	pthread_mutex_unlock(&g.lock);
	if (!room) {
		munmap((void *)a, size);
		return ERR_OUT_OF_MEMORY;
	}
	*ptr = a;
	return OK;
}

API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	bool found = false;
	pthread_mutex_lock(&g.lock);
	for (unsigned i = 0; i < cu.nreserved && !found; i++)
		if (cu.reserved[i].start == ptr && cu.reserved[i].size == size) {
			cu.reserved[i] = cu.reserved[--cu.nreserved];
			found = true;
		}
	pthread_mutex_unlock(&g.lock);
	if (!found)
		return ERR_INVALID_VALUE;
	munmap((void *)(uintptr_t)ptr, size);
	return OK;
}

/* Whether [a, a+len) lies in one reservation; under g.lock. */
static bool reserved_range(uintptr_t a, size_t len)
{
	for (unsigned i = 0; i < cu.nreserved; i++)
		if (a >= cu.reserved[i].start && len <= cu.reserved[i].size &&
		    a - cu.reserved[i].start <= cu.reserved[i].size - len)
			return true;
	return false;
}

API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
		      unsigned long long flags)
{
	if (flags != 0 || size == 0 || size % VMM_GRANULARITY != 0 || offset % VMM_GRANULARITY != 0 ||
	    ptr % VMM_GRANULARITY != 0)
		return ERR_INVALID_VALUE;
	pthread_mutex_lock(&g.lock);
	vmm *v = find_vmm(h);
	CUresult r = ERR_INVALID_VALUE;
	bool busy = false;
	for (unsigned i = 0; i < g.nallocs && !busy; i++)
		busy = ptr < g.allocs[i].start + g.allocs[i].size && g.allocs[i].start < ptr + size;
	if (v != NULL && offset <= v->size && size <= v->size - offset && reserved_range(ptr, size) && !busy &&
	    g.nallocs < MAX_ALLOCS) {
		/* As cuInit maps the devices: no access at the caller's address,
		 * a read-write view for the copies. */
		char *d = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, v->fd, (off_t)offset);
		char *rw = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, v->fd, (off_t)offset);
		if (d != MAP_FAILED && rw != MAP_FAILED) {
			g.allocs[g.nallocs++] = (alloc){ .start = ptr, .size = size, .priv = rw, .mapped = size,
							 .kind = A_VMM, .dev = v->dev, .h = v };
			v->refs++;
			atomic_fetch_add(&nviews, 1);
			r = OK;
		} else {
			if (rw != MAP_FAILED)
				munmap(rw, size);
			if (d != MAP_FAILED)
				mmap(d, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
			r = ERR_OUT_OF_MEMORY;
		}
	}
	pthread_mutex_unlock(&g.lock);
	return r;
}

API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	CUresult r = ERR_INVALID_VALUE;
	pthread_mutex_lock(&g.lock);
	for (unsigned i = 0; i < g.nallocs; i++)
		if (g.allocs[i].kind == A_VMM && g.allocs[i].start == ptr && g.allocs[i].size == size) {
			alloc a = g.allocs[i];
			g.allocs[i] = g.allocs[--g.nallocs];
			atomic_fetch_sub(&nviews, 1);
			munmap(a.priv, a.mapped);
			/* The address range stays reserved. */
			mmap((void *)a.start, a.mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
			     -1, 0);
			vmm_unref(a.h);
			r = OK;
			break;
		}
	pthread_mutex_unlock(&g.lock);
	return r;
}

API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	/* The device view stays without access rights: the CPU may never touch
	 * device memory. Only checked: the range is mapped, the devices exist. */
	alloc a;
	if (desc == NULL || count == 0 || !find_alloc((uintptr_t)ptr, &a) || a.kind != A_VMM ||
	    size > a.size - (ptr - a.start))
		return ERR_INVALID_VALUE;
	for (size_t i = 0; i < count; i++)
		if (desc[i].location.type != MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
		    desc[i].location.id >= NDEV)
			return ERR_INVALID_VALUE;
	return OK;
}

API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr)
{
	CUresult r = ERR_INVALID_VALUE;
	uintptr_t p = (uintptr_t)addr;
	pthread_mutex_lock(&g.lock);
	for (unsigned i = 0; i < g.nallocs; i++)
		if (g.allocs[i].kind == A_VMM && p >= g.allocs[i].start && p - g.allocs[i].start < g.allocs[i].size) {
			g.allocs[i].h->refs++;
			*h = (uintptr_t)g.allocs[i].h;
			r = OK;
			break;
		}
	pthread_mutex_unlock(&g.lock);
	return r;
}

API CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle h, int type,
					  unsigned long long flags)
{
	if (shareable == NULL || type != MEM_HANDLE_TYPE_POSIX_FD || flags != 0)
		return ERR_INVALID_VALUE;
	pthread_mutex_lock(&g.lock);
	vmm *v = find_vmm(h);
	int fd = -1;
	CUresult r = ERR_INVALID_VALUE;
	if (v != NULL && (v->types & MEM_HANDLE_TYPE_POSIX_FD)) {
		fd = fcntl(v->fd, F_DUPFD_CLOEXEC, 0); /* a new descriptor, the caller's to close */
		r = fd >= 0 ? OK : ERR_OUT_OF_MEMORY;
	} else if (v != NULL) {
		r = ERR_NOT_SUPPORTED; /* created without that handle type */
	}
	pthread_mutex_unlock(&g.lock);
	if (r == OK)
		*(int *)shareable = fd;
	return r;
}

API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle, int type)
{
	struct stat st;
	if (!g.ready)
		return ERR_NOT_INITIALIZED;
	if (h == NULL || type != MEM_HANDLE_TYPE_POSIX_FD)
		return ERR_INVALID_VALUE;
	int fd = (int)(uintptr_t)os_handle;
	if (fstat(fd, &st) != 0 || st.st_size <= 0 || st.st_size % VMM_GRANULARITY != 0)
		return ERR_INVALID_VALUE;
	int own_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0); /* the caller keeps and closes its descriptor */
	if (own_fd < 0)
		return ERR_OUT_OF_MEMORY;
	CUresult r = new_vmm(own_fd, (size_t)st.st_size, 0, MEM_HANDLE_TYPE_POSIX_FD, true, h);
	if (r != OK)
		close(own_fd);
	else
		atomic_fetch_add(&vmm_imports, 1);
	return r;
}

/* ---------------------------------------------------------------- IPC */

API CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
	alloc a;
	/* Handles name whole cuMemAlloc allocations of this process: the
	 * driver's legacy IPC refuses cuMemCreate memory too. */
	if (!find_alloc((uintptr_t)p, &a) || a.kind != A_MALLOC || a.start != p)
		return ERR_INVALID_VALUE;
	ipc_export(h->reserved, &a, IPC_MAGIC);
	return OK;
}

API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *out, CUipcMemHandle h, unsigned flags)
{
	void *d;
	(void)flags;
	CUresult r = ipc_open(h.reserved, IPC_MAGIC, 0, &d);
	if (r == OK) {
		*out = (uintptr_t)d;
		atomic_fetch_add(&ipc_opens, 1);
	}
	return r;
}

API CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
	return ipc_close(p) ? OK : ERR_INVALID_VALUE;
}
