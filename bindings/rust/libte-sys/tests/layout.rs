//! The `#[repr(C)]` mirrors against te.h: first the LP64 layout the header
//! implies (what any C compiler on x86_64 or aarch64 Linux produces), then
//! the same figures and every constant as the C compiler reports them from
//! the installed header.
use libte_sys::*;
use std::collections::HashMap;
use std::fmt::Write;
use std::mem::{align_of, size_of, MaybeUninit};
use std::process::Command;

/// Byte offset of `$field` in `$ty`, without creating a reference to
/// uninitialised memory (offset_of! is newer than the toolchain we support).
macro_rules! offset {
    ($ty:ty, $field:ident) => {{
        let u = MaybeUninit::<$ty>::uninit();
        let base = u.as_ptr();
        // SAFETY: addr_of! computes the field address without reading it.
        let field = unsafe { std::ptr::addr_of!((*base).$field) };
        field as usize - base as usize
    }};
}

/// (name, size, align, [(field, offset)]) of a mirrored struct.
type Layout = (&'static str, usize, usize, Vec<(&'static str, usize)>);

/// The Layout of struct `$ty` with the offsets of the fields named.
macro_rules! layout {
    ($ty:ident, [$($field:ident),* $(,)?]) => {
        (
            stringify!($ty),
            size_of::<$ty>(),
            align_of::<$ty>(),
            vec![$((stringify!($field), offset!($ty, $field))),*],
        )
    };
}

fn rust_layouts() -> Vec<Layout> {
    vec![
        layout!(te_request, [opcode, segment, local, remote, length]),
        layout!(te_task_status, [state, error, transferred]),
        layout!(te_task_info, [size, state, error, flags, transferred, deadline_ns]),
        layout!(te_segment_buffer, [addr, length, name]),
        layout!(te_option, [key, value]),
        layout!(te_memory_region, [addr, length, location, flags]),
        layout!(te_notification, [name, msg]),
        layout!(
            te_plugin_info,
            [
                size,
                path,
                name,
                version,
                description,
                kind,
                abi_major,
                abi_minor,
                loaded,
                reason,
            ]
        ),
        layout!(
            te_stats,
            [
                size,
                reserved,
                requests,
                bytes,
                completed,
                failed,
                canceled,
                in_flight,
                in_flight_bytes,
                retries,
                failovers,
                notifies_sent,
                notifies_received,
                registered_bytes,
                registered_regions,
                rpc_served,
                rpc_refused,
                auth_refused,
            ]
        ),
    ]
}

#[cfg(target_pointer_width = "64")]
#[test]
fn lp64_layout() {
    let want: HashMap<&str, (usize, usize, Vec<usize>)> = [
        ("te_request", (32, 8, vec![0, 4, 8, 16, 24])),
        ("te_task_status", (16, 8, vec![0, 4, 8])),
        ("te_task_info", (32, 8, vec![0, 4, 8, 12, 16, 24])),
        ("te_segment_buffer", (80, 8, vec![0, 8, 16])),
        ("te_option", (16, 8, vec![0, 8])),
        ("te_memory_region", (32, 8, vec![0, 8, 16, 24])),
        ("te_notification", (16, 8, vec![0, 8])),
        ("te_plugin_info", (64, 8, vec![0, 8, 16, 24, 32, 40, 44, 48, 52, 56])),
        (
            "te_stats",
            (
                176,
                8,
                vec![
                    0, 4, 8, 24, 40, 56, 72, 88, 96, 104, 112, 120, 128, 136, 144, 152, 160, 168,
                ],
            ),
        ),
    ]
    .into_iter()
    .collect();
    for (name, size, align, fields) in rust_layouts() {
        let (wsize, walign, woffs) = &want[name];
        assert_eq!(size, *wsize, "size of {}", name);
        assert_eq!(align, *walign, "alignment of {}", name);
        let offs: Vec<usize> = fields.iter().map(|f| f.1).collect();
        assert_eq!(&offs, woffs, "field offsets of {}", name);
    }
    assert_eq!(size_of::<te_segment_id>(), 4);
    assert_eq!(size_of::<te_batch_id>(), 8);
}

/// name -> value of every constant the header defines.
fn rust_constants() -> Vec<(&'static str, i64)> {
    macro_rules! constants {
        ($($name:ident),* $(,)?) => {
            vec![$((stringify!($name), $name as i64)),*]
        };
    }
    let mut v = constants![
        TE_ABI_MAJOR,
        TE_ABI_MINOR,
        TE_ERR_BASE,
        TE_ERR_PLUGIN,
        TE_ERR_NO_TRANSPORT,
        TE_ERR_METADATA,
        TE_ERR_PROTOCOL,
        TE_ERR_REJECTED,
        TE_ERR_BATCH_FULL,
        TE_ERR_ADDRESS,
        TE_ERR_OVERLAP,
        TE_ERR_SEGMENT,
        TE_ERR_BATCH,
        TE_ERR_AUTH,
        TE_LOG_ERROR,
        TE_LOG_WARN,
        TE_LOG_INFO,
        TE_LOG_DEBUG,
        TE_LOG_TRACE,
        TE_MEM_REMOTE_ACCESS,
        TE_LOCAL_SEGMENT,
        TE_OP_READ,
        TE_OP_WRITE,
        TE_TASK_WAITING,
        TE_TASK_PENDING,
        TE_TASK_INVALID,
        TE_TASK_CANCELED,
        TE_TASK_COMPLETED,
        TE_TASK_TIMEOUT,
        TE_TASK_FAILED,
        TE_TASK_UNSETTLED,
        TE_TASK_ENDED_EARLY,
        TE_NOTIFY_MAX,
        TE_KIND_TRANSPORT,
        TE_KIND_METADATA,
        TE_KIND_DEVICE,
        TE_KIND_EXPORTER,
    ];
    v.push(("TE_INVALID_BATCH_IS_MAX", (TE_INVALID_BATCH == u64::MAX) as i64));
    v.push((
        "SEGMENT_NAME_BYTES",
        std::mem::size_of::<[std::os::raw::c_char; 64]>() as i64,
    ));
    v
}

