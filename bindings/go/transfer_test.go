// SPDX-License-Identifier: Apache-2.0

package te_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"libte.org/te"
	"libte.org/te/internal/testenv"
)

const mib = 1 << 20

// pair is a target engine with remote-accessible memory and an initiator
// with its own registered memory and the target's segment open.
type pair struct {
	target, init *te.Engine
	tbuf, ibuf   []byte
	seg          *te.Segment
	remote       uint64 // address of tbuf in the target
}

func newPair(t *testing.T, metadata, tname, iname string, size int, opts ...te.Option) *pair {
	t.Helper()
	p := &pair{tbuf: mem(t, size), ibuf: mem(t, size)}
	testenv.Fill(p.tbuf, 1)
	tOpts := append([]te.Option{te.WithTransports("tcp")}, opts...)
	p.target = engine(t, metadata, tname, tOpts...)
	p.init = engine(t, metadata, iname, tOpts...)
	must(t, "target RegisterMemory", p.target.RegisterMemory(p.tbuf, "cpu:0", te.RemoteAccess))
	must(t, "initiator RegisterMemory", p.init.RegisterMemory(p.ibuf, "cpu:0"))
	seg, err := p.init.OpenSegment(p.target.Name())
	must(t, "OpenSegment", err)
	p.seg = seg
	p.remote = addr(p.tbuf)
	bufs, err := seg.Buffers()
	must(t, "Buffers", err)
	if len(bufs) != 1 || bufs[0].Addr != p.remote || bufs[0].Length != uint64(size) {
		t.Fatalf("target's buffers %+v, want one at %#x of %d bytes", bufs, p.remote, size)
	}
	return p
}

// checkTransfers moves data both ways between the pair and checks every
// byte on both sides.
func checkTransfers(t *testing.T, p *pair) {
	ctx := context.Background()
	size := len(p.tbuf)
	want := testenv.Pattern(size, 1)

	// READ the whole target buffer.
	must(t, "Read", p.init.Read(ctx, p.ibuf, p.seg.ID(), p.remote))
	if d := testenv.Diff(p.ibuf, want); d != "" {
		t.Fatalf("Read: %s", d)
	}

	// WRITE a new pattern into the second quarter of the target.
	q := size / 4
	testenv.Fill(p.ibuf, 2)
	must(t, "Write", p.init.Write(ctx, p.ibuf[:q], p.seg.ID(), p.remote+uint64(q)))
	copy(want[q:2*q], testenv.Pattern(q, 2))
	if d := testenv.Diff(p.tbuf, want); d != "" {
		t.Fatalf("target after Write: %s", d)
	}

	// One batch of scattered reads and writes.
	testenv.Fill(p.ibuf, 3)
	src := testenv.Pattern(size, 3)
	const n, chunk = 16, 8 << 10
	var reqs []te.Request
	for i := 0; i < n; i++ {
		local := (i * 5 % n) * chunk
		remote := uint64((i*7%n)*chunk + 2*q)
		op := te.OpRead
		if i%2 == 1 {
			op = te.OpWrite
		}
		reqs = append(reqs, te.Request{Op: op, Segment: p.seg.ID(), Remote: p.remote + remote,
			Local: p.ibuf[local : local+chunk]})
	}
	before := append([]byte(nil), p.tbuf...)
	must(t, "Transfer", p.init.Transfer(ctx, reqs...))
	for i, r := range reqs {
		off := int(r.Remote - p.remote)
		if r.Op == te.OpRead {
			if d := testenv.Diff(r.Local, before[off:off+chunk]); d != "" {
				t.Fatalf("request %d (read): %s", i, d)
			}
		} else {
			lo := int(addr(r.Local) - addr(p.ibuf))
			if d := testenv.Diff(p.tbuf[off:off+chunk], src[lo:lo+chunk]); d != "" {
				t.Fatalf("request %d (write): %s", i, d)
			}
		}
	}
}

