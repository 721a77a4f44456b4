#!/bin/sh
# Runs inside the qemu guest (chrooted into the host's read-only root, see
# guest-init.sh): sets up Soft-RoCE and runs one scenario's checks against
# it, writing "PASS name (Ns)" / "FAIL name (Ns)" lines to SCRATCH/results
# and each check's output to SCRATCH/<name>.log.
#
#   guest.sh BUILD_DIR SOURCE_DIR SCRATCH SCENARIO
#
# The network: four RoCE NICs on one switch. nicN (10.9.0.N+1) is one end
# of a veth pair whose other end, swN, is a port of the bridge "sw"; rxeN is
# the Soft-RoCE device over nicN. Engines on "host A" use rxe0 and rxe1,
# those on "host B" rxe2 and rxe3. All four addresses belong to this one
# kernel, so policy routing sends traffic between them out of the source
# NIC and across the switch instead of through the loopback device (rdma_rxe
# in this kernel works in the initial network namespace only, so the hosts
# cannot be namespaces). Pulling rxeN's cable is taking swN down: nicN
# loses its carrier and rxeN its port (TE_RDMA_TEST_LINKS for the tests).
build=$1 src=$2 scratch=$3 scenario=$4
res=$scratch/results
here=$src/tests/rdma-qemu
# te-bench and te-info load the shipped plugin; the plugin's tests load their
# own copy of it (same sources, with test statistics; on libibverbs here, as
# TE_RDMA_SOFT is unset): the checks below run them under "env" with that
# copy's folder first on TE_PLUGIN_PATH.
export TE_PLUGIN_PATH="$build/plugins/transport/rdma:$build/plugins/transport/tcp:$build/plugins/transport/shm"
unset TE_RDMA_SOFT TE_RDMA_SYSFS_ROOT
soft=$build/tests/rdma/soft-verbs
soft_path=$soft:$TE_PLUGIN_PATH soft_plugin=$soft/libte-transport-rdma.so
export TE_RDMA_TEST_LINKS=sw0,sw1,sw2,sw3
[ "${scenario#fn:}" = "$scenario" ] && : > "$res"

skip() { echo "SKIP: $*" > "$scratch/skip"; exit 0; }

# ------------------------------------------------------------------ setup
setup_net() {
	modprobe -a veth bridge crc32_generic rdma_rxe ib_uverbs ||
		skip "this kernel cannot load veth, bridge, crc32_generic, rdma_rxe and ib_uverbs"
	command -v rdma > /dev/null || skip "the rdma tool (iproute2) is missing"
	ip link set lo up
	for k in all default; do
		sysctl -qw net.ipv4.conf.$k.rp_filter=0 net.ipv4.conf.$k.accept_local=1 \
			net.ipv4.conf.$k.arp_ignore=1 net.ipv4.conf.$k.arp_announce=2
	done
	ip link add sw type bridge && ip link set sw up || skip "cannot create a bridge"
	for i in 0 1 2 3; do
		ip link add nic$i type veth peer name sw$i || skip "cannot create veth pairs"
		ip link set sw$i master sw
		ip link set sw$i up
		ip addr add 10.9.0.$((i + 1))/24 dev nic$i
		ip link set nic$i up
	done
	for i in 0 1 2 3; do
		ip rule add pref 10 iif lo from 10.9.0.$((i + 1)) lookup $((100 + i))
		for j in 0 1 2 3; do
			[ $i = $j ] || ip route add 10.9.0.$((j + 1)) dev nic$i src 10.9.0.$((i + 1)) table $((100 + i))
		done
	done
	ip rule del pref 0 lookup local && ip rule add pref 100 lookup local
	for i in 0 1 2 3; do
		rdma link add rxe$i type rxe netdev nic$i || skip "rdma link add rxe$i failed (no Soft-RoCE here)"
	done
	# The ports come up with the carrier; give ib_core a moment for the GIDs.
	n=0
	while [ $n -lt 50 ]; do
		up=$(rdma link show 2>/dev/null | grep -c 'state ACTIVE')
		[ "$up" = 4 ] && break
		sleep 0.1
		n=$((n + 1))
	done
	rdma link show > "$scratch/setup.log" 2>&1
}

