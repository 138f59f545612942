#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and real-kernel integration tests.
# Works on a fresh Debian machine with a Rust toolchain; installs what is missing (as root).
# Run as root, the sandbox tests also run every case as uid 65534.
set -euo pipefail
cd "$(dirname "$0")/.."

# Sandbox tests run python3 and coreutils *inside* sandboxes, which see /usr but not, say, a
# python under /root: the system's own python3 is needed.
need=()
[ -x /usr/bin/python3 ] || need+=(python3)
# The Python SDK's tests run in a virtualenv of the system's python3 (so uid 65534 can run it).
/usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
command -v setpriv >/dev/null || need+=(util-linux)
# The documented transaction examples (tests/it/docs.rs) apply a patch with git inside a
# sandbox and read the JSON outcome with jq.
[ -x /usr/bin/git ] || [ -x /usr/local/bin/git ] || need+=(git)
command -v jq >/dev/null || need+=(jq)
# lockbox-cow's hunk commits are property-tested against the real `patch` (tests/it/hunks.rs).
command -v patch >/dev/null || need+=(patch)
# The escape corpus (tests/escape) compiles its C attacks; they include kernel uapi headers.
command -v gcc >/dev/null || need+=(gcc)
[ -e /usr/include/linux/bpf.h ] || need+=(libc6-dev linux-libc-dev)
# The review console's browser tests (python/tests/test_console_*.py) drive Debian's headless
# Chromium through its driver with Selenium (pip-installed into the test venv below).
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
# The console's terminal test (python/tests/test_console_terminal.py) runs vim, less and top
# in a sandbox, which sees the host's /usr.
[ -x /usr/bin/vim ] || need+=(vim)
[ -x /usr/bin/less ] || need+=(less)
[ -x /usr/bin/top ] || need+=(procps)
# Image pulls (crates/lockbox-image/tests) run against a real registry on 127.0.0.1, fed by
# skopeo, with an htpasswd (bcrypt) instance for Basic auth; the test image's layer is
# busybox-static's /bin/busybox.
command -v docker-registry >/dev/null || need+=(docker-registry)
command -v skopeo >/dev/null || need+=(skopeo)
command -v htpasswd >/dev/null || need+=(apache2-utils)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
# The image tests' package-manager cases (crates/lockbox-confine/tests/it/image.rs) make a
# Debian minbase image with mmdebstrap (from Debian's mirror; kept in the target dir after).
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
# A long-lived sandbox on an image without glibc (crates/lockbox-runtime/tests/it/image.rs):
# busybox plus a static bash for its sessions.
[ -x /bin/bash-static ] || need+=(bash-static)
# Node code contexts (crates/lockbox-runtime/tests/it/contexts.rs) run the system's node.
[ -x /usr/bin/node ] || need+=(nodejs)
# The Kubernetes manifests' test (python/tests/test_k8s_manifests.py) runs lockbox serve under
# the shipped seccomp profile, loaded with libseccomp's Python binding as a runtime would.
/usr/bin/python3 -c 'import seccomp' 2>/dev/null || need+=(python3-seccomp)
# The HTTP API's fuzz test (scripts/fuzz-api.sh) pip-installs schemathesis into a venv.
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
# Each phase says how long the suite has run so far (docs/testing.md records where the time
# of a cold CI run goes).
phase() { printf '== [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }
phase "packages"
# What runs in the background (downloads, the wheel's build, the crash torture) is stopped
# with the suite when it fails early, not left running.
stop_background() {
  local pid
  for pid in $(jobs -p); do
    pkill -TERM -P "$pid" 2>/dev/null || true
    kill "$pid" 2>/dev/null || true
  done
}
trap stop_background EXIT
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq "${need[@]}"
  else
    echo "missing: ${need[*]} (install them, or run as root)" >&2
    exit 1
  fi
fi

# In CI a skipped test (kernel feature, PostgreSQL) is a failure, not a skip.
# CI builds once from clean: incremental state would only take disk (several GB).
if [ "${CI:-}" = true ]; then
  export LOCKBOX_TEST_REQUIRE=all
  export CARGO_INCREMENTAL=0
fi

# The journal's PostgreSQL backend is tested against a real server: a throwaway cluster on
# 127.0.0.1 (installed from Debian's packages if missing, which needs root), stopped at exit.
if [ "$(id -u)" = 0 ] || [ -d /usr/lib/postgresql ]; then
  phase "starting PostgreSQL"
  eval "$(bash scripts/start-postgres.sh)"
  export LOCKBOX_TEST_POSTGRES_URL
  trap 'stop_background; bash scripts/start-postgres.sh --stop' EXIT
else
  phase "no PostgreSQL (not root, not installed): its journal tests will say SKIP"
fi

phase "cargo fmt --check"
cargo fmt --all -- --check
# cargo's target directory (CARGO_TARGET_DIR, or the workspace's).
target_dir="$(cargo metadata --format-version 1 --no-deps | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
# While Rust builds, the Python environments download (pip waits on the network more than on
# the CPU): the SDK's virtualenv with its packages (used from the "python SDK" phase on) and
# schemathesis for the API fuzz test among lockbox-cli's tests (scripts/fuzz-api.sh
# --prepare). Each is waited for before it is needed; its output is printed if it failed.
pyvenv="${LOCKBOX_PY_VENV:-/tmp/lockbox-py-venv-$(id -u)-$(pwd | cksum | cut -d' ' -f1)}"
python_env() {
  [ -x "$pyvenv/bin/python" ] || /usr/bin/python3 -m venv "$pyvenv"
  # matplotlib: code contexts return its figures as PNG results (python/tests/test_code.py).
  # e2b, e2b-code-interpreter: the unmodified E2B SDK against lockbox serve (python/tests/e2b/), pinned.
  # psycopg: a fleet router's placements in PostgreSQL (python/tests/test_fleet_dns.py).
  # ruff and mypy are pinned: a new release's new rules must not turn a green tree red.
  "$pyvenv/bin/pip" install -q --disable-pip-version-check 'maturin>=1.7,<2' 'pytest>=7' 'ray>=2' 'selenium>=4.20,<5' 'mcp>=2,<3' 'matplotlib>=3.5' 'ruff==0.17.6' 'mypy==2.4.1' 'e2b==2.63.0' 'e2b-code-interpreter==2.11.5' 'psycopg[binary]>=3.1,<4'
}
py_log="$(mktemp)"
python_env > "$py_log" 2>&1 &
py_pid=$!
api_log="$(mktemp)"
CARGO_TARGET_DIR="$target_dir" bash scripts/fuzz-api.sh --prepare > "$api_log" 2>&1 &
api_pid=$!
# The Debian root of lockbox-confine's package-manager tests (tests/it/image.rs, debian_tar:
# the same mmdebstrap command, and the same file in CARGO_TARGET_TMPDIR) downloads now too,
# instead of holding up those tests. As root only: a user's unshare mode is left to the test.
debian_root() {
  local dir="$target_dir/tmp/lockbox-debian" tar="bookworm-minbase-python3-pip.tar"
  [ "$(id -u)" = 0 ] && [ ! -e "$dir/$tar" ] || return 0
  mkdir -p "$dir"
  mmdebstrap --quiet --variant=minbase --mode=root --format=tar --include=python3-pip bookworm "$dir/.$tar.$$"
  chmod 644 "$dir/.$tar.$$"
  mv "$dir/.$tar.$$" "$dir/$tar"
}
debian_log="$(mktemp)"
debian_root > "$debian_log" 2>&1 &
debian_pid=$!
# Waits for a background preparation; on failure prints its output and stops the suite.
wait_for() {
  local pid=$1 log=$2 what=$3
  if ! wait "$pid"; then
    cat "$log" >&2
    echo "preparing $what failed" >&2
    exit 1
  fi
  rm -f "$log"
}
# The in-sandbox agent (crates/lockbox-agent) is a binary of its own crate: built once here, in
# this target directory, for the runtime's tests and for lockbox-cli, which embeds it
# (crates/lockbox-cli/build.rs), as the Python extension does through it: they take it from
# $LOCKBOX_AGENT_EXE instead of a nested cargo build each (clippy and doc run the build
# script too).
phase "cargo build -p lockbox-agent"
cargo build -p lockbox-agent
export LOCKBOX_AGENT_EXE="$target_dir/debug/lockbox-agent"
phase "cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
# Tests skipped for a missing requirement (lockbox_testkit::require!: root, a kernel feature,
# a tool) are listed here and printed after the run; under LOCKBOX_TEST_REQUIRE=all (CI) they
# fail instead.
export LOCKBOX_TEST_SKIP_LOG="$target_dir/lockbox-test-skips.txt"
: > "$LOCKBOX_TEST_SKIP_LOG"
print_skips() {
  if [ -s "$LOCKBOX_TEST_SKIP_LOG" ]; then
    phase "$(wc -l < "$LOCKBOX_TEST_SKIP_LOG") skipped test(s), and why:"
    sort "$LOCKBOX_TEST_SKIP_LOG"
  fi
}
phase "cargo test --no-run (building the tests)"
cargo test --workspace --no-run --quiet
# From here on the jobs run side by side, because the tests wait on sandboxes, servers, Ray
# and child processes more than they compute (vmstat: one job at a time left the 2 cores
# idle for minutes); each background job's output is printed when it is done
# (background_done), and the suite fails if any failed.
background_failed=0
# The start of each failed Rust test's output (its panic message), gathered from the
# background logs and printed last: a long run's log is often read from its end.
digest="$(mktemp)"
failure_digest() {
  awk -v what="$2" '
    /^---- .* stdout ----$/ { on = 1; n = 0; trace = 0; print "== " what ": " $0; next }
    on && (/^---- .* ----$/ || /^failures:$/) { on = 0 }
    on && /^stack backtrace:$/ { trace = 1 }
    on && trace { if (/^note: /) trace = 0; next }
    on && n < 40 { print; n++ }
  ' "$1" >> "$digest"
}
background_done() {
  local pid=$1 log=$2 what=$3 status=0
  wait "$pid" || status=$?
  phase "$what: its output"
  cat "$log"
  if [ "$status" != 0 ]; then
    failure_digest "$log" "$what"
    echo "$what failed (exit $status)" >&2
    background_failed=1
  fi
  rm -f "$log"
}
wait_for "$api_pid" "$api_log" "schemathesis (scripts/fuzz-api.sh --prepare)"
wait_for "$debian_pid" "$debian_log" "the Debian root of lockbox-confine's image tests (mmdebstrap)"
# 1. The Rust tests. Two test threads per core (RUST_TEST_THREADS to choose) took
# lockbox-cli's 219 tests from 256 s to 135 s on 2 cores (docs/testing.md); lockbox-cli's
# tests run beside the other crates' (scripts/run-rust-tests.sh says why).
phase "cargo test: the tests built above, in two lanes (${RUST_TEST_THREADS:-$(($(nproc) * 2))} test threads each), started in the background"
rust_log="$(mktemp)"
bash scripts/run-rust-tests.sh > "$rust_log" 2>&1 &
rust_pid=$!
# 2. What the Python SDK's tests need, beside them: ruff and mypy, the extension built in
# debug mode by maturin (reusing cargo's target directory: one more crate, not a release
# build) and installed into the SDK's virtualenv (outside the checkout, which uid 65534 may
# not be able to enter) as a wheel, with its dependencies (cloudpickle) as `pip install
# ./python` does. The extension embeds the in-sandbox agent of Sandbox.open: the one built
# above ($LOCKBOX_AGENT_EXE).
wait_for "$py_pid" "$py_log" "the SDK's virtualenv ($pyvenv)"
python_wheel() {
  (cd python && "$pyvenv/bin/ruff" check lockbox && "$pyvenv/bin/mypy")
  rm -rf "$pyvenv/wheels"
  "$pyvenv/bin/maturin" build -q --profile dev -i "$pyvenv/bin/python" -m python/Cargo.toml -o "$pyvenv/wheels"
  "$pyvenv/bin/pip" install -q --disable-pip-version-check --force-reinstall "$pyvenv"/wheels/lockbox-*.whl
  chmod -R a+rX "$pyvenv"
}
phase "ruff, mypy --strict (settings in python/pyproject.toml) and the SDK's wheel"
wheel_log="$(mktemp)"
python_wheel > "$wheel_log" 2>&1 || { cat "$wheel_log" >&2; echo "ruff, mypy or the SDK's wheel failed" >&2; exit 1; }
rm -f "$wheel_log"
# 3. The API docs, warnings denied (cargo holds its build lock only while building).
doc_log="$(mktemp)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet > "$doc_log" 2>&1 &
doc_pid=$!
# 4. lockbox-txn's long crash torture (5,000 files, up to 500 SIGKILLed commits) is
# #[ignore]d for everyday runs; CI runs it bounded to 1 minute of trials (at least 10);
# LOCKBOX_TXN_LONG_CRASH_SECONDS chooses another bound. Its test binary is the one built
# above, run directly (`cargo test -p lockbox-txn` would resolve features for that crate alone
# and rebuild 29 crates).
torture_pid=""
if [ "${CI:-}" = true ] || [ -n "${LOCKBOX_TXN_LONG_CRASH_SECONDS:-}" ]; then
  phase "lockbox-txn long crash torture (${LOCKBOX_TXN_LONG_CRASH_SECONDS:-60} s of trials), started in the background"
  torture_log="$(mktemp)"
  txn_it="$(bash scripts/run-rust-tests.sh --list | awk -F'\t' '$3 == "lockbox-txn: tests/it/main.rs" { print $2 }')"
  [ -x "$txn_it" ] || { echo "lockbox-txn's test binary (tests/it/main.rs) is not among cargo's test binaries" >&2; exit 1; }
  (cd crates/lockbox-txn && LOCKBOX_TXN_LONG_CRASH_SECONDS="${LOCKBOX_TXN_LONG_CRASH_SECONDS:-60}" \
    env --default-signal "$txn_it" --ignored --exact crash::long_crash_torture_with_more_files_and_trials) \
    > "$torture_log" 2>&1 &
  torture_pid=$!
fi
# 5. Fuzzing, as a smoke run: every cargo-fuzz target built unoptimised (with
# AddressSanitizer and debug assertions: its build is the phase's cost), its seeds and corpus
# replayed and mutated for 10 s (11 targets, one per core). Campaigns are run by hand with
# optimised builds (docs/fuzzing.md). Outside CI it is skipped unless LOCKBOX_FUZZ_SECONDS is
# set.
fuzz_pid=""
if [ "${CI:-}" = true ] || [ -n "${LOCKBOX_FUZZ_SECONDS:-}" ]; then
  phase "fuzzing (scripts/fuzz.sh ${LOCKBOX_FUZZ_SECONDS:-10}, ${LOCKBOX_FUZZ_PROFILE:-dev} build), started in the background"
  fuzz_log="$(mktemp)"
  LOCKBOX_FUZZ_PROFILE="${LOCKBOX_FUZZ_PROFILE:-dev}" bash scripts/fuzz.sh "${LOCKBOX_FUZZ_SECONDS:-10}" > "$fuzz_log" 2>&1 &
  fuzz_pid=$!
else
  phase "fuzzing SKIPPED (not CI): run scripts/fuzz.sh [SECONDS], or set LOCKBOX_FUZZ_SECONDS"
fi
# 6. Harbor (python/tests-harbor): `harbor run` drives lockbox sandboxes through
# lockbox.harbor:LockboxEnvironment. Harbor needs Python 3.12+, so these tests run in a venv of
# their own, from a 3.12+ interpreter found on PATH or under pyenv. The extension is abi3: the
# same wheel installs there. When root, the interpreter is copied where uid 65534 can run it
# (pyenv's lives under /root), and LD_LIBRARY_PATH names the copy's libpython.
harbor_tests() {
  py3x=""
  for cand in python3.13 python3.12 "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python3.1[2-9]; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      py3x="$(command -v "$cand")"
      break
    fi
  done
  if [ -z "$py3x" ]; then
    if [ "${LOCKBOX_TEST_REQUIRE:-}" = all ]; then
      echo "no Python 3.12+ for Harbor's tests (python3.12 on PATH or under pyenv)" >&2
      exit 1
    fi
    phase "Harbor SKIPPED: no Python 3.12+ (python3.12 on PATH or under pyenv)"
  else
    pyprefix="$("$py3x" -c 'import sys; print(sys.base_prefix)')"
    pyver="$("$py3x" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    if [ "$(id -u)" = 0 ] && ! setpriv --reuid=65534 --regid=65534 --clear-groups -- test -r "$pyprefix/lib"; then
      copy="/tmp/lockbox-python-$pyver"
      [ -x "$copy/bin/python$pyver" ] || { cp -a "$pyprefix" "$copy.part" && chmod -R a+rX "$copy.part" && mv "$copy.part" "$copy"; }
      pyprefix="$copy"
    fi
    export LD_LIBRARY_PATH="$pyprefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    hvenv="${pyvenv}-harbor"
    [ -x "$hvenv/bin/python" ] || "$pyprefix/bin/python$pyver" -m venv "$hvenv"
    "$hvenv/bin/pip" install -q --disable-pip-version-check 'harbor[e2b]==0.26.0' 'pytest>=7'
    "$hvenv/bin/pip" install -q --disable-pip-version-check --force-reinstall "$pyvenv"/wheels/lockbox-*.whl
    chmod -R a+rX "$hvenv"
    # A background job ignores SIGINT, which its sandboxes would inherit: defaults first.
    env --default-signal "$hvenv/bin/python" -m pytest -q -rs -p no:cacheprovider python/tests-harbor
  fi
}
harbor_log="$(mktemp)"
phase "Harbor environment (python/tests-harbor), started in the background"
harbor_tests > "$harbor_log" 2>&1 &
harbor_pid=$!
# 7. The Python SDK's own tests (python/), in the foreground. In CI a missing dependency
# (Ray, PostgreSQL, root) fails the suite instead of skipping. Ray runs a real local cluster
# (ray.init(num_cpus=2)) in its tests. First the extension's stub
# (python/lockbox/_lockbox.pyi) against what the built module defines.
phase "stubtest lockbox._lockbox"
status=0
(cd / && "$pyvenv/bin/python" -m mypy.stubtest lockbox._lockbox) || status=$?
# --durations: the slowest tests are named at the end (where CI's time goes: docs/testing.md).
phase "the SDK's tests (python/tests)"
[ "$status" != 0 ] || "$pyvenv/bin/python" -m pytest -q -rs --durations=15 -p no:cacheprovider python/tests || status=$?
background_done "$rust_pid" "$rust_log" "cargo test (scripts/run-rust-tests.sh)"
print_skips
background_done "$doc_pid" "$doc_log" "cargo doc"
background_done "$harbor_pid" "$harbor_log" "Harbor environment (python/tests-harbor)"
[ -z "$torture_pid" ] || background_done "$torture_pid" "$torture_log" "lockbox-txn long crash torture"
[ -z "$fuzz_pid" ] || background_done "$fuzz_pid" "$fuzz_log" "fuzzing"
if [ "$status" != 0 ] || [ "$background_failed" != 0 ]; then
  if [ -s "$digest" ]; then
    phase "failed tests, in short (the first lines of each one's output above)"
    head -n 300 "$digest"
  fi
  rm -f "$digest"
  exit 1
fi
rm -f "$digest"

phase "done"
