#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# nvmeof-bench beside fio on the same file or block device, block size, queue
# depth, direct flag, buffer memory (2 MiB huge pages for both: fio
# --iomem=shmhuge) and written bytes (random, filled once: fio
# --scramble_buffers=0; a compressing device such as zram would otherwise do
# different work for each), interleaved round by round (fio, then libte) so drifting
# load hits both alike; caches are dropped before every run. Each run is
# measured for throughput and, around the whole process (every thread, the
# kernel's io_uring workers included), for CPU time, context switches and
# system calls per request (perf stat; without perf, /usr/bin/time gives CPU
# and switches). Prints every run, then the medians and their ratios. Needs
# root (drop_caches, vm.nr_hugepages, which it raises for the run and
# restores).
#
#   bench-vs-fio.sh BUILD_DIR FILE|DEVICE [ROUNDS [RUNTIME_S [QD]]]
# Environment: CASES (default "randread:4k randwrite:4k read:1m write:1m"),
#              MODES (default "block poll": nvmeof-bench waiting in te_batch_wait,
#              or polling task status like Mooncake's transfer_engine_bench),
#              THREADS_BLOCK, THREADS_POLL (nvmeof-bench --threads of each
#              mode; default 1 and 1, like fio's one job),
#              HUGEPAGES (default 1; 0 = ordinary pages for both),
#              QUIET_WAIT (seconds to wait, before each round, for the CPUs to be
#              90% idle over 2 s; default 60, 0 = do not wait).
set -eu

build=$1
file=$2
rounds=${3:-5}
runtime=${4:-10}
qd=${5:-32}
cases=${CASES:-"randread:4k randwrite:4k read:1m write:1m"}
threads_block=${THREADS_BLOCK:-1}
threads_poll=${THREADS_POLL:-1}
huge=${HUGEPAGES:-1}
modes=${MODES:-"block poll"}

bench="$build/tests/nvmeof/nvmeof-bench"
[ -x "$bench" ] || { echo "$bench: not built" >&2; exit 1; }
# A block device's size comes from the device (its st_size is 0).
if [ -b "$file" ]; then
	size=$(blockdev --getsize64 "$file")
elif [ -f "$file" ]; then
	size=$(stat -c %s "$file")
else
	echo "$file: neither a regular file nor a block device" >&2
	exit 1
fi
[ "$size" -gt 0 ] || { echo "$file: empty" >&2; exit 1; }

store=$(mktemp -d "${TMPDIR:-/tmp}/te-nvmeof-store-XXXXXX")
stats=$(mktemp)
results=$(mktemp)
old_huge=$(cat /proc/sys/vm/nr_hugepages)
trap 'rm -rf "$store" "$stats" "$results"; echo "$old_huge" > /proc/sys/vm/nr_hugepages' EXIT INT TERM
fio_mem=
if [ "$huge" = 1 ]; then
	# the largest buffer (qd x 1 MiB) in 2 MiB pages, plus slack
	echo $((old_huge + qd / 2 + 8)) > /proc/sys/vm/nr_hugepages
	fio_mem=--iomem=shmhuge
fi
export TE_PLUGIN_PATH="$build/tests/nvmeof:$build/plugins/transport/nvmeof"

quiet_wait=${QUIET_WAIT:-60}
use_perf=0
if perf stat -e raw_syscalls:sys_enter,context-switches,task-clock true >/dev/null 2>&1; then
	use_perf=1
fi

# Shared machines: start each round when the CPUs are (nearly) idle. Sets
# `idle` to the idle share seen last (percent).
idle=-
quiet() {
	end=$(($(date +%s) + quiet_wait))
	while :; do
		set -- $(head -1 /proc/stat)
		t1=$(($2 + $3 + $4 + $5 + $6 + $7 + $8 + $9)) i1=$5
		sleep 2
		set -- $(head -1 /proc/stat)
		t2=$(($2 + $3 + $4 + $5 + $6 + $7 + $8 + $9)) i2=$5
		idle=$((100 * (i2 - i1) / (t2 - t1)))
		[ "$idle" -ge 90 ] && return 0
		[ "$(date +%s)" -lt "$end" ] || break
	done
	[ "$quiet_wait" -gt 0 ] && echo "(round started on a busy machine: ${idle}% idle)" >&2
	return 0
}

drop() {
	sync
	echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
}

# Runs a command under perf stat (or time) with its output kept; leaves
# "<cpu seconds> <context switches> <system calls or ->" in $stats.
measured() {
	if [ "$use_perf" = 1 ]; then
		perf stat -x, -o "$stats.raw" -e task-clock,context-switches,raw_syscalls:sys_enter -- "$@"
		awk -F, '$3 == "task-clock" {c = $1 / 1000} $3 == "context-switches" {s = $1}
			 $3 ~ /sys_enter/ {y = $1} END {print c, s, y}' "$stats.raw" > "$stats"
	else
		/usr/bin/time -o "$stats.raw" -f "%U %S %w %c" "$@"
		awk 'END {print $1 + $2, $3 + $4, "-"}' "$stats.raw" > "$stats"
	fi
}

# "<MiB/s> <requests>" of one fio run
fio_run() { # rw bs
	measured fio --name=te --filename="$file" --rw="$1" --bs="$2" --iodepth="$qd" --direct=1 \
		--ioengine=io_uring $fio_mem --runtime="$runtime" --time_based --size="$size" \
		--scramble_buffers=0 --minimal 2>/dev/null |
		awk -F';' -v bs="$bytes" '{printf "%.1f %d\n", ($7 + $48) / 1024, ($6 + $47) * 1024 / bs}'
}

