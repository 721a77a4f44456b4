#!/usr/bin/env bash
# te-bench from the outside: flags, one-line errors and exit codes, the
# closing lines, --json, --check (and that it catches corruption), the
# progress line, two processes (target and initiator), bytes really crossing
# loopback TCP, and a metadata server when one is installed.
#   $1 te-bench   $2 folder of the "flip" test transport   $3 the source tree
# Other transports and stores are tried when built: te-nvmeof-register and
# te-metadata-server are looked for next to te-bench in the build tree.
set -u
bench=$1
src=$3
tools=$(dirname "$bench")/..
register=$tools/te-nvmeof-register/te-nvmeof-register
mds=$tools/te-metadata-server/te-metadata-server
export TE_PLUGIN_PATH="$2${TE_PLUGIN_PATH:+:$TE_PLUGIN_PATH}"
unset TE_LOG_LEVEL MC_LOG_LEVEL
tmp=$(mktemp -d)
failures=0
pids=()

. "$(dirname "$0")/../common/poll.sh" # free_port, bench_name, wait_port, stop_pids
cleanup() {
	stop_pids "${pids[@]}"
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; failures=$((failures + 1)); }

# run NAME EXPECTED_RC ARGS...: output in $tmp/out and $tmp/err
run() {
	local name=$1 want=$2
	shift 2
	timeout 120 "$bench" "$@" >"$tmp/out" 2>"$tmp/err"
	local rc=$?
	if [ "$rc" != "$want" ]; then
		bad "$name: exit $rc, expected $want"
		sed 's/^/    out: /' "$tmp/out" | head -5
		sed 's/^/    err: /' "$tmp/err" | head -5
		return 1
	fi
	return 0
}

one_line_error() { # NAME PATTERN
	local n
	n=$(wc -l <"$tmp/err")
	if [ "$n" != 1 ] || ! grep -q "^te-bench: $2" "$tmp/err"; then
		bad "$1: wanted one line 'te-bench: $2...', got $n lines:"
		sed 's/^/    err: /' "$tmp/err" | head -5
		return 1
	fi
	ok "$1"
}


plugin_there() { # KIND NAME
	local IFS=:
	for d in $TE_PLUGIN_PATH; do [ -e "$d/libte-$1-$2.so" ] && return 0; done
	return 1
}
# With the same-host transport built, te-bench's default (--protocol=auto)
# serves engines on this host with it.
if plugin_there transport shm; then near=shm; else near=tcp; fi

# --- flags ------------------------------------------------------------------
if run help 0 --help; then
	missing=
	for f in mode metadata_server local_server_name segment_id protocol memory device_name nic_priority_matrix \
		auto_discovery operation remote_offset batch_size block_size buffer_size duration threads report_unit \
		report_precision check json quiet verbose help pattern layers kv_heads head_dim dtype_bytes block_tokens \
		tp tokens rounds; do
		grep -q -- "--$f " "$tmp/out" || missing="$missing $f"
	done
	[ -z "$missing" ] && ok "--help documents every flag" || bad "--help lacks:$missing"
fi
run bogus 1 --bogus=1 && one_line_error "unknown flag" "unknown flag '--bogus=1'"
run badnum 1 --block_size=12x && one_line_error "bad number" "--block_size=12x is not a number"
run zero 1 --batch_size=0 && one_line_error "out of range" "--batch_size=0 is not a number in \[1,"
run badop 1 --operation=copy && one_line_error "bad operation" "--operation=copy: want read, write or mixed"
run badmem 1 --memory=heap && one_line_error "bad memory kind" "--memory=heap: want libte or anonymous"
run badunit 1 --report_unit=parsecs && one_line_error "bad unit" "--report_unit=parsecs"
run noproto 1 --protocol=nosuch --duration=1 && one_line_error "unknown transport" "cannot install transport 'nosuch'"
run unreachable 1 --segment_id=127.0.0.1:1 --duration=1 &&
	one_line_error "unreachable target" "cannot open segment '127.0.0.1:1'"
run badmeta 1 --metadata_server=gopher://x:1 --duration=1 && one_line_error "bad metadata string" "cannot start an engine"
run p2pfile 1 --segment_id=nvmeof/disk0 --protocol=nvmeof && one_line_error "file segment without a store" \
	"--segment_id=nvmeof/disk0 names a file (NVMe-oF) segment"

