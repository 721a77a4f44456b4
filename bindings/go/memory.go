// SPDX-License-Identifier: Apache-2.0

package te

/*
#include "tego.h"
*/
import "C"

import (
	"fmt"
	"sort"
	"sync"
	"unsafe"
)

// An allocation is one te_mem_alloc allocation made by Alloc. regs counts
// the registrations (by any engine) that lie inside it; Free refuses while it
// is not zero.
type allocation struct {
	base uintptr
	size uintptr
	regs int
}

var (
	allocMu sync.Mutex
	allocs  []*allocation // sorted by base; mappings never overlap
)

// Alloc allocates size bytes of zeroed, page-aligned memory outside the Go
// heap (libte's te_mem_alloc: shared memory that an engine on the same host
// maps, so the same-host transport serves it with one copy), for
// registration with RegisterMemory. Release it with Free once no engine has
// any of it registered. Go's collector never touches this memory: a slice
// of it stays valid until Free, whoever holds it.
func Alloc(size int) ([]byte, error) {
	if size <= 0 {
		return nil, newError("Alloc", ErrInvalid, fmt.Sprintf("size %d is not positive", size))
	}
	var p unsafe.Pointer // C memory: never Go's
	if err := cerr("Alloc", func() C.int { return C.te_mem_alloc(C.size_t(size), &p) }); err != nil {
		return nil, err
	}
	a := &allocation{base: uintptr(p), size: uintptr(size)}
	allocMu.Lock()
	i := sort.Search(len(allocs), func(i int) bool { return allocs[i].base > a.base })
	allocs = append(allocs, nil)
	copy(allocs[i+1:], allocs[i:])
	allocs[i] = a
	allocMu.Unlock()
	return unsafe.Slice((*byte)(p), size), nil
}

// Free releases memory that Alloc returned. buf must start where the
// allocation starts (a slice of it that keeps the first byte will do). It
// refuses (ErrBusy) while an engine has part of it registered: unmapping it
// then would let libte's threads touch unmapped memory. Every slice of the
// allocation is invalid after Free.
func Free(buf []byte) error {
	if len(buf) == 0 {
		return newError("Free", ErrInvalid, "empty slice")
	}
	p := addrOf(buf)
	allocMu.Lock()
	defer allocMu.Unlock()
	i := sort.Search(len(allocs), func(i int) bool { return allocs[i].base >= p })
	if i == len(allocs) || allocs[i].base != p {
		return newError("Free", ErrInvalid,
			fmt.Sprintf("%#x is not the start of memory from te.Alloc (or was freed already)", p))
	}
	a := allocs[i]
	if a.regs > 0 {
		return newError("Free", ErrBusy,
			fmt.Sprintf("%d registration(s) inside the allocation at %#x; unregister first", a.regs, p))
	}
	if err := cerr("Free", func() C.int { return C.tego_mem_free(C.uintptr_t(p)) }); err != nil {
		return err
	}
	allocs = append(allocs[:i], allocs[i+1:]...)
	return nil
}

// addrOf is the address of b's first byte; b must not be empty.
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// findAllocLocked returns the allocation holding [p, p+n), or nil.
// allocMu held.
func findAllocLocked(p, n uintptr) *allocation {
	i := sort.Search(len(allocs), func(i int) bool { return allocs[i].base > p })
	if i == 0 {
		return nil
	}
	a := allocs[i-1]
	if p-a.base > a.size || n > a.size-(p-a.base) {
		return nil
	}
	return a
}

// overlapsAllocLocked reports whether [p, p+n) touches any allocation.
// allocMu held.
func overlapsAllocLocked(p, n uintptr) bool {
	i := sort.Search(len(allocs), func(i int) bool { return allocs[i].base >= p+n })
	return i > 0 && allocs[i-1].base+allocs[i-1].size > p
}
