#!/usr/bin/env bash
# Runs one libFuzzer harness for a bounded time:
#   run-fuzzer.sh FUZZER NAME SEED_CORPUS REGRESSIONS WORK_DIR
# FUZZ_SECONDS (default 20) bounds the run; FUZZ_JOBS (default 1) runs that
# many fuzzing processes in parallel; FUZZ_MAX_LEN (default 8192) is the
# largest input tried (the JSON readers' harnesses get enough to break every
# limit of te-json.h); FUZZ_DICT names a libFuzzer dictionary. New inputs go to WORK_DIR/corpus (the
# committed seed corpus is only read); a crash leaves its input in
# WORK_DIR/crash-* and fails the run, naming the file to copy into
# tests/fuzz/regressions/NAME/.
set -uo pipefail
fuzzer=$1 name=$2 seeds=$3 regressions=$4 work=$5
seconds=${FUZZ_SECONDS:-20}
jobs=${FUZZ_JOBS:-1}

mkdir -p "$work/corpus"
rm -f "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*
args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="${FUZZ_MAX_LEN:-8192}"
      -print_final_stats=1 -artifact_prefix="$work/")
if [ -n "${FUZZ_DICT:-}" ]; then
  args+=(-dict="$FUZZ_DICT")
fi
if [ "$jobs" -gt 1 ]; then
  args+=(-jobs="$jobs" -workers="$jobs")
fi
# The hard stop covers a fuzzer that hangs outside libFuzzer's own timers.
timeout --kill-after=30 $((seconds + 120)) "$fuzzer" "${args[@]}" "$work/corpus" "$seeds" "$regressions"
rc=$?
found=$(ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* 2>/dev/null)
if [ $rc -ne 0 ] || [ -n "$found" ]; then
  echo "fuzz-$name: the fuzzer failed (exit $rc)"
  for f in $found; do
    echo "  input: $f  (to keep it: cp $f tests/fuzz/regressions/$name/)"
  done
  exit 1
fi
echo "fuzz-$name: $seconds s without a finding; corpus in $work/corpus ($(ls "$work/corpus" | wc -l) inputs)"
