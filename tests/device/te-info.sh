#!/bin/sh
# te-info and the device plugins: the CUDA plugin loads everywhere and says
# why it is idle on a machine without the driver (or lists the GPUs where
# there is one); the test device plugin lists its devices, or why it is idle;
# the RDMA plugin places the devices in its NIC priority matrix by the PCI
# addresses the device plugin reports (the tests' copy of the RDMA plugin,
# whose software verbs read the fixtures).
# Usage: te-info.sh TE_INFO RDMA_FIXTURES yes|no (whether the CUDA plugin was built)
#        [folder of the tests' RDMA plugin]
set -u
info=$1
fixtures=$2
with_cuda=$3
soft_dir=${4:-}
. "$(dirname "$0")/../common/check.sh"
out=$("$info") || { echo "te-info failed"; exit 1; }
if [ "$with_cuda" = yes ]; then
check "the cuda plugin is loaded as a device plugin" \
  sh -c 'printf "%s\n" "$1" | grep -Eq "^  cuda +device "' _ "$out"
cuda=$(printf '%s\n' "$out" | sed -n '/^\[cuda\] (device memory)$/{n;p;}')
case $cuda in
  "idle: the CUDA driver library libcuda.so.1 is not installed"*|"idle: no CUDA device"*|*" device(s), memory of locations 'cuda:N'")
    echo "ok   cuda report: $cuda" ;;
  *) echo "FAIL cuda report: '$cuda'"; fail=1 ;;
esac
fi
check "the test device lists its two devices" \
  sh -c 'printf "%s\n" "$1" | grep -q "^testdev:1: libte test device"' _ "$out"
off=$(TE_TESTDEV_OFF=1 "$info" | sed -n '/^\[testdev\] (device memory)$/{n;p;}')
check "an idle device plugin says why ($off)" test "$off" = "idle: disabled by TE_TESTDEV_OFF"
if [ -n "$soft_dir" ] && printf '%s\n' "$out" | grep -q '^  rdma '; then
  m=$(TE_PLUGIN_PATH="$soft_dir:$TE_PLUGIN_PATH" TE_TESTDEV_PCI=0000:87:00.0,0000:03:00.0 \
      TE_RDMA_SOFT=1 TE_RDMA_SYSFS_ROOT="$fixtures/two-socket" "$info" | grep 'priority matrix')
  check "RDMA places testdev:0 behind mlx5_3's switch" \
    sh -c 'printf "%s\n" "$1" | grep -q "\"testdev:0\":\[\[\"mlx5_3\"\]"' _ "$m"
  check "RDMA places testdev:1 behind mlx5_0's switch" \
    sh -c 'printf "%s\n" "$1" | grep -q "\"testdev:1\":\[\[\"mlx5_0\"\]"' _ "$m"
fi
exit $fail
