# Make symlinks inside the grant that point outside it, then follow them.
. "$BIN/lib.sh"
cd "$WORK" || exit 3
ln -s "$SECRET" l1; ln -s ../secret l2; ln -s / rootlink; ln -s .. up
must_fail "absolute link" cat l1
must_fail "relative link" cat l2
must_fail "link to /" cat "rootlink$SECRET"
must_fail "link to .." cat up/secret
attempt "write through link to .." sh -c 'echo x > up/pwned'
rm -f l1 l2 rootlink up
finish
