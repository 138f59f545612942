# Write a file past --max-file-size (SIGXFSZ or EFBIG).
. "$BIN/lib.sh"
trap '' XFSZ
must_fail "write 8 MiB with a 1 MiB limit" dd if=/dev/zero of=/tmp/big bs=1M count=8 status=none
finish
