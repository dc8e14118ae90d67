#!/usr/bin/env bash
# A PostgreSQL server (Debian's package) on a free loopback port, its data under DIR, run
# as the `postgres` user. A database and role `gridlinks` with a random password are made.
#
#   scripts/services/postgres.sh start DIR   prints the connection URL, also in DIR/url (mode 600)
#   scripts/services/postgres.sh stop DIR    stops it (immediate shutdown)
#   scripts/services/postgres.sh restart DIR starts a stopped one again on its port
#   scripts/services/postgres.sh psql DIR SQL runs SQL as the superuser, prints the rows unaligned
set -euo pipefail
# shellcheck source=scripts/services/lib.sh
. "$(dirname "$0")/lib.sh"

BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
[ -x "$BIN/initdb" ] || { echo "PostgreSQL server binaries not found (apt-get install postgresql)" >&2; exit 1; }

as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

run() {
  as_pg "$BIN/pg_ctl" -D "$1/data" -l "$1/server.log" -w -t 60 \
    -o "-p $2 -k $1 -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=200" start >/dev/null
}

start() {
  local dir=$1
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  local port password
  port=$(free_ports 1)
  password=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
  [ "$(id -u)" = 0 ] && chown postgres: "$dir"
  as_pg "$BIN/initdb" -D "$dir/data" -U postgres -A trust --no-sync -E UTF8 >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; exit 1; }
  # Trust only on the Unix socket in DIR (mode 700); TCP needs the password.
  cat >"$dir/data/pg_hba.conf" <<HBA
local all all trust
host all all 127.0.0.1/32 scram-sha-256
HBA
  run "$dir" "$port"
  as_pg "$BIN/psql" -h "$dir" -p "$port" -U postgres -q -v ON_ERROR_STOP=1 \
    -c "CREATE ROLE gridlinks LOGIN PASSWORD '$password'" -c "CREATE DATABASE gridlinks OWNER gridlinks" >/dev/null
  echo "$port" >"$dir/port"
  local url="postgres://gridlinks:$password@127.0.0.1:$port/gridlinks"
  (umask 077; echo "$url" >"$dir/url")
  echo "$url"
}

stop() {
  local dir=$1
  [ -d "$dir/data" ] && as_pg "$BIN/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
}

restart() {
  local dir
  dir=$(cd "$1" && pwd)
  run "$dir" "$(cat "$dir/port")"
}

psql_in() {
  local dir
  dir=$(cd "$1" && pwd)
  as_pg "$BIN/psql" -h "$dir" -p "$(cat "$dir/port")" -U postgres -d gridlinks -tA -v ON_ERROR_STOP=1 -c "$2"
}

case "${1:-}" in
  start) start "$2" ;;
  stop) stop "$2" ;;
  restart) restart "$2" ;;
  psql) psql_in "$2" "$3" ;;
  *) sed -n '2,9p' "$0" >&2; exit 2 ;;
esac
