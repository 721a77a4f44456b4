//! Segments: other engines' memory (or files) opened by name.
use crate::engine::Engine;
use crate::error::{call, Result};
use libte_sys as sys;

/// A segment id as requests name it. Copy it freely: it holds no reference,
/// so once every [`Segment`] of that name is closed it gives TE_ERR_SEGMENT
/// (libte never hands out an id twice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SegmentId(pub i32);

impl SegmentId {
    /// The engine's own segment.
    pub const LOCAL: SegmentId = SegmentId(sys::TE_LOCAL_SEGMENT);
}

impl From<&Segment<'_>> for SegmentId {
    fn from(s: &Segment<'_>) -> SegmentId {
        s.id
    }
}

/// A buffer of a segment as its descriptor lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentBuffer {
    /// The address in the owner's process (a byte offset for file segments).
    pub addr: u64,
    pub length: u64,
    /// Its location ("cpu:0") or, for files, the segment's name.
    pub name: String,
}

impl SegmentBuffer {
    pub(crate) const EMPTY_RAW: sys::te_segment_buffer = sys::te_segment_buffer { addr: 0, length: 0, name: [0; 64] };

    pub(crate) fn from_raw(b: &sys::te_segment_buffer) -> SegmentBuffer {
        // The name is NUL-terminated within its 64 bytes when libte cut it;
        // stop at the array's end regardless.
        let bytes: Vec<u8> = b.name.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
        SegmentBuffer { addr: b.addr, length: b.length, name: String::from_utf8_lossy(&bytes).into_owned() }
    }
}

/// An open segment (te_segment_open); closed when dropped. It borrows its
/// engine, so it cannot outlive it.
pub struct Segment<'e> {
    engine: &'e Engine,
    id: SegmentId,
    name: String,
    open: bool,
}

impl<'e> Segment<'e> {
    pub(crate) fn new(engine: &'e Engine, id: SegmentId, name: &str) -> Segment<'e> {
        Segment { engine, id, name: name.to_string(), open: true }
    }

    pub fn id(&self) -> SegmentId {
        self.id
    }

    /// The name it was opened by.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn engine(&self) -> &'e Engine {
        self.engine
    }

    /// The segment's buffers, sorted by address.
    pub fn buffers(&self) -> Result<Vec<SegmentBuffer>> {
        self.engine.segment_buffers(self.id)
    }

    /// The transport serving it ("tcp", "shm", ...; "local" for the
    /// engine's own segment); None for a closed segment.
    pub fn transport(&self) -> Option<String> {
        // SAFETY: live engine; the name is static storage, copied at once.
        let p = unsafe { sys::te_segment_transport(self.engine.as_raw(), self.id.0) };
        if p.is_null() {
            None
        } else {
            // SAFETY: NUL-terminated, valid while the transport is installed.
            Some(unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned())
        }
    }

    /// te_segment_refresh(): fetches the descriptor again.
    pub fn refresh(&self) -> Result<()> {
        // SAFETY: live engine.
        call(|| unsafe { sys::te_segment_refresh(self.engine.as_raw(), self.id.0) })?;
        Ok(())
    }

    /// The descriptor JSON as last fetched.
    pub fn descriptor(&self) -> Result<String> {
        self.engine.segment_descriptor(self.id)
    }

    /// Closes now and reports how that went (drop closes silently).
    pub fn close(mut self) -> Result<()> {
        self.open = false;
        // SAFETY: live engine; Drop will not close it again.
        call(|| unsafe { sys::te_segment_close(self.engine.as_raw(), self.id.0) })?;
        Ok(())
    }
}

impl Drop for Segment<'_> {
    fn drop(&mut self) {
        if self.open {
            // SAFETY: live engine; a failure leaves nothing to release.
            unsafe { sys::te_segment_close(self.engine.as_raw(), self.id.0) };
        }
    }
}

impl std::fmt::Debug for Segment<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment").field("id", &self.id.0).field("name", &self.name).finish()
    }
}

