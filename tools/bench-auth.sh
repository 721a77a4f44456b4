#!/usr/bin/env bash
# What the cluster key costs, in one run: te-bench in loopback mode over TCP,
# without and with --auth_key_file, alternated within each round (the order
# flips every round), 64 KiB throughput and 4 KiB requests per second; each
# figure is the median of ROUNDS runs; prints a markdown table with ratios.
#
#   tools/bench-auth.sh [BUILD_DIR] [ROUNDS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/bench-lib.sh
bench_args bench-auth 9 3 "$@"
export TE_PLUGIN_PATH="$PWD/$build/plugins/transport/tcp"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 32 /dev/urandom | base64 >"$tmp/key"
chmod 600 "$tmp/key"

echo "bench-auth: $rounds rounds of $secs s; $(nproc) CPUs; $(uname -r); load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for bs in 65536 4096; do
	for r in $(seq "$rounds"); do
		order="off on"
		[ $((r % 2)) -eq 0 ] && order="on off"
		for mode in $order; do
			key=()
			[ "$mode" = on ] && key=(--auth_key_file="$tmp/key")
			"$bench" --protocol=tcp --memory=anonymous --block_size="$bs" --buffer_size=256M \
				--duration="$secs" --quiet --json "${key[@]}" >"$tmp/$mode.$bs.$r"
		done
	done
	echo "  $bs done" >&2
done
echo "bench-auth: load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
def med(mode, bs, key):
    return statistics.median(
        json.loads(open(f"{tmp}/{mode}.{bs}.{r}").read().strip().splitlines()[-1])[key]
        for r in range(1, rounds + 1))
print("| case | auth off | auth on | on / off |")
print("|---|---:|---:|---:|")
off, on = (med(m, 65536, "throughput_bytes_per_s") / 1e9 for m in ("off", "on"))
print(f"| 64 KiB READ, GB/s | {off:.2f} | {on:.2f} | {on / off:.3f} |")
off, on = (med(m, 4096, "iops") for m in ("off", "on"))
print(f"| 4 KiB READ, requests/s | {off:,.0f} | {on:,.0f} | {on / off:.3f} |")
PY
