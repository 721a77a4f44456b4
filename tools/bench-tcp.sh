#!/usr/bin/env bash
# Reproduces the TCP table of docs/benchmarks.md on this machine:
# te-bench in loopback mode over TCP (read and write; 4 KiB, 64 KiB, 1 MiB and
# 4 MiB blocks; 1 and 2 submitting threads) next to single-stream iperf3 over
# loopback at the same write size, run alternately, medians of RUNS runs.
#
#   tools/bench-tcp.sh [BUILD_DIR]         (default: build)
#
# Environment: DURATION seconds per run (default 5), RUNS (default 3),
# SIZES (default "4096 65536 1048576 4194304"), THREADS (default "1 2"),
# OPS (default "read write"), TEBENCH_ARGS (extra te-bench flags).
# Needs iperf3 and python3. Quiet the machine first: the figures are only as
# good as the idle CPUs behind them.
set -euo pipefail

build=${1:-build}
bench=$build/tools/te-bench/te-bench
duration=${DURATION:-5}
runs=${RUNS:-3}
sizes=${SIZES:-"4096 65536 1048576 4194304"}
threads=${THREADS:-"1 2"}
ops=${OPS:-"read write"}

[ -x "$bench" ] || { echo "bench-tcp: $bench not found; build first (meson setup $build && ninja -C $build)" >&2; exit 1; }
command -v iperf3 >/dev/null || { echo "bench-tcp: iperf3 is not installed" >&2; exit 1; }
command -v python3 >/dev/null || { echo "bench-tcp: python3 is not installed" >&2; exit 1; }

tmp=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
iperf3 -s -p "$port" >"$tmp/iperf3-server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM
sleep 0.5

echo "# machine: $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), $(uname -r)"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg); ${runs} runs of ${duration} s each, alternated"

# Waits (at most 60 s) until the CPUs are at least 90 % idle over 2 s; prints
# the idle share seen, which goes into the log of the run.
wait_idle() {
	local a b idle=0 end=$((SECONDS + 60))
	while [ $SECONDS -lt $end ]; do
		a=($(head -1 /proc/stat)); sleep 2; b=($(head -1 /proc/stat))
		local tot=0 i
		for i in 1 2 3 4 5 6 7 8; do tot=$((tot + b[i] - a[i])); done
		idle=$((100 * (b[4] - a[4]) / (tot > 0 ? tot : 1)))
		[ $idle -ge 90 ] && break
	done
	echo "$idle"
}

results=$tmp/results
: >"$results"
for run in $(seq "$runs"); do
	for size in $sizes; do
		idle=$(wait_idle)
		# iperf3 sender's rate as seen by the receiver, GB/s; iperf3 writes at
		# most 1 MiB at a time, so larger blocks are set beside its 1 MiB rate
		isize=$((size > 1048576 ? 1048576 : size))
		iperf3 -c 127.0.0.1 -p "$port" -l "$isize" -t "$duration" -J >"$tmp/iperf.json"
		python3 - "$tmp/iperf.json" "$size" >>"$results" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("iperf3", sys.argv[2], "-", "-", d["end"]["sum_received"]["bits_per_second"] / 8e9, 0)
EOF
		for op in $ops; do
			for t in $threads; do
				# shellcheck disable=SC2086
				"$bench" --protocol=tcp --json --quiet --duration="$duration" --block_size="$size" --operation="$op" \
					--threads="$t" ${TEBENCH_ARGS:-} >"$tmp/tb.json"
				python3 - "$tmp/tb.json" "$size" "$op" "$t" >>"$results" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("te-bench", sys.argv[2], sys.argv[3], sys.argv[4], d["throughput_bytes_per_s"] / 1e9, d["iops"])
EOF
			done
		done
		echo "# run $run, $size bytes done (CPUs ${idle}% idle before it)" >&2
	done
done

python3 - "$results" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
def med(xs): return statistics.median(xs)
iperf = {}
for r in rows:
    if r[0] == "iperf3":
        iperf.setdefault(int(r[1]), []).append(float(r[4]))
tb = {}
for r in rows:
    if r[0] == "te-bench":
        tb.setdefault((int(r[1]), r[2], int(r[3])), []).append((float(r[4]), float(r[5])))
def size_name(n):
    return "%d MiB" % (n >> 20) if n >= 1 << 20 else "%d KiB" % (n >> 10)
print("| block | op | threads | te-bench GB/s | te-bench IOPS | iperf3 GB/s (same write size) | ratio | target |")
print("|---|---|---|---|---|---|---|---|")
for (size, op, t), v in sorted(tb.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
    gbs = med([x[0] for x in v]); iops = med([x[1] for x in v]); ip = med(iperf[size])
    ratio = gbs / ip
    if size == 1 << 20:
        target = "ratio >= 0.95: " + ("met" if ratio >= 0.95 else "BELOW")
    elif size == 64 << 10:
        target = "ratio >= 0.85: " + ("met" if ratio >= 0.85 else "BELOW")
    elif size == 4 << 10:
        target = ">= 150000 IOPS: " + ("met" if iops >= 150000 else "BELOW")
    else:
        target = "-"
    print("| %s | %s | %d | %.2f | %.0f | %.2f | %.2f | %s |" % (size_name(size), op, t, gbs, iops, ip, ratio, target))
print()
print("Each figure is the median of %d runs; the iperf3 column is the median of its runs at that size." %
      len(next(iter(iperf.values()))))
print("iperf3 runs, GB/s: " + "; ".join("%s: %s" % (size_name(s), ", ".join("%.2f" % x for x in v))
                                        for s, v in sorted(iperf.items())))
if any(s > 1 << 20 for s in iperf):
    print("iperf3 writes at most 1 MiB at a time: blocks above 1 MiB are set beside its 1 MiB rate.")
EOF
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
