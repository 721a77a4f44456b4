//! Two engines over TCP (P2PHANDSHAKE on 127.0.0.1) moving data both ways,
//! every byte checked; several threads on one engine and one batch;
//! segments and notifications.
mod common;

use common::{assert_same, pattern, tcp_engine, tcp_pair, with_buffers};
use libte::{Engine, Error, Request, SegmentId, SharedMemory, TaskState};
use std::time::{Duration, Instant};

const N: usize = (1 << 20) + 4099;

/// Offsets and lengths covering [0, N): single bytes, page-sized and
/// odd-sized pieces, and one large rest.
fn pieces() -> Vec<(usize, usize)> {
    let lens = [1usize, 4095, 4096, 65543, 3, 200_000];
    let mut out = Vec::new();
    let mut off = 0;
    for l in lens {
        out.push((off, l));
        off += l;
    }
    out.push((off, N - off));
    out
}

#[test]
fn both_ways_every_byte() {
    let (a, b) = tcp_pair();
    assert_ne!(a.name(), b.name());
    let a_orig = pattern(N, 1);
    let b_orig = pattern(N, 2);
    let (mut a_shared, mut b_shared) = (a_orig.clone(), b_orig.clone());
    let (mut a_local, mut b_local) = (vec![0u8; N], vec![0u8; N]);
    let a_new = pattern(N, 3);
    let b_new = pattern(N, 4);

    a.register(&mut a_shared, "cpu:0", true, |a_reg| {
        b.register(&mut b_shared, "cpu:0", true, |b_reg| {
            a.register(&mut a_local, "cpu:0", false, |al| {
                b.register(&mut b_local, "cpu:0", false, |bl| {
                    let seg_b = a.open_segment(b.name())?;
                    let seg_a = b.open_segment(a.name())?;
                    // The descriptors list the shared buffers where they are.
                    let bb = seg_b.buffers()?;
                    assert!(
                        bb.iter().any(|x| x.addr == b_reg.addr() && x.length == N as u64),
                        "b's buffer not in its descriptor: {:?}",
                        bb
                    );
                    assert!(seg_a.buffers()?.iter().any(|x| x.addr == a_reg.addr()));

                    // a reads b piece by piece, then writes all of a_new over it.
                    for (off, len) in pieces() {
                        a.read(&seg_b, b_reg.addr() + off as u64, al.range(off, len)?)?;
                    }
                    assert_same(al, &b_orig, "a read b");
                    al.copy_from_slice(&a_new);
                    a.write(&seg_b, b_reg.addr(), &*al)?;
                    assert_same(b_reg, &a_new, "a wrote b");

                    // and back: b reads a, then writes b_new into it in pieces.
                    b.read(&seg_a, a_reg.addr(), &mut *bl)?;
                    assert_same(bl, &a_orig, "b read a");
                    bl.copy_from_slice(&b_new);
                    for (off, len) in pieces().into_iter().rev() {
                        b.write(&seg_a, a_reg.addr() + off as u64, bl.range(off, len)?)?;
                    }
                    assert_same(a_reg, &b_new, "b wrote a");
                    Ok::<_, Error>(())
                })
            })
        })
    })
    .unwrap();
    // After the registrations the buffers are plain memory again.
    assert_same(&a_shared, &b_new, "a's buffer after unregistering");
    assert_same(&b_shared, &a_new, "b's buffer after unregistering");
}

