// SPDX-License-Identifier: Apache-2.0

package te

/*
#include "tego.h"
*/
import "C"

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unsafe"
)

// Engine is one libte engine: a segment name in a cluster, its transports,
// its registered memory, its open segments and batches. All methods are safe
// for concurrent use, Close included: calls running when Close starts finish
// first, later ones return ErrClosed.
type Engine struct {
	// mu guards h: every call holds it for reading, Close for writing, so
	// te_engine_destroy never runs under another call.
	mu sync.RWMutex
	h  *C.te_engine

	name    string
	address string
	rpcPort int

	// memMu guards the registry below. Submit holds it for reading across
	// te_submit, and registration changes hold it for writing, so a region
	// can never be unregistered between the check that a batch is idle and
	// the start of a new task on it.
	memMu   sync.RWMutex
	regions []*region // registered by this engine, sorted by addr
	batches map[*Batch]struct{}
}

// region is a registration of this engine; alloc is the Alloc allocation it
// lies in (nil for external memory outside every allocation).
type region struct {
	addr, size uintptr
	alloc      *allocation
}

type engineConfig struct {
	opts [][2]string
}

// Option configures NewEngine.
type Option func(*engineConfig)

// WithOption passes a te_option key/value as it is (see te.h for the keys
// libte knows; unknown keys reach plugins as configuration).
func WithOption(key, value string) Option {
	return func(c *engineConfig) { c.opts = append(c.opts, [2]string{key, value}) }
}

// WithTransports installs the named transports at creation ("tcp", "rdma").
func WithTransports(names ...string) Option {
	return WithOption("transports", strings.Join(names, ","))
}

// WithRPCPort sets the RPC/handshake port; 0 picks a free one.
func WithRPCPort(port int) Option { return WithOption("rpc_port", strconv.Itoa(port)) }

// WithAddress sets the address peers reach this engine at (ip_or_host_name).
func WithAddress(host string) Option { return WithOption("ip_or_host_name", host) }

// WithAutoDiscovery installs the best transport found (RDMA when devices
// exist, else TCP) at creation.
func WithAutoDiscovery() Option { return WithOption("auto_discovery", "1") }

// WithPluginPath adds plugin directories searched before the default ones.
func WithPluginPath(dirs ...string) Option {
	return WithOption("plugin_path", strings.Join(dirs, ":"))
}

// NewEngine creates an engine. metadata is a connection string:
// "P2PHANDSHAKE" (peers exchange descriptors directly), "etcd://h:p",
// "redis://h:p" or "http://h:p/path". name is this engine's segment name;
// with P2PHANDSHAKE it is "host" or "host:port" and becomes "host:<rpc
// port>". An empty name means the machine's host name.
func NewEngine(metadata, name string, opts ...Option) (*Engine, error) {
	const op = "NewEngine"
	var cfg engineConfig
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	var toFree []*C.char
	defer func() {
		for _, p := range toFree {
			C.free(unsafe.Pointer(p))
		}
	}()
	str := func(what, s string) (*C.char, error) {
		p, err := cstring(op, what, s)
		if err == nil {
			toFree = append(toFree, p)
		}
		return p, err
	}
	cmeta, err := str("metadata connection string", metadata)
	if err != nil {
		return nil, err
	}
	var cname *C.char
	if name != "" {
		if cname, err = str("name", name); err != nil {
			return nil, err
		}
	}
	// te_option entries hold C strings only, so the array may live in Go
	// memory while libte reads it.
	copts := make([]C.te_option, len(cfg.opts)+1)
	for i, kv := range cfg.opts {
		if copts[i].key, err = str("option key", kv[0]); err != nil {
			return nil, err
		}
		if copts[i].value, err = str("value of option "+kv[0], kv[1]); err != nil {
			return nil, err
		}
	}
	var h *C.te_engine
	rc, detail := ccall(func() C.int {
		return C.te_engine_create(cmeta, cname, &copts[0], C.size_t(len(cfg.opts)), &h)
	})
	if rc < 0 {
		return nil, newError(op, Code(rc), detail)
	}
	return &Engine{
		h:       h,
		name:    C.GoString(C.te_engine_name(h)),
		address: C.GoString(C.te_engine_address(h)),
		rpcPort: int(C.te_engine_rpc_port(h)),
		batches: make(map[*Batch]struct{}),
	}, nil
}

