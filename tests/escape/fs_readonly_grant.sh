# Modify a read-only grant every way there is.
. "$BIN/lib.sh"
f="$FX/ro/ro.txt"
must_fail "append" sh -c 'echo x >> "$1"' - "$f"
must_fail "truncate" truncate -s 0 "$f"
must_fail "chmod" chmod 777 "$f"
must_fail "touch -d" touch -d 2000-01-01 "$f"
must_fail "rm" rm "$f"
must_fail "mv" mv "$f" "$FX/ro/moved"
must_fail "create" sh -c 'echo x > "$FX/ro/new"'
must_fail "setfattr" python3 -c 'import os,sys; os.setxattr(sys.argv[1], "user.x", b"1")' "$f"
finish
