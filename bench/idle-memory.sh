#!/usr/bin/env bash
# Memory of idle keep-alive connections (issue 16): the summed PSS of all of a server's
# processes (master + workers; /proc/PID/smaps_rollup) while N clients are connected, each
# answered once and then idle, beside the same server with no client; bytes per idle
# connection = (PSS with N - PSS with none) / N; and whether a new client is then served at
# once (its connect + request + response, timed by the client, with all N still held).
#
#   bench/idle-memory.sh                          256 and 10,000 clients, then the scenario
#   COUNTS=256 SCENARIO=0 bench/idle-memory.sh    any setting below can be overridden
#
#   setting          default            meaning
#   COUNTS           "256 10000"        the numbers of idle clients
#   SERVERS          "appsrv nginx"     HTTP servers (GET / answered `Hello, World!`)
#   APPSRV_IO        "blocking event"   the appsrv models measured (event: see below)
#   APPSRV_WORKERS   "2 1"              event mode: one row per worker count (-w N)
#   APPSRV_EVENT_FLAGS  "--io event"    what selects event mode on the command line
#   APPSRV_BLOCKING_FLAGS (detected)    "--io blocking" when the examples know --io, else ""
#   BLOCKING_MAX     1024               blocking mode holds a process per client: counts
#                                       above this are not run for it (said in the table)
#   BLOCKING_RATE    50                 blocking mode: the clients connect at most this many
#                                       a second (idle-clients --rate), the pace at which
#                                       the dynamic pool forks spare workers; faster, a
#                                       client finds every worker holding an idle client,
#                                       is queued, and http_hello announces the close
#   PING             1                  also ping (event rows, and blocking) beside Redis
#   SCENARIO         1                  issue 16's scenario: http_hello --io event -w 2
#                                       --keepalive-timeout 120 --rlimit-nofile 20000 with
#                                       SCENARIO_N (5000) clients
#   SETTLE           2                  seconds between "holding" and the measurement
#   EX               (build)            a directory of prebuilt release examples
#
# Servers (each started afresh for each count, so that "none" is its own baseline: started,
# one request answered, no client left):
#   appsrv blocking  http_hello (ping) $APPSRV_BLOCKING_FLAGS --pool dynamic --start-workers 8 --min-spare 8
#                    --max-spare 32 --max-workers N+64 --keepalive-timeout 120
#                    --rlimit-nofile 20000 (each idle keep-alive client holds a worker)
#   appsrv event     http_hello (ping) $APPSRV_EVENT_FLAGS -w W --keepalive-timeout 120
#                    --rlimit-nofile 20000 (its --worker-connections default, 10000, is
#                    enough: the clients share W workers)
#   nginx            worker_processes 2, worker_connections N+1024, worker_rlimit_nofile
#                    20000, keepalive_timeout 120s, GET / is `return 200 'Hello, World!'`
#   redis            one process, --maxclients N+1024, no persistence (its idle-client
#                    timeout is 0: never)
# The keep-alive timeouts are 120 s so that no held connection times out during the
# measurement; the "still open" column shows that none was closed. An event worker stops
# accepting at --worker-connections (10000 by default), so with -w 1 and 10,000 held
# clients the new client is not served: that is the limit working, not a failure to
# serve (raise it with APPSRV_EVENT_FLAGS='--io event --worker-connections 10100').
#
# The client is idle-clients (crates/appsrv-bench): one connection after another from 4
# threads, each sent `GET / HTTP/1.1` (or `PING`) and its response read, then all held
# idle; it prints "holding N", the script waits SETTLE seconds and measures, then closes
# the client's stdin, and the client checks that the held connections are still open and
# that one more client is served, and resets them all (RST: no TIME_WAIT left behind).
#
# Limits: the script raises its own soft RLIMIT_NOFILE to the hard limit (ulimit -n; the
# client needs N + a few descriptors, and the servers inherit it) and stops when that is
# below the largest count + 100. 10,000 client sockets from one source address (127.0.0.1)
# to one port need 10,000 ephemeral ports: the default range (net.ipv4.ip_local_port_range
# 32768-60999) gives 28,232, enough. Loopback only; every server is stopped before the
# next one starts and at exit (trap), and every wait is bounded.
#
# Needs: nginx, python3 (free ports), redis-server for the PING rows.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

