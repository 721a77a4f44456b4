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

# Creates namespaces $A and $B joined by two veth pairs ($VA1-$VB1 on
# $n1.0/24, $VA2-$VB2 on $n2.0/24: A holds .1, B .2), every link up: the
# two rails of the multi-rail tests.
two_links() {
	ip netns add "$A" && ip netns add "$B" || fail "cannot create namespaces"
	local i va vb net
	for i in 1 2; do
		va=VA$i; vb=VB$i; net=n$i
		ip link add "${!va}" type veth peer name "${!vb}" || fail "cannot create veth pair $i"
		ip link set "${!va}" netns "$A" && ip link set "${!vb}" netns "$B" || fail "cannot move the veth ends"
		ip -n "$A" addr add "${!net}.1/24" dev "${!va}"
		ip -n "$B" addr add "${!net}.2/24" dev "${!vb}"
		ip -n "$A" link set "${!va}" up
		ip -n "$B" link set "${!vb}" up
	done
	for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
}
