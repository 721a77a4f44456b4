# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: engine pairs over TCP, a redis server, the hold transports."""
import ctypes
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
import types

import pytest

import libte

MIB = 1 << 20


def free_port() -> int:
    """A free loopback port from below the kernel's ephemeral range (32768 and
    up): one from that range may be taken by an outgoing connection of a test
    running beside before the server that wants it binds it."""
    for _ in range(500):
        p = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
                return p
            except OSError:
                continue
    raise RuntimeError("no free port below 32000")


def pattern(n: int, seed: int) -> bytes:
    """n deterministic bytes that differ for every seed and offset."""
    out = bytearray(n)
    x = (seed * 2654435761 + 1) & 0xFFFFFFFF
    for i in range(0, n, 4):
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF
        out[i:i + 4] = x.to_bytes(4, "little")[: n - i]
    return bytes(out)


@pytest.fixture
def pair():
    """Two engines over TCP (P2PHANDSHAKE): `a` opens `b`; each has a 4 MiB buffer."""
    a = libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports="tcp")
    b = libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports="tcp")
    abuf, bbuf = bytearray(4 * MIB), bytearray(4 * MIB)
    p = types.SimpleNamespace(a=a, b=b, abuf=abuf, bbuf=bbuf, aaddr=a.register(abuf),
                              baddr=b.register(bbuf))
    p.seg = a.open_segment(b.name)
    yield p
    a.close()
    b.close()


def _hold_pair(transport: str):
    """Two engines over a hold transport (`transport` names it and its plugin
    file), each with a 1 MiB buffer, `a` opening `b`; the plugin's controls
    count(), release(err) and, for "holddl", expired(). Releases what is
    still held and closes the engines at the end."""
    d = os.environ.get("TEST_PLUGIN_DIR")
    if not d:
        pytest.fail("TEST_PLUGIN_DIR is not set (run through meson test)")
    libte.plugins()  # makes libte load the plugin files
    lib = ctypes.CDLL(os.path.join(d, f"libte-transport-{transport}.so"), mode=os.RTLD_NOW | os.RTLD_NOLOAD)
    lib.te_test_hold_release.argtypes = [ctypes.c_int]
    lib.te_test_hold_release.restype = ctypes.c_size_t
    lib.te_test_hold_count.restype = ctypes.c_size_t
    a = libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports=transport)
    b = libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports=transport)
    abuf, bbuf = bytearray(MIB), bytearray(MIB)
    h = types.SimpleNamespace(a=a, b=b, abuf=abuf, bbuf=bbuf, aaddr=a.register(abuf),
                              baddr=b.register(bbuf), count=lib.te_test_hold_count,
                              release=lib.te_test_hold_release)
    if transport == "holddl":
        lib.te_test_hold_expired.restype = ctypes.c_size_t
        h.expired = lib.te_test_hold_expired
    h.seg = a.open_segment(b.name)
    yield h
    h.release(0)
    a.close()
    b.close()


@pytest.fixture
def hold():
    """Engines over the test 'hold' transport, which keeps every transfer in
    flight until release() is called (so tests can see tasks in flight)."""
    yield from _hold_pair("hold")


@pytest.fixture
def holddl():
    """As `hold`, over the 'holddl' test transport, which honours deadlines:
    libte ends its held transfers at their deadline or a cancel, and their
    bytes never move afterwards (a peer that stopped answering)."""
    yield from _hold_pair("holddl")


@pytest.fixture(scope="session")
def redis_url():
    """A redis server of the test's own on a free port, stopped at the end."""
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not os.path.exists(exe):
        pytest.fail("redis-server is not installed (tools/install-deps.sh installs it)")
    port = free_port()
    d = tempfile.mkdtemp(prefix="te-py-redis-")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", d],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    break
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail("redis-server did not start")
        time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(d, ignore_errors=True)
