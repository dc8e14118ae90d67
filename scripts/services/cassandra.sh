#!/usr/bin/env bash
# One Apache Cassandra 5.0 node on free loopback ports, from the jars on Maven Central (fetched
# once by Maven into target/services/cassandra/lib; scripts/services/cassandra/pom.xml names the
# version). Runs on the `java` on PATH: 17 (tested) or 11, the JDKs Cassandra 5.0 supports; as
# root too (only bin/cassandra refuses root, not the daemon). No JMX, so no nodetool.
# Heap CASSANDRA_HEAP (default 1g).
#
#   scripts/services/cassandra.sh start DIR     start a node with its data under DIR; prints the
#                                               CQL contact point 127.0.0.1:PORT, also in DIR/contact
#   scripts/services/cassandra.sh stop DIR      stop it (SIGTERM: drains; kill -9 after 20 s)
#   scripts/services/cassandra.sh kill DIR      kill -9 it at once
#   scripts/services/cassandra.sh restart DIR   start the stopped node again with its data and ports
#   scripts/services/cassandra.sh fetch         only fetch the jars
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=scripts/services/lib.sh
. "$ROOT/scripts/services/lib.sh"
LIB=${CASSANDRA_LIB:-$ROOT/target/services/cassandra/lib}
HEAP=${CASSANDRA_HEAP:-1g}

fetch() { fetch_jars cassandra "$LIB"; }

