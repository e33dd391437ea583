#!/usr/bin/env bash
# appsrv side by side with nginx and Apache 2 (prefork MPM), all on loopback, with ab: the
# median requests per second of RUNS runs of N requests for each server, workload,
# keep-alive (ab -k) or a new connection per request, and concurrency; then the memory
# (summed PSS) and process count of each server; then the ratios appsrv/nginx and
# appsrv/Apache.
#
#   bench/compare.sh              (N=20000 RUNS=3 CONCURRENCY="1 8 32" WORKERS=32 WARMUP=5 PING=1)
#   PING=0 bench/compare.sh       (the HTTP part only)
#   CONCURRENCY="1 8 32 128 256" bench/compare.sh     (or: bench/compare.sh "1 8 32 128 256")
#   N=2000 RUNS=1 bench/compare.sh            (a quick check that everything runs)
#
# Needs nginx, apache2 and ab from the Debian packages (it installs nothing):
#   apt-get install -y nginx apache2 apache2-utils
# The packages' own services are not used (nor need to run): each server runs from a
# private configuration in a temporary directory, on a free 127.0.0.1 port picked by
# binding port 0 (python3), and is stopped at exit.
#
# Workloads, each a 13-byte body `Hello, World!`:
#   appsrv  dynamic  GET /                    the http_hello example (release build)
#   appsrv  static   GET /static/hello.txt    http_hello --static-dir, sendfile(2)
#   nginx   static   GET /static/hello.txt
#   apache  static   GET /static/hello.txt
# appsrv: a static pool of WORKERS (default 32) workers, as bench/requests.sh (`-w 32`);
#   its defaults otherwise: keep-alive timeout 5 s, 1000 requests per connection.
# nginx: worker_processes 2, daemon off (a private pid file too), access_log off,
#   error_log in the temp dir, sendfile on, tcp_nopush on, keepalive_timeout 5s,
#   keepalive_requests 1000, worker_connections 1024, no open_file_cache.
# Apache: MPM prefork (mod_mpm_prefork from /usr/lib/apache2/modules), StartServers 8,
#   MinSpareServers 8, MaxSpareServers 32, MaxRequestWorkers 64 (ServerLimit 64),
#   MaxConnectionsPerChild 0, KeepAlive On, MaxKeepAliveRequests 1000, KeepAliveTimeout
#   5, EnableSendfile On, no access log, ErrorLog in the temp dir, private PidFile, run
#   in the foreground (-DFOREGROUND) in the background of this script. Modules: only
#   mpm_prefork, authz_core, alias and mime (unixd and log_config are compiled in).
#   It runs under setsid: prefork's shutdown signals its whole process group, which in
#   the foreground would be this script's (and the caller's).
#   Note: prefork serves one connection per process, so beyond 64 keep-alive clients the
#   others wait in the listen queue for a connection to end: at the end of a run, until
#   ab's idle connections time out (KeepAliveTimeout 5 s), so with keep-alive and c > 64
#   a run lasts at least 5 s (and ab counts a few "Length" failures there: 35 of 2000 at
#   c=128 in a trial). appsrv, also one connection per worker, closes a keep-alive
#   connection quiet for 100 ms while clients queue, so c > WORKERS does not stall it;
#   nginx, event-driven, has no such limit.
# Started as root, the workers of all three run as nobody:nogroup.
#
# Before each workload's runs: WARMUP seconds (default 5) of unmeasured keep-alive load
# at the highest concurrency. Without it prefork, growing from StartServers 8 by 1, 2,
# 4 ... processes a second, leaves keep-alive clients beyond its processes waiting in
# the listen queue for seconds, and the first c=32 keep-alive cell measures that ramp.
#
# ab runs with -r (a receive error is counted, not fatal), -s 10 (socket timeout) and
# under `timeout 120`. A cell is the median req/s of the runs that finished; failures
# (ab's "Failed requests" plus "Non-2xx responses", summed over the runs) and runs that
# ab did not finish are noted in the cell. The client shares the machine's CPUs with the
# server: the figures are lower bounds, and comparable with each other, not absolute.
# Memory is measured after each server's runs, before it is stopped: the sum of
# /proc/PID/smaps_rollup Pss over the master and its child processes.
#
# Part 2, after the HTTP tables (PING=0 skips it): a custom protocol, inline `PING\r\n`
# answered `+PONG\r\n`, loaded by redis-benchmark (redis-tools) with `-t ping_inline -q`,
# keep-alive (-k 1: each client keeps its connection) and a new connection per request
# (-k 0), at the same CONCURRENCY, RUNS runs, median req/s, each run under `timeout 120`,
# after WARMUP seconds of unmeasured keep-alive load at the highest concurrency; then
# memory (as above) and the ratios appsrv/Redis and appsrv/Net::Server. Servers:
#   appsrv       the ping example (release build), -w WORKERS, on a free port.
#   Redis        redis-server (apt-get install -y redis-server), one process: --port,
#                --bind 127.0.0.1, --protected-mode no, --save '', --appendonly no,
#                --daemonize no, --logfile /dev/null; skipped with a message if missing.
#   Net::Server  a Perl Net::Server::PreFork server written to the temp dir
#                (apt-get install -y libnet-server-perl; skipped with a message if
#                missing): reads lines, `+PONG` to each PING; min_servers 8,
#                max_servers 32, max_requests 1000000 (its default, 1000, would
#                recycle children during the runs), log_level 0, as nobody:nogroup when
#                started as root. It is slow: it gets N/4 requests per run (the table
#                says so).
# Each server must answer `+PONG` before it is measured.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3} N=${N:-20000} WORKERS=${WORKERS:-32} WARMUP=${WARMUP:-5}
CONCURRENCY=${CONCURRENCY:-${1:-1 8 32}}
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
APACHE=${APACHE:-$(command -v apache2 || echo /usr/sbin/apache2)}
APACHE_MODULES=${APACHE_MODULES:-/usr/lib/apache2/modules}

