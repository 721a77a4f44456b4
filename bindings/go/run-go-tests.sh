#!/bin/sh
# Tests the Go module against an installed copy of the build, the way a Go
# user builds it: libte from pkg-config, its plugins found next to the
# installed library. Go's caches and HOME stay under the build directory;
# no network (GOPROXY=off). Usage: run-go-tests.sh BUILD GO_SRC GO_BUILD TEST_PLUGIN_DIR
set -eu
build=$1
src=$2
work=$3
testplugins=$4
fail() { echo "go: $*" >&2; exit 1; }

mkdir -p "$work"
tmp=$(mktemp -d "$work/run.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

echo "go: installing the build into $tmp/root"
meson install -C "$build" --destdir "$tmp/root" --no-rebuild --quiet >/dev/null \
  || fail "meson install failed"
pc=$(find "$tmp/root" -name libte.pc | head -n 1)
[ -n "$pc" ] || fail "libte.pc not installed"
export PKG_CONFIG_PATH="$(dirname "$pc")" PKG_CONFIG_SYSROOT_DIR="$tmp/root"
libdir=$tmp/root$(env -u PKG_CONFIG_SYSROOT_DIR pkg-config --variable=libdir libte)
[ -e "$libdir/libte.so.1" ] || fail "libte.so.1 missing in $libdir"
[ -e "$libdir/te-1/libte-transport-tcp.so" ] || fail "tcp plugin not installed in $libdir/te-1"
[ -e "$libdir/te-1/libte-metadata-redis.so" ] || fail "redis plugin not installed in $libdir/te-1"
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "go: cgo flags: $(pkg-config --cflags --libs libte)"

# The installed plugins come from the installed library's own directory;
# only the hold test transport (not installed) comes from TE_PLUGIN_PATH.
unset TE_PLUGINS
mkdir -p "$tmp/plugins"
cp "$testplugins/libte-transport-hold.so" "$tmp/plugins/" || fail "hold test transport not built"
export TE_PLUGIN_PATH="$tmp/plugins"
export TE_TEST_HOLD_PLUGIN="$tmp/plugins/libte-transport-hold.so"

export GOPATH="$work/gopath" GOCACHE="$work/gocache" HOME="$work/home" GOTMPDIR="$tmp"
export GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local CGO_ENABLED=1
mkdir -p "$HOME"
cd "$src"

echo "go: $(go version)"
echo "go: go vet ./..."
go vet ./... || fail "go vet failed"
echo "go: go test ./..."
go test -count=1 -timeout 600s ./... || fail "go test failed"
echo "go: go test -race ./..."
go test -race -count=1 -timeout 900s ./... || fail "go test -race failed"
echo "go: ok"
