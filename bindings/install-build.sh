# Sourced (POSIX sh) by go/run-go-tests.sh and rust/run-tests.sh: installs
# the build into a scratch root and points the toolchain at it the way a
# user's machine would, libte found by pkg-config and its plugins next to the
# installed library.
#
#   install_build LANG BUILD WORK TEST_PLUGIN_DIR
#
# Sets root (the install root, WORK/root: one path from run to run, as the
# toolchains' caches keep the -L path they were given), tmp (a scratch folder
# removed with root on exit) and libdir; exports PKG_CONFIG_PATH,
# PKG_CONFIG_SYSROOT_DIR and LD_LIBRARY_PATH. Only the test transports, which
# are not installed, come from TE_PLUGIN_PATH ($tmp/plugins): "hold" (it
# keeps tasks in flight) and "holddl" (the same, honouring deadlines) are put
# there; a caller may add more.

fail() { echo "$lang: $*" >&2; exit 1; }

install_build() {
	lang=$1
	mkdir -p "$3"
	root=$3/root
	tmp=$(mktemp -d "$3/run.XXXXXX")
	trap 'rm -rf "$tmp" "$root"' EXIT INT TERM
	rm -rf "$root"

	echo "$lang: installing the build into $root"
	meson install -C "$2" --destdir "$root" --no-rebuild --quiet >/dev/null \
		|| fail "meson install failed (it installs what is built: ninja -C $2 first)"
	pc=$(find "$root" -name libte.pc | head -n 1)
	[ -n "$pc" ] || fail "libte.pc not installed"
	export PKG_CONFIG_PATH="$(dirname "$pc")" PKG_CONFIG_SYSROOT_DIR="$root"
	libdir=$root$(env -u PKG_CONFIG_SYSROOT_DIR pkg-config --variable=libdir libte)
	[ -e "$libdir/libte.so.1" ] || fail "libte.so.1 missing in $libdir"
	[ -e "$libdir/te-1/libte-transport-tcp.so" ] || fail "tcp plugin not installed in $libdir/te-1"
	export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

	unset TE_PLUGINS
	mkdir -p "$tmp/plugins"
	cp "$4/libte-transport-hold.so" "$4/libte-transport-holddl.so" "$tmp/plugins/" \
		|| fail "hold test transports not built"
	export TE_PLUGIN_PATH="$tmp/plugins"
	export TE_TEST_HOLD_PLUGIN="$tmp/plugins/libte-transport-hold.so"
	export TE_TEST_HOLDDL_PLUGIN="$tmp/plugins/libte-transport-holddl.so"
}
