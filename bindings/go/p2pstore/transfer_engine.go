// SPDX-License-Identifier: Apache-2.0

// Package p2pstore holds TransferEngine, a type with the method set of the
// transfer engine wrapper in Mooncake's P2P store (package p2pstore), built
// on libte's Go package. Its methods are package-private like Mooncake's, so
// the code that calls them lives in the same package: to move a P2P store
// to libte, replace its transfer_engine.go with this file (see README.md).
// The file needs nothing from its package but ErrTransferEngine.
package p2pstore

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"strconv"
	"sync"

	"libte.org/te"
)

// BatchID names a batch of a TransferEngine.
type BatchID int64

// Opcodes and task states, with Mooncake's numbers.
const (
	OPCODE_READ      = 0
	OPCODE_WRITE     = 1
	STATUS_WAITING   = 0
	STATUS_PENDING   = 1
	STATUS_INVALID   = 2
	STATUS_CANCELED  = 3
	STATUS_COMPLETED = 4
	STATUS_TIMEOUT   = 5
	STATUS_FAILED    = 6
)

// TransferRequest is one transfer: Length bytes between the local address
// Source (registered with registerLocalMemory) and TargetOffset, an address
// in the process owning segment TargetID.
type TransferRequest struct {
	Opcode       int
	Source       uint64
	TargetID     int64
	TargetOffset uint64
	Length       uint64
}

// TransferEngine is a libte engine behind Mooncake's wrapper methods.
type TransferEngine struct {
	engine *te.Engine

	mu       sync.Mutex
	nextID   BatchID
	batches  map[BatchID]*te.Batch
	segments map[int64][]*te.Segment // one entry per open reference
}

// engineError is what the methods return: it matches ErrTransferEngine, as
// Mooncake's errors do, and unwraps to libte's error.
type engineError struct{ err error }

func (e *engineError) Error() string        { return ErrTransferEngine.Error() + ": " + e.err.Error() }
func (e *engineError) Unwrap() error        { return e.err }
func (e *engineError) Is(target error) bool { return target == ErrTransferEngine }

func wrap(err error) error {
	if err == nil {
		return nil
	}
	return &engineError{err}
}

func fail(op string, code te.Code, detail string) error {
	return wrap(&te.Error{Op: op, Code: code, Detail: detail})
}

// NewTransferEngine creates an engine on the metadata store
// metadataConnString ("P2PHANDSHAKE", "etcd://...", "redis://...", a bare
// "host:port" for etcd) named localServerName, reached by peers at
// localIpAddress:rpcPort (an empty address: the name's host; port 0: the
// name's port, else a free one). No transport is installed yet:
// installTransport does that.
func NewTransferEngine(metadataConnString string, localServerName string,
	localIpAddress string, rpcPort int) (*TransferEngine, error) {
	if rpcPort < 0 || rpcPort > 65535 {
		return nil, fail("NewTransferEngine", te.ErrInvalid, fmt.Sprintf("rpc port %d", rpcPort))
	}
	// With a metadata store Mooncake publishes MC_TCP_BIND_ADDRESS, when set,
	// as the address peers reach this engine at.
	if bind := os.Getenv("MC_TCP_BIND_ADDRESS"); bind != "" && metadataConnString != "P2PHANDSHAKE" {
		localIpAddress = bind
	}
	var opts []te.Option
	if localIpAddress != "" {
		opts = append(opts, te.WithAddress(localIpAddress))
	}
	if rpcPort > 0 {
		opts = append(opts, te.WithRPCPort(rpcPort))
	}
	e, err := te.NewEngine(metadataConnString, localServerName, opts...)
	if err != nil {
		return nil, wrap(err)
	}
	return &TransferEngine{
		engine:   e,
		batches:  make(map[BatchID]*te.Batch),
		segments: make(map[int64][]*te.Segment),
	}, nil
}

// Engine is the libte engine underneath, for what the wrapper lacks
// (notifications, descriptors, batch waits).
func (engine *TransferEngine) Engine() *te.Engine { return engine.engine }

// installTransport installs "tcp", "rdma" (topologyMatrix: its NIC priority
// matrix as JSON, "" for none) or another transport plugin. Installing an
// installed transport is not an error, as in Mooncake.
func (engine *TransferEngine) installTransport(protocol string, topologyMatrix string) error {
	if names, err := engine.engine.Transports(); err == nil {
		for _, n := range names {
			if n == protocol {
				return nil
			}
		}
	}
	err := engine.engine.InstallTransport(protocol, topologyMatrix)
	if errors.Is(err, te.ErrExists) { // installed meanwhile by another goroutine
		return nil
	}
	return wrap(err)
}

func (engine *TransferEngine) uninstallTransport(protocol string) error {
	return wrap(engine.engine.UninstallTransport(protocol))
}

// Close destroys the engine; a second Close does nothing.
func (engine *TransferEngine) Close() {
	_ = engine.engine.Close()
}

// registerLocalMemory registers [addr, addr+length) for peers to read and
// write. The memory must not belong to the Go heap (use syscall.Mmap,
// te.Alloc or C allocations) and must stay mapped until unregistered.
func (engine *TransferEngine) registerLocalMemory(addr uintptr, length uint64, location string) error {
	return wrap(engine.engine.RegisterExternal(addr, length, location, te.RemoteAccess))
}

func (engine *TransferEngine) unregisterLocalMemory(addr uintptr) error {
	return wrap(engine.engine.UnregisterExternal(addr))
}

