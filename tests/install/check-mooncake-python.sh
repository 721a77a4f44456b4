#!/bin/sh
# Installs the build into a scratch root (meson install --destdir) and runs a
# connector written against Mooncake's module (python/tests/sglang_style.py,
# two processes over TCP) with only the installed copy on the path: the
# `mooncake` package must sit in libte's site directory and its
# mooncake.engine must be libte.mooncake. Arguments: the build folder, the
# source root, the interpreter the package was built for.
set -eu
build=$1
src=$2
py=$3
me=check-mooncake-python
. "$src/tests/install/scratch-root.sh"
init=$(find "$tmp/root" -path '*/libte/__init__.py' | head -n 1)
[ -n "$init" ] || fail "libte's Python package not installed"
site=$(dirname "$(dirname "$init")")
[ -f "$site/mooncake/__init__.py" ] && [ -f "$site/mooncake/engine.py" ] ||
  fail "the mooncake package is not installed beside libte in $site"
so=$(find "$tmp/root" -name 'libte.so.1' | head -n 1)
[ -n "$so" ] || fail "libte.so.1 not installed"
libdir=$(dirname "$so")
[ -d "$libdir/te-1" ] || fail "no plugin folder $libdir/te-1"
# The installed copy only: its site folder, library and plugins; run from
# outside the sources so nothing there is imported by accident.
cp "$src/python/tests/sglang_style.py" "$tmp/"
cd "$tmp"
out=$(env -u PYTHONHOME PYTHONPATH="$site" LD_LIBRARY_PATH="$libdir" TE_PLUGIN_PATH="$libdir/te-1" \
  PYTHONDONTWRITEBYTECODE=1 TE_LOG_LEVEL=error "$py" "$tmp/sglang_style.py" --root "$tmp/root" 2>&1) ||
  fail "$out"
echo "$out"
echo "$out" | grep -q "^mooncake.engine from $site/mooncake/engine.py\$" || fail "mooncake.engine not from $site"
echo "$out" | grep -q "^sglang-style ok\$" || fail "the transfer did not finish"
echo "$me: ok"
