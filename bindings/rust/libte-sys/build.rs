// Finds libte with pkg-config and tells cargo how to link it. No crates: the
// workspace builds offline, so this runs `pkg-config --libs libte` itself.
// pkg-config reads PKG_CONFIG_PATH, PKG_CONFIG_LIBDIR and
// PKG_CONFIG_SYSROOT_DIR from the environment it inherits (the sysroot is
// prefixed to the -L paths it prints, which is what a staged install
// needs); PKG_CONFIG names another pkg-config binary.
use std::env;
use std::process::Command;

fn main() {
    for var in [
        "PKG_CONFIG",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "PKG_CONFIG_SYSROOT_DIR",
    ] {
        println!("cargo:rerun-if-env-changed={}", var);
    }
    println!("cargo:rerun-if-changed=build.rs");

    let tool = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    let out = Command::new(&tool)
        .args(["--libs", "libte"])
        .output()
        .unwrap_or_else(|e| panic!("libte-sys: cannot run {}: {}", tool, e));
    if !out.status.success() {
        panic!(
            "libte-sys: `{} --libs libte` failed ({}): {}\n\
             Install libte, or point PKG_CONFIG_PATH at the directory holding libte.pc.",
            tool,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let flags = String::from_utf8(out.stdout).expect("libte-sys: pkg-config printed non-UTF-8 text");
    let mut linked = false;
    for flag in flags.split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={}", dir);
            // Dependents (through `links = "te"`) see it as DEP_TE_LIBDIR.
            println!("cargo:libdir={}", dir);
        } else if let Some(lib) = flag.strip_prefix("-l") {
            println!("cargo:rustc-link-lib={}", lib);
            linked |= lib == "te";
        }
    }
    if !linked {
        panic!("libte-sys: `{} --libs libte` named no -lte: {}", tool, flags.trim());
    }
}
