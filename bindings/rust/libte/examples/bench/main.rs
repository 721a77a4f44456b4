//! bench: te-bench through the Rust API. Same flags, same loop (per thread:
//! a batch of batch_size requests, submit, wait, free), same closing lines,
//! so the two can be compared run for run:
//!
//!   cargo run --release --example bench -- --duration=3 --block_size=4096
//!
//! With no flags it runs a target and an initiator engine in this process
//! over TCP on 127.0.0.1 with P2PHANDSHAKE.
use libte::{Engine, Local, Registration, Request, SegmentId, SharedMemory, TaskState};
use std::fmt::Write as _;
use std::io::Write;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod flags;
mod hist;
use flags::{fail, parse_flags, usage, Fail, Flags};
use hist::Hist;

const PROG: &str = "bench";
/// A batch that takes longer than this is reported as hung.
const WAIT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------- logging

/// Without --verbose libte's log is kept, not shown: the last warning or
/// error explains a failure in the one line printed.
static LAST_LOG: Mutex<String> = Mutex::new(String::new());

fn why() -> String {
    let l = LAST_LOG.lock().unwrap_or_else(|p| p.into_inner());
    if l.is_empty() {
        String::new()
    } else {
        format!(" [{}]", l)
    }
}

// ---------------------------------------------------------------- helpers

fn pattern_fill(p: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15).wrapping_add(0x632BE59BD9B4E019);
    let mut step = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut chunks = p.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&step().to_ne_bytes());
    }
    for b in chunks.into_remainder() {
        *b = step() as u8;
    }
}

fn unit_bytes(u: &str) -> u64 {
    match u {
        "GB" => 1_000_000_000,
        "GiB" => 1 << 30,
        "Gb" => 1_000_000_000 / 8,
        "MB" => 1_000_000,
        "MiB" => 1 << 20,
        "Mb" => 1_000_000 / 8,
        "KB" => 1000,
        "KiB" => 1 << 10,
        "Kb" => 1000 / 8,
        _ => 0,
    }
}

fn fmt_bytes(v: u64) -> String {
    if v >= 1 << 30 && v % (1 << 30) == 0 {
        format!("{} GiB", v >> 30)
    } else if v >= 1 << 20 && v % (1 << 20) == 0 {
        format!("{} MiB", v >> 20)
    } else if v >= 1024 && v % 1024 == 0 {
        format!("{} KiB", v >> 10)
    } else {
        format!("{} B", v)
    }
}

fn fmt_lat(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.1} us", ns / 1e3)
    }
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                o.push('\\');
                o.push(c);
            }
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

extern "C" {
    fn mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64) -> *mut c_void;
    fn munmap(addr: *mut c_void, len: usize) -> c_int;
    fn gethostname(name: *mut u8, len: usize) -> c_int;
    fn signal(sig: c_int, handler: extern "C" fn(c_int)) -> usize;
}

/// A buffer as te-bench makes it: te_mem_alloc (shared memory a same-host
/// peer maps) or an anonymous mapping, reserved but not committed, so a
/// 1 GiB buffer costs only the pages a run touches.
enum Buffer {
    Shared(SharedMemory),
    Mapped(*mut u8, usize),
}

impl Buffer {
    fn new(f: &Flags, len: u64) -> Result<Buffer, Fail> {
        let len = usize::try_from(len).map_err(|_| Fail(1, format!("cannot map a {}-byte buffer", len)))?;
        if f.memory == "libte" {
            return SharedMemory::new(len).map(Buffer::Shared).map_err(|e| {
                Fail(1, format!("cannot allocate a {}-byte buffer: {}{}", len, e, why()))
            });
        }
        const PROT_RW: c_int = 0x1 | 0x2;
        const MAP_PRIVATE_ANON_NORESERVE: c_int = 0x02 | 0x20 | 0x4000;
        // SAFETY: a fresh private anonymous mapping, owned by the Buffer.
        let p = unsafe { mmap(std::ptr::null_mut(), len, PROT_RW, MAP_PRIVATE_ANON_NORESERVE, -1, 0) };
        if p as isize == -1 {
            return fail(format!("cannot map a {}-byte buffer: {}", len, std::io::Error::last_os_error()));
        }
        Ok(Buffer::Mapped(p as *mut u8, len))
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            Buffer::Shared(m) => m,
            // SAFETY: the mapping is ours, readable and writable, for `len` bytes.
            Buffer::Mapped(p, len) => unsafe { std::slice::from_raw_parts_mut(*p, *len) },
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Buffer::Mapped(p, len) = self {
            // SAFETY: unmaps what new() mapped; nothing borrows it any more.
            unsafe { munmap(*p as *mut c_void, *len) };
        }
    }
}

