#!/usr/bin/env bash
# te-top against a te-bench whose endpoint wants a token (a run long enough
# for every call below, even under a sanitizer on a loaded machine): refused without it
# (exit 1, the 401 named), a view with it; nothing listening: exit 1 at once,
# a password in the URL hidden;
# bad arguments: exit 2.
#   te-top.sh TE_BENCH TE_TOP
set -uo pipefail
bench=${1:?usage: te-top.sh TE_BENCH TE_TOP}
top=${2:?usage: te-top.sh TE_BENCH TE_TOP}
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

printf 'a-token-of-32-characters-0123456\n' >"$dir/token"
printf 'a-wrong-token-of-32-characters-0\n' >"$dir/wrong"
start_bench http TE_METRICS_TOKEN_FILE="$dir/token"

timeout 20 "$top" --count=1 "$url" >"$dir/no.out" 2>"$dir/no.err"
rc=$?
[ $rc -eq 1 ] || fail "without the token te-top exited $rc"
grep -q 'answered 401' "$dir/no.err" || fail "no 401 named: $(cat "$dir/no.err")"
timeout 20 "$top" --count=1 --token_file="$dir/wrong" "$url" >/dev/null 2>"$dir/wrong.err"
[ $? -eq 1 ] && grep -q 'answered 401' "$dir/wrong.err" || fail "a wrong token was not refused"

timeout 20 "$top" --count=2 --interval=0.5 --token_file="$dir/token" "$url" >"$dir/yes.out" 2>"$dir/yes.err" ||
  fail "with the token te-top failed: $(cat "$dir/yes.err")"
[ "$(grep -c '^[0-9][0-9]:[0-9][0-9]:[0-9][0-9] ' "$dir/yes.out")" -eq 2 ] || fail "not 2 views: $(cat "$dir/yes.out")"
grep -qE '^  tcp +read +[0-9.]+ +[1-9][0-9]* ' "$dir/yes.out" || fail "no tcp reads shown: $(cat "$dir/yes.out")"
# Views 0.5 s apart (give or take a late wake-up), not the default 1 s.
awk '/^[0-9][0-9]:[0-9][0-9]:[0-9][0-9] / { sub(/,$/, "", $3); if ($3 < 0.3 || $3 > 0.95) bad = 1 } END { exit bad }' \
  "$dir/yes.out" || fail "the views are not 0.5 s apart: $(grep '^[0-9]' "$dir/yes.out")"

wait "$pid" || fail "te-bench failed: $(cat "$dir/bench.err")"
pid=
# Nothing listens there any more: a bounded run fails at once.
timeout 10 "$top" --count=1 "$url" >/dev/null 2>"$dir/gone.err"
rc=$?
[ $rc -eq 1 ] || fail "against nothing te-top exited $rc"
# A password in the URL is never shown.
timeout 10 "$top" --count=1 "${url/:\/\//://te:pw-5Xy@}" >/dev/null 2>"$dir/pw.err"
grep -q 'te:\*\*\*@' "$dir/pw.err" && ! grep -q 'pw-5Xy' "$dir/pw.err" ||
  fail "the password was not hidden: $(cat "$dir/pw.err")"
for bad in "--interval=0 $url" "--count=-1 $url" "ftp://x/metrics" "" "--token_file=$dir/nonexistent $url"; do
  # shellcheck disable=SC2086
  timeout 10 "$top" $bad >/dev/null 2>&1
  rc=$?
  [ $rc -eq 2 ] || fail "te-top $bad exited $rc, not 2"
done
echo "ok: te-top refused without the token, showed tcp reads with it, failed against nothing, refused bad arguments"
