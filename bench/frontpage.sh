#!/usr/bin/env bash
# The application front page of issue 20 on a real database: appsrv's `frontpage` example
# against the same pages in PHP (bench/frontpage/*.php: PDO, persistent connections,
# prepared statements, the same SQL) served by Apache prefork + mod_php and by nginx +
# PHP-FPM, on SQLite and on PostgreSQL, loaded with ab and wrk on loopback. Writes
# bench/results/frontpage.csv (and the versions to bench/results/env-frontpage.txt) and
# prints markdown tables: requests/s, the ratios appsrv / each peer, failures, the server's
# and the database's CPU per request, and PSS at the highest concurrency.
#
#   bench/frontpage.sh                                  the default matrix (below): some
#                                                       14 minutes on 2 CPUs
#   DBS=sqlite SERVERS="appsrv php-fpm" bench/frontpage.sh
#   PAGES=/ CONCURRENCY="8 500" TOOLS=ab N=2000 bench/frontpage.sh
#
#   setting          default                         meaning
#   DBS              "sqlite postgres"               the databases; postgres is skipped, with
#                                                    the reason, when no server answers
#   SERVERS          "appsrv mod_php php-fpm"        appsrv: the frontpage example (release
#                                                    build) --io blocking -w W; mod_php: Apache
#                                                    prefork + mod_php; php-fpm: nginx + PHP-FPM
#   W                4                               workers of every server: appsrv -w W;
#                                                    Apache StartServers = MinSpareServers =
#                                                    MaxSpareServers = MaxRequestWorkers =
#                                                    ServerLimit = W; PHP-FPM pm = static,
#                                                    pm.max_children = W
#   PAGES            "/ /rows?n=5 /rows?n=36 /rows?n=134"   the pages loaded (always checked:
#                                                    these four)
#   TOOLS            "ab wrk"                        load tools for `/`
#   KEEPALIVE        "1 0"                           for `/`: 1 keep-alive (ab -k; wrk's
#                                                    default), 0 a connection per request
#                                                    (ab without -k; wrk -H 'Connection: close')
#   CONCURRENCY      "8 32 128 500"                  for `/`: the client connections
#   ROWS_TOOLS       ab                              the same three for the /rows pages: a
#   ROWS_KEEPALIVE   "1 0"                           smaller matrix by default (12 cells per
#   ROWS_CONCURRENCY "8 500"                         server and database, not 48), to finish
#                                                    in time on this 2-core machine
#   N                5000                            ab: requests per run (-n; at least c) ...
#   AB_TIME          10                              ... or this many seconds (-t), whichever
#                                                    comes first: a slow cell stays bounded
#   DURATION         5                               wrk: seconds per run (-d)
#   WARMUP           2                               seconds of unmeasured ab -k -c 2W on `/`
#                                                    after each server starts (every worker
#                                                    opens its connection, opcache fills)
#   WRK_THREADS      2                               wrk -t (at most c)
#   PG_DB            frontpage_bench                 the PostgreSQL database: dropped and
#                                                    created again at the start, owned by the
#                                                    workers' role; dropped at the end unless
#                                                    KEEP_DB=1
#   PG_HOST PG_PORT  /var/run/postgresql 5432        its Unix socket directory and port
#   PG_ADMIN         runuser -u postgres -- psql     how to run psql as a superuser (as root;
#                                                    otherwise `psql`)
#   EX               (build)                         a directory holding a prebuilt release
#                                                    `frontpage`; without it cargo builds it
#   RESULTS          bench/results                   where the CSV goes
#   KEEP_WORK        0                               1 keeps the temporary directory (the
#                                                    servers' configurations and logs)
#
# Needs (it installs nothing; a missing tool stops the script with the apt-get line):
#   apt-get install -y nginx apache2 apache2-utils wrk php-fpm libapache2-mod-php \
#     php-sqlite3 php-pgsql python3 postgresql
#
# The data: for each database, the appsrv example creates and seeds it once (SQLite: its
# master writes a new file in a private temporary directory, given to the workers' user;
# PostgreSQL: its first worker loads the schema and the seed data into PG_DB), then every
# server serves that same database. Before a server is loaded, its bodies of /,
# /rows?n=5, /rows?n=36 and /rows?n=134 (and every page of PAGES) must be 200 and
# byte-identical (cmp) to the ones appsrv gave right after loading; a difference stops
# the script. PostgreSQL connections are made as a role named after the workers' user
# (nobody when started as root), by peer authentication on the Unix socket.
#
# The servers run one at a time from private configurations in a temporary directory, on
# a free 127.0.0.1 port, with no access log; started as root, their workers run as
# nobody:nogroup (so they can use the SQLite file and its -wal and -shm files, and the
# `nobody` role). Each is stopped before the next starts, and at exit, also on Ctrl-C or
# a failure (a trap): its processes are waited for, and any left after 10 s are killed
# by pid.
#   appsrv   crates/appsrv-frontpage/examples/frontpage.rs --database sqlite:PATH or
#            postgres:///PG_DB?host=PG_HOST&port=PG_PORT, --io blocking -w W (static
#            pool), defaults otherwise: keep-alive timeout 5 s, 1000 requests per
#            connection, a keep-alive connection given up (`Connection: close`) when
#            clients queue and no worker is idle.
#   mod_php  Apache prefork, the pool fixed at W (above), MaxConnectionsPerChild 0,
#            KeepAlive On, MaxKeepAliveRequests 1000, KeepAliveTimeout 5, libphp8.x.so
#            with Debian's php.ini (opcache on), `/` and `/rows` mapped to front.php and
#            rows.php (AliasMatch), the DSN by SetEnv. Under setsid (prefork signals its
#            process group at shutdown).
#   php-fpm  nginx (worker_processes 2, worker_connections 4096, keepalive_timeout 5s,
#            keepalive_requests 1000) passing `= /` and `= /rows` to PHP-FPM (php-fpm8.x
#            -F, Debian's php.ini: opcache on) on a Unix socket: pm = static,
#            pm.max_children = W, pm.max_requests 0; the DSN by fastcgi_param.
# The PHP pages open their connection with PDO::ATTR_PERSISTENT (kept by the process
# from one request to the next) and prepare their statements on each request (PDO keeps
# none across requests); appsrv's workers keep connection and statements for their life.
#
# A cell is one run: `ab -q -r -s 10 [-k] -t AB_TIME -n N -c C` or `wrk -t WRK_THREADS
# -c C -d DURATION --timeout 10s [-H 'Connection: close']`, each under `timeout`. Its
# figures (bench/results/frontpage.csv columns):
#   requests           completed requests (ab's "Complete requests", wrk's "N requests")
#   rps                ab's "Requests per second", wrk's "Requests/sec"
#   failed             ab's "Failed requests" (connect, receive, length and exceptions:
#                      the pages are deterministic, so a length failure is a wrong page);
#                      wrk's socket errors (connect + read + write + timeout)
#   non2xx             ab's "Non-2xx responses", wrk's "Non-2xx or 3xx responses"
#   cpu_us_per_req     the server's CPU time during the run over `requests`: summed over
#                      its masters (for php-fpm: nginx's and PHP-FPM's), their children
#                      and every thread, from two bench/lib.sh proc_counters samples, one
#                      before the run and one after it (each thread's run time from
#                      /proc/PID/task/*/schedstat: utime + stime, exactly, in ns; plus
#                      cutime + cstime of /proc/PID/stat, the children a master reaped)
#   db_cpu_us_per_req  the same for the PostgreSQL backends connected to PG_DB (the
#                      processes `postgres: … ROLE PG_DB …`; the cluster's shared
#                      background processes are left out: the load only reads, and other
#                      people's databases may share the cluster); `in-process` for SQLite,
#                      whose work is in the server's CPU
#   pss_kib            the largest summed PSS (/proc/PID/smaps_rollup; bench/lib.sh
#                      pss_kb) of the server's processes (php-fpm: nginx + PHP-FPM), sampled
#                      every 0.5 s during the run (and once after it when it was shorter)
# The summary's PSS is that of the cells at the highest concurrency: the servers loaded.
#
# Reading ab -k against a pool smaller than c: ab writes a connection's next request as
# soon as it has read the response, and once it has started its N requests it leaves its
# connections open and idle until the last answer comes. Apache prefork keeps a child on
# each idle keep-alive connection for KeepAliveTimeout (5 s), so the requests queued
# behind them wait up to 5 s at the end of the run: its ab -k cells include that wait
# (wrk's connections are never idle, nginx holds idle connections without a PHP worker,
# and appsrv gives them up when clients queue). And ab -k counts a failed request (Length)
# each time a server closes an idle keep-alive connection, also one ab had no request on
# (ab resets its keep-alive mark after each response, so the close does not look like
# the "legitimate" one; it counts a request done that was never sent): Apache after
# KeepAliveTimeout, appsrv when its keep-alive guard gives an idle connection up (100 ms
# without a request while clients queue and no worker is idle). Measured once with
# appsrv's --access-log: four `ab -k -c 500 -n 5000` runs reported 9 failed, the server
# logged all 20,000 requests ab sent as answered, and gave up 9 idle connections.
# The clients share the machine's 2 CPUs with the servers (and the database): requests/s
# are lower bounds, comparable within one run of this script; CPU per request compares
# the servers' own work.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

