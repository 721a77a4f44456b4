#!/usr/bin/env bash
# The staging choices on a GPU machine, in one pass from a bundle of
# tools/gpu-bundle.sh: te-bench between a target and an initiator process,
# both in device memory (cuda:0), over TCP, reads and writes of 64 KiB and
# 1 MiB (batch 128, one thread), under each variant of the initiator's
# staging (TE_STAGE_BUFFERS, TE_STAGE_CHUNK_BYTES), of the CUDA plugin's
# waits (TE_CUDA_WAIT) and of its gather kernel (TE_CUDA_GATHER=host), these
# two on both sides, and the hand-over of a burst's chunks (TE_STAGE_BURST=0:
# one by one, as before plugin ABI 1.7); host memory beside them.
# Medians of GPU_SWEEP_ROUNDS (2) runs of GPU_SWEEP_SECS (2) seconds, every
# run with a 60 s timeout. About 4 minutes.
#
#   tools/gpu-stage-sweep.sh [BUNDLE_DIR=.gpu] [OUT_DIR=$OUT or ./gpu-sweep-out]
#
# Writes OUT_DIR/sweep.md (the table) and OUT_DIR/sweep.log.
set -euo pipefail
bundle=${1:-.gpu}
out=${2:-${OUT:-./gpu-sweep-out}}
secs=${GPU_SWEEP_SECS:-2}
rounds=${GPU_SWEEP_ROUNDS:-2}
[ -f "$bundle/env.sh" ] || { echo "gpu-stage-sweep: no $bundle/env.sh (tools/gpu-bundle.sh)" >&2; exit 1; }
# shellcheck disable=SC1091
. "$bundle/env.sh"
. "$(dirname "$0")/bench-lib.sh"
mkdir -p "$out"
log=$out/sweep.log
: >"$log"
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"' EXIT

# Starts a target and sets the variable NAME to its segment name. In this
# shell, not in a $(...) subshell, so that the exit trap knows its pid.
target() { # name mem-flags env...
	local n=$1 mem=$2 seg
	shift 2
	env "$@" te-bench --mode=target --protocol=tcp $mem --buffer_size=512M --local_server_name=127.0.0.1 \
		>"$tmp/t.$n" 2>&1 &
	pids+=($!)
	seg=$(bench_target_name "$tmp/t.$n" "$!" 300)
	if [ -z "$seg" ]; then
		echo "target $n did not start: $(cat "$tmp/t.$n")" >&2
		exit 1
	fi
	printf -v "$n" '%s' "$seg"
}
target host "--memory=libte"
target dev "--use_vram"
target spin "--use_vram" TE_CUDA_WAIT=spin
target poll "--use_vram" TE_CUDA_WAIT=poll
target gath "--use_vram" TE_CUDA_GATHER=host
target gpoll "--use_vram" TE_CUDA_GATHER=host TE_CUDA_WAIT=poll

# The staging counts measured before (docs/benchmarks.md) keep two rows for
# reference; the gather kernel for host pieces (TE_CUDA_GATHER=host, on both
# sides: the initiator's staged chunks, the target's device stage) and the
# burst hand-over (the default; TE_STAGE_BURST=0 is the old way) are new.
variants=(
	"host|$host|--memory=libte|GPU_SWEEP=host"
	"64 x 1 MiB (the default)|$dev|--use_vram|GPU_SWEEP=default"
	"256 x 256 KiB|$dev|--use_vram|TE_STAGE_BUFFERS=256 TE_STAGE_CHUNK_BYTES=262144"
	"64 x 1 MiB, waits that poll 20 us first|$poll|--use_vram|TE_CUDA_WAIT=poll"
	"64 x 1 MiB, spinning waits|$spin|--use_vram|TE_CUDA_WAIT=spin"
	"64 x 1 MiB, the gather kernel for staged pieces (TE_CUDA_GATHER=host)|$gath|--use_vram|TE_CUDA_GATHER=host"
	"the same, waits that poll 20 us first|$gpoll|--use_vram|TE_CUDA_GATHER=host TE_CUDA_WAIT=poll"
	"256 x 256 KiB, the gather kernel for staged pieces|$gath|--use_vram|TE_CUDA_GATHER=host TE_STAGE_BUFFERS=256 TE_STAGE_CHUNK_BYTES=262144"
	"64 x 1 MiB, chunks handed to TCP one by one (TE_STAGE_BURST=0)|$dev|--use_vram|TE_STAGE_BURST=0"
)
cases=("read 1048576" "read 65536" "write 1048576" "write 65536")
for v in "${variants[@]}"; do echo "${v%%|*}"; done >"$tmp/labels"
for r in $(seq "$rounds"); do
	for v in "${!variants[@]}"; do
		IFS='|' read -r label seg mem vars <<<"${variants[$v]}"
		for c in "${!cases[@]}"; do
			read -r op bs <<<"${cases[$c]}"
			f=$tmp/r.$v.$c.$r
			# shellcheck disable=SC2086
			if timeout 60 env $vars te-bench --segment_id="$seg" --protocol=tcp $mem --buffer_size=256M \
				--operation="$op" --block_size="$bs" --batch_size=128 --duration="$secs" --quiet --json \
				>"$f" 2>"$f.err"; then
				g=$(sed -n 's/.*"throughput_bytes_per_s":\([0-9.e+]*\).*/\1/p' "$f" | tail -1)
				echo "$g" >"$f.gbs"
			else
				echo "FAILED" >"$f.gbs"
			fi
			echo "r$r [$label] $op $bs: $(cat "$f.gbs") $(tail -1 "$f.err")" | tee -a "$log"
		done
	done
done
python3 - "$tmp" "$rounds" "${#variants[@]}" "${#cases[@]}" >"$out/sweep.md" <<'PY'
import statistics, sys
tmp, rounds, nv, nc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
labels = open(f"{tmp}/labels").read().split("\n")
heads = ["read 1 MiB", "read 64 KiB", "write 1 MiB", "write 64 KiB"]
def med(v, c):
    xs = []
    for r in range(1, rounds + 1):
        s = open(f"{tmp}/r.{v}.{c}.{r}.gbs").read().strip()
        if s != "FAILED" and s:
            xs.append(float(s) / 1e9)
    return statistics.median(xs) if xs else None
host = [med(0, c) for c in range(nc)]
print("| initiator's staging (TCP, device memory both sides) | " + " | ".join(heads) + " |")
print("|---|" + "---:|" * nc)
for v in range(nv):
    cells = []
    for c in range(nc):
        m = med(v, c)
        if m is None:
            cells.append("FAILED")
        elif v == 0:
            cells.append(f"{m:.2f} GB/s")
        else:
            cells.append(f"{m:.2f} ({m / host[c]:.2f})" if host[c] else f"{m:.2f}")
    print(f"| {labels[v]} | " + " | ".join(cells) + " |")
PY
