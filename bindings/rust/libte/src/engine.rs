//! The engine: creation, transports, segments, notifications, and the
//! scoped entry points for registered memory and batches.
use crate::batch::{Batch, ReadTarget, Request, TaskState, WriteSource};
use crate::error::{call, code, Error, Result};
use crate::memory::Registration;
use crate::segment::{Segment, SegmentBuffer, SegmentId};
use libte_sys as sys;
use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_void};
use std::ptr::{self, NonNull};
use std::time::Duration;

/// A string argument for libte: refused (EINVAL) when it holds a NUL byte,
/// which C would silently cut at.
pub(crate) fn cstring(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::new(code::EINVAL, format!("{} contains a NUL byte: {:?}", what, s)))
}

pub(crate) fn owned_text(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: libte hands out NUL-terminated strings; copied at once.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// A message received from a peer's engine (te_notify_fetch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The sender's segment name (or the name it chose with `notify_as`).
    pub name: String,
    pub msg: String,
}

/// One libte engine: a member of a cluster under a segment name.
///
/// libte's calls are thread-safe, so an `Engine` is `Send + Sync` and is
/// shared between threads by reference (`std::thread::scope`) or in an
/// `Arc`. Everything made from it (segments, registrations, batches) borrows
/// it, so it cannot be dropped while any of them exists; dropping it calls
/// te_engine_destroy().
pub struct Engine {
    raw: NonNull<sys::te_engine>,
    name: String,
    address: String,
}

// SAFETY: every te.h call is thread-safe; the one exception (nothing may use
// an engine during or after te_engine_destroy) is ruled out by Drop taking
// the engine by value after every borrow of it ended.
unsafe impl Send for Engine {}
unsafe impl Sync for Engine {}

impl Engine {
    /// te_engine_create(): joins the cluster behind `metadata`
    /// ("P2PHANDSHAKE", "etcd://h:p", "redis://h:p", "http://h:p/path")
    /// under `name` (None: the host name). `options` are te.h's key/value
    /// options ("transports", "rpc_port", "ip_or_host_name", ...).
    pub fn new(metadata: &str, name: Option<&str>, options: &[(&str, &str)]) -> Result<Engine> {
        let metadata = cstring(metadata, "metadata connection string")?;
        let name = name.map(|n| cstring(n, "engine name")).transpose()?;
        let mut strings = Vec::with_capacity(options.len());
        for (k, v) in options {
            strings.push((cstring(k, "option key")?, cstring(v, "option value")?));
        }
        let opts: Vec<sys::te_option> =
            strings.iter().map(|(k, v)| sys::te_option { key: k.as_ptr(), value: v.as_ptr() }).collect();
        let mut raw = ptr::null_mut();
        // SAFETY: every pointer is valid for the call; `raw` receives the engine.
        call(|| unsafe {
            sys::te_engine_create(
                metadata.as_ptr(),
                name.as_ref().map_or(ptr::null(), |n| n.as_ptr()),
                opts.as_ptr(),
                opts.len(),
                &mut raw,
            )
        })?;
        let raw = NonNull::new(raw).ok_or_else(|| Error::new(code::ENOMEM, "te_engine_create gave no engine"))?;
        // SAFETY: the engine is live; the strings are copied.
        let (name, address) = unsafe {
            (owned_text(sys::te_engine_name(raw.as_ptr())), owned_text(sys::te_engine_address(raw.as_ptr())))
        };
        Ok(Engine { raw, name, address })
    }

    /// The C handle, for calls this crate does not wrap. It stays valid as
    /// long as `self` does; do not destroy it.
    pub fn as_raw(&self) -> *mut sys::te_engine {
        self.raw.as_ptr()
    }

    /// The engine's segment name (with P2PHANDSHAKE: "host:rpc_port").
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The address peers reach this engine at.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The bound RPC port.
    pub fn rpc_port(&self) -> u16 {
        // SAFETY: live engine.
        let p = unsafe { sys::te_engine_rpc_port(self.as_raw()) };
        u16::try_from(p).unwrap_or(0)
    }

    /// Installs transport `name` with optional JSON arguments.
    pub fn install_transport(&self, name: &str, json_args: Option<&str>) -> Result<()> {
        let name = cstring(name, "transport name")?;
        let args = json_args.map(|a| cstring(a, "transport arguments")).transpose()?;
        // SAFETY: valid strings for the call.
        call(|| unsafe {
            sys::te_transport_install(self.as_raw(), name.as_ptr(), args.as_ref().map_or(ptr::null(), |a| a.as_ptr()))
        })?;
        Ok(())
    }

