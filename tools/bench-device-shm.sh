#!/usr/bin/env bash
# Device memory between two processes of this host: a te-bench target and a
# te-bench initiator, both on the test device plugin's memory (--use_vram
# --vram_device=testdev), over the same-host transport (the initiator opens
# the target's device allocation and copies with the device plugin; its own
# device memory is staged) against TCP over 127.0.0.1 (staged on both
# sides). Reads and writes of 64 KiB and 1 MiB in batches of 128.
#
#   tools/bench-device-shm.sh [BUILD_DIR] [ROUNDS] [SECONDS]
#
# Each round runs tcp, shm, shm, tcp and gives two paired shm/tcp ratios;
# printed per case: each transport's median and the paired ratios' median
# and quartiles. The test device's copies are CPU copies: on a GPU machine
# run the same te-bench commands with --use_vram (cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/bench-lib.sh
bench_args bench-device-shm 5 3 "$@"
cases=${CASES:-read:65536 write:65536 read:1048576 write:1048576}
[ -e "$build/tests/device/libte-device-testdev.so" ] || { echo "bench-device-shm: the test device plugin is not built" >&2; exit 1; }
export TE_PLUGIN_PATH="$PWD/$build/tests/device:$PWD/$build/plugins/transport/tcp:$PWD/$build/plugins/transport/shm"
tmp=$(mktemp -d)
target=
trap '[ -n "$target" ] && kill "$target" 2>/dev/null; rm -rf "$tmp"' EXIT
vram=(--use_vram --vram_device=testdev --buffer_size=256M)

run() { # protocol op bs out: one initiator against a fresh target
	local proto=$1 op=$2 bs=$3 out=$4 name=
	"$bench" --mode=target --protocol="$proto" "${vram[@]}" --local_server_name=127.0.0.1 >"$tmp/target.out" 2>&1 &
	target=$!
	name=$(bench_target_name "$tmp/target.out")
	[ -n "$name" ] || { echo "bench-device-shm: the target did not start: $(cat "$tmp/target.out")" >&2; exit 1; }
	"$bench" --segment_id="$name" --protocol="$proto" "${vram[@]}" --operation="$op" --block_size="$bs" \
		--duration="$secs" --quiet --json >"$out"
	kill "$target"
	wait "$target" 2>/dev/null || true
	target=
}

echo "bench-device-shm: $rounds rounds of 4 runs of $secs s; $(nproc) CPUs; $(uname -r); load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
bench_abba tcp shm

python3 - "$tmp" "$rounds" "$cases" <<'PY'
import json, statistics, sys
tmp, rounds, cases = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def result(proto, op, bs, r, half):
    last = open(f"{tmp}/{proto}.{op}.{bs}.{r}.{half}").read().strip().splitlines()[-1]
    return json.loads(last)
print("| case | TCP GB/s | same-host GB/s | paired ratio: median | quartiles |")
print("|---|---:|---:|---:|---:|")
for c in cases:
    op, bs = c.split(":")
    runs = [(result("tcp", op, bs, r, h), result("shm", op, bs, r, h)) for r in range(1, rounds + 1) for h in "ab"]
    assert all(s["transport"] == "shm" and t["transport"] == "tcp" for t, s in runs), "a run used another transport"
    tcp = [t["throughput_bytes_per_s"] / 1e9 for t, _ in runs]
    shm = [s["throughput_bytes_per_s"] / 1e9 for _, s in runs]
    ratios = sorted(s / t for t, s in zip(tcp, shm))
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    size = f"{int(bs) // 1024} KiB" if int(bs) < 1 << 20 else f"{int(bs) >> 20} MiB"
    print(f"| {op} {size} | {statistics.median(tcp):.2f} | {statistics.median(shm):.2f} | "
          f"{statistics.median(ratios):.2f} | {q[0]:.2f}–{q[2]:.2f} |")
PY
