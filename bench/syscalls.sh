#!/usr/bin/env bash
# Syscalls per request of appsrv's examples, counted with `strace -c` on all the workers.
#
# Part 1 (C1=0 skips it): a server started with -w 2 (so that one worker is idle, as in a
# pool that is not saturated), over a fixed number of requests from one client; and, for
# the keep-alive guard, from two clients on two workers (no worker idle, nobody queued: the
# guard must cost nothing) and from one client on one worker with a second connection
# queued. ping and http_hello run with $APPSRV_BLOCKING_FLAGS (IO=event: with
# $APPSRV_EVENT_FLAGS instead, the same -w); hello and echo are handle_client servers,
# blocking only.
#
# Part 2 (C256=0 skips it), issue 16: keep-alive `GET /` at c=256 (ab -k -c 256 -n N256),
# appsrv in each of APPSRV_IO's models beside nginx (worker_processes 2): first WARMUP
# seconds of the same load, unmeasured (a dynamic pool grows to 256 workers); then a run
# without strace, from which requests/s, the server's CPU time per request and its context
# switches per request (all processes and threads, from /proc: bench/lib.sh proc_counters;
# strace would inflate both); then the same run under `strace -c -f` attached to every
# worker, for the syscalls per request. Servers:
#   appsrv blocking   http_hello $APPSRV_BLOCKING_FLAGS --pool dynamic --start-workers 8
#                     --min-spare 8 --max-spare 32 --max-workers 288 (as bench/compare.sh:
#                     each keep-alive client holds a worker)
#   appsrv event      http_hello $APPSRV_EVENT_FLAGS -w W for each W of APPSRV_WORKERS
#   nginx             worker_processes 2, worker_connections 1024, keepalive_timeout 5s,
#                     keepalive_requests 1000, `return 200 'Hello, World!'` (bench/lib.sh)
# nginx's keepalive_requests 1000 and appsrv's default of 1000 requests per connection
# both close a connection after its 1000th request and ab reconnects: an accept and a
# close per 1000 requests are in the counts (about 0.002 syscalls per request).
#
#   bench/syscalls.sh                    both parts, all the workloads whose client tools are installed
#   C1=0 bench/syscalls.sh               part 2 only
#   IO=event C256=0 bench/syscalls.sh    part 1 in event mode
#
#   setting              default            meaning
#   N                    20000              requests per row of part 1
#   N256                 50000              requests per run of part 2
#   WARMUP               3                  seconds of unmeasured load before part 2's runs
#   APPSRV_IO            "blocking event"   part 2's appsrv models
#   APPSRV_WORKERS       "2"                part 2's event pool sizes (-w)
#   APPSRV_EVENT_FLAGS   "--io event"       what selects event mode
#   APPSRV_BLOCKING_FLAGS "--io blocking"   (when the examples know --io, else "")
#   NGINX                (nginx in PATH)    set NGINX= to skip nginx
#
# Needs: strace; redis-benchmark (redis-tools) for ping; ab (apache2-utils) for http_hello
# and part 2; nginx for part 2's peer; cargo builds the release examples first. Prints
# markdown tables. Loopback only; every server is stopped at the end of its row (and at
# exit, by a trap); every load is bounded by its count and a timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
N=${N:-20000} N256=${N256:-50000} WARMUP=${WARMUP:-3}
APPSRV_IO=${APPSRV_IO:-blocking event} APPSRV_WORKERS=${APPSRV_WORKERS:-2}
APPSRV_EVENT_FLAGS=${APPSRV_EVENT_FLAGS---io event}
NGINX=${NGINX-$(command -v nginx || echo /usr/sbin/nginx)}
for v in N N256 WARMUP; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "syscalls.sh: $v must be a number, not '${!v}'" >&2; exit 1; }
done
cargo build --release --quiet -p appsrv -p appsrv-examples --examples
EX=target/release/examples
if "$EX/http_hello" --help 2>/dev/null | grep -q -- '--io '; then
  APPSRV_BLOCKING_FLAGS=${APPSRV_BLOCKING_FLAGS---io blocking}
  HAS_IO=1
else
  APPSRV_BLOCKING_FLAGS=${APPSRV_BLOCKING_FLAGS-} HAS_IO=""
