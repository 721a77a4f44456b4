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

const PROG: &str = "bench";
/// A batch that takes longer than this is reported as hung.
const WAIT: Duration = Duration::from_secs(120);

// ------------------------------------------------------------------ flags

#[derive(Clone)]
struct Flags {
    mode: Option<String>,
    metadata_server: String,
    local_server_name: Option<String>,
    segment_id: Option<String>,
    protocol: String,
    memory: String,
    device_name: String,
    nic_priority_matrix: String,
    auto_discovery: bool,
    operation: String,
    batch_size: u64,
    block_size: u64,
    buffer_size: u64,
    duration: u64,
    threads: u64,
    report_unit: String,
    report_precision: u64,
    check: bool,
    json: bool,
    quiet: bool,
    verbose: bool,
    help: bool,
}

impl Default for Flags {
    fn default() -> Flags {
        Flags {
            mode: None,
            metadata_server: "P2PHANDSHAKE".into(),
            local_server_name: None,
            segment_id: None,
            protocol: "auto".into(),
            memory: "libte".into(),
            device_name: String::new(),
            nic_priority_matrix: String::new(),
            auto_discovery: false,
            operation: "read".into(),
            batch_size: 128,
            block_size: 65536,
            buffer_size: 1 << 30,
            duration: 10,
            threads: 1,
            report_unit: "GB".into(),
            report_precision: 2,
            check: false,
            json: false,
            quiet: false,
            verbose: false,
            help: false,
        }
    }
}

enum Kind {
    Str,
    Num(u64, u64),
    Bool,
}

const DEFS: &[(&str, Kind, &str)] = &[
    ("mode", Kind::Str, "loopback | target | initiator (default: loopback; initiator when --segment_id is set)"),
    (
        "metadata_server",
        Kind::Str,
        "P2PHANDSHAKE, etcd://h:p[,h:p], h:p (etcd), redis://h:p or http://h:p/path (default P2PHANDSHAKE)",
    ),
    ("local_server_name", Kind::Str, "this engine's segment name (default: 127.0.0.1 in loopback mode, else the host name)"),
    ("segment_id", Kind::Str, "the target's segment name, e.g. 10.0.0.1:15123 or nvmeof/disk0 (initiator mode)"),
    (
        "protocol",
        Kind::Str,
        "transport to install: auto (the best network transport, and shm for engines on this host), \
         tcp, shm, rdma, nvmeof, ... (default auto)",
    ),
    (
        "memory",
        Kind::Str,
        "libte (te_mem_alloc: shared memory a same-host peer maps) or anonymous (mmap) (default libte)",
    ),
    ("device_name", Kind::Str, "RDMA devices, comma-separated (protocol rdma)"),
    ("nic_priority_matrix", Kind::Str, "file with an RDMA NIC priority matrix (JSON); overrides --device_name"),
    ("auto_discovery", Kind::Bool, "the same as --protocol=auto"),
    ("operation", Kind::Str, "read | write (default read)"),
    ("batch_size", Kind::Num(1, 1 << 20), "requests per batch (default 128)"),
    ("block_size", Kind::Num(1, 1 << 36), "bytes per request (default 65536)"),
    (
        "buffer_size",
        Kind::Num(1, 1 << 40),
        "bytes registered on each side (default 1 GiB, raised to block_size*batch_size*threads)",
    ),
    ("duration", Kind::Num(1, 86400), "seconds to run (default 10)"),
    ("threads", Kind::Num(1, 1024), "submitting threads (default 1)"),
    ("report_unit", Kind::Str, "GB | GiB | Gb | MB | MiB | Mb | KB | KiB | Kb (default GB)"),
    ("report_precision", Kind::Num(0, 9), "digits after the point (default 2)"),
    ("check", Kind::Bool, "write a pattern, read it back and compare every byte; fail loudly on a mismatch"),
    ("json", Kind::Bool, "print the result as one JSON object on stdout"),
    ("quiet", Kind::Bool, "no progress line on stderr every second"),
    ("verbose", Kind::Bool, "show libte's log (level info) on stderr"),
    ("help", Kind::Bool, "this text"),
];

fn usage() {
    println!(
        "Usage: {p} [--flag=value ...]\n\
         Moves blocks between two libte engines and reports throughput, IOPS and latency.\n\
         With no flags: both engines in this process, TCP over 127.0.0.1, P2PHANDSHAKE, 10 s.\n\
         Two machines: '{p} --mode=target' on one (it prints its segment name), then\n\
         '{p} --segment_id=<that name>' on the other.\n\n\
         Flags (also --flag value; booleans take --flag, --noflag or --flag=true|false):",
        p = PROG
    );
    for (name, _, help) in DEFS {
        println!("  --{:<20} {}", name, help);
    }
    println!(
        "\nEnvironment: TE_LOG_LEVEL shows libte's log; TE_TCP_* tune the TCP transport, \
         TE_PLUGIN_PATH adds plugin folders."
    );
}

/// A failed run: the exit code (1 bad use or failed run, 2 data mismatch)
/// and the one line to print.
#[derive(Debug)]
struct Fail(i32, String);

impl From<libte::Error> for Fail {
    fn from(e: libte::Error) -> Fail {
        Fail(1, e.to_string())
    }
}

fn fail<T>(msg: String) -> Result<T, Fail> {
    Err(Fail(1, msg))
}

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "true" | "1" | "yes" => Some(true),
        "false" | "0" | "no" => Some(false),
        _ => None,
    }
}

