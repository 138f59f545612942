#!/usr/bin/env bash
# Runs the workspace's Rust tests, already built by `cargo test --workspace --no-run`, in two
# lanes at once: lockbox-cli's tests in one, every other test binary and then the doc tests in
# the other. Why not `cargo test --workspace`: it runs one binary at a time, and lockbox-cli's
# (220 tests, 4-5 of a cold CI run's 7.5 minutes of Rust tests) ends on a minute of a few long
# tests that wait (a fuzzer, servers killed and restarted) while the two cores sit idle. Why not
# `cargo test -p`: building a subset of the workspace unifies other features and rebuilds 13
# crates. Each binary runs as cargo runs it: from its package's directory, with
# CARGO_MANIFEST_DIR set, and every signal at its default action: a script started in the
# background (`.ci/run &`) ignores SIGINT, the lane below does too, and an ignored signal is
# inherited through exec by the sandboxes (as `nohup` relies on), so the tests of Ctrl-C and
# interrupts would fail (cargo catches SIGINT, which gives its children the default again).
# RUST_TEST_THREADS (default: two per core) applies to each lane.
#
# Usage: scripts/run-rust-tests.sh          (exit 0 when every binary passed; the failed ones are named)
#        scripts/run-rust-tests.sh --list   (the test binaries: package directory, executable and
#                                            name, tab-separated)
set -euo pipefail
cd "$(dirname "$0")/.."
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-$(($(nproc) * 2))}"

# One line per test binary: its package's directory, the executable, what cargo calls it.
binaries="$(cargo test --workspace --no-run --quiet --message-format=json | /usr/bin/python3 -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    pkg = os.path.dirname(m["manifest_path"])
    kind = "unittests " if m["target"]["kind"] != ["test"] else ""
    src = os.path.relpath(m["target"]["src_path"], pkg)
    print(pkg, m["executable"], os.path.basename(pkg) + ": " + kind + src, sep="\t")
' | sort -t$'\t' -k3)"
[ -n "$binaries" ] || { echo "run-rust-tests: cargo listed no test binaries" >&2; exit 1; }
if [ "${1:-}" = --list ]; then
  printf '%s\n' "$binaries"
  exit 0
fi

# Runs the binaries of a lane (lines of the list above, on stdin) one after another; names the
# failed ones on stderr and exits 1 if any failed.
run_lane() {
  local dir exe name failed=()
  while IFS=$'\t' read -r dir exe name; do
    printf '     Running %s (%s)\n' "$name" "$exe"
    (cd "$dir" && CARGO_MANIFEST_DIR="$dir" env --default-signal "$exe") || failed+=("$name")
  done
  [ ${#failed[@]} = 0 ] || { printf 'FAILED test binary: %s\n' "${failed[@]}" >&2; return 1; }
}

cli_log="$(mktemp)"
trap 'rm -f "$cli_log"' EXIT
grep -P '^[^\t]*/lockbox-cli\t' <<< "$binaries" | run_lane > "$cli_log" 2>&1 &
cli_pid=$!
status=0
grep -vP '^[^\t]*/lockbox-cli\t' <<< "$binaries" | run_lane || status=1
echo "     Doc-tests (cargo test --workspace --doc)"
cargo test --workspace --doc --quiet || status=1
cli_status=0
wait "$cli_pid" || cli_status=1
echo "     lockbox-cli's tests (run beside the others above):"
cat "$cli_log"
[ "$status" = 0 ] && [ "$cli_status" = 0 ]
