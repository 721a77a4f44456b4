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
import threading
import time

import pytest

import libte
from conftest import MIB, pattern

HERE = os.path.dirname(os.path.abspath(__file__))

# How late past its deadline a call may return: a few ms promised, more
# under a sanitizer, which slows libte's threads down.
SLACK = 0.15 if "libasan" in os.environ.get("LD_PRELOAD", "") else 0.05


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


def test_past_deadline_fails_what_is_in_flight(holddl):
    """A deadline already passed ends every task still in flight at once:
    FAILED, -ETIMEDOUT, ended early; the writes unsettled (their bytes may
    have left), the reads not; and no byte moves when the peer answers."""
    h = holddl
    h.abuf[:] = pattern(MIB, 3)
    h.bbuf[:] = pattern(MIB, 4)
    t0 = time.monotonic()
    with h.a.batch(8) as b:
        b.submit_read(h.seg, [h.aaddr + i * 4096 for i in range(4)], [h.baddr + i * 4096 for i in range(4)], 4096,
                      deadline=1)
        b.submit_write(h.seg, [h.aaddr + (8 + i) * 4096 for i in range(4)],
                       [h.baddr + (8 + i) * 4096 for i in range(4)], 4096, deadline=1)
        assert b.wait(2) and time.monotonic() - t0 < 0.5  # at once, give or take a loaded machine
        assert h.count() == 8 and h.expired() == 8  # still held by the transport
        for n in range(8):
            i = b.info(n)
            assert (i.state, i.error, i.ended_early, i.deadline_ns) == (libte.TaskState.FAILED, -errno.ETIMEDOUT,
                                                                         True, 1)
            assert i.unsettled == (n >= 4)
        assert b.wait_settled(0.05) is False
        assert h.release(0) == 8
        assert b.wait_settled(5) and not any(b.info(n).unsettled for n in range(8))
    assert h.abuf == pattern(MIB, 3) and h.bbuf == pattern(MIB, 4)


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


class Peer:
    """A peer that stops answering: `stop()` and `go_on()`. Over TCP a peer
    process stopped with SIGSTOP; over 'holddl' the test transport, whose
    transfers stay held (in flight, bytes unmoved) until go_on()."""

    def __init__(self, kind, holddl=None):
        self.kind, self.h, self.proc = kind, holddl, None
        if kind == "holddl":
            self.e, self.seg, self.remote, self.local = holddl.a, holddl.seg, holddl.baddr, holddl.abuf
            holddl.bbuf[:] = pattern(MIB, 21)
            return
        self.proc, info = start_peer()
        self.e = libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports="tcp", address="127.0.0.1")
        self.local = bytearray(MIB)
        self.e.register(self.local)
        self.seg = self.e.open_segment(info["name"])
        self.remote = info["addr"]
        self.e.read(self.seg, self.local, self.remote, timeout=5)  # connected, and it serves
        assert self.local == pattern(MIB, 21)

    def stop(self):
        if self.proc is not None:
            stop(self.proc)

    def go_on(self):
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGCONT)
        else:
            self.h.release(0)  # ended transfers complete without moving a byte

    def read_again(self):
        """A read that completes, now that the peer answers again."""
        if self.proc is not None:
            self.e.read(self.seg, self.local, self.remote, timeout=5)
            return
        t = threading.Thread(target=self.e.read, args=(self.seg, self.local, self.remote), daemon=True)
        t.start()
        while self.h.count() == 0:
            time.sleep(0.001)
        self.h.release(0)
        t.join(5)
        assert not t.is_alive()

    def close(self):
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.e.close()
            end_peer(self.proc)


@pytest.fixture(params=["holddl", "tcp"])
def peer(request):
    p = Peer(request.param, request.getfixturevalue("holddl") if request.param == "holddl" else None)
    try:
        yield p
    finally:
        p.close()


