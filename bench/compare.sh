#!/usr/bin/env bash
# appsrv side by side with nginx, Apache 2 (prefork MPM), PHP-FPM behind nginx and Apache
# prefork with mod_php, all on loopback, with ab; then a custom protocol (inline PING)
# against Redis and Perl's Net::Server::PreFork with redis-benchmark; then the syscalls
# per request of each server under strace. Prints markdown tables, writes CSV files to
# bench/results/ and SVG charts (bench-charts, a binary of crates/appsrv-bench) to
# bench/charts/ (and the versions and settings to bench/results/env-PART.txt).
#
#   bench/compare.sh              quick mode (the default): a few minutes on 2 CPUs
#   bench/compare.sh --full       full mode (or MODE=full): some 20 minutes (estimated)
#   PING=0 SYSCALLS=0 bench/compare.sh          the HTTP part only
#   CONCURRENCY="1 8" N=2000 bench/compare.sh   any setting below can be overridden
#
#   setting        quick            full                meaning
#   RUNS           1                3                   ab runs per cell (the median is kept)
#   N              5000             20000               requests per run (100 KB file: N/2,
#                                                       1 MB file: N/10; never fewer than c)
#   CONCURRENCY    "8 32 256"       "1 8 32 128 256"    ab -c levels (HTTP)
#   PING_CONCURRENCY "8 32 50 256"  "1 8 32 50 128 256" redis-benchmark -c levels (50 is
#                                                       its default)
#   PIPELINE       16               16                  redis-benchmark -P of the pipelined
#                                                       PING row (0 skips it); it gets
#                                                       PIPELINE_N = 10 N requests per run
#   WARMUP         3                10                  seconds of unmeasured keep-alive
#                                                       load at the highest c, before each
#                                                       workload of each server
#   RAMP           12               15                  seconds of the same load once more,
#                                                       before a server's first workload
#                                                       (after its idle memory): time for
#                                                       Apache and PHP-FPM to grow to 256
#   SYSCALL_N      2000             10000               requests traced per server (strace)
#   MAX_WORKERS    max(32, highest c), both modes       pool ceiling of every prefork server
#   HTTP, PING, SYSCALLS, CHARTS   1 (0 skips the part)
#   HTTP_SERVERS   "appsrv nginx apache php-fpm mod_php"   the servers of parts 1 and 3
#   APPSRV_IO      "blocking event" the I/O models appsrv is measured in, each its own row(s)
#                                   in every part (ids: appsrv, appsrv-event-wW)
#   APPSRV_WORKERS "2 1"            event mode: one row per static pool size W (-w W)
#   APPSRV_EVENT_FLAGS  "--io event"   what selects event mode on appsrv's command line
#   APPSRV_BLOCKING_FLAGS  "--io blocking" when the examples know --io (ping defaults to
#                                   event mode in code), else "" (a build without it)
#   RESULTS        bench/results    where the CSV files go
#   CHARTS_DIR     bench/charts     where the SVG charts go
#   EX             (build)          a directory of prebuilt release examples (http_hello,
#                                   ping); without it cargo builds them (into
#                                   $CARGO_TARGET_DIR or target/)
#
# Needs (it installs nothing; a missing PHP, Redis or Net::Server peer is skipped with a
# message, a missing nginx, Apache or ab stops the script):
#   apt-get install -y nginx apache2 apache2-utils php-fpm libapache2-mod-php \
#     redis-server redis-tools libnet-server-perl strace python3
# The packages' own services are not used (nor need to run): each server runs from a
# private configuration in a temporary directory, on a free 127.0.0.1 port picked by
# binding port 0 (python3), logging off, and is stopped before the next one starts (and at
# exit, by a trap). Started as root, every server's workers run as nobody:nogroup.
#
# HTTP workloads (files: bench/results/WORKLOAD.csv, charts: bench/charts/WORKLOAD.svg):
#   hello-dynamic  a 13-byte `Hello, World!` computed per request:
#                    appsrv            GET /            the http_hello example
#                    php-fpm           GET /hello.php   nginx + PHP-FPM (FastCGI, Unix socket)
#                    mod_php           GET /hello.php   Apache prefork + mod_php
#                  hello.php is one line: <?php header("Content-Length: 13"); echo
#                  "Hello, World!"; (without the header, nginx answers ab's HTTP/1.0
#                  keep-alive request with `Connection: close`: it cannot chunk for 1.0)
#   hello-static   GET /static/hello.txt, the same 13 bytes from a file: appsrv
#                  (http_hello --static-dir, sendfile), nginx, apache
#   static-100k    GET /static/100k.bin, 102400 random bytes: appsrv, nginx, apache
#   static-1m      GET /static/1m.bin, 1048576 random bytes: appsrv, nginx, apache
# each with keep-alive (ab -k) and a new connection per request, at each CONCURRENCY. A
# server's workloads run in the order static-1m, static-100k, then the 13-byte ones, and
# for each workload, one connection per request first, then keep-alive, c ascending.
#
# Servers and their settings:
#   appsrv   http_hello (release build), APPSRV_BLOCKING_FLAGS --pool dynamic
#            --start-workers 8 --min-spare 8 --max-spare 32 --max-workers MAX_WORKERS (each
#            keep-alive client holds a worker: the pool must reach the highest c); defaults
#            otherwise: keep-alive timeout 5 s, 1000 requests per connection, no access log.
#   appsrv-event-wW  http_hello APPSRV_EVENT_FLAGS -w W (a static pool of W event-loop
#            workers; --worker-connections at its default, 10000), defaults otherwise as
#            above. No RAMP: a static pool does not grow.
#   nginx    worker_processes 2, daemon off, access_log off, error_log in the temp dir,
#            sendfile on, tcp_nopush on, keepalive_timeout 5s, keepalive_requests 1000,
#            worker_connections 1024, no open_file_cache.
#   apache   MPM prefork, StartServers 8, MinSpareServers 8, MaxSpareServers 32,
#            MaxRequestWorkers and ServerLimit MAX_WORKERS, MaxConnectionsPerChild 0,
#            KeepAlive On, MaxKeepAliveRequests 1000, KeepAliveTimeout 5, EnableSendfile
#            On, no access log, ErrorLog in the temp dir, private PidFile. Modules:
#            mpm_prefork, authz_core, alias, mime (unixd and log_config are compiled in).
#            It runs under setsid: prefork's shutdown signals its whole process group,
#            which in the foreground would be this script's (and the caller's).
#   php-fpm  nginx as above with `location = /hello.php` passed to PHP-FPM (fastcgi_pass
#            to a Unix socket, Debian's fastcgi_params written inline, no fastcgi_keep_conn)
#            and PHP-FPM (php-fpm8.x -F, Debian's php.ini: opcache on) with pm dynamic,
#            pm.start_servers 8, pm.min_spare_servers 8, pm.max_spare_servers 32,
#            pm.max_children MAX_WORKERS, no access log, error_log in the temp dir.
#   mod_php  Apache prefork as above plus libphp8.x.so (Debian's apache2 php.ini) and
#            `SetHandler application/x-httpd-php` for *.php.
#   Prefork pools grow: Apache and PHP-FPM by 1, 2, 4 ... 32 processes a second (about
#   12 s from 8 to 256), appsrv by 1, 2, 4 ... 32 every 50 ms. RAMP, then the WARMUP
#   before each workload let them grow to the highest c first, so that a keep-alive cell
#   at a high c does not measure the ramp; they shrink by one idle process a second
#   (above MaxSpareServers / pm.max_spare_servers / --max-spare 32). The memory table's
#   process counts show how far each pool grew.
#
# Server cost per request (a second table per workload, and the CSV columns
# cpu_us_per_request, csw_per_request): sampled from /proc before a cell's first run and
# after its last (outside ab's timing), summed over the master(s), their children and
# every thread (bench/lib.sh proc_counters): CPU time (each thread's run time from
# /proc/PID/task/*/schedstat, plus cutime + cstime of /proc/PID/stat, which keep the CPU
# of the children a master reaped) in microseconds per request, and context switches
# (voluntary + nonvoluntary, /proc/PID/task/*/status) per request. Where the client
# saturates its CPU (ab is single-threaded), requests/s is the client's limit and CPU per
# request compares the servers. A process that exits during the cell (a shrinking pool)
# takes its switches with it: the cell says "≥ X (N exited)", the CSV processes_exited.
#
# ab runs with -r (a receive error is counted, not fatal), -s 10 (socket timeout) and
# under `timeout 120`. A cell is the median req/s of the runs that finished; failures
# (ab's "Failed requests" plus "Non-2xx responses", summed over the runs) and runs that
# ab did not finish are noted in the cell and the CSV. Each server must answer with the
# exact expected body (checked with python3) before it is measured. The client shares the
# machine's CPUs with the server: the figures are lower bounds, comparable with each
# other within one run of this script, not across runs.
#
# Memory (bench/results/memory.csv): the summed PSS (/proc/PID/smaps_rollup) and count of
# a server's master(s) and their children: "idle" right after start (before any load),
# "after" right after its last run (keep-alive at the highest c). For php-fpm it is nginx
# and PHP-FPM together.
#
# Part 2 (PING=0 skips it): inline `PING\r\n` answered `+PONG\r\n`, loaded by
# redis-benchmark -t ping_inline -q, keep-alive (-k 1), pipelined (-k 1 -P PIPELINE,
# PIPELINE_N requests; bench/results/ping-pipelined.csv) and a new connection per request
# (-k 0), at PING_CONCURRENCY, RUNS runs of N requests, median req/s, each run under
# `timeout 120`, after WARMUP seconds of unmeasured keep-alive load at the highest c, with
# the server's CPU and context switches per request as above; then memory idle and after
# (bench/results/ping-memory.csv) and the ratios. Servers:
#   appsrv       the ping example (release build), APPSRV_BLOCKING_FLAGS and the dynamic
#                pool as http_hello above; appsrv-event-wW: ping APPSRV_EVENT_FLAGS -w W.
#   redis        redis-server, one process: --bind 127.0.0.1 --protected-mode no --save ''
#                --appendonly no --daemonize no --logfile /dev/null.
#   netserver    a Perl Net::Server::PreFork server written to the temp dir: reads lines,
#                `+PONG` to each PING; min_servers 8, max_servers MAX_WORKERS (each
#                keep-alive client holds a process), max_requests 1000000 (its default,
#                1000, would recycle children during the runs), log_level 0, its
#                default flock accept lock on a file in the temp dir. It is slow:
#                it gets N/4 requests per run (the table says so).
#
# Part 3 (SYSCALLS=0 skips it): syscalls per request on the keep-alive 13-byte workloads:
# `strace -c -f` attached to all the children (workers) of each server's master(s) while
# `ab -k -c 1 -n SYSCALL_N` runs, as bench/syscalls.sh does for appsrv alone; the calls
# counted divided by SYSCALL_N (bench/results/syscalls.csv). For php-fpm, the nginx workers
# and the PHP-FPM children are traced together and also shown apart.
#
# Then (CHARTS=0 skips it) bench-charts draws bench/charts/*.svg from bench/results/*.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

