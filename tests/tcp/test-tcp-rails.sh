#!/usr/bin/env bash
# Multi-rail TCP: two network namespaces joined by two veth pairs (two rails).
# The target publishes an address on each (TE_TCP_RAILS: one numeric address,
# one interface name); the initiator (tcp-rails) checks that both rails carry
# data, that a rail taken down mid-batch costs no task and no byte, that it
# is used again once back, that with both down every task fails within the
# bound, and that both are used again once back. With a third argument the
# initiator checks what happens when link events are lost instead (see
# tcp-rails.c): "lost" (the event of a link coming back is taken from the
# initiator's engine: its probes find the rail), "enobufs" (the events
# overflow the engine's rtnetlink socket: the link state is read again).
# Needs root and iproute2; skipped (77) otherwise.
set -u
peer=$1
rails=$2
mode=${3:-}

. "$(dirname "$0")/../common/netns.sh"
links 2 rails 214

# A rail list naming neither an address of the host nor an interface fails
# the install, with a line saying which item was wrong.
ip netns exec "$A" env TE_TCP_RAILS="$n1.1,10.9.9.9" timeout 20 "$peer" target "$n1.1" 4096 1 </dev/null \
	>"$tmp/bad" 2>&1 && fail "a rail address of another host was accepted"
grep -q "10.9.9.9 is not an address of this host" "$tmp/bad" || { cat "$tmp/bad"; fail "no line naming the bad rail"; }
ip netns exec "$A" env TE_TCP_RAILS="nosuchif0" timeout 20 "$peer" target "$n1.1" 4096 1 </dev/null \
	>"$tmp/bad" 2>&1 && fail "an unknown interface was accepted as a rail"
grep -q "'nosuchif0' is neither" "$tmp/bad" || { cat "$tmp/bad"; fail "no line naming the bad interface"; }

# The target runs until its stdin (fd 7 here) closes. Its data port listens
# on the two rail addresses only (TE_TCP_BIND_ADDRESS plus the rails).
mkfifo "$tmp/in"
ip netns exec "$A" env TE_TCP_RAILS="$n1.1,$VA2" TE_TCP_BIND_ADDRESS="$n1.1" TE_LOG_LEVEL=info \
	"$peer" target "$n1.1" 67108864 3 <"$tmp/in" >"$tmp/out" 2>&1 &
tpid=$!
exec 7>"$tmp/in"
name=$(ready_name "$tmp/out") || fail "the target did not come up"
grep -q "data addresses (TE_TCP_RAILS): $n1.1, $n2.1" "$tmp/out" || fail "the target does not list both rails"
# Both rail addresses listen, nothing else does.
lst=$(ip netns exec "$A" ss -Htln)
port=$(awk '/data port [0-9]+/ { for (i = 1; i < NF; i++) if ($i == "port") { sub(",", "", $(i+1)); print $(i+1); exit } }' "$tmp/out")
[ -n "$port" ] || fail "no data port in the target's log"
echo "$lst" | grep -q "$n1.1:$port " || fail "data port $port not listening on $n1.1: $lst"
echo "$lst" | grep -q "$n2.1:$port " || fail "data port $port not listening on $n2.1: $lst"
echo "$lst" | grep -q "\*:$port \|0.0.0.0:$port " && fail "data port $port listens on every interface"

start=$(date +%s)
if [ -n "$mode" ]; then
	args=$mode
	if [ "$mode" = enobufs ]; then
		# An interface of no rail, to flood the link events with.
		ip -n "$B" link add "fs$tag" type veth peer name "ft$tag" && ip -n "$B" link set "ft$tag" up ||
			fail "cannot create the spare veth pair"
		args="$mode fs$tag"
	fi
	# shellcheck disable=SC2086 # two words for enobufs
	TCP_PEER_NAME="$n1.2" TE_LOG_LEVEL=info timeout 80 ip netns exec "$B" "$rails" "$name" "$VB1" "$VB2" $args \
		>"$tmp/init" 2>&1
	rc=$?
	[ $rc = 0 ] || fail "initiator exited $rc"
	grep -q "^OK $mode " "$tmp/init" || fail "no '$mode' result"
	ms=$(awk -v w="$mode" '$1 == "OK" && $2 == w { print $3; exit }' "$tmp/init")
	# lost: the rail's next probe, at most TE_TCP_PROBE_MAX_MS (4 s) after
	# its last; enobufs: at once (the state read again, the next check).
	if [ "$mode" = lost ]; then
		[ "$ms" -lt 6000 ] || fail "the rail whose return was not told took $ms ms to come back"
	else
		[ "$ms" -lt 2500 ] || fail "the rail took $ms ms to come back after the events were lost"
	fi
	echo "ok in $(( $(date +%s) - start )) s: $(grep '^OK' "$tmp/init" | tr '\n' ';')"
	exit 0
fi
TCP_PEER_NAME="$n1.2" TE_LOG_LEVEL=info timeout 120 ip netns exec "$B" "$rails" "$name" "$VB1" "$VB2" \
	>"$tmp/init" 2>&1
rc=$?
[ $rc = 0 ] || fail "initiator exited $rc"
for what in both failover return alldown alldown-new bothback; do
	grep -q "^OK $what " "$tmp/init" || fail "no '$what' result"
done
# Bounds (TE_TCP_TIMEOUT_MS 1000, connect timeout 1000, probes 1..4 s):
# fail-over within the stall timeout plus checks; with both down, within one
# timeout per rail found broken in turn; a returning rail within its probe
# interval plus a round.
val() { awk -v w="$1" '$1 == "OK" && $2 == w { print $3; exit }' "$tmp/init"; }
[ "$(val failover)" -lt 4000 ] || fail "fail-over took $(val failover) ms"
[ "$(val alldown)" -lt 4000 ] || fail "with both rails down the tasks took $(val alldown) ms to fail"
[ "$(val alldown-new)" -lt 3000 ] || fail "a batch with both rails down took $(val alldown-new) ms to fail"
[ "$(val return)" -lt 8000 ] || fail "a returning rail took $(val return) ms to be used"
[ "$(val bothback)" -lt 8000 ] || fail "returning rails took $(val bothback) ms to be used"
grep -q "rail $n1.1:$port of .* is down" "$tmp/init" || fail "no log line for the rail going down"
grep -q "rail $n1.1:$port of .* is up again" "$tmp/init" || fail "no log line for the rail coming back"
echo "ok in $(( $(date +%s) - start )) s: $(grep '^OK' "$tmp/init" | tr '\n' ';')"
exit 0
