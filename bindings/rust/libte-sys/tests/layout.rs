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

fn rust_layouts() -> Vec<Layout> {
    vec![
        (
            "te_request",
            size_of::<te_request>(),
            align_of::<te_request>(),
            vec![
                ("opcode", offset!(te_request, opcode)),
                ("segment", offset!(te_request, segment)),
                ("local", offset!(te_request, local)),
                ("remote", offset!(te_request, remote)),
                ("length", offset!(te_request, length)),
            ],
        ),
        (
            "te_task_status",
            size_of::<te_task_status>(),
            align_of::<te_task_status>(),
            vec![
                ("state", offset!(te_task_status, state)),
                ("error", offset!(te_task_status, error)),
                ("transferred", offset!(te_task_status, transferred)),
            ],
        ),
        (
            "te_segment_buffer",
            size_of::<te_segment_buffer>(),
            align_of::<te_segment_buffer>(),
            vec![
                ("addr", offset!(te_segment_buffer, addr)),
                ("length", offset!(te_segment_buffer, length)),
                ("name", offset!(te_segment_buffer, name)),
            ],
        ),
        (
            "te_option",
            size_of::<te_option>(),
            align_of::<te_option>(),
            vec![("key", offset!(te_option, key)), ("value", offset!(te_option, value))],
        ),
        (
            "te_memory_region",
            size_of::<te_memory_region>(),
            align_of::<te_memory_region>(),
            vec![
                ("addr", offset!(te_memory_region, addr)),
                ("length", offset!(te_memory_region, length)),
                ("location", offset!(te_memory_region, location)),
                ("flags", offset!(te_memory_region, flags)),
            ],
        ),
        (
            "te_notification",
            size_of::<te_notification>(),
            align_of::<te_notification>(),
            vec![("name", offset!(te_notification, name)), ("msg", offset!(te_notification, msg))],
        ),
        (
            "te_plugin_info",
            size_of::<te_plugin_info>(),
            align_of::<te_plugin_info>(),
            vec![
                ("size", offset!(te_plugin_info, size)),
                ("path", offset!(te_plugin_info, path)),
                ("name", offset!(te_plugin_info, name)),
                ("version", offset!(te_plugin_info, version)),
                ("description", offset!(te_plugin_info, description)),
                ("kind", offset!(te_plugin_info, kind)),
                ("abi_major", offset!(te_plugin_info, abi_major)),
                ("abi_minor", offset!(te_plugin_info, abi_minor)),
                ("loaded", offset!(te_plugin_info, loaded)),
                ("reason", offset!(te_plugin_info, reason)),
            ],
        ),
        (
            "te_stats",
            size_of::<te_stats>(),
            align_of::<te_stats>(),
            vec![
                ("size", offset!(te_stats, size)),
                ("reserved", offset!(te_stats, reserved)),
                ("requests", offset!(te_stats, requests)),
                ("bytes", offset!(te_stats, bytes)),
                ("completed", offset!(te_stats, completed)),
                ("failed", offset!(te_stats, failed)),
                ("canceled", offset!(te_stats, canceled)),
                ("in_flight", offset!(te_stats, in_flight)),
                ("in_flight_bytes", offset!(te_stats, in_flight_bytes)),
                ("retries", offset!(te_stats, retries)),
                ("failovers", offset!(te_stats, failovers)),
                ("notifies_sent", offset!(te_stats, notifies_sent)),
                ("notifies_received", offset!(te_stats, notifies_received)),
                ("registered_bytes", offset!(te_stats, registered_bytes)),
                ("registered_regions", offset!(te_stats, registered_regions)),
                ("rpc_served", offset!(te_stats, rpc_served)),
                ("rpc_refused", offset!(te_stats, rpc_refused)),
                ("auth_refused", offset!(te_stats, auth_refused)),
            ],
        ),
    ]
}

