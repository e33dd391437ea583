#!/usr/bin/env bash
# Async handlers in event workers (issue 33), measured: appsrv's async examples against the
# blocking and hybrid models that would otherwise carry a waiting handler, the sync event
# handler, axum (bench/axum: axum-peer, the Rust peer) and nginx + PHP-FPM, on loopback.
# Every figure of a part comes from one run (runs vary by 20 % and more on a shared
# machine: compare within a run only). Writes bench/results/async.csv
# (part,server,case,metric,value) and bench/results/env-async.txt (the settings, versions
# and the load average at start), and prints markdown tables, each row with its goal.
#
#   bench/async.sh                                  every part: about 8 minutes on 2 CPUs
#                                                   (9 with PHP-FPM), after the build
#   PARTS="sleep hello" bench/async.sh
#   DURATION=1 PARTS=sleep SLEEP_CONCURRENCY=20 bench/async.sh        a smoke run
#   EX=/tmp/b/release/examples AXUM=/tmp/axum-peer bench/async.sh   prebuilt binaries
#
# Parts (PARTS, default "sleep hello frontpage memory smtp"); about how long each takes:
#   sleep      (~1.5 min) GET /sleep?ms=SLEEP_MS (50: a handler that waits, the database
#              stand-in), keep-alive, wrk -t2 -d10s --latency --timeout 5s at
#              c = SLEEP_CONCURRENCY (100 1000): async_hello -w 2 (the timer is a tokio
#              timer: no thread, no blocked process), http_hello --io blocking -w 256 and
#              --io hybrid -w 32 (the handler blocks its process), axum-peer --threads 2.
#              Requests/s, p50, p99, errors (wrk's socket errors + non-2xx). Goal (async):
#              requests/s >= 0.9 x c / SLEEP_MS and p99 <= SLEEP_MS + 30 ms (80 ms).
#   hello      (~3.5 min) GET / (13 bytes), keep-alive, wrk -t2 -d5s at c = 8, 32, 256:
#              async_hello -w 2, http_hello --io event -w 2 (the same page from a sync
#              handler in the same loop), axum-peer --threads 2, taking turns in each cell
#              (a fresh start and WARMUP s unmeasured each), HELLO_ROUNDS (3) rounds, the
#              median kept. Requests/s, errors, and the
#              server's CPU µs per request (all its processes and threads: bench/lib.sh
#              proc_counters before and after the run, per_request). Goals: async CPU per
#              request <= 1.15 x the sync event handler's; async requests/s >= 1.0 x axum's.
#   frontpage  (~4 min, 5 with PHP-FPM; n/a without PostgreSQL) the front page of issue
#              20 on PostgreSQL (crates/appsrv-frontpage/examples/frontpage.rs): pages FP_PAGES
#              (/ /rows?n=5 /rows?n=36 /rows?n=134), keep-alive, wrk -t2 -d5s --timeout 10s
#              at c = 32, 128, 500, after a 2 s unmeasured warm-up of each server:
#                frontpage-async     --io event -w ASYNC_W (2) --db-connections
#                                    FP_DB_CONNECTIONS (4): the async mode, when this
#                                    build's `frontpage --help` has --db-connections
#                                    (else n/a); --db-connections is per worker
#                frontpage-blocking  --io blocking -w W (8): a connection per worker
#                axum-peer           --threads 2 --db-connections ASYNC_W x
#                                    FP_DB_CONNECTIONS (8: the async mode's total)
#                nginx+php-fpm       bench/frontpage/*.php, the set-up of bench/frontpage.sh
#                                    (nginx worker_processes 2, PHP-FPM pm = static,
#                                    pm.max_children = W, opcache from Debian's php.ini);
#                                    n/a when php-fpm or pdo_pgsql is not installed
#              Requests/s, errors, the server's CPU µs per request (php: nginx's and
#              PHP-FPM's processes) and the database's (the PostgreSQL backends connected
#              to PG_DB as the workers' role, as bench/frontpage.sh measures it). Goals per
#              page and c: async requests/s >= 1.0 x axum's with server CPU per request <=
#              axum's, and >= 3 x nginx + PHP-FPM's. Before any load, bench/axum/check.sh
#              compares each frontpage mode with axum-peer (status, Content-Type, body of
#              the four pages and FP_PAGES): a difference fails the part; nginx + PHP-FPM's
#              bodies must equal frontpage's (cmp, as bench/frontpage.sh checks them).
#   memory     (~0.5 min) MEM_CONNECTIONS (10,000) keep-alive connections to async_hello
#              -w 2 --backlog 4096, each with one GET /sleep?ms=MEM_SLEEP_MS (10000) in
#              flight (a python3 selectors client; each answer is followed at once by the
#              next request, so the count stays up), held for MEM_SETTLE (2) s, then while
#              they are in flight: the PSS of the server's processes (bench/lib.sh pss_kb;
#              goal <= 64 MiB), the time of MEM_PROBES (5) new clients' GET / one after the
#              other (curl; goal: the slowest < 100 ms), and `async_hello status --json`'s
#              event.requests_in_flight (the workers' sum; n/a in a build without it) and
#              event.open. Goal too: every connection open (none refused or closed).
#   smtp       (~0.5 min; n/a without the smtp_sink example) smtp_sink -w 2 --backlog 4096
#              --maildir DIR: SMTP_IDLE (5,000) sessions connected, greeting read, then
#              idle; with them open, the time a new session waits for its 220 greeting
#              (goal < 1 s); then SMTP_SESSIONS (200) smtplib sessions at once (python3
#              threads), each delivering one message: the time, the sessions that
#              succeeded and the files in DIR (outside DIR/tmp) after them (goal: 200);
#              and how many idle sessions were still open at the end.
#
#   setting            default                      meaning
#   PARTS              sleep hello frontpage memory smtp
#   DURATION           (per part)                   wrk seconds for every part (a smoke run:
#                                                   1); else SLEEP_DURATION 10,
#                                                   HELLO_DURATION 5, FP_DURATION 5
#   CONCURRENCY        (per part)                   c levels for every wrk part; else
#                                                   SLEEP_CONCURRENCY "100 1000",
#                                                   HELLO_CONCURRENCY "8 32 256",
#                                                   FP_CONCURRENCY "32 128 500"
#   WRK_THREADS        2                            wrk -t (at most c)
#   SLEEP_MS           50                           the sleep part's /sleep?ms=
#   FP_PAGES           "/ /rows?n=5 /rows?n=36 /rows?n=134"
#   ASYNC_W            2                            frontpage-async's workers
#   FP_DB_CONNECTIONS  4                            its --db-connections (per worker)
#   W                  8                            frontpage-blocking's workers, PHP-FPM's
#                                                   children
#   WARMUP             2                            seconds of unmeasured load per
#                                                   frontpage server (0: none)
#   PG_DB              async_bench                  the PostgreSQL database: created at the
#                                                   start of the frontpage part, owned by
#                                                   the workers' role, seeded by frontpage,
#                                                   dropped at its end unless KEEP_DB=1 (a
#                                                   name of its own: frontpage.sh's
#                                                   frontpage_bench may be in use)
#   PG_HOST PG_PORT    /var/run/postgresql 5432
#   PG_ADMIN           runuser -u postgres -- psql  psql as a superuser (as root; else psql)
#   MEM_CONNECTIONS    10000                        the memory part's connections
#   MEM_SLEEP_MS       10000                        their /sleep?ms= (the example's largest)
#   MEM_SETTLE         2                            seconds held before measuring
#   MEM_PROBES         5                            new clients timed
#   SMTP_IDLE          5000                         idle SMTP sessions
#   SMTP_SESSIONS      200                          delivering SMTP sessions
#   EX                 (build)                      a directory of prebuilt release examples;
#                                                   without it: cargo build --release -p
#                                                   appsrv --example async_hello --example
#                                                   http_hello --example frontpage --example
#                                                   smtp_sink (those whose source exists)
#   AXUM               (build)                      a prebuilt axum-peer; without it:
#                                                   CARGO_TARGET_DIR=AXUM_TARGET_DIR cargo
#                                                   build --release --manifest-path
#                                                   bench/axum/Cargo.toml
#   AXUM_TARGET_DIR    /work/target-axum
#   PHP_FPM NGINX      /usr/sbin/php-fpm*, nginx    the binaries for nginx + PHP-FPM
#   RESULTS            bench/results                where the CSV goes
#   KEEP_WORK          0                            1 keeps the temporary directory (logs)
#
# A part whose server or tool is missing records `n/a (why)` and the run goes on; a part
# that fails (a server that does not start, pages that differ) is reported at the end and
# the script exits 1 after the others have run. Servers run one at a time (a byte check
# runs two side by side) from a temporary directory, on free 127.0.0.1 ports; started as
# root, their workers run as nobody:nogroup, and axum-peer, when it talks to PostgreSQL,
# runs as nobody too (setpriv: peer authentication as the role `nobody`). Each part runs in
# a subshell whose trap stops its clients and servers at its end, also on a failure or
# Ctrl-C: masters get SIGTERM, and any process of theirs left after 10 s is killed by pid.
# Each run is under `timeout`; the python clients end at their own deadline. The soft
# RLIMIT_NOFILE is raised to the hard limit (the memory part needs MEM_CONNECTIONS + 200
# descriptors in its client, and says n/a when it cannot have them).
#
# The clients share the machine's CPUs with the servers: requests/s are lower bounds,
# comparable within one run; CPU per request compares the servers' own work.
# Needs wrk, curl, python3; nginx, php-fpm, php-pgsql, psql and a PostgreSQL server only
# for their parts. It installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

