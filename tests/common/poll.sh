# SPDX-License-Identifier: Apache-2.0
# Bounded waits, free ports and a bounded stop of processes for the shell
# tests (POSIX sh), sourced by them; netns.sh and
# tools/bench-metrics-endpoint.sh source it too. Every wait ends after 10 s
# at the most.

# poll CMD [ARG...]: runs CMD every 0.1 s, at most 100 times, until it prints
# something; prints that and returns 0, or returns 1 when it never did.
poll() {
	local out _
	for _ in $(seq 100); do
		out=$("$@" 2>/dev/null)
		[ -n "$out" ] && { printf '%s\n' "$out"; return 0; }
		sleep 0.1
	done
	return 1
}

# ready_name FILE: the segment name on the READY line a test peer prints.
ready_name() { poll awk '/^READY/ { print $2; exit }' "$1"; }

# bench_name FILE: the segment name a te-bench target logs once it is up.
bench_name() { poll sed -n 's/.*segment name \([^ ]*\) .*/\1/p' "$1"; }

# wait_port PORT: until something accepts on 127.0.0.1:PORT.
wait_port() {
	poll python3 -c "import socket; socket.create_connection(('127.0.0.1', $1), 1); print(1)" >/dev/null
}

# stop_pids PID...: asks each process to end (SIGTERM), gives it 5 s, then
# kills it (SIGKILL) and reaps it when it is a child of this shell.
stop_pids() {
	local p _
	for p in "$@"; do kill "$p" 2>/dev/null; done
	for p in "$@"; do
		for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$p" 2>/dev/null
		wait "$p" 2>/dev/null
	done
}

# free_port: a loopback TCP port free now, from below the kernel's ephemeral
# range (32768 and up): one from that range may be taken, before a server
# binds it, by an outgoing connection of a test running beside.
free_port() {
	python3 -c '
import random, socket
for _ in range(500):
    p = random.randrange(20000, 32000)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
        print(p)
        break
    except OSError:
        pass
    finally:
        s.close()'
}