case ${1:-} in
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "usage: bench/frontpage.sh (settings in the environment; --help)" >&2; exit 2 ;;
esac

DBS=${DBS:-sqlite postgres}
SERVERS_SEL=${SERVERS:-appsrv mod_php php-fpm}
W=${W:-4}
PAGES=${PAGES:-/ /rows?n=5 /rows?n=36 /rows?n=134}
TOOLS=${TOOLS:-ab wrk} KEEPALIVE=${KEEPALIVE:-1 0} CONCURRENCY=${CONCURRENCY:-8 32 128 500}
ROWS_TOOLS=${ROWS_TOOLS:-ab} ROWS_KEEPALIVE=${ROWS_KEEPALIVE:-1 0}
ROWS_CONCURRENCY=${ROWS_CONCURRENCY:-8 500}
N=${N:-5000} AB_TIME=${AB_TIME:-10} DURATION=${DURATION:-5} WARMUP=${WARMUP:-2}
WRK_THREADS=${WRK_THREADS:-2}
PG_DB=${PG_DB:-frontpage_bench} PG_HOST=${PG_HOST:-/var/run/postgresql} PG_PORT=${PG_PORT:-5432}
RESULTS=${RESULTS:-bench/results}
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
APACHE=${APACHE:-$(command -v apache2 || echo /usr/sbin/apache2)}
APACHE_MODULES=${APACHE_MODULES:-/usr/lib/apache2/modules}
PHP_FPM=${PHP_FPM:-$(compgen -G '/usr/sbin/php-fpm*' | sort -V | tail -1 || true)}
LIBPHP=${LIBPHP:-$(compgen -G "$APACHE_MODULES/libphp*.so" | sort -V | tail -1 || true)}
if [ "$(id -u)" = 0 ]; then
  RUN_USER=nobody RUN_GROUP=nogroup
  PG_ADMIN=${PG_ADMIN:-runuser -u postgres -- psql}
