# SPDX-License-Identifier: Apache-2.0
"""A tiny transfer through an installed libte package: two engines over TCP,
1 MiB written to the peer and read back, every byte compared. Prints where
libte was imported from and the plugins it loaded."""
import sys

import libte
from libte.mooncake import TransferEngine  # noqa: F401  (must import)

print("libte from", libte.__file__)
for p in libte.plugins():
    print("plugin", p.name, p.path)

n = 1 << 20
src = bytearray((i * 31 + 7) & 0xFF for i in range(n))
dst = bytearray(n)
back = bytearray(n)
with libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports="tcp") as a, \
        libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports="tcp") as b:
    a.register(src)
    a.register(back)
    b.register(dst)
    with a.open_segment(b.name) as peer:
        remote = peer.buffers()[0].addr
        a.write(peer, src, remote)
        a.read(peer, back, remote)
if dst != src or back != src:
    sys.exit("transfer.py: the bytes moved differ")
print("transfer ok")
