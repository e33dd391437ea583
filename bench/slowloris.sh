#!/usr/bin/env bash
# A slowloris against http_hello: ATTACKERS connections from 127.0.0.2 each send the start
# of a request and then nothing; then a normal client on 127.0.0.1 asks GET / and the script
# prints how long it waited. Extra arguments go to the server.
#
#   bench/slowloris.sh [ATTACKERS] [SERVER ARGS...]
#   bench/slowloris.sh 200                              # no per-address cap
#   bench/slowloris.sh 200 --max-conns-per-ip 8         # with one
#
# The pool is dynamic with at most 32 workers. Without a cap the normal client waits for the
# attackers ahead of it in the listen queue, 32 at a time, each cut off by --header-timeout
# (20 s): minutes. Bounded: the client gives up after 300 s.
set -euo pipefail
cd "$(dirname "$0")/.."
ATTACKERS=${1:-200}
shift || true
cargo build --release --quiet --example http_hello
log=$(mktemp)
target/release/examples/http_hello -l 127.0.0.1:0 --pool dynamic --max-workers 32 "$@" 2>"$log" &
master=$!
trap 'kill $master 2>/dev/null || true; wait $master 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 200); do grep -q " ready" "$log" && break; sleep 0.05; done
port=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$log" | head -1 | cut -d: -f2)
python3 - "$port" "$ATTACKERS" <<'PY'
import socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
held = []
for _ in range(n):
    s = socket.socket()
    s.bind(("127.0.0.2", 0))
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: ")
    held.append(s)
t = time.monotonic()
c = socket.create_connection(("127.0.0.1", port), timeout=300)
c.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
answer = c.recv(64)
print(f"{n} slow connections from 127.0.0.2; the normal client's answer "
      f"({answer[:12].decode(errors='replace')!r}) took {time.monotonic() - t:.3f} s")
PY
