# SPDX-License-Identifier: Apache-2.0
"""Deadlines: libte.now_ns, Batch.set_deadline / submit(deadline=) / info /
wait_settled, the sync calls' timeout= as the tasks' deadline, and the
Mooncake layer's MC_SLICE_TIMEOUT, against a peer process stopped with
SIGSTOP (it holds every transfer to it in flight until it goes on)."""
import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import libte
from conftest import MIB, pattern

HERE = os.path.dirname(os.path.abspath(__file__))


def test_now_ns_is_the_monotonic_clock():
    a = libte.now_ns()
    m = time.monotonic_ns()
    b = libte.now_ns()
    assert isinstance(a, int) and 0 < a <= b
    assert abs(m - a) < 50_000_000  # the same clock (CLOCK_MONOTONIC)


def test_deadline_arguments(hold):
    a, seg = hold.a, hold.seg
    with a.batch(4) as b:
        with pytest.raises(libte.InvalidArgumentError):
            b.set_deadline(-1)
        with pytest.raises(TypeError):
            b.set_deadline(1.5)
        with pytest.raises(libte.InvalidArgumentError):
            b.submit([(libte.WRITE, seg, hold.aaddr, hold.baddr, 8)], deadline=-5)
        with pytest.raises(libte.InvalidArgumentError):
            b.submit_write(seg, [hold.aaddr], [hold.baddr], 8, deadline=2**63)
        with pytest.raises(TypeError):
            b.submit_read(seg, [hold.aaddr], [hold.baddr], 8, deadline="soon")
        assert b.submitted == 0 and hold.count() == 0  # nothing was appended
        with pytest.raises(IndexError):
            b.info(0)
        with pytest.raises(IndexError):
            b.info(-1)
        with pytest.raises(ValueError):
            b.wait_settled(timeout=-1)
        assert b.wait_settled(0) is True  # nothing in flight
    with pytest.raises(ValueError):
        a.read(seg, hold.aaddr, hold.baddr, 8, timeout=-0.1)
    with pytest.raises(libte.BatchError):
        b.info(0)  # freed


def test_deadlines_recorded(hold):
    """Each task carries the deadline its submit gave, else the batch's.
    The hold transport does not honour deadlines: its tasks go on past them
    (libte ends only the tasks of transports that do)."""
    a, seg = hold.a, hold.seg
    d1 = libte.now_ns() + 60 * 10**9
    d2 = libte.now_ns() + 50_000_000
    b = a.batch(4)
    b.set_deadline(d1)
    b.submit_write(seg, [hold.aaddr], [hold.baddr], 64)
    b.submit([(libte.READ, seg, hold.aaddr + 64, hold.baddr + 64, 64)], deadline=d2)
    b.set_deadline(0)
    b.submit_read(seg, [hold.aaddr + 128], [hold.baddr + 128], 64)
    assert [b.info(i).deadline_ns for i in range(3)] == [d1, d2, 0]
    time.sleep(0.15)  # past d2
    i = b.info(1)
    assert i.state == libte.TaskState.WAITING and i.flags == 0 and not i.ended_early
    assert b.in_flight == 3
    assert hold.release(0) == 3
    assert b.wait(5) and b.wait_settled(5)
    for n in range(3):
        i = b.info(n)
        assert (i.state, i.error, i.flags, i.transferred) == (libte.TaskState.COMPLETED, 0, 0, 64)
        assert not i.unsettled and not i.ended_early
    b.free()


def test_past_deadline_on_a_live_peer(pair):
    """A deadline already passed: every task that was still in flight when
    libte looked ends FAILED, -ETIMEDOUT, ended early; one the transport
    finished first completed with every byte. Nothing else."""
    a, seg = pair.a, pair.seg
    pair.bbuf[:] = pattern(4 * MIB, 5)
    with a.batch(64) as b:
        b.submit_read(seg, [pair.aaddr + i * 65536 for i in range(64)],
                      [pair.baddr + i * 65536 for i in range(64)], 65536, deadline=1)
        assert b.wait(5)
        for n in range(64):
            i = b.info(n)
            assert i.deadline_ns == 1
            if i.state == libte.TaskState.COMPLETED:
                assert not i.ended_early and i.error == 0
                assert pair.abuf[n * 65536:(n + 1) * 65536] == pair.bbuf[n * 65536:(n + 1) * 65536]
            else:
                assert (i.state, i.error, i.ended_early) == (libte.TaskState.FAILED, -errno.ETIMEDOUT, True)
                assert not i.unsettled  # a READ is settled when it ends
    # the sync form: it completes or raises TimeoutError, nothing else
    try:
        a.read(seg, pair.abuf, pair.baddr, timeout=0)
        assert pair.abuf == pair.bbuf
    except libte.TimeoutError:
        pass


def start_peer(transports="tcp"):
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "peer.py"), "P2PHANDSHAKE", "127.0.0.1", "21",
                             transports], stdout=subprocess.PIPE, cwd=HERE, text=True)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail("the peer process did not start")
    return proc, json.loads(line)


