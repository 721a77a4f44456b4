#!/usr/bin/env bash
# Every reader of JSON from outside goes through te_json_check() (te-json.h):
# fails when a file outside tests/ calls a JSON parser directly. json-glib's
# loaders may appear in include/te/te-json.h only (te_json_load() runs the
# check first); a Python json.loads() must say on its line why its text is
# already bounded ("# bounded: ...").
#   json-readers.sh SOURCE_ROOT
set -uo pipefail
root=${1:?usage: json-readers.sh SOURCE_ROOT}
cd "$root" || exit 2
bad=0
while IFS= read -r hit; do
  case $hit in
    include/te/te-json.h:*) ;;
    *) echo "unbounded JSON parse: $hit"; bad=1 ;;
  esac
done < <(grep -rnE 'json_parser_load_from_(data|file|mapped_file|stream)|json_from_string|json_gobject_from_data|json_gvariant_deserialize_data' \
           --include='*.c' --include='*.h' --exclude-dir=tests --exclude-dir='build*' --exclude-dir=.git .  | sed 's|^\./||')
while IFS= read -r hit; do
  case $hit in
    *'# bounded:'*) ;;
    *) echo "unbounded JSON parse: $hit"; bad=1 ;;
  esac
done < <(grep -rnE 'json\.loads?\(' --include='*.py' --exclude-dir=tests --exclude-dir='build*' --exclude-dir=.git . | sed 's|^\./||')
# The check is really there: te_json_load() calls it before parsing.
if ! grep -q 'if (te_json_check(text, len, lim, why, whylen) < 0)' include/te/te-json.h; then
  echo "te_json_load() no longer checks before it parses"
  bad=1
fi
[ $bad -eq 0 ] && echo "every JSON reader outside tests/ goes through te_json_check()"
exit $bad