else
  RUN_USER="" RUN_GROUP=""
  PG_ADMIN=${PG_ADMIN:-psql}
fi
# The role the workers connect as: their user's name (peer authentication).
DB_ROLE=${RUN_USER:-$(id -un)}

die() { echo "frontpage.sh: $*" >&2; exit 1; }
numbers() { [[ $2 =~ ^\ *[1-9][0-9]*(\ +[1-9][0-9]*)*\ *$ ]] || die "$1 must be numbers separated by spaces, not '$2'"; }
for v in CONCURRENCY ROWS_CONCURRENCY; do numbers "$v" "${!v}"; done
for v in W N AB_TIME DURATION WRK_THREADS; do numbers "$v" "${!v}"; [[ ${!v} != *" "* ]] || die "$v must be one number"; done
[[ $WARMUP =~ ^[0-9]+$ ]] || die "WARMUP must be a number, not '$WARMUP'"
[[ $PG_DB =~ ^[a-z_][a-z0-9_]*$ ]] || die "PG_DB must be a plain lower-case name, not '$PG_DB'"
for d in $DBS; do case $d in sqlite | postgres) ;; *) die "DBS: unknown database '$d' (sqlite, postgres)" ;; esac; done
for s in $SERVERS_SEL; do case $s in appsrv | mod_php | php-fpm) ;; *) die "SERVERS: unknown server '$s' (appsrv, mod_php, php-fpm)" ;; esac; done
for t in $TOOLS $ROWS_TOOLS; do case $t in ab | wrk) ;; *) die "TOOLS: unknown tool '$t' (ab, wrk)" ;; esac; done
for k in $KEEPALIVE $ROWS_KEEPALIVE; do case $k in 0 | 1) ;; *) die "KEEPALIVE: 1 or 0, not '$k'" ;; esac; done
for p in $PAGES; do [[ $p =~ ^/(rows\?n=[0-9]+)?$ ]] || die "PAGES: '$p' is not / or /rows?n=N"; done
levels() { tr -s ' ' '\n' <<<"$1" | grep . | sort -n | uniq | tr '\n' ' ' | sed 's/ $//'; }
CONCURRENCY=$(levels "$CONCURRENCY") ROWS_CONCURRENCY=$(levels "$ROWS_CONCURRENCY")

