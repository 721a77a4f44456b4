# SPDX-License-Identifier: Apache-2.0
"""Engine.stats() and Engine.metrics_text() after real transfers between two engines."""
import pytest

import libte

CHUNK = 64 << 10


def _entry(stats, transport, op):
    found = [t for t in stats["transports"] if t["transport"] == transport and t["op"] == op]
    assert len(found) == 1, f"{transport}/{op} appears {len(found)} times in {stats['transports']}"
    return found[0]


def test_stats_count_per_op_and_transport(pair):
    for i in range(3):
        pair.a.write(pair.seg, pair.aaddr + i * CHUNK, pair.baddr + i * CHUNK, CHUNK)
    pair.a.read(pair.seg, pair.aaddr, pair.baddr, 2 * CHUNK)

    s = pair.a.stats()
    assert isinstance(s, dict) and s["segment"] == pair.a.name
    w, r = _entry(s, "tcp", "write"), _entry(s, "tcp", "read")
    assert (w["requests"], w["bytes"], w["completed"], w["failed"]) == (3, 3 * CHUNK, 3, 0)
    assert (r["requests"], r["bytes"], r["completed"], r["failed"]) == (1, 2 * CHUNK, 1, 0)
    peer = {p["op"]: p for p in s["peers"] if p["peer"] == pair.b.name}
    assert peer["write"]["bytes"] == 3 * CHUNK and peer["read"]["requests"] == 1
    assert w["in_flight"] == r["in_flight"] == 0 and w["in_flight_bytes"] == 0
    lat = w["latency"]
    # One count per bucket, the last for latencies beyond every bound.
    assert lat["count"] == 3 == sum(lat["counts"]) and len(lat["counts"]) == len(lat["le_us"]) + 1
    assert lat["le_us"] == sorted(lat["le_us"]) and lat["sum_us"] >= 0
    # The target counts its registered buffer and started nothing itself.
    t = pair.b.stats()
    assert t["segment"] == pair.b.name
    assert all(e["requests"] == 0 for e in t["transports"])
    assert t["memory"]["registered_bytes"] >= len(pair.bbuf)

    # Each call is a fresh snapshot: one more write shows at once.
    pair.a.write(pair.seg, pair.aaddr, pair.baddr, CHUNK)
    assert _entry(pair.a.stats(), "tcp", "write")["bytes"] == 4 * CHUNK


def test_metrics_text_matches_stats(pair):
    pair.a.write(pair.seg, pair.aaddr, pair.baddr, CHUNK)
    text = pair.a.metrics_text()
    assert isinstance(text, str) and text.endswith("\n")
    assert "# TYPE " in text and 'transport="tcp"' in text and pair.a.name in text
    # Every sample line is "name{labels} value" with a number for value.
    for line in text.splitlines():
        if line and not line.startswith("#"):
            float(line.rsplit(" ", 1)[1])
    # A series with the write's bytes, labelled with the operation.
    assert any('op="write"' in line and line.rsplit(" ", 1)[1] in (str(CHUNK), f"{CHUNK}.0", f"{float(CHUNK):g}")
               for line in text.splitlines() if "bytes" in line.split("{")[0])


def test_stats_refused_and_closed(pair):
    # A read outside the target's buffer is refused: a request and a
    # failure of its transport and peer, no byte moved.
    with pytest.raises(libte.AddressError):
        pair.a.read(pair.seg, pair.aaddr, pair.baddr + len(pair.bbuf), CHUNK)
    s = pair.a.stats()
    r = _entry(s, "tcp", "read")
    assert (r["requests"], r["failed"], r["completed"], r["bytes"]) == (1, 1, 0, 0)
    peer = [p for p in s["peers"] if p["peer"] == pair.b.name and p["op"] == "read"]
    assert len(peer) == 1 and peer[0]["failed"] == 1 and not peer[0]["other"]
    pair.a.close()
    with pytest.raises(libte.ClosedError):
        pair.a.stats()
    with pytest.raises(libte.ClosedError):
        pair.a.metrics_text()


def test_stats_off():
    with libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports="tcp", options={"TE_METRICS": "0"}) as e:
        with pytest.raises(libte.NotSupportedError):
            e.stats()
        with pytest.raises(libte.NotSupportedError):
            e.metrics_text()


def test_stats_in_flight_and_devices(hold):
    b = hold.a.batch(2)
    b.submit([libte.Request.read(hold.seg, hold.aaddr, hold.baddr, 4096),
              libte.Request.read(hold.seg, hold.aaddr + 8192, hold.baddr + 8192, 8192)])
    s = hold.a.stats()
    r = _entry(s, "hold", "read")
    assert (r["requests"], r["in_flight"], r["in_flight_bytes"], r["completed"]) == (2, 2, 12288, 0)
    dev = [d for d in s["devices"] if d["transport"] == "hold"]
    assert [d["device"] for d in dev] == ["hold0"] and dev[0]["in_flight_bytes"] == 12288
    assert hold.release(0) == 2
    assert b.wait(10)
    s = hold.a.stats()
    r = _entry(s, "hold", "read")
    assert (r["in_flight"], r["in_flight_bytes"], r["completed"], r["bytes"]) == (0, 0, 2, 12288)
    dev = [d for d in s["devices"] if d["transport"] == "hold"][0]
    assert dev["in_flight_bytes"] == 0 and dev["bytes"] == 12288 and dev["bandwidth_bytes_per_second"] > 0
    b.free()
