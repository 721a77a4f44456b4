#!/usr/bin/env bash
# One pass of GPU measurements with a bundle made by tools/gpu-bundle.sh, on a
# machine with an NVIDIA GPU and its driver but none of libte's build
# dependencies:
#   - nvidia-smi's view (when it is there), te-info;
#   - te_submit_on_stream() on a blocking CUDA stream, on the legacy default
#     stream, and on cuda:1's streams while cuda:0 is current
#     (test-stream-runtime; with one GPU the last says it has nothing to do);
#   - gpu-copy-bench: the copy engines' limits (pinned, chunked, pageable,
#     device to device);
#   - te-bench between two processes, a target and an initiator (as
#     tools/bench-device-shm.sh runs them), over TCP on 127.0.0.1 and over
#     the same-host transport (shm), reads and writes of 64 KiB and 1 MiB in
#     batches of 128, one submitting thread: host memory on both sides
#     against device memory (cuda:0) on both sides; TCP 1 MiB reads with only
#     the target's, then only the initiator's, buffer in device memory; shm
#     host memory with 4 threads; the device runs again with TE_CUDA_ALLOC=vmm
#     (the CUDA plugin's cuMemCreate allocations) at 1 MiB;
#   - --check runs (every byte compared) of device memory over tcp and shm,
#     reads and writes, with and without TE_CUDA_ALLOC=vmm, and over tcp
#     with TE_CUDA_GATHER=host: they must pass.
#
#   tools/gpu-check.sh [BUNDLE_DIR=.gpu] [OUT_DIR=$OUT or ./gpu-check-out]
#
# Each measured case is run 3 times (rounds: every case once, then again, so
# that a drift of the machine's speed weighs on all alike), GPU_CHECK_SECS
# (2) seconds a run; the median is reported. A target serves all runs of its
# kind (protocol, memory, allocator) and is started again if it dies. Every
# te-bench run has a 60 s timeout. About 4 minutes on a 16-core machine.
#
# OUT_DIR receives three files: gpu-check.log (everything printed, each
# run's command and errors), results.json (each run's te-bench JSON, the
# copy figures, the machine) and summary.md (the tables).
# A step that fails is reported as FAILED (never as a zero) and makes the
# exit status 1; the other steps still run.
#
# Environment: GPU_CHECK_SECS (seconds per measured run, 2),
# GPU_CHECK_CHECK_SECS (per --check run, 1), GPU_CHECK_ROUNDS (3),
# GPU_CHECK_BUDGET (seconds, 285: runs that would start later are left out
# and reported, so that the pass ends in time), GPU_CHECK_COPY_ARGS
# (gpu-copy-bench flags, e.g. "--size=64M" for a short run), GPU_CHECK_GPU
# (the device index, 0).
set -euo pipefail

bundle=${1:-.gpu}
out=${2:-${OUT:-./gpu-check-out}}
secs=${GPU_CHECK_SECS:-2}
check_secs=${GPU_CHECK_CHECK_SECS:-1}
budget=${GPU_CHECK_BUDGET:-300}
rounds=${GPU_CHECK_ROUNDS:-3}
gpu=${GPU_CHECK_GPU:-0}
read -r -a copy_args <<<"${GPU_CHECK_COPY_ARGS:-}"

