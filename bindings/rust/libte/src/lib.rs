//! Safe Rust API of libte, the zero-copy, batched, asynchronous transfer
//! engine (the C API is `<te/te.h>`; the raw declarations are the
//! `libte-sys` crate).
//!
//! An [`Engine`] joins a cluster under a segment name; memory it moves is
//! registered ([`Engine::register`]); other engines' memory is a
//! [`Segment`]; transfers run in a [`Batch`] of [`Request`]s, each ending in
//! a [`TaskStatus`]. [`Engine::read`] and [`Engine::write`] do one transfer
//! and wait. Failures are [`Error`]s carrying libte's code, its name and the
//! text libte logged.
//!
//! # What borrows what
//!
//! - [`Segment`], [`Registration`] and [`Batch`] borrow the [`Engine`]: the
//!   engine cannot be destroyed while one of them exists.
//! - [`Engine::register`] borrows the buffer mutably until it has
//!   unregistered it, so the buffer cannot be freed, moved or used behind
//!   libte's back while it is registered. Its closure gets the
//!   [`Registration`], through which Rust code reads and writes the memory
//!   and takes [`Local`] ranges of it for requests.
//! - A [`Request`] borrows its local range: mutably for a READ (libte
//!   writes it), shared for a WRITE (libte reads it). Submitting it to a
//!   `Batch<'e, 'r>` extends that borrow to `'r`, which outlasts the
//!   [`Engine::batch`] call, and that call does not return before every
//!   task has ended. So no safe code can read, write, unregister or free
//!   memory a task may still touch.
//! - Registrations and batches are lent to closures instead of returned
//!   as handles because leaking a value is safe in Rust (`mem::forget`):
//!   a leaked handle would end its borrows without running its Drop, and
//!   memory would be freed while still registered or while a task moves
//!   bytes into it. The closures' guards run whatever the closure does,
//!   panics included.
//! - Segments are returned as handles (closed on drop): a leaked one only
//!   leaks a reference count. [`SegmentId`] is a plain number for
//!   requests; once the segment is closed it fails with
//!   [`code::SEGMENT`].
//!
//! What the borrow checker covers is the local side of every request. The
//! remote side is an address in a segment: another process's memory, or,
//! through [`SegmentId::LOCAL`], any memory this engine registered. Memory
//! that can be the remote side of a transfer (registered with remote
//! access, or addressed through the local segment) changes whenever the
//! application lets a transfer target it; as with any memory shared with
//! another process, the application's protocol (a notification, a message,
//! a batch it waited for) says when its bytes are settled. Do not point a
//! local-segment request at memory Rust code is using at the same time.
//!
//! # Threads
//!
//! All of libte's calls are thread-safe: [`Engine`] is `Send + Sync`, and a
//! [`Batch`] may be used from several threads at once (lend `&Batch` to
//! `std::thread::scope`). A [`Local`] splits into disjoint pieces
//! ([`Local::chunks`], [`Local::split_at`]) that threads own separately.
//!
//! # What the compiler refuses
//!
//! An engine dropped while a segment of it is open:
//!
//! ```compile_fail
//! let engine = libte::Engine::new("P2PHANDSHAKE", Some("127.0.0.1"), &[]).unwrap();
//! let seg = engine.local_segment();
//! drop(engine);
//! println!("{:?}", seg.id());
//! ```
//!
//! A buffer freed while it is registered:
//!
//! ```compile_fail
//! # let engine = libte::Engine::new("P2PHANDSHAKE", Some("127.0.0.1"), &[]).unwrap();
//! let mut buf = vec![0u8; 4096];
//! engine.register(&mut buf, "cpu:0", false, |_reg| {
//!     drop(buf);
//!     Ok::<_, libte::Error>(())
//! }).unwrap();
//! ```
//!
//! A batch kept after its closure (where it would outlive its wait):
//!
//! ```compile_fail
//! # let engine = libte::Engine::new("P2PHANDSHAKE", Some("127.0.0.1"), &[]).unwrap();
//! let mut kept = None;
//! engine.batch(1, |b| {
//!     kept = Some(b);
//!     Ok::<_, libte::Error>(())
//! }).unwrap();
//! ```
//!
//! An engine dropped while a batch of it is in use:
//!
//! ```compile_fail
//! let engine = libte::Engine::new("P2PHANDSHAKE", Some("127.0.0.1"), &[]).unwrap();
//! engine.batch(1, |b| {
//!     drop(engine);
//!     b.wait(None)
//! }).unwrap();
//! ```
//!
//! Memory read by Rust while a READ into it may still run:
//!
//! ```compile_fail
//! use libte::{Request, SegmentId};
//! # let engine = libte::Engine::new("P2PHANDSHAKE", Some("127.0.0.1"), &[]).unwrap();
//! let mut buf = vec![0u8; 4096];
//! engine.register(&mut buf, "cpu:0", false, |reg| {
//!     let mut local = reg.local();
//!     engine.batch(1, |b| {
//!         b.submit([Request::read(SegmentId::LOCAL, 0, &mut local)])?;
//!         let first = local[0];
//!         b.wait(None)
//!     })
//! }).unwrap();
//! ```
//!
//! A request whose memory would stop being borrowed before the batch ends
//! (`local` lives only inside the batch's closure):
//!
//! ```compile_fail
//! use libte::{Request, SegmentId};
//! # let engine = libte::Engine::new("P2PHANDSHAKE", Some("127.0.0.1"), &[]).unwrap();
//! let mut buf = vec![0u8; 4096];
//! engine.register(&mut buf, "cpu:0", false, |reg| {
//!     engine.batch(1, |b| {
//!         let mut local = reg.local();
//!         b.submit([Request::read(SegmentId::LOCAL, 0, &mut local)])?;
//!         Ok::<_, libte::Error>(())
//!     })
//! }).unwrap();
//! ```
//!
//! The same with the borrow taken right: `local` outlives the batch.
//!
//! ```no_run
//! use libte::{Request, SegmentId};
//! # let engine = libte::Engine::new("P2PHANDSHAKE", Some("127.0.0.1"), &[]).unwrap();
//! let mut buf = vec![0u8; 4096];
//! engine.register(&mut buf, "cpu:0", false, |reg| {
//!     let mut local = reg.local();
//!     engine.batch(1, |b| {
//!         b.submit([Request::read(SegmentId::LOCAL, 0, &mut local)])?;
//!         b.wait(None)
//!     })?;
//!     println!("{}", local[0]);
//!     Ok::<_, libte::Error>(())
//! }).unwrap();
//! ```

