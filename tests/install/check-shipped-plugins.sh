#!/bin/sh
# What ships is what runs: installs the build into a scratch root and checks
# that every installed plugin (transports, metadata stores, device plugins)
# exports its entry symbol and nothing else, and that the installed RDMA
# plugin carries none of the tests' switches, controls or software verbs
# (those live in the tests' own copy of it, tests/rdma/soft-verbs).
#   check-shipped-plugins.sh BUILD_DIR
set -eu
build=$1
me=check-shipped-plugins
. "$(dirname "$0")/scratch-root.sh"
status=0
bad() { echo "FAIL $*" >&2; status=1; }

# Plugins are libte-<kind>-<name>.so in the te-<abi> folder; anywhere else in
# the tree such a file would be a stray copy (a test plugin installed).
find "$tmp/root" -name 'libte-*-*.so' -type f > "$tmp/all"
grep '/te-[0-9][0-9]*/libte-[a-z]*-[^/]*\.so$' "$tmp/all" > "$tmp/plugins" || true
[ -s "$tmp/plugins" ] || { echo "no plugin installed" >&2; exit 1; }
stray=$(grep -vxFf "$tmp/plugins" "$tmp/all" || true)
[ -z "$stray" ] || bad "plugins outside the plugin folder: $stray"
[ "$(sed 's|.*/||' "$tmp/plugins" | sort | uniq -d)" = "" ] || bad "a plugin is installed twice"

while read -r so; do
	syms=$(nm -D --defined-only "$so" | awk 'NF >= 3 { print $3 }' | sort -u | tr '\n' ' ')
	if [ "$syms" = "te_plugin_entry " ]; then
		echo "ok   $(basename "$so"): te_plugin_entry only"
	else
		bad "$(basename "$so") defines: ${syms:-nothing}(want te_plugin_entry only)"
	fi
done < "$tmp/plugins"

rdma=$(grep '/libte-transport-rdma\.so$' "$tmp/plugins" || true)
if [ -n "$rdma" ]; then
	strings -a "$rdma" > "$tmp/rdma.strings"
	for s in TE_RDMA_SOFT TE_RDMA_SYSFS_ROOT te_rdma_soft_ te_rdma_get_stats "software verbs"; do
		if grep -qF "$s" "$tmp/rdma.strings"; then
			bad "the installed RDMA plugin contains \"$s\""
		else
			echo "ok   libte-transport-rdma.so has no \"$s\""
		fi
	done
else
	echo "note: the RDMA plugin is not built here"
fi
exit $status