die() { echo "gpu-check: $*" >&2; exit 1; }
[ -f "$bundle/env.sh" ] || die "$bundle/env.sh not found: make the bundle with tools/gpu-bundle.sh"
command -v python3 >/dev/null || die "python3 is needed for the JSON and the tables"
command -v timeout >/dev/null || die "timeout (coreutils) is needed"
[[ $secs =~ ^[0-9]+$ && $secs -ge 1 ]] || die "GPU_CHECK_SECS=$secs: want whole seconds"
[[ $rounds =~ ^[0-9]+$ && $rounds -ge 1 ]] || die "GPU_CHECK_ROUNDS=$rounds: want a count"
[[ $check_secs =~ ^[0-9]+$ && $check_secs -ge 1 ]] || die "GPU_CHECK_CHECK_SECS=$check_secs: want whole seconds"
[[ $budget =~ ^[0-9]+$ ]] || die "GPU_CHECK_BUDGET=$budget: want seconds"
# The bundle's libraries were linked against a glibc at least this new.
need=$(sed -n 's/^needs: glibc >= \([0-9.]*\).*/\1/p' "$bundle/bundle.txt" 2>/dev/null || true)
have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }' || true)
if [ -n "$need" ] && [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
	die "the bundle needs glibc >= $need; this machine has $have"
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
# shellcheck disable=SC1091
. "$bundle/env.sh" || die "$bundle/env.sh failed"
. "$(dirname "$0")/bench-lib.sh"
log=$out/gpu-check.log
: >"$log"
tmp=$(mktemp -d)
mkdir "$tmp/runs" "$tmp/targets"

main() {
	local t0=$SECONDS
	failures=()
	fail() { failures+=("$1"); echo "FAILED: $1"; }

	echo "== gpu-check: $(date -u +%Y-%m-%dT%H:%M:%SZ), bundle $GPU_BUNDLE"
	sed -n '2,4p' "$GPU_BUNDLE/bundle.txt"
	echo "host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'),"\
		"$(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r),"\
		"$(getconf GNU_LIBC_VERSION), $(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-?}")"
	if command -v nvidia-smi >/dev/null; then
		nvidia-smi -L || fail "nvidia-smi -L"
		nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id,memory.total,pcie.link.gen.max,pcie.link.width.max \
			--format=csv || echo "(nvidia-smi --query-gpu failed)"
		nvidia-smi topo -m 2>/dev/null | head -20 || true
	else
		echo "nvidia-smi: not installed"
	fi

	echo "== te-info"
	local cuda_ok=0 rc=0
	te-info >"$tmp/te-info.txt" 2>&1 || rc=$?
	# All of it in the log; here the plugins and the CUDA section.
	cat "$tmp/te-info.txt" >>"$log"
	sed -n '/^Plugins:/,/^$/p; /^\[cuda\]/,/^$/p' "$tmp/te-info.txt"
	if [ "$rc" -ne 0 ]; then
		tail -5 "$tmp/te-info.txt"
		fail "te-info exited with status $rc"
	# The line after "[cuda] (device memory)" says "N device(s)" or "idle: why".
	elif sed -n '/^\[cuda\] (device memory)$/{n;p;}' "$tmp/te-info.txt" | grep -q 'device(s)'; then
		cuda_ok=1
	else
		fail "te-info: the CUDA plugin is not active: $(sed -n '/^\[cuda\] (device memory)$/{n;p;}' "$tmp/te-info.txt")"
	fi

	if [ "$cuda_ok" = 1 ]; then
		echo "== test-stream-runtime cuda (te_submit_on_stream on the driver's streams)"
		for s in "" legacy device1; do
			rc=0
			timeout 60 test-stream-runtime cuda $s >"$tmp/stream.out" 2>&1 || rc=$?
			cat "$tmp/stream.out" >>"$log"
			case $s in
				"") what="a blocking CUDA stream (flags 0: ordered against the legacy stream)" ;;
				legacy) what="the legacy default stream" ;;
				device1) what="cuda:1's legacy stream and a stream made on cuda:1, cuda:0 current (the caller's context kept)" ;;
			esac
			if [ "$rc" -ne 0 ]; then
				fail "test-stream-runtime cuda $s exited with status $rc"
			elif grep -q "nothing to do" "$tmp/stream.out"; then
				echo "te_submit_on_stream on cuda:1: skipped, one GPU here"
			else
				echo "te_submit_on_stream: ordered on $what, every byte checked"
			fi
		done
	fi

	echo "== gpu-copy-bench ${copy_args[*]}"
	rc=0
	timeout 300 gpu-copy-bench --device="$gpu" --json "${copy_args[@]}" >"$tmp/copy.json" 2>"$tmp/copy.err" || rc=$?
	cat "$tmp/copy.err"
	if [ "$rc" -ne 0 ]; then
		fail "gpu-copy-bench exited with status $rc$([ "$rc" = 77 ] && echo ' (no driver or no device)')"
		rm -f "$tmp/copy.json"
	else
		python3 - "$tmp/copy.json" <<-'PY' || fail "gpu-copy-bench: its output does not parse"
		import json, sys
		d = json.load(open(sys.argv[1]))
		print(f"device {d['device']['index']}: {d['device']['name']} ({d['device']['pci_bus_id']}), driver {d['driver_version']}")
		for r in d["results"]:
		    assert r["gb_per_s"] > 0, r
		    print(f"  {r['name']:<26} {r['gb_per_s']:8.2f} GB/s  {r['us_per_call']:10.1f} us/call")
		PY
	fi

	# The cases: id proto op block threads target-memory initiator-memory allocator
	local cases=() p o b
	for p in tcp shm; do
		for o in read write; do
			for b in 64K 1M; do
				cases+=("$p.$o.$b.host $p $o $b 1 host host -")
				cases+=("$p.$o.$b.dev $p $o $b 1 dev dev -")
			done
		done
	done
	cases+=("tcp.read.1M.tdev tcp read 1M 1 dev host -")
	cases+=("tcp.read.1M.idev tcp read 1M 1 host dev -")
	cases+=("shm.read.1M.host.4t shm read 1M 4 host host -")
	cases+=("shm.write.1M.host.4t shm write 1M 4 host host -")
	# What two choices are worth: the gather kernel, the staging chunk.
	cases+=("shm.read.64K.nogather shm read 64K 1 dev dev nogather")
	cases+=("shm.read.1M.nogather shm read 1M 1 dev dev nogather")
	cases+=("tcp.read.1M.chunk1m tcp read 1M 1 dev dev chunk1m")
	for p in tcp shm; do
		for o in read write; do
			cases+=("$p.$o.1M.vmm $p $o 1M 1 dev dev vmm")
		done
	done
	local checks=()
	for a in - vmm; do
		for p in tcp shm; do
			for o in read write; do
				checks+=("check.$p.$o.dev$([ $a = vmm ] && echo .vmm) $p $o 64K 1 dev dev $a")
			done
		done
	done
	# The gather kernel on page-locked host memory (TE_CUDA_GATHER=host):
	# staged chunks and the TCP target's stage.
	for o in read write; do
		checks+=("check.tcp.$o.dev.ghost tcp $o 64K 1 dev dev ghost")
	done
	printf '%s\n' "${cases[@]}" >"$tmp/cases.txt"
	printf '%s\n' "${checks[@]}" >"$tmp/checks.txt"
	local total=$((${#checks[@]} + ${#cases[@]} * rounds)) n=0
	echo "== te-bench: ${#checks[@]} --check runs of $check_secs s, then $rounds rounds of ${#cases[@]} cases of $secs s" \
		"($total runs, about $(((${#checks[@]} * (check_secs + 1) + ${#cases[@]} * rounds * (secs + 1)) / 60 + 1)) min;" \
		"none starts after ${budget} s)"

	local c
	for c in "${checks[@]}"; do
		n=$((n + 1))
		bench_run "$c" 1 check "$cuda_ok"
	done
	local r
	for r in $(seq "$rounds"); do
		for c in "${cases[@]}"; do
			n=$((n + 1))
			bench_run "$c" "$r" measure "$cuda_ok"
		done
	done
	stop_targets

	echo "== results ($((SECONDS - t0)) s)"
	python3 - "$tmp" "$out" "$rounds" "$secs" <<-'PY' || fail "the summary could not be made"
	import glob, json, os, statistics, sys
	tmp, out, rounds, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

	def spec(line):
	    id, proto, op, bs, th, tm, im, alloc = line.split()
	    return dict(id=id, protocol=proto, operation=op, block=bs, threads=int(th),
	                target_memory=tm, initiator_memory=im, allocator="default" if alloc == "-" else alloc)

	cases = [spec(l) for l in open(f"{tmp}/cases.txt").read().split("\n") if l.strip()]
	checks = [spec(l) for l in open(f"{tmp}/checks.txt").read().split("\n") if l.strip()]
	runs = []
	for path in sorted(glob.glob(f"{tmp}/runs/*.status")):
	    base = path[: -len(".status")]
	    id, rnd = os.path.basename(base).rsplit(".r", 1)
	    status = open(path).read().strip()
	    res = None
	    try:
	        lines = open(base + ".json").read().strip().splitlines()
	        res = json.loads(lines[-1]) if lines else None
	    except (OSError, ValueError):
	        pass
	    err = open(base + ".err").read() if os.path.exists(base + ".err") else ""
	    cmd = open(base + ".cmd").read().strip() if os.path.exists(base + ".cmd") else None
	    ok = status == "0" and res is not None and res.get("throughput_bytes_per_s", 0) > 0
	    runs.append(dict(id=id, round=int(rnd), status=status, ok=ok, result=res,
	                     command=cmd, stderr=err[-4000:]))

	def med(id):
	    v = [r["result"]["throughput_bytes_per_s"] / 1e9 for r in runs if r["id"] == id and r["ok"]]
	    return (statistics.median(v), len(v), v) if v else (None, 0, [])

	def transports(id):
	    return sorted({r["result"]["transport"] for r in runs if r["id"] == id and r["ok"]})

	def fmt(x, id=None):
	    if x is None:
	        return "LEFT OUT (time)" if id in left and id not in failed else "FAILED"
	    n = med(id)[1] if id else rounds
	    return f"{x:.2f}" + (f" ({n} of {rounds} runs)" if n < rounds else "")

	failed = sorted({r["id"] for r in runs if not r["ok"] and r["status"] != "out-of-time"})
	left = sorted({r["id"] for r in runs if r["status"] == "out-of-time"})

	md = []
	md.append(f"### te-bench between two processes, GB/s, median of {rounds} runs of {secs} s, batch 128\n")
	md.append("| path | host GB/s | device GB/s | ratio |")
	md.append("|---|---:|---:|---:|")
	summary = {}
	def row(label, host_id, dev_id):
	    h, hn, hv = med(host_id)
	    d, dn, dv = med(dev_id) if dev_id else (None, 0, [])
	    ratio = f"{d / h:.2f}" if h and d else "—"
	    served = transports(dev_id or host_id)
	    note = f" (served by {', '.join(served)})" if served and served != [label.split()[0]] else ""
	    md.append(f"| {label}{note} | {fmt(h, host_id)} | {fmt(d, dev_id) if dev_id else '—'} | {ratio} |")
	    summary[label] = dict(host_gb_s=h, device_gb_s=d, host_runs=hv, device_runs=dv)
	size = {"64K": "64 KiB", "1M": "1 MiB"}
	for p in ("tcp", "shm"):
	    for o in ("read", "write"):
	        for b in ("64K", "1M"):
	            row(f"{p} {o} {size[b]}, both sides", f"{p}.{o}.{b}.host", f"{p}.{o}.{b}.dev")
	row("tcp read 1 MiB, only the target in device memory", "tcp.read.1M.host", "tcp.read.1M.tdev")
	row("tcp read 1 MiB, only the initiator in device memory", "tcp.read.1M.host", "tcp.read.1M.idev")
	for p in ("tcp", "shm"):
	    for o in ("read", "write"):
	        row(f"{p} {o} 1 MiB, device memory from cuMemCreate (TE_CUDA_ALLOC=vmm)", f"{p}.{o}.1M.host", f"{p}.{o}.1M.vmm")
	for o in ("read", "write"):
	    row(f"shm {o} 1 MiB, host memory, 4 threads", f"shm.{o}.1M.host.4t", None)
	for b in ("64K", "1M"):
	    row(f"shm read {size[b]}, a copy call per piece (TE_CUDA_GATHER=0)", f"shm.read.{b}.host", f"shm.read.{b}.nogather")
	row("tcp read 1 MiB, 1 MiB staging chunks (TE_STAGE_CHUNK_BYTES)", "tcp.read.1M.host", "tcp.read.1M.chunk1m")

	md.append("\n### --check runs (device memory both sides, 64 KiB, every byte compared)\n")
	md.append("| run | result | GB/s | served by |")
	md.append("|---|---|---:|---|")
	for c in checks:
	    r = next((x for x in runs if x["id"] == c["id"]), None)
	    res = "missing" if r is None else "pass" if r["ok"] else "LEFT OUT (time)" if r["status"] == "out-of-time" \
	        else f"FAILED (status {r['status']})"
	    g = fmt(r["result"]["throughput_bytes_per_s"] / 1e9) if r and r["ok"] else "—"
	    t = r["result"]["transport"] if r and r["ok"] else "—"
	    md.append(f"| {c['protocol']} {c['operation']}{ {'vmm': ' vmm', 'ghost': ' TE_CUDA_GATHER=host'}.get(c['allocator'], '')} | {res} | {g} | {t} |")

	copy = None
	if os.path.exists(f"{tmp}/copy.json"):
	    copy = json.load(open(f"{tmp}/copy.json"))
	    dv = copy["device"]
	    md.append(f"\n### gpu-copy-bench: {dv['name']} ({dv['pci_bus_id']}), driver {copy['driver_version']}, "
	              f"median of {copy['repeats']} runs\n")
	    md.append("| case | chunk | calls | GB/s | min–max | µs per call |")
	    md.append("|---|---:|---:|---:|---:|---:|")
	    for r in copy["results"]:
	        ch = r["chunk"]
	        chs = f"{ch >> 30} GiB" if ch >= 1 << 30 else f"{ch >> 20} MiB" if ch >= 1 << 20 else f"{ch >> 10} KiB"
	        md.append(f"| {r['name']} | {chs} | {r['calls']} | {r['gb_per_s']:.2f} | "
	                  f"{r['gb_per_s_min']:.2f}–{r['gb_per_s_max']:.2f} | {r['us_per_call']:.1f} |")
	else:
	    md.append("\n### gpu-copy-bench: FAILED (see gpu-check.log)")

	if failed:
	    md.append(f"\nFailed: {', '.join(failed)}")
	if left:
	    md.append(f"\nLeft out for time (GPU_CHECK_BUDGET): {sum(r['status'] == 'out-of-time' for r in runs)} runs of {', '.join(left)}")
	text = "\n".join(md) + "\n"
	open(f"{out}/summary.md", "w").write(text)
	print(text)
	machine = open(f"{tmp}/te-info.txt").read() if os.path.exists(f"{tmp}/te-info.txt") else None
	json.dump(dict(rounds=rounds, seconds=secs, cases=cases, checks=checks, summary=summary,
	               copy_bench=copy, te_info=machine, runs=runs), open(f"{out}/results.json", "w"), indent=1)
	def why(id):
	    r = next(x for x in runs if x["id"] == id and not x["ok"])
	    last = [l for l in r["stderr"].splitlines() if l.strip()]
	    return f"{sum(1 for x in runs if x['id'] == id and not x['ok'])} run(s): status {r['status']}: " + (last[-1] if last else "no message")
	open(f"{tmp}/failed.txt", "w").write("".join(f"te-bench {x}: {why(x)}\n" for x in failed))
	PY
	local line
	if [ -f "$tmp/failed.txt" ]; then
		while IFS= read -r line; do
			failures+=("$line")
		done <"$tmp/failed.txt"
	fi

	echo "== gpu-check: $((SECONDS - t0)) s; files in $out: $(cd "$out" && echo *)"
	if [ ${#failures[@]} -gt 0 ]; then
		echo "gpu-check: ${#failures[@]} step(s) FAILED:"
		printf '  %s\n' "${failures[@]}"
		return 1
	fi
	echo "gpu-check: every step passed"
}

# ------------------------------------------------------------ te-bench runs

declare -A target_pid target_name target_fails

target_env() { # allocator: the variables of its runs, for env(1)
	case $1 in
	vmm) echo TE_CUDA_ALLOC=vmm ;;
	nogather) echo TE_CUDA_GATHER=0 ;;        # a copy call per device-to-device piece
	ghost) echo TE_CUDA_GATHER=host ;;        # the gather kernel on page-locked host memory too
	chunk1m) echo TE_STAGE_CHUNK_BYTES=1048576 ;; # larger staging chunks
	*) echo GPU_CHECK_ALLOC=default ;;
	esac
}

