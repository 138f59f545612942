#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for SECONDS each (default 30); exits non-zero on the
# first crash, naming the reproducer. docs/fuzzing.md explains the targets and longer runs.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# cargo-fuzz needs a nightly compiler (sanitizer flags). With no nightly toolchain installed,
# the stable one is used with RUSTC_BOOTSTRAP=1, which unlocks the same flags
# (LOCKBOX_FUZZ_TOOLCHAIN=stable forces that path; =nightly forces nightly).
#
# LOCKBOX_FUZZ_PROFILE=release (the default) builds optimised targets, for real campaigns;
# =dev builds them unoptimised, with debug assertions (overflow checks) and still with
# AddressSanitizer: a build in well under half the time that runs about 4 times slower,
# which is what a short smoke run in CI wants (scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-30}
shift || true
targets=("$@")

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz (cargo install cargo-fuzz --locked)"
  cargo install cargo-fuzz --locked
fi

toolchain=${LOCKBOX_FUZZ_TOOLCHAIN:-}
if [ -z "$toolchain" ]; then
  if rustup run nightly rustc --version >/dev/null 2>&1; then
    toolchain=nightly
  else
    toolchain=stable
  fi
fi
if [ "$toolchain" = nightly ]; then
  fuzz=(cargo +nightly fuzz)
else
  echo "== stable toolchain with RUSTC_BOOTSTRAP=1 (no nightly installed, or LOCKBOX_FUZZ_TOOLCHAIN=stable)"
  export RUSTC_BOOTSTRAP=1
  fuzz=(cargo +stable fuzz)
fi

# The fuzz crate has its own target directory unless the caller chose one.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/fuzz/target}/fuzz

if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <("${fuzz[@]}" list)
fi
case ${LOCKBOX_FUZZ_PROFILE:-release} in
  release) mode=(-O) ;;
  dev) mode=(--dev) ;;
  *) echo "LOCKBOX_FUZZ_PROFILE must be release or dev, not ${LOCKBOX_FUZZ_PROFILE}" >&2; exit 2 ;;
esac
echo "== building the fuzz targets ($toolchain, ${LOCKBOX_FUZZ_PROFILE:-release})"
"${fuzz[@]}" build "${mode[@]}"
# Targets run side by side, one per core (LOCKBOX_FUZZ_JOBS to choose): each is one
# single-threaded process, so on 2 cores the 11 targets take 6 rounds, not 11.
jobs=${LOCKBOX_FUZZ_JOBS:-$(nproc)}
logs=$(mktemp -d)
# The targets' scratch files (e.g. journal_file's journal directory) go in a directory of this
# run's own: a fuzzer exits without dropping them.
scratch=$(mktemp -d)
trap 'rm -rf "$logs" "$scratch"' EXIT
fuzz_one() {
  local target=$1 log="$logs/$1.log"
  mkdir -p "fuzz/corpus/$target"
  # The committed seeds (valid examples) start the search; new inputs go to fuzz/corpus.
  TMPDIR="$scratch" "${fuzz[@]}" run "${mode[@]}" "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1
}
report() {
  local target=$1 status=$2 log="$logs/$1.log"
  echo "== fuzz $target for ${seconds}s"
  grep -E '^(#[0-9]+.*DONE|stat::number_of_executed_units|SUMMARY|Failing input|Test unit written)|panicked at' "$log" || true
  if [ "$status" != 0 ]; then
    tail -n 40 "$log" >&2
    echo "fuzz target $target failed: see fuzz/artifacts/$target/ (reproduce: cargo fuzz run $target ARTIFACT)" >&2
    kill "${pids[@]}" 2>/dev/null || true  # the round's other targets
    exit 1
  fi
}
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
  round=("${targets[@]:i:jobs}")
  pids=()
  for target in "${round[@]}"; do
    fuzz_one "$target" &
    pids+=($!)
  done
  for k in "${!round[@]}"; do
    status=0
    wait "${pids[$k]}" || status=$?
    report "${round[$k]}" "$status"
  done
done
echo "== fuzzing done: ${#targets[@]} targets, ${seconds}s each ($jobs at a time), no crash"