/// "64K", "1M", "1G" (optionally with "i" and/or "B") and plain numbers.
fn parse_size(v: &str) -> Option<u64> {
    let digits = v.bytes().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    let n: u64 = v[..digits].parse().ok()?;
    let mut rest = &v[digits..];
    let shift = match rest.as_bytes().first() {
        None => 0,
        Some(b'k') | Some(b'K') => 10,
        Some(b'm') | Some(b'M') => 20,
        Some(b'g') | Some(b'G') => 30,
        Some(_) => return None,
    };
    if shift > 0 {
        rest = &rest[1..];
    }
    rest = rest.strip_prefix('i').or_else(|| rest.strip_prefix('B')).unwrap_or(rest);
    rest = rest.strip_prefix('B').unwrap_or(rest);
    if !rest.is_empty() || (shift > 0 && n > (u64::MAX >> shift)) {
        return None;
    }
    Some(n << shift)
}

fn parse_flags(args: &[String]) -> Result<Flags, Fail> {
    let mut f = Flags::default();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        if !arg.starts_with('-') {
            return fail(format!("unexpected argument '{}' (flags look like --name=value; see --help)", arg));
        }
        let a = arg.strip_prefix("--").unwrap_or(&arg[1..]);
        let (name, value) = match a.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (a, None),
        };
        let mut negated = false;
        let def = DEFS.iter().find(|d| d.0 == name).or_else(|| {
            if value.is_none() {
                let base = name.strip_prefix("no")?;
                let d = DEFS.iter().find(|d| d.0 == base && matches!(d.1, Kind::Bool))?;
                negated = true;
                Some(d)
            } else {
                None
            }
        });
        let def = match (def, name) {
            (Some(d), _) => d,
            (None, "h") => DEFS.last().unwrap(),
            (None, _) => return fail(format!("unknown flag '{}' (see --help)", arg)),
        };
        let key = def.0;
        if let Kind::Bool = def.1 {
            let b = match value {
                None => !negated,
                Some(v) => match parse_bool(v) {
                    Some(b) => b,
                    None => return fail(format!("--{} wants true or false, not '{}'", key, v)),
                },
            };
            match key {
                "auto_discovery" => f.auto_discovery = b,
                "check" => f.check = b,
                "json" => f.json = b,
                "quiet" => f.quiet = b,
                "verbose" => f.verbose = b,
                _ => f.help = b,
            }
            i += 1;
            continue;
        }
        let v = match value {
            Some(v) => v.to_string(),
            None => {
                i += 1;
                match args.get(i) {
                    Some(v) => v.clone(),
                    None => return fail(format!("--{} needs a value", key)),
                }
            }
        };
        match def.1 {
            Kind::Num(min, max) => {
                let n = match parse_size(&v) {
                    Some(n) if n >= min && n <= max => n,
                    _ => return fail(format!("--{}={} is not a number in [{}, {}]", key, v, min, max)),
                };
                match key {
                    "batch_size" => f.batch_size = n,
                    "block_size" => f.block_size = n,
                    "buffer_size" => f.buffer_size = n,
                    "duration" => f.duration = n,
                    "threads" => f.threads = n,
                    _ => f.report_precision = n,
                }
            }
            _ => match key {
                "mode" => f.mode = Some(v),
                "metadata_server" => f.metadata_server = v,
                "local_server_name" => f.local_server_name = Some(v),
                "segment_id" => f.segment_id = Some(v),
                "protocol" => f.protocol = v,
                "memory" => f.memory = v,
                "device_name" => f.device_name = v,
                "nic_priority_matrix" => f.nic_priority_matrix = v,
                "operation" => f.operation = v,
                _ => f.report_unit = v,
            },
        }
        i += 1;
    }
    Ok(f)
}

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

// -------------------------------------------------------------- histogram

/// Log-linear buckets: 64 per power of two, under 1.6 % error.
const SUB_BITS: u32 = 6;
const SUB: u64 = 1 << SUB_BITS;
const NBUCKETS: usize = ((64 - SUB_BITS + 1) as usize) * SUB as usize;

#[derive(Clone)]
struct Hist {
    n: Vec<u64>,
    count: u64,
    max: u64,
}

impl Hist {
    fn new() -> Hist {
        Hist { n: vec![0; NBUCKETS], count: 0, max: 0 }
    }

    fn bucket_of(v: u64) -> usize {
        if v < SUB {
            return v as usize;
        }
        let e = 63 - v.leading_zeros();
        ((e - SUB_BITS + 1) as u64 * SUB + ((v >> (e - SUB_BITS)) & (SUB - 1))) as usize
    }

    fn bucket_mid(b: usize) -> f64 {
        if (b as u64) < SUB {
            return b as f64;
        }
        let e = (b as u64 / SUB) as i32 + SUB_BITS as i32 - 1;
        let s = b as u64 % SUB;
        let lo = (SUB + s) as f64 * 2f64.powi(e - SUB_BITS as i32);
        lo + 2f64.powi(e - SUB_BITS as i32) / 2.0
    }

    fn add(&mut self, v: u64, times: u64) {
        self.n[Hist::bucket_of(v)] += times;
        self.count += times;
        self.max = self.max.max(v);
    }

    fn merge(&mut self, h: &Hist) {
        for (a, b) in self.n.iter_mut().zip(&h.n) {
            *a += b;
        }
        self.count += h.count;
        self.max = self.max.max(h.max);
    }

    fn pct(&self, p: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let want = ((p * self.count as f64).ceil() as u64).max(1);
        let mut acc = 0;
        for (i, n) in self.n.iter().enumerate() {
            acc += n;
            if acc >= want {
                return Hist::bucket_mid(i).min(self.max as f64);
            }
        }
        self.max as f64
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
