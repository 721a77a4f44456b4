// SPDX-License-Identifier: Apache-2.0

package te_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"libte.org/te"
	"libte.org/te/internal/testenv"
)

// Goroutines submitting at once to one engine, each with batches of its
// own, reading and writing disjoint ranges; every byte is checked.
func TestConcurrentEngine(t *testing.T) {
	const workers, part, iters = 8, 512 << 10, 6
	p := newPair(t, "P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 2*workers*part)
	orig := testenv.Pattern(len(p.tbuf), 1)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			errs <- worker(p, w, part, iters, orig)
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// The target holds what each worker wrote last, and the untouched half.
	for w := 0; w < workers; w++ {
		off := (workers + w) * part
		want := testenv.Pattern(part, uint32(1000+w*iters+iters-1))
		if d := testenv.Diff(p.tbuf[off:off+part], want); d != "" {
			t.Fatalf("worker %d's region in the target: %s", w, d)
		}
	}
	if d := testenv.Diff(p.tbuf[:workers*part], orig[:workers*part]); d != "" {
		t.Fatalf("read-only half of the target changed: %s", d)
	}
}

// worker w reads its slice of the target's first half, writes a fresh
// pattern into its slice of the second half and reads it back, iters times,
// through Read/Write, Transfer and a batch of its own.
func worker(p *pair, w, part, iters int, orig []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	local := p.ibuf[2*w*part : 2*(w+1)*part]
	in, out := local[:part], local[part:]
	roff, woff := w*part, (len(p.tbuf)/2)+w*part
	for it := 0; it < iters; it++ {
		seed := uint32(1000 + w*iters + it)
		// Read the read-only slice, in halves on odd rounds.
		for i := range in {
			in[i] = 0
		}
		var err error
		if it%2 == 0 {
			err = p.init.Read(ctx, in, p.seg.ID(), p.remote+uint64(roff))
		} else {
			h := part / 2
			err = p.init.Transfer(ctx,
				te.Request{Op: te.OpRead, Segment: p.seg.ID(), Remote: p.remote + uint64(roff), Local: in[:h]},
				te.Request{Op: te.OpRead, Segment: p.seg.ID(), Remote: p.remote + uint64(roff+h), Local: in[h:]})
		}
		if err != nil {
			return fmt.Errorf("worker %d round %d read: %w", w, it, err)
		}
		if d := testenv.Diff(in, orig[roff:roff+part]); d != "" {
			return fmt.Errorf("worker %d round %d read: %s", w, it, d)
		}
		// Write a new pattern with a batch of our own, then read it back.
		testenv.Fill(out, seed)
		b, err := p.init.NewBatch(1)
		if err != nil {
			return err
		}
		if inv, err := b.Submit(te.Request{Op: te.OpWrite, Segment: p.seg.ID(),
			Remote: p.remote + uint64(woff), Local: out}); err != nil || inv != 0 {
			return fmt.Errorf("worker %d submit: %d invalid, %v", w, inv, err)
		}
		if err := b.Wait(ctx); err != nil {
			return err
		}
		st, err := b.Status(0)
		if err != nil || st.State != te.TaskCompleted || st.Transferred != uint64(part) {
			return fmt.Errorf("worker %d write status %+v %v", w, st, err)
		}
		if err := b.Free(); err != nil {
			return err
		}
		for i := range in {
			in[i] = 0
		}
		if err := p.init.Read(ctx, in, p.seg.ID(), p.remote+uint64(woff)); err != nil {
			return err
		}
		if d := testenv.Diff(in, testenv.Pattern(part, seed)); d != "" {
			return fmt.Errorf("worker %d round %d read back: %s", w, it, d)
		}
	}
	return nil
}

// Goroutines submitting at once to one batch while another watches its
// summary: every task lands once, completes, and moves the right bytes.
func TestConcurrentBatch(t *testing.T) {
	const workers, per, chunk = 8, 24, 8 << 10
	p := newPair(t, "P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", workers*per*chunk)
	b, err := p.init.NewBatch(workers * per)
	must(t, "NewBatch", err)
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, workers+1)
	n := workers * per
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			<-start
			// Each submit is a few requests; local slot k reads remote slot
			// n-1-k, so a misplaced task shows in the data.
			for i := 0; i < per; i += 3 {
				var reqs []te.Request
				for j := i; j < i+3 && j < per; j++ {
					k := w*per + j
					reqs = append(reqs, te.Request{Op: te.OpRead, Segment: p.seg.ID(),
						Remote: p.remote + uint64((n-1-k)*chunk), Local: p.ibuf[k*chunk : (k+1)*chunk]})
				}
				if inv, err := b.Submit(reqs...); err != nil || inv != 0 {
					errs <- fmt.Errorf("worker %d: submit %d invalid, %v", w, inv, err)
					return
				}
			}
		}(w)
	}
	watch := make(chan struct{})
	go func() {
		defer close(watch)
		for {
			s, err := b.Summary()
			if err != nil || s.InFlight > s.Submitted || s.Submitted > n {
				errs <- fmt.Errorf("summary %+v %v", s, err)
				return
			}
			if s.Submitted == n {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	close(start)
	wg.Wait()
	<-watch
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	waitWithin(t, "Wait", 60*time.Second, b.Wait)
	sum, err := b.Summary()
	if err != nil || sum != (te.BatchSummary{Submitted: n, State: te.TaskCompleted}) {
		t.Fatalf("summary %+v %v", sum, err)
	}
	for i := 0; i < n; i++ {
		st, err := b.Status(i)
		if err != nil || st.State != te.TaskCompleted || st.Transferred != chunk {
			t.Fatalf("task %d: %+v %v", i, st, err)
		}
	}
	for k := 0; k < n; k++ {
		r := n - 1 - k
		if d := testenv.Diff(p.ibuf[k*chunk:(k+1)*chunk], p.tbuf[r*chunk:(r+1)*chunk]); d != "" {
			t.Fatalf("slot %d: %s", k, d)
		}
	}
	must(t, "Free", b.Free())
}

// Close while other goroutines use the engine, its segment and batches:
// they see ErrClosed, nothing crashes, the memory can be freed afterwards.
func TestCloseDuringCalls(t *testing.T) {
	p := newPair(t, "P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 1*mib)
	spare := p.ibuf[512<<10:]
	must(t, "UnregisterMemory", p.init.UnregisterMemory(p.ibuf))
	must(t, "RegisterMemory", p.init.RegisterMemory(p.ibuf[:512<<10], "cpu:0"))
	shared, err := p.init.NewBatch(1 << 20)
	must(t, "NewBatch", err)
	ops := map[string]func(i int) error{
		"read": func(i int) error {
			part := p.ibuf[(i%4)*(64<<10) : (i%4+1)*(64<<10)]
			err := p.init.Read(context.Background(), part, p.seg.ID(), p.remote+uint64(i%4)*(64<<10))
			if err == nil {
				if d := testenv.Diff(part, p.tbuf[(i%4)*(64<<10):(i%4+1)*(64<<10)]); d != "" {
					return errors.New(d)
				}
			}
			return err
		},
		"submit-shared": func(i int) error {
			_, err := shared.Submit(te.Request{Op: te.OpRead, Segment: p.seg.ID(), Remote: p.remote,
				Local: p.ibuf[256<<10 : 256<<10+4096]})
			if err == nil {
				_, err = shared.Summary()
			}
			return err
		},
		"buffers": func(int) error { _, err := p.seg.Buffers(); return err },
		"notifications": func(int) error {
			_, err := p.target.Notifications()
			if err == nil {
				_, err = p.init.Notifications()
			}
			return err
		},
		"register": func(int) error {
			if err := p.init.RegisterMemory(spare, "cpu:0"); err != nil {
				return err
			}
			return p.init.UnregisterMemory(spare)
		},
		"batch": func(int) error {
			b, err := p.init.NewBatch(1)
			if err != nil {
				return err
			}
			if err := b.Wait(context.Background()); err != nil {
				return err
			}
			return b.Free()
		},
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(ops))
	for name, op := range ops {
		wg.Add(1)
		go func(name string, op func(int) error) {
			defer wg.Done()
			for i := 0; ; i++ {
				err := op(i)
				if err == nil {
					continue
				}
				if errors.Is(err, te.ErrClosed) {
					if i == 0 && name != "notifications" {
						errs <- fmt.Errorf("%s: closed before its first call", name)
					}
					return
				}
				errs <- fmt.Errorf("%s call %d: %w", name, i, err)
				return
			}
		}(name, op)
	}
	time.Sleep(300 * time.Millisecond)
	var cwg sync.WaitGroup
	closeErrs := make([]error, 2)
	for i := range closeErrs {
		cwg.Add(1)
		go func(i int) { defer cwg.Done(); closeErrs[i] = p.init.Close() }(i)
	}
	cwg.Wait()
	if (closeErrs[0] == nil) == (closeErrs[1] == nil) {
		t.Fatalf("two concurrent Closes returned %v and %v; want one nil, one ErrClosed", closeErrs[0], closeErrs[1])
	}
	must(t, "target Close", p.target.Close())
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("calls still running 20 s after Close")
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	wantCode(t, "Free of a batch of a closed engine", shared.Free(), te.ErrClosed)
}
