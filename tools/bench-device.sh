#!/usr/bin/env bash
# The cost of staging device memory, in one run: te-bench in loopback mode
# (both engines in one process, TCP on 127.0.0.1) moving host memory to host
# memory, and device memory to device memory (--use_vram, both sides) of the
# test device plugin, whose copies are plain memory copies through a second
# mapping (tests/device/testdev.c). Reads and writes of 64 KiB and 1 MiB in
# batches of 128, alternated round by round; each figure is the median of
# ROUNDS runs; prints a markdown table with the device/host ratio.
#
#   tools/bench-device.sh [BUILD_DIR] [ROUNDS] [SECONDS]
#
# A real GPU's copy engines change the picture (see docs/gpu.md): there,
# run the same te-bench commands with --use_vram (cuda) instead.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-5}
secs=${3:-3}
cases=${CASES:-read:65536 write:65536 read:1048576 write:1048576}
bench=$build/tools/te-bench/te-bench
[ -x "$bench" ] || { echo "bench-device: $bench not built" >&2; exit 1; }
[ -e "$build/tests/device/libte-device-testdev.so" ] || { echo "bench-device: the test device plugin is not built" >&2; exit 1; }
export TE_PLUGIN_PATH="$PWD/$build/tests/device:$PWD/$build/plugins/tcp"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "bench-device: $rounds rounds of $secs s; $(nproc) CPUs; $(uname -r); load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for c in $cases; do
	op=${c%%:*} bs=${c##*:}
	for r in $(seq "$rounds"); do
		"$bench" --protocol=tcp --memory=anonymous --operation="$op" --block_size="$bs" \
			--buffer_size=256M --duration="$secs" --quiet --json >"$tmp/host.$op.$bs.$r"
		"$bench" --protocol=tcp --use_vram --vram_device=testdev --operation="$op" --block_size="$bs" \
			--buffer_size=256M --duration="$secs" --quiet --json >"$tmp/dev.$op.$bs.$r"
		echo "  $c round $r done" >&2
	done
done
echo "bench-device: load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "$tmp" "$rounds" "$cases" <<'PY'
import json, statistics, sys
tmp, rounds, cases = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def med(kind, op, bs, key):
    return statistics.median(
        json.loads(open(f"{tmp}/{kind}.{op}.{bs}.{r}").read().strip().splitlines()[-1])[key]
        for r in range(1, rounds + 1))
print("| case | host→host GB/s | device→device GB/s | ratio |")
print("|---|---:|---:|---:|")
for c in cases:
    op, bs = c.split(":")
    h, d = (med(k, op, bs, "throughput_bytes_per_s") / 1e9 for k in ("host", "dev"))
    size = f"{int(bs) // 1024} KiB" if int(bs) < 1 << 20 else f"{int(bs) >> 20} MiB"
    print(f"| {op} {size} | {h:.2f} | {d:.2f} | {d / h:.2f} |")
PY
