#!/usr/bin/env bash
# Renders each manual page as man(1) shows it, 80 columns wide, and fails on
# any warning groff or man prints (a stray request, a line that cannot be
# set, an unknown escape) or on a page without a NAME section.
# usage: check-man.sh PAGE...
set -uo pipefail
if ! command -v man >/dev/null; then
  echo "skipped: man is not installed (man-db; tools/install-deps.sh installs it)"
  exit 77
fi
err=$(mktemp)
trap 'rm -f "$err"' EXIT
fail=0
for page in "$@"; do
  out=$(MANWIDTH=80 MANPAGER=cat PAGER=cat man --warnings -l "$page" 2>"$err")
  rc=$?
  if [ $rc -ne 0 ] || [ -s "$err" ] || ! grep -q '^NAME' <<<"$out"; then
    echo "FAIL: $(basename "$page") (man exit $rc):"
    cat "$err"
    fail=1
  else
    echo "ok: $(basename "$page"), $(wc -l <<<"$out") lines"
  fi
done
exit $fail
