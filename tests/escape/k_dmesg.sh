# Read the kernel log (host information and kernel addresses).
. "$BIN/lib.sh"
must_fail "dmesg" dmesg
must_fail "/dev/kmsg" head -c 1 /dev/kmsg
must_fail "/proc/kmsg" head -c 1 /proc/kmsg
finish