# --- the default run's output, shortened ----------------------------------------
if run loopback-write 0 --duration=1 --operation=write --block_size=65537 --check --quiet; then
	if grep -Eq '^Test completed: duration [0-9]+\.[0-9]{2}, batch count [1-9][0-9]*, throughput [0-9]+\.[0-9]{2} GB/s$' "$tmp/out" &&
		grep -Eq '^IOPS [1-9][0-9]* requests/s; latency per request p50 [0-9.]+ [mu]s, p99 [0-9.]+ [mu]s, p99\.9 [0-9.]+ [mu]s' "$tmp/out" &&
		grep -Eq '^Per second \(1 s\): min [0-9]+\.[0-9]{2}, median [0-9]+\.[0-9]{2}, max [0-9]+\.[0-9]{2} GB/s$' "$tmp/out" &&
		[ ! -s "$tmp/err" ]; then
		ok "closing lines in Mooncake's form, then IOPS and latency, then the per-second spread; nothing on stderr with --quiet"
	else
		bad "closing lines"; sed 's/^/    /' "$tmp/out" "$tmp/err"
	fi
fi
if run units 0 --duration=1 --report_unit=MiB --report_precision=3 --quiet --block_size=4096; then
	grep -Eq 'throughput [0-9]+\.[0-9]{3} MiB/s$' "$tmp/out" && ok "--report_unit, --report_precision" || bad "units"
fi
if run progress 0 --duration=2 --block_size=4096; then
	grep -Eq '^\[ +1 s\] [0-9.]+ GB/s, [0-9]+ requests/s$' "$tmp/err" && ok "a progress line each second on stderr" ||
		{ bad "progress line"; cat "$tmp/err"; }
fi

# --json, and the bytes really crossed TCP on loopback (lo's counters grew by
# at least as much as te-bench moved)
rx0=$(cat /sys/class/net/lo/statistics/rx_bytes)
if run json 0 --protocol=tcp --duration=1 --json --check --quiet --block_size=1048576 --batch_size=16; then
	rx1=$(cat /sys/class/net/lo/statistics/rx_bytes)
	if python3 - "$tmp/out" "$((rx1 - rx0))" <<'EOF'; then
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, lines
d = json.loads(lines[0])
for k in ("mode", "protocol", "operation", "block_size", "batch_size", "threads", "duration_s",
          "batch_count", "requests", "bytes", "throughput", "report_unit", "iops", "latency_us", "check"):
    assert k in d, k
assert d["mode"] == "loopback" and d["protocol"] == "tcp" and d["transport"] == "tcp" and d["check"] is True
assert d["requests"] == d["batch_count"] * 16 and d["requests"] > 0
assert d["bytes"] == d["requests"] * 1048576
for p in ("p50", "p99", "p999", "max"):
    assert d["latency_us"][p] > 0
ps = d["per_second_bytes_per_s"]
assert ps["seconds"] == 1 and 0 <= ps["min"] <= ps["median"] <= ps["max"], ps
# with --check each measured READ batch also wrote the pattern: twice the bytes at least
assert int(sys.argv[2]) >= 2 * d["bytes"], (sys.argv[2], d["bytes"])
EOF
		ok "--json: one object; the bytes crossed the loopback interface"
	else
		bad "--json"; cat "$tmp/out"
	fi
fi

# --- --check catches a transport that corrupts data --------------------------------
run flip 2 --protocol=flip --check --duration=2 --quiet && one_line_error "--check fails loudly" "DATA MISMATCH"
# A WRITE's mismatch is read once more: the flipped bit stays at the target, or
# the read-back was the one flipped; either way the line says which.
run flip-write 2 --protocol=flip --operation=write --check --duration=2 --quiet &&
	one_line_error "--check reads a mismatched block again" \
		"DATA MISMATCH after WRITE: .*; read again: \(as expected (the first read missed the bytes)\|still different (the target holds other bytes)\)$"
run flip-unchecked 0 --protocol=flip --duration=1 --quiet && ok "without --check the corruption goes unseen"

# --- --pattern=kv: a request's scattered KV-cache blocks, one batch per request ------
if run kv 0 --pattern=kv --protocol=tcp --layers=4 --tokens=250 --duration=1 --check --quiet; then
	if grep -q "^te-bench: loopback kv write over tcp: 4 layers x K,V x 16 blocks of 4 KiB (250 tokens, 128 descriptors, 512 KiB per request" "$tmp/out" &&
		grep -q "^KV pattern, median of 1 round: [0-9.]* ms per request (min [0-9.]*, max [0-9.]*), [0-9.]* us per token, [0-9]* descriptors/s, [0-9.]* GB/s" "$tmp/out" &&
		grep -q "^1 MiB blocks, same bytes, same run: [0-9.]* GB/s .*every byte checked first" "$tmp/out"; then
		ok "--pattern=kv: scattered pieces over TCP, every byte and every gap checked, beside 1 MiB blocks"
	else
		bad "--pattern=kv output"; cat "$tmp/out"
	fi