case ${1:-} in
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "usage: bench/async.sh (settings in the environment; --help)" >&2; exit 2 ;;
esac

die() { echo "async.sh: $*" >&2; exit 1; }
say() { echo "async.sh: $*" >&2; }

PARTS=${PARTS:-sleep hello frontpage memory smtp}
SLEEP_DURATION=${DURATION:-${SLEEP_DURATION:-10}}
HELLO_DURATION=${DURATION:-${HELLO_DURATION:-5}}
FP_DURATION=${DURATION:-${FP_DURATION:-5}}
SLEEP_CONCURRENCY=${CONCURRENCY:-${SLEEP_CONCURRENCY:-100 1000}}
HELLO_CONCURRENCY=${CONCURRENCY:-${HELLO_CONCURRENCY:-8 32 256}}
HELLO_ROUNDS=${HELLO_ROUNDS:-3}
FP_CONCURRENCY=${CONCURRENCY:-${FP_CONCURRENCY:-32 128 500}}
WRK_THREADS=${WRK_THREADS:-2}
SLEEP_MS=${SLEEP_MS:-50}
FP_PAGES=${FP_PAGES:-/ /rows?n=5 /rows?n=36 /rows?n=134}
ASYNC_W=${ASYNC_W:-2} FP_DB_CONNECTIONS=${FP_DB_CONNECTIONS:-4} W=${W:-8} WARMUP=${WARMUP:-2}
PG_DB=${PG_DB:-async_bench} PG_HOST=${PG_HOST:-/var/run/postgresql} PG_PORT=${PG_PORT:-5432}
MEM_CONNECTIONS=${MEM_CONNECTIONS:-10000} MEM_SLEEP_MS=${MEM_SLEEP_MS:-10000}
MEM_SETTLE=${MEM_SETTLE:-2} MEM_PROBES=${MEM_PROBES:-5}
SMTP_IDLE=${SMTP_IDLE:-5000} SMTP_SESSIONS=${SMTP_SESSIONS:-200}
RESULTS=${RESULTS:-bench/results}
AXUM_TARGET_DIR=${AXUM_TARGET_DIR:-/work/target-axum}
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
PHP_FPM=${PHP_FPM:-$(compgen -G '/usr/sbin/php-fpm*' | sort -V | tail -1 || true)}
if [ "$(id -u)" = 0 ]; then
  RUN_USER=nobody RUN_GROUP=nogroup
  PG_ADMIN=${PG_ADMIN:-runuser -u postgres -- psql}
  AS_RUN_USER=(setpriv --reuid=nobody --regid=nogroup --clear-groups)
else
  RUN_USER="" RUN_GROUP=""
  PG_ADMIN=${PG_ADMIN:-psql}
  AS_RUN_USER=()
fi
# The role the database connections are made as: the workers' user (peer authentication).
DB_ROLE=${RUN_USER:-$(id -un)}

numbers() { [[ $2 =~ ^\ *[1-9][0-9]*(\ +[1-9][0-9]*)*\ *$ ]] || die "$1 must be numbers separated by spaces, not '$2'"; }
for v in SLEEP_CONCURRENCY HELLO_CONCURRENCY FP_CONCURRENCY; do numbers "$v" "${!v}"; done
for v in SLEEP_DURATION HELLO_DURATION HELLO_ROUNDS FP_DURATION WRK_THREADS SLEEP_MS ASYNC_W FP_DB_CONNECTIONS W \
  MEM_CONNECTIONS MEM_SLEEP_MS MEM_PROBES SMTP_IDLE SMTP_SESSIONS; do
  numbers "$v" "${!v}"
  [[ ${!v} != *" "* ]] || die "$v must be one number"
done
for v in WARMUP MEM_SETTLE; do [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a number, not '${!v}'"; done
[ "$MEM_SLEEP_MS" -le 10000 ] || die "MEM_SLEEP_MS: async_hello sleeps at most 10000 ms"
[[ $PG_DB =~ ^[a-z_][a-z0-9_]*$ ]] || die "PG_DB must be a plain lower-case name, not '$PG_DB'"
for p in $FP_PAGES; do [[ $p =~ ^/(rows\?n=[0-9]+)?$ ]] || die "FP_PAGES: '$p' is not / or /rows?n=N"; done
for p in $PARTS; do
  case $p in sleep | hello | frontpage | memory | smtp) ;; *) die "unknown part '$p' (sleep hello frontpage memory smtp)" ;; esac
done
for tool in wrk curl python3; do command -v "$tool" >/dev/null || die "$tool is missing (apt-get install -y $tool)"; done

