#!/usr/bin/env bash
# Issue 19's DNS benchmarks: appsrv's `dns` example beside NSD and Knot, with dnsperf, all on
# loopback, one zone (bench/dns/gen.py) loaded by the three. Prints markdown tables ready for
# BENCHMARKS.md, with the exact command lines.
#
#   bench/dns.sh                 the benchmark (some 4.5 minutes with the defaults)
#   bench/dns.sh reload          reload under dnsperf load: the queries lost (about 1 minute)
#   ROUNDS=1 DURATION=5 bench/dns.sh       any setting below can be overridden
#   SERVERS="nsd knot" bench/dns.sh        the peers only
#
#   setting           default   meaning
#   DURATION          7         seconds of each max-rate dnsperf run (-l)
#   ROUNDS            3         rounds of the max-rate workloads; each round runs every workload
#                               on every server, the servers' order rotated by one each round;
#                               a cell is the median of its rounds, with the range
#   CLIENTS           4         dnsperf -c of the UDP runs (one UDP socket each)
#   TCP_CLIENTS       4         dnsperf -c of the TCP run: persistent connections
#   OUTSTANDING       200       dnsperf -q: queries in flight at most
#   LATENCY_SHARE     50        the latency run's rate, in % of the server's own median UDP
#                               1-record queries/s (dnsperf -Q)
#   LATENCY_DURATION  10        seconds of the latency run
#   SYSCALL_DURATION  5         seconds of the syscall-counting run (UDP 1-record, max rate)
#   WORKERS           2         appsrv's -w (NSD's server-count, Knot's udp- and tcp-workers: 2)
#   SERVERS           "appsrv nsd knot"; also udp_echo: appsrv's udp_echo example -w WORKERS
#                               (built with cargo unless BUILD=0; ECHO: its path), which sends
#                               each query back as it came (dnsperf takes it as an answer): the
#                               datagram layer's own cost, without DNS; UDP workloads only
#   NAMES, QUERIES    1000, 10000   bench/dns/gen.py's names per kind and lines per query file
#   DNS               target/release/examples/dns   appsrv's dns example; built with cargo
#                               (cargo build --release --example dns) unless BUILD=0;
#                               when it does not exist, appsrv is skipped with a message
#   APPSRV_FLAGS      ""        more flags for the dns example
#   NSD_REUSEPORT     no        NSD's reuseport (yes: a socket per server process, SO_REUSEPORT)
#   INSTALL           1         0: install nothing (a missing tool stops the script)
#   KEEP              0         1: keep the work directory (configs, logs, dnsperf outputs)
#   reload mode:
#   RELOADS           10        reloads, RELOAD_INTERVAL seconds apart, under load
#   RELOAD_INTERVAL   1
#   RELOAD_RATE       10000     dnsperf -Q: a fixed rate well below saturation
#   RELOAD_TIMEOUT    2         dnsperf -t: a query unanswered after this many seconds is lost
#   RELOAD_SERVERS    "appsrv nsd knot"
#
# Tools: nsd, knot, dnsperf and bind9-dnsutils (dig) are installed with apt-get when missing
# (after apt-get update; INSTALL=0 installs nothing). Debian's packages enable (and where a
# service manager runs, start) their services: the script disables those it installed
# (systemctl disable --now) and stops a daemon they started (the pid in /run/nsd/nsd.pid or
# /run/knot/knot.pid), so that none holds port 53 or CPU. A system NSD or Knot that was there
# before is left alone, with a warning. Syscalls are counted with perf (linux-perf) when it can
# read the raw_syscalls tracepoint, otherwise with strace -c -f (installed when missing), which
# slows the server: the table says which.
#
# Servers (each on its own free 127.0.0.1 port, UDP and TCP; all three run for the whole
# benchmark, idle while another is measured; started as root, each runs as its own user):
#   appsrv  DNS --zone ZONE -l udp://127.0.0.1:PORT -l 127.0.0.1:PORT -w WORKERS
#           --max-answers-per-ip 0 APPSRV_FLAGS (rate limit off, as NSD's below: the example
#           answers 200 per second per /24 by default, and dnsperf sends from 127.0.0.1)
#           (its workers run as nobody when started as root)
#   NSD     nsd -d -c CONF: server-count 2, rrl-ratelimit 0 (Debian's NSD is built with RRL,
#           --enable-ratelimit, and limits a source to 200 answers/s by default; a build without
#           it gets no rrl-* line), reuseport NSD_REUSEPORT (no, NSD's default: its 2 servers
#           share one socket per address, as appsrv's workers do), minimal-responses yes (answers without the NS set in authority, as Knot
#           and appsrv answer), do-ip6 no, database "" (no nsd.db), no remote control, username
#           nsd, no chroot, pid/xfrd/zone-list files in the work directory. Debian builds it with
#           --disable-recvmmsg: one recvfrom/sendto per query.
#   Knot    knotd -c CONF: udp-workers 2, tcp-workers 2, background-workers 1, no RRL (Knot's
#           RRL is the rrl module, not loaded), user knot:knot, rundir/storage/database in the
#           work directory, journal-content none, zonefile-load whole, log to stderr (notice).
# Before any load each server must answer a set of dig queries exactly as the zone says (A,
# 8 A, AAAA, CNAME chased, MX, NXDOMAIN and NODATA with the SOA in authority, REFUSED outside
# the zone, the same over TCP); a server that does not is skipped, with the difference.
#
# Workloads (bench/dns/gen.py says what the zone and the query files hold):
#   UDP 1-record  dnsperf -s 127.0.0.1 -p PORT -d queries-a1.txt -l DURATION -c CLIENTS -q OUTSTANDING
#                 (80 % answers of 1 record, A or AAAA, 20 % NXDOMAIN)
#   UDP 8-record  the same with -d queries-a8.txt (80 % answers of 8 A records, 20 % NXDOMAIN)
#   TCP           the same as UDP 1-record with -m tcp -c TCP_CLIENTS (persistent connections:
#                 dnsperf reconnects only if the server closes; the details say how often)
#   latency       UDP 1-record with -Q (LATENCY_SHARE % of the server's own median UDP 1-record
#                 queries/s) and -v, which prints each answer's latency (µs resolution):
#                 dnsperf 2.10 has no histogram or percentile output, so p50 and p99 are
#                 computed from those lines (a timed-out query counts as slower than any).
#                 -v costs dnsperf some CPU per query; it is the same for every server.
#   syscalls      UDP 1-record at max rate for SYSCALL_DURATION seconds under
#                 `perf stat -e raw_syscalls:sys_enter,syscalls:sys_enter_X... -p PIDS` (every
#                 process and thread of the server), divided by the queries dnsperf completed.
# dnsperf is one sending and one receiving thread and shares the 2 CPUs with the server: where
# it saturates, queries/s is its limit and the server's CPU per query compares the servers.
# Server CPU per query: the CPU time of all its processes and threads (bench/lib.sh
# proc_counters: /proc/PID/task/*/schedstat, plus the reaped children's cutime+cstime),
# sampled before and after the run, divided by the queries completed. Runs vary by some 20 %
# on a shared machine: compare servers within one run of this script.
#
# Reload mode: each of RELOAD_SERVERS in turn, alone, on its own copy of the zone, under
# dnsperf -Q RELOAD_RATE -t RELOAD_TIMEOUT (UDP 1-record queries) for RELOADS × RELOAD_INTERVAL
# + 3 seconds; from the second second on, every RELOAD_INTERVAL seconds the zone's serial is
# raised (the file replaced by rename) and the server reloaded: appsrv with
# `dns reload --control CTL` (which returns once the new generation serves alone), NSD with
# SIGHUP to its main process (it re-reads zone files whose mtime changed), Knot with
# `knotc -b zone-reload` (waits until loaded). It prints dnsperf's lost queries (unanswered
# after RELOAD_TIMEOUT), the answers other than NOERROR/NXDOMAIN, and the serial the server
# answers afterwards (it must be the last one written). Goal for appsrv (issue 19): 0 lost.
#
# Loopback only. Every process the script starts is stopped at its end (and at exit, by a
# trap: TERM to each server's whole process tree, KILL after 5 s); every dnsperf run is bounded
# by -l and `timeout`.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
export PATH=$PATH:/usr/sbin:/sbin

