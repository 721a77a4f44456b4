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
. "$(dirname "$0")/../install-build.sh"

# Go's build cache keeps the -L flags pkg-config gave when it built the
# package: install_build keeps one install path from run to run.
install_build go "$build" "$work" "$testplugins"
[ -e "$libdir/te-1/libte-metadata-redis.so" ] || fail "redis plugin not installed in $libdir/te-1"
# Go's build cache does not look at C headers or libraries outside the
# package: a digest of the installed ones in the cgo flags (part of the cache
# key) rebuilds the package when they change, and the -L flags in
# CGO_LDFLAGS make the link follow the install root.
inc=$root$(env -u PKG_CONFIG_SYSROOT_DIR pkg-config --variable=includedir libte)
digest=$(cat "$inc/te/te.h" "$libdir/libte.so.1" | sha256sum | cut -c1-16)
export CGO_CFLAGS="-g -O2 -DTE_GO_INSTALLED=0x$digest"
export CGO_LDFLAGS="-g -O2 $(pkg-config --libs libte)"
echo "go: cgo flags: $(pkg-config --cflags --libs libte), libte digest $digest"

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