fn hostname() -> String {
    let mut b = [0u8; 256];
    // SAFETY: writes at most len - 1 bytes into `b`.
    let rc = unsafe { gethostname(b.as_mut_ptr(), b.len() - 1) };
    let n = b.iter().position(|c| *c == 0).unwrap_or(0);
    if rc != 0 || n == 0 {
        "localhost".into()
    } else {
        String::from_utf8_lossy(&b[..n]).into_owned()
    }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

// ---------------------------------------------------------------- engines

/// The JSON arguments for a transport: RDMA takes a NIC priority matrix,
/// made from --device_name when no file is given.
fn transport_args(f: &Flags) -> Result<Option<String>, Fail> {
    if f.protocol != "rdma" {
        return Ok(None);
    }
    if !f.nic_priority_matrix.is_empty() {
        return std::fs::read_to_string(&f.nic_priority_matrix).map(Some).map_err(|e| {
            Fail(1, format!("cannot read --nic_priority_matrix file {}: {}", f.nic_priority_matrix, e))
        });
    }
    if f.device_name.is_empty() {
        return Ok(None);
    }
    let list: Vec<String> =
        f.device_name.split(',').filter(|d| !d.is_empty()).map(|d| format!("\"{}\"", d)).collect();
    let l = list.join(",");
    Ok(Some(format!("{{\"cpu:0\":[[{l}],[]],\"cpu:1\":[[{l}],[]],\"cuda:0\":[[{l}],[]]}}", l = l)))
}

fn make_engine(f: &Flags, name: &str, loopback_alias: bool) -> Result<Engine, Fail> {
    // Outside P2PHANDSHAKE two loopback engines need distinct names that
    // still say where to reach them.
    let opts: &[(&str, &str)] = if loopback_alias { &[("ip_or_host_name", "127.0.0.1")] } else { &[] };
    let e = Engine::new(&f.metadata_server, Some(name), opts).map_err(|e| {
        Fail(1, format!("cannot start an engine with metadata '{}' as '{}': {}{}", f.metadata_server, name, e, why()))
    })?;
    if f.auto_discovery || f.protocol == "auto" {
        e.install_best_transport()
            .map_err(|err| Fail(1, format!("auto-discovery installed no transport: {}{}", err, why())))?;
    } else {
        let args = transport_args(f)?;
        e.install_transport(&f.protocol, args.as_deref())
            .map_err(|err| Fail(1, format!("cannot install transport '{}': {}{}", f.protocol, err, why())))?;
    }
    Ok(e)
}

/// Engine::register with te-bench's message when the registration itself
/// fails; failures of the run inside pass through unchanged.
fn registered<T>(
    e: &Engine,
    buf: &mut [u8],
    remote: bool,
    f: impl FnOnce(&mut Registration<'_, '_>) -> Result<T, Fail>,
) -> Result<T, Fail> {
    enum Either {
        Register(libte::Error),
        Run(Fail),
    }
    impl From<libte::Error> for Either {
        fn from(e: libte::Error) -> Either {
            Either::Register(e)
        }
    }
    let len = buf.len();
    e.register(buf, "cpu:0", remote, |r| f(r).map_err(Either::Run)).map_err(|x| match x {
        Either::Register(err) => Fail(1, format!("cannot register {} bytes: {}{}", len, err, why())),
        Either::Run(fail) => fail,
    })
}

// ---------------------------------------------------------------- workers

/// What the workers share.
struct Run<'a> {
    f: &'a Flags,
    e: &'a Engine,
    seg: SegmentId,
    transport: String,
    read: bool,
    remote_base: Vec<u64>,
    stop: AtomicBool,
    batches: AtomicU64,
    failed: Mutex<Option<Fail>>,
}

