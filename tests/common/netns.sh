# SPDX-License-Identifier: Apache-2.0
# Sourced by the network-namespace tests once they set $tmp (a scratch
# folder), $tpid (a target started in the background, or empty) and $netns
# (the namespaces they create): fail() prints what the target and the
# initiator wrote ($tmp/out, $tmp/init) and exits 1; at exit the target is
# stopped, the namespaces (and the veth pairs in them) and $tmp removed.
netns_cleanup() {
	[ -n "$tpid" ] && kill "$tpid" 2>/dev/null && wait "$tpid" 2>/dev/null
	exec 7>&- 2>/dev/null
	for ns in $netns; do
		ip netns del "$ns" 2>/dev/null
	done
	rm -rf "$tmp"
}
trap netns_cleanup EXIT
trap 'exit 1' INT TERM

fail() {
	echo "FAIL: $*"
	echo "--- target output:"; cat "$tmp/out" 2>/dev/null
	echo "--- initiator output:"; cat "$tmp/init" 2>/dev/null
	exit 1
}
