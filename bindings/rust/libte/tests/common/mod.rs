//! Shared by the integration tests: engines over TCP on 127.0.0.1 with
//! P2PHANDSHAKE, a peer's buffer and a local one registered together, byte
//! patterns to check transfers with, and the controls of the hold test
//! transports.
#![allow(dead_code)]
use libte::{Engine, Error, Registration};
use std::ffi::CString;
use std::os::raw::{c_char, c_int, c_void};

/// An engine on 127.0.0.1 with the TCP transport installed.
pub fn tcp_engine() -> Engine {
    Engine::new("P2PHANDSHAKE", Some("127.0.0.1"), &[("transports", "tcp")])
        .unwrap_or_else(|e| panic!("cannot start an engine with the TCP transport: {}", e))
}

/// Two such engines: an initiator and its peer.
pub fn tcp_pair() -> (Engine, Engine) {
    (tcp_engine(), tcp_engine())
}

/// `remote` registered on `target` for peers and `local` on `initiator`
/// (both on cpu:0) while `f` runs with the two registrations, in that order.
pub fn with_buffers<T>(
    target: &Engine,
    remote: &mut [u8],
    initiator: &Engine,
    local: &mut [u8],
    f: impl FnOnce(&mut Registration<'_, '_>, &mut Registration<'_, '_>) -> Result<T, Error>,
) -> Result<T, Error> {
    target.register(remote, "cpu:0", true, |r| initiator.register(local, "cpu:0", false, |l| f(r, l)))
}

/// Bytes that differ from position to position and from seed to seed, so
/// a misplaced, shifted or stale block never passes a comparison.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// The first differing position, for a readable failure.
pub fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

pub fn assert_same(got: &[u8], want: &[u8], what: &str) {
    if let Some(i) = first_diff(got, want) {
        panic!(
            "{}: byte {} differs (got {:?}, want {:?}; {} vs {} bytes)",
            what,
            i,
            got.get(i),
            want.get(i),
            got.len(),
            want.len()
        );
    }
}

extern "C" {
    fn dlopen(file: *const c_char, flags: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void;
}

pub struct Hold {
    count: unsafe extern "C" fn() -> usize,
    release: unsafe extern "C" fn(c_int) -> usize,
}

impl Hold {
    pub fn count(&self) -> usize {
        // SAFETY: the plugin's own function, no arguments.
        unsafe { (self.count)() }
    }
    pub fn release(&self, error: i32) -> usize {
        // SAFETY: completes the held transfers through libte's services.
        unsafe { (self.release)(error) }
    }
}

/// A hold test transport ("hold", or "holddl" that honours deadlines) as
/// libte loaded it (RTLD_NOLOAD: the same copy), from the file `env` names;
/// None when it is unset (then LIBTE_RUST_REQUIRE_TEST_PLUGINS must be too).
pub fn hold_plugin(env: &str, name: &str) -> Option<Hold> {
    let path = match std::env::var(env) {
        Ok(p) => p,
        Err(_) => {
            assert!(std::env::var_os("LIBTE_RUST_REQUIRE_TEST_PLUGINS").is_none(), "{} is not set", env);
            return None;
        }
    };
    let loaded = libte::plugins();
    assert!(
        loaded.iter().any(|p| p.name.as_deref() == Some(name) && p.loaded),
        "libte did not load the {} transport: {:?}",
        name,
        loaded
    );
    let cpath = CString::new(path.clone()).unwrap();
    const RTLD_NOW: c_int = 2;
    const RTLD_NOLOAD: c_int = 4;
    // SAFETY: looks up symbols of a library already loaded by libte; the
    // signatures are those of tests/plugins/hold-transport.c.
    unsafe {
        let h = dlopen(cpath.as_ptr(), RTLD_NOW | RTLD_NOLOAD);
        assert!(!h.is_null(), "{} is not the {} plugin libte loaded", path, name);
        let c = dlsym(h, b"te_test_hold_count\0".as_ptr() as *const c_char);
        let r = dlsym(h, b"te_test_hold_release\0".as_ptr() as *const c_char);
        assert!(!c.is_null() && !r.is_null());
        Some(Hold {
            count: std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> usize>(c),
            release: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int) -> usize>(r),
        })
    }
}
