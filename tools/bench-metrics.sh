#!/usr/bin/env bash
# What counting costs (docs/benchmarks.md, "Metrics: the cost of counting"):
# te-bench requests per second at 4 KiB over TCP and over the same-host
# transport, a build with the metrics on (the default) against one built with
# -Dmetrics=false, in paired runs whose order alternates; prints each pair's
# ratio and the median ratio per case.
#
#   tools/bench-metrics.sh ON_BUILD OFF_BUILD
#
# Environment: ROUNDS (default 7), SECS per run (default 5), CASES (default
# "tcp:write tcp:read shm:write shm:read"), BLOCK (default 4096).
# Quiet the machine first.
#
# INSTR=1 counts instructions instead, which the machine's load does not
# change: one run per build and case under valgrind's callgrind, collecting
# only inside libte's calls on the initiator, divided by the requests made.
set -euo pipefail
. "$(dirname "$0")/bench-lib.sh"

on=${1:?ON_BUILD}
off=${2:?OFF_BUILD}
rounds=${ROUNDS:-7}
secs=${SECS:-5}
cases=${CASES:-"tcp:write tcp:read shm:write shm:read"}
block=${BLOCK:-4096}
for b in "$on" "$off"; do
	[ -x "$b/tools/te-bench/te-bench" ] || { echo "bench-metrics: $b/tools/te-bench/te-bench not built" >&2; exit 1; }
done

tmp=$(mktemp -d)
target_pid=
cleanup() {
	[ -n "$target_pid" ] && kill "$target_pid" 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

# run BUILD PROTOCOL OP -> requests per second on stdout, trying up to three
# times (a target whose port another program took meanwhile fails to serve).
run() {
	local i
	for i in 1 2 3; do
		run_once "$@" && return 0
		echo "bench-metrics: run failed (try $i); the target said:" >&2
		tail -3 "$tmp/target" >&2
	done
	exit 1
}

# start_target BUILD PROTOCOL: a target of BUILD (its te-bench and its
# plugins) in the background, its pid in target_pid and its segment name in
# name; the protocol the initiator asks for in tproto.
start_target() {
	local b=$1 proto=$2
	tproto=$proto
	[ "$proto" = shm ] && tproto=auto
	export TE_PLUGIN_PATH="$PWD/$b/plugins/transport/tcp:$PWD/$b/plugins/transport/shm"
	"$b/tools/te-bench/te-bench" --mode=target --local_server_name=127.0.0.1 --protocol="$tproto" \
		--buffer_size=64M >"$tmp/target" 2>&1 &
	target_pid=$!
	name=$(bench_target_name "$tmp/target")
	[ -n "$name" ] || { echo "bench-metrics: the target did not start" >&2; cat "$tmp/target" >&2; exit 1; }
}

stop_target() {
	kill "$target_pid" 2>/dev/null || true
	wait "$target_pid" 2>/dev/null || true
	target_pid=
}

# run_once BUILD PROTOCOL OP: the target and the initiator are both of BUILD.
run_once() {
	local b=$1 proto=$2 op=$3 name tproto
	start_target "$b" "$proto"
	local rc=0
	"$b/tools/te-bench/te-bench" --segment_id="$name" --protocol="$tproto" --operation="$op" \
		--block_size="$block" --duration="$secs" --quiet --json >"$tmp/out" 2>"$tmp/err" || rc=$?
	stop_target
	if [ $rc -ne 0 ]; then
		cat "$tmp/err" >&2
		return 1
	fi
	python3 - "$tmp/out" "$proto" <<'PY'
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
assert d["transport"] == sys.argv[2], d["transport"]
print(d["iops"])
PY
}

# instr BUILD PROTOCOL OP -> "instructions requests" of one run under
# callgrind, counted inside libte's calls only.
instr() {
	local b=$1 proto=$2 op=$3 name tproto
	start_target "$b" "$proto"
	local toggles=() f
	for f in te_submit te_batch_status te_batch_wait te_get_status te_batch_alloc te_batch_free; do
		toggles+=("--toggle-collect=$f")
	done
	valgrind --tool=callgrind --callgrind-out-file="$tmp/cg" "${toggles[@]}" \
		"$b/tools/te-bench/te-bench" --segment_id="$name" --protocol="$tproto" --operation="$op" \
		--block_size="$block" --duration="$secs" --quiet --json >"$tmp/out" 2>"$tmp/err" ||
		{ cat "$tmp/err" >&2; exit 1; }
	stop_target
	python3 - "$tmp/out" "$tmp/cg" <<'PY'
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
ir = 0
for line in open(sys.argv[2]):
    if line.startswith("summary:") or line.startswith("totals:"):
        ir = int(line.split()[1])
print(ir, d["requests"])
PY
}

if [ "${INSTR:-0}" = 1 ]; then
	command -v valgrind >/dev/null || { echo "bench-metrics: INSTR=1 needs valgrind" >&2; exit 1; }
	echo "| case | metrics on, instructions per request | compiled out | on - off |"
	echo "|---|---:|---:|---:|"
	for c in $cases; do
		proto=${c%%:*} op=${c##*:}
		read -r ia ra < <(instr "$on" "$proto" "$op")
		read -r ib rb < <(instr "$off" "$proto" "$op")
		python3 -c "import sys; a=$ia/$ra; b=$ib/$rb; print(f'| {sys.argv[1]} {sys.argv[2]} B | {a:,.1f} | {b:,.1f} | {a-b:+,.1f} |')" "$c" "$block"
	done
	exit 0
fi

echo "# $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), $(uname -r); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $rounds pairs of $secs s runs per case, $block-byte requests, order alternating"
: >"$tmp/results"
for c in $cases; do
	proto=${c%%:*} op=${c##*:}
	for r in $(seq "$rounds"); do
		if [ $((r % 2)) -eq 1 ]; then
			a=$(run "$on" "$proto" "$op"); b=$(run "$off" "$proto" "$op")
		else
			b=$(run "$off" "$proto" "$op"); a=$(run "$on" "$proto" "$op")
		fi
		echo "$c $r $a $b" | tee -a "$tmp/results"
	done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$tmp/results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    c, r, on, off = line.split()
    rows.setdefault(c, []).append((float(on), float(off)))
print("| case | metrics on, req/s (median) | metrics compiled out, req/s (median) | median of the pairs' on/off ratios |")
print("|---|---:|---:|---:|")
for c, v in rows.items():
    ratios = [a / b for a, b in v]
    print(f"| {c} 4 KiB | {statistics.median(a for a, _ in v):,.0f} | {statistics.median(b for _, b in v):,.0f} | {statistics.median(ratios):.3f} |")
PY