// Close removes what the engine published, fails the tasks still in flight,
// and frees the engine with its segments and batches. Later calls on the
// engine, its segments and batches return ErrClosed.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.h == nil {
		return newError("Close", ErrClosed, "engine already closed")
	}
	C.te_engine_destroy(e.h)
	e.h = nil
	e.memMu.Lock()
	allocMu.Lock()
	for _, r := range e.regions {
		if r.alloc != nil {
			r.alloc.regs--
		}
	}
	allocMu.Unlock()
	e.regions = nil
	e.batches = make(map[*Batch]struct{})
	e.memMu.Unlock()
	return nil
}

// rlock takes the engine for one call; on success the caller must
// e.mu.RUnlock().
func (e *Engine) rlock(op string) (*C.te_engine, error) {
	if e == nil {
		return nil, newError(op, ErrInvalid, "nil engine")
	}
	e.mu.RLock()
	if e.h == nil {
		e.mu.RUnlock()
		return nil, newError(op, ErrClosed, "engine is closed")
	}
	return e.h, nil
}

// rlockUnder takes mu, the lock of an object that lives in the engine (a
// batch, a segment), for reading, then the engine, for one call on the
// object: gone (run under mu) returns the error of an object already ended.
// On success the caller runs the returned release.
func (e *Engine) rlockUnder(op string, mu *sync.RWMutex, gone func() error) (*C.te_engine, func(), error) {
	mu.RLock()
	if err := gone(); err != nil {
		mu.RUnlock()
		return nil, nil, err
	}
	h, err := e.rlock(op)
	if err != nil {
		mu.RUnlock()
		return nil, nil, err
	}
	return h, func() { e.mu.RUnlock(); mu.RUnlock() }, nil
}

// callUnder runs fn, one libte call, through cerr with the handle use
// (a Batch's or a Segment's) gives, released after it.
func callUnder(op string, use func(string) (*C.te_engine, func(), error), fn func(h *C.te_engine) C.int) error {
	h, release, err := use(op)
	if err != nil {
		return err
	}
	defer release()
	return cerr(op, func() C.int { return fn(h) })
}

// call runs fn, one libte call, on the engine (held for reading
// meanwhile) through cint: its non-negative result or its error.
func (e *Engine) call(op string, fn func(h *C.te_engine) C.int) (int, error) {
	h, err := e.rlock(op)
	if err != nil {
		return 0, err
	}
	defer e.mu.RUnlock()
	return cint(op, func() C.int { return fn(h) })
}

// rlockString is rlock for a call that passes s (a `what`, for the error)
// as a C string: on success the caller runs the returned release, which
// frees the string and unlocks.
func (e *Engine) rlockString(op, what, s string) (*C.te_engine, *C.char, func(), error) {
	cs, err := cstring(op, what, s)
	if err != nil {
		return nil, nil, nil, err
	}
	h, err := e.rlock(op)
	if err != nil {
		C.free(unsafe.Pointer(cs))
		return nil, nil, nil, err
	}
	return h, cs, func() {
		e.mu.RUnlock()
		C.free(unsafe.Pointer(cs))
	}, nil
}

// Name is the engine's segment name (with P2PHANDSHAKE: "host:rpc_port").
func (e *Engine) Name() string { return e.name }

// Address is the host peers reach this engine at.
func (e *Engine) Address() string { return e.address }

// RPCPort is the engine's bound RPC port.
func (e *Engine) RPCPort() int { return e.rpcPort }

// InstallTransport installs a transport plugin ("tcp", "rdma", "nvmeof",
// ...), with optional JSON arguments ("" for none). Installing an installed
// transport again returns ErrExists.
func (e *Engine) InstallTransport(name, jsonArgs string) error {
	const op = "InstallTransport"
	cname, err := cstring(op, "transport name", name)
	if err != nil {
		return err
	}
	defer C.free(unsafe.Pointer(cname))
	var cargs *C.char
	if jsonArgs != "" {
		if cargs, err = cstring(op, "arguments", jsonArgs); err != nil {
			return err
		}
		defer C.free(unsafe.Pointer(cargs))
	}
	_, err = e.call(op, func(h *C.te_engine) C.int { return C.te_transport_install(h, cname, cargs) })
	return err
}

