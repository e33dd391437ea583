#!/usr/bin/env bash
# Is appsrv-bench the bottleneck? The same appsrv server loaded in turn by appsrv-bench and
# by an established load generator, at the same concurrency: requests/s side by side, and
# the CPU time each load generator (and the server) spent per request.
#
#   bench/loadgen-vs.sh        (RUNS=3 DURATION=3 N=100000 CONCURRENCY="8 32" WORKERS=32)
#   RUNS=1 DURATION=1 N=20000 bench/loadgen-vs.sh     (a quick check that everything runs)
#
# Needs wrk and redis-benchmark (it installs nothing): apt-get install -y wrk redis-tools
#
# Two workloads, on loopback (127.0.0.1, a port the kernel picks), keep-alive:
#   HTTP  the http_hello example (release build, -w WORKERS): `GET /`, 13-byte answer.
#         appsrv-bench --http / -c C -d DURATION   against   wrk -t WRK_THREADS -c C -d DURATION
#         (both send the same request, `GET / HTTP/1.1` and a Host header; the server's
#         defaults apply to both: keep-alive, 1000 requests per connection, then
#         `Connection: close` and a new connection).
#   PING  the ping example (release build, -w WORKERS): inline `PING\r\n`, `+PONG\r\n`.
#         appsrv-bench --request 'PING\r\n' --until '\r\n' -c C -n N   against
#         redis-benchmark -t ping_inline -k 1 -c C -n N   (redis-benchmark counts requests,
#         not seconds, so both make N).
# For each workload, concurrency and tool: RUNS runs (the tools alternate run by run, so that
# the VM's noise falls on both), after one unmeasured warm-up with each at the highest
# concurrency (WARMUP seconds, default 2; for PING, N/10 requests). A row gives, over the
# runs:
#   requests/s        the median and each run, each tool's own figure (wrk's Requests/sec,
#                     redis-benchmark's "requests per second", appsrv-bench's
#                     requests_per_s);
#   its CPU           the load generator's CPU time per request it completed, user + system
#                     (from /usr/bin/time; 10 ms resolution), median;
#   server CPU        the server's (utime + stime of the master and its workers from
#                     /proc/PID/stat, before and after the run) per request the tool
#                     completed, median;
#   served / counted  requests the server served in the run (appsrv_requests_total from
#                     its `metrics`, through a private control socket) over the tool's
#                     count, median: a check that the tools count what the server does
#                     (a -d run ends with up to c requests in flight, answered but not
#                     counted);
#   errors            summed: appsrv-bench's errors_total; wrk's socket errors and non-2xx
#                     responses; redis-benchmark reports none.
#
# Client and server share the machine's CPUs: the load generator's CPU per request is the
# figure that says whether it is the bottleneck (what it takes from the server), more than
# its requests/s. wrk runs WRK_THREADS threads (default 2, the CPUs of the test VM) on
# epoll; redis-benchmark runs one thread on epoll; appsrv-bench runs one blocking thread
# per connection. On loopback the receiver's TCP processing (and its wake-up) runs in the
# sender's system call, so system time is shared between client and server by who sends
# what; user time is each tool's own work.
#
# Every server started here (with a control socket in a temporary directory, for its
# request count) is stopped at exit (a trap), also on error or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3} DURATION=${DURATION:-3} N=${N:-100000} WORKERS=${WORKERS:-32}
CONCURRENCY=${CONCURRENCY:-8 32} WRK_THREADS=${WRK_THREADS:-2} WARMUP=${WARMUP:-2}

missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v redis-benchmark >/dev/null || missing+=(redis-tools)
[ -x /usr/bin/time ] || missing+=(time)
if [ ${#missing[@]} -gt 0 ]; then
  echo "loadgen-vs.sh: missing ${missing[*]}; install with: apt-get install -y ${missing[*]}" >&2
  exit 1
fi
[[ $CONCURRENCY =~ ^\ *[1-9][0-9]*(\ +[1-9][0-9]*)*\ *$ ]] \
  || { echo "loadgen-vs.sh: CONCURRENCY must be numbers separated by spaces" >&2; exit 1; }
for v in RUNS DURATION N WORKERS WRK_THREADS WARMUP; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "loadgen-vs.sh: $v must be a whole number" >&2; exit 1; }
done

cargo build --release --quiet --example http_hello --example ping
cargo build --release --quiet -p appsrv-bench
BIN=${CARGO_TARGET_DIR:-target}/release
EX=$BIN/examples
BENCH=$BIN/appsrv-bench
TICK=$(getconf CLK_TCK)
work=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start EXAMPLE: sets SERVER (the master's pid) and PORT. Not in a subshell: the EXIT trap
# would run there.
start() {
  CTL=$work/$1.sock EXAMPLE=$1
  "$EX/$1" -l 127.0.0.1:0 -w "$WORKERS" --control "$CTL" 2>"$work/$1.log" &
  SERVER=$!
  PIDS+=("$SERVER")
  for _ in $(seq 200); do grep -q " ready" "$work/$1.log" 2>/dev/null && break; sleep 0.05; done
  PORT=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$work/$1.log" | head -1 | cut -d: -f2)
  [ -n "$PORT" ] || { echo "loadgen-vs.sh: $1 did not start:" >&2; cat "$work/$1.log" >&2; exit 1; }
}

stop() {
  kill "$SERVER"
  wait "$SERVER" 2>/dev/null || true
  PIDS=()
}

# CPU ticks (utime + stime) of the server's master and its workers.
server_ticks() {
  local files=("/proc/$SERVER/stat")
  local p
  for p in $(pgrep -P "$SERVER"); do files+=("/proc/$p/stat"); done
  { cat "${files[@]}" 2>/dev/null || true; } | awk '{ s += $14 + $15 } END { print s + 0 }'
}

label() { case $1 in appsrv-bench-*) echo appsrv-bench ;; *) echo "$1" ;; esac; }

# Requests the server has served (its `metrics`, through the control socket).
server_requests() {
  "$EX/$EXAMPLE" metrics --control "$CTL" | awk '$1 == "appsrv_requests_total" { print $2 }'
}

median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

# measure TOOL C: runs the tool once under /usr/bin/time; prints "rps requests errors
# user_s sys_s server_cpu_s server_requests".
measure() {
  local tool=$1 c=$2 out=$work/out t0 t1 n0 n1 rps reqs errs
  n0=$(server_requests)
  t0=$(server_ticks)
  case $tool in
    appsrv-bench-http)
      /usr/bin/time -f '%U %S' -o "$work/time" \
        "$BENCH" "127.0.0.1:$PORT" --http / -c "$c" -d "$DURATION" --json >"$out" 2>"$work/err"
      rps=$(jq .requests_per_s "$out") reqs=$(jq .requests "$out") errs=$(jq .errors_total "$out") ;;
    wrk)
      /usr/bin/time -f '%U %S' -o "$work/time" \
        wrk -t "$WRK_THREADS" -c "$c" -d "${DURATION}s" "http://127.0.0.1:$PORT/" >"$out" 2>"$work/err"
      rps=$(awk '/^Requests\/sec:/ { print $2 }' "$out")
      reqs=$(awk '/requests in/ { print $1 }' "$out")
      errs=$(awk '/Socket errors:/ { gsub(",", ""); e += $4 + $6 + $8 + $10 }
                  /Non-2xx or 3xx/ { e += $5 } END { print e + 0 }' "$out") ;;
    appsrv-bench-ping)
      /usr/bin/time -f '%U %S' -o "$work/time" \
        "$BENCH" "127.0.0.1:$PORT" --request 'PING\r\n' --until '\r\n' -c "$c" -n "$N" --json \
        >"$out" 2>"$work/err"
      rps=$(jq .requests_per_s "$out") reqs=$(jq .requests "$out") errs=$(jq .errors_total "$out") ;;
    redis-benchmark)
      /usr/bin/time -f '%U %S' -o "$work/time" \
        redis-benchmark -h 127.0.0.1 -p "$PORT" -t ping_inline -n "$N" -c "$c" -k 1 -q >"$out" 2>"$work/err"
      rps=$(tr '\r' '\n' <"$out" | grep -o 'PING_INLINE: [0-9.]*' | tail -1 | cut -d' ' -f2)
      reqs=$N errs=0 ;;
  esac
  t1=$(server_ticks)
  n1=$(server_requests)
  if [ -z "$rps" ] || [ -z "$reqs" ] || [ "$reqs" = 0 ]; then
    echo "loadgen-vs.sh: $tool -c $c gave no result:" >&2
    cat "$out" "$work/err" >&2
    exit 1
  fi
  awk -v rps="$rps" -v reqs="$reqs" -v errs="$errs" -v t0="$t0" -v t1="$t1" -v tick="$TICK" \
    -v served=$((n1 - n0)) \
    '{ printf "%s %s %s %.2f %.2f %.2f %d\n", rps, reqs, errs, $1, $2, (t1 - t0) / tick, served }' \
    "$work/time"
}

