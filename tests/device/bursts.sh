# Sourced by the device plugins' stand-in suites (cuda-fake.sh, hip-fake.sh),
# after ../common/check.sh. A device plugin reports the copies it finds
# finished together as one burst (device_done_burst): the staged WRITE
# chunks they make ready go to TCP together, in fewer calls than chunks;
# with TE_STAGE_BURST=0, one call per chunk. (No --check: its read-back
# would count too.)
# Usage: check_bursts TE_BENCH TMPDIR [more te-bench flags...]
check_bursts() {
  _bench=$1 _dir=$2
  shift 2
  for _b in 1 0; do
    lsan_run "$_dir/burst-$_b.out" "$_dir/burst-$_b.err" env TE_STAGE_BURST=$_b TE_STAGE_STATS=1 \
      "$_bench" --protocol=tcp --use_vram --buffer_size=64M --duration=1 --quiet --json \
      --operation=write --block_size=65536 "$@"
    _rc=$?
    _got=$(sed -n 's/^stage-stats hand-overs: \([0-9]*\) calls, \([0-9]*\) chunks$/\1 \2/p' \
      "$_dir/burst-$_b.err" | tail -1)
    _calls=${_got%% *} _chunks=${_got##* }
    _calls=${_calls:-0} _chunks=${_chunks:-0}
    if [ $_rc = 0 ] && [ "$_chunks" -gt 0 ] &&
       { { [ $_b = 1 ] && [ "$_calls" -lt "$_chunks" ]; } ||
         { [ $_b = 0 ] && [ "$_calls" = "$_chunks" ]; }; }; then
      ok "TE_STAGE_BURST=$_b: $_chunks staged WRITE chunks handed to TCP in $_calls calls"
    else
      bad "TE_STAGE_BURST=$_b: exit $_rc, '$_calls' calls for '$_chunks' chunks: $(tail -2 "$_dir/burst-$_b.err")"
    fi
  done
}
