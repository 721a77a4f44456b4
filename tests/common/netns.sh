# SPDX-License-Identifier: Apache-2.0
# Sourced by the network-namespace tests (bash). It sets $tag (this
# process's id, to name things after), $tmp (a scratch folder), $tpid (for
# the test's target started in the background) and $netns (the namespaces
# the test creates: links() sets it, or the test itself); without root or
# iproute2 the test is skipped (77). fail() prints what the target and the
# initiator wrote ($tmp/out, $tmp/init) and exits 1; at exit the target is
# stopped, the namespaces (and the veth pairs in them) and $tmp removed. The
# waits of poll.sh come with it.
. "$(dirname "${BASH_SOURCE[0]}")/poll.sh"

tag=$$
tmp=$(mktemp -d)
tpid=
netns=

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

if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
	echo "skipped: needs root (network namespaces) and iproute2"
	exit 77
fi

fail() {
	echo "FAIL: $*"
	echo "--- target output:"; cat "$tmp/out" 2>/dev/null
	echo "--- initiator output:"; cat "$tmp/init" 2>/dev/null
	exit 1
}

# links N NAME NET: two hosts, namespaces $A (te-NAME-a-$tag) and $B
# (te-NAME-b-$tag), joined by N veth pairs, every link up: pair i has the
# ends $VAi and $VBi on the network $ni.0/24 (10.NET+i-1.$tag mod 250; A
# holds .1, B .2). Two are the two rails of the multi-rail tests.
links() {
	A=te-$2-a-$tag
	B=te-$2-b-$tag
	netns="$A $B"
	ip netns add "$A" && ip netns add "$B" || fail "cannot create namespaces"
	local i va vb net
	for i in $(seq "$1"); do
		printf -v "VA$i" '%sa%d%s' "$2" "$i" "$tag"
		printf -v "VB$i" '%sb%d%s' "$2" "$i" "$tag"
		printf -v "n$i" '10.%d.%d' $(($3 + i - 1)) $((tag % 250))
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
