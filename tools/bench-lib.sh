# shellcheck shell=bash disable=SC2154,SC2034
# (cases, rounds and tmp are the sourcing script's; build, rounds, secs and
# bench are set for it)
# Sourced by the tools/bench-*.sh and tools/gpu-*.sh scripts (bash): what
# they do alike around te-bench.
#
#   . "$(dirname "$0")/bench-lib.sh"

# bench_args NAME ROUNDS SECONDS [BUILD_DIR] [ROUNDS] [SECONDS]: the
# arguments the bench scripts take (defaults: build, and the ROUNDS and
# SECONDS given first). Sets build, rounds, secs and bench, BUILD_DIR's
# te-bench, which must be built (else NAME says so and the script ends).
bench_args() {
	local name=$1 r=$2 s=$3
	shift 3
	build=${1:-build}
	rounds=${2:-$r}
	secs=${3:-$s}
	bench=$build/tools/te-bench/te-bench
	[ -x "$bench" ] || { echo "$name: $bench not built" >&2; exit 1; }
}

# bench_target_name LOG [PID] [TRIES]: prints the segment name that a te-bench
# target writes to LOG ("target ready, segment name NAME ..."), looking every
# 0.1 s, TRIES times (default 100, 10 s); gives up early once PID (when given)
# has ended. Prints nothing when no name came.
bench_target_name() {
	local log=$1 pid=${2:-} tries=${3:-100} name=
	for _ in $(seq "$tries"); do
		name=$(sed -n 's/.*segment name \([^ ]*\) .*/\1/p' "$log")
		[ -n "$name" ] && break
		if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
			break
		fi
		sleep 0.1
	done
	printf '%s' "$name"
}

# bench_abba A B: for each case OP:BYTES of $cases, $rounds rounds of four
# runs, A, B, B, A, so that a drift of the machine's speed during a round
# weighs on both alike. Each run is the caller's `run KIND OP BYTES FILE`,
# FILE being $tmp/KIND.OP.BYTES.ROUND.a or .b (two of each kind a round).
bench_abba() {
	local a=$1 b=$2 c op bs r
	for c in $cases; do
		op=${c%%:*} bs=${c##*:}
		for r in $(seq "$rounds"); do
			run "$a" "$op" "$bs" "$tmp/$a.$op.$bs.$r.a"
			run "$b" "$op" "$bs" "$tmp/$b.$op.$bs.$r.a"
			run "$b" "$op" "$bs" "$tmp/$b.$op.$bs.$r.b"
			run "$a" "$op" "$bs" "$tmp/$a.$op.$bs.$r.b"
			echo "  $c round $r done" >&2
		done
	done
}