MODE=bench
case ${1:-} in
  "" | bench) ;;
  reload) MODE=reload ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "dns.sh: unknown mode '$1' (bench or reload; --help)" >&2; exit 2 ;;
esac

DURATION=${DURATION:-7} ROUNDS=${ROUNDS:-3} CLIENTS=${CLIENTS:-4} TCP_CLIENTS=${TCP_CLIENTS:-4}
OUTSTANDING=${OUTSTANDING:-200} LATENCY_SHARE=${LATENCY_SHARE:-50}
LATENCY_DURATION=${LATENCY_DURATION:-10} SYSCALL_DURATION=${SYSCALL_DURATION:-5}
WORKERS=${WORKERS:-2} NAMES=${NAMES:-1000} QUERIES=${QUERIES:-10000}
RELOADS=${RELOADS:-10} RELOAD_INTERVAL=${RELOAD_INTERVAL:-1} RELOAD_RATE=${RELOAD_RATE:-10000}
RELOAD_TIMEOUT=${RELOAD_TIMEOUT:-2}
SERVERS=${SERVERS:-appsrv nsd knot} RELOAD_SERVERS=${RELOAD_SERVERS:-appsrv nsd knot}
DNS=${DNS:-target/release/examples/dns} APPSRV_FLAGS=${APPSRV_FLAGS:-}
ECHO=${ECHO:-target/release/examples/udp_echo}
INSTALL=${INSTALL:-1} BUILD=${BUILD:-1} KEEP=${KEEP:-0} NSD_REUSEPORT=${NSD_REUSEPORT:-no}
case $NSD_REUSEPORT in yes | no) ;; *) echo "dns.sh: NSD_REUSEPORT must be yes or no" >&2; exit 2 ;; esac
for v in DURATION ROUNDS CLIENTS TCP_CLIENTS OUTSTANDING LATENCY_SHARE LATENCY_DURATION \
  SYSCALL_DURATION WORKERS NAMES QUERIES RELOADS RELOAD_INTERVAL RELOAD_RATE RELOAD_TIMEOUT; do
  if ! [[ ${!v} =~ ^[0-9]+$ ]] || [ "${!v}" -eq 0 ]; then
    echo "dns.sh: $v must be a positive number, not '${!v}'" >&2
    exit 2
  fi
done
for s in $SERVERS $RELOAD_SERVERS; do
  case $s in appsrv | udp_echo | nsd | knot) ;; *) echo "dns.sh: unknown server '$s' (appsrv, udp_echo, nsd, knot)" >&2; exit 2 ;; esac
done
T0=$(date +%s)

# ---------------------------------------------------------------------------------------
# Tools: installed on demand; the services Debian's packages set up are disabled and stopped.

# The system daemons of the packages (not ours): their pid files.
declare -A SYSTEM_PIDFILE=([nsd]=/run/nsd/nsd.pid [knot]=/run/knot/knot.pid)
declare -A SYSTEM_COMM=([nsd]='^nsd' [knot]='^knotd$')

# system_daemon PKG: the pid of the package's own daemon when one runs (from its pid file).
system_daemon() {
  local f=${SYSTEM_PIDFILE[$1]} p
  [ -s "$f" ] || return 0
  p=$(cat "$f" 2>/dev/null) || return 0
  [[ $p =~ ^[0-9]+$ ]] && grep -qE "${SYSTEM_COMM[$1]}" "/proc/$p/comm" 2>/dev/null && echo "$p"
  return 0
}

# quiet_services PKG...: disables and stops the services of packages this script installed.
quiet_services() {
  local pkg p
  for pkg in "$@"; do
    if command -v systemctl >/dev/null; then
      # --now stops it too where systemd runs; without a running systemd only the disable
      # (removing the wants/ link, and the SysV links) can work.
      systemctl disable --now "$pkg" >/dev/null 2>&1 || systemctl disable "$pkg" >/dev/null 2>&1 || true
    fi
    p=$(system_daemon "$pkg")
    if [ -n "$p" ]; then
      echo "dns.sh: stopping the $pkg daemon its package started (pid $p)" >&2
      kill -TERM "$p" 2>/dev/null || true
      for _ in $(seq 100); do [ -d "/proc/$p" ] || break; sleep 0.05; done
      kill -KILL "$p" 2>/dev/null || true
    fi
  done
}

