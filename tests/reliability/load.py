#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Load and soak against te-bench target processes (suite "reliability").

    load.py TE_BENCH SCENARIO

Scenarios:
  initiators   16 te-bench initiator processes with --check against one target,
               over TCP and over the same-host transport: every one exits 0 (no
               mismatch, no failed task).
  flood        10,000 connection attempts and 500 half-open connections on the
               target's RPC and TCP data ports while a checked initiator runs: the
               initiator succeeds, the target serves a new initiator afterwards,
               and its file descriptors come back to where they were.
  soak         a mixed read/write run with --check for SOAK_SECONDS (default 60):
               no lost or corrupt byte; the resident memory and the open file
               descriptors of target and initiator stay flat after warm-up.
Each prints one JSON line of figures (for docs/reliability.md).
"""
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time

BENCH = sys.argv[1]
SCENARIO = sys.argv[2]
MIB = 1 << 20
STARTED = []  # every process started, killed on the way out
TARGET_LOG = []  # the last lines the targets printed


def fail(msg):
    print(f"FAIL {SCENARIO}: {msg}", flush=True)
    if TARGET_LOG:
        print("the target's last lines:\n" + "".join(TARGET_LOG[-20:]), flush=True)
    for p in STARTED:
        if p.poll() is None:
            p.kill()
    sys.exit(1)


def drain(p):
    for line in p.stdout:
        TARGET_LOG.append(line)
        del TARGET_LOG[:-200]


def start_target(protocol, size="64M"):
    p = subprocess.Popen([BENCH, "--mode=target", "--local_server_name=127.0.0.1", f"--protocol={protocol}",
                          f"--buffer_size={size}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    STARTED.append(p)
    seen = []
    for line in p.stdout:  # libte's warnings may come first
        seen.append(line)
        m = re.search(r"segment name (\S+) ", line)
        if m:
            # Read the rest of its output as it comes: a target whose log
            # fills a pipe nobody reads blocks in the middle of its work.
            threading.Thread(target=drain, args=(p,), daemon=True).start()
            return p, m.group(1)
        if len(seen) > 50:
            break
    p.kill()
    fail(f"target did not start: {''.join(seen)[-500:]!r}")


def stop(p):
    p.terminate()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def initiator(name, protocol, secs, offset=0, extra=()):
    p = subprocess.Popen([BENCH, f"--segment_id={name}", f"--protocol={protocol}", f"--duration={secs}",
                             "--check", "--quiet", "--json", "--block_size=65536", "--batch_size=16",
                             "--operation=mixed", f"--remote_offset={offset}", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    STARTED.append(p)
    return p


def result(p, what, timeout=300):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        fail(f"{what}: did not finish")
    if p.returncode != 0:
        fail(f"{what}: exit {p.returncode}: {err.strip()[-300:]}")
    d = json.loads(out.strip().splitlines()[-1])
    if d["requests"] <= 0:
        fail(f"{what}: moved nothing")
    return d


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise ProcessLookupError(pid)  # exiting: its memory is already gone


def sanitized(pid):
    """True when the process runs with AddressSanitizer."""
    with open(f"/proc/{pid}/maps") as f:
        return any("libasan" in line for line in f)


def rpc_call(port, typ, body=b"{}"):
    """One frame of the RPC protocol (docs/wire.md, "RPC frames") and its answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(struct.pack("<QB", len(body) + 1, typ) + body)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    (n,) = struct.unpack("<Q", data[:8])
    return data[9:8 + n]


def scenario_initiators():
    figures = {}
    for protocol, want in (("tcp", "tcp"), ("auto", None)):
        target, name = start_target(protocol)
        procs = [initiator(name, protocol, 5, offset=i * MIB) for i in range(16)]
        res = [result(p, f"initiator {i} over {protocol}") for i, p in enumerate(procs)]
        stop(target)
        transports = {d["transport"] for d in res}
        if want and transports != {want}:
            fail(f"served by {transports}, wanted {want}")
        figures[protocol] = {"processes": 16, "transports": sorted(transports),
                             "requests": sum(d["requests"] for d in res),
                             "bytes_checked": sum(d["bytes"] for d in res), "failed": 0}
    print(json.dumps({"scenario": "initiators", **figures}), flush=True)


