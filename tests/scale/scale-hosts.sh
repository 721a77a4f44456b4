#!/bin/sh
# scale-run with its engines on M simulated hosts: M network namespaces, each
# joined by a veth pair to a bridge in this namespace, where etcd runs (at
# .1 of the subnet); engine i runs in namespace i % M at .(2 + i % M), so
# traffic between engines of two hosts crosses the bridge, and engines of
# one host share its address as they would a machine's.
# Usage: scale-hosts.sh SCALE_RUN M N [K [TTL]]. Root and iproute2 (exits 77,
# skipped, without them). Everything it made goes at exit.
set -u
run=$1 hosts=$2
shift 2
[ "$(id -u)" = 0 ] || { echo "scale-hosts: needs root (network namespaces); skipped"; exit 77; }
command -v ip >/dev/null || { echo "scale-hosts: needs iproute2; skipped"; exit 77; }
tag=$$
subnet=10.218.$((tag % 250))
br=tesc$tag
made=""
cleanup() {
  for ns in $made; do ip netns del "$ns" 2>/dev/null; done
  ip link del "$br" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 1' INT TERM
fail() { echo "scale-hosts: $*"; exit 1; }

ip link add "$br" type bridge || fail "cannot create bridge $br"
ip addr add "$subnet.1/24" dev "$br" && ip link set "$br" up || fail "cannot set up $br"
h=0
while [ "$h" -lt "$hosts" ]; do
  ns=te-scale-$tag-$h
  ip netns add "$ns" || fail "cannot create namespace $ns"
  made="$made $ns"
  ip link add "tesh$tag-$h" type veth peer name "tesp$tag-$h" 2>/dev/null ||
    ip link add "th$tag$h" type veth peer name "tp$tag$h" || fail "cannot create veth pair $h"
  # interface names are at most 15 characters
  hv=tesh$tag-$h pv=tesp$tag-$h
  ip link show "$hv" >/dev/null 2>&1 || { hv=th$tag$h; pv=tp$tag$h; }
  ip link set "$pv" netns "$ns" && ip link set "$hv" master "$br" && ip link set "$hv" up ||
    fail "cannot wire host $h"
  ip -n "$ns" addr add "$subnet.$((2 + h))/24" dev "$pv" && ip -n "$ns" link set "$pv" up &&
    ip -n "$ns" link set lo up && ip -n "$ns" route add default via "$subnet.1" ||
    fail "cannot address host $h"
  h=$((h + 1))
done
SCALE_HOSTS=$hosts SCALE_SUBNET=$subnet SCALE_TAG=$tag "$run" "$@"
