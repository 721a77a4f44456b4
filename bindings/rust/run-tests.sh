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
. "$(dirname "$0")/../install-build.sh"

# cargo keeps the -L path build.rs gave (build.rs runs again only when the
# pkg-config variables change): install_build keeps one install path.
install_build rust "$build" "$work" "$testplugins"
# "flip" corrupts data for the bench's --check.
if [ -n "$flipdir" ]; then
  cp "$flipdir/libte-transport-flip.so" "$tmp/plugins/" || fail "flip test transport not built"
  export LIBTE_RUST_REQUIRE_TEST_PLUGINS=1
fi
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
