#!/usr/bin/env bash
# The same-host transport beside TCP and beside memcpy, in one run: a te-bench
# target process and a te-bench initiator process on this machine, reads and
# writes of 4 KiB, 64 KiB and 1 MiB blocks in batches of 128, over
#   shm, shared   (target memory from te_mem_alloc: the initiator maps it)
#   shm, attach   (anonymous target memory: cross-memory attach)
#   tcp           (--protocol=tcp on both sides)
# and memcpy of the same blocks with 1 and 2 threads (the ceiling). Each figure
# is the median of ROUNDS alternated runs; prints a markdown table.
#
#   tools/bench-shm.sh [BUILD_DIR] [ROUNDS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/bench-lib.sh
bench_args bench-shm 5 5 "$@"
cases=${CASES:-read:4096 write:4096 read:65536 write:65536 read:1048576 write:1048576}
mcpy=$build/tests/shm/memcpy-bench
[ -x "$mcpy" ] || { echo "bench-shm: $mcpy not built" >&2; exit 1; }
export TE_PLUGIN_PATH="$PWD/$build/plugins/transport/tcp:$PWD/$build/plugins/transport/shm"
tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}" $(cat "$tmp/pids" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

# target PROTOCOL MEMORY -> its segment name on stdout
target() {
	"$bench" --mode=target --local_server_name=127.0.0.1 --protocol="$1" --memory="$2" --buffer_size=256M \
		>"$tmp/target.$1.$2" 2>&1 &
	echo $! >>"$tmp/pids" # this runs in a $(...) subshell: the parent reads the file
	local n
	n=$(bench_target_name "$tmp/target.$1.$2")
	[ -n "$n" ] && { echo "$n"; return; }
	echo "bench-shm: target ($1, $2) did not start" >&2
	exit 1
}
t_shared=$(target auto libte)
t_attach=$(target auto anonymous)
t_tcp=$(target tcp anonymous)

echo "bench-shm: $rounds rounds of $secs s; $(nproc) CPUs; $(uname -r); load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for c in $cases; do
	op=${c%%:*} bs=${c##*:}
	for r in $(seq "$rounds"); do
		"$bench" --segment_id="$t_shared" --operation="$op" --block_size="$bs" --duration="$secs" --quiet --json \
			>"$tmp/shared.$op.$bs.$r"
		"$bench" --segment_id="$t_attach" --memory=anonymous --operation="$op" --block_size="$bs" \
			--duration="$secs" --quiet --json >"$tmp/attach.$op.$bs.$r"
		"$bench" --segment_id="$t_tcp" --protocol=tcp --memory=anonymous --operation="$op" --block_size="$bs" \
			--duration="$secs" --quiet --json >"$tmp/tcp.$op.$bs.$r"
		"$mcpy" "$bs" 1 "$secs" >"$tmp/mc1.$op.$bs.$r"
		"$mcpy" "$bs" 2 "$secs" >"$tmp/mc2.$op.$bs.$r"
		echo "  $c round $r: shm $(grep -o '"transport":"[a-z]*"' "$tmp/shared.$op.$bs.$r")," \
			"attach $(grep -o '"transport":"[a-z]*"' "$tmp/attach.$op.$bs.$r")" >&2
	done
done
echo "bench-shm: load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "$tmp" "$rounds" "$cases" <<'PY'
import json, statistics, sys
tmp, rounds, cases = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def med(kind, op, bs, key):
    vals = []
    for r in range(1, rounds + 1):
        d = json.loads(open(f"{tmp}/{kind}.{op}.{bs}.{r}").read().strip().splitlines()[-1])
        if kind in ("shared", "attach", "tcp"):
            want = "tcp" if kind == "tcp" else "shm"
            assert d["transport"] == want, (kind, d["transport"])
        vals.append(d[key])
    return statistics.median(vals)
print("| case | shm shared GB/s | req/s | shm attach GB/s | req/s | TCP GB/s | req/s | memcpy 1 thread GB/s | memcpy 2 threads GB/s | shared / TCP | shared / memcpy 2 threads |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for c in cases:
    op, bs = c.split(":")
    g = lambda k: med(k, op, bs, "throughput_bytes_per_s") / 1e9
    q = lambda k: med(k, op, bs, "iops")
    size = f"{int(bs) // 1024} KiB" if int(bs) < 1 << 20 else f"{int(bs) >> 20} MiB"
    print(f"| {op} {size} | {g('shared'):.2f} | {q('shared'):,.0f} | {g('attach'):.2f} | {q('attach'):,.0f} | "
          f"{g('tcp'):.2f} | {q('tcp'):,.0f} | {g('mc1'):.2f} | {g('mc2'):.2f} | {g('shared') / g('tcp'):.2f} | "
          f"{g('shared') / g('mc2'):.2f} |")
PY
