#!/bin/sh
# Installs the build into a scratch root (meson install --destdir) and uses
# libtransfer_engine as a program written for Mooncake's C API would: the
# test program built with `pkg-config --cflags --libs libte-mooncake` only,
# run against the installed libraries and plugins; the header compiled
# strictly as C and C++; the library's soname and exported names checked.
set -eu
build=$1
src=$2
me=check-install-compat
. "$src/tests/install/scratch-root.sh"
pc=$(find "$tmp/root" -name libte-mooncake.pc | head -n 1)
[ -n "$pc" ] || fail "libte-mooncake.pc not installed"
export PKG_CONFIG_PATH="$(dirname "$pc")" PKG_CONFIG_SYSROOT_DIR="$tmp/root"
pcvar() { env -u PKG_CONFIG_SYSROOT_DIR pkg-config --variable="$1" "$2"; }
libdir=$tmp/root$(pcvar libdir libte-mooncake)
incdir=$tmp/root$(pcvar includedir libte-mooncake)

# the library, its soname, the header where programs look for it
lib=$libdir/libtransfer_engine.so.1
[ -f "$lib" ] || fail "libtransfer_engine.so.1 missing in $libdir"
[ -e "$libdir/libtransfer_engine.so" ] || fail "libtransfer_engine.so (link name) missing"
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libtransfer_engine.so.1" ] || fail "soname is '$soname'"
[ -f "$incdir/mooncake/transfer_engine_c.h" ] || fail "mooncake/transfer_engine_c.h not installed"
cflags=$(pkg-config --cflags libte-mooncake)
echo "$cflags" | grep -q -- "-I$incdir/mooncake" || fail "Cflags lack -I\${includedir}/mooncake: $cflags"

# only Mooncake's C API leaves the library
want="allocateBatchID closeSegment createTransferEngine destroyTransferEngine discoverTopology
enableGracefulShutdown freeBatchID freeNotifsMsgBuf genNotifyInEngine getLocalIpAndPort
getNicLoadStats getNotifsFromEngine getTransferStatus installTransport openSegment openSegmentNoCache
registerLocalMemory registerLocalMemoryBatch removeLocalSegment showLinks submitTransfer
submitTransferWithNotify syncSegmentCache uninstallTransport unregisterLocalMemory
unregisterLocalMemoryBatch warmupEfaSegment"
want=$(echo $want | tr ' ' '\n' | sort)
# Names without their symbol version (TE_MOONCAKE_1.1, 1.3; docs/abi.md), and
# without the version nodes themselves (absolute symbols, type A).
got=$(nm -D --defined-only "$lib" | awk '$2 != "A" {print $3}' | sed 's/@.*//' | sort)
[ "$got" = "$want" ] || fail "exported names differ from Mooncake's C API:
$(printf '%s\n' "$want" > "$tmp/want"; printf '%s\n' "$got" > "$tmp/got"; diff "$tmp/want" "$tmp/got")"

# each call in the version node of the release that added it
versions=$(nm -D --defined-only "$lib" | awk '$2 != "A" {print $3}')
echo "$versions" | grep -qx 'getNicLoadStats@@TE_MOONCAKE_1.3' \
  || fail "getNicLoadStats is not in TE_MOONCAKE_1.3: $(echo "$versions" | grep getNicLoadStats)"
old_api=$(echo "$versions" | grep -v '^getNicLoadStats@' | grep -vc '@@TE_MOONCAKE_1.1$' || true)
[ "$old_api" = 0 ] || fail "calls of the first release outside TE_MOONCAKE_1.1: $(echo "$versions" | grep -v '@@TE_MOONCAKE_1.1$')"

# the header: standard C only, strict C11 and C++, and next to Mooncake's
# own error.h (which defines the ERR_* codes too) in either order
if grep -E '^[[:space:]]*#[[:space:]]*include' "$incdir/mooncake/transfer_engine_c.h" \
   | grep -vE '<(stdbool|stddef|stdint)\.h>'; then
  fail "transfer_engine_c.h includes something beyond the C standard library"
fi
mkdir -p "$tmp/mc"
cat > "$tmp/mc/error.h" <<'EOF'
#ifndef ERROR_H
#define ERROR_H
#define ERR_INVALID_ARGUMENT (-1)
#define ERR_TOO_MANY_REQUESTS (-2)
#define ERR_ADDRESS_NOT_REGISTERED (-3)
#define ERR_BATCH_BUSY (-4)
#define ERR_DEVICE_NOT_FOUND (-6)
#define ERR_ADDRESS_OVERLAPPED (-7)
#define ERR_NOT_LOCAL_SEGMENT_OR_SHM (-8)
#define ERR_DNS (-101)
#define ERR_SOCKET (-102)
#define ERR_MALFORMED_JSON (-103)
#define ERR_REJECT_HANDSHAKE (-104)
#define ERR_METADATA (-200)
#define ERR_ENDPOINT (-201)
#define ERR_CONTEXT (-202)
#define ERR_NUMA (-300)
#define ERR_CLOCK (-301)
#define ERR_MEMORY (-302)
#define ERR_NOT_IMPLEMENTED (-303)
#endif
EOF
for order in "transfer_engine_c.h error.h" "error.h transfer_engine_c.h"; do
  : > "$tmp/h.c"
  for h in $order; do printf '#include "%s"\n' "$h" >> "$tmp/h.c"; done
  printf 'int main(void){ transfer_request_t r = {OPCODE_WRITE, 0, LOCAL_SEGMENT, 0, 0};\n  return r.opcode + ERR_INVALID_ARGUMENT; }\n' >> "$tmp/h.c"
  cc -std=c11 -Wall -Wextra -Wpedantic -Werror -I"$tmp/mc" $cflags -c "$tmp/h.c" -o "$tmp/h.o" \
    || fail "transfer_engine_c.h with error.h ($order) does not compile as strict C11"
  if command -v c++ >/dev/null; then
    cp "$tmp/h.c" "$tmp/h.cc"
    c++ -std=c++11 -Wall -Wextra -Werror -I"$tmp/mc" $cflags -c "$tmp/h.cc" -o "$tmp/h.o" \
      || fail "transfer_engine_c.h with error.h ($order) does not compile as C++"
  fi
done

# the test program, built with pkg-config only and run against the installed
# copy (plugins from the installed plugin directory, no environment)
cc -std=c11 -Wall -Wextra -Werror -pthread -o "$tmp/test-mooncake-c" \
  "$src/tests/compat/test-mooncake-c.c" $(pkg-config --cflags --libs libte-mooncake) \
  || fail "test program does not build with pkg-config libte-mooncake"
needed=$(readelf -d "$tmp/test-mooncake-c" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "$needed" | grep -qx "libtransfer_engine.so.1" || fail "program does not need libtransfer_engine.so.1"
export LD_LIBRARY_PATH="$libdir"
resolved=$(ldd "$tmp/test-mooncake-c" | grep -E 'libtransfer_engine|libte\.so')
echo "$resolved"
echo "$resolved" | grep -q "$libdir/libtransfer_engine.so.1" || fail "not run against the installed library"
echo "$resolved" | grep -q "$libdir/libte.so.1" || fail "libte not taken from the installed copy"
"$tmp/test-mooncake-c" || fail "test program failed against the installed copy"
"$tmp/test-mooncake-c" fork || fail "test program (two processes) failed against the installed copy"
echo "check-install-compat: ok"