declare -A PKG_OF=([nsd]=nsd [knotd]=knot [knotc]=knot [dnsperf]=dnsperf [dig]=bind9-dnsutils [python3]=python3)
need=()
for cmd in dnsperf dig python3; do command -v "$cmd" >/dev/null || need+=("${PKG_OF[$cmd]}"); done
want() { [[ " $SERVERS $([ "$MODE" = reload ] && echo "$RELOAD_SERVERS") " == *" $1 "* ]]; }
if [ "$MODE" = reload ]; then SERVERS=$RELOAD_SERVERS; fi
want nsd && ! command -v nsd >/dev/null && need+=(nsd)
want knot && { ! command -v knotd >/dev/null || ! command -v knotc >/dev/null; } && need+=(knot)
perf_ok() { perf stat -e raw_syscalls:sys_enter -o /dev/null true >/dev/null 2>&1; }
if [ "$MODE" = bench ] && ! perf_ok && ! command -v strace >/dev/null; then need+=(strace); fi
if [ ${#need[@]} -gt 0 ]; then
  mapfile -t need < <(printf '%s\n' "${need[@]}" | awk '!seen[$0]++')
  if [ "$INSTALL" = 0 ]; then
    echo "dns.sh: missing ${need[*]}; install with: apt-get install -y ${need[*]} (or run without INSTALL=0)" >&2
    exit 1
  fi
  echo "dns.sh: installing ${need[*]} (apt-get)" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >&2
  installed=()
  for p in "${need[@]}"; do case $p in nsd | knot) installed+=("$p") ;; esac; done
  [ ${#installed[@]} -eq 0 ] || quiet_services "${installed[@]}"
fi
for pkg in nsd knot; do
  p=$(system_daemon "$pkg")
  [ -z "$p" ] || echo "dns.sh: warning: the system's $pkg daemon runs (pid $p, not started by this script): it is left alone, but it shares the CPUs" >&2
done

# ---------------------------------------------------------------------------------------
# Processes. Every server is recorded in STARTED and its whole tree is ended at exit: NSD's
# process that we start becomes its xfrd, whose child is the main process, whose children
# answer the queries.

work=$(mktemp -d /tmp/dnsbench.XXXXXX)
chmod 755 "$work"
STARTED=()

# descendants PID...: the pids and all their descendants, one a line.
descendants() {
  local p c
  for p in "$@"; do
    [ -d "/proc/$p" ] || continue
    echo "$p"
    # shellcheck disable=SC2013 # the children files are space-separated pids
    for c in $(cat /proc/"$p"/task/*/children 2>/dev/null); do descendants "$c"; done
  done
}
# bench/lib.sh's server_pids is a master and its children; NSD's query processes are
# grandchildren of the process started: the whole tree here (proc_counters uses it).
server_pids() { descendants "$@" | awk '!seen[$0]++'; }

# running PID: the process exists and is not a zombie (a comm may hold spaces: "nsd: main").
running() {
  local st
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) && [ -n "$st" ] && [ "$st" != Z ]
}

# stop_tree PID...: TERM to each tree, KILL after 5 s to those of its processes still running.
stop_tree() {
  local pids p left
  mapfile -t pids < <(server_pids "$@")
  [ ${#pids[@]} -gt 0 ] || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 100); do
    left=()
    for p in "${pids[@]}"; do running "$p" && left+=("$p"); done
    [ ${#left[@]} -gt 0 ] || break
    sleep 0.05
  done
  [ ${#left[@]} -eq 0 ] || kill -KILL "${left[@]}" 2>/dev/null || true
  for p in "$@"; do wait "$p" 2>/dev/null || true; done
}

cleanup() {
  set +e
  [ ${#STARTED[@]} -eq 0 ] || stop_tree "${STARTED[@]}"
  local j
  for j in $(jobs -p); do kill -TERM "$j" 2>/dev/null; done
  wait 2>/dev/null
  if [ "$KEEP" = 1 ]; then echo "dns.sh: work directory kept: $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# free_port: a port free on 127.0.0.1 for both UDP and TCP.
free_port() {
  python3 - <<'EOF'
import socket
for _ in range(100):
    t = socket.socket()
    t.bind(("127.0.0.1", 0))
    port = t.getsockname()[1]
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        t.close()
        u.close()
    print(port)
    break
EOF
}

# ---------------------------------------------------------------------------------------
# The zone and the queries.

mkdir -p "$work/zone"
python3 bench/dns/gen.py "$work/zone" "$NAMES" "$QUERIES"
chmod 755 "$work/zone"
chmod 644 "$work/zone"/*

# ---------------------------------------------------------------------------------------
# Servers. start_server ID ZONE: starts it on a free port, waits until it answers; sets
# PORT_OF[ID], PID_OF[ID] (the process started), CMD_OF[ID]; returns 1 (with its log on
# stderr) when it does not come up.

declare -A PORT_OF PID_OF CMD_OF CONF_OF
SKIPPED=()
AS_ROOT=""
[ "$(id -u)" = 0 ] && AS_ROOT=1

if want udp_echo; then
  [ "$MODE" = bench ] || { echo "dns.sh: udp_echo is for the benchmark only (it does not answer DNS)" >&2; exit 2; }
  [ "$BUILD" = 0 ] || cargo build --release --quiet --example udp_echo >&2
  [ -x "$ECHO" ] || { echo "dns.sh: no $ECHO" >&2; exit 1; }
fi
if want appsrv; then
  has_source() { [ -f crates/appsrv-dns/examples/dns.rs ] || [ -f crates/appsrv-dns/examples/dns/main.rs ]; }
  if [ "$BUILD" != 0 ] && has_source; then
    echo "dns.sh: cargo build --release --example dns" >&2
    cargo build --release --quiet --example dns >&2 || echo "dns.sh: the build of the dns example failed" >&2
  fi
  if [ ! -x "$DNS" ]; then
    why="no $DNS"
    has_source || why="$why (no crates/appsrv-dns/examples/dns.rs or dns/main.rs in this tree yet)"
    echo "dns.sh: appsrv skipped: $why" >&2
    SKIPPED+=("appsrv: $why")
    SERVERS=$(tr ' ' '\n' <<<"$SERVERS" | grep -vx appsrv | tr '\n' ' ')
  fi
fi

# wait_dns PORT SECONDS: until the server on PORT answers the zone's SOA (UDP).
wait_dns() {
  local deadline=$(($(date +%s) + $2))
  while [ "$(date +%s)" -le "$deadline" ]; do
    [[ $(dig -p "$1" @127.0.0.1 +short +tries=1 +time=1 bench.test. SOA 2>/dev/null) == *hostmaster* ]] && return 0
    sleep 0.1
  done
  return 1
}

start_server() {
  local id=$1 zone=$2 port d log
  port=$(free_port)
  d=$work/$id
  mkdir -p "$d"
  log=$d/log
  case $id in
    udp_echo)
      CMD_OF[$id]="$ECHO -l udp://127.0.0.1:PORT -w $WORKERS${APPSRV_FLAGS:+ $APPSRV_FLAGS}"
      # shellcheck disable=SC2086
      "$ECHO" -l "udp://127.0.0.1:$port" -w "$WORKERS" $APPSRV_FLAGS 2>"$log" &
      ;;
    appsrv)
      local ctl=()
      [ "$MODE" = reload ] && ctl=(--control "$d/ctl")
      # shellcheck disable=SC2206 # the flags are words
      CMD_OF[$id]="$DNS --zone ${zone##*/} -l udp://127.0.0.1:PORT -l 127.0.0.1:PORT -w $WORKERS --max-answers-per-ip 0${APPSRV_FLAGS:+ $APPSRV_FLAGS}${ctl:+ ${ctl[*]}}"
      # shellcheck disable=SC2086
      "$DNS" --zone "$zone" -l "udp://127.0.0.1:$port" -l "127.0.0.1:$port" -w "$WORKERS" \
        --max-answers-per-ip 0 $APPSRV_FLAGS "${ctl[@]}" 2>"$log" &
      ;;
    nsd)
      # RRL off: both limits 0 (nsd.conf(5): "also set the whitelist-ratelimit to 0 to
      # disable ratelimit processing"). Left on, it blocks dnsperf's NXDOMAIN answers within a
      # second ("ratelimit block ... type nxdomain" in its log) and the runs lose nearly all
      # their queries. (nsd -v is read whole first: `nsd -v | grep -q` under pipefail fails
      # when grep exits before nsd has written, which once dropped these lines.)
      local rrl="rrl-ratelimit: 0
    rrl-whitelist-ratelimit: 0" v
      v=$(nsd -v 2>&1 || true)
      [[ $v == *--enable-ratelimit* ]] || rrl="# built without RRL (no --enable-ratelimit)"
      cat >"$d/nsd.conf" <<EOF
server:
    server-count: $WORKERS
    ip-address: 127.0.0.1@$port
    do-ip6: no
    reuseport: $NSD_REUSEPORT
    $rrl
    minimal-responses: yes
    hide-version: yes
    verbosity: 1
    ${AS_ROOT:+username: nsd}
    chroot: ""
    zonesdir: "$d"
    database: ""
    zonelistfile: "$d/zone.list"
    xfrdfile: "$d/xfrd.state"
    xfrdir: "$d"
    pidfile: "$d/nsd.pid"
    logfile: "$d/nsd.log"
remote-control:
    control-enable: no
zone:
    name: bench.test
    zonefile: "$zone"
EOF
      [ -z "$AS_ROOT" ] || chown nsd "$d"
      nsd-checkconf "$d/nsd.conf" >"$log" 2>&1 || { echo "dns.sh: NSD rejects its configuration:" >&2; cat "$log" >&2; return 1; }
      CONF_OF[$id]=$d/nsd.conf
      CMD_OF[$id]="nsd -d -c nsd.conf"
      nsd -d -c "$d/nsd.conf" >>"$log" 2>&1 &
      ;;
    knot)
      mkdir -p "$d/db"
      cat >"$d/knot.conf" <<EOF
server:
    rundir: "$d"
    ${AS_ROOT:+user: knot:knot}
    pidfile: "$d/knot.pid"
    listen: 127.0.0.1@$port
    udp-workers: $WORKERS
    tcp-workers: $WORKERS
    background-workers: 1
log:
  - target: stderr
    any: notice
database:
    storage: "$d/db"
control:
    listen: "$d/knot.sock"
template:
  - id: default
    storage: "$d"
    journal-content: none
    zonefile-sync: -1
    zonefile-load: whole
    semantic-checks: off
zone:
  - domain: bench.test.
    file: "$zone"
EOF
      [ -z "$AS_ROOT" ] || chown -R knot:knot "$d"
      knotc -c "$d/knot.conf" conf-check >"$log" 2>&1 || { echo "dns.sh: Knot rejects its configuration:" >&2; cat "$log" >&2; return 1; }
      CONF_OF[$id]=$d/knot.conf
      CMD_OF[$id]="knotd -c knot.conf"
      knotd -c "$d/knot.conf" >>"$log" 2>&1 &
      ;;
  esac
  PID_OF[$id]=$! PORT_OF[$id]=$port
  STARTED+=("$!")
  if [ "$id" = udp_echo ]; then
    # It answers no DNS: the ready line of its log.
    local deadline=$(($(date +%s) + 30))
    while [ "$(date +%s)" -le "$deadline" ]; do
      grep -qa " ready" "$log" && return 0
      sleep 0.05
    done
  elif wait_dns "$port" 30; then
    return 0
  fi
  echo "dns.sh: $id does not answer on 127.0.0.1:$port; its log:" >&2
  tail -20 "$log" "$d/nsd.log" 2>/dev/null >&2 || true
  stop_server "$id"
  return 1
}

stop_server() {
  local p=${PID_OF[$1]:-} s keep=()
  [ -n "$p" ] || return 0
  stop_tree "$p"
  for s in "${STARTED[@]}"; do [ "$s" = "$p" ] || keep+=("$s"); done
  STARTED=("${keep[@]}")
  unset "PID_OF[$1]"
}

version_of() {
  case $1 in
    appsrv) echo "appsrv \`dns\` -w $WORKERS ($(git rev-parse --short HEAD 2>/dev/null || echo "?"))" ;;
    udp_echo) echo "appsrv \`udp_echo\` -w $WORKERS (no DNS: echoes the query)" ;;
    nsd) echo "NSD $(nsd -v 2>&1 | awk '/^NSD version/ { print $3 }')" ;;
    knot) echo "Knot $(knotd -V 2>&1 | awk '{ print $NF }')" ;;
  esac
}