# warm_up TOOL: one unmeasured run of WARMUP seconds (or N/10 requests) at the highest
# concurrency.
warm_up() {
  local c d=$DURATION n=$N
  c=$(tr ' ' '\n' <<<"$CONCURRENCY" | sort -n | tail -1)
  DURATION=$WARMUP N=$((N / 10 > 0 ? N / 10 : 1))
  [ "$WARMUP" = 0 ] || measure "$1" "$c" >/dev/null
  DURATION=$d N=$n
}

# compare WORKLOAD TOOL_A TOOL_B: the rows of one workload.
compare() {
  local workload=$1 a=$2 b=$3 c i tool
  warm_up "$a"
  warm_up "$b"
  for c in $CONCURRENCY; do
    : >"$work/$a" && : >"$work/$b"
    for i in $(seq "$RUNS"); do
      # Every other run starts with the other tool.
      local order="$a $b"
      [ $((i % 2)) = 1 ] || order="$b $a"
      for tool in $order; do
        measure "$tool" "$c" >>"$work/$tool"
      done
    done
    for tool in $a $b; do
      local rps_all rps usr sys srv served errs
      rps_all=$(awk '{ printf "%s%.0f", (NR > 1 ? ", " : ""), $1 }' "$work/$tool")
      rps=$(awk '{ print $1 }' "$work/$tool" | median)
      usr=$(awk '{ print $4 / $2 * 1e6 }' "$work/$tool" | median)
      sys=$(awk '{ print $5 / $2 * 1e6 }' "$work/$tool" | median)
      srv=$(awk '{ print $6 / $2 * 1e6 }' "$work/$tool" | median)
      served=$(awk '{ print $7 / $2 }' "$work/$tool" | median)
      errs=$(awk '{ e += $3 } END { print e + 0 }' "$work/$tool")
      printf '| %s | %s | %s | %.0f (%s) | %.2f + %.2f | %.2f | %.4f | %s |\n' "$workload" "$c" \
        "$(label "$tool")" "$rps" "$rps_all" "$usr" "$sys" "$srv" "$served" "$errs"
    done
  done
}

echo "RUNS=$RUNS DURATION=${DURATION}s N=$N WORKERS=$WORKERS WRK_THREADS=$WRK_THREADS, $(nproc) CPUs"
echo
echo "| workload | c | load generator | requests/s: median (runs) | its CPU µs/request (user + sys) | server CPU µs/request | served / counted | errors |"
echo "|---|---|---|---|---|---|---|---|"
start http_hello
compare "HTTP GET / (http_hello)" appsrv-bench-http wrk
stop
start ping
compare "inline PING (ping)" appsrv-bench-ping redis-benchmark
stop
