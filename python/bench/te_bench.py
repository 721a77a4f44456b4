# SPDX-License-Identifier: Apache-2.0
"""te-bench's loop from Python: two engines in this process over TCP
(P2PHANDSHAKE); each thread moves batches of --batch_size blocks and waits for
each. Same flags and closing lines as te-bench, so the two compare directly:

    python3 te_bench.py --block_size=4096 --operation=read --duration=10

--api picks the Python path measured: "many" (Engine.read_many/write_many with
lists of ints), "arrays" (the same with numpy uint64 arrays), "batch" (Batch
objects: submit, wait, check, free) or "mooncake" (libte.mooncake's
batch_transfer_sync_read/write, as serving frameworks call it).
"""
import argparse
import json
import sys
import threading
import time

import libte

UNITS = {"GB": 1e9, "GiB": 2 ** 30, "Gb": 1e9 / 8, "MB": 1e6, "MiB": 2 ** 20, "Mb": 1e6 / 8,
         "KB": 1e3, "KiB": 2 ** 10, "Kb": 1e3 / 8}


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--operation", choices=["read", "write"], default="read")
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--block_size", type=int, default=65536)
    p.add_argument("--buffer_size", type=int, default=1 << 30)
    p.add_argument("--duration", type=float, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--protocol", default="tcp")
    p.add_argument("--report_unit", choices=list(UNITS), default="GB")
    p.add_argument("--report_precision", type=int, default=2)
    p.add_argument("--api", choices=["many", "arrays", "batch", "mooncake"], default="many")
    p.add_argument("--check", action="store_true", help="compare every byte after each batch")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.batch_size < 1 or a.block_size < 1 or a.threads < 1 or a.duration <= 0:
        p.error("sizes, threads and duration must be positive")
    a.buffer_size = max(a.buffer_size, a.block_size * a.batch_size * a.threads)
    return a


def main():
    a = parse()
    op_read = a.operation == "read"
    span = a.block_size * a.batch_size * a.threads
    target = libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports=a.protocol)
    init = libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports=a.protocol)
    tmem, imem = libte.Memory(a.buffer_size), libte.Memory(a.buffer_size)
    # fault in the part in use, as te-bench does
    memoryview(tmem)[:span] = bytes(span)
    memoryview(imem)[:span] = bytes(span)
    if a.check:
        memoryview(tmem)[:span] = bytes(i & 0xFF for i in range(span))
    tbase = target.register(tmem, location="cpu:0")
    ibase = init.register(imem, location="cpu:0", remote=False)
    seg = init.open_segment(target.name)
    mc = None
    if a.api == "mooncake":
        from libte.mooncake import TransferEngine
        mc = TransferEngine()
        # the class over the same initiator engine: what its methods cost on top
        mc._engine = init
    stop = threading.Event()
    counts = [0] * a.threads
    lat = [[] for _ in range(a.threads)]
    errors = []

    def worker(t):
        offs = [a.block_size * (i * a.threads + t) for i in range(a.batch_size)]
        locs = [ibase + o for o in offs]
        rems = [tbase + o for o in offs]
        if a.api == "arrays":
            import numpy as np
            locs, rems = np.array(locs, dtype=np.uint64), np.array(rems, dtype=np.uint64)
        lens = [a.block_size] * a.batch_size
        move = init.read_many if op_read else init.write_many
        n = 0
        try:
            while not stop.is_set():
                t0 = time.perf_counter_ns()
                if a.api in ("many", "arrays"):
                    move(seg, locs, rems, a.block_size)
                elif a.api == "batch":
                    b = init.batch(a.batch_size)
                    (b.submit_read if op_read else b.submit_write)(seg, locs, rems, a.block_size)
                    b.wait()
                    b.check()
                    b.free()
                else:
                    f = mc.batch_transfer_sync_read if op_read else mc.batch_transfer_sync_write
                    if f(target.name, locs, rems, lens) != 0:
                        raise RuntimeError("batch_transfer_sync failed")
                lat[t].append(time.perf_counter_ns() - t0)
                if a.check and op_read:
                    for o in offs:
                        if memoryview(imem)[o:o + a.block_size] != memoryview(tmem)[o:o + a.block_size]:
                            raise RuntimeError(f"DATA MISMATCH at offset {o}")
                n += 1
        except Exception as e:  # reported by the main thread
            errors.append(e)
            stop.set()
        counts[t] = n

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(a.threads)]
    start = time.perf_counter()
    for th in threads:
        th.start()
    time.sleep(a.duration)
    stop.set()
    for th in threads:
        th.join()
    duration = time.perf_counter() - start
    if errors:
        print(f"te_bench.py: {errors[0]}", file=sys.stderr)
        sys.exit(1)
    batches = sum(counts)
    nbytes = batches * a.batch_size * a.block_size
    rate = nbytes / duration
    iops = batches * a.batch_size / duration
    all_lat = sorted(x for l in lat for x in l)

    def pct(p):
        return all_lat[min(len(all_lat) - 1, int(p * len(all_lat)))] / 1e3 if all_lat else 0.0

    unit = UNITS[a.report_unit]
    if a.json:
        print(json.dumps({"mode": "loopback", "api": a.api, "protocol": a.protocol, "operation": a.operation,
                          "block_size": a.block_size, "batch_size": a.batch_size, "threads": a.threads,
                          "duration_s": round(duration, 3), "batch_count": batches,
                          "requests": batches * a.batch_size, "bytes": nbytes,
                          "throughput_bytes_per_s": round(rate), "iops": round(iops),
                          "latency_us": {"p50": pct(0.5), "p99": pct(0.99), "p999": pct(0.999)}}))
    else:
        print(f"te_bench.py: loopback {a.operation} over {a.protocol} through the '{a.api}' API, "
              f"{a.batch_size} x {a.block_size} B per batch, {a.threads} thread(s), {a.duration:g} s")
        print(f"Test completed: duration {duration:.2f}, batch count {batches}, throughput "
              f"{rate / unit:.{a.report_precision}f} {a.report_unit}/s")
        print(f"IOPS {iops:.0f} requests/s; latency per batch p50 {pct(0.5):.1f} us, p99 {pct(0.99):.1f} us")
    if mc is not None:
        mc._engine = None
    init.close()
    target.close()


if __name__ == "__main__":
    main()
