# SPDX-License-Identifier: Apache-2.0
"""KV-cache transfer pattern through Mooncake's Python API, on libte.mooncake
or on Mooncake's own ``mooncake.engine`` (same calls, same arguments).

A prefill process writes one request's KV cache to a decode process over TCP
(P2PHANDSHAKE), as a serving stack's Mooncake connector does: every layer's
K and V buffer registered on its own, one descriptor per block and buffer,
all of a request's descriptors in one batch_transfer_sync_write() with Python
lists of ints. Blocks sit every other one on both sides, so no two
descriptors touch adjacent memory and nothing can be merged. Beside each
figure, the same run's rate for large blocks (--large-block bytes each,
--large-total in all) shows what the link carries when descriptors are few.

    python3 kv.py                         # whichever mooncake.engine imports
    python3 kv.py --impl libte            # libte.mooncake
    python3 kv.py --impl mooncake         # Mooncake's module (must not be libte's)
    python3 kv.py --impl both --rounds 3  # alternating rounds, medians
    python3 kv.py --api arrays,prepared   # libte's own calls beside the lists

With --api, libte.mooncake's engine also moves the same request through
libte's own Python calls on the same engine and segment: `arrays` is
Engine.write_many() with the addresses as array('Q') (no Python object per
descriptor), `prepared` posts lists prepared once (Engine.prepare(),
Batch.submit_prepared()) and waits for the batch.

Defaults: 32 layers x K/V, 8 KV heads / TP 8 x head dim 128 x 2-byte dtype x
16-token blocks = 4 KiB per block and layer; 128, 1024 and 8192 tokens, that
is 512, 4096 and 32768 descriptors per request.
"""

import argparse
import array
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)


def load(impl):
    """The TransferEngine class of `impl` and where it came from."""
    if impl == "libte":
        from libte.mooncake import TransferEngine
        import libte.mooncake as mod
        return TransferEngine, mod.__file__
    from mooncake.engine import TransferEngine
    import mooncake.engine as mod
    origin = getattr(mod, "__file__", "?")
    try:
        import libte.mooncake
        ours = TransferEngine is libte.mooncake.TransferEngine
    except ImportError:
        ours = False
    if impl == "mooncake" and ours:
        sys.exit(f"kv.py: mooncake.engine ({origin}) is libte's; put Mooncake's package first on PYTHONPATH")
    return TransferEngine, origin


def shape(a):
    per_token = a.kv_heads // a.tp * a.head_dim * a.dtype_bytes
    return per_token * a.block_tokens


def new_engine(TransferEngine):
    e = TransferEngine()
    ret = e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    if ret != 0:
        sys.exit(f"kv.py: initialize() returned {ret}")
    return e


def buffers(e, nbuf, size):
    """nbuf separately registered buffers of `size` bytes (one per layer and K/V)."""
    bufs = [ctypes.create_string_buffer(size) for _ in range(nbuf)]
    ptrs = [ctypes.addressof(b) for b in bufs]
    ret = e.batch_register_memory(ptrs, [size] * nbuf)
    if ret != 0:
        sys.exit(f"kv.py: batch_register_memory() returned {ret}")
    return bufs, ptrs


def serve(a):
    """The decode side: registers, announces its buffers, waits for 'quit'."""
    TransferEngine, _ = load(a.impl)
    e = new_engine(TransferEngine)
    block, nblocks = shape(a), max(a.tokens) // a.block_tokens + 1
    kv, kv_ptrs = buffers(e, a.layers * 2, 2 * nblocks * block)
    large, large_ptrs = buffers(e, 1, 2 * a.large_total)
    print(json.dumps({"session": f"127.0.0.1:{e.get_rpc_port()}", "kv": kv_ptrs, "large": large_ptrs[0]}),
          flush=True)
    sys.stdin.readline()
    e.batch_unregister_memory(kv_ptrs + large_ptrs)


