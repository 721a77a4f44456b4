#!/usr/bin/env bash
# Builds libte twice (plain, and with AddressSanitizer + UndefinedBehaviorSanitizer),
# runs every meson test in both builds, then builds the fuzz harnesses with clang
# and libFuzzer (build-fuzz) and runs each for FUZZ_SECONDS (default 5), then
# runs the tests once more under ThreadSanitizer (build-tsan), and prints one
# summary line:
#   N passed, N failed
# Exit status: 0 only when nothing failed.
set -uo pipefail
cd "$(dirname "$0")/.."

jobs=${TE_TEST_JOBS:-$(nproc)}
# The soak's 30 s in CI (the sanitizer builds' 10 s are set by their meson
# test environment); docs/reliability.md has the long command.
export SOAK_SECONDS=${SOAK_SECONDS:-30}
status=0

setup() { # dir, options...
  local dir=$1; shift
  if [ -f "$dir/build.ninja" ]; then
    meson setup --reconfigure "$dir" "$@" >/dev/null
  else
    meson setup "$dir" "$@" >/dev/null
  fi
}

# The tests of a sanitizer build that match a pattern of SANITIZER_SKIP (both
# sanitizers) or TSAN_SKIP (ThreadSanitizer) run in the plain build only: they
# measure (throughput, idle costs, scale, a real Prometheus) or drive for a set
# time code that other tests run under the sanitizers already, and CI has 30
# minutes on two cores (docs/reliability.md lists them and why).
SANITIZER_SKIP=${SANITIZER_SKIP-"tcp-te-bench load-initiators load-flood prometheus scale-* tcp-rail-flap tcp-rail-drop"}
TSAN_SKIP=${TSAN_SKIP-"load-soak te-top nvmeof-register* device-hip-fake device-cuda-fake device-shm"}

# tests_except DIR PATTERNS: the names of DIR's tests that match none of the
# space-separated PATTERNS.
tests_except() {
  local dir=$1 t p
  local -; set -f # patterns for test names, not files
  for t in $(meson test -C "$dir" --list 2>/dev/null | sed -n 's/^libte:.* \/ //p'); do
    for p in $2; do
      # shellcheck disable=SC2053 # a pattern on purpose
      [[ $t == $p ]] && continue 2
    done
    echo "$t"
  done
}

# build_failed DIR LABEL: says so, and leaves a failed result for the summary.
build_failed() {
  echo "$2: build FAILED"
  echo "{\"name\": \"build-$2\", \"result\": \"FAIL\"}" > "$1.buildfail.json"
  return 1
}

run_build() { # dir, label, timeout multiplier, skip patterns, options...
  local dir=$1 label=$2 mult=$3 skip=$4 names=(); shift 4
  echo "=== $label build ($dir) ==="
  if ! setup "$dir" "$@" || ! ninja -C "$dir"; then
    build_failed "$dir" "$label"
    return 1
  fi
  rm -f "$dir.buildfail.json"
  mapfile -t names < <(tests_except "$dir" "$skip")
  echo "=== $label tests (not run: ${skip:-none}) ==="
  meson test -C "$dir" --num-processes "$jobs" --timeout-multiplier "$mult" --print-errorlogs "${names[@]}"
  return 0
}

# The fuzzers (tests/fuzz): only their targets are built, by meson test.
run_fuzz() {
  local dir=build-fuzz
  echo "=== fuzz build ($dir) ==="
  if ! command -v clang >/dev/null; then
    echo "fuzz: skipped: clang is not installed (tools/install-deps.sh installs it)"
    return 0
  fi
  if ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' |
      clang -x c -fsanitize=fuzzer -o /dev/null - 2>/dev/null; then
    echo "fuzz: skipped: clang cannot link -fsanitize=fuzzer (libclang-rt-14-dev is missing)"
    return 0
  fi
  if ! CC=clang setup "$dir" -Dfuzz=true -Dbuildtype=debugoptimized; then
    build_failed "$dir" fuzz
    return 1
  fi
  rm -f "$dir.buildfail.json"
  export FUZZ_SECONDS=${FUZZ_SECONDS:-5}
  echo "=== fuzz runs ($FUZZ_SECONDS s each) ==="
  meson test -C "$dir" --suite fuzz-run --num-processes "$jobs" --print-errorlogs
  if [ ! -f "$dir/meson-logs/testlog.json" ]; then
    build_failed "$dir" fuzz
    return 1
  fi
  return 0
}

# phase LABEL CMD...: runs one phase and records its wall time for the summary.
times=()
phase() {
  local label=$1 t0=$SECONDS rc=0; shift
  "$@" || rc=$?
  times+=("$label $((SECONDS - t0))s")
  return $rc
}

rm -f build/meson-logs/testlog.json build-asan/meson-logs/testlog.json build-fuzz/meson-logs/testlog.json
rm -f build-tsan/meson-logs/testlog.json
phase plain run_build build plain 1 "" -Dbuildtype=debugoptimized || status=1
phase asan run_build build-asan asan 1 "$SANITIZER_SKIP" -Dbuildtype=debug -Db_sanitize=address,undefined \
  -Db_lundef=false || status=1
phase fuzz run_fuzz || status=1
# ThreadSanitizer (docs/reliability.md): GLib's locks, conditions and thread
# pools on pthreads (tests/tsan), any report fails its test. Optimised (-O2):
# fewer memory accesses to watch, the same races found. TSan runs programs 5
# to 15 times slower: twice the time each test is given.
phase tsan run_build build-tsan tsan 2 "$SANITIZER_SKIP $TSAN_SKIP" -Dbuildtype=debugoptimized \
  -Db_sanitize=thread -Db_lundef=false -Dtsan_shim=true -Dpython=disabled || status=1
echo "phases (wall time, build and tests): ${times[*]}; total $((SECONDS / 60)) min $((SECONDS % 60)) s"

python3 - "$status" <<'PY'
import json, os, sys
passed = failed = skipped = 0
names = []
for f in ("build/meson-logs/testlog.json", "build-asan/meson-logs/testlog.json",
          "build-fuzz/meson-logs/testlog.json", "build-tsan/meson-logs/testlog.json",
          "build.buildfail.json", "build-asan.buildfail.json", "build-fuzz.buildfail.json",
          "build-tsan.buildfail.json"):
    if not os.path.exists(f):
        continue
    tag = f.split("/")[0].split(".")[0].replace("build-", "")
    tag = "plain" if tag == "build" else tag
    for line in open(f):
        line = line.strip()
        if not line:
            continue
        r = json.loads(line)
        res = r.get("result", "")
        if res in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif res == "SKIP":
            skipped += 1
        else:
            failed += 1
            names.append(f"{tag}:{r.get('name')} ({res})")
if skipped:
    print(f"{skipped} skipped")
for n in names:
    print("failed:", n)
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed or passed == 0 or sys.argv[1] != "0" else 0)
PY