    pub fn uninstall_transport(&self, name: &str) -> Result<()> {
        let name = cstring(name, "transport name")?;
        // SAFETY: valid string for the call.
        call(|| unsafe { sys::te_transport_uninstall(self.as_raw(), name.as_ptr()) })?;
        Ok(())
    }

    /// te_transport_auto(): installs the best transport found here and
    /// returns its name.
    pub fn install_best_transport(&self) -> Result<Option<String>> {
        let mut got: *const c_char = ptr::null();
        // SAFETY: `got` receives a plugin name or NULL.
        call(|| unsafe { sys::te_transport_auto(self.as_raw(), &mut got) })?;
        Ok(if got.is_null() { None } else { Some(owned_text(got)) })
    }

    /// The installed transports' names.
    pub fn transports(&self) -> Result<Vec<String>> {
        let mut names: Vec<*const c_char> = vec![ptr::null(); 16];
        loop {
            // SAFETY: `names` holds `len` slots.
            let n = call(|| unsafe { sys::te_transport_list(self.as_raw(), names.as_mut_ptr(), names.len()) })?
                as usize;
            if n <= names.len() {
                return Ok(names[..n].iter().map(|p| owned_text(*p)).collect());
            }
            names = vec![ptr::null(); n];
        }
    }

    /// Registers `buf` with libte (te_register_memory) for the duration of
    /// `f`, then unregisters it, also when `f` panics. `location` is
    /// "cpu:N", "cuda:N" or "*"; `remote` lets peers read and write it.
    ///
    /// The buffer is borrowed mutably for the whole call, so nothing else
    /// can free, move or touch it while libte may; `f` reaches the memory
    /// through the [`Registration`]. Why a closure rather than a returned
    /// handle: a handle can be leaked (`std::mem::forget` is safe), which
    /// would end the borrow while the memory stays registered and peers
    /// may still write into it; here the unregistration runs before this
    /// function returns, whatever `f` did with the reference it was lent.
    pub fn register<'b, T, E, F>(&self, buf: &'b mut [u8], location: &str, remote: bool, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut Registration<'_, 'b>) -> Result<T, E>,
        E: From<Error>,
    {
        let loc = cstring(location, "memory location")?;
        let flags = if remote { sys::TE_MEM_REMOTE_ACCESS } else { 0 };
        let addr = buf.as_mut_ptr();
        let len = buf.len();
        // SAFETY: `buf` is valid for `len` bytes and stays borrowed (so
        // alive and unmoved) until `_guard` below unregisters it.
        call(|| unsafe { sys::te_register_memory(self.as_raw(), addr as *mut c_void, len, loc.as_ptr(), flags) })?;
        let _guard = Unregister { engine: self, addr };
        // SAFETY: as above; the registration hands out access to `buf` only.
        let mut reg = unsafe { Registration::new(self, addr, len, remote) };
        f(&mut reg)
    }

    /// te_segment_open(): opens the segment `name` (closed on drop).
    pub fn open_segment(&self, name: &str) -> Result<Segment<'_>> {
        let cname = cstring(name, "segment name")?;
        // SAFETY: valid string for the call.
        let id = call(|| unsafe { sys::te_segment_open(self.as_raw(), cname.as_ptr()) })?;
        Ok(Segment::new(self, SegmentId(id), name))
    }

    /// te_segment_open_with(): as [`open_segment`](Self::open_segment)
    /// through the transport `transport`.
    pub fn open_segment_with(&self, name: &str, transport: &str) -> Result<Segment<'_>> {
        let cname = cstring(name, "segment name")?;
        let ctp = cstring(transport, "transport name")?;
        // SAFETY: valid strings for the call.
        let id = call(|| unsafe { sys::te_segment_open_with(self.as_raw(), cname.as_ptr(), ctp.as_ptr()) })?;
        Ok(Segment::new(self, SegmentId(id), name))
    }

    /// The engine's own segment (memcpy transfers within the process).
    pub fn local_segment(&self) -> Segment<'_> {
        Segment::new(self, SegmentId::LOCAL, &self.name)
    }

    /// te_segment_find(): the id of an open segment, without a reference:
    /// it stops working (TE_ERR_SEGMENT) once the segment is closed.
    pub fn find_segment(&self, name: &str) -> Result<SegmentId> {
        let cname = cstring(name, "segment name")?;
        // SAFETY: valid string for the call.
        let id = call(|| unsafe { sys::te_segment_find(self.as_raw(), cname.as_ptr()) })?;
        Ok(SegmentId(id))
    }

    /// te_segment_buffers() of any segment id.
    pub fn segment_buffers(&self, segment: impl Into<SegmentId>) -> Result<Vec<SegmentBuffer>> {
        let id = segment.into().0;
        let mut out = vec![SegmentBuffer::EMPTY_RAW; 64];
        loop {
            // SAFETY: `out` holds `len` entries.
            let n =
                call(|| unsafe { sys::te_segment_buffers(self.as_raw(), id, out.as_mut_ptr(), out.len()) })? as usize;
            if n <= out.len() {
                return Ok(out[..n].iter().map(SegmentBuffer::from_raw).collect());
            }
            out = vec![SegmentBuffer::EMPTY_RAW; n];
        }
    }

    /// te_segment_descriptor(): the segment's descriptor JSON.
    pub fn segment_descriptor(&self, segment: impl Into<SegmentId>) -> Result<String> {
        let id = segment.into().0;
        let mut json: *mut c_char = ptr::null_mut();
        // SAFETY: `json` receives a string we release with te_free.
        call(|| unsafe { sys::te_segment_descriptor(self.as_raw(), id, &mut json) })?;
        let text = owned_text(json);
        // SAFETY: allocated by libte for the caller.
        unsafe { sys::te_free(json as *mut c_void) };
        Ok(text)
    }

    /// te_segment_refresh_all(): how many open segments were refreshed.
    pub fn refresh_all(&self) -> Result<usize> {
        // SAFETY: live engine.
        Ok(call(|| unsafe { sys::te_segment_refresh_all(self.as_raw()) })? as usize)
    }

    /// te_segment_probe(): whether the engine `name` answers. None uses
    /// libte's RPC defaults.
    pub fn probe(&self, name: &str, timeout: Option<Duration>) -> Result<()> {
        let cname = cstring(name, "segment name")?;
        let ms = timeout.map_or(0, |t| t.as_millis().clamp(1, i32::MAX as u128) as i32);
        // SAFETY: valid string for the call.
        call(|| unsafe { sys::te_segment_probe(self.as_raw(), cname.as_ptr(), ms) })?;
        Ok(())
    }

    /// Allocates a batch of `capacity` tasks (te_batch_alloc), lends it to
    /// `f`, then waits for its tasks and frees it (also when `f` panics).
    ///
    /// Requests submitted to the batch borrow their local memory for `'r`,
    /// a lifetime that outlasts this call, and the batch is invariant in
    /// `'r`, so that memory stays borrowed (alive, registered, untouched
    /// by Rust) until every task has ended. A closure rather than a returned
    /// handle for the same reason as [`register`](Self::register): a leaked
    /// handle would end those borrows while tasks still move bytes.
    pub fn batch<'r, T, E, F>(&self, capacity: usize, f: F) -> Result<T, E>
    where
        F: FnOnce(&Batch<'_, 'r>) -> Result<T, E>,
        E: From<Error>,
    {
        let batch = Batch::alloc(self, capacity)?;
        f(&batch)
        // `batch` drops here: wait, then free.
    }

    /// Moves `requests` in one batch and waits: Ok when every task
    /// completed, else the first task's error.
    pub fn transfer<'r>(&self, requests: impl IntoIterator<Item = Request<'r>>) -> Result<()> {
        let reqs: Vec<Request<'r>> = requests.into_iter().collect();
        if reqs.is_empty() {
            return Ok(());
        }
        self.batch(reqs.len(), |b: &Batch<'_, 'r>| {
            b.submit(reqs)?;
            b.wait(None)?;
            let sum = b.summary()?;
            if sum.state == TaskState::Completed {
                return Ok(());
            }
            for (i, st) in b.statuses()?.iter().enumerate() {
                if st.state != TaskState::Completed {
                    return Err(st.to_error(i));
                }
            }
            Ok(())
        })
    }

    /// `transfer` with `timeout` as the tasks' deadline: past it libte ends
    /// them and this returns ETIMEDOUT within milliseconds, once nothing
    /// touches the local memory any more.
    pub fn transfer_within<'r>(&self, requests: impl IntoIterator<Item = Request<'r>>, timeout: Duration) -> Result<()> {
        let reqs: Vec<Request<'r>> = requests.into_iter().collect();
        if reqs.is_empty() {
            return Ok(());
        }
        let deadline = crate::deadline_in(timeout);
        self.batch(reqs.len(), |b: &Batch<'_, 'r>| {
            let n = reqs.len();
            b.submit_by(reqs, deadline)?;
            // libte ends the tasks by the deadline; past it and a grace (a
            // transport that does not honour deadlines), cancel and wait.
            if let Err(e) = b.wait(Some(timeout.saturating_add(Duration::from_millis(100)))) {
                if !e.is(code::ETIMEDOUT) {
                    return Err(e);
                }
                b.cancel()?;
                b.wait(None)?;
                return Err(Error::new(code::ETIMEDOUT, format!("not finished within {:?}", timeout)));
            }
            let mut first = None;
            for i in 0..n {
                let ti = b.task_info(i)?;
                if ti.ended_early() && ti.error == code::ETIMEDOUT {
                    return Err(Error::new(code::ETIMEDOUT, format!("not finished within {:?}", timeout)));
                }
                if ti.state != TaskState::Completed && first.is_none() {
                    first = Some(ti.status().to_error(i));
                }
            }
            first.map_or(Ok(()), Err)
        })
    }

    /// Reads the length of `local` in bytes at `remote` of `segment` into `local`.
    pub fn read<'q>(&self, segment: impl Into<SegmentId>, remote: u64, local: impl ReadTarget<'q>) -> Result<()> {
        self.transfer([Request::read(segment, remote, local)])
    }

    /// Writes `local` to `remote` of `segment`.
    pub fn write<'q>(&self, segment: impl Into<SegmentId>, remote: u64, local: impl WriteSource<'q>) -> Result<()> {
        self.transfer([Request::write(segment, remote, local)])
    }

    /// te_notify_send(): sends `msg` to the owner of `segment` and waits
    /// for its acknowledgement.
    pub fn notify(&self, segment: impl Into<SegmentId>, msg: &str) -> Result<()> {
        let id = segment.into().0;
        let cmsg = cstring(msg, "notification")?;
        // SAFETY: valid string for the call.
        call(|| unsafe { sys::te_notify_send(self.as_raw(), id, cmsg.as_ptr()) })?;
        Ok(())
    }

    /// te_notify_send_as(): as [`notify`](Self::notify) under the name
    /// `sender`.
    pub fn notify_as(&self, segment: impl Into<SegmentId>, sender: &str, msg: &str) -> Result<()> {
        let id = segment.into().0;
        let csender = cstring(sender, "sender name")?;
        let cmsg = cstring(msg, "notification")?;
        // SAFETY: valid strings for the call.
        call(|| unsafe { sys::te_notify_send_as(self.as_raw(), id, csender.as_ptr(), cmsg.as_ptr()) })?;
        Ok(())
    }

    /// te_notify_fetch(): takes every notification received so far.
    pub fn notifications(&self) -> Result<Vec<Notification>> {
        let mut list: *mut sys::te_notification = ptr::null_mut();
        let mut count = 0usize;
        // SAFETY: out-pointers valid; the list is released below.
        call(|| unsafe { sys::te_notify_fetch(self.as_raw(), &mut list, &mut count) })?;
        if list.is_null() {
            return Ok(Vec::new());
        }
        // SAFETY: libte returned `count` entries at `list`.
        let out = unsafe { std::slice::from_raw_parts(list, count) }
            .iter()
            .map(|n| Notification { name: owned_text(n.name), msg: owned_text(n.msg) })
            .collect();
        // SAFETY: releases what te_notify_fetch allocated.
        unsafe { sys::te_notifications_free(list, count) };
        Ok(out)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: no borrow of the engine is left (they all borrow `self`).
        unsafe { sys::te_engine_destroy(self.raw.as_ptr()) };
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("name", &self.name).field("address", &self.address).finish()
    }
}

/// Unregisters a buffer when `Engine::register` ends, normally or by panic.
struct Unregister<'e> {
    engine: &'e Engine,
    addr: *mut u8,
}

impl Drop for Unregister<'_> {
    fn drop(&mut self) {
        // SAFETY: the buffer is still borrowed by Engine::register. libte
        // waits here for peers' requests on it. It fails only when the
        // address is not registered, and then nothing can reach the buffer.
        unsafe { sys::te_unregister_memory(self.engine.as_raw(), self.addr as *mut c_void) };
    }
}
