# Reach the host's root through /proc magic links.
. "$BIN/lib.sh"
must_fail "/proc/self/root" cat "/proc/self/root$SECRET"
must_fail "/proc/1/root" cat "/proc/1/root$SECRET"
must_fail "list /proc/1/root" ls /proc/1/root/
must_fail "/proc/self/cwd/.." sh -c 'cd "$WORK" && cat /proc/self/cwd/../secret'
must_fail "/proc/1/cwd" ls /proc/1/cwd/
finish
