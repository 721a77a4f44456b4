// SPDX-License-Identifier: Apache-2.0

package p2pstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"libte.org/te"
	"libte.org/te/internal/testenv"
)

// The P2P store's way of registering a buffer: chunks registered by
// concurrent goroutines, all undone when one fails.
func registerChunks(e *TransferEngine, addr uintptr, length, chunk uint64, location string) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var done []uintptr
	var first error
	for off := uint64(0); off < length; off += chunk {
		n := chunk
		if n > length-off {
			n = length - off
		}
		wg.Add(1)
		go func(base uintptr, n uint64) {
			defer wg.Done()
			err := e.registerLocalMemory(base, n, location)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = err
			} else if err == nil {
				done = append(done, base)
			}
		}(addr+uintptr(off), n)
	}
	wg.Wait()
	if first != nil {
		for _, base := range done {
			_ = e.unregisterLocalMemory(base)
		}
	}
	return first
}

// mustRegisterChunks is registerChunks on cpu:0, failing the test (naming
// what) when it fails.
func mustRegisterChunks(t *testing.T, what string, e *TransferEngine, addr uintptr, length, chunk uint64) {
	t.Helper()
	if err := registerChunks(e, addr, length, chunk, "cpu:0"); err != nil {
		t.Fatalf("registering %s: %v", what, err)
	}
}

