# Fill the copy-on-write branch past --max-disk; the write must fail with ENOSPC and the
# workdir must not change (the test snapshots it; --on-exit abort).
. "$BIN/lib.sh"
must_fail "write 32 MiB into a 1 MiB branch" dd if=/dev/zero of="$WORK/fill" bs=1M count=32 status=none
finish
