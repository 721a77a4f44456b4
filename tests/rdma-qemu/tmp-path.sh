#!/bin/sh
# The qemu harness with everything the guest opens by path under /tmp, where
# the guest has a tmpfs of its own: a build tree of symlinks to this one, the
# harness's scripts (symlinked too) and the scratch folder, all in a fresh
# /tmp folder. One short check (te-bench over rxe0, the shipped plugin) is
# enough: the guest either sees its job, the scripts and the binaries there,
# or fails to start it. Exits as run.sh does (77: skipped).
#   tmp-path.sh BUILD_DIR SOURCE_DIR
set -eu
build=$(realpath "$1")
src=$(realpath "$2")
t=$(mktemp -d /tmp/te-qemu-path-XXXXXX)
trap 'rm -rf "$t"' EXIT INT TERM

cp -as "$build" "$t/build"
rm -rf "$t/build/tests/rdma-qemu/"run-* # earlier runs' work folders
mkdir -p "$t/src/tests"
cp -as "$src/tests/rdma-qemu" "$t/src/tests/"
echo "build and scripts under $t"
rc=0
TE_QEMU_ONLY=bench-loopback-read TE_QEMU_TIMEOUT=${TE_QEMU_TIMEOUT:-240} \
	"$src/tests/rdma-qemu/run.sh" "$t/build" "$t/src" bench || rc=$?
exit $rc
