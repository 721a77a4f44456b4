// SPDX-License-Identifier: Apache-2.0

package te_test

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"libte.org/te"
	"libte.org/te/internal/testenv"
)

func TestMemoryRule(t *testing.T) {
	buf := mem(t, 64<<10)
	e := engine(t, "P2PHANDSHAKE", "127.0.0.1", te.WithTransports("tcp"))

	_, err := te.Alloc(0)
	wantCode(t, "Alloc(0)", err, te.ErrInvalid)
	_, err = te.Alloc(-5)
	wantCode(t, "Alloc(-5)", err, te.ErrInvalid)

	// Go heap memory is refused, with the reason.
	heap := make([]byte, 4096)
	err = e.RegisterMemory(heap, "cpu:0")
	wantCode(t, "RegisterMemory(Go heap)", err, te.ErrAddress)
	if !strings.Contains(err.Error(), "te.Alloc") || !strings.Contains(err.Error(), "Go heap") {
		t.Fatalf("refusal does not explain the rule: %v", err)
	}
	wantCode(t, "RegisterMemory(empty)", e.RegisterMemory(buf[:0], "cpu:0"), te.ErrInvalid)
	wantCode(t, "RegisterMemory(nil)", e.RegisterMemory(nil, "cpu:0"), te.ErrInvalid)
	wantCode(t, "RegisterMemory(location with NUL)", e.RegisterMemory(buf, "cpu\x000"), te.ErrInvalid)

	// Part of an allocation is fine; overlapping registrations are not.
	must(t, "RegisterMemory(part)", e.RegisterMemory(buf[4096:8192], "cpu:0"))
	mark := logMark()
	wantCode(t, "overlapping registration", e.RegisterMemory(buf[:4097], "cpu:0"), te.ErrOverlap)
	if !logSince(mark, "overlaps") {
		t.Fatalf("no log line about the overlap")
	}
	wantCode(t, "UnregisterMemory(not its start)", e.UnregisterMemory(buf[4097:]), te.ErrAddress)
	wantCode(t, "UnregisterMemory(never registered)", e.UnregisterMemory(buf[16384:]), te.ErrAddress)

	// Free refuses while registered, and frees once unregistered.
	wantCode(t, "Free while registered", te.Free(buf), te.ErrBusy)
	must(t, "UnregisterMemory", e.UnregisterMemory(buf[4096:8192]))
	other, err := te.Alloc(4096)
	must(t, "Alloc", err)
	wantCode(t, "Free(not the start)", te.Free(other[1:]), te.ErrInvalid)
	wantCode(t, "Free(Go heap)", te.Free(heap), te.ErrInvalid)
	wantCode(t, "Free(nil)", te.Free(nil), te.ErrInvalid)
	must(t, "Free", te.Free(other[:1]))
	wantCode(t, "Free twice", te.Free(other[:1]), te.ErrInvalid)

	// External memory: by address, checked against allocations' edges.
	wantCode(t, "RegisterExternal(0)", e.RegisterExternal(0, 10, "cpu:0"), te.ErrInvalid)
	wantCode(t, "RegisterExternal(empty)", e.RegisterExternal(uintptr(addr(buf)), 0, "cpu:0"), te.ErrInvalid)
	wantCode(t, "RegisterExternal(wrapping)", e.RegisterExternal(^uintptr(0)-10, 100, "cpu:0"), te.ErrInvalid)
	straddle := uintptr(addr(buf)) + uintptr(len(buf)) - 10
	wantCode(t, "RegisterExternal(across an allocation's end)", e.RegisterExternal(straddle, 100, "cpu:0"), te.ErrAddress)
	mm, err := syscall.Mmap(-1, 0, 8192, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	must(t, "mmap", err)
	defer syscall.Munmap(mm)
	ext := uintptr(unsafe.Pointer(&mm[0]))
	must(t, "RegisterExternal(mmap)", e.RegisterExternal(ext, 8192, "cpu:0"))
	copy(mm, "bytes in memory from syscall.Mmap")
	must(t, "Write from external memory", e.Transfer(context.Background(), te.Request{Op: te.OpWrite,
		Segment: te.LocalSegment, Addr: ext, Length: 100, Remote: uint64(ext) + 4096}))
	if d := testenv.Diff(mm[4096:4196], mm[:100]); d != "" {
		t.Fatalf("copy within external memory: %s", d)
	}
	must(t, "UnregisterExternal", e.UnregisterExternal(ext))
	wantCode(t, "UnregisterExternal twice", e.UnregisterExternal(ext), te.ErrAddress)
	// Inside an allocation it counts against Free like RegisterMemory.
	must(t, "RegisterExternal(inside an allocation)", e.RegisterExternal(uintptr(addr(buf))+100, 100, "cpu:0"))
	wantCode(t, "Free with an external registration inside", te.Free(buf), te.ErrBusy)
	must(t, "UnregisterExternal", e.UnregisterExternal(uintptr(addr(buf))+100))
}

func TestBadRequests(t *testing.T) {
	p := newPair(t, "P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 64<<10)
	unreg := mem(t, 4096)
	ctx := context.Background()
	id := p.seg.ID()

	mark := logMark()
	wantCode(t, "Read past the end of the remote buffer",
		p.init.Read(ctx, p.ibuf[:8192], id, p.remote+uint64(len(p.tbuf))-4096), te.ErrAddress)
	if !logSince(mark, "outside the buffers") {
		t.Fatalf("no log line about the range")
	}
	wantCode(t, "Read into memory from Alloc that is not registered", p.init.Read(ctx, unreg, id, p.remote), te.ErrAddress)
	wantCode(t, "Read into Go memory", p.init.Read(ctx, make([]byte, 64), id, p.remote), te.ErrAddress)
	wantCode(t, "Read from an unknown segment", p.init.Read(ctx, p.ibuf[:64], 77, p.remote), te.ErrSegment)
	wantCode(t, "Read into an empty buffer", p.init.Read(ctx, p.ibuf[:0], id, p.remote), te.ErrInvalid)
	wantCode(t, "Request with Local and Addr", p.init.Transfer(ctx, te.Request{Op: te.OpRead, Segment: id,
		Remote: p.remote, Local: p.ibuf[:64], Addr: 1}), te.ErrInvalid)

	b, err := p.init.NewBatch(3)
	must(t, "NewBatch", err)
	inv, err := b.Submit(te.Request{Op: 9, Segment: id, Remote: p.remote, Local: p.ibuf[:64]},
		te.Request{Op: te.OpRead, Segment: id, Remote: p.remote, Local: p.ibuf[:64]})
	if err != nil || inv != 1 {
		t.Fatalf("Submit with a bad opcode: %d invalid, %v", inv, err)
	}
	st, err := b.Status(0)
	must(t, "Status", err)
	if st.State != te.TaskInvalid || !errors.Is(st.Err, te.ErrInvalid) {
		t.Fatalf("bad opcode task: %+v", st)
	}
	_, err = b.Status(-1)
	wantCode(t, "Status(-1)", err, te.ErrInvalid)
	_, err = b.Status(7)
	if err == nil {
		t.Fatalf("Status of a task never submitted")
	}
	_, err = b.Submit(make([]te.Request, 2)...)
	wantCode(t, "Submit beyond the capacity", err, te.ErrBatchFull)
	must(t, "Wait", b.Wait(ctx))
	must(t, "Free", b.Free())
	_, err = b.Submit(te.Request{Op: te.OpRead, Segment: id, Remote: p.remote, Local: p.ibuf[:64]})
	wantCode(t, "Submit after Free", err, te.ErrBatch)
	_, err = b.Status(0)
	wantCode(t, "Status after Free", err, te.ErrBatch)
	_, err = b.Summary()
	wantCode(t, "Summary after Free", err, te.ErrBatch)
	wantCode(t, "Wait after Free", b.Wait(ctx), te.ErrBatch)
	wantCode(t, "Cancel after Free", b.Cancel(), te.ErrBatch)
	wantCode(t, "Notify after Free", b.Notify(id, "x"), te.ErrBatch)
	wantCode(t, "Free twice", b.Free(), te.ErrBatch)
	_, err = p.init.NewBatch(0)
	wantCode(t, "NewBatch(0)", err, te.ErrInvalid)
	var nilBatch *te.Batch
	wantCode(t, "Free of a nil batch", nilBatch.Free(), te.ErrInvalid)

	// Notifications.
	wantCode(t, "Notify too long", p.init.Notify(id, strings.Repeat("x", te.NotifyMax+1)), te.ErrInvalid)
	wantCode(t, "Notify with NUL", p.init.Notify(id, "a\x00b"), te.ErrInvalid)
	wantCode(t, "NotifyAs with NUL", p.init.NotifyAs(id, "a\x00b", "m"), te.ErrInvalid)
	if err := p.init.Notify(99, "to nobody"); err == nil {
		t.Fatalf("Notify to an unknown segment")
	}

	// Segments.
	_, err = p.init.OpenSegment("")
	wantCode(t, "OpenSegment(\"\")", err, te.ErrInvalid)
	_, err = p.init.OpenSegment("127.0.0.1:\x001")
	wantCode(t, "OpenSegment(NUL)", err, te.ErrInvalid)
	_, err = p.init.OpenSegment("127.0.0.1:1")
	wantCode(t, "OpenSegment(nobody there)", err, te.ErrConnRefused)
	if !errors.Is(err, syscall.ECONNREFUSED) || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("refused open: %v", err)
	}
	_, err = p.init.FindSegment("not-open")
	wantCode(t, "FindSegment(not open)", err, te.ErrNotFound)
	_, err = p.init.OpenSegmentWith(p.target.Name(), "")
	wantCode(t, "OpenSegmentWith(no transport)", err, te.ErrInvalid)
	s2, err := p.init.OpenSegment(p.target.Name())
	must(t, "second OpenSegment", err)
	if s2.ID() != id {
		t.Fatalf("second open gave id %d, first %d", s2.ID(), id)
	}
	must(t, "Segment.Close", s2.Close())
	wantCode(t, "Segment.Close twice", s2.Close(), te.ErrSegment)
	_, err = s2.Buffers()
	wantCode(t, "Buffers after Close", err, te.ErrSegment)
	wantCode(t, "Refresh after Close", s2.Refresh(), te.ErrSegment)
	must(t, "the first reference still works", p.seg.Refresh())

	// Transports.
	wantCode(t, "InstallTransport twice", p.init.InstallTransport("tcp", ""), te.ErrExists)
	if err := p.init.InstallTransport("no-such-transport", ""); err == nil {
		t.Fatalf("unknown transport installed")
	}
}

func TestBadEngines(t *testing.T) {
	_, err := te.NewEngine("P2P\x00HANDSHAKE", "x")
	wantCode(t, "NUL in the connection string", err, te.ErrInvalid)
	_, err = te.NewEngine("P2PHANDSHAKE", "127.0.0.1", te.WithOption("rpc_port", "x\x00"))
	wantCode(t, "NUL in an option", err, te.ErrInvalid)
	mark := logMark()
	_, err = te.NewEngine("gopher://127.0.0.1:70", "x")
	var e *te.Error
	if err == nil || !errors.As(err, &e) || e.Code >= 0 || e.Detail == "" {
		t.Fatalf("unknown metadata scheme: %v", err)
	}
	if !logSince(mark, "gopher") {
		t.Fatalf("no log line names the scheme")
	}
	_, err = te.NewEngine("P2PHANDSHAKE", "127.0.0.1", te.WithTransports("no-such-transport"))
	if err == nil {
		t.Fatalf("engine with an unknown transport created")
	}

	// Everything on a closed engine is an error value.
	buf := mem(t, 8192)
	c, err := te.NewEngine("P2PHANDSHAKE", "127.0.0.1", te.WithTransports("tcp"))
	must(t, "NewEngine", err)
	must(t, "RegisterMemory", c.RegisterMemory(buf, "cpu:0", te.RemoteAccess))
	s, err := c.OpenSegment(c.Name())
	must(t, "OpenSegment", err)
	b, err := c.NewBatch(1)
	must(t, "NewBatch", err)
	must(t, "Close", c.Close())
	wantCode(t, "Close twice", c.Close(), te.ErrClosed)
	ctx := context.Background()
	for name, err := range map[string]error{
		"RegisterMemory":     c.RegisterMemory(buf, "cpu:0"),
		"UnregisterMemory":   c.UnregisterMemory(buf),
		"InstallTransport":   c.InstallTransport("tcp", ""),
		"UninstallTransport": c.UninstallTransport("tcp"),
		"Read":               c.Read(ctx, buf, te.LocalSegment, addr(buf)),
		"Notify":             c.Notify(te.LocalSegment, "x"),
		"Probe":              c.Probe(c.Name(), 0),
		"Segment.Refresh":    s.Refresh(),
		"Segment.Close":      s.Close(),
		"Batch.Wait":         b.Wait(ctx),
		"Batch.Cancel":       b.Cancel(),
		"Batch.Free":         b.Free(),
	} {
		wantCode(t, name+" after Close", err, te.ErrClosed)
	}
	_, err = c.OpenSegment("x")
	wantCode(t, "OpenSegment after Close", err, te.ErrClosed)
	_, err = c.NewBatch(1)
	wantCode(t, "NewBatch after Close", err, te.ErrClosed)
	_, err = b.Submit(te.Request{Local: buf})
	wantCode(t, "Submit after Close", err, te.ErrClosed)
	_, err = c.Notifications()
	wantCode(t, "Notifications after Close", err, te.ErrClosed)
	_, err = c.Transports()
	wantCode(t, "Transports after Close", err, te.ErrClosed)
	_, err = s.Buffers()
	wantCode(t, "Buffers after Close", err, te.ErrClosed)
	var nilEngine *te.Engine
	_, err = nilEngine.NewBatch(1)
	wantCode(t, "nil engine", err, te.ErrInvalid)
	// Close dropped the registration: the memory can be freed (by mem's cleanup).
}

// Every libte code has a sentinel that errors.Is matches, and no other.
func TestErrorCodes(t *testing.T) {
	codes := []struct {
		c    te.Code
		want int
	}{
		{te.ErrPlugin, -4097}, {te.ErrNoTransport, -4098}, {te.ErrMetadata, -4099},
		{te.ErrProtocol, -4100}, {te.ErrRejected, -4101}, {te.ErrBatchFull, -4102},
		{te.ErrAddress, -4103}, {te.ErrOverlap, -4104}, {te.ErrSegment, -4105},
		{te.ErrBatch, -4106}, {te.ErrInvalid, -22}, {te.ErrNoMemory, -12},
		{te.ErrNotFound, -2}, {te.ErrBusy, -16}, {te.ErrTimeout, -110}, {te.ErrExists, -17},
		{te.ErrNotSupported, -95}, {te.ErrConnRefused, -111}, {te.ErrCanceled, -125},
		{te.ErrAccess, -13}, {te.ErrIO, -5}, {te.ErrClosed, -9},
	}
	for _, c := range codes {
		if int(c.c) != c.want {
			t.Fatalf("code %v is %d, te.h says %d", c.c, int(c.c), c.want)
		}
		err := error(&te.Error{Op: "op", Code: te.Code(c.want), Detail: "what happened"})
		for _, o := range codes {
			if errors.Is(err, o.c) != (o.c == c.c) {
				t.Fatalf("errors.Is(error with code %d, %d) = %v", c.want, int(o.c), !(o.c == c.c))
			}
		}
		if c.want > -4096 && !errors.Is(err, syscall.Errno(-c.want)) {
			t.Fatalf("code %d does not match syscall.Errno(%d)", c.want, -c.want)
		}
		msg := err.Error()
		if strings.Contains(msg, "unknown error") || !strings.Contains(msg, "what happened") ||
			!strings.Contains(msg, c.c.Error()) || !strings.HasPrefix(msg, "te: op: ") {
			t.Fatalf("message %q for code %d", msg, c.want)
		}
	}
	if te.ErrNoTransport.Error() != "no installed transport serves the segment" {
		t.Fatalf("ErrNoTransport reads %q", te.ErrNoTransport.Error())
	}
}

// A real ErrNoTransport: the peer's only transport is not installed here.
func TestNoTransport(t *testing.T) {
	a := engine(t, "P2PHANDSHAKE", "127.0.0.1", te.WithTransports("tcp"))
	b := engine(t, "P2PHANDSHAKE", "127.0.0.1")
	_, err := b.OpenSegment(a.Name())
	wantCode(t, "OpenSegment without the peer's transport", err, te.ErrNoTransport)
	if !strings.Contains(err.Error(), a.Name()) {
		t.Fatalf("error does not name the segment: %v", err)
	}
	must(t, "InstallTransport", b.InstallTransport("tcp", ""))
	s, err := b.OpenSegment(a.Name())
	must(t, "OpenSegment with tcp", err)
	must(t, "Close", s.Close())
}
