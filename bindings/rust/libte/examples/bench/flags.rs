//! bench's flags: their table, their parsing and the usage text, as te-bench's.
use super::PROG;

// ------------------------------------------------------------------ flags

#[derive(Clone)]
pub(crate) struct Flags {
    pub(crate) mode: Option<String>,
    pub(crate) metadata_server: String,
    pub(crate) local_server_name: Option<String>,
    pub(crate) segment_id: Option<String>,
    pub(crate) protocol: String,
    pub(crate) memory: String,
    pub(crate) device_name: String,
    pub(crate) nic_priority_matrix: String,
    pub(crate) auto_discovery: bool,
    pub(crate) operation: String,
    pub(crate) batch_size: u64,
    pub(crate) block_size: u64,
    pub(crate) buffer_size: u64,
    pub(crate) duration: u64,
    pub(crate) threads: u64,
    pub(crate) report_unit: String,
    pub(crate) report_precision: u64,
    pub(crate) check: bool,
    pub(crate) json: bool,
    pub(crate) quiet: bool,
    pub(crate) verbose: bool,
    pub(crate) help: bool,
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

/// A flag's kind, with the field of [`Flags`] it sets.
pub(crate) enum Kind {
    Str(fn(&mut Flags) -> &mut String),
    /// A string that has no default.
    OptStr(fn(&mut Flags) -> &mut Option<String>),
    /// A size or count in [min, max].
    Num(u64, u64, fn(&mut Flags) -> &mut u64),
    Bool(fn(&mut Flags) -> &mut bool),
}

pub(crate) const DEFS: &[(&str, Kind, &str)] = &[
    ("mode", Kind::OptStr(|f| &mut f.mode), "loopback | target | initiator (default: loopback; initiator when --segment_id is set)"),
    (
        "metadata_server",
        Kind::Str(|f| &mut f.metadata_server),
        "P2PHANDSHAKE, etcd://h:p[,h:p], h:p (etcd), redis://h:p or http://h:p/path (default P2PHANDSHAKE)",
    ),
    ("local_server_name", Kind::OptStr(|f| &mut f.local_server_name), "this engine's segment name (default: 127.0.0.1 in loopback mode, else the host name)"),
    ("segment_id", Kind::OptStr(|f| &mut f.segment_id), "the target's segment name, e.g. 10.0.0.1:15123 or nvmeof/disk0 (initiator mode)"),
    (
        "protocol",
        Kind::Str(|f| &mut f.protocol),
        "transport to install: auto (the best network transport, and shm for engines on this host), \
         tcp, shm, rdma, nvmeof, ... (default auto)",
    ),
    (
        "memory",
        Kind::Str(|f| &mut f.memory),
        "libte (te_mem_alloc: shared memory a same-host peer maps) or anonymous (mmap) (default libte)",
    ),
    ("device_name", Kind::Str(|f| &mut f.device_name), "RDMA devices, comma-separated (protocol rdma)"),
    ("nic_priority_matrix", Kind::Str(|f| &mut f.nic_priority_matrix), "file with an RDMA NIC priority matrix (JSON); overrides --device_name"),
    ("auto_discovery", Kind::Bool(|f| &mut f.auto_discovery), "the same as --protocol=auto"),
    ("operation", Kind::Str(|f| &mut f.operation), "read | write (default read)"),
    ("batch_size", Kind::Num(1, 1 << 20, |f| &mut f.batch_size), "requests per batch (default 128)"),
    ("block_size", Kind::Num(1, 1 << 36, |f| &mut f.block_size), "bytes per request (default 65536)"),
    (
        "buffer_size",
        Kind::Num(1, 1 << 40, |f| &mut f.buffer_size),
        "bytes registered on each side (default 1 GiB, raised to block_size*batch_size*threads)",
    ),
    ("duration", Kind::Num(1, 86400, |f| &mut f.duration), "seconds to run (default 10)"),
    ("threads", Kind::Num(1, 1024, |f| &mut f.threads), "submitting threads (default 1)"),
    ("report_unit", Kind::Str(|f| &mut f.report_unit), "GB | GiB | Gb | MB | MiB | Mb | KB | KiB | Kb (default GB)"),
    ("report_precision", Kind::Num(0, 9, |f| &mut f.report_precision), "digits after the point (default 2)"),
    ("check", Kind::Bool(|f| &mut f.check), "write a pattern, read it back and compare every byte; fail loudly on a mismatch"),
    ("json", Kind::Bool(|f| &mut f.json), "print the result as one JSON object on stdout"),
    ("quiet", Kind::Bool(|f| &mut f.quiet), "no progress line on stderr every second"),
    ("verbose", Kind::Bool(|f| &mut f.verbose), "show libte's log (level info) on stderr"),
    ("help", Kind::Bool(|f| &mut f.help), "this text"),
];

pub(crate) fn usage() {
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
pub(crate) struct Fail(pub(crate) i32, pub(crate) String);

impl From<libte::Error> for Fail {
    fn from(e: libte::Error) -> Fail {
        Fail(1, e.to_string())
    }
}

pub(crate) fn fail<T>(msg: String) -> Result<T, Fail> {
    Err(Fail(1, msg))
}

pub(crate) fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "true" | "1" | "yes" => Some(true),
        "false" | "0" | "no" => Some(false),
        _ => None,
    }
}

/// "64K", "1M", "1G" (optionally with "i" and/or "B") and plain numbers.
pub(crate) fn parse_size(v: &str) -> Option<u64> {
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

pub(crate) fn parse_flags(args: &[String]) -> Result<Flags, Fail> {
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
                let d = DEFS.iter().find(|d| d.0 == base && matches!(d.1, Kind::Bool(_)))?;
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
        if let Kind::Bool(field) = def.1 {
            *field(&mut f) = match value {
                None => !negated,
                Some(v) => match parse_bool(v) {
                    Some(b) => b,
                    None => return fail(format!("--{} wants true or false, not '{}'", key, v)),
                },
            };
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
            Kind::Num(min, max, field) => {
                *field(&mut f) = match parse_size(&v) {
                    Some(n) if n >= min && n <= max => n,
                    _ => return fail(format!("--{}={} is not a number in [{}, {}]", key, v, min, max)),
                }
            }
            Kind::Str(field) => *field(&mut f) = v,
            Kind::OptStr(field) => *field(&mut f) = Some(v),
            Kind::Bool(_) => unreachable!("booleans take no separate value"),
        }
        i += 1;
    }
    Ok(f)
}
