# What the service scripts share (sourced by kafka.sh, cassandra.sh and postgres.sh).

# fetch_jars NAME LIB : Maven copies the runtime dependencies named by
# scripts/services/NAME/pom.xml into LIB, once (LIB/.complete marks it done).
fetch_jars() {
  if [ ! -f "$2/.complete" ]; then
    mkdir -p "$2"
    mvn -q -B -f "$(dirname "${BASH_SOURCE[0]}")/$1/pom.xml" dependency:copy-dependencies -Dstyle.color=never \
      -DoutputDirectory="$2" -DincludeScope=runtime >&2
    touch "$2/.complete"
  fi
}

# free_ports N : N distinct free loopback ports, on one line. All are held open until
# printed: two single picks can return the same port.
free_ports() {
  python3 -c 'import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))' "$1"
}