func (engine *TransferEngine) allocateBatchID(batchSize int) (BatchID, error) {
	b, err := engine.engine.NewBatch(batchSize)
	if err != nil {
		return BatchID(-1), wrap(err)
	}
	engine.mu.Lock()
	engine.nextID++
	id := engine.nextID
	engine.batches[id] = b
	engine.mu.Unlock()
	return id, nil
}

func (engine *TransferEngine) batch(op string, batchID BatchID) (*te.Batch, error) {
	engine.mu.Lock()
	b := engine.batches[batchID]
	engine.mu.Unlock()
	if b == nil {
		return nil, fail(op, te.ErrBatch, fmt.Sprintf("unknown batch id %d", batchID))
	}
	return b, nil
}

// submitTransfer starts the requests in the batch. When some of them are
// refused (they become INVALID tasks; getTransferStatus says which) it
// returns an error, and the others run.
func (engine *TransferEngine) submitTransfer(batchID BatchID, requests []TransferRequest) error {
	const op = "submitTransfer"
	b, err := engine.batch(op, batchID)
	if err != nil {
		return err
	}
	reqs := make([]te.Request, len(requests))
	for i, r := range requests {
		opcode := te.Opcode(math.MaxUint32) // anything else becomes an INVALID task
		if r.Opcode >= 0 && uint64(r.Opcode) <= math.MaxUint32 {
			opcode = te.Opcode(r.Opcode)
		}
		seg := te.SegmentID(-1) // an id out of range is no segment
		if r.TargetID >= math.MinInt32 && r.TargetID <= math.MaxInt32 {
			seg = te.SegmentID(r.TargetID)
		}
		if uint64(uintptr(r.Source)) != r.Source {
			return fail(op, te.ErrInvalid, fmt.Sprintf("request %d: source %#x is no address here", i, r.Source))
		}
		reqs[i] = te.Request{Op: opcode, Segment: seg, Remote: r.TargetOffset,
			Addr: uintptr(r.Source), Length: r.Length}
	}
	before, err := b.Summary()
	if err != nil {
		return wrap(err)
	}
	invalid, err := b.Submit(reqs...)
	if err != nil {
		return wrap(err)
	}
	if invalid > 0 {
		// Name the first refused request and libte's reason for it.
		// (Task ids continue from earlier submits; concurrent submits to
		// the same batch may interleave, so this is best effort.)
		for i := 0; i < len(reqs); i++ {
			st, serr := b.Status(before.Submitted + i)
			if serr == nil && st.State == te.TaskInvalid {
				code, _ := st.Err.(te.Code)
				if code == 0 {
					code = te.ErrInvalid
				}
				return fail(op, code, fmt.Sprintf("%d of %d requests refused, request %d first", invalid, len(reqs), i))
			}
		}
		return fail(op, te.ErrInvalid, fmt.Sprintf("%d of %d requests refused", invalid, len(reqs)))
	}
	return nil
}

// getTransferStatus returns a task's state (STATUS_*) and the bytes it
// moved so far.
func (engine *TransferEngine) getTransferStatus(batchID BatchID, taskID int) (int, uint64, error) {
	b, err := engine.batch("getTransferStatus", batchID)
	if err != nil {
		return -1, 0, err
	}
	st, err := b.Status(taskID)
	if err != nil {
		return -1, 0, wrap(err)
	}
	return int(st.State), st.Transferred, nil
}

// freeBatchID frees a batch; it refuses while tasks are in flight.
func (engine *TransferEngine) freeBatchID(batchID BatchID) error {
	b, err := engine.batch("freeBatchID", batchID)
	if err != nil {
		return err
	}
	if err := b.Free(); err != nil {
		return wrap(err)
	}
	engine.mu.Lock()
	delete(engine.batches, batchID)
	engine.mu.Unlock()
	return nil
}

// openSegment opens a segment by name; without useCache it fetches the
// segment's descriptor afresh even when it is open already.
func (engine *TransferEngine) openSegment(segmentName string, useCache bool) (int64, error) {
	s, err := engine.engine.OpenSegment(segmentName)
	if err != nil {
		return -1, wrap(err)
	}
	if !useCache {
		if err := s.Refresh(); err != nil {
			_ = s.Close()
			return -1, wrap(err)
		}
	}
	id := int64(s.ID())
	engine.mu.Lock()
	engine.segments[id] = append(engine.segments[id], s)
	engine.mu.Unlock()
	return id, nil
}

// closeSegment drops one reference taken by openSegment.
func (engine *TransferEngine) closeSegment(segmentID int64) error {
	engine.mu.Lock()
	list := engine.segments[segmentID]
	var s *te.Segment
	if len(list) > 0 {
		s = list[len(list)-1]
		if len(list) == 1 {
			delete(engine.segments, segmentID)
		} else {
			engine.segments[segmentID] = list[:len(list)-1]
		}
	}
	engine.mu.Unlock()
	if s == nil {
		return fail("closeSegment", te.ErrSegment, fmt.Sprintf("segment id %d is not open", segmentID))
	}
	return wrap(s.Close())
}

// syncSegmentCache fetches every open segment's descriptor again.
func (engine *TransferEngine) syncSegmentCache() error {
	_, err := engine.engine.RefreshSegments()
	return wrap(err)
}

// GetLocalIpAndPort returns "address:rpc_port", where peers reach this
// engine (with P2PHANDSHAKE also its segment name).
func (engine *TransferEngine) GetLocalIpAndPort() (string, error) {
	return net.JoinHostPort(engine.engine.Address(), strconv.Itoa(engine.engine.RPCPort())), nil
}