COUNTS=${COUNTS:-256 10000}
SERVERS=${SERVERS:-appsrv nginx}
APPSRV_IO=${APPSRV_IO:-blocking event}
APPSRV_WORKERS=${APPSRV_WORKERS:-2 1}
APPSRV_EVENT_FLAGS=${APPSRV_EVENT_FLAGS---io event}
BLOCKING_MAX=${BLOCKING_MAX:-1024} BLOCKING_RATE=${BLOCKING_RATE:-50}
PING=${PING:-1} SCENARIO=${SCENARIO:-1} SCENARIO_N=${SCENARIO_N:-5000} SETTLE=${SETTLE:-2}
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}

for v in BLOCKING_MAX BLOCKING_RATE SCENARIO_N SETTLE; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "idle-memory.sh: $v must be a number, not '${!v}'" >&2; exit 1; }
done
for c in $COUNTS; do
  [[ $c =~ ^[1-9][0-9]*$ ]] || { echo "idle-memory.sh: COUNTS must be numbers, not '$COUNTS'" >&2; exit 1; }
done
[ -x "$NGINX" ] || { echo "idle-memory.sh: no nginx (apt-get install -y nginx)" >&2; exit 1; }

PREBUILT=${EX:+1}
if [ -z "${EX:-}" ]; then
  cargo build --release --quiet --example http_hello --example ping
  EX=${CARGO_TARGET_DIR:-target}/release/examples
fi
cargo build --release --quiet -p appsrv-bench --bin idle-clients
IDLE=${CARGO_TARGET_DIR:-target}/release/idle-clients

# The blocking rows must stay blocking once ping defaults to event mode; a build without
# --io is blocking only.
if "$EX/http_hello" --help 2>/dev/null | grep -q -- '--io '; then
  APPSRV_BLOCKING_FLAGS=${APPSRV_BLOCKING_FLAGS---io blocking}
else
  APPSRV_BLOCKING_FLAGS=${APPSRV_BLOCKING_FLAGS-}
  case " $APPSRV_IO " in
    *" event "*)
      [ -n "$APPSRV_EVENT_FLAGS" ] && {
        echo "idle-memory.sh: $EX/http_hello has no --io option (no event mode in this build):" >&2
        echo "  run with APPSRV_IO=blocking, or APPSRV_EVENT_FLAGS='' to try the event rows' settings in blocking mode" >&2
        exit 1
      } ;;
  esac
fi

max=0
for c in $COUNTS; do [ "$c" -gt "$max" ] && max=$c; done
[ "$SCENARIO" != 0 ] && [ "$SCENARIO_N" -gt "$max" ] && max=$SCENARIO_N
ulimit -n "$(ulimit -Hn)"
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt $((max + 100)) ]; then
  echo "idle-memory.sh: RLIMIT_NOFILE hard limit $(ulimit -Hn) is below $((max + 100)) (the largest count + 100)" >&2
  exit 1
fi
NOFILE=20000
[ $((max + 1024)) -gt $NOFILE ] && NOFILE=$((max + 1024))

work=$(mktemp -d)
chmod 755 "$work"
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -m 755 "$work/static"
printf 'Hello, World!' >"$work/static/hello.txt"
chmod 644 "$work/static/hello.txt"

HTTP_REQ='GET / HTTP/1.1\r\nHost: x\r\n\r\n'
PING_REQ='PING\r\n'

SERVER=""
# start ID N: starts server ID (see row_name) sized for N clients; sets SERVER and PORT.
start() {
  local id=$1 n=$2 log=$work/$1.$2.log ex flags
  case $id in
    nginx)
      PORT=$(free_port)
      nginx_conf "$work/nginx" "$PORT" "$work/static" 120 $((n + 1024)) "$NOFILE"
      "$NGINX" -t -q -p "$work/nginx" -e "$work/nginx/error.log" -c "$work/nginx/nginx.conf" \
        || { echo "idle-memory.sh: bad nginx configuration" >&2; exit 1; }
      "$NGINX" -p "$work/nginx" -e "$work/nginx/error.log" -c "$work/nginx/nginx.conf" &
      SERVER=$! PIDS+=("$!")
      ;;
    redis)
      PORT=$(free_port)
      redis-server --port "$PORT" --bind 127.0.0.1 --protected-mode no --save '' --appendonly no \
        --daemonize no --logfile /dev/null --maxclients $((n + 1024)) >"$log" 2>&1 &
      SERVER=$! PIDS+=("$!")
      ;;
    *)
      # appsrv-MODEL[-wW]-EXAMPLE
      ex=${id##*-}
      case $id in
        appsrv-blocking-*)
          # shellcheck disable=SC2086
          flags="$APPSRV_BLOCKING_FLAGS --pool dynamic --start-workers 8 --min-spare 8 --max-spare 32 --max-workers $((n + 64))" ;;
        appsrv-event-w*)
          local w=${id#appsrv-event-w}
          w=${w%%-*}
          flags="$APPSRV_EVENT_FLAGS -w $w" ;;
      esac
      # shellcheck disable=SC2086
      "$EX/$ex" -l 127.0.0.1:0 $flags --keepalive-timeout 120 --rlimit-nofile "$NOFILE" 2>"$log" &
      SERVER=$! PIDS+=("$!")
      PORT=$(ready_port "$log" 20)
      [ -n "$PORT" ] || { echo "idle-memory.sh: $id did not start:" >&2; tail -20 "$log" >&2; exit 1; }
      ;;
  esac
}

