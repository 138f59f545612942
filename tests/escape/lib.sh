# Shared by the shell attacks: each step must fail.
escaped=0
must_fail() {
  desc=$1; shift
  if out=$("$@" 2>&1); then
    echo "ESCAPED: $desc: $(printf %s "$out" | head -c 200)"
    escaped=1
  else
    echo "ok: $desc: $(printf %s "$out" | head -c 200)"
  fi
}
finish() {
  if [ "$escaped" = 0 ]; then echo BLOCKED; else echo ESCAPED; exit 1; fi
}
# A step whose success inside the sandbox's own view proves nothing (the path exists only in
# the sandbox's private /tmp, say): it is tried, and the test's host check is the judge.
attempt() {
  desc=$1; shift
  if out=$("$@" 2>&1); then
    echo "tried: $desc: succeeded inside the sandbox's view"
  else
    echo "ok: $desc: $(printf %s "$out" | head -c 200)"
  fi
}
