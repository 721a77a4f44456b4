#!/usr/bin/env bash
# Two hosts on one machine: network namespaces joined by a veth pair. A
# target engine in one, an initiator in the other: verified transfers over a
# real (virtual) link, then the initiator's link goes down mid-batch (the
# tasks must fail within TE_TCP_TIMEOUT_MS, 1 s here), comes back, and
# transfers work again. Needs root and iproute2; skipped (77) otherwise.
set -u
peer=$1

. "$(dirname "$0")/../common/netns.sh"
links 1 tcp 213

# The target runs until its stdin (fd 7 here) closes.
mkfifo "$tmp/in"
ip netns exec "$A" "$peer" target "$n1.1" 67108864 3 <"$tmp/in" >"$tmp/out" 2>&1 &
tpid=$!
exec 7>"$tmp/in"
name=$(ready_name "$tmp/out") || fail "the target did not come up"
case "$name" in "$n1.1:"*) ;; *) fail "target segment name '$name' is not on $n1.1";; esac

TCP_PEER_NAME="$n1.2" timeout 120 ip netns exec "$B" "$peer" initiator "$name" "$VB1" >"$tmp/init" 2>&1
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
