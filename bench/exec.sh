#!/usr/bin/env bash
# appsrv-exec (issue 35) on loopback, in two parts, with appsrv-bench as the client.
#
# 1. Connection mode against its peers: connections per second of a command per connection,
#    `/bin/echo hello` and a shell script (`echo "hello $TCPREMOTEIP"`), served by
#    appsrv-exec, tcpserver (ucspi-tcp) and xinetd (a service file in a temp dir, on a free
#    port, run in the foreground), at c = 1, 8, 32. The client opens a connection per
#    request, sends nothing and reads to the end (`appsrv-bench --reconnect`). Beside each:
#    the PSS and number of processes of the server (master and every descendant, commands
#    included) sampled in the middle of the first run.
# 2. Persistent mode against connection mode, with the same Python and PHP handlers
#    (crates/appsrv-exec/examples: upper.py / upper-persistent.py, hello.php /
#    persistent.php): persistent mode over keep-alive connections (a line, its answer),
#    connection mode a connection (and a command) per request; c = 8 and 32. Beside each:
#    the server's CPU time per request (every process of the tree, the reaped commands
#    included through their parents' cutime/cstime).
#
# appsrv-exec runs with one worker per concurrent client (-w c), as tcpserver and xinetd
# have one process per client. Each figure is the median of RUNS runs of DURATION seconds
# after a 1 s warm-up. Every command run is echoed; the rows are appended to
# bench/results/exec.csv.
#
#   bench/exec.sh                                 (RUNS=3 DURATION=5 CONCS="1 8 32")
#   RUNS=5 DURATION=10 bench/exec.sh
#
# Needs tcpserver and xinetd (apt-get install ucspi-tcp xinetd: for this benchmark only),
# python3 and php. Run as root (xinetd and tcpserver then run the commands as nobody, as
# appsrv-exec's workers do). Every server is stopped at the end, also on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
RUNS=${RUNS:-3} DURATION=${DURATION:-5} CONCS=${CONCS:-"1 8 32"} PCONCS=${PCONCS:-"8 32"}
for tool in tcpserver xinetd python3 php; do
  command -v "$tool" >/dev/null || { echo "exec.sh: $tool is missing (apt-get install ucspi-tcp xinetd php-cli)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "exec.sh: run as root" >&2; exit 1; }
target=${CARGO_TARGET_DIR:-target}
run() { echo "+ $*" >&2; "$@"; }
run cargo build --release --quiet -p appsrv-exec -p appsrv-bench
EXEC=$target/release/appsrv-exec BENCH=$target/release/appsrv-bench
examples=$(pwd)/crates/appsrv-exec/examples

work=$(mktemp -d)
chmod 755 "$work"
SERVER=""
stop_server() {
  if [ -n "$SERVER" ]; then
    kill "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
    SERVER=""
  fi
}
trap 'stop_server; rm -rf "$work"' EXIT
cat >"$work/hello.sh" <<'SH'
#!/bin/sh
echo "hello $TCPREMOTEIP"
SH
chmod 755 "$work/hello.sh"
nobody_uid=$(id -u nobody) nobody_gid=$(id -g nobody)

# tree_pids PID: PID and all its descendants, one a line.
tree_pids() {
  local c
  echo "$1"
  for c in $(pgrep -P "$1" || true); do tree_pids "$c"; done
}

# tree_pss PID: "KB COUNT" of PID's tree.
tree_pss() {
  local p kb=0 n=0 v
  for p in $(tree_pids "$1"); do
    v=$(awk '/^Pss:/ { print $2 }' "/proc/$p/smaps_rollup" 2>/dev/null) || continue
    [ -n "$v" ] || continue
    kb=$((kb + v)) n=$((n + 1))
  done
  echo "$kb $n"
}

# tree_cpu_ns PID: CPU time of PID's tree in ns: each live thread's (schedstat), plus the
# children each process reaped (cutime + cstime, in clock ticks).
tree_cpu_ns() {
  local p files=()
  for p in $(tree_pids "$1"); do files+=("/proc/$p/stat" "/proc/$p"/task/*/schedstat); done
  { cat "${files[@]}" 2>/dev/null || true; } | awk -v hz="$LIB_HZ" '
    /^[0-9]+ \(/ { sub(/.*\) /, ""); split($0, f, " "); ticks += f[14] + f[15]; next }
    /^[0-9]+ [0-9]+ [0-9]+$/ { ns += $1 }
    END { printf "%.0f\n", ns + ticks * 1e9 / hz }'
}

# wait_port PORT: until something accepts on 127.0.0.1:PORT (10 s at most).
wait_port() {
  for _ in $(seq 200); do
    python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $1), 1).close()" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "nothing listens on $1" >&2
  return 1
}

# start_exec WORKERS ARGS...: appsrv-exec in the background; sets SERVER and PORT.
start_exec() {
  local w=$1
  shift
  : >"$work/exec.log"
  echo "+ $EXEC -l 127.0.0.1:0 -w $w --control $work/ctl.sock $*" >&2
  "$EXEC" -l 127.0.0.1:0 -w "$w" --control "$work/ctl.sock" "$@" 2>"$work/exec.log" &
  SERVER=$!
  PORT=$(ready_port "$work/exec.log" 30)
  [ -n "$PORT" ] || { cat "$work/exec.log" >&2; exit 1; }
}

# start_tcpserver CMD...: sets SERVER and PORT.
start_tcpserver() {
  PORT=$(free_port)
  echo "+ tcpserver -q -H -R -l 0 -c 1000 -u $nobody_uid -g $nobody_gid 127.0.0.1 $PORT $*" >&2
  tcpserver -q -H -R -l 0 -c 1000 -u "$nobody_uid" -g "$nobody_gid" 127.0.0.1 "$PORT" "$@" &
  SERVER=$!
  wait_port "$PORT"
}

# start_xinetd PROGRAM [ARG]: sets SERVER and PORT.
start_xinetd() {
  PORT=$(free_port)
  cat >"$work/xinetd.conf" <<CONF
defaults
{
    log_type       = FILE $work/xinetd.log
    log_on_success =
    log_on_failure =
}
service appsrv-exec-bench
{
    type           = UNLISTED
    port           = $PORT
    bind           = 127.0.0.1
    socket_type    = stream
    protocol       = tcp
    wait           = no
    user           = nobody
    server         = $1
    ${2:+server_args    = $2}
    instances      = UNLIMITED
    per_source     = UNLIMITED
    cps            = 1000000 1
    flags          = NOLIBWRAP
}
CONF
  echo "+ xinetd -dontfork -f $work/xinetd.conf -pidfile $work/xinetd.pid  ($(grep -E '^\s+(server|server_args|port) ' "$work/xinetd.conf" | xargs))" >&2
  xinetd -dontfork -f "$work/xinetd.conf" -pidfile "$work/xinetd.pid" &
  SERVER=$!
  wait_port "$PORT"
}

# measure ARGS...: RUNS runs of appsrv-bench against 127.0.0.1:$PORT; prints
# "MEDIAN_RPS RUNS_RPS ERRORS PSS_KB PROCESSES CPU_US_PER_REQUEST".
measure() {
  local i json rps all="" errors=0 sample="" served=0 before after
  before=$(tree_cpu_ns "$SERVER")
  for i in $(seq "$RUNS"); do
    echo "+ $BENCH 127.0.0.1:$PORT -d $DURATION --warmup 1 --json $*" >&2
    "$BENCH" "127.0.0.1:$PORT" -d "$DURATION" --warmup 1 --json "$@" >"$work/run.json" &
    local bench=$!
    if [ "$i" = 1 ]; then
      sleep "$(awk -v d="$DURATION" 'BEGIN { print 1 + d / 2 }')"
      sample=$(tree_pss "$SERVER")
    fi
    wait "$bench"
    json=$(cat "$work/run.json")
    rps=$(python3 -c 'import json,sys; print(round(json.loads(sys.argv[1])["requests_per_s"]))' "$json")
    errors=$((errors + $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["errors_total"])' "$json")))
    served=$((served + $(python3 -c 'import json,sys; j = json.loads(sys.argv[1]); print(j["requests"] + j["warmup_requests"])' "$json")))
    all="$all${all:+/}$rps"
  done
  after=$(tree_cpu_ns "$SERVER")
  local median cpu
  median=$(echo "$all" | tr / '\n' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
  cpu=$(awk -v a="$after" -v b="$before" -v n="$served" 'BEGIN { if (n > 0) printf "%.0f", (a - b) / 1e3 / n; else print "-" }')
  echo "$median $all $errors $sample $cpu"
}

csv=bench/results/exec.csv
mkdir -p bench/results
# Appended to, run after run (the header once): runs vary by 20 % and more, and the
# earlier runs are the record.
[ -s "$csv" ] || echo "part,server,command,mode,c,rps_median,rps_runs,errors,pss_kb,processes,cpu_us_per_request,date,machine" >"$csv"
machine="$(nproc) CPU $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo | tr -s ' ' | tr ',' ' ')"
row() {
  local part=$1 server=$2 command=$3 mode=$4 c=$5 m
  shift 5
  m=($(measure "$@"))
  echo "$part,$server,$command,$mode,$c,${m[0]},${m[1]},${m[2]},${m[3]},${m[4]},${m[5]},$(date -u +%F),$machine" | tee -a "$csv"
}

echo "== 1. a command per connection: appsrv-exec, tcpserver, xinetd" >&2
for c in $CONCS; do
  for cmd in echo script; do
    if [ "$cmd" = echo ]; then prog=(/bin/echo hello); else prog=("$work/hello.sh"); fi
    start_exec "$c" -- "${prog[@]}"
    row peers appsrv-exec "$cmd" connection "$c" -c "$c" --reconnect
    stop_server
    start_tcpserver "${prog[@]}"
    row peers tcpserver "$cmd" connection "$c" -c "$c" --reconnect
    stop_server
    start_xinetd "${prog[@]}"
    row peers xinetd "$cmd" connection "$c" -c "$c" --reconnect
    stop_server
  done
done

echo "== 2. persistent mode (keep-alive) against connection mode (a connection per request)" >&2
for c in $PCONCS; do
  start_exec "$c" --mode persistent -- "$examples/upper-persistent.py"
  row modes appsrv-exec python persistent "$c" -c "$c" --request 'hello\n' --until '\n'
  stop_server
  start_exec "$c" -- "$examples/upper.py"
  row modes appsrv-exec python connection "$c" -c "$c" --reconnect --request 'hello\n' --until 'HELLO\n'
  stop_server
  start_exec "$c" --mode persistent -- "$examples/persistent.php"
  row modes appsrv-exec php persistent "$c" -c "$c" --request 'hello\n' --until '\n'
  stop_server
  start_exec "$c" -- "$examples/hello.php"
  row modes appsrv-exec php connection "$c" -c "$c" --reconnect --request 'hello\n' --until '\n5\n'
  stop_server
done
echo "results: $csv" >&2
