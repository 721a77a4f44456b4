//! Errors: libte's negative codes, named by te_strerror(), with the text of
//! the last error libte logged on the calling thread.
use libte_sys as sys;
use std::ffi::CStr;
use std::fmt;
use std::os::raw::c_int;

/// The codes an [`Error`] can carry: `-errno` values (Linux numbers) and
/// libte's own codes, which lie above errno's range.
pub mod code {
    use libte_sys as sys;

    pub const ENOENT: i32 = -2;
    pub const EIO: i32 = -5;
    pub const ENOMEM: i32 = -12;
    pub const EBUSY: i32 = -16;
    pub const EEXIST: i32 = -17;
    pub const EINVAL: i32 = -22;
    pub const ERANGE: i32 = -34;
    pub const ENOTSUP: i32 = -95;
    pub const ECONNREFUSED: i32 = -111;
    pub const ETIMEDOUT: i32 = -110;
    pub const EINPROGRESS: i32 = -115;
    pub const ECANCELED: i32 = -125;

    pub const PLUGIN: i32 = sys::TE_ERR_PLUGIN;
    pub const NO_TRANSPORT: i32 = sys::TE_ERR_NO_TRANSPORT;
    pub const METADATA: i32 = sys::TE_ERR_METADATA;
    pub const PROTOCOL: i32 = sys::TE_ERR_PROTOCOL;
    pub const REJECTED: i32 = sys::TE_ERR_REJECTED;
    pub const BATCH_FULL: i32 = sys::TE_ERR_BATCH_FULL;
    pub const ADDRESS: i32 = sys::TE_ERR_ADDRESS;
    pub const OVERLAP: i32 = sys::TE_ERR_OVERLAP;
    pub const SEGMENT: i32 = sys::TE_ERR_SEGMENT;
    pub const BATCH: i32 = sys::TE_ERR_BATCH;
    pub const AUTH: i32 = sys::TE_ERR_AUTH;
}

/// A failed libte call: its code (negative), the code's name from
/// te_strerror() and what libte said about it (te_last_error()), or what
/// this crate found wrong before calling libte.
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    code: i32,
    detail: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error with `code` and an explanation of our own.
    pub fn new(code: i32, detail: impl Into<String>) -> Error {
        Error { code, detail: detail.into() }
    }

    /// An error with `code` explained by the last error libte logged on
    /// this thread (callers clear it before the call that failed).
    pub(crate) fn last(code: i32) -> Error {
        // SAFETY: te_last_error() returns a NUL-terminated thread-local
        // string valid until this thread's next libte call; copied at once.
        let detail = unsafe { CStr::from_ptr(sys::te_last_error()) }.to_string_lossy().into_owned();
        Error { code, detail }
    }

    /// The negative code (see [`code`]).
    pub fn code(&self) -> i32 {
        self.code
    }

    /// te_strerror(code): the name of the code.
    pub fn name(&self) -> &'static str {
        strerror(self.code)
    }

    /// What was wrong, as libte logged it (may be empty).
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// Whether this error carries `code`.
    pub fn is(&self, code: i32) -> bool {
        self.code == code
    }
}

/// te_strerror() as a `&'static str` (its strings are static storage).
pub fn strerror(code: i32) -> &'static str {
    // SAFETY: te_strerror never returns NULL and its text is static.
    let s: &'static CStr = unsafe { CStr::from_ptr(sys::te_strerror(code as c_int)) };
    s.to_str().unwrap_or("(error text not UTF-8)")
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.code)?;
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("code", &self.code)
            .field("name", &self.name())
            .field("detail", &self.detail)
            .finish()
    }
}

impl std::error::Error for Error {}

/// Runs one libte call with the thread's last error cleared first, so a
/// failure carries the text that call logged. Non-negative results pass.
pub(crate) fn call(f: impl FnOnce() -> c_int) -> Result<c_int> {
    // SAFETY: clears thread-local state only.
    unsafe { sys::te_last_error_clear() };
    let rc = f();
    if rc < 0 {
        Err(Error::last(rc))
    } else {
        Ok(rc)
    }
}
