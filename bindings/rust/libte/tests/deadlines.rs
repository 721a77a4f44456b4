//! Deadlines. Over TCP between two engines: what a task records, the
//! refusal of a negative deadline, and a deadline already passed, which
//! leaves every task either completed with its bytes or failed with
//! ETIMEDOUT and ended early. Over "holddl", the hold test transport that
//! honours deadlines (TE_TEST_HOLDDL_PLUGIN names it): tasks held as by a
//! peer that stopped answering end at their deadline, a write unsettled
//! until it is let go, and no byte moves afterwards.
mod common;

use common::{assert_same, hold_plugin, pattern, tcp_pair};
use libte::{code, Engine, Error, Request, TaskState};
use std::time::{Duration, Instant};

const CHUNK: usize = 64 << 10;
const N: usize = 64;

#[test]
fn clock() {
    let a = libte::now_ns();
    let d = libte::deadline_in(Duration::from_millis(500));
    let b = libte::now_ns();
    assert!(a > 0 && a <= b, "{} {}", a, b);
    assert!(d >= a + 500_000_000 && d <= b + 500_000_000, "{} {} {}", a, d, b);
    assert_eq!(libte::deadline_in(Duration::MAX), i64::MAX);
}

#[test]
fn deadlines_over_tcp() {
    let (a, b) = tcp_pair();
    let src = pattern(N * CHUNK, 7);
    let mut remote = src.clone();
    let mut local = vec![0u8; N * CHUNK];
    b.register(&mut remote, "*", true, |r| {
        let seg = a.open_segment(b.name())?;
        let ra = r.addr();
        a.register(&mut local, "cpu:0", false, |l| {
            let (mut x, rest) = l.local().split_at(CHUNK)?;
            // Refused deadlines append nothing.
            a.batch(1, |batch| {
                assert_eq!(batch.set_deadline(-1).unwrap_err().code(), code::EINVAL);
                let e = batch.submit_by([Request::read(&seg, ra, &mut x)], -1).unwrap_err();
                assert_eq!(e.code(), code::EINVAL);
                assert_eq!(batch.summary()?.submitted, 0);
                assert_eq!(batch.task_info(0).unwrap_err().code(), code::ERANGE);
                Ok::<_, Error>(())
            })?;
            // A deadline long passed.
            a.batch(N, |batch| {
                let mut reqs = vec![Request::read(&seg, ra, &mut x)];
                for (i, p) in rest.chunks(CHUNK)?.into_iter().enumerate() {
                    reqs.push(Request::read(&seg, ra + ((i + 1) * CHUNK) as u64, p));
                }
                assert_eq!(batch.submit_by(reqs, 1)?, 0);
                batch.wait(Some(Duration::from_secs(5)))?;
                batch.wait_settled(Some(Duration::from_secs(5)))?;
                for i in 0..N {
                    let ti = batch.task_info(i)?;
                    assert_eq!(ti.deadline_ns, 1);
                    assert!(!ti.unsettled(), "a READ is settled when it ends: {:?}", ti);
                    match ti.state {
                        TaskState::Completed => assert!(!ti.ended_early() && ti.error == 0, "{:?}", ti),
                        TaskState::Failed => {
                            assert!(ti.ended_early() && ti.error == code::ETIMEDOUT, "{:?}", ti)
                        }
                        _ => panic!("task {}: {:?}", i, ti),
                    }
                    assert_eq!(ti.status().state, ti.state);
                }
                Ok::<_, Error>(())
            })?;
            // The batch's deadline applies to submits that give none.
            a.batch(1, |batch| {
                let d = libte::deadline_in(Duration::from_secs(60));
                batch.set_deadline(d)?;
                batch.submit([Request::read(&seg, ra, &mut x)])?;
                batch.wait(Some(Duration::from_secs(5)))?;
                let ti = batch.task_info(0)?;
                assert_eq!((ti.state, ti.deadline_ns, ti.flags), (TaskState::Completed, d, 0));
                Ok::<_, Error>(())
            })?;
            assert_same(&x, &src[..CHUNK], "read with the batch's deadline");
            // transfer_within: in time, every byte; a zero timeout ends it
            // at once unless it completed first.
            let t0 = Instant::now();
            a.transfer_within([Request::read(&seg, ra, l.local())], Duration::from_secs(10))?;
            assert!(t0.elapsed() < Duration::from_secs(10));
            assert_same(l, &src, "read within the timeout");
            match a.transfer_within([Request::read(&seg, ra, l.local())], Duration::ZERO) {
                Ok(()) => assert_same(l, &src, "read that beat a zero timeout"),
                Err(e) => assert_eq!(e.code(), code::ETIMEDOUT, "{}", e),
            }
            Ok::<_, Error>(())
        })
    })
    .unwrap();
}

#[test]
fn deadlines_on_a_held_peer() {
    let hold = match hold_plugin("TE_TEST_HOLDDL_PLUGIN", "holddl") {
        Some(h) => h,
        None => {
            eprintln!("skipped: TE_TEST_HOLDDL_PLUGIN not set");
            return;
        }
    };
    let engine = || Engine::new("P2PHANDSHAKE", Some("127.0.0.1"), &[("transports", "holddl")]).expect("holddl engine");
    let (a, b) = (engine(), engine());
    let remote_orig = pattern(2 * CHUNK, 3);
    let local_orig = pattern(2 * CHUNK, 4);
    let mut remote = remote_orig.clone();
    let mut local = local_orig.clone();
    b.register(&mut remote, "*", true, |r| {
        let seg = a.open_segment(b.name())?;
        let ra = r.addr();
        a.register(&mut local, "cpu:0", false, |l| {
            let (mut x, y) = l.local().split_at(CHUNK)?;
            // A read ends at the deadline, ETIMEDOUT within milliseconds.
            let t0 = Instant::now();
            let e = a.transfer_within([Request::read(&seg, ra, &mut x)], Duration::from_millis(200)).unwrap_err();
            let took = t0.elapsed();
            assert_eq!(e.code(), code::ETIMEDOUT, "{}", e);
            assert!(took >= Duration::from_millis(195) && took < Duration::from_millis(260), "after {:?}", took);
            // A write is unsettled until its transfer is let go.
            a.batch(1, |batch| {
                batch.submit_by([Request::write(&seg, ra, &y)], libte::deadline_in(Duration::from_millis(100)))?;
                batch.wait(Some(Duration::from_secs(2)))?;
                let ti = batch.task_info(0)?;
                assert_eq!((ti.state, ti.error), (TaskState::Failed, code::ETIMEDOUT), "{:?}", ti);
                assert!(ti.ended_early() && ti.unsettled(), "{:?}", ti);
                assert_eq!(batch.wait_settled(Some(Duration::from_millis(50))).unwrap_err().code(), code::ETIMEDOUT);
                assert_eq!(hold.count(), 2);
                assert_eq!(hold.release(0), 2);
                batch.wait_settled(Some(Duration::from_secs(5)))?;
                let ti = batch.task_info(0)?;
                assert!(ti.ended_early() && !ti.unsettled(), "{:?}", ti);
                Ok::<_, Error>(())
            })?;
            Ok::<_, Error>(())
        })?;
        assert_same(r, &remote_orig, "the peer's memory after an ended write");
        Ok::<_, Error>(())
    })
    .unwrap();
    assert_same(&local, &local_orig, "local memory after an ended read");
}
