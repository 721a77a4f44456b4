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
