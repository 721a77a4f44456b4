//! Registered memory as Rust sees it: a [`Registration`] lent by
//! `Engine::register`, and [`Local`] ranges of it that requests borrow.
use crate::engine::Engine;
use crate::error::{call, code, Error, Result};
use libte_sys as sys;
use std::os::raw::c_void;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// The accessors of a registered range (`ptr`, `len`) that a
/// [`Registration`] and a [`Local`] both have.
macro_rules! range_accessors {
    () => {
        /// The range's address, as libte sees it (a request's local address).
        pub fn addr(&self) -> u64 {
            self.ptr.as_ptr() as u64
        }

        pub fn len(&self) -> usize {
            self.len
        }

        pub fn is_empty(&self) -> bool {
            self.len == 0
        }

        pub(crate) fn as_ptr(&self) -> *mut u8 {
            self.ptr.as_ptr()
        }
    };
}

/// A buffer registered with an engine, lent to the closure of
/// `Engine::register` (`'b` is the buffer's borrow).
///
/// Rust code reads and writes the memory through `as_slice` /
/// `as_mut_slice` (or `Deref`), and requests reach it through [`Local`]
/// ranges taken with `&mut self`: while a request borrows a range, Rust
/// cannot touch it.
///
/// With remote access, peers may read and write this memory at any time
/// the application lets them (libte cannot know when they will), and any
/// registration can be reached through the engine's own segment: as with
/// any memory shared with another process, the application's own protocol
/// (a notification, a message) says when the bytes are settled.
pub struct Registration<'e, 'b> {
    engine: &'e Engine,
    ptr: NonNull<u8>,
    len: usize,
    remote: bool,
    _buf: PhantomData<&'b mut [u8]>,
}

// SAFETY: a registration is a `&mut [u8]` plus a `&Engine`, both Send + Sync.
unsafe impl Send for Registration<'_, '_> {}
unsafe impl Sync for Registration<'_, '_> {}

impl<'e, 'b> Registration<'e, 'b> {
    /// # Safety
    /// `ptr..ptr+len` must be a live, exclusively borrowed buffer for `'b`.
    pub(crate) unsafe fn new(engine: &'e Engine, ptr: *mut u8, len: usize, remote: bool) -> Self {
        Registration {
            engine,
            ptr: NonNull::new(ptr).unwrap_or(NonNull::dangling()),
            len,
            remote,
            _buf: PhantomData,
        }
    }

    pub fn engine(&self) -> &'e Engine {
        self.engine
    }

    range_accessors!();

    /// Whether peers may read and write it.
    pub fn remote_access(&self) -> bool {
        self.remote
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the buffer is borrowed for 'b; `&self` excludes a live
        // READ into it (requests borrow it through `&mut self`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` excludes every other use.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The whole buffer as a [`Local`] for requests.
    pub fn local(&mut self) -> Local<'_> {
        Local { ptr: self.ptr, len: self.len, _m: PhantomData }
    }

    /// `len` bytes at `offset` as a [`Local`]; EINVAL when they do not fit.
    pub fn range(&mut self, offset: usize, len: usize) -> Result<Local<'_>> {
        let l = self.local();
        l.into_range(offset, len)
    }
}

impl Deref for Registration<'_, '_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for Registration<'_, '_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl std::fmt::Debug for Registration<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("remote", &self.remote)
            .finish()
    }
}

/// A range of registered memory, borrowed exclusively like `&'r mut [u8]`.
///
/// Requests take a `Local` by `&mut` (a READ writes it) or by `&` (a WRITE
/// reads it) for the lifetime of their batch. A `Local` splits into
/// disjoint pieces (`split_at`, `chunks`), which can go to different
/// threads: the borrow checker keeps them apart as it does for slices.
pub struct Local<'r> {
    ptr: NonNull<u8>,
    len: usize,
    _m: PhantomData<&'r mut [u8]>,
}

// SAFETY: like `&mut [u8]`.
unsafe impl Send for Local<'_> {}
unsafe impl Sync for Local<'_> {}

