#!/usr/bin/env bash
# Runs one scenario of tests/rdma-qemu/guest.sh inside a qemu guest that
# boots this machine's Debian kernel (which has Soft-RoCE, rdma_rxe) under
# TCG, so the RDMA plugin meets a real verbs provider.
#
#   run.sh BUILD_DIR SOURCE_DIR SCENARIO
#
# It installs nothing. Without qemu-system-x86_64, a /boot/vmlinuz-*-amd64
# with its /lib/modules tree, or a static busybox it exits 77 (meson's
# "skipped") and says what is missing. Otherwise it builds a small initramfs
# (busybox, the kernel's virtio/9p modules and tests/rdma-qemu/guest-init.sh
# as /init), boots it with the host's / shared read-only and a scratch
# folder shared read-write, and reads what the guest wrote there: exit 0
# when every check passed, 1 otherwise (with the failures and the guest's
# log printed).
#
# The build and source trees may live anywhere, /tmp included: the guest's
# own tmpfs on /tmp and /run does not hide them (guest-init.sh binds them
# back; tmp-path.sh checks it).
#
# Environment: TE_QEMU_TIMEOUT (s, whole guest run; default 600),
# TE_QEMU_MEM (MiB, 1536), TE_QEMU_SMP (2), TE_QEMU_KERNEL (a vmlinuz path),
# TE_QEMU_KEEP=1 (keep the work folder).
set -uo pipefail

build=$(realpath "$1")
src=$(realpath "$2")
scenario=$3
here=$src/tests/rdma-qemu

skip() { echo "SKIP: $*"; exit 77; }

qemu=$(command -v qemu-system-x86_64) ||
	skip "qemu-system-x86_64 not found (Debian package qemu-system-x86)"

# The kernel: the newest Debian amd64 one whose modules are installed.
kernel=${TE_QEMU_KERNEL:-}
if [ -z "$kernel" ]; then
	for k in $(ls -v /boot/vmlinuz-*-amd64 2>/dev/null); do
		[ -r "$k" ] && [ -f "/lib/modules/${k#/boot/vmlinuz-}/modules.dep" ] && kernel=$k
	done
fi
[ -n "$kernel" ] && [ -r "$kernel" ] ||
	skip "no readable /boot/vmlinuz-*-amd64 with its /lib/modules tree (Debian package linux-image-amd64)"
kver=${kernel#/boot/vmlinuz-}
moddir=/lib/modules/$kver
[ -f "$moddir/modules.dep" ] || skip "$moddir/modules.dep missing for $kernel"

busybox=
for b in /bin/busybox /usr/bin/busybox; do
	if [ -x "$b" ] && ! ldd "$b" >/dev/null 2>&1; then busybox=$b; break; fi
done
[ -n "$busybox" ] || skip "no statically linked busybox (Debian package busybox-static)"

work=$build/tests/rdma-qemu/run-$scenario
rm -rf "$work"
mkdir -p "$work/initrd" "$work/scratch" || exit 1
cleanup() { [ "${TE_QEMU_KEEP:-0}" = 1 ] || rm -rf "$work/initrd" "$work/initrd.cpio"; }
trap cleanup EXIT

# ---------------------------------------------------------------- initramfs
# Modules and their dependencies in load order, from modules.dep.
declare -A seen=()
order=()
add_module() { # path relative to $moddir, as modules.dep names it
	local m=$1 line dep
	[ -n "${seen[$m]:-}" ] && return 0
	seen[$m]=1
	line=$(grep -m1 "^$m:" "$moddir/modules.dep") || return 1
	for dep in ${line#*:}; do
		add_module "$dep" || return 1
	done
	order+=("$m")
}
for name in virtio_pci 9pnet_virtio 9p; do
	rel=$(awk -v n="$name" -F: '{ f = $1; sub(/.*\//, "", f); sub(/\.ko(\.(xz|zst|gz))?$/, "", f);
		if (f == n) { print $1; exit } }' "$moddir/modules.dep")
	if [ -z "$rel" ]; then
		# Built into this kernel: nothing to load.
		grep -qw "$name" "$moddir/modules.builtin" 2>/dev/null && continue
		skip "module $name not found in $moddir"
	fi
	add_module "$rel" || skip "cannot resolve the dependencies of $rel"
done

d=$work/initrd
mkdir -p "$d/bin" "$d/proc" "$d/sys" "$d/dev" "$d/newroot" "$d/modules"
cp "$busybox" "$d/bin/busybox"
ln -s busybox "$d/bin/sh"
cp "$here/guest-init.sh" "$d/init"
chmod 755 "$d/init"
: > "$d/modules.order"
for m in "${order[@]}"; do
	base=$(basename "$m")
	case "$m" in
	*.ko.xz) xz -dc "$moddir/$m" > "$d/modules/${base%.xz}"; base=${base%.xz} ;;
	*.ko.zst) zstd -qdc "$moddir/$m" > "$d/modules/${base%.zst}"; base=${base%.zst} ;;
	*.ko.gz) gzip -dc "$moddir/$m" > "$d/modules/${base%.gz}"; base=${base%.gz} ;;
	*) cp "$moddir/$m" "$d/modules/$base" ;;
	esac || { echo "cannot copy $m"; exit 1; }
	echo "$base" >> "$d/modules.order"
