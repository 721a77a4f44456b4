#!/usr/bin/env bash
# A real Prometheus scrapes a te-bench initiator (--metrics_addr) moving
# data over TCP to a te-bench target; after the run has ended the sum it
# stores equals, to the byte, what te-bench reports. On the way: promtool
# accepts a scraped body and te-top shows non-zero throughput.
#   prometheus.sh TE_BENCH TE_TOP [DASHBOARD]
# With DASHBOARD (docs/grafana-libte.json) every query of its panels must be
# valid PromQL and the throughput panel's must find the run.
# Exits 77 (skipped) without prometheus and promtool (Debian: prometheus).
set -uo pipefail
bench=${1:?usage: prometheus.sh TE_BENCH TE_TOP}
top=${2:?usage: prometheus.sh TE_BENCH TE_TOP}
dashboard=${3:-}
for p in prometheus promtool curl python3; do
  command -v "$p" >/dev/null || { echo "SKIP: $p is not installed"; exit 77; }
done

dir=$(mktemp -d /tmp/te-prometheus.XXXXXX)
pids=()
. "$(dirname "$0")/../common/poll.sh" # free_port, stop_pids
cleanup() {
  stop_pids "${pids[@]}"
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$dir"/*.out "$dir"/*.err; do [ -s "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done
  exit 1
}

# Waits up to $2 seconds for file $1 to hold a line matching $3.
wait_for() {
  local end=$((SECONDS + $2))
  while [ $SECONDS -lt $end ]; do
    grep -qE "$3" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}


"$bench" --mode=target --protocol=tcp --local_server_name=127.0.0.1 --buffer_size=16M \
  >"$dir/target.out" 2>"$dir/target.err" &
pids+=($!)
wait_for "$dir/target.out" 20 'segment name' || fail "the target did not start"
seg=$(sed -n 's/.*segment name \([^ ]*\) .*/\1/p' "$dir/target.out")

query() {
  curl -sS --max-time 2 --get "$api/query" --data-urlencode "query=$1" 2>/dev/null |
    python3 -c 'import json,sys
try:
    r = json.load(sys.stdin)["data"]["result"]  # bounded: a local Prometheus, one series
    print(r[0]["value"][1] if r else "none")
except Exception:
    print("none")'
}

# Prometheus first, so that it scrapes all through the run: the endpoint's
# port is chosen here.
pport=$(free_port)
mport=$(free_port)
[ -n "$pport" ] && [ -n "$mport" ] && [ "$pport" != "$mport" ] || fail "no free ports"
cat >"$dir/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: te-bench
    static_configs:
      - targets: ['127.0.0.1:$mport']
EOF
promtool check config "$dir/prometheus.yml" >"$dir/promtool-config.out" 2>&1 ||
  fail "promtool rejects the configuration"
prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
  --web.listen-address="127.0.0.1:$pport" --log.level=warn >"$dir/prometheus.out" 2>"$dir/prometheus.err" &
pids+=($!)
api="http://127.0.0.1:$pport/api/v1"
ready_by=$((SECONDS + 60))
until curl -sf --max-time 1 "http://127.0.0.1:$pport/-/ready" >/dev/null; do
  [ $SECONDS -lt $ready_by ] || fail "Prometheus did not get ready"
  sleep 0.2
done
# Its discovery hands the target over some seconds after start: the run
# begins once a first scrape (of nothing yet: up is 0) is stored.
until [ "$(query 'up{job="te-bench"}')" != none ]; do
  [ $SECONDS -lt $ready_by ] || fail "Prometheus did not scrape"
  sleep 0.2
done

# 6 s of 4 KiB reads, then 12 s more with the endpoint up and idle. Without
# TE_LOG_LEVEL te-bench prints the endpoint's URL.
env -u TE_LOG_LEVEL "$bench" --segment_id="$seg" --protocol=tcp --local_server_name=127.0.0.1 \
  --block_size=4096 --batch_size=32 --buffer_size=16M --duration=6 --json --quiet \
  --metrics_addr="127.0.0.1:$mport" --metrics_linger=12 >"$dir/bench.out" 2>"$dir/bench.err" &
bench_pid=$!
pids+=($bench_pid)
wait_for "$dir/bench.err" 20 'metrics at http' || fail "te-bench printed no metrics URL"
url=$(grep -o 'http://[^ ]*/metrics' "$dir/bench.err" | head -1)
[ "$url" = "http://127.0.0.1:$mport/metrics" ] || fail "te-bench serves at $url, not at port $mport"

