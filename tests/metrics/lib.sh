# Sourced by the metrics scripts (te-top.sh, tls.sh): a scratch folder $dir
# removed at exit with the te-bench it started, fail(), and start_bench.

dir=$(mktemp -d /tmp/te-metrics-test.XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

# start_bench SCHEME [VAR=VALUE...]: $bench over TCP for 12 s (long enough for
# every call of a script, even under a sanitizer on a loaded machine) with its
# metrics on a free loopback port, in the environment given; sets $pid and
# $url (SCHEME://127.0.0.1:PORT/metrics, from its log).
start_bench() {
  local scheme=$1
  shift
  env -u TE_LOG_LEVEL "$@" "$bench" --protocol=tcp --block_size=4096 --batch_size=16 --buffer_size=16M \
    --duration=12 --quiet --json --metrics_addr=127.0.0.1:0 >"$dir/bench.out" 2>"$dir/bench.err" &
  pid=$!
  for _ in $(seq 200); do grep -q 'metrics at http' "$dir/bench.err" && break; sleep 0.1; done
  url=$(grep -o "$scheme://[^ ]*/metrics" "$dir/bench.err" | head -1)
  [ -n "$url" ] || fail "te-bench printed no $scheme metrics URL: $(cat "$dir/bench.err")"
}
