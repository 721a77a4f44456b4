#!/usr/bin/env bash
# One request at a time: latency percentiles of libte beside their references,
# in one run, the cases alternated round by round; prints a markdown table of
# the medians (over ROUNDS) of p50, p99 and p99.9, in microseconds.
#
#   tools/bench-latency.sh [BUILD_DIR=build] [ROUNDS=5] [SECONDS=3]
#   LAT_QUICK=1 tools/bench-latency.sh build     # 1 round of 1 s: does it all work?
#
# libte (two processes on this machine: a te-bench --mode=target process and
# te-bench initiators, --batch_size=1, so every request waits for the last):
#   TCP         --protocol=tcp --memory=anonymous on both sides
#   same-host   --protocol=auto --memory=libte (transport "shm", checked)
#   READ and WRITE of 4 KiB and 1 MiB, each as is and with TE_SPIN_US=50 in the
#   environment of target and initiator (a bounded busy-wait before sleeping);
#   Python: libte.mooncake.TransferEngine.transfer_sync_read/_write of 4 KiB,
#   one call at a time (tools/bench-latency-py.py), over TCP and over shm,
#   against the same (as-is) targets.
# References:
#   raw TCP ping-pong (tools/latency-pingpong: 24-byte request, 4 KiB + 8
#     answer, TCP_NODELAY, loopback; both sides sleeping in epoll, and both
#     busy-polling): the round trip this kernel allows with and without wake-ups;
#   UCX ucx_perftest over loopback (server process + client 127.0.0.1):
#     ucp_put_lat (reports one-way = round trip / 2; the table shows both) and
#     ucp_get -O 1, with UCX_TLS=tcp at 4 KiB and with UCX's shared memory
#     (UCX_TLS=posix,self, else sm,self: the first that runs) at 4 KiB and 1 MiB;
#     p50, p99, p99.9 come from three runs (-R 50, -R 99, -R 99.9) and cover
#     the last 2048 iterations of each run only (ucx_perftest keeps no more);
#     -n is sized from a calibration run so the three take about SECONDS;
#     skipped with a note when ucx_perftest is missing;
#   memcpy of a cached 4 KiB and 1 MiB (pingpong memcpy: per-copy times), and
#     tests/shm/memcpy-bench's mean per copy (one block, one thread) beside it.
#
# Machine information and progress go to stderr, the tables to stdout. Every
# process started is stopped on exit. Environment: LAT_QUICK=1, PYTHON (python3),
# LAT_SPIN_US (50), LAT_UCX_SHM_TLS (try only this UCX_TLS for shared memory).
set -euo pipefail
orig=$PWD
cd "$(dirname "$0")/.."
root=$PWD
. tools/bench-lib.sh
build=${1:-build}
rounds=${2:-5}
secs=${3:-3}
if [ "${LAT_QUICK:-0}" != 0 ]; then rounds=1 secs=1; fi
# BUILD_DIR: relative to where the script was called from, else to the source tree
case $build in
/*) ;;
*) if [ -d "$orig/$build" ]; then build=$orig/$build; else build=$root/$build; fi ;;
esac
spin=${LAT_SPIN_US:-50}
py=${PYTHON:-python3}
tebench=$build/tools/te-bench/te-bench
pingpong=$build/tools/latency-pingpong/pingpong
mcpy=$build/tests/shm/memcpy-bench
[ -x "$tebench" ] || { echo "bench-latency: $tebench not built" >&2; exit 1; }
[ -e "$build/plugins/transport/tcp" ] && [ -e "$build/plugins/transport/shm" ] ||
	{ echo "bench-latency: no tcp or shm plugin in $build/plugins" >&2; exit 1; }
export TE_PLUGIN_PATH="$build/plugins/transport/tcp:$build/plugins/transport/shm"
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
unset TE_SPIN_US # "as is" means libte's default

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-latency.XXXXXX")
mkdir -p "$tmp/res" "$tmp/log"
pids=()      # the targets, for the whole run
transient=() # what runs now: a benchmark, a ucx_perftest server
# ours PID: still a child of this shell (never signal a recycled PID)
ours() { [ "$(awk '$3 != "Z" {print $4}' "/proc/$1/stat" 2>/dev/null)" = "$$" ]; }
cleanup() {
	local p mine=()
	trap - EXIT INT TERM
	for p in "${transient[@]}" "${pids[@]}"; do ours "$p" && mine+=("$p"); done
	for p in "${mine[@]}"; do kill "$p" 2>/dev/null || true; done
	# bounded: whatever ignores SIGTERM for 3 s gets SIGKILL
	for _ in $(seq 30); do
		local alive=0
		for p in "${mine[@]}"; do ours "$p" && alive=1; done
		[ $alive = 0 ] && break
		sleep 0.1
	done
	for p in "${mine[@]}"; do ours "$p" && kill -9 "$p" 2>/dev/null; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
# bg_run CMD...: CMD in the background, waited for (a signal to this script
# stops the wait at once, and cleanup stops CMD); CMD's exit status
bg_run() {
	local before=("${transient[@]}") rc=0
	"$@" &
	transient+=("$!")
	wait $! || rc=$?
	transient=("${before[@]}")
	return $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
failed=0
warn() { echo "bench-latency: $*" >&2; }

# --------------------------------------------------------------- programs
if [ ! -x "$pingpong" ]; then
	# an older build dir: compile the floor here
	pingpong=$tmp/pingpong
	${CC:-cc} -O2 -std=gnu11 -o "$pingpong" tools/latency-pingpong/pingpong.c ||
		{ warn "cannot build tools/latency-pingpong/pingpong.c"; exit 1; }
fi
have_py=1
if ! "$py" -c 'import libte.mooncake' 2>"$tmp/log/py-import"; then
	have_py=0
	warn "the Python package is not built in $build (PYTHONPATH=$build/python): Python rows skipped"
fi
have_ucx=0 ucx_shm_tls=
if command -v ucx_perftest >/dev/null; then have_ucx=1; else warn "ucx_perftest missing: UCX rows skipped"; fi
have_mcpy=1
[ -x "$mcpy" ] || { have_mcpy=0; warn "$mcpy not built: no memcpy-bench check"; }

# the longest the whole run may take: a safety net for the long-lived targets
maxlife=$((rounds * (60 * secs + 120) + 300))

# ---------------------------------------------------------------- targets
# start_target VAR PROTOCOL MEMORY SPIN: a te-bench target; its segment name in VAR
start_target() {
	local var=$1 proto=$2 mem=$3 sp=$4 log="$tmp/log/target.$1" n=
	if [ "$sp" = 0 ]; then
		timeout "$maxlife" "$tebench" --mode=target --local_server_name=127.0.0.1 --protocol="$proto" \
			--memory="$mem" --buffer_size=16M >"$log" 2>&1 &
	else
		TE_SPIN_US=$sp timeout "$maxlife" "$tebench" --mode=target --local_server_name=127.0.0.1 \
			--protocol="$proto" --memory="$mem" --buffer_size=16M >"$log" 2>&1 &
	fi
	pids+=("$!")
	n=$(bench_target_name "$log" "${pids[-1]}")
	[ -n "$n" ] || { warn "target ($proto, $mem, spin $sp) did not start:"; cat "$log" >&2; exit 1; }
	printf -v "$var" %s "$n"
}
start_target t_tcp_0 tcp anonymous 0
start_target t_tcp_s tcp anonymous "$spin"
start_target t_shm_0 auto libte 0
start_target t_shm_s auto libte "$spin"

# ------------------------------------------------------------------- UCX
have_ss=0
command -v ss >/dev/null && have_ss=1 # else: half a second for a server to listen
port=$((20000 + RANDOM % 10000))
next_port() {
	for _ in $(seq 200); do
		port=$((port + 1))
		[ $port -lt 32000 ] || port=20000
		[ $have_ss = 0 ] && return 0
		ss -Hltn "sport = :$port" 2>/dev/null | grep -q . || return 0
	done
}
# ucx_one TLS TEST SIZE N W RANK OUT: one server + client run; the client's output in OUT
ucx_one() {
	local tls=$1 test=$2 size=$3 n=$4 w=$5 rank=$6 out=$7 extra=() spid lim
	[ "$test" = ucp_get ] && extra=(-O 1)
	next_port
	lim=$((secs * 3 + 60))
	UCX_TLS=$tls timeout "$lim" ucx_perftest -p "$port" >"$out.server" 2>&1 &
	spid=$!
	transient+=("$spid")
	for _ in $(seq 100); do
		if [ $have_ss = 0 ]; then sleep 0.5; break; fi
		ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
		ours $spid || break
		sleep 0.05
	done
	bg_run env UCX_TLS="$tls" timeout "$lim" ucx_perftest 127.0.0.1 -p "$port" -t "$test" -s "$size" -n "$n" \
		-w "$w" -R "$rank" "${extra[@]}" >"$out" 2>&1 || true
	for _ in $(seq 50); do ours $spid || break; sleep 0.1; done
	ours $spid && kill $spid 2>/dev/null
	wait $spid 2>/dev/null || true
	transient=()
	grep -q '^Final:' "$out"
}
# ucx_parse FILE...: one JSON object from the runs' Final lines (the %ile column
# by the header, the overall mean latency); values as ucx_perftest reports them
ucx_parse() {
	"$py" - "$@" <<'PY'
import json, sys
res = {}
for f in sys.argv[1:]:
    head = final = None
    kind = ""
    for line in open(f):
        if "Stage" in line and "%ile" in line:
            head = [c.strip() for c in line.split("|")][1:]
        elif "(usec)" in line:
            kind = line.split("(usec)")[0].split("|")[-1].strip()
        elif line.startswith("Final:"):
            final = line.split()
    if head is None or final is None:
        sys.exit(f"no Final line in {f}")
    col = next(i for i, c in enumerate(head) if c.endswith("%ile"))
    rank = head[col][:-4]
    key = {"50.0": "p50", "99.0": "p99", "99.9": "p999"}[rank]
    res[key] = float(final[col])
    res.setdefault("mean_all", []).append(float(final[head.index("overall")]))
    res["iterations"] = int(final[1])
    res["column"] = kind  # "latency" (or "overhead")
res["mean"] = sum(res.pop("mean_all")) / 3
print(json.dumps(res))
PY
}
declare -A ucx_n ucx_w
ucx_cases=()
if [ $have_ucx = 1 ]; then
	# which shared-memory transports run here
	for tls in ${LAT_UCX_SHM_TLS:-posix,self sm,self}; do
		if ucx_one "$tls" ucp_put_lat 4096 1000 100 50 "$tmp/log/ucx-probe.$tls"; then
			ucx_shm_tls=$tls
			break
		fi
		warn "UCX_TLS=$tls does not run here: $(grep -v '^[|+]' "$tmp/log/ucx-probe.$tls" | tail -n 2 | tr '\n' ' ')"
	done
	ucx_cases=(tcp:ucp_put_lat:4096 tcp:ucp_get:4096)
	[ -n "$ucx_shm_tls" ] && ucx_cases+=(shm:ucp_put_lat:4096 shm:ucp_get:4096 shm:ucp_put_lat:1048576 shm:ucp_get:1048576)
	[ -n "$ucx_shm_tls" ] || warn "no UCX shared-memory transport runs: UCX shm rows skipped"
	# -n from a calibration run: the three runs of a case take about SECONDS
	for c in "${ucx_cases[@]}"; do
		IFS=: read -r t test size <<<"$c"
		tls=tcp
		[ "$t" = shm ] && tls=$ucx_shm_tls
		cn=2000
		[ "$size" -ge 1048576 ] && cn=200
		if ! ucx_one "$tls" "$test" "$size" $cn 50 50 "$tmp/log/ucx-cal.$t.$test.$size"; then
			warn "UCX $tls $test $size fails: $(tail -n 2 "$tmp/log/ucx-cal.$t.$test.$size" | tr '\n' ' ')"
			continue
		fi
		it_us=$(ucx_parse "$tmp/log/ucx-cal.$t.$test.$size"{,,} | "$py" -c \
			'import json,sys; d=json.load(sys.stdin); print(round(d["mean"] * (2 if sys.argv[1] == "ucp_put_lat" else 1), 3))' "$test")
		# at least 2100 iterations: the percentiles are over the last 2048 of them
		read -r n w < <("$py" -c 'import sys; s, it = float(sys.argv[1]), max(float(sys.argv[2]), 0.01)
n = int(min(2e7, max(2100, s / 3 * 1e6 / it))); print(n, max(100, min(10000, n // 20)))' "$secs" "$it_us")
		ucx_n[$c]=$n ucx_w[$c]=$w
		echo "bench-latency: UCX $tls $test $size: $it_us us an iteration: -n $n -w $w" >&2
	done
fi

# ------------------------------------------------------------------ cases
jobs=()
for proto in tcp shm; do
	for bs in 4096 1048576; do
		for op in read write; do jobs+=("tb:$proto:$op:$bs:0" "tb:$proto:$op:$bs:$spin"); done
	done
done
for c in "${ucx_cases[@]}"; do
	if [ -n "${ucx_n[$c]:-}" ]; then jobs+=("ucx:$c"); fi
done
jobs+=(pp:sleep pp:busy mc:4096 mc:1048576)
[ $have_py = 1 ] && jobs+=(py:tcp:read py:tcp:write py:shm:read py:shm:write)
mcsecs=$secs
[ "$secs" -gt 2 ] && mcsecs=2

# run_job JOB ROUND: its result, one JSON line, in $tmp/res/JOB.ROUND
run_job() {
	local job=$1 r=$2 out="$tmp/res/${1//:/_}.$2" lim=$((secs + 60))
	local kind proto op bs sp seg mem t test size tls rank
	IFS=: read -r kind proto op bs sp <<<"$job"
	case $kind in
	tb)
		if [ "$proto" = tcp ]; then mem=anonymous; pr=tcp; else mem=libte; pr=auto; fi
		if [ "$sp" = 0 ]; then
			[ "$proto" = tcp ] && seg=$t_tcp_0 || seg=$t_shm_0
			bg_run timeout $lim "$tebench" --segment_id="$seg" --protocol=$pr --memory=$mem --operation="$op" \
				--block_size="$bs" --batch_size=1 --buffer_size=16M --duration="$secs" --quiet --json \
				>"$out.raw" 2>"$out.err"
		else
			[ "$proto" = tcp ] && seg=$t_tcp_s || seg=$t_shm_s
			bg_run env TE_SPIN_US="$sp" timeout $lim "$tebench" --segment_id="$seg" --protocol=$pr --memory=$mem \
				--operation="$op" --block_size="$bs" --batch_size=1 --buffer_size=16M --duration="$secs" \
				--quiet --json >"$out.raw" 2>"$out.err"
		fi
		;;
	ucx)
		t=$proto test=$op size=$bs
		tls=tcp
		[ "$t" = shm ] && tls=$ucx_shm_tls
		local c="$t:$test:$size" f=()
		for rank in 50 99 99.9; do
			ucx_one "$tls" "$test" "$size" "${ucx_n[$c]}" "${ucx_w[$c]}" $rank "$out.R$rank" || return 1
			f+=("$out.R$rank")
		done
		ucx_parse "${f[@]}" >"$out.raw" 2>"$out.err"
		;;
	pp) bg_run timeout $lim "$pingpong" tcp "$proto" "$secs" >"$out.raw" 2>"$out.err" ;;
	mc)
		bg_run timeout $lim "$pingpong" memcpy "$proto" "$mcsecs" >"$out.raw" 2>"$out.err"
		if [ $have_mcpy = 1 ]; then
			bg_run timeout $lim "$mcpy" "$proto" 1 1 1 >"$out.mcb" 2>>"$out.err" || return 1
		fi
		;;
	py)
		[ "$proto" = tcp ] && seg=$t_tcp_0 || seg=$t_shm_0
		bg_run timeout $lim "$py" tools/bench-latency-py.py --segment_id="$seg" --protocol="$proto" --operation="$op" \
			--block_size=4096 --duration="$secs" >"$out.raw" 2>"$out.err"
		;;
	esac || return 1
	tail -n 1 "$out.raw" >"$out"
	[ -s "$out" ]
}

# ------------------------------------------------------------------- runs
sysinfo() {
	echo "bench-latency: $1: $(nproc) CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1));" \
		"$(uname -sr); load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
}
sysinfo "before"
echo "bench-latency: $rounds rounds of ${#jobs[@]} cases, $secs s each (the 3 UCX runs of a case together);" \
	"TE_SPIN_US=$spin; UCX: $([ $have_ucx = 1 ] && echo "$(ucx_info -v 2>/dev/null | sed -n 's/^# Version //p'), shm over UCX_TLS=${ucx_shm_tls:-none}" || echo missing)" >&2
n=${#jobs[@]}
for r in $(seq "$rounds"); do
	# each round starts elsewhere in the list, and every other round runs it backwards
	step=$(((n + rounds - 1) / rounds))
	order=()
	for i in $(seq 0 $((n - 1))); do order+=("${jobs[$(((i + (r - 1) * step) % n))]}"); done
	if [ $((r % 2)) = 0 ]; then
		rev=()
		for ((i = n - 1; i >= 0; i--)); do rev+=("${order[$i]}"); done
		order=("${rev[@]}")
	fi
	for j in "${order[@]}"; do
		if run_job "$j" "$r"; then
			echo "  round $r $j: $(grep -o '"p50": *[0-9.]*' "$tmp/res/${j//:/_}.$r" | head -n 1)" >&2
		else
			failed=$((failed + 1))
			warn "round $r $j FAILED: $(cat "$tmp/res/${j//:/_}.$r.err" 2>/dev/null | tail -n 3 | tr '\n' ' ')"
		fi
	done
done
sysinfo "after"

# ---------------------------------------------------------------- summary
"$py" - "$tmp/res" "$rounds" "$spin" "${ucx_shm_tls:-}" "${jobs[@]}" <<'PY'
import json, os, statistics, sys
res, rounds, spin, shm_tls, jobs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
bad = []

def load(job):
    out = []
    for r in range(1, rounds + 1):
        f = f"{res}/{job.replace(':', '_')}.{r}"
        if os.path.exists(f) and os.path.getsize(f):
            d = json.loads(open(f).read())
            if job.startswith("tb:shm") and d.get("transport") != "shm":
                bad.append(f"{job} round {r} ran over {d.get('transport')}, not shm")
                continue
            if job.startswith("tb:tcp") and d.get("transport") != "tcp":
                bad.append(f"{job} round {r} ran over {d.get('transport')}, not tcp")
                continue
            if job.startswith("py:") and d.get("transport") not in (job.split(":")[1], "?"):
                bad.append(f"{job} round {r} ran over {d.get('transport')}")
                continue
            out.append(d.get("latency_us", d))
    return out

def med(job, scale=1.0):
    """{p50, p99, p999, mean} medians over the rounds (each percentile apart), or None."""
    if job not in jobs:
        return None
    rs = load(job)
    if not rs:
        return None
    return {k: statistics.median(x[k] for x in rs) * scale for k in ("p50", "p99", "p999", "mean") if k in rs[0]}

def mcb(bs):
    vals = []
    for r in range(1, rounds + 1):
        f = f"{res}/mc_{bs}.{r}.mcb"
        if os.path.exists(f) and os.path.getsize(f):
            vals.append(1e6 / json.loads(open(f).read().strip().splitlines()[-1])["iops"])
    return statistics.median(vals) if vals else None

def fmt(v):
    if v is None:
        return "—"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:,.0f}"

def ratio(a, b, k="p50"):
    if not a or not b or not b.get(k):
        return "—"
    x = a[k] / b[k]
    return f"{x:.3f}" if x < 0.1 else f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:,.0f}"

def size(bs):
    bs = int(bs)
    return f"{bs >> 20} MiB" if bs >= 1 << 20 else f"{bs >> 10} KiB"

ucx_shm = f"UCX {shm_tls}" if shm_tls else "UCX shm"
pp = {"sleep": ("raw TCP ping-pong 4 KiB, both sleeping (epoll)", med("pp:sleep")),
      "busy": ("raw TCP ping-pong 4 KiB, both busy-polling", med("pp:busy"))}
def ucx(t, test, bs, rtt):
    m = med(f"ucx:{t}:{test}:{bs}", 2.0 if rtt else 1.0)
    tls = "UCX tcp" if t == "tcp" else ucx_shm
    name = {"ucp_put_lat": "ucp_put_lat round trip" if rtt else "ucp_put_lat one-way (as reported)",
            "ucp_get": "ucp_get"}[test]
    return (f"{tls} {name} {size(bs)}", m)
def mc(bs):
    return (f"memcpy {size(bs)} (cached)", med(f"mc:{bs}"))

rows = []
for proto, label in (("tcp", "TCP"), ("shm", "same-host (shm)")):
    for bs in ("4096", "1048576"):
        for op in ("read", "write"):
            refs = []
            if proto == "tcp" and bs == "4096":
                refs = [pp["sleep"], pp["busy"], ucx("tcp", "ucp_put_lat", bs, True), ucx("tcp", "ucp_get", bs, False)]
            elif proto == "shm" and bs == "4096":
                refs = [ucx("shm", "ucp_put_lat", bs, True), ucx("shm", "ucp_get", bs, False), mc(bs)]
            elif proto == "shm":
                refs = [mc(bs), ucx("shm", "ucp_put_lat", bs, True), ucx("shm", "ucp_get", bs, False)]
            rows.append((f"te-bench {label} {op} {size(bs)}", med(f"tb:{proto}:{op}:{bs}:0"),
                         med(f"tb:{proto}:{op}:{bs}:{spin}"), [x for x in refs if x[1]]))
for proto, label in (("tcp", "TCP"), ("shm", "same-host (shm)")):
    for op in ("read", "write"):
        m = med(f"py:{proto}:{op}")
        if m:
            rows.append((f"Python transfer_sync_{op} {label} 4 KiB", m, None,
                         [(f"te-bench {label} {op} 4 KiB", med(f"tb:{proto}:{op}:4096:0"))]))

print(f"Latency of one request at a time, µs: medians over {rounds} rounds of p50, p99 and p99.9; "
      f"spin = TE_SPIN_US={spin} in target and initiator; ratios libte / reference.")
print()
print(f"| case | p50 | p99 | p99.9 | spin p50 | spin p99 | spin p99.9 | reference | ref p50 | ref p99 | ref p99.9 "
      f"| p50 / ref | p99 / ref | spin p50 / ref |")
print("|---|" + "---:|" * 6 + "---|" + "---:|" * 6)
for name, a, s, refs in rows:
    cells = [name] + [fmt(a and a.get(k)) for k in ("p50", "p99", "p999")] + \
            [fmt(s and s.get(k)) for k in ("p50", "p99", "p999")]
    if not refs:
        print("| " + " | ".join(cells + ["—"] + ["—"] * 6) + " |")
    for i, (rn, rm) in enumerate(refs):
        left = cells if i == 0 else [""] * 7
        print("| " + " | ".join(left + [rn] + [fmt(rm.get(k)) for k in ("p50", "p99", "p999")] +
                                [ratio(a, rm), ratio(a, rm, "p99"), ratio(s, rm)]) + " |")

print()
print("References alone, µs. UCX: each percentile from its own run (-R 50, -R 99, -R 99.9) and over the last "
      "2048 iterations of that run only (all ucx_perftest keeps), so a p99 may come out below a p50; the mean "
      "covers every iteration of the three runs; ucp_put_lat reports half the round trip.")
print()
print("| reference | p50 | p99 | p99.9 | mean |")
print("|---|---:|---:|---:|---:|")
refs = [pp["sleep"], pp["busy"]]
for t, bs in (("tcp", "4096"), ("shm", "4096"), ("shm", "1048576")):
    refs += [ucx(t, "ucp_put_lat", bs, False), ucx(t, "ucp_put_lat", bs, True), ucx(t, "ucp_get", bs, False)]
refs += [mc("4096"), mc("1048576")]
for rn, rm in refs:
    if rm:
        print(f"| {rn} | {fmt(rm.get('p50'))} | {fmt(rm.get('p99'))} | {fmt(rm.get('p999'))} | {fmt(rm.get('mean'))} |")
for bs in ("4096", "1048576"):
    v = mcb(bs)
    if v is not None:
        print(f"| memcpy-bench {size(bs)}, 1 thread, 1 block: mean per copy | | | | {fmt(v)} |")
missing = [j for j in jobs if not load(j)]
for b in bad:
    print(f"\nbench-latency: {b}", file=sys.stderr)
if missing:
    print(f"\nbench-latency: no result for {', '.join(missing)}", file=sys.stderr)
sys.exit(1 if bad else 0)
PY
[ $failed = 0 ] || { warn "$failed runs failed"; exit 1; }
