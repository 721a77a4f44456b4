//! Tasks in flight, held by the "hold" test transport until the test lets
//! them go: wait timeouts, free while busy, cancel, failures, and the
//! batch's end waiting for its tasks. One test function: the transport's
//! queue is process-wide.
//!
//! TE_TEST_HOLD_PLUGIN names the plugin file (it must also be in a
//! TE_PLUGIN_PATH directory); without it the test says so and passes,
//! unless LIBTE_RUST_REQUIRE_TEST_PLUGINS is set.
mod common;

use common::{hold_plugin, pattern, Hold};
use libte::{code, Engine, Error, Request, TaskState};
use std::time::{Duration, Instant};

/// The hold plugin as libte loaded it.
fn hold() -> Option<Hold> {
    hold_plugin("TE_TEST_HOLD_PLUGIN", "hold")
}

fn hold_engine() -> Engine {
    Engine::new("P2PHANDSHAKE", Some("127.0.0.1"), &[("transports", "hold")]).expect("engine with the hold transport")
}

#[test]
fn tasks_in_flight() {
    let hold = match hold() {
        Some(h) => h,
        None => {
            eprintln!("skipped: TE_TEST_HOLD_PLUGIN not set");
            return;
        }
    };
    libte::set_log_handler(|_, _, _| {}); // the EBUSY below logs an error
    let a = hold_engine();
    let b = hold_engine();
    let remote_orig = pattern(4096, 9);
    let mut remote = remote_orig.clone();
    let mut local = vec![0u8; 4096];
    b.register(&mut remote, "*", true, |r| {
        let seg = a.open_segment(b.name())?;
        let ra = r.addr();
        a.register(&mut local, "cpu:0", false, |l| {
            let (mut x, mut y) = l.local().split_at(2048)?;

            // Held: the batch waits, times out, refuses to be freed.
            a.batch(8, |batch| {
                batch.submit([Request::read(&seg, ra, &mut x), Request::read(&seg, ra + 2048, &mut y)])?;
                assert_eq!(hold.count(), 2);
                assert_eq!(batch.status(0)?.state, TaskState::Waiting);
                let sum = batch.summary()?;
                assert_eq!((sum.submitted, sum.in_flight, sum.state), (2, 2, TaskState::Waiting));
                let t0 = Instant::now();
                assert_eq!(batch.wait(Some(Duration::from_millis(100))).unwrap_err().code(), code::ETIMEDOUT);
                assert!(t0.elapsed() >= Duration::from_millis(90));
                let e = batch.free().unwrap_err();
                assert_eq!(e.code(), code::EBUSY);
                assert!(e.detail().contains("in flight"), "{}", e);
                assert_eq!(hold.release(0), 2);
                batch.wait(Some(Duration::from_secs(5)))?;
                for st in batch.statuses()? {
                    assert_eq!((st.state, st.transferred), (TaskState::Completed, 2048));
                }
                Ok::<_, Error>(())
            })?;
            assert_eq!(&x[..], &remote_orig[..2048]);
            assert_eq!(&y[..], &remote_orig[2048..]);

            // Failures keep their error.
            a.batch(2, |batch| {
                batch.submit([Request::write(&seg, ra, &x)])?;
                assert_eq!(hold.release(code::EIO), 1);
                batch.submit([Request::write(&seg, ra, &x)])?;
                assert_eq!(hold.release(code::ETIMEDOUT), 1);
                batch.wait(Some(Duration::from_secs(5)))?;
                let st = batch.statuses()?;
                assert_eq!((st[0].state, st[0].error), (TaskState::Failed, code::EIO));
                assert_eq!((st[1].state, st[1].error), (TaskState::Timeout, code::ETIMEDOUT));
                assert_eq!(batch.summary()?.state, TaskState::Failed);
                Ok::<_, Error>(())
            })?;
            // The synchronous helper turns a failed task into its Err.
            let e = std::thread::scope(|s| {
                s.spawn(|| {
                    while hold.count() == 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    hold.release(code::EIO);
                });
                a.read(&seg, ra, &mut x).unwrap_err()
            });
            assert_eq!(e.code(), code::EIO, "{}", e);
            assert!(e.detail().contains("Failed"), "{}", e);

            // Cancel: held tasks end CANCELED when let go, later ones never start.
            a.batch(8, |batch| {
                batch.submit([Request::read(&seg, ra, &mut x)])?;
                batch.cancel()?;
                batch.submit([Request::read(&seg, ra, &mut y)])?;
                assert!(hold.count() <= 2);
                hold.release(0);
                batch.wait(Some(Duration::from_secs(5)))?;
                for st in batch.statuses()? {
                    assert_eq!(st.state, TaskState::Canceled, "{:?}", st);
                    assert_eq!(st.result().unwrap_err().code(), if st.error != 0 { st.error } else { code::ECANCELED });
                }
                assert_eq!(batch.summary()?.state, TaskState::Canceled);
                Ok::<_, Error>(())
            })?;

            // The end of Engine::batch waits for tasks the closure left
            // running: they are let go 300 ms later from another thread, and
            // their bytes are there when it returns.
            x.fill(0);
            let t0 = Instant::now();
            let left_running = std::thread::scope(|s| {
                s.spawn(|| {
                    while hold.count() < 1 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    std::thread::sleep(Duration::from_millis(300));
                    hold.release(0);
                });
                a.batch(1, |batch| {
                    batch.submit([Request::read(&seg, ra, &mut x)])?;
                    Ok::<_, Error>(batch.id())
                })
            })?;
            // ... and then freed it: libte no longer knows the id.
            // SAFETY: a status query on a live engine with valid out-pointers.
            let rc = unsafe {
                libte::sys::te_batch_status(
                    a.as_raw(),
                    left_running,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
            assert_eq!(rc, code::BATCH);
            assert!(t0.elapsed() >= Duration::from_millis(280), "returned after {:?}", t0.elapsed());
            assert_eq!(hold.count(), 0);
            assert_eq!(&x[..], &remote_orig[..2048]);

            // Several threads wait on one batch.
            a.batch(1, |batch| {
                batch.submit([Request::read(&seg, ra + 2048, &mut y)])?;
                std::thread::scope(|s| {
                    let waiters: Vec<_> = (0..3).map(|_| s.spawn(|| batch.wait(Some(Duration::from_secs(10))))).collect();
                    std::thread::sleep(Duration::from_millis(50));
                    assert_eq!(batch.summary().unwrap().in_flight, 1);
                    hold.release(0);
                    for w in waiters {
                        w.join().unwrap().unwrap();
                    }
                });
                assert_eq!(batch.status(0)?.state, TaskState::Completed);
                Ok::<_, Error>(())
            })?;
            Ok::<_, Error>(())
        })
    })
    .unwrap();
    libte::reset_log_handler();
}