# --------------------------------------------------------------- checking
# check NAME TIMEOUT CMD...: runs CMD with a time limit, records the result.
check() {
	name=$1 limit=$2
	shift 2
	t0=$(date +%s)
	echo "== $name: $*" > "$scratch/$name.log"
	timeout -k 5 "$limit" "$@" >> "$scratch/$name.log" 2>&1
	rc=$?
	dt=$(($(date +%s) - t0))
	if [ $rc = 0 ]; then
		echo "PASS $name (${dt}s)" >> "$res"
	else
		[ $rc = 124 ] && echo "== timed out after ${limit}s" >> "$scratch/$name.log"
		echo "FAIL $name (${dt}s, exit $rc)" >> "$res"
	fi
	echo "te-guest: $name exit $rc in ${dt}s" > /dev/console
	return $rc
}
# Only the checks named in TE_QEMU_ONLY (space-separated), when set.
wanted() { [ -z "${TE_QEMU_ONLY:-}" ] || echo " $TE_QEMU_ONLY " | grep -q " $1 "; }

bench=$build/tools/te-bench/te-bench

# pkts DEV sent|rcvd: the device's packet counter.
pkts() { cat "/sys/class/infiniband/$1/ports/1/hw_counters/$2_pkts"; }

# wait_log FILE PATTERN TRIES: until a line of FILE matches PATTERN (grep),
# looking every 0.2 s, TRIES times at the most.
wait_log() {
	n=0
	until grep -q "$2" "$1" || [ $n -ge "$3" ]; do
		sleep 0.2
		n=$((n + 1))
	done
}

# Starts a te-bench target on rxe2+rxe3 at 127.0.0.1:PORT; sets $tpid.
start_target() { # port, extra flag; $proto: the transports (rdma)
	"$bench" --mode=target --protocol="${proto:-rdma}" --device_name=rxe2,rxe3 \
		--local_server_name=127.0.0.1:$1 --buffer_size=16777216 $2 > "$scratch/target-$1.log" 2>&1 &
	tpid=$!
	wait_log "$scratch/target-$1.log" 'target ready' 150
}

