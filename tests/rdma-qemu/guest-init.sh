#!/bin/sh
# /init of the guest's initramfs (run by the static busybox there).
# Loads the virtio and 9p modules copied from the kernel's own tree, mounts
# the host's root read-only and the scratch folder read-write over 9p,
# chroots into the host's root to run the job the host left in the scratch
# folder, and powers off. Kernel command line: te_scratch=<host path of the
# scratch folder>.
/bin/busybox --install -s /bin
export PATH=/bin

mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev

say() { echo "te-guest: $*" > /dev/console; }
halt_now() { sync; poweroff -f; sleep 5; echo o > /proc/sysrq-trigger; }

for m in $(cat /modules.order); do
	insmod "/modules/$m" || say "insmod $m failed"
done

scratch=
for w in $(cat /proc/cmdline); do
	case "$w" in te_scratch=*) scratch=${w#te_scratch=} ;; esac
done
[ -n "$scratch" ] || { say "no te_scratch= on the command line"; halt_now; }

# msize: fewer, larger 9p messages (TCG makes each one costly).
opts=trans=virtio,version=9p2000.L,msize=524288
if ! mount -t 9p -o "$opts,ro,cache=loose" hostroot /newroot; then
	say "cannot mount the host's root over 9p"; halt_now
fi
mount -t 9p -o "$opts" scratch "/newroot$scratch" || { say "cannot mount $scratch"; halt_now; }
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
mkdir -p /newroot/dev/shm /newroot/dev/pts
mount -t tmpfs -o mode=1777 shm /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs -o mode=1777 tmp /newroot/tmp
mount -t tmpfs run /newroot/run
# Host-side configuration names may resolve here through the read-only
# /etc; the job needs only loopback and its own veth addresses.
say "running $scratch/job.sh"
chroot /newroot /bin/sh "$scratch/job.sh" > /dev/console 2>&1
say "job ended with status $?"
umount "/newroot$scratch" 2>/dev/null
halt_now
