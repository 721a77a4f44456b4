# SPDX-License-Identifier: Apache-2.0
"""Threads: the GIL is released while libte works, and memory in use stays alive."""
import threading
import time

import pytest

import libte
from conftest import MIB, pattern


def test_threads_transfer_at_once(pair):
    a, seg = pair.a, pair.seg
    nthreads, per, bs = 8, 32, 4096
    pair.abuf[: nthreads * per * bs] = pattern(nthreads * per * bs, 7)
    errors = []

    def worker(t):
        try:
            base = t * per * bs
            locs = [pair.aaddr + base + i * bs for i in range(per)]
            rems = [pair.baddr + base + i * bs for i in range(per)]
            for _ in range(20):
                a.write_many(seg, locs, rems, bs)
                b = a.batch(per)
                b.submit_read(seg, locs, rems, bs)
                assert b.wait(30)
                b.check()
                b.free()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert pair.bbuf[: nthreads * per * bs] == pair.abuf[: nthreads * per * bs]


def test_gil_released_while_waiting(hold):
    """A thread blocked in wait() must not stop the others."""
    a, seg = hold.a, hold.seg
    b = a.batch(1)
    b.submit_write(seg, [hold.aaddr], [hold.baddr], 16)
    done = threading.Event()

    def waiter():
        assert b.wait()  # blocks until the main thread releases the transfer
        done.set()

    th = threading.Thread(target=waiter)
    th.start()
    # pure-Python work while the other thread sits in libte
    t0 = time.monotonic()
    n = sum(i * i for i in range(200000))
    assert n > 0 and time.monotonic() - t0 < 5
    assert not done.is_set()
    assert hold.count() == 1
    hold.release(0)
    th.join(5)
    assert done.is_set()
    b.free()


def test_unregister_waits_for_local_batches(hold):
    """Unregistering memory a batch still writes into waits for that batch."""
    a, seg = hold.a, hold.seg
    buf = bytearray(4096)
    addr = a.register(buf)
    hold.bbuf[:5] = b"hello"
    b = a.batch(1)
    b.submit_read(seg, [addr], [hold.baddr], 5)
    finished = threading.Event()

    def unreg():
        a.unregister(buf)
        finished.set()

    th = threading.Thread(target=unreg)
    th.start()
    time.sleep(0.3)
    assert not finished.is_set()  # the read into buf is still in flight
    with pytest.raises(BufferError):
        buf.extend(b"x")  # and buf is still held
    hold.release(0)
    th.join(5)
    assert finished.is_set()
    assert bytes(buf[:5]) == b"hello"
    buf.extend(b"x")  # released once unregistered
    b.free()


def test_close_wakes_waiters(hold):
    """close() from another thread ends a wait with ClosedError rather than hanging."""
    a, seg = hold.a, hold.seg
    b = a.batch(1)
    b.submit_write(seg, [hold.aaddr], [hold.baddr], 16)
    raised = []

    def waiter():
        try:
            b.wait()
        except libte.ClosedError as e:
            raised.append(e)

    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.2)
    closer = threading.Thread(target=a.close)
    closer.start()
    time.sleep(0.3)
    hold.release(0)  # the canceled transfer ends, the engine can go
    closer.join(10)
    th.join(10)
    assert not closer.is_alive() and not th.is_alive()
    assert len(raised) == 1
    assert a.closed


def test_peer_reads_while_target_unregisters(pair):
    """A target unregistering memory a peer reads: no crash, and the memory is
    released only once libte lets go of it."""
    a, b, seg = pair.a, pair.b, pair.seg
    big = bytearray(64 * MIB)
    baddr = b.register(big)
    seg.refresh()
    local = bytearray(64 * MIB)
    laddr = a.register(local)
    outcome = []

    def reader():
        try:
            a.read_many(seg, [laddr + i * MIB for i in range(64)], [baddr + i * MIB for i in range(64)], MIB)
            outcome.append("completed")
        except libte.Error as e:
            outcome.append(type(e).__name__)

    th = threading.Thread(target=reader)
    th.start()
    time.sleep(0.01)
    b.unregister(big)
    big.extend(b"x")  # the buffer is ours again, and libte no longer reads it
    th.join(30)
    assert outcome and outcome[0] in ("completed", "TransferError", "AddressError")
    # the pair still works afterwards
    a.write(seg, pair.aaddr, pair.baddr, 4096)