fi
run kv-flip 2 --pattern=kv --protocol=flip --layers=2 --tokens=64 --duration=1 --check --quiet &&
	one_line_error "--pattern=kv --check fails loudly" "DATA MISMATCH: "
run kv-tp 1 --pattern=kv --kv_heads=6 --tp=4 && one_line_error "--pattern=kv: heads split evenly" \
	"--kv_heads=6 is not a multiple of --tp=4"

# --- --auth_key_file: the cluster key on both sides; without it, refused at once --------
printf '%s\n' 0123456789abcdef-te-bench-key >"$tmp/key"
chmod 600 "$tmp/key"
run auth 0 --protocol=tcp --auth_key_file="$tmp/key" --duration=1 --check --quiet &&
	ok "--auth_key_file: authenticated loopback over TCP, every byte checked"
printf 'short\n' >"$tmp/short.key"
run auth-short 1 --protocol=tcp --auth_key_file="$tmp/short.key" --duration=1 &&
	one_line_error "--auth_key_file with a 5-byte key" "cannot start an engine"
atname="127.0.0.1:$(free_port)"
"$bench" --mode=target --protocol=tcp --local_server_name="$atname" --buffer_size=64M \
	--auth_key_file="$tmp/key" >"$tmp/target-auth" 2>&1 &
atpid=$!
pids+=($atpid)
for _ in $(seq 100); do grep -q "target ready" "$tmp/target-auth" && break; sleep 0.1; done
run auth-initiator 0 --protocol=tcp --segment_id="$atname" --auth_key_file="$tmp/key" \
	--operation=write --duration=1 --check --quiet && ok "--auth_key_file: target and initiator processes"
t0=$(date +%s%N)
run auth-nokey 1 --protocol=tcp --segment_id="$atname" --duration=1 --quiet &&
	[ $(( ($(date +%s%N) - t0) / 1000000 )) -lt 3000 ] && grep -q "authentication" "$tmp/err" &&
	ok "an initiator without the key fails at once, saying why"
kill "$atpid"

# --- two processes: target and initiator ----------------------------------------
"$bench" --mode=target --local_server_name=127.0.0.1 --buffer_size=64M >"$tmp/target" 2>&1 &
pids+=($!)
name=$(bench_name "$tmp/target")
if [ -z "$name" ]; then
	bad "target did not start"; cat "$tmp/target"
elif run initiator 0 --segment_id="$name" --duration=1 --check --quiet --block_size=4096 --threads=2; then
	grep -q "^te-bench: initiator read over $near" "$tmp/out" && ok "initiator against a target process, over $near" ||
		{ bad "initiator header"; cat "$tmp/out"; }
	if run initiator-tcp 0 --protocol=tcp --segment_id="$name" --duration=1 --check --quiet --operation=write; then
		grep -q "^te-bench: initiator write over tcp" "$tmp/out" && ok "--protocol=tcp forces TCP on one host" ||
			{ bad "initiator header with --protocol=tcp"; cat "$tmp/out"; }
	fi
	if [ "$near" = shm ] && run initiator-anon 0 --memory=anonymous --segment_id="$name" --duration=1 --check --quiet; then
		grep -q "^te-bench: initiator read over shm" "$tmp/out" && ok "--memory=anonymous, over shm" ||
			{ bad "initiator header with --memory=anonymous"; cat "$tmp/out"; }
	fi
	kill "${pids[-1]}"
	wait "${pids[-1]}" && ok "target stops cleanly on SIGTERM" || bad "target exit status"
fi

# --- a metadata server, when this machine has one -----------------------------------
# two_processes LABEL CONN: a target process and an initiator process that find
# each other through the store CONN; the target's keys leave with it.
two_processes() {
	# named host:port as Mooncake nodes are: the host part is where peers reach it
	local label=$1 md=$2 tname="127.0.0.1:$(free_port)" up=
	"$bench" --mode=target --metadata_server="$md" --local_server_name="$tname" --buffer_size=64M \
		>"$tmp/target-$label" 2>&1 &
	local tpid=$!
	pids+=($tpid)
	for _ in $(seq 100); do
		grep -q "target ready, segment name $tname " "$tmp/target-$label" && { up=1; break; }
		sleep 0.1
	done
	if [ -z "$up" ]; then
		bad "$label: target process did not start"; sed 's/^/    /' "$tmp/target-$label" | head -5
		return
	fi
	run "$label-initiator" 0 --metadata_server="$md" --local_server_name="127.0.0.1:$(free_port)" \
		--segment_id="$tname" --operation=write --duration=1 --check --quiet &&
		grep -q "^te-bench: initiator write over $near" "$tmp/out" &&
		ok "target and initiator processes through $label"
	kill "$tpid"
	wait "$tpid" || bad "$label: target exit status"
}

