# Find or make device nodes for disks, memory and the kernel log.
. "$BIN/lib.sh"
for d in sda vda nvme0n1 mem kmem port kmsg userfaultfd fuse net/tun loop0 dri; do
  must_fail "/dev/$d exists" test -e "/dev/$d"
done
must_fail "mknod /dev/mem in the grant" mknod "$WORK/mem" c 1 1
must_fail "mknod a disk in /tmp" mknod /tmp/sda b 8 0
must_fail "write to /dev" sh -c 'echo x > /dev/pwned'
finish