# te-top while the run lasts: three views, throughput above zero.
"$top" --count=3 "$url" >"$dir/top.out" 2>"$dir/top.err" &
top_pid=$!
pids+=($top_pid)

# A body the format's own linter accepts, served with the format's type.
curl -sS -D "$dir/scrape.head" -o "$dir/scrape.txt" --max-time 5 "$url" || fail "cannot scrape $url"
grep -qi '^Content-Type: text/plain; version=0.0.4; charset=utf-8' "$dir/scrape.head" ||
  fail "wrong content type: $(cat "$dir/scrape.head")"
promtool check metrics <"$dir/scrape.txt" >"$dir/promtool.out" 2>&1 ||
  fail "promtool check metrics: $(cat "$dir/promtool.out")"
grep -q '^te_transfer_bytes_total{.*transport="tcp",op="read"}' "$dir/scrape.txt" ||
  fail "no tcp read bytes in the scrape"

wait "$top_pid" || fail "te-top failed: $(cat "$dir/top.err")"
rate=$(awk '$1 == "tcp" && $2 == "read" && $3 + 0 > 0 { n++ } END { print n + 0 }' "$dir/top.out")
[ "$rate" -ge 2 ] || fail "te-top showed no tcp read throughput in 3 views: $(cat "$dir/top.out")"
views=$(grep -c '^[0-9][0-9]:[0-9][0-9]:[0-9][0-9] ' "$dir/top.out")
[ "$views" -eq 3 ] || fail "te-top printed $views views, not 3"

# The run's end: te-bench prints its totals, then lingers.
wait_for "$dir/bench.out" 20 '"bytes":' || fail "te-bench printed no result"
want=$(python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["bytes"]))' "$dir/bench.out")
[ "$want" -gt 0 ] || fail "te-bench moved nothing"

# Every scrape from now on reads the final counts: the stored sum must
# reach exactly te-bench's figure within a few scrape intervals.
got=none
end=$((SECONDS + 10))
while [ $SECONDS -lt $end ]; do
  got=$(query 'sum(te_transfer_bytes_total{job="te-bench",transport="tcp",op="read"})')
  [ "$got" = "$want" ] && break
  sleep 0.5
done
[ "$got" = "$want" ] || fail "Prometheus holds $got bytes, te-bench reports $want"
# ... after having watched it grow: several scrapes while it ran.
n=$(query 'count_over_time(te_transfer_bytes_total{job="te-bench",transport="tcp",op="read"}[1m])')
[ "${n%.*}" != none ] && [ "${n%.*}" -ge 3 ] 2>/dev/null ||
  fail "only $n scrapes stored (of $(query 'count_over_time(up[1m])') tried, $(query 'sum_over_time(up[1m])') up, the slowest $(query 'max_over_time(scrape_duration_seconds[1m])') s)"
reqs=$(query 'sum(te_transfer_requests_total{job="te-bench",transport="tcp",op="read"})')
[ "$reqs" = "$((want / 4096))" ] || fail "Prometheus holds $reqs requests, te-bench made $((want / 4096))"

if [ -n "$dashboard" ]; then
  python3 - "$dashboard" "$api" >"$dir/dashboard.out" 2>&1 <<'PY' || fail "the dashboard: $(cat "$dir/dashboard.out")"
import json, sys, urllib.parse, urllib.request
dash, api = sys.argv[1], sys.argv[2]
panels = json.load(open(dash))["panels"]  # bounded: a file of this repository
bad = 0
for p in panels:
    for t in p["targets"]:
        q = t["expr"].replace("$__rate_interval", "1m").replace("$segment", ".*")
        url = api + "/query?" + urllib.parse.urlencode({"query": q})
        r = json.load(urllib.request.urlopen(url, timeout=5))  # bounded: the local Prometheus
        if r.get("status") != "success":
            print("refused:", q, r); bad = 1
        elif p["title"].startswith("Throughput per transport") and not r["data"]["result"]:
            print("no data:", q); bad = 1
print(len(panels), "panels checked")
sys.exit(bad)
PY
fi
kill -0 "$bench_pid" 2>/dev/null || fail "te-bench ended before its linger"
echo "ok: Prometheus holds $got bytes and $reqs requests, as te-bench reports; te-top showed $rate views of tcp reads${dashboard:+; dashboard: $(tail -1 "$dir/dashboard.out")}"