mem_flags() { # host|dev
	if [ "$1" = dev ]; then echo "--use_vram --gpu_id=$gpu"; else echo "--memory=libte"; fi
}

# A target for (protocol, memory, allocator), started when first needed;
# its segment name in $name. Returns 1 when it cannot start.
ensure_target() {
	local key=$1 proto=$2 mem=$3 alloc=$4 file
	name=
	if [ -n "${target_pid[$key]:-}" ] && kill -0 "${target_pid[$key]}" 2>/dev/null; then
		name=${target_name[$key]}
		return 0
	fi
	if [ -n "${target_pid[$key]:-}" ]; then
		echo "  target $key died; its output:"
		sed 's/^/    /' "$tmp/targets/$key.out"
		wait "${target_pid[$key]}" 2>/dev/null || true
		target_pid[$key]=
	fi
	# One that failed to start twice is not tried again: each try costs a wait.
	[ "${target_fails[$key]:-0}" -lt 2 ] || return 1
	file=$tmp/targets/$key.out
	: >"$file"
	# shellcheck disable=SC2046
	env $(target_env "$alloc") timeout 1800 te-bench --mode=target --protocol="$proto" $(mem_flags "$mem") \
		--buffer_size=512M --local_server_name=127.0.0.1 >"$file" 2>&1 &
	target_pid[$key]=$!
	name=$(bench_target_name "$file" "${target_pid[$key]}" 300)
	if [ -z "$name" ]; then
		echo "  target $key did not start: $(tr '\n' ' ' <"$file")"
		kill "${target_pid[$key]}" 2>/dev/null || true
		wait "${target_pid[$key]}" 2>/dev/null || true
		target_pid[$key]=
		target_fails[$key]=$((${target_fails[$key]:-0} + 1))
		return 1
	fi
	target_name[$key]=$name
	{ echo "-- target $key: $(cat "$file")"; } >>"$log"
}

