#!/usr/bin/env bash
# The metrics endpoint over https (TE_METRICS_TLS_CERT, TE_METRICS_TLS_KEY):
# te-top trusting the endpoint's self-signed certificate (--ca_file) shows
# the run; without it the certificate is refused; plain http to the https
# port gets no metrics. A certificate without its key, or one that is not
# there, stops te-bench at start with the reason.
#   tls.sh TE_BENCH TE_TOP SOURCE_ROOT
set -uo pipefail
bench=${1:?usage: tls.sh TE_BENCH TE_TOP SOURCE_ROOT}
top=${2:?usage: tls.sh TE_BENCH TE_TOP SOURCE_ROOT}
src=${3:?usage: tls.sh TE_BENCH TE_TOP SOURCE_ROOT}
command -v openssl >/dev/null || { echo "SKIP: openssl is not installed"; exit 77; }
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

# LeakSanitizer's tracer crashes on GnuTLS's thread-local storage (not a
# leak); under ThreadSanitizer the serving process gets the suppressions of
# glib-networking's hand-offs (tests/tsan/tls-server.txt says why).
[ -n "${ASAN_OPTIONS:-}" ] && export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"
server_tsan=${TSAN_OPTIONS:-}
case "$server_tsan" in
*suppressions=*) server_tsan="$server_tsan:suppressions=$src/tests/tsan/tls-server.txt" ;;
esac

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=127.0.0.1 \
  -addext subjectAltName=IP:127.0.0.1 -keyout "$dir/key.pem" -out "$dir/cert.pem" 2>"$dir/openssl.err" ||
  fail "openssl: $(cat "$dir/openssl.err")"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=other \
  -keyout "$dir/other-key.pem" -out "$dir/other.pem" 2>/dev/null || fail "openssl (other)"

start_bench https TSAN_OPTIONS="$server_tsan" TE_METRICS_TLS_CERT="$dir/cert.pem" \
  TE_METRICS_TLS_KEY="$dir/key.pem"

timeout 20 "$top" --count=2 --interval=0.5 --ca_file="$dir/cert.pem" "$url" >"$dir/yes.out" 2>"$dir/yes.err" ||
  fail "te-top over https failed: $(cat "$dir/yes.err")"
grep -qE '^  tcp +read +[0-9.]+ +[1-9][0-9]* ' "$dir/yes.out" || fail "no tcp reads shown: $(cat "$dir/yes.out")"
# Another CA: the endpoint's certificate is not trusted.
timeout 20 "$top" --count=1 --ca_file="$dir/other.pem" "$url" >/dev/null 2>"$dir/other.err"
rc=$?
[ $rc -eq 1 ] || fail "te-top trusting another CA exited $rc: $(cat "$dir/other.err")"
# Plain http to the https port: no metrics come back.
plain=${url/https:/http:}
timeout 20 "$top" --count=1 "$plain" >/dev/null 2>"$dir/plain.err"
rc=$?
[ $rc -eq 1 ] || fail "plain http to the https port: te-top exited $rc"
wait "$pid" || fail "te-bench failed: $(cat "$dir/bench.err")"
pid=

# Refused at start, the reason named.
start_refused() { # what, expected log text, env...
  local what=$1 want=$2
  shift 2
  env "$@" TSAN_OPTIONS="$server_tsan" "$bench" --protocol=tcp --duration=1 --quiet \
    --metrics_addr=127.0.0.1:0 >/dev/null 2>"$dir/refused.err"
  local rc=$?
  [ $rc -ne 0 ] || fail "$what: te-bench started"
  grep -q "$want" "$dir/refused.err" || fail "$what: no '$want' in: $(cat "$dir/refused.err")"
}
start_refused "a certificate without its key" "go together" TE_METRICS_TLS_CERT="$dir/cert.pem"
start_refused "a key without its certificate" "go together" TE_METRICS_TLS_KEY="$dir/key.pem"
start_refused "no such certificate" "cannot load the certificate" \
  TE_METRICS_TLS_CERT="$dir/none.pem" TE_METRICS_TLS_KEY="$dir/key.pem"
start_refused "a key file that holds a certificate" "cannot load the certificate" \
  TE_METRICS_TLS_CERT="$dir/cert.pem" TE_METRICS_TLS_KEY="$dir/other.pem"
echo "ok: https with the endpoint's certificate trusted; refused with another CA and over plain http; bad certificates refused at start"
