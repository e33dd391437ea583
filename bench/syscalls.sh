#!/usr/bin/env bash
# Syscalls per request of appsrv's examples, counted with `strace -c` on all the workers of
# a server started with -w 2 (so that one worker is idle, as in a pool that is not
# saturated), over a fixed number of requests from one client; and, for the keep-alive
# guard, from two clients on two workers (no worker idle, nobody queued: the guard must
# cost nothing) and from one client on one worker with a second connection queued.
#
#   bench/syscalls.sh            # all workloads whose client tools are installed
#
# Needs: strace; redis-benchmark (redis-tools) for ping; ab (apache2-utils) for http_hello;
# cargo builds the release examples first. Prints a markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
N=${N:-20000}
cargo build --release --quiet --examples -p appsrv
EX=target/release/examples
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# start EXAMPLE WORKERS → prints "MASTER_PID PORT"
start() {
  local ex=$1 workers=$2 log
  # A log of its own: the previous server may still be writing its last lines to its own.
  log=$(mktemp "$work/$ex.XXXXXX.log")
  "$EX/$ex" -l 127.0.0.1:0 -w "$workers" 2>"$log" &
  local pid=$!
  local port
  port=$(ready_port "$log")
  echo "$pid $port"
}

# measure NAME REQUESTS EXAMPLE CLIENT-COMMAND (with {PORT}) [WORKERS]
measure() {
  local name=$1 requests=$2 ex=$3 client=$4 workers=${5:-2}
  read -r master port < <(start "$ex" "$workers")
  local traced=()
  for w in $(pgrep -P "$master"); do traced+=(-p "$w"); done
  strace -c -f -q -o "$work/strace.txt" "${traced[@]}" &
  local tracer=$!
  sleep 0.5 # let strace attach before the load starts
  eval "${client//\{PORT\}/$port}" >/dev/null 2>&1
  kill -INT "$tracer"; wait "$tracer" 2>/dev/null || true
  # Not a child of this shell (started in the process substitution): wait for it to go.
  kill -TERM "$master"
  while kill -0 "$master" 2>/dev/null; do sleep 0.05; done
  # strace -c table: calls are column 4; skip header and total lines.
  local per
  per=$(awk -v n="$requests" '
    $1 ~ /^[0-9.]+$/ && $NF != "total" { calls[$NF] += ($4 ~ /^[0-9]+$/ ? $4 : $5) }
    END { for (s in calls) if (calls[s] / n >= 0.01) printf "%s %.2f, ", s, calls[s] / n }' "$work/strace.txt")
  local total
  # The total line has the same columns (calls is the 4th; an errors column may follow).
  total=$(awk -v n="$requests" '$NF == "total" { c = $4 } END { printf "%.2f", c / n }' "$work/strace.txt")
  echo "| $name | $requests | $total | ${per%, } |"
}

echo "| workload | requests | syscalls/request | per call (≥ 0.01/request) |"
echo "|---|---|---|---|"
if command -v redis-benchmark >/dev/null; then
  measure "ping, keep-alive (redis-benchmark -c 1)" "$N" ping \
    "redis-benchmark -p {PORT} -t ping_inline -n $N -c 1 -q"
  measure "ping, new connection per request (-k 0)" "$N" ping \
    "redis-benchmark -p {PORT} -t ping_inline -n $N -c 1 -k 0 -q"
  measure "ping, keep-alive, saturated pool (-w 1: no worker idle, nobody queued)" "$N" ping \
    "redis-benchmark -p {PORT} -t ping_inline -n $N -c 1 -q" 1
fi
if command -v ab >/dev/null && [ -x "$EX/http_hello" ]; then
  measure "http_hello GET /, keep-alive (ab -k -c 1)" "$N" http_hello \
    "ab -q -k -n $N -c 1 http://127.0.0.1:{PORT}/"
  measure "http_hello GET /, new connection per request (ab -c 1)" "$N" http_hello \
    "ab -q -n $N -c 1 http://127.0.0.1:{PORT}/"
  measure "http_hello GET /, keep-alive, 2 clients on 2 workers, none idle (ab -k -c 2)" "$N" http_hello \
    "ab -q -k -n $N -c 2 http://127.0.0.1:{PORT}/"
  measure "http_hello GET /, new connection per request, 2 clients on 2 workers (ab -c 2)" "$N" http_hello \
    "ab -q -n $N -c 2 http://127.0.0.1:{PORT}/"
fi
if [ -x target/release/appsrv-bench ] || cargo build --release --quiet -p appsrv-bench 2>/dev/null; then
  measure "hello (greet and close), appsrv-bench --reconnect -c 1" "$N" hello \
    "target/release/appsrv-bench 127.0.0.1:{PORT} --reconnect -c 1 -n $N"
  measure "echo lines, keep-alive (appsrv-bench -c 1)" "$N" echo \
    "target/release/appsrv-bench 127.0.0.1:{PORT} -c 1 -n $N --request 'ping\\n' --until '\\n'"
fi
