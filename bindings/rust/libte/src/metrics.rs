//! What an engine counts (docs/metrics.md): the engine-wide totals as a
//! struct, every counter as libte's JSON text, and the Prometheus text.
//! The crate has no dependencies, so the JSON is handed over as text for the
//! caller's JSON library of choice.
use crate::engine::Engine;
use crate::error::{call, Error, Result};
use libte_sys as sys;
use std::ffi::CStr;
use std::os::raw::{c_char, c_void};
use std::ptr;

/// The counters of one operation (read or write) over the engine's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpTotals {
    /// Tasks submitted, those refused at submission included.
    pub requests: u64,
    /// Bytes moved by tasks that ended, partial moves included.
    pub bytes: u64,
    pub completed: u64,
    /// Ended FAILED, TIMEOUT or INVALID.
    pub failed: u64,
    pub canceled: u64,
}

/// te_stats: the engine-wide totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub read: OpTotals,
    pub write: OpTotals,
    /// Tasks submitted and not ended, and their bytes.
    pub in_flight: u64,
    pub in_flight_bytes: u64,
    /// Requests a transport sent again, and moved to another device.
    pub retries: u64,
    pub failovers: u64,
    pub notifies_sent: u64,
    pub notifies_received: u64,
    /// Memory registered now.
    pub registered_bytes: u64,
    pub registered_regions: u64,
    /// RPC frames answered and refused on the handshake port.
    pub rpc_served: u64,
    pub rpc_refused: u64,
    /// Peers refused by the cluster key.
    pub auth_refused: u64,
}

impl Totals {
    fn from_raw(s: &sys::te_stats) -> Totals {
        let op = |i: usize| OpTotals {
            requests: s.requests[i],
            bytes: s.bytes[i],
            completed: s.completed[i],
            failed: s.failed[i],
            canceled: s.canceled[i],
        };
        Totals {
            read: op(sys::TE_OP_READ as usize),
            write: op(sys::TE_OP_WRITE as usize),
            in_flight: s.in_flight,
            in_flight_bytes: s.in_flight_bytes,
            retries: s.retries,
            failovers: s.failovers,
            notifies_sent: s.notifies_sent,
            notifies_received: s.notifies_received,
            registered_bytes: s.registered_bytes,
            registered_regions: s.registered_regions,
            rpc_served: s.rpc_served,
            rpc_refused: s.rpc_refused,
            auth_refused: s.auth_refused,
        }
    }
}

/// Every counter of an engine: the totals, and the JSON document of
/// te_engine_stats_json() with the per-transport, per-peer and per-device
/// figures (its fields: docs/metrics.md). The two are read one after the
/// other, so a transfer ending in between shows in the JSON only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    pub totals: Totals,
    pub json: String,
}

/// A text libte allocated, released with te_free() on drop.
struct TeText(*mut c_char);

impl Drop for TeText {
    fn drop(&mut self) {
        // SAFETY: the pointer came from libte (or is NULL, which te_free accepts).
        unsafe { sys::te_free(self.0 as *mut c_void) };
    }
}

impl Engine {
    /// te_engine_stats(): the engine-wide totals. `code::ENOTSUP` when
    /// counting is off (TE_METRICS=0).
    pub fn totals(&self) -> Result<Totals> {
        let mut raw = sys::te_stats { size: std::mem::size_of::<sys::te_stats>() as u32, ..Default::default() };
        // SAFETY: live engine; `raw` is a te_stats whose size says so.
        call(|| unsafe { sys::te_engine_stats(self.as_raw(), &mut raw) })?;
        Ok(Totals::from_raw(&raw))
    }

    /// The totals and the JSON document of every counter.
    pub fn stats(&self) -> Result<Stats> {
        let totals = self.totals()?;
        let mut json: *mut c_char = ptr::null_mut();
        // SAFETY: live engine; `json` receives a text released below.
        call(|| unsafe { sys::te_engine_stats_json(self.as_raw(), &mut json) })?;
        let json = TeText(json);
        if json.0.is_null() {
            return Err(Error::new(crate::code::EIO, "te_engine_stats_json gave no text"));
        }
        // SAFETY: a NUL-terminated text from libte, alive until `json` drops.
        let text = unsafe { CStr::from_ptr(json.0) }.to_string_lossy().into_owned();
        Ok(Stats { totals, json: text })
    }

    /// te_metrics_text(): the engine's counters in the Prometheus text
    /// format (version 0.0.4).
    pub fn metrics_text(&self) -> Result<String> {
        let mut text: *mut c_char = ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: live engine; `text` receives `len` bytes released below.
        call(|| unsafe { sys::te_metrics_text(self.as_raw(), &mut text, &mut len) })?;
        let text = TeText(text);
        if text.0.is_null() {
            return Ok(String::new());
        }
        // SAFETY: libte wrote `len` bytes at `text`, alive until it drops.
        let bytes = unsafe { std::slice::from_raw_parts(text.0 as *const u8, len) };
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }
}