def timed(e, session, src, dst, lens, min_iters, min_seconds):
    """Median seconds per batch_transfer_sync_write() of the lists."""
    ret = e.batch_transfer_sync_write(session, src, dst, lens)  # warm-up
    if ret != 0:
        sys.exit(f"kv.py: batch_transfer_sync_write() returned {ret}")
    times, start = [], time.perf_counter()
    while len(times) < min_iters or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        ret = e.batch_transfer_sync_write(session, src, dst, lens)
        times.append(time.perf_counter() - t0)
        if ret != 0:
            sys.exit(f"kv.py: batch_transfer_sync_write() returned {ret}")
    return statistics.median(times)


def timed_call(fn, min_iters, min_seconds):
    """Median seconds per call of fn() (after one warm-up call)."""
    fn()
    times, start = [], time.perf_counter()
    while len(times) < min_iters or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def libte_calls(e, session, src, dst, block, a):
    """Seconds per request through libte's own calls ({api: seconds})."""
    import libte
    eng = e._engine  # the libte.Engine under libte.mooncake's TransferEngine
    seg = e._segment(session)
    if eng is None or seg is None:
        sys.exit("kv.py: libte.mooncake's engine or segment is not open")
    out = {}
    if "arrays" in a.api:
        s_arr, d_arr = array.array("Q", src), array.array("Q", dst)
        out["arrays"] = timed_call(lambda: eng.write_many(seg, s_arr, d_arr, block), a.min_iters, a.min_seconds)
    if "prepared" in a.api:
        local = eng.prepare(libte.LOCAL_SEGMENT, array.array("Q", src), block)
        remote = eng.prepare(seg, array.array("Q", dst), block)

        def post():
            b = eng.batch(len(src))
            b.submit_prepared(libte.WRITE, local, remote, count=len(src))
            b.wait()
            b.check()
            b.free()
        out["prepared"] = timed_call(post, a.min_iters, a.min_seconds)
    return out


def serve_args(a):
    """What the decode process needs to know: the implementation and the sizes."""
    return ["--impl", a.impl, "--layers", str(a.layers), "--kv-heads", str(a.kv_heads),
            "--head-dim", str(a.head_dim), "--dtype-bytes", str(a.dtype_bytes),
            "--block-tokens", str(a.block_tokens), "--tp", str(a.tp),
            "--tokens", ",".join(str(t) for t in a.tokens), "--large-total", str(a.large_total)]


