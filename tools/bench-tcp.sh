#!/usr/bin/env bash
# Reproduces the TCP tables of docs/benchmarks.md on this machine: te-bench
# over TCP on loopback, with target and initiator in two processes and in one
# (loopback mode), READ and WRITE, beside single-stream iperf3 at the same
# write size, in alternating rounds: each round runs iperf3 and then every
# te-bench case, so that a change in the machine's load weighs on both.
# iperf3 sends one cached buffer over and over; te-bench's batch spans
# block x batch bytes of distinct memory on each side, so each round also
# runs a raw TCP stream over that much memory (tools/latency-pingpong
# `stream`), the wire's speed for memory that is not in the cache.
# Prints, per case, the median, min and max over the rounds, the ratios of
# the medians to iperf3's and to the raw stream's with the lowest ratio of a
# round to its own reference run; then the 4 KiB one-at-a-time latency
# (batch 1, two processes) beside UCX's ucp_put_lat over TCP when
# ucx_perftest is installed.
#
#   tools/bench-tcp.sh [BUILD_DIR]         (default: build)
#
# Environment: DURATION seconds per run (default 5), RUNS rounds (default 5),
# SIZES (default 1048576), BATCH (default 128), THREADS (default 1),
# OPS (default "read write"), MODES (default "two-process loopback"),
# LATENCY (default 1; 0 skips the latency part), TEBENCH_ARGS (extra
# te-bench flags), IDLE_WAIT (default 60: the most seconds to wait for idle
# CPUs before each round). TE_* settings in the environment reach every te-bench.
# Needs iperf3 and python3. Quiet the machine first: the figures are only as
# good as the idle CPUs behind them (the load is printed before and after).
set -euo pipefail

build=${1:-build}
bench=$build/tools/te-bench/te-bench
pingpong=$build/tools/latency-pingpong/pingpong
duration=${DURATION:-5}
runs=${RUNS:-5}
sizes=${SIZES:-1048576}
batch=${BATCH:-128}
threads=${THREADS:-1}
ops=${OPS:-"read write"}
modes=${MODES:-"two-process loopback"}
latency=${LATENCY:-1}

[ -x "$bench" ] || { echo "bench-tcp: $bench not found; build first (meson setup $build && ninja -C $build)" >&2; exit 1; }
command -v iperf3 >/dev/null || { echo "bench-tcp: iperf3 is not installed" >&2; exit 1; }
command -v python3 >/dev/null || { echo "bench-tcp: python3 is not installed" >&2; exit 1; }
[ -x "$pingpong" ] || { echo "bench-tcp: $pingpong not found; build first" >&2; exit 1; }
[ -n "${TE_PLUGIN_PATH:-}" ] || export TE_PLUGIN_PATH="$build/plugins/transport/tcp"

tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
iperf3 -s -p "$port" >"$tmp/iperf3-server.log" 2>&1 &
pids+=("$!")

echo "# machine: $(nproc) CPUs usable, $(lscpu | sed -n 's/^Model name: *//p'), $(uname -r)"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg); $runs rounds of ${duration} s runs"

# One long-lived target per run of the script for the two-process cases.
maxsize=0
for s in $sizes; do [ "$s" -gt "$maxsize" ] && maxsize=$s; done
tbuf=$((maxsize * batch * threads))
[ "$tbuf" -ge $((16 << 20)) ] || tbuf=$((16 << 20))
target=
if [[ " $modes " == *" two-process "* ]] || [ "$latency" = 1 ]; then
	# shellcheck disable=SC2086
	"$bench" --mode=target --local_server_name=127.0.0.1 --protocol=tcp --buffer_size="$tbuf" \
		${TEBENCH_ARGS:-} >"$tmp/target.log" 2>&1 &
	pids+=("$!")
	for _ in $(seq 100); do
		target=$(sed -n 's/.*segment name \([^ ]*\) .*/\1/p' "$tmp/target.log" 2>/dev/null || true)
		[ -n "$target" ] && break
		sleep 0.1
	done
	[ -n "$target" ] || { echo "bench-tcp: the target did not start:" >&2; cat "$tmp/target.log" >&2; exit 1; }
fi

