#!/usr/bin/env bash
# A program that calls a function newer than the installed libte must be
# refused by the loader, naming the version it lacks, rather than fail at its
# first call. newer-call uses te_last_error_clear (TE_1.1); libte-1.0/ holds
# libte.so.1 linked from the same objects with only the TE_1.0 node.
# usage: check-versions.sh NEWER_CALL LIBTE_DIR OLD_LIBTE_DIR
set -uo pipefail
prog=$1 libdir=$2 olddir=$3
fail=0

# The references carry their versions (objdump -T: "... TE_1.1 te_last_error_clear").
refs=$(objdump -T "$prog")
for want in "TE_1.1 te_last_error_clear" "TE_1.0 te_version"; do
  if ! grep -Eq "[[:space:]]\(?${want% *}\)?[[:space:]]+${want#* }\$" <<<"$refs"; then
    echo "FAIL: $prog does not reference ${want#* }@${want% *}:"
    grep -E 'te_(last_error_clear|version)' <<<"$refs"
    fail=1
  fi
done

# The stand-in old library really stops at TE_1.0.
if objdump -T "$olddir/libte.so.1" | grep 'TE_1\.1' >/dev/null; then
  echo "FAIL: $olddir/libte.so.1 defines TE_1.1"
  fail=1
fi

# Against the library it was built with: runs.
if ! out=$(LD_LIBRARY_PATH=$libdir "$prog" 2>&1); then
  echo "FAIL: against $libdir: $out"
  fail=1
else
  echo "against the current libte: $out"
fi

# Against the old one: the loader refuses it before main().
out=$(LD_LIBRARY_PATH=$olddir "$prog" 2>&1)
rc=$?
echo "against a libte that stops at TE_1.0 (exit $rc): $out"
if [ $rc -eq 0 ] || ! grep -q "version \`TE_1.1' not found" <<<"$out"; then
  echo "FAIL: expected the loader's \"version \`TE_1.1' not found\""
  fail=1
fi
exit $fail