# ---------------------------------------------------------------------------------------
# Answers: each server must answer as the zone says before it is measured.

# dig_norm PORT NAME TYPE [DIG FLAGS]: "RCODE AA|ANSWER;ANSWER...|AUTHORITY TYPES": the answer
# records without TTL and class, sorted; the authority section's types.
dig_norm() {
  local out
  out=$(dig -p "$1" @127.0.0.1 +norec +tries=1 +time=3 "${@:4}" "$2" "$3" 2>&1 | awk '
    /->>HEADER<<-/ { st = $6; sub(",", "", st) }
    /^;; flags:/ { aa = ($0 ~ / aa[ ;]/) ? "aa" : "-" }
    /^;; ANSWER SECTION:/ { sec = "A"; next }
    /^;; AUTHORITY SECTION:/ { sec = "U"; next }
    /^;; ADDITIONAL SECTION:/ { sec = ""; next }
    /^$/ { sec = ""; next }
    /^;/ { next }
    sec == "A" { r = $1 " " $4; for (i = 5; i <= NF; i++) r = r " " $i; print "A " r }
    sec == "U" { print "U " $4 }
    END { print "H " (st == "" ? "no-answer" : st) " " aa }')
  printf '%s|%s|%s\n' "$(grep '^H ' <<<"$out" | cut -c3-)" \
    "$(grep '^A ' <<<"$out" | cut -c3- | LC_ALL=C sort | paste -sd';')" \
    "$(grep '^U ' <<<"$out" | cut -c3- | LC_ALL=C sort -u | paste -sd,)"
}

# check_answers ID: compares dig's answers with the zone's; prints the differences.
check_answers() {
  local port=${PORT_OF[$1]} bad=0 q name type flags want got eight
  eight=$(for j in 1 2 3 4 5 6 7 8; do echo "eight1.bench.test. A 172.16.1.$j"; done | paste -sd';')
  # NAME TYPE DIG-FLAGS EXPECTED ("*" in the authority part: not compared, a positive answer).
  local checks=(
    "one1.bench.test.|A|+notcp|NOERROR aa|one1.bench.test. A 10.0.1.1|*"
    "eight1.bench.test.|A|+notcp|NOERROR aa|$eight|*"
    "six1.bench.test.|AAAA|+notcp|NOERROR aa|six1.bench.test. AAAA 2001:db8::1|*"
    "alias1.bench.test.|A|+notcp|NOERROR aa|alias1.bench.test. CNAME one1.bench.test.;one1.bench.test. A 10.0.1.1|*"
    "mx.bench.test.|MX|+notcp|NOERROR aa|mx.bench.test. MX 10 one1.bench.test.|*"
    "nx1.bench.test.|A|+notcp|NXDOMAIN aa||SOA"
    "one1.bench.test.|AAAA|+notcp|NOERROR aa||SOA"
    "www.example.com.|A|+notcp|REFUSED *"
    "one1.bench.test.|A|+tcp|NOERROR aa|one1.bench.test. A 10.0.1.1|*"
    "eight1.bench.test.|A|+tcp|NOERROR aa|$eight|*"
    "nx1.bench.test.|A|+tcp|NXDOMAIN aa||SOA"
  )
  for q in "${checks[@]}"; do
    IFS='|' read -r name type flags want <<<"$q"
    got=$(dig_norm "$port" "$name" "$type" "$flags")
    # "*" matches anything from there on (a glob, after the literal part).
    # shellcheck disable=SC2053
    if [[ $got != $want ]]; then
      echo "dns.sh: $1: dig $flags $name $type: got '$got', want '$want'" >&2
      bad=1
    fi
  done
  return "$bad"
}

# ---------------------------------------------------------------------------------------
# dnsperf runs.

# perf_run OUT SECONDS ARGS...: dnsperf -s 127.0.0.1 ARGS -l SECONDS into OUT, bounded.
perf_run() {
  local out=$1 secs=$2
  shift 2
  timeout $((secs + 60)) dnsperf -s 127.0.0.1 "$@" -l "$secs" >"$out" 2>&1 \
    || echo "dns.sh: dnsperf $* -l $secs failed: $(grep -v '^>' "$out" | tail -2 | tr '\n' ' ')" >&2
}
# perf_field OUT FIELD: qps, completed, sent, lost, size (average response bytes),
# codes (other than NOERROR and NXDOMAIN, "-" when none), reconnections.
perf_field() {
  awk -v f="$2" '
    /^  Queries sent:/ { sent = $3 }
    /^  Queries completed:/ { done = $3 }
    /^  Queries lost:/ { lost = $3 }
    /^  Queries per second:/ { qps = $4 }
    /^  Average packet size:/ { size = $NF }
    /^  Reconnections:/ { rec = $2 }
    /^  Response codes:/ {
      sub(/^  Response codes: */, ""); n = split($0, c, ", ")
      for (i = 1; i <= n; i++) { split(c[i], w, " "); if (w[1] != "NOERROR" && w[1] != "NXDOMAIN") other = other (other ? ", " : "") c[i] }
    }
    END {
      if (f == "qps") printf "%.0f\n", qps; else if (f == "completed") print done + 0
      else if (f == "sent") print sent + 0; else if (f == "lost") print lost + 0
      else if (f == "size") print size; else if (f == "reconnections") print (rec == "" ? "-" : rec)
      else if (f == "codes") print (other == "" ? "-" : other)
    }' "$1"
}

median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else if (NR) print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
range() { sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { if (NR > 1) printf "%s–%s", lo, hi }'; }

declare -A WL_ARGS WL_TITLE
WL_ARGS[udp1]="-d queries-a1.txt -c $CLIENTS -q $OUTSTANDING"
WL_ARGS[udp8]="-d queries-a8.txt -c $CLIENTS -q $OUTSTANDING"
WL_ARGS[tcp]="-m tcp -d queries-a1.txt -c $TCP_CLIENTS -q $OUTSTANDING"
WL_TITLE[udp1]="UDP, answers of 1 record"
WL_TITLE[udp8]="UDP, answers of 8 records"
WL_TITLE[tcp]="TCP, $TCP_CLIENTS persistent connections, answers of 1 record"
WORKLOADS=(udp1 udp8 tcp)

# dnsperf_args WL: the arguments with the query files' full paths.
dnsperf_args() { echo "${WL_ARGS[$1]//queries-a/$work/zone/queries-a}"; }

# ---------------------------------------------------------------------------------------
# Syscalls: perf stat on the raw_syscalls tracepoint (all of them) and the syscalls that a DNS
# server's loop makes (the breakdown); strace -c -f when perf cannot.

SYSCALL_NAMES="recvfrom sendto recvmsg sendmsg recvmmsg sendmmsg read write readv writev
  epoll_wait epoll_pwait epoll_pwait2 epoll_ctl poll ppoll select pselect6 futex accept accept4
  close io_uring_enter sched_yield clock_gettime nanosleep clock_nanosleep getpid"
SYSCALL_TOOL=""
if [ "$MODE" = bench ]; then
  if perf_ok; then
    SYSCALL_TOOL=perf
    PERF_EVENTS=raw_syscalls:sys_enter
    tracepoints=$(perf list tracepoint 2>/dev/null | awk '{ print $1 }')
    for s in $SYSCALL_NAMES; do
      grep -qx "syscalls:sys_enter_$s" <<<"$tracepoints" && PERF_EVENTS="$PERF_EVENTS,syscalls:sys_enter_$s"
    done
  elif command -v strace >/dev/null; then
    SYSCALL_TOOL=strace
  fi
fi

# count_syscalls ID OUT: a SYSCALL_DURATION-second UDP 1-record max-rate run under the tool;
# prints "PER_QUERY|BREAKDOWN".
count_syscalls() {
  local id=$1 out=$2 tracer pids total n per
  mapfile -t pids < <(server_pids "${PID_OF[$id]}")
  case $SYSCALL_TOOL in
    perf)
      perf stat -x, -e "$PERF_EVENTS" -p "$(IFS=,; echo "${pids[*]}")" -o "$out.count" &
      ;;
    strace)
      local args=()
      for p in "${pids[@]}"; do args+=(-p "$p"); done
      strace -c -f -q -o "$out.count" "${args[@]}" &
      ;;
    *) echo "-|no perf or strace"; return 0 ;;
  esac
  tracer=$!
  sleep 0.5 # attached before the load starts
  # shellcheck disable=SC2046
  perf_run "$out" "$SYSCALL_DURATION" -p "${PORT_OF[$id]}" $(dnsperf_args udp1)
  kill -INT "$tracer" 2>/dev/null || true
  wait "$tracer" 2>/dev/null || true
  n=$(perf_field "$out" completed)
  [ "$n" -gt 0 ] || { echo "-|no query completed"; return 0; }
  # "NAME COUNT" lines, the total as "TOTAL COUNT".
  if [ "$SYSCALL_TOOL" = perf ]; then
    # perf stat -x,: "COUNT,UNIT,EVENT,..."; raw_syscalls:sys_enter counts them all.
    awk -F, '
      $3 == "raw_syscalls:sys_enter" { print "TOTAL", $1 }
      $3 ~ /^syscalls:sys_enter_/ { s = $3; sub(/^syscalls:sys_enter_/, "", s); print s, $1 }' "$out.count" >"$out.calls"
  else
    # strace -c: calls are column 4 (5 when usecs/call is empty).
    awk '
      $NF == "total" { print "TOTAL", $4; next }
      $1 ~ /^[0-9.]+$/ { print $NF, ($4 ~ /^[0-9]+$/ ? $4 : $5) }' "$out.count" >"$out.calls"
  fi
  total=$(awk -v n="$n" '$1 == "TOTAL" { printf "%.2f", $2 / n }' "$out.calls")
  per=$(awk -v n="$n" '
      $1 == "TOTAL" { total = $2; next }
      { known += $2; if ($2 / n >= 0.01) printf "%s %.2f\n", $1, $2 / n }
      END { if (total > known && (total - known) / n >= 0.01) printf "~other %.2f\n", (total - known) / n }' "$out.calls" \
    | sort -k2,2gr -k1,1 | awk '{ printf "%s%s %s", (NR > 1 ? ", " : ""), $1, $2 }')
  per=${per//~other/other}
  echo "$total|$per"
}

# ---------------------------------------------------------------------------------------
# Latency: p50 and p99 from dnsperf -v's per-answer lines ("> RCODE NAME TYPE SECONDS"; a
# timeout is "> T ..."; "I", interrupted at the end of the run, is left out).

# latency OUT: "P50_MS P99_MS ANSWERS TIMEOUTS".
latency() {
  awk '$1 == ">" && $2 == "T" { t++; next } $1 == ">" && $2 != "I" { print $NF }' "$1" | sort -g \
    | awk -v t="$(awk '$1 == ">" && $2 == "T"' "$1" | wc -l)" '
      { v[NR] = $1 }
      END {
        n = NR + t
        if (n == 0) { print "- - 0 0"; exit }
        i50 = int(n * 0.50 + 0.999999); i99 = int(n * 0.99 + 0.999999)
        p50 = (i50 <= NR) ? sprintf("%.3f", v[i50] * 1000) : "timeout"
        p99 = (i99 <= NR) ? sprintf("%.3f", v[i99] * 1000) : "timeout"
        print p50, p99, NR, t
      }'
}

# ---------------------------------------------------------------------------------------
echo "dns.sh: $MODE; work directory $work" >&2
ENV_LINE="$(nproc) CPUs ($(uname -r)), $(dnsperf -h 2>&1 | awk '/^Version/ { print "dnsperf " $2 }'), $(for s in $SERVERS; do printf '%s; ' "$(version_of "$s")"; done)"
ENV_LINE=${ENV_LINE%; }

if [ "$MODE" = reload ]; then
  # bump_serial ZONE SERIAL: the zone with this serial, replaced by rename (a reload never
  # reads half a file).
  bump_serial() {
    sed "s/^\t\t[0-9]*\t; serial$/\t\t$2\t; serial/" "$1" >"$1.new"
    chmod 644 "$1.new"
    mv "$1.new" "$1"
  }
  serial_of() { dig -p "$1" @127.0.0.1 +short +tries=2 +time=2 bench.test. SOA 2>/dev/null | awk '{ print $3 }'; }
  reload_server() {
    case $1 in
      appsrv) "$DNS" reload --control "$work/appsrv/ctl" >/dev/null 2>>"$work/appsrv/reload.err" ;;
      nsd)
        local main
        main=$(cat "$work/nsd/nsd.pid" 2>/dev/null) && kill -HUP "$main" ;;
      knot) knotc -c "$work/knot/knot.conf" -b zone-reload bench.test. >/dev/null 2>>"$work/knot/reload.err" ;;
    esac
  }
  ROWS=()
  for id in $SERVERS; do
    zone=$work/zone/reload-$id.zone
    cp "$work/zone/bench.test.zone" "$zone"
    chmod 644 "$zone"
    echo "dns.sh: reload: $id" >&2
    start_server "$id" "$zone" || { SKIPPED+=("$id: did not start"); continue; }
    check_answers "$id" || { SKIPPED+=("$id: wrong answers (see stderr)"); stop_server "$id"; continue; }
    secs=$((RELOADS * RELOAD_INTERVAL + 3))
    out=$work/reload-$id.out
    # shellcheck disable=SC2046
    perf_run "$out" "$secs" -p "${PORT_OF[$id]}" $(dnsperf_args udp1) -Q "$RELOAD_RATE" -t "$RELOAD_TIMEOUT" &
    load=$!
    sleep 1.5
    ok=0 fresh=0
    for i in $(seq "$RELOADS"); do
      bump_serial "$zone" $((i + 1))
      reload_server "$id" && ok=$((ok + 1))
      sleep "$RELOAD_INTERVAL"
      # Served by then (NSD's SIGHUP does not wait for the load: one interval later).
      [ "$(serial_of "${PORT_OF[$id]}")" = $((i + 1)) ] && fresh=$((fresh + 1))
    done
    wait "$load" || true
    serial=$(serial_of "${PORT_OF[$id]}")
    stop_server "$id"
    ROWS+=("| $(version_of "$id") | $ok/$RELOADS | $fresh/$RELOADS | $(perf_field "$out" sent) | $(perf_field "$out" completed) | **$(perf_field "$out" lost)** | $(perf_field "$out" codes) | ${serial:-none} (want $((RELOADS + 1))) |")
  done
  echo "Reload under load: dnsperf -s 127.0.0.1 -p PORT -d queries-a1.txt -c $CLIENTS -q $OUTSTANDING -Q $RELOAD_RATE -t $RELOAD_TIMEOUT -l $((RELOADS * RELOAD_INTERVAL + 3)), $RELOADS reloads ${RELOAD_INTERVAL} s apart (the zone's serial raised before each); $ENV_LINE"
  echo
  echo "| server | reloads ok | new serial served ${RELOAD_INTERVAL} s after | queries sent | answered | lost (no answer in ${RELOAD_TIMEOUT} s) | other rcodes | serial served after |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
  [ ${#SKIPPED[@]} -eq 0 ] || printf 'Skipped: %s\n' "${SKIPPED[@]}"
  exit 0
fi

# ---------------------------------------------------------------------------------------
# The benchmark.

LIVE=()
for id in $SERVERS; do
  echo "dns.sh: starting $id" >&2
  if ! start_server "$id" "$work/zone/bench.test.zone"; then SKIPPED+=("$id: did not start"); continue; fi
  if [ "$id" != udp_echo ] && ! check_answers "$id"; then SKIPPED+=("$id: wrong answers (see stderr)"); stop_server "$id"; continue; fi
  # A short unmeasured warm-up (caches, lazily allocated buffers).
  # shellcheck disable=SC2046
  perf_run "$work/warmup-$id.out" 1 -p "${PORT_OF[$id]}" $(dnsperf_args udp1)
  LIVE+=("$id")
done
[ ${#LIVE[@]} -gt 0 ] || { echo "dns.sh: no server to measure" >&2; printf '%s\n' "${SKIPPED[@]}" >&2; exit 1; }

# proc_ticks PID: the CPU time (utime + stime, all threads) of a process of this shell, in
# clock ticks, also when it has exited and is not waited for yet (a zombie keeps them).
proc_ticks() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | awk '{ print $12 + $13 }'; }

# wait_bounded PID SECONDS: waits for a child; kills it after SECONDS (then fails).
wait_bounded() {
  local deadline=$(($(date +%s) + $2))
  while running "$1"; do
    if [ "$(date +%s)" -gt "$deadline" ]; then
      kill -KILL "$1" 2>/dev/null || true
      wait "$1" 2>/dev/null || true
      return 1
    fi
    sleep 0.05
  done
  wait "$1" 2>/dev/null || true
}

# machine_jiffies: the CPU time all the machine's CPUs were busy (/proc/stat's first line:
# all but idle and iowait), in clock ticks.
machine_jiffies() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat; }

# shellcheck disable=SC2034 # CLI, BUSY and MBUSY: read through cell's nameref
declare -A QPS CPU LOST SIZE CODES RECON CLI BUSY MBUSY
for r in $(seq "$ROUNDS"); do
  # The servers' order rotated by one each round.
  order=("${LIVE[@]:$(((r - 1) % ${#LIVE[@]}))}" "${LIVE[@]:0:$(((r - 1) % ${#LIVE[@]}))}")
  for wl in "${WORKLOADS[@]}"; do
    for id in "${order[@]}"; do
      [ "$id/$wl" != udp_echo/tcp ] || continue # a UDP listener only
      echo "dns.sh: round $r/$ROUNDS, $wl, $id" >&2
      out=$work/$wl-$id-$r.out
      mb=$(machine_jiffies) before=$(proc_counters "${PID_OF[$id]}") t0=$(date +%s%N)
      # shellcheck disable=SC2046
      dnsperf -s 127.0.0.1 -p "${PORT_OF[$id]}" $(dnsperf_args "$wl") -l "$DURATION" >"$out" 2>&1 &
      dp=$!
      # dnsperf's CPU time and the machine's, sampled when its time limit is up: when queries
      # were lost, dnsperf then waits for their timeout (-t, 5 s), spinning on a CPU.
      sleep "$DURATION"
      cli=$(proc_ticks "$dp") t1=$(date +%s%N) ma=$(machine_jiffies) mid=$(proc_counters "${PID_OF[$id]}")
      wait_bounded "$dp" $((DURATION + 60)) || echo "dns.sh: $id, $wl: dnsperf did not finish: $(grep -v '^>' "$out" | tail -2 | tr '\n' ' ')" >&2
      after=$(proc_counters "${PID_OF[$id]}")
      n=$(perf_field "$out" completed)
      read -r "CLI[$id/$wl/$r]" "BUSY[$id/$wl/$r]" "MBUSY[$id/$wl/$r]" < <(awk -v b="$before" -v m="$mid" \
        -v c="$cli" -v t="$((t1 - t0))" -v n="$n" -v mb="$mb" -v ma="$ma" -v hz="$LIB_HZ" 'BEGIN {
          split(b, x, " "); split(m, y, " "); split(mb, u, " "); split(ma, v, " ")
          if (n > 0 && c != "") printf "%.1f %.2f %.2f\n", c * 1e6 / hz / n, (y[1] - x[1] + c * 1e9 / hz) / t, (v[1] - u[1]) * 1e9 / hz / t
          else print "- - -"
        }')
      QPS[$id/$wl/$r]=$(perf_field "$out" qps)
      # shellcheck disable=SC2034 # read through cell's and med's namerefs
      CPU[$id/$wl/$r]=$(per_request "$before" "$after" "$n" | awk '{ print $1 }')
      LOST[$id/$wl/$r]=$(perf_field "$out" lost)
      SIZE[$id/$wl]=$(perf_field "$out" size)
      CODES[$id/$wl/$r]=$(perf_field "$out" codes)
      RECON[$id/$wl/$r]=$(perf_field "$out" reconnections)
      [ "${CODES[$id/$wl/$r]}" = - ] || echo "dns.sh: $id, $wl: answers other than NOERROR/NXDOMAIN: ${CODES[$id/$wl/$r]}" >&2
    done
  done
done

declare -A P50 P99 LAT_RATE LAT_GOT LAT_T SYS SYS_BY SYS_QPS
for id in "${LIVE[@]}"; do
  max=$(for r in $(seq "$ROUNDS"); do echo "${QPS[$id/udp1/$r]}"; done | median)
  LAT_RATE[$id]=$(awk -v m="$max" -v s="$LATENCY_SHARE" 'BEGIN { printf "%.0f", m * s / 100 }')
  echo "dns.sh: latency, $id, -Q ${LAT_RATE[$id]}" >&2
  out=$work/latency-$id.out
  # shellcheck disable=SC2046
  perf_run "$out" "$LATENCY_DURATION" -p "${PORT_OF[$id]}" $(dnsperf_args udp1) -Q "${LAT_RATE[$id]}" -v
  read -r "P50[$id]" "P99[$id]" _ "LAT_T[$id]" < <(latency "$out")
  LAT_GOT[$id]=$(perf_field "$out" qps)
done
for id in "${LIVE[@]}"; do
  echo "dns.sh: syscalls, $id ($SYSCALL_TOOL)" >&2
  r=$(count_syscalls "$id" "$work/syscalls-$id.out")
  SYS[$id]=${r%%|*} SYS_BY[$id]=${r#*|}
  SYS_QPS[$id]=$(perf_field "$work/syscalls-$id.out" qps)
done

WARN=()
if [[ " ${LIVE[*]} " == *" nsd "* ]] && grep -q "ratelimit block" "$work/nsd/nsd.log" 2>/dev/null; then
  WARN+=("NSD's RRL blocked answers during the runs ($(grep -c "ratelimit block" "$work/nsd/nsd.log") 'ratelimit block' lines in its log): its figures are not valid")
fi
for id in "${LIVE[@]}"; do stop_server "$id"; done

# cell ARRAY ID WL FORMAT: "MEDIAN (LO–HI)" over the rounds, each printed with FORMAT.
cell() {
  local -n a=$1
  local vals m rg
  vals=$(for r in $(seq "$ROUNDS"); do echo "${a[$2/$3/$r]:-}"; done | grep -v '^-*$' || true)
  [ -n "$vals" ] || { echo "-"; return; }
  # shellcheck disable=SC2059 # the format is the argument
  m=$(printf "$4" "$(median <<<"$vals")")
  rg=$(range <<<"$vals")
  # shellcheck disable=SC2059
  [ -z "$rg" ] || rg=$(printf "$4–$4" "${rg%–*}" "${rg#*–}")
  echo "$m${rg:+ ($rg)}"
}
med() {
  local -n a=$1
  { for r in $(seq "$ROUNDS"); do echo "${a[$2/$3/$r]:-}"; done | grep -v '^-*$' || true; } | median
}

head_row="| workload |"
sep="|---|"
for id in "${LIVE[@]}"; do head_row="$head_row $(version_of "$id") |" sep="$sep---|"; done

echo "DNS over loopback: $ENV_LINE; $ROUNDS round(s) of ${DURATION} s per max-rate cell (median, range of the rounds)"
echo
echo "$head_row"
echo "$sep"
for wl in "${WORKLOADS[@]}"; do
  row="| ${WL_TITLE[$wl]}: queries/s |"
  for id in "${LIVE[@]}"; do row="$row $(cell QPS "$id" "$wl" %.0f) |"; done
  echo "$row"
  row="| … server CPU µs/query |"
  for id in "${LIVE[@]}"; do row="$row $(cell CPU "$id" "$wl" %.1f) |"; done
  echo "$row"
done
row="| UDP latency p99 at $LATENCY_SHARE % of the server's own 1-record max (rate reached; p50) |"
for id in "${LIVE[@]}"; do
  row="$row ${P99[$id]} ms (${LAT_GOT[$id]} q/s; p50 ${P50[$id]} ms$([ "${LAT_T[$id]}" = 0 ] || echo "; ${LAT_T[$id]} timeouts")) |"
done
echo "$row"
row="| syscalls/query, UDP 1-record at max rate ($SYSCALL_TOOL) |"
for id in "${LIVE[@]}"; do row="$row ${SYS[$id]} |"; done
echo "$row"

echo
echo "Details: queries lost (summed over the rounds), answers other than NOERROR/NXDOMAIN, average response size, TCP reconnections, dnsperf's own CPU per query, and the CPUs busy (server + dnsperf CPU time / run time) of the machine's busy CPUs (all processes, /proc/stat; of $(nproc): the rest is other work on the machine); then syscalls by call (per query, ≥ 0.01) at the rate reached under $SYSCALL_TOOL"
echo
echo "| server | workload | lost | other rcodes | response bytes | reconnections | dnsperf CPU µs/query | CPUs busy: server + dnsperf / machine |"
echo "|---|---|---|---|---|---|---|---|"
for id in "${LIVE[@]}"; do
  for wl in "${WORKLOADS[@]}"; do
    [ "$id/$wl" != udp_echo/tcp ] || continue
    lost=0 codes="" rec=""
    for r in $(seq "$ROUNDS"); do
      lost=$((lost + ${LOST[$id/$wl/$r]:-0}))
      [ "${CODES[$id/$wl/$r]}" = - ] || codes="$codes${codes:+; }${CODES[$id/$wl/$r]}"
      rec="$rec${rec:+, }${RECON[$id/$wl/$r]}"
    done
    [ "$wl" = tcp ] || rec=-
    echo "| $(version_of "$id") | ${WL_TITLE[$wl]} | $lost | ${codes:--} | ${SIZE[$id/$wl]} | $rec | $(cell CLI "$id" "$wl" %.1f) | $(cell BUSY "$id" "$wl" %.2f) / $(cell MBUSY "$id" "$wl" %.2f) |"
  done
done
echo
echo "| server | syscalls/query | queries/s while counted | by call |"
echo "|---|---|---|---|"
for id in "${LIVE[@]}"; do echo "| $(version_of "$id") | ${SYS[$id]} | ${SYS_QPS[$id]} | ${SYS_BY[$id]} |"; done

if [[ " ${LIVE[*]} " == *" appsrv "* ]]; then
  echo
  echo "Ratios, appsrv / peer (queries/s: higher is better; CPU/query and p99: lower is better)"
  echo
  echo "| ratio | $(for wl in "${WORKLOADS[@]}"; do printf '%s q/s | %s CPU/query | ' "$wl" "$wl"; done)p99 |"
  echo "|---|$(for _ in "${WORKLOADS[@]}"; do printf -- '---|---|'; done)---|"
  for peer in "${LIVE[@]}"; do
    [ "$peer" = appsrv ] || [ "$peer" = udp_echo ] && continue
    row="| appsrv / $(version_of "$peer") |"
    for wl in "${WORKLOADS[@]}"; do
      for a in QPS CPU; do
        row="$row $(awk -v x="$(med $a appsrv "$wl")" -v y="$(med $a "$peer" "$wl")" 'BEGIN { if (x != "" && y > 0) printf "%.2f×", x / y; else print "-" }') |"
      done
    done
    row="$row $(awk -v x="${P99[appsrv]}" -v y="${P99[$peer]}" 'BEGIN { if (x + 0 > 0 && y + 0 > 0) printf "%.2f×", x / y; else print "-" }') |"
    echo "$row"
  done
fi

echo
echo "Command lines (PORT: each server's own; the files from bench/dns/gen.py $NAMES $QUERIES):"
echo
echo '```'
for wl in "${WORKLOADS[@]}"; do echo "dnsperf -s 127.0.0.1 -p PORT ${WL_ARGS[$wl]} -l $DURATION    # ${WL_TITLE[$wl]}"; done
echo "dnsperf -s 127.0.0.1 -p PORT ${WL_ARGS[udp1]} -l $LATENCY_DURATION -Q RATE -v    # latency, RATE = $LATENCY_SHARE % of the server's udp1 median"
if [ "$SYSCALL_TOOL" = perf ]; then
  echo "perf stat -x, -e raw_syscalls:sys_enter,syscalls:sys_enter_… -p ALL_PIDS &  dnsperf -s 127.0.0.1 -p PORT ${WL_ARGS[udp1]} -l $SYSCALL_DURATION"
else
  echo "strace -c -f -p PID… &  dnsperf -s 127.0.0.1 -p PORT ${WL_ARGS[udp1]} -l $SYSCALL_DURATION"
fi
for id in "${LIVE[@]}"; do echo "${CMD_OF[$id]}"; done
echo '```'
for id in "${LIVE[@]}"; do
  [ -n "${CONF_OF[$id]:-}" ] || continue
  echo
  echo "$id's configuration ($(basename "${CONF_OF[$id]}"), paths in a temporary directory):"
  echo
  echo '```'
  grep -v '^ *$' "${CONF_OF[$id]}" | sed "s|$work|\$WORK|g"
  echo '```'
done
[ ${#SKIPPED[@]} -eq 0 ] || { echo; printf 'Skipped: %s\n' "${SKIPPED[@]}"; }
[ ${#WARN[@]} -eq 0 ] || { echo; printf '**Warning:** %s\n' "${WARN[@]}"; printf 'dns.sh: warning: %s\n' "${WARN[@]}" >&2; }
echo
echo "($(($(date +%s) - T0)) s)"