done
(cd "$d" && find . | "$busybox" cpio -o -H newc 2>/dev/null) > "$work/initrd.cpio" || {
	echo "cannot build the initramfs"; exit 1; }

# ---------------------------------------------------------------- the job
# The guest runs guest.sh from the source tree and the binaries of the build
# tree, both seen through the read-only root, with the test environment.
q() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }
{
	echo "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	echo "export HOME=/tmp"
	for v in TE_PLUGIN_PATH TE_LOG_LEVEL TEST_PLUGIN_DIR ASAN_OPTIONS UBSAN_OPTIONS \
		TE_RDMA_PLUGIN TE_RDMA_FIXTURES TEST_VERBOSE TE_QEMU_ONLY; do
		[ -n "${!v+x}" ] && echo "export $v=$(q "${!v}")"
	done
	echo "cd $(q "$work/scratch")"
	echo "/bin/sh $(q "$here/guest.sh") $(q "$build") $(q "$src") $(q "$work/scratch") $(q "$scenario")"
	echo "echo \$? > $(q "$work/scratch/status")"
} > "$work/scratch/job.sh"
# The host folders the job reads at their own paths (guest-init.sh binds them
# back over the guest's /tmp and /run).
printf '%s\n' "$src" "$build" | sort -u > "$work/scratch/binds"

# ---------------------------------------------------------------- boot
limit=${TE_QEMU_TIMEOUT:-600}
echo "booting $kernel under TCG for scenario '$scenario' (limit ${limit}s)"
start=$(date +%s)
timeout --kill-after=10 "$limit" "$qemu" \
	-accel tcg,thread=multi -cpu max -smp "${TE_QEMU_SMP:-2}" -m "${TE_QEMU_MEM:-1536}" \
	-nodefaults -display none -no-reboot -monitor none \
	-serial "file:$work/console.log" \
	-kernel "$kernel" -initrd "$work/initrd.cpio" \
	-append "console=ttyS0 panic=-1 quiet loglevel=4 mitigations=off te_scratch=$work/scratch" \
	-virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
	-virtfs "local,path=$work/scratch,mount_tag=scratch,security_model=none,multidevs=remap" \
	-device virtio-rng-pci \
	> "$work/qemu.log" 2>&1
qrc=$?
took=$(($(date +%s) - start))
echo "guest ran ${took}s (qemu exit $qrc)"

# ---------------------------------------------------------------- results
res=$work/scratch/results
if [ -f "$work/scratch/skip" ]; then
	cat "$work/scratch/skip"
	exit 77
fi
[ -f "$res" ] && cat "$res"
fail=0
if [ $qrc -eq 124 ] || [ $qrc -eq 137 ]; then
	echo "FAIL: the guest did not finish within ${limit}s"
	fail=1
elif [ ! -f "$work/scratch/status" ]; then
	echo "FAIL: the guest's job never ended (see its console below)"
	fail=1
elif [ "$(cat "$work/scratch/status")" != 0 ]; then
	echo "FAIL: the guest script exited with status $(cat "$work/scratch/status")"
	fail=1
fi
npass=$(grep -c '^PASS' "$res" 2>/dev/null)
nfail=$(grep -c '^FAIL' "$res" 2>/dev/null)
[ "${nfail:-0}" -gt 0 ] && fail=1
[ "${npass:-0}" -eq 0 ] && { echo "FAIL: no check passed"; fail=1; }
if [ $fail -ne 0 ]; then
	echo "---- qemu"
	tail -n 20 "$work/qemu.log"
	echo "---- guest console (last 200 lines)"
	tail -n 200 "$work/console.log"
	for f in "$work"/scratch/*.log; do
		[ -f "$f" ] || continue
		echo "---- $(basename "$f") (last 60 lines)"
		tail -n 60 "$f"
	done
fi
echo "${npass:-0} passed, ${nfail:-0} failed (scenario $scenario, ${took}s)"
exit $fail
