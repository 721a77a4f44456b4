#!/bin/sh
# The HIP device plugin on the stand-in runtime of fake-hip/: te-info lists
# the runtime's devices, or says why the plugin is idle; the plugin's ops
# called directly (hip-ops: copy_batch, copy_async, classify, IPC); te-bench
# moves device memory over TCP, reads and writes, with every byte checked,
# the staging copies going through the plugin's asynchronous copies (events
# waited for by its completer thread, no stream callbacks, the copies found
# ended with one reported as a burst), on ROCm 6's and
# ROCm 5's numbering of memory types; the same-host transport reaches
# another process's device memory through HIP IPC handles; a runtime that
# refuses or fails copies ends the run with FAILED tasks and the runtime's
# reason, not with a crash.
# Usage: hip-fake.sh TE_INFO TE_BENCH FAKE_HIP_DIR HIP_OPS HIP_PLUGIN
set -u
info=$1
bench=$2
ops=$4
plugin=$5
# The library path without the stand-in's folder (meson puts it there too).
nolib_path=$(printf '%s\n' "${LD_LIBRARY_PATH:-}" | tr ':' '\n' | grep -vxF "$3" | paste -sd: -)
export LD_LIBRARY_PATH="$3${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
tmp=$(mktemp -d)
target=
trap '[ -n "$target" ] && kill "$target" 2>/dev/null; rm -rf "$tmp"' EXIT
. "$(dirname "$0")/../common/poll.sh"
. "$(dirname "$0")/../common/check.sh"
. "$(dirname "$0")/bursts.sh"
report() { # te-info output: the line after the hip plugin's header
  printf '%s\n' "$1" | sed -n '/^\[hip\] (device memory)$/{n;p;}'
}

out=$("$info") || { echo "te-info failed"; exit 1; }
hip=$(report "$out")
check "the hip plugin is active on the stand-in runtime ($hip)" \
  test "$hip" = "2 device(s), memory of locations 'hip:N'"
check "te-info lists hip:1 with its name and PCI address" \
  sh -c 'printf "%s\n" "$1" | grep -q "^hip:1: libte fake AMD GPU 1.*PCI 0000:C2:00.0"' _ "$out"
idle=$(report "$(FAKE_HIP_NO_DEVICE=1 "$info")")
check "no device: idle, and why ($idle)" test "$idle" = "idle: no HIP device (hipErrorNoDevice)"
idle=$(report "$(LD_LIBRARY_PATH=$nolib_path "$info")")
case $idle in
  "idle: the HIP runtime library libamdhip64.so is not installed"*) ok "no runtime library: idle, and why" ;;
  # A machine with ROCm installed has the real library.
  *" device(s), memory of locations 'hip:N'"|"idle: no HIP device"*) ok "no stand-in: the system's HIP runtime ($idle)" ;;
  *) bad "no runtime library: '$idle'" ;;
esac
# Installs with only the versioned names (no development package).
for so in libamdhip64.so.6 libamdhip64.so.5; do
  mkdir -p "$tmp/$so"
  ln -s "$3/libamdhip64.so" "$tmp/$so/$so"
  r=$(report "$(LD_LIBRARY_PATH="$tmp/$so${nolib_path:+:$nolib_path}" "$info")")
  check "only $so installed: found ($r)" test "$r" = "2 device(s), memory of locations 'hip:N'"
done

for v in 60342134 50731921; do
  if FAKE_HIP_VERSION=$v FAKE_HIP_STATS="$tmp/ops-$v.stats" "$ops" "$plugin" >"$tmp/ops-$v.out" 2>"$tmp/ops-$v.err"; then
    ok "hip-ops, runtime version $v: $(grep -c '^ok' "$tmp/ops-$v.out") checks"
  else
    bad "hip-ops, runtime version $v: $(grep FAIL "$tmp/ops-$v.out"; tail -3 "$tmp/ops-$v.err")"
  fi
done

stat() { # name, field: the field's count in the stats line
  sed -n "s/.* *$2 \([0-9]*\).*/\1/p" "$tmp/$1.stats" 2>/dev/null | tail -1
}
b=$(stat ops-60342134 batches)
e=$(stat ops-60342134 events)
w=$(stat ops-60342134 event_waits)
x=$(stat ops-60342134 event_ended)
check "hip-ops went through copy_batch ($b batches waited once) and copy_async ($e events, $w waited, $x found ended)" \
  test "${b:-0}" -ge 2 -a "${e:-0}" -ge 1000 -a "$(( ${w:-0} + ${x:-0} ))" -ge 1000

run() { # name, VAR=value for the run (or "-"), te-bench flags...
  name=$1 var=$2; shift 2
  [ "$var" = - ] && var=FAKE_HIP_NONE=1
  rm -f "$tmp/$name.stats"
  lsan_run "$tmp/$name.out" "$tmp/$name.err" env "$var" FAKE_HIP_STATS="$tmp/$name.stats" "$bench" \
    --protocol=tcp --use_vram --vram_device=hip --check --buffer_size=64M --duration=1 --quiet --json "$@"
}

