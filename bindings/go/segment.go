// SPDX-License-Identifier: Apache-2.0

package te

/*
#include "tego.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"time"
	"unsafe"
)

// SegmentID names an open segment in requests; LocalSegment is the
// engine's own.
type SegmentID int32

// LocalSegment is the id of the engine's own segment.
const LocalSegment SegmentID = C.TE_LOCAL_SEGMENT

// Segment is one reference to an open segment (another engine's registered
// memory, the engine's own, or a file segment). Opening a name twice gives
// two Segments with the same ID; each is closed once.
type Segment struct {
	e    *Engine
	id   SegmentID
	name string

	mu     sync.RWMutex // guards closed against Close during a call
	closed bool
}

// SegmentBuffer is a buffer of a segment as its descriptor lists it: for
// memory segments Addr is an address in the owner's process, for file
// segments a byte offset.
type SegmentBuffer struct {
	Addr   uint64
	Length uint64
	Name   string // location ("cpu:0") or segment name, as the descriptor says
}

// OpenSegment opens the segment of the engine called name (its own name
// gives LocalSegment).
func (e *Engine) OpenSegment(name string) (*Segment, error) {
	return e.openSegment("OpenSegment", name, "")
}

// OpenSegmentWith opens a segment through a chosen transport.
func (e *Engine) OpenSegmentWith(name, transport string) (*Segment, error) {
	if transport == "" {
		return nil, newError("OpenSegmentWith", ErrInvalid, "empty transport name")
	}
	return e.openSegment("OpenSegmentWith", name, transport)
}

func (e *Engine) openSegment(op, name, transport string) (*Segment, error) {
	if name == "" {
		return nil, newError(op, ErrInvalid, "empty segment name")
	}
	cname, err := cstring(op, "segment name", name)
	if err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(cname))
	var ctr *C.char
	if transport != "" {
		if ctr, err = cstring(op, "transport name", transport); err != nil {
			return nil, err
		}
		defer C.free(unsafe.Pointer(ctr))
	}
	id, err := e.call(op, func(h *C.te_engine) C.int {
		if ctr != nil {
			return C.int(C.te_segment_open_with(h, cname, ctr))
		}
		return C.int(C.te_segment_open(h, cname))
	})
	if err != nil {
		return nil, err
	}
	return &Segment{e: e, id: SegmentID(id), name: name}, nil
}

// FindSegment returns the id of segment name if it is open, without network
// traffic and without taking a reference (ErrNotFound when not open).
func (e *Engine) FindSegment(name string) (SegmentID, error) {
	const op = "FindSegment"
	h, cname, release, err := e.rlockString(op, "segment name", name)
	if err != nil {
		return -1, err
	}
	defer release()
	id, detail := ccall(func() C.int { return C.int(C.te_segment_find(h, cname)) })
	if id < 0 {
		if detail == "" {
			detail = fmt.Sprintf("segment %q is not open", name)
		}
		return -1, newError(op, Code(id), detail)
	}
	return SegmentID(id), nil
}

// Probe asks the engine called name (open or not) whether it is there. A
// timeout <= 0 uses libte's RPC defaults.
func (e *Engine) Probe(name string, timeout time.Duration) error {
	const op = "Probe"
	ms := timeout.Milliseconds()
	if timeout > 0 && ms == 0 {
		ms = 1
	}
	if ms > 1<<30 {
		ms = 1 << 30
	}
	h, cname, release, err := e.rlockString(op, "segment name", name)
	if err != nil {
		return err
	}
	defer release()
	return cerr(op, func() C.int { return C.te_segment_probe(h, cname, C.int(ms)) })
}

// RefreshSegments fetches every open segment's descriptor again and returns
// how many it refreshed, or the first error (the others are still tried).
func (e *Engine) RefreshSegments() (int, error) {
	return e.call("RefreshSegments", func(h *C.te_engine) C.int { return C.te_segment_refresh_all(h) })
}

// ID is the segment's id, for Request.Segment and notifications.
func (s *Segment) ID() SegmentID { return s.id }

// Name is the name the segment was opened by.
func (s *Segment) Name() string { return s.name }

// use takes the segment and its engine for one call; on success the caller
// runs the returned release.
func (s *Segment) use(op string) (*C.te_engine, func(), error) {
	if s == nil {
		return nil, nil, newError(op, ErrInvalid, "nil segment")
	}
	return s.e.rlockUnder(op, &s.mu, func() error {
		if s.closed {
			return newError(op, ErrSegment, fmt.Sprintf("segment %q (id %d) was closed", s.name, s.id))
		}
		return nil
	})
}

// call runs fn, one libte call, on the segment and its engine (both taken
// for it, as use does) through cerr.
func (s *Segment) call(op string, fn func(h *C.te_engine) C.int) error {
	return callUnder(op, s.use, fn)
}

// Buffers lists the segment's buffers, sorted by address (for the local
// segment: the registered regions).
func (s *Segment) Buffers() ([]SegmentBuffer, error) {
	const op = "Buffers"
	h, release, err := s.use(op)
	if err != nil {
		return nil, err
	}
	defer release()
	out := make([]C.te_segment_buffer, 16)
	for {
		n, err := cint(op, func() C.int {
			return C.te_segment_buffers(h, C.te_segment_id(s.id), &out[0], C.size_t(len(out)))
		})
		if err != nil {
			return nil, err
		}
		if n > len(out) { // more than asked for: ask again for all of them
			out = make([]C.te_segment_buffer, n)
			continue
		}
		bufs := make([]SegmentBuffer, n)
		for i := range bufs {
			bufs[i] = SegmentBuffer{
				Addr:   uint64(out[i].addr),
				Length: uint64(out[i].length),
				Name:   C.GoString(&out[i].name[0]),
			}
		}
		return bufs, nil
	}
}

// Refresh fetches the segment's descriptor again.
func (s *Segment) Refresh() error {
	return s.call("Refresh", func(h *C.te_engine) C.int { return C.te_segment_refresh(h, C.te_segment_id(s.id)) })
}

// Descriptor returns the segment's descriptor JSON as last fetched (for the
// local segment: as last published).
func (s *Segment) Descriptor() (string, error) {
	var js *C.char
	if err := s.call("Descriptor", func(h *C.te_engine) C.int {
		return C.te_segment_descriptor(h, C.te_segment_id(s.id), &js)
	}); err != nil {
		return "", err
	}
	defer C.te_free(unsafe.Pointer(js))
	return C.GoString(js), nil
}

// Transport names the transport that serves the segment: "shm" for an
// engine on this host (when both have the same-host transport), "tcp",
// "rdma", ...
func (s *Segment) Transport() (string, error) {
	var name string
	err := s.call("Transport", func(h *C.te_engine) C.int {
		cname := C.te_segment_transport(h, C.te_segment_id(s.id))
		if cname == nil {
			return C.int(ErrSegment)
		}
		name = C.GoString(cname) // the engine's string: copied while it is held
		return 0
	})
	return name, err
}

// Close drops this reference to the segment. A second Close returns
// ErrSegment.
func (s *Segment) Close() error {
	const op = "Segment.Close"
	if s == nil {
		return newError(op, ErrInvalid, "nil segment")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return newError(op, ErrSegment, fmt.Sprintf("segment %q (id %d) already closed", s.name, s.id))
	}
	h, err := s.e.rlock(op)
	if err != nil {
		return err
	}
	defer s.e.mu.RUnlock()
	if err := cerr(op, func() C.int { return C.te_segment_close(h, C.te_segment_id(s.id)) }); err != nil {
		return err
	}
	s.closed = true
	return nil
}