# "<MiB/s> <requests>" of one nvmeof-bench run
te_run() { # rw mode
	case $1 in
	randread) op=read pat=rand ;; randwrite) op=write pat=rand ;;
	read) op=read pat=seq ;; write) op=write pat=seq ;;
	esac
	if [ "$2" = poll ]; then poll=1 threads=$threads_poll; else poll=0 threads=$threads_block; fi
	measured "$bench" -m "file://$store" --file "$file" --op $op --pattern $pat --bs "$bytes" \
		--qd "$qd" --threads "$threads" --runtime "$runtime" --poll $poll --hugepages "$huge" |
		awk '/^RESULT/ {print $6, $9}'
}

# One result line: case bs tool MiB/s cpu-us/request switches/request
# syscalls/request round
record() { # rw bs tool "MiB/s requests"
	set -- "$1" "$2" "$3" $4 $(cat "$stats")
	awk -v c="$1 $2 $3" -v m="$4" -v n="$5" -v cpu="$6" -v cs="$7" -v sc="$8" -v r="$r" 'BEGIN {
		if (n <= 0) n = 1
		printf "%s %s %.2f %.4f %s %d\n", c, m, cpu * 1e6 / n, cs / n,
		       sc == "-" ? "-" : sprintf("%.2f", sc / n), r }' >> "$results"
	case $3 in fio) echo "fio $4" ;; *) echo "libte-$3 $4" ;; esac
}

# One run of `tool` (fio or a mode), after dropping the caches.
run_tool() { # rw bs tool
	drop
	if [ "$3" = fio ]; then
		record "$1" "$2" fio "$(fio_run "$1" "$2")"
	else
		record "$1" "$2" "$3" "$(te_run "$1" "$3")"
	fi
}

median() { sort -n | awk '{a[NR]=$1} END {if (NR == 0) print "-"; else print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

echo "$(date -u '+%F %T UTC'), $file ($size bytes), qd $qd, ${runtime} s runs, $rounds rounds;" \
     "load average $(cut -d' ' -f1-3 /proc/loadavg); perf: $([ $use_perf = 1 ] && echo yes || echo no)" >&2
for c in $cases; do
	rw=${c%%:*}
	bs=${c##*:}
	bytes=$(echo "$bs" | sed 's/k$/*1024/; s/m$/*1048576/' | bc)
	r=1
	while [ "$r" -le "$rounds" ]; do
		quiet
		# fio first in odd rounds, last in even ones: a drift during a
		# round favours neither side
		order="fio $modes"
		[ $((r % 2)) = 0 ] && order="$(echo $modes | awk '{for (i = NF; i > 0; i--) printf "%s ", $i}')fio"
		msg="$rw $bs round $r (${idle}% idle before):"
		for t in $order; do
			msg="$msg $(run_tool "$rw" "$bs" "$t"),"
		done
		echo "${msg%,} MiB/s" >&2
		r=$((r + 1))
	done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

# column $2 of tool $1's rows for the case in $rw $bs, median
med() { awk -v rw="$rw" -v bs="$bs" -v t="$1" -v k="$2" '$1==rw && $2==bs && $3==t {print $k}' "$results" | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a == "-" || b == "-" || b == 0) print "-"; else printf "%.2f", a / b}'; }

# median over the rounds of tool $1's MiB/s over fio's in the same round
paired() {
	awk -v rw="$rw" -v bs="$bs" -v t="$1" '$1==rw && $2==bs && $3=="fio" {f[$8] = $4}
		$1==rw && $2==bs && $3==t {m[$8] = $4}
		END {for (r in m) if (f[r] > 0) printf "%.4f\n", m[r] / f[r]}' "$results" | median
}

# Throughput, every mode against fio: the ratio of the medians, and the
# median of each round's ratio (the machine's speed drifts between rounds).
printf '%-10s %-4s %10s' case bs "fio MiB/s"
for m in $modes; do printf ' %12s %6s %7s' "libte-$m" ratio paired; done
echo
for c in $cases; do
	rw=${c%%:*} bs=${c##*:}
	fm=$(med fio 4)
	printf '%-10s %-4s %10s' "$rw" "$bs" "$fm"
	for m in $modes; do
		tm=$(med "$m" 4)
		printf ' %12s %6s %7s' "$tm" "$(ratio "$tm" "$fm")" "$(paired "$m" | awk '{printf "%.2f", $1}')"
	done
	echo
done
# Cost per request (medians): CPU microseconds, context switches, system
# calls, against fio's. A polling thread spins while it waits, so its CPU per
# request grows with the time a request takes.
echo
printf '%-10s %-4s %-9s %10s %8s %10s %8s %8s\n' case bs tool "CPU us/req" ratio "switches" ratio "syscalls"
for c in $cases; do
	rw=${c%%:*} bs=${c##*:}
	for t in fio $modes; do
		cpu=$(med "$t" 5) cs=$(med "$t" 6) sc=$(med "$t" 7)
		rc="" rs=""
		[ "$t" = fio ] || { rc=$(ratio "$cpu" "$(med fio 5)"); rs=$(ratio "$cs" "$(med fio 6)"); }
		printf '%-10s %-4s %-9s %10s %8s %10s %8s %8s\n' "$rw" "$bs" "$t" "$cpu" "$rc" "$cs" "$rs" "$sc"
	done
done