missing=()
[ -x "$NGINX" ] || missing+=(nginx)
{ [ -x "$APACHE" ] && [ -f "$APACHE_MODULES/mod_mpm_prefork.so" ]; } || missing+=(apache2)
command -v ab >/dev/null || missing+=(apache2-utils)
if [ ${#missing[@]} -gt 0 ]; then
  echo "compare.sh: missing ${missing[*]}; install with:" >&2
  echo "  apt-get install -y nginx apache2 apache2-utils" >&2
  exit 1
fi
[[ $CONCURRENCY =~ ^\ *[1-9][0-9]*(\ +[1-9][0-9]*)*\ *$ ]] \
  || { echo "compare.sh: CONCURRENCY must be numbers separated by spaces, not '$CONCURRENCY'" >&2; exit 1; }
command -v python3 >/dev/null || { echo "compare.sh: python3 is needed (free ports, checks)" >&2; exit 1; }

cargo build --release --quiet -p appsrv --example http_hello
EX=target/release/examples
work=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
# The workers (nobody when started as root) must read the file.
chmod 755 "$work"
mkdir -m 755 "$work/static"
printf 'Hello, World!' >"$work/static/hello.txt"
chmod 644 "$work/static/hello.txt"
if [ "$(id -u)" = 0 ]; then RUN_USER=nobody RUN_GROUP=nogroup; else RUN_USER="" RUN_GROUP=""; fi

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# check NAME URL: the body must be exactly `Hello, World!` (13 bytes), waiting up to 10 s
# for the server to come up.
check() {
  if ! python3 - "$2" <<'EOF'; then
import sys, time, urllib.error, urllib.request
url, err = sys.argv[1], None
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
for _ in range(100):
    try:
        with opener.open(url, timeout=2) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    except OSError as e:
        err = e
        time.sleep(0.1)
        continue
    if status == 200 and body == b"Hello, World!":
        sys.exit(0)
    err = "status %d, %d-byte body %r" % (status, len(body), body[:40])
    break
sys.exit("%s: %s" % (url, err))
EOF
    echo "compare.sh: $1 does not answer 'Hello, World!' at $2; its log:" >&2
    tail -20 "$work/$1.log" >&2 2>/dev/null || true
    exit 1
  fi
}

# Each start_* sets SERVER (the master's pid) and PORT. Not in a subshell: the EXIT trap
# would run there, and the server would not be our job.
start_appsrv() {
  "$EX/http_hello" -l 127.0.0.1:0 -w "$WORKERS" --static-dir "$work/static" 2>"$work/appsrv.log" &
  SERVER=$!
  PIDS+=("$SERVER")
  for _ in $(seq 200); do grep -q " ready" "$work/appsrv.log" 2>/dev/null && break; sleep 0.05; done
  PORT=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$work/appsrv.log" | head -1 | cut -d: -f2)
  [ -n "$PORT" ] || { echo "compare.sh: appsrv did not start:" >&2; cat "$work/appsrv.log" >&2; exit 1; }
}

start_nginx() {
  PORT=$(free_port)
  local d=$work/nginx
  mkdir -p "$d"
  cat >"$d/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes 2;
${RUN_USER:+user $RUN_USER $RUN_GROUP;}
pid $d/nginx.pid;
error_log $work/nginx.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_timeout 5s;
    keepalive_requests 1000;
    types { text/plain txt; }
    default_type application/octet-stream;
    client_body_temp_path $d/body;
    proxy_temp_path $d/proxy;
    fastcgi_temp_path $d/fastcgi;
    uwsgi_temp_path $d/uwsgi;
    scgi_temp_path $d/scgi;
    server {
        listen 127.0.0.1:$PORT;
        location /static/ { alias $work/static/; }
    }
}
EOF
  "$NGINX" -t -q -p "$d" -e "$work/nginx.log" -c "$d/nginx.conf" \
    || { echo "compare.sh: bad nginx configuration:" >&2; cat "$work/nginx.log" >&2; exit 1; }
  "$NGINX" -p "$d" -e "$work/nginx.log" -c "$d/nginx.conf" &
  SERVER=$!
  PIDS+=("$SERVER")
}

start_apache() {
  PORT=$(free_port)
  local d=$work/apache m=$APACHE_MODULES
  mkdir -p "$d"
  cat >"$d/apache2.conf" <<EOF
ServerRoot $d
DefaultRuntimeDir $d
PidFile $d/apache2.pid
Mutex file:$d default
ServerName 127.0.0.1
Listen 127.0.0.1:$PORT
ErrorLog $work/apache.log
LogLevel warn
LoadModule mpm_prefork_module $m/mod_mpm_prefork.so
LoadModule authz_core_module $m/mod_authz_core.so
LoadModule alias_module $m/mod_alias.so
LoadModule mime_module $m/mod_mime.so
${RUN_USER:+User $RUN_USER}
${RUN_GROUP:+Group $RUN_GROUP}
StartServers 8
MinSpareServers 8
MaxSpareServers 32
ServerLimit 64
MaxRequestWorkers 64
MaxConnectionsPerChild 0
KeepAlive On
MaxKeepAliveRequests 1000
KeepAliveTimeout 5
EnableSendfile On
TypesConfig /dev/null
AddType text/plain .txt
DocumentRoot $work/static
<Directory />
    AllowOverride None
    Require all denied
</Directory>
Alias /static/ $work/static/
<Directory $work/static>
    Options None
    AllowOverride None
    Require all granted
</Directory>
EOF
  "$APACHE" -t -d "$d" -f "$d/apache2.conf" >"$work/apache.log" 2>&1 \
    || { echo "compare.sh: bad Apache configuration:" >&2; cat "$work/apache.log" >&2; exit 1; }
  # Its own session: at shutdown prefork signals its whole process group (killpg), and
  # with -DFOREGROUND it does not leave ours, so it would kill this script too. A job of
  # a script is no group leader: setsid execs Apache without forking, $! is its pid.
  setsid "$APACHE" -d "$d" -f "$d/apache2.conf" -DFOREGROUND 2>>"$work/apache.log" &
  SERVER=$!
  PIDS+=("$SERVER")
  sleep 0.2
  [ "$(cat "/proc/$SERVER/comm" 2>/dev/null)" = apache2 ] \
    || { echo "compare.sh: Apache did not start:" >&2; cat "$work/apache.log" >&2; exit 1; }
}

stop() {
  kill "$SERVER" 2>/dev/null || true
  wait "$SERVER" 2>/dev/null || true
}

median() { sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }'; }

# ab_cell PORT PATH CONC KEEPALIVE(1|0): RUNS runs; prints the cell: the median req/s,
# with failures and unfinished runs noted.
ab_cell() {
  local k="" out rps=() failed=0 errs=0 i f x
  [ "$4" = 1 ] && k=-k
  for i in $(seq "$RUNS"); do
    if out=$(timeout 120 ab -q -r -s 10 $k -n "$N" -c "$3" "http://127.0.0.1:$1$2" 2>&1) \
      && x=$(awk '/^Requests per second/ { print $4 }' <<<"$out") && [ -n "$x" ]; then
      rps+=("$x")
      f=$(awk '/^Failed requests/ { f += $3 } /^Non-2xx responses/ { f += $3 } END { print f + 0 }' <<<"$out")
      failed=$((failed + f))
      [ "$f" = 0 ] || echo "compare.sh: ab -c $3 $k on :$1$2: $(grep -A1 -E '^(Failed requests|Non-2xx)' <<<"$out" | tr -s ' \n' ' ')" >&2
    else
      errs=$((errs + 1))
      echo "compare.sh: ab -c $3 $k on :$1$2 did not finish (run $i): $(tail -1 <<<"$out")" >&2
    fi
  done
  local cell="-"
  [ ${#rps[@]} -gt 0 ] && cell=$(printf '%s\n' "${rps[@]}" | median | xargs printf '%.0f')
  [ "$failed" -gt 0 ] && cell="$cell (${failed} failed)"
  [ "$errs" -gt 0 ] && cell="$cell (${errs}/${RUNS} runs unfinished)"
  echo "$cell"
}

# memory NAME: summed PSS (kB) and count of the master SERVER and its children.
memory() {
  local pids p kb=0 n=0 v
  # pgrep fails when there are no children (Redis): not fatal under pipefail.
  pids="$SERVER $({ pgrep -P "$SERVER" || true; } | tr '\n' ' ')"
  for p in $pids; do
    v=$(awk '/^Pss:/ { print $2 }' "/proc/$p/smaps_rollup" 2>/dev/null) || continue
    [ -n "$v" ] || continue
    kb=$((kb + v)) n=$((n + 1))
  done
  MEM+=("| $1 | $n | $((kb / 1024)).$(((kb % 1024) * 10 / 1024)) MiB | $((n ? kb / n : 0)) kB |")
}

# warm_up PORT PATH: WARMUP seconds of keep-alive load at the highest concurrency, not
# measured, so that a pool that grows (Apache's prefork from StartServers) has grown.
warm_up() {
  local cmax
  cmax=$(tr -s ' ' '\n' <<<"$CONCURRENCY" | sort -n | tail -1)
  [ "$WARMUP" -gt 0 ] || return 0
  # -n after -t: -t sets -n 50000.
  timeout 120 ab -q -r -s 10 -k -c "$cmax" -t "$WARMUP" -n 100000000 "http://127.0.0.1:$1$2" >/dev/null 2>&1 || true
}

declare -A CELL
MEM=()
ROWS=()
# measure SERVER_NAME WORKLOAD PATH: fills CELL[server/workload/ka/c] and ROWS.
measure() {
  local ka c key
  check "$1" "http://127.0.0.1:$PORT$3"
  warm_up "$PORT" "$3"
  for ka in 1 0; do
    for c in $CONCURRENCY; do
      key="$1/$2/$ka/$c"
      CELL[$key]=$(ab_cell "$PORT" "$3" "$c" "$ka")
    done
    ROWS+=("$1/$2/$ka")
  done
}

start_appsrv
measure appsrv dynamic /
measure appsrv static /static/hello.txt
memory "appsrv (-w $WORKERS)"
stop

start_nginx
measure nginx static /static/hello.txt
memory "nginx (worker_processes 2)"
stop

start_apache
measure apache static /static/hello.txt
memory "apache prefork (StartServers 8, MaxRequestWorkers 64)"
stop

ka_name() { [ "$1" = 1 ] && echo keep-alive || echo "one per request"; }
header() { # FIRST-COLUMNS...
  local h="|" s="|" c col
  for col in "$@"; do h="$h $col |"; s="$s---|"; done
  for c in $CONCURRENCY; do h="$h c=$c |"; s="$s---|"; done
  echo "$h"; echo "$s"
}

echo "Requests per second, median of $RUNS runs of $N requests (ab, 13-byte body; $(nproc) CPUs, client on the same machine)"
echo
header server workload connections
for r in "${ROWS[@]}"; do
  IFS=/ read -r srv wl ka <<<"$r"
  path=/static/hello.txt; [ "$wl" = dynamic ] && path=/
  row="| $srv | $wl \`GET $path\` | $(ka_name "$ka") |"
  for c in $CONCURRENCY; do row="$row ${CELL[$srv/$wl/$ka/$c]} |"; done
  echo "$row"
done
echo
echo "Memory after the runs (PSS summed over the master and its children)"
echo
echo "| server | processes | PSS | PSS per process |"
echo "|---|---|---|---|"
printf '%s\n' "${MEM[@]}"
echo
echo "Ratios of the medians (appsrv workload / other server's static file)"
echo
header ratio connections
ratio() { # A B: A/B with two decimals, or - when either is missing
  local a=${1%% *} b=${2%% *}
  if [[ $a =~ ^[0-9]+$ && $b =~ ^[0-9]+$ && $b -gt 0 ]]; then
    awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a / b }'
  else
    echo -
  fi
}
for wl in static dynamic; do
  for other in nginx apache; do
    for ka in 1 0; do
      row="| appsrv $wl / $other static | $(ka_name "$ka") |"
      for c in $CONCURRENCY; do
        row="$row $(ratio "${CELL[appsrv/$wl/$ka/$c]}" "${CELL[$other/static/$ka/$c]}") |"
      done
      echo "$row"
    done
  done
done

# ---------------------------------------------------------------------------------------
# Part 2 (PING=0 skips it): inline PING -> +PONG with redis-benchmark, against Redis,
# Net::Server::PreFork and appsrv's ping example.
[ "${PING:-1}" = 0 ] && exit 0
echo
if ! command -v redis-benchmark >/dev/null; then
  echo "compare.sh: PING part skipped: no redis-benchmark; install with:" >&2
  echo "  apt-get install -y redis-tools" >&2
  exit 0
fi
cargo build --release --quiet -p appsrv --example ping
# Net::Server: fewer requests (it is slow), at least 1.
N_NS=$((N / 4 > 0 ? N / 4 : 1))

# ping_check NAME: the server on PORT must answer `PING\r\n` with `+PONG\r\n`, waiting up
# to 10 s for it to come up.
ping_check() {
  if ! python3 - "$PORT" <<'EOF'; then
import socket, sys, time
err = None
for _ in range(100):
    try:
        with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2) as s:
            s.sendall(b"PING\r\n")
            got = b""
            while not got.endswith(b"\n"):
                b = s.recv(64)
                if not b:
                    break
                got += b
    except OSError as e:
        err = e
        time.sleep(0.1)
        continue
    if got == b"+PONG\r\n":
        sys.exit(0)
    err = "answered %r" % got
    break
sys.exit("port %s: %s" % (sys.argv[1], err))
EOF
    echo "compare.sh: $1 does not answer '+PONG' on port $PORT; its log:" >&2
    tail -20 "$work/$1.log" >&2 2>/dev/null || true
    return 1
  fi
}

start_appsrv_ping() {
  PORT=$(free_port)
  "$EX/ping" -l "127.0.0.1:$PORT" -w "$WORKERS" 2>"$work/appsrv-ping.log" &
  SERVER=$!
  PIDS+=("$SERVER")
}

start_redis() {
  PORT=$(free_port)
  redis-server --port "$PORT" --bind 127.0.0.1 --protected-mode no --save '' \
    --appendonly no --daemonize no --logfile /dev/null >"$work/redis.log" 2>&1 &
  SERVER=$!
  PIDS+=("$SERVER")
}

start_netserver() {
  PORT=$(free_port)
  cat >"$work/pingd.pl" <<'EOF'
package PingServer;
use strict;
use warnings;
use base 'Net::Server::PreFork';

sub process_request {
    STDOUT->autoflush(1);
    while (defined(my $line = <STDIN>)) {
        $line =~ s/\r?\n\z//;
        print uc($line) eq 'PING' ? "+PONG\r\n" : "-ERR unknown command\r\n";
    }
}

my ($port, $user, $group) = @ARGV;
PingServer->run(
    port => "127.0.0.1:$port", ipv => 4,
    min_servers => 8, max_servers => 32, max_requests => 1_000_000,
    log_level => 0,
    ($user ? (user => $user, group => $group) : ()),
);
EOF
  perl "$work/pingd.pl" "$PORT" "$RUN_USER" "$RUN_GROUP" >"$work/netserver.log" 2>&1 &
  SERVER=$!
  PIDS+=("$SERVER")
}

# rb_cell PORT CONC KEEPALIVE(1|0) REQUESTS: RUNS runs of redis-benchmark; prints the
# cell: the median req/s, with unfinished runs noted.
rb_cell() {
  local out rps=() errs=0 i x
  for i in $(seq "$RUNS"); do
    if out=$(timeout 120 redis-benchmark -h 127.0.0.1 -p "$1" -t ping_inline -n "$4" -c "$2" \
      -k "$3" -q 2>&1 | tr '\r' '\n') \
      && x=$(awk '/^PING_INLINE: [0-9.]+ requests per second/ { print $2 }' <<<"$out" | tail -1) \
      && [ -n "$x" ]; then
      rps+=("$x")
    else
      errs=$((errs + 1))
      echo "compare.sh: redis-benchmark -c $2 -k $3 on :$1 did not finish (run $i): $(grep . <<<"$out" | tail -1)" >&2
    fi
  done
  local cell="-"
  [ ${#rps[@]} -gt 0 ] && cell=$(printf '%s\n' "${rps[@]}" | median | xargs printf '%.0f')
  [ "$errs" -gt 0 ] && cell="$cell (${errs}/${RUNS} runs unfinished)"
  echo "$cell"
}

# ping_measure NAME REQUESTS: fills PCELL[name/ka/c] and PROWS, after WARMUP seconds of
# unmeasured keep-alive load at the highest concurrency.
declare -A PCELL
PROWS=()
ping_measure() {
  local ka c cmax
  cmax=$(tr -s ' ' '\n' <<<"$CONCURRENCY" | sort -n | tail -1)
  [ "$WARMUP" -gt 0 ] && { timeout "$WARMUP" redis-benchmark -h 127.0.0.1 -p "$PORT" \
    -t ping_inline -n 100000000 -c "$cmax" -q >/dev/null 2>&1 || true; }
  for ka in 1 0; do
    for c in $CONCURRENCY; do PCELL[$1/$ka/$c]=$(rb_cell "$PORT" "$c" "$ka" "$2"); done
    PROWS+=("$1/$ka/$2")
  done
}

MEM=()
PSKIP=()
start_appsrv_ping
ping_check appsrv-ping || exit 1
ping_measure appsrv "$N"
memory "appsrv ping (-w $WORKERS)"
stop

if command -v redis-server >/dev/null; then
  start_redis
  if ping_check redis; then
    ping_measure redis "$N"
    memory "redis-server (one process)"
  fi
  stop
else
  echo "compare.sh: Redis skipped: no redis-server; install with:" >&2
  echo "  apt-get install -y redis-server" >&2
  PSKIP+=("redis (not installed: apt-get install -y redis-server)")
fi

if perl -MNet::Server::PreFork -e 1 2>/dev/null; then
  start_netserver
  if ping_check netserver; then
    ping_measure netserver "$N_NS"
    memory "Net::Server::PreFork (min_servers 8, max_servers 32)"
  fi
  stop
else
  echo "compare.sh: Net::Server skipped: no Net::Server::PreFork; install with:" >&2
  echo "  apt-get install -y libnet-server-perl" >&2
  PSKIP+=("Net::Server (not installed: apt-get install -y libnet-server-perl)")
fi

ping_name() { case $1 in netserver) echo Net::Server ;; redis) echo Redis ;; *) echo "$1" ;; esac; }
echo "Inline PING -> +PONG, requests per second, median of $RUNS runs (redis-benchmark -t ping_inline; $N requests, Net::Server $N_NS; $(nproc) CPUs, client on the same machine)"
echo
header server requests connections
for r in "${PROWS[@]}"; do
  IFS=/ read -r srv ka n <<<"$r"
  row="| $(ping_name "$srv") | $n | $(ka_name "$ka") |"
  for c in $CONCURRENCY; do row="$row ${PCELL[$srv/$ka/$c]} |"; done
  echo "$row"
done
[ ${#PSKIP[@]} -eq 0 ] || printf 'Skipped: %s\n' "${PSKIP[@]}"
echo
echo "Memory after the PING runs (PSS summed over the master and its children)"
echo
echo "| server | processes | PSS | PSS per process |"
echo "|---|---|---|---|"
printf '%s\n' "${MEM[@]}"
echo
echo "Ratios of the PING medians"
echo
header ratio connections
for other in redis netserver; do
  for ka in 1 0; do
    row="| appsrv / $(ping_name "$other") | $(ka_name "$ka") |"
    for c in $CONCURRENCY; do
      row="$row $(ratio "${PCELL[appsrv/$ka/$c]:-}" "${PCELL[$other/$ka/$c]:-}") |"
    done
    echo "$row"
  done
done
