//! The bench example, run briefly: loopback over TCP with --check both
//! ways, JSON output, bad flags, and a corrupting transport that --check
//! must catch (the "flip" test transport, when TE_PLUGIN_PATH has it).
use std::path::PathBuf;
use std::process::{Command, Output};

/// target/<profile>/examples/bench beside target/<profile>/deps/<this test>.
fn bench() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let p = profile_dir.join("examples").join("bench");
    assert!(p.exists(), "{} not built (cargo test and cargo build --all-targets build it)", p.display());
    p
}

fn run(args: &[&str]) -> Output {
    Command::new(bench()).args(args).env_remove("TE_LOG_LEVEL").output().expect("run the bench example")
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// What the default protocol picks between two engines of this process.
fn shm_or_tcp() -> &'static str {
    if libte::plugins().iter().any(|p| p.name.as_deref() == Some("shm") && p.loaded) {
        "shm"
    } else {
        "tcp"
    }
}

const SMALL: &[&str] = &["--duration=1", "--batch_size=16", "--block_size=16K", "--buffer_size=1M"];

#[test]
fn checked_runs_both_ways() {
    // TCP with anonymous memory, then the default: the best transport
    // (shm between engines of one host, when its plugin is there) over
    // te_mem_alloc memory.
    for (op, extra) in [("read", ["--protocol=tcp", "--memory=anonymous"]), ("write", ["--protocol=auto", "--memory=libte"])] {
        let mut args = SMALL.to_vec();
        let opflag = format!("--operation={}", op);
        args.extend(["--check", "--threads=2", opflag.as_str()]);
        args.extend(extra);
        let o = run(&args);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{} failed: {}{}", op, out, err);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{}", out);
        let over = if op == "read" { "tcp" } else { shm_or_tcp() };
        assert!(
            lines[0].contains(&format!("loopback {} over {}, 16 x 16 KiB per batch, 2 threads", op, over)),
            "{}",
            out
        );
        assert!(lines[1].starts_with("Test completed: duration "), "{}", out);
        assert!(lines[1].contains(", batch count ") && lines[1].ends_with(" GB/s"), "{}", out);
        let count: u64 = lines[1].split(", batch count ").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
        assert!(count > 0, "{}", out);
        assert!(lines[2].starts_with("IOPS ") && lines[2].contains("every byte checked"), "{}", out);
        assert!(err.contains("[  1 s]"), "no progress line: {}", err);
    }
}

#[test]
fn json_result() {
    let mut args = SMALL.to_vec();
    args.extend(["--json", "--check", "--report_unit=MiB", "--quiet"]);
    let o = run(&args);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{}{}", out, err);
    let line = out.trim();
    let head = format!("{{\"mode\":\"loopback\",\"protocol\":\"auto\",\"transport\":\"{}\"", shm_or_tcp());
    assert!(line.starts_with(&head) && line.ends_with("}}"), "{}", line);
    for key in ["\"check\":true", "\"block_size\":16384", "\"batch_size\":16", "\"report_unit\":\"MiB\"", "\"p99\":"] {
        assert!(line.contains(key), "{} missing in {}", key, line);
    }
    let batches: u64 = line.split("\"batch_count\":").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
    let requests: u64 = line.split("\"requests\":").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
    assert!(batches > 0 && requests == batches * 16, "{}", line);
    assert!(err.is_empty(), "--quiet --json printed {}", err);
}

#[test]
fn bad_flags() {
    for (args, want) in [
        (vec!["--mode=sideways"], "--mode=sideways: want loopback, target or initiator"),
        (vec!["--batch_size=0"], "--batch_size=0 is not a number in [1, 1048576]"),
        (vec!["--operation=copy"], "--operation=copy: want read or write"),
        (vec!["--memory=disk"], "--memory=disk: want libte or anonymous"),
        (vec!["--report_unit=parsec"], "--report_unit=parsec"),
        (vec!["--no-such-flag"], "unknown flag '--no-such-flag'"),
        (vec!["--mode=initiator"], "--mode=initiator needs --segment_id"),
        (vec!["--block_size"], "--block_size needs a value"),
        (vec!["stray"], "unexpected argument 'stray'"),
    ] {
        let o = run(&args);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{:?}: {}{}", args, out, err);
        assert!(err.starts_with("bench: ") && err.contains(want), "{:?}: {}", args, err);
    }
    let o = run(&["--help"]);
    assert!(o.status.success());
    assert!(text(&o).0.contains("--check"));
}

#[test]
fn check_catches_corruption() {
    let has_flip = std::env::var("TE_PLUGIN_PATH")
        .map(|p| p.split(':').any(|d| std::path::Path::new(d).join("libte-transport-flip.so").exists()))
        .unwrap_or(false);
    if !has_flip {
        assert!(
            std::env::var_os("LIBTE_RUST_REQUIRE_TEST_PLUGINS").is_none(),
            "the flip test transport is not in TE_PLUGIN_PATH"
        );
        eprintln!("skipped: no flip test transport in TE_PLUGIN_PATH");
        return;
    }
    let o = run(&["--protocol=flip", "--memory=anonymous", "--check", "--duration=2", "--quiet", "--batch_size=8", "--block_size=4K"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{}{}", out, err);
    assert!(err.contains("DATA MISMATCH after READ"), "{}", err);
    assert!(!out.contains("Test completed"), "{}", out);
    // Without --check the same corruption goes unseen.
    let o = run(&["--protocol=flip", "--memory=anonymous", "--duration=1", "--quiet", "--batch_size=8", "--block_size=4K"]);
    assert!(o.status.success(), "{:?}", text(&o));
}