impl Run<'_> {
    fn fail_run(&self, code: i32, msg: String) {
        let mut f = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some(Fail(code, msg));
        }
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One worker's blocks: block i of thread `id` is block i*threads+id of
/// the span, as in te-bench.
struct Worker<'r> {
    id: u64,
    local: Vec<Local<'r>>,
    verify: Vec<Local<'r>>,
    remote: Vec<u64>,
    hist: Hist,
    batches: u64,
}

fn state_name(s: TaskState) -> String {
    match s {
        TaskState::Unknown(_) => "?".into(),
        s => format!("{:?}", s).to_uppercase(),
    }
}

/// One batch of `op` over the worker's blocks (READ into `blocks`, or
/// WRITE from them); false after recording a failure.
fn one_batch(run: &Run<'_>, remote: &[u64], read: bool, blocks: &mut [Local<'_>]) -> bool {
    let f = run.f;
    let r = run.e.batch(f.batch_size as usize, |b| {
        let reqs: Vec<Request<'_>> = if read {
            blocks.iter_mut().zip(remote).map(|(l, r)| Request::read(run.seg, *r, l)).collect()
        } else {
            blocks.iter().zip(remote).map(|(l, r)| Request::write(run.seg, *r, l)).collect()
        };
        if let Err(e) = b.submit(reqs) {
            return Err(Fail(1, format!("te_submit: {}{}", e, why())));
        }
        if let Err(e) = b.wait(Some(WAIT)) {
            // Canceled tasks stop at a slice boundary, so the batch can
            // settle before it is freed.
            let _ = b.cancel();
            return Err(Fail(1, format!("a batch did not finish within {} s: {}", WAIT.as_secs(), e)));
        }
        if b.summary()?.state != TaskState::Completed {
            for (i, st) in b.statuses()?.iter().enumerate() {
                if st.state != TaskState::Completed {
                    return Err(Fail(
                        1,
                        format!(
                            "{} of {} bytes at remote {:#x} ended {}: {}{}",
                            if read { "READ" } else { "WRITE" },
                            f.block_size,
                            remote[i],
                            state_name(st.state),
                            libte::strerror(st.error),
                            why()
                        ),
                    ));
                }
            }
        }
        Ok(())
    });
    match r {
        Ok(()) => true,
        Err(Fail(code, msg)) => {
            run.fail_run(code, msg);
            false
        }
    }
}

fn compare(run: &Run<'_>, w: &Worker<'_>, iter: u64) -> bool {
    for (i, (got, want)) in w.local.iter().zip(&w.verify).enumerate() {
        if got[..] == want[..] {
            continue;
        }
        let k = got.iter().zip(want.iter()).position(|(a, b)| a != b).unwrap_or(0);
        run.fail_run(
            2,
            format!(
                "DATA MISMATCH after {}: thread {}, batch {}, block {} (remote {:#x}), byte {}: got {:#04x}, want {:#04x}",
                if run.read { "READ" } else { "WRITE" },
                w.id,
                iter,
                i,
                w.remote[i],
                k,
                got[k],
                want[k]
            ),
        );
        return false;
    }
    true
}

fn worker_main(run: &Run<'_>, w: &mut Worker<'_>) {
    let f = run.f;
    let mut iter: u64 = 0;
    while !run.stop.load(Ordering::Relaxed) {
        if f.check {
            // Expected bytes in `verify`; the measured operation moves them
            // through the remote side into `local`.
            for (i, (l, v)) in w.local.iter_mut().zip(w.verify.iter_mut()).enumerate() {
                pattern_fill(v, (iter << 20) ^ ((i as u64) << 8) ^ w.id ^ 0x5eed);
                if run.read {
                    l.fill(0xa5);
                } else {
                    l.copy_from_slice(v);
                }
            }
            if run.read && !one_batch(run, &w.remote, false, &mut w.verify) {
                break;
            }
        }
        let t0 = Instant::now();
        if !one_batch(run, &w.remote, run.read, &mut w.local) {
            break;
        }
        let dt = t0.elapsed().as_nanos() as u64;
        if f.check {
            if !run.read {
                // Read back what was written, into `local` over the source.
                for l in w.local.iter_mut() {
                    l.fill(0xa5);
                }
                if !one_batch(run, &w.remote, true, &mut w.local) {
                    break;
                }
            }
            if !compare(run, w, iter) {
                break;
            }
        }
        // Every request of the batch saw the batch's completion time.
        w.hist.add(dt, f.batch_size);
        w.batches += 1;
        run.batches.fetch_add(1, Ordering::Relaxed);
        iter += 1;
    }
}

