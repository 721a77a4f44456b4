# SPDX-License-Identifier: Apache-2.0
"""The native API: engines, registration, segments, transfers, batches, notifications."""
import array
import mmap
import time

import numpy as np
import pytest

import libte
from conftest import MIB, pattern


def test_module_basics():
    assert libte.version() == libte.__version__
    assert libte.version().count(".") == 2
    assert libte.strerror(libte.ERROR_CODES["SEGMENT"]) != libte.strerror(libte.ERROR_CODES["BATCH"])
    names = {p.name for p in libte.plugins() if p.loaded}
    assert "tcp" in names
    tcp = [p for p in libte.plugins() if p.name == "tcp"][0]
    assert tcp.kind == "transport" and tcp.abi[0] == libte.ABI_MAJOR and tcp.reason is None
    assert "TCP" in libte.plugin_report("tcp")
    assert libte.segment_key("node1") == "mooncake/ram/node1"
    assert libte.segment_key("nvmeof/disk0") == "mooncake/nvmeof/disk0"
    old = libte.get_log_level()
    libte.set_log_level("debug")
    assert libte.get_log_level() == 3
    libte.set_log_level(old)
    with pytest.raises(ValueError):
        libte.set_log_level("loud")
    with pytest.raises(ValueError):
        libte.set_log_level(9)
    assert issubclass(libte.InvalidArgumentError, ValueError)
    assert issubclass(libte.TimeoutError, TimeoutError)
    assert issubclass(libte.AddressError, libte.Error)
    assert libte.TaskState.COMPLETED == 4 and libte.Opcode.WRITE == libte.WRITE == 1



def test_error_classes():
    """Every subclass of libte.Error, with the builtin exception it also
    derives from, and the class a code raises as."""
    want = {
        "ClosedError": ValueError, "TransferError": None, "InvalidArgumentError": ValueError,
        "TimeoutError": TimeoutError, "BusyError": None, "NotFoundError": LookupError,
        "ConnectionError": ConnectionError, "NotSupportedError": NotImplementedError,
        "PluginError": None, "NoTransportError": None, "MetadataError": None, "ProtocolError": None,
        "RejectedError": None, "BatchFullError": None, "AddressError": None, "OverlapError": None,
        "SegmentError": None, "BatchError": None, "AuthError": None,
    }
    assert libte.Error.__bases__ == (Exception,)
    for name, builtin in want.items():
        cls = getattr(libte._native, name)
        assert cls.__name__ == name and cls.__module__ == "libte" and cls.__doc__, name
        assert cls.__bases__ == ((libte.Error, builtin) if builtin else (libte.Error,)), name
    with pytest.raises(libte.InvalidArgumentError) as ei:
        libte.segment_key("n" * 2000)  # -ENAMETOOLONG
    assert ei.value.code == -36
    with libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports="tcp") as e:
        with pytest.raises(libte.AddressError):
            e.unregister(4096)
        with pytest.raises(libte.NotFoundError):
            e.uninstall("none")

def test_engine_lifecycle():
    with libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports=["tcp"]) as e:
        assert e.name == f"127.0.0.1:{e.rpc_port}"
        assert e.address == "127.0.0.1"
        assert e.transports == ["tcp"]
        assert not e.closed
        assert repr(e) == f"<libte.Engine {e.name}>"
        assert '"tcp_data_port"' in e.descriptor()
        e.uninstall("tcp")
        assert e.transports == []
        e.install("tcp")
        with pytest.raises(libte.Error) as ei:
            e.install("tcp")
        assert ei.value.code == -17  # -EEXIST
    assert e.closed
    with pytest.raises(libte.ClosedError):
        e.name
    with pytest.raises(libte.ClosedError):
        e.register(bytearray(10))
    e.close()  # idempotent
    assert repr(e) == "<libte.Engine closed>"