// UninstallTransport removes an installed transport.
func (e *Engine) UninstallTransport(name string) error {
	const op = "UninstallTransport"
	h, cname, release, err := e.rlockString(op, "transport name", name)
	if err != nil {
		return err
	}
	defer release()
	return cerr(op, func() C.int { return C.te_transport_uninstall(h, cname) })
}

// AutoTransport installs the best transport available here (RDMA when it
// finds devices, else TCP) and returns its name.
func (e *Engine) AutoTransport() (string, error) {
	var name string
	_, err := e.call("AutoTransport", func(h *C.te_engine) C.int {
		var cname *C.char
		rc := C.te_transport_auto(h, &cname)
		if cname != nil {
			name = C.GoString(cname)
		}
		return rc
	})
	return name, err
}

// Transports lists the installed transports.
func (e *Engine) Transports() ([]string, error) {
	const op = "Transports"
	h, err := e.rlock(op)
	if err != nil {
		return nil, err
	}
	defer e.mu.RUnlock()
	names := make([]*C.char, 8)
	for {
		rc, detail := ccall(func() C.int {
			return C.te_transport_list(h, &names[0], C.size_t(len(names)))
		})
		if rc < 0 {
			return nil, newError(op, Code(rc), detail)
		}
		if rc <= len(names) {
			out := make([]string, rc)
			for i := range out {
				out[i] = C.GoString(names[i])
			}
			return out, nil
		}
		names = make([]*C.char, rc)
	}
}

// MemFlag modifies a registration.
type MemFlag uint32

// RemoteAccess lets peers READ and WRITE the registered memory.
const RemoteAccess MemFlag = C.TE_MEM_REMOTE_ACCESS

// RegisterMemory registers buf with every installed transport (and those
// installed later). buf must lie inside memory from Alloc: libte's threads
// use registered memory long after this call returns, which cgo forbids for
// Go memory, so any other slice is refused with ErrAddress. location is
// "cpu:N", "cuda:N" or "*" (the NUMA node of the memory); pass RemoteAccess
// to let peers read and write it.
func (e *Engine) RegisterMemory(buf []byte, location string, flags ...MemFlag) error {
	const op = "RegisterMemory"
	if len(buf) == 0 {
		return newError(op, ErrInvalid, "empty buffer")
	}
	p, n := addrOf(buf), uintptr(len(buf))
	allocMu.Lock()
	a := findAllocLocked(p, n)
	if a != nil {
		a.regs++ // held from here so that Free cannot unmap it meanwhile
	}
	allocMu.Unlock()
	if a == nil {
		return newError(op, ErrAddress, fmt.Sprintf("buffer at %#x (%d bytes) is not inside memory "+
			"from te.Alloc: libte uses registered memory after the call returns, "+
			"which cgo forbids for memory of the Go heap", p, n))
	}
	return e.register(op, p, n, a, location, flags)
}

// RegisterExternal registers memory Go does not manage, given by address:
// from syscall.Mmap, C.malloc, a device, or a foreign library. The caller
// guarantees it stays mapped while registered; it must never be Go heap
// memory (Go may free it under libte). Ranges touching an Alloc allocation
// must lie inside it, and then count against Free like RegisterMemory.
func (e *Engine) RegisterExternal(addr uintptr, length uint64, location string, flags ...MemFlag) error {
	const op = "RegisterExternal"
	if addr == 0 || length == 0 {
		return newError(op, ErrInvalid, fmt.Sprintf("address %#x, length %d", addr, length))
	}
	n := uintptr(length)
	if uint64(n) != length || addr+n < addr {
		return newError(op, ErrInvalid, fmt.Sprintf("range %#x+%d wraps the address space", addr, length))
	}
	allocMu.Lock()
	a := findAllocLocked(addr, n)
	if a == nil && overlapsAllocLocked(addr, n) {
		allocMu.Unlock()
		return newError(op, ErrAddress, fmt.Sprintf("range %#x+%d straddles the edge of a te.Alloc allocation", addr, length))
	}
	if a != nil {
		a.regs++
	}
	allocMu.Unlock()
	return e.register(op, addr, n, a, location, flags)
}

