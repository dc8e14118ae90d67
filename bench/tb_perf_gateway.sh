#!/usr/bin/env bash
# ThingsBoard's own performance-test tool (thingsboard/performance-tests, gateway test)
# against GridLinks, then a count of what GridLinks stored.
#
# Starts GridLinks on free loopback ports with a temporary data directory and runs the
# tool with its defaults (1000 devices DW00000000.., 10 gateways GW00000000.. created on
# start, 1000 msg/s of SMART_METER telemetry on v1/gateway/telemetry at QoS 0, dashboards,
# warm-up) except the connection settings, GATEWAY_CREATE_ON_START=true and the duration.
# Afterwards it reads every DW device's time series over the REST API and compares the
# points stored with the messages the tool reports as published ("Completed performance
# iteration. Success: N, Failed: M"). Each SMART_METER message carries one point of
# pulseCounter, leakage and batteryLevel with its own ts, so stored points of each key
# must equal the messages published.
#
# Usage: [DURATION=300] [GRIDLINKS_BIN=target/release/gridlinks] [PERF_JAR=...] bench/tb_perf_gateway.sh
#   DURATION      the tool's DURATION_IN_SECONDS (default 300)
#   GRIDLINKS_BIN the gridlinks binary (default target/release/gridlinks; not built here)
#   PERF_JAR      tb-ce-performance-tests-4.0.1-boot.jar (build it with bench/perftool/build_perftool.sh)
#   OUT_DIR       where the logs are kept (default target/tb_perf_gateway/<date-time>)
#   TOOL_TIMEOUT  seconds before the tool is killed (default DURATION*1.2+600; it may hang after errors)
#   JAVA          java 17 binary (default java)
# Exit status: 0 when the tool completed without failures and every published message was
# stored; 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-300}
BIN=${GRIDLINKS_BIN:-target/release/gridlinks}
JAR_NAME=tb-ce-performance-tests-4.0.1-boot.jar
PERF_JAR=${PERF_JAR:-target/perftool/performance-tests/target/$JAR_NAME}
JAVA=${JAVA:-java}
TOOL_TIMEOUT=${TOOL_TIMEOUT:-$((DURATION * 12 / 10 + 600))}
OUT_DIR=${OUT_DIR:-target/tb_perf_gateway/$(date +%Y%m%d-%H%M%S)}

if [ ! -x "$BIN" ]; then
  echo "gridlinks binary not found at $BIN: cargo build --release -p gridlinks-server, or set GRIDLINKS_BIN" >&2; exit 1
fi
if [ ! -f "$PERF_JAR" ]; then
  cat >&2 <<MSG
ThingsBoard performance-test jar not found at $PERF_JAR.
Build it (git, JDK 17, Maven, Maven Central access; a few minutes):
  bench/perftool/build_perftool.sh        # -> target/perftool/performance-tests/target/$JAR_NAME
then run again (that path is found by default) or set PERF_JAR=/path/to/$JAR_NAME.
MSG
  exit 1
fi
command -v "$JAVA" >/dev/null || { echo "java (17) not found; set JAVA" >&2; exit 1; }
command -v curl >/dev/null || { echo "curl not found" >&2; exit 1; }

mkdir -p "$OUT_DIR"; OUT_DIR=$(cd "$OUT_DIR" && pwd)
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
PERF_JAR=$(cd "$(dirname "$PERF_JAR")" && pwd)/$(basename "$PERF_JAR")
TMP=$(mktemp -d)
PID=""
cleanup() {
  if [ -n "${TOOL_PID:-}" ] && kill -0 "$TOOL_PID" 2>/dev/null; then kill "$TOOL_PID"; wait "$TOOL_PID" 2>/dev/null || true; fi
  if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then kill "$PID"; wait "$PID" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
HTTP_PORT=$(free_port); MQTT_PORT=$(free_port)
while [ "$MQTT_PORT" = "$HTTP_PORT" ]; do MQTT_PORT=$(free_port); done
# The tool's default REST user; GridLinks' first tenant administrator is given that name.
ADMIN_USER=${ADMIN_USER:-tenant@thingsboard.org}
ADMIN_PASSWORD=${ADMIN_PASSWORD:-tenant}
URL=http://127.0.0.1:$HTTP_PORT

GRIDLINKS_ADMIN_USER=$ADMIN_USER GRIDLINKS_ADMIN_PASSWORD=$ADMIN_PASSWORD \
GRIDLINKS_ADMIN_SYSADMIN_PASSWORD=sysadmin-bench GRIDLINKS_LOG=${GRIDLINKS_LOG:-info} \
  "$BIN" serve --data-dir "$TMP/data" --http-bind 127.0.0.1:$HTTP_PORT \
  --mqtt-bind 127.0.0.1:$MQTT_PORT --mqtt-ws-bind "" --coap-bind "" \
  > "$OUT_DIR/gridlinks.log" 2>&1 &
PID=$!
for _ in $(seq 300); do
  curl -sf "$URL/healthz" >/dev/null && break
  kill -0 "$PID" 2>/dev/null || { echo "gridlinks exited at start:" >&2; tail -20 "$OUT_DIR/gridlinks.log" >&2; exit 1; }
  sleep 0.1
done
curl -sf "$URL/healthz" >/dev/null || { echo "gridlinks not healthy after 30 s" >&2; exit 1; }
TICK=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14+$15}' "/proc/$PID/stat"; }
echo "gridlinks pid $PID: http $URL, mqtt 127.0.0.1:$MQTT_PORT; logs in $OUT_DIR"
echo "running the tool: gateway test, DURATION_IN_SECONDS=$DURATION (timeout ${TOOL_TIMEOUT}s)..."