/// Builds and runs a C program that prints the same facts from the installed
/// te.h; None when no C compiler can be run here.
fn c_facts() -> Option<HashMap<String, i64>> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    if Command::new(&cc).arg("--version").output().is_err() {
        return None;
    }
    let cflags = Command::new(std::env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".into()))
        .args(["--cflags", "libte"])
        .output()
        .expect("pkg-config --cflags libte");
    assert!(cflags.status.success(), "pkg-config --cflags libte failed");
    let cflags = String::from_utf8(cflags.stdout).unwrap();

    let mut src = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <te/te.h>\n\
         #define L(T) printf(#T \"/size %zu\\n\" #T \"/align %zu\\n\", sizeof(T), _Alignof(T))\n\
         #define F(T, f) printf(#T \".\" #f \" %zu\\n\", offsetof(T, f))\n\
         #define C(c) printf(#c \" %lld\\n\", (long long)(c))\n\
         int main(void) {\n",
    );
    for (name, _, _, fields) in rust_layouts() {
        writeln!(src, "L({});", name).unwrap();
        for (f, _) in fields {
            writeln!(src, "F({}, {});", name, f).unwrap();
        }
    }
    for (name, _) in rust_constants() {
        match name {
            "TE_INVALID_BATCH_IS_MAX" => src += "C(TE_INVALID_BATCH == UINT64_MAX);\n",
            "SEGMENT_NAME_BYTES" => src += "C(sizeof(((te_segment_buffer *)0)->name));\n",
            _ => writeln!(src, "C({});", name).unwrap(),
        }
    }
    src += "return 0; }\n";

    let dir = std::env::temp_dir().join(format!("libte-sys-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&c, src).unwrap();
    let status = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&c)
        .args(cflags.split_whitespace())
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "the layout program did not compile");
    let out = Command::new(&exe).output().expect("run the layout program");
    std::fs::remove_dir_all(&dir).ok();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut facts = HashMap::new();
    for line in text.lines() {
        let (k, v) = line.rsplit_once(' ').unwrap();
        facts.insert(k.to_string(), v.parse::<i64>().unwrap());
    }
    // The two computed facts print under their C expression's name.
    if let Some(v) = facts.remove("TE_INVALID_BATCH == UINT64_MAX") {
        facts.insert("TE_INVALID_BATCH_IS_MAX".into(), v);
    }
    if let Some(v) = facts.remove("sizeof(((te_segment_buffer *)0)->name)") {
        facts.insert("SEGMENT_NAME_BYTES".into(), v);
    }
    Some(facts)
}

#[test]
fn matches_the_c_compiler() {
    let facts = match c_facts() {
        Some(f) => f,
        None => {
            assert!(
                std::env::var_os("LIBTE_RUST_REQUIRE_CC").is_none(),
                "no C compiler, but LIBTE_RUST_REQUIRE_CC is set"
            );
            eprintln!("skipped: no C compiler to compare with");
            return;
        }
    };
    let mut checked = 0;
    for (name, size, align, fields) in rust_layouts() {
        assert_eq!(facts[&format!("{}/size", name)], size as i64, "size of {}", name);
        assert_eq!(facts[&format!("{}/align", name)], align as i64, "alignment of {}", name);
        for (f, off) in fields {
            assert_eq!(
                facts[&format!("{}.{}", name, f)],
                off as i64,
                "offset of {}.{}",
                name,
                f
            );
            checked += 1;
        }
    }
    for (name, value) in rust_constants() {
        assert_eq!(facts[name], value, "constant {}", name);
        checked += 1;
    }
    assert!(checked > 60, "only {} facts compared", checked);
}

#[test]
fn links_and_names_errors() {
    // SAFETY: both return pointers to static NUL-terminated strings.
    let (version, segment) = unsafe {
        (
            std::ffi::CStr::from_ptr(te_version()).to_str().unwrap().to_string(),
            std::ffi::CStr::from_ptr(te_strerror(TE_ERR_SEGMENT))
                .to_str()
                .unwrap()
                .to_string(),
        )
    };
    assert!(
        version.starts_with(&format!("{}.", TE_ABI_MAJOR)),
        "version {}",
        version
    );
    assert!(!segment.is_empty());
    // SAFETY: as above.
    let other = unsafe { std::ffi::CStr::from_ptr(te_strerror(TE_ERR_BATCH)) };
    assert_ne!(other.to_str().unwrap(), segment);
}
