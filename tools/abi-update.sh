#!/usr/bin/env bash
# Records the ABI after a deliberate, compatible change (docs/abi.md):
# abi/libte.abi and abi/libtransfer_engine.abi from the libraries of a plain
# gcc build, and tests/abi/plugin-layout.h from te-plugin.h. Review the diff
# (git diff abi tests/abi) before committing it.
#   tools/abi-update.sh [BUILD_DIR]      (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}

[ -f "$dir/build.ninja" ] || meson setup "$dir" >/dev/null
if [ "$(meson introspect "$dir" --buildoptions |
        python3 -c 'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"] == "b_sanitize"][0])')" != none ]; then
  echo "abi-update: $dir is a sanitized build; the ABI is recorded from a plain one" >&2
  exit 1
fi
ninja -C "$dir"

set -- "$dir"/libte/libte.so.1 abi/libte.abi include/te
if [ -e "$dir"/compat/mooncake/libtransfer_engine.so.1 ]; then
  set -- "$@" "$dir"/compat/mooncake/libtransfer_engine.so.1 abi/libtransfer_engine.abi compat/mooncake
fi
tests/abi/check-abi.sh --write "$@"
python3 tests/abi/gen-plugin-layout.py . "${CC:-cc}"
git diff --stat -- abi tests/abi/plugin-layout.h || true
