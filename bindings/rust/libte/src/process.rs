//! Process-wide things: version, log level and handler, plugins found.
use crate::engine::owned_text;
use libte_sys as sys;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::RwLock;

/// libte's version ("1.2.0").
pub fn version() -> &'static str {
    // SAFETY: static NUL-terminated string.
    let s: &'static CStr = unsafe { CStr::from_ptr(sys::te_version()) };
    s.to_str().unwrap_or("?")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
    Trace = 4,
}

impl LogLevel {
    fn from_raw(l: c_int) -> LogLevel {
        match l {
            i if i <= 0 => LogLevel::Error,
            1 => LogLevel::Warn,
            2 => LogLevel::Info,
            3 => LogLevel::Debug,
            _ => LogLevel::Trace,
        }
    }
}

/// Sets the level of libte's log (process-wide).
pub fn set_log_level(level: LogLevel) {
    // SAFETY: plain call.
    unsafe { sys::te_set_log_level(level as c_int) }
}

pub fn log_level() -> LogLevel {
    // SAFETY: plain call.
    LogLevel::from_raw(unsafe { sys::te_get_log_level() })
}

/// Logs one line through libte's level and handler (te_log_write), so an
/// application's lines land where libte's do; an Error-level line also
/// becomes this thread's last error. Text after a NUL byte is dropped.
pub fn log(level: LogLevel, domain: &str, msg: &str) {
    let cut = |s: &str| std::ffi::CString::new(s.split('\0').next().unwrap_or("")).unwrap_or_default();
    let (d, m) = (cut(domain), cut(msg));
    // SAFETY: valid strings for the call.
    unsafe { sys::te_log_write(level as c_int, d.as_ptr(), m.as_ptr()) }
}

type Handler = Box<dyn Fn(LogLevel, &str, &str) + Send + Sync>;

// One handler for the process, as in libte. The trampoline reads it under
// the read lock, so replacing it waits for lines being delivered.
static HANDLER: RwLock<Option<Handler>> = RwLock::new(None);

unsafe extern "C" fn trampoline(level: c_int, domain: *const c_char, msg: *const c_char, _user: *mut c_void) {
    let domain = owned_text(domain);
    let msg = owned_text(msg);
    // A panic must not unwind into C; a panicking handler loses the line.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if let Ok(h) = HANDLER.read() {
            if let Some(f) = h.as_ref() {
                f(LogLevel::from_raw(level), &domain, &msg);
            }
        }
    }));
}

/// Sends libte's log lines (level, domain such as "te" or "tcp", text) to
/// `f` instead of stderr. `f` runs on libte's threads and must not call
/// `set_log_handler` or `reset_log_handler` itself.
pub fn set_log_handler<F>(f: F)
where
    F: Fn(LogLevel, &str, &str) + Send + Sync + 'static,
{
    *HANDLER.write().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(f));
    // SAFETY: the trampoline is valid for the life of the process.
    unsafe { sys::te_set_log_handler(Some(trampoline), std::ptr::null_mut()) };
}

/// Back to libte's own handler (stderr).
pub fn reset_log_handler() {
    // SAFETY: restores the default handler.
    unsafe { sys::te_set_log_handler(None, std::ptr::null_mut()) };
    *HANDLER.write().unwrap_or_else(|p| p.into_inner()) = None;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginKind {
    Transport,
    Metadata,
    Unknown,
}

/// A plugin file the loader found (te_plugin_foreach).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    pub path: String,
    /// None when the file could not be read.
    pub name: Option<String>,
    pub version: Option<String>,
    pub description: Option<String>,
    pub kind: PluginKind,
    pub abi: (u32, u32),
    /// Usable; else `reason` says why it was skipped.
    pub loaded: bool,
    pub reason: Option<String>,
}

fn opt(p: *const c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        Some(owned_text(p))
    }
}

unsafe extern "C" fn collect(info: *const sys::te_plugin_info, user: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `user` is the Vec passed by plugins(); `info` is valid
        // for this call.
        let out = &mut *(user as *mut Vec<PluginInfo>);
        let i = &*info;
        let base = info as usize;
        // The struct is versioned by `size`: a field counts only when the
        // size libte filled in covers it.
        let has = |field: usize, len: usize| field - base + len <= i.size;
        let field = |p: *const u8| p as usize;
        let text = |present: bool, p: *const c_char| if present { opt(p) } else { None };
        let ptr_len = std::mem::size_of::<*const c_char>();
        let int_len = std::mem::size_of::<c_int>();
        out.push(PluginInfo {
            path: text(has(field(std::ptr::addr_of!(i.path).cast()), ptr_len), i.path).unwrap_or_default(),
            name: text(has(field(std::ptr::addr_of!(i.name).cast()), ptr_len), i.name),
            version: text(has(field(std::ptr::addr_of!(i.version).cast()), ptr_len), i.version),
            description: text(has(field(std::ptr::addr_of!(i.description).cast()), ptr_len), i.description),
            kind: if !has(field(std::ptr::addr_of!(i.kind).cast()), int_len) {
                PluginKind::Unknown
            } else {
                match i.kind {
                    sys::TE_KIND_TRANSPORT => PluginKind::Transport,
                    sys::TE_KIND_METADATA => PluginKind::Metadata,
                    _ => PluginKind::Unknown,
                }
            },
            abi: if has(field(std::ptr::addr_of!(i.abi_minor).cast()), int_len) {
                (i.abi_major, i.abi_minor)
            } else {
                (0, 0)
            },
            loaded: has(field(std::ptr::addr_of!(i.loaded).cast()), int_len) && i.loaded != 0,
            reason: text(has(field(std::ptr::addr_of!(i.reason).cast()), ptr_len), i.reason),
        });
    }));
}

/// Every plugin file in the plugin directories, usable or not (the scan
/// runs once per process).
pub fn plugins() -> Vec<PluginInfo> {
    let mut out: Vec<PluginInfo> = Vec::new();
    // SAFETY: `collect` gets `out` back as its user pointer, synchronously.
    unsafe { sys::te_plugin_foreach(Some(collect), &mut out as *mut Vec<PluginInfo> as *mut c_void) };
    out
}