// ---------------------------------------------------------------- results

fn run_initiator(f: &Flags, e: &Engine, target: &str, mode_name: &str) -> Result<(), Fail> {
    let span = f.block_size * f.batch_size * f.threads;
    let unit = unit_bytes(&f.report_unit);
    let seg = e
        .open_segment(target)
        .map_err(|err| Fail(1, format!("cannot open segment '{}': {}{}", target, err, why())))?;
    let bufs = seg.buffers().map_err(|err| {
        Fail(1, format!("segment '{}' has no buffers to {}: {}{}", target, f.operation, err, why()))
    })?;
    if bufs.is_empty() {
        return fail(format!("segment '{}' has no buffers to {}", target, f.operation));
    }
    let bufs = &bufs[..bufs.len().min(64)];
    for (i, b) in bufs.iter().enumerate() {
        if b.length < span && (i as u64) < f.threads {
            return fail(format!(
                "segment '{}' buffer {} holds {} bytes; block_size*batch_size*threads = {}",
                target, i, b.length, span
            ));
        }
    }
    let run = Run {
        f,
        e,
        seg: seg.id(),
        // what serves it: shm for this host
        transport: seg.transport().unwrap_or_else(|| "?".into()),
        read: f.operation != "write",
        remote_base: bufs.iter().map(|b| b.addr).collect(),
        stop: AtomicBool::new(false),
        batches: AtomicU64::new(0),
        failed: Mutex::new(None),
    };

    let mut local_map = Buffer::new(f, f.buffer_size)?;
    let mut verify_map = if f.check { Some(Buffer::new(f, f.buffer_size)?) } else { None };
    // Fault in the part in use, so that page faults do not show in the figures.
    local_map.as_mut_slice()[..span as usize].fill(0);
    if let Some(m) = verify_map.as_mut() {
        m.as_mut_slice()[..span as usize].fill(0);
    }
    let bs = f.block_size as usize;
    let (hist, batches, duration) = registered(e, local_map.as_mut_slice(), false, |lreg| {
        let local_blocks = lreg.range(0, span as usize)?.chunks(bs)?;
        match verify_map.as_mut() {
            None => run_workers(&run, local_blocks, None, mode_name, unit),
            Some(vm) => registered(e, vm.as_mut_slice(), false, |vreg| {
                let verify_blocks = vreg.range(0, span as usize)?.chunks(bs)?;
                run_workers(&run, local_blocks, Some(verify_blocks), mode_name, unit)
            }),
        }
    })?;

    if let Some(Fail(code, msg)) = run.failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(Fail(code, msg));
    }
    let bytes = batches as f64 * f.batch_size as f64 * f.block_size as f64;
    let rate = bytes / duration;
    let iops = batches as f64 * f.batch_size as f64 / duration;
    let (p50, p99, p999) = (hist.pct(0.50), hist.pct(0.99), hist.pct(0.999));
    let prec = f.report_precision as usize;
    if f.json {
        println!(
            "{{\"mode\":{},\"protocol\":{},\"transport\":{},\"metadata_server\":{},\"segment_id\":{},\"operation\":\"{}\",\
             \"block_size\":{},\"batch_size\":{},\"threads\":{},\"check\":{},\"duration_s\":{:.3},\
             \"batch_count\":{},\"requests\":{},\"bytes\":{:.0},\"throughput_bytes_per_s\":{:.0},\
             \"throughput\":{:.*},\"report_unit\":{},\"iops\":{:.0},\
             \"latency_us\":{{\"p50\":{:.1},\"p99\":{:.1},\"p999\":{:.1},\"max\":{:.1}}}}}",
            json_str(mode_name),
            json_str(&f.protocol),
            json_str(&run.transport),
            json_str(&f.metadata_server),
            json_str(target),
            f.operation,
            f.block_size,
            f.batch_size,
            f.threads,
            f.check,
            duration,
            batches,
            batches * f.batch_size,
            bytes,
            rate,
            prec,
            rate / unit as f64,
            json_str(&f.report_unit),
            iops,
            p50 / 1e3,
            p99 / 1e3,
            p999 / 1e3,
            hist.max as f64 / 1e3
        );
    } else {
        println!(
            "Test completed: duration {:.2}, batch count {}, throughput {:.*} {}/s",
            duration,
            batches,
            prec,
            rate / unit as f64,
            f.report_unit
        );
        println!(
            "IOPS {:.0} requests/s; latency per request p50 {}, p99 {}, p99.9 {} (submit to batch completion){}",
            iops,
            fmt_lat(p50),
            fmt_lat(p99),
            fmt_lat(p999),
            if f.check { "; every byte checked (figures include the check traffic)" } else { "" }
        );
    }
    std::io::stdout().flush().ok();
    Ok(())
}

