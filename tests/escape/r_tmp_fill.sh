# Fill the sandbox's own /tmp and /dev/shm (tmpfs: host memory that RLIMIT_AS does not
# count) past --max-memory: the writes must stop with ENOSPC (or, with a memory cgroup,
# which does count them, the sandbox is killed at its limit).
. "$BIN/lib.sh"
must_fail "write 256 MiB into /tmp" dd if=/dev/zero of=/tmp/fill bs=1M count=256 status=none
rm -f /tmp/fill
must_fail "write 256 MiB into /dev/shm" dd if=/dev/zero of=/dev/shm/fill bs=1M count=256 status=none
finish