fi
case ${IO:-blocking} in
  blocking) IO_FLAGS=$APPSRV_BLOCKING_FLAGS ;;
  event) IO_FLAGS=$APPSRV_EVENT_FLAGS ;;
  *) echo "syscalls.sh: IO must be blocking or event, not '$IO'" >&2; exit 1 ;;
esac
work=$(mktemp -d)
chmod 755 "$work"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# start EXAMPLE WORKERS [FLAGS...] → prints "MASTER_PID PORT"
start() {
  local ex=$1 workers=$2 log
  shift 2
  # A log of its own: the previous server may still be writing its last lines to its own.
  log=$(mktemp "$work/$ex.XXXXXX.log")
  "$EX/$ex" -l 127.0.0.1:0 -w "$workers" "$@" 2>"$log" &
  local pid=$!
  local port
  port=$(ready_port "$log")
  echo "$pid $port"
}

# strace_total FILE REQUESTS → "TOTAL|PER-CALL" from an `strace -c` table.
strace_total() {
  local per total
  # strace -c table: calls are column 4 (5 when usecs/call is empty); skip header and total lines.
  per=$(awk -v n="$2" '
    $1 ~ /^[0-9.]+$/ && $NF != "total" { calls[$NF] += ($4 ~ /^[0-9]+$/ ? $4 : $5) }
    END { for (s in calls) if (calls[s] / n >= 0.01) printf "%s %.2f\n", s, calls[s] / n }' "$1" \
    | sort -k2,2nr -k1,1 | awk '{ printf "%s%s %s", (NR > 1 ? ", " : ""), $1, $2 }')
  # The total line has the same columns (calls is the 4th; an errors column may follow).
  total=$(awk -v n="$2" '$NF == "total" { c = $4 } END { printf "%.2f", c / n }' "$1")
  echo "$total|$per"
}

# measure NAME REQUESTS EXAMPLE CLIENT-COMMAND (with {PORT}) [WORKERS [FLAGS...]]
measure() {
  local name=$1 requests=$2 ex=$3 client=$4 workers=${5:-2}
  shift 4
  [ $# -gt 0 ] && shift
  read -r master port < <(start "$ex" "$workers" "$@")
  local traced=()
  for w in $(pgrep -P "$master"); do traced+=(-p "$w"); done
  strace -c -f -q -o "$work/strace.txt" "${traced[@]}" &
  local tracer=$!
  sleep 0.5 # let strace attach before the load starts
  eval "timeout 300 ${client//\{PORT\}/$port}" >/dev/null 2>&1 || echo "syscalls.sh: $name: the client failed or timed out" >&2
  kill -INT "$tracer"; wait "$tracer" 2>/dev/null || true
  # Not a child of this shell (started in the process substitution): wait for it to go.
  kill -TERM "$master"
  while kill -0 "$master" 2>/dev/null; do sleep 0.05; done
  local r
  r=$(strace_total "$work/strace.txt" "$requests")
  echo "| $name | $requests | ${r%%|*} | ${r#*|} |"
}

if [ "${C1:-1}" != 0 ]; then
  # shellcheck disable=SC2206 # the flags are words
  io=($IO_FLAGS)
  echo "Keep-alive and new connections from one or two clients, -w 2 (ping and http_hello: ${IO_FLAGS:-blocking: this build has no --io})"
  echo
  echo "| workload | requests | syscalls/request | per call (≥ 0.01/request) |"
  echo "|---|---|---|---|"
  if command -v redis-benchmark >/dev/null; then
    measure "ping, keep-alive (redis-benchmark -c 1)" "$N" ping \
      "redis-benchmark -p {PORT} -t ping_inline -n $N -c 1 -q" 2 "${io[@]}"
    measure "ping, new connection per request (-k 0)" "$N" ping \
      "redis-benchmark -p {PORT} -t ping_inline -n $N -c 1 -k 0 -q" 2 "${io[@]}"
    measure "ping, keep-alive, saturated pool (-w 1: no worker idle, nobody queued)" "$N" ping \
      "redis-benchmark -p {PORT} -t ping_inline -n $N -c 1 -q" 1 "${io[@]}"
  fi
  if command -v ab >/dev/null && [ -x "$EX/http_hello" ]; then
    measure "http_hello GET /, keep-alive (ab -k -c 1)" "$N" http_hello \
      "ab -q -k -n $N -c 1 http://127.0.0.1:{PORT}/" 2 "${io[@]}"
    measure "http_hello GET /, new connection per request (ab -c 1)" "$N" http_hello \
      "ab -q -n $N -c 1 http://127.0.0.1:{PORT}/" 2 "${io[@]}"
    measure "http_hello GET /, keep-alive, 2 clients on 2 workers, none idle (ab -k -c 2)" "$N" http_hello \
      "ab -q -k -n $N -c 2 http://127.0.0.1:{PORT}/" 2 "${io[@]}"
    measure "http_hello GET /, new connection per request, 2 clients on 2 workers (ab -c 2)" "$N" http_hello \
      "ab -q -n $N -c 2 http://127.0.0.1:{PORT}/" 2 "${io[@]}"
  fi
  if [ -x target/release/appsrv-bench ] || cargo build --release --quiet -p appsrv-bench 2>/dev/null; then
    measure "hello (greet and close), appsrv-bench --reconnect -c 1" "$N" hello \
      "target/release/appsrv-bench 127.0.0.1:{PORT} --reconnect -c 1 -n $N"
    measure "echo lines, keep-alive (appsrv-bench -c 1)" "$N" echo \
      "target/release/appsrv-bench 127.0.0.1:{PORT} -c 1 -n $N --request 'ping\\n' --until '\\n'"
  fi
fi

# ---------------------------------------------------------------------------------------
# Part 2: keep-alive at c=256, appsrv's models beside nginx.
SERVER=""
stop_server() {
  [ -n "$SERVER" ] || return 0
  kill -TERM "$SERVER" 2>/dev/null || true
  wait "$SERVER" 2>/dev/null || true
  SERVER=""
}

# start256 ID: sets SERVER (the master's pid, a job of this shell) and PORT.
start256() {
  local log=$work/$1.log
  case $1 in
    nginx)
      PORT=$(free_port)
      nginx_conf "$work/nginx" "$PORT" "$work" 5 1024
      "$NGINX" -t -q -p "$work/nginx" -e "$work/nginx/error.log" -c "$work/nginx/nginx.conf" \
        || { echo "syscalls.sh: bad nginx configuration" >&2; exit 1; }
      "$NGINX" -p "$work/nginx" -e "$work/nginx/error.log" -c "$work/nginx/nginx.conf" &
      SERVER=$!
      ;;
    appsrv-blocking)
      # shellcheck disable=SC2086
      "$EX/http_hello" -l 127.0.0.1:0 $APPSRV_BLOCKING_FLAGS --pool dynamic --start-workers 8 \
        --min-spare 8 --max-spare 32 --max-workers 288 2>"$log" &
      SERVER=$! PORT=$(ready_port "$log")
      ;;
    appsrv-event-w*)
      # shellcheck disable=SC2086
      "$EX/http_hello" -l 127.0.0.1:0 $APPSRV_EVENT_FLAGS -w "${1#appsrv-event-w}" 2>"$log" &
      SERVER=$! PORT=$(ready_port "$log")
      ;;
  esac
  for _ in $(seq 100); do
    [ -n "$PORT" ] && curl_ok "$PORT" && return 0
    sleep 0.1
  done
  echo "syscalls.sh: $1 does not answer GET / with Hello, World!" >&2
  tail -20 "$log" "$work/nginx/error.log" 2>/dev/null >&2 || true
  exit 1
}

