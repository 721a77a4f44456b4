// SPDX-License-Identifier: Apache-2.0

package te_test

import (
	"context"
	"strings"
	"syscall"
	"testing"

	"libte.org/te"
)

// Stats counts what a pair of engines moved, per transport and operation,
// and MetricsText says the same in the Prometheus format.
func TestStatsCountTransfers(t *testing.T) {
	const chunk = 64 << 10
	p := newPair(t, "P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 4*chunk)
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		must(t, "Write", p.init.Write(ctx, p.ibuf[i*chunk:(i+1)*chunk], p.seg.ID(), p.remote+uint64(i*chunk)))
	}
	must(t, "Read", p.init.Read(ctx, p.ibuf[:2*chunk], p.seg.ID(), p.remote))

	s, err := p.init.Stats()
	must(t, "Stats", err)
	if s.Segment != p.init.Name() {
		t.Fatalf("segment %q, want %q", s.Segment, p.init.Name())
	}
	w, r := s.Transport("tcp", "write"), s.Transport("tcp", "read")
	if w == nil || r == nil {
		t.Fatalf("no tcp read and write counters in %+v", s.Transports)
	}
	if w.Requests != 3 || w.Bytes != 3*chunk || w.Completed != 3 || w.Failed != 0 || w.InFlight != 0 {
		t.Fatalf("tcp writes %+v, want 3 requests of %d bytes completed", *w, chunk)
	}
	if r.Requests != 1 || r.Bytes != 2*chunk || r.Completed != 1 || r.InFlightBytes != 0 {
		t.Fatalf("tcp reads %+v, want 1 request of %d bytes completed", *r, 2*chunk)
	}
	var inBuckets uint64
	for _, c := range w.Latency.Counts {
		inBuckets += c
	}
	if w.Latency.Count != 3 || inBuckets != 3 || len(w.Latency.LeUS) == 0 ||
		len(w.Latency.Counts) != len(w.Latency.LeUS)+1 {
		t.Fatalf("write latency %+v, want 3 tasks over the buckets", w.Latency)
	}
	if pw := s.Peer(p.target.Name(), "write"); pw == nil || pw.Bytes != 3*chunk || pw.Requests != 3 {
		t.Fatalf("writes to the peer %q: %+v in %+v", p.target.Name(), pw, s.Peers)
	}
	// The target started no task of its own.
	ts, err := p.target.Stats()
	must(t, "target Stats", err)
	if tw := ts.Transport("tcp", "write"); tw != nil && tw.Requests != 0 {
		t.Fatalf("target counts %d writes of its own", tw.Requests)
	}
	if ts.Memory.RegisteredBytes < uint64(len(p.tbuf)) || ts.Memory.RegisteredRegions < 1 {
		t.Fatalf("target memory %+v, want its %d-byte buffer", ts.Memory, len(p.tbuf))
	}

	text, err := p.init.MetricsText()
	must(t, "MetricsText", err)
	if !strings.Contains(text, "# TYPE ") || !strings.Contains(text, `transport="tcp"`) {
		t.Fatalf("MetricsText has no typed tcp series:\n%s", text)
	}
	if !strings.Contains(text, p.init.Name()) {
		t.Fatalf("MetricsText does not name the engine %q", p.init.Name())
	}
}

// Tasks held by the "hold" transport show as in flight, then as canceled
// or failed once they end, never as bytes moved.
func TestStatsInFlight(t *testing.T) {
	p, hold := holdPair(t)
	b, err := p.init.NewBatch(2)
	must(t, "NewBatch", err)
	if inv, err := b.Submit(readReq(p, 0, 4096), readReq(p, 8192, 8192)); err != nil || inv != 0 {
		t.Fatalf("Submit: %d invalid, %v", inv, err)
	}
	s, err := p.init.Stats()
	must(t, "Stats", err)
	r := s.Transport("hold", "read")
	if r == nil || r.Requests != 2 || r.InFlight != 2 || r.InFlightBytes != 4096+8192 || r.Completed != 0 {
		t.Fatalf("held reads %+v, want 2 in flight with 12288 bytes", r)
	}
	hold.Release(-int(syscall.EIO))
	must(t, "Wait", b.Wait(context.Background()))
	s, err = p.init.Stats()
	must(t, "Stats", err)
	r = s.Transport("hold", "read")
	if r == nil || r.InFlight != 0 || r.InFlightBytes != 0 || r.Failed != 2 || r.Completed != 0 {
		t.Fatalf("failed reads %+v, want 2 failed, none in flight", r)
	}
	must(t, "Free", b.Free())
}

func TestStatsClosedEngine(t *testing.T) {
	e := engine(t, "P2PHANDSHAKE", "127.0.0.1", te.WithTransports("tcp"))
	must(t, "Close", e.Close())
	_, err := e.Stats()
	wantCode(t, "Stats after Close", err, te.ErrClosed)
	_, err = e.MetricsText()
	wantCode(t, "MetricsText after Close", err, te.ErrClosed)
}

// TE_METRICS=0 switches counting off for that engine: both calls say so.
func TestStatsOff(t *testing.T) {
	e := engine(t, "P2PHANDSHAKE", "127.0.0.1", te.WithTransports("tcp"), te.WithOption("TE_METRICS", "0"))
	_, err := e.Stats()
	wantCode(t, "Stats with TE_METRICS=0", err, te.ErrNotSupported)
	_, err = e.MetricsText()
	wantCode(t, "MetricsText with TE_METRICS=0", err, te.ErrNotSupported)
}