def test_engine_bad_arguments():
    with pytest.raises(libte.InvalidArgumentError) as ei:
        libte.Engine("")
    assert "metadata" in str(ei.value) and ei.value.detail
    with pytest.raises(libte.Error):
        libte.Engine("zookeeper://h:1", "127.0.0.1")
    with pytest.raises(libte.InvalidArgumentError):
        libte.Engine("P2PHANDSHAKE", "a/b")
    with pytest.raises(libte.NotFoundError):
        libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports="no-such-transport")
    with pytest.raises(TypeError):
        libte.Engine(42)
    with pytest.raises(TypeError):
        libte.Engine("P2PHANDSHAKE", "127.0.0.1", options=["x"])
    with pytest.raises(TypeError):
        libte.Engine("P2PHANDSHAKE", "127.0.0.1", options={1: "x"})
    # engine options pass through to plugins
    with libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports="tcp",
                      options={"TE_TCP_CONNS_PER_PEER": 3}, rpc_port=0) as e:
        assert e.rpc_port > 0


def test_register_kinds(pair):
    e = pair.a
    objs = [bytearray(8192), memoryview(bytearray(8192)), mmap.mmap(-1, 8192),
            np.zeros(1024, dtype=np.uint64), array.array("Q", [0] * 1024), libte.Memory(8192)]
    addrs = [e.register(o) for o in objs]
    assert addrs[0] == libte.buffer_address(objs[0])
    assert addrs[5] == objs[5].address
    bufs = {b.addr: b.length for b in e.local_buffers()}
    for a in addrs:
        assert bufs[a] == 8192
    # the object cannot be resized or unmapped while registered
    with pytest.raises(BufferError):
        objs[0].extend(b"x")
    with pytest.raises(BufferError):
        objs[5].close()
    for o in objs:
        e.unregister(o)
    objs[0].extend(b"x")
    objs[5].close()
    assert objs[5].closed
    # read-only memory can never be written by a peer: refused
    with pytest.raises(BufferError):
        e.register(b"immutable bytes")
    with pytest.raises(TypeError):
        e.register(12345)  # an address needs a length
    with pytest.raises(libte.OverlapError):
        e.register(pair.abuf)  # already registered by the fixture
    with pytest.raises(libte.AddressError):
        e.unregister(bytearray(10))
    # several at once, all or nothing
    x, y = bytearray(4096), bytearray(4096)
    got = e.register_many([x, y], remote=False)
    assert got == [libte.buffer_address(x), libte.buffer_address(y)]
    with pytest.raises(libte.OverlapError):
        e.register_many([bytearray(4096), x])
    e.unregister_many([x, y])
    # a raw address (how tensors are handed over): the memory is the caller's to keep
    m = libte.Memory(4096)
    assert e.register(m.address, 4096) == m.address
    e.unregister(m.address)
    m.close()


def test_transfers_every_byte(pair):
    a, seg, abuf, bbuf = pair.a, pair.seg, pair.abuf, pair.bbuf
    (buf,) = seg.buffers()
    assert (buf.addr, buf.length) == (pair.baddr, 4 * MIB) and isinstance(buf, libte.SegmentBuffer)
    for i, n in enumerate([1, 7, 4095, 4096, 65536 + 7, MIB, 4 * MIB - 13]):
        data = pattern(n, i)
        off = (i * 13) % 17
        abuf[off:off + n] = data
        bbuf[:] = bytes(len(bbuf))
        dst = (i * 7) % 11
        a.write(seg, pair.aaddr + off, pair.baddr + dst, n)
        assert bbuf[dst:dst + n] == data
        assert bbuf[:dst] == bytes(dst)
        abuf[:] = bytes(len(abuf))
        a.read(seg, memoryview(abuf)[5:5 + n], pair.baddr + dst)  # length from the view
        assert abuf[5:5 + n] == data


