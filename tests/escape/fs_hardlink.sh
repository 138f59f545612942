# Hard-link host files into the writable grant to write or read them there.
. "$BIN/lib.sh"
must_fail "hard link the secret" ln "$SECRET" "$WORK/h1"
must_fail "hard link a read-only grant's file" ln "$FX/ro/ro.txt" "$WORK/h2"
must_fail "write the read-only file through a link" sh -c 'ln "$FX/ro/ro.txt" "$WORK/h3" 2>/dev/null; echo x >> "$WORK/h3" && cmp -s "$WORK/h3" "$FX/ro/ro.txt"'
rm -f "$WORK/h3"
finish
