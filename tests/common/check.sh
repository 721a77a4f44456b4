# SPDX-License-Identifier: Apache-2.0
# The shell tests' counterpart of check.h (POSIX sh), sourced: ok and bad
# print one line a case; bad, or a check whose command fails, sets $fail to
# 1, and the test ends with `exit $fail`.
fail=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }
check() { # description, command...
  what=$1; shift
  if "$@"; then ok "$what"; else bad "$what"; fi
}
# LeakSanitizer's own failure at exit (it could not stop the threads: "fatal
# error", not a leak report) says nothing of the run: a caller runs it again,
# up to twice. A leak it finds ("detected memory leaks") fails as any error
# does.
lsan_broke() { # rc, stderr file
  [ "$1" -ne 0 ] && grep -q 'LeakSanitizer has encountered a fatal error' "$2" &&
    echo "note: LeakSanitizer failed at exit (not a finding); running it again" >&2
}
# Runs a command, its output and errors to files; again, up to four times,
# a moment apart, when only LeakSanitizer broke at its exit (on a loaded
# machine it broke three times in a row once). Should it break every time,
# a last run without the leak check says what the run did. The command's
# exit status.
lsan_run() { # out file, err file, command...
  _lout=$1 _lerr=$2
  shift 2
  for _ltry in 1 2 3 4 5; do
    "$@" >"$_lout" 2>"$_lerr"
    _lrc=$?
    lsan_broke $_lrc "$_lerr" || return $_lrc
    sleep 0.5
  done
  echo "note: LeakSanitizer broke at every exit; once more without it" >&2
  ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" "$@" >"$_lout" 2>"$_lerr"
}