# The binaries: the examples whose source is in this tree (a missing one makes its parts
# n/a), and axum-peer.
NOT_BUILT=()
if [ -z "${EX:-}" ]; then
  build=()
  for e in async_hello http_hello frontpage smtp_sink; do
    if compgen -G "crates/*/examples/$e.rs" >/dev/null || compgen -G "crates/*/examples/$e/main.rs" >/dev/null; then
      build+=(--example "$e")
    else
      say "no crates/*/examples/$e.rs: its parts will say n/a"
      NOT_BUILT+=("$e")
    fi
  done
  EX=${CARGO_TARGET_DIR:-target}/release/examples
  # One build; if it fails (an example being written may not compile), each example alone,
  # and one that does not build is missing (not an older binary left in EX).
  if [ ${#build[@]} -gt 0 ] && ! cargo build --release --quiet "${build[@]}"; then
    for ((i = 1; i < ${#build[@]}; i += 2)); do
      e=${build[i]}
      cargo build --release --quiet --example "$e" 2>/dev/null \
        || { say "the example $e does not build: its parts will say n/a"; NOT_BUILT+=("$e"); }
    done
  fi
fi
if [ -z "${AXUM:-}" ]; then
  CARGO_TARGET_DIR=$AXUM_TARGET_DIR cargo build --release --quiet --manifest-path bench/axum/Cargo.toml
  AXUM=$AXUM_TARGET_DIR/release/axum-peer
fi
have() { [[ " ${NOT_BUILT[*]} " != *" $1 "* ]] && [ -x "$EX/$1" ]; }

# Descriptors: c = 1000, 10,000 held connections, 5,000 SMTP sessions.
hard=$(ulimit -Hn)
[ "$hard" = unlimited ] && hard=1048576
ulimit -n "$hard" 2>/dev/null || true

work=$(mktemp -d)
chmod 755 "$work"
main_exit() {
  if [ "${KEEP_WORK:-0}" = 1 ]; then say "logs kept in $work (KEEP_WORK=1)"; else rm -rf "$work"; fi
}
trap main_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p "$RESULTS"
CSV=$RESULTS/async.csv
echo "part,server,case,metric,value" >"$CSV"

# record PART SERVER CASE METRIC VALUE: one CSV line (commas in VALUE become ';').
record() { echo "$1,$2,$3,$4,${5//,/;}" >>"$CSV"; }

# na PART SERVER WHY: the server (or the whole part: SERVER -) could not be measured.
na() {
  record "$1" "$2" - status "n/a ($3)"
  say "$1: $2: n/a ($3)"
}

# goal PART SERVER CASE METRIC VALUE OP TARGET: records METRIC_goal ("OP TARGET") and
# METRIC_met (yes, or no also when VALUE is empty); OP is >=, <= or <.
goal() {
  local met sym
  case $6 in '>=') sym="≥" ;; '<=') sym="≤" ;; '<') sym="<" ;; *) die "goal: operator $6" ;; esac
  met=$(awk -v v="$5" -v op="$6" -v t="$7" 'BEGIN {
    if (v !~ /^-?[0-9.]+$/) { print "no"; exit }
    v += 0; t += 0
    print ((op == ">=" && v >= t) || (op == "<=" && v <= t) || (op == "<" && v < t)) ? "yes" : "no" }')
  record "$1" "$2" "$3" "${4}_goal" "$sym $7"
  record "$1" "$2" "$3" "${4}_met" "$met"
}

# ratio A B: A / B with 2 decimals (empty when either is missing or B is 0).
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && b + 0 > 0) printf "%.2f", a / b }'; }

# to_ms WRK_TIME: wrk's "812.00us", "51.02ms", "1.20s", "1.50m" in milliseconds.
to_ms() {
  awk -v v="$1" 'BEGIN {
    if (v == "") exit
    n = v + 0
    if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n += 0; else if (v ~ /m$/) n *= 60000; else if (v ~ /s$/) n *= 1000
    printf "%.2f", n }'
}

# ---------------------------------------------------------------------------------------
# Servers. The start_* functions set PORT and append the master(s) to SRV.

SRV=()   # the masters of the server(s) running now
LOAD=""  # the client running in the background now
PG_MADE=0

started() { SRV+=("$1"); }

# stop_server: SIGTERM to the masters, then waits for them and their children; a process
# still there after 10 s is killed (by its pid) and reported.
stop_server() {
  local p all left=""
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
    say "still running 10 s after the stop, killed:$left"
    # shellcheck disable=SC2086 # pids
    kill -KILL $left 2>/dev/null || true
  fi
  for p in "${SRV[@]}"; do wait "$p" 2>/dev/null || true; done
  SRV=()
}

stop_load() {
  [ -n "$LOAD" ] || return 0
  kill "$LOAD" 2>/dev/null || true
  wait "$LOAD" 2>/dev/null || true
  LOAD=""
}

# The end of a part (its subshell's EXIT trap): its client, its servers, its database.
part_cleanup() {
  stop_load
  stop_server
  if [ "$PG_MADE" = 1 ] && [ "${KEEP_DB:-0}" != 1 ]; then
    $PG_ADMIN -X -q -h "$PG_HOST" -p "$PG_PORT" -c "DROP DATABASE IF EXISTS $PG_DB WITH (FORCE)" >/dev/null 2>&1 || true
  fi
}

# Each server logs to a file of its own (two may run side by side): LOG is the last one's.
LOGS=0
new_log() { LOGS=$((LOGS + 1)); LOG=$work/$1.$LOGS.log; }

# start_ex EXAMPLE ARGS...: an appsrv example on a free port.
start_ex() {
  local ex=$1
  shift
  new_log "$ex"
  "$EX/$ex" -l 127.0.0.1:0 "$@" >"$LOG" 2>&1 &
  started $!
  PORT=$(ready_port "$LOG" 60)
  [ -n "$PORT" ] || { tail -20 "$LOG" >&2; die "$ex $* did not start"; }
}

# start_axum [--as-run-user] ARGS...: axum-peer on a free port (as the workers' user with
# --as-run-user: its database connections are then made as that role).
start_axum() {
  local pre=()
  if [ "${1:-}" = --as-run-user ]; then
    shift
    pre=("${AS_RUN_USER[@]}")
  fi
  new_log axum-peer
  "${pre[@]}" "$AXUM" --listen 127.0.0.1:0 "$@" >"$LOG" 2>&1 &
  started $!
  PORT=$(ready_port "$LOG" 60)
  [ -n "$PORT" ] || { tail -20 "$LOG" >&2; die "axum-peer $* did not start"; }
}

# wrk_cell C SECONDS PATH [wrk args]: one wrk run against PORT; sets R_REQUESTS R_RPS R_P50
# R_P99 R_ERRORS (socket errors + non-2xx) R_CPU (the servers' SRV CPU µs per request) and,
# with DB_MEASURE=1, R_DBCPU (the database backends'; empty when one ended meanwhile).
DB_MEASURE=0
wrk_cell() {
  local c=$1 d=$2 path=$3 t out=$work/wrk.out rc=0 before after dbefore="" dafter gone
  shift 3
  t=$((WRK_THREADS < c ? WRK_THREADS : c))
  before=$(proc_counters "${SRV[@]}")
  [ "$DB_MEASURE" = 0 ] || dbefore=$(db_counters)
  timeout $((d + 30)) wrk -t"$t" -c"$c" -d"${d}s" --latency "$@" "http://127.0.0.1:$PORT$path" >"$out" 2>&1 || rc=$?
  after=$(proc_counters "${SRV[@]}")
  R_REQUESTS=$(awk '/ requests in / { print $1 }' "$out")
  R_RPS=$(awk '/^Requests\/sec:/ { printf "%.0f", $2 }' "$out")
  R_P50=$(to_ms "$(awk '$1 == "50%" { print $2 }' "$out")")
  R_P99=$(to_ms "$(awk '$1 == "99%" { print $2 }' "$out")")
  R_ERRORS=$(awk '/Socket errors:/ { gsub(",", ""); s += $4 + $6 + $8 + $10 } /Non-2xx or 3xx responses:/ { s += $5 } END { print s + 0 }' "$out")
  if [ "$rc" != 0 ] || [ -z "$R_REQUESTS" ]; then
    say "wrk -c$c $path did not finish (exit $rc): $(tail -2 "$out" | tr '\n' ' ')"
    R_REQUESTS=0 R_RPS=""
  fi
  read -r R_CPU _ _ < <(per_request "$before" "$after" "$R_REQUESTS")
  [ "$R_CPU" != - ] || R_CPU=""
  R_DBCPU=""
  if [ "$DB_MEASURE" = 1 ]; then
    dafter=$(db_counters)
    read -r R_DBCPU _ gone < <(per_request "$dbefore" "$dafter" "$R_REQUESTS")
    # A backend that ended during the run took its CPU time with it: no figure.
    [ "$gone" = 0 ] && [ "$R_DBCPU" != - ] || R_DBCPU=""
  fi
}