def test_many_and_columns(pair):
    a, seg = pair.a, pair.seg
    n, bs = 256, 4096
    pair.abuf[: n * bs] = pattern(n * bs, 42)
    locs = [pair.aaddr + i * bs for i in range(n)]
    rems = [pair.baddr + (n - 1 - i) * bs for i in range(n)]
    a.write_many(seg, locs, rems, bs)
    for i in range(n):
        assert pair.bbuf[(n - 1 - i) * bs:(n - i) * bs] == pair.abuf[i * bs:(i + 1) * bs]
    # arrays of uint64 are read without a Python object per element
    pair.abuf[:] = bytes(len(pair.abuf))
    a.read_many(seg, np.array(locs, dtype=np.uint64), array.array("Q", rems), np.full(n, bs, dtype=np.uint64))
    for i in range(n):
        assert pair.bbuf[(n - 1 - i) * bs:(n - i) * bs] == pair.abuf[i * bs:(i + 1) * bs]
    with pytest.raises(ValueError):
        a.read_many(seg, locs, rems[:-1], bs)
    with pytest.raises(TypeError):
        a.read_many(seg, bytearray(16), rems, bs)  # bytes are not addresses
    with pytest.raises(TypeError):
        a.read_many(seg, np.zeros(4, dtype=np.uint32), rems[:4], bs)
    a.read_many(seg, [], [], 0)  # nothing to do
    # generic requests
    reqs = [libte.Request.write(seg, pair.aaddr, pair.baddr, 100),
            libte.Request.read(seg, memoryview(pair.abuf)[200:300], pair.baddr + 1000),
            (libte.WRITE, seg.id, pair.aaddr + 500, pair.baddr + 2000, 10)]
    a.transfer(reqs)
    assert pair.bbuf[:100] == pair.abuf[:100]
    assert pair.abuf[200:300] == pair.bbuf[1000:1100]
    with pytest.raises(ValueError):
        a.transfer([(libte.READ, seg, pair.aaddr, pair.baddr)])
    with pytest.raises(ValueError):
        a.transfer([(7, seg, pair.aaddr, pair.baddr, 1)])


def test_bad_requests(pair):
    a, seg = pair.a, pair.seg
    with pytest.raises(libte.AddressError) as ei:
        a.write(seg, bytearray(64), pair.baddr)  # not registered
    assert ei.value.task == 0 and ei.value.statuses[0].state == libte.TaskState.INVALID
    assert "registered" in ei.value.detail
    with pytest.raises(libte.AddressError):
        a.read(seg, pair.aaddr, pair.baddr + 4 * MIB - 10, 11)  # beyond the peer's buffer
    with pytest.raises(libte.SegmentError):
        a.read(999, pair.aaddr, pair.baddr, 10)
    with pytest.raises(ValueError):
        a.read(seg, memoryview(pair.abuf)[:10], pair.baddr, 11)  # longer than the buffer
    with pytest.raises(TypeError):
        a.read(seg, 1.5, pair.baddr, 10)
    with pytest.raises(TypeError):
        a.read("segment", pair.aaddr, pair.baddr, 10)
    with pytest.raises(OverflowError):
        a.read(seg, -1, pair.baddr, 10)
    with pytest.raises(ValueError):
        a.read(seg, pair.aaddr, pair.baddr, 10, timeout=-1)
    # one bad request among good ones: the good ones still move
    pair.abuf[:10] = b"0123456789"
    with pytest.raises(libte.AddressError) as ei:
        a.write_many(seg, [pair.aaddr, 12345], [pair.baddr, pair.baddr], [10, 10])
    assert ei.value.task == 1
    assert ei.value.statuses[0].state == libte.TaskState.COMPLETED
    assert pair.bbuf[:10] == b"0123456789"
    # closed segment handles are refused before anything moves
    s2 = a.open_segment(pair.b.name)
    assert s2.id == seg.id
    s2.close()
    with pytest.raises(libte.SegmentError):
        a.read(s2, pair.aaddr, pair.baddr, 10)
    a.read(seg, pair.aaddr, pair.baddr, 10)  # the other handle still holds it open
    with pytest.raises(libte.ConnectionError):
        a.open_segment("127.0.0.1:1")
    with pytest.raises(libte.InvalidArgumentError):
        a.open_segment("no-port")