MODE=${MODE:-quick}
for arg in "$@"; do
  case $arg in
    --full) MODE=full ;;
    --quick) MODE=quick ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: bench/compare.sh [--quick|--full] (settings in the environment; --help)" >&2; exit 2 ;;
  esac
done
case $MODE in
  quick) d_runs=1 d_n=5000 d_conc="8 32 256" d_pconc="8 32 50 256" d_warmup=3 d_ramp=12 d_sn=2000 ;;
  full) d_runs=3 d_n=20000 d_conc="1 8 32 128 256" d_pconc="1 8 32 50 128 256" d_warmup=10 d_ramp=15 d_sn=10000 ;;
  *) echo "compare.sh: MODE must be quick or full, not '$MODE'" >&2; exit 2 ;;
esac
RUNS=${RUNS:-$d_runs} N=${N:-$d_n} CONCURRENCY=${CONCURRENCY:-$d_conc}
PING_CONCURRENCY=${PING_CONCURRENCY:-$d_pconc} PIPELINE=${PIPELINE:-16}
APPSRV_IO=${APPSRV_IO:-blocking event} APPSRV_WORKERS=${APPSRV_WORKERS:-2 1}
APPSRV_EVENT_FLAGS=${APPSRV_EVENT_FLAGS---io event}
WARMUP=${WARMUP:-$d_warmup} RAMP=${RAMP:-$d_ramp} SYSCALL_N=${SYSCALL_N:-$d_sn}
RESULTS=${RESULTS:-bench/results} CHARTS_DIR=${CHARTS_DIR:-bench/charts}
HTTP_SERVERS=${HTTP_SERVERS:-appsrv nginx apache php-fpm mod_php}
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
APACHE=${APACHE:-$(command -v apache2 || echo /usr/sbin/apache2)}
APACHE_MODULES=${APACHE_MODULES:-/usr/lib/apache2/modules}
PHP_FPM=${PHP_FPM:-$(compgen -G '/usr/sbin/php-fpm*' | sort -V | tail -1 || true)}
LIBPHP=${LIBPHP:-$(compgen -G "$APACHE_MODULES/libphp*.so" | sort -V | tail -1 || true)}