# record_wrk PART SERVER CASE METRICS...: records the wrk_cell figures named (rps p50 p99
# errors cpu dbcpu requests).
record_wrk() {
  local part=$1 srv=$2 case=$3 m
  shift 3
  for m in "$@"; do
    case $m in
      requests) record "$part" "$srv" "$case" requests "$R_REQUESTS" ;;
      rps) record "$part" "$srv" "$case" requests_per_second "$R_RPS" ;;
      p50) record "$part" "$srv" "$case" p50_ms "$R_P50" ;;
      p99) record "$part" "$srv" "$case" p99_ms "$R_P99" ;;
      errors) record "$part" "$srv" "$case" errors "$R_ERRORS" ;;
      cpu) record "$part" "$srv" "$case" cpu_us_per_request "$R_CPU" ;;
      dbcpu) record "$part" "$srv" "$case" db_cpu_us_per_request "$R_DBCPU" ;;
    esac
  done
  say "$part: $srv $case: ${R_RPS:--} req/s, p50 ${R_P50:--} ms, p99 ${R_P99:--} ms, errors $R_ERRORS, cpu ${R_CPU:--} µs/req${R_DBCPU:+, db $R_DBCPU µs/req}"
}

# ---------------------------------------------------------------------------------------
# sleep: requests that wait.

part_sleep() {
  local c srv path="/sleep?ms=$SLEEP_MS" target p99max=$((SLEEP_MS + 30))
  local -a servers=()
  have async_hello && servers+=(async_hello-w2) || na sleep async_hello-w2 "no async_hello in $EX"
  have http_hello && servers+=(http_hello-blocking-w256 http_hello-hybrid-w32) \
    || na sleep http_hello "no http_hello in $EX"
  [ -x "$AXUM" ] && servers+=(axum-peer-t2) || na sleep axum-peer-t2 "no axum-peer at $AXUM"
  for srv in "${servers[@]}"; do
    case $srv in
      async_hello-w2) start_ex async_hello -w 2 ;;
      http_hello-blocking-w256) start_ex http_hello --io blocking -w 256 ;;
      http_hello-hybrid-w32) start_ex http_hello --io hybrid -w 32 ;;
      axum-peer-t2) start_axum --threads 2 ;;
    esac
    for c in $SLEEP_CONCURRENCY; do
      wrk_cell "$c" "$SLEEP_DURATION" "$path" --timeout 5s
      record_wrk sleep "$srv" "c$c" rps p50 p99 errors
      if [ "$srv" = async_hello-w2 ]; then
        target=$(awk -v c="$c" -v ms="$SLEEP_MS" 'BEGIN { printf "%.0f", 0.9 * c * 1000 / ms }')
        goal sleep "$srv" "c$c" requests_per_second "$R_RPS" '>=' "$target"
        goal sleep "$srv" "c$c" p99_ms "$R_P99" '<=' "$p99max"
      fi
    done
    stop_server
  done
}

# ---------------------------------------------------------------------------------------
# hello: the cost of an async handler that does not wait.

part_hello() {
  local c srv r round
  local -a servers=()
  have async_hello && servers+=(async_hello-w2) || na hello async_hello-w2 "no async_hello in $EX"
  have http_hello && servers+=(http_hello-event-w2) || na hello http_hello-event-w2 "no http_hello in $EX"
  [ -x "$AXUM" ] && servers+=(axum-peer-t2) || na hello axum-peer-t2 "no axum-peer at $AXUM"
  declare -A rps=() cpu=()
  # The servers take turns in each cell (a fresh start, WARMUP seconds of the same load
  # unmeasured, then the measured run), and each cell is run HELLO_ROUNDS times: the
  # median is kept. Run one server after the other instead and a drift of the machine
  # (its clock, its other work) over the minutes of the part becomes a difference
  # between the servers: two such runs disagreed by 20 to 30 % on the same build.
  for round in $(seq "$HELLO_ROUNDS"); do
    for c in $HELLO_CONCURRENCY; do
      for srv in "${servers[@]}"; do
        case $srv in
          async_hello-w2) start_ex async_hello --io event -w 2 ;;
          http_hello-event-w2) start_ex http_hello --io event -w 2 ;;
          axum-peer-t2) start_axum --threads 2 ;;
        esac
        timeout $((WARMUP + 30)) wrk -t"$WRK_THREADS" -c"$c" -d"${WARMUP}s" "http://127.0.0.1:$PORT/" >/dev/null 2>&1 || true
        wrk_cell "$c" "$HELLO_DURATION" /
        record_wrk hello "$srv" "c$c round$round" rps cpu errors
        rps[$srv,$c]+="$R_RPS " cpu[$srv,$c]+="$R_CPU "
        stop_server
      done
    done
  done
  for c in $HELLO_CONCURRENCY; do
    for srv in "${servers[@]}"; do
      rps[$srv,$c]=$(median ${rps[$srv,$c]}) cpu[$srv,$c]=$(median ${cpu[$srv,$c]})
      record hello "$srv" "c$c median" requests_per_second "${rps[$srv,$c]}"
      record hello "$srv" "c$c median" cpu_us_per_request "${cpu[$srv,$c]}"
      say "hello: $srv c$c median of $HELLO_ROUNDS: ${rps[$srv,$c]} req/s, ${cpu[$srv,$c]} µs/req"
    done
    r=$(ratio "${cpu[async_hello-w2,$c]:-}" "${cpu[http_hello-event-w2,$c]:-}")
    record hello "CPU/request: async_hello ÷ http_hello event" "c$c" ratio "$r"
    goal hello "CPU/request: async_hello ÷ http_hello event" "c$c" ratio "$r" '<=' 1.15
    r=$(ratio "${rps[async_hello-w2,$c]:-}" "${rps[axum-peer-t2,$c]:-}")
    record hello "req/s: async_hello ÷ axum-peer" "c$c" ratio "$r"
    goal hello "req/s: async_hello ÷ axum-peer" "c$c" ratio "$r" '>=' 1.0
  done
}

