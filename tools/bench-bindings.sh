#!/usr/bin/env bash
# Measures the language bindings beside te-bench in one run: te-bench and each
# binding's bench alternate, case by case, with the same settings (loopback
# over TCP, one thread, batches of 128); prints the medians and their ratios to
# te-bench as a markdown table.
#
#   tools/bench-bindings.sh [BUILD_DIR] [ROUNDS] [SECONDS]
#
# Benches: Python (python/bench/te_bench.py, API "many" and "mooncake", from
# BUILD_DIR/python) and Rust (bindings/rust's `bench` example, built here in
# release mode against BUILD_DIR's libte when cargo is there, or RUST_BENCH).
# All over TCP (--protocol=tcp). CASES="read:4096 write:4096 read:65536
# write:65536" by default.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/bench-lib.sh
bench_args bench-bindings 5 5 "$@"
cases=${CASES:-read:4096 write:4096 read:65536 write:65536}
py=${PYTHON:-/usr/bin/python3}
export PYTHONPATH="$PWD/$build/python${PYTHONPATH:+:$PYTHONPATH}"
export TE_PLUGIN_PATH="$PWD/$build/plugins/transport/tcp"
tebench=$bench
"$py" -c 'import libte' || { echo "bench-bindings: the Python package is not built in $build" >&2; exit 1; }

declare -A runners=(
  [te-bench]="$tebench --protocol=tcp --quiet --json"
  [python]="$py python/bench/te_bench.py --json --api=many"
  [python-mooncake]="$py python/bench/te_bench.py --json --api=mooncake"
)
order=(te-bench python python-mooncake)
if [ -z "${RUST_BENCH:-}" ] && command -v cargo >/dev/null; then
  # Debian's toolchain when present, as the tests use
  cargo=cargo; [ -x /usr/bin/cargo ] && cargo=/usr/bin/cargo && export RUSTC=/usr/bin/rustc
  PKG_CONFIG_PATH="$PWD/$build/meson-uninstalled" CARGO_TARGET_DIR="$PWD/$build/bench-rust" \
    $cargo build --offline --locked --release --quiet --example bench --manifest-path bindings/rust/Cargo.toml \
    && RUST_BENCH="$PWD/$build/bench-rust/release/examples/bench"
fi
if [ -n "${RUST_BENCH:-}" ]; then
  export LD_LIBRARY_PATH="$PWD/$build/libte${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  runners[rust]="$RUST_BENCH --protocol=tcp --quiet --json"
  order+=(rust)
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "bench-bindings: $rounds rounds of $secs s per case and bench; $(nproc) cores; $(uname -r)" >&2
for c in $cases; do
  op=${c%%:*}
  bs=${c##*:}
  for r in $(seq "$rounds"); do
    # a different bench goes first each round: none always runs on a cold machine
    n=${#order[@]}
    rot=("${order[@]:$(( (r - 1) % n ))}" "${order[@]:0:$(( (r - 1) % n ))}")
    for b in "${rot[@]}"; do
      ${runners[$b]} --operation="$op" --block_size="$bs" --batch_size=128 --threads=1 --duration="$secs" \
        | tail -n 1 > "$tmp/$b.$op.$bs.$r.json"
      echo "  $c round $r $b: $(grep -o '"iops": *[0-9.]*' "$tmp/$b.$op.$bs.$r.json")" >&2
    done
  done
done

"$py" - "$tmp" "$rounds" "$cases" "${order[@]}" <<'PY'
import json, statistics, sys
tmp, rounds, cases, benches = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]
def med(b, op, bs, key):
    return statistics.median(json.load(open(f"{tmp}/{b}.{op}.{bs}.{r}.json"))[key] for r in range(1, rounds + 1))
head = "| case | te-bench req/s | te-bench GB/s |" + "".join(f" {b} req/s | ratio |" for b in benches[1:])
print(head)
print("|" + "---|" * (3 + 2 * (len(benches) - 1)))
for c in cases:
    op, bs = c.split(":")
    base = med("te-bench", op, bs, "iops")
    row = f"| {op} {int(bs) // 1024} KiB | {base:,.0f} | {med('te-bench', op, bs, 'throughput_bytes_per_s') / 1e9:.2f} |"
    for b in benches[1:]:
        v = med(b, op, bs, "iops")
        row += f" {v:,.0f} | {v / base:.2f} |"
    print(row)
PY
