#!/bin/sh
# /init of the guest's initramfs (run by the static busybox there).
# Loads the virtio and 9p modules copied from the kernel's own tree, mounts
# the host's root read-only and the scratch folder read-write over 9p,
# chroots into the host's root to run the job the host left in the scratch
# folder, and powers off. Kernel command line: te_scratch=<host path of the
# scratch folder>. The scratch folder's "binds" lists (one a line) the other
# host folders the job needs at their own paths (the build and source trees).
#
# The guest mounts its own tmpfs on /tmp and /run, which would hide anything
# the host keeps there (a checkout in /tmp). So the scratch folder is mounted
# at a neutral place and the host's root is seen a second time through a bind
# mount taken before the tmpfs mounts; once they are in place, the job's
# folders are bound back at their host paths from that second view.
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
mkdir -p /scratch /host
mount -t 9p -o "$opts" scratch /scratch || { say "cannot mount $scratch"; halt_now; }
mount -o bind /newroot /host || { say "cannot bind the host's root"; halt_now; }
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
mkdir -p /newroot/dev/shm /newroot/dev/pts
mount -t tmpfs -o mode=1777 shm /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs -o mode=1777 tmp /newroot/tmp
mount -t tmpfs run /newroot/run
# Back at their host paths, outer folders first (the list is sorted), the
# scratch folder last: under a tmpfs the mount points are made there; on the
# read-only root they exist already.
bind_back() { # FROM HOST_PATH
	mkdir -p "/newroot$2" 2>/dev/null
	mount -o bind "$1" "/newroot$2" || { say "cannot bind $2 into the guest"; halt_now; }
}
if [ -f /scratch/binds ]; then
	while IFS= read -r p; do
		case "$p" in /?*) bind_back "/host$p" "$p" ;; esac
	done < /scratch/binds
fi
bind_back /scratch "$scratch"
# Host-side configuration names may resolve here through the read-only
# /etc; the job needs only loopback and its own veth addresses.
say "running $scratch/job.sh"
chroot /newroot /bin/sh "$scratch/job.sh" > /dev/console 2>&1
say "job ended with status $?"
umount "/newroot$scratch" 2>/dev/null
umount /scratch 2>/dev/null
halt_now
