//! The counters of an engine after real transfers between two engines over
//! TCP: the totals per operation, the JSON document and the Prometheus text.
mod common;

use common::{pattern, tcp_pair};
use libte::{code, Engine, Error, OpTotals};

const CHUNK: usize = 64 << 10;

#[test]
fn counts_transfers_per_operation() {
    let (a, b) = tcp_pair();
    let mut shared = pattern(4 * CHUNK, 1);
    let mut local = vec![0u8; 4 * CHUNK];
    b.register(&mut shared, "cpu:0", true, |b_reg| {
        let during = b.totals()?;
        assert!(during.registered_bytes >= (4 * CHUNK) as u64, "b's registered memory: {:?}", during);
        assert!(during.registered_regions >= 1);
        a.register(&mut local, "cpu:0", false, |al| {
            let seg = a.open_segment(b.name())?;
            for i in 0..3 {
                a.write(&seg, b_reg.addr() + (i * CHUNK) as u64, al.range(i * CHUNK, CHUNK)?)?;
            }
            a.read(&seg, b_reg.addr(), al.range(0, 2 * CHUNK)?)?;
            Ok::<_, Error>(())
        })
    })
    .unwrap();

    let t = a.totals().unwrap();
    let want_write = OpTotals { requests: 3, bytes: (3 * CHUNK) as u64, completed: 3, failed: 0, canceled: 0 };
    let want_read = OpTotals { requests: 1, bytes: (2 * CHUNK) as u64, completed: 1, failed: 0, canceled: 0 };
    assert_eq!(t.write, want_write);
    assert_eq!(t.read, want_read);
    assert_eq!((t.in_flight, t.in_flight_bytes), (0, 0));
    // The target moved nothing of its own.
    let tb = b.totals().unwrap();
    assert_eq!((tb.read.requests, tb.write.requests), (0, 0));

    let s = a.stats().unwrap();
    assert_eq!(s.totals.write, want_write);
    assert!(s.json.starts_with('{') && s.json.trim_end().ends_with('}'), "not one JSON object: {}", s.json);
    assert!(s.json.contains("\"tcp\"") && s.json.contains(a.name()), "JSON without tcp or the segment: {}", s.json);

    let text = a.metrics_text().unwrap();
    assert!(text.contains("# TYPE ") && text.contains("transport=\"tcp\""), "no tcp series:\n{}", text);
}

#[test]
fn off_with_te_metrics_0() {
    let e = Engine::new("P2PHANDSHAKE", Some("127.0.0.1"), &[("transports", "tcp"), ("TE_METRICS", "0")]).unwrap();
    for err in [e.totals().err(), e.stats().err(), e.metrics_text().err()] {
        let err = err.expect("a call succeeded with counting off");
        assert_eq!(err.code(), code::ENOTSUP, "{}", err);
    }
}
