# SPDX-License-Identifier: Apache-2.0
"""Device memory from Python, with the test suite's device plugin (testdev),
whose memory the CPU cannot touch: allocation, copies, transfers between
engines in every direction, and Mooncake's *_on_cuda calls."""
import ctypes
import threading
import time

import pytest

import libte
from libte.mooncake import TransferEngine
from conftest import pattern

MIB = 1 << 20


def testdev():
    for p in libte.plugins():
        if p.name == "testdev" and p.loaded:
            return ctypes.CDLL(p.path)
    return None


pytestmark = pytest.mark.skipif(testdev() is None,
                                reason="the test device plugin is not on TE_PLUGIN_PATH")


def dev_write(addr, data):
    host = bytearray(data)
    libte.device_copy(addr, libte.buffer_address(host), len(host))


def dev_read(addr, n):
    host = bytearray(n)
    libte.device_copy(libte.buffer_address(host), addr, n)
    return bytes(host)


def test_alloc_copy_locate():
    a = libte.device_alloc("testdev:0", 3 * MIB + 1)
    b = libte.device_alloc("testdev:1", 3 * MIB + 1)
    assert libte.device_locate(a) == "testdev:0"
    assert libte.device_locate(b, 100) == "testdev:1"
    assert libte.device_locate(libte.buffer_address(bytearray(10))) is None
    data = pattern(3 * MIB + 1, 5)
    dev_write(a, data)
    libte.device_copy(b, a, len(data))
    assert dev_read(b, len(data)) == data
    with pytest.raises(libte.Error):
        libte.device_alloc("nosuchdev:0", 10)
    with pytest.raises(libte.InvalidArgumentError):
        libte.device_alloc("testdev:0", 0)
    with pytest.raises(libte.InvalidArgumentError):
        libte.device_free(libte.buffer_address(bytearray(10)))
    with pytest.raises(TypeError):
        libte.device_copy("x", a, 1)
    libte.device_free(a)
    libte.device_free(b)


@pytest.mark.parametrize("init_dev,target_dev", [(True, False), (False, True), (True, True)])
def test_engines(init_dev, target_dev):
    n = 2 * MIB + 3
    with libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports="tcp") as target, \
         libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports="tcp") as init:
        hosts = []

        def mem(dev, loc):
            if dev:
                return libte.device_alloc(loc, n)
            h = bytearray(n)
            hosts.append(h)
            return libte.buffer_address(h)

        def put(addr, dev, data):
            if dev:
                dev_write(addr, data)
            else:
                ctypes.memmove(addr, data, len(data))

        def get(addr, dev):
            return dev_read(addr, n) if dev else ctypes.string_at(addr, n)

        t, l = mem(target_dev, "testdev:0"), mem(init_dev, "testdev:1")
        target.register(t, n)                     # "*": the device is found
        init.register(l, n, remote=False)
        with init.open_segment(target.name) as seg:
            put(l, init_dev, pattern(n, 1))
            init.write(seg, l, t, n)
            assert get(t, target_dev) == pattern(n, 1)
            put(t, target_dev, pattern(n, 2))
            init.read(seg, l, t, n)
            assert get(l, init_dev) == pattern(n, 2)
        init.unregister(l)
        target.unregister(t)
        for addr, dev in ((t, target_dev), (l, init_dev)):
            if dev:
                libte.device_free(addr)


def test_mooncake_on_cuda():
    """Mooncake's stream-ordered calls return at once; the transfers run when
    the stream gets there, and the stream's later work waits for them. Device
    memory on both sides; the stream is the test device's."""
    lib = testdev()
    lib.te_testdev_launches.restype = ctypes.c_ulong
    hostfn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    p, d = TransferEngine(), TransferEngine()
    assert p.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert d.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    n, stream = MIB, 0x1234
    src, dst = libte.device_alloc("testdev:1", 2 * n), libte.device_alloc("testdev:0", 2 * n)
    assert p.register_memory(src, 2 * n) == 0
    assert d.register_memory(dst, 2 * n) == 0
    target = f"127.0.0.1:{d.get_rpc_port()}"
    dev_write(src, pattern(2 * n, 9))
    dev_write(dst, bytes(2 * n))
    # Work of the test's own holds the stream: the calls return anyway.
    opened = threading.Event()
    gate = hostfn(lambda _arg: opened.wait(30))
    assert lib.te_testdev_stream_launch(ctypes.c_void_p(stream), gate, None) == 0
    launches = lib.te_testdev_launches()
    t0 = time.monotonic()
    assert p.transfer_write_on_cuda(target, src, dst, n, stream) == 0
    assert p.batch_transfer_write_on_cuda(target, [src + n], [dst + n], [n], stream) == 0
    assert time.monotonic() - t0 < 5
    assert lib.te_testdev_launches() == launches + 2
    time.sleep(0.2)
    assert dev_read(dst, 2 * n) == bytes(2 * n)  # not before the stream gets there
    opened.set()
    libte.device_stream_wait("testdev", stream)
    assert dev_read(dst, 2 * n) == pattern(2 * n, 9)
    dev_write(src, bytes(2 * n))
    assert p.transfer_read_on_cuda(target, src, dst, n, stream) == 0
    assert p.batch_transfer_read_on_cuda(target, [src + n], [dst + n], [n], stream) == 0
    libte.device_stream_wait("testdev", stream)
    assert dev_read(src, 2 * n) == pattern(2 * n, 9)
    assert lib.te_testdev_launches() == launches + 4
    # a call with mismatched lists queues nothing
    assert p.batch_transfer_read_on_cuda(target, [src], [dst, dst], [n], stream) == -1
    assert lib.te_testdev_launches() == launches + 4
    p.close()
    d.close()