stop() {
  [ -n "$SERVER" ] || return 0
  kill "$SERVER" 2>/dev/null || true
  wait "$SERVER" 2>/dev/null || true
  SERVER=""
}

# answer_once REQUEST FRAMING: one client, answered, closed (waits up to 10 s for the server).
answer_once() {
  local out
  for _ in $(seq 100); do
    # shellcheck disable=SC2086
    out=$("$IDLE" --connect "127.0.0.1:$PORT" -n 1 --request "$1" $2 --hold 0 --timeout 5 2>&1) \
      && grep -q '^answered 1 ' <<<"$out" && return 0
    sleep 0.1
  done
  echo "idle-memory.sh: the server on port $PORT does not answer: $out" >&2
  exit 1
}

ROWS=()
CSV=server,clients,answered,failed,processes,pss_kb_none,pss_kb_held,bytes_per_connection,still_open,new_client_ms,open_s
# measure ID N REQUEST FRAMING: one row.
measure() {
  local id=$1 n=$2 req=$3 framing=$4 base held fifo out cpid fd i answered failed procs bpc open new secs rate=""
  [[ $id == appsrv-blocking-* ]] && rate="--rate $BLOCKING_RATE"
  start "$id" "$n"
  answer_once "$req" "$framing"
  sleep 1 # the baseline after the first answer; a dynamic pool's first spares are forked
  read -r base _ < <(pss_kb "$SERVER")
  fifo=$work/release.$id.$n out=$work/clients.$id.$n
  mkfifo "$fifo"
  # shellcheck disable=SC2086
  "$IDLE" --connect "127.0.0.1:$PORT" -n "$n" --request "$req" $framing $rate --timeout 10 <"$fifo" >"$out" 2>&1 &
  cpid=$! PIDS+=("$!")
  exec {fd}>"$fifo"
  # Each connection answered or failed within its 10 s timeout; the bound is generous.
  for i in $(seq 6000); do
    grep -q '^holding' "$out" && break
    kill -0 "$cpid" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q '^holding' "$out"; then
    echo "idle-memory.sh: $id, $n clients: the client did not get to holding:" >&2
    cat "$out" >&2
    kill "$cpid" 2>/dev/null || true
    exec {fd}>&-
    wait "$cpid" 2>/dev/null || true
    stop
    ROWS+=("| $(row_name "$id") | $n | (client did not finish) | | | | | | | |")
    return 0
  fi
  sleep "$SETTLE"
  read -r held procs < <(pss_kb "$SERVER")
  exec {fd}>&- # release: the client checks the held connections and a new client
  for i in $(seq 600); do kill -0 "$cpid" 2>/dev/null || break; sleep 0.1; done
  kill "$cpid" 2>/dev/null || true
  wait "$cpid" 2>/dev/null || true
  stop
  answered=$(awk '/^answered/ { print $2 }' "$out")
  failed=$(awk '/^answered/ { print $4 }' "$out")
  secs=$(awk '/^answered/ { print $(NF - 1) }' "$out")
  open=$(awk '/^still open/ { print $3 }' "$out")
  new=$(awk '/^new client: answered/ { print $5 " ms" } /^new client: failed/ { print "failed" }' "$out")
  bpc=$(awk -v h="$held" -v b="$base" -v n="$answered" 'BEGIN { if (n > 0) printf "%.0f", (h - b) * 1024 / n; else print "-" }')
  echo "$id,$n,$answered,$failed,$procs,$base,$held,$bpc,${open:-},${new% ms},$secs" >>"$RESULTS/idle-memory.csv"
  local fails=$failed
  [ "$failed" = 0 ] || fails="$failed ($(sed -n 's/^answered [0-9]* failed [0-9]* (\(.*\)) in .*/\1/p' "$out" | tr ',' '\n' | awk '$2 != 0 { printf "%s%s %s", (n++ ? ", " : ""), $1, $2 }'))"
  ROWS+=("| $(row_name "$id") | $n | $answered | $fails | $procs | $(mib "$base") | $(mib "$held") | $bpc | ${open:-?} | ${new:-?} |")
  grep -q '^first failure' "$out" && echo "idle-memory.sh: $id, $n clients: $(grep '^first failure' "$out")" >&2
  grep -q '^new client: failed' "$out" && echo "idle-memory.sh: $id, $n clients: $(grep '^new client' "$out")" >&2
  return 0
}

