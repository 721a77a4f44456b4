#!/usr/bin/env bash
# The KV-cache table of docs/benchmarks.md on this machine: te-bench
# --pattern=kv between two processes (a target, and one initiator per run),
# over TCP with scatter-gather frames (TE_TCP_SG=1, the default) and without
# (TE_TCP_SG=0: one wire request per piece, as before), and over the
# same-host transport; beside each, single-stream iperf3 over loopback (1 MiB writes, as te-bench's large blocks) and
# te-bench's 1 MiB rate of the same run. Rounds alternate every case; the
# summary gives medians with min and max, and the initiator's CPU time per
# descriptor beside its CPU time for as many bytes in 1 MiB blocks (what the
# per-request path costs, which a busy machine's clock hides).
#
#   tools/bench-kv.sh [BUILD_DIR]         (default: build)
#
# Environment: ROUNDS (default 3), DURATION seconds per measurement
# (default 2), TOKENS (default "1024 8192"), CASES (default "tcp-sg0 tcp-sg1 shm"),
# KV_ARGS (extra te-bench flags: the model's shape). Needs iperf3 and python3.
set -euo pipefail

build=${1:-build}
bench=$build/tools/te-bench/te-bench
rounds=${ROUNDS:-3}
duration=${DURATION:-2}
tokens=${TOKENS:-"1024 8192"}
cases=${CASES:-"tcp-sg0 tcp-sg1 shm"}
kv_args=${KV_ARGS:-}

[ -x "$bench" ] || { echo "bench-kv: $bench not found; build first" >&2; exit 1; }
command -v iperf3 >/dev/null || { echo "bench-kv: iperf3 is not installed" >&2; exit 1; }
command -v python3 >/dev/null || { echo "bench-kv: python3 is not installed" >&2; exit 1; }

tmp=$(mktemp -d)
maxtok=$(printf '%s\n' $tokens | sort -n | tail -1)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
iperf3 -s -p "$port" >"$tmp/iperf3-server.log" 2>&1 &
iserver=$!
# shellcheck disable=SC2086
"$bench" --mode=target --protocol=auto --local_server_name=127.0.0.1 --pattern=kv --tokens="$maxtok" \
	--buffer_size=1 $kv_args >"$tmp/target.log" 2>&1 &
target=$!
trap 'kill $iserver $target 2>/dev/null; wait $iserver $target 2>/dev/null; rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM
for _ in $(seq 100); do grep -q "segment name" "$tmp/target.log" && break; sleep 0.1; done
seg=$(sed -n 's/.*segment name \([^ ]*\) .*/\1/p' "$tmp/target.log")
[ -n "$seg" ] || { echo "bench-kv: the target did not start:" >&2; cat "$tmp/target.log" >&2; exit 1; }

echo "# machine: $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), $(uname -r)"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg); $rounds rounds of ${duration} s per figure, alternated"

results=$tmp/results
: >"$results"
for round in $(seq "$rounds"); do
	ip=$(iperf3 -c 127.0.0.1 -p "$port" -t "$duration" -l 1M -J | python3 -c \
		'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9)')
	echo "iperf3 $round $ip" >>"$results"
	for t in $tokens; do
		for c in $cases; do
			proto=${c%%-*}
			sg=1
			[ "$c" = tcp-sg0 ] && sg=0
			# shellcheck disable=SC2086
			out=$(TE_TCP_SG=$sg "$bench" --segment_id="$seg" --local_server_name=127.0.0.1 --protocol="$proto" \
				--pattern=kv --tokens="$t" --duration="$duration" --json --quiet $kv_args)
			echo "$c $t $out" >>"$results"
		done
	done
	echo "# round $round done, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$results" <<'EOF'
import json, statistics, sys
ip, rows = [], {}
for line in open(sys.argv[1]):
    k, a, rest = line.split(" ", 2)
    if k == "iperf3":
        ip.append(float(rest))
        continue
    j = json.loads(rest)
    rows.setdefault((k, int(a)), []).append(j)
def mm(v):
    return "%.2f (%.2f-%.2f)" % (statistics.median(v), min(v), max(v))
print("iperf3 single stream GB/s: %s" % mm(ip))
print("| case | tokens | descriptors | ms per request | us per token | descriptors/s | GB/s | 1 MiB GB/s | vs iperf3 | vs 1 MiB | initiator CPU us per descriptor (1 MiB) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for (k, t), js in rows.items():
    ms = [j["ms_per_request"]["median"] for j in js]
    gb = [j["throughput_bytes_per_s"] / 1e9 for j in js]
    lg = [j["large_bytes_per_s"] / 1e9 for j in js]
    us = [j["us_per_token"] for j in js]
    ds = [j["descriptors_per_s"] / 1e6 for j in js]
    kc = [j["cpu_us_per_descriptor"] for j in js]
    lc = [j["large_cpu_us_per_piece_bytes"] for j in js]
    print("| %s | %d | %d | %s | %.2f | %.2f M | %s | %s | %.2f | %.2f | %.2f (%.2f) |" % (
        k, t, js[0]["descriptors"], mm(ms), statistics.median(us), statistics.median(ds), mm(gb), mm(lg),
        statistics.median(gb) / statistics.median(ip), statistics.median(gb) / statistics.median(lg),
        statistics.median(kc), statistics.median(lc)))
EOF