/// Starts the workers on their blocks, prints progress every second, and
/// returns the merged histogram, the batch count and the duration.
fn run_workers(
    run: &Run<'_>,
    local_blocks: Vec<Local<'_>>,
    verify_blocks: Option<Vec<Local<'_>>>,
    mode_name: &str,
    unit: u64,
) -> Result<(Hist, u64, f64), Fail> {
    let f = run.f;
    let threads = f.threads as usize;
    let mut workers: Vec<Worker<'_>> = (0..threads)
        .map(|id| Worker {
            id: id as u64,
            local: Vec::new(),
            verify: Vec::new(),
            remote: Vec::new(),
            hist: Hist::new(),
            batches: 0,
        })
        .collect();
    for (k, l) in local_blocks.into_iter().enumerate() {
        let w = &mut workers[k % threads];
        let base = run.remote_base[w.id as usize % run.remote_base.len()];
        w.remote.push(base + f.block_size * k as u64);
        w.local.push(l);
    }
    for (k, v) in verify_blocks.into_iter().flatten().enumerate() {
        workers[k % threads].verify.push(v);
    }
    if !f.json {
        println!(
            "{}: {} {} over {}, {} x {} per batch, {} thread{}, {} s{}",
            PROG,
            mode_name,
            f.operation,
            run.transport,
            f.batch_size,
            fmt_bytes(f.block_size),
            f.threads,
            if f.threads > 1 { "s" } else { "" },
            f.duration,
            if f.check { ", checking every byte" } else { "" }
        );
    }
    std::io::stdout().flush().ok();

    let start = Instant::now();
    std::thread::scope(|s| {
        for w in workers.iter_mut() {
            s.spawn(move || worker_main(run, w));
        }
        let (mut last_b, mut last_t) = (0u64, start);
        let mut sec = 1u64;
        while !run.stop.load(Ordering::Relaxed) {
            let until = start + Duration::from_secs(sec);
            while Instant::now() < until && !run.stop.load(Ordering::Relaxed) && !INTERRUPTED.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
            if INTERRUPTED.load(Ordering::Relaxed) || sec >= f.duration {
                run.stop.store(true, Ordering::Relaxed);
            }
            if !f.quiet && run.failed.lock().map(|g| g.is_none()).unwrap_or(false) {
                let b = run.batches.load(Ordering::Relaxed);
                let t = Instant::now();
                let dt = (t - last_t).as_secs_f64();
                let reqs = (b - last_b) as f64 * f.batch_size as f64;
                eprintln!(
                    "[{:3} s] {:.*} {}/s, {:.0} requests/s",
                    sec,
                    f.report_precision as usize,
                    reqs * f.block_size as f64 / dt / unit as f64,
                    f.report_unit,
                    reqs / dt
                );
                last_b = b;
                last_t = t;
            }
            sec += 1;
        }
    });
    let duration = start.elapsed().as_secs_f64();
    let mut hist = Hist::new();
    let mut batches = 0;
    for w in &workers {
        hist.merge(&w.hist);
        batches += w.batches;
    }
    Ok((hist, batches, duration))
}

// ------------------------------------------------------------------- main

