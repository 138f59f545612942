# The same with util-linux tools, as a script would do it.
. "$BIN/lib.sh"
must_fail "unshare -Ur" unshare -Ur true
must_fail "unshare -m" unshare -m true
must_fail "unshare -p -f" unshare -p -f true
must_fail "nsenter -t 1 -m" nsenter -t 1 -m true
must_fail "mount -t tmpfs" mount -t tmpfs none /tmp
finish
