// SPDX-License-Identifier: Apache-2.0

package te_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"libte.org/te"
)

// logs keeps libte's log lines so tests can check that a refusal was
// explained; they are printed only with -v.
var logs struct {
	sync.Mutex
	lines []string
}

func TestMain(m *testing.M) {
	verbose := os.Getenv("TE_GO_TEST_LOG") != ""
	te.SetLogHandler(func(level te.LogLevel, domain, msg string) {
		line := domain + ": " + msg
		logs.Lock()
		logs.lines = append(logs.lines, line)
		logs.Unlock()
		if verbose {
			os.Stderr.WriteString("libte " + line + "\n")
		}
	})
	os.Exit(m.Run())
}

// logMark is where the log stands now; logSince(mark, s) looks for s after it.
func logMark() int {
	logs.Lock()
	defer logs.Unlock()
	return len(logs.lines)
}

func logSince(mark int, s string) bool {
	logs.Lock()
	defer logs.Unlock()
	for _, l := range logs.lines[mark:] {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// mem maps n bytes with te.Alloc and frees them when the test ends; the
// Free must succeed then, so call it before creating the engines that
// register the memory (cleanups run last-in first-out: engines close first).
func mem(t *testing.T, n int) []byte {
	t.Helper()
	b, err := te.Alloc(n)
	if err != nil {
		t.Fatalf("Alloc(%d): %v", n, err)
	}
	t.Cleanup(func() {
		if err := te.Free(b); err != nil {
			t.Errorf("Free at the end of the test: %v", err)
		}
	})
	return b
}

// engine creates an engine closed when the test ends.
func engine(t *testing.T, metadata, name string, opts ...te.Option) *te.Engine {
	t.Helper()
	e, err := te.NewEngine(metadata, name, opts...)
	if err != nil {
		t.Fatalf("NewEngine(%q, %q): %v", metadata, name, err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil && !errors.Is(err, te.ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return e
}

func addr(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

// wantCode fails unless err is a *te.Error with code c.
func wantCode(t *testing.T, what string, err error, c te.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want %v", what, c)
	}
	var te_ *te.Error
	if !errors.As(err, &te_) {
		t.Fatalf("%s: error %T %v is no *te.Error", what, err, err)
	}
	if !errors.Is(err, c) || te_.Code != c {
		t.Fatalf("%s: %v (code %d), want code %d (%v)", what, err, int(te_.Code), int(c), c)
	}
}

// waitWithin runs wait (a Batch's Wait or WaitSettled) with a context that
// times out after d, and fails the test, naming what, on its error.
func waitWithin(t *testing.T, what string, d time.Duration, wait func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	must(t, what, wait(ctx))
}

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func errorsAs(err error, target **te.Error) bool { return errors.As(err, target) }