def test_batches(pair):
    a, seg = pair.a, pair.seg
    b = a.batch(4)
    assert b.capacity == 4 and len(b) == 0 and not b.freed
    assert b.submit([libte.Request.write(seg, pair.aaddr, pair.baddr, 4096)]) == 0
    assert b.submit_read(seg, [pair.aaddr + 8192], [pair.baddr], 4096) == 0
    assert b.wait(10)
    b.check()
    assert len(b) == b.submitted == 2 and b.in_flight == 0
    assert b.state == libte.TaskState.COMPLETED
    st = b.status(1)
    assert st.state == libte.TaskState.COMPLETED and st.transferred == 4096 and st.error == 0
    assert [s.state for s in b.statuses()] == [4, 4]
    with pytest.raises(IndexError):
        b.status(2)
    with pytest.raises(libte.BatchFullError):
        b.submit([libte.Request.write(seg, pair.aaddr, pair.baddr, 1)] * 3)
    assert b.submit([libte.Request.write(seg, 77, pair.baddr, 1)]) == 1  # INVALID
    b.wait()
    with pytest.raises(libte.AddressError):
        b.check()
    assert b.state == libte.TaskState.INVALID
    b.free()
    assert b.freed
    b.free()  # again: nothing happens
    with pytest.raises(libte.BatchError):
        b.submit([])
    with pytest.raises(libte.BatchError):
        b.status(0)
    # a context manager waits and frees
    with a.batch(128) as b2:
        b2.submit_write(seg, [pair.aaddr + i * 4096 for i in range(128)],
                        [pair.baddr + i * 4096 for i in range(128)], 4096)
    assert b2.freed
    with pytest.raises(ValueError):
        a.batch(0)
    # libte refuses the capacity: the Batch made for it goes without a batch to free
    with pytest.raises(libte.InvalidArgumentError, match=r"^batch\(1099511627776\): "):
        a.batch(1 << 40)
    with a.batch(1) as b3:
        assert len(b3) == 0 and not b3.freed


def test_in_flight_free_cancel_timeout(hold):
    a, seg = hold.a, hold.seg
    b = a.batch(8)
    b.submit_write(seg, [hold.aaddr], [hold.baddr], 64)
    assert b.in_flight == 1 and b.state == libte.TaskState.WAITING
    assert hold.count() == 1
    with pytest.raises(libte.BusyError):
        b.free()
    with pytest.raises(libte.BusyError):
        b.check()
    t0 = time.monotonic()
    assert b.wait(0.2) is False
    assert 0.15 < time.monotonic() - t0 < 5
    b.cancel()
    hold.release(0)
    assert b.wait(5)
    assert b.status(0).state == libte.TaskState.CANCELED
    with pytest.raises(libte.TransferError):
        b.check()
    b.free()
    # a synchronous call that times out is canceled, and returns once settled
    import threading
    threading.Timer(0.5, hold.release, args=(0,)).start()
    with pytest.raises(libte.TimeoutError):
        a.write(seg, hold.aaddr, hold.baddr, 10, timeout=0.1)
    # failures carry the task's error
    threading.Timer(0.2, hold.release, args=(-5,)).start()  # -EIO
    with pytest.raises(libte.TransferError) as ei:
        a.read(seg, hold.aaddr, hold.baddr, 10)
    assert ei.value.code == -5 and ei.value.statuses[0].state == libte.TaskState.FAILED


def test_batch_dropped_with_tasks_in_flight(hold):
    a, seg = hold.a, hold.seg
    hold.abuf[:4] = b"abcd"
    b = a.batch(1)
    b.submit_write(seg, [hold.aaddr], [hold.baddr], 4)
    import threading
    threading.Timer(0.3, hold.release, args=(0,)).start()
    t0 = time.monotonic()
    del b  # waits for the task before freeing: it still uses registered memory
    assert time.monotonic() - t0 > 0.2
    assert hold.bbuf[:4] == b"abcd"


def test_notifications(pair):
    a, b, seg = pair.a, pair.b, pair.seg
    a.notify(seg, "hello")
    a.notify(seg.id, "named", sender="agent-1")
    got = b.notifications()
    assert got == [(a.name, "hello"), ("agent-1", "named")]
    assert isinstance(got[0], libte.Notification) and got[1].name == "agent-1" and got[1].msg == "named"
    assert b.notifications() == []
    with a.batch(2) as bt:
        bt.submit_write(seg, [pair.aaddr], [pair.baddr], 4096)
        bt.notify(seg, "batch done", sender="agent-2")
    deadline = time.monotonic() + 5
    got = []
    while not got and time.monotonic() < deadline:
        got = b.notifications()
        time.sleep(0.01)
    assert got == [("agent-2", "batch done")]
    with pytest.raises(libte.InvalidArgumentError):
        a.notify(seg, "x" * (libte.NOTIFY_MAX + 1))
    with pytest.raises(libte.SegmentError) as ei:
        a.notify(12345, "nobody")
    assert str(ei.value).startswith("notify(): ")
    bt = a.batch(1)
    with pytest.raises(libte.SegmentError) as ei:
        bt.notify(12345, "nobody")
    assert str(ei.value).startswith("Batch.notify(): ")
    with pytest.raises(TypeError):
        bt.notify(seg, "x", "positional sender")
    bt.free()
    with pytest.raises(libte.BatchError, match="was freed"):
        bt.notify(seg, "freed")
    assert b.notifications() == []


