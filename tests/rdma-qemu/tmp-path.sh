#!/bin/sh
# The qemu harness with everything the guest opens by path under /tmp, where
# the guest has a tmpfs of its own: a copy of the build tree's parts that
# one short check needs (te-bench over rxe0 with the shipped plugin: libte,
# the plugins, te-bench; they find each other by relative paths), the
# harness's scripts and the scratch folder, all in a fresh /tmp folder.
# Copies, not symlinks: a link back into a checkout that is itself under
# /tmp would lead the guest to a folder it was not given. The guest either
# sees its job, the scripts and the binaries there, or fails to start it.
# Exits as run.sh does (77: skipped).
#   tmp-path.sh BUILD_DIR SOURCE_DIR
set -eu
build=$(realpath "$1")
src=$(realpath "$2")
t=$(mktemp -d /tmp/te-qemu-path-XXXXXX)
trap 'rm -rf "$t"' EXIT INT TERM

for d in libte plugins/transport/rdma plugins/transport/tcp plugins/transport/shm tools/te-bench; do
	[ -d "$build/$d" ] || continue
	mkdir -p "$t/build/$d"
	cp -a "$build/$d/." "$t/build/$d/"
done
mkdir -p "$t/build/tests/rdma-qemu" "$t/src/tests"
cp -a "$src/tests/rdma-qemu" "$t/src/tests/"
echo "build and scripts under $t"
rc=0
TE_QEMU_ONLY=bench-loopback-read TE_QEMU_TIMEOUT=${TE_QEMU_TIMEOUT:-240} \
	"$src/tests/rdma-qemu/run.sh" "$t/build" "$t/src" bench || rc=$?
exit $rc