stop_targets() {
	local k
	for k in "${!target_pid[@]}"; do
		[ -n "${target_pid[$k]}" ] || continue
		kill "${target_pid[$k]}" 2>/dev/null || true
		wait "${target_pid[$k]}" 2>/dev/null || true
		target_pid[$k]=
		# What it said while it served, warnings included.
		{ echo "-- target $k at its end:"; sed 's/^/   /' "$tmp/targets/$k.out"; } >>"$log" 2>/dev/null || true
	done
}

bench_run() { # "id proto op block threads tmem imem alloc" round check|measure cuda_ok
	local id proto op bs th tm im alloc
	read -r id proto op bs th tm im alloc <<<"$1"
	local round=$2 kind=$3 cuda_ok=$4 base=$tmp/runs/$id.r$2 rc=0 extra=() key
	local t=$SECONDS
	if [ $((SECONDS - t0_all)) -ge "$budget" ]; then
		echo "left out: the pass had run ${budget} s (GPU_CHECK_BUDGET)" >"$base.err"
		echo out-of-time >"$base.status"
		printf '[%3d/%d %4ds] %-22s r%d LEFT OUT (time)\n' "$n" "$total" $((SECONDS - t0_all)) "$id" "$round"
		return 0
	fi
	if [ "$cuda_ok" = 0 ] && { [ "$tm" = dev ] || [ "$im" = dev ]; }; then
		echo "skipped: the CUDA plugin is not active" >"$base.err"
		echo skipped >"$base.status"
		printf '[%3d/%d %4ds] %-22s r%d SKIPPED (no CUDA)\n' "$n" "$total" $((SECONDS - t0_all)) "$id" "$round"
		return 0
	fi
	key=$proto.$tm.$alloc
	if ! ensure_target "$key" "$proto" "$tm" "$alloc"; then
		echo "the target $key could not be started: $(tr '\n' ' ' <"$tmp/targets/$key.out")" >"$base.err"
		echo no-target >"$base.status"
		printf '[%3d/%d %4ds] %-22s r%d FAILED (no target)\n' "$n" "$total" $((SECONDS - t0_all)) "$id" "$round"
		return 0
	fi
	local dur=$secs
	[ "$kind" = check ] && extra+=(--check) && dur=$check_secs
	local cmd
	cmd="$(target_env "$alloc") te-bench --segment_id=$name --protocol=$proto $(mem_flags "$im") --buffer_size=256M"
	cmd+=" --operation=$op --block_size=$bs --batch_size=128 --threads=$th --duration=$dur --quiet --json ${extra[*]}"
	echo "$cmd" >"$base.cmd"
	# shellcheck disable=SC2086
	timeout 60 env $cmd >"$base.json" 2>"$base.err" || rc=$?
	echo "$rc" >"$base.status"
	local gbs
	gbs=$(python3 -c 'import json,sys; print("%.2f" % (json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["throughput_bytes_per_s"] / 1e9))' \
		"$base.json" 2>/dev/null) || gbs=
	{
		echo "-- $id round $round: $cmd"
		echo "   status $rc; $(cat "$base.json")"
		[ -s "$base.err" ] && sed 's/^/   stderr: /' "$base.err"
	} >>"$log"
	if [ "$rc" -eq 0 ] && [ -n "$gbs" ]; then
		printf '[%3d/%d %4ds] %-22s r%d %7s GB/s (%ds)\n' "$n" "$total" $((SECONDS - t0_all)) "$id" "$round" "$gbs" $((SECONDS - t))
	else
		[ "$rc" -eq 124 ] && echo "timed out after 60 s" >>"$base.err"
		[ "$rc" -eq 0 ] && echo "no result in its output" >>"$base.err" && echo "no-json" >"$base.status"
		printf '[%3d/%d %4ds] %-22s r%d FAILED (status %s): %s\n' "$n" "$total" $((SECONDS - t0_all)) "$id" "$round" \
			"$rc" "$(tail -1 "$base.err")"
	fi
}

cleanup() {
	stop_targets
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

t0_all=$SECONDS
# Everything printed goes to the log too; the log also gets each run's
# command, output and errors (written there directly by bench_run).
rc=0
main > >(tee -a "$log") 2>&1 || rc=$?
# Let tee write its last lines before the shell exits.
wait $! 2>/dev/null || true
sleep 0.2
exit "$rc"