# The target's NIC rxe2 changes address (10.9.0.3 -> 10.9.0.7) while an
# initiator writes to it: its GID changes; transfers go on over rxe3, and
# rxe2 serves again once the endpoints are rebuilt with the new GID.
readdressed() {
	start_target 17210 --verbose
	"$bench" --protocol=rdma --device_name=rxe0,rxe1 --segment_id=127.0.0.1:17210 \
		--local_server_name=127.0.0.1 --operation=write --threads=2 --check --duration=14 \
		--buffer_size=16777216 --batch_size=16 --block_size=65536 --quiet &
	bpid=$!
	sleep 4
	r0=$(pkts rxe2 rcvd)
	ip addr del 10.9.0.3/24 dev nic2 && ip addr add 10.9.0.7/24 dev nic2 || return 1
	ip rule add pref 10 iif lo from 10.9.0.7 lookup 102
	for i in 0 1 3; do ip route add 10.9.0.7 dev nic$i src 10.9.0.$((i + 1)) table $((100 + i)); done
	echo "rxe2 readdressed after $r0 packets received"
	sleep 5 # failed paths paused (2 s), endpoints rebuilt
	r1=$(pkts rxe2 rcvd)
	wait $bpid
	rc=$?
	r2=$(pkts rxe2 rcvd)
	kill $tpid; wait $tpid
	echo "rxe2 received $((r2 - r1)) packets in the last seconds (te-bench exit $rc)"
	grep 'GID changed' "$scratch/target-17210.log"
	[ $rc = 0 ] && [ $((r2 - r1)) -gt 100 ] && grep -q 'rxe2 port 1: the GID changed' "$scratch/target-17210.log"
}
# Fail-over across transports: te-bench with RDMA and TCP installed on both
# sides writes with --check while every RDMA link of the target (sw2, sw3)
# is down for 3 s: its tasks go over TCP meanwhile (127.0.0.1), no task
# fails (te-bench exits 0) and no second passes without requests but, once,
# the one in which RDMA takes them back; RDMA carries them again after.
transport_failover() {
	proto=rdma,tcp start_target 17230
	"$bench" --protocol=rdma,tcp --device_name=rxe0,rxe1 --segment_id=127.0.0.1:17230 \
		--local_server_name=127.0.0.1 --operation=write --threads=2 --check --duration=16 \
		--buffer_size=16777216 --batch_size=16 --block_size=65536 --verbose > "$scratch/failover.log" 2>&1 &
	bpid=$!
	# Under TCG the first requests take a few seconds (handshakes, memory
	# registration): the links go down 2 s after the first second reported.
	wait_log "$scratch/failover.log" '^\[ *[0-9]* s\]' 100
	sleep 2
	ip link set sw2 down && ip link set sw3 down || return 1
	d0=$(($(pkts rxe0 sent) + $(pkts rxe1 sent)))
	sleep 3
	d1=$(($(pkts rxe0 sent) + $(pkts rxe1 sent)))
	ip link set sw2 up && ip link set sw3 up || return 1
	echo "RDMA links of the target down for 3 s: the initiator's NICs sent $((d1 - d0)) packets meanwhile"
	wait $bpid
	rc=$?
	d2=$(($(pkts rxe0 sent) + $(pkts rxe1 sent)))
	kill $tpid; wait $tpid
	grep -v ' \[rdma\] \| \[tcp\] ' "$scratch/failover.log" | tail -n 30
	# The per-second lines and the initiator's log lines stand in one file, in
	# order: the seconds before the first move to TCP (detection), those while
	# TCP carries the tasks, and those after RDMA takes them back. A second
	# without requests counts against its phase (a second with none prints no
	# line, or a line of 0 at the start).
	gaps=$(awk '/its tasks go over tcp/ { if (!ph) ph = 1 }
		/back on transport rdma/ { ph = 2 }
		match($0, /^\[ *[0-9]+ s\] .*, [0-9]+ requests\/s$/) {
			sub(/^\[ */, ""); n = $0; sub(/ s\].*/, "", n); r = $0; sub(/.*, /, "", r); sub(/ .*/, "", r)
			if (s && (n != prev + 1 || r == 0)) g[ph + 0]++
			if (r > 0) s = 1; prev = n
		}
		END { print g[0] + 0, g[1] + 0, g[2] + 0 }' "$scratch/failover.log")
	set -- $gaps
	secs=$(grep -c '^\[ *[0-9]* s\]' "$scratch/failover.log")
	echo "te-bench exit $rc; $secs seconds reported, without a request: $1 before the move to TCP, $2 over TCP, $3 after; $((d2 - d1)) RDMA packets after the links came back"
	grep 'its tasks go over tcp' "$scratch/failover.log" | head -n 2
	# While TCP carries the tasks, at most one second passes without requests:
	# a task that probes RDMA again holds its batch until the path fails
	# again (1-2 s under TCG). Before the move, the initiator learns that the
	# links are gone only when its queue pairs give up on their
	# retransmissions (up to 2.5 s once with the guest on a loaded host).
	# After RDMA takes the tasks back, Soft-RoCE's first requests on a rebuilt
	# path may wait for a retransmission (a p99 of ~1 s once). At most four
	# such seconds in all (of 16; a guest on a loaded host also stalls now and
	# then): a run in which TCP did not carry the tasks has many more.
	[ $rc = 0 ] && [ "$2" -le 1 ] && [ $(($1 + $2 + $3)) -le 4 ] && [ "$secs" -ge 8 ] &&
		[ $((d2 - d1)) -gt 1000 ] &&
		grep -q 'its tasks go over tcp' "$scratch/failover.log"
}

small="--buffer_size=16777216 --batch_size=16 --block_size=65536 --duration=3 --quiet"

case "$scenario" in
fn:*)
	# One of the functions above, as a check of its own (see "check").
	${scenario#fn:}
	exit $?
	;;
esac

setup_net
case "$scenario" in
plugin)
	# The plugin's own tests, on the real provider (rxe0..3 stand for the
	# fixture's mlx5_0..3).
	export TE_RDMA_TEST_DEVICES=rxe0,rxe1,rxe2,rxe3
	for t in transfer failover install pool; do
		wanted "rdma-$t" && check "rdma-$t" 240 env TE_PLUGIN_PATH="$soft_path" \
			TE_RDMA_PLUGIN="$soft_plugin" "$build/tests/rdma/test-rdma-$t"
	done
	# Mooncake's getNicLoadStats() over two rxe NICs per engine.
	wanted rdma-mooncake-nic-load && check rdma-mooncake-nic-load 120 env TE_PLUGIN_PATH="$soft_path" \
		TE_RDMA_PLUGIN="$soft_plugin" "$build/tests/compat/test-mooncake-metrics" rdma
	wanted te-info && check te-info 60 sh -c "TE_PLUGINS= '$build/tools/te-info/te-info' > '$scratch/te-info.out' 2>&1;
		cat '$scratch/te-info.out'; grep -q '^    rxe0 ' '$scratch/te-info.out' &&
		grep -q 'port 1 ACTIVE, Ethernet' '$scratch/te-info.out' &&
		grep -q 'GID index 1 chosen automatically (RoCE v2, IPv4' '$scratch/te-info.out' &&
		! grep -q 'PCI virtual' '$scratch/te-info.out'"
	;;
