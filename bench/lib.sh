# Sourced by the bench scripts: builds the release gridlinks and starts it on free loopback
# ports with a temporary data directory (removed on exit), then logs in.
# Sets: BIN, TMP, PID, URL, JWT.
# GRIDLINKS_BIN: a binary built elsewhere (no build here).
if [ -z "${GRIDLINKS_BIN:-}" ]; then cargo build --release -q -p gridlinks-server --bin gridlinks; fi
BIN=${GRIDLINKS_BIN:-target/release/gridlinks}
TMP=$(mktemp -d); trap 'kill $PID 2>/dev/null && wait $PID 2>/dev/null; rm -rf "$TMP"' EXIT
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
GRIDLINKS_ADMIN_PASSWORD=bench GRIDLINKS_LOG=${GRIDLINKS_LOG:-warn} $BIN serve --data-dir "$TMP/data" \
  --http-bind 127.0.0.1:$PORT --mqtt-bind 127.0.0.1:0 --mqtt-ws-bind "" &
PID=$!
URL=http://127.0.0.1:$PORT
until curl -sf $URL/healthz >/dev/null; do sleep 0.1; done
JWT=$(curl -s -XPOST $URL/api/auth/login -d '{"username":"admin","password":"bench"}' \
  | python3 -c 'import json,sys;print(json.load(sys.stdin)["token"])')
