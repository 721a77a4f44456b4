#!/bin/sh
# Installs the build into a scratch root (meson install --destdir) and uses it
# the way a distribution's user would: a program and a third-party plugin
# built with pkg-config only, the installed te-info, the installed headers and
# the exported symbols.
set -eu
build=$1
src=$2
me=check-install
. "$src/tests/install/scratch-root.sh"
pc=$(find "$tmp/root" -name libte.pc | head -n 1)
[ -n "$pc" ] || fail "libte.pc not installed"
[ -f "$(dirname "$pc")/libte-plugin.pc" ] || fail "libte-plugin.pc not installed"
export PKG_CONFIG_PATH="$(dirname "$pc")" PKG_CONFIG_SYSROOT_DIR="$tmp/root"
# variables as the package states them, without the sysroot
pcvar() { env -u PKG_CONFIG_SYSROOT_DIR pkg-config --variable="$1" "$2"; }
libdir=$tmp/root$(pcvar libdir libte)
plugindir=$(pcvar plugindir libte)
case "$plugindir" in */te-1) ;; *) fail "plugindir '$plugindir' does not end in te-1" ;; esac
[ "$(pcvar plugindir libte-plugin)" = "$plugindir" ] || fail "plugindir differs"
ls "$libdir"/libte.so.1 >/dev/null || fail "libte.so.1 missing in $libdir"

# headers: standard C only, and they compile strictly as C and C++
inc=$tmp/root$(pcvar includedir libte)/te
for h in te.h te-plugin.h te-host.h te-transport.h te-metadata.h te-device.h te-exporter.h te-json.h; do
  [ -f "$inc/$h" ] || fail "$h not installed"
  if grep -E '^[[:space:]]*#[[:space:]]*include' "$inc/$h" | grep -vE '<(errno|stdarg|stddef|stdint|stdio|stdlib|string|stdatomic|time)\.h>|<te/te(-(plugin|host|transport|metadata|device|exporter))?\.h>' ; then
    fail "$h includes something beyond the C standard library"
  fi
  printf '#include <te/%s>\nint main(void){return 0;}\n' "$h" > "$tmp/h.c"
  cc -std=c11 -Wall -Wextra -Wpedantic -Werror $(pkg-config --cflags libte-plugin) -c "$tmp/h.c" -o "$tmp/h.o" \
    || fail "$h does not compile as strict C11"
  if command -v c++ >/dev/null; then
    cp "$tmp/h.c" "$tmp/h.cc"
    c++ -std=c++11 -Wall -Wextra -Werror $(pkg-config --cflags libte-plugin) -c "$tmp/h.cc" -o "$tmp/h.o" \
      || fail "$h does not compile as C++"
  fi
done

# only te_* leaves the library (the version nodes, TE_1.0 and on, are
# absolute symbols of their own: type A)
bad=$(nm -D --defined-only "$libdir/libte.so.1" | awk '$2 != "A" {print $3}' | grep -v '^te_' || true)
[ -z "$bad" ] || fail "libte exports symbols beyond te_*: $bad"

# the out-of-tree example plugin, built with only libte-plugin's flags
mkdir -p "$tmp/plugins"
cc -std=c11 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden \
  -o "$tmp/plugins/libte-transport-memcpy.so" "$src/docs/examples/memcpy-transport/memcpy-transport.c" \
  $(pkg-config --cflags --libs libte-plugin) || fail "example plugin does not build"
exported=$(nm -D --defined-only "$tmp/plugins/libte-transport-memcpy.so" | awk '{print $3}')
[ "$exported" = "te_plugin_entry" ] || fail "example plugin exports: $exported"

# a program built with pkg-config libte uses it
cc -std=c11 -Wall -Wextra -Werror -o "$tmp/consumer" "$src/tests/install/consumer.c" \
  $(pkg-config --cflags --libs libte) || fail "consumer does not build"
out=$(TE_PLUGIN_PATH="$tmp/plugins" LD_LIBRARY_PATH="$libdir" "$tmp/consumer") || fail "consumer failed: $out"
echo "$out"
echo "$out" | grep -q "plugin memcpy loaded $tmp/plugins/libte-transport-memcpy.so" \
  || fail "memcpy plugin not loaded from TE_PLUGIN_PATH"

# the installed te-info finds the installed plugins with no environment set
info=$(env -u TE_PLUGIN_PATH LD_LIBRARY_PATH="$libdir" "$tmp/root$(pcvar prefix libte)/bin/te-info") \
  || fail "installed te-info failed"
echo "$info"
echo "$info" | grep -q "$libdir/te-1" || fail "te-info does not search $libdir/te-1"
echo "$info" | grep -q "$(cd "$src" && pwd)" && fail "installed te-info looks into the source or build tree"
for so in "$libdir"/te-1/libte-*.so; do
  [ -e "$so" ] || continue
  echo "$info" | grep -q " $so\$" || fail "installed plugin $so not listed as loaded by te-info"
done
echo "check-install: ok"
