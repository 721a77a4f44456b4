#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Integration runs under valgrind's memcheck: no invalid access, no use of
# uninitialised memory, no definite leak.
#   - a te-bench target and a te-bench initiator (both under valgrind), TCP,
#     mixed reads and writes with every byte checked;
#   - the same pair over the same-host transport;
#   - test-restart (a target killed and restarted; the initiator under valgrind);
#   - test-tcp-transfers' cancel, v1-peer and mixed-batch cases.
#
#   memcheck.sh TE_BENCH TEST_RESTART TCP_PEER TEST_TCP_TRANSFERS
# Skips (exit 77) without valgrind.
set -uo pipefail
bench=$1 restart=$2 peer=$3 transfers=$4

command -v valgrind >/dev/null || { echo "valgrind not installed"; exit 77; }
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
export G_SLICE=always-malloc G_DEBUG=gc-friendly
vg=(valgrind --quiet --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite
    --error-exitcode=99 --num-callers=30)
failed=0

check() { # name, log, exit status
	if [ "$3" -ne 0 ]; then
		echo "FAIL $1 (exit $3)"
		sed -n '1,80p' "$2"
		failed=1
	else
		echo "ok   $1"
	fi
}

pair() { # protocol
	local proto=$1 name=""
	"${vg[@]}" --log-file="$tmp/target-$proto.vg" "$bench" --mode=target --local_server_name=127.0.0.1 \
		--protocol="$proto" --buffer_size=16M >"$tmp/target-$proto.out" 2>&1 &
	local tpid=$!
	pids+=("$tpid")
	for _ in $(seq 1 600); do
		name=$(sed -n "s/.*segment name \([^ ]*\) .*/\1/p" "$tmp/target-$proto.out" | head -1)
		[ -n "$name" ] && break
		kill -0 "$tpid" 2>/dev/null || break
		sleep 0.1
	done
	if [ -z "$name" ]; then
		check "te-bench target over $proto" "$tmp/target-$proto.out" 1
		return
	fi
	"${vg[@]}" --log-file="$tmp/init-$proto.vg" "$bench" --segment_id="$name" --protocol="$proto" \
		--operation=mixed --check --duration=2 --buffer_size=16M --block_size=65536 --batch_size=16 \
		>"$tmp/init-$proto.out" 2>&1
	local rc=$?
	[ $rc -eq 0 ] && grep -q . "$tmp/init-$proto.vg" && rc=98
	cat "$tmp/init-$proto.vg" >>"$tmp/init-$proto.out"
	check "te-bench initiator over $proto (checked)" "$tmp/init-$proto.out" $rc
	kill -TERM "$tpid"
	wait "$tpid"
	rc=$?
	[ $rc -eq 0 ] && grep -q . "$tmp/target-$proto.vg" && rc=98
	cat "$tmp/target-$proto.vg" >>"$tmp/target-$proto.out"
	check "te-bench target over $proto" "$tmp/target-$proto.out" $rc
}

pair tcp
pair shm

"${vg[@]}" --log-file="$tmp/restart.vg" "$restart" "$peer" >"$tmp/restart.out" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q . "$tmp/restart.vg" && rc=98
cat "$tmp/restart.vg" >>"$tmp/restart.out"
check "test-restart" "$tmp/restart.out" $rc

for t in test_cancel test_v1_peer test_mixed_batch; do
	TE_TEST_ONLY=$t "${vg[@]}" --log-file="$tmp/$t.vg" "$transfers" >"$tmp/$t.out" 2>&1
	rc=$?
	[ $rc -eq 0 ] && grep -q . "$tmp/$t.vg" && rc=98
	cat "$tmp/$t.vg" >>"$tmp/$t.out"
	check "test-tcp-transfers $t" "$tmp/$t.out" $rc
done
exit $failed