# median X...: the median of the numbers given (the lower middle one of an even count);
# nothing when none is.
median() {
  [ $# -gt 0 ] || return 0
  printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

# ---------------------------------------------------------------------------------------
# frontpage: the application page on PostgreSQL. The database functions follow
# bench/frontpage.sh's (pg_available, pg_recreate, db_pids, db_counters).

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

# db_counters: proc_counters of the backends connected to PG_DB as DB_ROLE ("0 0 " when
# there are none).
db_counters() {
  local pids
  pids=$(pgrep -f "^postgres: .*: $DB_ROLE $PG_DB " || true)
  if [ -z "$pids" ]; then echo "0 0 "; return; fi
  # shellcheck disable=SC2086 # pids
  proc_counters $pids
}

start_frontpage() {
  # shellcheck disable=SC2086 # --user nobody when root
  start_ex frontpage --database "$APPSRV_DB" "$@" ${RUN_USER:+--user $RUN_USER}
}

# PHP-FPM and nginx in front of it: bench/frontpage.sh's start_fpm and start_nginx_fpm
# (kept the same by hand), on PostgreSQL only.
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

# php_missing: why nginx + PHP-FPM cannot run here (nothing when it can).
php_missing() {
  local mods
  if [ -z "$PHP_FPM" ] || [ ! -x "$PHP_FPM" ]; then
    echo "php-fpm not installed: apt-get install php-fpm php-pgsql"
    return
  fi
  # (Captured first: grep -q would end the pipe early, and pipefail would fail it.)
  mods=$("$PHP_FPM" -m 2>/dev/null || true)
  grep -qx pdo_pgsql <<<"$mods" || { echo "php-pgsql not installed: apt-get install php-pgsql"; return; }
  [ -x "$NGINX" ] || echo "nginx not installed: apt-get install nginx"
}

# fetch URL FILE: the body into FILE; prints the status (000: no answer).
fetch() { curl -s --noproxy '*' -m 30 -o "$2" -w '%{http_code}' "$1" || true; }
ref_file() { echo "$work/ref/$(tr -c 'a-z0-9' _ <<<"$1")"; }

part_frontpage() {
  local why help srv page c fp_async=0 php_ok=0 check_pages axum_db port_ref log_ref port_axum r f status
  local -a servers=()
  have frontpage || { na frontpage - "no frontpage example in $EX"; return 0; }
  [ -x "$AXUM" ] || { na frontpage - "no axum-peer at $AXUM"; return 0; }
  if ! why=$(pg_available); then na frontpage - "$why"; return 0; fi
  # (Captured first, as above.)
  help=$("$EX/frontpage" --help 2>&1 || true)
  if grep -q -- --db-connections <<<"$help"; then
    fp_async=1
    servers+=(frontpage-async)
  else
    na frontpage frontpage-async "frontpage has no async mode in this build"
  fi
  servers+=(frontpage-blocking axum-peer)
  why=$(php_missing)
  if [ -z "$why" ]; then
    php_ok=1
    servers+=(nginx+php-fpm)
  else
    na frontpage nginx+php-fpm "$why"
  fi
  axum_db=$((ASYNC_W * FP_DB_CONNECTIONS))
  APPSRV_DB="postgres:///$PG_DB?host=$PG_HOST&port=$PG_PORT"
  PHP_DSN="pgsql:host=$PG_HOST;port=$PG_PORT;dbname=$PG_DB;user=$DB_ROLE"
  mkdir -m 755 -p "$work/php" "$work/ref"
  cp bench/frontpage/*.php "$work/php/"
  chmod 644 "$work/php/"*.php
  check_pages=$(tr ' ' '\n' <<<"/ /rows?n=5 /rows?n=36 /rows?n=134 $FP_PAGES" | awk 'NF && !seen[$0]++' | tr '\n' ' ')

  # The data: the blocking frontpage's first worker loads the schema and the seed data into
  # the new database; its pages right after are the reference (nginx + PHP-FPM's check).
  say "frontpage: creating $PG_DB, seeded by frontpage --io blocking -w $W"
  pg_recreate
  start_frontpage --io blocking -w "$W"
  port_ref=$PORT log_ref=$LOG
  for page in $check_pages; do
    status=$(fetch "http://127.0.0.1:$port_ref$page" "$(ref_file "$page")")
    [ "$status" = 200 ] || { tail -20 "$log_ref" >&2; die "frontpage: $page answers $status"; }
  done
  start_axum --as-run-user --threads 2 --database "$APPSRV_DB" --db-connections "$axum_db"
  port_axum=$PORT
  say "frontpage: bench/axum/check.sh frontpage --io blocking vs axum-peer"
  PAGES=$check_pages bench/axum/check.sh "http://127.0.0.1:$port_ref" "http://127.0.0.1:$port_axum" >&2 \
    || die "frontpage --io blocking and axum-peer answer different pages"
  record frontpage frontpage-blocking - bytes_equal_to_axum yes
  if [ "$fp_async" = 1 ]; then
    start_frontpage --io event -w "$ASYNC_W" --db-connections "$FP_DB_CONNECTIONS"
    say "frontpage: bench/axum/check.sh frontpage --io event (async) vs axum-peer"
    PAGES=$check_pages bench/axum/check.sh "http://127.0.0.1:$PORT" "http://127.0.0.1:$port_axum" >&2 \
      || die "frontpage's async mode and axum-peer answer different pages"
    record frontpage frontpage-async - bytes_equal_to_axum yes
  fi
  stop_server

  declare -A rps=() cpu=()
  DB_MEASURE=1
  for srv in "${servers[@]}"; do
    case $srv in
      frontpage-async) start_frontpage --io event -w "$ASYNC_W" --db-connections "$FP_DB_CONNECTIONS" ;;
      frontpage-blocking) start_frontpage --io blocking -w "$W" ;;
      axum-peer) start_axum --as-run-user --threads 2 --database "$APPSRV_DB" --db-connections "$axum_db" ;;
      nginx+php-fpm)
        start_fpm
        start_nginx_fpm
        # Its bodies must be the reference's (waiting up to 10 s for PHP-FPM to answer).
        for _ in $(seq 100); do
          [ "$(fetch "http://127.0.0.1:$PORT/" "$work/got")" = 200 ] && break
          sleep 0.1
        done
        for page in $check_pages; do
          f=$(ref_file "$page")
          status=$(fetch "http://127.0.0.1:$PORT$page" "$work/got")
          if [ "$status" != 200 ] || ! cmp -s "$work/got" "$f"; then
            diff <(head -c 100000 "$f") <(head -c 100000 "$work/got") | head -20 >&2 || true
            tail -10 "$work/php-fpm.log" "$work/nginx.log" >&2 2>/dev/null || true
            die "frontpage: nginx + PHP-FPM answers $page with $status and a body other than frontpage's"
          fi
        done
        record frontpage nginx+php-fpm - bytes_equal_to_frontpage yes
        ;;
    esac
    if [ "$WARMUP" -gt 0 ]; then
      timeout $((WARMUP + 30)) wrk -t1 -c"$W" -d"${WARMUP}s" "http://127.0.0.1:$PORT/" >/dev/null 2>&1 || true
    fi
    for page in $FP_PAGES; do
      for c in $FP_CONCURRENCY; do
        wrk_cell "$c" "$FP_DURATION" "$page" --timeout 10s
        record_wrk frontpage "$srv" "$page c$c" rps cpu dbcpu errors
        rps[$srv,$page,$c]=$R_RPS cpu[$srv,$page,$c]=$R_CPU
      done
    done
    stop_server
  done
  DB_MEASURE=0

  [ "$fp_async" = 1 ] || return 0
  for page in $FP_PAGES; do
    for c in $FP_CONCURRENCY; do
      r=$(ratio "${rps[frontpage-async,$page,$c]:-}" "${rps[axum-peer,$page,$c]:-}")
      record frontpage "req/s: frontpage-async ÷ axum-peer" "$page c$c" ratio "$r"
      goal frontpage "req/s: frontpage-async ÷ axum-peer" "$page c$c" ratio "$r" '>=' 1.0
      r=$(ratio "${cpu[frontpage-async,$page,$c]:-}" "${cpu[axum-peer,$page,$c]:-}")
      record frontpage "CPU/request: frontpage-async ÷ axum-peer" "$page c$c" ratio "$r"
      goal frontpage "CPU/request: frontpage-async ÷ axum-peer" "$page c$c" ratio "$r" '<=' 1.0
      if [ "$php_ok" = 1 ]; then
        r=$(ratio "${rps[frontpage-async,$page,$c]:-}" "${rps[nginx+php-fpm,$page,$c]:-}")
        record frontpage "req/s: frontpage-async ÷ nginx+php-fpm" "$page c$c" ratio "$r"
        goal frontpage "req/s: frontpage-async ÷ nginx+php-fpm" "$page c$c" ratio "$r" '>=' 3
      fi
    done
  done
}

# ---------------------------------------------------------------------------------------
# memory: many requests in flight.

# The client: N keep-alive connections to PORT, each with one GET /sleep?ms=MS in flight
# (the next sent as soon as an answer is read), until SIGTERM or LIMIT seconds. Prints a
# progress line a second, `ready ...` once every connection is made (or failed), and
# `final ...` at the end: open = connections open (each with a request in flight).
cat >"$work/hold.py" <<'PY'
import errno, resource, selectors, signal, socket, sys, time

port, n, ms, limit = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = n + 100
if soft < want:
    resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))
REQ = b"GET /sleep?ms=%d HTTP/1.1\r\nHost: bench\r\n\r\n" % ms
sel = selectors.DefaultSelector()
stop = False

def on_term(*_):
    global stop
    stop = True

signal.signal(signal.SIGTERM, on_term)
to_open, connecting, open_, answered, not200, failed, closed = n, 0, 0, 0, 0, 0, 0
bufs = {}
t0 = time.monotonic()
last = t0
said_ready = False
first_error = ""

def report(tag):
    print(f"{tag} t={time.monotonic() - t0:.1f} open={open_} connecting={connecting} answered={answered} "
          f"not200={not200} failed={failed} closed={closed}{' error=' + first_error if first_error else ''}",
          flush=True)

def drop(s, was_open):
    global open_, closed
    sel.unregister(s)
    bufs.pop(s, None)
    s.close()
    if was_open:
        open_ -= 1
        closed += 1

while not stop:
    now = time.monotonic()
    if now - t0 > limit:
        report("timeout")
        break
    # At most 256 connects outstanding: the listen backlog is not flooded.
    while to_open > 0 and connecting < 256:
        to_open -= 1
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        err = s.connect_ex(("127.0.0.1", port))
        if err not in (0, errno.EINPROGRESS):
            failed += 1
            first_error = first_error or errno.errorcode.get(err, str(err))
            s.close()
            continue
        connecting += 1
        sel.register(s, selectors.EVENT_WRITE, "connect")
    for key, _ in sel.select(timeout=0.05):
        s = key.fileobj
        if key.data == "connect":
            connecting -= 1
            err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                failed += 1
                first_error = first_error or errno.errorcode.get(err, str(err))
                drop(s, False)
                continue
            open_ += 1
            bufs[s] = b""
            sel.modify(s, selectors.EVENT_READ, "read")
            try:
                s.send(REQ)
            except OSError:
                drop(s, True)
            continue
        try:
            data = s.recv(65536)
        except OSError:
            data = b""
        if not data:
            drop(s, True)
            continue
        buf = bufs[s] + data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            length = 0
            for line in buf[:end].split(b"\r\n")[1:]:
                k, _, v = line.partition(b":")
                if k.strip().lower() == b"content-length":
                    length = int(v)
            if len(buf) < end + 4 + length:
                break
            if buf[9:12] != b"200":
                not200 += 1
            buf = buf[end + 4 + length:]
            answered += 1
        bufs[s] = buf
        # The next request at once (one in flight per connection).
        if data and not buf:
            try:
                s.send(REQ)
            except OSError:
                drop(s, True)
    if not said_ready and to_open == 0 and connecting == 0:
        said_ready = True
        report("ready")
    if now - last >= 1:
        last = now
        report("progress")
report("final")
PY

# status_field JSON_FILE KEY.KEY: a value of the status JSON ("n/a" when absent).
status_field() {
  python3 - "$1" "$2" <<'PY'
import json, sys
try:
    v = json.load(open(sys.argv[1]))
    for k in sys.argv[2].split("."):
        v = v[k]
    print("n/a" if v is None else v)
except Exception:
    print("n/a")
PY
}

part_memory() {
  local srv=async_hello-w2 case="$MEM_CONNECTIONS x /sleep?ms=$MEM_SLEEP_MS" out=$work/hold.out
  local line kb procs pss_mib i t times=() status_json=$work/status.json inflight open_status
  local open_client fails not200 slowest median code
  have async_hello || { na memory "$srv" "no async_hello in $EX"; return 0; }
  if [ "$(ulimit -n)" -lt $((MEM_CONNECTIONS + 200)) ]; then
    na memory "$srv" "RLIMIT_NOFILE $(ulimit -n) < MEM_CONNECTIONS + 200 (raise the hard limit)"
    return 0
  fi
  start_ex async_hello -w 2 --backlog 4096 --control "$work/ctl.sock"
  say "memory: opening $MEM_CONNECTIONS connections, each with GET /sleep?ms=$MEM_SLEEP_MS in flight"
  timeout 300 python3 "$work/hold.py" "$PORT" "$MEM_CONNECTIONS" "$MEM_SLEEP_MS" 240 >"$out" 2>&1 &
  LOAD=$!
  for _ in $(seq 1200); do
    grep -q '^ready' "$out" 2>/dev/null && break
    kill -0 "$LOAD" 2>/dev/null || break
    sleep 0.1
  done
  grep -q '^ready' "$out" || { cat "$out" >&2; die "memory: the client did not open its connections in 120 s"; }
  say "memory: $(grep '^ready' "$out")"
  sleep "$MEM_SETTLE"
  # While they are in flight: the status, the PSS, then new clients.
  "$EX/async_hello" status --control "$work/ctl.sock" --json >"$status_json" 2>"$work/status.err" || true
  read -r kb procs < <(pss_kb "${SRV[@]}")
  for i in $(seq "$MEM_PROBES"); do
    read -r code t < <(curl -s --noproxy '*' -m 10 -o /dev/null -w '%{http_code} %{time_total}\n' "http://127.0.0.1:$PORT/" || echo "000 10")
    [ "$code" = 200 ] || t=""
    times+=("$(awk -v t="$t" 'BEGIN { if (t == "") print "fail"; else printf "%.1f", t * 1000 }')")
    say "memory: new client $i: GET / $code in ${times[-1]} ms"
  done
  line=$(grep -E '^(progress|ready)' "$out" | tail -1)
  stop_load
  stop_server
  open_client=$(sed -n 's/.* open=\([0-9]*\).*/\1/p' <<<"$line")
  fails=$(sed -n 's/.* failed=\([0-9]*\).*/\1/p' <<<"$line")
  not200=$(sed -n 's/.* not200=\([0-9]*\).*/\1/p' <<<"$line")
  inflight=$(status_field "$status_json" event.requests_in_flight)
  open_status=$(status_field "$status_json" event.open)
  pss_mib=$(awk -v k="$kb" 'BEGIN { printf "%.1f", k / 1024 }')
  slowest=$(printf '%s\n' "${times[@]}" | awk '$1 == "fail" { f = 1 } $1 + 0 > m { m = $1 + 0 } END { if (f) print "fail"; else printf "%.1f", m }')
  median=$(printf '%s\n' "${times[@]}" | grep -v fail | sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }')
  record memory "$srv" "$case" client_connections_open "$open_client"
  record memory "$srv" "$case" client_connect_failures "$fails"
  record memory "$srv" "$case" client_non_200 "$not200"
  record memory "$srv" "$case" status_requests_in_flight "$inflight"
  record memory "$srv" "$case" status_open_connections "$open_status"
  record memory "$srv" "$case" pss_mib "$pss_mib"
  record memory "$srv" "$case" processes "$procs"
  record memory "$srv" "$case" new_client_ms_slowest "$slowest"
  record memory "$srv" "$case" new_client_ms_median "$median"
  goal memory "$srv" "$case" client_connections_open "$open_client" '>=' "$MEM_CONNECTIONS"
  goal memory "$srv" "$case" pss_mib "$pss_mib" '<=' 64
  goal memory "$srv" "$case" new_client_ms_slowest "$slowest" '<' 100
  say "memory: open $open_client (status: in flight $inflight, open $open_status), PSS $pss_mib MiB in $procs processes, new clients: ${times[*]} ms"
}

# ---------------------------------------------------------------------------------------
# smtp: idle sessions and deliveries.

# The client: IDLE sessions connected and greeted, then idle; a new session's greeting
# time; SESSIONS smtplib sessions at once, one message each; how many idle ones are still
# open. Prints key=value lines.
cat >"$work/smtp.py" <<'PY'
import errno, resource, selectors, smtplib, socket, sys, threading, time

port, idle_n, sessions, limit = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = idle_n + sessions + 100
if soft < want:
    resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))