for v in CONCURRENCY PING_CONCURRENCY APPSRV_WORKERS; do
  [[ ${!v} =~ ^\ *[1-9][0-9]*(\ +[1-9][0-9]*)*\ *$ ]] \
    || { echo "compare.sh: $v must be numbers separated by spaces, not '${!v}'" >&2; exit 1; }
done
for v in RUNS N WARMUP RAMP SYSCALL_N PIPELINE; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "compare.sh: $v must be a number, not '${!v}'" >&2; exit 1; }
done
levels() { tr -s ' ' '\n' <<<"$1" | grep . | sort -n | uniq | tr '\n' ' ' | sed 's/ $//'; }
CONCURRENCY=$(levels "$CONCURRENCY") PING_CONCURRENCY=$(levels "$PING_CONCURRENCY")
# The highest level of either part: the dynamic pools' ceiling and the warm-ups' load.
CMAX=$(levels "$CONCURRENCY $PING_CONCURRENCY") CMAX=${CMAX##* }
PIPELINE_N=$((N * 10))
# The appsrv rows: appsrv (blocking, the dynamic pool) and appsrv-event-wW.
APPSRV_IDS=""
for m in $APPSRV_IO; do
  case $m in
    blocking) APPSRV_IDS="$APPSRV_IDS appsrv" ;;
    event) for w in $APPSRV_WORKERS; do APPSRV_IDS="$APPSRV_IDS appsrv-event-w$w"; done ;;
    *) echo "compare.sh: APPSRV_IO: unknown model '$m' (blocking, event)" >&2; exit 1 ;;
  esac
done
for srv in $HTTP_SERVERS; do
  case $srv in
    appsrv | nginx | apache | php-fpm | mod_php) ;;
    *) echo "compare.sh: HTTP_SERVERS: unknown server '$srv'" >&2; exit 1 ;;
  esac
done
MAX_WORKERS=${MAX_WORKERS:-$((CMAX > 32 ? CMAX : 32))}
# The servers of parts 1 and 3, appsrv expanded into its rows.
HTTP_IDS=""
for srv in $HTTP_SERVERS; do
  if [ "$srv" = appsrv ]; then HTTP_IDS="$HTTP_IDS $APPSRV_IDS"; else HTTP_IDS="$HTTP_IDS $srv"; fi
done

missing=()
[ -x "$NGINX" ] || missing+=(nginx)
{ [ -x "$APACHE" ] && [ -f "$APACHE_MODULES/mod_mpm_prefork.so" ]; } || missing+=(apache2)
command -v ab >/dev/null || missing+=(apache2-utils)
command -v python3 >/dev/null || missing+=(python3)
if [ ${#missing[@]} -gt 0 ]; then
  echo "compare.sh: missing ${missing[*]}; install with:" >&2
  echo "  apt-get install -y ${missing[*]}" >&2
  exit 1
fi

PREBUILT=${EX:+1}
if [ -z "${EX:-}" ]; then
  cargo build --release --quiet --example http_hello --example ping
  EX=${CARGO_TARGET_DIR:-target}/release/examples
fi
{ [ -x "$EX/http_hello" ] && [ -x "$EX/ping" ]; } \
  || { echo "compare.sh: no http_hello and ping in $EX" >&2; exit 1; }
# The blocking rows must stay blocking now that ping defaults to event mode; a build
# without --io is blocking only (and has no event rows).
if "$EX/http_hello" --help 2>/dev/null | grep -q -- '--io '; then
  APPSRV_BLOCKING_FLAGS=${APPSRV_BLOCKING_FLAGS---io blocking}
else
  APPSRV_BLOCKING_FLAGS=${APPSRV_BLOCKING_FLAGS-}
  if [[ " $APPSRV_IO " == *" event "* && -n $APPSRV_EVENT_FLAGS ]]; then
    echo "compare.sh: $EX/http_hello has no --io option (a build without event mode): run with" >&2
    echo "  APPSRV_IO=blocking, or APPSRV_EVENT_FLAGS='' to run the event rows' pools in blocking mode" >&2
    exit 1
  fi
fi

work=$(mktemp -d)
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
# The workers (nobody when started as root) must read the files.
chmod 755 "$work"
mkdir -m 755 "$work/static" "$work/php"
printf 'Hello, World!' >"$work/static/hello.txt"
cp "$work/static/hello.txt" "$work/hello.expected"
head -c 102400 /dev/urandom >"$work/static/100k.bin"
head -c 1048576 /dev/urandom >"$work/static/1m.bin"
echo '<?php header("Content-Length: 13"); echo "Hello, World!";' >"$work/php/hello.php"
chmod 644 "$work/static/"* "$work/php/hello.php"
if [ "$(id -u)" = 0 ]; then RUN_USER=nobody RUN_GROUP=nogroup; else RUN_USER="" RUN_GROUP=""; fi
mkdir -p "$RESULTS"

# check NAME URL FILE: a 200 whose body is exactly FILE's bytes, waiting up to 10 s for
# the server (and, behind nginx, PHP-FPM) to come up.
check() {
  if ! python3 - "$2" "$3" <<'EOF'; then
import sys, time, urllib.error, urllib.request
url, want, err = sys.argv[1], open(sys.argv[2], "rb").read(), None
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
for _ in range(100):
    try:
        with opener.open(url, timeout=2) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    except OSError as e:
        status, body = None, str(e)
    if status == 200 and body == want:
        sys.exit(0)
    err = "status %s, %d-byte body %r" % (status, len(body), body[:40])
    time.sleep(0.1)
sys.exit("%s: %s" % (url, err))
EOF
    echo "compare.sh: $1 does not answer as expected at $2; its log:" >&2
    tail -20 "$work/$1.log" >&2 2>/dev/null || true
    exit 1
  fi
}

# Each start_* appends the pids of the server's master(s) to SERVERS (stopped by `stop`)
# and sets PORT. Not in a subshell: the EXIT trap would run there, and the server would
# not be our job.
SERVERS=()
started() { SERVERS+=("$1"); PIDS+=("$1"); }

# appsrv_flags ID: the command line of appsrv row ID (appsrv, appsrv-event-wW).
appsrv_flags() {
  case $1 in
    appsrv) echo "$APPSRV_BLOCKING_FLAGS --pool dynamic --start-workers 8 --min-spare 8 --max-spare 32 --max-workers $MAX_WORKERS" ;;
    appsrv-event-w*) echo "$APPSRV_EVENT_FLAGS -w ${1#appsrv-event-w}" ;;
  esac
}

# start_appsrv EXAMPLE ID [ARGS...]
start_appsrv() {
  local ex=$1 id=$2 log
  shift 2
  # A log of its own (check and ping_check show it): $work/ID.log, ping-ID.log for ping.
  log=$work/$id.log
  [ "$ex" = ping ] && log=$work/ping-$id.log
  # shellcheck disable=SC2046 # the flags are words
  "$EX/$ex" -l 127.0.0.1:0 $(appsrv_flags "$id") "$@" 2>"$log" &
  started $!
  PORT=$(ready_port "$log")
  [ -n "$PORT" ] || { echo "compare.sh: $ex ($id) did not start:" >&2; cat "$log" >&2; exit 1; }
}

