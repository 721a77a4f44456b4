# SPDX-License-Identifier: Apache-2.0
"""Every method with random, mostly wrong, arguments: an exception of the
documented kinds or a result, never a crash or a SystemError."""
import random

import libte

ALLOWED = (TypeError, ValueError, OverflowError, BufferError, IndexError, libte.Error)


def values(pair):
    return [None, -1, 0, 1, 7, 2 ** 63, 2 ** 70, -(2 ** 70), 1.5, float("nan"), "x", "", "127.0.0.1:1",
            "a" * 5000, b"bytes", bytearray(16), memoryview(bytearray(8)), [], [1, 2], [(0, 0, 0, 0, 0)],
            [(libte.READ, pair.seg, pair.aaddr, pair.baddr, 8)], {}, {"k": object()}, object(),
            pair.seg, pair.aaddr, pair.baddr, pair.abuf, libte.Memory(4096), (1, 2)]


def test_random_arguments(pair):
    rng = random.Random(1234)
    pool = values(pair)
    batch = pair.a.batch(64)
    targets = {
        pair.a: ["install", "uninstall", "register", "register_many", "unregister", "unregister_many",
                 "open_segment", "probe", "notify", "batch", "transfer", "read", "write", "read_many",
                 "write_many", "write_bytes", "read_bytes"],
        batch: ["submit", "submit_read", "submit_write", "status", "wait", "notify"],
        pair.seg: ["buffers", "refresh", "descriptor"],
    }
    calls = 0
    for _ in range(3000):
        obj = rng.choice(list(targets))
        name = rng.choice(targets[obj])
        args = [rng.choice(pool) for _ in range(rng.randint(0, 5))]
        if name in ("wait", "probe") and args and isinstance(args[-1], (int, float)):
            args[-1] = 0.01  # bounded
        try:
            getattr(obj, name)(*args)
        except ALLOWED:
            pass
        calls += 1
    assert calls == 3000
    # registrations made along the way are still consistent and the pair still moves data
    for b in pair.a.local_buffers():
        if b.addr != pair.aaddr:
            pair.a.unregister(b.addr)
    batch.wait(5)
    pair.abuf[:4] = b"ping"
    pair.a.write(pair.seg, pair.aaddr, pair.baddr, 4)
    assert pair.bbuf[:4] == b"ping"
