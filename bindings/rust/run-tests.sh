#!/bin/sh
# Builds and tests the Rust workspace against an installed copy of the build,
# the way a Rust user would: libte found by pkg-config, its plugins next to
# the installed library. cargo's home and target directory stay under the
# build directory; no network (--offline, no dependencies).
# Usage: run-tests.sh BUILD RUST_SRC WORK TEST_PLUGIN_DIR [FLIP_PLUGIN_DIR]
set -eu
build=$1
src=$2
work=$3
testplugins=$4
flipdir=${5:-}
fail() { echo "rust: $*" >&2; exit 1; }

# One install path from run to run: cargo keeps the -L path build.rs gave
# (build.rs runs again only when the pkg-config variables change).
mkdir -p "$work"
root=$work/root
tmp=$(mktemp -d "$work/run.XXXXXX")
trap 'rm -rf "$tmp" "$root"' EXIT INT TERM
rm -rf "$root"

echo "rust: installing the build into $root"
meson install -C "$build" --destdir "$root" --no-rebuild --quiet >/dev/null \
  || fail "meson install failed (it installs what is built: ninja -C $build first)"
pc=$(find "$root" -name libte.pc | head -n 1)
[ -n "$pc" ] || fail "libte.pc not installed"
export PKG_CONFIG_PATH="$(dirname "$pc")" PKG_CONFIG_SYSROOT_DIR="$root"
libdir=$root$(env -u PKG_CONFIG_SYSROOT_DIR pkg-config --variable=libdir libte)
[ -e "$libdir/libte.so.1" ] || fail "libte.so.1 missing in $libdir"
[ -e "$libdir/te-1/libte-transport-tcp.so" ] || fail "tcp plugin not installed in $libdir/te-1"
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# The installed plugins come from the installed library's own directory;
# only the test transports (not installed) come from TE_PLUGIN_PATH: "hold"
# keeps tasks in flight, "flip" corrupts data for the bench's --check.
unset TE_PLUGINS
mkdir -p "$tmp/plugins"
cp "$testplugins/libte-transport-hold.so" "$tmp/plugins/" || fail "hold test transport not built"
export TE_TEST_HOLD_PLUGIN="$tmp/plugins/libte-transport-hold.so"
if [ -n "$flipdir" ]; then
  cp "$flipdir/libte-transport-flip.so" "$tmp/plugins/" || fail "flip test transport not built"
  export LIBTE_RUST_REQUIRE_TEST_PLUGINS=1
fi
export TE_PLUGIN_PATH="$tmp/plugins"
command -v cc >/dev/null && export LIBTE_RUST_REQUIRE_CC=1

# Debian's toolchain when it is there (the oldest we support), whatever
# else is first on PATH; cargo finds its clippy next to itself.
if [ -x /usr/bin/cargo ]; then
  cargo=/usr/bin/cargo
  export RUSTC=/usr/bin/rustc PATH="/usr/bin:$PATH"
  [ -x /usr/bin/rustdoc ] && export RUSTDOC=/usr/bin/rustdoc
else
  cargo=cargo
fi
export CARGO_HOME="$work/cargo-home" CARGO_TARGET_DIR="$work/target"
mkdir -p "$CARGO_HOME"
cd "$src"
echo "rust: $($cargo --version), $(${RUSTC:-rustc} --version)"
echo "rust: libte $(pkg-config --modversion libte): $(pkg-config --libs libte)"

echo "rust: cargo build"
$cargo build --offline --locked --all-targets || fail "cargo build failed"
echo "rust: cargo test"
$cargo test --offline --locked || fail "cargo test failed"
if $cargo clippy --version >/dev/null 2>&1; then
  echo "rust: cargo clippy"
  $cargo clippy --offline --locked --all-targets -- -D warnings || fail "cargo clippy found problems"
else
  echo "rust: cargo clippy is not installed; skipped"
fi
echo "rust: bench example, 2 s with --check"
out=$($cargo run --offline --locked --release --quiet --example bench -- --duration=2 --check --quiet) \
  || fail "bench failed: $out"
echo "$out"
echo "$out" | grep -q "^Test completed: duration " || fail "bench printed no result line"
echo "$out" | grep -q "^IOPS .*every byte checked" || fail "bench did not check the bytes"
echo "rust: ok"
