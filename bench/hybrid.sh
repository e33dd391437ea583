#!/usr/bin/env bash
# Hybrid mode (issue 21) against the blocking and event models and the peers a user would
# pick instead, in one run: every figure of a part comes from the same run, peers beside
# appsrv (runs vary by 20 % and more: compare within a run only).
#
#   bench/hybrid.sh                 all parts (about 6 minutes)
#   PARTS="http redis" bench/hybrid.sh
#   EX=/tmp/old/release/examples bench/hybrid.sh    another build's examples
#
# Parts (PARTS, default "slowloris redis http sleep cost"):
#   slowloris  http_hello -w 4, blocking and hybrid: a normal client on 127.0.0.1 makes
#              REQS (200) requests, each on a new connection, first alone, then while 300
#              connections from 127.0.0.2 send half a request head and stop (slowloris)
#              and 300 from 127.0.0.3 make one keep-alive request and stay idle; each
#              request waits at most 10 s, a phase at most 60 s (requests not made then
#              count as not served). Prints served/REQS, p50 and p99 of both phases.
#   redis      redis-benchmark with its defaults (50 clients, 100,000 requests; PING_INLINE
#              and PING_MBULK, the commands `ping` serves) against redis-server and
#              `ping -w 2` in hybrid, event and blocking mode (blocking: 2,000 requests,
#              it serves 2 clients at a time).
#   http       wrk -t2 -d5s, 13-byte "Hello, World!" keep-alive at c = 8, 32, 128, 256:
#              http_hello --io hybrid -w 8, --io blocking -w 256, --io event -w 2, and
#              nginx (worker_processes 2).
#   sleep      GET /sleep?ms=5 (a handler that blocks 5 ms: a database stand-in), c = 256
#              keep-alive, wrk -d10s --timeout 5s: http_hello -w 32 hybrid and blocking.
#              The bound is 32 workers x 200/s = 6,400 requests/s.
#   cost       the cost of a hand-off: CPU µs (all the server's processes) and system
#              calls (strace -c -f) per request, blocking and hybrid -w 2, for (a) one
#              keep-alive client (the worker keeps the connection), (b) a new connection
#              per request (one hand-off each), (c) one keep-alive client that pauses
#              150 ms between requests (a hand-off and a hand-back each; the figures
#              include the master's periodic look at its workers, 4 a second).
#
# Results: bench/results/hybrid.csv (part,server,case,metric,value), and the tables printed.
# Needs wrk, redis-benchmark, redis-server, nginx, strace, python3.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
PARTS=${PARTS:-slowloris redis http sleep cost}
EX=${EX:-target/release/examples}
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
REQS=${REQS:-200}
OUT=bench/results/hybrid.csv
if [ "$EX" = target/release/examples ]; then
  cargo build --release --quiet --example http_hello --example ping
fi
for tool in wrk redis-benchmark redis-server strace python3; do
  command -v "$tool" >/dev/null || { echo "hybrid.sh: $tool is missing" >&2; exit 1; }
done
[ -x "$NGINX" ] || { echo "hybrid.sh: nginx is missing" >&2; exit 1; }
ulimit -n 65536 2>/dev/null || true
work=$(mktemp -d)
master=""
stop_server() {
  if [ -n "$master" ]; then
    kill "$master" 2>/dev/null || true
    wait "$master" 2>/dev/null || true
    master=""
  fi
}
trap 'stop_server; rm -rf "$work"' EXIT
echo "part,server,case,metric,value" >"$OUT"
record() { echo "$1,$2,$3,$4,$5" >>"$OUT"; }

# start EXAMPLE ARGS...: starts an appsrv example on a free port; sets master and PORT.
start() {
  local ex=$1
  shift
  "$EX/$ex" -l 127.0.0.1:0 "$@" >"$work/server.log" 2>&1 &
  master=$!
  PORT=$(ready_port "$work/server.log" 30)
  [ -n "$PORT" ] || { echo "hybrid.sh: $ex $* did not start:" >&2; cat "$work/server.log" >&2; exit 1; }
}