def scenario_flood():
    target, name = start_target("tcp")
    rpc_port = int(name.rsplit(":", 1)[1])
    desc = json.loads(rpc_call(rpc_port, 1))
    data_port = desc["tcp_data_port"]
    base = fds(target.pid)
    init = initiator(name, "tcp", 12)
    held = []
    attempts = 0
    t0 = time.monotonic()
    # From another loopback address than the real initiator's (127.0.0.1), as
    # an attacker would be: the target limits connections per address.
    for port in (rpc_port, data_port):
        for _ in range(5000):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=2, source_address=("127.0.0.2", 0))
                attempts += 1
                if len(held) < 500 and attempts % 10 == 0:
                    held.append(s)  # half-open: connected, silent
                else:
                    s.close()
            except OSError:
                attempts += 1
    flood_s = time.monotonic() - t0
    peak = fds(target.pid)
    d = result(init, "initiator during the flood")
    for s in held:
        s.close()
    deadline = time.monotonic() + 30
    while fds(target.pid) > base + 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    after = fds(target.pid)
    if after > base + 4:
        fail(f"the target holds {after} descriptors after the flood, {base} before")
    again = result(initiator(name, "tcp", 1), "initiator after the flood")
    if rpc_call(rpc_port, 3) != b'{"status":"success"}':
        fail("the target does not answer a probe after the flood")
    stop(target)
    print(json.dumps({"scenario": "flood", "connection_attempts": attempts, "half_open_held": len(held),
                      "flood_seconds": round(flood_s, 1), "target_fds_before": base, "target_fds_peak": peak,
                      "target_fds_after": after, "initiator_requests_during": d["requests"],
                      "initiator_requests_after": again["requests"], "failed": 0}), flush=True)


def scenario_soak():
    secs = int(os.environ.get("SOAK_SECONDS", "60"))
    target, name = start_target("tcp", "256M")
    init = initiator(name, "tcp", secs, extra=["--threads=2", "--block_size=262144"])
    samples = []
    t0 = time.monotonic()
    # Samples stop a second before the initiator's end: one taken while it
    # exits would see its memory and descriptors already released.
    while init.poll() is None and time.monotonic() - t0 < secs - 1:
        try:
            samples.append((time.monotonic() - t0, rss(target.pid), fds(target.pid), rss(init.pid), fds(init.pid)))
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(1)
    asan = sanitized(target.pid)
    d = result(init, "soak initiator")
    stop(target)
    warm = [s for s in samples if s[0] >= secs * 0.25]
    if len(warm) < 3:
        fail("too few samples after warm-up")
    out = {"scenario": "soak", "seconds": secs, "requests": d["requests"], "bytes_checked": d["bytes"],
           "failed": 0, "samples": len(warm), "rss_asserted": not asan}
    for col, who, kind in ((1, "target", "rss"), (2, "target", "fds"), (3, "initiator", "rss"),
                           (4, "initiator", "fds")):
        vals = [s[col] for s in warm]
        spread = max(vals) - min(vals)
        out[f"{who}_{kind}_min"], out[f"{who}_{kind}_max"] = min(vals), max(vals)
        if kind == "rss" and asan:
            continue  # AddressSanitizer's quarantine keeps freed memory: RSS climbs to its cap
        limit = max(8 * MIB, max(vals) // 20) if kind == "rss" else 2
        if spread > limit:
            fail(f"{who} {kind} grew from {min(vals)} to {max(vals)} after warm-up")
    print(json.dumps(out), flush=True)


{"initiators": scenario_initiators, "flood": scenario_flood, "soak": scenario_soak}[SCENARIO]()
