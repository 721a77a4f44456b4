#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Block devices as NVMe-oF files, on a loop device over a scratch file:
# the transport (test-nvmeof-blockdev), nvmeof-bench (the device's size from
# the device; clear refusals of what it cannot use) and, when fio is here,
# bench-vs-fio.sh in one short round. Needs root and a free loop device;
# skipped (77) otherwise.
#
#   blockdev.sh TEST_EXE BENCH_EXE BUILD_DIR
set -eu

test_exe=$1
bench=$2
build=$3
src_dir=$(dirname "$0")

if [ "$(id -u)" != 0 ] || ! command -v losetup >/dev/null 2>&1; then
	echo "needs root and losetup for a loop device: skipped"
	exit 77
fi
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/te-blockdev-XXXXXX")
dev=
cleanup() {
	[ -z "$dev" ] || losetup -d "$dev" || true
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
dd if=/dev/zero of="$dir/backing" bs=1M count=16 status=none
if ! dev=$(losetup -f --show "$dir/backing" 2>/dev/null); then
	dev=
	echo "no loop device available: skipped"
	exit 77
fi
mkdir "$dir/store"
fail() {
	echo "FAIL: $*"
	exit 1
}

# The transport over the device.
NV_BLOCKDEV=$dev "$test_exe" || fail "test-nvmeof-blockdev"

# The bench takes the device's size from the device: every request lands
# inside its 16 MiB (a larger size would make reads past the end fail).
for op in write read; do
	out=$("$bench" -m "file://$dir/store" --file "$dev" --op $op --bs 65536 --qd 8 --runtime 0.3) ||
		fail "nvmeof-bench --op $op on $dev"
	echo "$out"
	echo "$out" | awk -v op=$op '/^RESULT/ && $2 == op && $3 == 65536 && $9 > 0 {ok = 1} END {exit !ok}' ||
		fail "no RESULT line with requests for $op"
done
out=$("$bench" -m "file://$dir/store" --file "$dev" --op read --pattern seq --bs 4096 --qd 4 --runtime 0.2) ||
	fail "sequential reads on $dev"

# What it cannot use, it says so.
: > "$dir/empty"
for bad in "$dir/empty:empty" "$dir:neither a regular file nor a block device" \
	   "$dir/missing:No such file or directory"; do
	path=${bad%%:*} why=${bad#*:}
	if err=$("$bench" -m "file://$dir/store" --file "$path" --runtime 0.1 2>&1); then
		fail "nvmeof-bench accepted $path"
	fi
	echo "$err" | grep -q "$why" || fail "nvmeof-bench on $path said: $err"
done

# The comparison script on the device, one short round.
if command -v fio >/dev/null 2>&1; then
	out=$(HUGEPAGES=0 QUIET_WAIT=0 CASES="randread:4k" MODES="block poll" \
		sh "$src_dir/bench-vs-fio.sh" "$build" "$dev" 1 1 8 2>&1) || fail "bench-vs-fio.sh: $out"
	echo "$out"
	echo "$out" | awk '$1 == "randread" && $2 == "4k" && $3 ~ /^[0-9.]+$/ && $5 > 0 && $6 > 0 && $8 > 0 && $9 > 0 {n++}
			   $1 == "randread" && $3 == "block" && $4 > 0 {c++} END {exit !(n == 1 && c == 1)}' ||
		fail "bench-vs-fio.sh printed no table for $dev"
else
	echo "fio not installed: bench-vs-fio.sh not run"
fi
echo "ok"
