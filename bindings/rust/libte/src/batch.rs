//! Batches, requests and task statuses.
use crate::engine::{cstring, Engine};
use crate::error::{call, code, Error, Result};
use crate::memory::{Local, Registration};
use crate::segment::SegmentId;
use libte_sys as sys;
use std::marker::PhantomData;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Which way a request moves bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    /// segment → local memory
    Read,
    /// local memory → segment
    Write,
}

/// One transfer between a [`Local`] range and a segment, borrowing the
/// range for `'q`: mutably for a READ (libte writes it), shared for a WRITE
/// (libte reads it). Not `Clone`: each request is submitted once, so two
/// tasks never write the same local bytes through one borrow.
#[repr(transparent)]
pub struct Request<'q> {
    raw: sys::te_request,
    _m: PhantomData<&'q mut [u8]>,
}

// SAFETY: it carries a borrow of registered memory (Send + Sync like a
// slice borrow) and plain numbers.
unsafe impl Send for Request<'_> {}
unsafe impl Sync for Request<'_> {}

/// What a READ may write into: a [`Local`] (by value or `&mut`) or a whole
/// registration (`&mut`). Sealed: only registered memory qualifies.
pub trait ReadTarget<'q>: sealed::Sealed {
    #[doc(hidden)]
    fn raw_range(self) -> (*mut u8, usize);
}

/// What a WRITE may read from: a [`Local`] (by value, `&` or `&mut`) or a
/// registration (`&` or `&mut`). Sealed: only registered memory qualifies.
pub trait WriteSource<'q>: sealed::Sealed {
    #[doc(hidden)]
    fn raw_range(self) -> (*mut u8, usize);
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::Local<'_> {}
    impl Sealed for &crate::Local<'_> {}
    impl Sealed for &mut crate::Local<'_> {}
    impl Sealed for &crate::Registration<'_, '_> {}
    impl Sealed for &mut crate::Registration<'_, '_> {}
}

/// `raw_range` for each type that qualifies as `$target`: the address and
/// length of the registered range it borrows.
macro_rules! raw_range_for {
    ($target:ident: $($t:ty),+) => {
        $(impl<'q> $target<'q> for $t {
            fn raw_range(self) -> (*mut u8, usize) {
                (self.as_ptr(), self.len())
            }
        })+
    };
}

raw_range_for!(ReadTarget: Local<'q>, &'q mut Local<'_>, &'q mut Registration<'_, '_>);
raw_range_for!(
    WriteSource: Local<'q>,
    &'q Local<'_>,
    &'q mut Local<'_>,
    &'q Registration<'_, '_>,
    &'q mut Registration<'_, '_>
);

impl<'q> Request<'q> {
    /// Reads `local`'s length in bytes at `remote` of `segment` into it.
    pub fn read(segment: impl Into<SegmentId>, remote: u64, local: impl ReadTarget<'q>) -> Request<'q> {
        let (p, n) = local.raw_range();
        Request::make(sys::TE_OP_READ, segment.into(), remote, p, n)
    }

    /// Writes `local` to `remote` of `segment`.
    pub fn write(segment: impl Into<SegmentId>, remote: u64, local: impl WriteSource<'q>) -> Request<'q> {
        let (p, n) = local.raw_range();
        Request::make(sys::TE_OP_WRITE, segment.into(), remote, p, n)
    }

    fn make(op: u32, seg: SegmentId, remote: u64, local: *mut u8, len: usize) -> Request<'q> {
        Request {
            raw: sys::te_request { opcode: op, segment: seg.0, local: local as *mut c_void, remote, length: len as u64 },
            _m: PhantomData,
        }
    }

    pub fn opcode(&self) -> Opcode {
        if self.raw.opcode == sys::TE_OP_READ {
            Opcode::Read
        } else {
            Opcode::Write
        }
    }

    pub fn segment(&self) -> SegmentId {
        SegmentId(self.raw.segment)
    }

    pub fn remote(&self) -> u64 {
        self.raw.remote
    }

    pub fn len(&self) -> u64 {
        self.raw.length
    }

    pub fn is_empty(&self) -> bool {
        self.raw.length == 0
    }
}

impl std::fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("opcode", &self.opcode())
            .field("segment", &self.raw.segment)
            .field("local", &self.raw.local)
            .field("remote", &format_args!("{:#x}", self.raw.remote))
            .field("length", &self.raw.length)
            .finish()
    }
}

