#!/usr/bin/env bash
# Starts a throwaway PostgreSQL cluster for the journal's tests and prints the environment
# the tests read:
#
#   eval "$(scripts/start-postgres.sh)"     # exports LOCKBOX_TEST_POSTGRES_URL
#   scripts/start-postgres.sh --stop        # stops the cluster (data dir is kept)
#
# On a fresh Debian machine as root it installs PostgreSQL from Debian's packages if it is
# missing. The cluster listens on 127.0.0.1 only, on a private port, with trust auth, in a
# temporary data directory. Idempotent: a second run finds the cluster up and only prints.
# Everything but the final `export` line goes to stderr.
set -euo pipefail

PORT="${LOCKBOX_PG_PORT:-54329}"
DATA="${LOCKBOX_PG_DIR:-/tmp/lockbox-test-pg}"
DB="${LOCKBOX_PG_DB:-lockbox_test}"

log() { echo "start-postgres: $*" >&2; }

find_bindir() {
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

BINDIR="$(find_bindir)"
if [[ -z "$BINDIR" || ! -x "$BINDIR/initdb" ]]; then
    if [[ "$(id -u)" -ne 0 ]]; then
        log "PostgreSQL is not installed and we are not root: install the 'postgresql' package"
        exit 1
    fi
    log "installing PostgreSQL from Debian packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update >&2
    apt-get install -y postgresql >&2
    BINDIR="$(find_bindir)"
fi

# PostgreSQL refuses to run as root: as root, run its tools as the 'postgres' user.
as_pg() {
    if [[ "$(id -u)" -eq 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

if [[ "${1:-}" == "--stop" ]]; then
    as_pg "$BINDIR/pg_ctl" -D "$DATA" -m fast stop >&2 || true
    exit 0
fi

if [[ ! -f "$DATA/PG_VERSION" ]]; then
    log "creating cluster in $DATA"
    mkdir -p "$DATA"
    if [[ "$(id -u)" -eq 0 ]]; then chown postgres:postgres "$DATA"; fi
    chmod 700 "$DATA"
    as_pg "$BINDIR/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 >&2
fi

if as_pg "$BINDIR/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
    log "cluster in $DATA already running"
else
    log "starting cluster on 127.0.0.1:$PORT"
    as_pg "$BINDIR/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $PORT -k $DATA -c fsync=on" start >&2
fi

if ! as_pg "$BINDIR/psql" -h 127.0.0.1 -p "$PORT" -U postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname = '$DB'" postgres | grep -q 1; then
    as_pg "$BINDIR/createdb" -h 127.0.0.1 -p "$PORT" -U postgres "$DB" >&2
fi

echo "export LOCKBOX_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:$PORT/$DB"