# start_nginx: nginx serving / on a free port; sets master and PORT.
start_nginx() {
  PORT=$(free_port)
  nginx_conf "$work/nginx" "$PORT" "$work" 5 10000 65536
  "$NGINX" -c "$work/nginx/nginx.conf" &
  master=$!
  for _ in $(seq 100); do
    curl -s -o /dev/null "http://127.0.0.1:$PORT/" && break
    sleep 0.05
  done
}

# wrk_run LABEL CASE C DURATION PATH [wrk args]: one wrk run against PORT, recorded.
wrk_run() {
  local label=$1 case=$2 c=$3 d=$4 path=$5
  shift 5
  local out
  out=$(wrk -t2 -c"$c" -d"$d" --latency "$@" "http://127.0.0.1:$PORT$path")
  local rps p99 max errors
  rps=$(awk '/Requests\/sec/ { print $2 }' <<<"$out")
  p99=$(awk '$1 == "99%" { print $2 }' <<<"$out")
  max=$(awk '$1 == "Latency" { print $4 }' <<<"$out")
  errors=$(awk '/Socket errors/ { gsub(",", ""); s = $4 + $6 + $8 + $10 } /Non-2xx/ { s += $5 } END { print s + 0 }' <<<"$out")
  record "$PART" "$label" "$case" requests_per_second "$rps"
  record "$PART" "$label" "$case" p99 "$p99"
  record "$PART" "$label" "$case" max_latency "$max"
  record "$PART" "$label" "$case" errors "$errors"
  printf '  %-28s %-8s %10s req/s  p99 %8s  max %8s  errors %s\n' "$label" "$case" "$rps" "$p99" "$max" "$errors"
}

part_slowloris() {
  echo "== slowloris: 300 slow + 300 idle connections, http_hello -w 4; a normal client's $REQS requests"
  for io in blocking hybrid; do
    start http_hello --io "$io" -w 4
    python3 - "$PORT" "$REQS" "$io" >>"$work/slow.txt" <<'PY'
import select, socket, sys, time
port, n, io = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

def one():
    t = time.monotonic()
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=10)
        c.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            b = c.recv(4096)
            if not b:
                break
            data += b
        c.close()
        return time.monotonic() - t if data.startswith(b"HTTP/1.1 200") else None
    except OSError:
        return None

def phase(name, budget=60.0):
    # At most `budget` seconds: blocking workers held by the attack answer nobody, and
    # each request would wait its full 10 s (the ones not made count as not served).
    end = time.monotonic() + budget
    times = []
    for _ in range(n):
        if time.monotonic() > end:
            break
        times.append(one())
    ok = sorted(t for t in times if t is not None)
    p = lambda q: ok[min(len(ok) - 1, int(q * len(ok)))] * 1e3 if ok else float("nan")
    print(f"{io},{name},{len(ok)},{n},{p(0.5):.3f},{p(0.99):.3f}")
    return ok

phase("alone")
held = []
for _ in range(300):
    s = socket.socket()
    s.bind(("127.0.0.2", 0))
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: ")
    held.append(s)
idle = []
for _ in range(300):
    s = socket.socket()
    s.bind(("127.0.0.3", 0))
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    except OSError:
        pass
    idle.append(s)
# Read their answers for at most 5 s in all (blocking workers held by the slow ones answer
# none of them; waiting 2 s for each would take 10 minutes before the phase starts).
end = time.monotonic() + 5
pending = list(idle)
while pending and time.monotonic() < end:
    ready, _, _ = select.select(pending, [], [], max(0.0, end - time.monotonic()))
    for s in ready:
        try:
            s.recv(4096)
        except OSError:
            pass
        pending.remove(s)
phase("attacked")
PY
    stop_server
  done
  while IFS=, read -r io phase ok n p50 p99; do
    record slowloris "http_hello-$io" "$phase" served "$ok/$n"
    record slowloris "http_hello-$io" "$phase" p50_ms "$p50"
    record slowloris "http_hello-$io" "$phase" p99_ms "$p99"
    printf '  %-10s %-9s served %s/%s  p50 %8s ms  p99 %8s ms\n' "$io" "$phase" "$ok" "$n" "$p50" "$p99"
  done <"$work/slow.txt"
}