/// A task's state; the numbers are libte's (and Mooncake's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    /// submitted, moving
    Waiting,
    /// accepted, not yet started
    Pending,
    /// refused at submit (see the status's `error`)
    Invalid,
    Canceled,
    Completed,
    Timeout,
    Failed,
    /// a state this crate does not know (a newer libte)
    Unknown(i32),
}

impl TaskState {
    pub fn from_raw(s: i32) -> TaskState {
        match s {
            sys::TE_TASK_WAITING => TaskState::Waiting,
            sys::TE_TASK_PENDING => TaskState::Pending,
            sys::TE_TASK_INVALID => TaskState::Invalid,
            sys::TE_TASK_CANCELED => TaskState::Canceled,
            sys::TE_TASK_COMPLETED => TaskState::Completed,
            sys::TE_TASK_TIMEOUT => TaskState::Timeout,
            sys::TE_TASK_FAILED => TaskState::Failed,
            other => TaskState::Unknown(other),
        }
    }

    /// Whether the task has ended (it will not change again).
    pub fn is_final(self) -> bool {
        !matches!(self, TaskState::Waiting | TaskState::Pending)
    }

    /// The code an error names when libte gave the task none.
    pub(crate) fn default_code(self) -> i32 {
        match self {
            TaskState::Waiting | TaskState::Pending => code::EINPROGRESS,
            TaskState::Canceled => code::ECANCELED,
            TaskState::Timeout => code::ETIMEDOUT,
            TaskState::Invalid => code::EINVAL,
            _ => code::EIO,
        }
    }
}

/// te_task_status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskStatus {
    pub state: TaskState,
    /// 0, or the negative code that ended the task.
    pub error: i32,
    /// Bytes moved so far (a lower bound while moving).
    pub transferred: u64,
}

impl TaskStatus {
    fn from_raw(s: &sys::te_task_status) -> TaskStatus {
        TaskStatus { state: TaskState::from_raw(s.state), error: s.error, transferred: s.transferred }
    }

    /// Ok(bytes moved) when the task completed, else its error.
    pub fn result(&self) -> Result<u64> {
        if self.state == TaskState::Completed {
            Ok(self.transferred)
        } else {
            Err(self.error_for("task"))
        }
    }

    /// The error of task number `task` that did not complete.
    pub(crate) fn to_error(self, task: usize) -> Error {
        self.error_for(&format!("task {}", task))
    }

    fn error_for(self, what: &str) -> Error {
        let c = if self.error != 0 { self.error } else { self.state.default_code() };
        Error::new(c, format!("{} ended {:?} after {} bytes", what, self.state, self.transferred))
    }
}

/// te_task_info: a task's status with its flags and deadline (since 1.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskInfo {
    pub state: TaskState,
    /// 0, or the negative code that ended the task.
    pub error: i32,
    /// `sys::TE_TASK_UNSETTLED` | `sys::TE_TASK_ENDED_EARLY`.
    pub flags: u32,
    /// Bytes moved so far.
    pub transferred: u64,
    /// The task's deadline ([`now_ns`](crate::now_ns)'s clock), 0: none.
    pub deadline_ns: i64,
}

impl TaskInfo {
    fn from_raw(s: &sys::te_task_info) -> TaskInfo {
        TaskInfo {
            state: TaskState::from_raw(s.state),
            error: s.error,
            flags: s.flags,
            transferred: s.transferred,
            deadline_ns: s.deadline_ns,
        }
    }

    /// Ended early while a WRITE's bytes were on their way: the peer may
    /// still apply them (until `Batch::wait_settled` returns).
    pub fn unsettled(&self) -> bool {
        self.flags & sys::TE_TASK_UNSETTLED != 0
    }

    /// Ended by libte at its deadline or a cancel, before its transport
    /// finished it.
    pub fn ended_early(&self) -> bool {
        self.flags & sys::TE_TASK_ENDED_EARLY != 0
    }

    /// The status part.
    pub fn status(&self) -> TaskStatus {
        TaskStatus { state: self.state, error: self.error, transferred: self.transferred }
    }
}

/// te_batch_status: the batch as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSummary {
    /// Tasks submitted so far.
    pub submitted: usize,
    /// Tasks not yet ended.
    pub in_flight: usize,
    /// Completed when every task completed; the worst final state when all
    /// ended; Waiting otherwise.
    pub state: TaskState,
}

