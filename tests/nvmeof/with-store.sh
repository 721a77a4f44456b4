#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Runs a test program against a real metadata server started here, on a free
# loopback port in a scratch folder, and stopped on exit whatever happens:
#   with-store.sh redis|etcd PROGRAM [ARGS...]
# The program finds the connection string in NV_METADATA. Exits 77 (skipped)
# when the server is not installed.
set -u

kind=$1
shift
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/te-nvmeof-store-XXXXXX")
pid=
. "$(dirname "$0")/../common/poll.sh" # stop_pids
cleanup() {
	[ -n "$pid" ] && stop_pids "$pid"
	rm -rf "$dir"
}
trap cleanup EXIT INT TERM

port_free() {
	! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

for attempt in $(seq 10); do
	port=$((20000 + RANDOM % 20000))
	peer=$((port + 1))
	port_free "$port" && port_free "$peer" || continue
	case $kind in
	redis)
		command -v redis-server >/dev/null || { echo "redis-server not installed"; exit 77; }
		redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save '' --appendonly no \
			>"$dir/server.log" 2>&1 &
		pid=$!
		conn="redis://127.0.0.1:$port"
		;;
	etcd)
		command -v etcd >/dev/null || { echo "etcd not installed"; exit 77; }
		etcd --data-dir "$dir/etcd" --listen-client-urls "http://127.0.0.1:$port" \
			--advertise-client-urls "http://127.0.0.1:$port" \
			--listen-peer-urls "http://127.0.0.1:$peer" \
			--initial-advertise-peer-urls "http://127.0.0.1:$peer" \
			--initial-cluster "default=http://127.0.0.1:$peer" >"$dir/server.log" 2>&1 &
		pid=$!
		conn="etcd://127.0.0.1:$port"
		;;
	*)
		echo "unknown store $kind"
		exit 2
		;;
	esac
	# up when it accepts connections (bounded: 10 s)
	for _ in $(seq 100); do
		kill -0 "$pid" 2>/dev/null || break
		port_free "$port" || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null && ! port_free "$port"; then
		[ "$kind" = etcd ] && sleep 0.5 # the gateway answers a moment after the port opens
		NV_METADATA=$conn "$@"
		exit $?
	fi
	kill "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	pid=
done
echo "could not start $kind; its log:"
cat "$dir/server.log" 2>/dev/null
exit 1