def one_round(a):
    """One initiator run against a fresh decode process: a dict of results."""
    TransferEngine, origin = load(a.impl)
    child = subprocess.Popen([sys.executable, HERE, "--serve"] + serve_args(a), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        peer = json.loads(child.stdout.readline(1 << 20))  # bounded: one line of our own child, at most 1 MiB
        e = new_engine(TransferEngine)
        block, nblocks = shape(a), max(a.tokens) // a.block_tokens + 1
        kv, kv_ptrs = buffers(e, a.layers * 2, 2 * nblocks * block)
        large, large_ptrs = buffers(e, 1, 2 * a.large_total)
        session = peer["session"]
        nlarge = max(1, a.large_total // a.large_block)
        src = [large_ptrs[0] + 2 * i * a.large_block for i in range(nlarge)]
        dst = [peer["large"] + 2 * i * a.large_block for i in range(nlarge)]
        t = timed(e, session, src, dst, [a.large_block] * nlarge, 3, a.min_seconds)
        large_gbs = nlarge * a.large_block / t / 1e9
        rows = []
        for tokens in a.tokens:
            n = -(-tokens // a.block_tokens)
            src, dst = [], []
            for i in range(a.layers * 2):
                src += [kv_ptrs[i] + 2 * b * block for b in range(n)]
                dst += [peer["kv"][i] + 2 * b * block for b in range(n)]
            lens = [block] * len(src)
            t = timed(e, session, src, dst, lens, a.min_iters, a.min_seconds)
            row = {"tokens": tokens, "descriptors": len(src), "bytes": len(src) * block, "seconds": t}
            if a.api and a.impl == "libte":
                row["api"] = libte_calls(e, session, src, dst, block, a)
            rows.append(row)
        e.batch_unregister_memory(kv_ptrs + large_ptrs)
    finally:
        if child.poll() is None:
            try:
                child.stdin.write("quit\n")
                child.stdin.flush()
                child.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                child.kill()
                child.wait()
    return {"impl": a.impl, "module": origin, "block": block, "large_gbs": large_gbs, "rows": rows}


def report(results, a):
    """Medians over the rounds of each implementation."""
    impls = []
    for r in results:
        if r["impl"] not in impls:
            impls.append(r["impl"])
    print(f"# {a.layers} layers x K/V, {a.kv_heads} KV heads / TP {a.tp} x head dim {a.head_dim} x "
          f"{a.dtype_bytes} B x {a.block_tokens}-token blocks = {shape(a)} B per block and layer; "
          f"large blocks {a.large_block} B")
    print(f"{'impl':10} {'tokens':>7} {'descs':>7} {'ms/req':>9} {'us/token':>9} {'descs/s':>11} "
          f"{'GB/s':>7} {'large GB/s':>11} {'rounds':>6}")
    for impl in impls:
        mine = [r for r in results if r["impl"] == impl]
        large = statistics.median(r["large_gbs"] for r in mine)
        for j, tokens in enumerate(a.tokens):
            t = statistics.median(r["rows"][j]["seconds"] for r in mine)
            row = mine[0]["rows"][j]
            print(f"{impl:10} {tokens:7d} {row['descriptors']:7d} {t * 1e3:9.2f} {t / tokens * 1e6:9.2f} "
                  f"{row['descriptors'] / t:11.0f} {row['bytes'] / t / 1e9:7.2f} {large:11.2f} {len(mine):6d}")
            for api in a.api if impl == "libte" else []:
                t = statistics.median(r["rows"][j]["api"][api] for r in mine)
                print(f"{'  ' + api:10} {tokens:7d} {row['descriptors']:7d} {t * 1e3:9.2f} {t / tokens * 1e6:9.2f} "
                      f"{row['descriptors'] / t:11.0f} {row['bytes'] / t / 1e9:7.2f} {large:11.2f} {len(mine):6d}")
    for impl in impls:
        print(f"# {impl}: {next(r['module'] for r in results if r['impl'] == impl)}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=["auto", "libte", "mooncake", "both"], default="auto",
                   help="libte.mooncake, Mooncake's mooncake.engine, whichever mooncake.engine "
                        "imports (auto), or both in alternating rounds")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype-bytes", type=int, default=2)
    p.add_argument("--block-tokens", type=int, default=16)
    p.add_argument("--tp", type=int, default=8, help="tensor-parallel degree (KV heads per rank = kv-heads / tp)")
    p.add_argument("--tokens", default="128,1024,8192", help="tokens per request, comma-separated")
    p.add_argument("--large-block", type=int, default=1 << 20)
    p.add_argument("--large-total", type=int, default=64 << 20)
    p.add_argument("--rounds", type=int, default=1, help="rounds per implementation")
    p.add_argument("--min-iters", type=int, default=5, help="requests timed per size and round, at least")
    p.add_argument("--min-seconds", type=float, default=0.5, help="time spent per size and round, at least")
    p.add_argument("--api", default="", help="with libte: also time libte's own calls, comma-separated: "
                   "arrays (write_many with array('Q')), prepared (prepared lists)")
    p.add_argument("--json", action="store_true", help="one JSON object per round instead of the table")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    a.tokens = [int(t) for t in a.tokens.split(",")]
    a.api = [x for x in a.api.split(",") if x]
    if any(x not in ("arrays", "prepared") for x in a.api):
        p.error("--api takes arrays and/or prepared")
    if a.kv_heads % a.tp or min(a.tokens) <= 0 or a.layers <= 0:
        p.error("kv-heads must be a multiple of tp; tokens and layers positive")
    if a.serve:
        serve(a)
        return
    if a.impl == "auto":
        # mooncake.engine, whichever it is; libte.mooncake without one.
        try:
            import mooncake.engine
            a.impl = "libte" if getattr(mooncake, "PROVIDER", "") == "libte" else "mooncake"
        except ImportError:
            a.impl = "libte"
    impls = ["libte", "mooncake"] if a.impl == "both" else [a.impl]
    results = []
    for _ in range(a.rounds):
        for impl in impls:
            args = argparse.Namespace(**vars(a))
            args.impl = impl
            r = one_round(args)
            results.append(r)
            if a.json:
                print(json.dumps(r), flush=True)
    if not a.json:
        report(results, a)


if __name__ == "__main__":
    main()
