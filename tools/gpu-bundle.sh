#!/usr/bin/env bash
# Packs what tools/gpu-check.sh runs into one folder that works on another
# Linux machine without libte's build dependencies (GLib, json-glib, libnuma,
# ...): te-info, te-bench, gpu-copy-bench, the tcp and shm transports, the
# CUDA device plugin, libte and every shared library they load, except
# glibc's own (the machine's must be used: they go with its ld.so) and
# libcuda (the machine's driver).
#
#   tools/gpu-bundle.sh [BUILD_DIR=build-gpu] [OUT_DIR=.gpu]
#
# BUILD_DIR is set up as a release build when it does not exist, and built
# with ninja (only what the bundle holds). The folder:
#   bin/      te-info, te-bench, gpu-copy-bench, test-stream-runtime (stripped)
#   lib/      libte.so.1, the libraries they need (stripped)
#   lib/te-1/ the plugins (where libte looks beside itself, and TE_PLUGIN_PATH)
#   env.sh    sourced by sh or bash: PATH, LD_LIBRARY_PATH, TE_PLUGIN_PATH
#   bundle.txt where it was built, the glibc it needs, its files
# Run there: . .gpu/env.sh && te-info
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
out=${2:-.gpu}
max_bytes=$((40 << 20))
die() { echo "gpu-bundle: $*" >&2; exit 1; }

command -v meson >/dev/null || die "meson is not installed"
command -v ninja >/dev/null || die "ninja is not installed"
if [ ! -f "$build/build.ninja" ]; then
	echo "gpu-bundle: setting up $build (release)" >&2
	meson setup "$build" -Dbuildtype=release >/dev/null
fi
# Figures from a debug build would be no figures at all.
buildtype=$(meson introspect "$build" --buildoptions |
	python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "buildtype"))')
[ "$buildtype" = release ] || die "$build is a '$buildtype' build; want release (meson configure $build -Dbuildtype=release)"

bins=(tools/te-info/te-info tools/te-bench/te-bench tools/gpu-copy-bench/gpu-copy-bench
	tests/device/test-stream-runtime)
plugins=(plugins/transport/tcp/libte-transport-tcp.so plugins/transport/shm/libte-transport-shm.so
	plugins/device/cuda/libte-device-cuda.so)
ninja -C "$build" "${bins[@]}" "${plugins[@]}" >/dev/null || die "ninja -C $build failed"
for f in "${bins[@]}" "${plugins[@]}" libte/libte.so.1; do
	[ -e "$build/$f" ] || die "$build/$f was not built (is its feature disabled?)"
done

# Only ever remove a folder this script made.
if [ -e "$out" ]; then
	[ -f "$out/bundle.txt" ] || [ -z "$(ls -A "$out")" ] || die "$out exists and is not a bundle; not touching it"
	rm -rf "$out"
fi
mkdir -p "$out/bin" "$out/lib/te-1"

for f in "${bins[@]}"; do
	cp "$build/$f" "$out/bin/"
done
for f in "${plugins[@]}"; do
	cp "$build/$f" "$out/lib/te-1/"
done
# libte under its soname only: no symbolic links, which a copy to the other
# machine might not keep.
cp -L "$build/libte/libte.so.1" "$out/lib/libte.so.1"

# Every library the programs and plugins load, recursively (ldd follows the
# whole tree), but glibc's and the driver's.
skip='^(linux-vdso\.so|linux-gate\.so|ld-linux.*|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so|libanl\.so|libnsl\.so|libmvec\.so|libBrokenLocale\.so|libcuda\.so|libte\.so)'
deps=$(for f in "${bins[@]}" "${plugins[@]}" libte/libte.so.1; do
	ldd "$build/$f" | awk '$2 == "=>" { print $1, $3 }'
done | sort -u)
missing=$(awk '$2 == "not" { print $1 }' <<<"$deps" | grep -Ev "$skip" || true)
[ -z "$missing" ] || die "libraries not found here: $missing"
while read -r name path; do
	[ -n "$name" ] || continue
	[[ $name =~ $skip ]] && continue
	[ -e "$out/lib/$name" ] || cp -L "$path" "$out/lib/$name"
done <<<"$deps"

strip --strip-all "$out"/bin/*
strip --strip-unneeded "$out"/lib/*.so* "$out"/lib/te-1/*.so 2>/dev/null || true

# The newest glibc symbol version anything here needs: the machine's glibc
# must be at least that (ldd --version there).
glibc=$(for f in "$out"/bin/* "$out"/lib/*.so* "$out"/lib/te-1/*.so; do
	objdump -T "$f" | awk '/\*UND\*/' | grep -o 'GLIBC_[0-9.]*' || true
done | sed 's/GLIBC_//' | sort -uV | tail -1)

cat >"$out/env.sh" <<'EOF'
# Sourced (". .gpu/env.sh") by sh or bash: the bundle's programs, libraries
# and plugins, found from where this file lies. dash keeps a sourced file open
# while it runs it, so /proc/$$/fd names it where BASH_SOURCE does not exist.
te_gpu_dir=
if [ -n "${BASH_SOURCE:-}" ]; then
	te_gpu_dir=$(dirname -- "$BASH_SOURCE")
else
	for te_gpu_fd in /proc/$$/fd/*; do
		te_gpu_f=$(readlink -- "$te_gpu_fd" 2>/dev/null) || continue
		case $te_gpu_f in
		*/env.sh) [ -f "$(dirname -- "$te_gpu_f")/bundle.txt" ] && te_gpu_dir=$(dirname -- "$te_gpu_f") && break ;;
		esac
	done
	unset te_gpu_fd te_gpu_f
fi
[ -n "$te_gpu_dir" ] || { [ -f ./.gpu/bundle.txt ] && te_gpu_dir=./.gpu; } || { [ -f ./bundle.txt ] && te_gpu_dir=.; }
if [ -z "$te_gpu_dir" ] || [ ! -f "$te_gpu_dir/bundle.txt" ]; then
	echo "env.sh: cannot tell where the bundle is; set GPU_BUNDLE or source it from its folder" >&2
	unset te_gpu_dir
	false
else
	GPU_BUNDLE=$(cd -- "$te_gpu_dir" && pwd)
	export GPU_BUNDLE
	export PATH="$GPU_BUNDLE/bin:$PATH"
	export LD_LIBRARY_PATH="$GPU_BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	export TE_PLUGIN_PATH="$GPU_BUNDLE/lib/te-1"
	unset te_gpu_dir
fi
EOF

{
	echo "libte GPU bundle"
	echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
	echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(getconf GNU_LIBC_VERSION)"
	echo "needs: glibc >= ${glibc:-unknown}, libcuda.so.1 (the NVIDIA driver) for the GPU"
	echo "files:"
	(cd "$out" && find . -type f ! -name bundle.txt -printf '  %p %s\n' | sort)
} >"$out/bundle.txt"

bytes=$(du -sb "$out" | cut -f1)
[ "$bytes" -le "$max_bytes" ] || die "$out holds $bytes bytes, more than $max_bytes"

# It must run from here with nothing of this machine's environment.
env -i PATH=/usr/bin:/bin sh -c ". '$out/env.sh' && te-info >/dev/null" ||
	die "te-info does not run from $out in a clean environment"
echo "gpu-bundle: $out: $(find "$out" -type f | wc -l) files, $((bytes / 1024)) KiB, needs glibc >= ${glibc:-?}"