#[test]
fn one_batch_many_requests_with_statuses() {
    let (a, b) = tcp_pair();
    const BLOCK: usize = 8192;
    const BLOCKS: usize = 64;
    let remote_orig = pattern(BLOCK * BLOCKS, 11);
    let mut remote = remote_orig.clone();
    let mut local = pattern(BLOCK * BLOCKS, 12);
    let local_orig = local.clone();
    with_buffers(&b, &mut remote, &a, &mut local, |rreg, lreg| {
        let raddr = rreg.addr();
        let seg = a.open_segment(b.name())?;
        // Even blocks are read from b, odd blocks written to b, in one batch.
        let mut blocks = lreg.local().chunks(BLOCK)?;
        a.batch(BLOCKS, |batch| {
            let reqs: Vec<Request<'_>> = blocks
                .iter_mut()
                .enumerate()
                .map(|(i, l)| {
                    let at = raddr + (i * BLOCK) as u64;
                    if i % 2 == 0 {
                        Request::read(&seg, at, l)
                    } else {
                        Request::write(&seg, at, &*l)
                    }
                })
                .collect();
            assert_eq!(reqs.len(), BLOCKS);
            assert_eq!(batch.submit(reqs)?, 0);
            batch.wait(Some(Duration::from_secs(60)))?;
            let sum = batch.summary()?;
            assert_eq!((sum.submitted, sum.in_flight, sum.state), (BLOCKS, 0, TaskState::Completed));
            for (i, st) in batch.statuses()?.iter().enumerate() {
                assert_eq!(st.state, TaskState::Completed, "task {}", i);
                assert_eq!((st.error, st.transferred), (0, BLOCK as u64), "task {}", i);
                assert_eq!(st.result()?, BLOCK as u64);
            }
            Ok::<_, Error>(())
        })?;
        for (i, l) in blocks.iter().enumerate() {
            let r = i * BLOCK..(i + 1) * BLOCK;
            if i % 2 == 0 {
                assert_same(l, &remote_orig[r], &format!("block {} read", i));
            } else {
                assert_same(l, &local_orig[r], &format!("block {} kept", i));
            }
        }
        for i in 0..BLOCKS {
            let r = i * BLOCK..(i + 1) * BLOCK;
            let want = if i % 2 == 0 { &remote_orig[r.clone()] } else { &local_orig[r.clone()] };
            assert_same(&rreg[r], want, &format!("remote block {}", i));
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn threads_share_an_engine_and_a_batch() {
    let (a, b) = tcp_pair();
    const THREADS: usize = 4;
    const PER: usize = 8; // blocks per thread
    const BLOCK: usize = 16384;
    const ROUNDS: u64 = 10;
    let mut remote = vec![0u8; THREADS * PER * BLOCK];
    let mut local = vec![0u8; THREADS * PER * BLOCK];
    with_buffers(&b, &mut remote, &a, &mut local, |rreg, lreg| {
        let raddr = rreg.addr();
        let seg = a.open_segment(b.name())?;
        let seg_id = seg.id();
        let mut blocks = lreg.local().chunks(BLOCK)?;

        // Each thread its own blocks and batches: write a pattern, read it
        // back over zeros, compare; rounds with fresh patterns.
        std::thread::scope(|s| {
            let mut joins = Vec::new();
            for (t, mine) in blocks.chunks_mut(PER).enumerate() {
                let a = &a;
                joins.push(s.spawn(move || -> Result<(), Error> {
                    for round in 0..ROUNDS {
                        let seed = (t as u64) << 32 | round;
                        for (k, l) in mine.iter_mut().enumerate() {
                            l.copy_from_slice(&pattern(BLOCK, seed + k as u64 * 1000));
                        }
                        let at = |k: usize| raddr + ((t * PER + k) * BLOCK) as u64;
                        a.transfer(mine.iter().enumerate().map(|(k, l)| Request::write(seg_id, at(k), l)))?;
                        for l in mine.iter_mut() {
                            l.fill(0);
                        }
                        a.transfer(mine.iter_mut().enumerate().map(|(k, l)| Request::read(seg_id, at(k), l)))?;
                        for (k, l) in mine.iter().enumerate() {
                            assert_same(l, &pattern(BLOCK, seed + k as u64 * 1000), "thread round trip");
                        }
                    }
                    Ok(())
                }));
            }
            for j in joins {
                j.join().expect("worker panicked")?;
            }
            Ok::<_, Error>(())
        })?;

        // One batch, submitted to from every thread at once, waited on by
        // two of them.
        for (i, l) in blocks.iter_mut().enumerate() {
            l.fill(0xee ^ i as u8);
        }
        let before = Instant::now();
        a.batch(THREADS * PER, |batch| {
            std::thread::scope(|s| {
                for (t, mine) in blocks.chunks_mut(PER).enumerate() {
                    s.spawn(move || {
                        let reqs = mine
                            .iter_mut()
                            .enumerate()
                            .map(|(k, l)| Request::read(seg_id, raddr + ((t * PER + k) * BLOCK) as u64, l));
                        assert_eq!(batch.submit(reqs).expect("submit from a thread"), 0);
                    });
                }
            });
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| batch.wait(Some(Duration::from_secs(60))).expect("wait from a thread"));
                }
            });
            let sum = batch.summary()?;
            assert_eq!((sum.submitted, sum.in_flight, sum.state), (THREADS * PER, 0, TaskState::Completed));
            Ok::<_, Error>(())
        })?;
        assert!(before.elapsed() < Duration::from_secs(60));
        let r = rreg.as_slice();
        for (i, l) in blocks.iter().enumerate() {
            assert_same(l, &r[i * BLOCK..(i + 1) * BLOCK], &format!("shared batch block {}", i));
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn local_segment_moves_within_the_engine() {
    let a = tcp_engine();
    let src_orig = pattern(100_000, 21);
    let mut src = src_orig.clone();
    let mut dst = vec![0u8; 100_000];
    a.register(&mut src, "cpu:0", false, |s| {
        a.register(&mut dst, "*", false, |d| {
            let local = a.local_segment();
            assert_eq!(local.id(), SegmentId::LOCAL);
            assert_eq!(a.find_segment(a.name())?, SegmentId::LOCAL);
            // Both regions are the local segment's buffers.
            let bufs = local.buffers()?;
            assert!(bufs.iter().any(|x| x.addr == s.addr()) && bufs.iter().any(|x| x.addr == d.addr()));
            a.read(&local, s.addr() + 10, d.range(0, 50_000)?)?;
            assert_same(&d[..50_000], &src_orig[10..50_010], "local read");
            a.write(&local, s.addr(), d.range(0, 1000)?)?;
            assert_same(&s[..1000], &src_orig[10..1010], "local write");
            Ok::<_, Error>(())
        })
    })
    .unwrap();
}

#[test]
fn segments_by_name() {
    let (a, b) = tcp_pair();
    let port = b.rpc_port();
    assert!(port > 0);
    assert!(b.name().ends_with(&format!(":{}", port)), "name {} port {}", b.name(), port);
    assert_eq!(b.address(), "127.0.0.1");
    assert!(a.transports().unwrap().iter().any(|t| t == "tcp"));
    a.probe(b.name(), Some(Duration::from_secs(5))).unwrap();

    let mut buf = vec![1u8; 4096];
    b.register(&mut buf, "cpu:0", true, |reg| {
        let s1 = a.open_segment(b.name())?;
        let s2 = a.open_segment(b.name())?;
        assert_eq!(s1.id(), s2.id(), "one name, one id");
        assert_eq!(s1.name(), b.name());
        assert_eq!(a.find_segment(b.name())?, s1.id());
        s1.refresh()?;
        assert!(a.refresh_all()? >= 1);
        let d = s1.descriptor()?;
        assert!(d.contains("\"buffers\"") && d.contains(&reg.addr().to_string()), "descriptor {}", d);
        // One close of two opens keeps it open.
        s1.close()?;
        assert_eq!(s2.buffers()?.len(), 1);
        assert_eq!(s2.buffers()?[0].addr, reg.addr());
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn notifications_both_ways() {
    let (a, b) = tcp_pair();
    let seg_b = a.open_segment(b.name()).unwrap();
    let seg_a = b.open_segment(a.name()).unwrap();
    assert!(b.notifications().unwrap().is_empty());
    a.notify(&seg_b, "hello b").unwrap();
    a.notify_as(&seg_b, "someone-else", "from a name of my choosing").unwrap();
    let got = b.notifications().unwrap();
    assert_eq!(got.len(), 2, "{:?}", got);
    assert_eq!((got[0].name.as_str(), got[0].msg.as_str()), (a.name(), "hello b"));
    assert_eq!((got[1].name.as_str(), got[1].msg.as_str()), ("someone-else", "from a name of my choosing"));
    assert!(b.notifications().unwrap().is_empty(), "fetch takes them");

    // A batch's notification follows its tasks.
    let mut remote = pattern(65536, 5);
    let want = remote.clone();
    let mut local = vec![0u8; 65536];
    with_buffers(&a, &mut remote, &b, &mut local, |r, l| {
        let mut whole = l.local();
        b.batch(1, |batch| {
            batch.submit([Request::read(&seg_a, r.addr(), &mut whole)])?;
            batch.notify(&seg_a, "done")?;
            batch.wait(Some(Duration::from_secs(30)))
        })?;
        b.batch(1, |batch| {
            batch.submit([Request::read(&seg_a, r.addr(), &mut whole)])?;
            batch.notify_as(&seg_a, "bee", "done too")?;
            batch.wait(Some(Duration::from_secs(30)))
        })?;
        assert_same(&whole, &want, "read before notifying");
        Ok(())
    })
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while got.len() < 2 && Instant::now() < deadline {
        got.extend(a.notifications().unwrap());
        std::thread::sleep(Duration::from_millis(10));
    }
    got.sort_by(|x, y| x.msg.cmp(&y.msg));
    assert_eq!(got.len(), 2, "{:?}", got);
    assert_eq!((got[0].name.as_str(), got[0].msg.as_str()), (b.name(), "done"));
    assert_eq!((got[1].name.as_str(), got[1].msg.as_str()), ("bee", "done too"));
}

#[test]
fn shared_memory_with_the_best_transports() {
    // te_mem_alloc memory on both sides and te_transport_auto: between two
    // engines of one host the same-host transport serves the segment when
    // its plugin is there, TCP otherwise; the bytes must arrive either way.
    let make = || {
        let e = Engine::new("P2PHANDSHAKE", Some("127.0.0.1"), &[]).unwrap();
        let net = e.install_best_transport().unwrap();
        assert!(net.is_some());
        e
    };
    let a = make();
    let b = make();
    let shm_loaded = libte::plugins().iter().any(|p| p.name.as_deref() == Some("shm") && p.loaded);
    assert_eq!(a.transports().unwrap().iter().any(|t| t == "shm"), shm_loaded);
    assert_eq!(SharedMemory::new(0).unwrap_err().code(), libte::code::EINVAL);
    let mut theirs = SharedMemory::new(300_001).unwrap();
    let mut mine = SharedMemory::new(300_001).unwrap();
    assert_eq!(theirs.len(), 300_001);
    assert!(theirs.iter().all(|b| *b == 0), "te_mem_alloc memory starts zeroed");
    assert_eq!(theirs.as_ptr() as usize % 4096, 0, "page-aligned");
    let orig = pattern(300_001, 31);
    theirs.copy_from_slice(&orig);
    let fresh = pattern(300_001, 32);
    with_buffers(&b, &mut theirs, &a, &mut mine, |t, m| {
        let seg = a.open_segment(b.name())?;
        let served_by = seg.transport().expect("an open segment has a transport");
        assert_eq!(served_by, if shm_loaded { "shm" } else { "tcp" });
        assert_eq!(a.local_segment().transport().as_deref(), Some("local"));
        a.read(&seg, t.addr(), m.local())?;
        assert_same(m, &orig, "read over the best transport");
        m.copy_from_slice(&fresh);
        a.write(&seg, t.addr() + 1, m.range(1, 300_000)?)?;
        assert_same(&t[1..], &fresh[1..], "write over the best transport");
        assert_eq!(t[0], orig[0]);
        let id = seg.id();
        seg.close()?;
        assert_eq!(a.find_segment(b.name()).unwrap_err().code(), libte::code::ENOENT);
        assert_eq!(a.read(id, t.addr(), m.local()).unwrap_err().code(), libte::code::SEGMENT);
        Ok(())
    })
    .unwrap();
    assert_same(&theirs[1..], &fresh[1..], "after unregistering");
}