# The tool lists its device profiles as a classpath directory (device/profile/), which
# yields nothing inside the boot jar: run as its packages do (start-tests.sh), with the
# resources unpacked into a loader.path directory and the PropertiesLauncher.
CONF=$TMP/conf
python3 - "$PERF_JAR" "$CONF" <<'PY'
import os, sys, zipfile
jar, dest = sys.argv[1:3]
pre = "BOOT-INF/classes/"
with zipfile.ZipFile(jar) as z:
    for n in z.namelist():
        if n.startswith(pre) and not n.endswith("/") and not n.endswith(".class"):
            out = os.path.join(dest, n[len(pre):]); os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f: f.write(z.read(n))
# the jar leaves its logback.xml out; this is the tool's conf/logback.xml (console, same pattern)
if not os.path.exists(os.path.join(dest, "logback.xml")):
    with open(os.path.join(dest, "logback.xml"), "w") as f:
        f.write("""<configuration><appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
<encoder><pattern>%d{HH:mm:ss.SSS} [%thread] %-5level %logger{36} - %msg%n</pattern></encoder>
</appender><logger name="org.thingsboard" level="INFO"/><root level="INFO"><appender-ref ref="STDOUT"/></root></configuration>
""")
PY
C0=$(cpu_ticks); T0=$(date +%s.%N)
(cd "$TMP" && exec timeout "$TOOL_TIMEOUT" env \
  REST_URL="$URL" REST_USERNAME="$ADMIN_USER" REST_PASSWORD="$ADMIN_PASSWORD" \
  MQTT_HOST=127.0.0.1 MQTT_PORT="$MQTT_PORT" \
  TEST_API=gateway DEVICE_API=MQTT GATEWAY_CREATE_ON_START=true \
  DURATION_IN_SECONDS="$DURATION" EXIT_AFTER_COMPLETE=true \
  "$JAVA" -cp "$PERF_JAR" -Dloader.path="$CONF" \
  -Dloader.main=org.thingsboard.tools.PerformanceTestApplication \
  -Dlogging.config="$CONF/logback.xml" org.springframework.boot.loader.launch.PropertiesLauncher \
  > "$OUT_DIR/tool.log" 2>&1) &
TOOL_PID=$!
# After "Application run failed" the tool keeps non-daemon threads alive: stop it then.
while kill -0 "$TOOL_PID" 2>/dev/null; do
  if grep -q "Application run failed" "$OUT_DIR/tool.log" 2>/dev/null; then
    sleep 10; kill -0 "$TOOL_PID" 2>/dev/null && { echo "the tool failed to start its run; stopping it" >&2; kill "$TOOL_PID"; }
    break
  fi
  sleep 2
done
set +e; wait "$TOOL_PID"; TOOL_RC=$?; set -e
T1=$(date +%s.%N)
kill -0 "$PID" 2>/dev/null || { echo "gridlinks died during the run:" >&2; tail -30 "$OUT_DIR/gridlinks.log" >&2; exit 1; }

# QoS 0: "published" means written to the socket. Let GridLinks drain what it has read:
# wait until the records it has committed stop changing and its queue is empty.
metric() { curl -s "$URL/metrics" | awk -v m="$1" '$1==m{print $2}'; }
prev=-1
for _ in $(seq 120); do
  cur=$(metric gridlinks_storage_records_total); q=$(metric gridlinks_storage_queue_depth)
  [ "$cur" = "$prev" ] && [ "${q:-0}" = "0" ] && break
  prev=$cur; sleep 1