# through NAME URL PORT PID: the metadata server PID, started in the
# background, at URL: once it listens on PORT, a loopback run and two
# processes through it.
through() {
	pids+=("$4")
	wait_port "$3"
	run "$1" 0 --metadata_server="$2" --duration=1 --check --quiet &&
		ok "loopback through $1://"
	two_processes "$1" "$2"
}

if command -v etcd >/dev/null && plugin_there metadata etcd; then
	cp=$(free_port); pp=$(free_port)
	etcd --data-dir "$tmp/etcd" --listen-client-urls "http://127.0.0.1:$cp" \
		--advertise-client-urls "http://127.0.0.1:$cp" --listen-peer-urls "http://127.0.0.1:$pp" \
		--initial-advertise-peer-urls "http://127.0.0.1:$pp" --initial-cluster "default=http://127.0.0.1:$pp" \
		--log-level error >"$tmp/etcd.log" 2>&1 &
	through etcd "etcd://127.0.0.1:$cp" "$cp" $!
else
	echo "note: no etcd server or etcd plugin here; etcd:// not exercised"
fi
if command -v redis-server >/dev/null && plugin_there metadata redis; then
	rp=$(free_port)
	redis-server --port "$rp" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" >"$tmp/redis.log" 2>&1 &
	through redis "redis://127.0.0.1:$rp" "$rp" $!
	# An NVMe-oF file segment: remote offsets start at 0 (from te_segment_buffers).
	if [ -x "$register" ] && plugin_there transport nvmeof; then
		truncate -s 64M "$tmp/disk0.img"
		md="redis://127.0.0.1:$rp"
		if "$register" -m "$md" register disk0 "$tmp/disk0.img" >/dev/null &&
			"$register" -m "$md" mount disk0 "$tmp/disk0.img" "$tmp/disk0.img" --host te-bench-host >/dev/null; then
			for op in write read; do
				# the engine opens only what TE_NVMEOF_ALLOW lists
				TE_NVMEOF_ALLOW=$tmp run "nvmeof-$op" 0 --metadata_server="$md" --protocol=nvmeof --segment_id=nvmeof/disk0 \
					--local_server_name=te-bench-host --operation=$op --duration=1 --check --quiet \
					--block_size=1M --batch_size=16 &&
					grep -q "^te-bench: initiator $op over nvmeof" "$tmp/out" && ok "NVMe-oF file segment, $op"
			done
		else
			bad "cannot register the NVMe-oF segment"
		fi
	fi
else
	echo "note: no redis server or redis plugin here; redis:// not exercised"
fi

if [ -x "$mds" ] && plugin_there metadata http; then
	hp=$(free_port)
	"$mds" --listen "127.0.0.1:$hp" >"$tmp/mds.log" 2>&1 &
	through http "http://127.0.0.1:$hp/metadata" "$hp" $!
else
	echo "note: no te-metadata-server or http plugin here; http:// not exercised"
fi

# --- RDMA, through the tests' copy of the plugin (its software verbs layer) and a
# sysfs fixture; the shipped plugin has no software verbs.
fixture=$src/tests/rdma/fixtures/two-socket
soft=$tools/../tests/rdma/soft-verbs
if [ -e "$soft/libte-transport-rdma.so" ] && [ -d "$fixture/sys/class/infiniband" ]; then
	saved_path=$TE_PLUGIN_PATH
	export TE_PLUGIN_PATH="$soft:$TE_PLUGIN_PATH" TE_RDMA_SOFT=1 TE_RDMA_SYSFS_ROOT="$fixture"
	run rdma-read 0 --protocol=rdma --duration=1 --check --quiet &&
		grep -q "loopback read over rdma" "$tmp/out" && ok "--protocol=rdma (software verbs)"
	dev=$(ls "$fixture/sys/class/infiniband" | head -1)
	run rdma-write 0 --protocol=rdma --device_name="$dev" --operation=write --duration=1 --check --quiet &&
		ok "--protocol=rdma --device_name=$dev"
	unset TE_RDMA_SOFT TE_RDMA_SYSFS_ROOT
	export TE_PLUGIN_PATH=$saved_path
else
	echo "note: no rdma test plugin or fixture here; --protocol=rdma not exercised"
fi

echo "$failures failed"
[ "$failures" = 0 ]
