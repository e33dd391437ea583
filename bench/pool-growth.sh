#!/usr/bin/env bash
# How fast a dynamic pool goes from idle to serving CLIENTS concurrent slow clients (each
# holds its worker: testbed greets, then waits), and the memory (PSS) of an idle worker.
#
#   bench/pool-growth.sh [CLIENTS]      (default 128; the pool starts with 2 workers)
#
# Apache prefork and PHP-FPM grow in one-second rounds of 1, 2, 4 … 32: about 8 s for 128.
set -euo pipefail
cd "$(dirname "$0")/.."
CLIENTS=${1:-128}
cargo build --release --quiet --example testbed
log=$(mktemp)
target/release/examples/testbed -l 127.0.0.1:0 --pool dynamic --start-workers 2 --min-spare 2 \
  --max-spare 8 --max-workers $((CLIENTS + 16)) --log-level debug 2>"$log" &
master=$!
trap 'kill $master 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 200); do grep -q " ready" "$log" && break; sleep 0.05; done
port=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$log" | head -1 | cut -d: -f2)
pss() { awk '/^Pss:/ { print $2 }' "/proc/$1/smaps_rollup"; }
echo "idle workers: $(for w in $(pgrep -P $master); do printf '%s kB ' "$(pss "$w")"; done)(PSS)"
python3 - "$port" "$CLIENTS" <<'PY'
import socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
t = time.monotonic()
conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
pids = set()
for c in conns:
    c.settimeout(30)
    pids.add(c.recv(64))
print(f"{n} concurrent slow clients served by {len(pids)} distinct workers after {time.monotonic() - t:.3f} s")
PY
echo "rounds (workers started per round): $(grep -o 'starting [0-9]* more' "$log" | awk '{print $2}' | tr '\n' ' ')"
echo "workers now: $(pgrep -P $master | wc -l)"
