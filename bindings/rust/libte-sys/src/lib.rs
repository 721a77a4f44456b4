//! Raw declarations of libte's C API, `<te/te.h>` version 1.1, written by
//! hand. Everything here is `unsafe` to call and mirrors the header one to
//! one: the structs are `#[repr(C)]` with the header's field order and types
//! (tests/layout.rs checks them against the C compiler), the enums are
//! constants, opaque handles are zero-sized `#[repr(C)]` types only ever used
//! behind pointers. The safe API is the `libte` crate.
//!
//! Linking: build.rs asks `pkg-config --libs libte`.
#![allow(non_camel_case_types)]

// std::os::raw rather than core::ffi: the C types reached core in 1.64.
use std::marker::{PhantomData, PhantomPinned};
use std::os::raw::{c_char, c_int, c_uint, c_void};

pub const TE_ABI_MAJOR: c_int = 1;
pub const TE_ABI_MINOR: c_int = 6;

// ------------------------------------------------------------------ errors

pub const TE_ERR_BASE: c_int = 4096;
/// A plugin could not be loaded or failed.
pub const TE_ERR_PLUGIN: c_int = -(TE_ERR_BASE + 1);
/// No installed transport reaches the segment.
pub const TE_ERR_NO_TRANSPORT: c_int = -(TE_ERR_BASE + 2);
/// The metadata store failed or holds bad data.
pub const TE_ERR_METADATA: c_int = -(TE_ERR_BASE + 3);
/// A peer broke the wire protocol.
pub const TE_ERR_PROTOCOL: c_int = -(TE_ERR_BASE + 4);
/// A peer refused the request.
pub const TE_ERR_REJECTED: c_int = -(TE_ERR_BASE + 5);
/// More requests than the batch's capacity.
pub const TE_ERR_BATCH_FULL: c_int = -(TE_ERR_BASE + 6);
/// Memory not registered, or a range outside a buffer.
pub const TE_ERR_ADDRESS: c_int = -(TE_ERR_BASE + 7);
/// A registration overlaps an existing one.
pub const TE_ERR_OVERLAP: c_int = -(TE_ERR_BASE + 8);
/// Unknown or closed segment id.
pub const TE_ERR_SEGMENT: c_int = -(TE_ERR_BASE + 9);
/// Unknown or freed batch id.
pub const TE_ERR_BATCH: c_int = -(TE_ERR_BASE + 10);
/// Peer authentication failed, or the two sides' keys differ (since 1.2).
pub const TE_ERR_AUTH: c_int = -(TE_ERR_BASE + 11);

// ----------------------------------------------------------------- logging

pub const TE_LOG_ERROR: c_int = 0;
pub const TE_LOG_WARN: c_int = 1;
pub const TE_LOG_INFO: c_int = 2;
pub const TE_LOG_DEBUG: c_int = 3;
pub const TE_LOG_TRACE: c_int = 4;

pub type te_log_fn = Option<
    unsafe extern "C" fn(level: c_int, domain: *const c_char, msg: *const c_char, user: *mut c_void),
>;

// ------------------------------------------------------------------ engine