bench)
	# te-bench in one process (both engines on rxe0) and as two processes
	# (target on rxe2+rxe3, initiator on rxe0+rxe1), READ and WRITE, every
	# byte checked.
	for op in read write; do
		wanted "bench-loopback-$op" && check "bench-loopback-$op" 60 \
			"$bench" --protocol=rdma --device_name=rxe0 --operation=$op --check $small
	done
	for op in read write; do
		wanted "bench-2proc-$op" || continue
		port=$((17100 + ${#op}))
		start_target $port
		s0=$(pkts rxe0 sent) s1=$(pkts rxe1 sent) r2=$(pkts rxe2 rcvd) r3=$(pkts rxe3 rcvd)
		check "bench-2proc-$op" 90 "$bench" --protocol=rdma --device_name=rxe0,rxe1 \
			--segment_id=127.0.0.1:$port --local_server_name=127.0.0.1 --operation=$op \
			--threads=2 --check $small
		# Both of the initiator's NICs sent, both of the target's received.
		check "bench-2proc-$op-nics" 10 test $(($(pkts rxe0 sent) - s0)) -gt 1000 -a \
			$(($(pkts rxe1 sent) - s1)) -gt 1000 -a $(($(pkts rxe2 rcvd) - r2)) -gt 1000 -a \
			$(($(pkts rxe3 rcvd) - r3)) -gt 1000
		kill "$tpid" 2>/dev/null
		wait "$tpid" 2>/dev/null
	done
	# Fail-over across transports, te-bench's way (a plain build's scenario:
	# te-bench's runs are what this one is about).
	wanted transport-failover && check transport-failover 120 sh "$0" "$build" "$src" "$scratch" \
		fn:transport_failover
	;;
faults)
	export TE_RDMA_TEST_DEVICES=rxe0,rxe1,rxe2,rxe3
	wanted peer-killed && check peer-killed 180 env TE_PLUGIN_PATH="$soft_path" \
		TE_RDMA_PLUGIN="$soft_plugin" "$build/tests/rdma-qemu/test-rxe-peer-killed"
	wanted readdressed && check readdressed 120 sh "$0" "$build" "$src" "$scratch" fn:readdressed
	;;
smoke)
	# By hand: the provider itself, without libte (perftest's and
	# rdma-core's own tools, when installed).
	wanted pingpong && check pingpong 60 sh -c "ibv_rc_pingpong -d rxe2 -g 1 -n 50 & sleep 1;
		ibv_rc_pingpong -d rxe0 -g 1 -n 50 127.0.0.1; rc=\$?; wait; exit \$rc"
	;;
*)
	echo "FAIL unknown-scenario-$scenario" >> "$res"
	;;
esac
exit 0
