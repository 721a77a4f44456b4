#!/bin/sh
# The CUDA device plugin on the stand-in driver of fake-cuda/: te-info lists
# the driver's devices; te-bench moves device memory over TCP, reads and
# writes, with every byte checked, and the staging copies go through the
# plugin's asynchronous copies (stream callbacks); a driver that refuses or
# fails copies ends the run with FAILED tasks and the driver's reason, not
# with a crash.
# The same-host transport reaches another process's device memory through
# the driver's IPC handles.
# Usage: cuda-fake.sh TE_INFO TE_BENCH FAKE_CUDA_DIR
set -u
info=$1
bench=$2
export LD_LIBRARY_PATH="$3${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }
check() { # description, command...
  what=$1; shift
  if "$@"; then ok "$what"; else bad "$what"; fi
}

out=$("$info") || { echo "te-info failed"; exit 1; }
cuda=$(printf '%s\n' "$out" | sed -n '/^\[cuda\] (device memory)$/{n;p;}')
check "the cuda plugin is active on the stand-in driver ($cuda)" \
  test "$cuda" = "2 device(s), memory of locations 'cuda:N'"
check "te-info lists cuda:1 with its name" \
  sh -c 'printf "%s\n" "$1" | grep -q "^cuda:1: libte fake GPU 1"' _ "$out"

run() { # name, VAR=value for the run (or "-"), te-bench flags...
  name=$1 var=$2; shift 2
  [ "$var" = - ] && var=FAKE_CUDA_NONE=1
  env "$var" FAKE_CUDA_STATS="$tmp/$name.stats" "$bench" --protocol=tcp --use_vram --check \
    --buffer_size=64M --duration=1 --quiet --json "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
}
stat() { # name, field: the field's count in the stats line
  sed -n "s/.*$2 \([0-9]*\).*/\1/p" "$tmp/$1.stats" | tail -1
}

for op in read write; do
  for bs in 65536 1000003; do
    n=$op-$bs
    if run "$n" - --operation=$op --block_size=$bs; then
      req=$(sed -n 's/.*"requests":\([0-9]*\).*/\1/p' "$tmp/$n.out" | tail -1)
      async=$(stat "$n" async)
      cbs=$(stat "$n" callbacks)
      if [ "${req:-0}" -gt 0 ] && [ "${async:-0}" -gt 0 ] && [ "${cbs:-0}" -ge "${async:-0}" ]; then
        ok "$op $bs bytes: $req requests checked, $async asynchronous copies, $cbs stream callbacks"
      else
        bad "$op $bs bytes: requests '$req', asynchronous copies '$async', callbacks '$cbs'"
      fi
    else
      bad "$op $bs bytes: te-bench failed: $(tail -3 "$tmp/$n.err")"
    fi
  done
done

# A driver that will not queue the stream callback: the plugin waits for
# the stream instead, and the bytes still arrive.
if run nocb FAKE_CUDA_NO_CALLBACK=1 --operation=read && [ "$(stat nocb callbacks)" = 0 ] &&
   [ "$(stat nocb async)" -gt 0 ] && [ "$(grep -c "waiting for copies instead" "$tmp/nocb.err")" = 1 ]; then
  ok "no stream callback: $(stat nocb async) copies waited for, every byte checked, said once"
else
  bad "no stream callback: $(tail -3 "$tmp/nocb.err"); $(cat "$tmp/nocb.stats" 2>/dev/null)"
fi

# The same-host transport between two processes: the initiator opens the
# target's device allocation with cuIpcOpenMemHandle and copies with
# cuMemcpy; reads and writes, every byte checked.
env FAKE_CUDA_STATS="$tmp/target.stats" "$bench" --mode=target --protocol=shm --use_vram \
  --buffer_size=64M --local_server_name=127.0.0.1 >"$tmp/target.out" 2>&1 &
target=$!
name=
for _ in $(seq 100); do
  name=$(sed -n 's/.*segment name \([^ ]*\) .*/\1/p' "$tmp/target.out")
  [ -n "$name" ] && break
  sleep 0.1
done
for op in read write; do
  n=shm-$op
  if [ -n "$name" ] && env FAKE_CUDA_STATS="$tmp/$n.stats" "$bench" --segment_id="$name" --protocol=shm \
       --use_vram --check --buffer_size=64M --duration=1 --quiet --json --operation=$op \
       >"$tmp/$n.out" 2>"$tmp/$n.err"; then
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

# A driver that refuses asynchronous copies, or whose copies fail on the
# stream: the run fails with FAILED tasks and the reason in the log.
for f in FAKE_CUDA_FAIL_ASYNC FAKE_CUDA_FAIL_STREAM; do
  run "$f" "$f=1" --operation=read
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
