# SPDX-License-Identifier: Apache-2.0
# Bounded waits and free ports for the shell tests (POSIX sh), sourced by
# them; netns.sh sources it too. Every wait ends after 10 s at the most.

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