// The P2P store's way of fetching one shard: a batch of one, the segment
// opened (bypassing the cache on retries), status polled until the task
// ends, the batch freed.
func fetchShard(ctx context.Context, e *TransferEngine, source uintptr, segment string, offset, length uint64, retry int) error {
	batchID, err := e.allocateBatchID(1)
	if err != nil {
		return err
	}
	targetID, err := e.openSegment(segment, retry == 0)
	if err != nil {
		return err
	}
	req := TransferRequest{Opcode: OPCODE_READ, Source: uint64(source), TargetID: targetID,
		TargetOffset: offset, Length: length}
	if err := e.submitTransfer(batchID, []TransferRequest{req}); err != nil {
		return err
	}
	status := STATUS_WAITING
	var moved uint64
	for status == STATUS_WAITING || status == STATUS_PENDING {
		select {
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if status, moved, err = e.getTransferStatus(batchID, 0); err != nil {
			return err
		}
		time.Sleep(100 * time.Microsecond)
	}
	if err := e.freeBatchID(batchID); err != nil {
		return err
	}
	if status != STATUS_COMPLETED || moved != length {
		return fmt.Errorf("shard at %#x ended in state %d after %d bytes", offset, status, moved)
	}
	return nil
}

func TestMain(m *testing.M) {
	// libte's log lines are expected here (the tests provoke errors);
	// TE_GO_TEST_LOG=1 shows them.
	if os.Getenv("TE_GO_TEST_LOG") == "" {
		te.SetLogHandler(func(te.LogLevel, string, string) {})
	}
	os.Exit(m.Run())
}

func mmap(t *testing.T, n int) ([]byte, uintptr) {
	t.Helper()
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatalf("mmap: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Munmap(b) })
	return b, uintptr(unsafe.Pointer(&b[0]))
}

// newEngine creates an engine the way NewP2PStore does: the server name
// "host:port" split into the address and the RPC port.
func newEngine(t *testing.T, metadata string) (*TransferEngine, string) {
	t.Helper()
	port := testenv.FreePort(t)
	name := fmt.Sprintf("127.0.0.1:%d", port)
	e, err := NewTransferEngine(metadata, name, "127.0.0.1", port)
	if err != nil {
		t.Fatalf("NewTransferEngine(%q, %q): %v", metadata, name, err)
	}
	t.Cleanup(e.Close)
	if err := e.installTransport("tcp", ""); err != nil {
		t.Fatalf("installTransport: %v", err)
	}
	if err := e.installTransport("tcp", ""); err != nil {
		t.Fatalf("installTransport of an installed transport: %v", err)
	}
	if got, err := e.GetLocalIpAndPort(); err != nil || got != name {
		t.Fatalf("GetLocalIpAndPort = %q, %v; want %q", got, err, name)
	}
	return e, name
}

func storeFlow(t *testing.T, metadata string) {
	const size, chunk, shard = 4 << 20, 1 << 20, 256 << 10
	gold, goldAddr := mmap(t, size)
	replica, replicaAddr := mmap(t, size)
	testenv.Fill(gold, 42)
	trainer, trainerName := newEngine(t, metadata)
	inferencer, _ := newEngine(t, metadata)
	mustRegisterChunks(t, "the gold copy", trainer, goldAddr, size, chunk)
	mustRegisterChunks(t, "the replica", inferencer, replicaAddr, size, size)

	// Every shard fetched by its own goroutine, twice: through the segment
	// cache, then bypassing it as the store does on a retry.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	opens := 0
	for retry := 0; retry < 2; retry++ {
		for i := range replica {
			replica[i] = 0
		}
		var wg sync.WaitGroup
		errs := make(chan error, size/shard)
		for off := uint64(0); off < size; off += shard {
			wg.Add(1)
			opens++
			go func(off uint64) {
				defer wg.Done()
				errs <- fetchShard(ctx, inferencer, replicaAddr+uintptr(off), trainerName, uint64(goldAddr)+off, shard, retry)
			}(off)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: %v", retry, err)
			}
		}
		if d := testenv.Diff(replica, gold); d != "" {
			t.Fatalf("round %d replica: %s", retry, d)
		}
	}
	if err := inferencer.syncSegmentCache(); err != nil {
		t.Fatalf("syncSegmentCache: %v", err)
	}
	id, err := inferencer.openSegment(trainerName, true)
	if err != nil {
		t.Fatalf("openSegment: %v", err)
	}
	for i := 0; i <= opens; i++ {
		if err := inferencer.closeSegment(id); err != nil {
			t.Fatalf("closeSegment %d of %d: %v", i+1, opens+1, err)
		}
	}
	err = inferencer.closeSegment(id)
	if !errors.Is(err, ErrTransferEngine) || !errors.Is(err, te.ErrSegment) {
		t.Fatalf("closeSegment once more than opened: %v", err)
	}
	for off := uint64(0); off < size; off += chunk {
		if err := trainer.unregisterLocalMemory(goldAddr + uintptr(off)); err != nil {
			t.Fatalf("unregisterLocalMemory: %v", err)
		}
	}
	if err := inferencer.unregisterLocalMemory(replicaAddr); err != nil {
		t.Fatalf("unregisterLocalMemory: %v", err)
	}
	trainer.Close()
	trainer.Close() // a second Close does nothing
}

func TestP2PStoreP2PHandshake(t *testing.T) { storeFlow(t, "P2PHANDSHAKE") }

func TestP2PStoreRedis(t *testing.T) { storeFlow(t, testenv.Redis(t)) }

// MC_TCP_BIND_ADDRESS: with a metadata store, the address published (and
// reached by peers) instead of the one NewTransferEngine was given.
func TestTCPBindAddress(t *testing.T) {
	const size = 1 << 20
	redis := testenv.Redis(t)
	gold, goldAddr := mmap(t, size)
	copyBuf, copyAddr := mmap(t, size)
	testenv.Fill(gold, 7)
	port := testenv.FreePort(t)
	name := fmt.Sprintf("127.0.0.1:%d", port)
	t.Setenv("MC_TCP_BIND_ADDRESS", "127.0.0.2")
	e, err := NewTransferEngine(redis, name, "127.0.0.1", port)
	if err != nil {
		t.Fatalf("NewTransferEngine: %v", err)
	}
	t.Cleanup(e.Close)
	if got, err := e.GetLocalIpAndPort(); err != nil || got != fmt.Sprintf("127.0.0.2:%d", port) {
		t.Fatalf("GetLocalIpAndPort = %q, %v; want 127.0.0.2:%d", got, err, port)
	}
	if err := e.installTransport("tcp", ""); err != nil {
		t.Fatalf("installTransport: %v", err)
	}
	os.Unsetenv("MC_TCP_BIND_ADDRESS")
	peer, _ := newEngine(t, redis)
	mustRegisterChunks(t, "the gold copy", e, goldAddr, size, size)
	mustRegisterChunks(t, "the copy", peer, copyAddr, size, size)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := fetchShard(ctx, peer, copyAddr, name, uint64(goldAddr), size, 0); err != nil {
		t.Fatalf("reading from the engine at its published address: %v", err)
	}
	if d := testenv.Diff(copyBuf, gold); d != "" {
		t.Fatalf("copy: %s", d)
	}
}

func TestCompatErrors(t *testing.T) {
	is := func(what string, err error, code te.Code) {
		t.Helper()
		if !errors.Is(err, ErrTransferEngine) || !errors.Is(err, code) {
			t.Fatalf("%s: %v, want ErrTransferEngine wrapping %v", what, err, code)
		}
	}
	_, err := NewTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", -1)
	is("negative rpc port", err, te.ErrInvalid)
	_, err = NewTransferEngine("gopher://127.0.0.1:70", "x", "127.0.0.1", 0)
	if !errors.Is(err, ErrTransferEngine) {
		t.Fatalf("unknown metadata scheme: %v", err)
	}

	buf, base := mmap(t, 64<<10)
	testenv.Fill(buf, 7)
	target, targetName := newEngine(t, "P2PHANDSHAKE")
	e, _ := newEngine(t, "P2PHANDSHAKE")
	if err := target.registerLocalMemory(base, 32<<10, "cpu:0"); err != nil {
		t.Fatalf("registerLocalMemory: %v", err)
	}
	if err := e.registerLocalMemory(base+32<<10, 32<<10, "cpu:0"); err != nil {
		t.Fatalf("registerLocalMemory: %v", err)
	}
	is("registerLocalMemory(0)", e.registerLocalMemory(0, 10, "cpu:0"), te.ErrInvalid)
	is("overlapping registerLocalMemory", e.registerLocalMemory(base+40<<10, 10, "cpu:0"), te.ErrOverlap)
	is("unregisterLocalMemory(unknown)", e.unregisterLocalMemory(base+1), te.ErrAddress)

	id, err := e.allocateBatchID(0)
	if id != -1 {
		t.Fatalf("allocateBatchID(0) gave %d", id)
	}
	is("allocateBatchID(0)", err, te.ErrInvalid)
	is("submitTransfer to an unknown batch", e.submitTransfer(12345, nil), te.ErrBatch)
	_, _, err = e.getTransferStatus(12345, 0)
	is("getTransferStatus of an unknown batch", err, te.ErrBatch)
	is("freeBatchID of an unknown batch", e.freeBatchID(12345), te.ErrBatch)

	seg, err := e.openSegment(targetName, false)
	if err != nil {
		t.Fatalf("openSegment: %v", err)
	}
	b, err := e.allocateBatchID(4)
	if err != nil {
		t.Fatalf("allocateBatchID: %v", err)
	}
	good := TransferRequest{Opcode: OPCODE_READ, Source: uint64(base + 32<<10), TargetID: seg,
		TargetOffset: uint64(base), Length: 4096}
	bad := good
	bad.TargetID = 1 << 40
	is("request to an id no segment has", e.submitTransfer(b, []TransferRequest{good, bad}), te.ErrSegment)
	badOp := good
	badOp.Opcode = 7
	is("request with opcode 7", e.submitTransfer(b, []TransferRequest{badOp}), te.ErrInvalid)
	for task, want := range []int{STATUS_COMPLETED, STATUS_INVALID, STATUS_INVALID} {
		var st int
		for st = STATUS_WAITING; st == STATUS_WAITING || st == STATUS_PENDING; time.Sleep(time.Millisecond) {
			if st, _, err = e.getTransferStatus(b, task); err != nil {
				t.Fatalf("getTransferStatus(%d): %v", task, err)
			}
		}
		if st != want {
			t.Fatalf("task %d ended %d, want %d", task, st, want)
		}
	}
	if d := testenv.Diff(buf[32<<10:32<<10+4096], buf[:4096]); d != "" {
		t.Fatalf("the good request's data: %s", d)
	}
	st, moved, err := e.getTransferStatus(b, 99)
	if st != -1 || moved != 0 || !errors.Is(err, ErrTransferEngine) {
		t.Fatalf("getTransferStatus of a task never submitted: %d %d %v", st, moved, err)
	}
	if err := e.freeBatchID(b); err != nil {
		t.Fatalf("freeBatchID: %v", err)
	}
	is("freeBatchID twice", e.freeBatchID(b), te.ErrBatch)
	_, err = e.openSegment("127.0.0.1:1", true)
	is("openSegment of nobody", err, te.ErrConnRefused)
	is("closeSegment of an id never opened", e.closeSegment(77), te.ErrSegment)

	// Without the peer's transport the segment cannot be opened afresh.
	if err := e.uninstallTransport("tcp"); err != nil {
		t.Fatalf("uninstallTransport: %v", err)
	}
	_, err = e.openSegment(fmt.Sprintf("127.0.0.1:%d", target.engine.RPCPort()), false)
	is("openSegment without a transport", err, te.ErrNoTransport)
	if e.Engine() == nil || e.Engine().Name() == "" {
		t.Fatalf("Engine() gives no engine")
	}
	e.Close()
	_, err = e.allocateBatchID(1)
	is("allocateBatchID after Close", err, te.ErrClosed)
}
