# Outlive the timeout: a double-forked, setsid daemon that ignores SIGTERM and SIGHUP.
# lockbox must kill it (exit 124); the test checks no process with the mark is left.
setsid sh -c 'trap "" TERM HUP INT; (trap "" TERM HUP INT; exec sleep 300) & exec sleep 301' &
trap '' TERM
sleep 302
echo "ESCAPED: not stopped by the timeout"
