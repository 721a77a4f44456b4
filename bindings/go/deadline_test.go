// SPDX-License-Identifier: Apache-2.0

package te_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"libte.org/te"
	"libte.org/te/internal/testenv"
)

// Deadlines are recorded per task (the submit's, else the batch's), refused
// when negative, and the flags and WaitSettled work on tasks that end
// normally. The hold transport does not honour deadlines: its tasks go on
// past them.
func TestDeadlineCalls(t *testing.T) {
	a, now := te.NowNs(), time.Now()
	if d := te.DeadlineNs(now) - a; a <= 0 || d < -int64(time.Millisecond) || d > int64(50*time.Millisecond) || te.NowNs() < a {
		t.Fatalf("NowNs %d, DeadlineNs(now) %d", a, te.DeadlineNs(now))
	}
	if d := te.DeadlineNs(now.Add(time.Second)) - a; d < int64(999*time.Millisecond) || d > int64(1050*time.Millisecond) {
		t.Fatalf("DeadlineNs a second from now: %d ns from NowNs", d)
	}
	if d := te.DeadlineNs(time.Now().Add(-time.Hour)); d < 1 || d > te.NowNs()-int64(59*time.Minute) {
		t.Fatalf("DeadlineNs an hour ago: %d, now %d", d, te.NowNs())
	}
	p, hold := holdPair(t)
	b, err := p.init.NewBatch(4)
	must(t, "NewBatch", err)
	wantCode(t, "SetDeadline(-1)", b.SetDeadline(-1), te.ErrInvalid)
	_, err = b.SubmitBy(-5, readReq(p, 0, 64))
	wantCode(t, "SubmitBy(-5)", err, te.ErrInvalid)
	if sum, _ := b.Summary(); sum.Submitted != 0 || hold.Count() != 0 {
		t.Fatalf("a refused submit appended tasks: %+v", sum)
	}
	_, err = b.TaskInfo(0)
	if err == nil {
		t.Fatalf("TaskInfo of a task never submitted: no error")
	}
	d1, d2 := te.NowNs()+int64(time.Minute), te.NowNs()+int64(50*time.Millisecond)
	must(t, "SetDeadline", b.SetDeadline(d1))
	if _, err := b.Submit(readReq(p, 0, 64)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.SubmitBy(d2, readReq(p, 64, 64)); err != nil {
		t.Fatal(err)
	}
	must(t, "SetDeadline(0)", b.SetDeadline(0))
	if _, err := b.Submit(readReq(p, 128, 64)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond) // past d2
	for i, want := range []int64{d1, d2, 0} {
		ti, err := b.TaskInfo(i)
		must(t, "TaskInfo", err)
		if ti.DeadlineNs != want || ti.State != te.TaskWaiting || ti.Flags != 0 {
			t.Fatalf("task %d: %+v, want deadline %d, in flight, no flags", i, ti, want)
		}
	}
	if n := hold.Release(0); n != 3 {
		t.Fatalf("released %d, want 3", n)
	}
	waitWithin(t, "WaitSettled", 5*time.Second, b.WaitSettled)
	for i := 0; i < 3; i++ {
		ti, err := b.TaskInfo(i)
		if err != nil || ti.State != te.TaskCompleted || ti.Err != nil || ti.Flags != 0 || ti.Transferred != 64 {
			t.Fatalf("task %d after release: %+v %v", i, ti, err)
		}
	}
	must(t, "Free", b.Free())
}

// Over TCP to a live peer: with a deadline already passed, every task ends
// completed with its bytes, or failed with ErrTimeout and TaskEndedEarly;
// and a Read whose ctx deadline passed returns DeadlineExceeded.
func TestDeadlinePassed(t *testing.T) {
	p := newPair(t, "P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 4*mib)
	b, err := p.init.NewBatch(64)
	must(t, "NewBatch", err)
	defer func() { _ = b.Free() }()
	const chunk = 64 << 10
	var reqs []te.Request
	for i := 0; i < 64; i++ {
		reqs = append(reqs, readReq(p, i*chunk, chunk))
	}
	if inv, err := b.SubmitBy(1, reqs...); err != nil || inv != 0 {
		t.Fatalf("SubmitBy: %d invalid, %v", inv, err)
	}
	waitWithin(t, "Wait", 5*time.Second, b.Wait)
	want := testenv.Pattern(4*mib, 1)
	for i := 0; i < 64; i++ {
		ti, err := b.TaskInfo(i)
		must(t, "TaskInfo", err)
		if ti.DeadlineNs != 1 {
			t.Fatalf("task %d deadline %d, want 1", i, ti.DeadlineNs)
		}
		switch {
		case ti.State == te.TaskCompleted && ti.Flags == 0:
			if d := testenv.Diff(p.ibuf[i*chunk:(i+1)*chunk], want[i*chunk:(i+1)*chunk]); d != "" {
				t.Fatalf("task %d completed: %s", i, d)
			}
		case ti.State == te.TaskFailed && errors.Is(ti.Err, te.ErrTimeout) && ti.Flags == te.TaskEndedEarly:
		default:
			t.Fatalf("task %d: %+v", i, ti)
		}
	}
	past, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	if err := p.init.Read(past, p.ibuf[:mib], p.seg.ID(), p.remote); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Read with a passed deadline: %v", err)
	}
}

// Over "holddl", a transport that honours deadlines and holds every
// transfer (a peer that stopped answering): Read returns at ctx's deadline
// and its buffer stays as it was when the transfer is let go later; a write
// ended at its deadline is unsettled until then, and WaitSettled waits for
// it; Cancel ends a task in flight at once.
func TestDeadlineHeldPeer(t *testing.T) {
	const size = 256 << 10
	p, hold := holdPairOn(t, "holddl")

	testenv.Fill(p.ibuf, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	start := time.Now()
	err := p.init.Read(ctx, p.ibuf, p.seg.ID(), p.remote)
	cancel()
	if el := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || el < 190*time.Millisecond || el > 400*time.Millisecond {
		t.Fatalf("Read with a 200 ms deadline: %v after %v", err, el)
	}
	if n := hold.Release(0); n != 1 {
		t.Fatalf("released %d, want the read still held", n)
	}
	if d := testenv.Diff(p.ibuf, testenv.Pattern(size, 2)); d != "" {
		t.Fatalf("a read ended at its deadline moved bytes: %s", d)
	}

	b, err := p.init.NewBatch(2)
	must(t, "NewBatch", err)
	defer func() { _ = b.Free() }()
	w := te.Request{Op: te.OpWrite, Segment: p.seg.ID(), Remote: p.remote, Local: p.ibuf[:4096]}
	if _, err := b.SubmitBy(te.NowNs()+int64(100*time.Millisecond), w); err != nil {
		t.Fatal(err)
	}
	wait, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	must(t, "Wait", b.Wait(wait))
	ti, err := b.TaskInfo(0)
	must(t, "TaskInfo", err)
	if ti.State != te.TaskFailed || !errors.Is(ti.Err, te.ErrTimeout) || ti.Flags != te.TaskEndedEarly|te.TaskUnsettled {
		t.Fatalf("write ended at its deadline: %+v", ti)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if err := b.WaitSettled(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitSettled while the write may still land: %v", err)
	}
	if _, err := b.Submit(readReq(p, 8192, 4096)); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	must(t, "Cancel", b.Cancel())
	must(t, "Wait", b.Wait(wait))
	if el := time.Since(start); el > 100*time.Millisecond {
		t.Fatalf("Cancel ended the held read after %v", el)
	}
	if ti, _ := b.TaskInfo(1); ti.State != te.TaskCanceled || ti.Flags != te.TaskEndedEarly {
		t.Fatalf("canceled read: %+v", ti)
	}
	if n := hold.Release(0); n != 2 {
		t.Fatalf("released %d, want 2", n)
	}
	must(t, "WaitSettled", b.WaitSettled(wait))
	if ti, _ := b.TaskInfo(0); ti.Flags != te.TaskEndedEarly {
		t.Fatalf("write after its release: %+v", ti)
	}
	if d := testenv.Diff(p.tbuf, testenv.Pattern(size, 1)); d != "" {
		t.Fatalf("the ended write moved bytes: %s", d)
	}
}
