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

# The install root keeps one path from run to run: Go's build cache keeps
# the -L flags pkg-config gave when it built the package, so a fresh path
# each run would send later links to a directory that is gone.
mkdir -p "$work"
root=$work/root
tmp=$(mktemp -d "$work/run.XXXXXX")
trap 'rm -rf "$tmp" "$root"' EXIT INT TERM
rm -rf "$root"

echo "go: installing the build into $root"
meson install -C "$build" --destdir "$root" --no-rebuild --quiet >/dev/null \
  || fail "meson install failed"
pc=$(find "$root" -name libte.pc | head -n 1)
[ -n "$pc" ] || fail "libte.pc not installed"
export PKG_CONFIG_PATH="$(dirname "$pc")" PKG_CONFIG_SYSROOT_DIR="$root"
libdir=$root$(env -u PKG_CONFIG_SYSROOT_DIR pkg-config --variable=libdir libte)
[ -e "$libdir/libte.so.1" ] || fail "libte.so.1 missing in $libdir"
[ -e "$libdir/te-1/libte-transport-tcp.so" ] || fail "tcp plugin not installed in $libdir/te-1"
[ -e "$libdir/te-1/libte-metadata-redis.so" ] || fail "redis plugin not installed in $libdir/te-1"
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Go's build cache does not look at C headers or libraries outside the
# package: a digest of the installed ones in the cgo flags (part of the cache
# key) rebuilds the package when they change, and the -L flags in
# CGO_LDFLAGS make the link follow the install root.
inc=$root$(env -u PKG_CONFIG_SYSROOT_DIR pkg-config --variable=includedir libte)
digest=$(cat "$inc/te/te.h" "$libdir/libte.so.1" | sha256sum | cut -c1-16)
export CGO_CFLAGS="-g -O2 -DTE_GO_INSTALLED=0x$digest"
export CGO_LDFLAGS="-g -O2 $(pkg-config --libs libte)"
echo "go: cgo flags: $(pkg-config --cflags --libs libte), libte digest $digest"

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