alive() { # PID: running and not a zombie (the exited node may wait a while to be reaped)
  local st; st=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${st#Z}" = "$st" ]
}

run_node() { # DIR
  local dir=$1 nolock=()
  # As root Cassandra's mlockall(MCL_CURRENT) succeeds and pins ~300 MB more; without
  # CAP_IPC_LOCK it fails (ENOMEM) and only logs a warning.
  if [ "$(id -u)" = 0 ]; then nolock=(setpriv --bounding-set=-ipc_lock); fi
  # The --add-exports/--add-opens are Cassandra's conf/jvm17-server.options (not in the jar).
  # The -Dcassandra.* after -Dcassandra-foreground are the test shortcuts: no gossip settling
  # or ring delay, token 0, a 100-row (not 100000-row) memtable overhead estimate, no 2 s
  # shutdown notice to peers and no 2 s wait for (absent) peer connections to quiesce: stop
  # takes < 1 s. (Not -Dcassandra.unsafesystem: with it a keyspace made just before a
  # kill -9 was gone after the restart.)
  # setsid: the node gets its own process group, so stop can kill it and its children.
  setsid "${nolock[@]}" java -Xms256m -Xmx"$HEAP" -Xss256k -XX:+UseG1GC -XX:+ParallelRefProcEnabled \
    -XX:MaxTenuringThreshold=1 -XX:G1HeapRegionSize=16m -XX:+UseThreadPriorities \
    -XX:+PerfDisableSharedMem -XX:+CrashOnOutOfMemoryError -ea -da:net.openhft... \
    -Djava.awt.headless=true -Djava.net.preferIPv4Stack=true -Djdk.attach.allowAttachSelf=true \
    -Dio.netty.tryReflectionSetAccessible=true -Dio.netty.allocator.useCacheForAllThreads=true \
    -Dio.netty.allocator.maxOrder=11 \
    --add-exports java.base/jdk.internal.misc=ALL-UNNAMED \
    --add-exports java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED \
    --add-exports java.rmi/sun.rmi.registry=ALL-UNNAMED \
    --add-exports java.rmi/sun.rmi.server=ALL-UNNAMED \
    --add-exports java.sql/java.sql=ALL-UNNAMED \
    --add-exports java.base/java.lang.ref=ALL-UNNAMED \
    --add-exports jdk.unsupported/sun.misc=ALL-UNNAMED \
    --add-exports jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED \
    --add-exports jdk.attach/sun.tools.attach=ALL-UNNAMED \
    --add-opens java.base/java.lang.module=ALL-UNNAMED \
    --add-opens java.base/jdk.internal.loader=ALL-UNNAMED \
    --add-opens java.base/jdk.internal.ref=ALL-UNNAMED \
    --add-opens java.base/jdk.internal.reflect=ALL-UNNAMED \
    --add-opens java.base/jdk.internal.math=ALL-UNNAMED \
    --add-opens java.base/jdk.internal.module=ALL-UNNAMED \
    --add-opens java.base/jdk.internal.util.jar=ALL-UNNAMED \
    --add-opens jdk.management/com.sun.management.internal=ALL-UNNAMED \
    --add-opens java.base/sun.nio.ch=ALL-UNNAMED \
    --add-opens java.base/java.io=ALL-UNNAMED \
    --add-opens java.base/java.lang.reflect=ALL-UNNAMED \
    --add-opens jdk.compiler/com.sun.tools.javac=ALL-UNNAMED \
    --add-opens java.base/java.lang=ALL-UNNAMED \
    --add-opens java.base/java.util=ALL-UNNAMED \
    -Dcassandra.config="file://$dir/cassandra.yaml" -Dcassandra.storagedir="$dir" \
    -Dcassandra.logdir="$dir" -Dlogback.configurationFile="$dir/logback.xml" \
    -Dcassandra-foreground=yes -Dcassandra.skip_wait_for_gossip_to_settle=0 \
    -Dcassandra.ring_delay_ms=0 -Dcassandra.initial_token=0 \
    -Dcassandra.memtable_row_overhead_computation_step=100 \
    -Dcassandra.shutdown_announce_in_ms=0 -Dcassandra.test.messagingService.nonGracefulShutdown=true \
    -cp "$LIB/*" org.apache.cassandra.service.CassandraDaemon >"$dir/stdout.log" 2>&1 </dev/null &
  echo $! >"$dir/pid"
}

wait_started() { # DIR
  local dir=$1
  for _ in $(seq 1 1200); do
    # logged after the CQL port is bound ("Starting listening for CQL clients" comes before)
    if grep -q "Startup complete" "$dir/system.log" 2>/dev/null; then return 0; fi
    if ! alive "$(cat "$dir/pid")"; then
      echo "cassandra exited:" >&2; tail -n 30 "$dir/system.log" "$dir/stdout.log" >&2; return 1
    fi
    sleep 0.1
  done
  echo "cassandra did not start within 120 s" >&2; tail -n 30 "$dir/system.log" "$dir/stdout.log" >&2; return 1
}

start() {
  local dir=$1
  fetch
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  local native storage
  read -r native storage < <(free_ports 2)
  cat >"$dir/logback.xml" <<LOG
<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>$dir/system.log</file>
    <encoder><pattern>%-5level [%thread] %date{ISO8601} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
LOG
  cat >"$dir/cassandra.yaml" <<YAML
cluster_name: gridlinks-test
num_tokens: 1
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: SimpleSnitch
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "127.0.0.1:$storage"
listen_address: 127.0.0.1
rpc_address: 127.0.0.1
storage_port: $storage
native_transport_port: $native
start_native_transport: true
authenticator: AllowAllAuthenticator
authorizer: AllowAllAuthorizer
data_file_directories: [$dir/data]
commitlog_directory: $dir/commitlog
saved_caches_directory: $dir/saved_caches
hints_directory: $dir/hints
cdc_raw_directory: $dir/cdc_raw
commitlog_sync: periodic
commitlog_sync_period: 10000ms
# a fresh node that will never meet 4.x nodes: no 4.x compatibility mode
storage_compatibility_mode: NONE
YAML
  run_node "$dir"
  wait_started "$dir"
  echo "127.0.0.1:$native" >"$dir/contact"
  echo "127.0.0.1:$native"
}

stop() { # DIR [SIGNAL]
  local dir=$1 sig=${2:-TERM}
  [ -f "$dir/pid" ] || return 0
  local pid; pid=$(cat "$dir/pid")
  kill -"$sig" -- "-$pid" 2>/dev/null || true
  for _ in $(seq 1 200); do alive "$pid" || break; sleep 0.1; done
  kill -9 -- "-$pid" 2>/dev/null || true
  rm -f "$dir/pid"
}

restart() {
  local dir=$1
  fetch
  dir=$(cd "$dir" && pwd)
  mv -f "$dir/system.log" "$dir/system.log.prev" 2>/dev/null || true
  run_node "$dir"
  wait_started "$dir"
  cat "$dir/contact"
}

case "${1:-}" in
  start) start "$2" ;;
  stop) stop "$2" ;;
  kill) stop "$2" 9 ;;
  restart) restart "$2" ;;
  fetch) fetch ;;
  *) sed -n '2,13p' "$0" >&2; exit 2 ;;
esac
