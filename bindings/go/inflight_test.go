// SPDX-License-Identifier: Apache-2.0

package te_test

import (
	"context"
	"errors"
	"runtime"
	"syscall"
	"testing"
	"time"

	"libte.org/te"
	"libte.org/te/internal/testenv"
)

// holdPair is a pair of engines on the "hold" test transport, which keeps
// every transfer in flight until the test releases it.
func holdPair(t *testing.T) (*pair, testenv.Hold) {
	t.Helper()
	return holdPairOn(t, "hold")
}

// holdPairOn is holdPair on transport "hold" or "holddl" (the hold
// transport that honours deadlines).
func holdPairOn(t *testing.T, transport string) (*pair, testenv.Hold) {
	t.Helper()
	const size = 256 << 10
	p := &pair{tbuf: mem(t, size), ibuf: mem(t, size)}
	testenv.Fill(p.tbuf, 1)
	p.target = engine(t, "P2PHANDSHAKE", "127.0.0.1", te.WithTransports(transport))
	p.init = engine(t, "P2PHANDSHAKE", "127.0.0.1", te.WithTransports(transport))
	plugin := testenv.HoldPlugin
	if transport == "holddl" {
		plugin = testenv.HoldDLPlugin
	}
	hold := plugin(t)
	t.Cleanup(func() { hold.Release(-int(syscall.ECANCELED)) }) // never leave transfers held
	must(t, "RegisterMemory", p.target.RegisterMemory(p.tbuf, "cpu:0", te.RemoteAccess))
	must(t, "RegisterMemory", p.init.RegisterMemory(p.ibuf, "cpu:0"))
	seg, err := p.init.OpenSegmentWith(p.target.Name(), transport)
	must(t, "OpenSegmentWith("+transport+")", err)
	p.seg, p.remote = seg, addr(p.tbuf)
	return p, hold
}

func readReq(p *pair, off, n int) te.Request {
	return te.Request{Op: te.OpRead, Segment: p.seg.ID(), Remote: p.remote + uint64(off), Local: p.ibuf[off : off+n]}
}

// Memory in use by tasks in flight can be neither unregistered nor freed,
// nor the batch freed; Wait honours its context without leaving goroutines.
func TestInFlight(t *testing.T) {
	p, hold := holdPair(t)
	b, err := p.init.NewBatch(2)
	must(t, "NewBatch", err)
	inv, err := b.Submit(readReq(p, 0, 4096), readReq(p, 8192, 4096))
	if err != nil || inv != 0 {
		t.Fatalf("Submit: %d invalid, %v", inv, err)
	}
	if n := hold.Count(); n != 2 {
		t.Fatalf("%d transfers held, want 2", n)
	}
	sum, err := b.Summary()
	if err != nil || sum.InFlight != 2 || sum.State != te.TaskWaiting {
		t.Fatalf("summary in flight: %+v %v", sum, err)
	}
	wantCode(t, "UnregisterMemory under tasks in flight", p.init.UnregisterMemory(p.ibuf), te.ErrBusy)
	wantCode(t, "Free under tasks in flight", te.Free(p.ibuf), te.ErrBusy)
	wantCode(t, "Batch.Free with tasks in flight", b.Free(), te.ErrBusy)
	// A batch notification waits for the tasks; one at a time.
	must(t, "Batch.Notify", b.Notify(p.seg.ID(), "after the held tasks"))
	wantCode(t, "second notification pending on a batch", b.Notify(p.seg.ID(), "x"), te.ErrBusy)
	time.Sleep(50 * time.Millisecond)
	if ns, err := p.target.Notifications(); err != nil || len(ns) != 0 {
		t.Fatalf("notification sent before the batch ended: %v %v", ns, err)
	}

	goroutines := runtime.NumGoroutine()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	start := time.Now()
	err = b.Wait(ctx)
	cancel()
	if el := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || el < 90*time.Millisecond || el > 2*time.Second {
		t.Fatalf("Wait with a 100 ms deadline: %v after %v", err, el)
	}
	ctx, cancel = context.WithCancel(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	if err := b.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait canceled: %v", err)
	}
	time.Sleep(20 * time.Millisecond)
	if g := runtime.NumGoroutine(); g > goroutines {
		t.Fatalf("%d goroutines after the waits, %d before", g, goroutines)
	}

	if n := hold.Release(0); n != 2 {
		t.Fatalf("released %d", n)
	}
	must(t, "Wait", b.Wait(context.Background()))
	for i := 0; i < 2; i++ {
		st, err := b.Status(i)
		if err != nil || st.State != te.TaskCompleted {
			t.Fatalf("task %d: %+v %v", i, st, err)
		}
	}
	if d := testenv.Diff(p.ibuf[8192:12288], p.tbuf[8192:12288]); d != "" {
		t.Fatalf("held read: %s", d)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ns, err := p.target.Notifications()
		must(t, "Notifications", err)
		if len(ns) == 1 && ns[0] == (te.Notification{Name: p.init.Name(), Msg: "after the held tasks"}) {
			break
		}
		if len(ns) != 0 || time.Now().After(deadline) {
			t.Fatalf("batch notification: %+v", ns)
		}
	}
	// Idle now: everything may go.
	must(t, "UnregisterMemory", p.init.UnregisterMemory(p.ibuf))
	must(t, "RegisterMemory", p.init.RegisterMemory(p.ibuf, "cpu:0"))
	must(t, "Free", b.Free())
}