# curl_ok PORT: GET / answers exactly `Hello, World!`.
curl_ok() {
  python3 - "$1" <<'EOF'
import sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    with opener.open("http://127.0.0.1:%s/" % sys.argv[1], timeout=2) as r:
        sys.exit(0 if r.status == 200 and r.read() == b"Hello, World!" else 1)
except OSError:
    sys.exit(1)
EOF
}

name256() {
  case $1 in
    nginx) echo "nginx (worker_processes 2)" ;;
    appsrv-blocking) echo "http_hello${APPSRV_BLOCKING_FLAGS:+ $APPSRV_BLOCKING_FLAGS} (dynamic pool, up to 288)" ;;
    appsrv-event-w*) echo "http_hello ${APPSRV_EVENT_FLAGS:-(no event flags)} -w ${1#appsrv-event-w}" ;;
  esac
}

# ab256 PORT: one bounded keep-alive run at c=256; prints ab's output.
ab256() {
  timeout 300 ab -q -r -s 10 -k -c 256 -n "$N256" "http://127.0.0.1:$1/" 2>&1 || true
}

row256() {
  local id=$1 out before after rps failed cost tracer r traced=() w
  start256 "$id"
  [ "$WARMUP" -gt 0 ] && timeout $((WARMUP + 30)) ab -q -r -s 10 -k -c 256 -t "$WARMUP" -n 100000000 \
    "http://127.0.0.1:$PORT/" >/dev/null 2>&1 || true
  # Untraced: requests/s, CPU and context switches.
  before=$(proc_counters "$SERVER")
  out=$(ab256 "$PORT")
  cost=$(per_request "$before" "$(proc_counters "$SERVER")" "$N256")
  rps=$(awk '/^Requests per second/ { printf "%.0f", $4 }' <<<"$out")
  failed=$(awk '/^Failed requests/ { f += $3 } /^Non-2xx responses/ { f += $3 } END { print f + 0 }' <<<"$out")
  [ -n "$rps" ] || { echo "syscalls.sh: $id: ab did not finish: $(tail -1 <<<"$out")" >&2; rps=-; }
  # Traced: every worker (the pool has grown: strace follows the forks of the processes it
  # traces, not the master's new children).
  for w in $(pgrep -P "$SERVER"); do traced+=(-p "$w"); done
  strace -c -f -q -o "$work/strace256.txt" "${traced[@]}" &
  tracer=$!
  sleep 1 # let strace attach to every worker before the load starts
  out=$(ab256 "$PORT")
  grep -q '^Requests per second' <<<"$out" || echo "syscalls.sh: $id: ab under strace did not finish: $(tail -1 <<<"$out")" >&2
  failed=$((failed + $(awk '/^Failed requests/ { f += $3 } /^Non-2xx responses/ { f += $3 } END { print f + 0 }' <<<"$out")))
  kill -INT "$tracer" 2>/dev/null || true
  wait "$tracer" 2>/dev/null || true
  stop_server
  r=$(strace_total "$work/strace256.txt" "$N256")
  local cpu csw exited
  read -r cpu csw exited <<<"$cost"
  [ "$exited" = 0 ] || csw="≥ $csw ($exited exited)"
  echo "| $(name256 "$id") | $N256 | $((${#traced[@]} / 2)) | $rps | $cpu | $csw | ${r%%|*} | $failed | ${r#*|} |"
}