t0 = time.monotonic()

def greeted(buf):
    # A complete greeting: a line "220 ..." (a multi-line one ends so too).
    return any(l.startswith(b"220 ") for l in buf.split(b"\r\n")[:-1])

sel = selectors.DefaultSelector()
to_open, connecting, idle, failed, bufs = idle_n, 0, [], 0, {}
first_error = ""
while (to_open or bufs or connecting) and time.monotonic() - t0 < limit:
    while to_open and connecting < 256:
        to_open -= 1
        s = socket.socket()
        s.setblocking(False)
        err = s.connect_ex(("127.0.0.1", port))
        if err not in (0, errno.EINPROGRESS):
            failed += 1
            first_error = first_error or errno.errorcode.get(err, str(err))
            s.close()
            continue
        connecting += 1
        sel.register(s, selectors.EVENT_WRITE, "connect")
    for key, _ in sel.select(timeout=0.05):
        s = key.fileobj
        if key.data == "connect":
            connecting -= 1
            err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                failed += 1
                first_error = first_error or errno.errorcode.get(err, str(err))
                sel.unregister(s)
                s.close()
                continue
            bufs[s] = b""
            sel.modify(s, selectors.EVENT_READ, "read")
            continue
        try:
            data = s.recv(4096)
        except OSError:
            data = b""
        if not data:
            failed += 1
            sel.unregister(s)
            del bufs[s]
            s.close()
            continue
        bufs[s] += data
        if greeted(bufs[s]):
            sel.unregister(s)
            del bufs[s]
            idle.append(s)
