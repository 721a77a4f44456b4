// SPDX-License-Identifier: Apache-2.0

package te

/*
#include "tego.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"syscall"
	"time"
)

// Opcode says which way a request moves bytes.
type Opcode uint32

const (
	OpRead  Opcode = C.TE_OP_READ  // segment -> local memory
	OpWrite Opcode = C.TE_OP_WRITE // local memory -> segment
)

// Request is one transfer. The local side is Local, a slice of memory this
// engine registered; or, for memory registered with RegisterExternal, Addr
// and Length with Local nil. Remote is an address in the segment owner's
// process (a byte offset for file segments).
type Request struct {
	Op      Opcode
	Segment SegmentID
	Remote  uint64
	Local   []byte
	Addr    uintptr
	Length  uint64
}

// TaskState is the state of one task; the numbers equal Mooncake's.
type TaskState int32

const (
	TaskWaiting   TaskState = C.TE_TASK_WAITING   // submitted, moving
	TaskPending   TaskState = C.TE_TASK_PENDING   // accepted, not yet started
	TaskInvalid   TaskState = C.TE_TASK_INVALID   // refused at submit
	TaskCanceled  TaskState = C.TE_TASK_CANCELED  // the batch was canceled
	TaskCompleted TaskState = C.TE_TASK_COMPLETED // every byte moved
	TaskTimeout   TaskState = C.TE_TASK_TIMEOUT
	TaskFailed    TaskState = C.TE_TASK_FAILED
)

var stateNames = [...]string{"WAITING", "PENDING", "INVALID", "CANCELED", "COMPLETED", "TIMEOUT", "FAILED"}

func (s TaskState) String() string {
	if s >= 0 && int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("TaskState(%d)", int32(s))
}

// Done reports whether a task in this state has ended.
func (s TaskState) Done() bool { return s != TaskWaiting && s != TaskPending }

// TaskStatus is the status of one task.
type TaskStatus struct {
	State       TaskState
	Err         error  // nil, or the Code that ended the task
	Transferred uint64 // bytes moved so far (a lower bound while moving)
}

// TaskFlags are what TaskInfo adds to a task's status.
type TaskFlags uint32

const (
	// TaskUnsettled: ended (by a deadline or a cancel) while a WRITE's
	// bytes were on their way; the peer may still apply them. Cleared once
	// it cannot (WaitSettled waits for that).
	TaskUnsettled TaskFlags = C.TE_TASK_UNSETTLED
	// TaskEndedEarly: ended by libte at its deadline or a cancel, before
	// its transport finished it.
	TaskEndedEarly TaskFlags = C.TE_TASK_ENDED_EARLY
)

// TaskInfo is a task's status with its flags and deadline.
type TaskInfo struct {
	State       TaskState
	Err         error     // nil, or the Code that ended the task
	Flags       TaskFlags // TaskUnsettled, TaskEndedEarly
	Transferred uint64    // bytes moved so far
	DeadlineNs  int64     // NowNs's clock; 0: none
}

// NowNs is the clock of deadlines: CLOCK_MONOTONIC in nanoseconds
// (te_now_ns).
func NowNs() int64 { return int64(C.te_now_ns()) }

// DeadlineNs converts t to NowNs's clock (a time in the past gives one in
// the past; at least 1, as 0 means none).
func DeadlineNs(t time.Time) int64 {
	now, left := NowNs(), int64(time.Until(t))
	if left > math.MaxInt64-now {
		return math.MaxInt64
	}
	if now+left < 1 {
		return 1
	}
	return now + left
}

// BatchSummary sums up a batch: State is TaskCompleted when every task
// completed, the worst end state when all ended and one did not complete,
// TaskWaiting while tasks are in flight.
type BatchSummary struct {
	Submitted int
	InFlight  int
	State     TaskState
}

// Batch is a set of up to its capacity tasks over its whole life (task ids
// continue across Submit calls). Its methods are safe for concurrent use.
type Batch struct {
	e        *Engine
	id       C.te_batch_id
	capacity int

	mu    sync.RWMutex // Free holds it for writing, every other call for reading
	freed bool

	// regions this batch's tasks have used since it was last seen idle
	// (see Engine.idleLocked).
	refMu   sync.Mutex
	regions map[*region]struct{}
}

// NewBatch allocates a batch that holds up to capacity tasks.
func (e *Engine) NewBatch(capacity int) (*Batch, error) {
	const op = "NewBatch"
	if capacity <= 0 {
		return nil, newError(op, ErrInvalid, fmt.Sprintf("capacity %d is not positive", capacity))
	}
	h, err := e.rlock(op)
	if err != nil {
		return nil, err
	}
	defer e.mu.RUnlock()
	var id C.te_batch_id
	if err := cerr(op, func() C.int { return C.te_batch_alloc(h, C.size_t(capacity), &id) }); err != nil {
		return nil, err
	}
	b := &Batch{e: e, id: id, capacity: capacity}
	e.memMu.Lock()
	e.batches[b] = struct{}{}
	e.memMu.Unlock()
	return b, nil
}

// Capacity is the number of tasks the batch holds over its life.
func (b *Batch) Capacity() int { return b.capacity }

// use takes the batch and its engine for one call; on success the caller
// runs the returned release.
func (b *Batch) use(op string) (*C.te_engine, func(), error) {
	if b == nil {
		return nil, nil, newError(op, ErrInvalid, "nil batch")
	}
	return b.e.rlockUnder(op, &b.mu, func() error {
		if b.freed {
			return newError(op, ErrBatch, "batch was freed")
		}
		return nil
	})
}

// call runs fn, one libte call, on the batch and its engine (both taken
// for it, as use does) through cerr.
func (b *Batch) call(op string, fn func(h *C.te_engine) C.int) error {
	return callUnder(op, b.use, fn)
}

// Submit appends the requests as tasks and starts them. It returns how many
// became INVALID tasks (a bad opcode, unregistered local memory, an unknown
// segment, a range outside the segment: see Status for why); the others
// run. err is set, and nothing appended, when the batch is freed, the
// engine closed, or the requests exceed the capacity left (ErrBatchFull).
// The tasks get the batch's deadline (SetDeadline), if any.
func (b *Batch) Submit(reqs ...Request) (invalid int, err error) {
	return b.submit("Submit", 0, reqs)
}

// SubmitBy is Submit with deadlineNs (NowNs's clock; 0: the batch's) for
// these tasks: one still in flight then ends TaskFailed with ErrTimeout
// within milliseconds, and from then on nothing touches its local memory
// (te_submit_by). A negative deadline is ErrInvalid.
func (b *Batch) SubmitBy(deadlineNs int64, reqs ...Request) (invalid int, err error) {
	if deadlineNs < 0 {
		return 0, newError("SubmitBy", ErrInvalid, fmt.Sprintf("deadline %d is negative", deadlineNs))
	}
	return b.submit("SubmitBy", deadlineNs, reqs)
}

func (b *Batch) submit(op string, deadlineNs int64, reqs []Request) (invalid int, err error) {
	creqs := make([]C.tego_request, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		p, n := r.Addr, r.Length
		if r.Local != nil {
			if r.Addr != 0 || r.Length != 0 {
				return 0, newError(op, ErrInvalid, fmt.Sprintf("request %d sets both Local and Addr/Length", i))
			}
			n = uint64(len(r.Local))
			if n > 0 {
				p = addrOf(r.Local)
			}
		}
		creqs[i] = C.tego_request{
			opcode:  C.uint32_t(r.Op),
			segment: C.int32_t(r.Segment),
			local:   C.uintptr_t(p),
			remote:  C.uint64_t(r.Remote),
			length:  C.uint64_t(n),
		}
	}
	h, release, err := b.use(op)
	if err != nil {
		return 0, err
	}
	defer release()
	if len(reqs) == 0 {
		return 0, nil
	}
	e := b.e
	e.memMu.RLock()
	defer e.memMu.RUnlock()
	// Remember the regions the tasks use, so that UnregisterMemory can tell
	// whether they are still in flight. Requests outside every region are
	// left to libte, which makes them INVALID tasks.
	b.refMu.Lock()
	for i := range creqs {
		n := uintptr(creqs[i].length)
		if r := e.regionForLocked(uintptr(creqs[i].local), n); r != nil && n > 0 {
			if b.regions == nil {
				b.regions = make(map[*region]struct{})
			}
			b.regions[r] = struct{}{}
		}
	}
	b.refMu.Unlock()
	n, err := cint(op, func() C.int {
		return C.tego_submit(h, b.id, &creqs[0], C.size_t(len(creqs)), C.int64_t(deadlineNs))
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// task runs get, one libte call about task i, on the batch (as call does);
// a negative i is ErrInvalid.
func (b *Batch) task(op string, i int, get func(h *C.te_engine, task C.size_t) C.int) error {
	if i < 0 {
		return newError(op, ErrInvalid, fmt.Sprintf("task %d", i))
	}
	return b.call(op, func(h *C.te_engine) C.int { return get(h, C.size_t(i)) })
}

// taskErr is a task's error code as TaskStatus.Err and TaskInfo.Err: nil
// for 0, so that Err == nil tells a task that did not fail.
func taskErr(code C.int32_t) error {
	if code == 0 {
		return nil
	}
	return Code(code)
}

// Status returns the status of task i (0 is the first task submitted).
func (b *Batch) Status(i int) (TaskStatus, error) {
	var st C.te_task_status
	if err := b.task("Status", i, func(h *C.te_engine, t C.size_t) C.int {
		return C.te_get_status(h, b.id, t, &st)
	}); err != nil {
		return TaskStatus{}, err
	}
	return TaskStatus{State: TaskState(st.state), Err: taskErr(st.error), Transferred: uint64(st.transferred)}, nil
}

// TaskInfo returns task i's status with its flags and deadline
// (te_get_task_info).
func (b *Batch) TaskInfo(i int) (TaskInfo, error) {
	var ti C.te_task_info
	ti.size = C.uint32_t(C.sizeof_te_task_info)
	if err := b.task("TaskInfo", i, func(h *C.te_engine, t C.size_t) C.int {
		return C.te_get_task_info(h, b.id, t, &ti)
	}); err != nil {
		return TaskInfo{}, err
	}
	return TaskInfo{State: TaskState(ti.state), Err: taskErr(ti.error), Flags: TaskFlags(ti.flags),
		Transferred: uint64(ti.transferred), DeadlineNs: int64(ti.deadline_ns)}, nil
}

// SetDeadline sets the deadline (NowNs's clock) of the tasks submitted to
// the batch from now on whose submit gives none; 0 removes it. Tasks
// already submitted keep theirs. A negative one is ErrInvalid.
func (b *Batch) SetDeadline(deadlineNs int64) error {
	return b.call("SetDeadline", func(h *C.te_engine) C.int {
		return C.te_batch_set_deadline(h, b.id, C.int64_t(deadlineNs))
	})
}

// Summary returns the number of tasks submitted, in flight, and the
// batch's overall state.
func (b *Batch) Summary() (BatchSummary, error) {
	var sub, inflight C.size_t
	var state C.int32_t
	if err := b.call("Summary", func(h *C.te_engine) C.int {
		return C.te_batch_status(h, b.id, &sub, &inflight, &state)
	}); err != nil {
		return BatchSummary{}, err
	}
	return BatchSummary{Submitted: int(sub), InFlight: int(inflight), State: TaskState(state)}, nil
}

// waitSlice is how long one te_batch_wait call blocks: the batch and the
// engine are released between calls, so Free, Close and ctx are noticed
// within it.
const waitSlice = 50 * time.Millisecond

// Wait blocks until no task of the batch is in flight, or ctx is done (then
// it returns ctx.Err() and the tasks go on: Cancel stops them). No
// goroutine is left behind: the waiting happens in bounded te_batch_wait
// calls on the caller's goroutine.
func (b *Batch) Wait(ctx context.Context) error {
	return b.wait(ctx, false)
}

// WaitSettled is Wait, then also until no task is unsettled (a WRITE ended
// early whose bytes the peer may still apply: TaskUnsettled).
func (b *Batch) WaitSettled(ctx context.Context) error {
	return b.wait(ctx, true)
}

func (b *Batch) wait(ctx context.Context, settled bool) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		slice := waitSlice
		if dl, ok := ctx.Deadline(); ok {
			if left := time.Until(dl); left < slice {
				slice = left
			}
		}
		ms := slice.Milliseconds()
		if ms < 1 {
			ms = 1
		}
		done, err := b.waitFor(ms, settled)
		if done || err != nil {
			return err
		}
	}
}

// waitFor runs one te_batch_wait (te_batch_wait_settled) of ms
// milliseconds; done when nothing is in flight (nor unsettled).
func (b *Batch) waitFor(ms int64, settled bool) (bool, error) {
	op := "Wait"
	if settled {
		op = "WaitSettled"
	}
	h, release, err := b.use(op)
	if err != nil {
		return false, err
	}
	defer release()
	rc, detail := ccall(func() C.int {
		if settled {
			return C.te_batch_wait_settled(h, b.id, C.int(ms))
		}
		return C.te_batch_wait(h, b.id, C.int(ms))
	})
	switch {
	case rc >= 0:
		return true, nil
	case rc == -int(syscall.ETIMEDOUT):
		return false, nil
	default:
		return false, newError(op, Code(rc), detail)
	}
}

// Cancel cancels the batch: its tasks still in flight end CANCELED, within
// milliseconds on a transport that honours deadlines (on another, running
// ones stop at their next slice). It returns at once; Wait sees them end.
func (b *Batch) Cancel() error {
	return b.call("Cancel", func(h *C.te_engine) C.int { return C.te_batch_cancel(h, b.id) })
}

// Free frees the batch. It refuses (ErrBusy) while a task has not ended; a
// freed batch returns ErrBatch from every method.
func (b *Batch) Free() error {
	const op = "Free"
	if b == nil {
		return newError(op, ErrInvalid, "nil batch")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed {
		return newError(op, ErrBatch, "batch was freed already")
	}
	e := b.e
	h, err := e.rlock(op)
	if err != nil {
		return err
	}
	defer e.mu.RUnlock()
	rc, detail := ccall(func() C.int { return C.te_batch_free(h, b.id) })
	if rc == -int(syscall.EBUSY) && b.allEndedLocked(h) {
		// libte shows a task's end state a moment before it stops counting
		// the task as in flight. Code that frees a batch as soon as every
		// status has ended (Mooncake's P2P store does) must not be refused
		// for that moment: let it pass, then free.
		if wr, _ := ccall(func() C.int { return C.te_batch_wait(h, b.id, 1000) }); wr == 0 {
			rc, detail = ccall(func() C.int { return C.te_batch_free(h, b.id) })
		}
	}
	if rc < 0 {
		return newError(op, Code(rc), detail)
	}
	b.freed = true
	e.memMu.Lock()
	delete(e.batches, b)
	e.memMu.Unlock()
	b.refMu.Lock()
	b.regions = nil
	b.refMu.Unlock()
	return nil
}

// allEndedLocked reports whether every task of the batch shows an end
// state. The caller holds the batch and the engine.
func (b *Batch) allEndedLocked(h *C.te_engine) bool {
	var sub C.size_t
	if rc, _ := ccall(func() C.int { return C.te_batch_status(h, b.id, &sub, nil, nil) }); rc < 0 {
		return false
	}
	for i := C.size_t(0); i < sub; i++ {
		var st C.te_task_status
		if rc, _ := ccall(func() C.int { return C.te_get_status(h, b.id, i, &st) }); rc < 0 ||
			!TaskState(st.state).Done() {
			return false
		}
	}
	return true
}

// Notify sends msg to the owner of seg once no task of the batch is in
// flight (at once when none is).
func (b *Batch) Notify(seg SegmentID, msg string) error {
	return b.notify("Batch.Notify", seg, nil, msg)
}

// NotifyAs is Notify with sender as the notification's name.
func (b *Batch) NotifyAs(seg SegmentID, sender, msg string) error {
	return b.notify("Batch.NotifyAs", seg, &sender, msg)
}

func (b *Batch) notify(op string, seg SegmentID, sender *string, msg string) error {
	return sendNotify(op, sender, msg, func(csender, cmsg *C.char) error {
		return b.call(op, func(h *C.te_engine) C.int {
			return C.te_batch_notify_as(h, b.id, C.te_segment_id(seg), csender, cmsg)
		})
	})
}

// Read copies len(local) bytes from seg at remote into local, and waits.
func (e *Engine) Read(ctx context.Context, local []byte, seg SegmentID, remote uint64) error {
	return e.transfer(ctx, "Read", Request{Op: OpRead, Segment: seg, Remote: remote, Local: local})
}

// Write copies local to seg at remote, and waits.
func (e *Engine) Write(ctx context.Context, local []byte, seg SegmentID, remote uint64) error {
	return e.transfer(ctx, "Write", Request{Op: OpWrite, Segment: seg, Remote: remote, Local: local})
}

// Transfer runs the requests as one batch and waits for all of them. It
// returns nil when every task completed, else an error naming the first
// task that did not. ctx's deadline is the tasks' deadline: libte ends
// them by it. When ctx ends first, it cancels the batch, waits until
// nothing touches the local memory any more and returns ctx.Err().
func (e *Engine) Transfer(ctx context.Context, reqs ...Request) error {
	return e.transfer(ctx, "Transfer", reqs...)
}

func (e *Engine) transfer(ctx context.Context, op string, reqs ...Request) error {
	if len(reqs) == 0 {
		return nil
	}
	for i := range reqs {
		if reqs[i].Local != nil && len(reqs[i].Local) == 0 {
			return newError(op, ErrInvalid, fmt.Sprintf("request %d has an empty buffer", i))
		}
	}
	b, err := e.NewBatch(len(reqs))
	if err != nil {
		return err
	}
	// Free's error only matters when the engine was closed meanwhile, and
	// then the batch went with it.
	defer func() { _ = b.Free() }()
	var deadline int64
	if dl, ok := ctx.Deadline(); ok {
		deadline = DeadlineNs(dl)
	}
	if _, err := b.submit(op, deadline, reqs); err != nil {
		return err
	}
	if err := b.Wait(ctx); err != nil {
		if ctx.Err() != nil {
			_ = b.Cancel()
			// Settle without ctx: the tasks may still touch local memory.
			_ = b.Wait(context.Background())
		}
		return err
	}
	for i := range reqs {
		st, err := b.TaskInfo(i)
		if err != nil {
			return err
		}
		if st.State == TaskCompleted {
			continue
		}
		if st.Flags&TaskEndedEarly != 0 && errors.Is(st.Err, ErrTimeout) && deadline != 0 {
			// Ended at ctx's deadline: libte's timer may fire before ctx's.
			if err := ctx.Err(); err != nil {
				return err
			}
			return context.DeadlineExceeded
		}
		code, _ := st.Err.(Code)
		if code == 0 {
			code = stateCode(st.State)
		}
		what := fmt.Sprintf("task %d of %d ended %s after %d bytes", i, len(reqs), st.State, st.Transferred)
		if len(reqs) == 1 {
			what = fmt.Sprintf("transfer ended %s after %d bytes", st.State, st.Transferred)
		}
		return newError(op, code, what)
	}
	return nil
}

// stateCode is the code for an end state whose task carries none.
func stateCode(s TaskState) Code {
	switch s {
	case TaskCanceled:
		return ErrCanceled
	case TaskTimeout:
		return ErrTimeout
	case TaskInvalid:
		return ErrInvalid
	default:
		return ErrIO
	}
}