if [ "${C256:-1}" != 0 ]; then
  command -v ab >/dev/null || { echo "syscalls.sh: part 2 needs ab (apt-get install -y apache2-utils)" >&2; exit 1; }
  printf 'Hello, World!' >"$work/hello.txt"
  ids=()
  for m in $APPSRV_IO; do
    case $m in
      blocking) ids+=(appsrv-blocking) ;;
      event)
        [ -n "$HAS_IO" ] || [ -z "$APPSRV_EVENT_FLAGS" ] || {
          echo "syscalls.sh: $EX/http_hello has no --io (no event mode in this build): APPSRV_IO=blocking" >&2
          exit 1
        }
        for w in $APPSRV_WORKERS; do ids+=("appsrv-event-w$w"); done ;;
      *) echo "syscalls.sh: APPSRV_IO: unknown model '$m'" >&2; exit 1 ;;
    esac
  done
  [ -n "$NGINX" ] && [ -x "$NGINX" ] && ids+=(nginx)
  echo
  echo "Keep-alive GET / at c=256 (ab -k -c 256 -n $N256, after ${WARMUP} s of the same load): requests/s, CPU and context switches per request without strace (all the server's processes), then syscalls per request under strace -c -f on every worker"
  echo
  echo "| server | requests | workers traced | requests/s | CPU µs/request | context switches/request | syscalls/request | failed | per call (≥ 0.01/request) |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for id in "${ids[@]}"; do row256 "$id"; done
fi
