#!/usr/bin/env bash
# The ABI of the built libraries against the baselines in abi/ (abidw XML,
# Debian's abigail-tools). Fails on a removed or changed function or
# variable, a changed type of a public header (struct layout, parameters),
# or a symbol moved to another version node; added functions pass.
#   check-abi.sh [--write] LIB BASELINE HEADERS_DIR [LIB BASELINE HEADERS_DIR ...]
# --write records the baselines instead (tools/abi-update.sh).
# Exit 77 (skipped) without abidw/abidiff, on another architecture than the
# baselines' (x86_64), or for a library built without debug information.
set -uo pipefail
write=0
if [ "${1:-}" = --write ]; then write=1; shift; fi

for t in abidw abidiff readelf; do
  if ! command -v $t >/dev/null; then
    echo "skipped: $t not installed (abigail-tools; tools/install-deps.sh installs it)"
    exit 77
  fi
done
if [ "$(uname -m)" != x86_64 ]; then
  echo "skipped: the baselines are x86_64's"
  exit 77
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
while [ $# -ge 3 ]; do
  lib=$1 base=$2 headers=$3
  shift 3
  # (Not grep -q on the pipe: readelf, cut short, would fail it under pipefail.)
  if ! readelf -S "$lib" | grep '\.debug_info' >/dev/null; then
    echo "skipped: $lib has no debug information (abidw reads types from DWARF)"
    exit 77
  fi
  # Only the types of the public headers count (--headers-dir,
  # --drop-private-types); no paths, so the record is the same from any
  # checkout and build folder.
  out=$tmp/$(basename "$base")
  if ! abidw --headers-dir "$headers" --drop-private-types --no-corpus-path \
      --no-comp-dir-path --no-show-locs --type-id-style hash --out-file "$out" "$lib"; then
    echo "FAIL: abidw could not read $lib"
    fail=1
    continue
  fi
  if [ $write = 1 ]; then
    cp "$out" "$base"
    echo "wrote $base"
    continue
  fi
  # Exit status bits: 1 error, 2 usage, 4 ABI change, 8 incompatible change.
  # Additions are left out of the report, so any bit set fails the test.
  report=$(abidiff --no-added-syms "$base" "$out")
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "FAIL: $(basename "$lib") differs from $base (abidiff exit $rc:" \
      "$( ((rc & 8)) && echo incompatible || echo changed))"
    echo "$report"
    fail=1
  else
    echo "ok: $(basename "$lib") keeps the ABI of $base"
  fi
done
[ $fail -eq 0 ] || echo "If the change is deliberate and compatible, record it: tools/abi-update.sh (docs/abi.md)"
exit $fail