for case in read:65536:- write:65536:- read:1000003:- write:1000003:- \
            read:65536:FAKE_HIP_VERSION=50731921 write:1000003:FAKE_HIP_VERSION=50731921; do
  op=${case%%:*} rest=${case#*:}
  bs=${rest%%:*} var=${rest#*:}
  n=$op-$bs-$(echo "$var" | tr -c 'a-zA-Z0-9\n' _)
  if run "$n" "$var" --operation=$op --block_size=$bs; then
    req=$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' "$tmp/$n.out" | tail -1)
    async=$(stat "$n" async)
    events=$(stat "$n" events)
    waits=$(stat "$n" event_waits)
    ended=$(stat "$n" event_ended)
    # The line's first field: hipMemcpy calls, which run on the null stream.
    sync=$(sed -n 's/^sync \([0-9]*\).*/\1/p' "$tmp/$n.stats" | tail -1)
    # Every event is waited for, or found ended when the one before was;
    # no copy of the plugin's on the null stream.
    if [ "${req:-0}" -gt 0 ] && [ "${async:-0}" -gt 0 ] && [ "${events:-0}" -gt 0 ] &&
       [ "$(( ${waits:-0} + ${ended:-0} ))" -ge "${events:-0}" ] && [ "$sync" = 0 ]; then
      ok "$op $bs bytes ($var): $req requests checked, $async asynchronous copies, $events events ($waits waited for, $ended found ended), no hipMemcpy"
    else
      bad "$op $bs bytes ($var): requests '$req', asynchronous copies '$async', events '$events', waits '$waits', ended '$ended', hipMemcpy '$sync'"
    fi
  else
    bad "$op $bs bytes ($var): te-bench failed: $(tail -3 "$tmp/$n.err")"
  fi
done

# A plugin's copies finished together are one burst for the host (bursts.sh).
check_bursts "$bench" "$tmp" --vram_device=hip
# A runtime whose hipEventQuery refuses: every copy is waited for and
# reported on its own, every byte still checked.
if run noquery FAKE_HIP_FAIL_EVENT_QUERY=1 --operation=write --block_size=65536 &&
   [ "$(stat noquery event_ended)" = 0 ] && [ "$(stat noquery event_waits)" -ge "$(stat noquery events)" ] &&
   [ "$(stat noquery events)" -gt 0 ]; then
  ok "hipEventQuery refusing: $(stat noquery events) events, each waited for, every byte checked"
else
  bad "hipEventQuery refusing: $(tail -3 "$tmp/noquery.err"); $(cat "$tmp/noquery.stats" 2>/dev/null)"
fi

# A runtime that will not record events: the plugin waits for the stream
# instead, and the bytes still arrive.
if run noev FAKE_HIP_NO_EVENT_RECORD=1 --operation=read && [ "$(stat noev events)" = 0 ] &&
   [ "$(stat noev async)" -gt 0 ] && [ "$(grep -c "waiting for copies instead" "$tmp/noev.err")" = 1 ]; then
  ok "no event record: $(stat noev async) copies waited for, every byte checked, said once"
else
  bad "no event record: $(tail -3 "$tmp/noev.err"); $(cat "$tmp/noev.stats" 2>/dev/null)"
fi

# The same-host transport between two processes: the initiator opens the
# target's device allocation with hipIpcOpenMemHandle and copies with the
# plugin; reads and writes, every byte checked.
env FAKE_HIP_STATS="$tmp/target.stats" "$bench" --mode=target --protocol=shm --use_vram --vram_device=hip \
  --buffer_size=64M --local_server_name=127.0.0.1 >"$tmp/target.out" 2>&1 &
target=$!
name=$(bench_name "$tmp/target.out")
for op in read write; do
  n=shm-$op
  if [ -n "$name" ] && lsan_run "$tmp/$n.out" "$tmp/$n.err" env FAKE_HIP_STATS="$tmp/$n.stats" \
       "$bench" --segment_id="$name" --protocol=shm --use_vram --vram_device=hip --check \
       --buffer_size=64M --duration=1 --quiet --json --operation=$op; then
    req=$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' "$tmp/$n.out" | tail -1)
    tp=$(sed -n 's/.*"transport":"\([a-z]*\)".*/\1/p' "$tmp/$n.out" | tail -1)
    ipc=$(stat "$n" ipc)
    if [ "${req:-0}" -gt 0 ] && [ "$tp" = shm ] && [ "${ipc:-0}" -ge 1 ]; then
      ok "shm $op between two processes: $req requests checked, the target's allocation opened ($ipc)"
    else
      bad "shm $op: requests '$req', transport '$tp', allocations opened '$ipc'"
    fi
  else
    bad "shm $op: target '${name:-not ready}'; $(tail -3 "$tmp/$n.err" 2>/dev/null)"
  fi
done
kill "$target" 2>/dev/null
wait "$target" 2>/dev/null
target=

# A runtime that refuses the transfers' copies (those through pinned
# staging memory), or whose copies of them fail on the stream: the run fails
# with FAILED tasks and the reason in the log. One whose every copy fails
# stops te-bench already where it fills its device buffer (with
# te_device_copy, the plugin's synchronous copy on a stream of its own): an
# error and the reason, no crash.
for f in FAKE_HIP_FAIL_ASYNC FAKE_HIP_FAIL_STREAM FAKE_HIP_FAIL_COPY; do
  run "$f" "$f=1" --operation=read
  rc=$?
  case $f in
    FAKE_HIP_FAIL_ASYNC) want="hipMemcpyAsync" ;;
    FAKE_HIP_FAIL_STREAM) want="hipErrorIllegalAddress" ;;
    *) want="copy of [0-9]* bytes: hipErrorIllegalAddress" ;;
  esac
  failed=FAILED
  [ "$f" = FAKE_HIP_FAIL_COPY ] && failed="FAILED\|device copy failed"
  if [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && grep -q "$failed" "$tmp/$f.err" && grep -q "$want" "$tmp/$f.err"; then
    ok "$f: te-bench exits $rc, $(grep -o "$failed" "$tmp/$f.err" | head -1), the log says '$want'"
  else
    bad "$f: exit $rc; $(tail -3 "$tmp/$f.err")"
  fi
done
exit $fail
