# SPDX-License-Identifier: Apache-2.0
"""Two engines in two processes, through P2PHANDSHAKE and through a real redis."""
import json
import os
import subprocess
import sys
import time

import pytest

import libte
from conftest import MIB, free_port, pattern
from libte.mooncake import TransferEngine

HERE = os.path.dirname(os.path.abspath(__file__))


def start_peer(metadata, name, seed, transports="tcp"):
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "peer.py"), metadata, name, str(seed), transports],
                            stdout=subprocess.PIPE, cwd=HERE, text=True)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail("the peer process did not start")
    return proc, json.loads(line)


def wait_notification(engine, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = engine.notifications()
        if got:
            return got
        time.sleep(0.01)
    return []


def exchange(metadata, local_name, peer_name, transports="tcp", served_by="tcp"):
    proc, info = start_peer(metadata, peer_name, seed=11, transports=transports)
    try:
        with libte.Engine(metadata, local_name, transports=transports, address="127.0.0.1") as e:
            local = bytearray(MIB)
            e.register(local)
            seg = e.open_segment(info["name"])
            assert seg.transport == served_by
            assert seg.buffers()[0].addr == info["addr"]
            e.read(seg, local, info["addr"])  # the peer's pattern, every byte
            assert local == pattern(MIB, 11)
            local[:] = pattern(MIB, 12)
            e.write(seg, local, info["addr"])
            e.notify(seg, "check 12")
            got = wait_notification(e)
            assert [n.msg for n in got] == ["ok"]
            assert got[0].name == info["name"]
            e.notify(seg, "quit")
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_two_processes_p2p():
    exchange("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1")


def test_two_processes_same_host_transport():
    # both engines have the same-host transport: it serves the peer's
    # te_mem_alloc memory (libte.Memory) through a shared mapping
    if not any(p.name == "shm" and p.loaded for p in libte.plugins()):
        pytest.fail("the shm transport plugin is not built")
    exchange("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", transports="tcp,shm", served_by="shm")


def test_two_processes_redis(redis_url):
    exchange(redis_url, f"py-init-{os.getpid()}", f"py-peer-{os.getpid()}")


def test_two_engines_redis_same_process(redis_url):
    names = [f"py-a-{os.getpid()}", f"py-b-{os.getpid()}"]
    with libte.Engine(redis_url, names[0], transports="tcp", address="127.0.0.1") as a, \
         libte.Engine(redis_url, names[1], transports="tcp", address="127.0.0.1") as b:
        ab, bb = bytearray(pattern(65536, 3)), bytearray(65536)
        a.register(ab)
        baddr = b.register(bb)
        with a.open_segment(names[1]) as seg:
            a.write(seg, ab, baddr)
        assert bb == ab
    # gone from the store when the engines closed
    with libte.Engine(redis_url, f"py-c-{os.getpid()}", transports="tcp", address="127.0.0.1") as c:
        with pytest.raises(libte.Error):
            c.open_segment(names[1])


def test_mooncake_class_through_redis(redis_url):
    # Segment names are host:port here, as deployments name them; the host part
    # is where peers connect.
    server = redis_url.split("://", 1)[1]
    pname, dname = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    p, d = TransferEngine(), TransferEngine()
    try:
        assert p.initialize_ext(pname, server, "tcp", "", "redis") == 0
        assert d.initialize(dname, redis_url, "tcp", "") == 0
        src, dst = bytearray(pattern(8192, 5)), bytearray(8192)
        pa, da = libte.buffer_address(src), libte.buffer_address(dst)
        assert p.register_memory(pa, len(src)) == 0
        assert d.register_memory(da, len(dst)) == 0
        assert p.get_first_buffer_address(dname) == da
        assert p.batch_transfer_sync_write(dname, [pa, pa + 4096], [da + 4096, da], [4096, 4096]) == 0
        assert dst[:4096] == src[4096:] and dst[4096:] == src[:4096]
    finally:
        p.close()
        d.close()
