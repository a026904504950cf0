#!/usr/bin/env bash
# Start a throw-away PostgreSQL on loopback for the tests (CI and local), installing Debian's
# package first if it is missing. Prints the line to eval:
#   eval "$(bash tests/test_postgres.sh)"   # sets PRECSEARCH_TEST_POSTGRES
# Stop it with: bash tests/test_postgres.sh stop
set -euo pipefail
PORT=${PRECSEARCH_PG_PORT:-54329}
DIR=${PRECSEARCH_PG_DIR:-/tmp/precsearch-pg}
PASSWORD=precsearch-test-pw
URL="postgresql://precsearch:${PASSWORD}@127.0.0.1:${PORT}/precsearch"

bindir() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }

if [ -z "$(bindir)" ]; then
  echo "installing PostgreSQL (Debian package)" >&2
  export DEBIAN_FRONTEND=noninteractive
  (apt-get update -qq && apt-get install -y -qq postgresql >/dev/null) >&2
fi
BIN=$(bindir)
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

if [ "${1:-start}" = stop ]; then
  as_pg "$BIN/pg_ctl" -D "$DIR" stop -m fast >&2 || true
  exit 0
fi

if ! as_pg "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT"; then
  rm -rf "$DIR"
  mkdir -p "$DIR"
  [ "$(id -u)" = 0 ] && chown postgres "$DIR"
  as_pg "$BIN/initdb" -D "$DIR" -A trust -U postgres >/dev/null
  # in the cluster's config, so that a plain `pg_ctl start` (the outage test restarts it) comes back the same
  printf "listen_addresses = '127.0.0.1'\nport = %s\nunix_socket_directories = '%s'\nmax_connections = 200\n" \
    "$PORT" "$DIR" | as_pg tee -a "$DIR/postgresql.conf" >/dev/null
  as_pg "$BIN/pg_ctl" -D "$DIR" -l "$DIR/server.log" -w start >&2
  as_pg "$BIN/psql" -q -h 127.0.0.1 -p "$PORT" -U postgres -c "CREATE ROLE precsearch LOGIN PASSWORD '$PASSWORD' CREATEDB" >&2
  as_pg "$BIN/psql" -q -h 127.0.0.1 -p "$PORT" -U postgres -c "CREATE DATABASE precsearch OWNER precsearch" >&2
fi
echo "export PRECSEARCH_TEST_POSTGRES='$URL' PRECSEARCH_PG_BIN='$BIN' PRECSEARCH_PG_DIR='$DIR'"
