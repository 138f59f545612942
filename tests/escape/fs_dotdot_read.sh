# Read a host file next to the writable grant through `..` and absolute paths.
. "$BIN/lib.sh"
cd "$WORK" || exit 3
must_fail "cat ../secret" cat ../secret
must_fail "cat WORK/../secret" cat "$WORK/../secret"
must_fail "cat absolute secret" cat "$SECRET"
must_fail "list the parent" ls "$FX/sentinel"
must_fail "cat via many .." cat ../../../../../../../"$SECRET"
finish