# start_fpm: PHP-FPM on the Unix socket $work/fpm/fpm.sock.
start_fpm() {
  local d=$work/fpm
  mkdir -p "$d"
  cat >"$d/php-fpm.conf" <<EOF
[global]
pid = $d/php-fpm.pid
error_log = $work/php-fpm.log
log_level = warning
daemonize = no

[www]
${RUN_USER:+user = $RUN_USER}
${RUN_GROUP:+group = $RUN_GROUP}
listen = $d/fpm.sock
listen.mode = 0666
pm = dynamic
pm.start_servers = 8
pm.min_spare_servers = 8
pm.max_spare_servers = 32
pm.max_children = $MAX_WORKERS
pm.max_requests = 0
catch_workers_output = no
EOF
  "$PHP_FPM" -t -y "$d/php-fpm.conf" >"$work/php-fpm.log" 2>&1 \
    || { echo "compare.sh: bad PHP-FPM configuration:" >&2; cat "$work/php-fpm.log" >&2; exit 1; }
  "$PHP_FPM" -F -y "$d/php-fpm.conf" >>"$work/php-fpm.log" 2>&1 &
  started $!
}

# start_nginx [fpm]: with fpm, /hello.php goes to PHP-FPM (started first).
start_nginx() {
  PORT=$(free_port)
  local d=$work/nginx php=""
  mkdir -p "$d"
  if [ "${1:-}" = fpm ]; then
    php="location = /hello.php {
            fastcgi_pass unix:$work/fpm/fpm.sock;
            fastcgi_param SCRIPT_FILENAME $work/php/hello.php;
            fastcgi_param QUERY_STRING \$query_string;
            fastcgi_param REQUEST_METHOD \$request_method;
            fastcgi_param CONTENT_TYPE \$content_type;
            fastcgi_param CONTENT_LENGTH \$content_length;
            fastcgi_param SCRIPT_NAME \$fastcgi_script_name;
            fastcgi_param REQUEST_URI \$request_uri;
            fastcgi_param DOCUMENT_URI \$document_uri;
            fastcgi_param DOCUMENT_ROOT $work/php;
            fastcgi_param SERVER_PROTOCOL \$server_protocol;
            fastcgi_param REQUEST_SCHEME \$scheme;
            fastcgi_param GATEWAY_INTERFACE CGI/1.1;
            fastcgi_param SERVER_SOFTWARE nginx/\$nginx_version;
            fastcgi_param REMOTE_ADDR \$remote_addr;
            fastcgi_param REMOTE_PORT \$remote_port;
            fastcgi_param SERVER_ADDR \$server_addr;
            fastcgi_param SERVER_PORT \$server_port;
            fastcgi_param SERVER_NAME \$server_name;
            fastcgi_param REDIRECT_STATUS 200;
        }"
  fi
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
        $php
    }
}
EOF
  "$NGINX" -t -q -p "$d" -e "$work/nginx.log" -c "$d/nginx.conf" \
    || { echo "compare.sh: bad nginx configuration:" >&2; cat "$work/nginx.log" >&2; exit 1; }
  "$NGINX" -p "$d" -e "$work/nginx.log" -c "$d/nginx.conf" &
  started $!
}

# start_apache [php]: with php, mod_php serves *.php from $work/php.
start_apache() {
  PORT=$(free_port)
  local d=$work/apache m=$APACHE_MODULES php=""
  mkdir -p "$d"
  [ "${1:-}" = php ] && php="LoadModule php_module $LIBPHP
<FilesMatch \"\\.php\$\">
    SetHandler application/x-httpd-php
</FilesMatch>"
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
$php
${RUN_USER:+User $RUN_USER}
${RUN_GROUP:+Group $RUN_GROUP}
StartServers 8
MinSpareServers 8
MaxSpareServers 32
ServerLimit $MAX_WORKERS
MaxRequestWorkers $MAX_WORKERS
MaxConnectionsPerChild 0
KeepAlive On
MaxKeepAliveRequests 1000
KeepAliveTimeout 5
EnableSendfile On
TypesConfig /dev/null
AddType text/plain .txt
DocumentRoot $work/php
<Directory />
    AllowOverride None
    Require all denied
</Directory>
<Directory $work/php>
    Options None
    AllowOverride None
    Require all granted
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
  started $!
  sleep 0.2
  [ "$(cat "/proc/$!/comm" 2>/dev/null)" = apache2 ] \
    || { echo "compare.sh: Apache did not start:" >&2; cat "$work/apache.log" >&2; exit 1; }
}

# start_server ID: the servers of the HTTP part by their id in the tables and CSV files.
start_server() {
  case $1 in
    appsrv*) start_appsrv http_hello "$1" --static-dir "$work/static" ;;
    nginx) start_nginx ;;
    apache) start_apache ;;
    php-fpm) start_fpm; start_nginx fpm ;;
    mod_php) start_apache php ;;
  esac
}

stop() {
  local p
  for p in "${SERVERS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${SERVERS[@]}"; do wait "$p" 2>/dev/null || true; done
  SERVERS=()
}

median() { sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }'; }