done
C1=$(cpu_ticks)
RSS_KB=$(awk '/^VmHWM/{print $2}' "/proc/$PID/status")
curl -s "$URL/metrics" > "$OUT_DIR/metrics.txt"

set +e
python3 - "$URL" "$ADMIN_USER" "$ADMIN_PASSWORD" "$OUT_DIR" "$TOOL_RC" "$DURATION" \
  "$C0" "$C1" "$TICK" "$RSS_KB" "$T0" "$T1" <<'PY'
import http.client, json, re, sys, time, urllib.parse
url, user, pw, out, tool_rc, duration = sys.argv[1:7]
c0, c1, tick, rss_kb = map(int, sys.argv[7:11]); t0, t1 = map(float, sys.argv[11:13])
tool_rc = int(tool_rc); duration = int(duration)
host = urllib.parse.urlparse(url).netloc
conn = http.client.HTTPConnection(host, timeout=120)

def call(method, path, body=None, hdrs=None):
    h = {"Content-Type": "application/json", **(hdrs or {})}
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=h)
    r = conn.getresponse(); data = r.read()
    if r.status != 200:
        raise SystemExit(f"{method} {path} -> {r.status} {data[:500]!r}")
    return json.loads(data)

problems = []
log = open(f"{out}/tool.log", errors="replace").read().splitlines()

# --- what the tool says it sent -------------------------------------------------------
final = [re.search(r"Completed performance iteration\. Success: (\d+), Failed: (\d+)\s*$", l) for l in log]
final = [m for m in final if m]
iters = [re.search(r"\[(\d+)\] Completed performance iteration\. Success: (\d+), Failed: (\d+), Alarms", l) for l in log]
iters = [m for m in iters if m]
sum_ok = sum(int(m.group(2)) for m in iters); sum_failed = sum(int(m.group(3)) for m in iters)
if final:
    sent, failed = int(final[-1].group(1)), int(final[-1].group(2))
else:
    problems.append("the tool never logged its final 'Completed performance iteration' line")
    sent, failed = sum_ok, sum_failed
if tool_rc == 124:
    problems.append(f"the tool did not exit before its timeout (killed)")
elif tool_rc != 0:
    problems.append(f"the tool exited with status {tool_rc}")
if failed or sum_failed:
    problems.append(f"the tool failed to publish {max(failed, sum_failed)} messages")
if len(iters) != duration:
    problems.append(f"the tool completed {len(iters)} iterations of {duration}")
errors = [l for l in log if re.match(r"^\S*\d\d:\d\d:\d\d\.\d{3}\S* +(\[[^\]]*\] )?(ERROR|WARN) ", l)]
errs = [l for l in errors if re.search(r"\bERROR\b", l)]
if errs:
    problems.append(f"the tool logged {len(errs)} ERROR lines (first: {errs[0][:300]})")
created = [re.search(r"(\d+) (devices|gateways) have been created successfully", l) for l in log]
created = {m.group(2): int(m.group(1)) for m in created if m}
connected = [re.search(r"(\d+) gateways have been connected successfully", l) for l in log]
connected = [int(m.group(1)) for m in connected if m]

def hms(l):
    h, m, s = re.search(r"(\d\d):(\d\d):(\d\d\.\d{3})", l).groups(); return int(h) * 3600 + int(m) * 60 + float(s)
start = next((hms(l) for l in log if "Starting performance test for" in l), None)
end = next((hms(l) for l in reversed(log) if re.search(r"Completed performance iteration\. Success: \d+, Failed: \d+\s*$", l)), None)
test_s = (end - start) % 86400 if start is not None and end is not None else None

# --- what GridLinks stored ------------------------------------------------------------
tok = call("POST", "/api/auth/login", {"username": user, "password": pw})["token"]
auth = {"X-Authorization": f"Bearer {tok}"}
devices, page = [], 0
while True:
    d = call("GET", f"/api/tenant/devices?pageSize=1000&page={page}", hdrs=auth)
    devices += d["data"]; page += 1
    if not d["hasNext"]: break
