# Reconfigure the machine through /proc and /sys.
. "$BIN/lib.sh"
must_fail "hostname sysctl" sh -c 'echo pwned > /proc/sys/kernel/hostname'
must_fail "core_pattern" sh -c 'echo "|/tmp/x" > /proc/sys/kernel/core_pattern'
must_fail "sysrq" sh -c 'echo h > /proc/sysrq-trigger'
must_fail "kcore has content" test -s /proc/kcore
must_fail "/sys exists" ls /sys/kernel
must_fail "LSM attr" sh -c 'echo unconfined > /proc/self/attr/current'
finish