fn real_main() -> Result<(), Fail> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut f = parse_flags(&args)?;
    if f.help {
        usage();
        return Ok(());
    }
    let mode = f.mode.clone().unwrap_or_else(|| if f.segment_id.is_some() { "initiator" } else { "loopback" }.into());
    if !["loopback", "target", "initiator"].contains(&mode.as_str()) {
        return fail(format!("--mode={}: want loopback, target or initiator", mode));
    }
    if f.memory != "libte" && f.memory != "anonymous" {
        return fail(format!("--memory={}: want libte or anonymous", f.memory));
    }
    if f.operation != "read" && f.operation != "write" {
        return fail(format!("--operation={}: want read or write", f.operation));
    }
    if unit_bytes(&f.report_unit) == 0 {
        return fail(format!("--report_unit={}: want GB, GiB, Gb, MB, MiB, Mb, KB, KiB or Kb", f.report_unit));
    }
    let target_name = f.segment_id.clone().unwrap_or_default();
    if mode == "initiator" && target_name.is_empty() {
        return fail("--mode=initiator needs --segment_id=<the target's segment name>".into());
    }
    if target_name.contains('/') && f.metadata_server == "P2PHANDSHAKE" {
        return fail(format!(
            "--segment_id={} names a file (NVMe-oF) segment, which lives in a metadata store: \
             give --metadata_server=etcd://... (or redis://, http://)",
            target_name
        ));
    }
    if f.block_size > u64::MAX / f.batch_size / f.threads {
        return fail("block_size*batch_size*threads overflows".into());
    }
    let need = f.block_size * f.batch_size * f.threads;
    if f.buffer_size < need {
        if !f.json {
            eprintln!("{}: --buffer_size raised to {} (block_size*batch_size*threads)", PROG, need);
        }
        f.buffer_size = need;
    }

    if f.verbose {
        libte::set_log_level(libte::LogLevel::Info);
    } else if std::env::var_os("TE_LOG_LEVEL").is_none() && std::env::var_os("MC_LOG_LEVEL").is_none() {
        libte::set_log_handler(|level, domain, msg| {
            if level <= libte::LogLevel::Warn {
                let d = if domain.is_empty() { "te" } else { domain };
                *LAST_LOG.lock().unwrap_or_else(|p| p.into_inner()) = format!("{}: {}", d, msg);
            }
        });
    }
    const SIGINT: c_int = 2;
    const SIGTERM: c_int = 15;
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
    }

    if mode == "target" {
        let name = f.local_server_name.clone().unwrap_or_else(hostname);
        let e = make_engine(&f, &name, false)?;
        let mut map = Buffer::new(&f, f.buffer_size)?;
        return registered(&e, map.as_mut_slice(), true, |_| {
                println!(
                    "{}: target ready, segment name {} (metadata {}, protocol {}); Ctrl-C stops it",
                    PROG,
                    e.name(),
                    f.metadata_server,
                    f.protocol
                );
                std::io::stdout().flush().ok();
                while !INTERRUPTED.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Ok(())
            });
    }
    if mode == "initiator" {
        let name = f.local_server_name.clone().unwrap_or_else(hostname);
        let e = make_engine(&f, &name, false)?;
        return run_initiator(&f, &e, &target_name, "initiator");
    }

    // loopback: a target and an initiator engine in this process
    let p2p = f.metadata_server == "P2PHANDSHAKE";
    let (tname, iname) = if p2p {
        let n = f.local_server_name.clone().unwrap_or_else(|| "127.0.0.1".into());
        (n.clone(), n)
    } else {
        let pid = std::process::id();
        (format!("te-bench-target-{}", pid), format!("te-bench-initiator-{}", pid))
    };
    let target = make_engine(&f, &tname, !p2p)?;
    let mut tmap = Buffer::new(&f, f.buffer_size)?;
    tmap.as_mut_slice()[..need as usize].fill(0);
    registered(&target, tmap.as_mut_slice(), true, |_| {
        let init = make_engine(&f, &iname, !p2p)?;
        run_initiator(&f, &init, target.name(), "loopback")
        // the initiator goes first, then the target
    })
}

fn main() {
    let code = match real_main() {
        Ok(()) => 0,
        Err(Fail(code, msg)) => {
            std::io::stdout().flush().ok();
            eprintln!("{}: {}", PROG, msg);
            code
        }
    };
    std::process::exit(code);
}
