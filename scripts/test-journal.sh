#!/usr/bin/env bash
# Runs every lockbox-journal test against all three backends, PostgreSQL included: starts (and
# on a fresh Debian machine as root, installs) a throwaway cluster first. Meant for .ci/run:
#
#   bash scripts/test-journal.sh
#
# LOCKBOX_TEST_REQUIRE=all is set, so a PostgreSQL that cannot be reached fails the run
# instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."

eval "$(bash scripts/start-postgres.sh)"
export LOCKBOX_TEST_POSTGRES_URL
export LOCKBOX_TEST_REQUIRE=all
cargo test -p lockbox-journal