redis_run() {
  local label=$1 n=$2
  local out
  out=$(redis-benchmark -p "$PORT" -t ping_inline,ping_mbulk -n "$n" -q 2>/dev/null | tr '\r' '\n' | grep 'requests per second')
  while read -r test rps _; do
    test=${test%:}
    record redis "$label" "$test" requests_per_second "$rps"
    printf '  %-22s %-12s %10s req/s\n' "$label" "$test" "$rps"
  done <<<"$out"
}

part_redis() {
  echo "== redis-benchmark defaults (50 clients)"
  PORT=$(free_port)
  redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >/dev/null 2>&1 &
  master=$!
  for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
  redis_run redis-server 100000
  stop_server
  for io in hybrid event; do
    start ping --io "$io" -w 2
    redis_run "ping-$io-w2" 100000
    stop_server
  done
  start ping --io blocking -w 2
  redis_run "ping-blocking-w2" 2000
  stop_server
}

part_http() {
  echo "== HTTP 13 B keep-alive, wrk -t2 -d5s"
  for c in 8 32 128 256; do
    start http_hello --io hybrid -w 8
    wrk_run http_hello-hybrid-w8 "c$c" "$c" 5s /
    stop_server
    start http_hello --io blocking -w 256
    wrk_run http_hello-blocking-w256 "c$c" "$c" 5s /
    stop_server
    start http_hello --io event -w 2
    wrk_run http_hello-event-w2 "c$c" "$c" 5s /
    stop_server
    start_nginx
    wrk_run nginx "c$c" "$c" 5s /
    stop_server
  done
}

part_sleep() {
  echo "== GET /sleep?ms=5, c = 256 keep-alive, 32 workers (bound: 6,400 req/s)"
  for io in hybrid blocking; do
    start http_hello --io "$io" -w 32
    wrk_run "http_hello-$io-w32" c256 256 10s "/sleep?ms=5" --timeout 5s
    stop_server
  done
}

# cost_case LABEL CASE REQUESTS CLIENT...: CPU µs and system calls per request of the
# server (master and children) while CLIENT makes REQUESTS requests.
cost_case() {
  local label=$1 case=$2 n=$3
  shift 3
  local pids args=() before after
  pids=$(server_pids "$master")
  for p in $pids; do args+=(-p "$p"); done
  before=$(proc_counters "$master")
  "$@" >/dev/null
  after=$(proc_counters "$master")
  local cpu
  cpu=$(per_request "$before" "$after" "$n" | cut -d' ' -f1)
  strace -f -c -o "$work/strace.txt" "${args[@]}" 2>/dev/null &
  local st=$!
  sleep 0.5
  "$@" >/dev/null
  kill -INT "$st" 2>/dev/null || true
  wait "$st" 2>/dev/null || true
  local calls
  calls=$(awk '$NF == "total" { print $(NF-2) }' "$work/strace.txt")
  local per
  per=$(awk -v c="$calls" -v n="$n" 'BEGIN { printf "%.2f", c / n }')
  record cost "$label" "$case" cpu_us_per_request "$cpu"
  record cost "$label" "$case" syscalls_per_request "$per"
  printf '  %-22s %-12s %8s µs/request  %6s system calls/request\n' "$label" "$case" "$cpu" "$per"
}

part_cost() {
  echo "== the cost of a hand-off (http_hello -w 2; a fresh server for each case)"
  local paused='
import socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
for _ in range(40):
    c.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    data = b""
    while not data.endswith(b"Hello, World!"):
        data += c.recv(4096)
    time.sleep(0.15)
'
  for io in blocking hybrid; do
    start http_hello --io "$io" -w 2
    cost_case "http_hello-$io" keepalive 20000 ab -q -k -c 1 -n 20000 "http://127.0.0.1:$PORT/"
    stop_server
    start http_hello --io "$io" -w 2
    cost_case "http_hello-$io" new-conn 5000 ab -q -c 1 -n 5000 "http://127.0.0.1:$PORT/"
    stop_server
    start http_hello --io "$io" -w 2
    cost_case "http_hello-$io" paused 40 python3 -c "$paused" "$PORT"
    stop_server
  done
}

for PART in $PARTS; do
  case $PART in
    slowloris | redis | http | sleep | cost) "part_$PART" ;;
    *) echo "hybrid.sh: unknown part '$PART'" >&2; exit 1 ;;
  esac
done
echo "results: $OUT"