/// A batch of tasks, lent by `Engine::batch` to its closure.
///
/// `'r` is the borrow every submitted request's local memory is held for;
/// it outlasts the `Engine::batch` call, which waits for the tasks before
/// it returns. The batch is invariant in `'r` (a shorter `'r` cannot be
/// substituted at a `submit` call) and only ever lent by reference (it
/// cannot be leaked or moved out), so no task can outlive its memory's
/// borrow. It is `Sync`: threads may submit to it, wait on it and read
/// statuses at once, as libte allows.
pub struct Batch<'e, 'r> {
    engine: &'e Engine,
    id: sys::te_batch_id,
    capacity: usize,
    freed: AtomicBool,
    _r: PhantomData<fn(&'r ()) -> &'r ()>,
}

impl<'e, 'r> Batch<'e, 'r> {
    pub(crate) fn alloc(engine: &'e Engine, capacity: usize) -> Result<Batch<'e, 'r>> {
        let mut id = sys::TE_INVALID_BATCH;
        // SAFETY: `id` receives the new batch id.
        call(|| unsafe { sys::te_batch_alloc(engine.as_raw(), capacity, &mut id) })?;
        Ok(Batch { engine, id, capacity, freed: AtomicBool::new(false), _r: PhantomData })
    }

    /// libte's batch id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Tasks it can hold over its life.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Appends the requests as tasks (task numbers continue from earlier
    /// submits). Returns how many became INVALID (bad range, unknown
    /// segment, ...; their statuses say why); the others run. Err when
    /// nothing was appended: capacity exceeded (TE_ERR_BATCH_FULL), freed
    /// batch (TE_ERR_BATCH).
    pub fn submit(&self, requests: impl IntoIterator<Item = Request<'r>>) -> Result<usize> {
        self.submit_by(requests, 0)
    }

    /// `submit` with `deadline_ns` ([`now_ns`](crate::now_ns)'s clock; 0:
    /// the batch's) for these tasks: one still in flight then ends Failed
    /// with ETIMEDOUT within milliseconds, and nothing touches its local
    /// memory afterwards (te_submit_by). EINVAL for a negative deadline.
    pub fn submit_by(&self, requests: impl IntoIterator<Item = Request<'r>>, deadline_ns: i64) -> Result<usize> {
        if deadline_ns < 0 {
            return Err(Error::new(code::EINVAL, format!("deadline {} is negative", deadline_ns)));
        }
        let reqs: Vec<Request<'r>> = requests.into_iter().collect();
        // SAFETY: Request is repr(transparent) over te_request. The local
        // memory stays borrowed for 'r, which outlives this batch.
        let n = call(|| unsafe {
            sys::te_submit_by(
                self.engine.as_raw(),
                self.id,
                reqs.as_ptr() as *const sys::te_request,
                reqs.len(),
                deadline_ns,
            )
        })?;
        Ok(n as usize)
    }

    /// The deadline of the tasks submitted from now on whose submit gives
    /// none; 0 removes it. EINVAL for a negative one.
    pub fn set_deadline(&self, deadline_ns: i64) -> Result<()> {
        // SAFETY: live engine.
        call(|| unsafe { sys::te_batch_set_deadline(self.engine.as_raw(), self.id, deadline_ns) })?;
        Ok(())
    }

    /// Task `task`'s status with its flags and deadline.
    pub fn task_info(&self, task: usize) -> Result<TaskInfo> {
        let mut ti = sys::te_task_info { size: std::mem::size_of::<sys::te_task_info>() as u32, ..Default::default() };
        // SAFETY: `ti` receives the info; its size field says how much.
        call(|| unsafe { sys::te_get_task_info(self.engine.as_raw(), self.id, task, &mut ti) })?;
        Ok(TaskInfo::from_raw(&ti))
    }

    /// The status of task `task` (0-based, in submit order).
    pub fn status(&self, task: usize) -> Result<TaskStatus> {
        let mut st = sys::te_task_status::default();
        // SAFETY: `st` receives the status.
        call(|| unsafe { sys::te_get_status(self.engine.as_raw(), self.id, task, &mut st) })?;
        Ok(TaskStatus::from_raw(&st))
    }

    /// Every submitted task's status.
    pub fn statuses(&self) -> Result<Vec<TaskStatus>> {
        let n = self.summary()?.submitted;
        (0..n).map(|i| self.status(i)).collect()
    }

