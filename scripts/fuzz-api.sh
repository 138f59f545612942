#!/usr/bin/env bash
# Fuzzes lockbox's HTTP API from its own OpenAPI document with schemathesis: starts
# `lockbox serve` on a free port with a scratch state directory, runs `schemathesis run`,
# and fails on any 5xx, on a request that hangs (--request-timeout), or on a response whose
# status, content type or body the document does not describe (FUZZ_CHECKS overrides the
# list of checks). As root the server runs as uid 65534, so no fuzzed grant or path
# can touch what only root may.
#
# Environment: LOCKBOX_BIN (default: build lockbox-cli), FUZZ_MAX_EXAMPLES (default 50),
# FUZZ_VENV (default $CARGO_TARGET_DIR/fuzz-venv or target/fuzz-venv; schemathesis is
# pip-installed there on first use). `scripts/fuzz-api.sh --prepare` only installs it.
set -euo pipefail
cd "$(dirname "$0")/.."

target=${CARGO_TARGET_DIR:-$PWD/target}
venv=${FUZZ_VENV:-$target/fuzz-venv}
# CPython before 3.11.8 and 3.12.2 shares the AST constructor's recursion counter between
# threads (gh-106905): two schemathesis workers (threads) building strategies at once can end a
# run with "AST constructor recursion depth mismatch", the tool's error, not the server's. The
# virtualenv is made from an interpreter with the fix where one is found (on PATH or under
# pyenv); with an older one, schemathesis runs one worker.
has_ast_fix='import sys; v = sys.version_info[:3]; sys.exit(not (v >= (3, 12, 2) or (3, 11, 8) <= v < (3, 12)))'
if [ ! -x "$venv/bin/schemathesis" ]; then
  py=python3
  for cand in python3 python3.13 python3.12 "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python3.1[2-9]; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "$has_ast_fix" 2>/dev/null; then
      py="$cand"
      break
    fi
  done
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q 'schemathesis>=4,<5'
fi
# --prepare: only make the virtualenv (scripts/test.sh does while Rust builds).
[ "${1:-}" != --prepare ] || exit 0
bin=${LOCKBOX_BIN:-}
if [ -z "$bin" ]; then
  cargo build -q -p lockbox-cli
  bin=$target/debug/lockbox
fi

work=$(mktemp -d /tmp/lockbox-fuzz.XXXXXX)
chmod 755 "$work"
cp "$bin" "$work/lockbox"
run_as=()
if [ "$(id -u)" = 0 ]; then
  mkdir "$work/state"
  chown 65534:65534 "$work/state"
  run_as=(setpriv --reuid=65534 --regid=65534 --clear-groups)
fi
"${run_as[@]}" "$work/lockbox" serve --listen 127.0.0.1:0 --state-dir "$work/state" \
  --print-token --max-sandboxes 8 >"$work/out" 2>"$work/err" &
server=$!
cleanup() {
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

for _ in $(seq 300); do
  [ -s "$work/out" ] && break
  kill -0 "$server" 2>/dev/null || { cat "$work/err" >&2; exit 1; }
  sleep 0.1
done
field() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())[sys.argv[2]])' "$work/out" "$1"; }
listen=$(field listen)
token=$(field token)
python3 - "$listen" "$token" "$work/openapi.json" <<'PY'
import sys, urllib.request
req = urllib.request.Request(f"http://{sys.argv[1]}/openapi.json",
                             headers={"Authorization": f"Bearer {sys.argv[2]}"})
open(sys.argv[3], "wb").write(urllib.request.urlopen(req).read())
PY

status=0
# The port proxy (/v1/sandboxes/{id}/ports/{port}/...) is left out: its replies are the
# sandboxed server's, and an exposed port nothing listens on is 502 PORT_NOT_LISTENING by
# design, which not_a_server_error would count as a failure. Exposing, listing and
# unexposing ports are fuzzed; the proxy is tested end to end (lockbox-cli/tests/it/serve_ports.rs).
# Media types schemathesis needs told how to send (the snapshot artifact's tar stream).
workers=1
"$venv/bin/python" -c "$has_ast_fix" && workers=2
SCHEMATHESIS_HOOKS="$PWD/scripts/fuzz-api-hooks.py" \
"$venv/bin/schemathesis" run "$work/openapi.json" --url "http://$listen" \
  -H "Authorization: Bearer $token" \
  --exclude-path-regex '^/v1/sandboxes/\{id\}/ports/\{port\}/' \
  --checks "${FUZZ_CHECKS:-not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance}" \
  --max-examples "${FUZZ_MAX_EXAMPLES:-50}" \
  --request-timeout 60 \
  --workers "$workers" \
  --seed 1 \
  --no-color || status=$?
if ! kill -0 "$server" 2>/dev/null; then
  echo "fuzz-api: the server died" >&2
  status=1
fi
if [ "$status" != 0 ]; then
  echo "--- server stderr" >&2
  tail -50 "$work/err" >&2
fi
exit "$status"
