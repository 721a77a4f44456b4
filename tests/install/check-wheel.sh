#!/bin/sh
# Builds the Python wheel (pyproject.toml, meson-python) from a copy of the
# tracked sources in a fresh virtual environment of Debian's interpreter,
# installs it there, runs the Python test suite against it (no build tree on
# PYTHONPATH, libte and its plugins from the wheel), uninstalls it and checks
# the environment is as before. 77 (skipped) where it cannot run.
# Arguments: the source root, then the folders of the suite's test plugins
# (the 'hold' transport, the test device), which the wheel does not carry.
set -eu
src=$(cd "$1" && pwd)
shift
testplugins=$(IFS=:; echo "$*")
skip() { echo "check-wheel: skipped: $*"; exit 77; }
fail() { echo "check-wheel: $*" >&2; exit 1; }

py=/usr/bin/python3
[ -x "$py" ] || skip "no $py"
"$py" -c 'import venv, ensurepip, mesonpy, pytest' 2>/dev/null ||
  skip "$py lacks venv, ensurepip, mesonpy or pytest (python3-venv, python3-mesonpy, python3-pytest)"
for t in git patchelf; do
  command -v "$t" >/dev/null || skip "$t is missing (tools/install-deps.sh installs it)"
done
git -c safe.directory="$src" -C "$src" rev-parse --git-dir >/dev/null 2>&1 || skip "$src is not a git checkout"

tmp=$(mktemp -d /tmp/te-wheel.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM
mkdir "$tmp/src"
git -c safe.directory="$src" -C "$src" ls-files -z | (cd "$src" && tar --null -T - --ignore-failed-read -cf - 2>/dev/null) |
  tar -xf - -C "$tmp/src" || fail "cannot copy the sources"

# Debian's meson-python and pytest come from the system site; nothing is
# fetched (--no-index).
"$py" -m venv --system-site-packages "$tmp/venv" || fail "cannot create a venv"
vpy=$tmp/venv/bin/python
unset PYTHONPATH TE_PLUGIN_PATH TE_PLUGINS LD_LIBRARY_PATH
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
(cd "$tmp" && "$vpy" -m pip wheel --no-build-isolation --no-deps -w "$tmp/dist" "$tmp/src" \
  >"$tmp/wheel.log" 2>&1) || { tail -n 40 "$tmp/wheel.log" >&2; fail "pip wheel failed"; }
whl=$(ls "$tmp"/dist/libte-*.whl) || fail "no wheel built"
echo "built $(basename "$whl")"

# Tags for this interpreter: cpXY-cpXY-<platform>.
tag=$("$vpy" -c 'import sys, sysconfig
v = "cp%d%d" % sys.version_info[:2]
print("%s-%s-%s" % (v, v, sysconfig.get_platform().replace("-", "_").replace(".", "_")))')
case "$(basename "$whl")" in *-"$tag".whl) ;; *) fail "wheel tags are not $tag" ;; esac
# The library and every plugin inside; no tools, headers or manual pages.
list=$("$vpy" -c 'import sys, zipfile; print("\n".join(zipfile.ZipFile(sys.argv[1]).namelist()))' "$whl")
for f in libte/_native. .libte.mesonpy.libs/libte.so.1 .libte.mesonpy.libs/te-1/libte-transport-tcp.so \
    .libte.mesonpy.libs/te-1/libte-transport-shm.so .libte.mesonpy.libs/te-1/libte-metadata-http.so \
    libte/__init__.py libte/mooncake.py; do
  echo "$list" | grep -qF "$f" || fail "$f is not in the wheel"
done
echo "$list" | grep -E '/(scripts|headers|data)/|\.[1-8]$' && fail "the wheel carries tools, headers or manual pages"

site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
before=$(cd "$tmp/venv" && find . | sort)
"$vpy" -m pip install --no-deps "$whl" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log" >&2; fail "pip install failed"; }

# The wheel alone: no plugin path, the working directory outside the sources.
cd "$tmp"
out=$("$vpy" -I "$src/tests/install/transfer.py") || fail "transfer.py: $out"
echo "$out"
echo "$out" | grep -q "^libte from $site/libte/" || fail "libte was not imported from the venv"
echo "$out" | grep -q "^plugin tcp $site/.libte.mesonpy.libs/te-1/libte-transport-tcp.so\$" ||
  fail "the wheel's libte did not load its own tcp plugin"
echo "$out" | grep -q "^transfer ok\$" || fail "transfer.py did not finish"

# The Python suite; its fixtures' test plugins come from the build.
TE_PLUGIN_PATH=$testplugins TEST_PLUGIN_DIR=$1 "$vpy" -m pytest -q -p no:cacheprovider \
  "$tmp/src/python/tests" || fail "the Python tests failed against the wheel"

"$vpy" -m pip uninstall -y libte >"$tmp/uninstall.log" 2>&1 || { cat "$tmp/uninstall.log" >&2; fail "pip uninstall failed"; }
after=$(cd "$tmp/venv" && find . | sort)
if [ "$before" != "$after" ]; then
  echo "$before" > "$tmp/before"; echo "$after" > "$tmp/after"
  diff "$tmp/before" "$tmp/after" >&2 || true
  fail "pip uninstall left files behind"
fi
echo "check-wheel: ok"