def stop(proc):
    os.kill(proc.pid, signal.SIGSTOP)
    # SIGSTOP takes effect asynchronously: wait until the process shows it
    for _ in range(1000):
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.001)
    pytest.fail("the peer did not stop")


def end_peer(proc):
    os.kill(proc.pid, signal.SIGCONT)
    proc.kill()
    proc.wait(10)


@pytest.fixture
def stopped_peer():
    """(engine, segment, the peer's buffer address, process) with the peer's
    segment open and one read done, then the peer stopped."""
    proc, info = start_peer()
    try:
        e = libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports="tcp", address="127.0.0.1")
        local = bytearray(MIB)
        e.register(local)
        seg = e.open_segment(info["name"])
        e.read(seg, local, info["addr"], timeout=5)  # connected, and the peer serves
        assert local == pattern(MIB, 21)
        stop(proc)
        yield e, seg, info["addr"], proc, local
        os.kill(proc.pid, signal.SIGCONT)
        e.close()
    finally:
        end_peer(proc)


def test_sync_timeout_to_a_stopped_peer(stopped_peer):
    """read(timeout=0.2) of 1 MiB from a peer that stopped raises TimeoutError
    by the deadline (plus a few ms), and no byte lands in the buffer after it
    returned, even once the peer goes on and answers."""
    e, seg, remote, proc, local = stopped_peer
    before = pattern(MIB, 22)
    local[:] = before
    for _ in range(2):  # the second call finds the peer still stopped
        t0 = time.monotonic()
        with pytest.raises(libte.TimeoutError):
            e.read(seg, local, remote, timeout=0.2)
        took = time.monotonic() - t0
        assert 0.19 < took < 0.25, f"read(timeout=0.2) returned after {took:.3f} s"
    os.kill(proc.pid, signal.SIGCONT)
    time.sleep(0.3)  # the peer answers the reads it had queued
    assert local == before
    e.read(seg, local, remote, timeout=5)  # and it serves again
    assert local == pattern(MIB, 21)


def test_batch_deadline_to_a_stopped_peer(stopped_peer):
    """A write with a deadline to a stopped peer ends FAILED -ETIMEDOUT at it;
    if its bytes had left it is unsettled until the peer, gone on, can no
    longer apply them, and wait_settled() waits for that."""
    e, seg, remote, proc, local = stopped_peer
    with e.batch(2) as b:
        t0 = time.monotonic()
        b.submit_write(seg, [local], [remote], MIB, deadline=libte.now_ns() + 150_000_000)
        assert b.wait(2)
        took = time.monotonic() - t0
        assert 0.14 < took < 0.2, f"ended after {took:.3f} s"
        i = b.info(0)
        assert (i.state, i.error, i.ended_early) == (libte.TaskState.FAILED, -errno.ETIMEDOUT, True)
        if i.unsettled:
            assert b.wait_settled(0.1) is False  # the peer is still stopped
        os.kill(proc.pid, signal.SIGCONT)
        assert b.wait_settled(5) is True
        assert not b.info(0).unsettled
        # cancel() ends a task in flight at once, too
        stop(proc)
        b.submit_read(seg, [local], [remote], MIB)
        time.sleep(0.05)
        t0 = time.monotonic()
        b.cancel()
        assert b.wait(2)
        assert time.monotonic() - t0 < 0.1
        i = b.info(1)
        assert (i.state, i.ended_early) == (libte.TaskState.CANCELED, True)


def test_mooncake_deadlines(monkeypatch):
    """MC_SLICE_TIMEOUT=1 is the deadline of what libte.mooncake submits: an
    async write to a stopped peer reads -2 once a second passed, and its
    batch is freed; a synchronous read returns -1 after a second (not after
    MC_TRANSFER_TIMEOUT's 5)."""
    from libte.mooncake import TransferEngine

    monkeypatch.setenv("MC_SLICE_TIMEOUT", "1")
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "5")
    proc, info = start_peer()
    te = TransferEngine()
    try:
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        local = libte.Memory(MIB)
        assert te.register_memory(local.address, MIB) == 0
        assert te.transfer_sync_read(info["name"], local.address, info["addr"], 4096) == 0
        assert bytes(memoryview(local)[:4096]) == pattern(MIB, 21)[:4096]
        stop(proc)
        t0 = time.monotonic()
        bid = te.transfer_submit_write(info["name"], local.address, info["addr"], 4096)
        assert bid != 0 and te.transfer_check_status(bid) == 0
        t1 = time.monotonic()
        assert te.transfer_sync_read(info["name"], local.address, info["addr"], MIB) == -1
        took = time.monotonic() - t1
        assert 0.95 < took < 1.1, f"returned after {took:.3f} s"
        while (rc := te.transfer_check_status(bid)) == 0 and time.monotonic() - t0 < 3:
            time.sleep(0.005)
        assert rc == -2 and time.monotonic() - t0 < 1.15
        assert te.transfer_check_status(bid) == -1  # freed: unknown now
    finally:
        te.close()
        end_peer(proc)
