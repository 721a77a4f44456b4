# SPDX-License-Identifier: Apache-2.0
"""libte.mooncake.TransferEngine used the way serving frameworks use Mooncake's class."""
import ctypes
import json
import os
import socket
import threading
import time

import numpy as np
import pytest

import libte
from libte.mooncake import TransferEngine, TransferNotify, TransferOpcode
from conftest import free_port

BLOCK = 64 * 1024
BLOCKS = 64


def kv_cache(seed):
    """A KV cache of BLOCKS blocks, as a numpy array (what frameworks hand over)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=BLOCKS * BLOCK, dtype=np.uint8)


@pytest.fixture
def prefill_decode():
    """Two engines set up like a prefill and a decode worker."""
    p, d = TransferEngine(), TransferEngine()
    assert p.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert d.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0  # no NIC here: TCP, as Mooncake
    pkv, dkv = kv_cache(1), np.zeros(BLOCKS * BLOCK, dtype=np.uint8)
    assert p.register_memory(pkv.ctypes.data, pkv.nbytes) == 0
    assert d.register_memory(dkv.ctypes.data, dkv.nbytes) == 0
    yield p, d, pkv, dkv
    p.close()
    d.close()


def session(engine):
    return f"127.0.0.1:{engine.get_rpc_port()}"


def test_opcodes_and_flags():
    assert TransferOpcode.Read == 0 and TransferOpcode.Write == 1
    assert TransferEngine.TransferOpcode is TransferOpcode
    import libte.mooncake as mc
    assert mc.Read is TransferOpcode.Read and mc.SUPPORT_CUDA is False
    assert mc.SUPPORT_MUSA is False  # Mooncake's module has the flag too
    n = TransferNotify("a", "b")
    assert (n.name, n.msg) == ("a", "b") and n == TransferNotify("a", "b")


def test_prefill_to_decode(prefill_decode):
    p, d, pkv, dkv = prefill_decode
    target = session(d)
    remote = p.get_first_buffer_address(target)
    assert remote == dkv.ctypes.data  # the address exchange frameworks do
    src = pkv.ctypes.data
    # one block, then every block in one batch (write), then read some back
    assert p.transfer_sync_write(target, src, remote, BLOCK) == 0
    assert np.array_equal(dkv[:BLOCK], pkv[:BLOCK])
    order = list(reversed(range(BLOCKS)))  # scattered, as KV blocks are
    assert p.batch_transfer_sync_write(target, [src + i * BLOCK for i in range(BLOCKS)],
                                       [remote + j * BLOCK for j in order], [BLOCK] * BLOCKS) == 0
    for i, j in enumerate(order):
        assert np.array_equal(dkv[j * BLOCK:(j + 1) * BLOCK], pkv[i * BLOCK:(i + 1) * BLOCK])
    back = np.zeros_like(pkv)
    assert p.register_memory(back.ctypes.data, back.nbytes) == 0
    assert p.batch_transfer_sync_read(target, [back.ctypes.data + i * BLOCK for i in range(8)],
                                      [remote + i * BLOCK for i in range(8)], [BLOCK] * 8) == 0
    assert np.array_equal(back[:8 * BLOCK], dkv[:8 * BLOCK])
    assert p.transfer_sync_read(target, back.ctypes.data, remote, 100) == 0
    assert p.unregister_memory(back.ctypes.data) == 0


def test_async_and_polling(prefill_decode):
    p, d, pkv, dkv = prefill_decode
    target, remote, src = session(d), d.get_first_buffer_address(session(d)), pkv.ctypes.data
    half = BLOCKS // 2
    ids = [p.batch_transfer_async_write(target, [src + i * BLOCK for i in range(k, k + half)],
                                        [remote + i * BLOCK for i in range(k, k + half)], [BLOCK] * half)
           for k in (0, half)]
    assert all(i > 0 for i in ids)
    assert p.get_batch_transfer_status(ids) == 0
    assert np.array_equal(dkv, pkv)
    # the ids are freed: asking again is an error, not a crash
    assert p.get_batch_transfer_status(ids) == -1
    dkv[:] = 0
    bid = p.transfer_submit_write(target, src, remote, BLOCK)
    assert bid > 0
    deadline = time.monotonic() + 10
    while (rc := p.transfer_check_status(bid)) == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert rc == 1
    assert np.array_equal(dkv[:BLOCK], pkv[:BLOCK])
    assert p.transfer_check_status(bid) == -1  # freed by the completed check
    bid = p.batch_transfer_async(target, [src], [remote], [BLOCK], TransferOpcode.Read)
    assert p.get_batch_transfer_status([bid]) == 0
    # an async batch with a request outside the peer's memory fails
    bad = p.batch_transfer_async_write(target, [src], [remote + BLOCKS * BLOCK], [BLOCK])
    assert bad == 0


def test_notify_and_threads(prefill_decode):
    p, d, pkv, dkv = prefill_decode
    target, remote, src = session(d), d.get_first_buffer_address(session(d)), pkv.ctypes.data
    assert p.transfer_sync(target, src, remote, BLOCK, TransferOpcode.Write,
                           TransferNotify("prefill-0", "req-17 done")) == 0
    deadline = time.monotonic() + 5
    got = []
    while not got and time.monotonic() < deadline:
        got = d.get_notifies()
        time.sleep(0.01)
    assert [(n.name, n.msg) for n in got] == [("prefill-0", "req-17 done")]
    assert p.batch_transfer_sync(target, [src], [remote], [BLOCK], TransferOpcode.Write,
                                 TransferNotify("prefill-0", "batch")) == 0
    # threads transferring at once, each its own blocks
    dkv[:] = 0
    results = []

    def worker(t):
        rcs = [p.transfer_sync_write(target, src + i * BLOCK, remote + i * BLOCK, BLOCK)
               for i in range(t, BLOCKS, 8)]
        results.append(rcs)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(rc == 0 for rcs in results for rc in rcs) and len(results) == 8
    assert np.array_equal(dkv, pkv)


def test_managed_buffers_and_bytes(prefill_decode):
    p, d, _, _ = prefill_decode
    a = p.allocate_managed_buffer(5000)         # the 8 KiB class
    b = p.allocate_managed_buffer(8192)
    c = p.allocate_managed_buffer(3 << 20)      # the 4 MiB class
    big = p.allocate_managed_buffer(300 << 20)  # past the largest class: its own region
    assert 0 not in (a, b, c, big) and len({a, b, c, big}) == 4
    assert abs(a - b) >= 8192
    assert p.write_bytes_to_buffer(c + 10, b"kv-bytes", 8) == 0
    assert p.read_bytes_from_buffer(c + 10, 8) == b"kv-bytes"
    # managed buffers are registered: they move like any other
    target = session(d)
    remote = d.get_first_buffer_address(target)
    assert p.transfer_sync_write(target, c + 10, remote, 8) == 0
    assert p.transfer_sync_read(target, a, remote, 8) == 0
    assert p.read_bytes_from_buffer(a, 8) == b"kv-bytes"
    assert p.free_managed_buffer(a, 5000) == 0
    assert p.allocate_managed_buffer(6000) == a  # reused
    assert p.free_managed_buffer(big, 300 << 20) == 0
    assert p.free_managed_buffer(big, 300 << 20) == -1
    assert p.free_managed_buffer(12345, 10) == -1
    assert p.allocate_managed_buffer(0) == 0
    assert p.allocate_managed_buffer("x") == 0


def test_bad_input_never_crashes(prefill_decode):
    p, d, pkv, dkv = prefill_decode
    target, remote, src = session(d), d.get_first_buffer_address(session(d)), pkv.ctypes.data
    assert p.transfer_sync_write("127.0.0.1:1", src, remote, 10) == -1       # nobody there
    assert p.transfer_sync_write(target, 4096, remote, 10) == -1             # unregistered source
    assert p.transfer_sync_write(target, src, remote + (1 << 40), 10) == -1  # outside the peer
    assert p.batch_transfer_sync_write(target, [src, src], [remote], [1, 1]) == -1
    assert p.batch_transfer_async_write(target, [src], [remote, remote], [1]) == 0
    assert p.transfer_check_status(987654) == -1
    assert p.get_batch_transfer_status([987654]) == -1
    assert p.write_bytes_to_buffer(4096, b"x", 1) == -1
    assert p.write_bytes_to_buffer(src, b"x", 5) == -1  # longer than the data
    assert p.read_bytes_from_buffer(4096, 10) == b""
    assert p.register_memory("not an address", 10) == -1
    assert p.register_memory(src, pkv.nbytes) == -7  # ERR_ADDRESS_OVERLAPPED
    assert p.unregister_memory(4096) == -3  # ERR_ADDRESS_NOT_REGISTERED
    assert p.batch_register_memory([src], [1, 2]) == -1
    assert p.get_first_buffer_address("127.0.0.1:1") == 0
    assert p.send_probe(target) == 0 and p.send_probe("127.0.0.1:1") == -1
    assert p.warmup_efa_segment(target) == 0
    assert json.loads(p.get_local_topology()) == {}
    # host memory, and no CUDA device here: the stream cannot be waited for
    assert p.transfer_write_on_cuda(target, src, remote, 10, 0) == -1
    assert p.batch_transfer_read_on_cuda(target, [src], [remote], [10], 0) == -1
    with pytest.raises(libte.NotSupportedError):
        p.get_engine_ptr()
    # the peer is still fine after all that
    assert p.transfer_sync_write(target, src, remote, BLOCK) == 0
    assert np.array_equal(dkv[:BLOCK], pkv[:BLOCK])


def test_before_initialize_and_bad_initialize(monkeypatch):
    t = TransferEngine()
    assert t.get_rpc_port() == -1
    assert t.transfer_sync_write("x:1", 1, 2, 3) == -1
    assert t.register_memory(4096, 10) == -1
    assert t.allocate_managed_buffer(10) == 0
    assert t.get_notifies() == []
    assert t.initialize("127.0.0.1", "zookeeper://h:1", "tcp", "") == -1
    assert t.initialize("127.0.0.1", "P2PHANDSHAKE", "xgmi", "") == -1
    assert t.initialize("", "P2PHANDSHAKE", "tcp", "") == -1
    # the RPC port is a free one, unless the legacy binding asks for the name's
    port = free_port()
    assert t.initialize(f"127.0.0.1:{port}", "P2PHANDSHAKE", "tcp", "") == 0
    assert t.get_rpc_port() != port
    monkeypatch.setenv("MC_LEGACY_RPC_PORT_BINDING", "1")
    u = TransferEngine()
    assert u.initialize(f"127.0.0.1:{port}", "P2PHANDSHAKE", "tcp", "") == 0
    assert u.get_rpc_port() == port
    u.close()
    t.close()


def test_async_sentinel_is_zero(prefill_decode):
    """Mooncake's async calls return 0, never -1, when the segment cannot be
    opened: its batch ids are never 0, and callers test ``batch_id != 0``."""
    p, d, pkv, _ = prefill_decode
    src, remote = pkv.ctypes.data, d.get_first_buffer_address(session(d))
    for peer in ("127.0.0.1:1", "unreachable_peer:9"):
        assert p.batch_transfer_async_write(peer, [src], [remote], [16]) == 0
        assert p.batch_transfer_async_read(peer, [src], [remote], [16]) == 0
        assert p.batch_transfer_async(peer, [src], [remote], [16], TransferOpcode.Write) == 0
        assert p.transfer_submit_write(peer, src, remote, 16) == 0
    # a write that cannot start (unregistered source) is 0 too
    assert p.transfer_submit_write(session(d), 4096, remote, 16) == 0


def test_cuda_stream_calls_take_mooncake_defaults(prefill_decode):
    """stream_ptr defaults to 0 (the default stream) and transport_hint is
    accepted, as in Mooncake's binding: the short call behaves as the long one."""
    p, d, pkv, _ = prefill_decode
    target, src = session(d), pkv.ctypes.data
    remote = d.get_first_buffer_address(target)
    for short, full in (
            (lambda: p.transfer_read_on_cuda(target, src, remote, 10),
             lambda: p.transfer_read_on_cuda(target, src, remote, 10, 0, "")),
            (lambda: p.batch_transfer_write_on_cuda(target, [src], [remote], [10]),
             lambda: p.batch_transfer_write_on_cuda(target, [src], [remote], [10],
                                                    stream_ptr=0, transport_hint="tcp"))):
        assert short() == full()