dw = sorted((x for x in devices if x["name"].startswith("DW")), key=lambda x: x["name"])
gw = [x for x in devices if x["name"].startswith("GW")]
gw_flag = sum(1 for x in gw if (x.get("additionalInfo") or {}).get("gateway") is True)
profiles = sorted(p["name"] for p in call("GET", "/api/deviceProfiles?pageSize=100&page=0", hdrs=auth)["data"])
dashboards = sorted(d["title"] for d in call("GET", "/api/tenant/dashboards?pageSize=100&page=0", hdrs=auth)["data"])
dw_types = sorted({x.get("type") for x in dw})
end_ts = int(time.time() * 1000) + 86400000
keys = ["pulseCounter", "leakage", "batteryLevel"]
stored = {k: 0 for k in keys}; per_dev = []; mismatch_keys = []
for x in dw:
    q = urllib.parse.urlencode({"keys": ",".join(keys), "startTs": 0, "endTs": end_ts,
                                "limit": 100000, "agg": "NONE", "orderBy": "ASC"})
    ts = call("GET", f"/api/plugins/telemetry/DEVICE/{x['id']['id']}/values/timeseries?{q}", hdrs=auth)
    n = {k: len(ts.get(k, [])) for k in keys}
    for k in keys: stored[k] += n[k]
    if len(set(n.values())) != 1: mismatch_keys.append((x["name"], n))
    per_dev.append(n["pulseCounter"])
    if n["pulseCounter"] >= 100000: problems.append(f"{x['name']}: 100000 points, the read limit; count is a lower bound")
n_stored = stored["pulseCounter"]
lost = sent - n_stored
if lost > 0: problems.append(f"{lost} published messages not stored")
if lost < 0: problems.append(f"{-lost} more points stored than messages published")
if mismatch_keys: problems.append(f"{len(mismatch_keys)} devices with differing counts per key, e.g. {mismatch_keys[0]}")
if len(dw) != 1000: problems.append(f"{len(dw)} DW devices in GridLinks (the tool makes 1000)")

metrics = {}
for l in open(f"{out}/metrics.txt"):
    p = l.split()
    if len(p) == 2 and not l.startswith("#"): metrics[p[0]] = p[1]
watch = ["gridlinks_mqtt_publishes_total", "gridlinks_mqtt_bad_publishes_total", "gridlinks_payload_rejected_total",
         "gridlinks_mqtt_protocol_errors_total", "gridlinks_mqtt_connects_refused_total",
         "gridlinks_mqtt_keepalive_timeouts_total", "gridlinks_storage_overloaded_total",
         "gridlinks_storage_refused_unhealthy_total", "gridlinks_mqtt_connects_total"]
for m in ["gridlinks_mqtt_bad_publishes_total", "gridlinks_payload_rejected_total", "gridlinks_mqtt_protocol_errors_total",
          "gridlinks_mqtt_connects_refused_total", "gridlinks_storage_overloaded_total", "gridlinks_storage_refused_unhealthy_total"]:
    if float(metrics.get(m, 0)) != 0: problems.append(f"{m} = {metrics[m]}")
gl_warn = [l for l in open(f"{out}/gridlinks.log", errors="replace") if re.search(r"\b(WARN|ERROR)\b", l)]

cpu = (c1 - c0) / tick
print(f"tool: exit {tool_rc}, {created.get('gateways', '?')} gateways and {created.get('devices', '?')} devices created, "
      f"{connected[-1] if connected else '?'} gateways connected, {len(iters)} iterations, wall {t1 - t0:.0f} s")
print(f"msgs sent (published, QoS 0): {sent}   (failed: {failed}; sum of iterations: {sum_ok})")
print(f"msgs stored: {n_stored}   (per key: {stored}; DW devices: {len(dw)}, per device min/max {min(per_dev, default=0)}/{max(per_dev, default=0)}; GW devices: {len(gw)})")
print(f"lost: {lost}")
print(f"entities in GridLinks: profiles {profiles}; dashboards {dashboards}; DW types {dw_types}; GW marked gateway {gw_flag}/{len(gw)}")
if test_s:
    print(f"duration: {test_s:.1f} s of publishing (DURATION_IN_SECONDS={duration}) -> {sent / test_s:.0f} msg/s, {3 * sent / test_s:.0f} points/s")
print(f"gridlinks CPU: {cpu:.1f} s during the tool's run ({cpu / (t1 - t0) * 100:.0f}% of one core)   peak RSS: {rss_kb / 1024:.1f} MiB")
print("gridlinks metrics: " + ", ".join(f"{m.replace('gridlinks_', '')}={metrics.get(m, '?')}" for m in watch))
if gl_warn:
    print(f"gridlinks log: {len(gl_warn)} WARN/ERROR lines, first: {gl_warn[0].strip()[:300]}")
if errors:
    print(f"tool log: {len(errors)} WARN/ERROR lines (see {out}/tool.log)")
for p in problems: print("PROBLEM:", p)
print("RESULT:", "OK" if not problems else "FAILED")
sys.exit(1 if problems else 0)
PY
RC=$?
exit $RC
