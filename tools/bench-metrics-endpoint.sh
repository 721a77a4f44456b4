#!/usr/bin/env bash
# What serving the metrics costs: te-bench 4 KiB reads over TCP (loopback,
# both engines in one process) without the endpoint and with it scraped once
# a second by curl, in pairs whose order alternates (off/on, on/off, ...);
# prints each pair's requests/s, their ratio, and the median ratio.
# The runs with the endpoint also give the CPU time of its thread
# ("te-metrics") against the whole process's, from /proc/PID/task/*/schedstat:
# what serving costs, measured directly rather than through two noisy rates.
#   [BUILD_DIR=build] [ROUNDS=6] [RUN_SECONDS=5] tools/bench-metrics-endpoint.sh
set -uo pipefail
build=${BUILD_DIR:-build}
rounds=${ROUNDS:-6}
secs=${RUN_SECONDS:-5}
bench=$build/tools/te-bench/te-bench
[ -x "$bench" ] || { echo "no $bench: build first (meson setup $build && ninja -C $build)"; exit 2; }
command -v curl >/dev/null || { echo "curl is needed"; exit 2; }
export TE_PLUGIN_PATH=${TE_PLUGIN_PATH:-$build/plugins/transport/tcp:$build/plugins/exporter/prometheus}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# free_port: the tests' own (a port below the kernel's ephemeral range).
. "$(dirname "$0")/../tests/common/poll.sh"

# cpu_ns PID: "EXPORTER_NS ALL_NS", the nanoseconds on a CPU of the process's
# exporter thread and of all its threads alive now.
cpu_ns() {
  local t ex=0 all=0 comm ns
  for t in /proc/"$1"/task/*; do
    comm=$(cat "$t/comm" 2>/dev/null) || continue
    read -r ns _ <"$t/schedstat" 2>/dev/null || continue
    all=$((all + ns))
    [ "$comm" = te-metrics ] && ex=$((ex + ns))
  done
  echo "$ex $all"
}

# One run; prints its requests/s. $1: off or on.
one() {
  local extra=() port pid scrapes=0
  if [ "$1" = on ]; then
    port=$(free_port)
    extra=(--metrics_addr="127.0.0.1:$port")
  fi
  "$bench" --protocol=tcp --block_size=4096 --duration="$secs" --json --quiet "${extra[@]}" \
    >"$tmp/out" 2>"$tmp/err" &
  pid=$!
  if [ "$1" = on ]; then
    local cpu="0 0" now
    while kill -0 "$pid" 2>/dev/null; do
      curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$port/metrics" && scrapes=$((scrapes + 1))
      now=$(cpu_ns "$pid")
      [ "${now#* }" != 0 ] && cpu=$now # the last reading before the process ends
      sleep 1
    done
    echo "$scrapes" >"$tmp/scrapes"
    echo "$cpu" >>"$tmp/cpu"
  fi
  wait "$pid" || { echo "te-bench failed: $(cat "$tmp/err")" >&2; exit 1; }
  sed -n 's/.*"iops":\([0-9]*\).*/\1/p' "$tmp/out"
}

ratios=()
printf '%-5s %14s %14s %8s %8s\n' pair 'off req/s' 'on req/s' ratio scrapes
for r in $(seq "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then
    off=$(one off); on=$(one on)
  else
    on=$(one on); off=$(one off)
  fi
  ratio=$(awk -v a="$on" -v b="$off" 'BEGIN { printf "%.4f", a / b }')
  ratios+=("$ratio")
  printf '%-5s %14s %14s %8s %8s\n' "$r" "$off" "$on" "$ratio" "$(cat "$tmp/scrapes")"
done
awk '{ ex += $1; all += $2 } END { if (all > 0)
  printf "exporter thread: %.3f ms of CPU in %.0f ms of the process'"'"'s CPU (%.4f %%) over the runs with the endpoint\n",
    ex / 1e6, all / 1e6, 100 * ex / all }' "$tmp/cpu"
printf '%s\n' "${ratios[@]}" | sort -n | awk '{ v[NR] = $1 } END {
  m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
  printf "median ratio (on/off) %.4f over %d pairs; quartiles %.4f..%.4f\n", m, NR, v[int((NR + 3) / 4)], v[int((3 * NR + 3) / 4)] }'