def test_rpc_port_variables(monkeypatch):
    """MC_MIN/MAX_RPC_PORT bound the port; the misspelt MC_MIN/MAX_PRC_PORT
    count only when the correct names are unset (Mooncake's order)."""
    p1 = free_port()
    p2 = free_port()
    while p2 == p1:
        p2 = free_port()
    for name in ("TE_MIN_RPC_PORT", "TE_MAX_RPC_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MC_MIN_RPC_PORT", str(p1))
    monkeypatch.setenv("MC_MAX_RPC_PORT", str(p1))
    monkeypatch.setenv("MC_MIN_PRC_PORT", str(p2))
    monkeypatch.setenv("MC_MAX_PRC_PORT", str(p2))
    t = TransferEngine()
    assert t.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert t.get_rpc_port() == p1
    t.close()
    monkeypatch.delenv("MC_MIN_RPC_PORT")
    monkeypatch.delenv("MC_MAX_RPC_PORT")
    t = TransferEngine()
    assert t.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert t.get_rpc_port() == p2
    t.close()


def test_tcp_bind_address_is_published(monkeypatch, redis_url):
    """With a metadata store, MC_TCP_BIND_ADDRESS is the address the engine
    publishes and peers reach it at, whatever host its name carries."""
    for name in ("TE_BIND_ADDRESS", "MC_LEGACY_RPC_PORT_BINDING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.2")
    a = TransferEngine()
    assert a.initialize("127.0.0.1:1", redis_url, "tcp", "") == 0
    monkeypatch.delenv("MC_TCP_BIND_ADDRESS")
    b = TransferEngine()
    assert b.initialize("127.0.0.1:2", redis_url, "tcp", "") == 0
    try:
        # the RPC port answers at the published address (libte listens there
        # only, so without the variable it would be 127.0.0.1's)
        with socket.create_connection(("127.0.0.2", a.get_rpc_port()), timeout=5):
            pass
        dst, src = np.zeros(BLOCK, dtype=np.uint8), kv_cache(7)[:BLOCK].copy()
        assert a.register_memory(dst.ctypes.data, dst.nbytes) == 0
        assert b.register_memory(src.ctypes.data, src.nbytes) == 0
        assert b.transfer_sync_write("127.0.0.1:1", src.ctypes.data, dst.ctypes.data, BLOCK) == 0
        assert np.array_equal(dst, src)
    finally:
        b.close()
        a.close()