/// Opaque engine handle.
#[repr(C)]
pub struct te_engine {
    _opaque: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct te_option {
    pub key: *const c_char,
    pub value: *const c_char,
}

// -------------------------------------------------------- memory registry

pub const TE_MEM_REMOTE_ACCESS: c_uint = 1 << 0;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct te_memory_region {
    pub addr: *mut c_void,
    pub length: usize,
    pub location: *const c_char,
    pub flags: c_uint,
}

// ---------------------------------------------------------------- segments

pub type te_segment_id = i32;
pub const TE_LOCAL_SEGMENT: te_segment_id = 0;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct te_segment_buffer {
    pub addr: u64,
    pub length: u64,
    pub name: [c_char; 64],
}

// ----------------------------------------------------------------- batches

pub type te_batch_id = u64;
pub const TE_INVALID_BATCH: te_batch_id = u64::MAX;

pub const TE_OP_READ: u32 = 0;
pub const TE_OP_WRITE: u32 = 1;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct te_request {
    pub opcode: u32,
    pub segment: te_segment_id,
    pub local: *mut c_void,
    pub remote: u64,
    pub length: u64,
}

pub const TE_TASK_WAITING: i32 = 0;
pub const TE_TASK_PENDING: i32 = 1;
pub const TE_TASK_INVALID: i32 = 2;
pub const TE_TASK_CANCELED: i32 = 3;
pub const TE_TASK_COMPLETED: i32 = 4;
pub const TE_TASK_TIMEOUT: i32 = 5;
pub const TE_TASK_FAILED: i32 = 6;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct te_task_status {
    pub state: i32,
    pub error: i32,
    pub transferred: u64,
}

// --------------------------------------------------------------- deadlines

/// Ended (by a deadline or a cancel) while a WRITE's bytes were on their way:
/// the peer may still apply them. Cleared once it cannot (since 1.6).
pub const TE_TASK_UNSETTLED: u32 = 1 << 0;
/// Ended by the host at its deadline or at a cancel, before its transport
/// finished it (since 1.6).
pub const TE_TASK_ENDED_EARLY: u32 = 1 << 1;

/// A task's status with what te_task_status cannot carry (since 1.6).
/// Versioned by `size`: set it to `size_of::<te_task_info>()` before
/// te_get_task_info().
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct te_task_info {
    pub size: u32,
    pub state: i32,
    pub error: i32,
    pub flags: u32,
    pub transferred: u64,
    pub deadline_ns: i64,
}

// ----------------------------------------------------------- notifications

pub const TE_NOTIFY_MAX: usize = 4096;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct te_notification {
    pub name: *mut c_char,
    pub msg: *mut c_char,
}

// ---------------------------------------------------------- metadata store

/// Opaque metadata store handle.
#[repr(C)]
pub struct te_metadata {
    _opaque: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

// ----------------------------------------------------------------- metrics

/// Engine-wide totals (since 1.3). Versioned by `size`: set it to
/// `size_of::<te_stats>()` before te_engine_stats(). Arrays are indexed by
/// opcode (TE_OP_READ, TE_OP_WRITE).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct te_stats {
    pub size: u32,
    pub reserved: u32,
    pub requests: [u64; 2],
    pub bytes: [u64; 2],
    pub completed: [u64; 2],
    pub failed: [u64; 2],
    pub canceled: [u64; 2],
    pub in_flight: u64,
    pub in_flight_bytes: u64,
    pub retries: u64,
    pub failovers: u64,
    pub notifies_sent: u64,
    pub notifies_received: u64,
    pub registered_bytes: u64,
    pub registered_regions: u64,
    pub rpc_served: u64,
    pub rpc_refused: u64,
    pub auth_refused: u64,
}

// ----------------------------------------------------------------- plugins

pub const TE_KIND_TRANSPORT: c_int = 1;
pub const TE_KIND_METADATA: c_int = 2;
/// Device memory plugins (GPUs), since 1.2.
pub const TE_KIND_DEVICE: c_int = 3;
/// Metrics exporters (TE_METRICS_ADDR), since 1.3.
pub const TE_KIND_EXPORTER: c_int = 4;

/// Versioned by `size`: read a field only when `size` covers it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct te_plugin_info {
    pub size: usize,
    pub path: *const c_char,
    pub name: *const c_char,
    pub version: *const c_char,
    pub description: *const c_char,
    pub kind: c_int,
    pub abi_major: c_uint,
    pub abi_minor: c_uint,
    pub loaded: c_int,
    pub reason: *const c_char,
}

pub type te_plugin_info_fn = Option<unsafe extern "C" fn(info: *const te_plugin_info, user: *mut c_void)>;
pub type te_plugin_dir_fn = Option<unsafe extern "C" fn(dir: *const c_char, exists: c_int, user: *mut c_void)>;