// register finishes a registration whose allocation (if any) already
// counts it; the count is dropped again on failure.
func (e *Engine) register(op string, p, n uintptr, a *allocation, location string, flags []MemFlag) (err error) {
	defer func() {
		if err != nil && a != nil {
			allocMu.Lock()
			a.regs--
			allocMu.Unlock()
		}
	}()
	var f C.uint
	for _, fl := range flags {
		f |= C.uint(fl)
	}
	h, cloc, release, err := e.rlockString(op, "location", location)
	if err != nil {
		return err
	}
	defer release()
	e.memMu.Lock()
	defer e.memMu.Unlock()
	rc, detail := ccall(func() C.int {
		return C.tego_register(h, C.uintptr_t(p), C.size_t(n), cloc, f)
	})
	if rc < 0 {
		return newError(op, Code(rc), detail)
	}
	r := &region{addr: p, size: n, alloc: a}
	i := sort.Search(len(e.regions), func(i int) bool { return e.regions[i].addr > p })
	e.regions = append(e.regions, nil)
	copy(e.regions[i+1:], e.regions[i:])
	e.regions[i] = r
	return nil
}

// UnregisterMemory unregisters the region that starts at buf's first byte.
// It refuses (ErrBusy) while a batch of this engine has tasks in flight
// that read or write the region; on the target side it waits for peers'
// requests on the region to end.
func (e *Engine) UnregisterMemory(buf []byte) error {
	if len(buf) == 0 {
		return newError("UnregisterMemory", ErrInvalid, "empty buffer")
	}
	return e.unregister("UnregisterMemory", addrOf(buf))
}

// UnregisterExternal unregisters the region registered at addr.
func (e *Engine) UnregisterExternal(addr uintptr) error {
	return e.unregister("UnregisterExternal", addr)
}

func (e *Engine) unregister(op string, p uintptr) error {
	h, err := e.rlock(op)
	if err != nil {
		return err
	}
	defer e.mu.RUnlock()
	e.memMu.Lock()
	defer e.memMu.Unlock()
	i := sort.Search(len(e.regions), func(i int) bool { return e.regions[i].addr >= p })
	if i == len(e.regions) || e.regions[i].addr != p {
		return newError(op, ErrAddress, fmt.Sprintf("no region registered by this engine starts at %#x", p))
	}
	r := e.regions[i]
	if err := e.idleLocked(op, h, r); err != nil {
		return err
	}
	if err := cerr(op, func() C.int { return C.tego_unregister(h, C.uintptr_t(p)) }); err != nil {
		return err
	}
	e.regions = append(e.regions[:i], e.regions[i+1:]...)
	if r.alloc != nil {
		allocMu.Lock()
		r.alloc.regs--
		allocMu.Unlock()
	}
	return nil
}

// idleLocked fails when a batch that used r still has tasks in flight.
// A batch found idle forgets every region it used: no task of it can start
// again on them without a new Submit, which memMu (held) keeps out.
func (e *Engine) idleLocked(op string, h *C.te_engine, r *region) error {
	for b := range e.batches {
		b.refMu.Lock()
		_, used := b.regions[r]
		if used {
			var inflight C.size_t
			rc, detail := ccall(func() C.int {
				return C.te_batch_status(h, b.id, nil, &inflight, nil)
			})
			if rc < 0 {
				b.refMu.Unlock()
				return newError(op, Code(rc), detail)
			}
			if inflight > 0 {
				b.refMu.Unlock()
				return newError(op, ErrBusy, fmt.Sprintf("%d task(s) of a batch still use the region at %#x", inflight, r.addr))
			}
			b.regions = nil
		}
		b.refMu.Unlock()
	}
	return nil
}

// regionForLocked returns the region of this engine holding [p, p+n), or
// nil. memMu held.
func (e *Engine) regionForLocked(p, n uintptr) *region {
	i := sort.Search(len(e.regions), func(i int) bool { return e.regions[i].addr > p })
	if i == 0 {
		return nil
	}
	r := e.regions[i-1]
	if p-r.addr > r.size || n > r.size-(p-r.addr) {
		return nil
	}
	return r
}
