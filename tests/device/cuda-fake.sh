#!/bin/sh
# The CUDA device plugin on the stand-in driver of fake-cuda/: te-info lists
# the driver's devices; te-bench moves device memory over TCP, reads and
# writes, with every byte checked, and the staging copies go through the
# plugin's asynchronous copies (each reported by an event or a stream
# callback), in the direction the operation needs; the same with the
# driver's H100 cost model on; a driver that refuses or fails copies ends the
# run with FAILED tasks and the driver's reason, not with a crash.
# The same-host transport reaches another process's device memory through
# the driver's IPC handles, or a file descriptor of cuMemCreate memory.
# The diagnostic counters (TE_STAGE_STATS, TE_CUDA_STATS, TE_TCP_STATS) print
# what they counted, and nothing unless asked for. TE_CUDA_GATHER=host puts
# the pieces between device memory and the plugin's page-locked memory in
# launches of the gather kernel, and nothing else.
# Usage: cuda-fake.sh TE_INFO TE_BENCH FAKE_CUDA_DIR
set -u
info=$1
bench=$2
export LD_LIBRARY_PATH="$3${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/../common/poll.sh"
. "$(dirname "$0")/../common/check.sh"
. "$(dirname "$0")/bursts.sh"

out=$("$info") || { echo "te-info failed"; exit 1; }
cuda=$(printf '%s\n' "$out" | sed -n '/^\[cuda\] (device memory)$/{n;p;}')
check "the cuda plugin is active on the stand-in driver ($cuda)" \
  test "$cuda" = "2 device(s), memory of locations 'cuda:N'"
check "te-info lists cuda:1 with its name" \
  sh -c 'printf "%s\n" "$1" | grep -q "^cuda:1: libte fake GPU 1"' _ "$out"

run() { # name, "VAR=value ..." for the run (or "-"), te-bench flags...
  name=$1 var=$2; shift 2
  [ "$var" = - ] && var=FAKE_CUDA_NONE=1
  rm -f "$tmp/$name.stats"
  # shellcheck disable=SC2086 # one word per variable
  lsan_run "$tmp/$name.out" "$tmp/$name.err" env $var FAKE_CUDA_STATS="$tmp/$name.stats" "$bench" \
    --protocol=tcp --use_vram --check --buffer_size=64M --duration=1 --quiet --json "$@"
}
stat() { # name, field: the field's count, summed over the stats lines (one per process)
  [ -e "$tmp/$1.stats" ] || { echo 0; return; }
  awk -v f="$2" '{ for (i = 1; i < NF; i++) if ($i == f) v += $(i + 1) } END { printf "%.0f\n", v }' "$tmp/$1.stats"
}

# A read lands in a host staging buffer and is copied into the device
# (host to device); a write is copied out of the device first.
for costs in - FAKE_CUDA_COSTS=h100; do
  for op in read write; do
    for bs in 65536 1000003; do
      label=
      [ "$costs" = - ] || label=" (h100 costs)"
      n=$op-$bs${label:+-h100}
      [ -z "$label" ] || [ "$bs" = 65536 ] || continue
      if run "$n" "$costs" --operation=$op --block_size=$bs; then
        req=$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' "$tmp/$n.out" | tail -1)
        async=$(stat "$n" async)
        # Each copy is reported by an event or a callback, or waited for
        # with its batch (cuStreamSynchronize).
        reports=$(( $(stat "$n" callbacks) + $(stat "$n" event_records) + $(stat "$n" stream_waits) ))
        dir=h2d_bytes
        [ $op = write ] && dir=d2h_bytes
        bytes=$(stat "$n" $dir)
        if [ "${req:-0}" -gt 0 ] && [ "${async:-0}" -gt 0 ] && [ "$reports" -gt 0 ] &&
           [ "${bytes:-0}" -ge $((req * bs)) ]; then
          ok "$op $bs bytes$label: $req requests checked, $async asynchronous copies, $reports events, callbacks or stream waits, $bytes bytes $dir"
        else
          bad "$op $bs bytes$label: requests '$req', asynchronous copies '$async', events, callbacks or stream waits '$reports', $dir '$bytes'"
        fi
      else
        bad "$op $bs bytes$label: te-bench failed: $(tail -3 "$tmp/$n.err")"
      fi
    done
  done
done