def test_sync_timeout_to_a_stopped_peer(peer):
    """read(timeout=0.2) of 1 MiB from a peer that stopped answering raises
    TimeoutError by the deadline (plus a few ms), and no byte lands in the
    buffer after it returned, even once the peer goes on and answers."""
    before = pattern(MIB, 22)
    peer.local[:] = before
    peer.stop()
    for _ in range(2):  # the second call finds the peer still stopped
        t0 = time.monotonic()
        with pytest.raises(libte.TimeoutError):
            peer.e.read(peer.seg, peer.local, peer.remote, timeout=0.2)
        took = time.monotonic() - t0
        assert 0.19 < took < 0.2 + SLACK, f"read(timeout=0.2) returned after {took:.3f} s"
    peer.go_on()
    time.sleep(0.3)  # the peer answers the reads it had queued
    assert peer.local == before
    peer.read_again()  # and it serves again
    assert peer.local == pattern(MIB, 21)


def test_batch_deadline_to_a_stopped_peer(peer):
    """A write with a deadline to a stopped peer ends FAILED -ETIMEDOUT at it;
    if its bytes had left it is unsettled until the peer, gone on, can no
    longer apply them, and wait_settled() waits for that. cancel() ends a
    task in flight at once."""
    peer.stop()
    with peer.e.batch(2) as b:
        t0 = time.monotonic()
        b.submit_write(peer.seg, [peer.local], [peer.remote], MIB, deadline=libte.now_ns() + 150_000_000)
        assert b.wait(2)
        took = time.monotonic() - t0
        assert 0.14 < took < 0.15 + SLACK, f"ended after {took:.3f} s"
        i = b.info(0)
        assert (i.state, i.error, i.ended_early) == (libte.TaskState.FAILED, -errno.ETIMEDOUT, True)
        if peer.kind == "holddl":
            assert i.unsettled  # holddl's held WRITE may have left
        if i.unsettled:
            assert b.wait_settled(0.1) is False  # the peer is still stopped
        b.submit_read(peer.seg, [peer.local], [peer.remote], MIB)
        time.sleep(0.05)
        t0 = time.monotonic()
        b.cancel()
        assert b.wait(2)
        assert time.monotonic() - t0 < 0.1
        i = b.info(1)
        assert (i.state, i.ended_early, i.unsettled) == (libte.TaskState.CANCELED, True, False)
        peer.go_on()
        assert b.wait_settled(5) is True
        assert not b.info(0).unsettled


@pytest.mark.parametrize("kind", ["holddl", "tcp"])
def test_mooncake_deadlines(monkeypatch, request, kind):
    """MC_SLICE_TIMEOUT=1 is the deadline of what libte.mooncake submits: an
    async write to a peer that stopped answering reads -2 once a second
    passed, and its batch is freed; a synchronous read returns -1 after a
    second (not after MC_TRANSFER_TIMEOUT's 5)."""
    from libte.mooncake import TransferEngine

    monkeypatch.setenv("MC_SLICE_TIMEOUT", "1")
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "5")
    te, local, proc, h = TransferEngine(), libte.Memory(MIB), None, None
    target = None
    try:
        if kind == "holddl":
            h = request.getfixturevalue("holddl")
            assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "holddl", "") == 0
            target, remote = h.b.name, h.baddr
        else:
            proc, info = start_peer()
            assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
            target, remote = info["name"], info["addr"]
        assert te.register_memory(local.address, MIB) == 0
        if proc is not None:
            assert te.transfer_sync_read(target, local.address, remote, 4096) == 0
            assert bytes(memoryview(local)[:4096]) == pattern(MIB, 21)[:4096]
            stop(proc)
        t0 = time.monotonic()
        bid = te.transfer_submit_write(target, local.address, remote, 4096)
        assert bid != 0 and te.transfer_check_status(bid) == 0
        t1 = time.monotonic()
        assert te.transfer_sync_read(target, local.address, remote, MIB) == -1
        took = time.monotonic() - t1
        assert 0.95 < took < 1 + SLACK, f"returned after {took:.3f} s"
        while (rc := te.transfer_check_status(bid)) == 0 and time.monotonic() - t0 < 3:
            time.sleep(0.005)
        assert rc == -2 and time.monotonic() - t0 < 1 + SLACK
        assert te.transfer_check_status(bid) == -1  # freed: unknown now
    finally:
        if h is not None:
            h.release(0)
        if proc is not None:
            # the engine's close waits for what its transport still holds
            # of the ended tasks: the peer's answers, once it goes on
            os.kill(proc.pid, signal.SIGCONT)
        te.close()
        if proc is not None:
            end_peer(proc)
