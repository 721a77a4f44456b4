# SPDX-License-Identifier: Apache-2.0
"""Prepared transfers: Engine.prepare and Batch.submit_prepared."""
import array

import numpy as np
import pytest

import libte
from conftest import pattern

BS = 4096
N = 64


def lists(p):
    loc = p.a.prepare(libte.LOCAL_SEGMENT, np.arange(N, dtype=np.uint64) * BS + p.aaddr, BS)
    rem = p.a.prepare(p.seg, [p.baddr + i * BS for i in range(N)], [BS] * N)
    return loc, rem


def test_every_byte_and_merging(pair):
    a = pair.a
    loc, rem = lists(pair)
    assert len(loc) == N and loc.segment == 0 and rem.segment == pair.seg.id
    pair.bbuf[: N * BS] = pattern(N * BS, 5)
    ri = (np.arange(N, dtype=np.uint32) * 7) % N  # 4-byte indices, used in place
    with a.batch(N) as b:
        first, tasks, invalid = b.submit_prepared(libte.READ, loc, rem, np.arange(N, dtype=np.uint32), ri)
        assert (first, tasks, invalid) == (0, N, 0)
        b.wait(10)
        b.check()
    for k in range(N):
        assert pair.abuf[k * BS:(k + 1) * BS] == pair.bbuf[int(ri[k]) * BS:(int(ri[k]) + 1) * BS]
    # pairs that continue one another are one task: 8-byte indices, lists
    pair.abuf[: N * BS] = pattern(N * BS, 6)
    with a.batch(N) as b:
        assert b.submit_prepared(libte.WRITE, loc, rem, array.array("Q", range(10, 20)), list(range(30, 40))) == \
            (0, 1, 0)
        # the next one writes the same remote blocks: tasks of a batch run at
        # once (over several connections), so it waits for this one
        b.wait(10)
        assert b.submit_prepared(libte.WRITE, loc, rem, count=N) == (1, 1, 0)
        b.wait(10)
        b.check()
        assert len(b) == 2
    assert pair.bbuf[: N * BS] == pair.abuf[: N * BS]


def test_refused(pair):
    a = pair.a
    loc, rem = lists(pair)
    with a.batch(8) as b:
        with pytest.raises(libte.InvalidArgumentError, match="remote index 64 outside"):
            b.submit_prepared(libte.READ, loc, rem, [0], [N])
        with pytest.raises(IndexError):
            b.submit_prepared(libte.READ, loc, rem, [1 << 40], [0])
        with pytest.raises(ValueError):
            b.submit_prepared(libte.READ, loc, rem, [0, 1], [0])
        with pytest.raises(ValueError):
            b.submit_prepared(libte.READ, loc, rem)  # neither indices nor count
        with pytest.raises(TypeError):
            b.submit_prepared(libte.READ, loc, rem, np.zeros(2, dtype=np.uint16), None)
        with pytest.raises(libte.BatchFullError):
            b.submit_prepared(libte.READ, loc, rem, None, np.arange(N, dtype=np.int64) * 7 % N)
        other = pair.b.prepare(libte.LOCAL_SEGMENT, [pair.baddr], [BS])
        with pytest.raises(ValueError):
            b.submit_prepared(libte.READ, other, rem, [0], [0])
        assert len(b) == 0
    with pytest.raises(libte.AddressError):
        a.prepare(libte.LOCAL_SEGMENT, [pair.aaddr + len(pair.abuf) - 8], [16])
    with pytest.raises(libte.InvalidArgumentError):
        a.prepare(libte.LOCAL_SEGMENT, [pair.aaddr], [0])
    with pytest.raises(ValueError):
        a.prepare(pair.seg, [pair.baddr, pair.baddr + BS], [BS])
    with pytest.raises(TypeError):
        a.prepare(pair.seg, np.zeros(2, dtype=np.float64), BS)


def test_segment_closed(pair):
    a = pair.a
    loc, rem = lists(pair)
    name = pair.seg.name
    pair.seg.close()
    with a.batch(4) as b:
        with pytest.raises(libte.SegmentError, match="prepare it again"):
            b.submit_prepared(libte.READ, loc, rem, count=1)
    seg = a.open_segment(name)
    rem = a.prepare(seg, [pair.baddr], [BS])
    pair.bbuf[:BS] = pattern(BS, 9)
    with a.batch(4) as b:
        b.submit_prepared(libte.READ, loc, rem, count=1)
        b.wait(10)
        b.check()
    assert pair.abuf[:BS] == pair.bbuf[:BS]