missing=()
[ -x "$NGINX" ] || missing+=(nginx)
{ [ -x "$APACHE" ] && [ -f "$APACHE_MODULES/mod_mpm_prefork.so" ]; } || missing+=(apache2)
[ -n "$LIBPHP" ] || missing+=(libapache2-mod-php)
[ -n "$PHP_FPM" ] || missing+=(php-fpm)
command -v ab >/dev/null || missing+=(apache2-utils)
command -v wrk >/dev/null || missing+=(wrk)
command -v python3 >/dev/null || missing+=(python3)
command -v curl >/dev/null || missing+=(curl)
# (Captured first: grep -q would end the pipe early, and pipefail would fail it.)
PHP_MODULES=$([ -z "$PHP_FPM" ] || "$PHP_FPM" -m 2>/dev/null || true)
php_has() { grep -qx "$1" <<<"$PHP_MODULES"; }
[ -z "$PHP_FPM" ] || php_has pdo_sqlite || missing+=(php-sqlite3)
[ -z "$PHP_FPM" ] || php_has pdo_pgsql || missing+=(php-pgsql)
[ ${#missing[@]} -eq 0 ] || die "missing ${missing[*]}; install with: apt-get install -y ${missing[*]}"

if [ -z "${EX:-}" ]; then
  cargo build --release --quiet --example frontpage
  EX=${CARGO_TARGET_DIR:-target}/release/examples
fi
[ -x "$EX/frontpage" ] || die "no frontpage in $EX"

work=$(mktemp -d)
LOAD=""   # the load tool running now (killed at exit)
SRV=()    # the masters of the server running now (stopped at exit)
PG_MADE=0
cleanup() {
  trap - EXIT INT TERM
  [ -z "$LOAD" ] || kill "$LOAD" 2>/dev/null || true
  stop_server
  wait 2>/dev/null || true
  if [ "$PG_MADE" = 1 ] && [ "${KEEP_DB:-0}" != 1 ]; then
    $PG_ADMIN -X -q -h "$PG_HOST" -p "$PG_PORT" -c "DROP DATABASE IF EXISTS $PG_DB WITH (FORCE)" >/dev/null 2>&1 || true
  fi
  if [ "${KEEP_WORK:-0}" = 1 ]; then
    echo "frontpage.sh: the servers' configurations and logs are in $work (KEEP_WORK=1)" >&2
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# The workers (nobody when started as root) must reach the database and the PHP files.
chmod 755 "$work"
mkdir -m 755 "$work/php" "$work/ref"
cp bench/frontpage/*.php "$work/php/"
chmod 644 "$work/php/"*.php
mkdir -p "$RESULTS"

# started PID: a master of the running server.
started() { SRV+=("$1"); }

# stop_server: stops the running server's masters (SIGTERM) and waits for them and their
# children; a process still there after 10 s is killed (by its pid) and reported.
stop_server() {
  local p all left
  [ ${#SRV[@]} -gt 0 ] || return 0
  all=$(server_pids "${SRV[@]}" | tr '\n' ' ')
  for p in "${SRV[@]}"; do kill "$p" 2>/dev/null || true; done
  for _ in $(seq 100); do
    left=""
    for p in $all; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
    [ -n "$left" ] || break
    sleep 0.1
  done
  if [ -n "$left" ]; then
    echo "frontpage.sh: still running 10 s after the stop, killed:$left" >&2
    # shellcheck disable=SC2086 # pids
    kill -KILL $left 2>/dev/null || true
  fi
  for p in "${SRV[@]}"; do wait "$p" 2>/dev/null || true; done
  SRV=()
}

# ---------------------------------------------------------------------------------------
# The databases.

pg_available() {
  command -v psql >/dev/null || { echo "no psql (apt-get install -y postgresql)"; return 1; }
  local out
  if ! out=$($PG_ADMIN -X -At -h "$PG_HOST" -p "$PG_PORT" -c 'SELECT 1' 2>&1); then
    echo "no PostgreSQL server answers on $PG_HOST port $PG_PORT ($PG_ADMIN: $(tail -1 <<<"$out"))"
    return 1
  fi
  if [ "$($PG_ADMIN -X -At -h "$PG_HOST" -p "$PG_PORT" -c "SELECT 1 FROM pg_roles WHERE rolname = '$DB_ROLE'")" != 1 ]; then
    echo "PostgreSQL has no role '$DB_ROLE' (the workers' user): CREATE ROLE $DB_ROLE LOGIN"
    return 1
  fi
}

pg_recreate() {
  PG_MADE=1
  $PG_ADMIN -X -q -v ON_ERROR_STOP=1 -h "$PG_HOST" -p "$PG_PORT" -c 'SET client_min_messages = warning' \
    -c "DROP DATABASE IF EXISTS $PG_DB WITH (FORCE)" -c "CREATE DATABASE $PG_DB OWNER $DB_ROLE" >/dev/null \
    || die "cannot create the PostgreSQL database $PG_DB"
}

# pg_started: when the PostgreSQL server started ("down" if it does not answer). The
# cluster may be shared (other people's tests restart it): a change during a server's
# cells makes them invalid, and the summary says so.
pg_started() {
  $PG_ADMIN -X -At -h "$PG_HOST" -p "$PG_PORT" -c 'SELECT pg_postmaster_start_time()' 2>/dev/null || echo down
}

# pg_wait: waits up to 60 s for the server to answer (someone else may be restarting it).
pg_wait() {
  local i
  for i in $(seq 120); do
    [ "$(pg_started)" != down ] && return 0
    [ "$i" = 1 ] && echo "frontpage.sh: PostgreSQL does not answer; waiting up to 60 s" >&2
    sleep 0.5
  done
  die "PostgreSQL on $PG_HOST port $PG_PORT does not answer"
}

# set_db DB: APPSRV_DB (appsrv's --database) and PHP_DSN (PDO's) of database DB.
set_db() {
  case $1 in
    sqlite)
      APPSRV_DB=sqlite:$work/sqlite/frontpage.db
      PHP_DSN=sqlite:$work/sqlite/frontpage.db
      ;;
    postgres)
      APPSRV_DB="postgres:///$PG_DB?host=$PG_HOST&port=$PG_PORT"
      PHP_DSN="pgsql:host=$PG_HOST;port=$PG_PORT;dbname=$PG_DB;user=$DB_ROLE"
      ;;
  esac
}

# db_pids DB: the processes whose CPU is the database's: PostgreSQL's backends connected
# to PG_DB as DB_ROLE (nothing for SQLite).
db_pids() {
  [ "$1" = postgres ] || return 0
  pgrep -f "^postgres: .*: $DB_ROLE $PG_DB " || true
}

# db_counters DB: proc_counters of db_pids ("0 0 " when there are none).
db_counters() {
  local pids
  pids=$(db_pids "$1")
  if [ -z "$pids" ]; then echo "0 0 "; return; fi
  # shellcheck disable=SC2086 # pids
  proc_counters $pids
}

# ---------------------------------------------------------------------------------------
# The servers. Each start_* sets PORT and appends the master(s) to SRV.

start_appsrv() {
  PORT=""
  # shellcheck disable=SC2086 # --user nobody when root
  "$EX/frontpage" --database "$APPSRV_DB" -l 127.0.0.1:0 --io blocking -w "$W" \
    ${RUN_USER:+--user $RUN_USER} 2>"$work/appsrv.log" &
  started $!
  PORT=$(ready_port "$work/appsrv.log" 60)
  [ -n "$PORT" ] || { cat "$work/appsrv.log" >&2; die "appsrv's frontpage did not start"; }
}

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
pm = static
pm.max_children = $W
pm.max_requests = 0
catch_workers_output = no
EOF
  "$PHP_FPM" -t -y "$d/php-fpm.conf" >"$work/php-fpm.log" 2>&1 \
    || { cat "$work/php-fpm.log" >&2; die "bad PHP-FPM configuration"; }
  "$PHP_FPM" -F -y "$d/php-fpm.conf" >>"$work/php-fpm.log" 2>&1 &
  started $!
}

# fastcgi LOCATION SCRIPT: an nginx location passing LOCATION to PHP-FPM's SCRIPT.
fastcgi() {
  cat <<EOF
        location = $1 {
            fastcgi_pass unix:$work/fpm/fpm.sock;
            fastcgi_param SCRIPT_FILENAME $work/php/$2;
            fastcgi_param SCRIPT_NAME /$2;
            fastcgi_param FRONTPAGE_DSN "$PHP_DSN";
            fastcgi_param QUERY_STRING \$query_string;
            fastcgi_param REQUEST_METHOD \$request_method;
            fastcgi_param CONTENT_TYPE \$content_type;
            fastcgi_param CONTENT_LENGTH \$content_length;
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
        }
EOF
}

start_nginx_fpm() {
  PORT=$(free_port)
  local d=$work/nginx
  mkdir -p "$d"
  cat >"$d/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes 2;
worker_rlimit_nofile 16384;
${RUN_USER:+user $RUN_USER $RUN_GROUP;}
pid $d/nginx.pid;
error_log $work/nginx.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_timeout 5s;
    keepalive_requests 1000;
    default_type application/octet-stream;
    client_body_temp_path $d/body;
    proxy_temp_path $d/proxy;
    fastcgi_temp_path $d/fastcgi;
    uwsgi_temp_path $d/uwsgi;
    scgi_temp_path $d/scgi;
    server {
        listen 127.0.0.1:$PORT;
$(fastcgi / front.php)
$(fastcgi /rows rows.php)
        location / { return 404; }
    }
}
EOF
  "$NGINX" -t -q -p "$d" -e "$work/nginx.log" -c "$d/nginx.conf" \
    || { cat "$work/nginx.log" >&2; die "bad nginx configuration"; }
  "$NGINX" -p "$d" -e "$work/nginx.log" -c "$d/nginx.conf" &
  started $!
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
LoadModule env_module $m/mod_env.so
LoadModule php_module $LIBPHP
${RUN_USER:+User $RUN_USER}
${RUN_GROUP:+Group $RUN_GROUP}
StartServers $W
MinSpareServers $W
MaxSpareServers $W
ServerLimit $W
MaxRequestWorkers $W
MaxConnectionsPerChild 0
KeepAlive On
MaxKeepAliveRequests 1000
KeepAliveTimeout 5
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
AliasMatch "^/\$" "$work/php/front.php"
AliasMatch "^/rows\$" "$work/php/rows.php"
<FilesMatch "\\.php\$">
    SetHandler application/x-httpd-php
</FilesMatch>
SetEnv FRONTPAGE_DSN "$PHP_DSN"
EOF
  "$APACHE" -t -d "$d" -f "$d/apache2.conf" >"$work/apache.log" 2>&1 \
    || { cat "$work/apache.log" >&2; die "bad Apache configuration"; }
  # Its own session: at shutdown prefork signals its whole process group (killpg), which
  # in the foreground would be this script's. setsid execs Apache: $! is its pid.
  setsid "$APACHE" -d "$d" -f "$d/apache2.conf" -DFOREGROUND 2>>"$work/apache.log" &
  started $!
}

start_server() {
  case $1 in
    appsrv) start_appsrv ;;
    mod_php) start_apache ;;
    php-fpm) start_fpm; start_nginx_fpm ;;
  esac
}

server_name() {
  case $1 in
    appsrv) echo "appsrv --io blocking -w $W" ;;
    mod_php) echo "Apache prefork + mod_php" ;;
    php-fpm) echo "nginx + PHP-FPM" ;;
  esac
}

server_log() {
  case $1 in
    appsrv) tail -20 "$work/appsrv.log" ;;
    mod_php) tail -20 "$work/apache.log" ;;
    php-fpm) tail -10 "$work/nginx.log"; tail -10 "$work/php-fpm.log" ;;
  esac 2>/dev/null || true
}

# fetch URL FILE: the body into FILE; prints the status (000: no answer).
fetch() { curl -s --noproxy '*' -m 10 -o "$2" -w '%{http_code}' "$1" || true; }

# CHECKED: the pages every server is compared on (the four of the issue, and PAGES).
CHECKED=$(tr ' ' '\n' <<<"/ /rows?n=5 /rows?n=36 /rows?n=134 $PAGES" | awk 'NF && !seen[$0]++' | tr '\n' ' ')
ref_file() { echo "$work/ref/$1$(tr -c 'a-z0-9' _ <<<"$2")"; }

# reference DB: the bodies appsrv gives right after creating and seeding DB.
reference() {
  local page status f
  for page in $CHECKED; do
    f=$(ref_file "$1" "$page")
    status=$(fetch "http://127.0.0.1:$PORT$page" "$f")
    [ "$status" = 200 ] || { server_log appsrv >&2; die "$1: appsrv answers $page with $status"; }
  done
}

# check DB SERVER: every checked page 200 and byte-identical to the reference, waiting up
# to 10 s for the server (behind nginx: PHP-FPM) to answer at all.
check() {
  local page status f=$work/got
  for _ in $(seq 100); do
    status=$(fetch "http://127.0.0.1:$PORT/" "$f")
    [ "$status" = 200 ] && break
    sleep 0.1
  done
  for page in $CHECKED; do
    status=$(fetch "http://127.0.0.1:$PORT$page" "$f")
    if [ "$status" != 200 ] || ! cmp "$f" "$(ref_file "$1" "$page")" >&2; then
      echo "frontpage.sh: $1: $(server_name "$2") answers $page with status $status and a body other than appsrv's:" >&2
      diff <(head -c 100000 "$(ref_file "$1" "$page")") <(head -c 100000 "$f") | head -20 >&2 || true
      server_log "$2" >&2
      exit 1
    fi
  done
}

warm_up() {
  [ "$WARMUP" -gt 0 ] || return 0
  timeout $((WARMUP + 30)) ab -q -r -s 10 -k -c $((2 * W)) -t "$WARMUP" -n 100000000 \
    "http://127.0.0.1:$PORT/" >/dev/null 2>&1 || true
}

# ---------------------------------------------------------------------------------------
# One cell: run_cell DB SERVER PAGE TOOL KEEPALIVE C appends a CSV line.

CSV=$RESULTS/frontpage.csv
echo "db,server,page,tool,keepalive,c,requests,rps,failed,non2xx,cpu_us_per_req,db_cpu_us_per_req,pss_kib" >"$CSV.tmp"

run_cell() {
  local db=$1 srv=$2 page=$3 tool=$4 ka=$5 c=$6 url out=$work/load.out cmd pid rc n
  local before dbefore after dafter pss=0 kb requests rps failed non2xx cpu dbcpu t gone
  url="http://127.0.0.1:$PORT$page"
  case $tool in
    ab)
      n=$((N > c ? N : c))
      cmd=(timeout $((AB_TIME + 60)) ab -q -r -s 10 -t "$AB_TIME" -n "$n" -c "$c")
      [ "$ka" = 1 ] && cmd+=(-k)
      ;;
    wrk)
      t=$((WRK_THREADS < c ? WRK_THREADS : c))
      cmd=(timeout $((DURATION + 60)) wrk -t "$t" -c "$c" -d "${DURATION}s" --timeout 10s)
      [ "$ka" = 0 ] && cmd+=(-H 'Connection: close')
      ;;
  esac
  before=$(proc_counters "${SRV[@]}") dbefore=$(db_counters "$db")
  "${cmd[@]}" "$url" >"$out" 2>&1 &
  pid=$! LOAD=$!
  # PSS while it runs: the largest of one sample a second.
  while kill -0 "$pid" 2>/dev/null; do
    sleep 0.5
    kill -0 "$pid" 2>/dev/null || break
    read -r kb _ < <(pss_kb "${SRV[@]}")
    [ "$kb" -gt "$pss" ] && pss=$kb
  done
  rc=0
  wait "$pid" || rc=$?
  LOAD=""
  after=$(proc_counters "${SRV[@]}") dafter=$(db_counters "$db")
  if [ "$pss" = 0 ]; then read -r pss _ < <(pss_kb "${SRV[@]}"); fi
  case $tool in
    ab)
      requests=$(awk '/^Complete requests:/ { print $3 }' "$out")
      rps=$(awk '/^Requests per second:/ { print $4 }' "$out")
      failed=$(awk '/^Failed requests:/ { print $3 }' "$out")
      non2xx=$(awk '/^Non-2xx responses:/ { print $3 }' "$out")
      ;;
    wrk)
      requests=$(awk '/ requests in / { print $1 }' "$out")
      rps=$(awk '/^Requests\/sec:/ { print $2 }' "$out")
      failed=$(awk '/Socket errors:/ { gsub(",", ""); print $4 + $6 + $8 + $10 }' "$out")
      non2xx=$(awk '/Non-2xx or 3xx responses:/ { print $5 }' "$out")
      ;;
  esac
  if [ "$rc" != 0 ] || [ -z "$requests" ] || [ -z "$rps" ]; then
    echo "frontpage.sh: $db $srv $page $tool keep-alive=$ka c=$c did not finish (exit $rc): $(tail -2 "$out" | tr '\n' ' ')" >&2
    requests=${requests:-0} rps=""
  fi
  failed=${failed:-0} non2xx=${non2xx:-0}
  [ "$failed" = 0 ] && [ "$non2xx" = 0 ] \
    || echo "frontpage.sh: $db $srv $page $tool keep-alive=$ka c=$c: $failed failed, $non2xx non-2xx: $(grep -E -A1 '^(Failed requests|Non-2xx)|Socket errors' "$out" | tr -s ' \n' ' ')" >&2
  read -r cpu _ _ < <(per_request "$before" "$after" "$requests")
  if [ "$db" = sqlite ]; then
    dbcpu=in-process
  else
    read -r dbcpu _ gone < <(per_request "$dbefore" "$dafter" "$requests")
    # A backend that ended during the run took its CPU time with it: no figure.
    if [ "$gone" != 0 ]; then
      echo "frontpage.sh: $db $srv $page $tool keep-alive=$ka c=$c: $gone PostgreSQL backend(s) ended during the run: no database CPU figure" >&2
      dbcpu=""
    fi
  fi
  rps=${rps:+$(printf '%.0f' "$rps")}
  echo "$db,$srv,$page,$tool,$ka,$c,$requests,$rps,$failed,$non2xx,$cpu,$dbcpu,$pss" >>"$CSV.tmp"
  printf 'frontpage.sh:   %-10s %-8s %-12s %-3s ka=%s c=%-4s %7s req/s  failed %s  non-2xx %s  cpu %s µs  db %s  pss %s KiB\n' \
    "$db" "$srv" "$page" "$tool" "$ka" "$c" "${rps:--}" "$failed" "$non2xx" "$cpu" "$dbcpu" "$pss" >&2
}

# ---------------------------------------------------------------------------------------

versions() {
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "settings: DBS=\"$DBS\" SERVERS=\"$SERVERS_SEL\" W=$W PAGES=\"$PAGES\" TOOLS=\"$TOOLS\" KEEPALIVE=\"$KEEPALIVE\" CONCURRENCY=\"$CONCURRENCY\" ROWS_TOOLS=\"$ROWS_TOOLS\" ROWS_KEEPALIVE=\"$ROWS_KEEPALIVE\" ROWS_CONCURRENCY=\"$ROWS_CONCURRENCY\" N=$N AB_TIME=$AB_TIME DURATION=$DURATION WARMUP=$WARMUP WRK_THREADS=$WRK_THREADS"
  echo "appsrv: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- crates/appsrv 2>/dev/null || echo ' (crates/appsrv modified)')"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine shares its CPUs)"
  echo "machine: $(nproc) CPUs, $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo), $(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), Linux $(uname -r)"
  echo "nginx: $("$NGINX" -v 2>&1 | sed 's/.*nginx\///')"
  echo "apache: $("$APACHE" -v | sed -n 's/^Server version: Apache\///p')"
  echo "php-fpm: $("$PHP_FPM" -v | head -1 | cut -d' ' -f2); mod_php: $(basename "$LIBPHP")"
  echo "ab: $(ab -V | sed -n 's/.*Version \([^ ]*\).*/\1/p' | head -1); wrk: $(wrk -v 2>&1 | head -1 | cut -d' ' -f2)"
  command -v psql >/dev/null && echo "postgresql: $($PG_ADMIN -X -At -h "$PG_HOST" -p "$PG_PORT" -c 'SHOW server_version' 2>/dev/null || echo 'not running')"
  return 0
}
versions >"$work/env.txt"
echo "frontpage.sh: $(sed -n 2p "$work/env.txt")" >&2

SKIPPED=()
NOTES=()
DONE_DBS=""
for db in $DBS; do
  if [ "$db" = postgres ]; then
    if ! why=$(pg_available); then
      echo "frontpage.sh: PostgreSQL skipped: $why" >&2
      SKIPPED+=("postgres: $why")
      continue
    fi
    pg_recreate
  fi
  set_db "$db"
  # The data: appsrv creates it (SQLite: the master; PostgreSQL: the first worker), and
  # its pages right after are the reference every server must give.
  echo "frontpage.sh: $db: loading the schema and the seed data with appsrv's frontpage" >&2
  start_appsrv
  reference "$db"
  stop_server
  for srv in $SERVERS_SEL; do
    echo "frontpage.sh: $db: $(server_name "$srv")" >&2
    if [ "$db" = postgres ]; then pg_wait; pg_t0=$(pg_started); fi
    start_server "$srv"
    check "$db" "$srv"
    warm_up
    for page in $PAGES; do
      if [ "$page" = / ]; then
        tools=$TOOLS kas=$KEEPALIVE cs=$CONCURRENCY
      else
        tools=$ROWS_TOOLS kas=$ROWS_KEEPALIVE cs=$ROWS_CONCURRENCY
      fi
      for tool in $tools; do
        for ka in $kas; do
          for c in $cs; do run_cell "$db" "$srv" "$page" "$tool" "$ka" "$c"; done
        done
      done
    done
    stop_server
    if [ "$db" = postgres ] && [ "$(pg_started)" != "$pg_t0" ]; then
      echo "frontpage.sh: PostgreSQL restarted or went down while $(server_name "$srv") was measured: its postgres cells are not valid" >&2
      NOTES+=("PostgreSQL restarted or went down while $(server_name "$srv") was measured (started $pg_t0, now $(pg_started)): its postgres cells are not valid")
    fi
  done
  DONE_DBS="$DONE_DBS $db"
done
# The same data on both databases should give the same pages (not a condition of the
# benchmark: each server is compared with appsrv on the same database).
if [[ " $DONE_DBS " == *" sqlite "* && " $DONE_DBS " == *" postgres "* ]]; then
  for page in $CHECKED; do
    cmp -s "$(ref_file sqlite "$page")" "$(ref_file postgres "$page")" \
      || NOTES+=("appsrv's $page differs between SQLite and PostgreSQL")
  done
fi

mv "$CSV.tmp" "$CSV"
cp "$work/env.txt" "$RESULTS/env-frontpage.txt"
[ ${#SKIPPED[@]} -eq 0 ] || printf 'skipped: %s\n' "${SKIPPED[@]}" >>"$RESULTS/env-frontpage.txt"
[ ${#NOTES[@]} -eq 0 ] || printf 'note: %s\n' "${NOTES[@]}" >>"$RESULTS/env-frontpage.txt"

# ---------------------------------------------------------------------------------------
# The summary, from the CSV.
python3 - "$CSV" "$W" "$(nproc)" <<'EOF'
import csv, sys
from collections import defaultdict

rows = list(csv.DictReader(open(sys.argv[1])))
w, cpus = sys.argv[2], sys.argv[3]
NAMES = {"appsrv": f"appsrv --io blocking -w {w}", "mod_php": "Apache prefork + mod_php",
         "php-fpm": "nginx + PHP-FPM"}
DBNAME = {"sqlite": "SQLite", "postgres": "PostgreSQL"}
TOOLKA = lambda t, k: f"{t}{' -k' if (t == 'ab' and k == '1') else ''}" + (
    "" if t == "ab" else (" (keep-alive)" if k == "1" else " (Connection: close)"))

def order(xs, key):
    seen = []
    for x in xs:
        if key(x) not in seen:
            seen.append(key(x))
    return seen

cell = {(r["db"], r["server"], r["page"], r["tool"], r["keepalive"], r["c"]): r for r in rows}
dbs = order(rows, lambda r: r["db"])
servers = order(rows, lambda r: r["server"])
pages = order(rows, lambda r: r["page"])
peers = [s for s in servers if s != "appsrv"]

def num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None

def rps_text(r):
    t = r["rps"] or "-"
    bad = int(r["failed"] or 0) + int(r["non2xx"] or 0)
    return t + (f" ({bad} failed)" if bad else "")

print(f"Requests per second ({cpus} CPUs, client on the same machine; W = {w} workers each)")
for db in dbs:
    for page in pages:
        sub = [r for r in rows if r["db"] == db and r["page"] == page]
        if not sub:
            continue
        cs = order(sorted(sub, key=lambda r: int(r["c"])), lambda r: r["c"])
        combos = order(sub, lambda r: (r["tool"], r["keepalive"]))
        print(f"\n{DBNAME[db]}, `{page}`:\n")
        print("| server | load | " + " | ".join(f"c={c}" for c in cs) + " |")
        print("|---|---|" + "---|" * len(cs))
        for s in servers:
            for t, k in combos:
                if not any((db, s, page, t, k, c) in cell for c in cs):
                    continue
                print(f"| {NAMES[s]} | {TOOLKA(t, k)} | " + " | ".join(
                    rps_text(cell[(db, s, page, t, k, c)]) if (db, s, page, t, k, c) in cell else "-" for c in cs) + " |")
        if "appsrv" in servers and peers:
            print("\nappsrv / peer, requests per second:\n")
            print("| peer | load | " + " | ".join(f"c={c}" for c in cs) + " |")
            print("|---|---|" + "---|" * len(cs))
            for p in peers:
                for t, k in combos:
                    out = []
                    for c in cs:
                        a, b = cell.get((db, "appsrv", page, t, k, c)), cell.get((db, p, page, t, k, c))
                        x, y = num(a and a["rps"]), num(b and b["rps"])
                        out.append(f"{x / y:.2f}" if x and y else "-")
                    print(f"| {NAMES[p]} | {TOOLKA(t, k)} | " + " | ".join(out) + " |")

print("\nCPU per request, µs (server / database; the mean over all of a page's cells, and the"
      " range), SQLite's in the server's process:\n")
print("| database | page | " + " | ".join(NAMES[s] for s in servers) + " |")
print("|---|---|" + "---|" * len(servers))
for db in dbs:
    for page in pages:
        out = []
        for s in servers:
            sub = [r for r in rows if r["db"] == db and r["page"] == page and r["server"] == s]
            cpu = [num(r["cpu_us_per_req"]) for r in sub if num(r["cpu_us_per_req"]) is not None]
            dbc = [num(r["db_cpu_us_per_req"]) for r in sub if num(r["db_cpu_us_per_req"]) is not None]
            if not cpu:
                out.append("-")
                continue
            t = f"{sum(cpu) / len(cpu):.0f} ({min(cpu):.0f}–{max(cpu):.0f})"
            t += f" / {sum(dbc) / len(dbc):.0f} ({min(dbc):.0f}–{max(dbc):.0f})" if dbc else " / in-process"
            out.append(t)
        print(f"| {DBNAME[db]} | `{page}` | " + " | ".join(out) + " |")

cmax = max(int(r["c"]) for r in rows) if rows else 0
print(f"\nAt c={cmax}: failed requests (failed + non-2xx, summed over the page's cells at c={cmax})"
      f" and PSS (the largest sample, MiB):\n")
print("| database | server | " + " | ".join(f"`{p}` failed" for p in pages) + " | PSS | PSS / appsrv's |")
print("|---|---|" + "---|" * (len(pages) + 2))
for db in dbs:
    pss = {}
    for s in servers:
        sub = [r for r in rows if r["db"] == db and r["server"] == s and int(r["c"]) == cmax]
        pss[s] = max((int(r["pss_kib"] or 0) for r in sub), default=0)
    for s in servers:
        fails = []
        for page in pages:
            sub = [r for r in rows if r["db"] == db and r["server"] == s and r["page"] == page and int(r["c"]) == cmax]
            fails.append(str(sum(int(r["failed"] or 0) + int(r["non2xx"] or 0) for r in sub)) if sub else "-")
        ratio = f"{pss[s] / pss['appsrv']:.2f}" if pss.get("appsrv") else "-"
        print(f"| {DBNAME[db]} | {NAMES[s]} | " + " | ".join(fails) + f" | {pss[s] / 1024:.1f} | {ratio} |")
EOF
[ ${#SKIPPED[@]} -eq 0 ] || printf '\nSkipped: %s\n' "${SKIPPED[@]}"
[ ${#NOTES[@]} -eq 0 ] || printf '\nNote: %s\n' "${NOTES[@]}"
