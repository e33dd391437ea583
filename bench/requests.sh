#!/usr/bin/env bash
# Requests per second of the ping and http_hello examples at 1, 8 and 32 concurrent
# clients, keep-alive and a new connection per request: the median of RUNS runs each.
#
#   bench/requests.sh            (RUNS=3 N=20000 WORKERS=32 by default)
#
# Clients: redis-benchmark (redis-tools) for ping, ab (apache2-utils) for http_hello, on
# the same machine as the server: on a 2-core machine client and server share the CPUs,
# so the figures are lower bounds for the server. WORKERS is large enough for every client
# to have its own worker (a static pool; prefork serves one connection per worker).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3} N=${N:-20000} WORKERS=${WORKERS:-32}
cargo build --release --quiet -p appsrv -p appsrv-examples --examples
EX=target/release/examples
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# start EXAMPLE: sets SERVER (the master's pid) and PORT. Not in a subshell: the EXIT trap
# would run there.
start() {
  "$EX/$1" -l 127.0.0.1:0 -w "$WORKERS" 2>"$work/$1.log" &
  SERVER=$!
  for _ in $(seq 200); do grep -q " ready" "$work/$1.log" 2>/dev/null && break; sleep 0.05; done
  PORT=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$work/$1.log" | head -1 | cut -d: -f2)
}

median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

ping_rps() { # PORT CONC KEEPALIVE(1|0)
  redis-benchmark -p "$1" -t ping_inline -n "$N" -c "$2" -k "$3" -q 2>/dev/null \
    | tr '\r' '\n' | grep -o 'PING_INLINE: [0-9.]*' | tail -1 | cut -d' ' -f2
}
http_rps() { # PORT CONC KEEPALIVE(1|0)
  local k=""; [ "$3" = 1 ] && k=-k
  ab -q $k -n "$N" -c "$2" "http://127.0.0.1:$1/" 2>/dev/null | awk '/Requests per second/ { print $4 }'
}

echo "| example | connections | c=1 | c=8 | c=32 |"
echo "|---|---|---|---|---|"
for ex in ping http_hello; do
  start "$ex"
  port=$PORT
  for ka in 1 0; do
    row="| $ex | $([ $ka = 1 ] && echo keep-alive || echo one per request) |"
    for c in 1 8 32; do
      fn=${ex%%_*}_rps; [ "$ex" = http_hello ] && fn=http_rps
      v=$(for _ in $(seq "$RUNS"); do $fn "$port" "$c" "$ka"; done | median)
      row="$row $(printf '%.0f' "$v") |"
    done
    echo "$row"
  done
  kill "$SERVER"
  wait "$SERVER" 2>/dev/null || true
done