    /// te_batch_status.
    pub fn summary(&self) -> Result<BatchSummary> {
        let (mut submitted, mut in_flight, mut state) = (0usize, 0usize, 0i32);
        // SAFETY: out-pointers valid for the call.
        call(|| unsafe {
            sys::te_batch_status(self.engine.as_raw(), self.id, &mut submitted, &mut in_flight, &mut state)
        })?;
        Ok(BatchSummary { submitted, in_flight, state: TaskState::from_raw(state) })
    }

    /// Blocks until no task is in flight (None: no limit); ETIMEDOUT when
    /// the time ran out first.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        // SAFETY: live engine.
        call(|| unsafe { sys::te_batch_wait(self.engine.as_raw(), self.id, ms) })?;
        Ok(())
    }

    /// As `wait`, then also until no task is unsettled (a WRITE ended early
    /// whose bytes the peer may still apply); ETIMEDOUT when the time ran
    /// out first.
    pub fn wait_settled(&self, timeout: Option<Duration>) -> Result<()> {
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        // SAFETY: live engine.
        call(|| unsafe { sys::te_batch_wait_settled(self.engine.as_raw(), self.id, ms) })?;
        Ok(())
    }

    /// Cancels: the tasks still in flight end CANCELED, within milliseconds
    /// on a transport that honours deadlines (on another, running ones stop
    /// at a slice boundary). Returns at once; `wait` to see them end.
    pub fn cancel(&self) -> Result<()> {
        // SAFETY: live engine.
        call(|| unsafe { sys::te_batch_cancel(self.engine.as_raw(), self.id) })?;
        Ok(())
    }

    /// Frees the batch now: EBUSY while tasks are in flight. Afterwards
    /// every call on it fails with TE_ERR_BATCH (libte never reuses an id).
    /// Without it, `Engine::batch` frees the batch when the closure ends.
    pub fn free(&self) -> Result<()> {
        // SAFETY: live engine.
        call(|| unsafe { sys::te_batch_free(self.engine.as_raw(), self.id) })?;
        self.freed.store(true, Ordering::Release);
        Ok(())
    }

    /// te_batch_notify: sends `msg` to the owner of `segment` once no task
    /// is in flight.
    pub fn notify(&self, segment: impl Into<SegmentId>, msg: &str) -> Result<()> {
        let cmsg = cstring(msg, "notification")?;
        let seg = segment.into().0;
        // SAFETY: valid string for the call.
        call(|| unsafe { sys::te_batch_notify(self.engine.as_raw(), self.id, seg, cmsg.as_ptr()) })?;
        Ok(())
    }

    /// te_batch_notify_as: as `notify` under the name `sender`.
    pub fn notify_as(&self, segment: impl Into<SegmentId>, sender: &str, msg: &str) -> Result<()> {
        let cmsg = cstring(msg, "notification")?;
        let csender = cstring(sender, "sender name")?;
        let seg = segment.into().0;
        // SAFETY: valid strings for the call.
        call(|| unsafe {
            sys::te_batch_notify_as(self.engine.as_raw(), self.id, seg, csender.as_ptr(), cmsg.as_ptr())
        })?;
        Ok(())
    }
}

impl Drop for Batch<'_, '_> {
    /// Waits for every task, then frees. This runs before the borrows of
    /// 'r may end, and it must not return while a task could still touch
    /// that memory: so it waits without a time limit.
    fn drop(&mut self) {
        if self.freed.load(Ordering::Acquire) {
            return;
        }
        let e = self.engine.as_raw();
        loop {
            // SAFETY: live engine and batch.
            let rc = unsafe { sys::te_batch_wait(e, self.id, -1) };
            if rc == 0 {
                break;
            }
            // Waiting forever fails only for a bad engine or batch; confirm
            // nothing is in flight before going on.
            let mut in_flight = 0usize;
            // SAFETY: out-pointer valid for the call.
            let src = unsafe {
                sys::te_batch_status(e, self.id, std::ptr::null_mut(), &mut in_flight, std::ptr::null_mut())
            };
            if src < 0 || in_flight == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // SAFETY: nothing in flight; the id is ours.
        unsafe { sys::te_batch_free(e, self.id) };
    }
}

impl std::fmt::Debug for Batch<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch").field("id", &self.id).field("capacity", &self.capacity).finish()
    }
}