def test_context_managers(pair):
    # leaving a block closes the object and lets the block's exception through
    with pytest.raises(KeyError):
        with libte.Memory(4096) as m:
            raise KeyError("in the block")
    assert m.closed
    with pytest.raises(KeyError):
        with pair.a.open_segment(pair.b.name) as s:
            raise KeyError("in the block")
    assert s.closed
    with pytest.raises(KeyError):
        with libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports="tcp") as e:
            raise KeyError("in the block")
    assert e.closed
    # a close() that fails fails the block's end
    m = libte.Memory(4096)
    with pytest.raises(BufferError):
        with m:
            view = memoryview(m)
    assert not m.closed
    view.release()
    assert m.__exit__(None, None, None) is False
    assert m.closed


def test_segments_and_probe(pair):
    a, b = pair.a, pair.b
    a.probe(b.name, timeout=2)
    with pytest.raises(libte.ConnectionError):
        a.probe("127.0.0.1:1", timeout=1)
    assert pair.seg.name == b.name and int(pair.seg) == pair.seg.id and pair.seg.engine is a
    assert '"buffers"' in pair.seg.descriptor()
    more = bytearray(8192)
    b.register(more)
    assert len(pair.seg.buffers()) == 1
    assert a.refresh_segments() == 1
    assert len(pair.seg.buffers()) == 2
    b.unregister(more)
    pair.seg.refresh()
    assert len(pair.seg.buffers()) == 1
    with a.open_segment(b.name, transport="tcp") as s:
        assert s.id == pair.seg.id
    assert s.closed
    with pytest.raises(libte.SegmentError):
        s.buffers()


def test_local_bytes(pair):
    a = pair.a
    a.write_bytes(pair.aaddr + 10, b"abc")
    assert pair.abuf[10:13] == b"abc"
    assert a.read_bytes(pair.aaddr + 10, 3) == b"abc"
    with pytest.raises(libte.AddressError):
        a.write_bytes(12345, b"x")  # never a crash
    with pytest.raises(libte.AddressError):
        a.read_bytes(pair.aaddr + 4 * MIB - 1, 2)  # runs past the registration
    with pytest.raises(ValueError):
        a.read_bytes(pair.aaddr, -1)


def test_engine_close_with_live_objects(pair):
    a = pair.a
    b = a.batch(2)
    seg = pair.seg
    a.close()
    with pytest.raises(libte.ClosedError):
        b.submit([])
    with pytest.raises(libte.ClosedError):
        seg.buffers()
    b.free()  # the engine freed it already: nothing to do
    seg.close()
    # the buffers it held are released
    pair.abuf.extend(b"x")


def test_auth_key_mismatch_raises_auth_error(tmp_path):
    """A peer with the cluster key refuses an engine without it: AuthError, at once."""
    key = tmp_path / "key"
    key.write_text("0123456789abcdef0123456789abcdef\n")
    key.chmod(0o600)
    with libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports="tcp",
                      options={"auth_key_file": str(key)}) as target, \
         libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports="tcp") as stranger, \
         libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports="tcp",
                      options={"auth_key_file": str(key)}) as member:
        buf = bytearray(4096)
        remote = target.register(buf)
        t0 = time.monotonic()
        with pytest.raises(libte.AuthError) as err:
            stranger.open_segment(target.name)
        assert err.value.code == libte.ERROR_CODES["AUTH"] and time.monotonic() - t0 < 2
        mine = bytearray(b"x" * 4096)
        member.register(mine, remote=False)
        with member.open_segment(target.name) as seg:
            member.write(seg, mine, remote)
        assert bytes(buf) == bytes(mine)
