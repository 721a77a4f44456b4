# SPDX-License-Identifier: Apache-2.0
"""A target engine in a process of its own, steered by notifications:
    python peer.py METADATA NAME SEED [TRANSPORTS]
prints one JSON line {"name", "addr", "length"}, then on the notification
"check <seed>" compares its buffer with pattern(<seed>) and answers "ok" or
"mismatch at <offset>" by notification; "quit" ends it."""
import json
import sys
import time

import libte
from conftest import MIB, pattern

metadata, name, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
transports = sys.argv[4] if len(sys.argv) > 4 else "tcp"
with libte.Engine(metadata, name, transports=transports, address="127.0.0.1") as e:
    buf = libte.Memory(MIB)  # shared memory: the same-host transport maps it
    memoryview(buf)[:] = pattern(MIB, seed)
    addr = e.register(buf)
    print(json.dumps({"name": e.name, "addr": addr, "length": len(buf)}), flush=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for n in e.notifications():
            if n.msg == "quit":
                sys.exit(0)
            if n.msg.startswith("check "):
                want = pattern(MIB, int(n.msg.split()[1]))
                view = memoryview(buf)
                bad = next((i for i in range(MIB) if view[i] != want[i]), None) if view != want else None
                with e.open_segment(n.name) as back:
                    e.notify(back, "ok" if bad is None else f"mismatch at {bad}")
        time.sleep(0.01)
    sys.exit(3)