impl<'r> Local<'r> {
    range_accessors!();

    /// A shorter borrow of the same range.
    pub fn reborrow(&mut self) -> Local<'_> {
        Local { ptr: self.ptr, len: self.len, _m: PhantomData }
    }

    /// `len` bytes at `offset`, borrowed from `self`; EINVAL when they do
    /// not fit.
    pub fn range(&mut self, offset: usize, len: usize) -> Result<Local<'_>> {
        self.reborrow().into_range(offset, len)
    }

    /// `len` bytes at `offset`, keeping the whole borrow.
    pub fn into_range(self, offset: usize, len: usize) -> Result<Local<'r>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(Local {
                // SAFETY: offset <= self.len, inside the same buffer.
                ptr: unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(offset)) },
                len,
                _m: PhantomData,
            }),
            _ => Err(Error::new(
                code::EINVAL,
                format!("range of {} bytes at offset {} does not fit in {} registered bytes", len, offset, self.len),
            )),
        }
    }

    /// Two disjoint pieces, [0, mid) and [mid, len); EINVAL past the end.
    pub fn split_at(self, mid: usize) -> Result<(Local<'r>, Local<'r>)> {
        if mid > self.len {
            return Err(Error::new(code::EINVAL, format!("split at {} past the end of {} bytes", mid, self.len)));
        }
        // SAFETY: both halves lie inside the range and do not overlap.
        let tail = unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(mid)) };
        Ok((
            Local { ptr: self.ptr, len: mid, _m: PhantomData },
            Local { ptr: tail, len: self.len - mid, _m: PhantomData },
        ))
    }

    /// Disjoint pieces of `size` bytes (the last may be shorter); EINVAL
    /// for size 0.
    pub fn chunks(self, size: usize) -> Result<Vec<Local<'r>>> {
        if size == 0 {
            return Err(Error::new(code::EINVAL, "chunks of 0 bytes"));
        }
        let mut out = Vec::with_capacity(self.len / size + 1);
        let mut off = 0;
        while off < self.len {
            let n = size.min(self.len - off);
            // SAFETY: off < len: inside the range; pieces do not overlap.
            let p = unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(off)) };
            out.push(Local { ptr: p, len: n, _m: PhantomData });
            off += n;
        }
        Ok(out)
    }
}

impl Deref for Local<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: an exclusive borrow of registered memory for 'r; a READ
        // into it needs `&mut self`, so none is running while this lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for Local<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; `&mut self` excludes requests reading it too.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for Local<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Local").field("addr", &format_args!("{:#x}", self.addr())).field("len", &self.len).finish()
    }
}

/// Memory from te_mem_alloc(): page-aligned, zeroed, and mappable by other
/// processes on this host, so that a same-host transport (shm) serves peers
/// through a shared mapping of it. Use it as a `[u8]`; register it with
/// `Engine::register(&mut mem, ...)` like any buffer (the borrow there keeps
/// it from being freed while registered). Freed on drop.
pub struct SharedMemory {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: owned memory, like a Box<[u8]>.
unsafe impl Send for SharedMemory {}
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// `len` zeroed bytes (libte rounds the mapping up to pages; the slice
    /// is exactly `len`). EINVAL for 0.
    pub fn new(len: usize) -> Result<SharedMemory> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` receives the allocation.
        call(|| unsafe { sys::te_mem_alloc(len, &mut p) })?;
        let ptr = NonNull::new(p as *mut u8).ok_or_else(|| Error::new(code::ENOMEM, "te_mem_alloc gave no memory"))?;
        Ok(SharedMemory { ptr, len })
    }
}

impl Deref for SharedMemory {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: owned, live allocation of at least `len` bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for SharedMemory {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: the address te_mem_alloc returned; no registration can
        // remain (each borrowed the memory until it had unregistered it).
        unsafe { sys::te_mem_free(self.ptr.as_ptr() as *mut c_void) };
    }
}

impl std::fmt::Debug for SharedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMemory").field("addr", &self.ptr).field("len", &self.len).finish()
    }
}