mod batch;
mod engine;
mod error;
mod memory;
mod metrics;
mod process;
mod segment;

pub use batch::{Batch, BatchSummary, Opcode, ReadTarget, Request, TaskInfo, TaskState, TaskStatus, WriteSource};
pub use engine::{Engine, Notification};
pub use error::{code, strerror, Error, Result};
pub use memory::{Local, Registration, SharedMemory};
pub use metrics::{OpTotals, Stats, Totals};
pub use process::{
    log, log_level, plugins, reset_log_handler, set_log_handler, set_log_level, version, LogLevel, PluginInfo, PluginKind,
};
pub use segment::{Segment, SegmentBuffer, SegmentId};

/// The clock of deadlines: CLOCK_MONOTONIC in nanoseconds (te_now_ns).
pub fn now_ns() -> i64 {
    // SAFETY: no arguments, no state.
    unsafe { sys::te_now_ns() }
}

/// The deadline `after` from now, on [`now_ns`]'s clock.
pub fn deadline_in(after: std::time::Duration) -> i64 {
    let ns = after.as_nanos().min(i64::MAX as u128) as i64;
    now_ns().saturating_add(ns)
}

/// The raw C API, for what this crate does not wrap.
pub use libte_sys as sys;

// The README's example runs as a doc-test.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