# ab_cell PORT PATH CONC KEEPALIVE(1|0) REQUESTS: RUNS runs; sets RPS (the median req/s,
# empty when no run finished), FAILED (summed over the runs), UNFINISHED (runs), and
# CPUREQ and CSWREQ (the server's CPU µs and context switches per completed request).
ab_cell() {
  local k="" out rps=() i f x before
  FAILED=0 UNFINISHED=0 RPS=""
  [ "$4" = 1 ] && k=-k
  before=$(proc_counters "${SERVERS[@]}")
  for i in $(seq "$RUNS"); do
    if out=$(timeout 120 ab -q -r -s 10 $k -n "$5" -c "$3" "http://127.0.0.1:$1$2" 2>&1) \
      && x=$(awk '/^Requests per second/ { print $4 }' <<<"$out") && [ -n "$x" ]; then
      rps+=("$x")
      f=$(awk '/^Failed requests/ { f += $3 } /^Non-2xx responses/ { f += $3 } END { print f + 0 }' <<<"$out")
      FAILED=$((FAILED + f))
      [ "$f" = 0 ] || echo "compare.sh: ab -c $3 $k on :$1$2: $(grep -A1 -E '^(Failed requests|Non-2xx)' <<<"$out" | tr -s ' \n' ' ')" >&2
    else
      UNFINISHED=$((UNFINISHED + 1))
      echo "compare.sh: ab -c $3 $k on :$1$2 did not finish (run $i): $(tail -1 <<<"$out")" >&2
    fi
  done
  [ ${#rps[@]} -gt 0 ] && RPS=$(printf '%s\n' "${rps[@]}" | median | xargs printf '%.0f')
  read -r CPUREQ CSWREQ EXITED < <(per_request "$before" "$(proc_counters "${SERVERS[@]}")" $((${#rps[@]} * $5)))
  return 0
}

# cost_text: the markdown cell of CPUREQ and CSWREQ (and EXITED: "(N exited)" marks a
# lower bound of the switches).
cost_text() {
  if [ "$CPUREQ" = - ]; then echo -; return; fi
  if [ "$EXITED" = 0 ]; then echo "$CPUREQ µs, $CSWREQ"; else echo "$CPUREQ µs, ≥ $CSWREQ ($EXITED exited)"; fi
}

# cell_text: the markdown cell of RPS, FAILED and UNFINISHED.
cell_text() {
  local cell=${RPS:--}
  [ "$FAILED" -gt 0 ] && cell="$cell (${FAILED} failed)"
  [ "$UNFINISHED" -gt 0 ] && cell="$cell (${UNFINISHED}/${RUNS} runs unfinished)"
  echo "$cell"
}

CSV_HEADER=server,concurrency,keepalive,rps,requests,runs,failed,unfinished_runs,cpu_us_per_request,csw_per_request,processes_exited
MEM_HEADER=server,phase,processes,pss_kb

# memory CSV SERVER PHASE: summed PSS (kB) and count of the masters in SERVERS and their
# children, appended to CSV and to MEM (a markdown row).
MEM=()
memory() {
  local pids p kb=0 n=0 v
  # pgrep fails when there are no children (Redis): not fatal under pipefail.
  pids="${SERVERS[*]} $(for p in "${SERVERS[@]}"; do pgrep -P "$p" || true; done | tr '\n' ' ')"
  for p in $pids; do
    v=$(awk '/^Pss:/ { print $2 }' "/proc/$p/smaps_rollup" 2>/dev/null) || continue
    [ -n "$v" ] || continue
    kb=$((kb + v)) n=$((n + 1))
  done
  echo "$2,$3,$n,$kb" >>"$1"
  MEM+=("| $2 | $3 | $n | $(awk -v k="$kb" 'BEGIN { printf "%.1f", k / 1024 }') MiB | $((n ? kb / n : 0)) kB |")
}

# warm_up PORT PATH [SECS]: SECS (default WARMUP) seconds of keep-alive load at the
# highest concurrency, not measured, so that a pool that grows has grown.
warm_up() {
  local secs=${3:-$WARMUP}
  [ "$secs" -gt 0 ] || return 0
  # -n after -t: -t sets -n 50000.
  timeout $((secs + 30)) ab -q -r -s 10 -k -c "$CMAX" -t "$secs" -n 100000000 \
    "http://127.0.0.1:$1$2" >/dev/null 2>&1 || true
}

ka_name() {
  case $1 in
    1) echo keep-alive ;;
    p) echo "keep-alive, -P $PIPELINE" ;;
    *) echo "one per request" ;;
  esac
}
header() { # FIRST-COLUMNS..., with a column per level of LEVELS (default CONCURRENCY)
  local h="|" s="|" c col
  for col in "$@"; do h="$h $col |"; s="$s---|"; done
  for c in ${LEVELS:-$CONCURRENCY}; do h="$h c=$c |"; s="$s---|"; done
  echo "$h"; echo "$s"
}
ratio() { # A B: A/B with two decimals, or - when either is missing
  local a=${1%% *} b=${2%% *}
  if [[ $a =~ ^[0-9]+$ && $b =~ ^[0-9]+$ && $b -gt 0 ]]; then
    awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a / b }'
  else
    echo -
  fi
}
server_name() {
  case $1 in
    appsrv) echo "appsrv${APPSRV_BLOCKING_FLAGS:+ $APPSRV_BLOCKING_FLAGS} (dynamic pool)" ;;
    appsrv-event-w*) echo "appsrv ${APPSRV_EVENT_FLAGS:-(no event flags)} -w ${1#appsrv-event-w}" ;;
    apache) echo "Apache prefork" ;;
    php-fpm) echo "nginx + PHP-FPM" ;;
    mod_php) echo "Apache prefork + mod_php" ;;
    redis) echo Redis ;;
    netserver) echo Net::Server ;;
    *) echo "$1" ;;
  esac
}
min_n() { echo $(($1 > CMAX ? $1 : CMAX)); }

declare -A CELL COST PATHS REQS TITLE SRVS
PATHS=([hello-dynamic]=/ [hello-static]=/static/hello.txt [static-100k]=/static/100k.bin [static-1m]=/static/1m.bin)
REQS=([hello-dynamic]=$(min_n "$N") [hello-static]=$(min_n "$N") [static-100k]=$(min_n $((N / 2))) [static-1m]=$(min_n $((N / 10))))
TITLE=([hello-dynamic]="13-byte dynamic \`Hello, World!\` (appsrv \`GET /\`, PHP \`GET /hello.php\`)"
  [hello-static]="13-byte static file \`GET /static/hello.txt\`"
  [static-100k]="100 KB static file \`GET /static/100k.bin\`"
  [static-1m]="1 MB static file \`GET /static/1m.bin\`")
WORKLOADS=(hello-dynamic hello-static static-100k static-1m)

# expected WORKLOAD: the file whose bytes are the body.
expected() {
  case $1 in
    static-100k) echo "$work/static/100k.bin" ;;
    static-1m) echo "$work/static/1m.bin" ;;
    *) echo "$work/hello.expected" ;;
  esac
}

# measure SERVER WORKLOAD PATH: the cells of one server and workload, into CELL and the
# workload's CSV.
measure() {
  local ka c n=${REQS[$2]}
  check "$1" "http://127.0.0.1:$PORT$3" "$(expected "$2")"
  warm_up "$PORT" "$3"
  for ka in 0 1; do
    for c in $CONCURRENCY; do
      ab_cell "$PORT" "$3" "$c" "$ka" "$n"
      CELL[$1/$2/$ka/$c]=$(cell_text) COST[$1/$2/$ka/$c]=$(cost_text)
      echo "$1,$c,$ka,$RPS,$n,$RUNS,$FAILED,$UNFINISHED,$CPUREQ,$CSWREQ,$EXITED" >>"$RESULTS/$2.csv"
    done
  done
  SRVS[$2]="${SRVS[$2]:-} $1"
}