extern "C" {
    pub fn te_strerror(err: c_int) -> *const c_char;
    pub fn te_version() -> *const c_char;
    pub fn te_last_error() -> *const c_char;
    pub fn te_last_error_clear();

    pub fn te_set_log_handler(fn_: te_log_fn, user: *mut c_void);
    pub fn te_set_log_level(level: c_int);
    pub fn te_get_log_level() -> c_int;
    pub fn te_log_write(level: c_int, domain: *const c_char, msg: *const c_char);

    pub fn te_engine_create(
        metadata: *const c_char,
        local_name: *const c_char,
        options: *const te_option,
        n_options: usize,
        out: *mut *mut te_engine,
    ) -> c_int;
    pub fn te_engine_destroy(engine: *mut te_engine);
    pub fn te_engine_name(engine: *const te_engine) -> *const c_char;
    pub fn te_engine_rpc_port(engine: *const te_engine) -> c_int;
    pub fn te_engine_address(engine: *const te_engine) -> *const c_char;

    pub fn te_transport_install(engine: *mut te_engine, name: *const c_char, json_args: *const c_char) -> c_int;
    pub fn te_transport_uninstall(engine: *mut te_engine, name: *const c_char) -> c_int;
    pub fn te_transport_auto(engine: *mut te_engine, installed: *mut *const c_char) -> c_int;
    pub fn te_transport_list(engine: *const te_engine, names: *mut *const c_char, max: usize) -> c_int;

    pub fn te_register_memory(
        engine: *mut te_engine,
        addr: *mut c_void,
        length: usize,
        location: *const c_char,
        flags: c_uint,
    ) -> c_int;
    pub fn te_unregister_memory(engine: *mut te_engine, addr: *mut c_void) -> c_int;
    pub fn te_mem_alloc(length: usize, addr: *mut *mut c_void) -> c_int;
    pub fn te_mem_free(addr: *mut c_void) -> c_int;
    pub fn te_register_memory_batch(engine: *mut te_engine, regions: *const te_memory_region, n: usize) -> c_int;
    pub fn te_unregister_memory_batch(engine: *mut te_engine, addrs: *const *mut c_void, n: usize) -> c_int;

    pub fn te_segment_open(engine: *mut te_engine, name: *const c_char) -> te_segment_id;
    pub fn te_segment_open_with(
        engine: *mut te_engine,
        name: *const c_char,
        transport: *const c_char,
    ) -> te_segment_id;
    pub fn te_segment_close(engine: *mut te_engine, segment: te_segment_id) -> c_int;
    pub fn te_segment_transport(engine: *mut te_engine, segment: te_segment_id) -> *const c_char;
    pub fn te_segment_refresh(engine: *mut te_engine, segment: te_segment_id) -> c_int;
    pub fn te_segment_find(engine: *mut te_engine, name: *const c_char) -> te_segment_id;
    pub fn te_segment_descriptor(engine: *mut te_engine, segment: te_segment_id, json: *mut *mut c_char) -> c_int;
    pub fn te_segment_refresh_all(engine: *mut te_engine) -> c_int;
    pub fn te_segment_probe(engine: *mut te_engine, name: *const c_char, timeout_ms: c_int) -> c_int;
    pub fn te_segment_buffers(
        engine: *mut te_engine,
        segment: te_segment_id,
        out: *mut te_segment_buffer,
        max: usize,
    ) -> c_int;

    pub fn te_batch_alloc(engine: *mut te_engine, capacity: usize, out: *mut te_batch_id) -> c_int;
    pub fn te_batch_free(engine: *mut te_engine, batch: te_batch_id) -> c_int;
    pub fn te_submit(engine: *mut te_engine, batch: te_batch_id, reqs: *const te_request, n: usize) -> c_int;
    pub fn te_get_status(engine: *mut te_engine, batch: te_batch_id, task: usize, out: *mut te_task_status) -> c_int;
    pub fn te_batch_status(
        engine: *mut te_engine,
        batch: te_batch_id,
        submitted: *mut usize,
        in_flight: *mut usize,
        state: *mut i32,
    ) -> c_int;
    pub fn te_batch_wait(engine: *mut te_engine, batch: te_batch_id, timeout_ms: c_int) -> c_int;
    pub fn te_batch_cancel(engine: *mut te_engine, batch: te_batch_id) -> c_int;

    // Deadlines (since 1.6): CLOCK_MONOTONIC nanoseconds, 0 = none.
    pub fn te_now_ns() -> i64;
    pub fn te_batch_set_deadline(engine: *mut te_engine, batch: te_batch_id, deadline_ns: i64) -> c_int;
    pub fn te_submit_by(
        engine: *mut te_engine,
        batch: te_batch_id,
        reqs: *const te_request,
        n: usize,
        deadline_ns: i64,
    ) -> c_int;
    pub fn te_get_task_info(engine: *mut te_engine, batch: te_batch_id, task: usize, out: *mut te_task_info)
        -> c_int;
    pub fn te_batch_wait_settled(engine: *mut te_engine, batch: te_batch_id, timeout_ms: c_int) -> c_int;
    pub fn te_batch_notify(
        engine: *mut te_engine,
        batch: te_batch_id,
        segment: te_segment_id,
        msg: *const c_char,
    ) -> c_int;

    pub fn te_notify_send(engine: *mut te_engine, segment: te_segment_id, msg: *const c_char) -> c_int;
    pub fn te_notify_send_as(
        engine: *mut te_engine,
        segment: te_segment_id,
        sender: *const c_char,
        msg: *const c_char,
    ) -> c_int;
    pub fn te_batch_notify_as(
        engine: *mut te_engine,
        batch: te_batch_id,
        segment: te_segment_id,
        sender: *const c_char,
        msg: *const c_char,
    ) -> c_int;
    pub fn te_notify_fetch(engine: *mut te_engine, out: *mut *mut te_notification, count: *mut usize) -> c_int;
    pub fn te_notifications_free(list: *mut te_notification, count: usize);

    pub fn te_metadata_open(conn: *const c_char, out: *mut *mut te_metadata) -> c_int;
    pub fn te_metadata_close(md: *mut te_metadata);
    pub fn te_metadata_get(md: *mut te_metadata, key: *const c_char, value: *mut *mut c_char, len: *mut usize)
        -> c_int;
    pub fn te_metadata_put(md: *mut te_metadata, key: *const c_char, value: *const c_char, len: usize) -> c_int;
    pub fn te_metadata_remove(md: *mut te_metadata, key: *const c_char) -> c_int;
    pub fn te_metadata_segment_key(name: *const c_char, buf: *mut c_char, size: usize) -> c_int;
    pub fn te_metadata_rpc_key(name: *const c_char, buf: *mut c_char, size: usize) -> c_int;

    pub fn te_free(p: *mut c_void);

    pub fn te_plugin_foreach(fn_: te_plugin_info_fn, user: *mut c_void) -> c_int;
    pub fn te_plugin_dirs(fn_: te_plugin_dir_fn, user: *mut c_void) -> c_int;
    pub fn te_plugin_report(name: *const c_char, text: *mut *mut c_char) -> c_int;

    // Device memory (since 1.2): memory of a device plugin ("cuda:0").
    pub fn te_device_alloc(location: *const c_char, len: usize, ptr: *mut *mut c_void) -> c_int;
    pub fn te_device_free(ptr: *mut c_void) -> c_int;
    pub fn te_device_copy(dst: *mut c_void, src: *const c_void, len: usize) -> c_int;
    pub fn te_device_locate(addr: *const c_void, len: usize, buf: *mut c_char, size: usize) -> c_int;
    pub fn te_device_stream_wait(location: *const c_char, stream: *mut c_void) -> c_int;
    // Since 1.4: requests that start when the stream gets there.
    pub fn te_submit_on_stream(
        engine: *mut te_engine,
        batch: te_batch_id,
        reqs: *const te_request,
        n: usize,
        location: *const c_char,
        stream: *mut c_void,
    ) -> c_int;

    // Metrics (since 1.3). The texts are released with te_free().
    pub fn te_engine_stats(engine: *mut te_engine, out: *mut te_stats) -> c_int;
    pub fn te_engine_stats_json(engine: *mut te_engine, json: *mut *mut c_char) -> c_int;
    pub fn te_metrics_text(engine: *mut te_engine, text: *mut *mut c_char, len: *mut usize) -> c_int;
}
