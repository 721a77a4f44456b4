#!/usr/bin/env bash
# Least exposure in a network namespace of its own, with two addresses on a
# veth pair whose both ends it holds (A and B, both of this "host"): a target named by A listens on
# A only (its RPC and TCP data ports refuse connections to B); an initiator
# reaches it over A, with the cluster key on both sides; TE_BIND_ADDRESS=*
# opens every interface again. Traffic stays inside the namespace the test
# created. Needs root and iproute2; skipped (77) otherwise.
set -u
peer=$1

. "$(dirname "$0")/../common/netns.sh"
NS=te-sec-$tag
netns=$NS
net=10.214.$((tag % 250))
A=$net.1
B=$net.2

stop_target() {
	exec 7>&- 2>/dev/null
	if [ -n "$tpid" ]; then
		for _ in $(seq 50); do kill -0 "$tpid" 2>/dev/null || break; sleep 0.1; done
		kill "$tpid" 2>/dev/null
		wait "$tpid" 2>/dev/null
	fi
	tpid=
}

ip netns add "$NS" || fail "cannot create the namespace"
ip -n "$NS" link set lo up
ip -n "$NS" link add v0 type veth peer name v1 || fail "cannot create a veth pair"
ip -n "$NS" addr add "$A/24" dev v0
ip -n "$NS" addr add "$B/24" dev v1
ip -n "$NS" link set v0 up
ip -n "$NS" link set v1 up

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/key"
chmod 600 "$tmp/key"
data_port=23456

# 0 when a TCP connection to $1:$2 inside the namespace is accepted.
reach() {
	ip netns exec "$NS" timeout 3 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null
}

# Starts a target named by A with the environment given; sets $name, $rpc_port.
start_target() {
	rm -f "$tmp/in"
	mkfifo "$tmp/in"
	ip netns exec "$NS" env TE_TCP_PORT=$data_port TE_AUTH_KEY_FILE="$tmp/key" "$@" \
		"$peer" target "$A" 4194304 3 <"$tmp/in" >"$tmp/out" 2>&1 &
	tpid=$!
	exec 7>"$tmp/in"
	name=$(ready_name "$tmp/out") || fail "the target did not come up"
	rpc_port=${name##*:}
}

# Default: A only.
start_target
reach "$A" "$rpc_port" || fail "RPC port $rpc_port not reachable on $A"
reach "$B" "$rpc_port" && fail "RPC port $rpc_port reachable on $B (should listen on $A only)"
reach "$A" "$data_port" || fail "data port not reachable on $A"
reach "$B" "$data_port" && fail "data port reachable on $B (should listen on $A only)"
TCP_PEER_NAME="$B" TE_AUTH_KEY_FILE="$tmp/key" TE_BIND_ADDRESS='*' timeout 60 \
	ip netns exec "$NS" "$peer" initiator "$name" >"$tmp/init" 2>&1 || fail "initiator failed"
grep -q '^OK transfers' "$tmp/init" || fail "no verified transfers with the key"
stop_target

# TE_BIND_ADDRESS=*: every interface.
start_target TE_BIND_ADDRESS='*'
reach "$B" "$rpc_port" || fail "with TE_BIND_ADDRESS=* the RPC port is not reachable on $B"
reach "$B" "$data_port" || fail "with TE_BIND_ADDRESS=* the data port is not reachable on $B"
stop_target
echo "ok: listening on $A only by default, on $B too with TE_BIND_ADDRESS=*; transfers with the key"
exit 0
