# Write next to the writable grant through `..` and absolute paths.
# The fixture lives under the host's /tmp; inside, /tmp is private, so the path of the
# fixture exists there as an empty directory: writes may "work" and the host check decides.
. "$BIN/lib.sh"
cd "$WORK" || exit 3
attempt "write ../pwned" sh -c 'echo x > ../pwned'
attempt "write absolute pwned" sh -c 'echo x > "$FX/pwned"'
attempt "mkdir ../pwned" mkdir ../pwned
must_fail "overwrite a sentinel" sh -c 'echo x > "$FX/sentinel/a"'
must_fail "remove a sentinel" rm "$FX/sentinel/a"
finish