# The versions, for the tables' captions and bench/results/env.txt.
versions() {
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "mode: $MODE (RUNS=$RUNS N=$N CONCURRENCY=\"$CONCURRENCY\" PING_CONCURRENCY=\"$PING_CONCURRENCY\" PIPELINE=$PIPELINE WARMUP=$WARMUP RAMP=$RAMP SYSCALL_N=$SYSCALL_N MAX_WORKERS=$MAX_WORKERS)"
  local id
  for id in $APPSRV_IDS; do echo "appsrv row $id: $(appsrv_flags "$id" | tr -s ' ' | sed 's/^ //')"; done
  if [ -n "$PREBUILT" ]; then
    echo "appsrv: prebuilt examples in $EX"
  else
    echo "appsrv: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- crates/appsrv 2>/dev/null || echo ' (crates/appsrv modified)')"
  fi
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine shares its CPUs)"
  echo "machine: $(nproc) CPUs, $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo), $(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), Linux $(uname -r)"
  echo "nginx: $("$NGINX" -v 2>&1 | sed 's/.*nginx\///')"
  echo "apache: $("$APACHE" -v | sed -n 's/^Server version: Apache\///p')"
  echo "ab: $(ab -V | sed -n 's/.*Version \([^ ]*\).*/\1/p' | head -1)"
  [ -n "$PHP_FPM" ] && echo "php-fpm: $("$PHP_FPM" -v | head -1 | cut -d' ' -f2)"
  [ -n "$LIBPHP" ] && echo "mod_php: $(basename "$LIBPHP")"
  command -v redis-server >/dev/null && echo "redis: $(redis-server --version | sed 's/.* v=\([^ ]*\).*/\1/')"
  perl -MNet::Server -e 'print "Net::Server: $Net::Server::VERSION\n"' 2>/dev/null || true
  return 0
}
# Each part that runs writes its own copy (env-http.txt, env-ping.txt, env-syscalls.txt),
# so that a part run alone later does not misdate the others' results.
versions >"$work/env.txt"
echo "compare.sh: $MODE mode; $(sed -n 2p "$work/env.txt")" >&2