print(f"idle_greeted={len(idle)}")
print(f"idle_failed={failed + len(bufs) + connecting}")
print(f"idle_open_seconds={time.monotonic() - t0:.1f}")
if first_error:
    print(f"idle_first_error={first_error}")
sys.stdout.flush()

# A new session's greeting, the idle ones open.
t = time.monotonic()
try:
    c = socket.create_connection(("127.0.0.1", port), timeout=10)
    buf = b""
    while not greeted(buf):
        b = c.recv(4096)
        if not b:
            raise OSError("closed before the greeting")
        buf += b
    print(f"new_greeting_ms={(time.monotonic() - t) * 1000:.1f}")
    c.sendall(b"QUIT\r\n")
    c.close()
except OSError as e:
    print(f"new_greeting_ms=fail")
    print(f"new_greeting_error={e!r}")
sys.stdout.flush()

# SESSIONS deliveries at once.
go = threading.Event()
results = [None] * sessions

def deliver(i):
    go.wait()
    msg = (f"From: bench@example.com\r\nTo: sink@example.com\r\nSubject: async.sh {i}\r\n"
           f"Message-ID: <async-sh-{i}@bench.localhost>\r\n\r\nMessage {i} of bench/async.sh.\r\n")
    try:
        with smtplib.SMTP("127.0.0.1", port, local_hostname="bench.localhost", timeout=30) as s:
            s.sendmail("bench@example.com", ["sink@example.com"], msg)
        results[i] = True
    except Exception as e:
        results[i] = repr(e)

threads = [threading.Thread(target=deliver, args=(i,), daemon=True) for i in range(sessions)]
for th in threads:
    th.start()
t = time.monotonic()
go.set()
for th in threads:
    th.join(max(0.1, 120 - (time.monotonic() - t)))
print(f"deliver_seconds={time.monotonic() - t:.2f}")
ok = sum(1 for r in results if r is True)
print(f"sent_ok={ok}")
errors = [r for r in results if r is not True]
if errors:
    print(f"sent_first_error={str(errors[0]).replace(chr(10), ' ')}")

# The idle sessions still open (nothing to read, no end of file).
still = 0
for s in idle:
    s.setblocking(False)
    try:
        if s.recv(1, socket.MSG_PEEK):
            pass  # it said something (421 at a stop): not idle any more
    except BlockingIOError:
        still += 1
    except OSError:
        pass
    s.close()
print(f"idle_still_open={still}")
PY

part_smtp() {
  local srv=smtp_sink-w2 out=$work/smtp.out maildir=$work/maildir delivered
  have smtp_sink || { na smtp "$srv" "no smtp_sink example in $EX (crates/appsrv-examples/examples/smtp_sink.rs)"; return 0; }
  if [ "$(ulimit -n)" -lt $((SMTP_IDLE + SMTP_SESSIONS + 200)) ]; then
    na smtp "$srv" "RLIMIT_NOFILE $(ulimit -n) < SMTP_IDLE + SMTP_SESSIONS + 200 (raise the hard limit)"
    return 0
  fi
  mkdir -m 755 "$maildir"
  [ -z "$RUN_USER" ] || chown "$RUN_USER:$RUN_GROUP" "$maildir"
  start_ex smtp_sink -w 2 --backlog 4096 --maildir "$maildir"
  say "smtp: $SMTP_IDLE idle sessions, then $SMTP_SESSIONS deliveries"
  timeout 300 python3 "$work/smtp.py" "$PORT" "$SMTP_IDLE" "$SMTP_SESSIONS" 120 >"$out" 2>&1 &
  LOAD=$!
  wait "$LOAD" || { cat "$out" >&2; LOAD=""; die "smtp: the client failed"; }
  LOAD=""
  val() { sed -n "s/^$1=//p" "$out" | head -1; }
  # The files delivered (outside tmp/, where a maildir writer keeps what it has not
  # finished), waiting up to 10 s for the last.
  for _ in $(seq 100); do
    delivered=$(find "$maildir" -mindepth 2 -type f -not -path "$maildir/tmp/*" | wc -l)
    [ "$delivered" -ge "$SMTP_SESSIONS" ] && break
    sleep 0.1
  done
  stop_server
  record smtp "$srv" "$SMTP_IDLE idle" idle_sessions_greeted "$(val idle_greeted)"
  record smtp "$srv" "$SMTP_IDLE idle" idle_sessions_failed "$(val idle_failed)"
  record smtp "$srv" "$SMTP_IDLE idle" seconds_to_open "$(val idle_open_seconds)"
  record smtp "$srv" "$SMTP_IDLE idle" new_greeting_ms "$(val new_greeting_ms)"
  record smtp "$srv" "$SMTP_IDLE idle" idle_still_open_at_end "$(val idle_still_open)"
  goal smtp "$srv" "$SMTP_IDLE idle" idle_sessions_greeted "$(val idle_greeted)" '>=' "$SMTP_IDLE"
  goal smtp "$srv" "$SMTP_IDLE idle" new_greeting_ms "$(val new_greeting_ms)" '<' 1000
  record smtp "$srv" "$SMTP_SESSIONS deliveries" sessions_ok "$(val sent_ok)"
  record smtp "$srv" "$SMTP_SESSIONS deliveries" seconds "$(val deliver_seconds)"
  record smtp "$srv" "$SMTP_SESSIONS deliveries" files_delivered "$delivered"
  goal smtp "$srv" "$SMTP_SESSIONS deliveries" files_delivered "$delivered" '>=' "$SMTP_SESSIONS"
  [ -z "$(val sent_first_error)" ] || say "smtp: first failed delivery: $(val sent_first_error)"
  [ -z "$(val idle_first_error)" ] || say "smtp: first failed idle session: $(val idle_first_error)"
  say "smtp: $(tr '\n' ' ' <"$out")files=$delivered"
}

