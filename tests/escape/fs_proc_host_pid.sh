# Reach a host process (the victim) through /proc/<host pid>.
. "$BIN/lib.sh"
must_fail "victim exists" test -e "/proc/$VICTIM"
must_fail "victim environ" cat "/proc/$VICTIM/environ"
must_fail "victim root" cat "/proc/$VICTIM/root$SECRET"
must_fail "victim mem" sh -c 'head -c 1 "/proc/$VICTIM/mem"'
must_fail "more than a handful of pids" sh -c '[ "$(ls /proc | grep -c "^[0-9]")" -gt 10 ]'
finish
