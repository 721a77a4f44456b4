//! Shared by the integration tests: engines over TCP on 127.0.0.1 with
//! P2PHANDSHAKE, and byte patterns to check transfers with.
#![allow(dead_code)]
use libte::Engine;

/// An engine on 127.0.0.1 with the TCP transport installed.
pub fn tcp_engine() -> Engine {
    Engine::new("P2PHANDSHAKE", Some("127.0.0.1"), &[("transports", "tcp")])
        .unwrap_or_else(|e| panic!("cannot start an engine with the TCP transport: {}", e))
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
