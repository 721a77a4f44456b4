#!/usr/bin/env bash
# What staging device memory costs when the device costs what an H100 does:
# te-bench with --use_vram on the CUDA plugin and the stand-in driver of the
# tests (tests/device/fake-cuda) with its cost model on (FAKE_CUDA_COSTS=h100,
# docs/gpu-model.md), against the same runs on host memory. TCP over
# 127.0.0.1 (loopback: both engines in one process) and the same-host
# transport (a te-bench target and a te-bench initiator), reads and writes of
# 64 KiB and 1 MiB in batches of 128.
#
#   tools/bench-gpu-model.sh [BUILD_DIR] [BASE_BUILD_DIR]
#
# BUILD_DIR (default build) must have built the stand-in driver (-Dcuda not
# disabled). With BASE_BUILD_DIR (another commit's build, for instance
#   git worktree add /tmp/te-base <commit> && meson setup /tmp/te-base/build && ninja -C /tmp/te-base/build
# ) its te-bench and plugins run too, by turns with BUILD_DIR's, both on
# BUILD_DIR's stand-in driver, and the figures are printed side by side.
# Environment: ROUNDS (default 3), SECS (seconds per run, default 2), CASES
# (default "tcp:read:65536 tcp:write:65536 tcp:read:1048576
# tcp:write:1048576 shm:read:65536 shm:write:65536 shm:read:1048576
# shm:write:1048576"), BENCH_ENV (variables for every run), DEVICE_ENV (for
# the device runs only, such as "FAKE_CUDA_CALLBACK_US=40").
# Printed per case and build: the median GB/s of host and device memory
# over the rounds and their ratio (— where a run failed; its error is said
# on stderr). A whole run takes about ROUNDS * cases * 2 * builds * (SECS + 1)
# seconds: about 2 minutes for one build with the defaults, 4 for two.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/bench-lib.sh
build=${1:-build}
base=${2:-}
rounds=${ROUNDS:-3}
secs=${SECS:-2}
cases=${CASES:-tcp:read:65536 tcp:write:65536 tcp:read:1048576 tcp:write:1048576 shm:read:65536 shm:write:65536 shm:read:1048576 shm:write:1048576}
read -r -a benchenv <<<"${BENCH_ENV:-}"
read -r -a devenv <<<"${DEVICE_ENV:-}"
abs() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
build=$(abs "$build")
fake=$build/tests/device/fake-cuda
[ -e "$fake/libcuda.so.1" ] || { echo "bench-gpu-model: $fake/libcuda.so.1 not built" >&2; exit 1; }
builds=("$build")
[ -n "$base" ] && builds+=("$(abs "$base")")
for b in "${builds[@]}"; do
	[ -x "$b/tools/te-bench/te-bench" ] || { echo "bench-gpu-model: $b/tools/te-bench/te-bench not built" >&2; exit 1; }
	[ -e "$b/plugins/device/cuda/libte-device-cuda.so" ] || { echo "bench-gpu-model: $b has no CUDA plugin" >&2; exit 1; }
done
tmp=$(mktemp -d)
target=
trap '[ -n "$target" ] && kill "$target" 2>/dev/null; rm -rf "$tmp"' EXIT

# One run: build index, memory (host|dev), protocol, op, block size, output file.
run() {
	local bi=$1 mem=$2 proto=$3 op=$4 bs=$5 out=$6 b=${builds[$1]} name=
	local bench=$b/tools/te-bench/te-bench
	local -a env=(LD_LIBRARY_PATH="$fake" FAKE_CUDA_COSTS=h100
		TE_PLUGIN_PATH="$b/plugins/transport/tcp:$b/plugins/transport/shm:$b/plugins/device/cuda" "${benchenv[@]}")
	local -a flags=(--protocol="$proto" --buffer_size=256M)
	if [ "$mem" = dev ]; then
		env+=("${devenv[@]}")
		flags+=(--use_vram)
	fi
	if [ "$proto" = tcp ]; then
		env "${env[@]}" "$bench" "${flags[@]}" --operation="$op" --block_size="$bs" --batch_size=128 \
			--duration="$secs" --quiet --json >"$out" 2>"$out.err" || true
		return
	fi
	env "${env[@]}" "$bench" --mode=target "${flags[@]}" --local_server_name=127.0.0.1 >"$tmp/target.out" 2>&1 &
	target=$!
	name=$(bench_target_name "$tmp/target.out")
	[ -n "$name" ] || { echo "bench-gpu-model: the target did not start: $(cat "$tmp/target.out")" >&2; exit 1; }
	env "${env[@]}" "$bench" --segment_id="$name" "${flags[@]}" --operation="$op" --block_size="$bs" \
		--batch_size=128 --duration="$secs" --quiet --json >"$out" 2>"$out.err" || true
	kill "$target"
	wait "$target" 2>/dev/null || true
	target=
}

echo "bench-gpu-model: ${#builds[@]} build(s), $rounds rounds, $secs s a run; $(nproc) CPUs; load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for r in $(seq "$rounds"); do
	for c in $cases; do
		IFS=: read -r proto op bs <<<"$c"
		# host, device for each build; the builds by turns, so that a drift
		# of the machine's speed weighs on all alike.
		for bi in "${!builds[@]}"; do
			for mem in host dev; do
				run "$bi" "$mem" "$proto" "$op" "$bs" "$tmp/$bi.$mem.$proto.$op.$bs.$r"
			done
		done
	done
	echo "  round $r done" >&2
done
echo "bench-gpu-model: load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "$tmp" "$rounds" "$cases" "${builds[@]}" <<'PY'
import json, statistics, sys
tmp, rounds, cases, builds = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]
def gbs(bi, mem, proto, op, bs, r):
    path = f"{tmp}/{bi}.{mem}.{proto}.{op}.{bs}.{r}"
    try:
        res = json.loads(open(path).read().strip().splitlines()[-1])
    except (OSError, IndexError, ValueError):
        try:
            err = open(path + ".err").read().strip().splitlines()[-1:]
        except OSError:
            err = []
        print(f"  (failed run {path.rsplit('/', 1)[1]}: {' '.join(err)})", file=sys.stderr)
        return None
    if res.get("transport") != proto:
        print(f"  (run {path.rsplit('/', 1)[1]} used {res.get('transport')})", file=sys.stderr)
        return None
    return res["throughput_bytes_per_s"] / 1e9
names = ["current"] + (["base"] if len(builds) > 1 else [])
head = "| case |" + "".join(f" {n}: host GB/s | {n}: device GB/s | {n}: device/host |" for n in names)
print(head)
print("|---|" + "---:|---:|---:|" * len(names))
def med(v):
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else None
for c in cases:
    proto, op, bs = c.split(":")
    size = f"{int(bs) // 1024} KiB" if int(bs) < 1 << 20 else f"{int(bs) >> 20} MiB"
    row = f"| {proto} {op} {size} |"
    for bi in range(len(builds)):
        h = med([gbs(bi, "host", proto, op, bs, r) for r in range(1, rounds + 1)])
        d = med([gbs(bi, "dev", proto, op, bs, r) for r in range(1, rounds + 1)])
        fmt = lambda x: "—" if x is None else f"{x:.2f}"
        row += f" {fmt(h)} | {fmt(d)} | {fmt(d / h) if h and d else '—'} |"
    print(row)
print()
for i, b in enumerate(builds):
    print(f"{names[i]}: {b}")
PY