# The diagnostic counters (docs/gpu.md): each prints its line, with what it
# counted, when its engine or plugin goes away.
if run diag "TE_STAGE_STATS=1 TE_CUDA_STATS=1 TE_TCP_STATS=1" --operation=read --block_size=65536 &&
   grep -Eq '^stage-stats read: [1-9][0-9]* chunks' "$tmp/diag.err" &&
   grep -Eq '^cuda-stats\[[0-9]+\]: async [1-9][0-9]*,' "$tmp/diag.err" &&
   grep -Eq '^tcp-stats: read fills [1-9][0-9]*,' "$tmp/diag.err"; then
  ok "TE_STAGE_STATS, TE_CUDA_STATS, TE_TCP_STATS: each printed what it counted"
else
  bad "diagnostic counters: $(grep stats "$tmp/diag.err" | head -5)"
fi
# A plugin's copies finished together are one burst for the host (bursts.sh).
check_bursts "$bench" "$tmp"
# Without them, nothing is printed.
if run nodiag - --operation=read --block_size=65536 && ! grep -q -- '-stats' "$tmp/nodiag.err"; then
  ok "no diagnostic lines unless asked for"
else
  bad "diagnostic lines printed unasked: $(grep -- -stats "$tmp/nodiag.err" | head -3)"
fi

# A driver that will not create events (nor queue stream callbacks): the
# plugin copies without them, and the bytes still arrive.
if run noev "FAKE_CUDA_NO_EVENTS=1 FAKE_CUDA_NO_CALLBACK=1" --operation=read &&
   [ "$(stat noev callbacks)" = 0 ] && [ "$(stat noev event_records)" = 0 ] &&
   [ "$(( $(stat noev sync) + $(stat noev async) ))" -gt 0 ]; then
  ok "no events: $(stat noev sync) synchronous and $(stat noev async) queued copies, every byte checked"
else
  bad "no events: $(tail -3 "$tmp/noev.err"); $(cat "$tmp/noev.stats" 2>/dev/null)"
fi

# Each way of waiting, every byte checked: block and spin wait for every
# event they record (cuEventSynchronize), poll finds most ends with
# cuEventQuery first and sleeps on the rest.
for w in poll block spin; do
  for op in read write; do
    n=wait-$w-$op
    if run "$n" "TE_CUDA_WAIT=$w" --operation=$op --block_size=65536; then
      rec=$(stat "$n" event_records) waits=$(stat "$n" event_waits)
      if [ "$rec" -gt 0 ] && { { [ "$w" = poll ] && [ "$waits" -lt "$rec" ]; } ||
                               { [ "$w" != poll ] && [ "$waits" = "$rec" ]; }; }; then
        ok "TE_CUDA_WAIT=$w, $op: every byte checked, $rec events recorded, $waits slept on"
      else
        bad "TE_CUDA_WAIT=$w, $op: $rec events recorded, $waits slept on"
      fi
    else
      bad "TE_CUDA_WAIT=$w, $op: $(tail -3 "$tmp/$n.err")"
    fi
  done
done

# The same-host transport between two processes: the initiator opens the
# target's device allocation and copies with the driver; reads and writes,
# every byte checked. The target's memory from cuMemAlloc is opened with
# cuIpcOpenMemHandle; from cuMemCreate (TE_CUDA_ALLOC=vmm) it is shared as a
# file descriptor and imported (both counted by the driver).
for alloc in legacy vmm; do
  export TE_CUDA_ALLOC=$alloc
  field=ipc how=cuIpcOpenMemHandle
  [ $alloc = vmm ] && field=vmm_imports how="an imported file descriptor"
  env FAKE_CUDA_STATS="$tmp/target.stats" "$bench" --mode=target --protocol=shm --use_vram \
    --buffer_size=64M --local_server_name=127.0.0.1 >"$tmp/target.out" 2>&1 &
  target=$!
  name=$(bench_name "$tmp/target.out")
  for op in read write; do
    n=shm-$alloc-$op
    if [ -n "$name" ] && lsan_run "$tmp/$n.out" "$tmp/$n.err" env FAKE_CUDA_STATS="$tmp/$n.stats" \
         "$bench" --segment_id="$name" --protocol=shm --use_vram --check --buffer_size=64M --duration=1 \
         --quiet --json --operation=$op; then
      req=$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' "$tmp/$n.out" | tail -1)
      tp=$(sed -n 's/.*"transport":"\([a-z]*\)".*/\1/p' "$tmp/$n.out" | tail -1)
      opened=$(stat "$n" $field) launches=$(stat "$n" launches)
      # Device to device: the pieces of a run in launches of the gather kernel.
      if [ "${req:-0}" -gt 0 ] && [ "$tp" = shm ] && [ "${opened:-0}" -ge 1 ] && [ "$launches" -gt 0 ]; then
        ok "shm $op between two processes ($alloc): $req requests checked, the target's allocation opened through $how ($opened), $launches gather launches"
      else
        bad "shm $op ($alloc): requests '$req', transport '$tp', $field '$opened', launches '$launches'"
      fi
    else
      bad "shm $op ($alloc): target '${name:-not ready}'; $(tail -3 "$tmp/$n.err" 2>/dev/null); the target said: $(tail -5 "$tmp/target.out" 2>/dev/null)"
    fi
  done
  kill "$target" 2>/dev/null
  wait "$target" 2>/dev/null