func TestCancelAndFailures(t *testing.T) {
	p, hold := holdPair(t)
	ctx := context.Background()

	// Cancel: held tasks end CANCELED.
	b, err := p.init.NewBatch(1)
	must(t, "NewBatch", err)
	_, err = b.Submit(readReq(p, 0, 4096))
	must(t, "Submit", err)
	must(t, "Cancel", b.Cancel())
	hold.Release(0)
	must(t, "Wait", b.Wait(ctx))
	st, err := b.Status(0)
	if err != nil || st.State != te.TaskCanceled || !errors.Is(st.Err, te.ErrCanceled) {
		t.Fatalf("canceled task: %+v %v", st, err)
	}
	must(t, "Free", b.Free())

	// A failed transfer reports its code through Read.
	for _, c := range []struct {
		errno syscall.Errno
		code  te.Code
	}{{syscall.EIO, te.ErrIO}, {syscall.ETIMEDOUT, te.ErrTimeout}} {
		done := make(chan error, 1)
		go func() { done <- p.init.Read(ctx, p.ibuf[:4096], p.seg.ID(), p.remote) }()
		waitHeld(t, hold, 1)
		hold.Release(-int(c.errno))
		err := <-done
		wantCode(t, "Read failed by the transport", err, c.code)
	}

	// Transfer gives up at its context's end: it cancels the batch, waits
	// for it to settle, frees it, and returns ctx.Err().
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.init.Transfer(cctx, readReq(p, 0, 4096), readReq(p, 4096, 4096)) }()
	waitHeld(t, hold, 2)
	<-cctx.Done()
	// Transfer's last wait ends at the deadline; give it time to see the
	// context end and cancel before the held transfers come back (released
	// earlier they would complete, and Transfer rightly return nil).
	time.Sleep(500 * time.Millisecond)
	var terr error
	for deadline := time.Now().Add(10 * time.Second); ; {
		hold.Release(0) // the settle after cancel needs the held transfers back
		select {
		case terr = <-done:
		case <-time.After(10 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatalf("Transfer did not return after its context ended")
			}
			continue
		}
		break
	}
	if !errors.Is(terr, context.DeadlineExceeded) {
		t.Fatalf("Transfer past its deadline: %v", terr)
	}
	// Its batch is gone and idle: the memory can be unregistered.
	must(t, "UnregisterMemory after the abandoned Transfer", p.init.UnregisterMemory(p.ibuf))
}

func waitHeld(t *testing.T, hold testenv.Hold, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); hold.Count() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d transfers held, waited for %d", hold.Count(), n)
		}
	}
}