# ---------------------------------------------------------------------------------------

{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "settings: PARTS=\"$PARTS\" SLEEP_DURATION=$SLEEP_DURATION HELLO_DURATION=$HELLO_DURATION FP_DURATION=$FP_DURATION SLEEP_CONCURRENCY=\"$SLEEP_CONCURRENCY\" HELLO_CONCURRENCY=\"$HELLO_CONCURRENCY\" HELLO_ROUNDS=$HELLO_ROUNDS FP_CONCURRENCY=\"$FP_CONCURRENCY\" WRK_THREADS=$WRK_THREADS SLEEP_MS=$SLEEP_MS FP_PAGES=\"$FP_PAGES\" ASYNC_W=$ASYNC_W FP_DB_CONNECTIONS=$FP_DB_CONNECTIONS W=$W WARMUP=$WARMUP MEM_CONNECTIONS=$MEM_CONNECTIONS MEM_SLEEP_MS=$MEM_SLEEP_MS SMTP_IDLE=$SMTP_IDLE SMTP_SESSIONS=$SMTP_SESSIONS"
  echo "appsrv: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- crates/appsrv 2>/dev/null || echo ' (crates/appsrv modified)'); examples: $EX; axum-peer: $AXUM"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine shares its CPUs)"
  echo "machine: $(nproc) CPUs, $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo), Linux $(uname -r); RLIMIT_NOFILE $(ulimit -n)"
  echo "wrk: $(wrk -v 2>&1 | head -1 | cut -d' ' -f2)"
} >"$RESULTS/env-async.txt"
say "$(sed -n 2p "$RESULTS/env-async.txt")"

FAILED=()
for PART in $PARTS; do
  say "== $PART"
  set +e
  (
    set -e
    trap part_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    "part_$PART"
  )
  rc=$?
  set -e
  if [ "$rc" -ge 128 ]; then exit "$rc"; fi
  if [ "$rc" != 0 ]; then
    FAILED+=("$PART")
    record "$PART" - - status "failed (exit $rc: see the messages above)"
  fi
done

# ---------------------------------------------------------------------------------------
# The tables, from the CSV: per part, one table per kind of row (the same metrics), each
# row with its goals; then every goal in one table.
python3 - "$CSV" <<'PY'
import csv, sys

rows = list(csv.DictReader(open(sys.argv[1])))
TITLES = {
    "sleep": "GET /sleep (a handler that waits), keep-alive, wrk",
    "hello": "GET / (13 bytes), keep-alive, wrk",
    "frontpage": "the front page on PostgreSQL, keep-alive, wrk",
    "memory": "requests in flight: memory and a new client",
    "smtp": "SMTP: idle sessions and deliveries",
}
LABEL = {
    "requests_per_second": "req/s", "p50_ms": "p50 ms", "p99_ms": "p99 ms", "errors": "errors",
    "cpu_us_per_request": "CPU µs/req", "db_cpu_us_per_request": "DB CPU µs/req", "ratio": "ratio",
    "pss_mib": "PSS MiB", "new_client_ms_slowest": "new client ms (slowest)",
    "new_client_ms_median": "new client ms (median)",
    "status_requests_in_flight": "in flight (status)", "status_open_connections": "open (status)",
    "client_connections_open": "open (client)", "client_connect_failures": "connect failures",
    "client_non_200": "non-200", "new_greeting_ms": "new session's 220, ms",
}
def label(m):
    return LABEL.get(m, m.replace("_", " "))

def order(xs):
    seen = []
    for x in xs:
        if x not in seen:
            seen.append(x)
    return seen

def is_goal(m):
    return m.endswith("_goal") or m.endswith("_met")

all_goals = []
for part in order(r["part"] for r in rows):
    prow = [r for r in rows if r["part"] == part]
    print(f"\n### {part}: {TITLES.get(part, '')}")
    if any(r["metric"] == "status" for r in prow):
        print()
    for r in prow:
        if r["metric"] == "status":
            who = "" if r["server"] == "-" else f"{r['server']}: "
            print(f"- {who}{r['value']}")
    data, goals = {}, {}
    for r in prow:
        if r["metric"] == "status":
            continue
        k = (r["server"], r["case"])
        m = r["metric"]
        if m.endswith("_goal"):
            goals.setdefault(k, {}).setdefault(m[:-5], {})["goal"] = r["value"]
        elif m.endswith("_met"):
            goals.setdefault(k, {}).setdefault(m[:-4], {})["met"] = r["value"]
        else:
            data.setdefault(k, {})[m] = r["value"]
    groups = {}
    for k in order([(r["server"], r["case"]) for r in prow if r["metric"] != "status"]):
        if k in data:
            groups.setdefault(tuple(data[k]), []).append(k)
    for sig, keys in groups.items():
        with_goal = any(k in goals for k in keys)
        print()
        print("| server | case | " + " | ".join(label(m) for m in sig) + (" | goal |" if with_goal else " |"))
        print("|---|---|" + "---|" * (len(sig) + with_goal))
        for k in keys:
            cells = [data[k].get(m) or "-" for m in sig]
            line = f"| {k[0]} | {k[1]} | " + " | ".join(cells) + " |"
            if with_goal:
                g = goals.get(k, {})
                text = "; ".join(
                    f"{label(m)} {v.get('goal', '?')}: {'met' if v.get('met') == 'yes' else '**not met**'}"
                    for m, v in g.items())
                line += f" {text or '-'} |"
                for m, v in g.items():
                    all_goals.append((part, k[0], k[1], label(m), data[k].get(m) or "-", v.get("goal", "?"), v.get("met", "?")))
            print(line)
if all_goals:
    print("\n### goals\n")
    print("| part | server | case | figure | value | goal | met |")
    print("|---|---|---|---|---|---|---|")
    for g in all_goals:
        print("| " + " | ".join(g[:6]) + f" | {'yes' if g[6] == 'yes' else '**no**'} |")
PY
echo
echo "results: $CSV (and $RESULTS/env-async.txt)"
if [ ${#FAILED[@]} -gt 0 ]; then
  say "failed parts: ${FAILED[*]}"
  exit 1
fi
