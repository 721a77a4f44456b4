# SPDX-License-Identifier: Apache-2.0
"""A KV-cache transfer between two processes, written the way a serving
stack's connector drives Mooncake's engine: a wrapper class around
``mooncake.engine.TransferEngine`` (initialize with P2PHANDSHAKE over tcp, the
session id from get_rpc_port(), register and batch-register memory by int
address, batch_transfer_sync_write with Python lists of ints, read back,
probe, unregister). Nothing here imports libte except the check that
``mooncake.engine`` is libte's.

    python3 sglang_style.py [--root DIR]

runs the decode side (the target) as a child process of the same interpreter
and environment, writes to it, has it verify what arrived, reads it back and
compares. With --root, mooncake and libte must both be imported from under
DIR (an installed copy). Prints "sglang-style ok" and exits 0, or says what
was wrong and exits 1.
"""

import ctypes
import os
import subprocess
import sys

BLOCK = 4096       # bytes per block of one layer's K or V
BLOCKS = 64        # blocks per buffer; every other one is moved
LAYERS = 2         # K and V buffers per layer


class KVTransferEngine:
    """The connector's view of the engine: raises on failure, as the
    serving stacks' wrappers do around Mooncake's int returns."""

    def __init__(self, hostname: str, ib_device: str = ""):
        from mooncake.engine import TransferEngine

        self.engine = TransferEngine()
        self.hostname = hostname
        ret = self.engine.initialize(hostname, "P2PHANDSHAKE", "tcp", ib_device)
        if ret != 0:
            raise RuntimeError(f"initialize() returned {ret}")
        self.session_id = f"{hostname}:{self.engine.get_rpc_port()}"

    def register(self, ptr: int, length: int):
        ret = self.engine.register_memory(ptr, length)
        if ret != 0:
            raise RuntimeError(f"register_memory(0x{ptr:x}, {length}) returned {ret}")

    def batch_register(self, ptrs, lengths):
        ret = self.engine.batch_register_memory(ptrs, lengths)
        if ret != 0:
            raise RuntimeError(f"batch_register_memory() returned {ret}")

    def deregister(self, ptr: int):
        ret = self.engine.unregister_memory(ptr)
        if ret != 0:
            raise RuntimeError(f"unregister_memory(0x{ptr:x}) returned {ret}")

    def batch_deregister(self, ptrs):
        ret = self.engine.batch_unregister_memory(ptrs)
        if ret != 0:
            raise RuntimeError(f"batch_unregister_memory() returned {ret}")

    def transfer_sync(self, session_id: str, buffer: int, peer_buffer_address: int, length: int) -> int:
        return self.engine.transfer_sync_write(session_id, buffer, peer_buffer_address, length)

    def batch_transfer_sync(self, session_id: str, buffers, peer_buffer_addresses, lengths) -> int:
        return self.engine.batch_transfer_sync_write(session_id, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_sync_read(self, session_id: str, buffers, peer_buffer_addresses, lengths) -> int:
        return self.engine.batch_transfer_sync_read(session_id, buffers, peer_buffer_addresses, lengths)

    def get_session_id(self) -> str:
        return self.session_id


def pattern(layer: int, block: int) -> bytes:
    """What block `block` of buffer `layer` holds on the prefill side."""
    head = f"L{layer}B{block}:".encode()
    return (head * (BLOCK // len(head) + 1))[:BLOCK]


def fail(msg: str):
    print(f"sglang-style: {msg}", flush=True)
    sys.exit(1)


def check_provider(root):
    """mooncake.engine must be libte.mooncake, from under root when given."""
    import mooncake.engine
    import libte.mooncake

    if mooncake.engine.TransferEngine is not libte.mooncake.TransferEngine:
        fail(f"mooncake.engine.TransferEngine is not libte's: {mooncake.engine.TransferEngine!r}")
    for mod in (mooncake, mooncake.engine, libte.mooncake):
        where = os.path.realpath(mod.__file__)
        if root and not where.startswith(os.path.realpath(root) + os.sep):
            fail(f"{mod.__name__} imported from {where}, not from under {root}")
        print(f"{mod.__name__} from {where}", flush=True)


def decode_side():
    """The target: registers its KV buffers, announces them, then answers
    'verify' (did every other block arrive, and nothing else?) and 'quit'."""
    eng = KVTransferEngine("127.0.0.1")
    size = BLOCKS * BLOCK
    bufs = [ctypes.create_string_buffer(size) for _ in range(LAYERS)]
    ptrs = [ctypes.addressof(b) for b in bufs]
    eng.batch_register(ptrs, [size] * LAYERS)
    print("ready", eng.get_session_id(), " ".join(str(p) for p in ptrs), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd == ["verify"]:
            bad = [(layer, b) for layer in range(LAYERS) for b in range(BLOCKS)
                   if bufs[layer].raw[b * BLOCK:(b + 1) * BLOCK]
                   != (pattern(layer, b - 1) if b % 2 else bytes(BLOCK))]
            print("verified" if not bad else f"mismatch at (layer, block) {bad[:4]}", flush=True)
        elif cmd == ["quit"]:
            eng.batch_deregister(ptrs)
            print("bye", flush=True)
            return
        else:
            print(f"unknown command {line.strip()!r}", flush=True)


def prefill_side(root):
    check_provider(root)
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--decode"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ready = child.stdout.readline().split()
        if len(ready) != 2 + LAYERS or ready[0] != "ready":
            fail(f"the decode side did not start: {ready!r}")
        session, peer_ptrs = ready[1], [int(p) for p in ready[2:]]

        eng = KVTransferEngine("127.0.0.1")
        size = BLOCKS * BLOCK
        src = [ctypes.create_string_buffer(size) for _ in range(LAYERS)]
        back = ctypes.create_string_buffer(size * LAYERS)
        src_ptrs = [ctypes.addressof(b) for b in src]
        eng.batch_register(src_ptrs, [size] * LAYERS)
        eng.register(ctypes.addressof(back), len(back))
        for layer in range(LAYERS):
            for b in range(BLOCKS):
                ctypes.memmove(src_ptrs[layer] + b * BLOCK, pattern(layer, b), BLOCK)

        if eng.engine.send_probe(session) != 0:
            fail(f"send_probe({session}) failed")
        first = eng.engine.get_first_buffer_address(session)
        if first != min(peer_ptrs):
            fail(f"get_first_buffer_address() = 0x{first:x}, the peer registered 0x{min(peer_ptrs):x} first")

        # Even blocks here go to odd blocks there: no two requests touch
        # adjacent memory on either side, so none can be merged.
        buffers, peers, lengths = [], [], []
        for layer in range(LAYERS):
            for b in range(0, BLOCKS, 2):
                buffers.append(src_ptrs[layer] + b * BLOCK)
                peers.append(peer_ptrs[layer] + (b + 1) * BLOCK)
                lengths.append(BLOCK)
        # The last pair goes alone, through transfer_sync_write.
        ret = eng.batch_transfer_sync(session, buffers[:-1], peers[:-1], lengths[:-1])
        if ret != 0:
            fail(f"batch_transfer_sync_write() returned {ret}")
        ret = eng.transfer_sync(session, buffers[-1], peers[-1], lengths[-1])
        if ret != 0:
            fail(f"transfer_sync_write() returned {ret}")
        child.stdin.write("verify\n")
        child.stdin.flush()
        answer = child.stdout.readline().strip()
        if answer != "verified":
            fail(f"the decode side says: {answer}")

        # Read the written blocks back, packed, and compare.
        packed = [ctypes.addressof(back) + i * BLOCK for i in range(len(peers))]
        ret = eng.batch_transfer_sync_read(session, packed, peers, lengths)
        if ret != 0:
            fail(f"batch_transfer_sync_read() returned {ret}")
        want = b"".join(pattern(layer, b) for layer in range(LAYERS) for b in range(0, BLOCKS, 2))
        if back.raw[:len(want)] != want:
            fail("what was read back differs from what was written")
        ret = eng.engine.transfer_sync_read(session, packed[0], peers[0], BLOCK)
        if ret != 0:
            fail(f"transfer_sync_read() returned {ret}")

        # A write outside what the peer registered fails with a negative
        # return and leaves the engine usable.
        ret = eng.batch_transfer_sync(session, [buffers[0]], [peer_ptrs[0] + size * 64], [BLOCK])
        if ret >= 0:
            fail(f"a write to unregistered peer memory returned {ret}")
        if eng.engine.send_probe(session) != 0:
            fail("send_probe() failed after a refused write")

        eng.batch_deregister(src_ptrs)
        eng.deregister(ctypes.addressof(back))
        child.stdin.write("quit\n")
        child.stdin.flush()
        if child.stdout.readline().strip() != "bye" or child.wait(timeout=30) != 0:
            fail("the decode side did not end cleanly")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    print(f"{len(buffers)} blocks written, verified and read back", flush=True)
    print("sglang-style ok", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--decode"]:
        decode_side()
    elif len(sys.argv) == 1:
        prefill_side(None)
    elif len(sys.argv) == 3 and sys.argv[1] == "--root":
        prefill_side(sys.argv[2])
    else:
        fail("usage: sglang_style.py [--root DIR]")