func TestP2PHandshake(t *testing.T) {
	p := newPair(t, "P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 4*mib)
	if !strings.HasPrefix(p.target.Name(), "127.0.0.1:") ||
		p.target.Name() != fmt.Sprintf("127.0.0.1:%d", p.target.RPCPort()) {
		t.Fatalf("P2PHANDSHAKE name %q, rpc port %d", p.target.Name(), p.target.RPCPort())
	}
	if p.target.Address() != "127.0.0.1" {
		t.Fatalf("address %q", p.target.Address())
	}
	checkTransfers(t, p)

	tr, err := p.init.Transports()
	must(t, "Transports", err)
	if len(tr) != 1 || tr[0] != "tcp" {
		t.Fatalf("transports %v", tr)
	}
	must(t, "Probe", p.init.Probe(p.target.Name(), 5*time.Second))
	id, err := p.init.FindSegment(p.target.Name())
	must(t, "FindSegment", err)
	if id != p.seg.ID() || id == te.LocalSegment {
		t.Fatalf("FindSegment gave %d, OpenSegment %d", id, p.seg.ID())
	}
	desc, err := p.seg.Descriptor()
	must(t, "Descriptor", err)
	for _, s := range []string{`"name":"` + p.target.Name() + `"`, `"protocol":"tcp"`,
		fmt.Sprintf(`"addr":%d`, p.remote)} {
		if !strings.Contains(desc, s) {
			t.Fatalf("descriptor %s lacks %s", desc, s)
		}
	}
}

// The batch API step by step: ids continue across submits, the capacity
// holds over the batch's life, statuses and the summary tell the truth.
// TestSameHost: with the same-host transport installed too, it serves the
// target (te.Alloc memory: the shared mapping); the bytes are checked as over TCP.
func TestSameHost(t *testing.T) {
	p := newPair(t, "P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 1<<20, te.WithTransports("tcp", "shm"))
	tp, err := p.seg.Transport()
	must(t, "Transport", err)
	if tp != "shm" {
		t.Fatalf("segment served by %q, want shm", tp)
	}
	checkTransfers(t, p)
}

func TestBatch(t *testing.T) {
	p := newPair(t, "P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 1*mib)
	b, err := p.init.NewBatch(4)
	must(t, "NewBatch", err)
	if b.Capacity() != 4 {
		t.Fatalf("capacity %d", b.Capacity())
	}
	const chunk = 64 << 10
	req := func(i int) te.Request {
		return te.Request{Op: te.OpRead, Segment: p.seg.ID(), Remote: p.remote + uint64(i*chunk),
			Local: p.ibuf[(3-i)*chunk : (4-i)*chunk]}
	}
	for _, pairOf := range [][]int{{0, 1}, {2, 3}} {
		inv, err := b.Submit(req(pairOf[0]), req(pairOf[1]))
		if err != nil || inv != 0 {
			t.Fatalf("Submit: %d invalid, %v", inv, err)
		}
	}
	inv, err := b.Submit(req(0))
	wantCode(t, "fifth task in a batch of 4", err, te.ErrBatchFull)
	if inv != 0 {
		t.Fatalf("refused Submit reports %d invalid", inv)
	}
	waitWithin(t, "Wait", 30*time.Second, b.Wait)
	for i := 0; i < 4; i++ {
		st, err := b.Status(i)
		must(t, "Status", err)
		if st.State != te.TaskCompleted || st.Err != nil || st.Transferred != chunk {
			t.Fatalf("task %d: %+v", i, st)
		}
		if d := testenv.Diff(p.ibuf[(3-i)*chunk:(4-i)*chunk], p.tbuf[i*chunk:(i+1)*chunk]); d != "" {
			t.Fatalf("task %d data: %s", i, d)
		}
	}
	sum, err := b.Summary()
	must(t, "Summary", err)
	if sum != (te.BatchSummary{Submitted: 4, InFlight: 0, State: te.TaskCompleted}) {
		t.Fatalf("summary %+v", sum)
	}
	must(t, "Free", b.Free())
}

// The engine's own segment is id 0 and served by local copies.
func TestLocalSegment(t *testing.T) {
	buf := mem(t, 2*mib)
	e := engine(t, "P2PHANDSHAKE", "127.0.0.1", te.WithTransports("tcp"))
	must(t, "RegisterMemory", e.RegisterMemory(buf, "cpu:0"))
	s, err := e.OpenSegment(e.Name())
	must(t, "OpenSegment(own name)", err)
	if s.ID() != te.LocalSegment {
		t.Fatalf("own segment id %d", s.ID())
	}
	bufs, err := s.Buffers()
	must(t, "Buffers", err)
	if len(bufs) != 1 || bufs[0].Addr != addr(buf) || bufs[0].Length != 2*mib {
		t.Fatalf("local buffers %+v", bufs)
	}
	testenv.Fill(buf[mib:], 9)
	must(t, "Read", e.Read(context.Background(), buf[:mib], te.LocalSegment, addr(buf)+mib))
	if d := testenv.Diff(buf[:mib], testenv.Pattern(mib, 9)); d != "" {
		t.Fatalf("local copy: %s", d)
	}
	must(t, "Segment.Close", s.Close())
}

func TestNotifications(t *testing.T) {
	p := newPair(t, "P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 64<<10)
	must(t, "Notify", p.init.Notify(p.seg.ID(), "plain"))
	must(t, "NotifyAs", p.init.NotifyAs(p.seg.ID(), "chosen-sender", "second"))
	b, err := p.init.NewBatch(1)
	must(t, "NewBatch", err)
	_, err = b.Submit(te.Request{Op: te.OpRead, Segment: p.seg.ID(), Remote: p.remote, Local: p.ibuf[:4096]})
	must(t, "Submit", err)
	must(t, "Batch.NotifyAs", b.NotifyAs(p.seg.ID(), "after-batch", "third"))
	empty, err := p.init.NewBatch(1) // no task in flight: sent at once
	must(t, "NewBatch", err)
	must(t, "Batch.Notify", empty.Notify(p.seg.ID(), "fourth"))
	must(t, "Free", empty.Free())
	want := map[te.Notification]bool{
		{Name: p.init.Name(), Msg: "plain"}:    false,
		{Name: "chosen-sender", Msg: "second"}: false,
		{Name: "after-batch", Msg: "third"}:    false,
		{Name: p.init.Name(), Msg: "fourth"}:   false,
	}
	got := 0
	for deadline := time.Now().Add(10 * time.Second); got < len(want) && time.Now().Before(deadline); {
		ns, err := p.target.Notifications()
		must(t, "Notifications", err)
		for _, n := range ns {
			seen, ok := want[n]
			if !ok || seen {
				t.Fatalf("unexpected notification %+v", n)
			}
			want[n] = true
			got++
		}
		time.Sleep(10 * time.Millisecond)
	}
	for n, seen := range want {
		if !seen {
			t.Fatalf("notification %+v never arrived", n)
		}
	}
	ns, err := p.target.Notifications()
	if err != nil || len(ns) != 0 {
		t.Fatalf("notifications taken twice: %v %v", ns, err)
	}
	must(t, "Wait", b.Wait(context.Background()))
	must(t, "Free", b.Free())
}

// The metadata store is a real redis-server started for the test.
func TestRedis(t *testing.T) {
	conn := testenv.Redis(t)
	pid := os.Getpid()
	tname, iname := fmt.Sprintf("go-target-%d", pid), fmt.Sprintf("go-init-%d", pid)
	extra := mem(t, 256<<10)
	p := newPair(t, conn, tname, iname, 2*mib, te.WithAddress("127.0.0.1"))
	if p.target.Name() != tname {
		t.Fatalf("name %q with a store, want %q", p.target.Name(), tname)
	}
	checkTransfers(t, p)

	// A buffer registered later shows up after a refresh.
	testenv.Fill(extra, 5)
	must(t, "RegisterMemory", p.target.RegisterMemory(extra, "cpu:0", te.RemoteAccess))
	n, err := p.init.RefreshSegments()
	must(t, "RefreshSegments", err)
	if n != 1 {
		t.Fatalf("RefreshSegments refreshed %d segments, want 1", n)
	}
	bufs, err := p.seg.Buffers()
	must(t, "Buffers", err)
	if len(bufs) != 2 {
		t.Fatalf("buffers after refresh: %+v", bufs)
	}
	must(t, "Read of the new buffer", p.init.Read(context.Background(), p.ibuf[:len(extra)], p.seg.ID(), addr(extra)))
	if d := testenv.Diff(p.ibuf[:len(extra)], extra); d != "" {
		t.Fatalf("new buffer: %s", d)
	}

	// Names the store does not hold.
	mark := logMark()
	_, err = p.init.OpenSegment(fmt.Sprintf("go-nobody-%d", pid))
	var e *te.Error
	if err == nil || !errorsAs(err, &e) || !strings.Contains(e.Detail, "go-nobody") {
		t.Fatalf("opening an unknown name: %v", err)
	}
	if !logSince(mark, "go-nobody") {
		t.Fatalf("no log line names the unknown segment")
	}
	// Once the target is gone its keys are too: a new initiator cannot open it.
	must(t, "target Close", p.target.Close())
	late := engine(t, conn, fmt.Sprintf("go-late-%d", pid), te.WithAddress("127.0.0.1"), te.WithTransports("tcp"))
	if _, err := late.OpenSegment(tname); err == nil {
		t.Fatalf("segment of a closed engine opened")
	}
}

// A batch may be freed as soon as Status shows every task ended, without
// a Wait (the P2P store's pattern).
func TestFreeAfterStatus(t *testing.T) {
	p := newPair(t, "P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 64<<10)
	for i := 0; i < 200; i++ {
		b, err := p.init.NewBatch(1)
		must(t, "NewBatch", err)
		_, err = b.Submit(te.Request{Op: te.OpRead, Segment: p.seg.ID(), Remote: p.remote + uint64(i%16)*4096,
			Local: p.ibuf[:4096]})
		must(t, "Submit", err)
		for {
			st, err := b.Status(0)
			must(t, "Status", err)
			if st.State.Done() {
				if st.State != te.TaskCompleted {
					t.Fatalf("round %d: %+v", i, st)
				}
				break
			}
		}
		must(t, fmt.Sprintf("Free right after the end state (round %d)", i), b.Free())
		if d := testenv.Diff(p.ibuf[:4096], p.tbuf[(i%16)*4096:(i%16+1)*4096]); d != "" {
			t.Fatalf("round %d: %s", i, d)
		}
	}
}