done
unset TE_CUDA_ALLOC

# The gather kernel on page-locked host memory (TE_CUDA_GATHER=host): the
# staged chunks' copies and the TCP target's device stage go in launches of
# the kernel, several pieces a launch, every byte checked; by default those
# pieces take copy calls (no launch at all over TCP).
for op in read write; do
  n=ghost-$op
  if run "$n" "TE_CUDA_GATHER=host TE_CUDA_STATS=1" --operation=$op --block_size=65536; then
    launches=$(stat "$n" launches) plain=$(stat "$op-65536" launches)
    pieces=$(sed -n 's/.*gather launches [0-9]*, \([0-9]*\) pieces.*/\1/p' "$tmp/$n.err" | awk '{ s += $1 } END { printf "%.0f\n", s }')
    if [ "$launches" -gt 0 ] && [ "$pieces" -gt "$launches" ] && [ "$plain" = 0 ]; then
      ok "TE_CUDA_GATHER=host, tcp $op: $pieces pieces in $launches launches, every byte checked (default: $plain launches)"
    else
      bad "TE_CUDA_GATHER=host, tcp $op: launches '$launches', pieces '$pieces', default launches '$plain'"
    fi
  else
    bad "TE_CUDA_GATHER=host, tcp $op: $(tail -3 "$tmp/$n.err")"
  fi
done
# The kernel is given only the plugin's own page-locked memory: the
# same-host transport's copies between device memory and a target's host
# memory (a shared mapping the kernel cannot reach: the stand-in's kernel
# fails the stream on it, as a real one would fault) stay copy calls.
env TE_CUDA_GATHER=host "$bench" --mode=target --protocol=shm --memory=libte --buffer_size=64M \
  --local_server_name=127.0.0.1 >"$tmp/htarget.out" 2>&1 &
target=$!
name=$(bench_name "$tmp/htarget.out")
for op in read write; do
  n=ghost-shm-$op
  if [ -n "$name" ] && lsan_run "$tmp/$n.out" "$tmp/$n.err" env TE_CUDA_GATHER=host \
       FAKE_CUDA_STATS="$tmp/$n.stats" "$bench" --segment_id="$name" --protocol=shm --use_vram --check \
       --buffer_size=64M --duration=1 --quiet --json --operation=$op; then
    req=$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' "$tmp/$n.out" | tail -1)
    if [ "${req:-0}" -gt 0 ] && [ "$(stat "$n" launches)" = 0 ] && [ "$(stat "$n" async)" -gt 0 ]; then
      ok "TE_CUDA_GATHER=host, shm $op to a target's host memory: $req requests checked, copy calls, no launch"
    else
      bad "TE_CUDA_GATHER=host, shm $op: requests '$req', launches '$(stat "$n" launches)', async '$(stat "$n" async)'"
    fi
  else
    bad "TE_CUDA_GATHER=host, shm $op: target '${name:-not ready}'; $(tail -3 "$tmp/$n.err" 2>/dev/null)"
  fi
done
kill "$target" 2>/dev/null
wait "$target" 2>/dev/null

# A driver that refuses asynchronous copies, or whose copies fail on the
# stream: the run fails with FAILED tasks and the reason in the log.
# (The stand-in refuses only copies to or from pinned memory, the staging
# the transfers go through, so te-bench fills its buffers for --check; a
# failing stream fails every copy of the plugin's, its own synchronous ones
# included, so that run checks nothing and the failure meets the transfers'
# copies.)
for f in FAKE_CUDA_FAIL_ASYNC FAKE_CUDA_FAIL_STREAM; do
  if [ "$f" = FAKE_CUDA_FAIL_ASYNC ]; then
    run "$f" "$f=1 TE_CUDA_WAIT=spin" --operation=read
  else
    run "$f" "$f=1" --operation=read --nocheck
  fi
  rc=$?
  want="cuMemcpyAsync"
  [ "$f" = FAKE_CUDA_FAIL_STREAM ] && want="an illegal memory access"
  if [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && grep -q FAILED "$tmp/$f.err" && grep -q "$want" "$tmp/$f.err"; then
    ok "$f: te-bench exits $rc, tasks FAILED, the log says '$want'"
  else
    bad "$f: exit $rc; $(tail -3 "$tmp/$f.err")"
  fi
done
exit $fail