mib() { awk -v k="$1" 'BEGIN { printf "%.1f MiB", k / 1024 }'; }

row_name() {
  case $1 in
    nginx) echo "nginx (2 workers)" ;;
    redis) echo "Redis" ;;
    appsrv-blocking-*) echo "${1##*-} blocking (dynamic pool)" ;;
    appsrv-event-w*)
      local w=${1#appsrv-event-w}
      echo "${1##*-} ${APPSRV_EVENT_FLAGS:-(no event flags)} -w ${w%%-*}" ;;
  esac
}

# appsrv_ids EXAMPLE: the appsrv rows for EXAMPLE.
appsrv_ids() {
  local m w
  for m in $APPSRV_IO; do
    case $m in
      blocking) echo "appsrv-blocking-$1" ;;
      event) for w in $APPSRV_WORKERS; do echo "appsrv-event-w$w-$1"; done ;;
      *) echo "idle-memory.sh: APPSRV_IO: unknown model '$m'" >&2; exit 1 ;;
    esac
  done
}

RESULTS=${RESULTS:-bench/results}
mkdir -p "$RESULTS"
echo "$CSV" >"$RESULTS/idle-memory.csv"
SKIPPED=()
run_set() { # REQUEST FRAMING ID...
  local req=$1 framing=$2 id n
  shift 2
  for n in $COUNTS; do
    for id in "$@"; do
      if [[ $id == appsrv-blocking-* ]] && [ "$n" -gt "$BLOCKING_MAX" ]; then
        SKIPPED+=("$(row_name "$id") with $n clients (a process per client; BLOCKING_MAX=$BLOCKING_MAX)")
        continue
      fi
      echo "idle-memory.sh: $(row_name "$id"), $n clients" >&2
      measure "$id" "$n" "$req" "$framing"
    done
  done
}

ids=()
for s in $SERVERS; do
  case $s in
    appsrv) mapfile -t -O "${#ids[@]}" ids < <(appsrv_ids http_hello) ;;
    nginx) ids+=(nginx) ;;
    *) echo "idle-memory.sh: SERVERS: unknown server '$s'" >&2; exit 1 ;;
  esac
done
run_set "$HTTP_REQ" --http "${ids[@]}"
if [ "$PING" != 0 ]; then
  ids=()
  mapfile -t ids < <(appsrv_ids ping)
  if command -v redis-server >/dev/null; then ids+=(redis); else SKIPPED+=("Redis (apt-get install -y redis-server)"); fi
  run_set "$PING_REQ" "--until \\n" "${ids[@]}"
fi

echo "Idle keep-alive clients, each answered once: summed PSS of all the server's processes ($(nproc) CPUs; $(date -u +%Y-%m-%d); appsrv $(git rev-parse --short HEAD 2>/dev/null || echo '?')${PREBUILT:+, prebuilt examples in $EX})"
echo
echo "| server | clients | answered | failed | processes | PSS, no client | PSS, clients held | bytes per connection | still open | new client |"
echo "|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
[ ${#SKIPPED[@]} -eq 0 ] || printf 'Not run: %s\n' "${SKIPPED[@]}"

if [ "$SCENARIO" != 0 ]; then
  ROWS=()
  echo "idle-memory.sh: the issue's scenario, $SCENARIO_N clients" >&2
  # The issue's command line exactly: measure's own flags are the same (-w 2,
  # --keepalive-timeout 120, --rlimit-nofile $NOFILE = 20000 for up to 18,976 clients).
  measure "appsrv-event-w2-http_hello" "$SCENARIO_N" "$HTTP_REQ" --http
  echo
  echo "Issue 16's scenario: \`http_hello ${APPSRV_EVENT_FLAGS:-(no event flags)} -w 2 --keepalive-timeout 120 --rlimit-nofile $NOFILE\`, $SCENARIO_N keep-alive clients each answered, all still open (goal: PSS ≤ 12 MiB, a new client served at once)"
  echo
  echo "| server | clients | answered | failed | processes | PSS, no client | PSS, clients held | bytes per connection | still open | new client |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
fi
