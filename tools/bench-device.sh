#!/usr/bin/env bash
# The cost of staging device memory, in one run: te-bench in loopback mode
# (both engines in one process, TCP on 127.0.0.1) moving host memory to host
# memory, and device memory to device memory (--use_vram, both sides) of the
# test device plugin, whose copies are plain memory copies through a second
# mapping (tests/device/testdev.c). Reads and writes of 64 KiB and 1 MiB in
# batches of 128.
#
#   tools/bench-device.sh [BUILD_DIR] [ROUNDS] [SECONDS]
#
# Each round runs host, device, device, host (so that a drift of the
# machine's speed during the round weighs on both kinds alike) and gives two
# paired device/host ratios. Printed per case: the medians of each kind, the
# median of the paired ratios and their quartiles. On a shared machine whose
# speed wanders by tens of percent from minute to minute the paired ratios
# are the figure to read; the ratio of the medians is shown beside them.
#
# Environment: CASES (default "read:65536 write:65536 read:1048576
# write:1048576"), BENCH_ENV (variables for every run, such as
# "TE_TCP_WINDOW=2097152"), DEVICE_ENV (for the device runs only, such as
# "TE_STAGE_BUFFERS=128" or "TE_TESTDEV_SMALL_PAGES=1").
#
# A real GPU's copy engines change the picture (see docs/gpu.md): there,
# run the same te-bench commands with --use_vram (cuda) instead.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/bench-lib.sh
bench_args bench-device 5 3 "$@"
cases=${CASES:-read:65536 write:65536 read:1048576 write:1048576}
read -r -a hostenv <<<"${BENCH_ENV:-}"
read -r -a devenv <<<"${BENCH_ENV:-} ${DEVICE_ENV:-}"
[ -e "$build/tests/device/libte-device-testdev.so" ] || { echo "bench-device: the test device plugin is not built" >&2; exit 1; }
export TE_PLUGIN_PATH="$PWD/$build/tests/device:$PWD/$build/plugins/transport/tcp"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run() { # kind op bs out
	local kind=$1 op=$2 bs=$3 out=$4
	if [ "$kind" = host ]; then
		env "${hostenv[@]}" "$bench" --protocol=tcp --memory=anonymous --operation="$op" --block_size="$bs" \
			--buffer_size=256M --duration="$secs" --quiet --json >"$out"
	else
		env "${devenv[@]}" "$bench" --protocol=tcp --use_vram --vram_device=testdev --operation="$op" \
			--block_size="$bs" --buffer_size=256M --duration="$secs" --quiet --json >"$out"
	fi
}

echo "bench-device: $rounds rounds of 4 runs of $secs s; $(nproc) CPUs; $(uname -r); load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
bench_abba host dev
echo "bench-device: load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "$tmp" "$rounds" "$cases" <<'PY'
import json, statistics, sys
tmp, rounds, cases = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def gbs(kind, op, bs, r, half):
    line = open(f"{tmp}/{kind}.{op}.{bs}.{r}.{half}").read().strip().splitlines()[-1]
    return json.loads(line)["throughput_bytes_per_s"] / 1e9
def quartiles(v):
    q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
    return q[0], q[2]
print("| case | host→host GB/s | device→device GB/s | ratio of medians | paired ratio: median | quartiles |")
print("|---|---:|---:|---:|---:|---:|")
for c in cases:
    op, bs = c.split(":")
    host, dev, ratios = [], [], []
    for r in range(1, rounds + 1):
        for half in "ab":
            h, d = gbs("host", op, bs, r, half), gbs("dev", op, bs, r, half)
            host.append(h)
            dev.append(d)
            ratios.append(d / h)
    size = f"{int(bs) // 1024} KiB" if int(bs) < 1 << 20 else f"{int(bs) >> 20} MiB"
    hm, dm = statistics.median(host), statistics.median(dev)
    lo, hi = quartiles(ratios)
    print(f"| {op} {size} | {hm:.2f} | {dm:.2f} | {dm / hm:.2f} | {statistics.median(ratios):.2f} | {lo:.2f}–{hi:.2f} |")
PY