#[cfg(target_pointer_width = "64")]
#[test]
fn lp64_layout() {
    let want: HashMap<&str, (usize, usize, Vec<usize>)> = [
        ("te_request", (32, 8, vec![0, 4, 8, 16, 24])),
        ("te_task_status", (16, 8, vec![0, 4, 8])),
        ("te_segment_buffer", (80, 8, vec![0, 8, 16])),
        ("te_option", (16, 8, vec![0, 8])),
        ("te_memory_region", (32, 8, vec![0, 8, 16, 24])),
        ("te_notification", (16, 8, vec![0, 8])),
        ("te_plugin_info", (64, 8, vec![0, 8, 16, 24, 32, 40, 44, 48, 52, 56])),
        (
            "te_stats",
            (176, 8, vec![0, 4, 8, 24, 40, 56, 72, 88, 96, 104, 112, 120, 128, 136, 144, 152, 160, 168]),
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
    vec![
        ("TE_ABI_MAJOR", TE_ABI_MAJOR as i64),
        ("TE_ABI_MINOR", TE_ABI_MINOR as i64),
        ("TE_ERR_BASE", TE_ERR_BASE as i64),
        ("TE_ERR_PLUGIN", TE_ERR_PLUGIN as i64),
        ("TE_ERR_NO_TRANSPORT", TE_ERR_NO_TRANSPORT as i64),
        ("TE_ERR_METADATA", TE_ERR_METADATA as i64),
        ("TE_ERR_PROTOCOL", TE_ERR_PROTOCOL as i64),
        ("TE_ERR_REJECTED", TE_ERR_REJECTED as i64),
        ("TE_ERR_BATCH_FULL", TE_ERR_BATCH_FULL as i64),
        ("TE_ERR_ADDRESS", TE_ERR_ADDRESS as i64),
        ("TE_ERR_OVERLAP", TE_ERR_OVERLAP as i64),
        ("TE_ERR_SEGMENT", TE_ERR_SEGMENT as i64),
        ("TE_ERR_BATCH", TE_ERR_BATCH as i64),
        ("TE_ERR_AUTH", TE_ERR_AUTH as i64),
        ("TE_LOG_ERROR", TE_LOG_ERROR as i64),
        ("TE_LOG_WARN", TE_LOG_WARN as i64),
        ("TE_LOG_INFO", TE_LOG_INFO as i64),
        ("TE_LOG_DEBUG", TE_LOG_DEBUG as i64),
        ("TE_LOG_TRACE", TE_LOG_TRACE as i64),
        ("TE_MEM_REMOTE_ACCESS", TE_MEM_REMOTE_ACCESS as i64),
        ("TE_LOCAL_SEGMENT", TE_LOCAL_SEGMENT as i64),
        ("TE_OP_READ", TE_OP_READ as i64),
        ("TE_OP_WRITE", TE_OP_WRITE as i64),
        ("TE_TASK_WAITING", TE_TASK_WAITING as i64),
        ("TE_TASK_PENDING", TE_TASK_PENDING as i64),
        ("TE_TASK_INVALID", TE_TASK_INVALID as i64),
        ("TE_TASK_CANCELED", TE_TASK_CANCELED as i64),
        ("TE_TASK_COMPLETED", TE_TASK_COMPLETED as i64),
        ("TE_TASK_TIMEOUT", TE_TASK_TIMEOUT as i64),
        ("TE_TASK_FAILED", TE_TASK_FAILED as i64),
        ("TE_NOTIFY_MAX", TE_NOTIFY_MAX as i64),
        ("TE_KIND_TRANSPORT", TE_KIND_TRANSPORT as i64),
        ("TE_KIND_METADATA", TE_KIND_METADATA as i64),
        ("TE_KIND_DEVICE", TE_KIND_DEVICE as i64),
        ("TE_KIND_EXPORTER", TE_KIND_EXPORTER as i64),
        ("TE_INVALID_BATCH_IS_MAX", (TE_INVALID_BATCH == u64::MAX) as i64),
        ("SEGMENT_NAME_BYTES", std::mem::size_of::<[std::os::raw::c_char; 64]>() as i64),
    ]
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
            assert_eq!(facts[&format!("{}.{}", name, f)], off as i64, "offset of {}.{}", name, f);
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
            std::ffi::CStr::from_ptr(te_strerror(TE_ERR_SEGMENT)).to_str().unwrap().to_string(),
        )
    };
    assert!(version.starts_with(&format!("{}.", TE_ABI_MAJOR)), "version {}", version);
    assert!(!segment.is_empty());
    // SAFETY: as above.
    let other = unsafe { std::ffi::CStr::from_ptr(te_strerror(TE_ERR_BATCH)) };
    assert_ne!(other.to_str().unwrap(), segment);
}
