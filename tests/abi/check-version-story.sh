#!/usr/bin/env bash
# One version story (docs/abi.md): the project version's major.minor is
# te.h's TE_ABI_MAJOR.TE_ABI_MINOR, the soname is libte.so.<major>, the
# newest node of libte.map is TE_<major>.<minor>, every function te.h declares
# is exported under a TE_<major>.* version, and te-info says all of it.
# usage: check-version-story.sh SOURCE_ROOT LIBTE TE_INFO PROJECT_VERSION
set -uo pipefail
src=$1 lib=$2 teinfo=$3 version=$4
fail=0
bad() { echo "FAIL: $*"; fail=1; }

macro() { sed -n "s/^#define $1 \([0-9]*\)\$/\1/p" "$2"; }
major=$(macro TE_ABI_MAJOR "$src/include/te/te.h")
minor=$(macro TE_ABI_MINOR "$src/include/te/te.h")
pmajor=$(macro TE_PLUGIN_ABI_MAJOR "$src/include/te/te-plugin.h")
pminor=$(macro TE_PLUGIN_ABI_MINOR "$src/include/te/te-plugin.h")
echo "project $version, API $major.$minor, plugin ABI $pmajor.$pminor"

[[ $version == "$major.$minor."* ]] ||
  bad "project version $version is not API $major.$minor (te.h TE_ABI_MAJOR/MINOR)"

soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libte.so.$major" ] || bad "soname $soname, expected libte.so.$major"

last=$(grep -Eo '^TE_[0-9]+\.[0-9]+' "$src/libte/libte.map" | tail -n1)
[ "$last" = "TE_$major.$minor" ] || bad "newest node of libte.map is $last, expected TE_$major.$minor"

# Exported: "<addr> g DF .text <size> TE_1.0 te_version".
exported=$(objdump -T "$lib" | awk '$NF ~ /^te_/ && $0 !~ /\*UND\*/ {print $(NF-1), $NF}')
while read -r ver sym; do
  [[ $ver == TE_$major.* ]] || bad "$sym exported as version '$ver'"
done <<<"$exported"
for sym in $(grep -Eo '\bte_[a-z0-9_]+\(' "$src/include/te/te.h" | tr -d '(' | sort -u); do
  grep -q " $sym\$" <<<"$exported" || bad "$sym is declared in te.h but not exported (libte.map)"
done

want="libte $version (API $major.$minor, soname libte.so.$major, plugin ABI $pmajor.$pminor)"
got=$("$teinfo" 2>/dev/null | head -n1)
[ "$got" = "$want" ] || bad "te-info says '$got', expected '$want'"
[ $fail -eq 0 ] && echo "consistent: $want"
exit $fail