def _held_write(hold_lib, protocol="hold"):
    """Two engines over the 'hold' test transport, and one write from the
    first to the second, kept in flight until hold_lib releases it."""
    a, b = TransferEngine(), TransferEngine()
    assert a.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0
    assert b.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0
    src, dst = kv_cache(3)[:4096].copy(), np.zeros(4096, dtype=np.uint8)
    assert a.register_memory(src.ctypes.data, src.nbytes) == 0
    assert b.register_memory(dst.ctypes.data, dst.nbytes) == 0
    bid = a.transfer_submit_write(session(b), src.ctypes.data, dst.ctypes.data, 4096)
    assert bid != 0
    return a, b, bid, src, dst


def _finish(a, bid, hold_lib):
    assert hold_lib.te_test_hold_release(0) == 1
    deadline = time.monotonic() + 10
    while (rc := a.transfer_check_status(bid)) in (0, -2) and time.monotonic() < deadline:
        time.sleep(0.001)
    return rc


def test_slice_timeout(monkeypatch, hold):
    """MC_SLICE_TIMEOUT=1: a write still in flight after a second reads as
    timed out (-2), and still completes once it can; unset, it reads as
    moving (0) however long it takes."""
    lib = ctypes.CDLL(os.path.join(os.environ["TEST_PLUGIN_DIR"], "libte-transport-hold.so"),
                      mode=os.RTLD_NOW | os.RTLD_NOLOAD)
    lib.te_test_hold_release.argtypes = [ctypes.c_int]
    lib.te_test_hold_release.restype = ctypes.c_size_t
    monkeypatch.setenv("MC_SLICE_TIMEOUT", "1")
    a, b, bid, src, dst = _held_write(lib)
    try:
        assert a.transfer_check_status(bid) == 0
        time.sleep(1.3)
        assert a.transfer_check_status(bid) == -2
        assert _finish(a, bid, lib) == 1
        assert np.array_equal(dst, src)
    finally:
        lib.te_test_hold_release(0)  # closing waits for transfers in flight
        a.close()
        b.close()
    monkeypatch.delenv("MC_SLICE_TIMEOUT")
    a, b, bid, src, dst = _held_write(lib)
    try:
        time.sleep(1.3)
        assert a.transfer_check_status(bid) == 0
        assert _finish(a, bid, lib) == 1
    finally:
        lib.te_test_hold_release(0)
        a.close()
        b.close()
