# Follow symlinks the host left inside the grant, pointing outside it.
. "$BIN/lib.sh"
must_fail "read through planted file link" cat "$WORK/planted"
attempt "write through planted dir link" sh -c 'echo x > "$WORK/planted_dir/pwned"'
must_fail "read through planted dir link" cat "$WORK/planted_dir/secret"
finish
