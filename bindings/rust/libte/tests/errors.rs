//! Bad input comes back as `Err` values that say what was wrong: unknown
//! and closed segments, ranges that do not fit, freed and full batches,
//! strings C cannot take. (What the compiler refuses is in the crate's
//! compile_fail doc-tests.)
mod common;

use common::{pattern, tcp_engine, tcp_pair, with_buffers};
use libte::{code, Engine, Error, Request, SegmentId, TaskState};
use std::sync::Mutex;
use std::time::Duration;

/// libte's log lines, captured instead of printed (process-wide handler;
/// the tests of this file look for their own lines by content).
static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn capture_log() {
    libte::set_log_handler(|level, domain, msg| {
        LOG.lock().unwrap().push(format!("{:?} {}: {}", level, domain, msg));
    });
}

fn logged(needle: &str) -> bool {
    LOG.lock().unwrap().iter().any(|l| l.contains(needle))
}

#[test]
fn unknown_segment() {
    capture_log();
    let a = tcp_engine();
    // Nobody listens on port 1 of 127.0.0.1.
    let e = a.open_segment("127.0.0.1:1").unwrap_err();
    assert!(e.code() < 0 && !e.detail().is_empty(), "{}", e);
    assert_eq!(a.find_segment("127.0.0.1:1").unwrap_err().code(), code::ENOENT);

    let mut buf = vec![0u8; 4096];
    a.register(&mut buf, "cpu:0", false, |reg| {
        // An id nobody opened: the task is refused.
        let bogus = SegmentId(987_654);
        let e = a.read(bogus, 0, reg.local()).unwrap_err();
        assert_eq!(e.code(), code::SEGMENT, "{}", e);
        assert_eq!(a.segment_buffers(bogus).unwrap_err().code(), code::SEGMENT);
        assert!(a.segment_buffers(bogus).unwrap_err().detail().contains("987654"));
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn ranges_that_do_not_fit() {
    capture_log();
    let (a, b) = tcp_pair();
    let mut remote = pattern(4096, 1);
    let mut local = vec![0u8; 8192];
    with_buffers(&b, &mut remote, &a, &mut local, |r, l| {
        let seg = a.open_segment(b.name())?;
        // Local ranges past the registration are refused before libte.
        assert_eq!(l.range(8000, 193).unwrap_err().code(), code::EINVAL);
        assert_eq!(l.range(usize::MAX, 2).unwrap_err().code(), code::EINVAL);
        assert!(l.range(8000, 192).is_ok());
        let whole = l.local();
        assert_eq!(whole.split_at(8193).unwrap_err().code(), code::EINVAL);
        assert_eq!(l.local().chunks(0).unwrap_err().code(), code::EINVAL);
        assert_eq!(l.local().chunks(3000)?.iter().map(|c| c.len()).collect::<Vec<_>>(), vec![3000, 3000, 2192]);

        // A remote range longer than the peer's buffer (8 KiB into 4 KiB).
        let e = a.read(&seg, r.addr(), l.local()).unwrap_err();
        assert_eq!(e.code(), code::ADDRESS, "{}", e);
        // Starting inside, ending outside.
        let e = a.write(&seg, r.addr() + 4000, l.range(0, 97)?).unwrap_err();
        assert_eq!(e.code(), code::ADDRESS, "{}", e);
        // Entirely elsewhere.
        let e = a.read(&seg, 4096, l.range(0, 16)?).unwrap_err();
        assert_eq!(e.code(), code::ADDRESS, "{}", e);
        // The last byte exactly fits.
        a.read(&seg, r.addr() + 4095, l.range(0, 1)?)?;
        assert_eq!(l[0], pattern(4096, 1)[4095]);

        // In one batch: the bad request becomes INVALID, the rest run.
        let (mut x, mut y) = l.local().split_at(4096)?;
        let (mut y1, mut y2) = y.reborrow().split_at(2048)?;
        a.batch(3, |batch| {
            let invalid = batch.submit([
                Request::read(&seg, r.addr(), &mut x),
                Request::read(&seg, r.addr() + 4000, &mut y1),
                Request::read(&seg, r.addr() + 2048, &mut y2),
            ])?;
            assert_eq!(invalid, 1);
            batch.wait(Some(Duration::from_secs(30)))?;
            let st = batch.statuses()?;
            assert_eq!(st[0].state, TaskState::Completed);
            assert_eq!((st[1].state, st[1].error), (TaskState::Invalid, code::ADDRESS));
            assert_eq!(st[1].result().unwrap_err().code(), code::ADDRESS);
            assert_eq!(st[2].state, TaskState::Completed);
            assert_eq!(batch.summary()?.state, TaskState::Invalid);
            Ok::<_, Error>(())
        })?;
        assert_eq!(&x[..], &pattern(4096, 1)[..]);
        assert_eq!(&y2[..], &pattern(4096, 1)[2048..]);
        Ok(())
    })
    .unwrap();
}

#[test]
fn closed_segment() {
    capture_log();
    let (a, b) = tcp_pair();
    let mut remote = vec![7u8; 4096];
    let mut local = vec![0u8; 4096];
    with_buffers(&b, &mut remote, &a, &mut local, |r, l| {
        let seg = a.open_segment(b.name())?;
        let id = seg.id();
        a.read(id, r.addr(), l.local())?;
        assert_eq!(l[100], 7);
        seg.close()?;
        let e = a.read(id, r.addr(), l.local()).unwrap_err();
        assert_eq!(e.code(), code::SEGMENT, "{}", e);
        assert_eq!(a.segment_buffers(id).unwrap_err().code(), code::SEGMENT);
        assert_eq!(a.notify(id, "x").unwrap_err().code(), code::SEGMENT);
        assert_eq!(a.find_segment(b.name()).unwrap_err().code(), code::ENOENT);
        // Opening again gives a new id; the old one stays dead.
        let again = a.open_segment(b.name())?;
        assert_ne!(again.id(), id);
        assert_eq!(a.read(id, r.addr(), l.local()).unwrap_err().code(), code::SEGMENT);
        a.read(&again, r.addr(), l.local())?;
        Ok(())
    })
    .unwrap();
}

#[test]
fn freed_and_full_batches() {
    capture_log();
    let a = tcp_engine();
    let mut src = pattern(4096, 3);
    let mut dst = vec![0u8; 4096];
    a.register(&mut src, "cpu:0", false, |s| {
        a.register(&mut dst, "cpu:0", false, |d| {
            let (mut d1, mut d2) = d.local().split_at(2048)?;
            let at = s.addr();
            a.batch(1, |batch| {
                // Over capacity: nothing is appended.
                let e = batch
                    .submit([Request::read(SegmentId::LOCAL, at, &mut d1), Request::read(SegmentId::LOCAL, at, &mut d2)])
                    .unwrap_err();
                assert_eq!(e.code(), code::BATCH_FULL, "{}", e);
                assert_eq!(batch.summary()?.submitted, 0);
                assert_eq!(batch.capacity(), 1);
                Ok::<_, Error>(())
            })?;
            a.batch(2, |batch| {
                batch.submit([Request::read(SegmentId::LOCAL, at, &mut d1)])?;
                batch.wait(None)?;
                batch.free()?;
                // Freed: every call now fails with TE_ERR_BATCH.
                let e = batch.submit([Request::read(SegmentId::LOCAL, at, &mut d2)]).unwrap_err();
                assert_eq!(e.code(), code::BATCH, "{}", e);
                assert!(e.detail().contains(&batch.id().to_string()), "{}", e);
                assert_eq!(batch.wait(None).unwrap_err().code(), code::BATCH);
                assert_eq!(batch.status(0).unwrap_err().code(), code::BATCH);
                assert_eq!(batch.summary().unwrap_err().code(), code::BATCH);
                assert_eq!(batch.cancel().unwrap_err().code(), code::BATCH);
                assert_eq!(batch.free().unwrap_err().code(), code::BATCH);
                Ok::<_, Error>(())
            })?;
            assert_eq!(&d1[..], &pattern(4096, 3)[..2048]);
            assert!(d2.iter().all(|b| *b == 0), "the refused request moved nothing");
            Ok::<_, Error>(())
        })
    })
    .unwrap();
    assert!(logged("unknown batch id"));
    // Capacity 0 is refused.
    let e = a.batch(0, |_| Ok::<_, Error>(())).unwrap_err();
    assert_eq!(e.code(), code::EINVAL);
    assert!(e.detail().contains("capacity"), "{}", e);
    // Task numbers past the submitted ones.
    a.batch(4, |batch| {
        assert!(batch.status(0).is_err());
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn bad_strings_engines_and_registrations() {
    capture_log();
    let e = Engine::new("P2PHANDSHAKE", Some("127.0.0.1\0x"), &[]).unwrap_err();
    assert_eq!(e.code(), code::EINVAL);
    assert!(e.detail().contains("NUL"), "{}", e);
    let e = Engine::new("P2PHANDSHAKE", Some("127.0.0.1"), &[("transports", "no-such-transport")]).unwrap_err();
    assert!(e.code() < 0 && !e.detail().is_empty(), "{}", e);
    let e = Engine::new("nosuchscheme://127.0.0.1:1", Some("127.0.0.1"), &[]).unwrap_err();
    assert!(e.code() < 0, "{}", e);

    let a = tcp_engine();
    assert_eq!(a.install_transport("tcp", None).unwrap_err().code(), code::EEXIST);
    assert!(a.install_transport("no-such-transport", None).is_err());
    assert_eq!(a.notify(SegmentId::LOCAL, "a\0b").unwrap_err().code(), code::EINVAL);
    assert_eq!(a.open_segment("x\0y").unwrap_err().code(), code::EINVAL);

    // Zero length is refused by libte, with its reason.
    let mut empty: Vec<u8> = Vec::new();
    let e = a.register(&mut empty, "cpu:0", false, |_| Ok::<_, Error>(())).unwrap_err();
    assert_eq!(e.code(), code::EINVAL, "{}", e);
    assert!(!e.detail().is_empty());
    let mut buf = vec![0u8; 64];
    let e = a.register(&mut buf, "bad\0loc", false, |_| Ok::<_, Error>(())).unwrap_err();
    assert_eq!(e.code(), code::EINVAL);
    // A closure's own error passes through, and the buffer is unregistered:
    // it can be registered again at once.
    let e = a.register(&mut buf, "cpu:0", false, |_| Err::<(), _>(Error::new(code::ERANGE, "mine"))).unwrap_err();
    assert_eq!((e.code(), e.detail()), (code::ERANGE, "mine"));
    a.register(&mut buf, "cpu:0", false, |_| Ok::<_, Error>(())).unwrap();
    assert!(a.segment_buffers(SegmentId::LOCAL).unwrap().is_empty());
}

#[test]
fn a_panic_inside_still_unregisters() {
    capture_log();
    let a = tcp_engine();
    let mut buf = vec![0u8; 4096];
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        a.register(&mut buf, "cpu:0", false, |_| -> Result<(), Error> { panic!("inside") })
    }));
    assert!(r.is_err());
    assert!(a.segment_buffers(SegmentId::LOCAL).unwrap().is_empty(), "still registered after a panic");
    a.register(&mut buf, "cpu:0", false, |reg| {
        assert_eq!(a.segment_buffers(SegmentId::LOCAL)?.len(), 1);
        assert_eq!(a.segment_buffers(SegmentId::LOCAL)?[0].addr, reg.addr());
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn errors_read_well() {
    let e = Error::new(code::SEGMENT, "unknown segment id 7");
    let text = e.to_string();
    assert!(text.contains(libte::strerror(code::SEGMENT)), "{}", text);
    assert!(text.contains(&code::SEGMENT.to_string()) && text.ends_with("unknown segment id 7"), "{}", text);
    assert!(e.is(code::SEGMENT) && !e.is(code::BATCH));
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(e);
    assert_eq!(boxed.to_string(), text);
    // Our errno numbers are the ones libte names.
    for (c, word) in [
        (code::EBUSY, "busy"),
        (code::EINVAL, "invalid"),
        (code::ETIMEDOUT, "timed out"),
        (code::ENOENT, "no such"),
        (code::ECANCELED, "cancel"),
        (code::EIO, "input/output"),
    ] {
        assert!(libte::strerror(c).to_lowercase().contains(word), "{} -> {}", c, libte::strerror(c));
    }
    // libte's own codes have names of their own.
    let names: std::collections::HashSet<&str> =
        [code::SEGMENT, code::BATCH, code::ADDRESS, code::BATCH_FULL].iter().map(|c| libte::strerror(*c)).collect();
    assert_eq!(names.len(), 4);
    assert!(libte::version().starts_with("1."));
}

#[test]
fn log_lines_and_levels() {
    capture_log();
    libte::log(libte::LogLevel::Warn, "rust-test", "a line of our own");
    assert!(logged("Warn rust-test: a line of our own"));
    // Below the level: not delivered.
    let before = libte::log_level();
    libte::set_log_level(libte::LogLevel::Error);
    assert_eq!(libte::log_level(), libte::LogLevel::Error);
    libte::log(libte::LogLevel::Warn, "rust-test", "filtered out");
    assert!(!logged("filtered out"));
    libte::set_log_level(before);
    assert_eq!(libte::log_level(), before);
    // The plugins the loader found include the TCP transport.
    let tcp = libte::plugins().into_iter().find(|p| p.name.as_deref() == Some("tcp")).expect("tcp plugin listed");
    assert!(tcp.loaded && tcp.kind == libte::PluginKind::Transport && tcp.abi.0 == 1, "{:?}", tcp);
    assert!(tcp.path.ends_with("libte-transport-tcp.so"), "{:?}", tcp);
}
