#!/bin/sh
# Builds the Debian packages (debian/) from a copy of the tracked sources,
# lintians them, installs them, uses the installed copy the way a user of the
# packages would (te-info, a te-bench run, the Python packages, a program, a
# Mooncake program and a third-party plugin built with pkg-config from /usr,
# te-metadata-server started with its unit's command line), then purges them
# and checks that nothing is left. Root only; 77 (skipped) where it cannot
# run. Arguments: the source root.
set -eu
src=$(cd "$1" && pwd)
skip() { echo "check-debs: skipped: $*"; exit 77; }
fail() { echo "check-debs: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root (it installs and purges packages)"
for t in dpkg-buildpackage lintian dpkg dh git python3 cc pkg-config setpriv; do
  command -v "$t" >/dev/null || skip "$t is missing (tools/install-deps.sh installs it)"
done
git -c safe.directory="$src" -C "$src" rev-parse --git-dir >/dev/null 2>&1 || skip "$src is not a git checkout"
pkgs=$(sed -n 's/^Package: //p' "$src/debian/control")
[ -n "$pkgs" ] || fail "no packages in debian/control"
# Never touch a copy someone installed: the purge at the end would remove it.
for p in $pkgs; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q installed; then
    skip "$p is installed already"
  fi
done
triplet=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
plugindir=/usr/lib/$triplet/te-1
if [ -d "$plugindir" ] && [ -n "$(ls -A "$plugindir")" ]; then
  skip "$plugindir holds files already (an install of libte outside the packages)"
fi
[ -e /usr/include/te ] && skip "/usr/include/te exists already"

tmp=$(mktemp -d /tmp/te-debs.XXXXXX)
installed=0
cleanup() {
  if [ "$installed" = 1 ]; then
    # shellcheck disable=SC2086
    dpkg --purge $pkgs >/dev/null 2>&1 || true
    rm -rf /var/lib/te-metadata-server /var/lib/private/te-metadata-server
  fi
  [ -n "${server_pid:-}" ] && kill "$server_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# The tracked files as they are in the work tree (uncommitted changes
# included, build folders and other untracked files left out).
mkdir "$tmp/src"
git -c safe.directory="$src" -C "$src" ls-files -z | (cd "$src" && tar --null -T - --ignore-failed-read -cf - 2>/dev/null) |
  tar -xf - -C "$tmp/src" || fail "cannot copy the sources"
(cd "$tmp/src" && DEB_BUILD_OPTIONS="nocheck noddebs parallel=${TE_DEB_JOBS:-2}" \
  dpkg-buildpackage -us -uc -b >"$tmp/build.log" 2>&1) || {
  tail -n 40 "$tmp/build.log" >&2; fail "dpkg-buildpackage failed"; }
changes=$(ls "$tmp"/*.changes)
for p in $pkgs; do
  ls "$tmp/${p}_"*.deb >/dev/null 2>&1 || fail "package $p was not built"
done

# lintian: no error and no warning (overrides carry their reasons in debian/)
lint=$(lintian --allow-root --tag-display-limit 0 "$changes" 2>&1) || true
echo "$lint"
if echo "$lint" | grep -E '^(E|W):' >/dev/null; then
  fail "lintian reports errors or warnings"
fi

installed=1
dpkg -i "$tmp"/*.deb >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log" >&2; fail "dpkg -i failed"; }

# From here on only the installed copy: no plugin path, no library path, no
# build tree, a working directory outside the sources.
cd "$tmp"
run() { env -i PATH=/usr/bin:/bin HOME="$tmp" TE_LOG_LEVEL=warn "$@"; }

info=$(run te-info) || fail "te-info failed"
echo "$info"
n=0
for so in "$plugindir"/libte-*.so; do
  [ -e "$so" ] || fail "no plugins in $plugindir"
  echo "$info" | grep -q " $so\$" || fail "te-info does not list $so as loaded"
  n=$((n + 1))
done
[ "$n" -ge 10 ] || fail "only $n plugins installed in $plugindir"
echo "$info" | grep -q "$src" && fail "te-info looks into the source tree"

out=$(run te-bench --protocol=tcp --duration=1 --block_size=65536 --batch_size=16 \
  --buffer_size=16777216 --check --quiet --json) || fail "te-bench loopback failed: $out"
echo "$out"

# Debian's interpreter in isolated mode: no PYTHONPATH, no user site.
out=$(run /usr/bin/python3 -I "$src/tests/install/transfer.py") || fail "python: $out"
echo "$out"
echo "$out" | grep -q "^libte from /usr/lib/python3/dist-packages/libte/" || fail "python imported another libte"
echo "$out" | grep -q "^plugin tcp $plugindir/libte-transport-tcp.so\$" || fail "python's libte lacks the tcp plugin"
echo "$out" | grep -q "^transfer ok\$" || fail "python transfer did not finish"
# python3-libte-mooncake: a connector written for Mooncake's module, two
# processes, mooncake.engine being libte.mooncake from /usr.
out=$(run /usr/bin/python3 -I "$src/python/tests/sglang_style.py" --root /usr/lib/python3/dist-packages) ||
  fail "mooncake.engine: $out"
echo "$out"
echo "$out" | grep -q "^sglang-style ok\$" || fail "the SGLang-style transfer did not finish"

# A program and a plugin built with pkg-config from /usr, nothing else.
mkdir "$tmp/plugins"
run cc -std=c11 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden \
  -o "$tmp/plugins/libte-transport-memcpy.so" "$src/docs/examples/memcpy-transport/memcpy-transport.c" \
  $(run pkg-config --cflags --libs libte-plugin) || fail "the example plugin does not build"
run cc -std=c11 -Wall -Wextra -Werror -o "$tmp/consumer" "$src/tests/install/consumer.c" \
  $(run pkg-config --cflags --libs libte) || fail "consumer does not build"
out=$(run TE_PLUGIN_PATH="$tmp/plugins" "$tmp/consumer") || fail "consumer failed: $out"
echo "$out"
echo "$out" | grep -q "plugin memcpy loaded $tmp/plugins/libte-transport-memcpy.so" \
  || fail "the memcpy plugin was not loaded"
echo "$out" | grep -q "plugin tcp loaded $plugindir/libte-transport-tcp.so" \
  || fail "consumer did not find the installed plugins"
run cc -std=c11 -Wall -Wextra -Werror -o "$tmp/mc" "$src/tests/install/mooncake-consumer.c" \
  $(run pkg-config --cflags --libs libte-mooncake) || fail "the Mooncake program does not build"
out=$(run "$tmp/mc") || fail "the Mooncake program failed: $out"
echo "$out"

# te-metadata-server with its unit's command line. systemd would create the
# state directory and run it as a user of its own: here nobody does.
unit=$(ls /lib/systemd/system/te-metadata-server.service /usr/lib/systemd/system/te-metadata-server.service 2>/dev/null | head -n 1)
[ -n "$unit" ] || fail "te-metadata-server.service not installed"
if command -v systemd-analyze >/dev/null; then
  v=$(systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify: $v"
  [ -z "$v" ] || fail "systemd-analyze verify: $v"
fi
cmd=$(sed -n 's/^ExecStart=//p' "$unit")
state=$(sed -n 's/^StateDirectory=//p' "$unit")
[ -n "$cmd" ] && [ -n "$state" ] || fail "no ExecStart= or StateDirectory= in $unit"
case "$cmd" in *"--persist /var/lib/$state/"*) ;; *) fail "ExecStart= does not persist under /var/lib/$state" ;; esac
listen=$(echo "$cmd" | sed -n 's/.*--listen \([^ ]*\).*/\1/p')
[ -n "$listen" ] || fail "no --listen in ExecStart="
mkdir -m 0700 "/var/lib/$state"
chown nobody:nogroup "/var/lib/$state"
# shellcheck disable=SC2086
setpriv --reuid=nobody --regid=nogroup --clear-groups env -i $cmd >"$tmp/server.log" 2>&1 &
server_pid=$!
python3 - "$listen" <<'EOF' || { cat "$tmp/server.log" >&2; fail "te-metadata-server did not answer"; }
import json, sys, time, urllib.request
base = "http://" + sys.argv[1]
for _ in range(100):
    try:
        urllib.request.urlopen(base + "/health", timeout=2).read()
        break
    except OSError:
        time.sleep(0.1)
req = urllib.request.Request(base + "/metadata?key=check-debs", data=b"value-1", method="PUT")
urllib.request.urlopen(req, timeout=5).read()
got = urllib.request.urlopen(base + "/metadata?key=check-debs", timeout=5).read()
assert got == b"value-1", got
health = json.loads(urllib.request.urlopen(base + "/health", timeout=5).read())
assert health["keys"] == 1, health
print("te-metadata-server at", base, "answers:", health)
EOF
kill "$server_pid"
wait "$server_pid" || true
server_pid=
grep -q '"check-debs"' "/var/lib/$state/metadata.json" || fail "the key was not persisted under /var/lib/$state"

# Purge: every file goes, the plugin directory, the headers and the state.
# shellcheck disable=SC2086
dpkg --purge $pkgs >"$tmp/purge.log" 2>&1 || { cat "$tmp/purge.log" >&2; fail "dpkg --purge failed"; }
installed=0
for p in $pkgs; do
  if dpkg -L "$p" 2>/dev/null | grep -q .; then
    fail "dpkg -L $p still lists files after the purge"
  fi
done
if [ -d "$plugindir" ] && [ -n "$(ls -A "$plugindir")" ]; then
  fail "files left in $plugindir: $(ls -A "$plugindir")"
fi
for f in /usr/include/te /usr/include/mooncake/transfer_engine_c.h /usr/lib/python3/dist-packages/libte /usr/lib/python3/dist-packages/mooncake \
    "$unit" "/var/lib/$state" "/var/lib/private/$state" /usr/bin/te-info "/usr/lib/$triplet/libte.so.1"; do
  [ -e "$f" ] && fail "$f is left after the purge"
done
echo "check-debs: ok"
