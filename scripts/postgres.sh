#!/usr/bin/env bash
# A private PostgreSQL server for the audit store's tests, from Debian's packages.
#
#   scripts/postgres.sh start   install postgresql if needed, start a private cluster in $DIR
#                               (unix socket only, no TCP), create the database, and write
#                               `export PTC_TEST_POSTGRES_URL=...` to $DIR/env (also printed)
#   scripts/postgres.sh stop    stop that cluster and delete $DIR
#   scripts/postgres.sh halt    stop that cluster's server and keep $DIR: `start` brings it back
#                               with its data (a test that makes the store unavailable)
#
# DIR is $PTC_PG_DIR or /tmp/ptc-postgres. Idempotent: `start` on a running cluster only
# reprints the URL. Runs the server as the `postgres` user (initdb refuses root).
set -euo pipefail

DIR="${PTC_PG_DIR:-/tmp/ptc-postgres}"
PORT="${PTC_PG_PORT:-5439}"
DB=ptc_test
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

pg_bin() {
  local bin
  bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
  [ -n "$bin" ] && echo "$bin"
}

as_postgres() {
  $SUDO runuser -u postgres -- "$@"
}

start() {
  if ! pg_bin >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq postgresql >/dev/null
  fi
  local bin
  bin="$(pg_bin)"
  $SUDO mkdir -p "$DIR"
  $SUDO chown postgres:postgres "$DIR"
  $SUDO chmod 0755 "$DIR"
  if [ ! -f "$DIR/data/PG_VERSION" ]; then
    as_postgres "$bin/initdb" -D "$DIR/data" -U postgres -A trust -E UTF8 >/dev/null
  fi
  if ! as_postgres "$bin/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1; then
    as_postgres "$bin/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 \
      -o "-c listen_addresses='' -k $DIR -p $PORT -c fsync=off" start >/dev/null
  fi
  if ! as_postgres "$bin/psql" -h "$DIR" -p "$PORT" -U postgres -tAc \
      "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1; then
    as_postgres "$bin/createdb" -h "$DIR" -p "$PORT" -U postgres "$DB"
  fi
  local url="postgresql://postgres@/$DB?host=$DIR&port=$PORT"
  echo "export PTC_TEST_POSTGRES_URL='$url'" | $SUDO tee "$DIR/env" >/dev/null
  echo "export PTC_TEST_POSTGRES_URL='$url'"
}

stop() {
  local bin
  bin="$(pg_bin || true)"
  if [ -n "$bin" ] && [ -f "$DIR/data/PG_VERSION" ]; then
    as_postgres "$bin/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null 2>&1 || true
  fi
  $SUDO rm -rf "$DIR"
}

halt() {
  local bin
  bin="$(pg_bin)"
  as_postgres "$bin/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  halt) halt ;;
  *) echo "usage: $0 start|stop|halt" >&2; exit 2 ;;
esac
