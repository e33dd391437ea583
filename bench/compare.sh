#!/usr/bin/env bash
# appsrv side by side with nginx and Apache 2 (prefork MPM), all on loopback, with ab: the
# median requests per second of RUNS runs of N requests for each server, workload,
# keep-alive (ab -k) or a new connection per request, and concurrency; then the memory
# (summed PSS) and process count of each server; then the ratios appsrv/nginx and
# appsrv/Apache.
#
#   bench/compare.sh              (N=20000 RUNS=3 CONCURRENCY="1 8 32" WORKERS=32 WARMUP=5)
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
  pids="$SERVER $(pgrep -P "$SERVER" | tr '\n' ' ')"
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
