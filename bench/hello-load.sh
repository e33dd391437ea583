#!/usr/bin/env bash
# The hello example under concurrent load: CONNS connections (one per request) from CONC
# concurrent clients, with appsrv-bench; then the memory (PSS) of the master and of each
# worker, from /proc/PID/smaps_rollup.
#
#   bench/hello-load.sh [CONNS] [CONC] [WORKERS]     (default 20000 16 2)
set -euo pipefail
cd "$(dirname "$0")/.."
CONNS=${1:-20000} CONC=${2:-16} WORKERS=${3:-2}
cargo build --release --quiet --example hello
cargo build --release --quiet -p appsrv-bench
log=$(mktemp)
target/release/examples/hello -l 127.0.0.1:0 -w "$WORKERS" --allow-root-workers 2>"$log" &
master=$!
trap 'kill $master 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 200); do grep -q " ready" "$log" && break; sleep 0.05; done
addr=$(grep -o 'listening on [^ ]*' "$log" | head -1 | cut -d' ' -f3)
pss() { awk '/^Pss:/ { print $2 }' "/proc/$1/smaps_rollup"; }
echo "idle: master PSS $(pss $master) kB; workers: $(for w in $(pgrep -P $master); do printf '%s kB ' "$(pss "$w")"; done)"
target/release/appsrv-bench "$addr" --reconnect -c "$CONC" -n "$CONNS"
echo "after: master PSS $(pss $master) kB; workers: $(for w in $(pgrep -P $master); do printf '%s kB ' "$(pss "$w")"; done)"
echo "worker replacements during the run: $(grep -c 'starting a replacement' "$log" || true)"
