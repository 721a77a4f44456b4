#!/usr/bin/env bash
# Builds libte twice (plain, and with AddressSanitizer + UndefinedBehaviorSanitizer),
# runs every meson test in both builds, and prints one summary line:
#   N passed, N failed
# Exit status: 0 only when nothing failed.
set -uo pipefail
cd "$(dirname "$0")/.."

jobs=${TE_TEST_JOBS:-$(nproc)}
status=0

setup() { # dir, options...
  local dir=$1; shift
  if [ -f "$dir/build.ninja" ]; then
    meson setup --reconfigure "$dir" "$@" >/dev/null
  else
    meson setup "$dir" "$@" >/dev/null
  fi
}

run_build() { # dir, label, options...
  local dir=$1 label=$2; shift 2
  echo "=== $label build ($dir) ==="
  if ! setup "$dir" "$@" || ! ninja -C "$dir"; then
    echo "$label: build FAILED"
    echo "{\"name\": \"build-$label\", \"result\": \"FAIL\"}" > "$dir.buildfail.json"
    return 1
  fi
  rm -f "$dir.buildfail.json"
  echo "=== $label tests ==="
  meson test -C "$dir" --num-processes "$jobs" --print-errorlogs
  return 0
}

rm -f build/meson-logs/testlog.json build-asan/meson-logs/testlog.json
run_build build plain -Dbuildtype=debugoptimized || status=1
run_build build-asan asan -Dbuildtype=debug -Db_sanitize=address,undefined -Db_lundef=false || status=1

python3 - "$status" <<'PY'
import json, os, sys
passed = failed = skipped = 0
names = []
for f in ("build/meson-logs/testlog.json", "build-asan/meson-logs/testlog.json",
          "build.buildfail.json", "build-asan.buildfail.json"):
    if not os.path.exists(f):
        continue
    tag = "asan" if f.startswith("build-asan") else "plain"
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
