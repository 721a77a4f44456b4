#!/bin/sh
# te-info's [rdma] section: the devices, topology and matrix the plugin finds
# (the tests' copy, first on TE_PLUGIN_PATH: software verbs layer over the
# two-socket fixture), and, through libibverbs on a machine without RDMA
# devices, the reason it cannot work. The shipped plugin (TE_RDMA_SHIPPED_PLUGIN)
# must ignore the tests' switches: libibverbs and the real sysfs, always.
set -eu
teinfo=$1
fixtures=$2
fail=0

section() { sed -n '/^\[rdma\]/,/^\[/p'; }
expect() { # text, needle
	if ! printf '%s\n' "$1" | grep -qF -- "$2"; then
		echo "te-info lacks: $2"
		fail=1
	fi
}

out=$(TE_RDMA_SOFT=1 TE_RDMA_SYSFS_ROOT="$fixtures/two-socket" "$teinfo" 2>/dev/null | section)
expect "$out" "verbs: soft"
expect "$out" "mlx5_0     PCI 0000:04:00.0, NUMA node 0"
expect "$out" "mlx5_3     PCI 0000:88:00.0, NUMA node 1"
expect "$out" "GID index 3 chosen automatically (RoCE v2, IPv4"
expect "$out" 'priority matrix: {"cpu:0":[["mlx5_0","mlx5_1"],["mlx5_2","mlx5_3"]]'
expect "$out" '"cuda:4":[["mlx5_2","mlx5_3"],["mlx5_0","mlx5_1"]]'

if [ ! -e /sys/class/infiniband ]; then
	out=$(env -u TE_RDMA_SOFT -u TE_RDMA_SYSFS_ROOT "$teinfo" 2>/dev/null | section)
	expect "$out" "verbs: libibverbs"
	expect "$out" "no RDMA devices were found (libibverbs lists none"
fi
shipped=$(dirname "$TE_RDMA_SHIPPED_PLUGIN")
out=$(TE_PLUGIN_PATH="$shipped" TE_RDMA_SOFT=1 TE_RDMA_SYSFS_ROOT="$fixtures/two-socket" "$teinfo" \
	2>/dev/null | section)
expect "$out" "verbs: libibverbs"
if printf '%s\n' "$out" | grep -qE "verbs: soft|sysfs root|mlx5_0"; then
	echo "the shipped plugin follows TE_RDMA_SOFT/TE_RDMA_SYSFS_ROOT"
	fail=1
fi
[ $fail -eq 0 ] && echo "te-info: ok"
exit $fail