# tebench MODE OP SIZE BATCH SECONDS: one te-bench run's JSON line on stdout
tebench() {
	local seg=()
	[ "$1" = two-process ] && seg=(--segment_id="$target")
	# shellcheck disable=SC2086
	"$bench" "${seg[@]}" --protocol=tcp --json --quiet --duration="$5" --block_size="$3" --operation="$2" \
		--batch_size="$4" --threads="$threads" --buffer_size="$tbuf" ${TEBENCH_ARGS:-} | tail -n 1
}

# Waits (at most IDLE_WAIT s, 60 by default) until the CPUs are at least 90 %
# idle over 2 s; prints
# the idle share seen, which goes into the log of the run.
wait_idle() {
	local a b idle=0 end=$((SECONDS + ${IDLE_WAIT:-60}))
	while [ $SECONDS -lt $end ]; do
		read -ra a </proc/stat
		sleep 2
		read -ra b </proc/stat
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
		# iperf3 writes at most 1 MiB at a time
		isize=$((size > 1048576 ? 1048576 : size))
		iperf3 -c 127.0.0.1 -p "$port" -l "$isize" -t "$duration" -J >"$tmp/iperf.json"
		python3 - "$tmp/iperf.json" "$size" "$run" >>"$results" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print(json.dumps({"kind": "iperf3", "size": int(sys.argv[2]), "round": int(sys.argv[3]),
                  "gbs": d["end"]["sum_received"]["bits_per_second"] / 8e9}))
EOF
		span=$((size * batch * threads))
		span=$(((span + 1048575) / 1048576 * 1048576))
		"$pingpong" stream "$span" "$duration" >"$tmp/stream.json"
		python3 - "$tmp/stream.json" "$size" "$run" >>"$results" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print(json.dumps({"kind": "stream", "size": int(sys.argv[2]), "round": int(sys.argv[3]), "gbs": d["gb_per_s"],
                  "span": d["span"]}))
EOF
		for mode in $modes; do
			for op in $ops; do
				tebench "$mode" "$op" "$size" "$batch" "$duration" >"$tmp/tb.json"
				python3 - "$tmp/tb.json" "$size" "$run" "$mode" >>"$results" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
ps = d.get("per_second_bytes_per_s", {})
print(json.dumps({"kind": "te-bench", "size": int(sys.argv[2]), "round": int(sys.argv[3]), "mode": sys.argv[4],
                  "op": d["operation"], "gbs": d["throughput_bytes_per_s"] / 1e9, "iops": d["iops"],
                  "sec_min": ps.get("min", 0) / 1e9, "sec_max": ps.get("max", 0) / 1e9}))
EOF
			done
		done
		echo "# round $run, $size bytes done (CPUs ${idle}% idle before it, load $(cut -d' ' -f1 /proc/loadavg))" >&2
	done
done

python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = statistics.median
def size_name(n):
    return "%d MiB" % (n >> 20) if n >= 1 << 20 else "%d KiB" % (n >> 10)
ip = {}
for r in rows:
    if r["kind"] == "iperf3":
        ip.setdefault(r["size"], {})[r["round"]] = r["gbs"]
st = {}
for r in rows:
    if r["kind"] == "stream":
        st.setdefault(r["size"], {})[r["round"]] = r["gbs"]
tb = {}
for r in rows:
    if r["kind"] == "te-bench":
        tb.setdefault((r["size"], r["mode"], r["op"]), []).append(r)
print("| block | mode | op | te-bench GB/s median (min-max of rounds) | slowest second .. fastest | "
      "iperf3 GB/s median (min-max) | raw stream GB/s median (min-max) | te-bench / iperf3 (lowest round) | "
      "te-bench / raw stream (lowest round) |")
print("|---|---|---|---|---|---|---|---|---|")
for (size, mode, op), v in sorted(tb.items()):
    g = [x["gbs"] for x in v]
    i = list(ip[size].values())
    s = list(st[size].values())
    ri = [x["gbs"] / ip[size][x["round"]] for x in v]
    rs = [x["gbs"] / st[size][x["round"]] for x in v]
    print("| %s | %s | %s | %.2f (%.2f-%.2f) | %.2f .. %.2f | %.2f (%.2f-%.2f) | %.2f (%.2f-%.2f) | %.2f (%.2f) | %.2f (%.2f) |" % (
        size_name(size), mode, op, med(g), min(g), max(g), min(x["sec_min"] for x in v),
        max(x["sec_max"] for x in v), med(i), min(i), max(i), med(s), min(s), max(s), med(g) / med(i), min(ri),
        med(g) / med(s), min(rs)))
print()
print("Rounds: %d; each round ran iperf3 (one stream, writes of the block size up to 1 MiB) and then every "
      "te-bench case." % len(next(iter(ip.values()))))
for s, v in sorted(ip.items()):
    print("iperf3 %s, GB/s by round: %s" % (size_name(s), ", ".join("%.2f" % v[k] for k in sorted(v))))
for s, v in sorted(st.items()):
    print("raw stream, %s blocks, GB/s by round: %s" % (size_name(s), ", ".join("%.2f" % v[k] for k in sorted(v))))
for (size, mode, op), v in sorted(tb.items()):
    print("te-bench %s %s %s, GB/s by round: %s" % (size_name(size), mode, op,
                                                 ", ".join("%.2f" % x["gbs"] for x in sorted(v, key=lambda x: x["round"]))))
EOF

[ "$latency" = 1 ] || { echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"; exit 0; }

# ------------------------------------------------- one request at a time
echo
echo "4 KiB, batch 1, two processes ($runs runs of ${duration} s; p50 / p99 in us):"
for run in $(seq "$runs"); do
	idle=$(wait_idle)
	tebench two-process read 4096 1 "$duration" >"$tmp/lat.$run.json"
	echo "# latency run $run done (CPUs ${idle}% idle before it)" >&2
done
python3 - "$tmp" "$runs" <<'EOF'
import json, statistics, sys
v = [json.load(open("%s/lat.%d.json" % (sys.argv[1], r)))["latency_us"] for r in range(1, int(sys.argv[2]) + 1)]
p50 = [x["p50"] for x in v]; p99 = [x["p99"] for x in v]
print("libte READ: p50 %.1f (%.1f-%.1f), p99 %.1f (%.1f-%.1f)" % (statistics.median(p50), min(p50), max(p50),
                                                                statistics.median(p99), min(p99), max(p99)))
open(sys.argv[1] + "/lat.med", "w").write("%f %f\n" % (statistics.median(p50), statistics.median(p99)))
EOF
if command -v ucx_perftest >/dev/null; then
	for run in $(seq "$runs"); do
		for rank in 50 99; do
			uport=$(free_port)
			UCX_TLS=tcp timeout 120 ucx_perftest -p "$uport" >"$tmp/ucx.server" 2>&1 &
			spid=$!
			sleep 0.5
			UCX_TLS=tcp timeout 120 ucx_perftest 127.0.0.1 -p "$uport" -t ucp_put_lat -s 4096 -n 10000 -w 500 \
				-R "$rank" >"$tmp/ucx.$run.$rank" 2>&1 || true
			wait "$spid" 2>/dev/null || true
		done
	done
	python3 - "$tmp" "$runs" <<'EOF'
import statistics, sys
# ucp_put_lat reports half a round trip; the round trip is what te-bench's
# batch-1 latency is
def final(f):
    head = None
    for line in open(f):
        if "Stage" in line and "%ile" in line:
            head = [c.strip() for c in line.split("|")][1:]
        elif line.startswith("Final:") and head:
            cols = line.split()
            return 2 * float(cols[next(i for i, c in enumerate(head) if c.endswith("%ile"))])
    return None
t, n = sys.argv[1], int(sys.argv[2])
p50 = [x for x in (final("%s/ucx.%d.50" % (t, r)) for r in range(1, n + 1)) if x]
p99 = [x for x in (final("%s/ucx.%d.99" % (t, r)) for r in range(1, n + 1)) if x]
if not p50 or not p99:
    print("UCX ucp_put_lat (UCX_TLS=tcp): no result")
    sys.exit(0)
m50, m99 = statistics.median(p50), statistics.median(p99)
print("UCX ucp_put_lat round trip (UCX_TLS=tcp): p50 %.1f (%.1f-%.1f), p99 %.1f (%.1f-%.1f)" % (
    m50, min(p50), max(p50), m99, min(p99), max(p99)))
l50, l99 = map(float, open(t + "/lat.med").read().split())
print("libte / UCX: p50 %.2f, p99 %.2f" % (l50 / m50, l99 / m99))
EOF
else
	echo "ucx_perftest is not installed (apt-get install ucx-utils): no UCX figures"
fi
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
