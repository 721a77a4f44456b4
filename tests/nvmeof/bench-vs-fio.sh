#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# nvmeof-bench beside fio on the same file, block size, queue depth, direct
# flag and buffer memory (2 MiB huge pages for both: fio --iomem=shmhuge),
# interleaved round by round (fio, then libte) so drifting load hits both
# alike; caches are dropped before every run. Prints every run, then the
# medians and their ratio. Needs root (drop_caches, vm.nr_hugepages, which
# it raises for the run and restores).
#
#   bench-vs-fio.sh BUILD_DIR FILE [ROUNDS [RUNTIME_S [QD]]]
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
store=$(mktemp -d "${TMPDIR:-/tmp}/te-nvmeof-store-XXXXXX")
old_huge=$(cat /proc/sys/vm/nr_hugepages)
trap 'rm -rf "$store"; echo "$old_huge" > /proc/sys/vm/nr_hugepages' EXIT INT TERM
fio_mem=
if [ "$huge" = 1 ]; then
	# the largest buffer (qd x 1 MiB) in 2 MiB pages, plus slack
	echo $((old_huge + qd / 2 + 8)) > /proc/sys/vm/nr_hugepages
	fio_mem=--iomem=shmhuge
fi
export TE_PLUGIN_PATH="$build/tests/nvmeof:$build/plugins/nvmeof"
size=$(stat -c %s "$file")

quiet_wait=${QUIET_WAIT:-60}

# Shared machines: start each round when the CPUs are (nearly) idle.
quiet() {
	end=$(($(date +%s) + quiet_wait))
	while [ "$(date +%s)" -lt "$end" ]; do
		set -- $(head -1 /proc/stat)
		t1=$(($2 + $3 + $4 + $5 + $6 + $7 + $8 + $9)) i1=$5
		sleep 2
		set -- $(head -1 /proc/stat)
		t2=$(($2 + $3 + $4 + $5 + $6 + $7 + $8 + $9)) i2=$5
		[ $((100 * (i2 - i1) / (t2 - t1))) -ge 90 ] && return 0
	done
	[ "$quiet_wait" -gt 0 ] && echo "(round started on a busy machine)" >&2
	return 0
}

drop() {
	sync
	echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
}

# MiB/s of one fio run
fio_run() { # rw bs
	fio --name=te --filename="$file" --rw="$1" --bs="$2" --iodepth="$qd" --direct=1 \
	    --ioengine=io_uring $fio_mem --runtime="$runtime" --time_based --size="$size" \
	    --minimal 2>/dev/null |
	awk -F';' '{printf "%.1f\n", ($7 + $48) / 1024}' # terse v3: read and write KiB/s
}

# MiB/s of one nvmeof-bench run
te_run() { # rw bs mode
	case $1 in
	randread) op=read pat=rand ;; randwrite) op=write pat=rand ;;
	read) op=read pat=seq ;; write) op=write pat=seq ;;
	esac
	bytes=$(echo "$2" | sed 's/k$/*1024/; s/m$/*1048576/' | bc)
	if [ "$3" = poll ]; then poll=1 threads=$threads_poll; else poll=0 threads=$threads_block; fi
	"$bench" -m "file://$store" --file "$file" --op $op --pattern $pat --bs "$bytes" \
		--qd "$qd" --threads "$threads" --runtime "$runtime" --poll $poll --hugepages "$huge" |
		awk '/^RESULT/ {print $6}'
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

results=$(mktemp)
for c in $cases; do
	rw=${c%%:*}
	bs=${c##*:}
	r=1
	while [ "$r" -le "$rounds" ]; do
		quiet
		drop
		f=$(fio_run "$rw" "$bs")
		line="$rw $bs $f"
		msg="$rw $bs round $r: fio $f"
		for m in $modes; do
			drop
			t=$(te_run "$rw" "$bs" "$m")
			line="$line $t"
			msg="$msg, libte-$m $t"
		done
		echo "$msg MiB/s" >&2
		echo "$line" >> "$results"
		r=$((r + 1))
	done
done

printf '%-10s %-4s %10s' case bs "fio MiB/s"
for m in $modes; do printf ' %12s %6s' "libte-$m" ratio; done
echo
for c in $cases; do
	rw=${c%%:*}
	bs=${c##*:}
	fm=$(awk -v rw="$rw" -v bs="$bs" '$1==rw && $2==bs {print $3}' "$results" | median)
	printf '%-10s %-4s %10s' "$rw" "$bs" "$fm"
	col=4
	for m in $modes; do
		tm=$(awk -v rw="$rw" -v bs="$bs" -v c=$col '$1==rw && $2==bs {print $c}' "$results" | median)
		printf ' %12s %6.2f' "$tm" "$(echo "$tm / $fm" | bc -l)"
		col=$((col + 1))
	done
	echo
done
rm -f "$results"