# ---------------------------------------------------------------------------------------
# Part 1 (HTTP=0 skips it)
if [ "${HTTP:-1}" != 0 ]; then
  cp "$work/env.txt" "$RESULTS/env-http.txt"
  for wl in "${WORKLOADS[@]}"; do echo "$CSV_HEADER" >"$RESULTS/$wl.csv"; done
  echo "$MEM_HEADER" >"$RESULTS/memory.csv"
  SKIP=()
  for srv in $HTTP_IDS; do
    case $srv in
      php-fpm) [ -n "$PHP_FPM" ] || { SKIP+=("nginx + PHP-FPM (apt-get install -y php-fpm)"); continue; } ;;
      mod_php) [ -n "$LIBPHP" ] || { SKIP+=("Apache + mod_php (apt-get install -y libapache2-mod-php)"); continue; } ;;
    esac
    echo "compare.sh: $(server_name "$srv")" >&2
    start_server "$srv"
    case $srv in
      appsrv*) wls="static-1m static-100k hello-static hello-dynamic" ;;
      nginx | apache) wls="static-1m static-100k hello-static" ;;
      *) wls=hello-dynamic ;;
    esac
    first=1
    for wl in $wls; do
      path=${PATHS[$wl]}
      [ "$wl" = hello-dynamic ] && [[ $srv != appsrv* ]] && path=/hello.php
      if [ "$first" = 1 ]; then
        # Up and answering (one request), then idle.
        check "$srv" "http://127.0.0.1:$PORT$path" "$(expected "$wl")"
        memory "$RESULTS/memory.csv" "$srv" idle
        # A static pool (event mode) does not grow: no ramp.
        [[ $srv == appsrv-event-* ]] || warm_up "$PORT" "$path" "$RAMP"
        first=0
      fi
      measure "$srv" "$wl" "$path"
    done
    memory "$RESULTS/memory.csv" "$srv" after
    stop
  done

  echo "HTTP, requests per second, median of $RUNS run(s) (ab; $(nproc) CPUs, client on the same machine; $MODE mode)"
  for wl in "${WORKLOADS[@]}"; do
    echo
    echo "${TITLE[$wl]}, ${REQS[$wl]} requests per run:"
    echo
    header server connections
    for ka in 1 0; do
      for srv in ${SRVS[$wl]:-}; do
        row="| $(server_name "$srv") | $(ka_name "$ka") |"
        for c in $CONCURRENCY; do row="$row ${CELL[$srv/$wl/$ka/$c]} |"; done
        echo "$row"
      done
    done
    echo
    echo "Server CPU per request and context switches per request, same cells:"
    echo
    header server connections
    for ka in 1 0; do
      for srv in ${SRVS[$wl]:-}; do
        row="| $(server_name "$srv") | $(ka_name "$ka") |"
        for c in $CONCURRENCY; do row="$row ${COST[$srv/$wl/$ka/$c]} |"; done
        echo "$row"
      done
    done
  done
  [ ${#SKIP[@]} -eq 0 ] || printf 'Skipped: %s\n' "${SKIP[@]}"
  echo
  echo "Memory: PSS summed over the master(s) and their children, idle (after start) and after the last run (keep-alive, c=$CMAX)"
  echo
  echo "| server | when | processes | PSS | PSS per process |"
  echo "|---|---|---|---|---|"
  printf '%s\n' "${MEM[@]}"
  echo
  echo "Ratios of the medians, appsrv / the other server, same workload (hello-dynamic also"
  echo "beside nginx's hello-static: the same 13 bytes, from a file)"
  echo
  header workload appsrv "/ …" connections
  for wl in "${WORKLOADS[@]}"; do
    peers=""
    for srv in ${SRVS[$wl]:-}; do [[ $srv == appsrv* ]] || peers="$peers $wl:$srv"; done
    [ "$wl" = hello-dynamic ] && [ -n "${SRVS[hello-static]:-}" ] \
      && [[ " ${SRVS[hello-static]} " == *" nginx "* ]] && peers="$peers hello-static:nginx"
    for a in ${SRVS[$wl]:-}; do
      [[ $a == appsrv* ]] || continue
      for peer in $peers; do
        pwl=${peer%%:*} srv=${peer#*:}
        for ka in 1 0; do
          row="| $wl | $(server_name "$a") | $(server_name "$srv")$([ "$pwl" = "$wl" ] || echo " ($pwl)") | $(ka_name "$ka") |"
          for c in $CONCURRENCY; do
            row="$row $(ratio "${CELL[$a/$wl/$ka/$c]:-}" "${CELL[$srv/$pwl/$ka/$c]:-}") |"
          done
          echo "$row"
        done
      done
    done
  done
fi

# ---------------------------------------------------------------------------------------
# Part 2 (PING=0 skips it): inline PING -> +PONG with redis-benchmark.
if [ "${PING:-1}" != 0 ]; then
  echo
  if ! command -v redis-benchmark >/dev/null; then
    echo "compare.sh: PING part skipped: no redis-benchmark; install with:" >&2
    echo "  apt-get install -y redis-tools" >&2
  else
    N_NS=$(min_n $((N / 4)))
    cp "$work/env.txt" "$RESULTS/env-ping.txt"
    echo "$CSV_HEADER" >"$RESULTS/ping.csv"
    [ "$PIPELINE" -gt 0 ] && echo "$CSV_HEADER" >"$RESULTS/ping-pipelined.csv"
    echo "$MEM_HEADER" >"$RESULTS/ping-memory.csv"

    # ping_check NAME: the server on PORT must answer `PING\r\n` with `+PONG\r\n`,
    # waiting up to 10 s for it to come up.
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

    start_redis() {
      PORT=$(free_port)
      redis-server --port "$PORT" --bind 127.0.0.1 --protected-mode no --save '' \
        --appendonly no --daemonize no --logfile /dev/null >"$work/redis.log" 2>&1 &
      started $!
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

my ($port, $max, $lock, $user, $group) = @ARGV;
PingServer->run(
    port => "127.0.0.1:$port", ipv => 4,
    min_servers => 8, max_servers => $max, max_requests => 1_000_000,
    log_level => 0, serialize => 'flock', lock_file => $lock,
    ($user ? (user => $user, group => $group) : ()),
);
EOF
      # Its accept lock (flock), made here: by default it makes a temporary file after
      # dropping privileges, in the current directory when /tmp is not writable.
      : >"$work/netserver.lock"
      [ -z "$RUN_USER" ] || chown "$RUN_USER:$RUN_GROUP" "$work/netserver.lock"
      perl "$work/pingd.pl" "$PORT" "$MAX_WORKERS" "$work/netserver.lock" "$RUN_USER" "$RUN_GROUP" \
        >"$work/netserver.log" 2>&1 &
      started $!
    }

    # rb_cell PORT CONC KEEPALIVE(1|0|p: pipelined) REQUESTS: RUNS runs of redis-benchmark;
    # sets RPS, FAILED (always 0: redis-benchmark reports none), UNFINISHED, CPUREQ and
    # CSWREQ as ab_cell.
    rb_cell() {
      local out rps=() i x before k=(-k "$3")
      FAILED=0 UNFINISHED=0 RPS=""
      [ "$3" = p ] && k=(-k 1 -P "$PIPELINE")
      before=$(proc_counters "${SERVERS[@]}")
      for i in $(seq "$RUNS"); do
        if out=$(timeout 120 redis-benchmark -h 127.0.0.1 -p "$1" -t ping_inline -n "$4" -c "$2" \
          "${k[@]}" -q 2>&1 | tr '\r' '\n') \
          && x=$(awk '/^PING_INLINE: [0-9.]+ requests per second/ { print $2 }' <<<"$out" | tail -1) \
          && [ -n "$x" ]; then
          rps+=("$x")
        else
          UNFINISHED=$((UNFINISHED + 1))
          echo "compare.sh: redis-benchmark -c $2 ${k[*]} on :$1 did not finish (run $i): $(grep . <<<"$out" | tail -1)" >&2
        fi
      done
      [ ${#rps[@]} -gt 0 ] && RPS=$(printf '%s\n' "${rps[@]}" | median | xargs printf '%.0f')
      read -r CPUREQ CSWREQ EXITED < <(per_request "$before" "$(proc_counters "${SERVERS[@]}")" $((${#rps[@]} * $4)))
      return 0
    }

    # ping_measure NAME REQUESTS [PIPELINED_REQUESTS]: fills PCELL[name/ka/c],
    # PCOST[name/ka/c], PROWS, ping.csv and ping-pipelined.csv, after WARMUP seconds of
    # unmeasured keep-alive load at the highest concurrency.
    declare -A PCELL PCOST
    PROWS=()
    ping_measure() {
      local ka c kas="0 1" n csv
      [ "$PIPELINE" -gt 0 ] && kas="0 1 p"
      memory "$RESULTS/ping-memory.csv" "$1" idle
      [ "$WARMUP" -gt 0 ] && { timeout "$WARMUP" redis-benchmark -h 127.0.0.1 -p "$PORT" \
        -t ping_inline -n 100000000 -c "$CMAX" -q >/dev/null 2>&1 || true; }
      for ka in $kas; do
        n=$2 csv=$RESULTS/ping.csv
        [ "$ka" = p ] && n=${3:-$PIPELINE_N} csv=$RESULTS/ping-pipelined.csv
        for c in $PING_CONCURRENCY; do
          rb_cell "$PORT" "$c" "$ka" "$n"
          PCELL[$1/$ka/$c]=$(cell_text) PCOST[$1/$ka/$c]=$(cost_text)
          echo "$1,$c,${ka/p/1},$RPS,$n,$RUNS,$FAILED,$UNFINISHED,$CPUREQ,$CSWREQ,$EXITED" >>"$csv"
        done
      done
      for ka in 1 p 0; do
        [[ " $kas " == *" $ka "* ]] || continue
        if [ "$ka" = p ]; then PROWS+=("$1/$ka/${3:-$PIPELINE_N}"); else PROWS+=("$1/$ka/$2"); fi
      done
      memory "$RESULTS/ping-memory.csv" "$1" after
    }

    MEM=()
    PSKIP=()
    for id in $APPSRV_IDS; do
      echo "compare.sh: PING, $(server_name "$id")" >&2
      start_appsrv ping "$id"
      ping_check "ping-$id" || exit 1
      ping_measure "$id" "$(min_n "$N")"
      stop
    done

    if command -v redis-server >/dev/null; then
      echo "compare.sh: PING, Redis" >&2
      start_redis
      if ping_check redis; then ping_measure redis "$(min_n "$N")"; fi
      stop
    else
      echo "compare.sh: Redis skipped: no redis-server; install with:" >&2
      echo "  apt-get install -y redis-server" >&2
      PSKIP+=("redis (not installed: apt-get install -y redis-server)")
    fi

    if perl -MNet::Server::PreFork -e 1 2>/dev/null; then
      echo "compare.sh: PING, Net::Server" >&2
      start_netserver
      if ping_check netserver; then ping_measure netserver "$N_NS" "$N_NS"; fi
      stop
    else
      echo "compare.sh: Net::Server skipped: no Net::Server::PreFork; install with:" >&2
      echo "  apt-get install -y libnet-server-perl" >&2
      PSKIP+=("Net::Server (not installed: apt-get install -y libnet-server-perl)")
    fi

    LEVELS=$PING_CONCURRENCY
    echo "Inline PING -> +PONG, requests per second, median of $RUNS run(s) (redis-benchmark -t ping_inline; $(nproc) CPUs, client on the same machine; $MODE mode)"
    echo
    header server requests connections
    for r in "${PROWS[@]}"; do
      IFS=/ read -r srv ka n <<<"$r"
      row="| $(server_name "$srv") | $n | $(ka_name "$ka") |"
      for c in $PING_CONCURRENCY; do row="$row ${PCELL[$srv/$ka/$c]} |"; done
      echo "$row"
    done
    echo
    echo "Server CPU per request and context switches per request, same cells:"
    echo
    header server requests connections
    for r in "${PROWS[@]}"; do
      IFS=/ read -r srv ka n <<<"$r"
      row="| $(server_name "$srv") | $n | $(ka_name "$ka") |"
      for c in $PING_CONCURRENCY; do row="$row ${PCOST[$srv/$ka/$c]} |"; done
      echo "$row"
    done
    [ ${#PSKIP[@]} -eq 0 ] || printf 'Skipped: %s\n' "${PSKIP[@]}"
    echo
    echo "Memory of the PING servers, idle and after the last run (c=$CMAX)"
    echo
    echo "| server | when | processes | PSS | PSS per process |"
    echo "|---|---|---|---|---|"
    printf '%s\n' "${MEM[@]}"
    echo
    echo "Ratios of the PING medians"
    echo
    header ratio connections
    for other in redis netserver; do
      [ -n "${PCELL[$other/1/${PING_CONCURRENCY%% *}]:-}" ] || continue
      for a in $APPSRV_IDS; do
        for ka in 1 p 0; do
          [ -n "${PCELL[$a/$ka/${PING_CONCURRENCY%% *}]:-}" ] || continue
          row="| $(server_name "$a") / $(server_name "$other") | $(ka_name "$ka") |"
          for c in $PING_CONCURRENCY; do
            row="$row $(ratio "${PCELL[$a/$ka/$c]:-}" "${PCELL[$other/$ka/$c]:-}") |"
          done
          echo "$row"
        done
      done
    done
    unset LEVELS
  fi
fi

# ---------------------------------------------------------------------------------------
# Part 3 (SYSCALLS=0 skips it): syscalls per request, keep-alive, c=1, under strace -c.
if [ "${SYSCALLS:-1}" != 0 ]; then
  echo
  if ! command -v strace >/dev/null; then
    echo "compare.sh: syscalls part skipped: no strace; install with: apt-get install -y strace" >&2
  else
    cp "$work/env.txt" "$RESULTS/env-syscalls.txt"
    echo "server,workload,requests,syscalls_per_request,by_process,calls" >"$RESULTS/syscalls.csv"
    echo "Syscalls per request, keep-alive (ab -k -c 1 -n $SYSCALL_N), strace -c -f on all the workers"
    echo
    echo "| server | workload | syscalls/request | by process group | per call (≥ 0.01/request) |"
    echo "|---|---|---|---|---|"
    # strace_calls FILE: "name count" lines of an strace -c table (calls are column 4,
    # or 5 when the usecs/call column is empty); no header or total line.
    strace_calls() {
      awk '$1 ~ /^[0-9.]+$/ && $NF != "total" { print $NF, ($4 ~ /^[0-9]+$/ ? $4 : $5) }' "$1"
    }
    # trace SERVER WORKLOAD PATH
    trace() {
      local i=0 p w tracers=() files=() by="" all per total
      check "$1" "http://127.0.0.1:$PORT$3" "$work/hello.expected"
      # Untraced first, so that a pool that keeps spare processes (Apache, PHP-FPM) has
      # started the one it wants when a worker is busy: strace follows the children it
      # attached to, not those the master starts later.
      timeout 30 ab -q -k -c 1 -t 1 -n 100000000 "http://127.0.0.1:$PORT$3" >/dev/null 2>&1 || true
      sleep 1.5
      for p in "${SERVERS[@]}"; do
        local traced=()
        for w in $(pgrep -P "$p"); do traced+=(-p "$w"); done
        i=$((i + 1))
        strace -c -f -q -o "$work/strace.$i.txt" "${traced[@]}" &
        tracers+=("$!") files+=("$work/strace.$i.txt")
        PIDS+=("$!")
      done
      sleep 0.5 # let strace attach before the load starts
      timeout 300 ab -q -k -n "$SYSCALL_N" -c 1 "http://127.0.0.1:$PORT$3" >/dev/null 2>&1 \
        || echo "compare.sh: ab under strace on $1 did not finish" >&2
      for p in "${tracers[@]}"; do kill -INT "$p" 2>/dev/null || true; done
      for p in "${tracers[@]}"; do wait "$p" 2>/dev/null || true; done
      if [ ${#files[@]} -gt 1 ]; then
        i=0
        for p in "${SERVERS[@]}"; do
          by="$by$(cat "/proc/$p/comm" 2>/dev/null || echo "?") $(strace_calls "${files[$i]}" \
            | awk -v n="$SYSCALL_N" '{ s += $2 } END { printf "%.2f", s / n }'); "
          i=$((i + 1))
        done
      fi
      all=$(for p in "${files[@]}"; do strace_calls "$p"; done)
      total=$(awk -v n="$SYSCALL_N" '{ s += $2 } END { printf "%.2f", s / n }' <<<"$all")
      per=$(awk -v n="$SYSCALL_N" '{ c[$1] += $2 } END { for (s in c) if (c[s] / n >= 0.01) printf "%s %.2f\n", s, c[s] / n }' <<<"$all" \
        | sort -k2,2nr -k1,1 | awk '{ printf "%s%s %s", (NR > 1 ? ", " : ""), $1, $2 }')
      echo "$1,$2,$SYSCALL_N,$total,\"${by%; }\",\"$per\"" >>"$RESULTS/syscalls.csv"
      by=${by%; }
      echo "| $(server_name "$1") | $2 | $total | ${by:--} | $per |"
    }
    for srv in $HTTP_IDS; do
      case $srv in
        php-fpm) [ -n "$PHP_FPM" ] || continue ;;
        mod_php) [ -n "$LIBPHP" ] || continue ;;
      esac
      start_server "$srv"
      case $srv in
        appsrv*) trace "$srv" hello-dynamic /; trace "$srv" hello-static /static/hello.txt ;;
        nginx | apache) trace "$srv" hello-static /static/hello.txt ;;
        *) trace "$srv" hello-dynamic /hello.php ;;
      esac
      stop
    done
  fi
fi

# ---------------------------------------------------------------------------------------
if [ "${CHARTS:-1}" != 0 ]; then
  mkdir -p "$CHARTS_DIR"
  cargo run --release --quiet -p appsrv-bench --bin bench-charts -- "$RESULTS" "$CHARTS_DIR" >&2
fi
