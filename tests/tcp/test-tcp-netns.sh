#!/usr/bin/env bash
# Two hosts on one machine: network namespaces joined by a veth pair. A
# target engine in one, an initiator in the other: verified transfers over a
# real (virtual) link, then the initiator's link goes down mid-batch (the
# tasks must fail within TE_TCP_TIMEOUT_MS, 1 s here), comes back, and
# transfers work again. Needs root and iproute2; skipped (77) otherwise.
set -u
peer=$1

if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
	echo "skipped: needs root and iproute2"
	exit 77
fi

tag=$$
A=te-tcp-a-$tag
B=te-tcp-b-$tag
VA=tcpa$tag
VB=tcpb$tag
net=10.213.$((tag % 250))
tmp=$(mktemp -d)
tpid=

netns="$A $B"
. "$(dirname "$0")/../common/netns.sh"

ip netns add "$A" && ip netns add "$B" || fail "cannot create namespaces"
ip link add "$VA" type veth peer name "$VB" || fail "cannot create the veth pair"
ip link set "$VA" netns "$A" && ip link set "$VB" netns "$B" || fail "cannot move the veth ends"
ip -n "$A" addr add "$net.1/24" dev "$VA"
ip -n "$B" addr add "$net.2/24" dev "$VB"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set "$VA" up
ip -n "$B" link set "$VB" up

# The target runs until its stdin (fd 7 here) closes.
mkfifo "$tmp/in"
ip netns exec "$A" "$peer" target "$net.1" 67108864 3 <"$tmp/in" >"$tmp/out" 2>&1 &
tpid=$!
exec 7>"$tmp/in"
name=
for _ in $(seq 100); do
	name=$(awk '/^READY/ { print $2; exit }' "$tmp/out")
	[ -n "$name" ] && break
	sleep 0.1
done
[ -n "$name" ] || fail "the target did not come up"
case "$name" in "$net.1:"*) ;; *) fail "target segment name '$name' is not on $net.1";; esac

TCP_PEER_NAME="$net.2" timeout 120 ip netns exec "$B" "$peer" initiator "$name" "$VB" >"$tmp/init" 2>&1
rc=$?
[ $rc = 0 ] || fail "initiator exited $rc"
grep -q '^OK transfers' "$tmp/init" || fail "no verified transfers"
ms=$(awk '/^OK linkdown/ { print $3 }' "$tmp/init")
[ -n "$ms" ] || fail "no link-down result"
[ "$ms" -lt 4000 ] || fail "tasks took $ms ms to fail after the link went down (bound: 1000 ms + 100 ms checks + slack)"
grep -q '^OK relink' "$tmp/init" || fail "transfers did not work again after the link came back"
# The target saw the whole thing from another address.
echo "ok: $(grep '^OK' "$tmp/init" | tr '\n' ';')"
exit 0
