# SPDX-License-Identifier: Apache-2.0
"""One synchronous transfer at a time through the Mooncake-compatible binding
(libte.mooncake.TransferEngine.transfer_sync_read / transfer_sync_write)
against a running target (a te-bench --mode=target process), each call timed
with time.perf_counter_ns; prints p50/p99/p99.9 as one JSON object, shaped like
te-bench's --json latency_us.

    PYTHONPATH=build/python TE_PLUGIN_PATH=build/plugins/transport/tcp:build/plugins/transport/shm \\
      python3 tools/bench-latency-py.py --segment_id=127.0.0.1:16001 --protocol=tcp \\
      --operation=read --block_size=4096 --duration=3

--protocol is the one passed to TransferEngine.initialize() ("tcp", "shm", or
"auto": the best transport found); the JSON's "transport" is the one the
binding's segment reports. The first 10 % of the time (at most 0.2 s) is
warm-up and not counted.
"""
import argparse
import json
import sys
import time

from libte.mooncake import TransferEngine


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--segment_id", required=True, help="the target's segment name")
    p.add_argument("--protocol", default="tcp")
    p.add_argument("--operation", choices=["read", "write"], default="read")
    p.add_argument("--block_size", type=int, default=4096)
    p.add_argument("--duration", type=float, default=3)
    p.add_argument("--json", action="store_true", help="(the output is always JSON)")
    a = p.parse_args()

    te = TransferEngine()
    if te.initialize("127.0.0.1", "P2PHANDSHAKE", a.protocol, "") != 0:
        sys.exit("bench-latency-py: initialize() failed")
    buf = te.allocate_managed_buffer(a.block_size)
    if buf == 0:
        sys.exit("bench-latency-py: allocate_managed_buffer() failed")
    remote = te.get_first_buffer_address(a.segment_id)
    if remote == 0:
        sys.exit(f"bench-latency-py: segment {a.segment_id} has no buffer")
    transport = "?"
    try:  # which transport the binding routes the segment through
        transport = te._segment(a.segment_id).transport
    except Exception:  # a private helper; the figures do not depend on it
        pass
    move = te.transfer_sync_read if a.operation == "read" else te.transfer_sync_write
    seg, n = a.segment_id, a.block_size
    clock = time.perf_counter_ns

    warm = int(min(0.2, a.duration / 10) * 1e9)
    t_start = clock()
    end = t_start + warm + int(a.duration * 1e9)
    lat = []
    add = lat.append
    while True:
        t0 = clock()
        rc = move(seg, buf, remote, n)
        t1 = clock()
        if rc != 0:
            sys.exit(f"bench-latency-py: transfer_sync_{a.operation} returned {rc}")
        if t0 - t_start >= warm:
            add(t1 - t0)
        if t1 >= end:
            break
    te.free_managed_buffer(buf, a.block_size)
    te.close()

    lat.sort()

    def pct(q):
        return lat[min(len(lat) - 1, int(q * len(lat)))] / 1e3

    print(json.dumps({"api": "mooncake.transfer_sync_" + a.operation, "protocol": a.protocol,
                      "transport": transport, "segment_id": seg, "operation": a.operation,
                      "block_size": n, "requests": len(lat),
                      "latency_us": {"p50": pct(0.5), "p99": pct(0.99), "p999": pct(0.999),
                                     "mean": sum(lat) / len(lat) / 1e3, "max": lat[-1] / 1e3}}))


if __name__ == "__main__":
    main()
